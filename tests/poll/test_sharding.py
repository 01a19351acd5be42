"""Sharding and file_sd discovery: several exporters split a fleet exactly.

Protected behaviour: N shards partition any fleet (no target lost, none polled twice), with
the same assignment as Prometheus' own ``hashmod`` relabelling over the same file_sd file
(checked against a real Prometheus); file_sd files in JSON and YAML are read like
Prometheus reads them, re-read on change, and a broken file keeps its previous targets;
a running exporter picks up added and removed targets; bad input is a clear error.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from helpers.pageserver import Page, PageSequenceServer, Stall
from helpers.scrape import scrape, select

from specwatch.app import settings as app_settings
from specwatch.app.serve import ServeApp
from specwatch.common.errors import ConfigError
from specwatch.plugins.pairs.settings import PairConfig, shard_keys
from specwatch.poll import config
from specwatch.poll.discovery import (
    FileSDConfig,
    FileSDError,
    TargetSource,
    parse_file_sd,
    shard_of,
)
from specwatch.poll.poller import Poller, PollTarget

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "tests" / "fixtures" / "constructed" / "vllm-0.33-spec-decode.prom").read_text()
FLEET = [f"vllm-{i:03d}.inference.svc:8000" for i in range(500)]


@dataclass(frozen=True)
class T:
    name: str
    url: str = ""


def make(raw, where):
    return T(config.default_target_name(raw["url"]), raw["url"])


def write_sd(path: Path, groups) -> None:
    """Write atomically (temp file + rename), as a file_sd writer should."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(groups) if path.suffix == ".json" else _yaml(groups))
    tmp.replace(path)


def _yaml(groups) -> str:
    import yaml

    return yaml.safe_dump(groups)


# -- the partition ------------------------------------------------------------------------

@pytest.mark.parametrize("count", [1, 2, 3, 7, 16])
def test_shards_partition_the_fleet_exactly(count):
    """Every target of a 500-server fleet is in exactly one shard, and no shard is starved
    (hashmod spreads them like a fair die: each shard within 4 binomial sigmas)."""
    shards = []
    for index in range(count):
        src = TargetSource([T(n) for n in FLEET], (), make, index, count)
        src.refresh()
        shards.append({t.name for t in src.targets})
    assert set().union(*shards) == set(FLEET)
    assert sum(len(s) for s in shards) == len(FLEET)
    fair = len(FLEET) / count
    sigma = (len(FLEET) * (1 / count) * (1 - 1 / count)) ** 0.5
    assert all(abs(len(s) - fair) <= 4 * sigma for s in shards), [len(s) for s in shards]


def test_adding_a_target_moves_no_other_target():
    """hashmod depends on the target alone: growing the fleet never reshuffles it."""
    before = {n: shard_of(n, 5) for n in FLEET}
    after = {n: shard_of(n, 5) for n in [*FLEET, "new-server:8000"]}
    assert all(after[n] == s for n, s in before.items())


def test_static_targets_are_sharded_by_the_config_and_the_flags(tmp_path):
    """--shard-index/--shard-count (and global.shard_*) select the static targets too; the
    flags win over the file; the cap applies after sharding."""
    cfg_file = tmp_path / "specwatch.yaml"
    cfg_file.write_text("global:\n  shard_count: 3\n  shard_index: 0\n  max_targets: 1000\n"
                        "targets:\n" + "".join(f"  - url: http://{n}/metrics\n" for n in FLEET))
    got = []
    for index in range(3):
        cfg = app_settings.build_config(str(cfg_file), [], "127.0.0.1:0", None, shard_index=index)
        got.append({t.name for t in cfg.targets})
        assert cfg.shard_count == 3 and cfg.shard_index == index
        assert all(shard_of(n, 3) == index for n in got[-1])
    assert set().union(*got) == set(FLEET) and sum(map(len, got)) == len(FLEET)
    capped = app_settings.build_config(str(cfg_file), [], "127.0.0.1:0", None, shard_index=1,
                                 shard_count=2)
    assert {t.name for t in capped.targets} == {n for n in FLEET if shard_of(n, 2) == 1}


@pytest.mark.parametrize("count", [2, 3, 7])
def test_both_sides_of_every_pair_are_polled_by_one_shard(tmp_path, count):
    """A fleet of 40 A/B pairs (one baseline shared by two SD replicas) and 200 unpaired
    servers, split over N exporters from one config (static targets) and one file_sd file:
    each pair's two sides are polled by exactly one exporter, so every pair is measured
    exactly once; unpaired targets are partitioned by their own name, as without pairs."""
    pairs = [{"name": f"ab-{i:02d}", "sd": f"sd-{i:02d}.svc:8000", "baseline":
              f"base-{i:02d}.svc:8000"} for i in range(40)]
    pairs.append({"name": "ab-shared", "sd": "sd-extra.svc:8000", "baseline": "base-07.svc:8000"})
    paired = {t for p in pairs for t in (p["sd"], p["baseline"])}
    unpaired = FLEET[:200]
    mixed = tmp_path / "mixed.yaml"  # 100 unpaired static, the rest from file_sd
    static = tmp_path / "static.yaml"  # every target static
    write_sd(tmp_path / "fleet.yaml", [{"targets": [*sorted(paired), *unpaired[100:]]}])
    mixed.write_text(yaml.safe_dump({
        "targets": [{"url": f"http://{n}/metrics"} for n in unpaired[:100]],
        "file_sd_configs": [{"files": [str(tmp_path / "fleet.yaml")]}],
        "pairs": pairs, "pair_options": {"window": "1m"}}))
    static.write_text(yaml.safe_dump({
        "targets": [{"url": f"http://{n}/metrics"} for n in [*sorted(paired), *unpaired]],
        "pairs": pairs, "pair_options": {"window": "1m"}}))
    for path in (mixed, static):
        shards = []
        for index in range(count):
            cfg = app_settings.build_config(str(path), [], "127.0.0.1:0", None, shard_index=index,
                                      shard_count=count)
            app = ServeApp(cfg)  # the serve path: config, then the target source
            shards.append({t.name for t in app.targets.targets})
        assert sum(map(len, shards)) == len(paired) + len(unpaired), "a target twice or lost"
        for p in pairs:
            holders = [i for i, s in enumerate(shards) if p["sd"] in s or p["baseline"] in s]
            assert len(holders) == 1, (p["name"], holders)
            assert {p["sd"], p["baseline"]} <= shards[holders[0]]
        for n in unpaired:
            assert [i for i, s in enumerate(shards) if n in s] == [shard_of(n, count)]
        assert len({i for i, s in enumerate(shards) if s & paired}) > 1, \
            "the pairs should spread over the shards"


@pytest.mark.parametrize("index,count", [(3, 3), (-1, 2), (0, 0)])
def test_bad_shard_settings_are_config_errors(index, count):
    with pytest.raises(ConfigError, match="shard"):
        app_settings.build_config(None, ["a=http://a:1/"], "127.0.0.1:0", None, shard_index=index,
                            shard_count=count)


def test_bad_shard_flags_exit_2_with_a_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "specwatch", "serve", "--target",
                           "http://a:1/", "--shard-index", "2", "--shard-count", "2",
                           "--listen", "127.0.0.1:0"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "shard index 2 is not in 0..1" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- the same assignment as Prometheus ----------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("paired", [False, True], ids=["unpaired", "pairs"])
def test_same_shards_as_prometheus_hashmod_over_the_same_file_sd(tmp_path, paired):
    """A real Prometheus reads the same file_sd file with one job per shard
    (``hashmod`` of ``__address__``, ``keep`` the shard's index): its active targets per
    job are exactly specwatch's shards, and its targets' URLs are specwatch's URLs. With
    pairs, the relabelling of docs/exporter.md (a paired address hashed by its pair's
    name) keeps the same targets as specwatch's shards by pair."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus not found: `make setup` installs Debian's prometheus package"
    fleet = FLEET[:60]
    sd = tmp_path / "fleet.json"
    write_sd(sd, [{"targets": fleet[:40], "labels": {"pool": "a"}},
                  {"targets": fleet[40:], "labels": {"__metrics_path__": "/v1/metrics"}}])
    count = 3
    pairs = [PairConfig(f"ab-{i}", fleet[2 * i], fleet[2 * i + 1]) for i in range(10)] \
        if paired else []
    keys = shard_keys(pairs)
    by_pair = "".join(
        f"      - {{source_labels: [__address__], regex: "
        f"'{re.escape(p.sd)}|{re.escape(p.baseline)}', target_label: __tmp_shard_key,"
        f" replacement: {p.name}}}\n" for p in pairs)
    jobs = "".join(
        f"  - job_name: shard{i}\n    scrape_interval: 1h\n    scrape_timeout: 1s\n"
        f"    file_sd_configs: [{{files: ['{sd}']}}]\n"
        f"    relabel_configs:\n"
        f"      - {{source_labels: [__address__], target_label: __tmp_shard_key}}\n"
        f"{by_pair}"
        f"      - {{source_labels: [__tmp_shard_key], modulus: {count},"
        f" target_label: __tmp_shard, action: hashmod}}\n"
        f"      - {{source_labels: [__tmp_shard], regex: '{i}', action: keep}}\n"
        for i in range(count))
    (tmp_path / "prometheus.yml").write_text("scrape_configs:\n" + jobs)
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        active: list = []
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets",
                                            timeout=2) as resp:
                    active = json.loads(resp.read())["data"]["activeTargets"]
                if len(active) == len(fleet):
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.2)
        assert len(active) == len(fleet)
        prom = {i: {t["discoveredLabels"]["__address__"] for t in active
                    if t["labels"]["job"] == f"shard{i}"} for i in range(count)}
        prom_urls = {t["scrapeUrl"] for t in active}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    for i in range(count):
        src = TargetSource([], [FileSDConfig((str(sd),))], make, i, count, shard_keys=keys)
        src.refresh(strict=True)
        assert {t.name for t in src.targets} == prom[i], f"shard {i}"
    for p in pairs:
        assert [i for i in range(count) if {p.sd, p.baseline} <= prom[i]] == \
            [shard_of(p.name, count)]
    every = TargetSource([], [FileSDConfig((str(sd),))], make)
    every.refresh(strict=True)
    assert {t.url for t in every.targets} == prom_urls


# -- file_sd files ------------------------------------------------------------------------

def test_file_sd_json_and_yaml_with_scheme_and_path(tmp_path):
    groups = [{"targets": ["a:8000", "b:8000"]},
              {"targets": ["c:443"], "labels": {"__scheme__": "https",
                                                "__metrics_path__": "/custom/metrics",
                                                "team": "x"}}]
    urls = ["http://a:8000/metrics", "http://b:8000/metrics", "https://c:443/custom/metrics"]
    for name in ("sd.json", "sd.yaml", "sd.yml"):
        write_sd(tmp_path / name, groups)
        raws = parse_file_sd((tmp_path / name).read_bytes(), str(tmp_path / name))
        assert [r["url"] for r in raws] == urls


@pytest.mark.parametrize("name,content,message", [
    ("x.json", "{not json", "x.json: not valid JSON"),
    ("x.json", '{"targets": ["a:1"]}', "expected a list of target groups"),
    ("x.json", '[{"targets": "a:1"}]', "[0].targets: expected a list of host:port"),
    ("x.json", '[{"targets": ["http://a:1/metrics"]}]', "[0].targets[0]: expected host:port"),
    ("x.json", '[{"targets": ["a:1"], "lables": {}}]', "unknown key(s) ['lables']"),
    ("x.json", '[{"targets": ["a:1"], "labels": {"__scheme__": "ftp"}}]', "__scheme__"),
    ("x.yaml", "- targets: [a:1]\n  labels: {__metrics_path__: metrics}\n", "__metrics_path__"),
    ("x.yaml", "- targets: [a:1\n", "x.yaml: not valid YAML"),
    ("x.txt", "[]", "must end in .json, .yml or .yaml"),
])
def test_bad_file_sd_files_name_the_file_and_the_entry(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(FileSDError) as exc:
        parse_file_sd(path.read_bytes(), str(path))
    assert message in str(exc.value)
    assert str(path) in str(exc.value)


def test_file_sd_changes_are_picked_up_and_bad_rewrites_keep_the_old_targets(tmp_path):
    """Added, changed and removed targets and files are applied on refresh; a rewrite that
    does not parse keeps the file's previous targets and is counted; a deleted file's
    targets go; globs pick up new files."""
    first = tmp_path / "a.json"
    write_sd(first, [{"targets": ["a:1", "b:1"]}])
    src = TargetSource([T("static:1")], [FileSDConfig((str(tmp_path / "*.json"),), 0.1)], make)
    changes: list[tuple] = []
    src._on_change = changes.append
    assert src.refresh(strict=True)
    assert [t.name for t in src.targets] == ["static:1", "a:1", "b:1"]
    assert not src.refresh()  # nothing changed: no callback
    write_sd(first, [{"targets": ["a:1", "c:1"]}])
    assert src.refresh()
    assert [t.name for t in src.targets] == ["static:1", "a:1", "c:1"]
    first.write_text("[{broken")
    assert not src.refresh()
    assert [t.name for t in src.targets] == ["static:1", "a:1", "c:1"]
    assert src.stats.read_errors_total == 1
    write_sd(tmp_path / "b.json", [{"targets": ["d:1", "a:1", "static:1"]}])
    assert src.refresh()
    assert [t.name for t in src.targets] == ["static:1", "a:1", "c:1", "d:1"]  # no duplicates
    first.unlink()
    assert src.refresh()
    assert [t.name for t in src.targets] == ["static:1", "d:1", "a:1"]
    assert len(changes) == 4 and changes[-1] == src.targets


def test_discovered_targets_are_capped_after_sharding(tmp_path):
    sd = tmp_path / "fleet.yaml"
    write_sd(sd, [{"targets": FLEET}])
    src = TargetSource([], [FileSDConfig((str(sd),))], make, 1, 2, max_targets=100)
    src.refresh(strict=True)
    mine = [n for n in FLEET if shard_of(n, 2) == 1]
    assert [t.name for t in src.targets] == mine[:100]
    assert src.stats.dropped == len(mine) - 100 and src.stats.discovered == len(FLEET)


def test_bad_file_sd_at_start_up_exits_2(tmp_path):
    sd = tmp_path / "fleet.json"
    sd.write_text('[{"targets": ["http://a:1"]}]')
    cfg_file = tmp_path / "specwatch.yaml"
    cfg_file.write_text("file_sd_configs:\n  - files: [fleet.json]\n")
    proc = subprocess.run([sys.executable, "-m", "specwatch", "serve", "--config",
                           str(cfg_file), "--listen", "127.0.0.1:0"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"{sd}: [0].targets[0]: expected host:port" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_file_sd_config_keys_are_validated(tmp_path):
    cfg_file = tmp_path / "specwatch.yaml"
    cfg_file.write_text("file_sd_configs:\n  - file: [x.json]\n")
    with pytest.raises(ConfigError, match=r"file_sd_configs\[0\].file: unknown key"):
        app_settings.build_config(str(cfg_file), [], "127.0.0.1:0", None)
    cfg_file.write_text("file_sd_configs:\n  - files: [x.json]\n    refresh_interval: 2s\n")
    cfg = app_settings.build_config(str(cfg_file), [], "127.0.0.1:0", None)
    assert cfg.file_sd == (FileSDConfig((str(tmp_path / "x.json"),), 2.0),)
    assert cfg.targets == ()


# -- a running exporter -------------------------------------------------------------------

def _up_targets(app: ServeApp) -> set[str]:
    host, port = app.web.address
    series = scrape(f"http://{host}:{port}/metrics")
    return {dict(k[1])["target"] for k in select(series, "specwatch_target_up")}


def _wait(predicate, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_running_exporters_follow_file_sd_and_split_it(tmp_path):
    """Two exporters (shards 0 and 1 of 2) read one file_sd file: together they poll every
    server exactly once; a server added to the file is polled by its shard within a refresh,
    a removed one disappears from /metrics."""
    servers = [PageSequenceServer([Page(PAGE)]).start() for _ in range(6)]
    apps: list[ServeApp] = []
    try:
        addresses = [s.url.split("/")[2] for s in servers]
        sd = tmp_path / "fleet.json"
        write_sd(sd, [{"targets": addresses[:5]}])
        cfg_file = tmp_path / "specwatch.yaml"
        cfg_file.write_text("global:\n  poll_interval: 0.5\n"
                            "file_sd_configs:\n  - files: [fleet.json]\n"
                            "    refresh_interval: 200ms\n")
        for index in range(2):
            cfg = app_settings.build_config(str(cfg_file), [], "127.0.0.1:0", None,
                                      shard_index=index, shard_count=2)
            app = ServeApp(cfg)
            app.start()
            apps.append(app)

        def shards() -> list[set[str]]:
            return [_up_targets(a) for a in apps]

        assert _wait(lambda: set().union(*shards()) == set(addresses[:5]))
        a, b = shards()
        assert not a & b
        assert a == {n for n in addresses[:5] if shard_of(n, 2) == 0}
        write_sd(sd, [{"targets": addresses[1:]}])
        assert _wait(lambda: set().union(*shards()) == set(addresses[1:]))
        a, b = shards()
        assert not a & b and len(a) + len(b) == 5
        owner = apps[shard_of(addresses[5], 2)]
        assert _wait(lambda: _target_up(owner, addresses[5]))
    finally:
        for app in apps:
            app.stop()
        for s in servers:
            s.stop()


def _target_up(app: ServeApp, name: str) -> bool:
    host, port = app.web.address
    series = select(scrape(f"http://{host}:{port}/metrics"), "specwatch_target_up",
                    target=name)
    return list(series.values()) == [1.0]


def test_slow_targets_do_not_delay_the_others():
    """10 targets that never answer (each poll ends at its 2 s deadline) and 10 fast ones,
    0.5 s interval for 3 s: with a worker per target every fast target keeps its interval
    (about 6 polls; at least 3 asked, for a loaded machine); a single shared worker gives
    each fast target at most 1 poll (measured: 0)."""
    stall = PageSequenceServer([Stall(30.0)]).start()
    fast = PageSequenceServer([Page(PAGE)]).start()
    polls: dict[str, int] = {}

    def count(result) -> None:
        if result.error_reason is None:
            polls[result.target] = polls.get(result.target, 0) + 1

    targets = [PollTarget(f"slow{i}", stall.url, timeout_seconds=2.0) for i in range(10)] + \
        [PollTarget(f"fast{i}", fast.url, timeout_seconds=2.0) for i in range(10)]
    poller = Poller(targets, 0.5, count)
    try:
        poller.start()
        time.sleep(3.0)
    finally:
        poller.stop(timeout=5)
        stall.stop()
        fast.stop()
    fast_polls = [polls.get(f"fast{i}", 0) for i in range(10)]
    assert min(fast_polls) >= 3, fast_polls


def test_poller_set_targets_while_running():
    """Targets added while the scheduler runs are polled at once; removed ones stop."""
    server = PageSequenceServer([Page(PAGE)]).start()
    seen: list[str] = []
    poller = Poller([PollTarget("a", server.url)], 0.3, lambda r: seen.append(r.target))
    try:
        poller.start()
        assert _wait(lambda: "a" in seen)
        poller.set_targets([PollTarget("b", server.url)])
        assert _wait(lambda: "b" in seen)
        time.sleep(0.4)  # any poll of "a" still in flight ends
        n = len(seen)
        time.sleep(0.8)
        assert "a" not in seen[n:] and seen[n:].count("b") >= 2
    finally:
        poller.stop(timeout=5)
        server.stop()


def test_pipeline_set_targets_keeps_history_and_drops_removed_results():
    """A kept target keeps its snapshot and history, a new one starts down, and a result
    that arrives for a removed target is not published (no resurrected series)."""
    from specwatch.poll.pipeline import Pipeline, PollResult
    from specwatch.poll.windows import derive

    p = Pipeline([("a", "auto"), ("b", "auto")], derive.DeriveConfig(), 5.0)
    p.apply(PollResult("a", 0.0, 1.0, 0.01, body=PAGE))
    assert p.snapshot.targets["a"].up
    p.set_targets([("a", "auto"), ("c", "auto")])
    assert list(p.snapshot.targets) == ["a", "c"]
    assert p.snapshot.targets["a"].up and not p.snapshot.targets["c"].up
    p.apply(PollResult("b", 5.0, 6.0, 0.01, body=PAGE))
    assert "b" not in p.snapshot.targets
    p.apply(PollResult("a", 5.0, 6.0, 0.01, body=PAGE))
    assert p._states["a"].history.models  # two polls in one history
    assert len(next(iter(p._states["a"].history.models.values())).entries) == 2


def test_polls_are_spread_over_the_interval_and_keep_it():
    """After the start-up poll, each target is polled on its own phase of the interval
    (``Poller.phase``, a fixed hash of its name: 20 targets cover the interval) and once per
    interval; with poll_spread off every target keeps phase 0 (all polls go out together)."""
    server = PageSequenceServer([Page(PAGE)]).start()
    try:
        for spread in (True, False):
            starts: dict[str, list[float]] = {}
            poller = Poller([PollTarget(f"t{i}", server.url) for i in range(20)], 1.0,
                            lambda r, s=starts: s.setdefault(r.target, []).append(r.started),
                            spread=spread)
            try:
                poller.start()
                time.sleep(3.8)
            finally:
                poller.stop(timeout=5)
            t0 = min(v[0] for v in starts.values())
            assert all(3 <= len(v) <= 5 for v in starts.values()), starts
            phases = [poller.phase(n) for n in starts]
            assert (max(phases) - min(phases) > 0.5) == spread
            for name, v in starts.items():
                for t in v[1:]:  # every later poll on the target's slot (0.25 s lateness)
                    off = (t - t0 - poller.phase(name)) % 1.0
                    assert off < 0.25 or off > 0.95, (name, spread, v)
    finally:
        server.stop()
