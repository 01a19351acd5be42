"""One simulated vLLM engine core: continuous batching with speculative decoding.

`Engine` is a discrete-event loop over arrivals (a non-homogeneous Poisson process by
thinning), prefill completions and verify-step completions, whose handlers share the
engine's state: the waiting queue, the prefills in flight, the decode batch and the KV-cache
blocks. Costs come from `specwatch.sim.costs.StepCosts`; counters and histograms go to
`specwatch.sim.stats.EngineStats`, following vLLM's definitions (one draft per request and
step, k draft tokens, accepted tokens without the bonus token, per-position counts).

Each request draws α from its phase's distribution at arrival; a verify cycle accepts a
prefix of its k drafts (position i with probability α if positions 0..i−1 were) and commits
accepted + 1 tokens, truncated to what the request still needs. Requests join the batch
and are admitted only at step boundaries, as vLLM's scheduler runs once per step.

Everything runs in simulated seconds; `time_scale` multiplies every duration put into the
histograms (`specwatch simulate --speed X` uses 1/X). The mapping from the model's coefficients
to these mechanisms, and what the model ignores, are in docs/simulator.md ("The simulated
system").
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque

import numpy as np

from specwatch.sim.costs import StepCosts
from specwatch.sim.distributions import AcceptanceDist
from specwatch.sim.scenario import ModelSpec
from specwatch.sim.stats import EngineStats

__all__ = ["Engine"]

_INF = float("inf")
_POOL = 64  # arrivals' lengths and α are drawn in blocks of this many (per phase)
_VECTOR_MIN = 6  # below this many, observing value by value is cheaper than with arrays
_VECTOR_BATCH = 48  # from this batch size on, a step runs as numpy array operations


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
        #: Ground-truth latency records: when the simulation keeps them, each
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
