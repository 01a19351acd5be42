"""A scripted vLLM 0.33-shaped server state whose /metrics page tests render.

The counters move together as in vLLM: each finished request adds its generated tokens,
drafts = verify steps that drafted (generated tokens / acceptance length), per-position
accepted counts = drafts × P(first i+1 accepted), accepted = their sum, proposed draft
tokens = drafts × k; the e2e and TTFT histograms use vLLM's buckets. With SD off the
spec_decode families are absent (as when vLLM runs without --speculative-config), and a
restart zeroes every counter and changes process_start_time_seconds.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# Each request's latency is spread over three values (share, factor of the mean):
# quantiles then fall in known buckets.
SPREAD = ((0.5, 0.8), (0.49, 1.0), (0.01, 3.0))


@dataclass
class VllmState:
    model: str = "m"
    sd: bool = True
    k: int = 3
    process_start: float = 1.7e9
    drafts: float = 0.0
    draft_tokens: float = 0.0
    per_position: list[float] = field(default_factory=list)
    requests: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    e2e_sum: float = 0.0
    e2e_counts: list[float] = field(default_factory=lambda: [0.0] * (len(E2E_BUCKETS) + 1))
    ttft_sum: float = 0.0
    ttft_counts: list[float] = field(default_factory=lambda: [0.0] * (len(TTFT_BUCKETS) + 1))

    def __post_init__(self) -> None:
        if not self.per_position:
            self.per_position = [0.0] * self.k

    def restart(self, sd: bool, k: int | None = None, at: float | None = None) -> None:
        """A server restart with a new configuration: every counter starts from 0."""
        fresh = VllmState(model=self.model, sd=sd, k=k or self.k,
                          process_start=at if at is not None else self.process_start + 1)
        self.__dict__.update(fresh.__dict__)

    def advance(self, seconds: float, arrival_rate: float, profile: tuple[float, ...],
                latency: float, ttft: float, prompt: float = 500.0,
                generation: float = 200.0) -> None:
        """``seconds`` of steady traffic; ``profile`` is P(first i+1 drafts accepted)."""
        n = arrival_rate * seconds
        self.requests += n
        self.prompt_tokens += n * prompt
        self.generation_tokens += n * generation
        for share, factor in SPREAD:
            self._observe(self.e2e_counts, E2E_BUCKETS, latency * factor, n * share)
            self._observe(self.ttft_counts, TTFT_BUCKETS, ttft * factor, n * share)
        self.e2e_sum += n * latency * sum(s * f for s, f in SPREAD)
        self.ttft_sum += n * ttft * sum(s * f for s, f in SPREAD)
        if self.sd:
            prof = [profile[i] if i < len(profile) else 0.0 for i in range(self.k)]
            e = 1.0 + sum(prof)
            drafts = n * generation / e
            self.drafts += drafts
            self.draft_tokens += drafts * self.k
            for i, p in enumerate(prof):
                self.per_position[i] += drafts * p

    @staticmethod
    def _observe(counts: list[float], bounds: tuple[float, ...], value: float, n: float) -> None:
        counts[bisect.bisect_left(bounds, value)] += n

    def render(self) -> str:
        m = f'model_name="{self.model}"'
        lines = [
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.process_start}",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{engine="0",finished_reason="stop",{m}}} '
            f"{self.requests}",
        ]
        for name, total, count in (("prompt_tokens", self.prompt_tokens, self.requests),
                                   ("generation_tokens", self.generation_tokens, self.requests)):
            lines += [f"# TYPE vllm:request_{name} histogram",
                      f'vllm:request_{name}_bucket{{engine="0",le="+Inf",{m}}} {count}',
                      f'vllm:request_{name}_sum{{engine="0",{m}}} {total}',
                      f'vllm:request_{name}_count{{engine="0",{m}}} {count}']
        for name, bounds, counts, total in (
                ("e2e_request_latency_seconds", E2E_BUCKETS, self.e2e_counts, self.e2e_sum),
                ("time_to_first_token_seconds", TTFT_BUCKETS, self.ttft_counts, self.ttft_sum)):
            lines.append(f"# TYPE vllm:{name} histogram")
            running = 0.0
            for bound, c in zip((*bounds, None), counts, strict=True):
                running += c
                le = "+Inf" if bound is None else repr(float(bound))
                lines.append(f'vllm:{name}_bucket{{engine="0",le="{le}",{m}}} {running}')
            lines += [f'vllm:{name}_sum{{engine="0",{m}}} {total}',
                      f'vllm:{name}_count{{engine="0",{m}}} {running}']
        lines += ["# TYPE vllm:num_requests_running gauge",
                  f'vllm:num_requests_running{{engine="0",{m}}} 4']
        if self.sd:
            accepted = sum(self.per_position)
            for name, value in (("drafts", self.drafts), ("draft_tokens", self.draft_tokens),
                                ("accepted_tokens", accepted)):
                lines += [f"# TYPE vllm:spec_decode_num_{name}_total counter",
                          f'vllm:spec_decode_num_{name}_total{{engine="0",{m}}} {value}']
            lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
            for i, v in enumerate(self.per_position):
                lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total'
                             f'{{engine="0",{m},position="{i}"}} {v}')
        return "\n".join(lines) + "\n"
