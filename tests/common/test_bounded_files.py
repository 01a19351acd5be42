"""Every file specwatch reads goes through one bounded reader (specwatch.common.boundedfile):
regular files only (a FIFO without a writer is refused at once, a device is never read), a
size limit per kind, YAML and JSON nesting bounded, YAML aliases refused, duplicate keys
refused in YAML and JSON alike. Each failure is one line naming the file, exit 2, no
traceback, in bounded time and memory.

The cases that hung or ran out of memory before run in a subprocess with a deadline and a
memory cap, so that a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.certs import make_pki

from specwatch.cli import main
from specwatch.common import boundedfile
from specwatch.common.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ROOT / "examples/params/qwen3-32b-h100-eagle3.yaml"
BENCH_NOSD = ROOT / "tests/fixtures/vllm-bench/qwen3-32b-nosd.jsonl"
PREDICT = ["predict", "--arrival-rate", "1", "--draft-length", "2", "--prompt-tokens", "144",
           "--generation-tokens", "200"]
#: Memory cap of a subprocess case (address space): the interpreter, numpy and the CLI take
#: about 0.5 GiB of it; the old code's MemoryError at /dev/zero needed several GiB.
MEMORY_CAP = 2 << 30


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.err + captured.out


def run_subprocess(argv: list[str], timeout: float = 30.0) -> tuple[int, str]:
    """The CLI in a fresh interpreter with a deadline and an address-space cap."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    proc = subprocess.run([sys.executable, "-m", "specwatch", *argv], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=cap, check=False)
    return proc.returncode, proc.stderr + proc.stdout


def one_line(rc: int, out: str) -> str:
    assert rc == 2, out
    assert "Traceback" not in out and out.count("\n") == 1, out
    return out


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    """A FIFO nobody writes to: opening it for reading blocks unless O_NONBLOCK."""
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    return path


def test_predict_params_dev_zero_is_refused_without_reading(capsys):
    """/dev/zero as --params was read until MemoryError (1.3 GB and a traceback)."""
    rc, out = run_subprocess([*PREDICT, "--params", "/dev/zero"])
    assert "/dev/zero: is a character device, not a regular file" in one_line(rc, out)


def test_predict_params_fifo_is_refused_at_once(fifo):
    """A FIFO with no writer hung predict forever."""
    rc, out = run_subprocess([*PREDICT, "--params", str(fifo)], timeout=20)
    assert f"{fifo}: is a FIFO, not a regular file" in one_line(rc, out)


def test_serve_target_params_fifo_is_refused_at_once(fifo, tmp_path):
    """targets[].params naming a FIFO hung serve at start-up."""
    cfg = tmp_path / "specwatch.yaml"
    cfg.write_text(f"targets: [{{name: t, url: 'http://127.0.0.1:9/metrics', "
                   f"params: {fifo}}}]\n")
    rc, out = run_subprocess(["serve", "--config", str(cfg), "--listen", "127.0.0.1:0"],
                             timeout=20)
    assert f"targets[0].params: {fifo}: is a FIFO" in one_line(rc, out)


def test_params_nested_100k_deep_is_one_line(tmp_path, capsys):
    """100,000 `[` was a RecursionError traceback."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 100_000)
    rc, out = run_cli([*PREDICT, "--params", str(deep)], capsys)
    assert f"{deep}:1: nested too deeply (more than {boundedfile.MAX_DEPTH} levels)" \
        in one_line(rc, out)


def test_params_of_2_mb_with_a_million_draft_lengths_is_refused_by_size(tmp_path):
    """A 2 MB file with 10^6 draft lengths gave no answer after 20 s: it is over the
    parameters file's size limit, and refused before it is parsed."""
    text = PARAMS.read_text().replace(
        "  draft_lengths:\n  - 0\n  - 1\n  - 2\n  - 3\n  - 4\n  - 5\n  - 6\n",
        "  draft_lengths: [" + ",".join(["1"] * 1_000_000) + "]\n")
    big = tmp_path / "big.yaml"
    big.write_text(text)
    assert big.stat().st_size > 2_000_000
    rc, out = run_subprocess([*PREDICT, "--params", str(big)], timeout=20)
    assert f"{big}: is {big.stat().st_size} bytes, over the 256 KiB limit for a parameters " \
           f"file" in one_line(rc, out)


def test_params_just_under_the_limit_parse_in_bounded_time(tmp_path):
    """The worst a file under the limit can hold (one-character items) still parses: the
    size limit bounds the time, and the answer is the field's error, not a hang."""
    items = (boundedfile.PARAMETERS.limit - 200) // 2
    text = "draft_lengths: [" + ",".join(["1"] * items) + "]\n"
    path = tmp_path / "wide.yaml"
    path.write_text(text)
    assert path.stat().st_size <= boundedfile.PARAMETERS.limit
    assert len(boundedfile.read_yaml(path, boundedfile.PARAMETERS)["draft_lengths"]) == items


def test_params_anchor_bomb_in_provenance_is_refused(tmp_path):
    """Nine levels of nine aliases in `provenance` (9^10 leaves once expanded) gave no
    answer after 15 s. Aliases are refused where they are composed."""
    bomb = "provenance:\n  a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 10):
        bomb += f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n"
    text = PARAMS.read_text().split("provenance:")[0] + bomb
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    line = text.splitlines().index("  a1: &a1 [" + ", ".join(["*a0"] * 9) + "]") + 1
    rc, out = run_subprocess([*PREDICT, "--params", str(path)], timeout=20)
    assert f"{path}:{line}: YAML alias *a0 is not accepted" in one_line(rc, out)


def test_calibrate_csv_field_over_128_kib_is_one_line(tmp_path, capsys):
    """A CSV field over the csv module's 128 KiB limit was a _csv.Error traceback."""
    path = tmp_path / "runs.csv"
    path.write_text("arrival_rate,latency_s,draft_length\n1,2,0\n"
                    f"1,\"{'x' * 200_000}\",1\n")
    rc, out = run_cli(["calibrate", str(path), "--out", str(tmp_path / "p.yaml")], capsys)
    assert f"{path} row 3: a field is longer than 128 KiB" in one_line(rc, out)


def test_calibrate_dev_zero_is_refused_without_reading(tmp_path):
    """/dev/zero as a calibration input was read until MemoryError."""
    rc, out = run_subprocess(["calibrate", "/dev/zero", "--out", str(tmp_path / "p.yaml")])
    assert "/dev/zero: is a character device, not a regular file" in one_line(rc, out)


def test_calibrate_fifo_is_refused_at_once(fifo, tmp_path):
    """A FIFO as a calibration input hung calibrate."""
    rc, out = run_subprocess(["calibrate", str(fifo), "--out", str(tmp_path / "p.yaml")],
                             timeout=20)
    assert f"{fifo}: is a FIFO, not a regular file" in one_line(rc, out)


def test_calibrate_bench_json_with_a_duplicate_key_is_refused(tmp_path, capsys):
    """A bench JSON giving `completed` twice was accepted (the last one won) while the
    parameters loader refuses duplicate keys; both refuse them now."""
    first = BENCH_NOSD.read_text().splitlines()[0]
    doc = json.loads(first)
    assert "completed" in doc
    path = tmp_path / "dup.json"
    path.write_text(first[:-1] + f', "completed": {doc["completed"] + 1}}}\n')
    rc, out = run_cli(["calibrate", str(path), "--out", str(tmp_path / "p.yaml")], capsys)
    assert f"{path}: duplicate key 'completed' in one JSON object" in one_line(rc, out)


def test_calibrate_over_the_size_limit_says_the_limit(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(boundedfile, "CALIBRATION_INPUT",
                        boundedfile.FileKind("calibration input", 1024))
    path = tmp_path / "runs.csv"
    path.write_text("arrival_rate,latency_s,draft_length\n" + "1,2,0\n" * 400)
    rc, out = run_cli(["calibrate", str(path), "--out", str(tmp_path / "p.yaml")], capsys)
    assert f"{path}: is {path.stat().st_size} bytes, over the 1 KiB limit for a " \
           f"calibration input" in one_line(rc, out)


@pytest.mark.parametrize("argv", [
    ["serve", "--config", "{bad}", "--listen", "127.0.0.1:0"],
    ["serve", "--target", "http://127.0.0.1:9/metrics", "--listen", "127.0.0.1:0",
     "--web-config", "{bad}"],
    ["simulate", "--scenario", "{bad}", "--listen", "127.0.0.1:0"],
], ids=["serve-config", "web-config", "scenario"])
@pytest.mark.parametrize("bad", ["fifo", "/dev/zero"])
def test_every_config_kind_refuses_fifos_and_devices(argv, bad, fifo, tmp_path):
    path = str(fifo) if bad == "fifo" else bad
    rc, out = run_subprocess([a.replace("{bad}", path) for a in argv], timeout=20)
    assert f"{path}: is a " in one_line(rc, out) and "not a regular file" in out


@pytest.mark.parametrize(("config", "key"), [
    ("targets: [{{name: t, url: 'https://127.0.0.1:9/metrics', tls: {{ca_file: {bad}}}}}]\n",
     "targets[0].tls.ca_file"),
    ("targets: [{{name: t, url: 'https://127.0.0.1:9/metrics', "
     "tls: {{cert_file: {bad}, key_file: {bad}}}}}]\n", "targets[0].tls.cert_file"),
], ids=["target-ca", "target-cert"])
def test_tls_files_openssl_reads_are_checked_first(config, key, fifo, tmp_path):
    """OpenSSL opens a TLS file itself: a FIFO as a target's ca_file hung serve at start-up.
    It is refused before OpenSSL sees it."""
    cfg = tmp_path / "specwatch.yaml"
    cfg.write_text(config.format(bad=fifo))
    rc, out = run_subprocess(["serve", "--config", str(cfg), "--listen", "127.0.0.1:0"],
                             timeout=20)
    assert f"{key}: '{fifo}' is a FIFO, not a regular file" in one_line(rc, out)


def test_web_config_client_ca_fifo_is_refused(fifo, tmp_path):
    pki = make_pki(tmp_path / "pki")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki.server.cert}\n"
                   f"  key_file: {pki.server.key}\n"
                   f"  client_auth_type: RequireAndVerifyClientCert\n"
                   f"  client_ca_file: {fifo}\n")
    rc, out = run_subprocess(["serve", "--target", "http://127.0.0.1:9/metrics", "--listen",
                              "127.0.0.1:0", "--web-config", str(web)], timeout=20)
    assert f"tls_server_config.client_ca_file: '{fifo}' is a FIFO, not a regular file" \
        in one_line(rc, out)


@pytest.mark.parametrize(("text", "error"), [
    ("a: 1\nb: {c: 2, c: 3}\n", "x.yaml:2: b.c: duplicate key"),
    ("a: &x 1\nb: *x\n", "x.yaml:2: YAML alias *x is not accepted"),
    ("a: [1\n", "x.yaml: not valid YAML at line 2"),
], ids=["duplicate", "alias", "syntax"])
def test_yaml_rules_are_the_same_for_every_kind(tmp_path, monkeypatch, text, error):
    monkeypatch.chdir(tmp_path)
    Path("x.yaml").write_text(text)
    for kind in (boundedfile.PARAMETERS, boundedfile.SERVE_CONFIG, boundedfile.WEB_CONFIG,
                 boundedfile.SCENARIO, boundedfile.FILE_SD, boundedfile.RULE_FILE):
        with pytest.raises(ConfigError) as info:
            boundedfile.read_yaml("x.yaml", kind)
        assert str(info.value).startswith(error), str(info.value)


def test_json_nesting_is_bounded_below_the_recursion_limit():
    ok = "[" * boundedfile.MAX_DEPTH + "]" * boundedfile.MAX_DEPTH
    assert boundedfile.load_json(ok, "ok.json") is not None
    deep = "[" * (boundedfile.MAX_DEPTH + 1) + "]" * (boundedfile.MAX_DEPTH + 1)
    with pytest.raises(ConfigError, match=r"deep\.json: JSON nested too deeply"):
        boundedfile.load_json(deep, "deep.json")
