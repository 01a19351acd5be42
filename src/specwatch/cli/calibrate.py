"""`specwatch calibrate`: its options, handed to :func:`specwatch.calibrate.workflow.calibrate`
as a typed :class:`~specwatch.calibrate.workflow.CalibrateRequest`.

    specwatch calibrate INPUT... --out params.yaml [--system NAME] [--max-utilization 0.9]
                        [--max-concurrency N] [--max-ttft-ratio R|off] [--report DIR] [--json]
                        [--draft-length K FILE]... [--no-sd FILE]...
                        [--prometheus URL --start T --end T [--step S] [--selector SEL]]
                        [--compare OLD.yaml [--tolerance 0.1]] [--reference PARAMS]
    specwatch calibrate --compare OLD.yaml NEW.yaml
"""

from __future__ import annotations

import argparse

from specwatch.calibrate.workflow import CalibrateRequest, calibrate
from specwatch.cli import numbers

#: ``--max-ttft-ratio``: a ratio above 1.
TTFT_RATIO = numbers.Number(1.0, numbers.MAX_RATIO, lo_open=True)


def _ratio_or_off(text: str) -> float | None:
    if text.strip().lower() in ("off", "none", "0"):
        return None
    try:
        return float(TTFT_RATIO(text))
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} or 'off'") from None


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
    _add_fit_arguments(parser)
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
    parser.add_argument(
        "--reference",
        metavar="PARAMS",
        help="fit from a few points: keep this parameters file's shapes and fit only the time"
        " scales the points identify (model.md, Calibrating from a reference)",
    )
    _add_capacity_arguments(parser)
    _add_prometheus_arguments(parser)
    _add_drift_arguments(parser)


def _add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """Which points the fit keeps, and which form it fits."""
    parser.add_argument(
        "--max-utilization",
        type=numbers.UTILIZATION,
        default=0.9,
        metavar="U",
        help="exclude points whose fitted utilisation λ·C2 is above U (0.9)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=numbers.COUNT,
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
        type=numbers.COUNT,
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


def _add_capacity_arguments(parser: argparse.ArgumentParser) -> None:
    cap = parser.add_argument_group(
        "server capacity",
        "what the servers of the runs stated (facts the fit takes instead of fitting them;"
        " model.md, Server capacity); a run that states its own (Prometheus history) keeps it")
    cap.add_argument("--kv-cache-tokens", type=numbers.COUNT, metavar="N",
                     help="KV-cache tokens of the server without SD (vLLM's"
                     " kv_cache_size_tokens, or num_gpu_blocks x block_size)")
    cap.add_argument("--kv-cache-tokens-sd", type=numbers.COUNT, metavar="N",
                     help="KV-cache tokens of the server running SD (drafter loaded)")
    cap.add_argument("--max-num-seqs", type=numbers.COUNT, metavar="N",
                     help="vLLM --max-num-seqs the runs were served with")


def _add_prometheus_arguments(parser: argparse.ArgumentParser) -> None:
    prom = parser.add_argument_group("Prometheus history")
    prom.add_argument("--prometheus", metavar="URL", help="Prometheus base URL (HTTP API)")
    prom.add_argument(
        "--start", type=numbers.TIME, metavar="T",
        help="start: RFC 3339, Unix seconds, or now-DURATION (e.g. now-6h)"
    )
    prom.add_argument("--end", type=numbers.TIME, metavar="T", default="now",
                      help="end (default now)")
    prom.add_argument(
        "--step", type=numbers.DURATION, metavar="S", default="60s",
        help="resolution; at least 4 scrape intervals (60s)"
    )
    prom.add_argument(
        "--selector",
        metavar="SEL",
        default="",
        help="label matchers added to every series, e.g. 'model_name=\"qwen\"'",
    )
    prom.add_argument(
        "--min-window", type=numbers.DURATION, metavar="S", default="5m",
        help="shortest steady window kept (5m)"
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
        type=numbers.TIMEOUT,
        default=30.0,
        metavar="S",
        help="HTTP timeout per query in seconds (30)",
    )


def _add_drift_arguments(parser: argparse.ArgumentParser) -> None:
    drift = parser.add_argument_group("drift")
    drift.add_argument(
        "--compare",
        metavar="OLD.yaml",
        help="compare with an earlier fit; exit 1 when it drifted past --tolerance",
    )
    drift.add_argument(
        "--tolerance",
        type=numbers.RATIO,
        default=0.10,
        metavar="F",
        help="largest acceptable relative change of predicted latency (0.10)",
    )


def request(args: argparse.Namespace) -> CalibrateRequest:
    return CalibrateRequest(
        inputs=list(args.inputs), out=args.out, system=args.system,
        max_utilization=args.max_utilization, max_concurrency=args.max_concurrency,
        max_ttft_ratio=args.max_ttft_ratio, vif_limit=args.vif_limit, model=args.model,
        report=args.report, as_json=args.json,
        draft_length=[(k, path) for k, path in args.draft_length], no_sd=list(args.no_sd),
        kv_cache_tokens=args.kv_cache_tokens, kv_cache_tokens_sd=args.kv_cache_tokens_sd,
        max_num_seqs=args.max_num_seqs, prometheus=args.prometheus, start=args.start,
        end=args.end, step=args.step, selector=args.selector, min_window=args.min_window,
        point_sources=args.point_sources, timeout=args.timeout, compare=args.compare,
        tolerance=args.tolerance, reference=args.reference)


def run(args: argparse.Namespace) -> int:
    """Fit, report, write; with --compare the exit status is the drift verdict."""
    return calibrate(request(args))
