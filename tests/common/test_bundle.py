"""The wheel is the whole bundle: it carries the Jsonnet sources, the generated rules
and dashboards, the example parameter files and the calibration data; `specwatch mixin render`
adapts the rules to the user's selectors; a missing optional dependency is one line.

The wheel here is built offline (no build isolation) and unpacked onto
``PYTHONPATH`` in an empty folder outside the repository, which is enough to prove what the
wheel carries and that the code finds it there. tests/test_wheel_install.py (slow) installs it
into a fresh virtualenv with its dependencies and runs the commands end to end.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers.wheelvenv import built_dist
from mixin_helpers import promtool

from specwatch import cli
from specwatch.engines import registry

ROOT = Path(__file__).resolve().parents[2]


def _setup_module():
    """setup.py as a module (its BUNDLE list is the one list of what ships)."""
    spec = importlib.util.spec_from_file_location("specwatch_setup", ROOT / "setup.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rule_exprs(path: Path) -> list[tuple[str, str]]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [(r.get("alert") or r.get("record"), r["expr"])
            for g in doc["groups"] for r in g["rules"]]


# --------------------------------------------------------------------------- mixin render


def test_mixin_render_with_both_selectors_writes_rules_promtool_accepts(tmp_path: Path,
                                                                        capsys) -> None:
    """Every selector in the rules becomes the user's when the exporter's and each engine
    family's are set (the engines' families from the registry: vLLM, SGLang, ...)."""
    out = tmp_path / "out"
    families = [f for f in registry.families() if f != "vllm"]
    others = [a for f in families for a in ("--set", f'{f}Selector=job="llm-{f}"')]
    rc = cli.main(["mixin", "render", "--out", str(out), "--set", 'vllmSelector=job="llm"',
                   "--set", 'exporterSelector=job="llm-sw"', *others])
    assert rc == 0
    printed = capsys.readouterr().out.split()
    rules = sorted((out / "alerts").glob("*.yaml"))
    assert [p.name for p in rules] == ["specwatch-alerts.yaml", "specwatch-rules.yaml"]
    # Besides the rules it prints the rule tests it wrote for them (alerts/tests/).
    assert sorted(str(p) for p in rules) == sorted(
        p for p in printed if p.endswith(".yaml") and Path(p).parent == out / "alerts")
    assert sorted(p.name for p in (out / "dashboards").glob("*.json")) == sorted(
        p.name for p in (ROOT / "dashboards").glob("*.json"))
    check = subprocess.run([promtool(), "check", "rules", *map(str, rules)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    exprs = [e for p in rules for e in _rule_exprs(p)]
    # Every rule that selects raw series does it with the user's selector (the others read
    # recorded series, which carry it already).
    selecting = [(n, e) for n, e in exprs if "{" in e]
    assert len(selecting) >= len(exprs) // 2, exprs
    users = ('job="llm"', 'job="llm-sw"', *(f'job="llm-{f}"' for f in families))
    defaults = ('job="vllm"', 'job="specwatch"', *(f'job="{f}"' for f in families))
    for name, expr in selecting:
        assert any(u in expr for u in users), f"{name}: selector not applied: {expr}"
        assert not any(d in expr for d in defaults), name
    # The dashboards carry it too.
    dashboards = "".join(p.read_text() for p in (out / "dashboards").glob("*.json"))
    assert 'job=\\"llm\\"' in dashboards and 'job=\\"vllm\\"' not in dashboards


def test_mixin_render_typed_overrides_reach_the_rules(tmp_path: Path) -> None:
    rc = cli.main(["mixin", "render", "--out", str(tmp_path),
                   "--set", "alerts.SDAcceptanceRateLow.threshold=0.35",
                   "--set", "alerts.SDAcceptanceRateLow.for=3m",
                   "--set", "alerts.SDModelInvalid.enabled=false"])
    assert rc == 0
    doc = yaml.safe_load((tmp_path / "alerts" / "specwatch-alerts.yaml").read_text())
    alerts = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    low = alerts["SDAcceptanceRateLow"]
    assert "< 0.35" in low["expr"] and low["for"] == "3m"
    assert "SDModelInvalid" not in alerts
    assert "SDModelSaturated" in alerts


def test_mixin_render_without_overrides_writes_the_committed_files(tmp_path: Path) -> None:
    """Same code path as `make generate`: only the header line differs."""
    assert cli.main(["mixin", "render", "--out", str(tmp_path)]) == 0
    for rel in ("alerts/specwatch-alerts.yaml", "alerts/specwatch-rules.yaml"):
        body = (tmp_path / rel).read_text().split("\ngroups:", 1)[1]
        assert body == (ROOT / rel).read_text().split("\ngroups:", 1)[1], rel
    for path in (ROOT / "dashboards").glob("*.json"):
        assert (tmp_path / "dashboards" / path.name).read_text() == path.read_text()


@pytest.mark.parametrize("setting, expected", [
    ("alerts.Foo.threshold=1", "alerts has no key 'Foo'"),
    ("vllmSelectr=x", "_config has no key 'vllmSelectr'"),
    ("showMultiCluster=yes", "expected true or false, got 'yes'"),
    ("alerts.SDAcceptanceRateLow.threshold=low", "expected a number, got 'low'"),
    ("alerts=1", "is a group of settings"),
    ("selector", "expected KEY=VALUE"),
    # One shorthand for both selectors sent specwatch's sd_* queries to vLLM's job.
    ('selector=job="vllm"', "there is no single selector"),
    # Values that render, but into rules promtool rejects or alerts that cannot fire.
    ("vllmSelector=job=vllm", 'quote the value: job="vllm"'),
    ("exporterSelector=", "is not a PromQL label-matcher list"),
    ('exporterSelector=job="a" namespace="b"', "is not a PromQL label-matcher list"),
    ("alerts.SDAcceptanceRateLow.for=ten minutes", "is not a Prometheus duration"),
    ("alerts.SDAcceptanceRateLow.keepFiringFor=2 min", "is not a Prometheus duration"),
    ("rateWindow=0m", "is not a Prometheus duration"),
    ("alerts.SDAcceptanceRateLow.window=1 minute", "is not an exporter window"),
    ("alerts.SDAcceptanceRateLow.threshold=1.5", "expected a number in [0, 1]"),
    ("alerts.SDModelSaturated.threshold=0", "expected a number in (0, 1]"),
    ("alerts.SDPredictedSpeedupLow.threshold=-1", "expected a number in (0, inf)"),
    ("alerts.SDAcceptanceBimodal.minSamples=2.5", "expected an integer in [1, inf)"),
    ("alerts.SDAcceptanceRateLow.severity=page", "is not one of critical, warning, info"),
    ("alerts.SDMeasuredSlowdown.statistic=p90", "is not one of mean, p50, p99"),
])
def test_mixin_render_bad_set_is_one_line_exit_2(tmp_path: Path, capsys, setting: str,
                                                  expected: str) -> None:
    rc = cli.main(["mixin", "render", "--out", str(tmp_path / "o"), "--set", setting])
    err = capsys.readouterr().err
    assert rc == 2
    assert expected in err and err.startswith("specwatch mixin: error: --set ")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- missing extras


@pytest.mark.parametrize("argv, module, extra", [
    (["calibrate", "x.csv", "--out", "p.yaml"], "scipy", "analysis"),
    (["mixin", "render", "--out", "o"], "_jsonnet", None),
])
def test_missing_optional_dependency_is_one_line_naming_the_extra(tmp_path: Path, argv, module,
                                                                  extra) -> None:
    """A fresh interpreter where the module cannot be imported (as after a plain install)."""
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from specwatch.cli import main\n"
            f"sys.exit(main({argv!r}))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    if extra:
        # This suite runs from an editable install of the clone (make setup): the hint is
        # the clone's command, not the index's, which a clone's user may not reach.
        assert f"pip install -e '.[{extra}]' (in {ROOT}, the clone it came from)" in lines[0]
    else:
        assert "pip install jsonnet" in lines[0]


def test_missing_specwatch_module_is_not_disguised_as_an_extra() -> None:
    """Only the listed optional modules get the one-line message; a bug keeps its traceback."""
    exc = ModuleNotFoundError("No module named 'specwatch.nope'", name="specwatch.nope")
    assert cli.missing_dependency_message("serve", exc) is None
    exc = ModuleNotFoundError("No module named 'matplotlib.pyplot'", name="matplotlib.pyplot")
    assert "[analysis]" in (cli.missing_dependency_message("sweep", exc) or "")


@pytest.mark.parametrize("direct_url, command", [
    (None, "pip install 'specwatch[analysis]'"),
    ({"url": "file:///src/spec%20watch", "dir_info": {}},
     "pip install '.[analysis]' (in /src/spec watch, the clone it came from)"),
    ({"url": "file:///src/specwatch", "dir_info": {"editable": True}},
     "pip install -e '.[analysis]' (in /src/specwatch, the clone it came from)"),
    ({"url": "file:///tmp/specwatch-0.1.0-py3-none-any.whl", "archive_info": {}},
     "pip install 'specwatch[analysis]'"),
])
def test_the_extra_hint_follows_how_specwatch_was_installed(direct_url, command) -> None:
    """pip's direct_url.json (PEP 610) tells a clone install from an index install."""
    assert cli.extra_install_command("analysis", direct_url) == command


# --------------------------------------------------------------------------- the wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel as `make dist` builds it: sdist first, then the wheel from the unpacked sdist
    (so MANIFEST.in is checked too, and no stale build/ folder of the checkout leaks in);
    offline, without build isolation (setuptools and wheel come from the dev extra)."""
    out = built_dist(tmp_path_factory)
    log = (out / "build.log").read_text(encoding="utf-8")
    # No deprecation notice from the build backend (the license as a TOML table gave one).
    assert "deprecated" not in log.lower(), log[-3000:]
    assert len(list(out.glob("specwatch-*.tar.gz"))) == 1
    wheels = list(out.glob("specwatch-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_carries_the_bundle_byte_for_byte(wheel: Path) -> None:
    expected = _setup_module().bundle_files(ROOT)
    # The acceptance alert's rules, the mixin entry point, an example: the list is not empty
    # of what matters.
    for rel in ("mixin.libsonnet", "config.libsonnet", "alerts/specwatch-alerts.yaml",
                "alerts/specwatch-rules.yaml", "alerts/tests/sd-acceptance-rate-low.yaml",
                "dashboards/specwatch-sd-overview.json",
                "dashboards/lib/g.libsonnet", "examples/params/qwen3-32b-h100-eagle3.yaml"):
        assert rel in expected, rel
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        bundled = {n.removeprefix("specwatch/bundle/") for n in names
                   if n.startswith("specwatch/bundle/")}
        assert bundled == set(expected)
        for rel, src in expected.items():
            assert zf.read(f"specwatch/bundle/{rel}") == src.read_bytes(), rel
        scenarios = {n for n in names if n.startswith("specwatch/sim/data/scenarios/")}
    assert "specwatch/sim/data/scenarios/demo.yaml" in scenarios


def test_unpacked_wheel_finds_its_bundle_from_an_empty_folder(wheel: Path,
                                                               tmp_path: Path) -> None:
    """No checkout in sight: the rules, the mixin sources and the examples come from the wheel."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECWATCH_")}
    env["PYTHONPATH"] = str(site)
    bundle = site / "specwatch" / "bundle"

    def py(*args: str) -> subprocess.CompletedProcess[str]:
        # PYTHONPATH comes before site-packages, so the unpacked wheel wins over any
        # editable checkout installed there; the dependencies come from site-packages.
        return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              cwd=empty, env=env, timeout=120)

    probe = py("-c", "import specwatch, specwatch.app.demo as d; print(specwatch.__file__); "
                     "print('\\n'.join(map(str, d.default_rule_files())))")
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.split()
    assert lines[0] == str(site / "specwatch" / "__init__.py")
    assert lines[1:] == [str(bundle / "alerts" / "specwatch-alerts.yaml"),
                         str(bundle / "alerts" / "specwatch-rules.yaml")]

    render = py("-m", "specwatch", "mixin", "render", "--out", "out",
                "--set", 'vllmSelector=job="llm"',
                "--set", 'exporterSelector=job="llm-sw"')
    assert render.returncode == 0, render.stderr
    text = (empty / "out" / "alerts" / "specwatch-alerts.yaml").read_text()
    assert "SDAcceptanceRateLow" in text and 'job="llm"' in text

    sweep = py("-m", "specwatch", "sweep", "--params", "qwen3-32b-h100-eagle3",
               "--prompt-tokens", "500", "--generation-tokens", "300",
               "--arrival-rates", "0.5:4:3", "--draft-lengths", "2,4", "--json")
    assert sweep.returncode == 0, sweep.stderr
    assert "Qwen3-32B" in sweep.stdout

    where = py("-m", "specwatch.common.bundle")
    assert where.returncode == 0 and where.stdout.strip() == str(bundle)


# --------------------------------------------------------------------------- the resolver


def test_params_argument_takes_a_shipped_example_by_name(tmp_path: Path, monkeypatch) -> None:
    from specwatch.common import bundle

    examples = bundle.example_params()
    assert set(examples) == {p.stem for p in (ROOT / "examples" / "params").glob("*.yaml")}
    monkeypatch.chdir(tmp_path)
    assert bundle.resolve_params("qwen3-32b-h100-eagle3") == examples["qwen3-32b-h100-eagle3"]
    # A file of that name in the working folder wins over the example.
    (tmp_path / "qwen3-32b-h100-eagle3").write_text("system: mine\n")
    assert bundle.resolve_params("qwen3-32b-h100-eagle3") == Path("qwen3-32b-h100-eagle3")
    # Anything else is left to the loader, which names it in its error.
    assert bundle.resolve_params("no-such-params") == Path("no-such-params")


def test_bundle_dir_not_found_names_where_it_looked(tmp_path: Path, monkeypatch) -> None:
    from specwatch.common import bundle
    from specwatch.common.errors import ConfigError

    monkeypatch.setenv(bundle.ENV, str(tmp_path))
    with pytest.raises(ConfigError, match=f"no mixin.libsonnet in {tmp_path}"):
        bundle.bundle_dir()
    assert bundle.example_params() == {}
    rc = cli.main(["mixin", "render", "--out", str(tmp_path / "o")])
    assert rc == 2


def test_wheel_and_sdist_carry_the_license_and_the_package_metadata(wheel: Path) -> None:
    """The Apache-2.0 text in both, an SPDX license expression, the project's URLs, and a
    description whose links and picture work away from the repository."""
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (lic,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert zf.read(lic).decode() == license_text
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = zf.read(meta_name).decode()
    headers, _, description = meta.partition("\n\n")
    assert "License-Expression: Apache-2.0" in headers.splitlines()
    urls = [h for h in headers.splitlines() if h.startswith("Project-URL: ")]
    assert {u.split(": ", 1)[1].split(",")[0] for u in urls} >= {"Homepage", "Documentation",
                                                                 "Source", "Issues"}
    targets = re.findall(r"\]\(([^)\s]+)", description)
    assert len(targets) >= 10 and "docs/img/sweep-qwen3-32b-h100-eagle3.png" in description
    relative = [t for t in targets if not t.startswith(("https://", "http://", "#"))]
    assert not relative, relative
    assert any(t.startswith("https://raw.githubusercontent.com/") and t.endswith(".png")
               for t in targets)
    import tarfile

    (sdist,) = wheel.parent.glob("specwatch-*.tar.gz")
    with tarfile.open(sdist) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("/LICENSE"))
        assert tf.extractfile(member).read().decode() == license_text  # type: ignore[union-attr]
        assert any(m.name.endswith("/alerts/tests/sd-acceptance-rate-low.yaml")
                   for m in tf.getmembers())
