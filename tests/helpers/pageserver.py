"""A local HTTP server that serves a scripted sequence of /metrics responses.

Reusable by every suite that needs a fake vLLM/SGLang target (replay, fault matrix, e2e).
Each step is one of:

* :class:`Page` - a normal response (any status, body, headers);
* :class:`Drop` - accept the request, then close the connection without answering
  (the poller sees a connection error);
* :class:`Stall` - answer nothing for ``seconds`` (the poller should time out);
* :class:`Trickle` - send headers, then the body a few bytes at a time.

``advance="manual"``: the test moves with :meth:`PageSequenceServer.set_step` /
:meth:`advance`, and every request gets the current step (deterministic replay).
``advance="per_request"``: each request gets the next step (the last one repeats), for
running the real scheduler against a recorded sequence.

The server binds 127.0.0.1 on a free port; use it as a context manager.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass(frozen=True)
class Page:
    body: str | bytes = ""
    status: int = 200
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Drop:
    """Close the connection without a response."""


@dataclass(frozen=True)
class Stall:
    seconds: float


@dataclass(frozen=True)
class Trickle:
    body: str | bytes
    chunk_bytes: int = 1
    interval_seconds: float = 0.1


Step = Page | Drop | Stall | Trickle


def fixture_pages(directory: Path) -> list[tuple[float, str]]:
    """(capture time in seconds, text) of every ``snap_<ms>.prom`` file, in time order."""
    files = sorted(directory.glob("snap_*.prom"), key=lambda p: int(p.stem.split("_")[1]))
    return [(int(p.stem.split("_")[1]) / 1000.0, p.read_text()) for p in files]


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: ten pollers connecting at once overflow
    # it, the kernel drops the extra SYNs and those clients retry after 1 s (a spurious
    # poll timeout in any test with many targets on one server).
    request_queue_size = 128


class PageSequenceServer:
    def __init__(self, steps: list[Step], advance: str = "manual") -> None:
        if advance not in ("manual", "per_request"):
            raise ValueError(advance)
        self.steps = list(steps)
        self.advance_mode = advance
        self.index = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._stopping = threading.Event()

    # -- control ---------------------------------------------------------------------------
    def set_step(self, index: int) -> None:
        with self._lock:
            self.index = index

    def advance(self) -> None:
        with self._lock:
            self.index = min(self.index + 1, len(self.steps) - 1)

    def _next_step(self) -> Step:
        with self._lock:
            self.requests += 1
            step = self.steps[self.index]
            if self.advance_mode == "per_request":
                self.index = min(self.index + 1, len(self.steps) - 1)
            return step

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/metrics"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> PageSequenceServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                step = owner._next_step()
                if isinstance(step, Drop):
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if isinstance(step, Stall):
                    owner._stopping.wait(step.seconds)
                    self.close_connection = True
                    return
                body = step.body.encode() if isinstance(step.body, str) else step.body
                if isinstance(step, Trickle):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    for i in range(0, len(body), step.chunk_bytes):
                        if owner._stopping.is_set():
                            break
                        try:
                            self.wfile.write(body[i:i + step.chunk_bytes])
                            self.wfile.flush()
                        except OSError:
                            break
                        time.sleep(step.interval_seconds)
                    self.close_connection = True
                    return
                self.send_response(step.status)
                self.send_header("Content-Type", step.content_type)
                self.send_header("Content-Length", str(len(body)))
                for k, v in step.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> PageSequenceServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
