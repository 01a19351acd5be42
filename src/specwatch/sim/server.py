"""A vLLM-shaped /metrics server driven by a discrete-event simulation (`specwatch simulate`,
whose options are in :mod:`specwatch.cli.simulate`).

The physics is `specwatch.sim.engine` (continuous batching, speculative decoding, queueing),
the page is `specwatch.sim.stats` (vLLM 0.33's families, rendered by prometheus_client), the
scenario is `specwatch.sim.scenario`. This module only keeps the simulation in step with the wall
clock and serves it:

* simulated time = ``speed`` × wall time since start; a driver thread advances the
  simulation every ``tick`` seconds under a lock that /metrics also takes, so a scrape always
  sees one consistent instant;
* during a scripted whole-server restart the listening socket is closed (connection refused,
  as for a restarting vLLM) and reopened on the same port when the downtime ends; a client
  still holding a kept-alive connection gets a 503 with ``Connection: close``;
* ``/sim/status`` (not a vLLM route) tells tests and the demo where the scenario is: the
  simulated time, each model's phase, its arrival rate and its acceptance truth;
* ``/metrics?timebase=wall`` (with a simulated clock, the demo's): the same page for a reader
  on the wall clock such as Prometheus, cumulative samples divided by the speed so that a
  per-wall-second ``rate()`` reads the scenario's rates (:class:`WallTimeView`);
* ``POST /sim/restart`` (not a vLLM route) restarts the server now, optionally with another
  ``num_speculative_tokens`` (0 = SD off): what a deployer does when a controller asks to
  switch SD, so controller tests can use the simulator as the thing they act on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from specwatch import __version__
from specwatch.common.errors import ConfigError
from specwatch.sim.scenario import Restart, Scenario
from specwatch.sim.simulation import Simulation
from specwatch.sim.stats import vllm_families
from specwatch.web.negotiate import by_preference
from specwatch.web.routing import Request, Response, only_get
from specwatch.web.server import WebServer, parse_listen

log = logging.getLogger("specwatch.sim.server")

DEFAULT_LISTEN = "127.0.0.1:8000"  # vLLM's default port; loopback unless asked otherwise
DEFAULT_TICK = 0.05
#: Most simulated seconds advanced while the lock is held (a scrape waits at most that long).
STEP_SLICE_S = 1.0


def baseline_scenario(scenario: Scenario) -> Scenario:
    """The same scenario with SD off for every model (the baseline side of an A/B pair):
    same seed, traffic and phases; restarts that would set a draft length keep SD off."""
    models = [dataclasses.replace(m, num_speculative_tokens=0) for m in scenario.models]
    restarts = tuple(dataclasses.replace(r, num_speculative_tokens=0)
                     if r.num_speculative_tokens is not None else r
                     for r in scenario.restarts)
    return dataclasses.replace(scenario, models=tuple(models), restarts=restarts)


def default_baseline_listen(listen: str) -> str:
    """--listen's host with the next port (port 0 stays 0: a free one)."""
    host, port = parse_listen(listen)
    port = port + 1 if port else 0
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class SimulationCollector(Collector):
    """prometheus_client collector for a `Simulation`: vLLM's families at the current
    instant, read under `lock` (the one the driver holds while advancing)."""

    def __init__(self, sim: Simulation, lock: threading.Lock | None = None) -> None:
        self.sim = sim
        self.lock = lock or threading.Lock()

    def collect(self) -> Iterator[Any]:
        with self.lock:
            sim = self.sim
            families = list(vllm_families(sim.engine_stats(), sim.cache_config(),
                                          http_created=sim.wall_time(sim.up_since)))
        return iter(families)


class WallTimeView(Collector):
    """The page of a simulated-clock server as a reader on the wall clock must see it.

    With ``simulated_clock`` at ``speed`` X, one wall second holds X scenario seconds, so
    Prometheus' ``rate()`` (per wall second) over the scenario page reads X times the
    scenario's rates. Here every cumulative sample (counter ``_total``, histogram
    ``_bucket``/``_count``/``_sum``) is divided by X: a rate over any wall window is then the
    scenario's own per-second rate over that window's scenario span, the same figure the
    exporter measures on the simulated clock. Ratios of counters (acceptance, mean latency)
    and histogram quantiles are unchanged (numerator and denominator scale alike), gauges
    are instants and stay as they are, and ``_created`` times are mapped to the wall clock.
    """

    _CUMULATIVE = ("counter", "histogram", "summary")

    def __init__(self, inner: Collector, speed: float,
                 to_wall: Callable[[float], float]) -> None:
        self.inner = inner
        self.speed = speed
        self.to_wall = to_wall

    def collect(self) -> Iterator[Any]:
        for fam in self.inner.collect():
            if fam.type not in self._CUMULATIVE:
                yield fam
                continue
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                value = (self.to_wall(s.value) if s.name.endswith("_created")
                         else s.value / self.speed)
                out.samples.append(s._replace(value=value))
            yield out


def simulation_registry(sim: Simulation, lock: threading.Lock | None = None,
                        process_collectors: bool = True) -> CollectorRegistry:
    """A private registry rendering `sim` (plus the process/platform/GC collectors a vLLM
    API server has in prometheus_client's default registry)."""
    registry = CollectorRegistry(auto_describe=False)
    if process_collectors:
        for extra in (ProcessCollector, PlatformCollector, GCCollector):
            extra(registry=registry)
    registry.register(SimulationCollector(sim, lock))
    return registry


def render_page(sim: Simulation, accept: str = "text/plain",
                process_collectors: bool = True) -> tuple[bytes, str]:
    """The /metrics body and content type for an Accept header (tests use it without HTTP)."""
    encoder, content_type = choose_encoder(by_preference(accept))
    return encoder(simulation_registry(sim, process_collectors=process_collectors)), content_type


class SimulatorServer:
    """The simulation plus its HTTP endpoint, kept in step with the wall clock.

    ``clock`` is injectable so tests can drive time; ``start()`` binds and starts the driver
    thread, ``stop()`` stops both (idempotent).
    """

    def __init__(self, scenario: Scenario, listen: str = DEFAULT_LISTEN, speed: float = 1.0,
                 seed: int | None = None, tick: float = DEFAULT_TICK,
                 clock: Callable[[], float] = time.time, record_latencies: int = 0,
                 simulated_clock: bool = False, listen_option: str = "--listen") -> None:
        """``simulated_clock``: the page describes the scenario's own server in simulated
        seconds (latencies, ``_created`` and start times on :meth:`simulated_now`'s scale),
        for a reader that runs on :meth:`simulated_now` too (the demo's exporter). Without
        it (``specwatch simulate``), at ``speed`` X the page describes a server X times
        faster in wall seconds, for readers on the wall clock."""
        if not speed > 0:
            raise ConfigError(f"--speed: expected a positive number, got {speed}")
        parse_listen(listen, listen_option)  # fail early on a malformed address
        self.scenario = scenario
        self.listen = listen
        self.listen_option = listen_option
        self.speed = float(speed)
        self.tick = tick
        self.clock = clock
        self.wall0 = clock()
        self.lock = threading.Lock()
        self.simulated_clock = simulated_clock
        if simulated_clock:
            self.sim = Simulation(scenario, seed=seed, time_scale=1.0,
                                  wall_time=lambda t: self.wall0 + t,
                                  record_latencies=record_latencies)
        else:
            self.sim = Simulation(scenario, seed=seed, time_scale=1.0 / self.speed,
                                  wall_time=lambda t: self.wall0 + t / self.speed,
                                  record_latencies=record_latencies)
        self.registry = simulation_registry(self.sim, self.lock)
        # ``/metrics?timebase=wall``: the same page for a reader on the wall clock (the
        # demo's Prometheus); without a simulated clock the page is in wall time already.
        self.wall_registry = self.registry
        if simulated_clock and self.speed != 1.0:
            self.wall_registry = CollectorRegistry(auto_describe=False)
            for extra in (ProcessCollector, PlatformCollector, GCCollector):
                extra(registry=self.wall_registry)
            self.wall_registry.register(WallTimeView(
                SimulationCollector(self.sim, self.lock), self.speed, self.wall_time))
        self.routes = {
            "/metrics": only_get(self._metrics),
            "/health": only_get(self._health),
            "/v1/models": only_get(self._models),
            "/sim/status": only_get(self._status),
            "/sim/restart": self._restart,
        }
        self._web: WebServer | None = None
        self._bound: tuple[str, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lagging = False

    # ----------------------------------------------------------------- HTTP

    def _down_response(self) -> Response:
        return Response(503, b"restarting\n", headers={"Connection": "close"})

    def _metrics(self, req: Request) -> Response:
        if not self.sim.up:
            return self._down_response()
        encoder, content_type = choose_encoder(by_preference(req.headers.get("accept")))
        timebase = req.query.get("timebase", ["simulated"])[-1]
        if timebase not in ("simulated", "wall"):
            return Response(400, b"timebase: expected simulated or wall\n")
        registry = self.wall_registry if timebase == "wall" else self.registry
        return Response(200, encoder(registry), content_type)

    def _health(self, _req: Request) -> Response:
        return self._down_response() if not self.sim.up else Response(200, b"")

    def _models(self, _req: Request) -> Response:
        if not self.sim.up:
            return self._down_response()
        data = [{"id": m.model_name, "object": "model", "owned_by": "vllm",
                 "max_model_len": m.max_model_len} for m in self.sim.specs]
        body = json.dumps({"object": "list", "data": data}).encode()
        return Response(200, body, "application/json")

    def _restart(self, req: Request) -> Response:
        """POST /sim/restart {"num_speculative_tokens": k, "model_name": m, "engine": e,
        "downtime_s": wall seconds}: restart now, as a deployer applying a new SD config."""
        if req.method != "POST":
            return Response(405, b"use POST\n", headers={"Allow": "POST"})
        try:
            body = json.loads(req.body or b"{}")
            restart = _restart_request(body, [m.model_name for m in self.sim.specs],
                                       {m.model_name: m.engines for m in self.sim.specs},
                                       self.speed)
        except (ValueError, ConfigError) as exc:
            return Response(400, f"{exc}\n".encode())
        with self.lock:
            self.sim.request_restart(restart)
            at = self.sim.now
        log.info("restart requested over HTTP: %s", restart)
        answer = {"restart_at_sim_s": at, "back_at_sim_s": at + restart.downtime_s}
        return Response(200, json.dumps(answer).encode(), "application/json")

    def _status(self, _req: Request) -> Response:
        body = json.dumps(self.status(), indent=1).encode()
        return Response(200, body, "application/json")

    def status(self) -> dict[str, Any]:
        """Where the scenario is now, and what the page should converge to (the truth)."""
        with self.lock:
            t = self.sim.now
            up = self.sim.up
        models = []
        for m in self.sim.specs:
            idx, into = m.phase_at(t, self.scenario.loop)
            ph = m.phases[idx]
            truth = ph.acceptance.truth(m.num_speculative_tokens, ph.generation_tokens)
            frac = min(into / ph.duration_s, 1.0)
            models.append({
                "model_name": m.model_name,
                "phase": ph.name,
                "phase_index": idx,
                "phase_elapsed_s": into,
                "arrival_rate": ph.arrival_rate.at(frac) * self._rate_scale,
                "num_speculative_tokens": m.num_speculative_tokens,
                "engines": m.engines,
                "truth": truth,
            })
        return {"version": __version__, "sim_time_s": t, "speed": self.speed, "up": up,
                "restarts_done": self.sim.restarts_done, "models": models}

    @property
    def address(self) -> tuple[str, int]:
        assert self._bound is not None, "start() first"
        return self._bound

    @property
    def url(self) -> str:
        host, port = self.address
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    def _open(self) -> None:
        listen = self.listen
        if self._bound is not None:  # reopen on the port we had (port 0 → the one we got)
            host, _ = parse_listen(self.listen)
            listen = f"[{host}]:{self._bound[1]}" if ":" in host else f"{host}:{self._bound[1]}"
        web = WebServer(listen, self.routes, listen_option=self.listen_option)
        web.start()
        self._web = web
        self._bound = web.address

    def _close(self) -> None:
        if self._web is not None:
            self._web.stop()
            self._web = None

    # ----------------------------------------------------------------- driver

    def sim_time_now(self) -> float:
        return (self.clock() - self.wall0) * self.speed

    def wall_time(self, simulated: float) -> float:
        """The wall-clock Unix time of a :meth:`simulated_now` time."""
        return self.wall0 + (simulated - self.wall0) / self.speed

    def simulated_now(self) -> float:
        """Unix time on the simulated clock: the start time plus the simulated seconds since.

        At ``speed`` X it runs X times faster than the wall clock. With ``simulated_clock``
        it is the time base of the page, so an exporter stamping its polls with it measures
        the scenario's own rates and windows at any speed."""
        return self.wall0 + self.sim_time_now()

    @property
    def _rate_scale(self) -> float:
        """Rates on the page per second of its time base (wall: X times the scenario's)."""
        return 1.0 if self.simulated_clock else self.speed

    def step(self) -> None:
        """Advance the simulation to the wall clock's simulated time, open/close the port.

        The simulation advances in slices of at most :data:`STEP_SLICE_S` simulated seconds
        with the lock released between them, and stops advancing once :meth:`stop` was
        called: at a speed the machine cannot keep up with, /metrics still answers and a
        SIGTERM still stops the server; simulated time lags (logged once)."""
        target = self.sim_time_now()
        started = time.monotonic()
        with self.lock:
            now = self.sim.now
            up = self.sim.up
        while now < target and not self._stop.is_set():
            now = min(target, now + STEP_SLICE_S)
            with self.lock:
                self.sim.advance_to(now)
                up = self.sim.up
        spent = time.monotonic() - started
        if spent > 4 * max(self.tick, 0.05) and not self._lagging:
            self._lagging = True
            log.warning("the simulation needs %.2fs of CPU per %.2fs tick: --speed %g is "
                        "more than this machine keeps up with; simulated time will lag",
                        spent, self.tick, self.speed)
        if up and self._web is None:
            self._open()
            log.info("simulated vLLM back up on %s/metrics", self.url)
        elif not up and self._web is not None:
            self._close()
            log.info("simulated vLLM restarting: connections refused until it is back")

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            try:
                self.step()
            except Exception:  # never let one bad tick kill the server silently
                log.exception("simulation step failed")
                self._stop.set()

    def start(self) -> None:
        self._open()
        self._thread = threading.Thread(target=self._run, name="specwatch-sim", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._close()


def _restart_request(body: Any, models: list[str], engines: dict[str, int],
                     speed: float) -> Restart:
    """Validate a /sim/restart body (downtime in wall seconds → simulated seconds)."""
    if not isinstance(body, dict):
        raise ValueError("expected a JSON object")
    unknown = set(body) - {"num_speculative_tokens", "model_name", "engine", "downtime_s"}
    if unknown:
        raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
    k = body.get("num_speculative_tokens")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= 32):
        raise ValueError(f"num_speculative_tokens: expected an integer in [0, 32], got {k!r}")
    model = body.get("model_name")
    if model is not None and model not in models:
        raise ValueError(f"model_name: no model {model!r} (models: {', '.join(models)})")
    engine = body.get("engine")
    if engine is not None:
        if model is None or isinstance(engine, bool) or not isinstance(engine, int) \
                or not 0 <= engine < engines[model]:
            raise ValueError("engine: needs model_name and an index below its engine count")
        if k is not None:
            raise ValueError("num_speculative_tokens applies to a whole model, not one engine")
    downtime = body.get("downtime_s", 0.0)
    if isinstance(downtime, bool) or not isinstance(downtime, (int, float)) \
            or not 0 <= downtime <= 3600:
        raise ValueError(f"downtime_s: expected seconds in [0, 3600], got {downtime!r}")
    if downtime and model is not None:
        raise ValueError("downtime_s: only a whole-server restart closes the port")
    return Restart(0.0, float(downtime) * speed, model, engine, k)
