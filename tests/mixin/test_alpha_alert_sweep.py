"""The acceptance alert on the public sweep: healthy SD at every k stays silent.

The sweep (tests/fixtures/sd-validation, Qwen3-32B on one H100, vLLM V1) ran EAGLE-3 and the
Qwen3-1.7B and Qwen3-4B draft models at k = 1..6 beside runs without SD at the same dataset
and concurrency. The measured speedup of a configuration is the no-SD run's mean end-to-end
latency over its own (`e2e_latency_s_est`). For every configuration measured at >= 1.5x,
promtool replays what the exporter and vLLM would expose for 30 minutes (each value from the
CSV row: first-position acceptance `per_pos`, vLLM's rate `acc_rate`, acceptance length
`acc_len`, k, the output throughput and request rate) against the rendered rules. The default
alert (the α) must not fire for any of them, from the exporter's series or from vLLM's
counters through the recording rules. The raw-rate variant, on the same inputs, fires for
exactly the configurations whose rate is below the threshold (EAGLE-3 from k = 3): the test
can tell the two apart.
"""

from __future__ import annotations

import csv
import re
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from mixin_helpers import FIXTURES, promtool

from specwatch.mixin import render as mixin

SWEEP = FIXTURES / "sd-validation" / "tomasruizt_qwen3-32b_1xH100_vllm-bench.csv"
MIN_SPEEDUP = 1.5
MINUTES = 30
THRESHOLD = mixin.default_config()["alerts"]["SDAcceptanceRateLow"]["threshold"]


@dataclass(frozen=True)
class Config:
    drafter: str
    k: int
    dataset: str
    concurrency: int
    first_position: float  # share of drafts whose first token was accepted
    rate: float  # vLLM's accepted / proposed draft tokens
    acceptance_length: float
    arrival_rate: float  # finished requests per second
    drafts_per_second: float
    speedup: float  # measured: no-SD mean latency / SD mean latency

    @property
    def name(self) -> str:
        """A model_name label value that names the configuration."""
        slug = re.sub(r"[^a-z0-9]+", "-", f"{self.drafter}-k{self.k}-{self.dataset}".lower())
        return f"{slug}-c{self.concurrency}"


def _sweep() -> list[Config]:
    with SWEEP.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    baseline = {(r["dataset"], r["conc"]): float(r["e2e_latency_s_est"])
                for r in rows if r["method"] == "nosd"}
    out = []
    for r in rows:
        base = baseline.get((r["dataset"], r["conc"]))
        if r["method"] == "nosd" or base is None:
            continue
        e = float(r["acc_len"])
        out.append(Config(
            drafter=r["draft"], k=int(r["k"]), dataset=r["dataset"], concurrency=int(r["conc"]),
            first_position=float(r["per_pos"].split(";")[0]) / 100.0,
            rate=float(r["acc_rate"]) / 100.0, acceptance_length=e,
            arrival_rate=float(r["req_tp"]),
            # Each verification step commits E tokens: steps (drafts) = output tokens / E.
            drafts_per_second=float(r["out_tp"]) / e,
            speedup=base / float(r["e2e_latency_s_est"])))
    return out


SWEEP_CONFIGS = _sweep()
HEALTHY = [c for c in SWEEP_CONFIGS if c.speedup >= MIN_SPEEDUP]


def _exporter_series(c: Config) -> list[dict]:
    """The exporter's 1m series of one configuration at steady state."""
    labels = (f'job="specwatch", instance="specwatch:10440", target="vllm", '
              f'model_name="{c.name}", window="1m"')
    return [
        {"series": f'sd_acceptance_alpha{{{labels}, method="first_position"}}',
         "values": f"{c.first_position!r}x{MINUTES}"},
        {"series": f"sd_acceptance_rate{{{labels}}}", "values": f"{c.rate!r}x{MINUTES}"},
        {"series": f"sd_arrival_rate{{{labels}}}", "values": f"{c.arrival_rate!r}x{MINUTES}"},
    ]


def _vllm_series(c: Config) -> list[dict]:
    """vLLM's counters of one configuration, increasing at the run's rates (per minute)."""
    labels = f'job="vllm", instance="vllm:8000", model_name="{c.name}", engine="0"'
    drafts = 60.0 * c.drafts_per_second

    def counter(name: str, per_minute: float, extra: str = "") -> dict:
        return {"series": f"{name}{{{labels}{extra}}}", "values": f"0+{per_minute!r}x{MINUTES}"}

    return [
        counter("vllm:spec_decode_num_drafts_total", drafts),
        counter("vllm:spec_decode_num_draft_tokens_total", drafts * c.k),
        counter("vllm:spec_decode_num_accepted_tokens_total",
                drafts * (c.acceptance_length - 1.0)),
        counter("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                drafts * c.first_position, ', position="0"'),
        counter("vllm:request_success_total", 60.0 * c.arrival_rate, ', finished_reason="stop"'),
    ]


def _firing(tmp_path: Path, overrides: dict, series: list[dict]) -> set[str]:
    """The configurations (model_name) whose SDAcceptanceRateLow fires at 25 minutes, from
    promtool run on the rules rendered with ``overrides``."""
    mixin.write_files(tmp_path, overrides)
    test = {
        "rule_files": [str(tmp_path / mixin.RULES_FILE), str(tmp_path / mixin.ALERTS_FILE)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [{
                "expr": 'count by (model_name) '
                        '(ALERTS{alertname="SDAcceptanceRateLow", alertstate="firing"})',
                "eval_time": "25m",
                "exp_samples": [],
            }],
        }],
    }
    path = tmp_path / "sweep-test.yaml"
    path.write_text(yaml.safe_dump(test), encoding="utf-8")
    proc = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    if proc.returncode == 0:
        assert "SUCCESS" in out, out[-3000:]
        return set()
    assert "got:" in out, out[-3000:]  # any other failure is a broken test file
    got = set(re.findall(r'model_name="([^"]+)"', out.split("got:", 1)[1]))
    assert got, out[-3000:]
    return got


def test_the_sweep_has_every_drafter_and_k_at_a_real_speedup():
    """The premise: each drafter at each k (but Qwen3-4B at k = 1, never 1.5x faster) has
    configurations measured at >= 1.5x, and vLLM's rate is below 0.4 for many of them."""
    have = {(c.drafter, c.k) for c in HEALTHY}
    drafters = {c.drafter for c in SWEEP_CONFIGS}
    assert len(drafters) == 3
    assert have == {(d, k) for d in drafters for k in range(1, 7)} - {("Qwen3-4B", 1)}
    assert sum(c.rate < THRESHOLD for c in HEALTHY) >= 40
    assert all(c.first_position >= c.rate - 1e-9 for c in SWEEP_CONFIGS)


def test_default_alert_stays_silent_on_every_healthy_configuration(tmp_path):
    """The default alert (the exporter's α) fires for none of the configurations measured at
    >= 1.5x; the raw-rate variant on the same series fires exactly where the rate is below
    the threshold."""
    series = [s for c in HEALTHY for s in _exporter_series(c)]
    assert _firing(tmp_path / "default", {}, series) == set()
    rate_low = {c.name for c in HEALTHY if c.rate < THRESHOLD}
    fired = _firing(tmp_path / "rate", {"alerts": {"SDAcceptanceRateLow": {"measure": "rate"}}},
                    series)
    assert fired == rate_low
    _print_figures(fired)


def test_vllm_source_alert_stays_silent_on_every_healthy_configuration(tmp_path):
    """The same from vLLM's counters: the recorded first-position α (source 'vllm')."""
    series = [s for c in HEALTHY for s in _vllm_series(c)]
    assert _firing(tmp_path / "vllm", {"alerts": {"SDAcceptanceRateLow": {"source": "vllm"}}},
                   series) == set()
    fired = _firing(tmp_path / "vllm-rate",
                    {"alerts": {"SDAcceptanceRateLow": {"source": "vllm", "measure": "rate"}}},
                    series)
    assert fired == {c.name for c in HEALTHY if c.rate < THRESHOLD}


def _print_figures(rate_fired: set[str]) -> None:
    """Per drafter and k: α, vLLM's rate and the measured speedup over the healthy runs."""
    by: dict[tuple[str, int], list[Config]] = defaultdict(list)
    for c in HEALTHY:
        by[(c.drafter, c.k)].append(c)
    print(f"\n{'drafter':<30} k  runs  α (first pos)  vLLM rate   speedup     "
          "α alert  rate alert")
    for (drafter, k), cs in sorted(by.items()):
        def span(values: list[float]) -> str:
            return f"{min(values):.2f}-{max(values):.2f}"
        n_rate = sum(c.name in rate_fired for c in cs)
        print(f"{drafter:<30} {k}  {len(cs):>4}  {span([c.first_position for c in cs]):>13}  "
              f"{span([c.rate for c in cs]):>9}  {span([c.speedup for c in cs]):>9}  "
              f"{'0':>8}  {n_rate:>4}/{len(cs)}")


@pytest.mark.parametrize("k", range(1, 7))
def test_alpha_does_not_fall_with_k_on_the_sweep(k):
    """Why it works: over the healthy runs, the first-position acceptance of each drafter at
    k stays within 0.05 of its value at k = 2, while vLLM's rate falls with k."""
    for drafter in {c.drafter for c in HEALTHY}:
        def mean(attr: str, kk: int, drafter: str = drafter) -> float:
            xs = [getattr(c, attr) for c in SWEEP_CONFIGS if c.drafter == drafter and c.k == kk]
            return sum(xs) / len(xs)
        assert abs(mean("first_position", k) - mean("first_position", 2)) < 0.05, drafter
        if k > 1:
            assert mean("rate", k) < mean("rate", k - 1), drafter
