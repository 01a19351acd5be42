"""What the application hands each plug-in: the typed host interface.

A plug-in's ``install(host, ...)`` registers itself through a :class:`PluginHost` and its own
typed settings (built by the application from the plug-in's config section), never the
application object: target and forget hooks on the poll pipeline, family builders on the
collector, routes on the web server, a start/stop lifecycle. What one plug-in needs from
another arrives as an explicit typed argument the application passes, or through the snapshot
slots
(:class:`specwatch.poll.snapshot.Slot`); plug-ins never import each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from specwatch.expose.collector import FamilyBuilder
from specwatch.poll.pipeline import ForgetHook, TargetHook
from specwatch.web.routing import Handler


class PluginHost(Protocol):
    """The registries a plug-in may use (ServeApp provides one).

    Registrations take effect in call order: hooks run, and families render, in the order
    plug-ins were installed. Everything is registered before the application starts."""

    def add_target_hook(self, hook: TargetHook) -> None:
        """``hook(target) -> target`` on every derived target snapshot, before publishing."""
        ...

    def add_forget_hook(self, hook: ForgetHook) -> None:
        """``hook(target, model, reason)`` when the poll path forgets a model."""
        ...

    def add_family_builder(self, builder: FamilyBuilder) -> None:
        """``builder(snapshot) -> metric families`` rendered on every scrape."""
        ...

    def add_route(self, path: str, handler: Handler, own_auth: bool = False) -> None:
        """An HTTP route; ``own_auth``: the handler checks its own credentials (the web
        config's basic auth does not apply to it)."""
        ...

    def add_lifecycle(self, start: Callable[[], None], stop: Callable[[], None]) -> None:
        """Called when the application starts (after the HTTP server is bound) and stops."""
        ...
