"""Drive a vLLM server through load phases and save its /metrics every few seconds.

Usage: python drive_load.py URL MODEL OUT_DIR PHASES_JSON
PHASES_JSON: [[clients, seconds, share_at_temperature_1], ...]
Temperature-0 requests make a tiny random model repeat itself (n-gram drafts mostly
accepted); temperature-1 requests make drafts mostly rejected. Needs aiohttp.
"""
import asyncio
import json
import os
import random
import sys
import time

import aiohttp

URL, MODEL, OUT, PHASES = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
SNAP_SECONDS = float(os.environ.get("SNAP_SECONDS", "2"))
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "speculative",
         "decoding", "draft", "verify", "token", "batch", "load", "latency"]


def prompt() -> str:
    return " ".join(random.choice(WORDS) for _ in range(32))


async def client(session, stop_at, hot_share):
    while time.time() < stop_at:
        body = {"model": MODEL, "prompt": prompt(), "max_tokens": random.randint(32, 96),
                "temperature": 1.0 if random.random() < hot_share else 0.0}
        try:
            async with session.post(URL + "/v1/completions", json=body) as r:
                await r.read()
        except aiohttp.ClientError:
            await asyncio.sleep(0.5)


async def snapshots(session, done):
    while not done.is_set():
        try:
            async with session.get(URL + "/metrics") as r:
                text = await r.text()
            with open(os.path.join(OUT, f"snap_{int(time.time() * 1000)}.prom"), "w") as f:
                f.write(text)
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(SNAP_SECONDS)


async def main():
    os.makedirs(OUT, exist_ok=True)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        done = asyncio.Event()
        snapper = asyncio.create_task(snapshots(session, done))
        for clients, seconds, hot_share in PHASES:
            stop_at = time.time() + seconds
            await asyncio.gather(*(client(session, stop_at, hot_share) for _ in range(clients)))
        done.set()
        await snapper


asyncio.run(main())
