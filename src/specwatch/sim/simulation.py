"""The simulated server: every engine of every model of a scenario, with scripted and
requested restarts.

`Simulation` owns the engines (one `Engine` per model and engine index, re-created on a restart
with a fresh generation's seed), maps simulated time to wall time for ``_created`` samples, and
describes each engine's KV cache as vLLM's ``cache_config_info`` labels. For a fixed seed, the
same scenario gives the same pages.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from specwatch.sim.costs import StepCosts
from specwatch.sim.engine import Engine
from specwatch.sim.scenario import ModelSpec, Restart, Scenario
from specwatch.sim.stats import EngineStats

__all__ = ["Simulation"]


@dataclass
class _Slot:
    model_index: int
    engine: int
    generation: int
    engine_obj: Engine


class Simulation:
    """Every engine of every model of a scenario, with scripted restarts.

    `wall_time(sim_t)` maps simulated time to the Unix time used for ``_created`` samples;
    the HTTP driver passes its own, tests can leave the default (start now, speed 1).
    """

    def __init__(self, scenario: Scenario, *, seed: int | None = None, time_scale: float = 1.0,
                 wall_time: Callable[[float], float] | None = None,
                 record_latencies: int = 0) -> None:
        """``record_latencies``: keep the last N finished requests' (finish time, e2e,
        TTFT) in :attr:`records` (the ground truth of measured-speedup tests; 0: none)."""
        import time

        for i, m in enumerate(scenario.models):
            if m.coefficients is None:
                raise ValueError(f"models[{i}] ({m.model_name}): coefficients not loaded")
        self.scenario = scenario
        self.specs = list(scenario.models)  # current configuration (restarts may change k)
        self.seed = scenario.seed if seed is None else seed
        self.time_scale = time_scale
        start_wall = time.time()
        self.wall_time = wall_time or (lambda t: start_wall + t)
        self.now = 0.0
        self.down_until = -1.0
        self.up_since = 0.0
        self.restarts_done = 0
        self._requested: list[Restart] = []
        self.records: deque[tuple[float, float, float]] | None = (
            deque(maxlen=record_latencies) if record_latencies > 0 else None)
        self.costs = [StepCosts(m.coefficients, m.num_speculative_tokens, m.nonlinear_s)
                      for m in scenario.models]
        self.slots: list[_Slot] = []
        for mi, m in enumerate(scenario.models):
            for e in range(m.engines):
                self.slots.append(_Slot(mi, e, 0, self._new_engine(mi, e, 0, 0.0)))

    def _new_engine(self, mi: int, e: int, generation: int, start: float) -> Engine:
        spec = self.specs[mi]
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, mi, e, generation]))
        created = self.wall_time(start)
        stats = EngineStats(spec.model_name, e, spec.num_speculative_tokens,
                            spec.max_model_len, created)
        engine = Engine(spec, e, self.costs[mi], rng, stats, start, self.scenario.loop,
                        self.time_scale, mix_seed=(self.seed, mi))
        engine.records = getattr(self, "records", None)
        return engine

    @property
    def up(self) -> bool:
        """Whether the server answers (false during a whole-server restart's downtime)."""
        return self.now >= self.down_until

    def request_restart(self, restart: Restart) -> None:
        """Restart at the current simulated time (its `at_s` is ignored), e.g. with another
        `num_speculative_tokens`, as a deployer does to switch SD off or change k."""
        self._requested.append(restart)

    def advance_to(self, t: float) -> None:
        """Advance every engine to simulated time t, applying restarts on the way."""
        for r in self._requested:
            self._restart(r, self.now)
        self._requested = []
        restarts = self.scenario.restarts
        while self.restarts_done < len(restarts) and restarts[self.restarts_done].at_s <= t:
            r = restarts[self.restarts_done]
            self.restarts_done += 1
            self._restart(r, r.at_s)
        self._advance_engines(t)

    def _restart(self, r: Restart, at: float) -> None:
        self._advance_engines(at)
        back = at + r.downtime_s
        targeted = {mi for mi, spec in enumerate(self.specs)
                    if r.model_name is None or spec.model_name == r.model_name}
        if r.num_speculative_tokens is not None:
            for mi in targeted:
                spec = replace(self.specs[mi], num_speculative_tokens=r.num_speculative_tokens)
                self.specs[mi] = spec
                self.costs[mi] = StepCosts(spec.coefficients, spec.num_speculative_tokens,
                                           spec.nonlinear_s)
        whole = r.model_name is None and r.engine is None
        for slot in self.slots:
            if not whole and slot.model_index not in targeted:
                continue
            if r.engine is not None and slot.engine != r.engine:
                continue
            slot.generation += 1
            slot.engine_obj = self._new_engine(slot.model_index, slot.engine,
                                               slot.generation, back)
        if whole:
            self.down_until = back
            self.up_since = back

    def _advance_engines(self, t: float) -> None:
        for slot in self.slots:
            slot.engine_obj.advance_to(t)
        self.now = max(self.now, t)

    def engine_stats(self) -> list[EngineStats]:
        """Stats of engines that exist now (a restarting server has none until it is back),
        gauges refreshed to the current instant."""
        out = []
        for slot in self.slots:
            eng = slot.engine_obj
            if self.now >= eng.now:
                eng.refresh_gauges()
                out.append(eng.stats)
        return out

    def cache_config(self) -> list[dict[str, str]]:
        """``vllm:cache_config_info`` labels per engine (vLLM 0.32's CacheConfig fields)."""
        out = []
        for slot in self.slots:
            spec = self.specs[slot.model_index]
            blocks = spec.kv_cache_tokens // spec.block_size
            out.append(_cache_config_labels(spec, slot.engine, blocks))
        return out


def _cache_config_labels(spec: ModelSpec, engine: int, blocks: int) -> dict[str, str]:
    tokens = blocks * spec.block_size
    return {
        "_block_size_resolved": "True",
        "block_size": str(spec.block_size),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(spec.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": "True",
        "engine": str(engine),
        "gpu_memory_utilization": "0.9",
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(round(tokens / spec.max_model_len, 2)),
        "kv_cache_memory_bytes": "None",
        "kv_cache_size_tokens": str(tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(blocks),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }
