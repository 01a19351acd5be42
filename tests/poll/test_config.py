"""Configuration: strict validation with one message naming file and key, exit code 2."""

from __future__ import annotations

import json

import pytest
from helpers import testsecrets

from specwatch.app import settings as app_settings
from specwatch.cli import main
from specwatch.common.errors import ConfigError
from specwatch.poll import config


def _write(tmp_path, text: str) -> str:
    p = tmp_path / "specwatch.yaml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(("body", "message"), [
    ("targets:\n  - url: http://a:8000/metrics\n    colour: blue\n",
     "targets[0].colour: unknown key"),
    ("global:\n  poll_interval: [1]\n", "global.poll_interval: expected a number or a string"),
    ("global:\n  count_window: fast\n", "global.count_window: expected a number, got a string"),
    ("targets:\n  - url: http://a:8000/\n  - url: foo\n",
     "targets[1].url: expected an http(s) URL like http://host:8000/metrics, got 'foo'"),
    ("targets:\n  - {name: a, url: 'http://x:1/metrics'}\n  - {name: a, url: 'http://y:1/'}\n",
     "targets[1].name: duplicate target name 'a'"),
    ("targets:\n  - url: http://a:8000/\n    engine: tgi\n",
     "targets[0].engine: expected one of vllm, sglang, trtllm, llamacpp, auto, got 'tgi'"),
    ("global:\n  windows: [1m, 2x]\n", "global.windows[1]: expected a duration"),
    ("targets:\n  - name: a\n", "targets[0]: missing required key 'url'"),
    ("targets:\n  - url: http://a:1/\n    auth: {type: bearer, token_env: SPECWATCH_NO_SUCH}\n",
     "targets[0].auth.token_env: environment variable 'SPECWATCH_NO_SUCH' is not set"),
    ("targets: [\n", "not valid YAML"),
])
def test_bad_config_exits_2_naming_file_and_key(tmp_path, capsys, body, message):
    """Each kind of bad config gives one line with the file name and the key path, exit 2."""
    path = _write(tmp_path, body)
    assert main(["serve", "--config", path]) == 2
    err = capsys.readouterr().err
    assert f"{path}" in err and message in err, err
    assert "Traceback" not in err


def test_duplicate_name_between_file_and_flag_is_rejected(tmp_path):
    path = _write(tmp_path, "targets:\n  - {name: a, url: 'http://x:1/metrics'}\n")
    with pytest.raises(ConfigError, match="duplicate target name 'a'"):
        app_settings.build_config(path, ["a=http://y:2/metrics"], None, None)


@pytest.mark.parametrize("name", ["t1\n", "t1\n\n", "\nt1"])
def test_a_name_with_a_newline_is_refused(tmp_path, name):
    """A target name is the whole value: a trailing newline is not a name (``$`` would match
    before it), from the file and from ``--target NAME=URL`` alike, in one line."""
    path = _write(tmp_path, f"targets:\n  - {{name: {json.dumps(name)}, url: 'http://x:1/m'}}\n")
    with pytest.raises(ConfigError, match=r"targets\[0\]\.name: expected a target name"):
        app_settings.build_config(path, [], None, None)
    with pytest.raises(ConfigError, match="expected a target name") as err:
        app_settings.build_config(None, [f"{name}=http://y:2/metrics"], None, None)
    assert "\n" not in str(err.value).replace(repr(name), "")


def test_no_target_is_an_error():
    with pytest.raises(ConfigError, match="no targets"):
        app_settings.build_config(None, [], None, None)


def test_flags_defaults_and_secrets(tmp_path, monkeypatch):
    """Defaults (port 10440, 5 s, 1m/5m/15m, 1000req), /metrics appended to a bare URL,
    bearer token read from a file into a header, basic auth from an environment variable."""
    token = tmp_path / "token"
    token.write_text(testsecrets.GENERIC_SECRET + "\n")
    monkeypatch.setenv("SW_PW", "pw")
    path = _write(tmp_path, f"""
global:
  windows: [30s, 90s]
targets:
  - name: bearer
    url: https://vllm.example:8443
    auth: {{type: bearer, token_file: {token}}}
  - url: http://b:8000/metrics
    auth: {{type: basic, username: u, password_env: SW_PW}}
""")
    cfg = app_settings.build_config(path, ["http://c:9000"], None, None)
    assert cfg.listen == "0.0.0.0:10440" and cfg.poll_interval == 5.0
    assert cfg.windows == (("30s", 30.0), ("1m30s", 90.0))
    assert cfg.count_window == 1000
    a, b, c = cfg.targets
    assert a.url == "https://vllm.example:8443/metrics"
    assert a.headers["Authorization"] == f"Bearer {testsecrets.GENERIC_SECRET}"
    assert testsecrets.GENERIC_SECRET not in repr(a)
    assert b.name == "b:8000" and b.basic_auth == ("u", "pw")
    assert c.name == "c:9000" and c.url == "http://c:9000/metrics"
    default = app_settings.build_config(None, ["x=http://x:1/"], "127.0.0.1:0", 2.5)
    assert default.windows == (("1m", 60.0), ("5m", 300.0), ("15m", 900.0))
    assert default.poll_interval == 2.5 and default.listen == "127.0.0.1:0"


def test_example_config_file_is_valid(monkeypatch):
    """examples/specwatch.yaml, the documented complete example, loads without error."""
    from pathlib import Path

    monkeypatch.setenv("VLLM_B_PASSWORD", "example")
    example = Path(__file__).resolve().parents[2] / "examples" / "specwatch.yaml"
    raw = app_settings.load_file(str(example))
    assert raw["targets"]
    for key in ("listen", "poll_interval", "windows", "count_window", "min_drafts_per_sample",
                "max_body_bytes", "timeout", "min_bimodality_samples"):
        assert key in raw["global"], f"example does not document global.{key}"


def test_durations():
    assert config.parse_duration("1h30m") == 5400
    assert config.parse_duration("500ms") == 0.5
    assert config.format_duration(5400) == "1h30m"
    with pytest.raises(config.CheckError):
        config.parse_duration("0s")


def test_config_paths_resolve_a_plugins_file_keys_only_through_its_section(tmp_path):
    """configpaths resolves the poll path's own file keys (auth, tls); a plug-in's file keys
    (the live model's params, the controller's header and token files) are resolved by the
    section that declares them, so without the sections they are left as written."""
    from specwatch.poll import configpaths

    raw = {"targets": [{"url": "http://a:1/metrics", "params": "model.yaml",
                        "auth": {"type": "bearer", "token_file": "token"},
                        "controller": {"webhook": {"url": "http://hook:1/",
                                                   "headers_from_file": {"X-K": "key"}}}}],
           "controller": {"alertmanager": {"token_file": "am-token"}}}
    cfg_file = str(tmp_path / "specwatch.yaml")
    alone = configpaths.resolve_paths(raw, cfg_file)
    (t,) = alone["targets"]
    assert t["auth"]["token_file"] == str(tmp_path / "token")
    assert t["params"] == "model.yaml"
    assert t["controller"]["webhook"]["headers_from_file"] == {"X-K": "key"}
    assert alone["controller"]["alertmanager"]["token_file"] == "am-token"
    composed = configpaths.resolve_paths(raw, cfg_file, app_settings.SECTIONS)
    (t,) = composed["targets"]
    assert t["params"] == str(tmp_path / "model.yaml")
    assert t["controller"]["webhook"]["headers_from_file"] == {"X-K": str(tmp_path / "key")}
    assert composed["controller"]["alertmanager"]["token_file"] == str(tmp_path / "am-token")
    assert raw["targets"][0]["params"] == "model.yaml"  # the input is not changed


def test_the_file_is_parsed_once_into_typed_settings(tmp_path):
    """Global keys, each target's and each plug-in's come out typed, defaults filled in."""
    from specwatch.plugins.live.settings import SECTION as LIVE
    from specwatch.plugins.live.settings import LiveTarget
    from specwatch.web.limits import ServerLimits

    path = _write(tmp_path, (
        "global:\n  max_models: 7\n  max_label_value_bytes: 64\n  model_window: 1m\n"
        "  http_server: {max_connections: 9, idle_timeout: 5s}\n"
        "targets:\n"
        "  - {name: a, url: 'http://a:1/metrics', max_num_seqs: 32, model_window: 5m,\n"
        "     controller: {mode: recommend}}\n"
        "  - {name: b, url: 'http://b:1/metrics', max_models: 3}\n"))
    cfg = app_settings.build_config(path, [], None, None)
    a, b = cfg.targets
    assert (a.max_num_seqs, a.max_models, b.max_num_seqs, b.max_models) == (32, 7, None, 3)
    assert cfg.max_label_value_bytes == 64
    assert cfg.http_server == ServerLimits(max_connections=9, idle_timeout=5.0)
    assert cfg.section(LIVE).model_window == "1m"
    assert (a.section(LIVE), b.section(LIVE)) == (LiveTarget(None, "5m"), LiveTarget())
    controller = app_settings.CONTROLLER
    assert a.section(controller).path == "targets[0].controller"
    assert a.section(controller).settings.mode == "recommend"
    assert b.section(controller) is None and cfg.section(controller) is None
