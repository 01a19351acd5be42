"""The demo (`specwatch demo`): a simulated vLLM, the exporter on it, and Prometheus with the
rules, for a laptop without a GPU (the README Quickstart's ``make demo``).

:class:`Demo` starts the simulator (`specwatch.sim.server`, the packaged ``demo`` scenario)
and its SD-off A/B baseline, the exporter (``ServeApp``, in this process, on the simulated
clock) and, when a ``prometheus`` binary is found, a Prometheus with a temporary data
directory scraping both and loading the generated rules; ``stop()`` ends all three and
removes the temporary directory (Prometheus also gets a parent-death signal).

Invariant: at any ``--speed X`` every panel tells the scenario's story in its own units: the
exporter runs on the simulated clock and serves its timestamps mapped back to wall time;
Prometheus scrapes the simulator's wall-time view and loads the rules with every wall-clock
duration divided by X (:mod:`specwatch.app.demo_time`). The whole story: docs/simulator.md,
"specwatch demo". Options and the run loop: :mod:`specwatch.cli.demo`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from specwatch.app.demo_time import scaled_alert_durations, scaled_rules, wall_timestamps
from specwatch.common import boundedfile
from specwatch.common.bundle import ALERTS_DIR, bundle_dir
from specwatch.common.errors import ConfigError, SpecwatchError
from specwatch.engines import registry
from specwatch.sim.scenario import Scenario, load_scenario
from specwatch.web.server import parse_listen

log = logging.getLogger("specwatch.app.demo")

DEFAULT_EXPORTER_LISTEN = "127.0.0.1:10440"
PROMETHEUS_READY_TIMEOUT = 30.0
#: Shortest wall time between the exporter's polls at high --speed (CPU of a laptop).
MIN_WALL_POLL_INTERVAL = 0.25
#: Default --speed: the packaged demo's story (75 scenario minutes) in under 4 wall minutes.
DEFAULT_SPEED = 20.0


@dataclass(frozen=True)
class DemoOptions:
    """What the demo runs: the scenario, its speed, the three parts' addresses and rules
    (``rules`` None: the bundle's generated alerts/*.yaml; ``pair``: also the SD-off
    baseline)."""

    scenario: str = "demo"
    speed: float = DEFAULT_SPEED
    seed: int | None = None
    simulator_listen: str = "127.0.0.1:0"
    exporter_listen: str = DEFAULT_EXPORTER_LISTEN
    poll_interval: float = 5.0
    prometheus: str = "auto"  # auto (on PATH), off, or a path
    prometheus_port: int = 0  # 0: a free one
    rules: list[str] | None = None
    pair: bool = False


# --------------------------------------------------------------------------- helpers


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def default_rule_files() -> list[Path]:
    """The mixin's generated rule files (``alerts/*.yaml``, without the promtool unit-test
    files) from the bundle: the copy packaged in the wheel, or this checkout's. Empty when
    neither exists (the banner says so)."""
    try:
        folder = bundle_dir() / ALERTS_DIR
    except ConfigError:
        return []
    if not folder.is_dir():
        return []
    files = []
    for path in sorted(folder.glob("*.y*ml")):
        if path.stem.endswith(("_test", "-test", ".test")) or path.name.startswith("test"):
            continue
        try:
            doc = boundedfile.read_yaml(path, boundedfile.RULE_FILE)
        except ConfigError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("groups"), list):
            files.append(path)
    return files


def scaled_params_file(scenario: Scenario, index: int, speed: float, folder: Path) -> Path | None:
    """The model's parameters file as the exporter must see it at --speed (coefficients
    divided by the speed: the page describes a server that many times faster)."""
    spec = scenario.models[index]
    if spec.params is None:
        return None
    if speed == 1.0:
        return Path(spec.params)
    from specwatch.model import Coefficients, ExpertCoefficients
    from specwatch.model.params import dump_params, load_params

    params = load_params(spec.params)

    def scale(c: Any) -> Any:
        cls = type(c)
        names = [f for f in ("a_p", "b_p", "a_v", "b_v", "a_d", "b_d", "b_v_context",
                             "c_v", "c_d") if hasattr(c, f)]
        # Knees (tokens per step) and capacities (requests, tokens) are not durations.
        kept = [f for f in ("knee_v", "knee_d", "max_num_seqs", "kv_cache_tokens",
                            "kv_cache_tokens_sd")
                if hasattr(c, f)]
        return cls(**{n: getattr(c, n) / speed for n in names},
                   **{n: getattr(c, n) for n in kept})

    coefficients: Coefficients = scale(params.coefficients)
    moe = params.moe
    if moe is not None:
        expert: ExpertCoefficients = scale(moe.expert_coefficients)
        moe = replace(moe, expert_coefficients=expert)
    system = f"{params.system} (at --speed {speed:g})"
    out = folder / f"params-{index}.yaml"
    dump_params(replace(params, coefficients=coefficients, moe=moe, system=system), out)
    return out


def _fixed_port(listen: str, option: str) -> str:
    """``HOST:PORT`` with port 0 replaced by a free port now, so that Prometheus can be told
    the address before the server binds it (``option``: the flag an error names)."""
    host, port = parse_listen(listen, option)
    if port == 0:
        port = free_port("127.0.0.1" if host == "0.0.0.0" else host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _scrape_address(listen: str) -> str:
    """Where Prometheus reaches a server listening on ``listen`` (all interfaces: loopback)."""
    host, port = parse_listen(listen)
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


try:  # resolved in the parent: the child after fork() should do as little as possible
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):  # pragma: no cover - exotic libc
    _PRCTL = None
_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal() -> None:  # pragma: no cover - runs in the child
    """Linux: have the kernel SIGTERM Prometheus if the demo dies without cleaning up."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SpecwatchError(f"prometheus exited with status {proc.returncode} "
                                 "before it was ready (see its log above)")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1.0) as resp:
            if resp.status == 200:
                return
        time.sleep(0.2)
    raise SpecwatchError(f"prometheus was not ready at {url} after {timeout:g}s")


def prometheus_ui_prefix(url: str) -> str:
    """The path prefix of the Prometheus web UI at ``url``: ``/classic`` where only the
    classic UI is served (Debian's 2.x packages, built without the React UI: ``/alerts`` is a
    404 and ``/graph`` redirects without its query), else ``""`` (upstream 2.x and 3.x)."""
    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(f"{url}{path}", timeout=2.0) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0
    return "/classic" if status("/alerts") == 404 and status("/classic/alerts") == 200 else ""


# --------------------------------------------------------------------------- the demo


class Demo:
    """The three parts and their lifecycle; `start()` then `stop()` (idempotent)."""

    def __init__(self, options: DemoOptions) -> None:
        self.options = options
        self.scenario = load_scenario(options.scenario)
        self.tmp = Path(tempfile.mkdtemp(prefix="specwatch-demo-"))
        self.simulator: Any = None
        self.baseline: Any = None
        self.exporter: Any = None
        self.prometheus: subprocess.Popen[bytes] | None = None
        self.prometheus_url: str | None = None
        self.rule_files: list[Path] = []
        self.prometheus_note = ""
        self.sim_listen = options.simulator_listen
        self.exp_listen = options.exporter_listen

    # ----------------------------------------------------------------- parts

    def start_simulator(self) -> None:
        from specwatch.sim.server import SimulatorServer

        self.simulator = SimulatorServer(self.scenario, self.sim_listen,
                                         self.options.speed, self.options.seed,
                                         simulated_clock=True,
                                         listen_option="--simulator-listen")
        if getattr(self.options, "pair", False):
            # The A/B baseline: the same scenario and traffic with SD off, on the
            # same clock, so the exporter measures the speedup beside the predicted one.
            from specwatch.sim.server import baseline_scenario

            self.baseline = SimulatorServer(baseline_scenario(self.scenario), "127.0.0.1:0",
                                            self.options.speed, self.options.seed,
                                            simulated_clock=True)
            self.baseline.wall0 = self.simulator.wall0
        self.simulator.start()
        if self.baseline is not None:
            self.baseline.start()

    def exporter_poll_interval(self) -> float:
        """Wall seconds between polls: ``--poll-interval`` simulated seconds, but no less
        than :data:`MIN_WALL_POLL_INTERVAL` (then the polls are further apart in simulated
        time; the windows stay right, they are measured on the simulated clock)."""
        return max(self.options.poll_interval / self.options.speed, MIN_WALL_POLL_INTERVAL)

    def start_exporter(self) -> None:
        from specwatch.app import settings
        from specwatch.app.serve import ServeApp
        from specwatch.web.server import parse_listen

        parse_listen(self.options.exporter_listen, "--exporter-listen")
        target: dict[str, Any] = {"name": "vllm-sim", "url": f"{self.simulator.url}/metrics",
                                  "engine": "vllm"}
        # The exporter runs on the simulated clock and the page is in simulated seconds,
        # so the scenario's own parameters apply at any --speed (no scaling).
        params = scaled_params_file(self.scenario, 0, 1.0, self.tmp)
        if params is not None:
            target["params"] = str(params)
        # The controller in recommend mode (it decides and shows its state, switches
        # nothing), with its default timers (300 s stabilization, 600 s between switches),
        # which run on the exporter's (simulated) clock.
        target["controller"] = {"mode": "recommend"}
        doc: dict[str, Any] = {"global": {"listen": self.exp_listen,
                                          "poll_interval": self.exporter_poll_interval()},
                               "targets": [target]}
        if self.baseline is not None:
            doc["targets"].append({"name": "vllm-sim-baseline",
                                   "url": f"{self.baseline.url}/metrics", "engine": "vllm"})
            doc["pairs"] = [{"name": "demo-ab", "sd": "vllm-sim", "baseline":
                             "vllm-sim-baseline"}]
            # Bins along the demo's load (0.5 to 11.2 req/s: the page is in simulated time);
            # the peak's 11.2 req/s well inside the last bounded bin, so that the noise of a
            # 1m window (up to 13 req/s) does not move the current bin back and forth.
            doc["pair_options"] = {"arrival_rate_bins": [0, 1, 2, 4, 6, 8, 10, 16]}
        path = self.tmp / "specwatch.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        cfg = settings.build_config(str(path), [], None, None)
        self.exporter = ServeApp(cfg, clock=self.simulator.simulated_now,
                                 listen_option="--exporter-listen")
        if self.options.speed != 1.0:
            self.exporter.web.routes["/metrics"] = wall_timestamps(
                self.exporter.web.routes["/metrics"], self.simulator.wall_time)
        self.exporter.start()

    def exporter_url(self) -> str:
        host, port = self.exporter.web.address
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{host}:{port}"

    def prometheus_binary(self) -> str | None:
        choice = self.options.prometheus
        if choice == "off":
            self.prometheus_note = "Prometheus: off (--prometheus off)"
            return None
        if choice == "auto":
            found = shutil.which("prometheus")
            if found is None:
                self.prometheus_note = ("Prometheus: not on the PATH, skipped (install "
                                        "Debian's `prometheus` package: `make setup`)")
            return found
        if not (os.path.isfile(choice) and os.access(choice, os.X_OK)):
            raise ConfigError(f"--prometheus {choice}: not an executable file")
        return choice

    def start_prometheus(self) -> None:
        binary = self.prometheus_binary()
        if binary is None:
            return
        if self.options.rules:
            rules = [Path(r) for r in self.options.rules]
        elif self.options.speed != 1.0:
            rules = self.scaled_rule_files()
        else:
            rules = default_rule_files()
        for r in rules:
            if not r.is_file():
                raise ConfigError(f"--rules {r}: no such file")
        self.rule_files = rules
        port = self.options.prometheus_port or free_port()
        interval = max(1, min(15, round(self.exporter_poll_interval())))
        sim_host, exp_host = _scrape_address(self.sim_listen), _scrape_address(self.exp_listen)
        prefix = registry.get("vllm").prefix  # the simulator writes vLLM's page
        underscored = prefix.replace(":", "_")
        prom_cfg = {
            "global": {"scrape_interval": f"{interval}s", "evaluation_interval": f"{interval}s"},
            "rule_files": [str(r) for r in rules],
            "scrape_configs": [
                {"job_name": "specwatch", "static_configs": [{"targets": [exp_host]}]},
                {"job_name": "vllm", "static_configs": [{"targets": [sim_host]}],
                 # The simulator's page on the wall clock: rate() reads scenario rates.
                 "params": {"timebase": ["wall"]},
                 # prometheus_client >= 0.22 answers Prometheus 2.x's OpenMetrics request
                 # with vllm_* sample names (client_python#1177); vLLM pages do too.
                 # Restore the documented vllm:* names (a no-op where they are intact).
                 "metric_relabel_configs": [
                     {"source_labels": ["__name__"], "regex": f"{underscored}(.*)",
                      "target_label": "__name__", "replacement": f"{prefix}$1"}]},
            ],
        }
        cfg_path = self.tmp / "prometheus.yml"
        cfg_path.write_text(yaml.safe_dump(prom_cfg, sort_keys=False), encoding="utf-8")
        log_path = self.tmp / "prometheus.log"
        cmd = [binary, f"--config.file={cfg_path}",
               f"--storage.tsdb.path={self.tmp / 'prometheus-data'}",
               f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d",
               "--log.level=warn"]
        with open(log_path, "wb") as logf:
            self.prometheus = subprocess.Popen(
                cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_set_parent_death_signal)
        self.prometheus_url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(f"{self.prometheus_url}/-/ready", self.prometheus,
                        PROMETHEUS_READY_TIMEOUT)
        except SpecwatchError:
            sys.stderr.write(log_path.read_text(errors="replace")[-4000:])
            raise

    def scaled_rule_files(self) -> list[Path]:
        """The mixin's rules rendered with every alert's ``for`` and ``keep_firing_for``
        divided by ``--speed`` (Prometheus waits on the wall clock), from the bundle's
        mixin sources; the generated files, unscaled, when rendering fails."""
        try:
            from specwatch.mixin.render import default_config, dump_rules, render_rules

            overrides = scaled_alert_durations(default_config(), self.options.speed)
            text = dump_rules(scaled_rules(render_rules(overrides), self.options.speed))
        except Exception as exc:  # no checkout, no jsonnet: keep the demo running
            log.warning("rules not rendered for --speed %g (%s): alert `for` durations and "
                        "rule windows are not scaled", self.options.speed, exc)
            return default_rule_files()
        path = self.tmp / "rules.yaml"
        path.write_text(text, encoding="utf-8")
        return [path]

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Prometheus first (on the addresses the others will take), then the simulator and
        the exporter: the scenario's clock starts with the simulator, so Prometheus, which can
        take seconds to start on a busy machine, misses none of the story."""
        self.sim_listen = _fixed_port(self.options.simulator_listen, "--simulator-listen")
        self.exp_listen = _fixed_port(self.options.exporter_listen, "--exporter-listen")
        self.start_prometheus()
        self.start_simulator()
        self.start_exporter()

    def stop(self) -> None:
        if self.prometheus is not None:
            proc, self.prometheus = self.prometheus, None
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        if self.exporter is not None:
            exporter, self.exporter = self.exporter, None
            exporter.stop()
        if self.simulator is not None:
            simulator, self.simulator = self.simulator, None
            simulator.stop()
        if self.baseline is not None:
            baseline, self.baseline = self.baseline, None
            baseline.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ----------------------------------------------------------------- text

    def banner(self) -> str:
        sc = self.scenario
        speed = self.options.speed
        lines = ["", "specwatch demo is running. Ctrl-C stops everything.", ""]
        lines.append(f"  simulated vLLM  {self.simulator.url}/metrics")
        if self.baseline is not None:
            lines.append(f"  baseline (no SD) {self.baseline.url}/metrics  (A/B pair demo-ab)")
        lines.append(f"  exporter        {self.exporter_url()}/metrics")
        if self.prometheus_url:
            rules = (f"{len(self.rule_files)} rule file(s)" if self.rule_files
                     else "no rule files found: in a checkout run `make generate`")
            lines.append(f"  Prometheus      {self.prometheus_url}/   ({rules})")
        else:
            lines.append(f"  {self.prometheus_note}")
        lines += ["", "What to look at:"]
        exp = self.exporter_url()
        lines.append(f"  {exp}/metrics: sd_acceptance_alpha, sd_acceptance_rate, "
                     "sd_acceptance_length, "
                     "sd_arrival_rate, sd_acceptance_bimodality_coefficient, and (with the "
                     "model) sd_predicted_speedup and sd_breakeven_arrival_rate")
        if self.prometheus_url:
            p = self.prometheus_url + prometheus_ui_prefix(self.prometheus_url)
            lines.append(f"  {p}/graph?g0.expr=sd_acceptance_alpha%7Bwindow%3D%221m%22%7D"
                         "  (the α the 0.4 alert and the controller compare; vLLM's "
                         "sd_acceptance_rate falls with k)")
            lines.append(f"  {p}/graph?g0.expr=sd_predicted_speedup  (falls below 1 past "
                         "break-even)")
            lines.append(f"  {p}/alerts  (each alert of the story goes pending, fires "
                         "and resolves: SDPredictedSpeedupLow, SDArrivalRateAboveBreakeven "
                         "and SDMeasuredSlowdown in the peak, SDAcceptanceRateLow in the "
                         "acceptance drop)")
            if self.baseline is not None:
                lines.append(f"  {p}/graph?g0.expr=sd_measured_speedup%7Bstatistic%3D%22mean"
                             "%22%7D  (measured, per arrival-rate bin, beside the predicted)")
        wall = sc.duration_s / speed
        other = ("--speed 1 runs it in real time." if speed != 1.0 else
                 f"--speed {DEFAULT_SPEED:g} runs it in "
                 f"{_minutes(sc.duration_s / DEFAULT_SPEED)}.")
        lines += ["", f"Scenario {sc.source} at {speed:g}x real time: the whole story takes "
                  f"{_minutes(wall)} of wall time ({_minutes(sc.duration_s)} in scenario "
                  f"time{', then loops' if sc.loop else ''}). {other}",
                  "  (wall time  scenario time  model: phase)"]
        for m in sc.models:
            start = 0.0
            for ph in m.phases:
                at = f"{_clock(start / speed)}  {_clock(start):>8}"
                rate = ph.arrival_rate
                rate_txt = (f"{rate.start:g} req/s" if rate.start == rate.end
                            else f"{rate.start:g} → {rate.end:g} req/s")
                truth = ph.acceptance.truth(m.num_speculative_tokens, ph.generation_tokens)
                acc = truth.get("acceptance_rate")
                first = (truth.get("position_acceptance_rate") or [None])[0]
                acc_txt = (f", α ≈ {first:.2f}" if first is not None else "") + (
                    f", acceptance rate ≈ {acc:.2f}" if acc is not None else "")
                lines.append(f"  {at}  {m.model_name}: {ph.name} ({rate_txt}{acc_txt})")
                start += ph.duration_s
        if sc.description:
            lines += ["", f"  {sc.description}"]
        lines += ["", f"Working files (removed on exit): {self.tmp}"]
        return "\n".join(lines) + "\n"

    def phases_now(self) -> list[tuple[str, str]]:
        t = self.simulator.sim_time_now()
        out = []
        for m in self.scenario.models:
            idx, _ = m.phase_at(t, self.scenario.loop)
            out.append((m.model_name, m.phases[idx].name))
        return out


def _clock(seconds: float) -> str:
    """``M:SS`` (or ``H:MM:SS`` from an hour)."""
    whole = round(seconds)
    h, rest = divmod(whole, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} minutes" if seconds < 7200 else f"{seconds / 3600:.1f} hours"
