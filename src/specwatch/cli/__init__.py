"""Command-line entry point: `specwatch <command> ...`, the top layer.

Each command has one module here exposing ``add_arguments(parser)`` and ``run(args) -> int``:
it parses and checks its options and calls typed functions of the layers below, which never
see an argparse namespace. Modules are imported lazily so that `specwatch serve` never pays
for matplotlib or scipy, and so that one command's optional dependency cannot break another
command. ``whatif_options`` holds the options predict, sweep and advise share.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import sys
import urllib.parse
from collections.abc import Mapping
from typing import Any, NoReturn

from specwatch import __version__
from specwatch.common.errors import SpecwatchError

# command name -> (module, one-line help). Keep in the order a new user meets them.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("specwatch.cli.demo", "simulated vLLM + exporter (+ Prometheus with the rules)"),
    "serve": ("specwatch.cli.serve", "poll vLLM/SGLang /metrics, derive SD signals, serve them"),
    "predict": ("specwatch.cli.predict", "predict SD and no-SD latency, speedup, break-even"),
    "sweep": ("specwatch.cli.sweep", "speedup vs arrival rate for each draft length"),
    "advise": ("specwatch.cli.advise", "enable SD or not, which k, at your load percentiles"),
    "calibrate": ("specwatch.cli.calibrate", "fit the latency model from benchmarks or Prometheus"),
    "simulate": ("specwatch.cli.simulate", "a simulated vLLM with speculative decoding (/metrics)"),
    "mixin": ("specwatch.cli.mixin",
              "render the rules and dashboards with your selectors and thresholds"),
}

# Optional dependencies: top-level module -> (PyPI package, the extra that installs it). A
# command that needs one that is not installed says so in one line (exit 2), no traceback.
OPTIONAL_MODULES: dict[str, tuple[str, str | None]] = {
    "scipy": ("scipy", "analysis"),
    "matplotlib": ("matplotlib", "analysis"),
    "rich": ("rich", "analysis"),
    "_jsonnet": ("jsonnet", None),  # a core dependency; missing only after --no-deps
}


def missing_dependency_message(name: str, exc: ModuleNotFoundError) -> str | None:
    """The one-line error for a missing optional module, or None for any other import error
    (a missing specwatch module is a bug and keeps its traceback)."""
    top = (exc.name or "").split(".")[0]
    if top not in OPTIONAL_MODULES:
        return None
    package, extra = OPTIONAL_MODULES[top]
    if extra is None:
        return (f"specwatch {name}: error: needs the Python package {package!r}, which is not "
                f"installed: pip install {package}")
    return (f"specwatch {name}: error: needs {package}, which is not installed; it comes with "
            f"the {extra!r} extra: {extra_install_command(extra, _direct_url())}")


def _direct_url() -> dict[str, Any] | None:
    """How this specwatch was installed: pip's record of a direct install (PEP 610
    ``direct_url.json``: a local folder, a file or a VCS URL), None for an index install."""
    # Every specwatch metadata folder on the path: a source tree's egg-info (left by a
    # build) can come before the installed one, and it has no direct_url.json.
    for dist in importlib.metadata.distributions(name="specwatch"):
        text = dist.read_text("direct_url.json")
        if text:
            try:
                return json.loads(text)
            except ValueError:
                return None
    return None


def extra_install_command(extra: str, direct_url: Mapping[str, Any] | None) -> str:
    """The pip command that adds ``extra`` to this install: from the clone it was installed
    from (``.[extra]`` there, ``-e`` kept for an editable install), else from the index."""
    url = str((direct_url or {}).get("url", ""))
    if "dir_info" in (direct_url or {}) and url.startswith("file://"):
        folder = urllib.parse.unquote(urllib.parse.urlparse(url).path)
        editable = "-e " if direct_url["dir_info"].get("editable") else ""
        return f"pip install {editable}'.[{extra}]' (in {folder}, the clone it came from)"
    return f"pip install 'specwatch[{extra}]'"


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``specwatch CMD: error: --flag: what was expected``
    (argparse prints the whole usage first), exit status 2."""

    #: The last error, as printed without the help hint (``--json`` commands print it too).
    last_error: str | None = None

    def error(self, message: str) -> NoReturn:
        message = message.removeprefix("argument ").replace("\n", " ")
        self.last_error = message
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser(name: str) -> argparse.ArgumentParser:
    """The parser of command ``name`` (imports its module)."""
    module = importlib.import_module(COMMANDS[name][0])
    parser = Parser(prog=f"specwatch {name}", description=COMMANDS[name][1])
    module.add_arguments(parser)
    return parser


def _usage() -> str:
    lines = [f"usage: specwatch <command> [options]   (specwatch {__version__})", "", "commands:"]
    width = max((len(c) for c in COMMANDS), default=0)
    for name, (_, help_text) in COMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {help_text}")
    lines.append("")
    lines.append("Run `specwatch <command> --help` for the options of one command.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"specwatch {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"specwatch: error: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
        parser = build_parser(name)
        try:
            args = parser.parse_args(rest)
        except SystemExit as exc:
            # A command with --json answers a bad option with its JSON verdict too.
            message = getattr(parser, "last_error", None)
            if exc.code == 2 and message and "--json" in rest and hasattr(module, "json_error"):
                module.json_error(message)
            return exc.code if isinstance(exc.code, int) else 2
        return int(module.run(args) or 0)
    except SpecwatchError as exc:
        print(f"specwatch {name}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        message = missing_dependency_message(name, exc)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
