"""Polls of one URL on one direct-transport session, as the poller makes them."""

from __future__ import annotations

from specwatch.poll.fetch import client as fetch


def poll_direct(url: str, times: int = 2) -> list[str]:
    """``times`` polls of ``url`` on one :class:`~specwatch.poll.fetch.client.DirectSession`
    (one keep-alive connection while the server keeps it), closed after: the pages."""
    target = fetch.PollTarget(name="t", url=url)
    session = fetch.DirectSession(target.url)
    try:
        return [fetch.fetch(session, target) for _ in range(times)]
    finally:
        session.close()
