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
from radixtop.errors import UsageError


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
        help="keep up to 100,000 existing lines in view (default: the last 5,000; findings cover the whole file either way)",
    )
    parser.add_argument(
        "--theme",
        choices=["dark", "light", "high-contrast"],
        default=None,
        help="colour theme (NO_COLOR in the environment is always respected)",
    )
    parser.add_argument(
        "--url", default=None, metavar="URL",
        help="the server to watch, e.g. http://127.0.0.1:30000 (default: found on this node)",
    )
    parser.add_argument(
        "--instrument", action="append", default=[], metavar="URL",
        help="a rank's radixtop debug endpoint (repeatable; default: the server's /server_info, else found on its ports)",
    )
    parser.add_argument("--no-discover", action="store_true", help="do not look for servers on this node")
    parser.add_argument("--no-gpu", action="store_true", help="do not read GPUs through NVML")
    parser.add_argument("--no-panes", action="store_true", help="the log pane alone")


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


def _add_readonly_option(parser: argparse.ArgumentParser, top_level: bool = True) -> None:
    parser.add_argument(
        "--readonly",
        action="store_true",
        default=False if top_level else argparse.SUPPRESS,
        help="observe only: every action (bundle, replay, record, confirm; the UI's keys b and c) is refused",
    )


# The subcommands --readonly refuses: each sends traffic to the server, starts or stops a
# process, or attaches to one (py-spy pauses it). Here, so that refusing costs no import.
ACTIONS = ("bundle", "replay", "record", "confirm")


def _add_vocab_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vocab-size", type=int, default=None, metavar="N",
        help="the model's vocabulary, when its config.json is not on this machine (default: read from the "
        "folder or Hugging Face cache /server_info names)",
    )  # fmt: skip


def _add_bundle(sub: argparse._SubParsersAction) -> None:
    bundle = sub.add_parser(
        "bundle",
        help="write an evidence bundle: first occurrences, findings, server state, GPU, processes, stacks",
        description="Collect the evidence of an incident into DIR/radixtop-bundle-<time>-<reason>/ (written "
        "atomically, a .tar.gz beside it, secrets redacted, a manifest with every file's SHA-256).",
    )
    bundle.add_argument("--url", default=None, help="the server's base URL, e.g. http://127.0.0.1:30000")
    # SUPPRESS: `radixtop --log F bundle` keeps the top-level --log instead of an empty default.
    bundle.add_argument("--log", action="append", default=argparse.SUPPRESS, metavar="PATH", help="server log (repeatable)")
    bundle.add_argument("--out", default=None, metavar="DIR", help="directory to write the bundle in")
    bundle.add_argument("--pid", type=int, default=None, help="the server's pid (default: the one listening on the URL's port)")
    bundle.add_argument(
        "--instrument", action="append", default=argparse.SUPPRESS, metavar="URL",
        help="a rank's radixtop debug endpoint (repeatable; default: /server_info's, else found on the server's ports)",
    )  # fmt: skip
    bundle.add_argument("--reason", default="manual", help="a word for the bundle's name (default manual)")
    bundle.add_argument("--json", action="store_true", help="print the result as one JSON object")
    bundle.add_argument("--verify", default=None, metavar="BUNDLE", help="check a bundle (directory or .tar.gz) against its manifest")
    _add_signature_option(bundle, top_level=False)
    _add_readonly_option(bundle, top_level=False)


def _add_replay(sub: argparse._SubParsersAction) -> None:
    replay = sub.add_parser(
        "replay",
        help="send a workload trace N times at temperature 0 and report which requests' outputs diverge",
    )
    replay.add_argument("trace", metavar="TRACE", help="a trace file, or a built-in name (finding_03330, demo_pressure)")
    replay.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:30000")
    replay.add_argument("--runs", type=int, default=5, help="how many times to send the trace (default 5)")
    replay.add_argument("--json", action="store_true", help="print one JSON object")
    replay.add_argument("--no-flush", action="store_true", help="do not POST /flush_cache before each run")
    replay.add_argument(
        "--page-size", default=None, metavar="N|auto",
        help="rescale the trace's shared prefixes to this page size (auto: the server's)",
    )  # fmt: skip
    replay.add_argument("--seed", type=int, default=0, help="seed of the synthesized prompts (same seed, same prompts)")
    _add_vocab_option(replay)
    _add_readonly_option(replay, top_level=False)


def _add_record(sub: argparse._SubParsersAction) -> None:
    record = sub.add_parser(
        "record", help="record live traffic as a trace: a proxy on loopback in front of the server"
    )
    record.add_argument("--url", required=True, help="the server to forward to")
    record.add_argument("--out", required=True, metavar="TRACE", help="the trace file to write")
    record.add_argument("--listen-port", type=int, default=0, help="the proxy's port on 127.0.0.1 (default: a free one)")
    record.add_argument("--keep-prompts", action="store_true", help="keep the prompts in the trace (they may be sensitive)")
    record.add_argument("--duration", type=float, default=0, help="stop after this many seconds (default: at Ctrl-C)")
    record.add_argument("--max-requests", type=int, default=0, help="stop after this many generate calls")
    record.add_argument("--name", default=None, help="the trace's name (default: the file's)")
    record.add_argument("--ready-file", default=None, help=argparse.SUPPRESS)  # tests: where the port is written
    _add_readonly_option(record, top_level=False)


def _add_analyze(sub: argparse._SubParsersAction) -> None:
    analyze = sub.add_parser(
        "analyze",
        help="run a trace on the simulator's radix cache in-process (no server, no GPU): hit rate, misses by reason",
    )
    analyze.add_argument("trace", metavar="TRACE", help="a trace file (radixtop record writes one), or a built-in name")
    analyze.add_argument("--page-size", type=int, default=None, help="tokens per KV page (default 1, as SGLang)")
    analyze.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size in tokens (default 16384)")
    analyze.add_argument("--max-running-requests", type=int, default=None, help="scheduler batch bound (default 32)")
    analyze.add_argument("--radix-eviction-policy", "--eviction-policy", dest="eviction_policy", default="lru",
                         help="lru (default), lfu, fifo, mru, filo or priority")  # fmt: skip
    analyze.add_argument("--disable-radix-cache", action="store_true", help="analyze the workload without the cache")
    analyze.add_argument("--step-ms", type=float, default=2.0, help="emulated scheduler step time (default 2 ms, as radixtop sim)")
    analyze.add_argument("--sweep", default=None, metavar="FLAG=V1,V2",
                         help="one row per value: page-size=1,16,64, max-total-tokens=..., or max-running-requests=...")  # fmt: skip
    analyze.add_argument("--seed", type=int, default=0, help="seed of the synthesized prompts (as replay's)")
    analyze.add_argument("--json", action="store_true", help="print one JSON object")


def _add_confirm(sub: argparse._SubParsersAction) -> None:
    confirm = sub.add_parser(
        "confirm",
        help="the confirmation run: evidence, a plan to approve, then the live server vs a bounded control",
    )
    confirm.add_argument("--url", required=True, help="the live server's base URL")
    confirm.add_argument("--trace", default=None, help="workload: a trace file or built-in name (default: pressure sized to the server)")
    confirm.add_argument("--runs", type=int, default=3, help="runs against each server (default 3)")
    confirm.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    confirm.add_argument("--yes", action="store_true", help="approve the plan without asking")
    confirm.add_argument("--log", action="append", default=argparse.SUPPRESS, metavar="PATH", help="the live server's log (default: found)")
    confirm.add_argument("--pid", type=int, default=None, help="the live server's pid (default: found by its port)")
    confirm.add_argument("--launch-command", default=None, help="the live server's command, when it cannot be learned")
    confirm.add_argument(
        "--control-cache", choices=["disable", "keep"], default="disable",
        help="disable: the control adds --disable-radix-cache (default); keep: only the pressure is lowered",
    )  # fmt: skip
    confirm.add_argument("--concurrency-divisor", type=int, default=4, help="the control's --max-running-requests is the live one divided by this (default 4)")
    confirm.add_argument("--control-arg", action="append", default=[], metavar="FLAG", help="an extra control flag (--control-arg=--mem-fraction-static=0.3); repeatable")
    confirm.add_argument("--stop-original", action="store_true", help="stop the live server first, then run a reproduction and the control (never done otherwise)")
    confirm.add_argument("--no-reproduction", action="store_true", help="with the server gone: no reproduction arm; its crash log stands as the baseline")
    confirm.add_argument("--gpus", default=None, metavar="IDS", help="CUDA_VISIBLE_DEVICES for the servers radixtop starts (default: idle GPUs with room, from NVML)")
    confirm.add_argument("--own-env", action="store_true", help="start the servers with radixtop's environment when the live server's cannot be read")
    confirm.add_argument("--inherit-env", action="store_true", help="start the servers with the live server's whole environment and working directory (default: a clean one with its behaviour keys, shown in the plan)")
    confirm.add_argument("--no-flush", action="store_true", help="do not flush the caches between runs")
    confirm.add_argument("--no-bundle", action="store_true", help="skip the evidence bundle (not recommended)")
    confirm.add_argument("--control-timeout", "--health-timeout", dest="control_timeout", type=float, default=1200.0,
                         help="seconds to wait for a started server's health: a real model loads for minutes (default 1200)")
    _add_vocab_option(confirm)
    confirm.add_argument("--workdir", default=None, help="where the plan, logs, replays and verdict go (default ./radixtop-confirm-<time>)")
    _add_signature_option(confirm, top_level=False)
    _add_readonly_option(confirm, top_level=False)


def _add_scan(sub: argparse._SubParsersAction) -> None:
    scan = sub.add_parser("scan", help="scan logs headless for known failure signatures")
    scan.add_argument("logs", nargs="+", metavar="LOG", help="log files (.gz accepted), or - for stdin")
    scan.add_argument("--json", action="store_true", help="print one JSON object")
    scan.add_argument(
        "--matches",
        action="store_true",
        help="print every matching line as FILE:LINE:SIGNATURE:TEXT instead of the report",
    )
    _add_signature_option(scan, top_level=False)


def _add_demo(sub: argparse._SubParsersAction) -> None:
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


def _add_sim(sub: argparse._SubParsersAction) -> None:
    sub.add_parser(
        "sim",
        help="run the SGLang-compatible simulator (takes SGLang's flags; see `radixtop sim --help`)",
        add_help=False,
    )


# In the order `radixtop --help` lists them.
SUBCOMMANDS = {
    "scan": _add_scan,
    "demo": _add_demo,
    "bundle": _add_bundle,
    "replay": _add_replay,
    "record": _add_record,
    "analyze": _add_analyze,
    "confirm": _add_confirm,
    "sim": _add_sim,
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` that subcommand's: building all of them costs `radixtop
    scan` about a fifth of its start-up (argparse formats and translates every help text)."""
    parser = argparse.ArgumentParser(
        prog="radixtop",
        description="Watch an LLM server's logs, prefix cache and GPU memory; confirm the cause.",
    )
    parser.add_argument("--version", action="version", version=f"radixtop {__version__}")
    _add_tui_options(parser)
    _add_signature_option(parser)
    _add_readonly_option(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, add in SUBCOMMANDS.items():
        if only in (None, name):
            add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The simulator takes SGLang's own flags (unknown ones included), so it parses its argv itself.
    if argv[:1] == ["sim"]:
        from radixtop.sim.cli import main as sim_main

        return sim_main(argv[1:])
    # `radixtop scan LOG` builds only the scan parser; options before the subcommand
    # (`radixtop --log F bundle`) need the whole one.
    args = build_parser(argv[0] if argv[:1] and argv[0] in SUBCOMMANDS else None).parse_args(argv)
    try:
        if args.command in ACTIONS:
            if args.readonly:
                raise UsageError(f"--readonly: `{args.command}` is an action and is refused; run without --readonly")
            from radixtop.incident import commands

            return getattr(commands, f"run_{args.command}")(args)
        if args.command == "analyze":
            from radixtop.incident.commands import run_analyze

            return run_analyze(args)
        if args.command == "demo":
            from radixtop.sim.demo import run_demo

            return run_demo(args)
        if args.command == "scan":
            from radixtop.scan import run_scan

            return run_scan(args)
        from radixtop.options import TuiOptions
        from radixtop.tui.app import run_tui

        return run_tui(TuiOptions.from_args(args))
    except UsageError as exc:
        print(f"radixtop: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
