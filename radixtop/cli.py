"""Command line entry point: one table of subcommands (SUBCOMMANDS), dispatched from the table.

Only the standard library is imported here (argcheck and errors import nothing more): `radixtop
scan` must start as fast as a grep, so each subcommand names its runner as "module:function",
imported when it runs. Textual is imported only by the commands that draw.

Options go after the subcommand they belong to. The TUI's options (TUI_OPTIONS) before a
subcommand are refused: that subcommand's parser would write its own values over theirs.
--signatures, --context and --readonly may come before any subcommand that takes them.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, TypeVar, overload

from radixtop import __version__
from radixtop.argcheck import Parser, at_least, page_size_or_auto, within
from radixtop.errors import ExitStatus, UsageError


class Subcommand(NamedTuple):
    name: str
    help: str
    # Adds the subcommand's options; None: the runner takes its argv unparsed.
    add_arguments: Callable[[argparse.ArgumentParser], None] | None
    runner: str  # "module:function", imported only when the subcommand runs
    # Sends traffic to the server, starts or stops a process, or attaches to one (py-spy pauses
    # it): --readonly refuses it.
    action: bool = False


TUI_RUNNER = "radixtop.tui.app:run_from_args"  # radixtop with no subcommand

# The TUI's options, on the root parser. demo runs the TUI and takes the ones it does not set itself.
TUI_OPTIONS: dict[str, dict[str, Any]] = {
    "--log": dict(
        action="append", default=[], metavar="PATH",
        help="log file or glob to follow (repeatable); rotation and truncation are survived",
    ),
    "--from-start": dict(
        action="store_true",
        help="keep up to 100,000 existing lines in view "
             "(default: the last 5,000; findings cover the whole file either way)",
    ),
    "--theme": dict(
        choices=["dark", "light", "high-contrast"], default=None,
        help="colour theme (NO_COLOR in the environment is always respected)",
    ),
    "--url": dict(
        default=None, metavar="URL",
        help="the server to watch, e.g. http://127.0.0.1:30000 (default: found on this node)",
    ),
    "--instrument": dict(
        action="append", default=[], metavar="URL",
        help="a rank's radixtop debug endpoint (repeatable; "
             "default: the server's /server_info, else found on its ports)",
    ),
    "--prometheus": dict(
        default=None, metavar="URL",
        help="the fleet's Prometheus, e.g. http://prometheus:9090: a fleet view (F) of every rank it scrapes, "
             "and those that stand out",
    ),
    "--node": dict(
        action="append", default=[], metavar="HOST",
        help="another node to watch too, as ssh names it (host, user@host, an alias in your ssh config; your own "
             "ssh, BatchMode, radixtop installed there): its logs streamed here, its ranks' endpoints forwarded "
             "to loopback; repeatable",
    ),
    "--node-url": dict(
        action="append", default=[], metavar="HOST=URL",
        help="the server to watch on a --node host, as its URL there (default: every server radixtop finds there)",
    ),
    "--ssh-config": dict(default=None, metavar="FILE",
                         help="the ssh config file for --node (ssh -F; default: ssh's own, ~/.ssh/config)"),
    "--remote-radixtop": dict(default="radixtop", metavar="CMD",
                              help="the radixtop command on the --node hosts (default: radixtop on the PATH of a "
                                   "non-interactive ssh session)"),
    "--no-discover": dict(action="store_true", help="do not look for servers on this node"),
    "--no-gpu": dict(action="store_true", help="do not read GPUs through NVML"),
    "--no-panes": dict(action="store_true", help="the log pane alone"),
}

_GIVEN = "given_before_command"  # the namespace's note of the root options given, by dest


class _Given(argparse.Action):
    """A root option: stored as argparse's store, append or store_true (``kind``) would, and noted
    as given. A subcommand's parser writes its values over the root's, so only this note tells
    `radixtop --url U bundle` from `radixtop bundle --url U`."""

    def __init__(self, option_strings: list[str], dest: str, kind: str = "store", **kwargs: Any) -> None:
        if kind == "store_true":
            kwargs.update(nargs=0, default=kwargs.get("default", False))
        super().__init__(option_strings, dest, **kwargs)
        self.kind = kind

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        value: object
        if self.kind == "store_true":
            value = True
        elif self.kind == "append":
            value = [*getattr(namespace, self.dest), values]
        else:
            value = values
        setattr(namespace, self.dest, value)
        vars(namespace).setdefault(_GIVEN, {})[self.dest] = (self.option_strings[0], self.kind, value)


def _option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, root: bool, **spec: Any) -> None:
    """Adds ``flag``; on the root parser through _Given, so that giving it is noted."""
    if root:
        spec["kind"] = spec.pop("action", "store")
        spec["action"] = _Given
    parser.add_argument(flag, **spec)


def _add_signature_options(parser: argparse.ArgumentParser, root: bool = False) -> None:
    # A subcommand's --signatures add to those given before it; its --context replaces the one
    # given before it only when given itself (SUPPRESS).
    _option(parser, "--signatures", root, action="append", default=[], metavar="FILE",
            help="extra signature catalog (TOML), merged with the built-in one; repeatable")
    _option(parser, "--context", root, type=at_least(0), default=100 if root else argparse.SUPPRESS, metavar="N",
            help="lines of context kept before each first occurrence (default 100)")


def _add_readonly_option(parser: argparse.ArgumentParser, root: bool = False) -> None:
    _option(parser, "--readonly", root, action="store_true", default=False if root else argparse.SUPPRESS,
            help="observe only: every action (bundle, replay, record, confirm; the UI's keys b and c) is refused")


def _add_vocab_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vocab-size", type=at_least(16), default=None, metavar="N",
        help="the model's vocabulary, when its config.json is not on this machine (default: read from the "
        "folder or Hugging Face cache /server_info names)",
    )


def _scan_arguments(scan: argparse.ArgumentParser) -> None:
    scan.add_argument("logs", nargs="*", metavar="LOG", help="log files (.gz accepted), or - for stdin")
    scan.add_argument("--json", action="store_true", help="print one JSON object")
    scan.add_argument(
        "--matches",
        action="store_true",
        help="print every matching line as FILE:LINE:SIGNATURE:TEXT instead of the report",
    )
    scan.add_argument("--found", action="store_true",
                      help="scan the log of each server radixtop finds on this node (what --node runs on each node)")
    nodes = scan.add_argument_group(
        "other nodes (through your own ssh, radixtop installed there: each finding tagged with its node, the "
        "initiating one the earliest across nodes on this node's clock)")
    _add_node_options(nodes, "--timeout", 3600, 120.0, "scan")
    nodes.add_argument("--node-log", action="append", default=[], metavar="HOST=PATH",
                       help="a log to scan on HOST (default: the log of each server radixtop finds there); repeatable")
    _add_signature_options(scan)


def _add_node_options(parser: Any, timeout_flag: str, max_s: int, default_s: float, what: str) -> None:
    """--node, --ssh-config, the wait for each node's `what` and --remote-radixtop: how a headless
    command reaches other nodes (the TUI's are in TUI_OPTIONS)."""
    parser.add_argument(
        "--node", action="append", default=[], metavar="HOST",
        help="another node, as ssh names it (host, user@host, an alias in your ssh config); repeatable",
    )
    parser.add_argument("--ssh-config", default=None, metavar="FILE",
                        help="the ssh config file to use (ssh -F; default: ssh's own, ~/.ssh/config)")
    parser.add_argument(timeout_flag, type=within(1, max_s, float), default=default_s, metavar="S",
                        help=f"seconds to wait for each node's {what} (default {default_s:g})")
    parser.add_argument("--remote-radixtop", default="radixtop", metavar="CMD",
                        help="the radixtop command on the nodes, e.g. /opt/venv/bin/radixtop (default: radixtop on "
                             "the PATH of a non-interactive ssh session)")


def _discover_arguments(discover: argparse.ArgumentParser) -> None:
    discover.description = (
        "What radixtop finds on this node (servers, their URL, logs, ranks' debug endpoints, processes, GPUs, "
        "hostname, clock), and with --node on other nodes, through your own ssh (BatchMode: your agent and keys, "
        "never a password prompt; radixtop installed there)."
    )
    discover.add_argument("--json", action="store_true", help="print one JSON object")
    _add_node_options(discover, "--timeout", 600, 30.0, "answer")
    discover.add_argument("--no-local", action="store_true", help="only the --node hosts, not this node")


def _follow_arguments(follow: argparse.ArgumentParser) -> None:
    follow.description = (
        "This node's server logs as a stream of JSON lines (what `radixtop --node HOST` on another node runs here "
        "through ssh): the logs --log names, else the ones discovery finds."
    )
    follow.add_argument("--json", action="store_true", required=True, help="JSON lines (the only form)")
    follow.add_argument("--log", action="append", default=[], metavar="PATH", help="a log to follow (repeatable)")
    follow.add_argument("--url", default=None, metavar="URL", help="the server whose log to follow (default: every "
                                                                    "server's discovery finds)")
    follow.add_argument("--backlog", type=within(0, 100_000, int), default=5_000, metavar="N",
                        help="lines before each log's end to send first (default 5000)")


def _fleet_arguments(fleet: argparse.ArgumentParser) -> None:
    fleet.description = (
        "Every rank the fleet's own Prometheus scrapes (radixtop's debug endpoints' /metrics), per node and rank: "
        "token usage, locked tokens, evictions, lock anomalies; and the ranks that stand out, with why and the "
        "command that opens one."
    )
    fleet.add_argument("--prometheus", required=True, metavar="URL",
                       help="Prometheus's base URL, e.g. http://prometheus:9090 (its HTTP API, /api/v1/query)")
    fleet.add_argument("--json", action="store_true", help="print one JSON object")
    fleet.add_argument("--timeout", type=within(1, 600, float), default=10.0, metavar="S",
                       help="seconds to wait for Prometheus's answers (default 10)")


def _demo_arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument(
        "--fault",
        default="lock-race",
        choices=["lock-race", "block-boundary", "leak", "double-unlock", "none"],
        help="the incident to reproduce (default lock-race: the page-lock/eviction race)",
    )
    demo.add_argument("--seed", type=int, default=7, help="fault seed (same seed, same incident)")
    for flag in ("--theme", "--no-discover", "--no-gpu", "--no-panes"):  # the demo sets the log and URL
        demo.add_argument(flag, **TUI_OPTIONS[flag])
    _add_signature_options(demo)
    _add_readonly_option(demo)


def _bundle_arguments(bundle: argparse.ArgumentParser) -> None:
    bundle.description = (
        "Collect the evidence of an incident into DIR/radixtop-bundle-<time>-<reason>/ (written atomically, "
        "a .tar.gz beside it, secrets redacted, a manifest with every file's SHA-256)."
    )
    bundle.add_argument("--url", default=None, help="the server's base URL, e.g. http://127.0.0.1:30000")
    bundle.add_argument("--log", action="append", default=[], metavar="PATH", help="server log (repeatable)")
    bundle.add_argument("--out", default=None, metavar="DIR", help="directory to write the bundle in")
    bundle.add_argument(
        "--pid", type=int, default=None,
        help="the server's pid (default: the one listening on the URL's port)",
    )
    bundle.add_argument(
        "--instrument", action="append", default=[], metavar="URL",
        help="a rank's radixtop debug endpoint (repeatable; default: /server_info's, else found on the server's ports)",
    )
    bundle.add_argument("--reason", default="manual", help="a word for the bundle's name (default manual)")
    bundle.add_argument("--json", action="store_true", help="print the result as one JSON object")
    bundle.add_argument(
        "--verify", default=None, metavar="BUNDLE",
        help="check a bundle (directory or .tar.gz) against its manifest",
    )
    nodes = bundle.add_argument_group(
        "other nodes (through your own ssh, radixtop installed there: each node's own bundle in nodes/HOST/, "
        "one timeline on this node's clock)")
    _add_node_options(nodes, "--node-timeout", 3600, 300.0, "bundle")
    nodes.add_argument("--node-url", action="append", default=[], metavar="HOST=URL",
                       help="the server to bundle on HOST (default: the one radixtop finds there)")
    nodes.add_argument("--node-log", action="append", default=[], metavar="HOST=PATH",
                       help="a log to bundle on HOST, e.g. a dead server's (default: the found server's); repeatable")
    nodes.add_argument("--node-max-bytes", type=at_least(1024), default=1 << 30, help=argparse.SUPPRESS)
    nodes.add_argument("--stream", action="store_true",
                       help="write this node's bundle as a .tar.gz to stdout (what --node runs on each node)")
    _add_signature_options(bundle)
    _add_readonly_option(bundle)


def _replay_arguments(replay: argparse.ArgumentParser) -> None:
    replay.add_argument(
        "trace", metavar="TRACE",
        help="a trace file, or a built-in name (finding_03330, demo_pressure)",
    )
    replay.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:30000")
    replay.add_argument("--runs", type=at_least(1), default=5, help="how many times to send the trace (default 5)")
    replay.add_argument("--json", action="store_true", help="print one JSON object")
    replay.add_argument("--no-flush", action="store_true", help="do not POST /flush_cache before each run")
    replay.add_argument(
        "--page-size", type=page_size_or_auto, default=None, metavar="N|auto",
        help="rescale the trace's shared prefixes to this page size (auto: the server's)",
    )
    replay.add_argument("--seed", type=int, default=0, help="seed of the synthesized prompts (same seed, same prompts)")
    replay.add_argument(
        "--max-in-flight", type=at_least(0), default=0, metavar="K",
        help="at most K calls out at once: a call due while K are out waits for an answer (lower pressure, "
             "the server's flags untouched; default 0: no cap)",
    )
    replay.add_argument(
        "--namespace-per-request", action="store_true",
        help="give every call a cache namespace of its own (SGLang's extra_key): the same pressure, no prefix reuse",
    )
    replay.add_argument(
        "--log", action="append", default=[], metavar="PATH",
        help="the server's log, whose batch lines give each run's peak token usage (repeatable; "
             "default: the log of the server at --url, when it runs on this node)",
    )
    _add_vocab_option(replay)
    _add_readonly_option(replay)


def _record_arguments(record: argparse.ArgumentParser) -> None:
    record.add_argument("--url", required=True, help="the server to forward to")
    record.add_argument("--out", required=True, metavar="TRACE", help="the trace file to write")
    record.add_argument(
        "--listen-port", type=within(0, 65535), default=0,
        help="the proxy's port on 127.0.0.1 (default: a free one)",
    )
    record.add_argument(
        "--keep-prompts", action="store_true",
        help="keep the prompts in the trace (they may be sensitive)",
    )
    record.add_argument("--duration", type=float, default=0, help="stop after this many seconds (default: at Ctrl-C)")
    record.add_argument("--max-requests", type=int, default=0, help="stop after this many generate calls")
    record.add_argument("--name", default=None, help="the trace's name (default: the file's)")
    record.add_argument("--ready-file", default=None, help=argparse.SUPPRESS)  # tests: where the port is written
    _add_readonly_option(record)


def _trace_arguments(trace: argparse.ArgumentParser) -> None:
    trace.add_argument("action", choices=["convert"], help="convert: write SOURCE as a trace file")
    trace.add_argument("source", metavar="SOURCE",
                       help="SGLang's crash or request dump (.pkl), its dump folder (the newest dump), a trace, "
                            "or a Mooncake trace (.jsonl)")
    trace.add_argument("-o", "--out", default=None, metavar="TRACE",
                       help="the file to write (default NAME.trace.json, or NAME.mooncake.jsonl)")
    trace.add_argument("--format", choices=["radixtop", "mooncake"], default="radixtop",
                       help="radixtop: a trace file (default); mooncake: JSON Lines of hash ids, as AIPerf, vLLM and "
                            "SGLang's bench_serving replay")
    trace.add_argument("--block-size", type=at_least(1), default=None, metavar="N",
                       help="tokens a Mooncake hash id stands for: of a Mooncake SOURCE (default 512) and of "
                            "--format mooncake (default the trace's page_size_hint)")


def _analyze_arguments(analyze: argparse.ArgumentParser) -> None:
    analyze.add_argument("trace", metavar="TRACE", help="a trace file (radixtop record writes one), or a built-in name")
    # The sizes are the simulator's settings: its engine checks them, as it does for radixtop sim.
    analyze.add_argument("--page-size", type=int, default=None, help="tokens per KV page (default 1, as SGLang)")
    analyze.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size in tokens (default 16384)")
    analyze.add_argument("--max-running-requests", type=int, default=None, help="scheduler batch bound (default 32)")
    analyze.add_argument("--radix-eviction-policy", "--eviction-policy", dest="eviction_policy", default="lru",
                         help="lru (default), lfu, fifo, mru, filo or priority")
    analyze.add_argument("--disable-radix-cache", action="store_true", help="analyze the workload without the cache")
    analyze.add_argument("--step-ms", type=within(0, 10_000, float), default=2.0,
                         help="emulated scheduler step time (default 2 ms, as radixtop sim)")
    analyze.add_argument("--sweep", default=None, metavar="FLAG=V1,V2",
                         help="one row per value: page-size=1,16,64, max-total-tokens=..., or max-running-requests=...")
    analyze.add_argument("--seed", type=int, default=0, help="seed of the synthesized prompts (as replay's)")
    analyze.add_argument("--json", action="store_true", help="print one JSON object")


def _confirm_arguments(confirm: argparse.ArgumentParser) -> None:
    confirm.add_argument("--url", required=True, help="the live server's base URL")
    confirm.add_argument(
        "--trace", default=None,
        help="workload: a trace file or built-in name (default: pressure sized to the server)",
    )
    confirm.add_argument("--runs", type=at_least(1), default=3, help="runs of the workload per step (default 3)")
    confirm.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    confirm.add_argument("--yes", action="store_true", help="approve the plan without asking")
    confirm.add_argument(
        "--log", action="append", default=[], metavar="PATH",
        help="the live server's log (default: found)",
    )
    confirm.add_argument("--pid", type=int, default=None, help="the live server's pid (default: found by its port)")
    confirm.add_argument("--launch-command", default=None, help="the live server's command, when it cannot be learned")
    confirm.add_argument(
        "--control-cache", choices=["disable", "keep"], default="disable",
        help="disable: the experiment may start a server with --disable-radix-cache (default); keep: never "
             "(the cache question stays open)",
    )
    confirm.add_argument(
        "--concurrency-divisor", type=at_least(1), default=4,
        help="the pressure ladder's lowest rung: max running requests divided by this, in flight (default 4)",
    )
    confirm.add_argument(
        "--control-arg", action="append", default=[], metavar="FLAG",
        help="an extra flag for the server without the cache (--control-arg=--mem-fraction-static=0.3); "
             "repeatable",
    )
    confirm.add_argument(
        "--detectors", action="store_true",
        help="start servers with SGLang's own corruption detectors (page invariants, busy memory check; the KV "
             "canary on a GPU): a corruption caught at its cause, at some cost in speed",
    )
    confirm.add_argument(
        "--stop-original", action="store_true",
        help="stop the live server first, then run the experiment on a reproduction (never done otherwise)",
    )
    confirm.add_argument(
        "--no-reproduction", action="store_true",
        help="with the server gone: its crash log stands for the workload as run (no run of it as recorded)",
    )
    confirm.add_argument(
        "--gpus", default=None, metavar="IDS",
        help="CUDA_VISIBLE_DEVICES for the servers radixtop starts (default: idle GPUs with room, from NVML)",
    )
    confirm.add_argument(
        "--own-env", action="store_true",
        help="start the servers with radixtop's environment when the live server's cannot be read",
    )
    confirm.add_argument(
        "--inherit-env", action="store_true",
        help="start the servers with the live server's whole environment and working directory "
             "(default: a clean one with its behaviour keys, shown in the plan)",
    )
    confirm.add_argument("--no-flush", action="store_true", help="do not flush the caches between runs")
    confirm.add_argument("--no-bundle", action="store_true", help="skip the evidence bundle (not recommended)")
    confirm.add_argument("--control-timeout", "--health-timeout", dest="control_timeout", type=float, default=1200.0,
                         help="seconds to wait for a started server's health: a real model loads for minutes "
                              "(default 1200)")
    _add_vocab_option(confirm)
    confirm.add_argument(
        "--workdir", default=None,
        help="where the plan, logs, replays and verdict go (default ./radixtop-confirm-<time>)",
    )
    _add_signature_options(confirm)
    _add_readonly_option(confirm)


_INCIDENT = "radixtop.incident.commands"

# Every subcommand, in the order `radixtop --help` lists them.
SUBCOMMANDS: dict[str, Subcommand] = {c.name: c for c in (
    Subcommand("scan", "scan logs headless for known failure signatures", _scan_arguments, "radixtop.scan:run_scan"),
    Subcommand("discover", "what radixtop finds on this node, and on others through ssh (--node HOST)",
               _discover_arguments, "radixtop.discover:run_discover"),
    Subcommand("follow", "this node's server logs as JSON lines, for radixtop --node on another node",
               _follow_arguments, "radixtop.incident.follow:run_follow"),
    Subcommand("fleet", "the fleet through its own Prometheus: every rank, and those that stand out",
               _fleet_arguments, "radixtop.fleet:run_fleet"),
    Subcommand("demo", "start a simulated failing SGLang server with a workload, and watch it fail",
               _demo_arguments, "radixtop.demo:run_demo"),
    Subcommand("bundle", "write an evidence bundle: first occurrences, findings, server state, GPU, processes, stacks",
               _bundle_arguments, f"{_INCIDENT}:run_bundle", action=True),
    Subcommand("replay", "send a workload trace N times at temperature 0 and report which requests' outputs diverge",
               _replay_arguments, f"{_INCIDENT}:run_replay", action=True),
    Subcommand("record", "record live traffic as a trace: a proxy on loopback in front of the server",
               _record_arguments, f"{_INCIDENT}:run_record", action=True),
    Subcommand("trace", "convert SGLang's crash dumps and Mooncake traces into traces, and traces into Mooncake's",
               _trace_arguments, f"{_INCIDENT}:run_trace"),
    Subcommand("analyze", "run a trace on the simulator's radix cache in-process (no server, no GPU): "
                          "hit rate, misses by reason",
               _analyze_arguments, f"{_INCIDENT}:run_analyze"),
    Subcommand("confirm", "the confirmation run: evidence, a plan to approve, "
                          "then the live server vs a bounded control",
               _confirm_arguments, f"{_INCIDENT}:run_confirm", action=True),
    # SGLang's own flags, unknown ones included: its parser is its own.
    Subcommand("sim", "run the SGLang-compatible simulator (takes SGLang's flags; see `radixtop sim --help`)",
               None, "radixtop.sim.cli:main"),
)}


_N = TypeVar("_N")


class _RootParser(Parser):
    """The root parser: after parsing, the options given before a subcommand are checked against it."""

    subcommands: dict[str, argparse.ArgumentParser]

    # argparse's own overloads, kept: a namespace passed in comes back, of its type.
    @overload
    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: None = None
    ) -> tuple[argparse.Namespace, list[str]]: ...
    @overload
    def parse_known_args(self, args: Iterable[str] | None, namespace: _N) -> tuple[_N, list[str]]: ...
    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:
        parsed: argparse.Namespace
        parsed, extras = super().parse_known_args(args, namespace)
        given: dict[str, tuple[str, str, Any]] = vars(parsed).pop(_GIVEN, {})
        if parsed.command is not None:
            for dest, (flag, kind, value) in given.items():
                self._before_command(parsed, dest, flag, kind, value)
        return parsed, extras

    def _before_command(self, args: argparse.Namespace, dest: str, flag: str, kind: str, value: Any) -> None:
        name = args.command
        has = flag in self.subcommands[name]._option_string_actions  # argparse's own index of its options
        if flag in TUI_OPTIONS:
            if has:
                raise UsageError(
                    f"{flag} before `{name}` is the TUI's; give it after the subcommand: radixtop {name} {flag} ..."
                )
            raise UsageError(
                f"{flag} applies only to the TUI (radixtop with no subcommand); drop it from `radixtop {name}`"
            )
        # --readonly reaches every subcommand parsed here: one that is no action has nothing to refuse.
        parsed_here = SUBCOMMANDS[name].add_arguments is not None
        if not (has or (flag == "--readonly" and parsed_here)):
            raise UsageError(f"`radixtop {name}` does not take {flag}; drop it (see `radixtop {name} --help`)")
        if kind == "append":  # the subcommand's own list starts empty: both places count
            setattr(args, dest, [*value, *getattr(args, dest)])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` that subcommand's: building all of them costs `radixtop
    scan` about a fifth of its start-up (argparse formats and translates every help text)."""
    parser = _RootParser(
        prog="radixtop",
        description="Watch an LLM server's logs, prefix cache and GPU memory; confirm the cause.",
        epilog="A COMMAND's options go after its name (radixtop bundle --url URL); before it, only "
        "--signatures, --context and --readonly.",
    )
    parser.add_argument("--version", action="version", version=f"radixtop {__version__}")
    tui = parser.add_argument_group("the TUI's options (radixtop with no COMMAND)")
    for flag, spec in TUI_OPTIONS.items():
        _option(tui, flag, True, **spec)
    _add_signature_options(parser, root=True)
    _add_readonly_option(parser, root=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    parser.subcommands = {}
    for command in SUBCOMMANDS.values():
        if only in (None, command.name):
            own = sub.add_parser(command.name, help=command.help, description=command.help,
                                 add_help=command.add_arguments is not None)
            if command.add_arguments is not None:
                command.add_arguments(own)
            parser.subcommands[command.name] = own
    return parser


def _load(runner: str) -> Callable[[Any], int]:
    """The function a "module:function" names, imported now."""
    module, _, function = runner.partition(":")
    return getattr(importlib.import_module(module), function)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    named = SUBCOMMANDS.get(argv[0]) if argv else None
    try:
        if named is not None and named.add_arguments is None:
            return _load(named.runner)(argv[1:])
        # `radixtop scan LOG` builds only the scan parser; options before the subcommand
        # (`radixtop --readonly bundle`) need the whole one.
        args = build_parser(named.name if named else None).parse_args(argv)
        command = SUBCOMMANDS[args.command] if args.command else None
        if command is None:
            # No cyclic collection until the first frame (tui/app.py freezes what start-up built
            # then, and enables it again): it walked Textual's objects a hundred times on the way.
            gc.disable()
            return _load(TUI_RUNNER)(args)
        if command.action and args.readonly:
            raise UsageError(f"--readonly: `{command.name}` is an action and is refused; run without --readonly")
        return _load(command.runner)(args)
    except UsageError as exc:
        print(f"radixtop: {exc}", file=sys.stderr)
        return ExitStatus.USAGE
    except KeyboardInterrupt:
        return ExitStatus.INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`radixtop analyze ... | head`): no traceback, and no second
        # BrokenPipeError when Python flushes stdout on the way out.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return ExitStatus.PIPE_CLOSED
