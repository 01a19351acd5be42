"""What the exporter derives from the simulator matches the scenario's known truth.

The simulator's pages are fed to the exporter's real pipeline (sources → history → derive)
at simulated poll times, without sockets or a wall clock, so a 30-minute scenario takes a
few seconds. The truth comes from the scenario (`AcceptanceDist.truth`: what the counters
converge to for that α distribution; the phase's arrival rate), not from the exporter's code.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from specwatch.poll.pipeline import Pipeline, PollResult
from specwatch.poll.snapshot import WindowSignals
from specwatch.poll.windows import bimodality, derive
from specwatch.sim.scenario import Scenario, load_scenario
from specwatch.sim.server import render_page
from specwatch.sim.simulation import Simulation

POLL = 10.0
T0 = 1_800_000_000.0
WINDOWS = (("2m", 120.0), ("5m", 300.0))


@dataclass
class Replay:
    """The exporter's pipeline polling a simulation every POLL simulated seconds."""

    scenario: Scenario
    sim: Simulation
    pipeline: Pipeline

    poll: float = POLL

    @classmethod
    def of(cls, name: str, poll: float = POLL) -> Replay:
        scenario = load_scenario(name)
        sim = Simulation(scenario, wall_time=lambda t: T0 + t)
        cfg = derive.DeriveConfig(windows=WINDOWS, count_window=500)
        return cls(scenario, sim, Pipeline([("sim", "vllm")], cfg, poll), poll)

    def poll_until(self, t_end: float, lead: float = 330.0) -> None:
        """Advance to t_end, polling over the last `lead` seconds (enough for every window)."""
        t = max(self.sim.now, t_end - lead)
        self.sim.advance_to(t)
        while t <= t_end + 1e-9:
            self.sim.advance_to(t)
            if self.sim.up:  # a restarting server has no page: the poll fails
                body = render_page(self.sim, process_collectors=False)[0].decode()
                self.pipeline.apply(PollResult("sim", T0 + t, T0 + t, 0.01, body=body))
            else:
                self.pipeline.apply(PollResult("sim", T0 + t, T0 + t, 0.01,
                                               error_reason="connection",
                                               error_message="connection refused"))
            t += self.poll

    def window(self, label: str) -> WindowSignals:
        model = self.scenario.models[0].model_name
        w = self.pipeline.snapshot.targets["sim"].models[model].window(label)
        assert w is not None, f"no {label} window"
        return w


def test_acceptance_and_arrival_rate_track_each_phase() -> None:
    """In each phase of the acceptance-drop scenario the exporter's acceptance rate,
    acceptance length and per-position rates converge to what the phase's α distribution
    implies, and the arrival rate to the phase's rate."""
    replay = Replay.of("acceptance-drop", poll=15.0)
    spec = replay.scenario.models[0]
    end = 0.0
    for phase in spec.phases:
        end += phase.duration_s
        replay.poll_until(end)
        truth = phase.acceptance.truth(spec.num_speculative_tokens, phase.generation_tokens)
        w = replay.window("5m")
        v = w.values
        print(f"{phase.name}: acceptance rate {v['sd_acceptance_rate']:.3f} "
              f"(truth {truth['acceptance_rate']:.3f}), length "
              f"{v['sd_acceptance_length']:.3f} (truth {truth['acceptance_length']:.3f}), "
              f"arrival {v['sd_arrival_rate']:.2f}/s (truth {phase.arrival_rate.mean:g})")
        assert v["sd_acceptance_rate"] == pytest.approx(truth["acceptance_rate"], abs=0.03)
        assert v["sd_acceptance_length"] == pytest.approx(truth["acceptance_length"], rel=0.03)
        assert v["sd_draft_length"] == pytest.approx(spec.num_speculative_tokens)
        assert v["sd_arrival_rate"] == pytest.approx(phase.arrival_rate.mean, rel=0.12)
        got = w.positions[derive.POSITION_ACCEPTANCE_RATE]
        for i, want in enumerate(truth["position_acceptance_rate"]):
            assert got[str(i)] == pytest.approx(want, abs=0.04)
        mean_gen = phase.generation_tokens.mean()
        assert v["sd_mean_generation_tokens"] == pytest.approx(mean_gen, rel=0.12)


def test_heterogeneity_and_bimodality_reveal_the_two_populations() -> None:
    """Interleaved easy and hard requests show as heterogeneity (per-position acceptance,
    the exporter's normalised variance of α, near the truth) while every poll sees the same
    mix; populations taking turns every 30 s split the poll samples: the bimodality
    coefficient rises above Sarle's 5/9, well above its interleaved value."""
    replay = Replay.of("bimodal")
    spec = replay.scenario.models[0]
    interleaved, alternating = spec.phases
    replay.poll_until(interleaved.duration_s)
    truth = interleaved.acceptance.truth(spec.num_speculative_tokens,
                                         interleaved.generation_tokens)
    v = replay.window("5m").values
    assert v["sd_acceptance_heterogeneity"] == pytest.approx(
        truth["acceptance_heterogeneity"], abs=0.06)
    mixed_bc = v["sd_acceptance_bimodality_coefficient"]
    cond = replay.window("5m").positions[derive.POSITION_CONDITIONAL_ACCEPTANCE_RATE]
    assert cond["3"] > cond["1"] > cond["0"]  # survivors of early positions are the easy ones
    replay.poll_until(interleaved.duration_s + alternating.duration_s)
    v = replay.window("5m").values
    split_bc = v["sd_acceptance_bimodality_coefficient"]
    print(f"bimodality coefficient: interleaved {mixed_bc:.3f}, alternating {split_bc:.3f}")
    assert split_bc > bimodality.BIMODALITY_THRESHOLD
    assert split_bc > mixed_bc + 0.15


def test_restarts_are_reset_corrected_by_the_exporter() -> None:
    """Across an engine restart and a whole-server restart (multi-model scenario) the
    exporter counts the resets and its rates stay at the truth (no negative delta, no
    spike), separately for each model."""
    replay = Replay.of("multi-model", poll=20.0)
    replay.poll_until(900.0, lead=660.0)  # from before the engine restart at 300 s
    target = replay.pipeline.snapshot.targets["sim"]
    assert target.counter_resets_total >= 2
    for spec in replay.scenario.models:
        phase = spec.phases[0]
        truth = phase.acceptance.truth(spec.num_speculative_tokens, phase.generation_tokens)
        w = target.models[spec.model_name].window("5m")
        assert w is not None
        assert w.values["sd_acceptance_rate"] == pytest.approx(truth["acceptance_rate"], abs=0.03)
        assert w.values["sd_arrival_rate"] == pytest.approx(phase.arrival_rate.mean, rel=0.15)
