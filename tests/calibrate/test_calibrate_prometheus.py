"""Calibration from Prometheus history, against a REAL Prometheus (Debian package).

A simulated vLLM history with known coefficients (tests/promsim.py) is backfilled into a TSDB
with `promtool tsdb create-blocks-from openmetrics`, served by the `prometheus` binary on a
free port, pulled through the HTTP API (query_range), cut into steady windows and fitted.
One server for the module: starting it is the slow part (~1 s).
"""

import json
import time

import pytest
import yaml
from promsim import ALPHA, MODEL, TRUE, backfill, default_phases, openmetrics_history
from promsim import running_prometheus as prometheus_server

from specwatch import model
from specwatch.calibrate.fit import FitOptions, fit_system
from specwatch.calibrate.prometheus import (
    PrometheusQuery,
    parse_duration,
    parse_time,
    read_prometheus,
)
from specwatch.cli import main
from specwatch.common.errors import ConfigError, SpecwatchError
from specwatch.model.params import load_params


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """(url, start, end) of a running Prometheus holding 3.7 h of simulated vLLM history."""
    work = tmp_path_factory.mktemp("prom")
    end = time.time() - 600
    text, start = openmetrics_history(default_phases(), end, kv_cache_tokens=KV_TOKENS)
    backfill(text, work / "tsdb")
    with prometheus_server(work / "tsdb", work) as url:
        yield url, start, end


#: The KV cache each server states (draft length -> tokens): the drafter takes memory.
KV_TOKENS = {0: 262144, 2: 196608, 4: 196608}


def _query(history, **kw):
    url, start, end = history
    args = dict(
        url=url,
        start=str(start),
        end=str(end + 60),
        step="60s",
        selector=f'model_name="{MODEL}"',
        min_window="5m",
        timeout=10,
    )
    args.update(kw)
    return PrometheusQuery.from_args(**args)


def test_steady_windows_recover_each_phase(history):
    """18 phases (k in 0/2/4, two workloads, three loads) give 18 windows whose λ, p, g, k
    and E are the simulated ones; SD off has E = 1; per-position acceptance is α^(i+1)."""
    points = read_prometheus(_query(history), progress=False)
    assert len(points) == len(default_phases()) == 18
    for point, phase in zip(points, default_phases(), strict=True):
        assert point.arrival_rate == pytest.approx(phase.arrival_rate, rel=0.01)
        assert point.draft_length == phase.k
        assert point.generation_tokens == pytest.approx(phase.generation_tokens, rel=1e-6)
        assert point.prompt_tokens == pytest.approx(phase.prompt_tokens, rel=1e-6)
        e = float(model.acceptance_length_from_alpha(ALPHA, phase.k)) if phase.k else 1.0
        assert point.acceptance_length == pytest.approx(e, rel=0.01)
        if phase.k:
            assert point.per_position == pytest.approx(
                [ALPHA ** (i + 1) for i in range(phase.k)], rel=1e-6
            )
        assert point.system == MODEL and point.source.startswith(f"prometheus {MODEL} ")
        # What the server stated in vllm:cache_config_info while the window ran.
        assert point.kv_cache_tokens == KV_TOKENS[phase.k]


def test_fit_from_prometheus_recovers_known_coefficients(history):
    """The six-coefficient fit on the windows recovers the verify and draft costs within 5%,
    and the speedup and break-even the true model predicts within 2% (latencies carry ±2%
    noise; a_p and b_p are a few percent of a 3–18 s request, so they are looser)."""
    points = read_prometheus(_query(history), progress=False)
    fit = fit_system(MODEL, points, FitOptions())
    assert fit.mode == "six-coefficient" and fit.n_excluded == 0
    assert fit.r2 > 0.99 and fit.leave_one_k_out_mape < 0.02
    c = fit.coefficients
    for name in ("a_v", "b_v", "a_d", "b_d"):
        assert getattr(c, name) == pytest.approx(getattr(TRUE, name), rel=0.05), name
    assert c.a_p == pytest.approx(TRUE.a_p, abs=0.05)
    assert c.b_p == pytest.approx(TRUE.b_p, abs=0.002)
    for k in (2, 4):
        e = float(model.acceptance_length_from_alpha(ALPHA, k))
        want = float(model.speedup(TRUE, 0.0, k, e, 150, 200))
        assert float(model.speedup(c, 0.0, k, e, 150, 200)) == pytest.approx(want, rel=0.02)
        want_be = float(model.breakeven_arrival_rate(TRUE, k, e, 150, 200))
        assert float(model.breakeven_arrival_rate(c, k, e, 150, 200)) == pytest.approx(
            want_be, rel=0.05
        )


def test_cli_prometheus_writes_params(history, tmp_path, capsys):
    """`specwatch calibrate --prometheus URL --start --end --out` end to end."""
    url, start, end = history
    out = tmp_path / "prom.yaml"
    code = main(
        [
            "calibrate",
            "--prometheus",
            url,
            "--start",
            str(start),
            "--end",
            str(end + 60),
            "--selector",
            f'{{model_name="{MODEL}"}}',
            "--out",
            str(out),
            "--json",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    s = json.loads(captured.out)["systems"][MODEL]
    assert s["n_points"] == 18 and s["r2"] > 0.99
    doc = yaml.safe_load(out.read_text())
    assert doc["system"] == MODEL
    assert any(d.startswith(f"prometheus {url}") for d in doc["provenance"]["data"])
    # The servers' stated capacity is recorded and is the model's capacity (facts, not
    # fits), whatever the fit's form (these runs are fitted by the linear one).
    assert doc["server_capacity"] == {"kv_cache_tokens": 262144.0,
                                      "kv_cache_tokens_sd": 196608.0}
    coef = load_params(out).coefficients
    assert (coef.kv_cache_tokens, coef.kv_cache_tokens_sd) == (262144.0, 196608.0)


def test_selector_matching_nothing_is_an_input_error(history):
    """A selector that matches no series says so (and which range was asked)."""
    with pytest.raises(ConfigError, match="no vllm:e2e_request_latency_seconds_count"):
        read_prometheus(_query(history, selector='model_name="nope"'), progress=False)


def test_min_window_longer_than_any_phase_finds_nothing(history):
    with pytest.raises(ConfigError, match="no steady window of at least 3600 s"):
        read_prometheus(_query(history, min_window="1h"), progress=False)


def test_unreachable_prometheus_exits_2(capsys):
    """A closed port is reported with the URL, exit 2, no traceback."""
    code = main(
        ["calibrate", "--prometheus", "http://127.0.0.1:9", "--start", "now-1h", "--timeout", "2"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "cannot reach Prometheus at http://127.0.0.1:9" in err


def test_prometheus_refusal_is_reported(history):
    """Prometheus's own error (a bad regex in a matcher) comes back in the message."""
    with pytest.raises(SpecwatchError, match="Prometheus refused"):
        read_prometheus(_query(history, selector='model_name=~"("'), progress=False)


@pytest.mark.parametrize(
    ("text", "seconds"), [("60s", 60), ("5m", 300), ("1.5h", 5400), ("250ms", 0.25), ("30", 30)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text, "--step") == seconds


def test_parse_time_forms():
    """RFC 3339 with zone, Unix seconds, now and now-DURATION; a zone-less time is refused."""
    assert parse_time("2026-01-23T10:00:00Z", "--start") == 1769162400.0
    assert parse_time("1769162400", "--start") == 1769162400.0
    assert parse_time("now-1h", "--start", now=10_000.0) == 6400.0
    with pytest.raises(ConfigError, match="no time zone"):
        parse_time("2026-01-23T10:00:00", "--start")
    with pytest.raises(ConfigError, match="--step: expected a duration"):
        parse_duration("ten", "--step")


def test_bad_selector_and_range_are_refused_before_any_request():
    with pytest.raises(ConfigError, match="--selector"):
        PrometheusQuery.from_args(
            url="http://x:1",
            start="now-1h",
            end="now",
            step="60s",
            selector="model_name=qwen",
            min_window="5m",
            timeout=1,
        )
    with pytest.raises(ConfigError, match="must be after --start"):
        PrometheusQuery.from_args(
            url="http://x:1",
            start="now",
            end="now-1h",
            step="60s",
            selector="",
            min_window="5m",
            timeout=1,
        )


def test_unreadable_stated_capacity_is_fitted_not_fatal(history, monkeypatch, capsys):
    """Prometheus refusing the capacity query (one instance serving several model names
    cannot be joined by instance) costs the stated capacity only: the windows are the same,
    they state none, and a note says so."""
    from specwatch.calibrate import prometheus as prom

    real = prom.query_range

    def refuse_capacity(session, q, expr, start, end):
        if prom.CACHE_CONFIG in expr:
            raise prom.PrometheusError("Prometheus refused it: many-to-many matching")
        return real(session, q, expr, start, end)

    monkeypatch.setattr(prom, "query_range", refuse_capacity)
    points = read_prometheus(_query(history), progress=False)
    assert len(points) == 18 and all(p.kv_cache_tokens is None for p in points)
    assert "stated KV cache could not be read" in capsys.readouterr().err
