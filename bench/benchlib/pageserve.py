"""A vLLM stand-in for bench_poll.py: serves /metrics from recorded pages over HTTP/1.1.

``--page real``: the 49 recorded vLLM 0.32 pages (about 55 KB); ``--page big``: each of them
grown to 2 MB (14 models x 4 engines, bench/benchlib/pages.py). ``--mode same`` serves the
last page on every request (an idle server: the bytes never change); ``--mode changing``
serves the next recorded page on each request (counters move, as on a busy server).
``GET /stats``: requests served so far per User-Agent product (JSON), so the benchmark
divides CPU by polls actually made. Prints ``PORT <port>`` when listening.
"""

from __future__ import annotations

import argparse
import http.server
import itertools
import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchlib.pages import multiply, real_pages


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--page", choices=["real", "big"], required=True)
    parser.add_argument("--mode", choices=["same", "changing"], required=True)
    args = parser.parse_args()
    pages = real_pages()
    if args.page == "big":
        pages = [multiply(p, 14, 4) for p in pages]
    bodies = [p.encode() for p in pages]
    if args.mode == "same":
        bodies = bodies[-1:]
    cycle = itertools.cycle(bodies)
    lock = threading.Lock()
    counts: dict[str, int] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            agent = (self.headers.get("User-Agent") or "-").split("/")[0]
            with lock:
                if self.path == "/stats":
                    body = json.dumps(counts).encode()
                else:
                    counts[agent] = counts.get(agent, 0) + 1
                    body = next(cycle)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
