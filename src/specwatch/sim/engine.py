"""Discrete-event simulation of vLLM's continuous batching with speculative decoding.

The simulated system's ground truth is the latency model's six coefficients (README "Latency
model"; a_p, b_p prefill, a_v, b_v verify, a_d, b_d one draft token; optional context slope
and MoE split). This module turns them into engine costs such that, with no noise and no
non-linear term, the long-run mean latency of the simulation is what the model's closed form
L = C1 / (1 − λ·C2) predicts, up to effects the model deliberately ignores (listed below).

Step-cost mapping
-----------------
The model prices a request as ``L = a_p + b_p·B + (g/E)·[(a_v + k·a_d) + B·(b_v + k·b_d)]``
with B = λ·L requests in flight. The simulator realises each term physically:

* **Verify cycles.** Requests in decode advance together in engine steps. A step with n
  requests admitted to the batch (decoding and prefilling, i.e. ``num_requests_running``)
  lasts ``(a_v + k·a_d) + (n − 1)·(b_v + k·b_d)``: a_v + k·a_d is the batch-of-one cost (one
  verify pass plus k drafter steps, as measured at batch 1) and each *other* request in the
  batch adds its marginal b_v + k·b_d. A tagged request takes about g/E such steps and sees,
  on average, the B other requests the model counts. (Charging n instead of n − 1 would
  count the request against itself: the model's zero-load latency would then be wrong by
  (g/E)·(b_v + k·b_d).) With the context slope, each other request adds
  ``b_v_context·(its prompt + generated tokens)``, whose mean over a request's life is the
  model's ``b_v_context·(p + g/2)``.
* **Prefill, and how it delays others.** In a continuous batch a newly admitted prompt is
  computed alongside the running decodes (chunked prefill), so it slows the requests already
  in flight. The model's ``b_p·B`` term has two equivalent readings in the mean: my prefill
  costs b_p per request in flight, or each of the B requests that arrive during my lifetime
  (λ·L = B of them, Poisson arrivals) delays me by b_p with its prefill. The simulator uses
  the second, physical reading: admitting a request stalls every request already admitted
  (the current decode step and other prefills) by b_p, and the new request itself waits a_p
  for its first token (its zero-load time to first token). Charging the whole prefill a_p
  to every running request instead would make the marginal prefill cost a_p, not b_p: a
  system the six-coefficient form cannot represent with these coefficients.
* **MoE.** With an MoE block, the verify and prefill costs add their expert part times
  φ(T) = 1 − (1 − m/M)^T, T = n·(k + 1) tokens routed through the verifier in the step (n
  without SD), the model's φ with T = B·(k + 1).
* **Compute-bound steps (saturation regime).** With ``c_v``/``knee_v`` (and ``c_d``/
  ``knee_d``) set, a step whose other requests put more than knee_v tokens through the
  verifier (``(n − 1)·(k + 1)``; n − 1 without SD) costs ``c_v`` per token past the knee,
  and each of the k drafter steps ``c_d`` per request past knee_d: the model's roofline
  terms with B = n − 1 others. SD reaches the knee at a (k + 1)-times smaller batch, so its
  speedup collapses past break-even (``make demo``), as on real hardware.
* **Perturbations (off by default).** ``step_noise_cv`` multiplies each step and prefill
  by an independent mean-one lognormal factor; ``nonlinear_s`` adds
  ``nonlinear_s·(n − 1)²`` seconds per step (attention and memory traffic that grow faster
  than linearly), so the linear model becomes an approximation, not an identity.

What the model ignores and the simulator keeps (the sources of the small residual error):
requests join the batch and are admitted only at step boundaries (as vLLM's scheduler runs
once per step); the first token comes from the prefill, so decode needs g − 1 tokens; the
last verify cycle of a request is truncated (its extra accepted tokens are counted by the
SD counters but not emitted, as in vLLM); the batch and KV-cache limits (past them requests
queue in ``num_requests_waiting`` and latency explodes, as in vLLM, while the model only
sees λ·C2 → 1).

Acceptance
----------
Each request draws α from its phase's distribution at arrival. Every verify cycle drafts k
tokens; position i is accepted with probability α if positions 0..i−1 were (acceptance is a
prefix); the cycle commits accepted + 1 tokens (the bonus token), truncated to what the
request still needs. Counters follow vLLM's definitions exactly: one draft per (request,
step), k draft tokens, accepted tokens without the bonus, per-position counts.

Time
----
Everything here runs in simulated seconds. `time_scale` multiplies every duration put into
the histograms: `specwatch simulate --speed X` uses 1/X, so that the page describes a
consistent server X times faster than the scenario (Little's law and the model still hold
on the page with every coefficient divided by X).

Size: one discrete-event loop (arrivals, scheduling, prefill, drafting, verification,
restarts) whose handlers share the engine's state; split across modules they would each
need all of it.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from specwatch.sim.scenario import AcceptanceDist, ModelSpec, Restart, Scenario
from specwatch.sim.stats import EngineStats

__all__ = ["Engine", "Simulation", "StepCosts"]

_INF = float("inf")
_POOL = 64  # arrivals' lengths and α are drawn in blocks of this many (per phase)
_VECTOR_MIN = 6  # below this many, observing value by value is cheaper than with arrays
_VECTOR_BATCH = 48  # from this batch size on, a step runs as numpy array operations


# --------------------------------------------------------------------------- costs


class StepCosts:
    """The coefficient → engine-cost mapping described in the module docstring.

    `coef` is a `specwatch.model.Coefficients` or `MoECoefficients` (duck-typed: dense
    coefficients a_p, b_p, a_v, b_v, a_d, b_d, b_v_context; MoE adds dense, expert,
    experts, active_experts).
    """

    def __init__(self, coef: Any, k: int, nonlinear_s: float = 0.0) -> None:
        moe = hasattr(coef, "expert")
        dense = coef.dense if moe else coef
        self.k = k
        self.c0 = dense.a_v + k * dense.a_d
        self.c1 = dense.b_v + k * dense.b_d
        self.ctx = float(getattr(dense, "b_v_context", 0.0))
        self.a_p = dense.a_p
        self.b_p = dense.b_p
        self.nonlinear = nonlinear_s
        # Saturation regime (model.md): compute-bound cost past the verifier's and the
        # drafter's knee, in tokens per step; zero for the linear model and MoE.
        self.c_v = float(getattr(dense, "c_v", 0.0))
        self.knee_v = float(getattr(dense, "knee_v", 0.0))
        self.c_d = float(getattr(dense, "c_d", 0.0))
        self.knee_d = float(getattr(dense, "knee_d", 0.0))
        self.moe = moe
        if moe:
            self.s_c0 = coef.expert.a_v
            self.s_c1 = coef.expert.b_v
            self.s_a_p = coef.expert.a_p
            self.s_b_p = coef.expert.b_p
            self._log_keep = (
                math.log(1.0 - coef.active_experts / coef.experts)
                if coef.active_experts < coef.experts
                else -_INF
            )

    def phi(self, n: int) -> float:
        """Share of experts the step's n·(k+1) routed tokens touch (0 for dense models)."""
        if not self.moe or n <= 0:
            return 0.0
        if self._log_keep == -_INF:
            return 1.0
        return -math.expm1(n * (self.k + 1) * self._log_keep)

    def step(self, n: int, total_context: float) -> float:
        """Duration of one verify step with n requests in the batch (n >= 1)."""
        others = n - 1
        cost = self.c0 + others * self.c1
        if self.ctx:
            cost += self.ctx * total_context * others / n
        if self.moe:
            cost += self.phi(n) * (self.s_c0 + others * self.s_c1)
        if self.nonlinear:
            cost += self.nonlinear * others * others
        if self.c_v:
            cost += self.c_v * max(0.0, others * (self.k + 1) - self.knee_v)
        if self.c_d:
            cost += self.k * self.c_d * max(0.0, others - self.knee_d)
        return cost

    def prefill(self, n: int) -> float:
        """The admitted request's own prefill time (to its first token); n includes it."""
        return self.a_p + (self.phi(n) * self.s_a_p if self.moe else 0.0)

    def stall(self, n: int) -> float:
        """How long admitting one prefill delays every request already in the batch."""
        return self.b_p + (self.phi(n) * self.s_b_p if self.moe else 0.0)


# --------------------------------------------------------------------------- requests


class _Request:
    __slots__ = (
        "admitted_at",
        "alpha",
        "arrival",
        "cached",
        "finish_reason",
        "first_scheduled",
        "first_token_at",
        "generated",
        "kv_blocks",
        "last_token_at",
        "log_alpha",
        "max_tokens",
        "preemptions",
        "prompt",
        "target",
    )

    def __init__(self, arrival: float, prompt: int, target: int, max_tokens: int,
                 finish_reason: str, alpha: float, cached: int) -> None:
        self.arrival = arrival
        self.prompt = prompt
        self.target = target
        self.max_tokens = max_tokens
        self.finish_reason = finish_reason
        self.alpha = alpha
        # log α for the draws; α = 1 accepts every draft (a tiny negative caps at k), α = 0
        # none (−inf gives 0)
        self.log_alpha = math.log(alpha) if 0.0 < alpha < 1.0 else (
            -1e-300 if alpha >= 1.0 else -_INF)
        self.cached = cached
        self.generated = 0
        self.first_scheduled = -1.0
        self.admitted_at = -1.0
        self.first_token_at = -1.0
        self.last_token_at = -1.0
        self.preemptions = 0
        self.kv_blocks = 0


# --------------------------------------------------------------------------- one engine


class Engine:
    """One vLLM engine core (one ``engine`` label value) of one model.

    Events: arrivals (a non-homogeneous Poisson process by thinning), prefill completions
    and step completions. `advance_to(t)` processes every event up to simulated time t.

    The decode batch is a list of request objects. A step over a small batch runs as plain
    Python (numpy's per-call overhead would dominate); from `_VECTOR_BATCH` requests on, the
    acceptance draws and token bookkeeping run as a few numpy array operations.
    """

    def __init__(self, spec: ModelSpec, engine: int, costs: StepCosts, rng: np.random.Generator,
                 stats: EngineStats, start: float, loop: bool, time_scale: float = 1.0,
                 mix_seed: tuple[int, ...] = (0,)) -> None:
        self.spec = spec
        self.mix_seed = mix_seed
        self._blocks_seen: dict[tuple[int, int], int] = {}
        self.engine = engine
        self.costs = costs
        self.rng = rng
        self.stats = stats
        self.loop = loop
        self.scale = time_scale
        self.k = spec.num_speculative_tokens
        self.now = start
        self.share = 1.0 / spec.engines
        self.block_size = spec.block_size
        self.total_blocks = spec.kv_cache_tokens // spec.block_size
        self.used_blocks = 0
        self.waiting: deque[_Request] = deque()
        self.prefilling: list[tuple[float, int, _Request]] = []  # heap of (end, seq, req)
        self.joining: list[_Request] = []  # prefill done, join at the next step boundary
        self.batch: list[_Request] = []  # the decode batch, in admission order
        # scalar draws of the pure-Python step path (seeded from the engine's generator)
        self.prng = random.Random(int(rng.integers(1 << 62)))
        self.step_end = _INF
        self.prev_step_end = -1.0
        self.iter_prompt_tokens = 0
        self._seq = 0
        self._noise_sigma = math.sqrt(math.log1p(spec.step_noise_cv**2))
        self._enter_phase(start)
        self.next_arrival = self._next_arrival(start)
        #: Ground-truth latency records (issue 16): when the simulation keeps them, each
        #: finished request appends (finish time, e2e, TTFT) in page seconds (simulated
        #: seconds x time scale; finish time in simulated seconds).
        self.records: deque[tuple[float, float, float]] | None = None

    # ----------------------------------------------------------------- arrivals

    def _enter_phase(self, t: float) -> None:
        """Cache the phase containing t: [start, end) in absolute time, rates, samplers."""
        spec = self.spec
        idx, into = spec.phase_at(t, self.loop)
        phase = spec.phases[idx]
        start = t - into
        if idx == len(spec.phases) - 1 and not self.loop:
            end = _INF
        else:
            end = max(start + phase.duration_s, math.nextafter(t, _INF))
        self.ph_index = idx
        self.ph = phase
        self.ph_start = start
        self.ph_end = end
        self.ph_peak = phase.arrival_rate.peak * self.share
        self._pool_left = 0

    def _next_arrival(self, t: float) -> float:
        """Next arrival of the non-homogeneous Poisson process (thinning per phase)."""
        rng = self.rng
        while True:
            if not (self.ph_start <= t < self.ph_end):
                self._enter_phase(t)
            peak = self.ph_peak
            if peak <= 0:
                if self.ph_end == _INF:
                    return _INF
                t = self.ph_end
                continue
            candidate = t + rng.exponential(1.0 / peak)
            if candidate >= self.ph_end:
                t = self.ph_end
                continue
            t = candidate
            rate = self.ph.arrival_rate
            if rate.start == rate.end:
                return t
            frac = min((t - self.ph_start) / self.ph.duration_s, 1.0)
            if rng.random() * peak <= rate.at(frac) * self.share:
                return t

    def _draw(self) -> tuple[int, int, float]:
        """(prompt, wanted generation, α) for one arrival, from pre-sampled blocks."""
        if self._pool_left == 0:
            n = _POOL
            ph = self.ph
            rng = self.rng
            self._pool_prompt = ph.prompt_tokens.sample(rng, n).tolist()
            self._pool_gen = ph.generation_tokens.sample(rng, n).tolist()
            self._pool_alpha = (ph.acceptance.sample(rng, n).tolist() if self.k
                                else [0.0] * n)
            self._pool_left = n
        self._pool_left -= 1
        i = self._pool_left
        alpha = self._pool_alpha[i]
        acc = self.ph.acceptance
        if self.k and acc.switch_every_s:
            alpha = acc.components[self._block_component(acc)].sample(self.rng)
        return self._pool_prompt[i], self._pool_gen[i], alpha

    def _block_component(self, acc: AcceptanceDist) -> int:
        """The mixture component serving the current time block: drawn by weight from the
        block's own seed, so every engine of the model agrees (tenants switch for all)."""
        block = int(self.now // acc.switch_every_s)
        key = (id(acc), block)
        comp = self._blocks_seen.get(key)
        if comp is None:
            rng = np.random.default_rng(np.random.SeedSequence([*self.mix_seed, block]))
            comp = int(rng.choice(len(acc.components), p=np.asarray(acc.weights)))
            if len(self._blocks_seen) > 1024:
                self._blocks_seen.clear()
            self._blocks_seen[key] = comp
        return comp

    def _arrive(self) -> None:
        t = self.now
        spec = self.spec
        if not (self.ph_start <= t < self.ph_end):
            self._enter_phase(t)
        prompt, want, alpha = self._draw()
        max_tokens = min(spec.max_tokens, spec.max_model_len - prompt)
        if want >= max_tokens:
            target, reason = max_tokens, "length"
        else:
            target, reason = want, "stop"
        cached = 0
        if spec.prefix_cache_hit_rate:
            bs = spec.block_size
            # whole blocks only, and never the last prompt token (vLLM recomputes it)
            cached = max(min(int(prompt * spec.prefix_cache_hit_rate) // bs * bs, prompt - 1), 0)
        self.waiting.append(_Request(t, prompt, target, max_tokens, reason, alpha, cached))
        self.next_arrival = self._next_arrival(t)
        self._admit()

    # ----------------------------------------------------------------- scheduling

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _running(self) -> int:
        return len(self.batch) + len(self.joining) + len(self.prefilling)

    def _admit(self) -> None:
        """Admit waiting requests (FCFS) while the batch and the KV cache have room.

        Admission starts the request's prefill at once; its prompt shares the forward passes
        of everything already admitted, which are delayed by the prefill stall.
        """
        limit = self.spec.max_num_seqs
        while self.waiting:
            running = self._running()
            if running >= limit:
                break
            req = self.waiting[0]
            need = self._blocks(req.prompt + req.generated + 1)
            if self.used_blocks + need > self.total_blocks:
                break
            self.waiting.popleft()
            self.used_blocks += need
            req.kv_blocks = need
            now = self.now
            if req.first_scheduled < 0:
                req.first_scheduled = now
            n = running + 1
            if running:
                stall = self.costs.stall(n) * self._noise()
                if stall > 0:
                    if self.step_end != _INF:
                        self.step_end += stall
                    if self.prefilling:  # a uniform shift keeps the heap ordered
                        self.prefilling = [(end + stall, s, r) for end, s, r in self.prefilling]
            duration = self.costs.prefill(n) * self._noise()
            self._seq += 1
            heapq.heappush(self.prefilling, (now + duration, self._seq, req))

    def _noise(self) -> float:
        if not self._noise_sigma:
            return 1.0
        s = self._noise_sigma
        return float(self.rng.lognormal(-s * s / 2.0, s))

    def _start_step(self) -> None:
        """Start the next verify step if anyone is decoding.

        Members of the last step already hold the KV blocks for this step (reserved when it
        ended); requests joining now take theirs, and on overflow the newest are preempted.
        """
        batch = self.batch
        if self.joining:
            bs = self.block_size
            extra = self.k + bs  # this step's k drafts + 1 token, rounded up to whole blocks
            grow = 0
            for r in self.joining:
                need = (r.prompt + r.generated + extra) // bs
                grow += need - r.kv_blocks
                r.kv_blocks = need
            self.used_blocks += grow
            batch.extend(self.joining)
            self.joining = []
        if not batch:
            self.step_end = _INF
            return
        if self.used_blocks > self.total_blocks and len(batch) > 1:
            self._preempt()
        n = len(batch) + len(self.prefilling)
        context = 0.0
        if self.costs.ctx:
            context = float(sum(r.prompt + r.generated for r in batch))
            context += float(sum(r.prompt for _, _, r in self.prefilling))
        self.step_end = self.now + self.costs.step(n, context) * self._noise()

    def _preempt(self) -> None:
        """vLLM's recompute preemption: drop the newest requests until the step fits; they
        free their KV blocks and go back to the head of the queue."""
        batch = self.batch
        while len(batch) > 1 and self.used_blocks > self.total_blocks:
            victim = batch.pop()
            self.used_blocks -= victim.kv_blocks
            victim.kv_blocks = 0
            victim.preemptions += 1
            self.stats.num_preemptions += 1
            self.waiting.appendleft(victim)

    def _finish_step(self) -> None:
        now = self.now
        st = self.stats
        batch = self.batch
        k = self.k
        if len(batch) >= _VECTOR_BATCH:
            emitted, done = self._step_vector(batch)
        else:
            emitted, done = self._step_python(batch)
        if k:
            st.num_drafts += len(batch)
            st.num_draft_tokens += len(batch) * k
        st.generation_tokens += emitted
        st.h_iteration.observe(emitted + self.iter_prompt_tokens)
        self.iter_prompt_tokens = 0
        self.prev_step_end = now
        if done:
            gone = set(map(id, done))
            self.batch = [r for r in batch if id(r) not in gone]
            self._finish_many(done)
        self.step_end = _INF
        self._admit()
        self._start_step()

    def _step_python(self, batch: list[_Request]) -> tuple[int, list[_Request]]:
        """One verify cycle for each request of a small batch, in plain Python.

        Accepted drafts a: P(a >= i) = α^i for i <= k (acceptance is a prefix), drawn as
        a = floor(log(1 − U) / log α) capped at k. Each continuing request then reserves
        the KV blocks of its next step.
        """
        now, k, st = self.now, self.k, self.stats
        rand, log = self.prng.random, math.log
        bs = self.block_size
        extra = k + bs
        counts = [0] * (k + 1)
        emitted = accepted = same = grow = 0
        prev = self.prev_step_end
        itl = st.h_itl
        scale = self.scale
        done = []
        for r in batch:
            if k:
                q = log(1.0 - rand()) / r.log_alpha
                a = k if q >= k else int(q)
                counts[a] += 1
                accepted += a
            else:
                a = 0
            want = r.target - r.generated
            t = a + 1 if a < want else want
            r.generated += t
            emitted += t
            if r.last_token_at == prev:
                same += 1
            else:
                itl.observe((now - r.last_token_at) * scale)
            r.last_token_at = now
            if t == want:
                done.append(r)
            else:
                need = (r.prompt + r.generated + extra) // bs
                grow += need - r.kv_blocks
                r.kv_blocks = need
        self.used_blocks += grow
        if same:
            itl.observe_n((now - prev) * scale, same)
        if k:
            self._count_accepted(counts, accepted)
        return emitted, done

    def _step_vector(self, batch: list[_Request]) -> tuple[int, list[_Request]]:
        """`_step_python` for a large batch, with numpy arrays (same distributions)."""
        now, k, st = self.now, self.k, self.stats
        m = len(batch)
        gen = np.array([r.generated for r in batch], dtype=np.int64)
        target = np.array([r.target for r in batch], dtype=np.int64)
        if k:
            log_alpha = np.array([r.log_alpha for r in batch])
            with np.errstate(divide="ignore", over="ignore"):
                q = np.log1p(-self.rng.random(m)) / log_alpha
            acc = np.minimum(q, k).astype(np.int64)
            counts = np.bincount(acc, minlength=k + 1).tolist()
            self._count_accepted(counts, int(acc.sum()))
            tokens = np.minimum(acc + 1, target - gen)
        else:
            tokens = np.minimum(1, target - gen)
        gen += tokens
        prev = self.prev_step_end
        last = [r.last_token_at for r in batch]
        same = last.count(prev)
        if same == m:
            st.h_itl.observe_n((now - prev) * self.scale, m)
        else:
            st.h_itl.observe_many((now - np.array(last)) * self.scale)
        bs = self.block_size
        prompt = np.array([r.prompt for r in batch], dtype=np.int64)
        finished = gen >= target
        need = np.where(finished, 0, (prompt + gen + (k + bs)) // bs)
        grow = 0
        done = []
        for r, g, nb, f in zip(batch, gen.tolist(), need.tolist(), finished.tolist(),
                               strict=True):
            r.generated = g
            r.last_token_at = now
            if f:
                done.append(r)
            else:
                grow += nb - r.kv_blocks
                r.kv_blocks = nb
        self.used_blocks += grow
        return int(tokens.sum()), done

    def _count_accepted(self, counts: list[int], accepted: int) -> None:
        """counts[a] = drafts with exactly a accepted → per-position counts (a >= i + 1)."""
        st = self.stats
        st.num_accepted_tokens += accepted
        per_pos = st.accepted_per_pos
        running = 0
        for pos in range(self.k - 1, -1, -1):
            running += counts[pos + 1]
            per_pos[pos] += running

    def _finish_prefill(self) -> None:
        _, _, req = heapq.heappop(self.prefilling)
        now = self.now
        st = self.stats
        scale = self.scale
        computed = req.prompt + req.generated
        if req.first_token_at < 0:
            computed -= req.cached
            st.prompt_tokens += req.prompt
            st.prompt_tokens_cached += req.cached
            st.prefix_cache_queries += req.prompt
            st.prefix_cache_hits += req.cached
            req.first_token_at = now
            st.h_ttft.observe((now - req.arrival) * scale)
        else:  # recomputed after a preemption
            st.h_itl.observe((now - req.last_token_at) * scale)
        # the prefill's forward pass samples the next token
        req.generated += 1
        req.last_token_at = now
        st.generation_tokens += 1
        if self.step_end == _INF:
            st.h_iteration.observe(computed + 1)
        else:
            self.iter_prompt_tokens += computed + 1
        if req.generated >= req.target:
            self._finish(req)
            self._admit()
        else:
            self.joining.append(req)
        if self.step_end == _INF:
            self._start_step()

    def _finish(self, r: _Request) -> None:
        st = self.stats
        scale = self.scale
        now = self.now
        self.used_blocks -= r.kv_blocks
        r.kv_blocks = 0
        g = r.generated
        decode = now - r.first_token_at
        st.h_e2e.observe((now - r.arrival) * scale)
        st.h_queue.observe((r.first_scheduled - r.arrival) * scale)
        st.h_prefill.observe((r.first_token_at - r.first_scheduled) * scale)
        st.h_decode.observe(decode * scale)
        st.h_inference.observe((now - r.first_scheduled) * scale)
        st.h_tpot.observe(decode * scale / (g - 1) if g > 1 else 0.0)
        st.h_prompt.observe(r.prompt)
        st.h_generation.observe(g)
        st.h_max_generation.observe(g)
        st.h_params_n.observe(1)
        st.h_params_max_tokens.observe(r.max_tokens)
        st.h_kv_computed.observe(r.prompt - r.cached)
        st.h_preemptions.observe(r.preemptions)
        st.request_success[r.finish_reason] += 1
        st.http_2xx += 1
        if self.records is not None:
            self.records.append((now, (now - r.arrival) * scale,
                                 (r.first_token_at - r.arrival) * scale))

    def _finish_many(self, reqs: list[_Request]) -> None:
        """`_finish` for the requests one step completed, with array observations."""
        if len(reqs) <= _VECTOR_MIN:
            for r in reqs:
                self._finish(r)
            return
        st = self.stats
        scale = self.scale
        now = self.now
        n = len(reqs)
        cols = np.array([(r.arrival, r.first_scheduled, r.first_token_at, r.generated,
                          r.prompt, r.cached, r.preemptions, r.max_tokens, r.kv_blocks)
                         for r in reqs], dtype=float)
        arrival, sched, first, g, prompt, cached, preempt, max_tok, blocks = cols.T
        self.used_blocks -= int(blocks.sum())
        decode = now - first
        st.h_e2e.observe_many((now - arrival) * scale)
        st.h_queue.observe_many((sched - arrival) * scale)
        st.h_prefill.observe_many((first - sched) * scale)
        st.h_decode.observe_many(decode * scale)
        st.h_inference.observe_many((now - sched) * scale)
        st.h_tpot.observe_many(np.where(g > 1, decode * scale / np.maximum(g - 1, 1), 0.0))
        st.h_prompt.observe_many(prompt)
        st.h_generation.observe_many(g)
        st.h_max_generation.observe_many(g)
        st.h_params_n.observe_many(np.ones(n))
        st.h_params_max_tokens.observe_many(max_tok)
        st.h_kv_computed.observe_many(prompt - cached)
        st.h_preemptions.observe_many(preempt)
        for r in reqs:
            r.kv_blocks = 0
            st.request_success[r.finish_reason] += 1
        st.http_2xx += n
        if self.records is not None:
            e2e = (now - arrival) * scale
            ttft = (first - arrival) * scale
            self.records.extend((now, float(a), float(b)) for a, b in zip(e2e, ttft,
                                                                          strict=True))

    def refresh_gauges(self) -> None:
        """Copy the scheduler state into the gauges (done when the page is rendered)."""
        st = self.stats
        st.running = self._running()
        st.waiting = len(self.waiting)
        st.kv_cache_usage = self.used_blocks / self.total_blocks if self.total_blocks else 0.0

    # ----------------------------------------------------------------- driver

    def advance_to(self, t: float) -> None:
        """Process every event up to simulated time t (events at exactly t included)."""
        while True:
            t_pf = self.prefilling[0][0] if self.prefilling else _INF
            t_next = min(self.next_arrival, self.step_end, t_pf)
            if t_next > t:
                self.now = max(self.now, t)
                return
            self.now = t_next
            if t_next == self.step_end:
                self._finish_step()
            elif t_next == t_pf:
                self._finish_prefill()
            else:
                self._arrive()


# --------------------------------------------------------------------------- whole server


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
