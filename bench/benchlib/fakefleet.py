"""A fake fleet of vLLM servers in one process: ``/t<i>/metrics`` for i in 0..N-1.

Run as its own process (``python bench/benchlib/fakefleet.py --paths 500 ...``) so its CPU is
not the exporter's. It prints ``PORT <port>`` on stdout when it listens on 127.0.0.1.

* Each path replays the 49 recorded vLLM 0.32 pages (counters advancing, one server restart
  included), starting at a different page per path, one page further per request.
* Every response is pre-encoded (status line, headers and body), so serving one costs a
  dictionary lookup and a socket write: one asyncio loop keeps up with hundreds of requests
  per second on persistent (keep-alive) connections.
* A ``--slow-share`` of the paths (every k-th one) answer only after ``--slow-delay``
  seconds (by default longer than the exporter's poll deadline: the poll times out).
* A ``--dead-share`` of the paths (every k-th one, offset by k/2 from the slow ones) take the
  request and never answer.
* ``GET /stats``: the pages served so far (JSON ``{"served": n}``), so a benchmark divides
  CPU by the pages actually fetched.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib.pages import real_pages


def responses() -> list[bytes]:
    out = []
    for page in real_pages():
        body = page.encode()
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        out.append(head + body)
    return out


NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


class Fleet:
    def __init__(self, paths: int, slow_every: int, slow_delay: float,
                 dead_every: int = 0) -> None:
        self.pages = responses()
        self.count = [i % len(self.pages) for i in range(paths)]
        self.dead = {i for i in range(paths) if dead_every and i % dead_every == dead_every // 2}
        self.slow = {i for i in range(paths) if slow_every and i % slow_every == 0} - self.dead
        self.slow_delay = slow_delay
        self.served = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                if path == "/stats":
                    body = json.dumps({"served": self.served}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    await writer.drain()
                    continue
                parts = path.strip("/").split("/")
                i = int(parts[0][1:]) if parts and parts[0][:1] == "t" and \
                    parts[0][1:].isdigit() else -1
                if not 0 <= i < len(self.count):
                    writer.write(NOT_FOUND)
                    await writer.drain()
                    continue
                if i in self.dead:
                    await asyncio.Event().wait()  # never answers
                if i in self.slow:
                    await asyncio.sleep(self.slow_delay)
                page = self.pages[self.count[i] % len(self.pages)]
                self.count[i] += 1
                self.served += 1
                writer.write(page)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


async def serve(args: argparse.Namespace) -> None:
    slow_every = round(1 / args.slow_share) if args.slow_share > 0 else 0
    dead_every = round(1 / args.dead_share) if args.dead_share > 0 else 0
    fleet = Fleet(args.paths, slow_every, args.slow_delay, dead_every)
    server = await asyncio.start_server(fleet.handle, "127.0.0.1", args.port, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(f"PORT {port} SLOW {len(fleet.slow)} DEAD {len(fleet.dead)}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", type=int, default=500)
    parser.add_argument("--slow-share", type=float, default=0.1)
    parser.add_argument("--slow-delay", type=float, default=10.0)
    parser.add_argument("--dead-share", type=float, default=0.0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
