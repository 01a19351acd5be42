"""prometheus_client custom collector: fresh metric families from the latest snapshot.

Why a custom collector: families are rebuilt on every scrape from one immutable snapshot, so
a label set that disappears (a target down, a model unloaded) disappears from the next
scrape, and two concurrent scrapes never race on shared metric objects
(writing_exporters.md, "Collectors"). collect() does no I/O and never raises: a failure in
one part is logged and the rest, health series first, is still exposed (in client_python a
raising collector turns the whole page into a 500).

Extension point: ``add_family_builder(fn)`` with ``fn(snapshot) -> Iterable[Metric]`` renders
what plug-ins' hooks put in the snapshot's slots (live predictions, controller state).

Exposition rendered once per snapshot: a large fleet's page holds tens of thousands of series,
too many to rebuild as metric objects on every scrape. :meth:`SpecwatchCollector.exposition`
writes the health and derived families as bytes directly:
each target's sample lines are rendered once per :class:`TargetSnapshot` (at publish time when
the pipeline calls :meth:`SpecwatchCollector.prerender` and a scrape is due before the target's
next poll, or after the poller's run of polls with :meth:`SpecwatchCollector.prerender_later`;
else at the first scrape that sees it) and a scrape joins the cached pieces; the
joined page (text, OpenMetrics, and its gzip deflate stream) is cached per :class:`Snapshot`.
The bytes equal prometheus_client's encoding of :meth:`collect` (tests/expose/test_exposition.py),
which stays the interface for registry users. Builders are rendered per scrape (they may read
state that changes between snapshots, such as receiver counters) unless registered with
``per_snapshot=True``.

Names, types, labels and HELP texts come from `specwatch.expose.metricdefs`, the table the
metrics reference is generated from.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from specwatch.expose import metricdefs
from specwatch.expose.gzipstream import deflate_parts
from specwatch.expose.gzipstream import gzip_join as gzip_join  # serve imports it from here
from specwatch.poll.snapshot import (
    MODEL_DROP_REASONS,
    POLL_ERROR_REASONS,
    SERIES_DROP_REASONS,
    Snapshot,
    TargetSnapshot,
)
from specwatch.poll.windows import derive

log = logging.getLogger(__name__)

FamilyBuilder = Callable[[Snapshot], Iterable[Metric]]

#: Names of the per-window gauges, in exposition order (type, labels, HELP: metricdefs).
WINDOW_GAUGES: tuple[str, ...] = (
    derive.ACCEPTANCE_RATE, derive.ACCEPTANCE_LENGTH, derive.DRAFT_LENGTH,
    derive.TOKEN_ACCEPTANCE_PROBABILITY, derive.ACCEPTANCE_HETEROGENEITY, derive.ARRIVAL_RATE,
    derive.EFFECTIVE_BATCH_SIZE, derive.MEAN_PROMPT_TOKENS, derive.MEAN_GENERATION_TOKENS,
    derive.MEAN_LATENCY_SECONDS, derive.BIMODALITY_COEFFICIENT,
)
#: The draft-length-independent α, labelled ``method`` (``derive.acceptance_alpha``).
ALPHA = derive.ACCEPTANCE_ALPHA
POSITION_GAUGES: tuple[str, ...] = (
    derive.POSITION_ACCEPTANCE_RATE, derive.POSITION_CONDITIONAL_ACCEPTANCE_RATE,
)


class SpecwatchCollector(Collector):
    """Renders ``get_snapshot()`` on each collect(); :meth:`exposition` serves cached bytes."""

    def __init__(self, get_snapshot: Callable[[], Snapshot | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: when scrapes and publishes happen (see :meth:`prerender`)."""
        self._get_snapshot = get_snapshot
        self._clock = clock
        self._scrapes: collections.deque[float] = collections.deque(maxlen=4)
        self._published: dict[str, float] = {}  # target -> when it was last published
        self._builders: list[FamilyBuilder] = []
        self._snapshot_builders: list[FamilyBuilder] = []
        # What a target's lines were rendered from; a target published again lets go of its
        # entry (see _render_ahead).
        self._targets: dict[str, tuple[TargetSnapshot | None, Mapping[str, bytes]]] = {}
        # The page cache names its snapshot by a weak reference: a snapshot the pipeline has
        # replaced is freed at once (with the target snapshots it alone holds: their
        # windows and their models' frozen history arrays), not held until the next scrape.
        self._page: tuple[weakref.ref[Snapshot] | None, dict[str, bytes | tuple]] = (None, {})
        self._page_lock = threading.RLock()  # held by exposition_deflate around a render
        self._scraped = False  # prerender only once someone reads the exposition
        #: Targets published and left for :meth:`render_queued` (the newest of each).
        self._queued: dict[str, TargetSnapshot] = {}
        self._queue_lock = threading.Lock()

    def add_family_builder(self, builder: FamilyBuilder, per_snapshot: bool = False) -> None:
        """Register extra families rendered from the snapshot (see module docstring).

        ``per_snapshot=True``: the builder reads nothing but the snapshot (and constant
        configuration), so its families are cached with the snapshot's page; by default a
        builder runs on every scrape."""
        (self._snapshot_builders if per_snapshot else self._builders).append(builder)
        self._page = (None, {})

    def describe(self) -> list[Metric]:
        # Unchecked collector: the family set depends on the data.
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        if snap is None:
            return
        parts: list[Callable[[Snapshot], Iterable[Metric]]] = [
            health_families, derived_families, *self._snapshot_builders, *self._builders]
        yield from _build(parts, snap)

    def _snapshot(self) -> Snapshot | None:
        try:
            return self._get_snapshot()
        except Exception:
            log.exception("could not read the snapshot")
            return None

    def per_scrape(self) -> Collector:
        """A collector of the builders that run on every scrape (the rest of the page
        :meth:`exposition` does not hold)."""
        return _PerScrape(self)

    # -- cached exposition -------------------------------------------------------------------
    def prerender(self, target: TargetSnapshot) -> None:
        """Render one target's sample lines now (a pipeline publish listener), so a scrape
        only joins cached bytes. Never raises.

        Only what a scrape will read is rendered ahead: nothing before the first scrape (an
        exporter nobody scrapes yet pays nothing), and not a snapshot that the target's
        next poll will replace before the next scrape is due (polled every 5 s and scraped
        every 15 s, two renders in three would never be served). A scrape that comes
        earlier than expected renders what it finds stale itself, so the bytes served are
        the same either way; only where the CPU is spent moves."""
        try:
            if self._render_ahead(target):
                self._target_lines(target)
        except Exception:
            log.exception("rendering the series of target %s failed", target.name)

    def prerender_later(self, target: TargetSnapshot) -> None:
        """:meth:`prerender`, the render left for :meth:`render_queued` (a pipeline publish
        listener of ``specwatch serve``, whose poller calls ``render_queued`` after each run of
        polls). Never raises.

        Why later: a poll interleaved with a render runs each on caches the other has just
        filled with its own code and data, so a batch's renders run together after its polls
        (``bench/bench_fleet.py`` measures it). A snapshot replaced before the queue is
        rendered is not rendered (the newest of a target is); a scrape that comes first
        renders what it finds stale itself, so the bytes served are the same either way."""
        try:
            ahead = self._render_ahead(target)
            with self._queue_lock:
                if ahead:
                    self._queued[target.name] = target
                else:  # an older snapshot still queued is replaced: nobody reads it
                    self._queued.pop(target.name, None)
        except Exception:
            log.exception("queueing the render of target %s failed", target.name)

    def render_queued(self) -> None:
        """Render the targets :meth:`prerender_later` queued. Never raises."""
        with self._queue_lock:
            if not self._queued:
                return
            queued, self._queued = self._queued, {}
        for target in queued.values():
            self._lines_or_logged(target)

    def _render_ahead(self, target: TargetSnapshot) -> bool:
        """Should ``target``, published now, be rendered before a scrape asks for it (see
        :meth:`prerender`)? Records when it was published, and lets go of the lines
        rendered for an earlier snapshot of the target (a scrape of the new one renders it
        again anyway), so that snapshot and its lines are freed now, not at the next scrape.
        The entry's value is replaced, never removed: a scrape may be iterating over them."""
        cached = self._targets.get(target.name)
        if cached is not None and cached[0] is not target:
            self._targets[target.name] = _RELEASED
        if not self._scraped:
            return False
        now = self._clock()
        last = self._published.get(target.name)
        self._published[target.name] = now
        return last is None or not self._replaced_before_scrape(now, now - last)

    def _replaced_before_scrape(self, now: float, gap: float) -> bool:
        """Will a target published now, and polled again about ``gap`` seconds later (its
        last interval), be published again before the next scrape? Scrapes are expected
        every shortest gap between the last four pages rendered (two Prometheus replicas at
        different offsets shorten it: more renders, never fewer than needed), with a margin
        for jitter of 0.1 s plus 1% of that period; unknown before three scrapes.

        The margin only moves CPU: a target skipped here whose next poll comes after the
        scrape after all is rendered by that scrape, so the margin is wasted renders bought
        to keep scrapes short. Each extra second of it renders one poll in ``period`` more
        (at 5 s polls and 15 s scrapes, a tenth of the period plus 0.2 s rendered 45% of the
        polls, 0.25 s plus 2% 37%, 0.1 s plus 1% 35%, against the 33% a scrape reads). What
        it covers is how much later than its last interval predicts a poll is published:
        the scheduler starts a poll up to a tick after its slot, the same tick for every
        interval, so the interval from one poll to the next varies by a few tens of
        milliseconds (start lateness at most 0.25 s with 500 targets, ``bench/bench_fleet.py``;
        with this margin no scrape of a 30 s sample there had to render a target itself)."""
        times = list(self._scrapes)
        if len(times) < 3:
            return False
        period = min(b - a for a, b in itertools.pairwise(times))
        return now + gap + 0.01 * period + 0.1 < times[-1] + period

    def _target_lines(self, target: TargetSnapshot) -> Mapping[str, bytes]:
        cached = self._targets.get(target.name)
        if cached is not None and cached[0] is target:
            return cached[1]
        lines = render_target(target)
        self._targets[target.name] = (target, lines)
        return lines

    def _lines_or_logged(self, target: TargetSnapshot) -> Mapping[str, bytes] | None:
        """:meth:`_target_lines`, or None with the error logged: one target whose render
        fails must not take the others (or the scrape) with it."""
        try:
            return self._target_lines(target)
        except Exception:
            log.exception("rendering the series of target %s failed", target.name)
            return None

    def exposition(self, snap: Snapshot | None, openmetrics: bool) -> bytes:
        """The health, derived and per-snapshot builder families of ``snap`` as exposition
        bytes (OpenMetrics without its ``# EOF`` line: the per-scrape part comes after)."""
        return self._exposition(snap, openmetrics, keep=True)

    def _exposition(self, snap: Snapshot | None, openmetrics: bool, keep: bool) -> bytes:
        """``keep``: cache the bytes with the snapshot (a gzip scrape keeps only their
        deflate stream: the megabytes of text are not held between scrapes)."""
        parts = self._exposition_parts(snap, openmetrics, keep)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _exposition_parts(self, snap: Snapshot | None, openmetrics: bool, keep: bool
                          ) -> list[bytes]:
        """:meth:`_exposition` as pieces to be joined (the cached bytes as one piece)."""
        if snap is None:
            return []
        key = "om" if openmetrics else "text"
        self._scraped = True
        with self._page_lock:
            page_snap, cache = self._page
            if page_snap is None or page_snap() is not snap:
                cache = {}
                self._page = (weakref.ref(snap), cache)
                self._scrapes.append(self._clock())
            body = cache.get(key)
            if body is not None:
                return [body]  # type: ignore[list-item]
            parts = self._render_page(snap, openmetrics)
            if keep:
                body = b"".join(parts)
                cache[key] = body
                parts = [body]
            for name in [n for n in self._targets.keys() | self._published.keys()
                         if n not in snap.targets]:  # a target gone from the set
                self._targets.pop(name, None)
                self._published.pop(name, None)
        return parts

    def exposition_deflate(self, snap: Snapshot | None, openmetrics: bool
                           ) -> tuple[bytes, int, int]:
        """:meth:`exposition` as a raw deflate stream ended by a sync flush (not final), with
        its CRC-32 and length: the start of a gzip body (see :func:`gzip_join`)."""
        key = "om.z" if openmetrics else "text.z"
        with self._page_lock:  # concurrent scrapes of one snapshot render it once
            page_snap, cache = self._page
            got = cache.get(key) if page_snap is not None and page_snap() is snap else None
            if got is None:
                got = deflate_parts(self._exposition_parts(snap, openmetrics, keep=False))
                page_snap, cache = self._page
                if page_snap is not None and page_snap() is snap:
                    cache[key] = got
        return got  # type: ignore[return-value]

    def _render_page(self, snap: Snapshot, openmetrics: bool) -> list[bytes]:
        """The page's pieces in order (family headers and each target's lines of the
        family), to be joined or compressed piece by piece."""
        out: list[bytes] = []
        try:
            out.append(_header("specwatch_build_info", openmetrics))
            out.append(f'specwatch_build_info{{version="{_esc(snap.version)}"}} 1.0\n'
                       .encode())
            per_target = []
            for t in snap.targets.values():
                lines = self._lines_or_logged(t)
                if lines is not None:
                    per_target.append(lines)
            for name, always in _FAMILY_ORDER:
                chunks = [c for lines in per_target if (c := lines.get(name))]
                if chunks or always:
                    out.append(_header(name, openmetrics))
                    out.extend(chunks)
        except Exception:
            log.exception("rendering the exposition failed")
        if self._snapshot_builders:
            fams = list(_build(self._snapshot_builders, snap))
            encoded = _encode(fams, openmetrics)
            out.append(encoded[:-len(_EOF)] if openmetrics else encoded)
        return out


_EOF = b"# EOF\n"
#: A target's cache entry once a newer snapshot of it was published (see _render_ahead).
_RELEASED: tuple[None, Mapping[str, bytes]] = (None, {})


class _PerScrape(Collector):
    def __init__(self, parent: SpecwatchCollector) -> None:
        self._parent = parent

    def collect(self) -> Iterator[Metric]:
        snap = self._parent._snapshot()
        if snap is not None:
            yield from _build(self._parent._builders, snap)


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _encode(families: list[Metric], openmetrics: bool) -> bytes:
    from prometheus_client.exposition import generate_latest

    reg = _Families(families)
    return om_exposition.generate_latest(reg) if openmetrics else generate_latest(reg)


def _build(parts: Iterable[Callable[[Snapshot], Iterable[Metric]]], snap: Snapshot
           ) -> Iterator[Metric]:
    for part in parts:
        try:
            families = list(part(snap))
        except Exception:
            log.exception("building metric families with %r failed", part)
            continue
        yield from families


#: The health families, in exposition order (after specwatch_build_info).
HEALTH: tuple[str, ...] = (
    "specwatch_target_up", "specwatch_target_poll_duration_seconds",
    "specwatch_target_poll_errors", "specwatch_target_resets",
    "specwatch_target_series_dropped", "specwatch_target_models_dropped",
    "specwatch_target_label_values_truncated",
    "specwatch_target_last_success_timestamp_seconds",
)


def _family(name: str) -> Metric:
    d = metricdefs.BY_NAME[name]
    return {"gauge": metricdefs.gauge, "counter": metricdefs.counter,
            "histogram": metricdefs.histogram}[d.type](name)


def health_families(snap: Snapshot) -> Iterator[Metric]:
    """specwatch_build_info and the per-target health series (always present per target)."""
    info = metricdefs.gauge("specwatch_build_info")
    info.add_metric([snap.version], 1.0)
    yield info
    fams = {name: _family(name) for name in HEALTH}
    up = fams["specwatch_target_up"]
    duration = fams["specwatch_target_poll_duration_seconds"]
    errors = fams["specwatch_target_poll_errors"]
    resets = fams["specwatch_target_resets"]
    dropped = fams["specwatch_target_series_dropped"]
    models_dropped = fams["specwatch_target_models_dropped"]
    truncated = fams["specwatch_target_label_values_truncated"]
    last = fams["specwatch_target_last_success_timestamp_seconds"]
    for name, t in snap.targets.items():
        up.add_metric([name], 1.0 if t.up else 0.0)
        if t.poll_duration_seconds is not None:
            duration.add_metric([name], t.poll_duration_seconds)
        for reason in POLL_ERROR_REASONS:
            errors.add_metric([name, reason], float(t.errors_total.get(reason, 0)))
        resets.add_metric([name], float(t.counter_resets_total))
        for reason in SERIES_DROP_REASONS:
            dropped.add_metric([name, reason], float(t.series_dropped_total.get(reason, 0)))
        for reason in MODEL_DROP_REASONS:
            models_dropped.add_metric([name, reason],
                                      float(t.models_dropped_total.get(reason, 0)))
        truncated.add_metric([name], float(t.label_values_truncated_total))
        if t.last_success_timestamp is not None:
            last.add_metric([name], t.last_success_timestamp)
    yield from fams.values()


def server_families(snap: Snapshot, max_num_seqs: Mapping[str, int] | None = None
                    ) -> Iterator[Metric]:
    """What each target that is up says about its capacity (its page's cache_config_info),
    and the max_num_seqs its configuration states; a value nobody stated has no series."""
    tokens = metricdefs.gauge(SERVER_KV_CACHE_TOKENS)
    blocks = metricdefs.gauge(SERVER_KV_CACHE_BLOCKS)
    seqs = metricdefs.gauge(SERVER_MAX_NUM_SEQS)
    for name, t in snap.targets.items():
        if max_num_seqs and name in max_num_seqs:
            seqs.add_metric([name], float(max_num_seqs[name]))
        server = t.server if t.up else None
        if server is None:
            continue
        if server.kv_cache_tokens is not None:
            tokens.add_metric([name], server.kv_cache_tokens)
        if server.num_gpu_blocks is not None:
            blocks.add_metric([name], server.num_gpu_blocks)
    for fam in (tokens, blocks, seqs):
        if fam.samples:
            yield fam


def derived_families(snap: Snapshot, keep_empty: bool = False) -> Iterator[Metric]:
    """The sd_* series of every target that is up (a down target exposes none); families
    without samples are left out unless ``keep_empty``."""
    gauges = {name: metricdefs.gauge(name) for name in WINDOW_GAUGES}
    alpha = metricdefs.gauge(ALPHA)
    pos_gauges = {name: metricdefs.gauge(name) for name in POSITION_GAUGES}
    configured = metricdefs.gauge("sd_draft_length_configured")
    samples = metricdefs.histogram("sd_acceptance_rate_samples")
    for tname, target in snap.targets.items():
        if not target.up:
            continue
        for mname, model in target.models.items():
            if model.configured_k is not None:
                configured.add_metric([tname, mname], float(model.configured_k))
            for w in model.windows:
                for name, value in w.values.items():
                    fam = gauges.get(name)
                    if fam is not None:
                        fam.add_metric([tname, mname, w.window], value)
                got = derive.acceptance_alpha(w)
                if got is not None:
                    alpha.add_metric([tname, mname, w.window, got[1]], got[0])
                for name, per_pos in w.positions.items():
                    fam = pos_gauges.get(name)
                    if fam is not None:
                        for pos, value in per_pos.items():
                            fam.add_metric([tname, mname, w.window, pos], value)
            h = model.samples
            if h is not None:
                buckets = [(_fmt_bound(b), float(n)) for b, n in
                           zip(h.bounds, h.cumulative_counts, strict=False)]
                buckets.append(("+Inf", float(h.count)))
                samples.add_metric([tname, mname], buckets, h.sum)
    for fam in (*gauges.values(), alpha, *pos_gauges.values(), configured, samples):
        if fam.samples or keep_empty:
            yield fam


def _fmt_bound(b: float) -> str:
    return repr(float(b))


# -- the cached exposition: one target's sample lines, written directly ----------------------
_WINDOW_NAMES = frozenset(WINDOW_GAUGES)
_POSITION_NAMES = frozenset(POSITION_GAUGES)
CONFIGURED = "sd_draft_length_configured"
#: What the server states about its capacity (server_families).
SERVER_KV_CACHE_TOKENS = "sd_server_kv_cache_tokens"
SERVER_KV_CACHE_BLOCKS = "sd_server_kv_cache_blocks"
SERVER_MAX_NUM_SEQS = "sd_server_max_num_seqs"
SAMPLES = "sd_acceptance_rate_samples"
#: Family order of the page after specwatch_build_info, and whether a family with no sample
#: is still written (health families are; derived ones only when they have data).
_FAMILY_ORDER: tuple[tuple[str, bool], ...] = (
    *((name, True) for name in HEALTH),
    *((name, False) for name in WINDOW_GAUGES),
    (ALPHA, False),
    *((name, False) for name in POSITION_GAUGES),
    (CONFIGURED, False), (SAMPLES, False))


def _esc(v: str) -> str:
    """A label value as both exposition formats write it."""
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


_HEADERS: dict[tuple[str, bool], bytes] = {}


def _header(name: str, openmetrics: bool) -> bytes:
    """The HELP/TYPE lines of one family, from prometheus_client's own encoder."""
    got = _HEADERS.get((name, openmetrics))
    if got is None:
        fam = _empty_family(name)
        got = _encode([fam], openmetrics)
        if openmetrics:
            got = got[:-len(_EOF)]
        _HEADERS[(name, openmetrics)] = got
    return got


def _empty_family(name: str) -> Metric:
    return _family(name)


def go_float(d: float) -> str:
    """``floatToGoString(d)`` (prometheus_client), the same string, faster for most values.

    A finite float below 1e6 is its ``repr``: the library checks for ±Inf and NaN, then
    rewrites positive values whose integer part has more than six digits in Go's exponent
    form, and neither applies. A render writes about a hundred values per target, and those
    checks cost more than the ``repr``. Anything else (ints, ±Inf, NaN, 1e6 and up)
    goes to the library. ``tests/expose/test_exposition.py`` compares both on every kind of float.
    """
    if type(d) is float and -math.inf < d < 1e6:
        return repr(d)
    return floatToGoString(d)


def render_target(t: TargetSnapshot) -> dict[str, bytes]:
    """The sample lines of one target, per family name: exactly what prometheus_client
    writes for the samples :func:`health_families` and :func:`derived_families` give this
    target (labels sorted by name, values by ``floatToGoString``: :func:`go_float`)."""
    fg = go_float
    out: dict[str, list[str]] = {}
    tl = f'target="{_esc(t.name)}"'
    out["specwatch_target_up"] = [f"specwatch_target_up{{{tl}}} {fg(1.0 if t.up else 0.0)}\n"]
    if t.poll_duration_seconds is not None:
        out["specwatch_target_poll_duration_seconds"] = [
            f"specwatch_target_poll_duration_seconds{{{tl}}} {fg(t.poll_duration_seconds)}\n"]
    out["specwatch_target_poll_errors"] = [
        f'specwatch_target_poll_errors_total{{reason="{r}",{tl}}} '
        f"{fg(float(t.errors_total.get(r, 0)))}\n" for r in POLL_ERROR_REASONS]
    out["specwatch_target_resets"] = [
        f"specwatch_target_resets_total{{{tl}}} {fg(float(t.counter_resets_total))}\n"]
    out["specwatch_target_series_dropped"] = [
        f'specwatch_target_series_dropped_total{{reason="{r}",{tl}}} '
        f"{fg(float(t.series_dropped_total.get(r, 0)))}\n" for r in SERIES_DROP_REASONS]
    out["specwatch_target_models_dropped"] = [
        f'specwatch_target_models_dropped_total{{reason="{r}",{tl}}} '
        f"{fg(float(t.models_dropped_total.get(r, 0)))}\n" for r in MODEL_DROP_REASONS]
    out["specwatch_target_label_values_truncated"] = [
        f"specwatch_target_label_values_truncated_total{{{tl}}} "
        f"{fg(float(t.label_values_truncated_total))}\n"]
    if t.last_success_timestamp is not None:
        out["specwatch_target_last_success_timestamp_seconds"] = [
            f"specwatch_target_last_success_timestamp_seconds{{{tl}}} "
            f"{fg(t.last_success_timestamp)}\n"]
    if t.up:
        for mname, model in t.models.items():
            ml = f'model_name="{_esc(mname)}"'
            if model.configured_k is not None:
                out.setdefault(CONFIGURED, []).append(
                    f"{CONFIGURED}{{{ml},{tl}}} {fg(float(model.configured_k))}\n")
            for w in model.windows:
                # The label set after the name, the same for every value of the window:
                # written once per window, not once per line.
                wl = f'window="{_esc(w.window)}"'
                labels = f"{{{ml},{tl},{wl}}} "
                for name, value in w.values.items():
                    if name in _WINDOW_NAMES:
                        line = f"{name}{labels}{fg(value)}\n"
                        lines = out.get(name)
                        if lines is None:
                            out[name] = [line]
                        else:
                            lines.append(line)
                got = derive.acceptance_alpha(w)
                if got is not None:
                    out.setdefault(ALPHA, []).append(
                        f'{ALPHA}{{method="{got[1]}",{ml},{tl},{wl}}} {fg(got[0])}\n')
                for name, per_pos in w.positions.items():
                    if name in _POSITION_NAMES:
                        lines = out.setdefault(name, [])
                        head, tail = f'{name}{{{ml},position="', f'",{tl},{wl}}} '
                        for pos, value in per_pos.items():
                            lines.append(f"{head}{_esc(pos)}{tail}{fg(value)}\n")
            h = model.samples
            if h is not None:
                lines = out.setdefault(SAMPLES, [])
                heads, inf_head = _bucket_heads(tuple(h.bounds))
                rest = f"{ml},{tl}}} "
                pairs = list(zip(heads, h.cumulative_counts, strict=False))
                for head, n in pairs:
                    lines.append(f"{head}{rest}{fg(float(n))}\n")
                lines.append(f"{inf_head}{rest}{fg(float(h.count))}\n")
                # The first bucket's bound (+Inf without one) is not negative (as written and
                # read back: repr gives back the same float).
                if (float(h.bounds[0]) >= 0 if pairs else True) and h.sum is not None:
                    lines.append(f"{SAMPLES}_count{{{ml},{tl}}} {fg(float(h.count))}\n")
                    lines.append(f"{SAMPLES}_sum{{{ml},{tl}}} {fg(h.sum)}\n")
    return {name: "".join(lines).encode() for name, lines in out.items()}


@functools.lru_cache(maxsize=64)
def _bucket_heads(bounds: tuple[float, ...]) -> tuple[tuple[str, ...], str]:
    """``sd_acceptance_rate_samples_bucket{le="<bound>",`` for each bound, and for +Inf: the
    same few bound sets on every render (one per configuration), formatted once."""
    return (tuple(f'{SAMPLES}_bucket{{le="{_fmt_bound(b)}",' for b in bounds),
            f'{SAMPLES}_bucket{{le="+Inf",')
