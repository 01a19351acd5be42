"""Which targets this exporter polls: static ones, Prometheus ``file_sd`` files, its shard.

A fleet too large for one exporter is split between N exporters that read the same target
list (the same config, or the same ``file_sd`` files) and differ only in ``--shard-index``.
Each keeps the targets whose shard is its index, so every server is polled by exactly one
exporter, with no coordination between them.

* **Shard of a target**: Prometheus' ``hashmod`` on the target name (``host:port`` unless the
  config names it): the last 8 bytes of its MD5 as a big-endian integer, modulo the shard
  count. The same function Prometheus applies in ``relabel_configs`` (``action: hashmod``,
  ``source_labels: [__address__]``), so a sharded Prometheus and sharded exporters can split
  a fleet the same way. Adding or removing a target moves no other target.
* **Pairs** (``pairs:``): both sides of a measured A/B pair must be polled by one exporter,
  so a paired target is sharded by its pair's name instead of its own
  (``ServeConfig.shard_keys``, from the pairs plug-in's config section; pairs that share a
  target by the group's first pair name). docs/exporter.md has the Prometheus relabelling
  that matches.
* **file_sd**: the files Prometheus' ``file_sd_configs`` read: JSON (``.json``) or YAML
  (``.yml``/``.yaml``) lists of ``{targets: [host:port, ...], labels: {...}}``; globs in the
  file name are expanded. ``__scheme__`` and ``__metrics_path__`` labels set the URL like in
  Prometheus (default ``http`` and ``/metrics``); other labels are not used (specwatch
  labels its series with ``target`` only; join on it in PromQL for more). Files are re-read
  every ``refresh_interval`` and applied when their content changed. A file that cannot be
  read or parsed keeps its previous targets (error logged and counted): write files
  atomically (write, then rename), as for Prometheus.
* **Cap**: at most ``max_targets`` targets are polled; static targets come first, then the
  discovered ones in file and group order; the rest are counted as dropped.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specwatch.common import boundedfile
from specwatch.common.errors import ConfigError, SpecwatchError

log = logging.getLogger(__name__)

DEFAULT_REFRESH_INTERVAL = 30.0


def shard_of(name: str, shard_count: int) -> int:
    """The shard (0..count-1) of a target name: Prometheus' ``hashmod`` (see module doc)."""
    if shard_count < 1:
        raise ValueError("shard_count must be >= 1")
    digest = hashlib.md5(name.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % shard_count


class FileSDError(ConfigError):
    """A file_sd file that is not a valid target group list (message names file and entry)."""


@dataclass(frozen=True)
class FileSDConfig:
    """One ``file_sd_configs`` entry: file paths or globs, and how often to re-read them."""

    files: tuple[str, ...]
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL


def parse_file_sd(data: bytes, path: str) -> list[dict[str, Any]]:
    """Parse the bytes of a file_sd file named ``path`` (its extension picks the format)."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".json", ".yml", ".yaml"):
        raise FileSDError(f"{path}: file_sd files must end in .json, .yml or .yaml")
    try:
        text = boundedfile.decode(data, path)
        if ext == ".json":
            groups = boundedfile.load_json(text, path)
        else:
            groups = boundedfile.load_yaml(text, path)
    except json.JSONDecodeError as exc:
        raise FileSDError(f"{path}: not valid JSON: {exc}") from None
    except ConfigError as exc:
        raise FileSDError(str(exc)) from None
    if groups is None:
        return []
    if not isinstance(groups, list):
        raise FileSDError(f"{path}: expected a list of target groups "
                          f"({{targets: [...], labels: {{...}}}}), got {type(groups).__name__}")
    out: list[dict[str, Any]] = []
    for i, group in enumerate(groups):
        where = f"{path}: [{i}]"
        if not isinstance(group, dict):
            raise FileSDError(f"{where}: expected a mapping with 'targets', got "
                              f"{type(group).__name__}")
        unknown = set(group) - {"targets", "labels"}
        if unknown:
            raise FileSDError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: targets, "
                              f"labels)")
        targets = group.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise FileSDError(f"{where}.targets: expected a list of host:port strings")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise FileSDError(f"{where}.labels: expected a mapping of strings to strings")
        scheme = labels.get("__scheme__", "http")
        if scheme not in ("http", "https"):
            raise FileSDError(f"{where}.labels.__scheme__: expected http or https, "
                              f"got {scheme!r}")
        path_label = labels.get("__metrics_path__", "/metrics")
        if not path_label.startswith("/"):
            raise FileSDError(f"{where}.labels.__metrics_path__: expected a path starting "
                              f"with /, got {path_label!r}")
        for j, address in enumerate(targets):
            address = address.strip()
            if not address or "/" in address or "://" in address or " " in address:
                raise FileSDError(f"{where}.targets[{j}]: expected host:port (no scheme, no "
                                  f"path: use the __scheme__ and __metrics_path__ labels), "
                                  f"got {address!r}")
            out.append({"url": f"{scheme}://{address}{path_label}",
                        "_where": f"{where}.targets[{j}]"})
    return out


TargetFactory = Callable[[Mapping[str, Any], str], Any]


@dataclass
class _FileState:
    data: bytes | None = None
    targets: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class SourceStats:
    """For the exporter's own series: how many targets exist, are polled, were dropped."""

    discovered: int  # static + file_sd, all shards, duplicates removed
    polled: int
    dropped: int  # in this shard but beyond max_targets
    read_errors_total: int
    files: int


class TargetSource:
    """Static targets plus file_sd targets, filtered to one shard, capped.

    ``make_target(raw, where)`` turns a discovered ``{"url": ...}`` mapping into a target
    object with a ``name`` (and raises ValueError subclasses on bad input). ``on_change``
    receives the new target tuple whenever :meth:`refresh` changes it.
    """

    def __init__(self, static: Sequence[Any], file_sd: Sequence[FileSDConfig],
                 make_target: TargetFactory, shard_index: int = 0, shard_count: int = 1,
                 max_targets: int | None = None, static_dropped: int = 0,
                 shard_keys: Mapping[str, str] | None = None) -> None:
        if not 0 <= shard_index < shard_count:
            raise ValueError(f"shard index {shard_index} not in 0..{shard_count - 1}")
        self.static = tuple(static)
        self.file_sd = tuple(file_sd)
        self.make_target = make_target
        self.shard_index = shard_index
        self.shard_count = shard_count
        #: Target name -> the name it is sharded by (a paired target: its pair's name).
        self.shard_keys = dict(shard_keys or {})
        self.max_targets = max_targets
        self.static_dropped = static_dropped
        self._files: dict[str, _FileState] = {}
        self._lock = threading.Lock()
        self._targets: tuple[Any, ...] = ()
        self._stats = SourceStats(len(self.static), 0, static_dropped, 0, 0)
        self._errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_change: Callable[[tuple[Any, ...]], object] | None = None

    @property
    def targets(self) -> tuple[Any, ...]:
        """The targets this exporter polls now, in display order."""
        return self._targets

    @property
    def stats(self) -> SourceStats:
        return self._stats

    def mine(self, name: str) -> bool:
        """Does this shard poll the target named ``name``?"""
        return self.shard_count == 1 or \
            shard_of(self.shard_keys.get(name, name), self.shard_count) == self.shard_index

    def refresh(self, strict: bool = False) -> bool:
        """Re-read changed files and recompute the target set; True when it changed.

        ``strict``: raise FileSDError on a bad file (start-up) instead of keeping the file's
        previous targets and counting the error (runtime).
        """
        with self._lock:
            paths: list[str] = []
            for cfg in self.file_sd:
                for pattern in cfg.files:
                    matched = sorted(glob.glob(pattern)) if glob.has_magic(pattern) \
                        else [pattern]
                    paths.extend(p for p in matched if p not in paths)
            for gone in set(self._files) - set(paths):
                del self._files[gone]
            for path in paths:
                self._read(path, strict)
            discovered: dict[str, Any] = {}
            for t in self.static:
                discovered.setdefault(t.name, t)
            for path in paths:
                for t in self._files[path].targets:
                    if t.name in discovered:
                        log.debug("%s: target %s listed twice; the first entry is kept",
                                  path, t.name)
                        continue
                    discovered[t.name] = t
            mine = [t for t in discovered.values() if self.mine(t.name)]
            cap = self.max_targets if self.max_targets is not None else len(mine)
            selected = tuple(mine[:cap])
            dropped = len(mine) - len(selected) + self.static_dropped
            if dropped and dropped != self._stats.dropped:
                log.warning("%d target(s) of this shard are not polled: global.max_targets "
                            "is %s", dropped, self.max_targets)
            changed = selected != self._targets
            self._targets = selected
            self._stats = SourceStats(len(discovered) + self.static_dropped, len(selected),
                                      dropped, self._errors, len(paths))
        if changed and self._on_change is not None:
            self._on_change(selected)
        return changed

    def _read(self, path: str, strict: bool) -> None:
        state = self._files.setdefault(path, _FileState())
        try:
            data = boundedfile.read_bytes(path, boundedfile.FILE_SD)
        except boundedfile.FileMissingError:
            if state.data is not None or strict:
                log.warning("file_sd file %s does not exist (yet); it has no targets", path)
            state.data, state.targets = None, []
            return
        except ConfigError as exc:
            self._fail(path, str(exc), strict)
            return
        if data == state.data:
            return
        try:
            raws = parse_file_sd(data, path)
            targets = [self.make_target(raw, raw.pop("_where")) for raw in raws]
        except (ValueError, SpecwatchError) as exc:  # FileSDError, ConfigError
            self._fail(path, str(exc), strict)
            return
        state.data, state.targets = data, targets
        log.info("file_sd %s: %d target(s)", path, len(targets))

    def _fail(self, path: str, message: str, strict: bool) -> None:
        if strict:
            raise FileSDError(message)
        self._errors += 1
        log.error("file_sd: %s (keeping the previous targets of %s)", message, path)

    # -- background refresh ----------------------------------------------------------------
    def start(self, on_change: Callable[[tuple[Any, ...]], object]) -> None:
        """Re-read the files every refresh_interval (the shortest one) in a thread."""
        self._on_change = on_change
        if not self.file_sd:
            return
        interval = min(c.refresh_interval for c in self.file_sd)
        self._thread = threading.Thread(target=self._loop, args=(interval,),
                                        name="specwatch-file-sd", daemon=True)
        self._thread.start()

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.refresh()
            except Exception:  # never let discovery die: the current targets stay
                log.exception("file_sd refresh failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
