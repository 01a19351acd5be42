"""A window's signals, computed when first read: the mappings of :class:`WindowSignals`.

Why: every poll derives every window of every model, but only a reader needs the
signals: the exposition (a target polled every 5 s and scraped every 15 s has two
snapshots in three that nobody renders), a live prediction hook, the controller. So
:func:`specwatch.poll.windows.derive.derive_model` decides at poll time which windows exist and
their span, requests and drafts (the cheap fields), and hands each window its row of counter
increases; the formulas run on the first read of ``values``, ``positions`` or
``histograms``, once for the three. The Sarle coefficient of the window's samples, the
dearest signal, waits one step longer: for the first read of that key (or of the whole
``values`` mapping).

A snapshot stays a value: what a window computes from (its row of increases, its samples, a
copy of the model's gauges, the plan: a :class:`Source`) is its own and never written to,
so a read after an hour more of polls gives what computing at once would have given, key
order included (``tests/poll/test_derive_lazy.py``). Two threads reading at once may both
compute and store equal results. Should a computation raise (a bug), the window reads as
empty (no series: "no data means no series") and the error is logged, instead of an
exception in a scrape.

Copies, pickles and ``dict()`` hold the computed values: nothing lazy crosses them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np

from specwatch.poll.signals import BIMODALITY_COEFFICIENT
from specwatch.poll.windows import bimodality

log = logging.getLogger(__name__)


class Signals(NamedTuple):
    """What one window's formulas give: ``samples`` is the window's per-poll acceptance
    samples when there are enough for the bimodality coefficient (else None)."""

    values: dict[str, float]
    positions: dict[str, dict[str, float]]
    histograms: dict[str, tuple[tuple[float, float], ...]]
    samples: np.ndarray | None


_EMPTY = Signals({}, {}, {}, None)


def _or_logged(compute: Callable[[], Any], fallback: Any, what: str) -> Any:
    """``compute()``, or ``fallback`` with the error logged: a bug in a computation run on a
    first read must never raise in a scrape or a hook."""
    try:
        return compute()
    except Exception:
        log.exception("%s failed", what)
        return fallback


class Source(Protocol):
    """What the windows of one model at one poll are computed from."""

    def signals(self, key: Any) -> Signals:
        """The signals of the window ``key`` names (computed now)."""


class _Lazy(Mapping[str, Any]):
    """A read-only mapping that stands for the dict :meth:`_resolved` gives: it reads, compares,
    prints, copies and pickles as that dict."""

    __slots__ = ()

    def _resolved(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self._resolved()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._resolved().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._resolved()

    def __iter__(self) -> Iterator[str]:
        return iter(self._resolved())

    def __len__(self) -> int:
        return len(self._resolved())

    def items(self):  # type: ignore[override]  # dict's views: the exposition's loop
        return self._resolved().items()

    def keys(self):  # type: ignore[override]
        return self._resolved().keys()

    def values(self):  # type: ignore[override]
        return self._resolved().values()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._resolved() == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # (a mapping, like dict)

    def __repr__(self) -> str:
        return repr(self._resolved())

    def __reduce__(self) -> tuple:  # pickles (and copies) as the plain dict it stands for
        return (dict, (self._resolved(),))


class WindowValues(_Lazy):
    """A window's ``values``: the window's signals are computed on the first read of
    anything (here or in a :class:`LazyMapping` of the same window), the bimodality
    coefficient on the first read of its key, of the whole mapping, ``len`` or ``in`` of
    that key. Reading any other key never computes the coefficient.

    Objects matter: a snapshot lives one poll interval, long enough for the
    garbage collector to move what it holds to older generations, whose passes walk all of
    it. So a window is three objects, as many as computing at once made (this, a
    :class:`LazyMapping` for positions, the ``WindowSignals``); what the windows compute from
    is one :class:`Source` per model and poll, let go of once each window has read it, and
    the results are kept in slots here."""

    __slots__ = ("_all", "_histograms", "_key", "_positions", "_samples", "_source", "_values")

    def __init__(self, source: Source, key: Any) -> None:
        """``key``: which window of ``source`` (a tuple of numbers: untracked by the
        collector after its first pass)."""
        self._source: Source | None = source
        self._key = key
        self._values: dict[str, float] | None = None  # set last: the signals are computed
        self._positions: dict[str, dict[str, float]] = {}
        self._histograms: dict[str, tuple[tuple[float, float], ...]] = {}
        self._samples: np.ndarray | None = None
        self._all: dict[str, float] | None = None  # the values, coefficient included

    def _plain(self) -> dict[str, float]:
        """The values, with the coefficient only if it was already computed (the window's
        signals computed now if not yet)."""
        values = self._values
        if values is not None:
            return values
        source = self._source
        if source is None:  # another thread stored the result between the two reads
            return self._values  # type: ignore[return-value]
        out = _or_logged(lambda: source.signals(self._key), _EMPTY,
                         "deriving a window's signals")
        self._positions, self._histograms, self._samples = out[1:]
        self._values = out.values  # last: a reader that sees it sees the others
        self._source = None
        return out.values

    def part(self, index: int) -> Mapping[str, Any]:
        """Field ``index`` of :class:`Signals` (1: positions, 2: histograms)."""
        self._plain()
        return self._positions if index == 1 else self._histograms

    def _resolved(self) -> dict[str, float]:
        done = self._all
        if done is not None:
            return done
        values = self._plain()
        samples = self._samples
        if samples is None:
            done = self._all  # None: too few samples, or another thread has just finished
            if done is not None:
                return done
        else:
            try:
                bc = bimodality.coexistence_coefficient(samples)
            except Exception:  # pragma: no cover - a bug; keep the rest of the window
                log.exception("bimodality coefficient failed")
                bc = None
            if bc is not None and math.isfinite(bc):
                values = {**values, BIMODALITY_COEFFICIENT: bc}
        self._all = values
        self._samples = None  # after: a reader that then finds no samples finds this
        return values

    def __getitem__(self, key: str) -> float:
        if key == BIMODALITY_COEFFICIENT:
            return self._resolved()[key]
        return self._plain()[key]

    def get(self, key: str, default: float | None = None) -> float | None:  # type: ignore[override]
        if key == BIMODALITY_COEFFICIENT:
            return self._resolved().get(key, default)
        return self._plain().get(key, default)

    def __contains__(self, key: object) -> bool:
        if key == BIMODALITY_COEFFICIENT:
            return key in self._resolved()
        return key in self._plain()


class LazyMapping(_Lazy):
    """A window's ``positions`` or ``histograms`` (field ``index`` of :class:`Signals`),
    computed on first read."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: WindowValues, index: int) -> None:
        self._values = values
        self._index = index

    def _resolved(self) -> dict[str, Any]:
        return self._values.part(self._index)


class Deferred(_Lazy):
    """A mapping that ``compute()`` gives on its first read: a target's models
    (:func:`specwatch.poll.windows.derive.derive_models`). ``compute`` must read only what it
    owns (a frozen copy of the history), so the result is the same whenever it runs; it is
    let go of once it has run. A computation that raises (a bug) reads as an empty mapping
    (no series: "no data means no series") and is logged, instead of an exception in a
    scrape or a hook. Two threads reading at once may both compute; each gets an equal
    result."""

    __slots__ = ("_compute", "_done")

    def __init__(self, compute: Callable[[], dict[str, Any]]) -> None:
        self._compute: Callable[[], dict[str, Any]] | None = compute
        self._done: dict[str, Any] | None = None

    def _resolved(self) -> dict[str, Any]:
        done = self._done
        if done is not None:
            return done
        compute = self._compute
        if compute is None:  # another thread stored the result between the two reads
            return self._done  # type: ignore[return-value]
        done = _or_logged(compute, {}, "deriving the models of a target")
        self._done = done  # first: a reader that finds no compute finds this
        self._compute = None
        return done


def window_mappings(source: Source, key: Any, positions: bool, histograms: bool
                    ) -> tuple[WindowValues, Mapping[str, Any], Mapping[str, Any]]:
    """``values``, ``positions`` and ``histograms`` of the window ``key`` of ``source``,
    computed together on the first read of any of them; ``positions`` or ``histograms``
    False: that one is always empty (a plain empty dict, which the garbage collector does
    not track)."""
    values = WindowValues(source, key)
    return (values, LazyMapping(values, 1) if positions else {},
            LazyMapping(values, 2) if histograms else {})
