"""Drive an A/B pair of vLLM servers with the same requests; save both /metrics pages.

Usage: python drive_pair.py SD_URL BASE_URL MODEL OUT_DIR PHASES_JSON
PHASES_JSON: [[clients, seconds, share_at_temperature_1], ...]

Each client sends one request to both servers at the same moment (same prompt, same
max_tokens, same temperature) and waits for both answers before its next one, so both
servers see the same arrival process. Both pages are saved every SNAP_SECONDS (default 2)
as OUT_DIR/sd/snap_<ms>.prom and OUT_DIR/base/snap_<ms>.prom with one timestamp, and
OUT_DIR/phases.json holds each phase's wall-clock [start, end]. Needs aiohttp.
"""
import asyncio
import json
import os
import random
import sys
import time

import aiohttp

SD, BASE, MODEL, OUT = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
PHASES = json.loads(sys.argv[5])
SNAP_SECONDS = float(os.environ.get("SNAP_SECONDS", "2"))
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "speculative",
         "decoding", "draft", "verify", "token", "batch", "load", "latency"]


async def one(session, url, body):
    try:
        async with session.post(url + "/v1/completions", json=body) as r:
            await r.read()
    except aiohttp.ClientError:
        await asyncio.sleep(0.5)


async def client(session, stop_at, hot_share):
    while time.time() < stop_at:
        # ignore_eos: the random model may end a greedy answer after a token or two; every
        # request then generates its max_tokens, as the one-client rate was measured.
        body = {"model": MODEL, "prompt": " ".join(random.choice(WORDS) for _ in range(32)),
                "max_tokens": random.randint(32, 96), "ignore_eos": True,
                "temperature": 1.0 if random.random() < hot_share else 0.0}
        await asyncio.gather(one(session, SD, body), one(session, BASE, body))


async def snapshots(session, done):
    while not done.is_set():
        ms = int(time.time() * 1000)
        try:
            texts = []
            for url in (SD, BASE):
                async with session.get(url + "/metrics") as r:
                    texts.append(await r.text())
            for side, text in zip(("sd", "base"), texts, strict=True):
                with open(os.path.join(OUT, side, f"snap_{ms}.prom"), "w") as f:
                    f.write(text)
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(SNAP_SECONDS)


async def main():
    for side in ("sd", "base"):
        os.makedirs(os.path.join(OUT, side), exist_ok=True)
    times = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        done = asyncio.Event()
        snapper = asyncio.create_task(snapshots(session, done))
        for clients, seconds, hot_share in PHASES:
            start = time.time()
            stop_at = start + seconds
            await asyncio.gather(*(client(session, stop_at, hot_share) for _ in range(clients)))
            times.append([start, time.time()])
            with open(os.path.join(OUT, "phases.json"), "w") as f:
                json.dump(times, f)
        await asyncio.sleep(SNAP_SECONDS * 1.5)  # a page after the last answers
        done.set()
        await snapper


asyncio.run(main())
