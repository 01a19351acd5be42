"""What a newcomer meets at the edges: the exporter-toolkit flag spellings, paths in the config
resolved against the config file's folder, shipped example names in targets[].params, and
error messages that name the right flag and say what is wrong (no "None", no urllib3 dump).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest
from helpers.certs import make_pki

from specwatch import cli
from specwatch.app import settings as app_settings
from specwatch.cli import serve
from specwatch.common.errors import ConfigError
from specwatch.plugins.live import plugin as live
from specwatch.plugins.live import settings as live_settings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "params" / "qwen3-32b-h100-eagle3.yaml"


def _serve_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(argv)


def test_serve_takes_the_exporter_toolkit_flag_spellings() -> None:
    dotted = _serve_args(["--web.listen-address", "127.0.0.1:9", "--web.config.file", "w.yml"])
    plain = _serve_args(["--listen", "127.0.0.1:9", "--web-config", "w.yml"])
    assert (dotted.listen, dotted.web_config) == (plain.listen, plain.web_config) == (
        "127.0.0.1:9", "w.yml")


def test_serve_with_the_dotted_listen_flag_serves_there(tmp_path: Path, capsys) -> None:
    """Through the CLI: a bad address given with the dotted spelling is refused like --listen's."""
    rc = cli.main(["serve", "--target", "http://127.0.0.1:1/metrics",
                   "--web.listen-address", "nonsense"])
    assert rc == 2 and "--listen: expected HOST:PORT" in capsys.readouterr().err


def _config_in_subfolder(tmp_path: Path, params: str) -> Path:
    folder = tmp_path / "etc"
    folder.mkdir()
    shutil.copyfile(EXAMPLE, folder / "model.yaml")
    (folder / "token").write_text("s3cret\n")
    pki = make_pki(folder / "pki")
    ca = pki.ca.relative_to(folder)
    path = folder / "specwatch.yaml"
    path.write_text(
        "targets:\n"
        "  - name: a\n"
        "    url: https://127.0.0.1:1/metrics\n"
        f"    params: {params}\n"
        "    auth: {type: bearer, token_file: token}\n"
        f"    tls: {{ca_file: {ca}}}\n")
    return path


def test_config_paths_resolve_against_the_config_files_folder(tmp_path: Path,
                                                               monkeypatch) -> None:
    path = _config_in_subfolder(tmp_path, "model.yaml")
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = app_settings.build_config(str(path), [], None, None)
    (target,) = cfg.targets
    assert target.section(live_settings.SECTION).params == str(path.parent / "model.yaml")
    assert live.from_config(cfg).params["a"].system  # the model loaded from etc/
    assert target.headers["Authorization"] == "Bearer s3cret"  # the token read from etc/
    assert isinstance(target.tls_verify, str)
    assert target.tls_verify.startswith(str(path.parent))


def test_targets_params_takes_a_shipped_example_by_name(tmp_path: Path, monkeypatch) -> None:
    path = _config_in_subfolder(tmp_path, "qwen3-32b-h100-eagle3")
    monkeypatch.chdir(tmp_path)
    cfg = app_settings.build_config(str(path), [], None, None)
    params = live.from_config(cfg).params["a"]
    assert "eagle3" in params.system
    # A file of that name beside the config wins over the example.
    (path.parent / "qwen3-32b-h100-eagle3").write_text("not: [a, params, file]\n")
    with pytest.raises(ConfigError, match=r"targets\[0\]\.params"):
        live.from_config(app_settings.build_config(str(path), [], None, None))


def _pem_pair(tmp_path: Path) -> tuple[Path, Path, Path]:
    pki = make_pki(tmp_path / "pki")
    garbage = tmp_path / "garbage.key"
    garbage.write_text("not a key\n")
    return Path(pki.server.cert), Path(pki.client.key), garbage


@pytest.mark.parametrize("which, expected", [
    ("other", "the key does not match the certificate"),
    ("garbage", "key_file holds no PEM private key"),
])
def test_tls_key_errors_say_what_is_wrong(tmp_path: Path, capsys, which: str,
                                          expected: str) -> None:
    cert, other, garbage = _pem_pair(tmp_path)
    key = other if which == "other" else garbage
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    rc = cli.main(["serve", "--target", "http://127.0.0.1:1/metrics", "--listen",
                   "127.0.0.1:0", "--web.config.file", str(web)])
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and "None" not in err, err
    conf = tmp_path / "t.yml"
    conf.write_text("targets:\n  - url: http://127.0.0.1:1/metrics\n"
                    f"    tls: {{cert_file: {cert}, key_file: {key}}}\n")
    rc = cli.main(["serve", "--config", str(conf), "--listen", "127.0.0.1:0"])
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and "None" not in err, err


def test_demo_errors_name_the_demos_flags(capsys) -> None:
    rc = cli.main(["demo", "--exporter-listen", "nonsense", "--prometheus", "off"])
    err = capsys.readouterr().err
    assert rc == 2 and "--exporter-listen: expected HOST:PORT" in err, err
    assert "global.listen" not in err


def test_demo_bind_error_names_exporter_listen(capsys) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc = cli.main(["demo", "--exporter-listen", f"127.0.0.1:{port}", "--prometheus", "off"])
    err = capsys.readouterr().err
    assert rc == 2 and f"--exporter-listen 127.0.0.1:{port}: cannot bind" in err, err


def test_calibrate_unreachable_prometheus_is_one_plain_line(capsys) -> None:
    rc = cli.main(["calibrate", "--prometheus", "http://127.0.0.1:9", "--start", "now-1h",
                   "--timeout", "2"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("specwatch calibrate: error:"), err
    assert "connection refused" in err
    for noise in ("HTTPConnectionPool", "Max retries", "query_range", "NewConnectionError"):
        assert noise not in err


def test_sweep_plot_title_fits_the_figure(tmp_path: Path, monkeypatch) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    seen: list[Figure] = []
    original = Figure.savefig

    def keep(self: Figure, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append(self)

    monkeypatch.setattr(Figure, "savefig", keep)
    monkeypatch.setattr("matplotlib.pyplot.close", lambda *a, **k: None)
    rc = cli.main(["sweep", "--params", str(EXAMPLE), "--prompt-tokens", "512",
                   "--generation-tokens", "256", "--draft-lengths", "1-6",
                   "--arrival-rates", "0:20:41", "--plot", str(tmp_path / "s.png"), "--json"])
    assert rc == 0
    (fig,) = seen
    renderer = fig.canvas.get_renderer()
    box = fig.axes[0].title.get_window_extent(renderer)
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1, (box, fig.bbox)


def test_make_demo_needs_only_the_runtime_install() -> None:
    """`make demo` installs specwatch without the dev extra, Debian packages or npm (those are
    for `make test`), and runs `specwatch demo` from that install."""
    import subprocess

    dry = subprocess.run(["make", "-n", "-B", "demo"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    commands = dry.stdout
    assert "pip install -q ." in commands and "specwatch demo" in commands, commands
    for dev_only in ("system-deps", "apt", "npm", "dev]", "analysis,dev", "-e ."):
        assert dev_only not in commands, (dev_only, commands)
