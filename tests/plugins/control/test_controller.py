"""The controller's state machine on scripted timelines with a fake clock (no sleeps).

Each test drives :class:`ModelController` with one :class:`Observation` per poll, the poll
time being the clock, in the style of Alertmanager's acceptance tests (inputs at t, expected
actions between t1 and t2). The assessor (the latency model's verdict) is scripted as a
function of time where a test is about the guards, and is the real model where it is about
what the model decides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from specwatch.model import acceptance_length_from_profile, extend_profile, validity
from specwatch.model.closed_form import optimal_draft_length
from specwatch.model.params import load_params, params_from_mapping
from specwatch.plugins.control.actuation import Outcome
from specwatch.plugins.control.assess import (
    AcceptanceProfile,
    Assessment,
    Observation,
    admissible_k_max,
    model_assessor,
    params_profile,
)
from specwatch.plugins.control.machine import ModelController
from specwatch.plugins.control.settings import Settings

PARAMS = "examples/params/qwen3-32b-h100-eagle3.yaml"
GOOD = (0.8, 0.6, 0.45)  # per-position acceptance: rate (0.8+0.6+0.45)/3 = 0.617
BAD = (0.3, 0.1, 0.05)  # rate 0.15
#: First-position acceptance 0.15: on the shipped EAGLE-3 parameters at 0.5 req/s the model
#: predicts 1.11x (interval 1.08-1.15), inside the hysteresis band: SD does not pay enough.
VERY_BAD = (0.15, 0.03, 0.01)

WEBHOOK = Settings(mode="webhook")
RECOMMEND = Settings(mode="recommend")


def obs(t: float, *, sd: bool = True, rate: float | None = None, positions=None,
        drafts: float = 10_000.0, requests: float = 500.0, up: bool = True,
        complete: bool = True, lam: float = 2.0, span: float = 300.0, **kw) -> Observation:
    """A poll of one model: by default SD on, healthy (GOOD), busy, complete 5m window. A
    ``rate`` without ``positions`` is a flat profile at that rate (first-position
    acceptance = vLLM's rate = α)."""
    if not up:
        return Observation(t=t)
    if positions is None:
        positions = GOOD if rate is None else (rate,) * 3
    if rate is None and sd:
        rate = sum(positions) / len(positions)
    return Observation(
        t=t, up=True, present=True, sd_on=sd, configured_k=len(positions) if sd else None,
        window_found=True, window_complete=complete, window_start=t - span,
        drafts=drafts if sd else 0.0, requests=requests,
        acceptance_rate=rate if sd else None, positions=tuple(positions) if sd else (),
        arrival_rate=lam, prompt_tokens=500.0, generation_tokens=200.0, **kw)


class Scripted:
    """An assessor whose best predicted speedup is a function of time; records profiles."""

    def __init__(self, speedup: Callable[[float], float], k: int = 3) -> None:
        self.speedup = speedup
        self.k = k
        self.profiles: list[tuple[float, AcceptanceProfile]] = []

    def __call__(self, o: Observation, profile: AcceptanceProfile) -> Assessment:
        self.profiles.append((o.t, profile))
        s = self.speedup(o.t)
        return Assessment(True, "ok", self.k if s > 1 else 0, s if s > 1 else 1.0)


def run(mc: ModelController, times, make) -> list[tuple[float, str]]:
    """Step through ``times``; return (time, action) of every decision."""
    out = []
    for t in times:
        d = mc.step(make(t))
        if d is not None:
            out.append((t, d.action))
    return out


def test_acceptance_oscillating_around_threshold_never_switches():
    """Acceptance alternating 0.35 / 0.45 every minute for 3 hours: no switch at all."""
    mc = ModelController("t", "m", WEBHOOK)
    decisions = run(mc, range(0, 3 * 3600, 5),
                    lambda t: obs(t, rate=0.35 if (t // 60) % 2 else 0.45))
    assert decisions == []
    assert mc.state == "enabled"


def test_predicted_speedup_in_hysteresis_band_switches_once():
    """Best speedup alternating 1.0 and 1.1 every 400 s for 2 hours: one switch-off after
    the first 300 s below 1.05, then never back on (1.1 is inside the band, below 1.2)."""
    assess = Scripted(lambda t: 1.0 if (t // 400) % 2 == 0 else 1.1)
    mc = ModelController("t", "m", RECOMMEND, assessor=assess)
    decisions = run(mc, range(0, 2 * 3600, 5), obs)
    assert decisions == [(300, "disable")]
    assert mc.transitions == {"disable": 1, "enable": 0}


def test_stabilization_window_is_exact():
    """Low acceptance from t=1000 (polls every second): nothing at 1299 s, switch at 1300 s."""
    mc = ModelController("t", "m", WEBHOOK)
    make = lambda t: obs(t, rate=0.2 if t >= 1000 else 0.6)  # noqa: E731
    assert run(mc, range(0, 1300), make) == []
    assert mc.status().detail["waiting"] == "disable: condition held 299s of 300s"
    assert run(mc, [1300], make) == [(1300, "disable")]
    assert mc.state == "pending"


def test_minimum_switch_interval_is_exact():
    """Switch-off at 300 s; the re-enable condition holds from 301 s (stabilized at 601 s),
    but the next switch waits for 300 + 600: nothing at 899 s, switch at 900 s."""
    assess = Scripted(lambda t: 1.0 if t <= 300 else 1.5)
    mc = ModelController("t", "m", RECOMMEND, assessor=assess)
    assert run(mc, range(0, 900), obs) == [(300, "disable")]
    assert mc.status().detail["waiting"] == "enable: 599s since the last switch, need 600s"
    assert run(mc, [900], obs) == [(900, "enable")]


@pytest.mark.parametrize("gap", ["down", "incomplete", "idle", "absent"])
def test_stale_missing_or_idle_data_resets_and_blocks(gap):
    """Low acceptance for hours, but one bad poll every 200 s (target down, window not
    complete, too few drafts, model gone): the 300 s window never fills, so no action."""
    def make(t):
        if t % 200 == 0:
            return {"down": obs(t, up=False), "incomplete": obs(t, rate=0.1, complete=False),
                    "idle": obs(t, rate=0.1, drafts=50.0),
                    "absent": Observation(t=t, up=True)}[gap]
        return obs(t, rate=0.1)
    mc = ModelController("t", "m", WEBHOOK)
    assert run(mc, range(0, 4 * 3600, 5), make) == []


def test_idle_server_with_zero_acceptance_does_nothing():
    """An idle server (30 drafts per window, acceptance 0) never triggers a switch."""
    mc = ModelController("t", "m", WEBHOOK)
    assert run(mc, range(0, 7200, 5), lambda t: obs(t, rate=0.0, drafts=30.0)) == []
    assert mc.status().detail["blocked"].startswith("low traffic: 30 drafts")


def test_outage_then_recovery_restarts_the_stabilization_window():
    """Acceptance low throughout; target down 200-800 s: the window restarts after it."""
    mc = ModelController("t", "m", WEBHOOK)
    make = lambda t: obs(t, up=not 200 <= t < 800, rate=0.1)  # noqa: E731
    assert run(mc, range(0, 2000, 10), make) == [(1100, "disable")]


def test_pending_blocks_until_server_reports_new_configuration():
    """After a switch-off request the server keeps SD on (restart in progress) while the
    condition still holds: no new decision; then SD families vanish: state disabled."""
    mc = ModelController("t", "m", WEBHOOK)
    low = lambda t: obs(t, rate=0.1)  # noqa: E731
    assert run(mc, range(0, 301, 5), low) == [(300, "disable")]
    assert run(mc, range(305, 900, 5), low) == []  # 600 s more of the condition: blocked
    assert mc.state == "pending"
    assert mc.status().detail["blocked"].startswith("pending")
    mc.step(obs(900, sd=False))
    assert mc.state == "disabled"
    assert mc.pending is None
    events = [e["event"] for e in mc.take_events()]
    assert events[-1] == "switch_confirmed"


def test_pending_times_out_and_is_counted():
    """The server never reports the new configuration: at exactly since + timeout the
    controller gives up (one actuation error) and returns to the observed state."""
    s = dataclasses.replace(WEBHOOK, pending_timeout_seconds=900.0)
    mc = ModelController("t", "m", s)
    assert run(mc, range(0, 301, 5), lambda t: obs(t, rate=0.1)) == [(300, "disable")]
    mc.step(obs(1199, rate=0.6))
    assert mc.state == "pending"
    mc.step(obs(1200, rate=0.6))
    assert mc.state == "enabled" and mc.errors == 1
    assert any(e["event"] == "switch_timeout" for e in mc.take_events())


def test_failed_delivery_leaves_pending_counts_once_and_is_not_repeated():
    """A delivery that failed after its retries: state back to enabled at once, one error;
    the same decision is never re-issued, a new one needs the guards again."""
    mc = ModelController("t", "m", WEBHOOK)
    decisions = []
    for t in range(0, 301, 5):
        d = mc.step(obs(t, rate=0.1))
        if d:
            decisions.append(d)
    assert len(decisions) == 1
    mc.finished(decisions[0], Outcome(False, 5, "HTTP 503: busy"), 320.0)
    assert mc.state == "enabled" and mc.errors == 1
    # The condition holds again, but the minimum interval counts from the failed request.
    more = run(mc, range(325, 1200, 5), lambda t: obs(t, rate=0.1))
    assert more == [(900, "disable")]


def test_external_change_is_followed_and_respected():
    """An operator turns SD off by hand: state follows (no controller transition counted)
    and the minimum interval applies from that restart."""
    assess = Scripted(lambda t: 2.0)
    mc = ModelController("t", "m", WEBHOOK, assessor=assess)
    run(mc, range(0, 100, 5), obs)
    mc.step(obs(100, sd=False))
    assert mc.state == "disabled"
    assert mc.transitions == {"disable": 0, "enable": 0}
    decisions = run(mc, range(105, 1000, 5), lambda t: obs(t, sd=False))
    assert decisions == [(700, "enable")]  # 100 + 600 (window from 100, held since 400)


def test_window_spanning_a_switch_is_not_used():
    """After a switch the decision window must start after it: with a 5m window nothing is
    evaluated until 300 s after the new configuration appeared."""
    assess = Scripted(lambda t: 2.0)
    s = dataclasses.replace(WEBHOOK, stabilization_seconds=0.0, min_switch_interval_seconds=0)
    mc = ModelController("t", "m", s, assessor=assess)
    mc.step(obs(0))
    mc.step(obs(10, sd=False))  # observed (external) switch-off at t=10
    assert mc.step(obs(309, sd=False)) is None
    assert "spans the last configuration change" in mc.status().detail["blocked"]
    d = mc.step(obs(310, sd=False))
    assert d is not None and d.action == "enable"


def test_reenable_uses_model_at_live_load_with_remembered_profile():
    """Real model: SD on with a healthy profile at low load; the load rises past break-even
    (best predicted speedup < 1.05): switch-off. With SD off the model is fed the profile
    remembered from the last healthy window; when the load falls back, switch-on with the
    model's best k, and the payload says where the acceptance came from."""
    # A draft model costing ~19% of a verifier step: SD stops paying around 7 req/s.
    params = params_from_mapping({"system": "draft-model", "coefficients": {
        "a_p": 0.015, "b_p": 0.0028, "a_v": 0.03417, "b_v": 0.000086, "a_d": 0.0065,
        "b_d": 0.0004}})
    assess = model_assessor(params)
    # Arrival rates from the model itself: one where SD pays well, one where no k pays.
    lams = [x / 10 for x in range(1, 400)]
    opt = optimal_draft_length(params.model(), lams, profile=GOOD, p=500.0, g=200.0,
                               k_max=params.k_max, max_utilization=params.max_utilization)
    low = next(lam for lam, k, s in zip(lams, opt.k, opt.speedup, strict=True) if s > 1.3)
    high = next(lam for lam, k in zip(lams, opt.k, strict=True) if k == 0)
    s = dataclasses.replace(WEBHOOK, stabilization_seconds=60, min_switch_interval_seconds=120)
    mc = ModelController("t", "m", s, assessor=assess)
    timeline = []
    for t in range(0, 2000, 10):
        if mc.state == "pending":
            sd = mc.pending.expects_sd if t % 100 == 0 else not mc.pending.expects_sd
        else:
            sd = mc.observed_sd if mc.observed_sd is not None else True
        lam = high if 300 <= t < 900 else low
        d = mc.step(obs(t, sd=sd, lam=lam, span=30.0))
        if d is not None:
            timeline.append((t, d.action, d.reason_code, d.payload))
    assert [(a, c) for _, a, c, _ in timeline] == [("disable", "low_predicted_speedup"),
                                                    ("enable", "predicted_speedup")]
    enable = timeline[1][3]
    assert enable["acceptance"]["source"] == "remembered"
    assert enable["acceptance"]["per_position"] == list(GOOD)
    assert enable["recommended_draft_length"] >= 1
    assert enable["speculative_config_update"] == {
        "num_speculative_tokens": enable["recommended_draft_length"]}
    assert enable["predicted_speedup"]["best"] >= 1.2
    assert timeline[0][0] >= 360 and timeline[1][0] >= 900 + 60


def test_reenable_after_low_acceptance_is_a_probe_with_doubling_backoff():
    """Acceptance stays bad: each switch-off for low acceptance doubles the wait before the
    next re-enable probe (600 s, 1200 s, 2400 s): a few probes, not a restart loop."""
    class LikesGood(Scripted):
        """1.8x on the remembered (healthy) profile, no k pays on the live bad one."""

        def __call__(self, o: Observation, profile: AcceptanceProfile) -> Assessment:
            a = super().__call__(o, profile)
            return a if profile.positions == GOOD else Assessment(True, "ok", 0, 1.0)

    assess = LikesGood(lambda t: 1.8)
    s = dataclasses.replace(WEBHOOK, stabilization_seconds=60)
    mc = ModelController("t", "m", s, assessor=assess)
    switches, off = [], set()
    for t in range(0, 3 * 3600, 5):
        if mc.state == "pending":
            sd = mc.pending.expects_sd  # the server applies a switch by the next poll
        else:
            sd = mc.observed_sd if mc.observed_sd is not None else True
        positions = GOOD if t < 1000 else BAD
        if not sd:
            off.add(t)
        d = mc.step(obs(t, sd=sd, positions=positions, span=30.0))
        if d is not None:
            switches.append((t, d.action))
    offs = [t for t, a in switches if a == "disable"]
    ons = [t for t, a in switches if a == "enable"]
    assert [b - a for a, b in zip(offs, ons, strict=False)] == [600, 1200, 2400]
    used = [p for t, p in assess.profiles if t in off]
    assert used and all(p.source == "remembered" and p.positions == GOOD for p in used)


def test_alert_feeds_the_same_state_machine():
    """A firing SDAcceptanceRateLow alert (started 400 s before it arrives) is a switch-off
    condition: acted on at the next fresh poll; never on stale data; a resolved alert
    before the stabilization window ends does nothing."""
    mc = ModelController("t", "m", WEBHOOK)
    run(mc, range(0, 1000, 5), obs)
    mc.alert("fp1", "SDAcceptanceRateLow", True, starts_at=600.0, now=1000.0)
    assert mc.step(obs(1000, up=False)) is None  # stale data: no action
    d = mc.step(obs(1005))
    assert d is not None and d.reason_code == "alert"

    mc2 = ModelController("t", "m", WEBHOOK)
    run(mc2, range(0, 1000, 5), obs)
    mc2.alert("fp1", "SDAcceptanceRateLow", True, starts_at=1000.0, now=1000.0)
    assert run(mc2, range(1000, 1200, 5), obs) == []
    mc2.alert("fp1", "SDAcceptanceRateLow", False, starts_at=1000.0, now=1200.0)
    assert run(mc2, range(1200, 2000, 5), obs) == []


def test_recommend_mode_never_pends_and_counts_recommendations():
    """Recommend mode: the state is the recommendation (no pending, nothing delivered)."""
    mc = ModelController("t", "m", RECOMMEND)
    d = run(mc, range(0, 400, 5), lambda t: obs(t, rate=0.1))
    assert d == [(300, "disable")]
    assert mc.state == "disabled" and mc.pending is None
    assert mc.status().transitions == {"disable": 1, "enable": 0}


def test_switch_latency_record_compares_window_quantiles():
    """Before/after record: the decision window's P50/P99 of e2e latency and TTFT right
    before the switch, against the first window entirely after it."""
    def hist(p50_bucket_count):
        # Buckets (bound, cumulative): 100 requests, ranks 50 and 99 placed by hand.
        return (0.5, 0.0), (1.0, p50_bucket_count), (2.0, 100.0), (float("inf"), 100.0)

    s = dataclasses.replace(WEBHOOK, stabilization_seconds=0, min_switch_interval_seconds=0)
    mc = ModelController("t", "m", s)
    before = {"e2e_latency_seconds": hist(100.0), "ttft_seconds": hist(100.0)}
    after = {"e2e_latency_seconds": hist(0.0), "ttft_seconds": hist(100.0)}
    mc.step(obs(0, histograms=before))
    d = mc.step(obs(10, rate=0.1, histograms=before))
    assert d is not None and d.action == "disable"
    mc.step(obs(20, sd=False, histograms=after))  # switch observed at 20
    assert mc.status().latency_ratios == {}
    mc.step(obs(320, sd=False, histograms=after))  # first window entirely after: 20..320
    # before: P50 = 0.5 + 0.5·50/100 = 0.75, P99 = 0.5 + 0.5·99/100 = 0.995
    # after (e2e): P50 = 1 + 1·50/100 = 1.5, P99 = 1 + 99/100 = 1.99; TTFT unchanged.
    assert mc.status().latency_ratios == pytest.approx({
        ("disable", "e2e", "50"): 1.5 / 0.75, ("disable", "e2e", "99"): 1.99 / 0.995,
        ("disable", "ttft", "50"): 1.0, ("disable", "ttft", "99"): 1.0})
    latency_events = [e for e in mc.take_events() if e["event"] == "switch_latency"]
    assert latency_events[-1]["ratio"]["e2e_p50"] == pytest.approx(2.0)


def test_switch_record_keeps_both_windows_as_calibration_points():
    """The record also keeps what each window says about the operating point (λ, mean e2e
    latency, lengths, and with SD on draft and acceptance length): the before window at
    the configuration before the switch, the first complete one after at the new one. That
    is what `calibrate --point-sources switches` reads (sd_switch_window_*)."""
    hist = {"e2e_latency_seconds": ((1.0, 50.0), (2.0, 100.0), (float("inf"), 100.0))}
    s = dataclasses.replace(WEBHOOK, stabilization_seconds=0, min_switch_interval_seconds=0)
    mc = ModelController("t", "m", s)
    mc.step(obs(0, histograms=hist, lam=3.0, mean_latency=1.2, draft_length=3.0,
                acceptance_length=2.5))
    assert mc.status().switch_window is None
    mc.step(obs(10, rate=0.1, histograms=hist, lam=3.0, mean_latency=1.25, draft_length=3.0,
                acceptance_length=1.3))
    mc.step(obs(20, sd=False, histograms=hist, lam=3.0, mean_latency=9.0))  # switch at 20
    assert mc.status().switch_window is None  # no complete window after it yet
    mc.step(obs(320, sd=False, histograms=hist, lam=2.9, mean_latency=2.0))
    rec = mc.status().switch_window
    assert rec == {"action": "disable", "switched_at": 20,
                   "before": {"latency_seconds": 1.25, "arrival_rate": 3.0,
                              "prompt_tokens": 500.0, "generation_tokens": 200.0,
                              "draft_length": 3.0, "acceptance_length": 1.3},
                   "after": {"latency_seconds": 2.0, "arrival_rate": 2.9,
                             "prompt_tokens": 500.0, "generation_tokens": 200.0}}


def test_params_profile_is_the_fallback_before_any_healthy_window():
    """A target that starts with SD off uses the parameters file's acceptance profile."""
    params = load_params(PARAMS)
    prof = params_profile(params)
    assert prof is not None and prof.positions == tuple(params.acceptance_profile)
    assess = Scripted(lambda t: 1.5)
    mc = ModelController("t", "m", dataclasses.replace(RECOMMEND, stabilization_seconds=0),
                         assessor=assess, fallback_profile=prof)
    d = mc.step(obs(0, sd=False))
    assert d is not None and d.action == "enable"
    assert assess.profiles[-1][1].source == "params"


class Banded(Scripted):
    """A scripted assessor whose best speedup comes with a 90% interval of ±`half`."""

    def __init__(self, speedup: Callable[[float], float], half: float) -> None:
        super().__init__(speedup)
        self.half = half

    def __call__(self, o: Observation, profile: AcceptanceProfile) -> Assessment:
        a = super().__call__(o, profile)
        s = self.speedup(o.t)
        return dataclasses.replace(a, best_speedup_interval=(s - self.half, s + self.half))


def test_no_switch_on_while_the_interval_straddles_the_enable_threshold():
    """SD off, best speedup 1.25 (above enable_above_speedup 1.2) but its 90% interval
    [1.15, 1.35] reaches below it: never enabled, the controller says `uncertain`; the
    same speedup with a ±0.03 interval is enabled after the stabilization window."""
    prof = AcceptanceProfile("params", GOOD)
    mc = ModelController("t", "m", RECOMMEND, assessor=Banded(lambda t: 1.25, 0.10),
                         fallback_profile=prof)
    assert run(mc, range(0, 3600, 5), lambda t: obs(t, sd=False)) == []
    assert mc.state == "disabled" and mc.waiting.startswith("uncertain:")
    assert mc.status().reason == "uncertain"
    mc = ModelController("t", "m", RECOMMEND, assessor=Banded(lambda t: 1.25, 0.03),
                         fallback_profile=prof)
    assert run(mc, range(0, 3600, 5), lambda t: obs(t, sd=False)) == [(300, "enable")]


def test_no_switch_off_while_the_interval_straddles_the_disable_threshold():
    """SD on, best speedup 1.0 (below disable_below_speedup 1.05) with an interval
    [0.9, 1.1]: no switch-off on the prediction (`uncertain`); with ±0.02 it switches."""
    mc = ModelController("t", "m", RECOMMEND, assessor=Banded(lambda t: 1.0, 0.10))
    assert run(mc, range(0, 3600, 5), obs) == []
    assert mc.state == "enabled" and mc.waiting.startswith("uncertain:")
    assert mc.status().reason == "uncertain"
    mc = ModelController("t", "m", RECOMMEND, assessor=Banded(lambda t: 1.0, 0.02))
    assert run(mc, range(0, 3600, 5), obs) == [(300, "disable")]


def test_the_model_assessor_gives_the_interval_of_its_best_speedup():
    params = load_params(PARAMS)
    a = model_assessor(params)(obs(0.0, lam=4.0), AcceptanceProfile("live", GOOD))
    assert a.valid and a.best_draft_length and a.best_speedup_interval is not None
    lo, hi = a.best_speedup_interval
    assert lo < a.best_speedup < hi
def test_low_alpha_in_the_demos_bimodal_phase_while_sd_pays_says_sd_pays():
    """The demo's bimodal phase: a window where hard traffic dominates has acceptance 0.38
    at position 0, below min_acceptance_alpha, while the model finds k = 4 best (1.34x, its
    interval above enable_above_speedup). SD pays, so SD stays on at the model's k and the
    state says why (sd_pays: low acceptance against the predicted speedup), not a silent
    contradiction and not a switch-off."""
    from specwatch.model import extend_profile
    from specwatch.sim.scenario import packaged_scenario_path

    params = load_params(str(packaged_scenario_path("demo").parent / "demo-params.yaml"))
    positions = (0.38, 0.30, 0.26)
    model = optimal_draft_length(params.model(), 3.0, p=500.0, g=200.0, k_max=params.k_max,
                                 max_utilization=params.max_utilization,
                                 profile=tuple(extend_profile(positions, params.k_max)))
    assert int(model.k) > 0 and float(model.speedup) > 1.2
    mc = ModelController("t", "m", RECOMMEND, assessor=model_assessor(params, 0.4))
    for t in range(0, 120, 5):
        mc.step(obs(t, positions=positions, lam=3.0, live_optimal_k=int(model.k)))
    st = mc.status()
    assert st.state == "enabled" and st.recommended_draft_length == int(model.k)
    assert st.reason == "sd_pays" and st.detail["reason"] == "sd_pays"
    assert "acceptance α 0.380 (first-position acceptance) below" in st.detail["waiting"]
    assert f"the model predicts {float(model.speedup):.2f}x at k={int(model.k)}" \
        in st.detail["waiting"]


def test_reason_follows_what_holds_the_state():
    """The model keeps predicting some speedup (1.11x, inside the hysteresis band) while
    acceptance drops below the guard for 700 s: first SD stays on with k = 0 recommended
    (acceptance_guard),
    then it goes off for the guard (acceptance_guard); once acceptance is back, the
    switch-on waits for its stabilization window (stabilization), then the controller
    follows the model again (agrees)."""
    params = load_params(PARAMS)
    assess = model_assessor(params, 0.4)
    mc = ModelController("t", "m", RECOMMEND, assessor=assess)
    best = assess(obs(0, lam=0.5), AcceptanceProfile("live", positions=GOOD))
    k = best.best_draft_length
    seen = []
    for t in range(0, 2000, 10):
        positions = VERY_BAD if 300 <= t < 1000 else GOOD
        mc.step(obs(t, positions=positions, lam=0.5, live_optimal_k=k))
        st = mc.status()
        if not seen or seen[-1] != (st.state, st.reason):
            seen.append((st.state, st.reason))
    assert seen == [("enabled", "agrees"), ("enabled", "acceptance_guard"),
                    ("disabled", "acceptance_guard"), ("disabled", "stabilization"),
                    ("enabled", "agrees")]


def test_the_model_assessor_never_offers_a_best_k_it_cannot_vouch_for():
    """Near the EAGLE-3 ceiling the model's fastest k has a declined prediction: past 9.5
    req/s (at 12 req/s k = 4 is `saturated`, though the optimiser still finds it the
    fastest) and no other k is vouched for either: the assessment is not valid (the
    controller waits) and says which k and why."""
    assess = model_assessor(load_params(PARAMS))
    ok = assess(obs(0.0, lam=8.0), AcceptanceProfile("live", GOOD))
    assert ok.valid and ok.best_draft_length
    a = assess(obs(0.0, lam=12.0), AcceptanceProfile("live", GOOD))
    assert not a.valid and a.best_draft_length is None
    assert a.reason.startswith("best k = 4 not vouched for: ") and "saturated" in a.reason


def _sensitive_at_6_percent():
    params = load_params(PARAMS)
    return dataclasses.replace(params, uncertainty=dataclasses.replace(
        params.uncertainty, max_relative_halfwidth=0.06))


def test_the_controller_moves_only_to_a_vouched_k():
    """A file whose interval limit is ±6%: at 9 req/s the model's fastest k = 5 is
    `sensitive`, k = 4 is vouched for and predicted 3.4% slower, inside the two 90% latency
    intervals (`model.bestk`). The assessment offers k = 4, never k = 5, and a controller
    fed that load for an hour recommends k = 4 throughout: every k it recommends has a
    vouched prediction of its own."""
    params = _sensitive_at_6_percent()
    assess = model_assessor(params)
    profile = tuple(extend_profile(GOOD, params.k_max))
    fastest = optimal_draft_length(params.model(), 9.0, p=500.0, g=200.0, k_max=params.k_max,
                                   max_utilization=params.max_utilization, profile=profile)
    a = assess(obs(0.0, lam=9.0), AcceptanceProfile("live", GOOD))
    assert int(fastest.k) == 5 and a.valid and a.best_draft_length == 4

    def is_vouched(k: int) -> bool:
        e = float(acceptance_length_from_profile(profile, k))
        return bool(validity.vouched(params, 9.0, k, e, 500.0, 200.0))

    assert is_vouched(4) and not is_vouched(5)
    lo, hi = a.best_speedup_interval
    assert lo < a.best_speedup < hi
    mc = ModelController("t", "m", RECOMMEND, assessor=assess)
    recommended = set()
    for t in range(0, 3600, 5):
        mc.step(obs(t, lam=9.0))
        recommended.add(mc.status().recommended_draft_length)
    assert recommended - {None} == {4}
    assert all(is_vouched(k) for k in recommended - {None})


def test_the_controller_holds_where_no_vouched_k_is_as_good_as_the_fastest():
    """With a ±1% interval limit every k at 9 req/s is `sensitive`: no k is vouched for, no
    decision, and the reason says which k and why."""
    params = dataclasses.replace(_sensitive_at_6_percent(), uncertainty=dataclasses.replace(
        load_params(PARAMS).uncertainty, max_relative_halfwidth=0.01))
    a = model_assessor(params)(obs(0.0, lam=9.0), AcceptanceProfile("live", GOOD))
    assert not a.valid and a.best_draft_length is None
    assert a.reason.startswith("best k = 5 not vouched for: sensitive")


# ----------------------------------------------------------------- the k-independent guard

#: EAGLE-3 at k = 5 in the simulator (beta α, mean 0.58, concentration 15: the packaged
#: eagle3-k5 scenario): P(first i+1 drafts accepted) per position. vLLM's acceptance rate
#: (their mean) is 0.25, below 0.4; the first-position acceptance is 0.55.
EAGLE3_K5 = (0.551, 0.319, 0.192, 0.120, 0.078)


def test_eagle3_at_k5_keeps_sd_on_although_vllms_rate_is_below_the_threshold():
    """The shipped EAGLE-3 parameters at k = 5: vLLM's rate 0.25 reads as low acceptance,
    but the first-position acceptance is 0.55 and the model predicts about 1.9x at 3 req/s.
    The controller compares the α that does not fall with k: no switch in an hour, SD
    stays on, agreeing with the model, and recommends the model's k."""
    params = load_params(PARAMS)
    assert round(sum(EAGLE3_K5) / 5, 2) == 0.25
    assess = model_assessor(params, 0.4)
    best = assess(obs(0, positions=EAGLE3_K5, lam=3.0), AcceptanceProfile("live", EAGLE3_K5))
    assert best.valid and best.best_speedup > 1.7 and best.k_limit is None
    mc = ModelController("t", "m", RECOMMEND, assessor=assess)
    decisions = run(mc, range(0, 3600, 5), lambda t: obs(
        t, positions=EAGLE3_K5, lam=3.0, live_optimal_k=best.best_draft_length))
    assert decisions == []
    st = mc.status()
    assert st.state == "enabled" and st.reason == "agrees"
    assert st.recommended_draft_length == best.best_draft_length


def test_admissible_k_is_all_or_none_by_the_first_position():
    """The guard no longer picks k (α is the same at every k): the fitted EAGLE-3 profile
    (first position 0.64) admits every k at 0.4, where vLLM's rate would have cut k at 3,
    and none at 0.7. The model's best k is then the unguarded one."""
    params = load_params(PARAMS)
    prof = params_profile(params)
    assert prof.independent_alpha() == (pytest.approx(0.6389), "first_position")
    assert admissible_k_max(prof, params.k_max, 0.4) == params.k_max
    assert admissible_k_max(prof, params.k_max, 0.7) == 0
    assert admissible_k_max(AcceptanceProfile("live", alpha=0.5), 6, 0.4) == 6  # per-token
    a = model_assessor(params, 0.4)(obs(0, sd=False, lam=0.5), prof)
    unguarded = model_assessor(params, 0.0)(obs(0, sd=False, lam=0.5), prof)
    assert a.valid and a.best_draft_length == unguarded.best_draft_length
    assert a.k_limit is None


@dataclasses.dataclass(frozen=True)
class Measured:
    """A measured A/B speedup as the pairs plug-in gives it (MeasuredFigures)."""

    pair: str
    speedup: float
    lower: float
    upper: float


LOW_ALPHA = (0.3, 0.12, 0.05)  # first-position acceptance 0.3 < 0.4


def test_low_alpha_while_the_prediction_says_sd_pays_holds_and_says_why():
    """α 0.3 below min_acceptance_alpha, but the model predicts 1.5x with a 90% interval
    [1.45, 1.55] above enable_above_speedup (1.2): no switch-off in an hour; the state is
    `sd_pays` and its text names both signals; one event when the disagreement starts. The
    same α with a prediction inside the hysteresis band (1.1) switches off at 300 s."""
    mc = ModelController("t", "m", RECOMMEND, assessor=Banded(lambda t: 1.5, 0.05))
    # A failed poll every 200 s neither ends the disagreement nor starts a new one.
    assert run(mc, range(0, 3600, 5), lambda t: obs(t, positions=LOW_ALPHA, up=t % 200 != 0)
               ) == []
    st = mc.status()
    assert st.state == "enabled" and st.reason == "sd_pays"
    text = st.detail["waiting"]
    assert "acceptance α 0.300 (first-position acceptance) below min_acceptance_alpha 0.4" \
        in text
    assert "the model predicts 1.50x at k=3 (90% interval 1.45-1.55)" in text
    assert st.recommended_draft_length == 3
    held = [e for e in mc.take_events() if e["event"] == "switch_off_held"]
    assert len(held) == 1 and held[0]["reason"] == text

    mc = ModelController("t", "m", RECOMMEND, assessor=Banded(lambda t: 1.1, 0.03))
    d = run(mc, range(0, 3600, 5), lambda t: obs(t, positions=LOW_ALPHA))
    assert d == [(300, "disable")]
    assert mc.last_decision["reason_code"] == "low_acceptance"
    assert mc.status().reason == "acceptance_guard"


@pytest.mark.parametrize(("lower", "switches"), [(1.25, []), (1.10, [(300, "disable")])])
def test_measured_ab_speedup_above_the_band_holds_a_switch_off(lower, switches):
    """No model, α 0.3: the measured A/B speedup 1.3x whose 90% interval starts at 1.25
    (above enable_above_speedup) keeps SD on; one whose interval reaches 1.10 does not."""
    m = Measured("ab", 1.3, lower, 1.35)
    mc = ModelController("t", "m", RECOMMEND)
    assert run(mc, range(0, 3600, 5), lambda t: obs(t, positions=LOW_ALPHA,
                                                    measured=m)) == switches
    if not switches:
        assert mc.status().reason == "sd_pays"
        assert "the A/B pair ab measures 1.30x (90% interval 1.25-1.35)" in mc.waiting


def test_a_switch_off_alert_is_held_while_sd_pays():
    """A firing SDAcceptanceRateLow while the prediction shows SD paying: no switch-off."""
    mc = ModelController("t", "m", RECOMMEND, assessor=Banded(lambda t: 1.6, 0.05))
    run(mc, range(0, 100, 5), obs)
    mc.alert("fp", "SDAcceptanceRateLow", True, starts_at=100.0, now=100.0)
    assert run(mc, range(100, 3600, 5), obs) == []
    assert mc.status().reason == "sd_pays"
    assert "Alertmanager alert SDAcceptanceRateLow firing" in mc.waiting
