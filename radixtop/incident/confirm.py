"""The confirmation run: is the failure capacity pressure, or a defect that stays under a control?

The seed's checklist as one action. Three steps, each visible to the user:

1. ``prepare()`` (async): evidence first (an evidence bundle of the live server), then a
   :class:`Plan`: the live server's launch command (psutil's cmdline of the listening process,
   or ``/server_info`` ``launch_command`` split with shlex, or one the user gives), the control
   command built from it (``radixtop.incident.launch``), the workload (a trace, or a pressure
   workload sized to the server), the runs. Nothing has been started or sent yet.
2. The caller shows ``plan.describe()`` and asks the user (the CLI on the terminal, the TUI in a
   modal). Nothing is launched or stopped without that.
3. ``ConfirmationRun(plan).run()`` (async): replay the workload against the live server (the
   baseline) while watching its log; optionally stop the live server (only with
   ``stop_original``); start the control on a free loopback port with its output captured, wait
   for its health (bounded), replay the same workload against it while watching its log; stop it;
   give a :class:`Verdict`:

   * ``pressure-dependent``: a signature or a divergence in the baseline, gone under the control;
   * ``persists-under-control``: still there under the control (an unconditional defect or
     another cause: the competing hypothesis stays open);
   * ``not-reproduced``: the baseline itself came out clean;
   * ``inconclusive``: the control could not run (why, with its output's tail).

Progress goes to ``on_event`` as :class:`ConfirmEvent` (phase, message, data). ``cancel()`` (from
any thread, or a signal handler) stops the run at once: in-flight calls are abandoned and the
control server is stopped, so nothing is left behind. The live server is never touched except
by the replayed requests and the cache flushes between runs, unless ``stop_original`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from radixtop.incident.divergence import DivergenceReport, compare_runs
from radixtop.incident.launch import (
    CACHE_MODES,
    ControlProcess,
    LaunchCommand,
    LaunchError,
    build_control_argv,
    flag_value,
    free_loopback_port,
    launch_from_argv,
    parse_launch_command,
    wait_healthy,
)
from radixtop.incident.redact import Redactor
from radixtop.incident.replay import ReplayEvent, replay_series, server_alive
from radixtop.incident.trace import Trace, plan_requests, rescale_prefixes, save_trace

__all__ = [
    "VERDICTS",
    "ConfirmCancelled",
    "ConfirmEvent",
    "ConfirmOptions",
    "ConfirmationRun",
    "Plan",
    "PlanError",
    "Verdict",
    "prepare",
]

VERDICTS = ("pressure-dependent", "persists-under-control", "not-reproduced", "inconclusive")
POLL_S = 0.25
SETTLE_S = 0.6  # after a replay, lines the server is still writing (a death is several lines)
STOP_ORIGINAL_GRACE_S = 15.0


class PlanError(Exception):
    """No plan can be made: one line saying what to pass."""


class ConfirmCancelled(Exception):
    pass


@dataclass(frozen=True)
class ConfirmEvent:
    phase: str  # evidence, plan, baseline, stop-original, control-start, control, verdict, cleanup, cancelled
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
    launch_command: str | None = None  # overrides psutil and /server_info
    cache: str = "disable"  # "disable": --disable-radix-cache; "keep": only the pressure changes
    concurrency_divisor: int = 4
    control_args: tuple[str, ...] = ()  # extra control flags, overriding the live ones
    stop_original: bool = False
    health_timeout_s: float = 900.0
    bundle: bool = True
    signature_files: tuple[str, ...] = ()
    min_severity: str = "error"  # signatures at or above this count for the verdict
    request_timeout_s: float = 120.0


@dataclass
class Plan:
    options: ConfirmOptions
    baseline_url: str
    server_pid: int | None
    server_version: str | None
    live: LaunchCommand
    control_argv: list[str]
    control_changes: list[str]
    control_port: int
    control_output: Path
    control_logs: list[str]
    control_cwd: str | None
    control_env: dict[str, str] | None = field(repr=False)
    baseline_logs: list[str]
    trace: Trace
    trace_path: Path
    control_summary: str = ""  # the condition the control changes, in a few words
    bundle: Any = None  # BundleResult
    notes: list[str] = field(default_factory=list)
    redactor: Redactor = field(default_factory=Redactor, repr=False)

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    @property
    def calls(self) -> int:
        return sum(r.n for r in self.trace.requests)

    def repeat_command(self) -> list[str]:
        o = self.options
        argv = ["radixtop", "confirm", "--url", self.baseline_url, "--trace", str(self.trace_path),
                "--runs", str(o.runs), "--control-cache", o.cache,
                "--concurrency-divisor", str(o.concurrency_divisor)]  # fmt: skip
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
        return self.redactor.argv(argv)

    def describe(self) -> list[str]:
        """The plan as lines, for the approval prompt (secrets redacted)."""
        o = self.options
        duration = max((r.offset_ms for r in self.trace.requests), default=0) / 1000.0
        lines = [
            f"Live server   {self.baseline_url}  pid {self.server_pid or '?'}  {self.server_version or ''}".rstrip(),
            f"  launched as ({self.live.source}): {shlex.join(self.redactor.argv(self.live.argv))}",
            f"  logs watched: {', '.join(self.baseline_logs) or '(none found: signatures cannot be watched; pass --log)'}",
            f"Evidence      {self.bundle.path if self.bundle is not None else '(no bundle taken)'}",
            (
                f"Workload      {self.trace.name}: {len(self.trace.requests)} requests, {self.calls} calls "
                f"over {duration:.1f} s at temperature 0 ({self.trace_path})"
            ),
            f"Runs          {o.runs} against the live server, then {o.runs} against the control; "
            + ("the cache is flushed before each run (POST /flush_cache)" if o.flush else "no cache flush (--no-flush)"),
            f"Control       {shlex.join(self.redactor.argv(self.control_argv))}",
            f"  on {self.control_url}, output in {self.control_output}",
        ]
        lines += [f"  change: {c}" for c in self.control_changes]
        lines.append(
            "Live server   STOPPED before the control starts (--stop-original)"
            if o.stop_original
            else "Live server   left running (it is never stopped unless you pass --stop-original)"
        )
        lines += [f"Note          {n}" for n in self.notes]
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline_url": self.baseline_url,
            "server_pid": self.server_pid,
            "server_version": self.server_version,
            "live_argv": self.redactor.argv(self.live.argv),
            "live_argv_source": self.live.source,
            "baseline_logs": list(self.baseline_logs),
            "control_argv": self.redactor.argv(self.control_argv),
            "control_url": self.control_url,
            "control_changes": list(self.control_changes),
            "control_summary": self.control_summary,
            "control_output": str(self.control_output),
            "workload": {
                "name": self.trace.name,
                "path": str(self.trace_path),
                "requests": len(self.trace.requests),
                "calls": self.calls,
            },
            "runs": self.options.runs,
            "flush": self.options.flush,
            "stop_original": self.options.stop_original,
            "bundle": None if self.bundle is None else str(self.bundle.path),
            "notes": list(self.notes),
            "repeat": self.repeat_command(),
        }


# -- planning -------------------------------------------------------------------------------------


async def _server_info(url: str, timeout_s: float = 5.0) -> dict[str, Any] | None:
    from radixtop.incident.server import auth_headers

    async with httpx.AsyncClient(timeout=timeout_s, headers=auth_headers()) as client:
        for path in ("/server_info", "/get_server_info"):
            try:
                response = await client.get(f"{url}{path}")
            except httpx.HTTPError:
                return None
            if response.status_code == 200:
                try:
                    body = response.json()
                except ValueError:
                    return None
                return body if isinstance(body, dict) else None
    return None


def _live_launch(options: ConfirmOptions, info: dict[str, Any] | None, pid: int | None) -> LaunchCommand:
    from radixtop.incident.server import process_argv, process_cwd, process_python

    if options.launch_command:
        return parse_launch_command(options.launch_command, source="given",
                                    version=(info or {}).get("version"), python=process_python(pid))  # fmt: skip
    argv = process_argv(pid)
    if argv and any(a.startswith("--") for a in argv):
        live = launch_from_argv(argv, source="psutil")
        if live.kind == "unknown":  # a proxy or a wrapper on the port: relaunching it confirms nothing
            raise PlanError(
                f"the process listening on the server's port ({shlex.join(live.program)[:80]}) is neither SGLang "
                "nor radixtop's simulator; pass --launch-command '...' with the server's own command"
            )
        return replace(live, cwd=process_cwd(pid))
    text = (info or {}).get("launch_command")
    if isinstance(text, str) and text.strip():
        cmd = parse_launch_command(text, version=str(info.get("version", "")), python=process_python(pid))
        return replace(cmd, cwd=process_cwd(pid))
    raise PlanError(
        "cannot learn the live server's launch command (no local process on its port and no "
        "launch_command in /server_info); pass --launch-command '...' (split like a shell, never run by one)"
    )


def _baseline_logs(options: ConfirmOptions, live: LaunchCommand, pid: int | None) -> list[str]:
    from radixtop.incident.server import stdout_log_paths

    if options.logs:
        return list(options.logs)
    found: list[str] = []
    # A path named by /server_info is network text: never read into a bundle (the process's own
    # stdout, found by psutil, and the user's --log are).
    log_file = flag_value(live.flags, "--log-file") if live.source != "server_info" else None
    if log_file:
        path = Path(log_file)
        if not path.is_absolute() and live.cwd:
            path = Path(live.cwd) / path
        found.append(str(path))
    for path in stdout_log_paths(pid):
        if path not in found:
            found.append(path)
    return found


def _max_running(live: LaunchCommand, info: dict[str, Any] | None) -> int | None:
    """The live server's max running requests: its flag, /server_info's server argument, else
    what the scheduler settled on (SGLang sizes it from the KV pool when the flag is absent, the
    usual case; 0.5.23 reports it per DP rank in internal_states)."""
    info = info or {}
    states = info.get("internal_states")
    effective = states[0].get("effective_max_running_requests_per_dp") if (
        isinstance(states, list) and states and isinstance(states[0], dict)) else None  # fmt: skip
    for value in (flag_value(live.flags, "--max-running-requests"), info.get("max_running_requests"), effective):
        try:
            if value not in (None, ""):
                return int(value)
        except (TypeError, ValueError):
            continue
    return None


async def prepare(
    options: ConfirmOptions,
    on_event: Callable[[ConfirmEvent], None] | None = None,
    cancel: threading.Event | None = None,
) -> Plan:
    """Evidence first (a bundle), then the plan. Starts and stops nothing; sends no workload."""
    from radixtop.incident.server import (
        base_url,
        is_loopback_url,
        listening_pid,
        process_environ,
        url_port,
    )
    from radixtop.incident.workloads import pressure_trace

    emit = on_event or (lambda event: None)
    if options.runs < 1:
        raise PlanError(f"--runs must be at least 1, got {options.runs}")
    if options.cache not in CACHE_MODES:
        raise PlanError(f"--control-cache {options.cache!r}: choose one of {', '.join(CACHE_MODES)}")
    if options.concurrency_divisor < 1:
        raise PlanError(f"--concurrency-divisor must be at least 1, got {options.concurrency_divisor}")
    url = base_url(options.url)
    workdir = Path(options.workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlanError(f"cannot create the work directory {workdir}: {exc.strerror or exc}; pass --workdir") from None
    notes: list[str] = []
    info = await _server_info(url)
    if info is None:
        notes.append(f"{url}/server_info did not answer: the live server may be down")
    pid = options.pid
    if pid is None and is_loopback_url(url):
        pid = listening_pid(url_port(url))
    if not is_loopback_url(url):
        notes.append(f"{url} is not on this machine's loopback: the control starts here, on 127.0.0.1")
    try:
        live = _live_launch(options, info, pid)
    except LaunchError as exc:
        raise PlanError(str(exc)) from None
    notes += list(live.notes)
    redactor = Redactor()
    redactor.learn_env(os.environ)
    redactor.learn_argv(live.argv)
    baseline_logs = _baseline_logs(options, live, pid)

    bundle = None
    if options.bundle:
        from radixtop.incident.bundle import BundleError, take_bundle

        def relay(p: Any) -> None:
            if p.step != "done":  # announced below, with the path as data
                emit(ConfirmEvent("evidence", p.message, {"done": p.done, "total": p.total}))

        emit(ConfirmEvent("evidence", "preserving evidence first: taking a bundle of the live server"))
        try:
            bundle = await asyncio.to_thread(
                take_bundle, workdir / "evidence", url=url, logs=baseline_logs, pid=pid, reason="confirm",
                signature_files=options.signature_files, cancel=cancel,
                on_progress=relay,
            )  # fmt: skip
            emit(ConfirmEvent("evidence", f"bundle written: {bundle.path}", {"bundle": str(bundle.path)}))
        except BundleError as exc:
            if cancel is not None and cancel.is_set():
                raise ConfirmCancelled("cancelled while taking the bundle") from None
            notes.append(f"no evidence bundle: {exc}")

    max_running = _max_running(live, info)
    if max_running is None:
        notes.append("the live server's max running requests is unknown; the control runs 4")
        control_running = 4
    else:
        control_running = max(1, max_running // options.concurrency_divisor)
    trace = options.trace
    server_page = (info or {}).get("page_size")
    if trace is not None and isinstance(server_page, int) and server_page >= 1 and server_page != trace.page_size_hint:
        # A trace's boundary cases are written in pages (finding_03330: a prefix of exactly one
        # page): replayed as written against another page size they would test nothing.
        notes.append(f"the trace's prefixes were written for page size {trace.page_size_hint}; "
                     f"rescaled to the server's {server_page}")  # fmt: skip
        trace = rescale_prefixes(trace, server_page)
    if trace is None:
        if info is None or not info.get("max_total_num_tokens"):
            raise PlanError("no /server_info to size a pressure workload from; pass --trace (a file or a built-in name)")
        trace = pressure_trace(
            int(info["max_total_num_tokens"]), max_running or 32,
            page_size=int(info.get("page_size") or 1), max_input_len=info.get("max_req_input_len"),
        )  # fmt: skip
    trace_path = workdir / "workload.json"
    save_trace(trace, trace_path)

    port = free_loopback_port()
    output = workdir / "control.out"
    control_log = workdir / "control.log"
    try:
        control_argv, changes = build_control_argv(
            live, port=port, max_running=control_running, cache=options.cache,
            log_file=control_log, extra=options.control_args,
        )  # fmt: skip
    except LaunchError as exc:
        raise PlanError(str(exc)) from None
    watched = [str(output)] + ([str(control_log)] if live.kind == "radixtop-sim" else [])
    env = process_environ(pid)
    if env is None:
        env = dict(os.environ)
        if pid is not None:
            notes.append("the live server's environment is not readable; the control inherits radixtop's")
    redactor.learn_env(env)
    if live.kind == "sglang" and not options.stop_original:
        notes.append(
            "the live server keeps its GPU memory: the control needs its own (lower --mem-fraction-static "
            "with --control-arg, or pass --stop-original); otherwise it may fail to start (inconclusive)"
        )
    if flag_value(live.flags, "--api-key") is not None:
        notes.append("the live server requires an API key: the baseline replay sends $RADIXTOP_API_KEY if set")
    if options.runs < 2:
        notes.append("with 1 run, divergence cannot be seen; only signatures count")
    plan = Plan(
        options=replace(options, url=url),
        baseline_url=url,
        server_pid=pid,
        server_version=None if info is None else str(info.get("version", "")) or None,
        live=live,
        control_argv=control_argv,
        control_changes=changes,
        control_summary=f"--max-running-requests {control_running}"
        + (", --disable-radix-cache" if options.cache == "disable" else ", radix cache kept"),
        control_port=port,
        control_output=output,
        control_logs=watched,
        control_cwd=live.cwd,
        control_env=env,
        baseline_logs=baseline_logs,
        trace=trace,
        trace_path=trace_path,
        bundle=bundle,
        notes=notes,
        redactor=redactor,
    )
    (workdir / "plan.json").write_text(json.dumps(plan.to_json(), indent=2) + "\n", encoding="utf-8")
    emit(ConfirmEvent("plan", "plan ready for approval", {"plan": plan.to_json()}))
    return plan


# -- the run ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    baseline: dict[str, Any]
    control: dict[str, Any]
    bundle: str | None
    repeat: list[str]
    workdir: str

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "baseline": self.baseline,
            "control": self.control,
            "bundle": self.bundle,
            "repeat": self.repeat,
            "workdir": self.workdir,
        }

    def format(self) -> str:
        b, c = self.baseline, self.control
        lines = [
            f"VERDICT: {self.verdict}",
            f"  {self.reason}",
            "",
            (
                f"Baseline (live server {b.get('url')}): {b.get('runs', 0)} runs, "
                f"{b.get('failed_calls', 0)} failed calls, alive after: {b.get('alive_after')}"
            ),
            f"  signatures: {', '.join(b.get('signatures') or []) or 'none'}",
            f"  diverged:   {', '.join(b.get('diverged') or []) or 'none'}",
        ]
        lines += [f"  first: {f}" for f in b.get("first_occurrences", [])[:5]]
        lines += [
            f"Control ({c.get('url')}): " + ("ran" if c.get("healthy") else "did not run"),
            f"  argv: {shlex.join(c.get('argv') or [])}",
            f"  signatures: {', '.join(c.get('signatures') or []) or 'none'}",
            f"  diverged:   {', '.join(c.get('diverged') or []) or 'none'}",
        ]
        if c.get("error"):
            lines.append(f"  error: {c['error']}")
        if c.get("output_tail"):
            lines.append("  its output ended with:")
            lines += [f"    {line}" for line in c["output_tail"].splitlines()[-15:]]
        lines += [
            "",
            f"Evidence bundle: {self.bundle or '(none)'}",
            f"Work directory:  {self.workdir}",
            f"Repeat: {shlex.join(self.repeat)}",
        ]
        return "\n".join(lines) + "\n"


def _signature_summary(window: Any, threshold: int) -> tuple[list[str], list[str], list[str]]:
    """(ids at/above the threshold, ids below it, 'id at file:line: text' for the former)."""
    if window is None:
        return [], [], []
    report = window.report()
    strong, weak, firsts = [], [], []
    for finding in report.findings:
        if finding.signature.level >= threshold:
            strong.append(finding.signature.id)
            occ = finding.first
            firsts.append(f"{finding.signature.id} at {occ.file}:{occ.line}: {occ.text.strip()[:160]}")
        else:
            weak.append(finding.signature.id)
    return strong, weak, firsts


class ConfirmationRun:
    """One approved plan, executed once. ``await run()``; ``cancel()`` from anywhere."""

    def __init__(self, plan: Plan, on_event: Callable[[ConfirmEvent], None] | None = None) -> None:
        self.plan = plan
        self._emit_fn = on_event
        self._cancel = threading.Event()
        self.control: ControlProcess | None = None
        self.verdict: Verdict | None = None
        self._started = False
        self._planned: list[Any] = []

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def _emit(self, phase: str, message: str, **data: Any) -> None:
        if self._emit_fn is not None:
            self._emit_fn(ConfirmEvent(phase, message, data))

    async def _guard(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run coro; if cancel() is called meanwhile, abandon it and raise ConfirmCancelled."""
        task = asyncio.ensure_future(coro)
        while not task.done():
            if self._cancel.is_set():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                raise ConfirmCancelled("cancelled")
            await asyncio.wait({task}, timeout=0.1)
        return task.result()

    async def _replay_watched(self, phase: str, url: str, window: Any) -> tuple[DivergenceReport, bool]:
        from radixtop.incident.server import auth_headers

        plan = self.plan

        def relay(event: ReplayEvent) -> None:
            self._emit(phase, event.message, run=event.run, runs=event.runs, kind=event.kind)

        async def watch() -> None:
            while True:
                await asyncio.sleep(POLL_S)
                await self._poll(phase, window)

        watcher = asyncio.create_task(watch()) if window is not None else None
        try:
            series = await self._guard(
                replay_series(
                    url, self._planned, plan.options.runs, flush=plan.options.flush,
                    headers=auth_headers() if url == plan.baseline_url else None,
                    on_event=relay, should_stop=self._cancel.is_set,
                    request_timeout_s=plan.options.request_timeout_s,
                )
            )  # fmt: skip
            await self._guard(asyncio.sleep(SETTLE_S))
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        await self._poll(phase, window)
        async with httpx.AsyncClient(timeout=3.0) as client:
            alive = await server_alive(client, url)
        return compare_runs(series, plan.trace), alive

    # File reading and prompt synthesis run off the event loop: a UI shares it.

    async def _poll(self, phase: str, window: Any) -> None:
        if window is None:
            return
        for sig_id in await asyncio.to_thread(window.poll):
            self._emit(phase, f"signature in the log: {sig_id}", signature=sig_id)

    async def _window(self, paths: Sequence[str]) -> Any:
        from radixtop.diagnosis.catalog import load_catalog
        from radixtop.incident.logwindow import LogWindow

        if not paths:
            return None

        def make() -> LogWindow:
            window = LogWindow(paths, load_catalog(list(self.plan.options.signature_files)))
            window.start()
            return window

        return await asyncio.to_thread(make)

    async def run(self) -> Verdict:
        from radixtop.diagnosis.catalog import severity_rank

        if self._started:
            raise RuntimeError("a ConfirmationRun runs once; make a new one from the plan")
        self._started = True
        plan = self.plan
        threshold = severity_rank(plan.options.min_severity)
        baseline: dict[str, Any] = {"url": plan.baseline_url, "logs": plan.baseline_logs}
        control: dict[str, Any] = {
            "argv": plan.redactor.argv(plan.control_argv), "url": plan.control_url, "output": str(plan.control_output),
            "signatures": [], "diverged": [], "healthy": False,
        }  # fmt: skip
        try:
            # 1. the baseline: the live server, the same workload
            self._emit("baseline", f"replaying {plan.trace.name} against the live server ({plan.options.runs} runs)")
            self._planned = await asyncio.to_thread(plan_requests, plan.trace)  # the same prompts for both
            window = await self._window(plan.baseline_logs)
            report, alive = await self._replay_watched("baseline", plan.baseline_url, window)
            strong, weak, firsts = _signature_summary(window, threshold)
            baseline.update(
                signatures=strong, other_signatures=weak, first_occurrences=firsts, diverged=report.diverged,
                runs=report.runs, failed_calls=report.failed_calls, alive_after=alive,
                dispatch_jitter_ms=report.jitter, stopped_early=report.stopped_early,
            )  # fmt: skip
            self._write("baseline-replay.json", report.to_json())
            if not alive and strong:
                self._emit("baseline", "the live server died during the replay: that is the evidence (see its log)")

            # 2. optionally stop the original (only when asked)
            if plan.options.stop_original:
                self._emit("stop-original", f"stopping the live server (pid {plan.server_pid}) as asked")
                baseline["stopped"] = await asyncio.to_thread(_stop_original, plan.server_pid)

            # 3. the control
            control_window = await self._window(plan.control_logs)
            self.control = ControlProcess(plan.control_argv, plan.control_output, plan.control_cwd, plan.control_env)
            self._emit("control-start", f"starting the control on {plan.control_url}")
            try:
                self.control.start()
            except LaunchError as exc:
                control["error"] = str(exc)
                return await self._finish(baseline, control, threshold)
            control["pid"] = self.control.pid
            why = await self._guard(
                wait_healthy(
                    plan.control_url, self.control, timeout_s=plan.options.health_timeout_s,
                    should_stop=self._cancel.is_set,
                    on_tick=lambda s: self._emit("control-start", f"waiting for the control's health ({s:.0f} s): "
                                                 f"{self.control.tail(1)[:160]}"),
                )
            )  # fmt: skip
            if why is not None:
                if why == "cancelled":
                    raise ConfirmCancelled(why)
                control["error"] = why
                control["output_tail"] = plan.redactor.text(self.control.tail(30))
                await self._poll("control", control_window)
                control["signatures"], _, control["first_occurrences"] = _signature_summary(control_window, threshold)
                return await self._finish(baseline, control, threshold)
            control["healthy"] = True
            self._emit("control", f"control healthy; replaying {plan.trace.name} ({plan.options.runs} runs)")
            report, alive = await self._replay_watched("control", plan.control_url, control_window)
            strong, weak, firsts = _signature_summary(control_window, threshold)
            control.update(
                signatures=strong, other_signatures=weak, first_occurrences=firsts, diverged=report.diverged,
                runs=report.runs, failed_calls=report.failed_calls, alive_after=alive,
                dispatch_jitter_ms=report.jitter,
            )  # fmt: skip
            control["answered_calls"] = report.runs * plan.calls - report.failed_calls
            if not alive:
                control["output_tail"] = plan.redactor.text(self.control.tail(30))
            self._write("control-replay.json", report.to_json())
            return await self._finish(baseline, control, threshold)
        except ConfirmCancelled:
            self._emit("cancelled", "cancelled; stopping the control")
            raise
        finally:
            if self.control is not None and self.control.proc is not None:
                self._emit("cleanup", "stopping the control server")
                await asyncio.to_thread(self.control.stop)

    def _write(self, name: str, doc: Any) -> None:
        path = Path(self.plan.options.workdir) / name
        path.write_text(json.dumps(self.plan.redactor.json(doc), indent=2) + "\n", encoding="utf-8")

    async def _finish(self, baseline: dict[str, Any], control: dict[str, Any], threshold: int) -> Verdict:
        verdict, reason = await asyncio.to_thread(_decide, self.plan, baseline, control, threshold)
        result = Verdict(
            verdict=verdict,
            reason=reason,
            baseline=baseline,
            control=control,
            bundle=None if self.plan.bundle is None else str(self.plan.bundle.path),
            repeat=self.plan.repeat_command(),
            workdir=str(self.plan.options.workdir),
        )
        self._write("verdict.json", result.to_json())
        self.verdict = result
        self._emit("verdict", f"{verdict}: {reason}", verdict=verdict)
        return result


def _prior_signatures(plan: Plan, threshold: int) -> list[str]:
    """Error-or-worse signatures already in the live server's logs (when it could not be replayed)."""
    from radixtop.diagnosis.catalog import load_catalog
    from radixtop.diagnosis.findings import FindingsBuilder
    from radixtop.diagnosis.matcher import Matcher
    from radixtop.probes.logscan import ScanInputError, scan_into

    paths = [p for p in plan.baseline_logs if Path(p).is_file()]
    if not paths:
        return []
    catalog = load_catalog(list(plan.options.signature_files))
    matcher = Matcher(catalog.signatures)
    builder = FindingsBuilder(catalog, matcher=matcher)
    try:
        scan_into(builder, paths, matcher)
    except ScanInputError:
        return []
    return [f.signature.id for f in builder.report().findings if f.signature.level >= threshold]


def _decide(plan: Plan, baseline: dict[str, Any], control: dict[str, Any], threshold: int) -> tuple[str, str]:
    b_sig, b_div = baseline.get("signatures") or [], baseline.get("diverged") or []
    answered = baseline.get("runs", 0) * plan.calls - baseline.get("failed_calls", 0)
    if not b_sig and not b_div and answered == 0:
        prior = _prior_signatures(plan, threshold)
        if prior:
            baseline["prior_signatures"] = prior
            b_sig = prior
            baseline["note"] = "the live server answered no call; its log's earlier signatures stand as the baseline"
        else:
            baseline["note"] = "the live server answered no call and its log shows no signature"
    baseline_bad = bool(b_sig or b_div)
    what = " and ".join(
        part for part in (
            f"signature {', '.join(b_sig)}" if b_sig else "",
            f"divergence in {', '.join(b_div)}" if b_div else "",
        ) if part
    )  # fmt: skip
    if not control.get("healthy"):
        why = control.get("error") or "the control server did not run"
        return "inconclusive", f"the control could not run: {why}; the baseline showed {what or 'nothing'}"
    c_sig, c_div = control.get("signatures") or [], control.get("diverged") or []
    if control.get("answered_calls", 0) == 0 and not c_sig:
        return "inconclusive", "the control answered none of the workload's calls (see its output)"
    if not baseline_bad:
        if answered == 0:
            return "inconclusive", baseline.get("note", "the live server answered no call")
        extra = f" (the control showed {', '.join(c_sig + c_div)})" if c_sig or c_div else ""
        return "not-reproduced", f"the live server stayed clean under this workload: no signature, no divergence{extra}"
    if c_sig or c_div:
        parts = (f"signature {', '.join(c_sig)}" if c_sig else "", f"divergence in {', '.join(c_div)}" if c_div else "")
        still = " and ".join(p for p in parts if p)
        return "persists-under-control", (
            f"the baseline showed {what}; under the control ({plan.control_summary}) there is still {still}: "
            "an unconditional defect or another cause (the competing hypothesis stays open)"
        )
    return "pressure-dependent", (
        f"the baseline showed {what}; under the control ({plan.control_summary}) it is gone across the same "
        "workload: resume only with bounded pressure (the control's settings)"
    )


def _stop_original(pid: int | None) -> str:
    import psutil

    if pid is None:
        return "not stopped: the live server's pid is unknown"
    try:
        proc = psutil.Process(pid)
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return "already gone"
    except psutil.AccessDenied:
        return "not stopped: permission denied"
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(family, timeout=STOP_ORIGINAL_GRACE_S)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return f"stopped pid {pid} ({len(family)} processes)"


def now_label() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
