"""How the application wires its plug-ins: each registers through a PluginHost (never the
application), takes the settings built from its config section and writes typed snapshot
slots; the application composes their config sections, so the tables' key order (every
"allowed:" list in an error) and what validates do not depend on what was imported first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import testsecrets

from specwatch.app import settings as app_settings
from specwatch.plugins.control import controller
from specwatch.plugins.live import plugin as live
from specwatch.plugins.pairs import plugin as pairs
from specwatch.plugins.pairs import settings as pair_settings
from specwatch.poll import config
from specwatch.poll.snapshot import ModelSnapshot, Slot, TargetSnapshot


class FakeHost:
    """A PluginHost that records what is registered."""

    def __init__(self, cfg: config.ServeConfig) -> None:
        self.cfg = cfg
        self.hooks: list[object] = []
        self.forget: list[object] = []
        self.builders: list[object] = []
        self.routes: dict[str, tuple[object, bool]] = {}
        self.lifecycle: list[tuple[object, object]] = []

    def add_target_hook(self, hook) -> None:
        self.hooks.append(hook)

    def add_forget_hook(self, hook) -> None:
        self.forget.append(hook)

    def add_family_builder(self, builder) -> None:
        self.builders.append(builder)

    def add_route(self, path: str, handler, own_auth: bool = False) -> None:
        self.routes[path] = (handler, own_auth)

    def add_lifecycle(self, start, stop) -> None:
        self.lifecycle.append((start, stop))


def test_plugins_register_through_the_host(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(testsecrets.RECEIVER_TOKEN)
    path = tmp_path / "specwatch.yaml"
    path.write_text(
        "targets:\n"
        "  - {name: a, url: http://a:8000/metrics, controller: {mode: recommend}}\n"
        "  - {name: b, url: http://b:8000/metrics}\n"
        "pairs:\n  - {name: p, sd: a, baseline: b}\n"
        f"controller:\n  alertmanager: {{token_file: {token}}}\n")
    cfg = app_settings.build_config(str(path), [], None, None)
    host = FakeHost(cfg)
    model = live.install(host, live.from_config(cfg))
    tracker = pairs.install(host, cfg.section(pair_settings.SECTION))
    ctl = controller.install(host, controller.from_config(cfg, model.params, model.windows))
    assert tracker is not None and ctl is not None
    assert host.hooks == [model.hook, tracker.observe, ctl.hook]
    assert host.builders == [model.families, tracker.families, ctl.families]
    assert host.forget == [ctl.forget_model]
    assert host.routes["/controller/alertmanager"][1] is True
    assert host.routes["/controller"][1] is False
    assert host.lifecycle == [(ctl.start, ctl.stop)]
    assert cfg.shard_keys == {"a": "p", "b": "p"}


def test_a_slot_reads_its_own_type_only() -> None:
    key: Slot[int] = Slot("test.count", int)
    model = ModelSnapshot("m", "vllm", None, ())
    target = TargetSnapshot("t", True, models={"m": model})
    assert model.slot(key) is None and target.slot(key) is None
    assert model.with_slot(key, 3).slot(key) == 3
    assert target.with_slot(key, 4).slot(key) == 4
    assert target.with_model_slot("m", key, 5).models["m"].slot(key) == 5
    assert model.with_slot(Slot("test.count", str), "x").slot(key) is None  # type: ignore[arg-type]
    assert target.models["m"].slot(key) is None  # the original is unchanged


ORDER = """
import importlib, json, sys
for name in sys.argv[2:]:
    importlib.import_module(name)
from specwatch.app import settings
from specwatch.common.errors import ConfigError
from specwatch.poll import config

def outcome(build):
    try:
        return [t.name for t in build(sys.argv[1], [], None, None).targets]
    except ConfigError as exc:
        return str(exc)

print(json.dumps({
    "composed": [list(settings.SCHEMA.top), list(settings.SCHEMA.target),
                 list(settings.SCHEMA.global_keys)],
    "poll path": [list(config.TOP_SCHEMA), list(config.TARGET_SCHEMA),
                  list(config.GLOBAL_SCHEMA)],
    "with plug-ins": outcome(settings.build_config),
    "poll path alone": outcome(config.build_config)}))
"""

#: A file using each plug-in's keys: the controller's per target, the live model's in global,
#: the pairs' at the top level.
PLUGIN_KEYS = """\
global: {model_window: 1m}
targets:
  - {name: a, url: "http://127.0.0.1:1/metrics", controller: {mode: recommend}}
  - {name: b, url: "http://127.0.0.1:2/metrics"}
pairs: [{name: p, sd: a, baseline: b}]
"""


def test_validation_does_not_depend_on_what_was_imported_first(tmp_path: Path) -> None:
    """Fresh interpreters import the plug-ins in different orders (or none, or the whole
    application) before validating the same file: the tables, their key order (every
    "allowed:" list) and the outcome are the same. Importing a plug-in changes no table: the
    poll path alone refuses the plug-ins' keys, the composed schema accepts them."""
    path = tmp_path / "specwatch.yaml"
    path.write_text(PLUGIN_KEYS)
    orders = [(),
              ("specwatch.plugins.pairs.settings", "specwatch.plugins.live.plugin",
               "specwatch.plugins.control.settings"),
              ("specwatch.plugins.control.controller", "specwatch.plugins.pairs.plugin",
               "specwatch.plugins.live.settings"),
              ("specwatch.app.serve",)]
    out = {subprocess.run([sys.executable, "-c", ORDER, str(path), *o], capture_output=True,
                          text=True, check=True, timeout=120).stdout for o in orders}
    assert len(out) == 1, out
    result = json.loads(out.pop())
    top, target, glob = result["composed"]
    assert top == ["global", "targets", "file_sd_configs", "controller", "pairs",
                   "pair_options"]
    assert target[target.index("auth") + 1:target.index("auth") + 3] == ["params",
                                                                          "model_window"]
    assert target[-1] == "controller"
    assert glob[glob.index("min_bimodality_samples") + 1] == "model_window"
    poll_top, poll_target, poll_global = result["poll path"]
    assert poll_top == ["global", "targets", "file_sd_configs"]
    assert {"params", "model_window", "controller"}.isdisjoint(poll_target)
    assert "model_window" not in poll_global
    assert result["with plug-ins"] == ["a", "b"]
    assert result["poll path alone"] == (
        f"{path}: global.model_window: unknown key (allowed: {', '.join(poll_global)})")
