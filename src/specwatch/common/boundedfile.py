"""The one reader of the files specwatch reads: parameters, calibration inputs, the serve and
web configs, secrets, scenarios, file_sd and rule files.

Every read is bounded before it starts, so a mistaken path or a hostile file costs a line,
never memory, a hang or a traceback:

- only a *regular* file is read (a symbolic link to one is followed). The file is opened
  with ``O_NONBLOCK`` and checked with ``fstat`` before any read: a FIFO without a writer
  is refused at once instead of blocking, and a device such as ``/dev/zero`` is refused
  instead of being read until memory runs out;
- at most the size limit of its kind (:class:`FileKind`) is read, whatever ``st_size``
  says (procfs files state 0, a file may grow while it is read);
- YAML is parsed by :func:`load_yaml`: nesting deeper than :data:`MAX_DEPTH` is refused
  while composing (100,000 ``[`` is one line, not a RecursionError), aliases are refused
  (an anchor bomb expands exponentially in whatever walks it), and so are duplicate keys
  (PyYAML keeps the last one silently);
- JSON is parsed by :func:`load_json` with the same rules: nesting bounded, duplicate keys
  refused.

Every failure is one :class:`~specwatch.common.errors.ConfigError` that names the file and
what was wrong (exit status 2 at the command line). Nothing of a file's content appears in
the message beyond a key name.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from typing import Any

import yaml

from specwatch.common.errors import ConfigError

KIB = 1024
MIB = 1024 * KIB

#: Deepest nesting of a YAML or JSON document: far above any file specwatch reads (a serve
#: config nests about 6 deep, a vllm bench result 3) and far below Python's recursion limit.
MAX_DEPTH = 64


class FileMissingError(ConfigError):
    """The file does not exist (a reader for which that is normal, file_sd, tells it apart)."""


@dataclass(frozen=True)
class FileKind:
    """What a file is for (its name in messages), the most bytes read from it, and what to
    do instead when it is not a regular file."""

    name: str
    limit: int
    hint: str = ""


#: Parameters file: the shipped ones are under 5 KiB; 256 KiB is fifty times that and
#: parses in about a second however it is filled.
PARAMETERS = FileKind("parameters file", 256 * KIB)
#: Calibration input (vllm bench serve JSON with per-request details, a CSV of runs):
#: 10^5 CSV rows are about 20 MiB.
CALIBRATION_INPUT = FileKind("calibration input", 64 * MIB)
#: Serve config: thousands of targets with their labels fit in 4 MiB.
SERVE_CONFIG = FileKind("serve config", 4 * MIB)
#: Web config (TLS and basic-auth settings, a few hundred users).
WEB_CONFIG = FileKind("web config", 1 * MIB)
#: Scenario of the simulator (phases and models).
SCENARIO = FileKind("scenario file", 1 * MIB)
#: file_sd file: the same bound as a serve config's targets.
FILE_SD = FileKind("file_sd file", 4 * MIB)
#: Prometheus rule file of the bundle.
RULE_FILE = FileKind("rule file", 4 * MIB)
#: TLS certificate, key or CA bundle (read by OpenSSL; a system CA bundle is about 200 KiB).
TLS_FILE = FileKind("TLS file", 4 * MIB)
#: Secret (a bearer token, a password, a header value).
SECRET = FileKind("secret file", 64 * KIB, "point it at a file holding only the secret")


def size_text(n: int) -> str:
    """``n`` bytes in words: 64 KiB, 4 MiB."""
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} bytes"


def _type_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _open_checked(path: str, kind: FileKind, where: str | None) -> tuple[int, str]:
    """An open descriptor of the regular file ``path`` within the size limit of its kind,
    and the head of every error line about it."""
    head = f"{where}: {path!r}" if where else f"{path}:"
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if where:
            raise ConfigError(f"{where}: cannot read {path!r}: {exc.strerror}") from None
        if exc.errno == errno.ENOENT:
            raise FileMissingError(f"{path}: {kind.name} not found (no such file or "
                                   f"directory)") from None
        raise ConfigError(f"{path}: cannot read {kind.name}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            hint = kind.hint or f"a {kind.name} is read whole, so it must be a regular file"
            raise ConfigError(f"{head} is {_type_of(info.st_mode)}, not a regular file: {hint}")
        if info.st_size > kind.limit:
            raise ConfigError(f"{head} is {info.st_size} bytes, over the "
                              f"{size_text(kind.limit)} limit for a {kind.name}")
    except BaseException:
        os.close(fd)
        raise
    return fd, head


def check_regular(path: str | os.PathLike[str], kind: FileKind, *,
                  where: str | None = None) -> None:
    """Refuse what :func:`read_bytes` refuses, without reading: for a file another library
    reads (OpenSSL reads the TLS files), which would block on a FIFO."""
    fd, _ = _open_checked(os.fspath(path), kind, where)
    os.close(fd)


def read_bytes(path: str | os.PathLike[str], kind: FileKind, *, where: str | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``kind.limit`` of them.

    ``where`` (a config key) starts every error line when given, followed by the quoted
    path; otherwise the line starts with the path.
    """
    fd, head = _open_checked(os.fspath(path), kind, where)
    limit = kind.limit
    try:
        chunks: list[bytes] = []
        got = 0
        while got <= limit:  # st_size may be 0 or stale (procfs, a file being written)
            chunk = os.read(fd, min(limit + 1 - got, 4 * MIB))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise ConfigError(f"{head} is over the {size_text(limit)} limit for a {kind.name}")
    except OSError as exc:
        raise ConfigError(f"{head} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def decode(data: bytes, source: str) -> str:
    """UTF-8 text (a leading byte-order mark dropped); one line naming the byte otherwise."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                          f"save the file as UTF-8") from None


def read_text(path: str | os.PathLike[str], kind: FileKind) -> str:
    """The UTF-8 text of a regular file (see :func:`read_bytes`)."""
    return decode(read_bytes(path, kind), os.fspath(path))


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and nesting deeper than :data:`MAX_DEPTH` while it
    composes (before any recursion or expansion can cost anything)."""

    def __init__(self, stream: str, source: str) -> None:
        super().__init__(stream)
        self.source = source
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise ConfigError(f"{self.source}:{event.start_mark.line + 1}: YAML alias "
                              f"*{event.anchor} is not accepted (write the value out)")
        if self.depth >= MAX_DEPTH:
            raise ConfigError(f"{self.source}:{event.start_mark.line + 1}: nested too "
                              f"deeply (more than {MAX_DEPTH} levels)")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def check_duplicate_keys(source: str, node: yaml.Node | None,
                         path: tuple[str | int, ...] = ()) -> None:
    """Refuse a mapping that gives one key twice (PyYAML keeps the last one silently)."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise ConfigError(f"{source}:{key_node.start_mark.line + 1}: "
                                  f"{'.'.join(str(p) for p in (*path, key))}: duplicate key")
            seen.add(key)
            check_duplicate_keys(source, value_node, (*path, key))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            check_duplicate_keys(source, item, (*path, i))


def compose_yaml(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """The node tree (for line numbers) and the data of one YAML document, parsed strictly
    (no aliases, nesting bounded, no duplicate keys). An empty document is ``(None, None)``.
    """
    loader = _StrictLoader(text, source)
    try:
        node = loader.get_single_node()
        check_duplicate_keys(source, node)
        data = None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).replace("\n", " ")
        raise ConfigError(f"{source}: not valid YAML{at}: {problem}") from None
    finally:
        loader.dispose()
    return node, data


def load_yaml(text: str, source: str) -> Any:
    """The data of one YAML document, parsed strictly (see :func:`compose_yaml`)."""
    return compose_yaml(text, source)[1]


def read_yaml(path: str | os.PathLike[str], kind: FileKind) -> Any:
    """Read and parse a YAML file with the bounds of its kind."""
    return load_yaml(read_text(path, kind), os.fspath(path))


def _no_duplicates(source: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ConfigError(f"{source}: duplicate key {key!r} in one JSON object")
            out[key] = value
        return out
    return hook


def _depth_ok(doc: Any) -> bool:
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return True


def load_json(text: str, source: str) -> Any:
    """One JSON document, nesting bounded and duplicate keys refused.

    Raises :class:`json.JSONDecodeError` for text that is not JSON (callers word it: a file
    of JSON lines tries line by line) and ConfigError for the rest.
    """
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates(source))
    except RecursionError:
        raise ConfigError(f"{source}: JSON nested too deeply (more than {MAX_DEPTH} "
                          f"levels)") from None
    if isinstance(doc, dict | list) and not _depth_ok(doc):
        raise ConfigError(f"{source}: JSON nested too deeply (more than {MAX_DEPTH} levels)")
    return doc
