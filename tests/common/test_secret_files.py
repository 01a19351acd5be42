"""File-backed secrets (target auth token_file / password_file, the receiver's token_file,
webhook headers_from_file) go through one bounded reader: regular files (and the Kubernetes
Secret volume's symbolic links) up to 64 KiB of UTF-8; anything else is one line naming the
key and the file, exit 2, no traceback, and memory stays small even for /dev/zero."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specwatch.cli import main
from specwatch.common.secretfile import SECRET_FILE_MAX_BYTES, read_secret_file

#: (key path as the error names it, config text with {secret} for the file's path)
KEYS = [
    ("targets[0].auth.token_file",
     "targets:\n  - url: http://127.0.0.1:1/\n    auth: {{type: bearer, token_file: {secret}}}\n"),
    ("targets[0].auth.password_file",
     "targets:\n  - url: http://127.0.0.1:1/\n"
     "    auth: {{type: basic, username: u, password_file: {secret}}}\n"),
    ("controller.alertmanager.token_file",
     "targets:\n  - url: http://127.0.0.1:1/\n"
     "controller:\n  alertmanager:\n    token_file: {secret}\n"),
    ("targets[0].controller.webhook.headers_from_file.Authorization",
     "targets:\n  - url: http://127.0.0.1:1/\n    controller:\n      mode: webhook\n"
     "      webhook:\n        url: http://127.0.0.1:1/hook\n"
     "        headers_from_file: {{Authorization: {secret}}}\n"),
]


def _bad_files(tmp: Path) -> dict[str, tuple[str, str]]:
    """name -> (path, what the error says)."""
    big = tmp / "big"
    big.write_bytes(b"x" * (SECRET_FILE_MAX_BYTES + 1))
    latin = tmp / "latin1"
    latin.write_bytes("hunt\u00e9r2\n".encode("latin-1"))
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    return {
        "dev_zero": ("/dev/zero", "a character device, not a regular file"),
        "too_large": (str(big), "over the 64 KiB limit"),
        "not_utf8": (str(latin), "is not UTF-8 text"),
        "directory": (str(tmp), "a directory, not a regular file"),
        "fifo": (str(fifo), "a FIFO, not a regular file"),
    }


@pytest.mark.parametrize("bad", ["dev_zero", "too_large", "not_utf8", "directory", "fifo"])
@pytest.mark.parametrize(("key", "template"), KEYS, ids=[k for k, _ in KEYS])
def test_bad_secret_file_exits_2_with_one_line(tmp_path, capsys, key, template, bad):
    secret, says = _bad_files(tmp_path)[bad]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(template.format(secret=secret))
    assert main(["serve", "--config", str(cfg), "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if key in line]
    assert len(lines) == 1, err
    assert str(cfg) in lines[0] and repr(secret) in lines[0] and says in lines[0], err
    if bad == "not_utf8":
        assert "hunt" not in err  # nothing of the content in the error


def test_kubernetes_secret_volume_layout(tmp_path):
    """token -> ..data/token, ..data -> ..2026_01_01_00_00_00.1 (what the kubelet writes)."""
    stamp = tmp_path / "..2026_01_01_00_00_00.1"
    stamp.mkdir()
    (stamp / "token").write_text("s3cret-token\n")
    (tmp_path / "..data").symlink_to(stamp.name)
    (tmp_path / "token").symlink_to("..data/token")
    assert read_secret_file(str(tmp_path / "token"), "k") == "s3cret-token"


def test_limit_is_inclusive(tmp_path):
    exact = tmp_path / "exact"
    exact.write_bytes(b"t" * SECRET_FILE_MAX_BYTES)
    assert len(read_secret_file(str(exact), "k")) == SECRET_FILE_MAX_BYTES


def test_dev_zero_secret_peak_rss(tmp_path):
    """The exporter started with /dev/zero as its token file exits 2 at once; its peak RSS
    stays that of a process that read nothing (an address-space limit guards the machine
    from the unbounded read that this replaced)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(KEYS[0][1].format(secret="/dev/zero"))
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from specwatch.cli import main\n"
        f"code = main(['serve', '--config', {str(cfg)!r}, '--listen', '127.0.0.1:0'])\n"
        # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so it would include the
        # forking test process's own memory.
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
        "print('maxrss_kib', hwm.split()[1])\n"
        "sys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    rss_kib = int(proc.stdout.split("maxrss_kib")[1].split()[0])
    print(f"peak RSS with /dev/zero as token_file: {rss_kib / 1024:.1f} MiB")
    # The interpreter and specwatch's imports are ~70 MiB; the read adds at most 64 KiB
    # (the unbounded read took 841 MB before its MemoryError).
    assert rss_kib < 200 * 1024
