"""The simulator behaves like the system the latency model describes, and like vLLM.

Everything here runs the discrete-event simulation directly (no HTTP, no wall clock), so a
long simulated stretch costs about a second. Figures are checked against independent truth:
the model's closed form from specwatch.model for latency, the scenario's acceptance
distribution for the SD counters, vLLM's counting rules for the invariants.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch import model
from specwatch.model.coefficients import Coefficients, ExpertCoefficients, MoECoefficients
from specwatch.sim.distributions import AcceptanceDist, LengthDist
from specwatch.sim.scenario import (
    ModelSpec,
    Phase,
    RateProfile,
    Restart,
    Scenario,
)
from specwatch.sim.server import render_page
from specwatch.sim.simulation import Simulation

K = 3
ALPHA = 0.7
PROMPT = 256
GEN = 64
# A batch-friendly system: a request adds ~1% of a batch-of-one step (c0/c1 ≈ 120), as on
# a large GPU. Many requests in flight keep the relative noise of the mean latency small.
COEF = Coefficients(a_p=0.04, b_p=0.0005, a_v=0.020, b_v=0.0001, a_d=0.001, b_d=0.00003)


def steady(rate: float, coef: object = COEF, *, k: int = K, alpha: AcceptanceDist | None = None,
           gen: LengthDist | None = None, duration: float = 1e6, **spec: object) -> Scenario:
    phase = Phase("steady", duration, RateProfile(rate, rate),
                  alpha or AcceptanceDist("fixed", value=ALPHA),
                  LengthDist("fixed", value=PROMPT), gen or LengthDist("fixed", value=GEN))
    fields = {"max_num_seqs": 100_000, "kv_cache_tokens": 1 << 30, "max_model_len": 1 << 20,
              "max_tokens": 100_000}
    fields.update(spec)
    m = ModelSpec("sim/model", (phase,), num_speculative_tokens=k, coefficients=coef,
                  **fields)  # type: ignore[arg-type]
    return Scenario((m,), seed=11)


def mean_latency(sim: Simulation, warmup: float, end: float, batches: int = 10
                 ) -> tuple[float, float]:
    """Mean e2e latency of requests finishing in (warmup, end], and its standard error by
    batch means (successive batches of a long run are nearly independent)."""
    sim.advance_to(warmup)
    st = sim.engine_stats()[0]
    means = []
    count, total = st.h_e2e.count, st.h_e2e.total
    for b in range(1, batches + 1):
        sim.advance_to(warmup + (end - warmup) * b / batches)
        means.append((st.h_e2e.total - total) / (st.h_e2e.count - count))
        count, total = st.h_e2e.count, st.h_e2e.total
    arr = np.asarray(means)
    return float(arr.mean()), float(arr.std(ddof=1) / math.sqrt(batches))


def model_latency(coef: object, rate: float, k: int = K, alpha: float = ALPHA) -> float:
    e = float(model.acceptance_length_from_alpha(alpha, k))
    return float(model.latency(coef, rate, k, e, PROMPT, GEN, max_utilization=1.0).latency)


def rate_at_utilization(rho: float, coef: Coefficients = COEF) -> float:
    e = float(model.acceptance_length_from_alpha(ALPHA, K))
    _, c2 = model.cost_terms(coef, K, e, PROMPT, GEN)
    return rho / float(c2)


# Simulated seconds per utilisation: the mean latency relaxes in about L/(1−ρ)², so the
# run grows with ρ to keep the standard error near 1%.
RUNS = {0.2: 150.0, 0.4: 200.0, 0.6: 300.0, 0.8: 600.0}


@pytest.mark.parametrize("rho", sorted(RUNS))
def test_mean_latency_matches_the_model_closed_form(rho: float) -> None:
    """With no noise and no non-linear term, the long-run mean latency of the simulated
    continuous batch is the model's L = C1/(1 − λ·C2) with the same six coefficients,
    within 10% at utilisations 0.2-0.8 (measured: about +1-3%; the residual is the half
    step a request waits to join the batch, which the model does not price)."""
    rate = rate_at_utilization(rho)
    sim = Simulation(steady(rate))
    run = RUNS[rho]
    measured, stderr = mean_latency(sim, 0.05 * run, run)
    predicted = model_latency(COEF, rate)
    error = (measured - predicted) / predicted
    print(f"utilisation {rho}: simulated {measured:.4f}s, model {predicted:.4f}s, "
          f"error {error:+.2%} (± {stderr / predicted:.2%})")
    assert stderr / predicted < 0.03, "run too short to resolve the tolerance"
    assert abs(error) < 0.10


@pytest.fixture(scope="module")
def clean_run() -> tuple[float, Simulation]:
    """A run at utilisation 0.5 without noise or non-linear term (shared baseline)."""
    rate = rate_at_utilization(0.5)
    sim = Simulation(steady(rate))
    return mean_latency(sim, 20.0, 150.0)[0], sim


def test_nonlinear_term_makes_the_linear_model_an_approximation(
        clean_run: tuple[float, Simulation]) -> None:
    """A super-linear batch cost (nonlinear_s·(n−1)² per step) makes the system slower than
    the linear model says: the model is an approximation, not an identity."""
    rate = rate_at_utilization(0.5)
    predicted = model_latency(COEF, rate)
    bent = mean_latency(Simulation(steady(rate, nonlinear_s=2e-7)), 20.0, 150.0)[0]
    assert abs(clean_run[0] - predicted) / predicted < 0.05
    assert bent > predicted * 1.15


def test_step_noise_keeps_the_mean_but_spreads_the_steps(
        clean_run: tuple[float, Simulation]) -> None:
    """Mean-one lognormal noise on each step leaves the mean latency near the noiseless
    run while the inter-token latency histogram spreads over more buckets."""
    noisy = Simulation(steady(rate_at_utilization(0.5), step_noise_cv=0.5))
    lat_noisy = mean_latency(noisy, 20.0, 150.0)[0]
    assert abs(lat_noisy - clean_run[0]) / clean_run[0] < 0.10

    def occupied(sim: Simulation) -> int:
        return sum(1 for c in sim.engine_stats()[0].h_itl.counts if c)

    assert occupied(noisy) > occupied(clean_run[1])


def test_moe_mode_matches_the_moe_model() -> None:
    """With an MoE block, each step pays the expert part times φ(T) = 1 − (1 − m/M)^T for its
    T = n(k+1) routed tokens; the mean latency matches the model's φ fixed point within 10%."""
    expert = ExpertCoefficients(a_p=0.02, b_p=0.0002, a_v=0.010, b_v=0.00005)
    coef = MoECoefficients(dense=COEF, expert=expert, experts=64, active_experts=4)
    e = float(model.acceptance_length_from_alpha(ALPHA, K))
    rate = 40.0
    predicted = float(model.latency(coef, rate, K, e, PROMPT, GEN, max_utilization=1.0).latency)
    measured, _ = mean_latency(Simulation(steady(rate, coef)), 20.0, 300.0)
    print(f"MoE: simulated {measured:.4f}s, model {predicted:.4f}s")
    assert abs(measured - predicted) / predicted < 0.10
    # the expert part matters: a dense model with the same dense coefficients is faster
    assert measured > model_latency(COEF, rate) * 1.2


def test_compute_bound_steps_match_the_saturation_model() -> None:
    """With a roofline knee (c_v per verified token past knee_v tokens per step), the mean
    latency follows the saturation model's fixed point B = λ·L(B) within 10%, and SD's
    latency grows well past what the linear part alone predicts (the collapse `make demo`
    shows past break-even)."""
    coef = replace(COEF, c_v=4e-5, knee_v=120.0)
    e = float(model.acceptance_length_from_alpha(ALPHA, K))
    ceiling = float(model.throughput_ceiling(coef, K, e, PROMPT, GEN))
    rate = 0.7 * ceiling
    predicted = float(model.latency(coef, rate, K, e, PROMPT, GEN, max_utilization=1.0).latency)
    measured, stderr = mean_latency(Simulation(steady(rate, coef)), 30.0, 400.0)
    print(f"compute-bound: simulated {measured:.4f}s ± {stderr:.4f}, model {predicted:.4f}s")
    assert abs(measured - predicted) / predicted < 0.10
    assert measured > model_latency(COEF, rate) * 1.1


def page_series(sim: Simulation) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(render_page(sim)[0].decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def check_vllm_invariants(series: dict[str, list[tuple[dict[str, str], float]]]) -> None:
    """vLLM's counting rules, per (model_name, engine); k = the number of position series."""
    def by_engine(name: str) -> dict[tuple[str, str], float]:
        return {(lab["model_name"], lab["engine"]): v for lab, v in series[name]}

    drafts = by_engine("vllm:spec_decode_num_drafts_total")
    tokens = by_engine("vllm:spec_decode_num_draft_tokens_total")
    accepted = by_engine("vllm:spec_decode_num_accepted_tokens_total")
    per_pos: dict[tuple[str, str], dict[int, float]] = {}
    for lab, v in series["vllm:spec_decode_num_accepted_tokens_per_pos_total"]:
        per_pos.setdefault((lab["model_name"], lab["engine"]), {})[int(lab["position"])] = v
    assert drafts and set(drafts) == set(tokens) == set(accepted) == set(per_pos)
    for key in drafts:
        k = len(per_pos[key])
        assert sorted(per_pos[key]) == list(range(k)), key
        assert accepted[key] <= tokens[key], key
        assert drafts[key] * k >= tokens[key], key
        counts = [per_pos[key][i] for i in range(k)]
        assert all(a >= b for a, b in itertools.pairwise(counts)), counts
        assert sum(counts) == accepted[key], key
    for name in ("vllm:e2e_request_latency_seconds", "vllm:inter_token_latency_seconds"):
        buckets: dict[tuple[str, str], list[float]] = {}
        for lab, v in series[name + "_bucket"]:
            buckets.setdefault((lab["model_name"], lab["engine"]), []).append(v)
        for key, vals in buckets.items():
            assert vals == sorted(vals), name
            count = dict(((lab["model_name"], lab["engine"]), v)
                         for lab, v in series[name + "_count"])[key]
            assert vals[-1] == count


def test_counters_keep_vllms_invariants_over_time() -> None:
    """accepted <= proposed, per-position counts non-increasing and summing to accepted,
    drafts × k >= proposed, cumulative histograms: at every scrape of a run with noise,
    bimodal acceptance, two engines and a KV cache small enough to preempt."""
    mixture = AcceptanceDist("mixture", weights=(0.5, 0.5), components=(
        AcceptanceDist("beta", a=27.0, b=3.0), AcceptanceDist("beta", a=6.0, b=24.0)))
    gen = LengthDist("lognormal", mean_=80.0, cv=0.8, lo=1, hi=600)
    sc = steady(60.0, alpha=mixture, gen=gen, k=4, engines=2, step_noise_cv=0.3,
                kv_cache_tokens=6_000, max_tokens=500)
    sim = Simulation(sc)
    previous: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for t in (5.0, 20.0, 40.0, 60.0):
        sim.advance_to(t)
        series = page_series(sim)
        check_vllm_invariants(series)
        for name, samples in series.items():
            if name.endswith("_total") or name.endswith("_count") or name.endswith("_bucket"):
                for lab, v in samples:
                    key = (name, frozenset(lab.items()))
                    assert v >= previous.get(key, 0.0), key
                    previous[key] = v
    assert sum(st.num_preemptions for st in sim.engine_stats()) > 0
    assert all(0.0 <= st.kv_cache_usage <= 1.0 for st in sim.engine_stats())


@pytest.mark.parametrize("dist", [
    AcceptanceDist("fixed", value=0.6),
    AcceptanceDist("beta", a=16.0, b=4.0),
    AcceptanceDist("mixture", weights=(0.6, 0.4), components=(
        AcceptanceDist("beta", a=27.0, b=3.0), AcceptanceDist("fixed", value=0.2))),
], ids=["fixed", "beta", "mixture"])
def test_sd_counters_converge_to_the_scenario_truth(dist: AcceptanceDist) -> None:
    """vLLM's acceptance rate, acceptance length and per-position rates computed from the
    counters match what the α distribution implies (drafts weighted by verify cycles), for a
    single α, a beta and a bimodal mixture."""
    gen = LengthDist("uniform", lo=32, hi=160)
    sim = Simulation(steady(30.0, alpha=dist, gen=gen))
    sim.advance_to(120.0)
    st = sim.engine_stats()[0]
    truth = dist.truth(K, gen)
    rate = st.num_accepted_tokens / st.num_draft_tokens
    length = 1.0 + st.num_accepted_tokens / st.num_drafts
    # ~3600 requests: a mixture's share of easy requests alone moves these by ~1%
    assert rate == pytest.approx(truth["acceptance_rate"], abs=0.015)
    assert length == pytest.approx(truth["acceptance_length"], rel=0.02)
    for i in range(K):
        got = st.accepted_per_pos[i] / st.num_drafts
        assert got == pytest.approx(truth["position_acceptance_rate"][i], abs=0.015)


def test_arrival_rate_follows_the_piecewise_profile() -> None:
    """Poisson arrivals follow a constant phase, then a linear ramp: completions per phase
    match the integral of the profile (a ramp 4 → 12 over 100 s brings 800 requests)."""
    phases = (
        Phase("flat", 100.0, RateProfile(4.0, 4.0), AcceptanceDist("fixed", value=0.7),
              LengthDist("fixed", value=64), LengthDist("fixed", value=8)),
        Phase("ramp", 100.0, RateProfile(4.0, 12.0), AcceptanceDist("fixed", value=0.7),
              LengthDist("fixed", value=64), LengthDist("fixed", value=8)),
    )
    m = ModelSpec("sim/ramp", phases, coefficients=COEF)
    sim = Simulation(Scenario((m,), seed=5))
    sim.advance_to(100.0)
    first = sim.engine_stats()[0].finished
    sim.advance_to(150.0)
    middle = sim.engine_stats()[0].finished - first
    sim.advance_to(200.0)
    second = sim.engine_stats()[0].finished - first
    assert first == pytest.approx(400, abs=3 * math.sqrt(400))
    assert second == pytest.approx(800, abs=3 * math.sqrt(800))
    assert middle == pytest.approx(300, abs=3 * math.sqrt(300))  # ∫ 4 → 8 over 50 s


def test_saturation_queues_requests_and_latency_explodes() -> None:
    """Past what max_num_seqs can serve, requests wait (vllm:num_requests_waiting grows) and
    the queue time dominates latency, as on a saturated vLLM."""
    sim = Simulation(steady(200.0, max_num_seqs=16))
    sim.advance_to(20.0)
    st = sim.engine_stats()[0]
    waiting_early, queue_early = st.waiting, st.h_queue.total / max(st.h_queue.count, 1)
    sim.advance_to(60.0)
    st = sim.engine_stats()[0]
    assert st.running == 16
    assert st.waiting > waiting_early > 100
    assert st.h_queue.total / st.h_queue.count > queue_early
    assert st.h_e2e.total / st.h_e2e.count > 5 * model_latency(COEF, 1.0)


def test_restart_resets_counters_and_the_server_is_down_for_the_gap() -> None:
    """A scripted whole-server restart: no page during the downtime, then every counter
    starts again from 0 with new _created timestamps; a per-engine restart resets only that
    engine's series."""
    sc = steady(20.0, engines=2)
    sc = replace(sc, restarts=(Restart(30.0, 10.0), Restart(60.0, 0.0, "sim/model", 1)))
    clock = {"t0": 1_800_000_000.0}
    sim = Simulation(sc, wall_time=lambda t: clock["t0"] + t)
    sim.advance_to(29.9)
    before = {st.engine: st.num_drafts for st in sim.engine_stats()}
    assert sim.up and min(before.values()) > 0
    sim.advance_to(35.0)
    assert not sim.up and sim.engine_stats() == []
    sim.advance_to(41.0)
    after = {st.engine: st for st in sim.engine_stats()}
    assert sim.up and set(after) == {"0", "1"}
    assert all(after[e].num_drafts < before[e] for e in after)
    assert all(st.created == clock["t0"] + 40.0 for st in after.values())
    sim.advance_to(59.9)
    kept = {st.engine: st.num_drafts for st in sim.engine_stats()}
    sim.advance_to(60.5)
    now = {st.engine: st for st in sim.engine_stats()}
    assert now["0"].num_drafts >= kept["0"] and now["0"].created == clock["t0"] + 40.0
    assert now["1"].num_drafts < kept["1"] and now["1"].created == clock["t0"] + 60.0


def test_several_models_and_engines_on_one_page() -> None:
    """Two models (model_name) with two and one engines: series per (model_name, engine),
    each model with its own k and arrival rate."""
    a = steady(10.0, engines=2).models[0]
    b = replace(steady(3.0, k=5).models[0], model_name="sim/other")
    sim = Simulation(Scenario((a, b), seed=2))
    sim.advance_to(60.0)
    series = page_series(sim)
    keys = {(lab["model_name"], lab["engine"]) for lab, _ in series["vllm:request_success_total"]}
    assert keys == {("sim/model", "0"), ("sim/model", "1"), ("sim/other", "0")}
    positions = {lab["model_name"]: set() for lab, _ in
                 series["vllm:spec_decode_num_accepted_tokens_per_pos_total"]}
    for lab, _ in series["vllm:spec_decode_num_accepted_tokens_per_pos_total"]:
        positions[lab["model_name"]].add(lab["position"])
    assert len(positions["sim/model"]) == 3 and len(positions["sim/other"]) == 5
    finished = {m: sum(st.finished for st in sim.engine_stats() if st.model_name == m)
                for m in ("sim/model", "sim/other")}
    assert finished["sim/model"] == pytest.approx(600, rel=0.15)
    assert finished["sim/other"] == pytest.approx(180, rel=0.25)
    check_vllm_invariants(series)


def test_same_seed_same_page_other_seed_other_page() -> None:
    """--seed makes runs reproducible: the same seed renders the same counters."""
    def counters(seed: int) -> list[float]:
        sim = Simulation(steady(15.0), seed=seed, wall_time=lambda t: 1.8e9 + t)
        sim.advance_to(30.0)
        st = sim.engine_stats()[0]
        return [st.num_drafts, st.num_accepted_tokens, st.h_e2e.total, st.finished]

    assert counters(1) == counters(1)
    assert counters(1) != counters(2)


def test_time_scale_divides_every_duration_on_the_page() -> None:
    """--speed X exposes durations divided by X (a consistent server X times faster), and
    leaves token counts alone."""
    slow = Simulation(steady(10.0), time_scale=1.0)
    fast = Simulation(steady(10.0), time_scale=0.1)
    slow.advance_to(30.0)
    fast.advance_to(30.0)
    s, f = slow.engine_stats()[0], fast.engine_stats()[0]
    assert f.num_drafts == s.num_drafts
    assert f.h_e2e.total == pytest.approx(s.h_e2e.total * 0.1)
    assert f.h_itl.total == pytest.approx(s.h_itl.total * 0.1)


def test_scripted_restart_with_another_draft_length() -> None:
    """A scenario restart with num_speculative_tokens changes the SD configuration: k = 0
    removes the spec_decode families (vLLM without --speculative-config), k = 2 brings two
    position series back, and the latency follows the new configuration."""
    sc = replace(steady(20.0), restarts=(Restart(30.0, 0.0, None, None, 0),
                                         Restart(60.0, 0.0, None, None, 2)))
    sim = Simulation(sc)
    sim.advance_to(59.0)
    assert not [n for n in page_series(sim) if n.startswith("vllm:spec_decode")]
    st = sim.engine_stats()[0]
    no_sd = st.h_e2e.total / st.h_e2e.count
    sim.advance_to(90.0)
    series = page_series(sim)
    assert len(series["vllm:spec_decode_num_accepted_tokens_per_pos_total"]) == 2
    check_vllm_invariants(series)
    st = sim.engine_stats()[0]
    with_sd = st.h_e2e.total / st.h_e2e.count
    assert no_sd == pytest.approx(model_latency(COEF, 20.0, k=0, alpha=0.0), rel=0.1)
    assert with_sd < no_sd
