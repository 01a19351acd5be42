"""What a vLLM server says about its own capacity, read from its page (vllm:cache_config_info).

Protects: on the recorded vLLM 0.32 pages the KV cache is read as the server states it
(524288 tokens, 4096 blocks of 128), by the fast and full parsers and from a page plan
alike; data-parallel engines are summed; a page of an older vLLM without
kv_cache_size_tokens gives blocks × block size; an engine that states nothing (or two
values) makes the server's value unknown, never a partial sum; SGLang and pages without
the family have none; the info series never becomes a model (it has no model_name).

Live, through the real exporter on the recorded pages: the stated capacity is exposed
(sd_server_kv_cache_tokens, _blocks; sd_server_max_num_seqs from the configuration; nothing
for a target that states nothing); a parameters file whose server_capacity matches the server
(within 5%) is not flagged; one that does not is `sd_model_valid` 0 with reason
capacity_mismatch, names the field in sd_model_provenance_mismatch, shows no number that
rests on the capacity, and logs it once; a value one side does not state is not compared, so
files without server_capacity behave as before.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.pageserver import Page, PageSequenceServer
from helpers.paths import FIXTURES
from helpers.scrape import fetch_text, parse_exposition, select

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.expose.collector import server_families
from specwatch.model.params import params_from_mapping
from specwatch.plugins.live.plugin import capacity_mismatch
from specwatch.poll import pageplan, sources
from specwatch.poll.snapshot import Snapshot, TargetSnapshot

FIX = FIXTURES
REAL = sorted((FIX / "vllm-0.32-cpu-ngram").glob("snap_*.prom"),
              key=lambda p: int(p.stem.split("_")[1]))
PAGE = REAL[-1].read_text()
INFO = re.compile(r"^vllm:cache_config_info\{.*$", re.M)


def _info_line() -> str:
    m = INFO.search(PAGE)
    assert m is not None
    return m.group(0)


def _with_info(*lines: str) -> str:
    """The recorded page with its cache_config_info line replaced by `lines`."""
    return PAGE.replace(_info_line(), "\n".join(lines))


@pytest.mark.parametrize("parser", sources.PARSERS)
def test_recorded_pages_state_their_kv_cache(parser: str) -> None:
    plan = pageplan.PagePlan()
    for path in REAL:
        page = sources.parse_page(path.read_text(), parser=parser,
                                  plan=plan if parser == "fast" else None)
        assert page.server == sources.ServerCapacity(
            kv_cache_tokens=524288.0, num_gpu_blocks=4096.0, block_size=128.0, engines=1)
        assert "" not in page.models and page.models == {"tiny-llama"}
    if parser == "fast":
        assert plan.hits == len(REAL) - 1  # the steady pages came from the plan


def test_engines_are_summed() -> None:
    one = _info_line()
    two = one.replace('engine="0"', 'engine="1"')
    page = sources.parse_page(_with_info(one, two))
    assert page.server == sources.ServerCapacity(1048576.0, 8192.0, 128.0, 2)


def test_without_kv_cache_size_tokens_blocks_times_block_size() -> None:
    older = re.sub(r'kv_cache_size_tokens="[^"]*",', "", _info_line())
    assert "kv_cache_size_tokens" not in older
    assert sources.parse_page(_with_info(older)).server.kv_cache_tokens == 524288.0


@pytest.mark.parametrize("bad", ['num_gpu_blocks="None"', 'num_gpu_blocks="-3"'])
def test_an_engine_stating_nothing_makes_the_sum_unknown(bad: str) -> None:
    one = re.sub(r'kv_cache_size_tokens="[^"]*",', "", _info_line())
    two = one.replace('engine="0"', 'engine="1"').replace('num_gpu_blocks="4096"', bad)
    for parser in sources.PARSERS:
        server = sources.parse_page(_with_info(one, two), parser=parser).server
        assert server is not None and server.engines == 2
        assert server.kv_cache_tokens is None and server.num_gpu_blocks is None
        assert server.block_size == 128.0


def test_one_engine_stating_two_values_is_unknown() -> None:
    one = _info_line()
    other = one.replace('kv_cache_size_tokens="524288"', 'kv_cache_size_tokens="262144"')
    server = sources.parse_page(_with_info(one, other)).server
    assert server == sources.ServerCapacity(None, None, None, 1)


def _stating(line: str, **values: str) -> str:
    for name, value in values.items():
        line = re.sub(rf'{name}="[^"]*"', f'{name}="{value}"', line)
    return line


@pytest.mark.parametrize("parser", sources.PARSERS)
@pytest.mark.parametrize("case", ["sum", "product"])
def test_a_sum_or_product_that_overflows_is_dropped_and_counted(parser: str, case: str
                                                                ) -> None:
    """A stated size is checked, and so is what specwatch computes from the stated sizes: a
    sum over engines (two engines of 1e308 tokens) or a product (1e200 blocks of 1e200
    tokens, an older vLLM without kv_cache_size_tokens) that is not finite is unknown
    (None), never +Inf, and is counted with the page's invalid series."""
    if case == "sum":
        one = _stating(_info_line(), kv_cache_size_tokens="1e308")
        lines = [one, one.replace('engine="0"', 'engine="1"')]
    else:
        older = re.sub(r'kv_cache_size_tokens="[^"]*",', "", _info_line())
        lines = [_stating(older, num_gpu_blocks="1e200", block_size="1e200")]
    page = sources.parse_page(_with_info(*lines), parser=parser)
    assert page.server is not None and page.server.kv_cache_tokens is None
    assert page.invalid_series == 1
    assert sources.parse_page(_with_info(_info_line()), parser=parser).invalid_series == 0


def test_pages_without_it_have_none() -> None:
    assert sources.parse_page(_with_info()).server is None
    for name in ("sglang-0.5.23-spec.prom", "vllm-0.33-spec-decode.prom"):
        assert sources.parse_page((FIX / "constructed" / name).read_text()).server is None
    # An SGLang-only reading of a vLLM page does not look for vLLM's info series.
    assert sources.parse_page(PAGE, engine="sglang").server is None


# -- live: the exporter on the recorded pages ----------------------------------------------

#: Two recorded pages of one server run (before the restart): 300 s apart on the exporter's
#: clock, they give the 5m window arrival rate, acceptance and lengths.
LIVE_PAGES = [REAL[0].read_text(), REAL[18].read_text()]
PARAMS = """\
system: worked-example
coefficients: {a_p: 0.1, b_p: 0.01, a_v: 0.02, b_v: 0.001, a_d: 0.002, b_d: 0.0005}
"""


class Clock:
    t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def run(tmp_path: Path, params: str = PARAMS, target_extra: str = "",
        pages: list[str] = LIVE_PAGES) -> dict:
    """Serve `pages` 300 s apart to an exporter with target `a` (params file, extra keys)
    and target `b` (the same server, no params); the scraped series."""
    (tmp_path / "params.yaml").write_text(params)
    with PageSequenceServer([Page(p) for p in pages]) as server:
        (tmp_path / "specwatch.yaml").write_text(
            f"global:\n  poll_interval: 5\ntargets:\n  - name: a\n    url: {server.url}\n"
            f"    params: {tmp_path / 'params.yaml'}\n{target_extra}"
            f"  - name: b\n    url: {server.url}\n")
        cfg = app_settings.build_config(str(tmp_path / "specwatch.yaml"), [], "127.0.0.1:0", None)
        clock = Clock()
        app = ServeApp(cfg, clock=clock)
        app.start(poll=False)
        try:
            for i in range(len(pages)):
                server.set_step(i)
                clock.t = 1_000_000.0 + 300.0 * i
                for t in cfg.targets:
                    app.poller.poll_now(t.name)
            host, port = app.web.address
            return parse_exposition(fetch_text(f"http://{host}:{port}/metrics"))
        finally:
            app.stop()


def one(series: dict, name: str, **labels: str) -> float:
    found = select(series, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return next(iter(found.values()))


def test_the_exporter_exposes_what_the_server_states(tmp_path: Path) -> None:
    s = run(tmp_path, target_extra="    max_num_seqs: 256\n")
    for target in ("a", "b"):
        assert one(s, "sd_server_kv_cache_tokens", target=target) == 524288.0
        assert one(s, "sd_server_kv_cache_blocks", target=target) == 4096.0
    assert one(s, "sd_server_max_num_seqs", target="a") == 256.0
    assert not select(s, "sd_server_max_num_seqs", target="b")  # not configured: no series


def test_a_page_stating_nothing_and_a_down_target_have_no_series() -> None:
    server = sources.ServerCapacity(524288.0, 4096.0, 128.0, 1)
    snap = Snapshot("v", {
        "down": TargetSnapshot("down", up=False, server=server),
        "silent": TargetSnapshot("silent", up=True),
        "unstated": TargetSnapshot("unstated", up=True,
                                   server=sources.ServerCapacity(None, None, 128.0, 2)),
    })
    assert list(server_families(snap)) == []


def test_a_server_of_the_calibrated_capacity_is_not_flagged(tmp_path: Path) -> None:
    """The recorded server runs SD (n-gram, k = 4) with 524288 tokens; the file says 520000
    (within 5%: a memory profile moves it a little between restarts)."""
    params = PARAMS + ("server_capacity: {kv_cache_tokens_sd: 520000, max_num_seqs: 256}\n"
                       "capacity: {kv_cache_tokens_sd: 0}\n")
    s = run(tmp_path, params, target_extra="    max_num_seqs: 256\n")
    assert not select(s, "sd_model_provenance_mismatch")
    assert one(s, "sd_model_valid", target="a") == 1.0
    assert one(s, "sd_predicted_speedup", target="a") > 0


def test_a_server_of_another_capacity_is_flagged(tmp_path: Path, caplog) -> None:
    """The file was calibrated on a server with half the KV cache: not valid, reason
    capacity_mismatch, the field named, no number that rests on the capacity, one log line."""
    params = PARAMS + "server_capacity: {kv_cache_tokens_sd: 262144}\n"
    with caplog.at_level("WARNING"):
        s = run(tmp_path, params)
    assert one(s, "sd_model_provenance_mismatch", target="a",
               field="kv_cache_tokens_sd") == 1.0
    assert one(s, "sd_model_valid", target="a") == 0.0
    assert one(s, "sd_model_valid", target="a", reason="capacity_mismatch") == 0.0
    for name in ("sd_predicted_speedup", "sd_predicted_latency_seconds",
                 "sd_breakeven_arrival_rate", "sd_optimal_draft_length",
                 "sd_model_speedup_curve"):
        assert not select(s, name, target="a"), name
    lines = [r.getMessage() for r in caplog.records
             if "server_capacity kv_cache_tokens_sd" in r.getMessage()]
    assert len(lines) == 1 and "262144" in lines[0] and "524288" in lines[0]


def test_another_max_num_seqs_is_flagged(tmp_path: Path) -> None:
    params = PARAMS + "server_capacity: {max_num_seqs: 128}\n"
    s = run(tmp_path, params, target_extra="    max_num_seqs: 256\n")
    assert one(s, "sd_model_provenance_mismatch", target="a", field="max_num_seqs") == 1.0
    assert one(s, "sd_model_valid", target="a", reason="capacity_mismatch") == 0.0


@pytest.mark.parametrize("params", [
    PARAMS,  # a file from before server_capacity
    # The no-SD server's cache is not what an SD server states: not compared.
    PARAMS + "server_capacity: {kv_cache_tokens: 1000}\ncapacity: {kv_cache_tokens: 0}\n",
    # max_num_seqs stated by the file, not by the target's configuration: not compared.
    PARAMS + "server_capacity: {max_num_seqs: 128}\ncapacity: {max_num_seqs: 0}\n",
])
def test_values_one_side_does_not_state_are_not_compared(tmp_path: Path, params: str) -> None:
    s = run(tmp_path, params)
    assert not select(s, "sd_model_provenance_mismatch")
    assert one(s, "sd_model_valid", target="a") == 1.0


def test_the_cache_of_the_servers_kind_is_compared() -> None:
    """A server running SD is compared with kv_cache_tokens_sd, one without with
    kv_cache_tokens (the recorded page's 524288 tokens either way), each within 5%."""
    server = sources.parse_page(PAGE).server
    doc = {"system": "s", "coefficients": {n: 0.01 for n in
                                           ("a_p", "b_p", "a_v", "b_v", "a_d", "b_d")},
           "server_capacity": {"kv_cache_tokens": 530000, "kv_cache_tokens_sd": 400000}}
    params = params_from_mapping(doc)
    assert capacity_mismatch(params, server, sd=True) == ("kv_cache_tokens_sd",)
    assert capacity_mismatch(params, server, sd=False) == ()  # 1.1% off: the same
    doc["server_capacity"] = {"kv_cache_tokens": 600000}
    assert capacity_mismatch(params_from_mapping(doc), server, sd=False) == ("kv_cache_tokens",)
    assert capacity_mismatch(params_from_mapping(doc), None, sd=False) == ()
