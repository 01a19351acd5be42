"""Live model series end to end: pages served over HTTP → the real exporter (poller,
sources, history, derive, model hook, collector, HTTP) → scraped /metrics, against numbers
computed by hand.

The parameters file is the worked-example system of tests/model/test_model.py (a_p=0.1, b_p=0.01,
a_v=0.02, b_v=0.001, a_d=0.002, b_d=0.0005). Two pages 300 s apart give the 5m window:
300 finished requests (λ = 1 req/s), mean prompt and generation length 100, 10000 drafts
of 3 tokens (k = 3), 8750 accepted (E = 1 + 8750/10000 = 1.875, α = 0.5) with positions
5000/2500/1250 (profile 0.5, 0.25, 0.125: exactly i.i.d. α = 0.5). By hand at λ = 1:

    L_SD = (4.46/3)/(1 − 0.43/3) = 4.46/2.57 = 1.735409 s     ρ_SD = 0.43/3 = 0.143333
    L_D  = 2.1/(1 − 0.11)       = 2.1/0.89  = 2.359551 s
    S    = 2.1·2.57/(0.89·4.46) = 5.397/3.9694 = 1.359651
    λ*   = 1.84/0.4124 = 4.461687 req/s
    best k: L(0) = 2.359551, L(1) = 1.566667/0.89 = 1.760300,
            L(2) = 1.471429/(1 − 0.124286) = 1.680261, L(3) = 1.735409,
            L(4) = 1.545161/(1 − 0.164839) = 1.850136  → k = 2
"""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest
from helpers.pageserver import Page, PageSequenceServer
from helpers.scrape import fetch_text, parse_exposition, select

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.common.errors import ConfigError
from specwatch.model import predict, speedup, throughput_ceiling
from specwatch.model.params import load_params
from specwatch.plugins.live.plugin import CURVE_POINTS, speedup_curve

PARAMS = """\
system: worked-example
coefficients: {a_p: 0.1, b_p: 0.01, a_v: 0.02, b_v: 0.001, a_d: 0.002, b_d: 0.0005}
"""
MODEL = "m"


def vllm_page(req=0, p_sum=0.0, g_sum=0.0, lat_sum=0.0, drafts=0, tok=0, acc=0,
              per_pos=(0, 0, 0), with_generation=True, waiting=None, model=MODEL) -> str:
    """A minimal vLLM v1 page with the families the model needs."""
    lab = f'engine="0",model_name="{model}"'
    out = [
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
        f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {tok}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {acc}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {n}'
          for i, n in enumerate(per_pos)),
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{lab},finished_reason="stop"}} {req}',
    ]
    hists = [("vllm:request_prompt_tokens", p_sum), ("vllm:e2e_request_latency_seconds", lat_sum)]
    if with_generation:
        hists.append(("vllm:request_generation_tokens", g_sum))
    for name, total in hists:
        out += [f"# TYPE {name} histogram",
                f'{name}_bucket{{{lab},le="+Inf"}} {req}',
                f"{name}_count{{{lab}}} {req}",
                f"{name}_sum{{{lab}}} {total}"]
    if waiting is not None:
        out += ["# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{lab}}} {waiting}"]
    return "\n".join(out) + "\n"


ZERO = vllm_page()
STEADY = vllm_page(req=300, p_sum=30000, g_sum=30000, lat_sum=520.0, drafts=10000, tok=30000,
                   acc=8750, per_pos=(5000, 2500, 1250))
# λ = 2100/300 = 7 req/s: ρ_SD = 7·0.43/3 = 1.003333, past saturation for k = 3.
SATURATED = vllm_page(req=2100, p_sum=210000, g_sum=210000, lat_sum=9000.0, drafts=10000,
                      tok=30000, acc=8750, per_pos=(5000, 2500, 1250))
NO_GENERATION = vllm_page(req=300, p_sum=30000, lat_sum=520.0, drafts=10000, tok=30000,
                          acc=8750, per_pos=(5000, 2500, 1250), with_generation=False)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def run_pages(tmp_path, pages, extra_target: bool = False, target_extra: str = "",
              global_extra: str = "", raw: bool = False, params: str = PARAMS):
    """Serve `pages` 300 s apart to an exporter configured with the params file; scrape
    (the parsed series, or the exposition text with raw=True)."""
    (tmp_path / "params.yaml").write_text(params)
    with PageSequenceServer([Page(p) for p in pages]) as server:
        cfg_text = (
            "global:\n  poll_interval: 5\n" + global_extra
            + f"targets:\n  - name: a\n    url: {server.url}\n    params: "
            f"{tmp_path / 'params.yaml'}\n" + target_extra
        )
        if extra_target:
            cfg_text += f"  - name: b\n    url: {server.url}\n"
        (tmp_path / "specwatch.yaml").write_text(cfg_text)
        cfg = app_settings.build_config(str(tmp_path / "specwatch.yaml"), [], "127.0.0.1:0", None)
        clock = Clock()
        app = ServeApp(cfg, clock=clock)
        app.start(poll=False)
        try:
            host, port = app.web.address
            for i in range(len(pages)):
                server.set_step(i)
                clock.t = 1_000_000.0 + 300.0 * i
                for t in cfg.targets:
                    app.poller.poll_now(t.name)
            text = fetch_text(f"http://{host}:{port}/metrics")
            return text if raw else parse_exposition(text)
        finally:
            app.stop()


def one(series, name, **labels):
    found = select(series, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return next(iter(found.values()))


def test_live_predictions_match_hand_computation(tmp_path):
    s = run_pages(tmp_path, [ZERO, STEADY])
    lab = {"target": "a", "model_name": MODEL, "window": "5m"}
    assert one(s, "sd_arrival_rate", **lab) == pytest.approx(1.0)  # the input, as derived
    assert one(s, "sd_model_valid", **lab) == 1.0
    assert one(s, "sd_predicted_speedup", **lab) == pytest.approx(5.397 / 3.9694, rel=1e-9)
    assert one(s, "sd_predicted_latency_seconds", mode="sd", **lab) == pytest.approx(
        4.46 / 2.57, rel=1e-9)
    assert one(s, "sd_predicted_latency_seconds", mode="nosd", **lab) == pytest.approx(
        2.1 / 0.89, rel=1e-9)
    assert one(s, "sd_model_utilization", **lab) == pytest.approx(0.43 / 3, rel=1e-9)
    assert one(s, "sd_breakeven_arrival_rate", **lab) == pytest.approx(1.84 / 0.4124, rel=1e-9)
    # SD's throughput ceiling, its own series: 1/C2 of SD (utilisation λ·C2 = 0.43/3 at λ = 1).
    assert one(s, "sd_throughput_ceiling_arrival_rate", **lab) == pytest.approx(3 / 0.43,
                                                                                 rel=1e-9)
    assert one(s, "sd_optimal_draft_length", **lab) == 2.0
    assert one(s, "specwatch_model_configured", target="a") == 1.0


def test_a_measured_sd_ceiling_below_the_crossing_is_the_ceiling_not_a_break_even(tmp_path):
    """A measured ceiling of k = 3 on these lengths at 3 req/s (below the fit's λ* of
    4.46 req/s, where no SD still serves): the speedup does not fall to 1 before SD stops
    keeping up, so there is no break-even (+Inf) and SD's throughput ceiling is 3 req/s, the
    numbers `specwatch predict` gives with the same file."""
    params = PARAMS + (
        "calibrated_range:\n  max_arrival_rate: 5.0\n  max_in_flight: 10.0\n"
        "  draft_lengths: [0, 3]\n  measured_ceilings:\n"
        "  - {k: 3, prompt_tokens: 100, generation_tokens: 100, arrival_rate: 3.0}\n")
    s = run_pages(tmp_path, [ZERO, STEADY], params=params)
    lab = {"target": "a", "model_name": MODEL, "window": "5m"}
    assert one(s, "sd_breakeven_arrival_rate", **lab) == math.inf
    assert one(s, "sd_throughput_ceiling_arrival_rate", **lab) == 3.0
    assert one(s, "sd_model_valid", **lab) == 1.0  # λ = 1 req/s: below it, the fit's number


def test_saturated_load_is_invalid_without_nonsense(tmp_path):
    """Past saturation: valid 0, no speedup or latency, utilisation shows how far past;
    break-even and best k (k = 1 keeps ρ = 7·0.11 = 0.77) are still given."""
    s = run_pages(tmp_path, [ZERO, SATURATED])
    lab = {"target": "a", "model_name": MODEL, "window": "5m"}
    assert one(s, "sd_model_valid", **lab) == 0.0
    assert not select(s, "sd_predicted_speedup")
    assert not select(s, "sd_predicted_latency_seconds")
    assert one(s, "sd_model_utilization", **lab) == pytest.approx(7 * 0.43 / 3, rel=1e-9)
    assert one(s, "sd_breakeven_arrival_rate", **lab) == pytest.approx(1.84 / 0.4124, rel=1e-9)
    assert one(s, "sd_optimal_draft_length", **lab) == 1.0


def test_missing_inputs_give_valid_zero_only(tmp_path):
    """No generation-length histogram: the model cannot run; only sd_model_valid 0 shows."""
    s = run_pages(tmp_path, [vllm_page(with_generation=False), NO_GENERATION])
    lab = {"target": "a", "model_name": MODEL, "window": "5m"}
    assert one(s, "sd_model_valid", **lab) == 0.0
    for name in ("sd_predicted_speedup", "sd_predicted_latency_seconds",
                 "sd_breakeven_arrival_rate", "sd_throughput_ceiling_arrival_rate",
                 "sd_optimal_draft_length", "sd_model_utilization"):
        assert not select(s, name), name


def test_target_without_params_has_no_model_series(tmp_path):
    s = run_pages(tmp_path, [ZERO, STEADY], extra_target=True)
    assert one(s, "specwatch_model_configured", target="b") == 0.0
    assert one(s, "specwatch_model_configured", target="a") == 1.0
    assert not select(s, "sd_model_valid", target="b")
    assert select(s, "sd_arrival_rate", target="b")  # derived series are unaffected


def test_model_window_is_configurable(tmp_path):
    """model_window: 15m feeds the model from the 15m window (labelled window="15m")."""
    s = run_pages(tmp_path, [ZERO, STEADY], target_extra="    model_window: 15m\n")
    assert one(s, "sd_model_valid", target="a", window="15m") == 1.0
    assert not select(s, "sd_model_valid", window="5m")


def test_bad_params_file_stops_serve_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(PARAMS.replace("a_v: 0.02", "a_v: -1"))
    (tmp_path / "specwatch.yaml").write_text(
        f"targets:\n  - name: a\n    url: http://127.0.0.1:9/metrics\n    params: {bad}\n")
    cfg = app_settings.build_config(str(tmp_path / "specwatch.yaml"), [], "127.0.0.1:0", None)
    with pytest.raises(ConfigError, match=r"targets\[0\]\.params: .*coefficients\.a_v"):
        ServeApp(cfg)


def test_unknown_model_window_is_a_config_error(tmp_path):
    (tmp_path / "params.yaml").write_text(PARAMS)
    (tmp_path / "specwatch.yaml").write_text(
        "global:\n  model_window: 2m\ntargets:\n  - name: a\n"
        f"    url: http://127.0.0.1:9/metrics\n    params: {tmp_path / 'params.yaml'}\n")
    cfg = app_settings.build_config(str(tmp_path / "specwatch.yaml"), [], "127.0.0.1:0", None)
    with pytest.raises(ConfigError, match=r"global\.model_window: window '2m' is not computed"):
        ServeApp(cfg)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_model_series_pass_promtool(tmp_path):
    """The new families follow Prometheus naming and exposition rules (real promtool)."""
    text = run_pages(tmp_path, [ZERO, STEADY], raw=True)
    assert "sd_predicted_speedup{" in text
    check = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                           capture_output=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_latency_error_ratio_is_predicted_over_measured_minus_one(tmp_path):
    """Measured mean latency 520/300 s against the predicted 4.46/2.57 s: the signed error
    the SDModelDrift alert watches; valid carries an empty reason."""
    s = run_pages(tmp_path, [ZERO, STEADY])
    lab = {"target": "a", "model_name": MODEL, "window": "5m"}
    assert one(s, "sd_model_latency_error_ratio", **lab) == pytest.approx(
        (4.46 / 2.57) / (520 / 300) - 1, rel=1e-9)
    assert one(s, "sd_model_valid", reason="", **lab) == 1.0


def test_invalid_predictions_say_why_in_the_reason_label(tmp_path):
    s = run_pages(tmp_path, [ZERO, SATURATED])
    assert one(s, "sd_model_valid", reason="saturated") == 0.0
    assert not select(s, "sd_model_latency_error_ratio")  # no prediction, no error
    s = run_pages(tmp_path, [vllm_page(with_generation=False), NO_GENERATION])
    assert one(s, "sd_model_valid", reason="missing_input") == 0.0


def test_load_beyond_the_calibrated_range_is_not_valid(tmp_path):
    """λ = 1 req/s against a file calibrated up to 0.5 req/s: beyond_calibrated_load, the
    numbers still come with the error ratio, but no speedup is vouched for."""
    params = PARAMS + ("calibrated_range: {max_arrival_rate: 0.5, max_in_flight: 100, "
                       "draft_lengths: [0, 3]}\n")
    s = run_pages(tmp_path, [ZERO, STEADY], params=params)
    assert one(s, "sd_model_valid", reason="beyond_calibrated_load") == 0.0
    assert not select(s, "sd_predicted_speedup")
    assert select(s, "sd_model_latency_error_ratio")


def test_waiting_requests_mean_queueing(tmp_path):
    waiting = vllm_page(req=300, p_sum=30000, g_sum=30000, lat_sum=520.0, drafts=10000,
                        tok=30000, acc=8750, per_pos=(5000, 2500, 1250), waiting=12)
    s = run_pages(tmp_path, [ZERO, waiting])
    assert one(s, "sd_model_valid", reason="queueing") == 0.0


def test_provenance_mismatch_is_a_series_and_a_log_line(tmp_path, caplog):
    params = PARAMS + "provenance: {model: Qwen/Qwen3-32B}\n"
    with caplog.at_level("WARNING"):
        s = run_pages(tmp_path, [ZERO, STEADY], params=params)
    assert one(s, "sd_model_provenance_mismatch", field="model") == 1.0
    lines = [r.getMessage() for r in caplog.records if "provenance model" in r.getMessage()]
    assert len(lines) == 1 and "Qwen/Qwen3-32B" in lines[0] and "re-calibrate" in lines[0]
    s = run_pages(tmp_path, [ZERO, STEADY], params=PARAMS + f"provenance: {{model: {MODEL}}}\n")
    assert not select(s, "sd_model_provenance_mismatch")


# ---- The speedup curve (the XY chart's model line).

#: The worked example's throughput ceilings: 1/C2 with C2_SD = 0.43/3 and C2_D = 0.11; the
#: SD system's is the lower. The curve spans 0 .. 0.9 x that (the validity ceiling).
LAM_MAX = 3 / 0.43
INPUTS = {"k": 3.0, "e": 1.875, "p": 100.0, "g": 100.0}  # the STEADY window's k, E, p, g


def curve(series, **labels) -> dict[str, tuple[float, float]]:
    """point -> (arrival rate, speedup) of the scraped curve; x and y present together."""
    xs = {dict(k[1])["point"]: v for k, v in
          select(series, "sd_model_curve_arrival_rate", **labels).items()}
    ys = {dict(k[1])["point"]: v for k, v in
          select(series, "sd_model_speedup_curve", **labels).items()}
    assert xs.keys() == ys.keys(), "every curve point has both its rate and its speedup"
    return {pt: (xs[pt], ys[pt]) for pt in xs}


def test_speedup_curve_is_the_closed_form_speedup_on_the_grid(tmp_path):
    """24 points from 0 to 0.9 x the lower ceiling, each the closed-form speedup at its rate
    for the window's inputs; it crosses 1 at the break-even (λ* = 4.461687 by hand)."""
    s = run_pages(tmp_path, [ZERO, STEADY])
    lab = {"target": "a", "model_name": MODEL, "window": "5m"}
    pts = curve(s, **lab)
    assert sorted(pts) == [f"{i:02d}" for i in range(CURVE_POINTS)]
    coef = load_params(tmp_path / "params.yaml").model()
    for pt, (lam, sp) in pts.items():
        assert lam == pytest.approx(0.9 * LAM_MAX * int(pt) / CURVE_POINTS, rel=1e-12)
        want = float(speedup(coef, lam, INPUTS["k"], INPUTS["e"], INPUTS["p"], INPUTS["g"]))
        assert sp == pytest.approx(want, rel=1e-12), pt
    assert pts["00"][1] == pytest.approx(2.1 * 3 / 4.46, rel=1e-12)  # L_D/L_SD at λ = 0
    be = 1.84 / 0.4124
    assert all((sp > 1) == (lam < be) for lam, sp in pts.values())
    assert any(sp < 1 for _, sp in pts.values()) and any(sp > 1 for _, sp in pts.values())


def test_no_inputs_no_curve(tmp_path):
    """No generation lengths: the model cannot run, so no curve series at all (never 0)."""
    s = run_pages(tmp_path, [vllm_page(with_generation=False), NO_GENERATION])
    assert one(s, "sd_model_valid", reason="missing_input") == 0.0
    assert not select(s, "sd_model_speedup_curve")
    assert not select(s, "sd_model_curve_arrival_rate")
    s = run_pages(tmp_path, [ZERO, ZERO])  # no traffic in the window: no inputs either
    assert not select(s, "sd_model_speedup_curve")


def test_curve_points_outside_the_calibrated_range_are_absent(tmp_path):
    """Calibrated up to 2 req/s (+10 % margin): only the grid points at or below 2.2 req/s
    exist; a draft length calibration never measured leaves no point at all."""
    params = PARAMS + ("calibrated_range: {max_arrival_rate: 2.0, max_in_flight: 100, "
                       "draft_lengths: [0, 3]}\n")
    pts = curve(run_pages(tmp_path, [ZERO, STEADY], params=params))
    want = [i for i in range(CURVE_POINTS) if 0.9 * LAM_MAX * i / CURVE_POINTS <= 2.2]
    assert sorted(pts) == [f"{i:02d}" for i in want] and len(want) == 9
    params = PARAMS + ("calibrated_range: {max_arrival_rate: 20, max_in_flight: 100, "
                       "draft_lengths: [0, 2]}\n")
    s = run_pages(tmp_path, [ZERO, STEADY], params=params)
    assert one(s, "sd_model_valid", reason="extrapolated_k") == 0.0
    assert not select(s, "sd_model_speedup_curve")


def test_curve_stays_while_the_live_load_is_saturated_or_queueing(tmp_path):
    """The curve depends on the measured acceptance and lengths, not on the live load: at a
    saturated live load (no sd_predicted_speedup) or with requests waiting it is unchanged."""
    base = curve(run_pages(tmp_path, [ZERO, STEADY]))
    s = run_pages(tmp_path, [ZERO, SATURATED])
    assert not select(s, "sd_predicted_speedup")
    assert curve(s) == base
    waiting = vllm_page(req=300, p_sum=30000, g_sum=30000, lat_sum=520.0, drafts=10000,
                        tok=30000, acc=8750, per_pos=(5000, 2500, 1250), waiting=12)
    s = run_pages(tmp_path, [ZERO, waiting])
    assert one(s, "sd_model_valid", reason="queueing") == 0.0
    assert curve(s) == base


def _models_page(names, **kw) -> str:
    """One page serving several models (each family once, with every model's samples)."""
    blocks: dict[str, list[str]] = {}
    for name in names:
        family = None
        for line in vllm_page(model=name, **kw).splitlines():
            if line.startswith("# TYPE "):
                family = line
                blocks.setdefault(family, [])
            else:
                blocks[family].append(line)
    return "".join(f"{t}\n" + "".join(f"{x}\n" for x in rows) for t, rows in blocks.items())


def test_curve_series_are_bounded_by_points_and_models(tmp_path):
    """Six models on a target capped at max_models 2: two curves of CURVE_POINTS points (two
    series each), whatever the target serves."""
    names = [f"m{i}" for i in range(6)]
    steady = {"req": 300, "p_sum": 30000, "g_sum": 30000, "lat_sum": 520.0, "drafts": 10000,
              "tok": 30000, "acc": 8750, "per_pos": (5000, 2500, 1250)}
    s = run_pages(tmp_path, [_models_page(names), _models_page(names, **steady)],
                  target_extra="    max_models: 2\n")
    ys = select(s, "sd_model_speedup_curve")
    xs = select(s, "sd_model_curve_arrival_rate")
    models = {dict(k[1])["model_name"] for k in ys}
    assert len(models) == 2
    assert len(ys) == len(xs) == 2 * CURVE_POINTS


def test_moe_curve_points_are_valid_moe_speedups(tmp_path):
    """MoE has no closed-form ceiling: the dense part's bounds the grid, the points past the
    true (lower) ceiling are absent, and every point present is the MoE speedup there."""
    (tmp_path / "moe.yaml").write_text(PARAMS + (
        "moe:\n  experts: 64\n  active_experts: 8\n"
        "  expert_coefficients: {a_p: 0.05, b_p: 0.004, a_v: 0.01, b_v: 0.0004}\n"))
    params = load_params(tmp_path / "moe.yaml")
    coef = params.model()
    pts = speedup_curve(params, **INPUTS)
    assert 0 < len(pts) < CURVE_POINTS, "the experts lower the ceiling below the dense bound"
    dense_max = float(throughput_ceiling(coef.dense, **INPUTS))
    idx = [i for i, *_ in pts]
    assert idx == list(range(len(pts))), "valid points are the low-load end of the grid"
    for i, lam, sp, _lo, _hi in pts:
        assert lam == pytest.approx(0.9 * dense_max * i / CURVE_POINTS, rel=1e-12)
        want = float(speedup(coef, lam, **INPUTS))
        assert math.isfinite(want) and sp == pytest.approx(want, rel=1e-12)
    nxt = 0.9 * dense_max * len(pts) / CURVE_POINTS  # the first grid point left out
    assert not bool(predict(coef, nxt, **INPUTS, max_utilization=0.9).valid)


UNCERTAIN = PARAMS + """\
uncertainty:
  level: 0.9
  max_relative_halfwidth: 0.15
  bands:
    - {utilization_below: 0.5, sigma: 0.02, runs: 50}
    - {utilization_below: .inf, sigma: 0.05, runs: 10}
"""


def test_intervals_are_lower_and_upper_gauges_beside_the_point(tmp_path):
    """With an `uncertainty` block every valid point series has its 90% interval as
    `_lower` / `_upper` gauges with the same labels: the fixed point of the fit scaled by
    1 ∓ 1.645·σ (σ = 2% in the band of ρ_SD = 0.143 and of ρ_D = 0.11), by hand."""
    from specwatch.model import Coefficients, latency

    series = run_pages(tmp_path, [ZERO, STEADY], params=UNCERTAIN)
    key = {"target": "a", "window": "5m"}
    coef = Coefficients(a_p=0.1, b_p=0.01, a_v=0.02, b_v=0.001, a_d=0.002, b_d=0.0005)
    d = 1.6448536269514722 * 0.02

    def at(scale, k, e):
        return scale * float(latency(coef, scale * 1.0, k, e, 100, 100).latency)

    sd_lo, sd_hi = at(1 - d, 3, 1.875), at(1 + d, 3, 1.875)
    d_lo, d_hi = at(1 - d, 0, 1.0), at(1 + d, 0, 1.0)
    assert one(series, "sd_predicted_latency_lower_seconds", mode="sd", **key) == \
        pytest.approx(sd_lo, rel=1e-9)
    assert one(series, "sd_predicted_latency_upper_seconds", mode="sd", **key) == \
        pytest.approx(sd_hi, rel=1e-9)
    assert one(series, "sd_predicted_latency_upper_seconds", mode="nosd", **key) == \
        pytest.approx(d_hi, rel=1e-9)
    lo = one(series, "sd_predicted_speedup_lower", **key)
    hi = one(series, "sd_predicted_speedup_upper", **key)
    assert lo == pytest.approx(d_lo / sd_hi, rel=1e-9) and hi == pytest.approx(d_hi / sd_lo,
                                                                                rel=1e-9)
    assert lo < one(series, "sd_predicted_speedup", **key) < hi
    curve = select(series, "sd_model_speedup_curve", **key)
    assert curve and len(select(series, "sd_model_speedup_curve_lower", **key)) == len(curve)


def test_a_wide_interval_is_sensitive_and_withholds_the_numbers(tmp_path):
    """A limit below the interval's half-width: sd_model_valid 0 with reason `sensitive`,
    and no speedup, latency or interval series."""
    params = UNCERTAIN.replace("max_relative_halfwidth: 0.15", "max_relative_halfwidth: 0.01")
    series = run_pages(tmp_path, [ZERO, STEADY], params=params)
    key = {"target": "a", "window": "5m"}
    assert one(series, "sd_model_valid", reason="sensitive", **key) == 0.0
    assert not select(series, "sd_predicted_speedup", **key)
    assert not select(series, "sd_predicted_speedup_lower", **key)


def test_without_an_uncertainty_block_there_are_no_interval_series(tmp_path):
    series = run_pages(tmp_path, [ZERO, STEADY])
    assert select(series, "sd_predicted_speedup", target="a")
    assert not select(series, "sd_predicted_speedup_lower", target="a")
    assert not select(series, "sd_model_speedup_curve_upper", target="a")


def test_the_best_k_is_withheld_where_its_own_prediction_is_declined(tmp_path):
    """sd_optimal_draft_length is the model's fastest k only where that k's prediction is
    vouched for: with a ±1% interval limit every k at this load is `sensitive`, so there is
    no best k to show (with the file's ±15% limit it is k = 2, as by hand)."""
    key = {"target": "a", "window": "5m"}
    series = run_pages(tmp_path, [ZERO, STEADY], params=UNCERTAIN)
    assert one(series, "sd_optimal_draft_length", **key) == 2.0
    params = UNCERTAIN.replace("max_relative_halfwidth: 0.15", "max_relative_halfwidth: 0.01")
    series = run_pages(tmp_path, [ZERO, STEADY], params=params)
    assert not select(series, "sd_optimal_draft_length", **key)


def test_the_best_k_is_the_best_vouched_one_where_the_fastest_cannot_be_told_from_it(tmp_path):
    """A file that measured k = 3 only: the model's fastest k at this load, 2, is
    `extrapolated_k`. With σ = 2% it is predicted 3.3% faster than k = 3, inside the two 90%
    latency intervals, so sd_optimal_draft_length is 3 (the best k `predict` shows,
    model.bestk); with σ = 0.1% the intervals cannot hold that gain and there is none."""
    key = {"target": "a", "window": "5m"}
    ranged = PARAMS + ("calibrated_range:\n  max_arrival_rate: 5.0\n  max_in_flight: 10.0\n"
                       "  draft_lengths: [0, 3]\n")
    band = ("uncertainty:\n  level: 0.9\n  max_relative_halfwidth: 0.15\n"
            "  bands:\n    - {utilization_below: .inf, sigma: SIGMA, runs: 20}\n")
    series = run_pages(tmp_path, [ZERO, STEADY], params=ranged + band.replace("SIGMA", "0.02"))
    assert one(series, "sd_optimal_draft_length", **key) == 3.0
    series = run_pages(tmp_path, [ZERO, STEADY], params=ranged + band.replace("SIGMA", "0.001"))
    assert not select(series, "sd_optimal_draft_length", **key)
