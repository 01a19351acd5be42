"""The calibration workflow behind `specwatch calibrate`: gather the points (benchmark files,
Prometheus history, measured pairs and switches), fit each system, write the parameters files,
report, and compare with an earlier fit.

Inputs are detected by content: `vllm bench serve --save-result` JSON (also `--append-result`
JSON lines), the calibration CSV, or the public sweep layout (tests/fixtures/sd-validation/).
The modules behind it: ``inputs`` (readers), ``prometheus`` and ``measured`` (history),
``fit`` and ``load_range`` (the fits), ``report`` (JSON, tables, plots, drift). The options
are declared in :mod:`specwatch.cli.calibrate`, which hands them over as a
:class:`CalibrateRequest`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specwatch.calibrate.inputs import BenchOptions, Point, read_inputs, systems_of
from specwatch.common import boundedfile
from specwatch.common.errors import ConfigError
from specwatch.model.closed_form import MAX_DRAFT_LENGTH


@dataclass(frozen=True)
class CalibrateRequest:
    """One calibration as the command line states it (option names: docs/cli.md)."""

    inputs: list[str]
    out: str | None = None
    system: str | None = None
    max_utilization: float = 0.9
    max_concurrency: float | None = None
    max_ttft_ratio: float | None = 5.0
    vif_limit: float = 1000.0
    model: str = "saturation"
    report: str | None = None
    as_json: bool = False
    draft_length: list[tuple[str, str]] = field(default_factory=list)  # (K, FILE)
    no_sd: list[str] = field(default_factory=list)
    kv_cache_tokens: float | None = None
    kv_cache_tokens_sd: float | None = None
    max_num_seqs: float | None = None
    prometheus: str | None = None
    start: str | None = None
    end: str = "now"
    step: str = "60s"
    selector: str = ""
    min_window: str = "5m"
    point_sources: str = "vllm"
    timeout: float = 30.0
    compare: str | None = None
    tolerance: float = 0.10
    reference: str | None = None


def _bench_options(req: CalibrateRequest) -> dict[str, BenchOptions]:
    out: dict[str, BenchOptions] = {}
    for k_text, path in req.draft_length:
        text = k_text.strip()
        if not (text.isdecimal() and len(text) <= 3 and int(text) <= MAX_DRAFT_LENGTH):
            raise ConfigError(f"--draft-length {k_text} {path}: K must be an integer in "
                              f"[0, {MAX_DRAFT_LENGTH}]")
        k = int(text)
        if path in out:
            raise ConfigError(f"{path}: given twice in --draft-length/--no-sd")
        out[path] = BenchOptions(draft_length=k, no_sd=k == 0)
    for path in req.no_sd:
        if path in out:
            raise ConfigError(f"{path}: given twice in --draft-length/--no-sd")
        out[path] = BenchOptions(no_sd=True)
    return out


def _params_file(path: str) -> bool:
    """True when `path` looks like a parameters file (YAML mapping with `coefficients`)."""
    try:
        doc = boundedfile.read_yaml(path, boundedfile.PARAMETERS)
    except ConfigError:
        return False
    return isinstance(doc, dict) and "coefficients" in doc


def calibrate(req: CalibrateRequest) -> int:
    """Fit, report, write; with --compare the exit status is the drift verdict."""
    from specwatch.calibrate import report as report
    from specwatch.model.params import load_params

    if (
        req.compare
        and not req.prometheus
        and len(req.inputs) == 1
        and _params_file(req.inputs[0])
    ):
        drift = report.compare_params(
            load_params(req.compare), load_params(req.inputs[0]), req.tolerance
        )
        if req.as_json:
            print(json.dumps({"compare": drift.to_json()}, indent=2, allow_nan=False))
        else:
            report.print_drift(drift)
        return 1 if drift.drifted else 0
    if req.reference and req.compare:
        raise ConfigError("--reference and --compare: give one (compare the file --reference"
                          " writes in a second run)")
    if req.reference and req.report:
        raise ConfigError("--reference writes no --report directory; --json prints its whole"
                          " report")
    if req.reference:
        ignored = _full_fit_options(req)
        if ignored:
            raise ConfigError(f"--reference keeps the reference's load range and form; "
                              f"{', '.join(ignored)} only shape a full fit: drop "
                              f"{'it' if len(ignored) == 1 else 'them'}")
    old = load_params(req.compare) if req.compare else None

    points = _gather(req)
    if req.reference:
        return _calibrate_from_reference(req, points)
    fits = _fit_all(req, points)
    written: dict[str, str] = {}
    pending_error: ConfigError | None = None
    if req.out:
        written, pending_error = _write_params(req, fits)
    drift = None
    if old is not None:
        drift = _drift_against(old, fits, req, report)
    doc: dict[str, Any] = {
        "systems": {f.system: report.system_json(f) for f in fits},
        "point_sources": point_sources(points),
        "written": written,
        "compare": drift.to_json() if drift is not None else None,
    }
    if req.report:
        report.write_report_dir(Path(req.report), fits, doc, drift)
    if req.as_json:
        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        report.print_report(fits, written, drift)
        for system, counts in point_sources(points).items():
            print(f"points of {system}: " + ", ".join(f"{n} from {kind}"
                                                      for kind, n in counts.items()))
    if pending_error is not None:
        raise pending_error
    if drift is not None and drift.drifted:
        return 1
    return 0


def _calibrate_from_reference(req: CalibrateRequest, points: list[Point]) -> int:
    """`--reference`: the reference's form scaled to the points (`calibrate.reference`)."""
    from specwatch.calibrate import reference
    from specwatch.calibrate.report import slug
    from specwatch.model.params import dump_params, load_params

    ref = load_params(req.reference)
    systems = _select_systems(req, points)
    if len(systems) > 1:
        names = ", ".join(repr(n) for n in systems)
        raise ConfigError(f"--reference: the inputs hold {len(systems)} systems ({names});"
                          " choose one with --system")
    (system, pts), = systems.items()
    rf = reference.fit_from_reference(system, pts, ref, req.reference, _data_sources(req))
    written: str | None = None
    if req.out:
        path = Path(req.out.replace("{system}", slug(system)))
        if path.parent and not path.parent.exists():
            raise ConfigError(f"--out {req.out}: directory {path.parent} does not exist")
        try:
            dump_params(rf.params, path)
        except OSError as exc:
            raise ConfigError(f"--out {path}: cannot write: {exc.strerror or exc}") from None
        written = str(path)
    doc = {"systems": {system: rf.to_json()}, "point_sources": point_sources(pts),
           "written": {system: written} if written else {}}
    if req.as_json:
        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        print("\n".join(reference.report_lines(rf, written)))
    return 0


def point_sources(points: list[Point]) -> dict[str, dict[str, int]]:
    """How many points of each system came from where: ``files`` (bench JSON, CSV),
    ``vllm`` (steady windows of vLLM's Prometheus history), ``pairs`` (the exporter's
    measured A/B pairs) and ``switches`` (the controller's before/after switch records)."""
    from specwatch.calibrate.measured import sources_of

    return sources_of(points)


def _gather(req: CalibrateRequest) -> list[Point]:
    options = _bench_options(req)
    paths = list(req.inputs)
    for path in options:
        if path not in paths:
            paths.append(path)
    points = read_inputs(paths, default_system=req.system, bench_options=options)
    if req.prometheus:
        from specwatch.calibrate.prometheus import SOURCE, PrometheusQuery, read_prometheus

        if not req.start:
            raise ConfigError("--prometheus needs --start (and optionally --end)")
        query = PrometheusQuery.from_args(
            url=req.prometheus,
            start=req.start,
            end=req.end,
            step=req.step,
            selector=req.selector,
            min_window=req.min_window,
            timeout=req.timeout,
        )
        sources = [x.strip() for x in req.point_sources.split(",") if x.strip()]
        unknown = sorted(set(sources) - {SOURCE, "pairs", "switches"})
        if unknown or not sources:
            raise ConfigError(f"--point-sources: expected a comma-separated list of vllm,"
                              f" pairs, switches; got {req.point_sources!r}")
        if SOURCE in sources:
            points.extend(read_prometheus(query, progress=not req.as_json))
        if "pairs" in sources:
            from specwatch.calibrate.measured import read_pair_points

            points.extend(read_pair_points(query))
        if "switches" in sources:
            from specwatch.calibrate.measured import read_switch_points

            points.extend(read_switch_points(query))
    elif req.start or req.selector:
        raise ConfigError("--start/--end/--selector need --prometheus URL")
    points = [_stated(p, req) for p in points]
    if not points:
        raise ConfigError(
            "no input: give benchmark files (vllm bench serve JSON, CSV) or --prometheus URL"
        )
    return points


def _stated(point: Point, req: CalibrateRequest) -> Point:
    """The point with the capacity the flags state, where it states none itself."""
    kv = req.kv_cache_tokens_sd if point.sd else req.kv_cache_tokens
    changes: dict[str, float] = {}
    if point.kv_cache_tokens is None and kv is not None:
        changes["kv_cache_tokens"] = kv
    if point.max_num_seqs is None and req.max_num_seqs is not None:
        changes["max_num_seqs"] = req.max_num_seqs
    return dataclasses.replace(point, **changes) if changes else point


def _select_systems(req: CalibrateRequest, points: list[Point]) -> dict[str, list[Point]]:
    by_system: dict[str, list[Point]] = defaultdict(list)
    for p in points:
        by_system[p.system].append(p)
    names = systems_of(points)
    if not req.system:
        return {n: by_system[n] for n in names}
    if req.system in by_system:
        return {req.system: by_system[req.system]}
    matches = [n for n in names if req.system.lower() in n.lower()]
    if len(matches) == 1:
        return {matches[0]: by_system[matches[0]]}
    if len(names) == 1:
        return {req.system: by_system[names[0]]}
    listed = ", ".join(repr(n) for n in names)
    if matches:
        raise ConfigError(f"--system {req.system!r} matches several systems: {listed}")
    raise ConfigError(
        f"--system {req.system!r} matches none of the systems in the inputs: {listed}"
    )


def _full_fit_options(req: CalibrateRequest) -> list[str]:
    """The full fit's filters the user changed from their defaults (a reference fit reads none)."""
    defaults = CalibrateRequest(inputs=[])
    names = {"max_utilization": "--max-utilization", "max_concurrency": "--max-concurrency",
             "max_ttft_ratio": "--max-ttft-ratio", "vif_limit": "--vif-limit",
             "model": "--model"}
    return [flag for attr, flag in names.items()
            if getattr(req, attr) != getattr(defaults, attr)]


def _fit_all(req: CalibrateRequest, points: list[Point]) -> list[Any]:
    from specwatch.calibrate.fit import FitError, FitOptions, fit_system
    from specwatch.calibrate.load_range import fit_system_saturation

    fitter = fit_system_saturation if req.model == "saturation" else fit_system

    options = FitOptions(
        max_utilization=req.max_utilization,
        max_concurrency=req.max_concurrency,
        max_ttft_ratio=req.max_ttft_ratio,
        vif_limit=req.vif_limit,
    )
    fits = []
    for name, pts in _select_systems(req, points).items():
        try:
            fits.append(fitter(name, pts, options))
        except FitError as exc:
            raise ConfigError(str(exc)) from None
    for fit in fits:
        for note in sorted({n for p in fit.points for n in p.notes}):
            print(f"specwatch calibrate: note: {note}", file=sys.stderr)
    return fits


def _fit_options(req: CalibrateRequest) -> dict[str, Any]:
    return {
        "model": req.model,
        "max_utilization": req.max_utilization,
        "max_concurrency": req.max_concurrency,
        "max_ttft_ratio": req.max_ttft_ratio,
    }


def _data_sources(req: CalibrateRequest) -> list[str]:
    data = [str(p) for p in req.inputs]
    data += [p for _, p in req.draft_length if p not in data]
    data += [p for p in req.no_sd if p not in data]
    if req.prometheus:
        sel = f"{{{req.selector}}}" if req.selector else ""
        data.append(f"prometheus {req.prometheus} {sel} {req.start}..{req.end} step {req.step}")
    return data


def _write_params(
    req: CalibrateRequest, fits: list[Any]
) -> tuple[dict[str, str], ConfigError | None]:
    from specwatch.calibrate import report as report
    from specwatch.model.params import dump_params

    per_system = "{system}" in req.out
    if not per_system and len(fits) > 1:
        names = ", ".join(repr(f.system) for f in fits)
        raise ConfigError(
            f"the inputs hold {len(fits)} systems ({names}); choose one with --system or put"
            " '{system}' in --out to write one file per system"
        )
    written: dict[str, str] = {}
    refused: list[str] = []
    for fit in fits:
        path = Path(req.out.replace("{system}", report.slug(fit.system)))
        if fit.coefficients is None:
            why = fit.fallback_reason or "no six-coefficient fit"
            refused.append(
                f"{fit.system}: not writing {path}: {why}"
                " (the report above has per-configuration speedup and break-even)"
            )
            continue
        params = report.build_params(
            fit, system_name=fit.system, data=_data_sources(req), options=_fit_options(req)
        )
        if path.parent and not path.parent.exists():
            raise ConfigError(f"--out {req.out}: directory {path.parent} does not exist")
        try:
            dump_params(params, path)
        except OSError as exc:  # /proc, a read-only or full file system, no permission
            raise ConfigError(f"--out {path}: cannot write: {exc.strerror or exc}") from None
        written[fit.system] = str(path)
    return written, ConfigError("; ".join(refused)) if refused else None


def _drift_against(old: Any, fits: list[Any], req: CalibrateRequest, report: Any) -> Any:
    candidates = [f for f in fits if f.coefficients is not None]
    if not candidates:
        raise ConfigError("--compare needs a six-coefficient fit; the data allowed none")
    if len(candidates) > 1:
        matching = [f for f in candidates if f.system == old.system]
        if len(matching) != 1:
            raise ConfigError(
                f"--compare: the inputs hold several systems; choose the one matching"
                f" {old.system!r} with --system"
            )
        candidates = matching
    fit = candidates[0]
    new = report.build_params(
        fit, system_name=fit.system, data=_data_sources(req), options=_fit_options(req)
    )
    return report.compare_params(old, new, req.tolerance)
