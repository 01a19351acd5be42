"""`specwatch calibrate`: fit the latency model's coefficients from benchmarks or Prometheus.

    specwatch calibrate INPUT... --out params.yaml [--system NAME] [--max-utilization 0.9]
                        [--max-concurrency N] [--max-ttft-ratio R|off] [--report DIR] [--json]
                        [--draft-length K FILE]... [--no-sd FILE]...
                        [--prometheus URL --start T --end T [--step S] [--selector SEL]]
                        [--compare OLD.yaml [--tolerance 0.1]]
    specwatch calibrate --compare OLD.yaml NEW.yaml

Inputs are detected by content: `vllm bench serve --save-result` JSON (also `--append-result`
JSON lines), the calibration CSV, or the public sweep layout (tests/fixtures/sd-validation/).
The modules behind it: calibrate_inputs (readers), calibrate_prometheus (history), calibrate_fit
(NNLS, identifiability, leave-one-k-out), calibrate_report (JSON, tables, plots, drift).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from specwatch.calibrate.inputs import BenchOptions, Point, read_inputs, systems_of
from specwatch.common.errors import ConfigError


def _ratio_or_off(text: str) -> float | None:
    if text.strip().lower() in ("off", "none", "0"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 1 or 'off', got {text!r}") from None
    if not value > 1:
        raise argparse.ArgumentTypeError(f"expected a number > 1 or 'off', got {text!r}")
    return value


def _ceiling(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `specwatch calibrate` (see the README section "Calibration")."""
    parser.add_argument(
        "inputs",
        nargs="*",
        metavar="INPUT",
        help="vllm bench serve result JSON, calibration CSV or sweep CSV (detected by content);"
        " with --compare and no data: the new parameters file",
    )
    parser.add_argument(
        "--out",
        metavar="PATH",
        help="write the fitted parameters file here; '{system}' in the path writes one file per"
        " system",
    )
    parser.add_argument(
        "--system",
        metavar="NAME",
        help="the system to calibrate: selects it when the inputs hold several (exact name or a"
        " unique part of it), names it when they hold one",
    )
    parser.add_argument(
        "--max-utilization",
        type=_ceiling,
        default=0.9,
        metavar="U",
        help="exclude points whose fitted utilisation λ·C2 is above U (0.9)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=_positive,
        metavar="N",
        help="exclude runs whose benchmark concurrency is above N",
    )
    parser.add_argument(
        "--max-ttft-ratio",
        type=_ratio_or_off,
        default=5.0,
        metavar="R",
        help="exclude points whose mean TTFT is above R times the TTFT at the lowest load of the"
        " same configuration (server-side queueing); 'off' disables (5)",
    )
    parser.add_argument(
        "--vif-limit",
        type=_positive,
        default=1000.0,
        metavar="V",
        help="variance inflation above which a coefficient is not identifiable (1000)",
    )
    parser.add_argument(
        "--model",
        choices=("saturation", "linear"),
        default="saturation",
        help="saturation (default): the roofline-knee form fitted on the whole load range,"
        " high-concurrency runs included; linear: the six-coefficient form below saturation"
        " (--max-utilization and --max-ttft-ratio apply to it only)",
    )
    parser.add_argument("--report", metavar="DIR", help="write PNG plots, summary.md, report.json")
    parser.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    parser.add_argument(
        "--draft-length",
        nargs=2,
        action="append",
        default=[],
        metavar=("K", "FILE"),
        help="bench JSON FILE ran SD with draft length K (when the file does not say); repeatable",
    )
    parser.add_argument(
        "--no-sd",
        action="append",
        default=[],
        metavar="FILE",
        help="bench JSON FILE ran without SD; repeatable",
    )
    cap = parser.add_argument_group(
        "server capacity",
        "what the servers of the runs stated (facts the fit takes instead of fitting them;"
        " model.md, Server capacity); a run that states its own (Prometheus history) keeps it")
    cap.add_argument("--kv-cache-tokens", type=_positive, metavar="N",
                     help="KV-cache tokens of the server without SD (vLLM's"
                     " kv_cache_size_tokens, or num_gpu_blocks x block_size)")
    cap.add_argument("--kv-cache-tokens-sd", type=_positive, metavar="N",
                     help="KV-cache tokens of the server running SD (drafter loaded)")
    cap.add_argument("--max-num-seqs", type=_positive, metavar="N",
                     help="vLLM --max-num-seqs the runs were served with")
    prom = parser.add_argument_group("Prometheus history")
    prom.add_argument("--prometheus", metavar="URL", help="Prometheus base URL (HTTP API)")
    prom.add_argument(
        "--start", metavar="T", help="start: RFC 3339, Unix seconds, or now-DURATION (e.g. now-6h)"
    )
    prom.add_argument("--end", metavar="T", default="now", help="end (default now)")
    prom.add_argument(
        "--step", metavar="S", default="60s", help="resolution; at least 4 scrape intervals (60s)"
    )
    prom.add_argument(
        "--selector",
        metavar="SEL",
        default="",
        help="label matchers added to every series, e.g. 'model_name=\"qwen\"'",
    )
    prom.add_argument(
        "--min-window", metavar="S", default="5m", help="shortest steady window kept (5m)"
    )
    prom.add_argument(
        "--point-sources",
        metavar="LIST",
        default="vllm",
        help="comma-separated Prometheus point sources: vllm (steady windows of vLLM's"
        " history), pairs (the exporter's measured A/B pairs, one point per visit of each bin"
        " and side), switches (the controller's before/after switch records, two points per"
        " switch) (vllm)",
    )
    prom.add_argument(
        "--timeout",
        type=_positive,
        default=30.0,
        metavar="S",
        help="HTTP timeout per query in seconds (30)",
    )
    drift = parser.add_argument_group("drift")
    drift.add_argument(
        "--compare",
        metavar="OLD.yaml",
        help="compare with an earlier fit; exit 1 when it drifted past --tolerance",
    )
    drift.add_argument(
        "--tolerance",
        type=_positive,
        default=0.10,
        metavar="F",
        help="largest acceptable relative change of predicted latency (0.10)",
    )


def _bench_options(args: argparse.Namespace) -> dict[str, BenchOptions]:
    out: dict[str, BenchOptions] = {}
    for k_text, path in args.draft_length:
        try:
            k = int(k_text)
        except ValueError:
            raise ConfigError(f"--draft-length {k_text} {path}: K must be an integer") from None
        if k < 0:
            raise ConfigError(f"--draft-length {k_text} {path}: K must be >= 0")
        if path in out:
            raise ConfigError(f"{path}: given twice in --draft-length/--no-sd")
        out[path] = BenchOptions(draft_length=k, no_sd=k == 0)
    for path in args.no_sd:
        if path in out:
            raise ConfigError(f"{path}: given twice in --draft-length/--no-sd")
        out[path] = BenchOptions(no_sd=True)
    return out


def _params_file(path: str) -> bool:
    """True when `path` looks like a parameters file (YAML mapping with `coefficients`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        doc = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(doc, dict) and "coefficients" in doc


def run(args: argparse.Namespace) -> int:
    """Fit, report, write; with --compare the exit status is the drift verdict."""
    from specwatch.calibrate import report as report
    from specwatch.model.params import load_params

    if (
        args.compare
        and not args.prometheus
        and len(args.inputs) == 1
        and _params_file(args.inputs[0])
    ):
        drift = report.compare_params(
            load_params(args.compare), load_params(args.inputs[0]), args.tolerance
        )
        if args.json:
            print(json.dumps({"compare": drift.to_json()}, indent=2, allow_nan=False))
        else:
            report.print_drift(drift)
        return 1 if drift.drifted else 0
    old = load_params(args.compare) if args.compare else None

    points = _gather(args)
    fits = _fit_all(args, points)
    written: dict[str, str] = {}
    pending_error: ConfigError | None = None
    if args.out:
        written, pending_error = _write_params(args, fits)
    drift = None
    if old is not None:
        drift = _drift_against(old, fits, args, report)
    doc: dict[str, Any] = {
        "systems": {f.system: report.system_json(f) for f in fits},
        "point_sources": point_sources(points),
        "written": written,
        "compare": drift.to_json() if drift is not None else None,
    }
    if args.report:
        report.write_report_dir(Path(args.report), fits, doc, drift)
    if args.json:
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


def point_sources(points: list[Point]) -> dict[str, dict[str, int]]:
    """How many points of each system came from where: ``files`` (bench JSON, CSV),
    ``vllm`` (steady windows of vLLM's Prometheus history), ``pairs`` (the exporter's
    measured A/B pairs) and ``switches`` (the controller's before/after switch records)."""
    from specwatch.calibrate.measured import sources_of

    return sources_of(points)


def _gather(args: argparse.Namespace) -> list[Point]:
    options = _bench_options(args)
    paths = list(args.inputs)
    for path in options:
        if path not in paths:
            paths.append(path)
    points = read_inputs(paths, default_system=args.system, bench_options=options)
    if args.prometheus:
        from specwatch.calibrate.prometheus import PrometheusQuery, read_prometheus

        if not args.start:
            raise ConfigError("--prometheus needs --start (and optionally --end)")
        query = PrometheusQuery.from_args(
            url=args.prometheus,
            start=args.start,
            end=args.end,
            step=args.step,
            selector=args.selector,
            min_window=args.min_window,
            timeout=args.timeout,
        )
        sources = [x.strip() for x in args.point_sources.split(",") if x.strip()]
        unknown = sorted(set(sources) - {"vllm", "pairs", "switches"})
        if unknown or not sources:
            raise ConfigError(f"--point-sources: expected a comma-separated list of vllm,"
                              f" pairs, switches; got {args.point_sources!r}")
        if "vllm" in sources:
            points.extend(read_prometheus(query, progress=not args.json))
        if "pairs" in sources:
            from specwatch.calibrate.measured import read_pair_points

            points.extend(read_pair_points(query))
        if "switches" in sources:
            from specwatch.calibrate.measured import read_switch_points

            points.extend(read_switch_points(query))
    elif args.start or args.selector:
        raise ConfigError("--start/--end/--selector need --prometheus URL")
    points = [_stated(p, args) for p in points]
    if not points:
        raise ConfigError(
            "no input: give benchmark files (vllm bench serve JSON, CSV) or --prometheus URL"
        )
    return points


def _stated(point: Point, args: argparse.Namespace) -> Point:
    """The point with the capacity the flags state, where it states none itself."""
    kv = args.kv_cache_tokens_sd if point.sd else args.kv_cache_tokens
    changes: dict[str, float] = {}
    if point.kv_cache_tokens is None and kv is not None:
        changes["kv_cache_tokens"] = kv
    if point.max_num_seqs is None and args.max_num_seqs is not None:
        changes["max_num_seqs"] = args.max_num_seqs
    return dataclasses.replace(point, **changes) if changes else point


def _select_systems(args: argparse.Namespace, points: list[Point]) -> dict[str, list[Point]]:
    by_system: dict[str, list[Point]] = defaultdict(list)
    for p in points:
        by_system[p.system].append(p)
    names = systems_of(points)
    if not args.system:
        return {n: by_system[n] for n in names}
    if args.system in by_system:
        return {args.system: by_system[args.system]}
    matches = [n for n in names if args.system.lower() in n.lower()]
    if len(matches) == 1:
        return {matches[0]: by_system[matches[0]]}
    if len(names) == 1:
        return {args.system: by_system[names[0]]}
    listed = ", ".join(repr(n) for n in names)
    if matches:
        raise ConfigError(f"--system {args.system!r} matches several systems: {listed}")
    raise ConfigError(
        f"--system {args.system!r} matches none of the systems in the inputs: {listed}"
    )


def _fit_all(args: argparse.Namespace, points: list[Point]) -> list[Any]:
    from specwatch.calibrate.fit import FitError, FitOptions, fit_system
    from specwatch.calibrate.load_range import fit_system_saturation

    fitter = fit_system_saturation if args.model == "saturation" else fit_system

    options = FitOptions(
        max_utilization=args.max_utilization,
        max_concurrency=args.max_concurrency,
        max_ttft_ratio=args.max_ttft_ratio,
        vif_limit=args.vif_limit,
    )
    fits = []
    for name, pts in _select_systems(args, points).items():
        try:
            fits.append(fitter(name, pts, options))
        except FitError as exc:
            raise ConfigError(str(exc)) from None
    for fit in fits:
        for note in sorted({n for p in fit.points for n in p.notes}):
            print(f"specwatch calibrate: note: {note}", file=sys.stderr)
    return fits


def _fit_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": args.model,
        "max_utilization": args.max_utilization,
        "max_concurrency": args.max_concurrency,
        "max_ttft_ratio": args.max_ttft_ratio,
    }


def _data_sources(args: argparse.Namespace) -> list[str]:
    data = [str(p) for p in args.inputs]
    data += [p for _, p in args.draft_length if p not in data]
    data += [p for p in args.no_sd if p not in data]
    if args.prometheus:
        sel = f"{{{args.selector}}}" if args.selector else ""
        data.append(f"prometheus {args.prometheus} {sel} {args.start}..{args.end} step {args.step}")
    return data


def _write_params(
    args: argparse.Namespace, fits: list[Any]
) -> tuple[dict[str, str], ConfigError | None]:
    from specwatch.calibrate import report as report
    from specwatch.model.params import dump_params

    per_system = "{system}" in args.out
    if not per_system and len(fits) > 1:
        names = ", ".join(repr(f.system) for f in fits)
        raise ConfigError(
            f"the inputs hold {len(fits)} systems ({names}); choose one with --system or put"
            " '{system}' in --out to write one file per system"
        )
    written: dict[str, str] = {}
    refused: list[str] = []
    for fit in fits:
        path = Path(args.out.replace("{system}", report.slug(fit.system)))
        if fit.coefficients is None:
            why = fit.fallback_reason or "no six-coefficient fit"
            refused.append(
                f"{fit.system}: not writing {path}: {why}"
                " (the report above has per-configuration speedup and break-even)"
            )
            continue
        params = report.build_params(
            fit, system_name=fit.system, data=_data_sources(args), options=_fit_options(args)
        )
        if path.parent and not path.parent.exists():
            raise ConfigError(f"--out {args.out}: directory {path.parent} does not exist")
        try:
            dump_params(params, path)
        except OSError as exc:  # /proc, a read-only or full file system, no permission
            raise ConfigError(f"--out {path}: cannot write: {exc.strerror or exc}") from None
        written[fit.system] = str(path)
    return written, ConfigError("; ".join(refused)) if refused else None


def _drift_against(old: Any, fits: list[Any], args: argparse.Namespace, report: Any) -> Any:
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
        fit, system_name=fit.system, data=_data_sources(args), options=_fit_options(args)
    )
    return report.compare_params(old, new, args.tolerance)
