"""Bad input gets one clear message and exit 2, never a traceback.

Each case is one the issue found giving a traceback (at start-up, or on every poll or
request afterwards): infinite durations, invalid UTF-8 files, a calibration input of 1e308,
JSON nested 100,000 deep, an unwritable ``--out``, a command actuation the OS must refuse.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from specwatch.cli import main
from specwatch.plugins.control.actuation import Actuator, CommandDelivery, Decision, DeliveryError
from specwatch.plugins.control.receiver import parse_alertmanager
from specwatch.poll.discovery import FileSDError, parse_file_sd

ROOT = Path(__file__).resolve().parent.parent
BENCH = sorted((ROOT / "tests/fixtures/vllm-bench").glob("qwen3-32b-eagle3-k*.jsonl"))
TARGET = "targets: [{name: t, url: 'http://127.0.0.1:9/metrics'}]\n"


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.err + captured.out


@pytest.mark.parametrize(("text", "key"), [
    ("global: {poll_interval: .inf}\n" + TARGET, "global.poll_interval"),
    ("global: {poll_interval: .nan}\n" + TARGET, "global.poll_interval"),
    ("global: {windows: [1m, .inf]}\n" + TARGET, "global.windows[1]"),
    ("global: {timeout: .inf}\n" + TARGET, "global.timeout"),
    ("global: {timeout: 99999999999999h}\n" + TARGET, "global.timeout"),
    ("global: {http_server: {request_timeout: .inf}}\n" + TARGET,
     "global.http_server.request_timeout"),
    ("targets: [{name: t, url: 'http://127.0.0.1:9/metrics', timeout: .inf}]\n",
     "targets[0].timeout"),
    ("global: {min_drafts_per_sample: .inf}\n" + TARGET, "global.min_drafts_per_sample"),
], ids=["interval-inf", "interval-nan", "window-inf", "timeout-inf", "timeout-huge",
        "request-timeout-inf", "target-timeout-inf", "min-drafts-inf"])
def test_non_finite_durations_and_numbers_are_one_clear_error(tmp_path, capsys, text, key):
    """An infinite (or absurdly long) duration is refused at start-up
    naming its key (old code started, then every poll failed with OverflowError or every
    request was reset)."""
    cfg = tmp_path / "specwatch.yaml"
    cfg.write_text(text)
    rc, out = run_cli(["serve", "--config", str(cfg), "--listen", "127.0.0.1:0"], capsys)
    assert rc == 2, out
    assert f"{cfg}: {key}: expected a finite" in out or "expected a positive" in out, out
    assert "Traceback" not in out and out.count("\n") == 1


@pytest.mark.parametrize("value", ["inf", "nan", "1e308"])
def test_poll_interval_flag_must_be_finite(capsys, value):
    rc, out = run_cli(["serve", "--target", "http://127.0.0.1:9/metrics", "--listen",
                       "127.0.0.1:0", "--poll-interval", value], capsys)
    assert rc == 2 and out.startswith("specwatch serve: error: --poll-interval: "), out
    assert "Traceback" not in out


@pytest.mark.parametrize("flag", ["--config", "--web-config"])
def test_invalid_utf8_config_files_are_one_clear_error(tmp_path, capsys, flag):
    """A config or web config that is not UTF-8 names the file and the
    byte (old code: UnicodeDecodeError traceback)."""
    bad = tmp_path / "bad.yml"
    bad.write_bytes(b"global:\n  listen: '\xff\xfe:10440'\n")
    argv = ["serve", "--listen", "127.0.0.1:0"]
    argv += [flag, str(bad)] if flag == "--config" else \
        ["--target", "http://127.0.0.1:9/metrics", flag, str(bad)]
    rc, out = run_cli(argv, capsys)
    assert rc == 2, out
    assert f"{bad}: not UTF-8 text" in out and "Traceback" not in out


def test_calibrate_refuses_values_of_1e308(tmp_path, capsys):
    """Finite but overflowing inputs are refused by name (old code: a
    numpy 'array must not contain infs or NaNs' traceback from the fit)."""
    rows = ["arrival_rate,latency_s,draft_length"]
    rows += [f"{r},{1e307 * (1 + r / 100) * (1 + k / 10)},{k}"
             for k in (0, 2, 4) for r in (1, 2, 4, 8, 16, 32)]
    csv = tmp_path / "huge.csv"
    csv.write_text("\n".join(rows) + "\n")
    rc, out = run_cli(["calibrate", str(csv), "--out", str(tmp_path / "p.yaml")], capsys)
    assert rc == 2, out
    assert f"{csv} row 2: latency_s 1.01e+307 is out of range" in out
    assert "Traceback" not in out


def test_calibrate_refuses_json_nested_100k_deep(tmp_path, capsys):
    """A JSON file nested 100,000 deep is one error line, not a RecursionError traceback."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    rc, out = run_cli(["calibrate", str(deep), "--out", str(tmp_path / "p.yaml")], capsys)
    assert rc == 2 and f"{deep}: JSON nested too deeply" in out, out


def test_calibrate_out_under_proc_is_one_clear_error(capsys):
    """An --out path that cannot be written is one error line, not a FileNotFoundError
    traceback from the temp file."""
    rc, out = run_cli(["calibrate", *map(str, BENCH), "--out", "/proc/params.yaml"], capsys)
    assert rc == 2, out
    assert "--out /proc/params.yaml: cannot write" in out and "Traceback" not in out


def test_deep_json_to_the_receiver_and_file_sd_is_a_clear_error():
    """The same 100k-deep JSON as an Alertmanager webhook body is a ValueError (a 400), and
    as a file_sd file a FileSDError, never a RecursionError."""
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_alertmanager(deep)
    with pytest.raises(FileSDError, match="nested too deeply"):
        parse_file_sd(deep, "targets.json")


def _decision(i: int, model: str) -> Decision:
    return Decision(id=f"d{i}", target="t", model=model, action="disable",
                    reason_code="low_acceptance", reason="acceptance 0.1 < 0.4",
                    decided_at=1000.0 + i, payload={"decision_id": f"d{i}"})


@pytest.mark.parametrize("model", ["llama\0evil", "m" * 200_000], ids=["nul", "200kB"])
def test_command_actuation_the_os_must_refuse_fails_once_clearly(caplog, model):
    """A model name the OS cannot pass to a program (NUL, over 128 kB) fails
    the delivery at once as permanent (no retries), with one WARNING for the first decision
    and none for the decisions that follow (old code: a traceback every poll)."""
    outcomes = []
    act = Actuator("t", CommandDelivery(["true"], 5.0), lambda d, o: outcomes.append(o),
                   max_attempts=5, wait=lambda s: False)
    caplog.set_level(logging.DEBUG)
    for i in range(3):
        act.run_one(_decision(i, model))
    assert [(o.ok, o.attempts) for o in outcomes] == [(False, 1)] * 3
    assert "SPECWATCH_MODEL" in outcomes[0].detail
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage()[:200] for r in warnings]
    assert not any(r.exc_info for r in caplog.records)
    assert len(warnings[0].getMessage()) < 1000
    with pytest.raises(DeliveryError) as err:
        CommandDelivery(["true"], 5.0)(_decision(9, model))
    assert err.value.permanent
