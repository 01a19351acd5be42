"""Readers for `specwatch calibrate`: turn benchmark files into measurement points.

Every reader returns :class:`Point` objects, one per steady measurement (a benchmark run, a CSV
row, a Prometheus window), so the fitting code never sees a file format. The file-level
parsing (text, format by content, number fields) is `calibrate.inputfiles`; every reader
applies `validate_point`, so each format is held to the same checks in the same words.

Bad input never becomes a silent gap in the fit: every reader raises
:class:`specwatch.common.errors.ConfigError` naming the file, the row and what was expected.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specwatch.calibrate.inputfiles import (
    CSV_REQUIRED,
    csv_rows,
    detect_format,
    json_documents,
    need,
    number,
    read_text,
)
from specwatch.common.errors import ConfigError

#: Most runs (rows, JSON lines) calibrate reads: 10^5 runs fit in about 20 s and 400 MiB
#: (bench/bench_calibrate.py); every run past that costs memory before any fit starts.
MAX_RUNS = 100_000

#: Name given to the system of inputs that do not say which system they measured.
DEFAULT_SYSTEM = "default"

#: A run with fewer requests than this many per concurrency slot is transient: it is mostly
#: ramp-up and drain (n = c sends every request at once), so its n / duration is set by its
#: slowest requests, not by a sustained arrival rate.
STEADY_REQUESTS_PER_SLOT = 2.0

#: Slack when checking 1 <= E <= k + 1: vLLM rounds nothing, but CSV files often carry E with
#: two decimals, and the runtime counts the bonus token of a truncated final step.
_ACCEPTANCE_SLACK = 1e-6


#: Methods of the sweep layout that mean "SD off".
_SWEEP_NO_SD = {"nosd", "none", "no_sd", "baseline", ""}

#: `--metadata` keys of `vllm bench serve` that specwatch reads (all optional).
BENCH_META_DRAFT_LENGTH = ("draft_length", "num_speculative_tokens", "spec_tokens")


@dataclass(frozen=True)
class Point:
    """One steady measurement of a serving system: the inputs of one row of the fit.

    `draft_length` is 0 for runs without SD; `acceptance_length` is then 1. Optional fields are
    None when the input did not carry them (the fit says what that costs).
    """

    source: str
    system: str
    arrival_rate: float
    latency_s: float
    draft_length: float
    acceptance_length: float | None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    concurrency: float | None = None
    dataset: str | None = None
    ttft_s: float | None = None
    per_position: tuple[float, ...] | None = None
    notes: tuple[str, ...] = field(default=())
    #: What the server of this run said about its capacity (facts, not fitted): its KV
    #: cache in tokens (vllm:cache_config_info) and --max-num-seqs; None when not stated.
    kv_cache_tokens: float | None = None
    max_num_seqs: float | None = None
    #: Requests the run completed (bench `n`, `completed`); None when not stated.
    requests: float | None = None

    @property
    def sd(self) -> bool:
        """True when the run used speculative decoding."""
        return self.draft_length > 0

    @property
    def in_flight(self) -> float:
        """Little's law B = λ·L: the mean number of requests in the system."""
        return self.arrival_rate * self.latency_s

    @property
    def slots(self) -> float:
        """Requests the run served at once: its concurrency, else its requests in flight."""
        return self.concurrency if self.concurrency else self.in_flight

    @property
    def transient(self) -> bool:
        """Fewer than STEADY_REQUESTS_PER_SLOT requests per slot: the run never reached a
        steady state (False when its request count is not stated)."""
        return self.requests is not None and \
            self.requests < STEADY_REQUESTS_PER_SLOT * self.slots


@dataclass(frozen=True)
class BenchOptions:
    """Per-file overrides for bench results: `--draft-length K FILE`, `--no-sd FILE`."""

    draft_length: int | None = None
    no_sd: bool = False


# --------------------------------------------------------------------------------------------
# validation


def validate_point(point: Point) -> Point:
    """Reject physically impossible points with a message naming their source.

    Why here and not in the fit: a negative latency or an acceptance length above k + 1 means the
    file is broken (wrong column, wrong unit); fitting it would hide that behind a bad R².
    """
    where = point.source
    if point.latency_s <= 0:
        raise ConfigError(f"{where}: latency must be > 0 s, got {point.latency_s:g}")
    if point.arrival_rate < 0:
        raise ConfigError(f"{where}: arrival rate must be >= 0 req/s, got {point.arrival_rate:g}")
    k = point.draft_length
    if k < 0:
        raise ConfigError(f"{where}: draft length must be >= 0 (0 = no SD), got {k:g}")
    e = point.acceptance_length
    if e is not None:
        if k == 0 and abs(e - 1.0) > _ACCEPTANCE_SLACK:
            raise ConfigError(
                f"{where}: acceptance length {e:g} given for a run without SD (draft length 0);"
                " expected 1 or empty"
            )
        if e < 1.0 - _ACCEPTANCE_SLACK:
            raise ConfigError(f"{where}: acceptance length must be >= 1 (bonus token), got {e:g}")
        if e > k + 1 + _ACCEPTANCE_SLACK:
            raise ConfigError(
                f"{where}: acceptance length {e:g} is above draft length + 1 = {k + 1:g};"
                " E counts tokens per verify cycle, bonus included, so it cannot exceed k + 1"
            )
    for name, value in (
        ("prompt tokens", point.prompt_tokens),
        ("concurrency", point.concurrency),
        ("TTFT", point.ttft_s),
    ):
        if value is not None and value < 0:
            raise ConfigError(f"{where}: {name} must be >= 0, got {value:g}")
    if point.generation_tokens is not None and point.generation_tokens < 1:
        raise ConfigError(
            f"{where}: generation tokens must be >= 1 per request, got {point.generation_tokens:g}"
        )
    return point


# --------------------------------------------------------------------------------------------
# plain CSV


def read_csv(path: Path, text: str, default_system: str | None) -> list[Point]:
    """Read the plain calibration CSV (columns documented in CSV_REQUIRED / CSV_OPTIONAL).

    A no-SD row (draft_length 0) whose `system` cell is empty, in a file whose SD rows name
    their systems, belongs to every one of those systems: a per-drafter fit is "the no-SD runs
    plus one drafter's runs", and the no-SD runs are measured once.
    """
    reader, rows = csv_rows(path, text)
    fields = list(reader.fieldnames or [])
    missing = [c for c in CSV_REQUIRED if c not in fields]
    if missing:
        raise ConfigError(f"{path}: missing required column(s) {', '.join(missing)}")
    raw_points: list[tuple[Point, bool]] = []
    for row in rows:
        where = f"{path} row {reader.line_num}"
        if None in row:
            raise ConfigError(f"{where}: more cells than header columns")
        if all((v or "").strip() == "" for v in row.values()):
            continue
        k = number(row.get("draft_length"), where, "draft_length", required=True)
        assert k is not None
        e = number(row.get("acceptance_length"), where, "acceptance_length", required=False)
        if k == 0 and e is None:
            e = 1.0
        system_cell = (row.get("system") or "").strip()
        point = Point(
            source=where,
            system=system_cell or (default_system or DEFAULT_SYSTEM),
            arrival_rate=_req(row, where, "arrival_rate"),
            latency_s=_req(row, where, "latency_s"),
            draft_length=k,
            acceptance_length=e,
            prompt_tokens=number(row.get("prompt_tokens"), where, "prompt_tokens", required=False),
            generation_tokens=number(
                row.get("generation_tokens"), where, "generation_tokens", required=False
            ),
            concurrency=number(row.get("concurrency"), where, "concurrency", required=False),
            dataset=(row.get("dataset") or "").strip() or None,
            ttft_s=number(row.get("ttft_s"), where, "ttft_s", required=False),
        )
        raw_points.append((validate_point(point), bool(system_cell)))
    if not raw_points:
        raise ConfigError(f"{path}: no data rows under the header")
    named_sd_systems = sorted({p.system for p, named in raw_points if named and p.sd})
    points: list[Point] = []
    for point, named in raw_points:
        if not point.sd and not named and named_sd_systems:
            points.extend(replace(point, system=s) for s in named_sd_systems)
        else:
            points.append(point)
    return points


def _req(row: Mapping[str, str], where: str, name: str) -> float:
    value = number(row.get(name), where, name, required=True)
    assert value is not None
    return value


# --------------------------------------------------------------------------------------------
# the public Qwen3-32B sweep layout


def read_sweep_csv(path: Path, text: str, default_system: str | None) -> list[Point]:
    """Read the sd-validation sweep layout (one `vllm bench serve` run per row).

    Mapping: arrival rate = n / dur when both are present (that is exactly how vLLM computes
    request_throughput; `req_tp` was printed with two decimals, 3% off at concurrency 1), else
    req_tp; latency = e2e_latency_s_est; k; E = acc_len (1 without SD); p, g = mean_prompt_tok,
    mean_out_tok; concurrency = conc; TTFT = ttft / 1000. The system is "<target>+<draft>",
    and the no-SD rows belong to every drafter's system.
    """
    reader, csv_lines = csv_rows(path, text)
    rows: list[tuple[Point, bool]] = []
    for row in csv_lines:
        where = f"{path} row {reader.line_num}"
        if None in row:
            raise ConfigError(f"{where}: more cells than header columns")
        if all((v or "").strip() == "" for v in row.values()):
            continue
        method = (row.get("method") or "").strip().lower()
        k = _req(row, where, "k")
        sd = method not in _SWEEP_NO_SD
        if sd and k <= 0:
            raise ConfigError(f"{where}: method {method!r} is SD but k = {k:g}; expected k >= 1")
        if not sd and k != 0:
            raise ConfigError(f"{where}: method {method!r} is no-SD but k = {k:g}; expected 0")
        n = number(row.get("n"), where, "n", required=False)
        dur = number(row.get("dur"), where, "dur", required=False)
        rate = n / dur if n is not None and dur else _req(row, where, "req_tp")
        ttft_ms = number(row.get("ttft"), where, "ttft", required=False)
        target = (row.get("target") or "").strip()
        draft = (row.get("draft") or "").strip()
        short_target = target.rsplit("/", 1)[-1] if target else ""
        if sd:
            system = f"{short_target}+{draft}" if short_target else draft or method
        else:
            system = short_target or (default_system or DEFAULT_SYSTEM)
        point = Point(
            source=where,
            system=system,
            arrival_rate=rate,
            latency_s=_req(row, where, "e2e_latency_s_est"),
            draft_length=k,
            acceptance_length=_req(row, where, "acc_len") if sd else 1.0,
            prompt_tokens=_req(row, where, "mean_prompt_tok"),
            generation_tokens=_req(row, where, "mean_out_tok"),
            concurrency=_req(row, where, "conc"),
            dataset=(row.get("dataset") or "").strip() or None,
            ttft_s=ttft_ms / 1000.0 if ttft_ms is not None else None,
            per_position=_sweep_profile(row.get("per_pos"), where, k) if sd else None,
            requests=n,
        )
        rows.append((validate_point(point), sd))
    if not rows:
        raise ConfigError(f"{path}: no data rows under the header")
    drafters = sorted({p.system for p, sd in rows if sd})
    points: list[Point] = []
    for point, sd in rows:
        if not sd and drafters:
            points.extend(replace(point, system=s) for s in drafters)
        else:
            points.append(point)
    return points


def _sweep_profile(raw: str | None, where: str, k: float) -> tuple[float, ...] | None:
    """Per-position acceptance "63.19;35.40;..." in percent -> fractions (None when absent)."""
    if raw is None or not raw.strip():
        return None
    values = []
    for cell in raw.split(";"):
        value = number(cell, where, "per_pos", required=True)
        assert value is not None
        values.append(value / 100.0)
    return _check_profile(tuple(values), where, k)


def _check_profile(values: tuple[float, ...], where: str, k: float) -> tuple[float, ...]:
    if len(values) != k:
        raise ConfigError(
            f"{where}: {len(values)} per-position acceptance rates for draft length {k:g}"
        )
    for i, v in enumerate(values):
        if not 0.0 <= v <= 1.0 + _ACCEPTANCE_SLACK:
            raise ConfigError(
                f"{where}: per-position acceptance at position {i} is {v:g}; expected 0..1"
            )
    return values


# --------------------------------------------------------------------------------------------
# vllm bench serve --save-result JSON


def read_bench_json(
    path: Path, text: str, default_system: str | None, options: BenchOptions | None = None
) -> list[Point]:
    """Read `vllm bench serve --save-result` output (also `--append-result` JSON lines).

    Field names are those of vllm/benchmarks/serve.py: request_throughput, completed, failed,
    total_input_tokens, total_output_tokens, mean_e2el_ms (only when `--percentile-metrics`
    includes e2el; otherwise the mean of the per-request `latencies` of successful requests),
    mean_ttft_ms, max_concurrency, and the spec_decode_* fields vLLM adds when the server
    exposes SD metrics. `--metadata draft_length=K`, `system=NAME`, `dataset=NAME` are read too.
    The system is `--metadata system=NAME`, else ``default_system`` (``--system``), else the
    result's `model_id` (the served model).
    """
    options = options or BenchOptions()
    docs = json_documents(path, text)
    if not docs:
        raise ConfigError(f"{path}: empty JSON; expected vllm bench serve results")
    return [
        validate_point(_bench_point(where, doc, default_system, options)) for where, doc in docs
    ]


def _bench_point(where: str, doc: Any, default_system: str | None, options: BenchOptions) -> Point:
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a JSON object (one vllm bench serve result)")
    missing = [
        key
        for key in ("request_throughput", "completed", "total_input_tokens", "total_output_tokens")
        if key not in doc
    ]
    if missing:
        raise ConfigError(
            f"{where}: not a vllm bench serve result: missing {', '.join(missing)}"
            " (save it with `vllm bench serve --save-result`)"
        )
    completed = number(doc["completed"], where, "completed", required=True)
    assert completed is not None
    if completed <= 0:
        raise ConfigError(f"{where}: completed = {completed:g}; a run without finished requests")
    rate = number(doc["request_throughput"], where, "request_throughput", required=True)
    assert rate is not None
    latency_s = _bench_latency(where, doc)
    p = number(doc["total_input_tokens"], where, "total_input_tokens", required=True)
    g = number(doc["total_output_tokens"], where, "total_output_tokens", required=True)
    assert p is not None and g is not None
    k, e, notes = _bench_sd(where, doc, options)
    profile = None
    positions = doc.get("spec_decode_per_position_acceptance_rates")
    if k > 0 and isinstance(positions, list) and positions:
        name = "spec_decode_per_position_acceptance_rates[]"
        profile = _check_profile(tuple(need(v, where, name) for v in positions), where, k)
    ttft_ms = number(doc.get("mean_ttft_ms"), where, "mean_ttft_ms", required=False)
    # --metadata system=NAME, else --system, else the served model vLLM recorded.
    system = (str(doc.get("system") or "").strip() or default_system
              or str(doc.get("model_id") or "").strip() or DEFAULT_SYSTEM)
    return Point(
        source=where,
        system=system,
        arrival_rate=rate,
        latency_s=latency_s,
        draft_length=float(k),
        acceptance_length=e,
        prompt_tokens=p / completed,
        generation_tokens=g / completed,
        concurrency=number(doc.get("max_concurrency"), where, "max_concurrency", required=False),
        dataset=str(doc.get("dataset") or doc.get("dataset_name") or "").strip() or None,
        ttft_s=ttft_ms / 1000.0 if ttft_ms is not None else None,
        per_position=profile,
        notes=notes,
        requests=completed,
    )


def _bench_latency(where: str, doc: Mapping[str, Any]) -> float:
    """Mean end-to-end latency in seconds: mean_e2el_ms, else the mean of successful latencies."""
    if doc.get("mean_e2el_ms") is not None:
        value = number(doc["mean_e2el_ms"], where, "mean_e2el_ms", required=True)
        assert value is not None
        return value / 1000.0
    latencies = doc.get("latencies")
    if not isinstance(latencies, list) or not latencies:
        raise ConfigError(
            f"{where}: no end-to-end latency: neither mean_e2el_ms (add e2el to"
            " `--percentile-metrics`) nor per-request `latencies`"
        )
    values = [number(v, where, "latencies[]", required=True) for v in latencies]
    errors = doc.get("errors")
    if isinstance(errors, list) and len(errors) == len(values):
        # --save-detailed: keep exactly the successful requests.
        kept = [v for v, err in zip(values, errors, strict=True) if not err]
    elif int(doc.get("failed") or 0) > 0:
        # Without --save-detailed vLLM drops `errors`; a failed request has latency 0.
        kept = [v for v in values if v and v > 0]
    else:
        kept = values
    kept_values = [v for v in kept if v is not None]
    if not kept_values:
        raise ConfigError(f"{where}: every request in `latencies` failed")
    return sum(kept_values) / len(kept_values)


def _bench_sd(
    where: str, doc: Mapping[str, Any], options: BenchOptions
) -> tuple[int, float | None, tuple[str, ...]]:
    """Draft length and acceptance length of one run: from the file, checked against options."""
    has_sd_fields = doc.get("spec_decode_acceptance_length") is not None
    file_k: int | None = None
    positions = doc.get("spec_decode_per_position_acceptance_rates")
    if isinstance(positions, list) and positions:
        file_k = len(positions)
    elif doc.get("spec_decode_num_drafts") and doc.get("spec_decode_draft_tokens") is not None:
        drafts = need(doc["spec_decode_num_drafts"], where, "spec_decode_num_drafts")
        tokens = need(doc["spec_decode_draft_tokens"], where, "spec_decode_draft_tokens")
        file_k = round(tokens / drafts) if drafts > 0 else None
    meta_k: int | None = None
    for key in BENCH_META_DRAFT_LENGTH:
        if doc.get(key) not in (None, ""):
            value = number(doc[key], where, f"metadata {key}", required=True)
            assert value is not None
            if value < 0 or value != int(value):
                raise ConfigError(f"{where}: metadata {key} must be an integer >= 0, got {value:g}")
            meta_k = int(value)
            break
    if options.no_sd:
        if has_sd_fields or file_k:
            raise ConfigError(
                f"{where}: --no-sd given, but the file has spec_decode_* results (SD was on)"
            )
        return 0, 1.0, ()
    k = options.draft_length if options.draft_length is not None else meta_k
    if k is not None and file_k is not None and k != file_k:
        raise ConfigError(
            f"{where}: draft length {k} given, but the file's SD counters say {file_k}"
            " (draft tokens per draft / number of per-position rates)"
        )
    if k is None:
        k = file_k
    notes: tuple[str, ...] = ()
    if k is None:
        if has_sd_fields:
            raise ConfigError(
                f"{where}: SD results without a draft length; pass --draft-length K {where}"
            )
        k = 0
        notes = (
            "no spec_decode_* fields: treated as a run without SD (use --draft-length if not)",
        )
    if k == 0:
        if has_sd_fields:
            raise ConfigError(f"{where}: draft length 0 given, but the file has SD results")
        return 0, 1.0, notes
    e = None
    if has_sd_fields:
        e = need(doc["spec_decode_acceptance_length"], where, "spec_decode_acceptance_length")
    return k, e, notes


# --------------------------------------------------------------------------------------------
# entry point


def read_inputs(
    paths: Sequence[str | os.PathLike[str]],
    *,
    default_system: str | None = None,
    bench_options: Mapping[str, BenchOptions] | None = None,
) -> list[Point]:
    """Read every input file (format by content) into one list of points."""
    bench_options = dict(bench_options or {})
    points: list[Point] = []
    runs = 0
    for raw in paths:
        path = Path(raw)
        text = read_text(path)
        kind = detect_format(path, text)
        # a CSV's runs are at most its lines less its header (counted before they are read);
        # a bench JSON's are its documents (counted as read: its size bounds them)
        runs += text.count("\n") - 1 if kind != "bench-json" else 0
        if runs > MAX_RUNS:
            raise _too_many_runs(path)
        if kind == "bench-json":
            options = bench_options.get(str(raw)) or bench_options.get(str(path))
            read = read_bench_json(path, text, default_system, options)
            runs += len(read)
            points.extend(read)
        elif kind == "csv":
            _reject_bench_options(raw, bench_options)
            points.extend(read_csv(path, text, default_system))
        else:
            _reject_bench_options(raw, bench_options)
            points.extend(read_sweep_csv(path, text, default_system))
        if runs > MAX_RUNS:
            raise _too_many_runs(path)
    return points


def _too_many_runs(path: Path) -> ConfigError:
    return ConfigError(
        f"{path}: the inputs hold more than {MAX_RUNS} runs, more than calibrate fits within "
        f"its time and memory bounds; average the repeated runs of each configuration (same "
        f"draft length, concurrency and lengths) into one row, or calibrate one system at a "
        f"time from its own files")


def _reject_bench_options(raw: str | os.PathLike[str], options: Mapping[str, BenchOptions]) -> None:
    if str(raw) in options:
        raise ConfigError(
            f"{raw}: --draft-length/--no-sd apply to vllm bench serve JSON files; this file is a"
            " CSV, whose draft_length column says it"
        )


def systems_of(points: Iterable[Point]) -> list[str]:
    """The distinct systems, in first-seen order."""
    seen: dict[str, None] = {}
    for p in points:
        seen.setdefault(p.system, None)
    return list(seen)
