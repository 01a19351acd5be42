"""Calibration input files as text: decoding, format detection by content, JSON documents,
and number fields.

Formats are detected by content, not by extension, because operators rename files freely
(`run-3.txt`, `out.log`): a plain calibration CSV, the public sweep CSV layout, or `vllm bench
serve` JSON (one document, a list, or JSON lines). Every failure raises `ConfigError` naming the
file, the row or entry, and what was expected; numbers are finite and bounded. Builds no points
(that is `calibrate.inputs`).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specwatch.common import boundedfile
from specwatch.common.errors import ConfigError

__all__ = [
    "CSV_OPTIONAL",
    "CSV_REQUIRED",
    "MAX_MAGNITUDE",
    "SWEEP_REQUIRED",
    "csv_errors",
    "csv_rows",
    "detect_format",
    "json_documents",
    "need",
    "number",
    "read_text",
]

#: Columns of the plain CSV format (documented in the README).
CSV_REQUIRED = ("arrival_rate", "latency_s", "draft_length")
CSV_OPTIONAL = (
    "system",
    "acceptance_length",
    "prompt_tokens",
    "generation_tokens",
    "concurrency",
    "dataset",
    "ttft_s",
)

#: Columns that identify the public Qwen3-32B sweep layout (tests/fixtures/sd-validation/).
SWEEP_REQUIRED = (
    "req_tp",
    "e2e_latency_s_est",
    "k",
    "acc_len",
    "mean_prompt_tok",
    "mean_out_tok",
    "method",
    "draft",
    "conc",
)

#: Largest magnitude of any input number: far above any real latency (s or ms), rate or token
#: count, far below what overflows when the fit squares and sums values.
MAX_MAGNITUDE = 1e12


def number(raw: Any, where: str, name: str, *, required: bool) -> float | None:
    """Parse one numeric field; empty means absent. Rejects NaN and infinities by name."""
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        if required:
            raise ConfigError(f"{where}: {name} is empty (expected a number)")
        return None
    if isinstance(raw, bool):
        raise ConfigError(f"{where}: {name} must be a number, got {raw!r}")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {name} must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{where}: {name} must be finite, got {raw!r}")
    if abs(value) > MAX_MAGNITUDE:
        # 1e308 is finite, but the fit squares and sums such values into infinities.
        raise ConfigError(f"{where}: {name} {value:g} is out of range (at most "
                          f"{MAX_MAGNITUDE:g} in magnitude)")
    return value


def need(raw: Any, where: str, name: str) -> float:
    """A required number (see `number`)."""
    value = number(raw, where, name, required=True)
    assert value is not None
    return value


def read_text(path: Path) -> str:
    """Read a file as UTF-8 text, with the bounds of a calibration input (a regular file of
    at most 64 MiB: `specwatch.common.boundedfile`); binary garbage becomes a ConfigError,
    not a traceback."""
    data = boundedfile.read_bytes(path, boundedfile.CALIBRATION_INPUT)
    if b"\x00" in data:
        raise ConfigError(f"{path}: binary data; expected a vllm bench serve JSON or a CSV file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.start}); expected JSON or CSV"
        ) from None


def detect_format(path: Path, text: str) -> str:
    """Return "bench-json", "csv" or "sweep-csv" from the content of a file."""
    stripped = text.lstrip()
    if not stripped:
        raise ConfigError(f"{path}: empty file; expected a vllm bench serve JSON or a CSV file")
    if stripped[0] in "{[":
        return "bench-json"
    header = _csv_header(path, text)
    names = {h.strip() for h in header}
    if set(CSV_REQUIRED) <= names:
        return "csv"
    if set(SWEEP_REQUIRED) <= names:
        return "sweep-csv"
    shown = ", ".join(h for h in header[:8] if h) or "nothing"
    raise ConfigError(
        f"{path}: neither a vllm bench serve result (JSON) nor a calibration CSV: the first line"
        f" has {shown}; a CSV needs the columns {', '.join(CSV_REQUIRED)}"
        f" (optional: {', '.join(CSV_OPTIONAL)})"
    )


def _csv_header(path: Path, text: str) -> list[str]:
    reader = csv.reader(io.StringIO(text))
    with csv_errors(path, reader):
        first = next(reader, [])
    return [c.strip() for c in first]


@contextmanager
def csv_errors(path: Path, reader: Any) -> Iterator[None]:
    """A malformed CSV row (a field over the csv module's 128 KiB limit, a NUL, a stray quote)
    is one ConfigError naming the file and row, not a ``_csv.Error`` traceback."""
    try:
        yield
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            # raised before the reader counts the line it was reading
            limit = csv.field_size_limit() // 1024
            raise ConfigError(f"{path} row {reader.line_num + 1}: a field is longer than "
                              f"{limit} KiB; a calibration CSV holds numbers and short "
                              f"names") from None
        raise ConfigError(f"{path} row {reader.line_num}: not valid CSV: {exc}") from None


def csv_rows(path: Path, text: str) -> tuple[csv.DictReader[str], Iterator[dict[str, Any]]]:
    """A DictReader over ``text`` (its header read, names stripped) and its rows, each read
    under :func:`csv_errors`."""
    reader = csv.DictReader(io.StringIO(text))
    with csv_errors(path, reader):
        reader.fieldnames = [f.strip() for f in (reader.fieldnames or [])]

    def rows() -> Iterator[dict[str, Any]]:
        while True:
            with csv_errors(path, reader):
                row = next(reader, None)
            if row is None:
                return
            yield row

    return reader, rows()


def json_documents(path: Path, text: str) -> list[tuple[str, Any]]:
    """Parse one JSON document, a list of runs, or `--append-result` output (one per line);
    nesting bounded and duplicate keys refused (`specwatch.common.boundedfile.load_json`)."""
    try:
        doc = boundedfile.load_json(text, str(path))
    except json.JSONDecodeError as first_error:
        docs: list[tuple[str, Any]] = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                docs.append((where, boundedfile.load_json(line, where)))
            except json.JSONDecodeError as exc:
                if number == 1 and not docs:
                    raise ConfigError(
                        f"{path}: invalid JSON at line {first_error.lineno} column"
                        f" {first_error.colno}: {first_error.msg}"
                    ) from None
                raise ConfigError(
                    f"{path} line {number}: invalid JSON at column {exc.colno}: {exc.msg}"
                ) from None
        return docs
    if isinstance(doc, list):
        return [(f"{path} entry {i}", d) for i, d in enumerate(doc, start=1)]
    return [(str(path), doc)]
