"""Fault matrix: one misbehaving target next to a healthy one, real sockets end to end.

Each case runs the real exporter (config → poller → sources → history → derive →
collector → hardened HTTP server) against two fake vLLM servers on 127.0.0.1: a healthy one
and one that misbehaves on one poll (transport faults, bad bodies, counter resets, a model
vanishing). For every case:

* the exporter's /metrics answers 200 within a budget *shorter than the poll timeout*,
  while the bad poll is still running (so a scrape never waits on a target);
* the bad target is down with the expected ``reason`` counted exactly once (or, for resets,
  invalid counters and vanishing models, up with exact values);
* the healthy target's values are exact and its error counters stay 0;
* every ratio in the exposition is within [0, 1] and no value is NaN or infinite;
* the bad target is up with exact values at its first good poll.

Exact values: every engine's counters grow by the same increments each poll, so when resets
and gaps are handled right every windowed signal is a known constant (e.g. acceptance rate
180/450). A reset read as a negative delta, a lost interval, a re-baselined series or a
half-counted model changes it.
"""

from __future__ import annotations

import gzip
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from helpers.faultserver import Blackhole, FaultServer, Raw, Refuse, Serve, Trickle, http_response
from helpers.scrape import parse_exposition, select

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.poll.sources import PARSERS

POLL_DT = 5.0  # seconds between polls on the fake clock
POLL_TIMEOUT = 1.5  # the targets' poll deadline
SCRAPE_BUDGET = 1.0  # the exporter must answer faster than a poll can time out
MAX_BODY = 64 * 1024
WINDOWS = ("1m", "5m", "15m")

# Per poll and engine: drafts, draft tokens, accepted tokens, accepted per position (k=3),
# finished requests, e2e latency seconds.
INC = {
    "0": {"drafts": 100, "tokens": 300, "accepted": 150, "pos": (80, 45, 25), "req": 10,
          "lat": 20.0},
    "1": {"drafts": 50, "tokens": 150, "accepted": 30, "pos": (20, 7, 3), "req": 5,
          "lat": 10.0},
}
_T = {k: sum(INC[e][k] for e in INC) for k in ("drafts", "tokens", "accepted", "req", "lat")}
EXPECTED = {
    "sd_acceptance_rate": _T["accepted"] / _T["tokens"],
    "sd_acceptance_length": 1 + _T["accepted"] / _T["drafts"],
    "sd_draft_length": _T["tokens"] / _T["drafts"],
    "sd_arrival_rate": _T["req"] / POLL_DT,
    "sd_mean_latency_seconds": _T["lat"] / _T["req"],
}
EXPECTED_POS = {str(p): sum(INC[e]["pos"][p] for e in INC) / _T["drafts"] for p in range(3)}
RATIO_METRICS = ("sd_acceptance_rate", "sd_position_acceptance_rate",
                 "sd_position_conditional_acceptance_rate", "sd_token_acceptance_probability",
                 "sd_acceptance_heterogeneity")


class FakeVllm:
    """Cumulative counters of one vLLM server with models × engines."""

    def __init__(self, models: tuple[str, ...]) -> None:
        self.models = models
        self.start = 1_700_000_000.0
        self.v: dict[tuple[str, str], dict[str, float]] = {}
        self.created: dict[tuple[str, str], float] = {}
        for m in models:
            for e in INC:
                self._zero(m, e)

    def _zero(self, m: str, e: str) -> None:
        self.v[(m, e)] = {"drafts": 0, "tokens": 0, "accepted": 0, "req": 0, "lat": 0.0,
                          **{f"pos{p}": 0 for p in range(3)}}
        self.created[(m, e)] = self.start + len(self.created)

    def advance(self, only: tuple[str, str] | None = None) -> None:
        """One poll interval of work on every engine (or on ``only``)."""
        for (m, e), c in self.v.items():
            if only is not None and (m, e) != only:
                continue
            for k in ("drafts", "tokens", "accepted", "req", "lat"):
                c[k] += INC[e][k]
            for p in range(3):
                c[f"pos{p}"] += INC[e]["pos"][p]

    def restart(self) -> None:
        """The whole server restarted during the last interval (new process start time)
        and then worked for one interval's worth: every counter shows one increment."""
        self.start += 3600
        self.created.clear()
        for m in self.models:
            for e in INC:
                self._zero(m, e)
        self.advance()

    def restart_engine(self, model: str, engine: str) -> None:
        """One engine (data-parallel rank) restarted and then worked one increment."""
        self._zero(model, engine)
        self.created[(model, engine)] = self.start + 10_000
        self.advance(only=(model, engine))

    def page(self, models: tuple[str, ...] | None = None,
             override: Callable[[str, str, str], str | None] | None = None) -> str:
        """The /metrics text; ``override(model, engine, family)`` may replace a value."""
        fams = [("vllm:spec_decode_num_drafts", "drafts"),
                ("vllm:spec_decode_num_draft_tokens", "tokens"),
                ("vllm:spec_decode_num_accepted_tokens", "accepted")]
        out = ["# HELP process_start_time_seconds Start time of the process.",
               "# TYPE process_start_time_seconds gauge",
               f"process_start_time_seconds {self.start!r}"]
        keys = [(m, e) for (m, e) in self.v if models is None or m in models]

        def val(m: str, e: str, fam: str, x: float) -> str:
            o = override(m, e, fam) if override else None
            return o if o is not None else repr(float(x))

        for fam, k in fams:
            out += [f"# HELP {fam}_total x", f"# TYPE {fam}_total counter"]
            out += [f'{fam}_total{{engine="{e}",model_name="{m}"}} '
                    f'{val(m, e, fam, self.v[(m, e)][k])}' for m, e in keys]
            out += [f"# TYPE {fam}_created gauge"]
            out += [f'{fam}_created{{engine="{e}",model_name="{m}"}} {self.created[(m, e)]!r}'
                    for m, e in keys]
        fam = "vllm:spec_decode_num_accepted_tokens_per_pos"
        out += [f"# HELP {fam}_total x", f"# TYPE {fam}_total counter"]
        out += [f'{fam}_total{{engine="{e}",model_name="{m}",position="{p}"}} '
                f'{val(m, e, fam, self.v[(m, e)][f"pos{p}"])}' for m, e in keys for p in range(3)]
        out += ["# HELP vllm:request_success_total x", "# TYPE vllm:request_success_total counter"]
        out += [f'vllm:request_success_total{{engine="{e}",finished_reason="stop",'
                f'model_name="{m}"}} {self.v[(m, e)]["req"]!r}' for m, e in keys]
        out += ["# HELP vllm:e2e_request_latency_seconds x",
                "# TYPE vllm:e2e_request_latency_seconds histogram"]
        for m, e in keys:
            c = self.v[(m, e)]
            lab = f'engine="{e}",model_name="{m}"'
            out += [f'vllm:e2e_request_latency_seconds_bucket{{{lab},le="+Inf"}} {c["req"]!r}',
                    f"vllm:e2e_request_latency_seconds_sum{{{lab}}} {c['lat']!r}",
                    f"vllm:e2e_request_latency_seconds_count{{{lab}}} {c['req']!r}"]
        return "\n".join(out) + "\n"


@dataclass(frozen=True)
class Case:
    """``fault(bad_vllm, bad_server)`` sets up the bad poll; ``expect`` is "down" or "up".

    ``reason``: the poll error counted when down. ``absent``: models of the bad target
    without derived series at the fault poll (up cases). ``resets``: expected increase of
    the bad target's reset counter. ``invalid``: the invalid-series counter must grow.
    The signals of model "a" that read an invalid counter are exact at the fault poll too:
    a bad sample is a missed sample, so they have the values of the poll before, the same
    constants here.
    """

    name: str
    fault: Callable[[FakeVllm, FaultServer], None]
    expect: str
    reason: str | None = None
    absent: tuple[str, ...] = ()
    resets: int = 0
    invalid: bool = False


def _serve(text: str | bytes, **kw: object) -> Serve:
    return Serve(text.encode() if isinstance(text, str) else text, **kw)  # type: ignore[arg-type]


def _gzip_bomb() -> bytes:
    return gzip.compress(b"\n" * (16 * 1024 * 1024), compresslevel=9)


CASES = [
    Case("connection_refused", lambda v, s: s.set(Refuse()), "down", "connection"),
    Case("accepts_never_answers", lambda v, s: s.set(Blackhole()), "down", "timeout"),
    Case("trickles_one_byte_per_second",
         lambda v, s: s.set(Trickle(v.page().encode(), interval=1.0)), "down", "timeout"),
    Case("http_500", lambda v, s: s.set(_serve("internal error\n", status=500)), "down",
         "http_status"),
    Case("html_instead_of_metrics",
         lambda v, s: s.set(_serve("<!doctype html><html><head><title>502 Bad Gateway"
                                   "</title></head><body><h1>Bad Gateway</h1></body></html>\n")),
         "down", "parse"),
    Case("truncated_page_mid_line",
         lambda v, s: s.set(_serve(v.page()[: len(v.page()) * 2 // 3].rsplit("=", 1)[0])),
         "down", "parse"),
    Case("truncated_page_inside_unread_family",
         lambda v, s: s.set(_serve(v.page() + 'vllm:kv_cache_usage_perc{engine="0",model_n')),
         "down", "parse"),
    Case("truncated_transfer",
         lambda v, s: s.set(Raw(http_response(v.page().encode()[:500],
                                              content_length=len(v.page())))),
         "down", "connection"),
    Case("random_bytes",
         lambda v, s: s.set(_serve(random.Random(9).randbytes(4096))), "down", "parse"),
    Case("gzip_bomb",
         lambda v, s: s.set(_serve(_gzip_bomb(), headers={"Content-Encoding": "gzip"})),
         "down", "too_large"),
    Case("far_over_size_limit_streamed",
         lambda v, s: s.set(Raw(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                b"Connection: close\r\n\r\n" + b"# pad\n" * (MAX_BODY * 2))),
         "down", "too_large"),
    Case("far_over_size_limit_announced",
         lambda v, s: s.set(_serve(b"# pad\n" * (MAX_BODY * 2))), "down", "too_large"),
    Case("nan_and_inf_values",
         lambda v, s: s.set(_serve(v.page(override=lambda m, e, fam: (
             "NaN" if fam.endswith("accepted_tokens") else
             "+Inf" if fam.endswith("draft_tokens") else None) if m == "a" else None))),
         "up", invalid=True),
    Case("duplicate_series_conflicting",
         lambda v, s: s.set(_serve(v.page() + 'vllm:spec_decode_num_drafts_total{engine="0",'
                                   'model_name="a"} 1.0\n')),
         "up", invalid=True),
    Case("duplicate_series_identical",
         lambda v, s: s.set(_serve(v.page() + 'vllm:spec_decode_num_drafts_total{engine="0",'
                                   f'model_name="a"}} {v.v[("a", "0")]["drafts"]!r}\n')),
         "up"),
    Case("counter_reset_whole_server",
         lambda v, s: (v.restart(), s.set(_serve(v.page()))), "up", resets=1),
    Case("counter_reset_one_engine_of_several",
         lambda v, s: (v.restart_engine("m", "1"), s.set(_serve(v.page()))),
         "up", resets=1),
    Case("model_series_vanish",
         lambda v, s: s.set(_serve(v.page(models=("m",)))), "up", absent=("a",)),
]


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def _errors(series: dict, target: str) -> dict[str, float]:
    return {dict(k[1])["reason"]: v for k, v in
            select(series, "specwatch_target_poll_errors_total", target=target).items()}


def _one(series: dict, name: str, **labels: str) -> float:
    found = select(series, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return next(iter(found.values()))


def _check_sane(series: dict) -> None:
    for (name, _labels), value in series.items():
        assert math.isfinite(value), (name, value)
        if name in RATIO_METRICS:
            assert 0.0 <= value <= 1.0, (name, value)


def _check_exact(series: dict, target: str, model: str) -> None:
    """Every window of (target, model) has the constant values of EXPECTED."""
    for w in WINDOWS:
        for name, want in EXPECTED.items():
            got = select(series, name, target=target, model_name=model, window=w)
            assert list(got.values()) == [pytest.approx(want, rel=1e-9)], (name, w, got)
        for pos, want in EXPECTED_POS.items():
            got = select(series, "sd_position_acceptance_rate", target=target,
                         model_name=model, window=w, position=pos)
            assert list(got.values()) == [pytest.approx(want, rel=1e-9)], (pos, w, got)


def _has_model(series: dict, target: str, model: str) -> bool:
    return bool(select(series, "sd_acceptance_rate", target=target, model_name=model))


def _scrape(url: str) -> tuple[int, float, str]:
    import urllib.request

    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = resp.read().decode()
        return resp.status, time.monotonic() - t0, body


@pytest.fixture
def exporter(tmp_path):
    """Yield a factory: (healthy_url, bad_url, parser) -> (app, clock, scrape_url)."""
    apps: list[ServeApp] = []

    def make(good_url: str, bad_url: str, parser: str) -> tuple[ServeApp, Clock, str]:
        cfg_file = tmp_path / "specwatch.yaml"
        cfg_file.write_text(
            f"global:\n  listen: 127.0.0.1:0\n  parser: {parser}\n"
            f"  timeout: {POLL_TIMEOUT}\n  max_body_bytes: {MAX_BODY}\n"
            f"targets:\n  - {{name: good, url: '{good_url}'}}\n"
            f"  - {{name: bad, url: '{bad_url}'}}\n")
        cfg = app_settings.build_config(str(cfg_file), [], None, POLL_DT)
        clock = Clock()
        app = ServeApp(cfg, clock=clock)
        app.start(poll=False)
        apps.append(app)
        host, port = app.web.address
        return app, clock, f"http://{host}:{port}/metrics"

    yield make
    for app in apps:
        app.stop()


@pytest.mark.usefixtures("fetch_path")
@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fault_isolated_counted_and_recovered(case: Case, parser: str, exporter):
    """One misbehaving target: the exporter answers in time, the bad target is reported
    with the right reason (or exact values for resets and vanishing models), the healthy
    target is untouched, ratios stay in [0, 1], and the bad target recovers at once."""
    good_v, bad_v = FakeVllm(("m",)), FakeVllm(("m", "a"))
    with FaultServer(_serve(good_v.page())) as good_s, \
            FaultServer(_serve(bad_v.page())) as bad_s:
        app, clock, url = exporter(good_s.url, bad_s.url, parser)

        def poll_both(fault: bool = False) -> dict:
            clock.t += POLL_DT
            good_v.advance()
            good_s.set(_serve(good_v.page()))
            app.poller.poll_now("good")
            if fault:
                bad_v.advance()
                case.fault(bad_v, bad_s)
                worker = threading.Thread(target=app.poller.poll_now, args=("bad",))
                worker.start()
                time.sleep(0.2)  # the bad poll is under way (connected, waiting, reading)
                status, took, _ = _scrape(url)
                assert status == 200
                assert took < SCRAPE_BUDGET, f"scrape took {took:.2f}s during a bad poll"
                worker.join(POLL_TIMEOUT + 5)
                assert not worker.is_alive(), "the bad poll outlived its deadline"
            else:
                bad_v.advance()
                bad_s.set(_serve(bad_v.page()))
                app.poller.poll_now("bad")
            status, _, body = _scrape(url)
            assert status == 200
            series = parse_exposition(body)
            _check_sane(series)
            return series

        for _ in range(3):
            before = poll_both()
        _check_exact(before, "good", "m")
        for m in ("m", "a"):
            _check_exact(before, "bad", m)
        resets_before = _one(before, "specwatch_target_resets_total", target="bad")

        # -- the fault -----------------------------------------------------------------
        during = poll_both(fault=True)
        up = select(during, "specwatch_target_up", target="bad")
        errors = _errors(during, "bad")
        if case.expect == "down":
            assert list(up.values()) == [0.0]
            assert errors[case.reason] == 1.0, errors
            assert sum(errors.values()) == 1.0, errors
            assert not any(k[0].startswith("sd_") and dict(k[1]).get("target") == "bad"
                           for k in during), "a down target must expose no derived series"
        else:
            assert list(up.values()) == [1.0]
            assert sum(errors.values()) == 0.0, errors
            for m in ("m", "a"):
                if m in case.absent:
                    assert not _has_model(during, "bad", m)
                else:
                    # An invalid counter of "a" removes only the signals that read it.
                    _check_exact(during, "bad", m)
            resets = _one(during, "specwatch_target_resets_total", target="bad")
            assert resets - resets_before == case.resets
            invalid = _one(during, "specwatch_target_series_dropped_total", target="bad",
                           reason="invalid")
            assert (invalid > 0) == case.invalid
        # The healthy target is unaffected: exact values, no errors.
        assert list(select(during, "specwatch_target_up", target="good").values()) == [1.0]
        assert sum(_errors(during, "good").values()) == 0.0
        _check_exact(during, "good", "m")

        # -- recovery: the first good poll brings the bad target back, exact ----------------
        after = poll_both()
        assert list(select(after, "specwatch_target_up", target="bad").values()) == [1.0]
        assert _errors(after, "bad") == errors, "no new error after recovery"
        for m in ("m", "a"):
            _check_exact(after, "bad", m)
        _check_exact(after, "good", "m")
