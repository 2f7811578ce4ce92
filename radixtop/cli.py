"""Command line entry point.

Only argparse and the standard library are imported here: `radixtop scan` must start as fast as a
grep, so each subcommand imports its own (heavier) modules when it runs. Textual is imported only
by the commands that draw.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from radixtop import __version__


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def _add_tui_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log",
        action="append",
        default=[],
        metavar="PATH",
        help="log file or glob to follow (repeatable); rotation and truncation are survived",
    )
    parser.add_argument(
        "--from-start",
        action="store_true",
        help="read followed logs from their first line instead of their end",
    )
    parser.add_argument(
        "--theme",
        choices=["dark", "light", "high-contrast"],
        default=None,
        help="colour theme (NO_COLOR in the environment is always respected)",
    )


def _add_signature_option(parser: argparse.ArgumentParser, top_level: bool = True) -> None:
    # On a subcommand the defaults are suppressed, so that `radixtop --signatures F scan LOG`
    # keeps the top-level value instead of the subcommand's default replacing it.
    parser.add_argument(
        "--signatures",
        action="append",
        default=[] if top_level else argparse.SUPPRESS,
        metavar="FILE",
        help="extra signature catalog (TOML), merged with the built-in one; repeatable",
    )
    parser.add_argument(
        "--context",
        type=int,
        default=100 if top_level else argparse.SUPPRESS,
        metavar="N",
        help="lines of context kept before each first occurrence (default 100)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixtop",
        description="Watch an LLM server's logs, prefix cache and GPU memory; confirm the cause.",
    )
    parser.add_argument("--version", action="version", version=f"radixtop {__version__}")
    _add_tui_options(parser)
    _add_signature_option(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    scan = sub.add_parser("scan", help="scan logs headless for known failure signatures")
    scan.add_argument("logs", nargs="+", metavar="LOG", help="log files (.gz accepted), or - for stdin")
    scan.add_argument("--json", action="store_true", help="print one JSON object")
    scan.add_argument(
        "--matches",
        action="store_true",
        help="print every matching line as FILE:LINE:SIGNATURE:TEXT instead of the report",
    )
    _add_signature_option(scan, top_level=False)

    demo = sub.add_parser(
        "demo", help="start a simulated failing SGLang server with a workload, and watch it fail"
    )
    demo.add_argument(
        "--fault",
        default="lock-race",
        choices=["lock-race", "block-boundary", "leak", "double-unlock", "none"],
        help="the incident to reproduce (default lock-race: the page-lock/eviction race)",
    )
    demo.add_argument("--seed", type=int, default=7, help="fault seed (same seed, same incident)")
    demo.add_argument(
        "--theme", choices=["dark", "light", "high-contrast"], default=argparse.SUPPRESS, help="colour theme"
    )
    _add_signature_option(demo, top_level=False)

    sub.add_parser(
        "sim",
        help="run the SGLang-compatible simulator (takes SGLang's flags; see `radixtop sim --help`)",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The simulator takes SGLang's own flags (unknown ones included), so it parses its argv itself.
    if argv[:1] == ["sim"]:
        from radixtop.sim.cli import main as sim_main

        return sim_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            from radixtop.sim.demo import run_demo

            return run_demo(args)
        if args.command == "scan":
            from radixtop.scan import run_scan

            return run_scan(args)
        from radixtop.tui.app import run_tui

        return run_tui(args)
    except UsageError as exc:
        print(f"radixtop: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
