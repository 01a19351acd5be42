"""Limits that count instead of failing: series per target, targets, compressed bodies; and
the log redaction filter.

Protected behaviour: the excess is dropped and counted, the page stays 200, what is still
published is exact (whole models are dropped, never single series of a model), and a
compressed body is read up to the cap on its *decompressed* size.
"""

from __future__ import annotations

import gzip
import logging
import sys
import urllib.request
import zlib

import pytest
from helpers import testsecrets
from helpers.faultserver import FaultServer, Serve
from helpers.scrape import parse_exposition, select

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.common import redact
from specwatch.poll import limits, sources


def page(models: dict[str, int], engines: int = 2) -> str:
    """A vLLM page: per model and engine, drafts n, draft tokens 3n, accepted 2n."""
    out = []
    for m, n in models.items():
        for e in range(engines):
            lab = f'engine="{e}",model_name="{m}"'
            out += [f"vllm:spec_decode_num_drafts_total{{{lab}}} {n}",
                    f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {3 * n}",
                    f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {2 * n}"]
    return "\n".join(out) + "\n"


def test_cap_series_drops_whole_models_keeping_known_ones_first():
    """Over the cap, whole models go (by name, models kept before stay first); the count of
    dropped series is exact; under the cap the page is returned unchanged."""
    p = sources.parse_page(page({"a": 10, "b": 10, "c": 10}))  # 6 series per model
    same, dropped = limits.cap_series(p, 18)
    assert same is p and dropped == 0
    capped, dropped = limits.cap_series(p, 13)
    assert capped.models == {"a", "b"} and dropped == 6
    capped, dropped = limits.cap_series(p, 13, keep_first={"c"})
    assert capped.models == {"a", "c"} and dropped == 6
    assert limits.series_count(capped) == 12


def _app(tmp_path, yaml: str) -> tuple[ServeApp, str]:
    f = tmp_path / "specwatch.yaml"
    f.write_text("global: {listen: '127.0.0.1:0', timeout: 2}\n" + yaml)
    app = ServeApp(app_settings.build_config(str(f), [], None, 60))
    app.start(poll=False)
    host, port = app.web.address
    return app, f"http://{host}:{port}/metrics"


def _scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        return parse_exposition(resp.read().decode())


def test_max_series_drops_models_and_keeps_the_rest_exact(tmp_path):
    """A target with 4 models and max_series 13 (two models' worth): the page is 200, the
    target up, two models published with exact values, the rest counted as dropped."""
    with FaultServer(Serve(page({"a": 100, "b": 100, "c": 100, "d": 100}).encode())) as s:
        app, url = _app(tmp_path, f"targets: [{{name: t, url: '{s.url}', max_series: 13}}]\n")
        try:
            app.poller.poll_now("t")
            s.set(Serve(page({"a": 200, "b": 300, "c": 400, "d": 500}).encode()))
            app.poller.poll_now("t")
            series = _scrape(url)
        finally:
            app.stop()
    assert list(select(series, "specwatch_target_up", target="t").values()) == [1.0]
    rates = {dict(k[1])["model_name"]: v for k, v in
             select(series, "sd_acceptance_rate", target="t", window="1m").items()}
    assert rates == {"a": pytest.approx(2 / 3), "b": pytest.approx(2 / 3)}
    dropped = select(series, "specwatch_target_series_dropped_total", target="t",
                     reason="max_series")
    assert list(dropped.values()) == [24.0]  # 2 polls x 2 models x 6 series


def test_max_targets_polls_the_first_n_and_counts_the_rest(tmp_path):
    """max_targets 2 with 3 targets: 2 are polled and exposed, 1 is counted as dropped."""
    f = tmp_path / "capped.yaml"
    with FaultServer(Serve(page({"m": 10}).encode())) as s:
        f.write_text("global: {listen: '127.0.0.1:0', max_targets: 2}\ntargets:\n" + "".join(
            f"  - {{name: t{i}, url: '{s.url}'}}\n" for i in range(3)))
        cfg = app_settings.build_config(str(f), [], None, 60)
        assert [t.name for t in cfg.targets] == ["t0", "t1"] and cfg.dropped_targets == ("t2",)
        app = ServeApp(cfg)
        app.start(poll=False)
        try:
            for name in ("t0", "t1"):
                app.poller.poll_now(name)
            host, port = app.web.address
            series = _scrape(f"http://{host}:{port}/metrics")
        finally:
            app.stop()
    up = {dict(k[1])["target"]: v for k, v in select(series, "specwatch_target_up").items()}
    assert up == {"t0": 1.0, "t1": 1.0}
    assert series[("specwatch_targets_dropped", frozenset())] == 1.0


@pytest.mark.parametrize(("body", "headers", "up", "reason"), [
    (gzip.compress(page({"m": 10}).encode()), {"Content-Encoding": "gzip"}, 1.0, None),
    (zlib.compress(page({"m": 10}).encode()), {"Content-Encoding": "deflate"}, 1.0, None),
    (gzip.compress(page({"m": 10}).encode())[:-12], {"Content-Encoding": "gzip"}, 0.0, "parse"),
    (b"\x1f\x8b\x08\x00garbage-not-deflate", {"Content-Encoding": "gzip"}, 0.0, "parse"),
    (page({"m": 10}).encode(), {"Content-Encoding": "br"}, 0.0, "parse"),
    (gzip.compress(page({"m": 10}).encode()), {}, 0.0, "parse"),  # gzip without the header
], ids=["gzip", "deflate", "gzip_cut_short", "gzip_corrupt", "unsupported_encoding",
        "gzip_without_header"])
def test_compressed_bodies(tmp_path, body, headers, up, reason):
    """Compressed pages are read (decompressed incrementally under the cap); a cut-short,
    corrupt, unsupported or unannounced encoding is a parse error, never a crash."""
    with FaultServer(Serve(body, headers=headers)) as s:
        app, url = _app(tmp_path, f"targets: [{{name: t, url: '{s.url}'}}]\n")
        try:
            app.poller.poll_now("t")
            series = _scrape(url)
        finally:
            app.stop()
    assert list(select(series, "specwatch_target_up", target="t").values()) == [up]
    errors = {dict(k[1])["reason"]: v for k, v in
              select(series, "specwatch_target_poll_errors_total", target="t").items() if v}
    assert errors == ({reason: 1.0} if reason else {})


def test_redacting_filter_rewrites_registered_secrets(caplog):
    """Second line of defence: a registered secret in a message, its arguments or an
    exception text is replaced by <redacted> before any handler formats it."""
    redact.register(testsecrets.TARGET_BEARER_TOKEN)
    handler_filter = redact.RedactingFilter()
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "token %s rejected",
                               (testsecrets.TARGET_BEARER_TOKEN,), None)
    assert handler_filter.filter(record)
    assert record.getMessage() == "token <redacted> rejected"
    try:
        raise ValueError(f"bad header Bearer {testsecrets.TARGET_BEARER_TOKEN}")
    except ValueError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    handler_filter.filter(rec)
    assert rec.exc_info is None and "<redacted>" in rec.exc_text
    assert testsecrets.TARGET_BEARER_TOKEN not in rec.exc_text
    assert redact.redact("short") == "short"
