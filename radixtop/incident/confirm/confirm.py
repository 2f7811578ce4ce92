"""The confirmation run: is the failure capacity pressure, the cache itself, or a defect that stays?

The seed's checklist as one action, built for the moment it is needed: usually right after the
server died, on a node whose GPUs it may still hold, with a colleague watching the same node.

1. ``prepare()`` (async): evidence first (a bundle), then a :class:`Plan`. The live server's
   launch command comes from psutil while it lives, else from what was seen of it while it lived
   (a :class:`~radixtop.incident.common.sighting.Sighting`: argv, /server_info, environment, GPUs), else
   from ``/server_info`` (flags only) or the user. The plan has two arms, run one after the other
   with the same workload and seeds:

   * with the original alive: the baseline (the live server itself) and the control;
   * with the original gone (or stopped first, which needs the user's explicit ``stop``): a
     reproduction (the original flags) and the control, each on a free loopback port;
   * ``--no-reproduction``: the control only, the original's crash log standing as the baseline.

   The control is the same launch with ``--max-running-requests`` divided and, by default,
   ``--disable-radix-cache``. New servers are placed on GPUs with room for them (NVML, see
   placement.py); one that cannot fit is never started. Nothing has been started or sent yet.
2. The caller shows ``plan.describe()`` and asks the user; ``plan.blockers`` say why it cannot
   start at all (one line each, with what to pass).
3. ``ConfirmationRun(plan).run()`` (async, radixtop/incident/confirm/confirm_run.py): each arm in turn
   (start, wait for health within ``--control-timeout`` showing the server's own progress lines, replay
   while watching its log and ``/metrics``, stop), then a :class:`~radixtop.incident.confirm.verdict.Verdict`
   with the arms side by side.

Progress goes to ``on_event`` as :class:`ConfirmEvent`. ``cancel()`` (any thread, a signal
handler) stops at once: in-flight calls are abandoned and every server radixtop started is
stopped. The live server is touched only by the replayed requests and the cache flushes, unless
the plan stops it (``stop_original``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from radixtop.incident.common.redact import Redactor
from radixtop.incident.common.sighting import Sighting, behaviour_env, load_sighting, observe, save_sighting
from radixtop.incident.confirm.control_server import (
    CACHE_MODES,
    CommandSource,
    LaunchCommand,
    LaunchError,
    build_control_argv,
    build_reproduction_argv,
    flag_value,
    free_loopback_port,
    launch_from_argv,
    parse_launch_command,
)
from radixtop.incident.confirm.detectors import detectors
from radixtop.incident.confirm.launch_env import LaunchEnv, launch_env
from radixtop.incident.confirm.placement import Placement, place
from radixtop.incident.confirm.startup import startup_seconds
from radixtop.incident.confirm.verdict import ROLE_NAMES, VERDICTS, ArmRole, Verdict
from radixtop.incident.replay.crash_dump import CrashDump, DumpError, crash_workload, shape_of
from radixtop.incident.replay.trace import (
    Trace,
    TraceError,
    check_recorded_ids,
    check_size,
    rescale_prefixes,
    save_trace,
)
from radixtop.incident.replay.vocab import SIM_VOCABULARY, VocabError, Vocabulary, for_server
from radixtop.probes.gpu import read_once
from radixtop.probes.server_info import MAX_RUNNING, LimitError, ServerLimits

__all__ = [
    "VERDICTS",
    "ArmPlan",
    "ConfirmCancelled",
    "ConfirmEvent",
    "ConfirmOptions",
    "Plan",
    "PlanError",
    "Verdict",
    "prepare",
]



# live: the ladder on the live server, started servers beside it; live-only: no GPU is free, the
# live server alone; relaunch: a reproduction of the original (gone, or stopped first); crash-log:
# the original's crash log stands for the workload as run (--no-reproduction).
PlanMode = Literal["live", "live-only", "relaunch", "crash-log"]


class PlanError(Exception):
    """No plan can be made: one line saying what to pass."""


class ConfirmCancelled(Exception):
    pass


@dataclass(frozen=True)
class ConfirmEvent:
    phase: str  # evidence, plan, stop-original, <role>-start, <role>, verdict, cleanup, cancelled
    message: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ConfirmOptions:
    url: str
    workdir: Path
    trace: Trace | None = None  # None: a pressure workload sized to the live server
    trace_label: str | None = None  # what the user passed as --trace (for the repeat command)
    runs: int = 3
    flush: bool = True
    logs: tuple[str, ...] = ()  # the live server's logs; discovered when empty
    pid: int | None = None  # the live server's pid; found by its port when None
    launch_command: str | None = None  # overrides psutil, the sighting and /server_info
    cache: str = "disable"  # "disable": a server without the cache may be started; "keep": never (left open)
    concurrency_divisor: int = 4  # the pressure ladder's lowest rung: max running requests / this
    control_args: tuple[str, ...] = ()  # extra flags for the server without the cache, overriding the live ones
    stop_original: bool = False  # stop the live server first, then reproduction + control
    reproduction: bool = True  # False: with the original gone, its crash log is the baseline
    control_timeout_s: float = 1200.0  # a real model loads for minutes
    gpus: str | None = None  # CUDA_VISIBLE_DEVICES for the servers radixtop starts (else chosen by NVML)
    own_env: bool = False  # start them with radixtop's environment when the server's is unreadable
    inherit_env: bool = False  # give them the server's whole environment, not its behaviour keys alone
    bundle: bool = True
    signature_files: tuple[str, ...] = ()
    min_severity: str = "error"  # signatures at or above this count for the verdict
    request_timeout_s: float = 120.0
    sighting: Sighting | None = None  # what the caller saw of the server while it lived (the TUI)
    crash_dump_folder: str | None = None  # where radixtop told the server to dump its requests
    vocab_size: int | None = None  # --vocab-size: the model's vocabulary when its files are not here
    detectors: bool = False  # the started servers run SGLang's own corruption detectors (detectors.py)


@dataclass
class ArmPlan:
    """One side of the comparison: the live server, or a server radixtop starts."""

    role: ArmRole  # "baseline" (the live server), "reproduction" or "control" (the cache off)
    url: str
    argv: list[str] | None = None  # None: the live server, which radixtop does not start
    port: int | None = None
    output: Path | None = None  # the started server's stdout and stderr
    logs: list[str] = field(default_factory=list)  # watched for signatures
    env: dict[str, str] | None = field(default=None, repr=False)
    cwd: str | None = None
    changes: list[str] = field(default_factory=list)


@dataclass
class Plan:
    options: ConfirmOptions
    baseline_url: str  # the original server's URL
    server_pid: int | None
    server_version: str | None
    live: LaunchCommand
    mode: PlanMode
    failing: ArmPlan | None  # the server the ladder runs on: the live one or a reproduction; None: the crash log
    restart: ArmPlan | None  # the reproduction that replaces a failing server that died; None: none may start
    control: ArmPlan | None  # the server without the cache; None: not asked (why in ``unasked``)
    ladder: tuple[int, ...]  # calls in flight for each rung below the workload as recorded, lowest first
    max_running: int | None  # the original's max running requests (the ladder's top below as recorded)
    placement: Placement
    baseline_logs: list[str]  # the original's logs
    trace: Trace
    trace_path: Path
    workload_origin: str = ""  # where the workload comes from: given, the crash's own, or made up
    vocab: Vocabulary | None = SIM_VOCABULARY  # where made-up prompts draw their ids; None: unknown (a blocker)
    launch_env: LaunchEnv | None = None  # what the started servers run with (None: none is started)
    unasked: dict[str, str] = field(default_factory=dict)  # a question no step can answer: why ("cache": ...)
    startup_s: float | None = None  # the original's own start-up (server_args to "fired up"), seconds
    bundle: Any = None  # BundleResult
    notes: list[str] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)  # why it cannot start; what to pass
    planned_from: str | None = None  # "the server died at T; planned from what was seen at T0"
    timings: dict[str, float] = field(default_factory=dict)  # seconds: evidence, plan
    redactor: Redactor = field(default_factory=Redactor, repr=False)

    @property
    def arms(self) -> list[ArmPlan]:
        """Every server the plan may use, the failing one first."""
        found = [a for a in (self.failing, self.restart, self.control) if a is not None]
        return [a for i, a in enumerate(found) if a not in found[:i]]

    @property
    def control_argv(self) -> list[str]:
        return list(self.control.argv or []) if self.control is not None else []

    @property
    def stops_original(self) -> bool:
        return self.options.stop_original and self.server_pid is not None and self.mode == "relaunch"

    @property
    def calls(self) -> int:
        return sum(r.n for r in self.trace.requests)

    @property
    def runs_calls(self) -> int:
        return self.options.runs * self.calls

    def repeat_command(self) -> list[str]:
        o = self.options
        argv = ["radixtop", "confirm", "--url", self.baseline_url, "--trace", str(self.trace_path),
                "--runs", str(o.runs), "--control-cache", o.cache,
                "--concurrency-divisor", str(o.concurrency_divisor)]
        for log in self.baseline_logs:
            argv += ["--log", log]
        if not o.flush:
            argv.append("--no-flush")
        if o.launch_command:
            argv += ["--launch-command", o.launch_command]
        for arg in o.control_args:
            argv.append(f"--control-arg={arg}")
        if o.stop_original:
            argv.append("--stop-original")
        if not o.reproduction:
            argv.append("--no-reproduction")
        if o.gpus:
            argv += ["--gpus", o.gpus]
        if o.own_env:
            argv.append("--own-env")
        if o.inherit_env:
            argv.append("--inherit-env")
        if o.control_timeout_s != ConfirmOptions.control_timeout_s:
            argv += ["--control-timeout", f"{o.control_timeout_s:g}"]
        if o.vocab_size is not None:
            argv += ["--vocab-size", str(o.vocab_size)]
        if o.detectors:
            argv.append("--detectors")
        return self.redactor.argv(argv)

    def describe(self) -> list[str]:
        """The plan as lines, for the approval prompt (secrets redacted)."""
        o = self.options
        duration = max((r.offset_ms for r in self.trace.requests), default=0) / 1000.0
        lines = [
            f"Live server   {self.baseline_url}  pid {self.server_pid or '?'}  {self.server_version or ''}".rstrip()
        ]
        if self.planned_from:
            lines.append(f"  DOWN: {self.planned_from}")
        lines += [
            f"  launched as ({self.live.source}): {shlex.join(self.redactor.argv(self.live.argv))}",
            "  logs watched: "
            f"{', '.join(self.baseline_logs) or '(none found: signatures cannot be watched; pass --log)'}",
            f"Evidence      {self.bundle.path if self.bundle is not None else '(no bundle taken)'}",
            (
                f"Workload      {self.trace.name}: {len(self.trace.requests)} requests, {self.calls} calls "
                f"over {duration:.1f} s at temperature 0 ({self.trace_path})"
            ),
            *([f"  {self.workload_origin}"] if self.workload_origin else []),
            f"  token ids from the model's vocabulary: {self.vocab.describe() if self.vocab else 'unknown'}",
            f"Runs          {o.runs} per step, the same workload and prompts; "
            + ("the cache is flushed before each run (POST /flush_cache)" if o.flush
               else "no cache flush (--no-flush)"),
            *self.placement.lines,
        ]
        if self.launch_env is not None and any(arm.argv is not None for arm in self.arms):
            lines += self.launch_env.describe(self.redactor)  # every started server runs with it
        lines += self.experiment_lines()
        for arm in self.arms:
            if arm.argv is None:
                continue
            lines += [
                f"Server        {ROLE_NAMES[arm.role]}: {shlex.join(self.redactor.argv(arm.argv))}",
                f"  on {arm.url}, output in {arm.output}",
            ]
            lines += [f"  change: {c}" for c in arm.changes]
        if self.mode in ("live", "live-only"):
            lines.append("Live server   left running by radixtop (it is never stopped unless you pass --stop-original)")
        elif self.stops_original:
            lines.append(f"Live server   STOPPED FIRST (pid {self.server_pid}), as asked (--stop-original)")
        else:
            lines.append("Live server   already down: nothing of it is touched")
        lines += [f"Note          {n}" for n in self.notes]
        lines += [f"CANNOT START  {b}" for b in self.blockers]
        return lines

    def load_time(self) -> str:
        return f"~{self.startup_s:.0f} s to load, as the original took" if self.startup_s is not None else (
            "its load time unknown (no start-up in the original's log)")

    def steps(self) -> list[str]:
        """The experiment's steps in the order they may run, each with the question it answers."""
        where = ROLE_NAMES["baseline" if self.mode in ("live", "live-only") else "reproduction"]
        out = [f"lower load: at most {k} calls in flight on {where}: does it fail below the pressure of the "
               "workload as recorded?" + (" (failing under pressure already: down by halves until clean)"
                                          if n == 0 else "") for n, k in enumerate(self.ladder)]
        out.append("as run: the original's crash log stands for the workload as recorded" if self.mode == "crash-log"
                   else f"as run: the workload as recorded on {where}: does it fail at all?")
        restart = (f"if the server died, a reproduction restarted with SGLANG_RADIX_FORCE_MISS=1, "
                   f"{self.load_time()}" if self.restart is not None else "")
        out.append("reuse off at the failing load: a cache namespace per request on the same server"
                   + (f" (or, {restart})" if restart else "") + ": does it fail without prefix hits?")
        if self.control is not None:
            out.append(f"cache off at the failing load: a server started with --disable-radix-cache, "
                       f"{self.load_time()}, unless reuse was needed: does it fail without the cache?")
        return out

    def experiment_lines(self) -> list[str]:
        lines = ["Experiment    one condition changed per step, from the lowest load up; a step runs only while its "
                 "question is open (a clean rung leaves the server up, a failing one may end it)"]
        lines += [f"  {n} {text}" for n, text in enumerate(self.steps(), 1)]
        lines.append("  a changed step clean below the pressure the failure came at is tried again at more load: a "
                     "change that also lowers the pressure decides nothing")
        if self.restart is not None and self.mode != "crash-log":
            lines.append(f"  a failing server that dies is replaced by a reproduction ({self.load_time()})")
        lines += [f"  open: {what}: {why}" for what, why in self.unasked.items()]
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline_url": self.baseline_url,
            "server_pid": self.server_pid,
            "server_version": self.server_version,
            "mode": self.mode,
            "planned_from": self.planned_from,
            "live_argv": self.redactor.argv(self.live.argv),
            "live_argv_source": self.live.source,
            "baseline_logs": list(self.baseline_logs),
            "arms": [
                {"role": a.role, "url": a.url, "argv": self.redactor.argv(a.argv) if a.argv else None,
                 "output": str(a.output) if a.output else None, "changes": list(a.changes)}
                for a in self.arms
            ],
            "ladder": list(self.ladder),
            "steps": self.steps(),
            "unasked": dict(self.unasked),
            "startup_s": self.startup_s,
            "environment": None if self.launch_env is None else {
                "inherited": self.launch_env.inherited, "cwd": self.launch_env.cwd,
                "carried": list(self.launch_env.carried), "left_out": list(self.launch_env.dropped),
                "env": self.redactor.env(self.launch_env.env)},
            "gpus": {"status": self.placement.status, "visible": self.placement.visible, "need": self.placement.need},
            "workload": {
                "name": self.trace.name,
                "origin": self.workload_origin,
                "path": str(self.trace_path),
                "requests": len(self.trace.requests),
                "calls": self.calls,
                "vocab_size": self.vocab.size if self.vocab else None,
                "vocab_source": self.vocab.source if self.vocab else None,
            },
            "runs": self.options.runs,
            "flush": self.options.flush,
            "stop_original": self.stops_original,
            "bundle": None if self.bundle is None else str(self.bundle.path),
            "notes": list(self.notes),
            "blockers": list(self.blockers),
            "timings": dict(self.timings),
            "repeat": self.repeat_command(),
        }


# -- planning -------------------------------------------------------------------------------------


async def _server_info(url: str, timeout_s: float = 5.0) -> dict[str, Any] | None:
    from radixtop.incident.common.server import auth_headers
    from radixtop.probes.http import make_client
    from radixtop.probes.server_info import read_server_info

    async with make_client(timeout_s) as client:
        client.headers.update(auth_headers())
        return await read_server_info(client, url, timeout_s)


def _limits(info: Mapping[str, Any] | None, url: str) -> ServerLimits:
    """The numbers the plan is sized from; PlanError (one line) when /server_info's are not a server's."""
    try:
        return ServerLimits.read(info, f"{url}/server_info")
    except LimitError as exc:
        raise PlanError(str(exc)) from None


def _live_launch(
    options: ConfirmOptions, info: Mapping[str, Any] | None, pid: int | None, seen: Sighting | None
) -> LaunchCommand:
    from radixtop.incident.common.server import executable_trust, process_argv, process_cwd, server_interpreter

    python, why_not = server_interpreter(pid) if pid is not None else (None, "the server is gone")
    if python is None and seen is not None and seen.python and executable_trust(seen.python) is None:
        python = seen.python  # trusted when it was seen, and still
    cwd = process_cwd(pid) or (seen.cwd if seen is not None else None)
    if options.launch_command:
        return replace(parse_launch_command(options.launch_command, source="given",
                                            version=(info or {}).get("version"), python=python), cwd=cwd)
    argv = process_argv(pid)
    source: CommandSource = "psutil"
    if not (argv and any(a.startswith("--") for a in argv)) and seen is not None and seen.argv:
        argv, source = list(seen.argv), "seen"
    if argv and any(a.startswith("--") for a in argv):
        live = launch_from_argv(argv, source=source)
        if live.kind == "unknown":  # a proxy or a wrapper on the port: relaunching it confirms nothing
            raise PlanError(
                f"the process listening on the server's port ({shlex.join(live.program)[:80]}) is neither SGLang "
                "nor radixtop's simulator; pass --launch-command '...' with the server's own command"
            )
        return replace(live, program=_trusted_program(live.program, python, why_not, cwd), cwd=cwd)
    text = (info or {}).get("launch_command")
    if isinstance(text, str) and text.strip():
        cmd = parse_launch_command(text, version=str((info or {}).get("version", "")), python=python)
        return replace(cmd, cwd=cwd)
    raise PlanError(
        "cannot learn the server's launch command (no local process on its port, none seen while it lived and "
        "no launch_command in /server_info); pass --launch-command '...' (split like a shell, never run by one)"
    )


def _untrusted_module(live: LaunchCommand, launch: LaunchEnv) -> str | None:
    """Why the module the server's program runs with -m must not run as the started servers
    would run it; None when it may (or it runs none)."""
    program = list(live.program)
    if "-m" not in program[1:-1]:
        return None
    return launch.module_problem(program[program.index("-m", 1) + 1])


def _runs_inline_code(arg: str) -> bool:
    """python -c CODE, alone or among combined short options (-uc, -Bc) before an -X/-W value."""
    if not arg.startswith("-") or arg.startswith("--"):
        return False
    letters = arg[1:].split("W")[0].split("X")[0]
    return "c" in letters


def _trusted_program(program: Sequence[str], python: str | None, why_not: str, cwd: str | None) -> tuple[str, ...]:
    """The server's program as radixtop may run it: argv[0] is the process's own choice (``exec -a
    /any/dir/python``), so the interpreter is the one the kernel says it runs, checked as the
    bundle checks it (radixtop.incident.common.server.executable_trust); a script it runs (a console
    script, launch_server.py) must pass the same check. PlanError when it cannot."""
    from radixtop.incident.common.server import executable_trust

    if not program or "python" not in os.path.basename(program[0]).lower():
        raise PlanError(f"the server's program {program[0] if program else '?'} is not a Python interpreter "
                        "radixtop can vouch for; pass --launch-command '...' with the command to run")
    if python is None:
        raise PlanError(f"{why_not}; pass --launch-command '...' with the command to run")
    if any(_runs_inline_code(a) for a in program[1:]):
        raise PlanError("the server's program runs code given on its command line (python -c): radixtop runs no "
                        "code it cannot vouch for; pass --launch-command '...' with the command to run")
    out = [python]
    for arg in program[1:]:
        path = arg if os.path.isabs(arg) or cwd is None else os.path.join(cwd, arg)
        if not arg.startswith("-") and os.path.isfile(path):
            why = executable_trust(path)
            if why is not None:
                raise PlanError(f"the server's script {arg} is not run: {why}; pass --launch-command '...'")
        out.append(arg)
    return tuple(out)


def _baseline_logs(options: ConfirmOptions, live: LaunchCommand, pid: int | None, seen: Sighting | None) -> list[str]:
    from radixtop.incident.common.server import stdout_log_paths

    if options.logs:
        return list(options.logs)
    found: list[str] = []
    # A path named by /server_info is network text: never read into a bundle (the process's own
    # stdout, found by psutil, and the user's --log are).
    log_file = flag_value(live.flags, "--log-file") if live.source != "server_info" else None
    if log_file:
        given = Path(log_file)
        if not given.is_absolute() and live.cwd:
            given = Path(live.cwd) / given
        found.append(str(given))
    real = {os.path.realpath(p) for p in found}
    for path in [*stdout_log_paths(pid), *(seen.logs if seen is not None else ())]:
        if os.path.realpath(path) not in real:
            found.append(path)
            real.add(os.path.realpath(path))
    return found


def _max_running(live: LaunchCommand, limits: ServerLimits) -> int | None:
    """The live server's max running requests: its flag, /server_info's server argument, else
    what the scheduler settled on (SGLang sizes it from the KV pool when the flag is absent, the
    usual case; 0.5.23 reports it per DP rank in internal_states)."""
    flag = flag_value(live.flags, "--max-running-requests")
    if flag is not None and flag.isdigit() and 1 <= int(flag) <= MAX_RUNNING:
        return int(flag)
    return limits.max_running_requests or limits.effective_max_running_requests


def _server_env(options: ConfirmOptions, pid: int | None, alive: bool, seen: Sighting | None, cwd: str | None,
                notes: list[str], blockers: list[str]) -> LaunchEnv:
    """What the started servers run with: a clean environment over the live server's behaviour
    keys (read now, else what was seen of it), in a working directory that passes the ownership
    rule (incident/confirm/launch_env.py); its whole environment with --inherit-env."""
    from radixtop.incident.common.server import process_environ

    server_env = process_environ(pid) if alive else None
    if server_env is None:
        if alive and pid is not None and _running(pid) and not options.own_env:
            blockers.append(
                f"the live server's environment is not readable (pid {pid} is another user's process?): run radixtop "
                "as the server's user, or pass --own-env to start the servers with radixtop's environment"
            )
        if seen is not None and seen.env:
            missing = [k for k in seen.secret_keys if k not in seen.env and k not in os.environ]
            if missing:
                notes.append(f"secret keys the server had are not kept on disk and not set here: {', '.join(missing)}; "
                             "export them before confirming if the server needs them")
            server_env = {**behaviour_env(os.environ), **seen.env}
        else:
            if not alive:
                notes.append("the server's environment was never seen: the servers start with radixtop's")
            server_env = dict(os.environ)
    return launch_env(server_env, os.environ, server_cwd=cwd, run_dir=str(options.workdir),
                      inherit=options.inherit_env)


def _vocabulary(options: ConfirmOptions, info: Mapping[str, Any] | None, live: LaunchCommand,
                seen: Sighting | None) -> tuple[Vocabulary | None, str | None]:
    """The model's vocabulary, from --vocab-size or its files (named by /server_info or the launch
    command's --model-path); else None and the blocker that says what to pass."""
    if options.vocab_size is not None:
        if options.vocab_size < 16:
            raise PlanError(f"--vocab-size must be at least 16, got {options.vocab_size}")
        return Vocabulary(options.vocab_size, (), "--vocab-size"), None
    named = dict(info or {})
    for key, flag in (("model_path", "--model-path"), ("tokenizer_path", "--tokenizer-path")):
        if not named.get(key):
            named[key] = flag_value(live.flags, flag) or flag_value(live.flags, "--model")
    try:
        return for_server(named, env=seen.env if seen is not None else None, kind=live.kind), None
    except VocabError as exc:
        if (
            options.trace is not None
            and all(r.input_ids is not None or r.text is not None for r in options.trace.requests)
        ):
            return Vocabulary(1 << 31, (), "the trace's recorded prompts"), None  # nothing is made up
        return None, str(exc)


def _running(pid: int | None) -> bool:
    """The process exists and is not a zombie (a dead server's pid may linger unreaped)."""
    import psutil

    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _planned_down(url: str, seen: Sighting | None, options: ConfirmOptions, notes: list[str]) -> str | None:
    """For a server found down: what the plan is made from (what was seen of it, else the launch
    command given); PlanError when neither."""
    if seen is not None:
        return seen.describe_age()
    if not options.launch_command:
        raise PlanError(
            f"{url} does not answer and radixtop never saw it alive (nothing remembered for it); pass "
            "--launch-command '...' with the server's command (and --log) to plan a reproduction"
        )
    notes.append(f"{url} does not answer: the server is down; the plan relaunches the command you gave")
    return None


async def _died_meanwhile(url: str, pid: int | None, seen: Sighting | None) -> str | None:
    """None while the server lives; else what the plan is made from. `c` pressed as a server dies
    finds its pid still there (it outlives the port for a moment) and gone once the evidence is
    taken: the plan is then made as for a server found down."""
    if _running(pid) or await _server_info(url) is not None:  # the pid first: no request when it lives
        return None
    if seen is None:
        return "the server died while the evidence was taken"
    at = time.strftime("%H:%M:%S", time.localtime(seen.last_seen))
    return f"the server died while the evidence was taken; planned from what was seen at {at}"


def _check_options(options: ConfirmOptions) -> None:
    if options.runs < 1:
        raise PlanError(f"--runs must be at least 1, got {options.runs}")
    if options.cache not in CACHE_MODES:
        raise PlanError(f"--control-cache {options.cache!r}: choose one of {', '.join(CACHE_MODES)}")
    if options.concurrency_divisor < 1:
        raise PlanError(f"--concurrency-divisor must be at least 1, got {options.concurrency_divisor}")


async def _evidence(options: ConfirmOptions, workdir: Path, url: str, logs: list[str], pid: int | None,
                    own: OwnWorkload, emit: Callable[[ConfirmEvent], None],
                    cancel: threading.Event | None, notes: list[str]) -> Any:
    """The evidence bundle, taken before anything else (None with --no-bundle, or a note why not)."""
    if not options.bundle:
        return None
    from radixtop.incident.bundle.bundle import BundleError, take_bundle

    def relay(p: Any) -> None:
        if p.step != "done":  # announced below, with the path as data
            emit(ConfirmEvent("evidence", p.message, {"done": p.done, "total": p.total}))

    emit(ConfirmEvent("evidence", "preserving evidence first: taking a bundle of the server"
                      + ("" if pid is not None else " (down: its logs and what is left)")))
    try:
        bundle = await asyncio.to_thread(
            take_bundle, workdir / "evidence", url=url, logs=logs, pid=pid,
            reason="confirm", signature_files=options.signature_files, cancel=cancel, on_progress=relay,
            workload=lambda _logs: own.shape(),
        )
    except BundleError as exc:
        if cancel is not None and cancel.is_set():
            raise ConfirmCancelled("cancelled while taking the bundle") from None
        notes.append(f"no evidence bundle: {exc}")
        return None
    emit(ConfirmEvent("evidence", f"bundle written: {bundle.path}", {"bundle": str(bundle.path)}))
    return bundle


@dataclass(frozen=True)
class OwnWorkload:
    """The crash's own workload, read once for the plan and the evidence bundle both."""

    found: tuple[Trace, CrashDump] | None
    unreadable: DumpError | None = None

    @classmethod
    def read(cls, options: ConfirmOptions, info: Mapping[str, Any] | None, logs: list[str]) -> OwnWorkload:
        try:
            return cls(crash_workload(logs, info, options.crash_dump_folder))
        except DumpError as exc:
            return cls(None, exc)

    def shape(self) -> tuple[str, dict[str, Any]] | None:
        if self.unreadable is not None:
            raise self.unreadable  # the bundle notes it, as it notes any source it cannot read
        return shape_of(self.found)


def _workload(options: ConfirmOptions, limits: ServerLimits, own: OwnWorkload, max_running: int | None,
              notes: list[str]) -> tuple[Trace, str]:
    """The workload and where it comes from: given (--trace), the crash's own (a dump, a request
    log), else token pressure made up to the server's size."""
    from radixtop.incident.replay.workloads import pressure_trace

    trace, origin = options.trace, f"given: {options.trace_label or options.trace.name}" if options.trace else ""
    if trace is None:
        if own.unreadable is not None:
            notes.append(f"the server's crash dump cannot be read: {own.unreadable}")
        if own.found is not None:
            trace, dump = own.found
            whose = "the crash's own" if dump.path.suffix == ".pkl" else "the server's logged requests"
            origin = f"{whose}: {dump.summary()}; made-up pressure is the fallback (--trace to choose)"
    server_page = limits.page_size
    if (trace is not None and trace.prefix_unit == "pages" and server_page is not None
            and server_page != trace.page_size_hint):
        # A trace's boundary cases are written in pages (finding_03330: a prefix of exactly one
        # page): replayed as written against another page size they would test nothing.
        notes.append(f"the trace's prefixes were written for page size {trace.page_size_hint}; "
                     f"rescaled to the server's {server_page}")
        trace = rescale_prefixes(trace, server_page)
    if trace is not None:
        return trace, origin
    if limits.max_total_num_tokens is None:
        raise PlanError("no /server_info to size a pressure workload from; pass --trace (a file or a built-in name)")
    trace = pressure_trace(
        limits.max_total_num_tokens, max_running or 32,
        page_size=limits.page_size or 1, max_input_len=limits.max_req_input_len,
    )
    try:
        check_size(trace, f"a pressure workload for a {limits.max_total_num_tokens:,}-token pool",
                   fix="pass --trace (a file or a built-in name)")
    except TraceError as exc:
        raise PlanError(str(exc)) from None
    return trace, ("made up: token pressure sized to the server (no crash dump of it found; SGLang writes one "
                   "with --crash-dump-folder)")


def _placement(options: ConfirmOptions, live: LaunchCommand, gpu_sample: Any, pid: int | None, seen: Sighting | None,
               notes: list[str], blockers: list[str]) -> Placement:
    """Where the started servers go. With the original alive (``pid``) and no GPU free, none is
    started: the experiment keeps to the live server (a blocker only when the original is gone)."""
    from radixtop.incident.common.server import process_tree

    original_pids = {p.pid for p in process_tree(pid)} if pid else set()
    original_use = {g.uuid: g.used_bytes for g in (seen.gpus if seen is not None else ())}
    placement = place(live.kind, live.flags, gpu_sample, original_pids=original_pids, original_use=original_use,
                      original_gone=pid is None, will_stop=options.stop_original, given=options.gpus)
    if placement.status == "no-room" and pid is None:
        blockers.append(placement.lines[0].removeprefix("GPUs").strip())
    if placement.status == "unknown":
        notes.append("GPU placement is unknown: approving starts the servers anyway")
    return placement


def _ladder(max_running: int | None, divisor: int, notes: list[str]) -> tuple[int, ...]:
    """Calls in flight for each rung below the workload as recorded: from max running / divisor,
    doubling while below max running."""
    if max_running is None:
        notes.append("the live server's max running requests is unknown: the pressure ladder has one rung, 4 in flight")
        return (4,)
    rungs: list[int] = []
    k = max(1, max_running // divisor)
    while k < max_running and divisor > 1:
        rungs.append(k)
        k *= 2
    return tuple(rungs)


def _started_arm(role: ArmRole, options: ConfirmOptions, live: LaunchCommand, workdir: Path,
                 placement: Placement, launch: LaunchEnv) -> ArmPlan:
    """A server the plan starts: the reproduction (the original's flags) or the control (the cache off)."""
    env = launch.env
    port = free_loopback_port()
    output = workdir / f"{role}.out"
    log_file = workdir / f"{role}.log"
    try:
        if role == "control":
            argv, changes = build_control_argv(live, port=port, log_file=log_file, extra=options.control_args)
        else:
            argv, changes = build_reproduction_argv(live, port=port, log_file=log_file)
    except LaunchError as exc:
        raise PlanError(str(exc)) from None
    program, flags = argv[: len(live.program)], argv[len(live.program) :]
    flags, arm_env, placed = placement.apply(flags, env)
    if options.detectors:
        flags, arm_env, found = detectors(live.kind, flags, arm_env)
        placed = [*placed, *found]
    if arm_env is not None and arm_env.get("RADIXTOP_INSTRUMENT") == "1":
        # Its own debug endpoints, never the original's ports: a radixtop watching the original
        # must not take the arm's tree for the original's.
        arm_env = {**arm_env, "RADIXTOP_INSTRUMENT_PORT": str(free_loopback_port())}
        placed = [*placed, f"radixtop's debug endpoint from 127.0.0.1:{arm_env['RADIXTOP_INSTRUMENT_PORT']} "
                  "(its own, not the original's)"]
    watched = [str(output)] + ([str(log_file)] if live.kind == "radixtop-sim" else [])
    return ArmPlan(role, f"http://127.0.0.1:{port}", [*program, *flags], port, output, watched, arm_env,
                   launch.cwd, changes + placed)


async def prepare(
    options: ConfirmOptions,
    on_event: Callable[[ConfirmEvent], None] | None = None,
    cancel: threading.Event | None = None,
) -> Plan:
    """Evidence first (a bundle), then the plan. Starts and stops nothing; sends no workload."""
    from radixtop.incident.common.server import base_url, listening_pid, url_port
    from radixtop.probes.http import is_loopback_url

    emit = on_event or (lambda event: None)
    began = time.monotonic()
    timings: dict[str, float] = {}
    _check_options(options)
    url = base_url(options.url)
    workdir = Path(options.workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlanError(f"cannot create the work directory {workdir}: {exc.strerror or exc}; pass --workdir") from None
    notes: list[str] = []
    blockers: list[str] = []
    info = await _server_info(url)
    pid = options.pid
    if pid is None and is_loopback_url(url):
        pid = listening_pid(url_port(url))
    alive = info is not None or _running(pid)
    seen = options.sighting if options.sighting is not None and options.sighting.url == url else load_sighting(url)
    planned_from = None if alive else _planned_down(url, seen, options, notes)
    info = info if info is not None else (dict(seen.server_info) if seen is not None and seen.server_info else None)
    if not is_loopback_url(url):
        notes.append(f"{url} is not on this machine's loopback: the servers start here, on 127.0.0.1")
    try:
        live = _live_launch(options, info, pid if alive else None, seen)
    except LaunchError as exc:
        raise PlanError(str(exc)) from None
    notes += list(live.notes)
    gpu_sample = await asyncio.to_thread(read_once) if live.kind in ("sglang", "vllm") and not options.gpus else None
    if alive:
        with contextlib.suppress(OSError):  # remembered for a later plan, should it die
            seen = observe(url, pid, server_info=info, gpu_sample=gpu_sample, previous=seen, logs=options.logs)
            save_sighting(seen)
    redactor = Redactor()
    redactor.learn_env(os.environ)
    redactor.learn_argv(live.argv)
    if any("[REDACTED]" in a for a in live.argv):
        notes.append("secret flag values were not kept on disk ([REDACTED] in the command): pass --launch-command "
                     "with them, or --control-arg for each")
    baseline_logs = _baseline_logs(options, live, pid if alive else None, seen)

    evidence_began = time.monotonic()
    own = OwnWorkload.read(options, info, baseline_logs)
    bundle = await _evidence(options, workdir, url, baseline_logs, pid if alive else None, own, emit, cancel, notes)
    timings["evidence_s"] = round(time.monotonic() - evidence_began, 2)
    if alive and (died := await _died_meanwhile(url, pid, seen)) is not None:
        alive, planned_from = False, died
    limits = _limits(info, url)
    max_running = _max_running(live, limits)
    ladder = _ladder(max_running, options.concurrency_divisor, notes)
    trace, origin = _workload(options, limits, own, max_running, notes)
    vocab, no_vocab = _vocabulary(options, info, live, seen)
    if no_vocab is not None:
        blockers.append(no_vocab)
    try:
        if vocab is not None:
            check_recorded_ids(trace, vocab)
    except TraceError as exc:
        raise PlanError(str(exc)) from None
    trace_path = workdir / "workload.json"
    save_trace(trace, trace_path)

    # Where the started servers go, and whether the original must be stopped for them.
    placement = _placement(options, live, gpu_sample, pid if alive else None, seen, notes, blockers)
    mode: PlanMode
    if alive and not options.stop_original:
        mode = "live" if placement.can_start else "live-only"
    elif options.reproduction or alive:
        mode = "relaunch"
    else:
        mode = "crash-log"

    unasked: dict[str, str] = {}
    restart = control = launch = None
    if mode == "live-only":
        unasked["cache"] = ("no GPU is free to start a server without the cache beside the live server "
                            "(--stop-original stops it and uses its GPUs)")
        notes.append("no GPU is free: every step runs on the live server; should it die, no other is started")
    else:
        launch = _server_env(options, pid, alive, seen, live.cwd, notes, blockers)
        redactor.learn_env(launch.env)
        why_module = _untrusted_module(live, launch)
        if why_module is not None:
            raise PlanError(f"{why_module}; pass --launch-command '...' with a module radixtop can vouch for")
        restart = _started_arm("reproduction", options, live, workdir, placement, launch)
        if options.cache == "keep":
            unasked["cache"] = "--control-cache keep: no server without the cache is started"
        else:
            control = _started_arm("control", options, live, workdir, placement, launch)
    failing = ArmPlan("baseline", url, logs=baseline_logs) if mode in ("live", "live-only") else (
        restart if mode == "relaunch" else None)
    if flag_value(live.flags, "--api-key") is not None and mode in ("live", "live-only"):
        notes.append("the live server requires an API key: the baseline replay sends $RADIXTOP_API_KEY if set")
    if options.runs < 2:
        notes.append("with 1 run, divergence cannot be seen; only signatures count")
    plan = Plan(
        options=replace(options, url=url, sighting=None),
        baseline_url=url,
        server_pid=pid if alive else (seen.pid if seen is not None else None),
        server_version=str((info or {}).get("version", "")) or None,
        live=live,
        mode=mode,
        failing=failing,
        restart=restart,
        control=control,
        ladder=ladder,
        max_running=max_running,
        unasked=unasked,
        startup_s=startup_seconds(baseline_logs),
        placement=placement,
        launch_env=launch,
        baseline_logs=baseline_logs,
        trace=trace,
        trace_path=trace_path,
        workload_origin=origin,
        vocab=vocab,
        bundle=bundle,
        notes=notes,
        blockers=blockers,
        planned_from=planned_from,
        timings=timings,
        redactor=redactor,
    )
    timings["plan_s"] = round(time.monotonic() - began, 2)  # evidence included
    (workdir / "plan.json").write_text(json.dumps(plan.to_json(), indent=2) + "\n", encoding="utf-8")
    emit(ConfirmEvent("plan", "plan ready for approval", {"plan": plan.to_json()}))
    return plan
