"""The confirmation run, executed: the experiment of an approved :class:`~radixtop.incident.confirm.confirm.Plan`,
step by step, then the verdict (radixtop/incident/confirm/judge.py) with the steps side by side.

Steps run from the lowest load up on the failing server (the live one, or a reproduction),
starting a server only when a step needs one: a reproduction when the failing server died, with
``SGLANG_RADIX_FORCE_MISS=1`` when the step is reuse off; the control (the cache off). Each start
waits for health showing the server's own lines; each step replays the workload while watching
its log and ``/metrics``. A step runs only while its question is open.

``ConfirmationRun(plan).run()`` (async); ``cancel()`` from any thread or a signal handler stops it
at once: in-flight calls are abandoned and every server it started is stopped. It runs on the
caller's loop (the TUI's own: a started server's PR_SET_PDEATHSIG follows the thread that started
it). See radixtop/incident/confirm/confirm.py for the plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import httpx

from radixtop.incident.confirm.confirm import (
    ArmPlan,
    ConfirmCancelled,
    ConfirmEvent,
    Plan,
    PlanError,
)
from radixtop.incident.confirm.control_server import ControlProcess, LaunchError, exit_reason, port_free, wait_healthy
from radixtop.incident.confirm.judge import bad, failed, failing_floor, judge, matched, ran, under_pressure
from radixtop.incident.confirm.verdict import USAGE_STEP, ArmEvidence, SignatureSeen, StepKind, Verdict
from radixtop.incident.replay.divergence import DivergenceReport, compare_runs
from radixtop.incident.replay.replay import ReplayEvent, replay_series, server_alive
from radixtop.incident.replay.trace import plan_requests
from radixtop.incident.replay.vocab import SIM_VOCABULARY
from radixtop.textsafe import strip_ansi

__all__ = ["ConfirmationRun"]

POLL_S = 0.25
METRICS_EVERY_S = 1.0
SETTLE_S = 0.6  # after a replay, lines the server is still writing (a death is several lines)
STOP_ORIGINAL_GRACE_S = 15.0
PLATEAU = USAGE_STEP  # token usage a step at more load must add (one logged step) to be worth another
PROGRESS_LINES = 3  # a starting server's newest lines shown per second while it loads


Flavor = Literal["failing", "force-miss", "control"]
NAMESPACES = "a namespace per request"  # reuse off on a running server: SGLang's extra_key per call
FORCE_MISS = "SGLANG_RADIX_FORCE_MISS=1"  # reuse off on a started server: every match finds nothing


@dataclass
class _Running:
    """A server steps run on: the live one (no process) or one this run started."""

    arm: ArmPlan
    process: ControlProcess | None
    start: ArmEvidence  # what its start showed (pid, seconds to health)
    dead: bool = False
    flavor: Flavor = "failing"  # the original's flags, reuse off from its start, or the cache off
    failed_before: bool = False  # a step on it showed a signature: what that left may hide a repeat
    window: Any = None  # its log from its start, for its first step: it ran under that step's condition from birth


def _port_holder(port: int) -> str:
    from radixtop.incident.common.server import listening_pid

    pid = listening_pid(port)
    return f" (by pid {pid})" if pid else ""


def _with_signatures(arm: ArmEvidence, report: Any, threshold: int) -> ArmEvidence:
    """The arm with a report's findings split at the threshold, with counts and first times."""
    found: list[str] = []
    other: list[str] = []
    firsts: list[str] = []
    detail: list[SignatureSeen] = []
    for finding in report.findings if report is not None else ():
        occ = finding.first
        if finding.signature.level >= threshold:
            found.append(finding.signature.id)
            firsts.append(f"{finding.signature.id} at {occ.file}:{occ.line}: {occ.text.strip()[:160]}")
            detail.append(
                SignatureSeen(finding.signature.id, finding.count, occ.time, occ.rank, occ.text.strip()[:300])
            )
        else:
            other.append(finding.signature.id)
    return replace(arm, signatures=tuple(found), other_signatures=tuple(other), first_occurrences=tuple(firsts),
                   signature_detail=tuple(detail))


async def _metrics(client: httpx.AsyncClient, url: str) -> Any:
    """The server's /metrics (probes.sglang.ServerMetrics), or None."""
    from radixtop.probes.http import fetch
    from radixtop.probes.sglang import MAX_METRICS_BYTES, parse_metrics

    got = await fetch(client, f"{url}/metrics", max_bytes=MAX_METRICS_BYTES, timeout_s=2.0)
    if not got.ok:
        return None
    try:
        return parse_metrics(got.body.decode("utf-8", "replace"))
    except ValueError:
        return None


def _peak(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


class ConfirmationRun:
    """One approved plan, executed once. ``await run()``; ``cancel()`` from anywhere."""

    def __init__(self, plan: Plan, on_event: Callable[[ConfirmEvent], None] | None = None) -> None:
        self.plan = plan
        self._emit_fn = on_event
        self._cancel = threading.Event()
        self.servers: list[ControlProcess] = []  # every server this run started
        self.verdict: Verdict | None = None
        self._started = False
        self._planned: list[Any] = []
        self._threshold = 0
        self._began = 0.0
        self._steps: list[ArmEvidence] = []
        self._unasked: dict[str, str] = dict(plan.unasked)
        self._current: _Running | None = None  # the server the next step runs on
        self._failing_used = False  # the planned failing server was used (a later one is a restart)
        self._stop_s: dict[str, float] = {}
        self._catalog: Any = None  # the signature catalog, read at the first window

    @property
    def control(self) -> ControlProcess | None:
        """The server started last (the control, once it runs)."""
        return self.servers[-1] if self.servers else None

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

    # File reading and prompt synthesis run off the event loop: a UI shares it.

    async def _poll(self, phase: str, window: Any) -> None:
        if window is None:
            return
        for sig_id in await asyncio.to_thread(window.poll):
            self._emit(phase, f"signature in the log: {sig_id}", signature=sig_id)

    async def _window(self, paths: Sequence[str]) -> Any:
        from radixtop.diagnosis.catalog import load_catalog
        from radixtop.incident.confirm.logwindow import LogWindow

        if not paths:
            return None

        def make() -> LogWindow:
            if self._catalog is None:  # read once: every start and step opens a window
                self._catalog = load_catalog(list(self.plan.options.signature_files))
            window = LogWindow(paths, self._catalog)
            window.start()
            return window

        return await asyncio.to_thread(make)

    async def _replay_watched(
        self, arm: ArmPlan, window: Any, max_in_flight: int | None, *, namespaces: bool
    ) -> tuple[DivergenceReport, bool, float | None, float | None]:
        """The replay's report, whether the server answered after it, and from /metrics its peak
        token usage and evicted tokens per second (None: unknown)."""
        from radixtop.incident.common.server import auth_headers

        plan = self.plan
        evicted: list[tuple[float, float]] = []  # (time, evicted tokens total) from /metrics
        usages: list[float] = []  # token usage from /metrics: pressure between two batch lines too

        def relay(event: ReplayEvent) -> None:
            self._emit(arm.role, event.message, run=event.run, runs=event.runs, kind=event.kind)

        done = asyncio.Event()  # besides the cancel: a cancel lost in a library still ends the loop

        async def watch() -> None:
            last_metrics = 0.0
            async with httpx.AsyncClient() as client:
                while not done.is_set():
                    await asyncio.sleep(POLL_S)
                    await self._poll(arm.role, window)
                    now = time.monotonic()
                    if now - last_metrics >= METRICS_EVERY_S:
                        last_metrics = now
                        metrics = await _metrics(client, arm.url)
                        value = metrics.get("evicted_tokens_total") if metrics is not None else None
                        if value is not None:
                            evicted.append((now, value))
                        usage = metrics.get("token_usage") if metrics is not None else None
                        if usage is not None:
                            usages.append(usage)

        watcher = asyncio.create_task(watch())
        try:
            series = await self._guard(
                replay_series(
                    arm.url, self._planned, plan.options.runs, flush=plan.options.flush,
                    headers=auth_headers() if arm.argv is None else None,
                    on_event=relay, should_stop=self._cancel.is_set,
                    request_timeout_s=plan.options.request_timeout_s,
                    max_in_flight=max_in_flight, namespace_per_request=namespaces,
                )
            )
            await self._guard(asyncio.sleep(SETTLE_S))
        finally:
            done.set()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await self._poll(arm.role, window)
        peak_usage = max(usages) if usages else None
        evicted_per_s = None
        if len(evicted) >= 2 and evicted[-1][0] > evicted[0][0]:
            evicted_per_s = round((evicted[-1][1] - evicted[0][1]) / (evicted[-1][0] - evicted[0][0]), 1)
        async with httpx.AsyncClient(timeout=3.0) as client:
            alive = await server_alive(client, arm.url)
        return compare_runs(series, plan.trace), alive, peak_usage, evicted_per_s

    async def _progress(self, arm: ArmPlan, window: Any, waited: float) -> None:
        """A starting server's own newest lines (loading weights, capturing CUDA graphs)."""
        from radixtop.diagnosis.logline import access_key

        await self._poll(f"{arm.role}-start", window)  # off the loop, as every read of a log here
        fresh = [
            line
            for line in (window.fresh if window is not None else ())
            if line.strip() and access_key(line) is None
        ]
        if window is not None:
            window.fresh.clear()
        if not fresh:
            self._emit(f"{arm.role}-start", f"waiting for its health ({waited:.0f} s)")
            return
        for line in fresh[-PROGRESS_LINES:]:
            said = self.plan.redactor.text(strip_ansi(line).strip())  # SGLang colours its warnings
            self._emit(f"{arm.role}-start", f"({waited:.0f} s) {said[:200]}")

    def _base(self, arm: ArmPlan, kind: StepKind, max_in_flight: int | None, reuse_off: str | None) -> ArmEvidence:
        plan = self.plan
        return ArmEvidence(
            role=arm.role, url=arm.url, argv=tuple(plan.redactor.argv(arm.argv)) if arm.argv else None,
            output=str(arm.output) if arm.output else None, calls=plan.runs_calls, calls_per_run=plan.calls,
            healthy=arm.argv is None, logs=tuple(arm.logs), step=kind, max_in_flight=max_in_flight,
            reuse_off=reuse_off,
        )

    async def _start(self, arm: ArmPlan, base: ArmEvidence, env: Mapping[str, str] | None = None
                     ) -> tuple[_Running | None, ArmEvidence]:
        """Start a planned server and wait for its health: the running server, or None and why not."""
        plan = self.plan
        assert arm.argv is not None  # the live server is never started
        window = await self._window(arm.logs)
        if arm.port is not None and not port_free(arm.port):
            return None, replace(base, error=(
                f"port {arm.port} was taken between the plan and the start{_port_holder(arm.port)}: "
                "nothing was started; press c (or run confirm) again for a fresh plan"))
        server = ControlProcess(arm.argv, arm.output or Path(plan.options.workdir) / f"{arm.role}.out", arm.cwd,
                                {**(arm.env or {}), **(env or {})} if env else arm.env)
        extra = f" with {', '.join(f'{k}={v}' for k, v in env.items())}" if env else ""
        self._emit(f"{arm.role}-start", f"starting the {arm.role} on {arm.url}{extra}")
        started = time.monotonic()
        try:
            server.start()
        except LaunchError as exc:
            return None, replace(base, error=str(exc))
        self.servers.append(server)
        why = await self._guard(
            wait_healthy(
                arm.url, server, timeout_s=plan.options.control_timeout_s, what=f"the {arm.role} server",
                should_stop=self._cancel.is_set,
                on_tick=lambda waited: self._progress(arm, window, waited),
            )
        )
        base = replace(base, pid=server.pid, start_s=round(time.monotonic() - started, 1))
        if why is None:
            self._emit(arm.role, f"{arm.role} healthy after {base.start_s:.0f} s")
            return _Running(arm, server, replace(base, healthy=True), window=window), replace(base, healthy=True)
        if why == "cancelled":
            raise ConfirmCancelled(why)
        result = replace(base, error=why, output_tail=plan.redactor.text(server.tail(30)))
        await self._poll(arm.role, window)
        result = _with_signatures(result, window.report() if window is not None else None, self._threshold)
        await asyncio.to_thread(server.stop)
        return None, replace(result, death_signatures=result.signatures + result.other_signatures)

    async def _step(self, running: _Running, kind: StepKind, max_in_flight: int | None,
                    reuse_off: str | None = None) -> ArmEvidence:
        """One step on a running server: the workload replayed at that load, watched."""
        plan = self.plan
        arm, server = running.arm, running.process
        number = len(self._steps) + 1
        first = running.window is not None  # the first step on a server it started carries the start's time
        result = replace(running.start, step=kind, max_in_flight=max_in_flight, reuse_off=reuse_off,
                         after_failure=running.failed_before, start_s=running.start.start_s if first else None)
        window, running.window = running.window or await self._window(arm.logs), None
        self._emit(arm.role, f"step {number}, {result.label()}: replaying {plan.trace.name} "
                             f"({plan.options.runs} runs)")
        replay_began = time.monotonic()
        report, alive, metrics_usage, evicted_per_s = await self._replay_watched(
            arm, window, max_in_flight, namespaces=reuse_off == NAMESPACES)
        result = _with_signatures(result, window.report() if window is not None else None, self._threshold)
        result = replace(
            result, evicted_tokens_per_s=evicted_per_s, replay_s=round(time.monotonic() - replay_began, 1),
            diverged=tuple(report.diverged), runs=report.runs, failed_calls=report.failed_calls, alive_after=alive,
            answered_calls=report.runs * plan.calls - report.failed_calls, dispatch_jitter_ms=report.jitter,
            stopped_early=report.stopped_early,
            peak_token_usage=_peak(window.peak_token_usage if window is not None else None, metrics_usage),
            retractions=window.retracted if window is not None else 0,
        )
        running.failed_before = running.failed_before or bool(result.signatures)
        if not alive:
            running.dead = True
            if server is not None:
                code = server.exited()
                died = f"the {arm.role} server {exit_reason(code)} during the replay" if code is not None else ""
                if died and not result.signatures:
                    result = replace(result, error=died)  # killed from outside: no signature of its own
                result = replace(result, output_tail=plan.redactor.text(server.tail(30)))
            elif result.signatures:
                self._emit(arm.role, "the live server died during the replay: that is the evidence (see its log)")
        if report.cache is not None:  # the verdict shows the calls short of their prefix, and the diverged
            result = replace(result, cached_tokens={
                **report.cache.summary.to_json(),
                "page_size": report.cache.page_size,
                "rows": [r.to_json() for r in report.cache.shown(report.diverged)],
            })
        await self._write(f"step{number}-{arm.role}-{kind}.json", report.to_json())
        peak = result.peak_token_usage
        self._emit(arm.role, f"step {number}: {bad(result) or 'clean'}"
                   + (f", peak token usage {peak:.2f}" if peak is not None else ""))
        return result

    async def _retire(self, running: _Running | None) -> None:
        """Stop a server this run started (the live one is never stopped)."""
        if running is not None and running.process is not None:
            self._emit("cleanup", f"stopping the {running.arm.role} server")
            began = time.monotonic()
            await asyncio.to_thread(running.process.stop)
            self._stop_s[running.arm.role] = round(time.monotonic() - began, 1)

    def _usable(self, flavor: Flavor) -> _Running | None:
        """The running server, if it is of that flavor and up; one that already failed with a
        signature only when no other may start (what a failure leaves can hide a repeat)."""
        current = self._current
        if current is None or current.dead or current.flavor != flavor:
            return None
        if current.failed_before and (flavor == "control" or self.plan.restart is not None):
            return None
        return current

    async def _fresh(self, arm: ArmPlan, flavor: Flavor, base: ArmEvidence) -> tuple[_Running | None, ArmEvidence]:
        """Stop the running server (the next needs its room), then start this one."""
        await self._retire(self._current)
        self._current = None
        env = {"SGLANG_RADIX_FORCE_MISS": "1"} if flavor == "force-miss" else None
        running, started = await self._start(arm, base, env)
        if running is not None:
            running.flavor = flavor
            self._current = running
        return running, started

    async def _rung(self, max_in_flight: int | None) -> ArmEvidence:
        """A rung of the pressure ladder on the failing server (the crash log as recorded, with it)."""
        plan = self.plan
        kind: StepKind = "lower-pressure" if max_in_flight is not None else "as-run"
        if max_in_flight is None and plan.mode == "crash-log":
            step = await asyncio.to_thread(_crash_log_arm, plan, self._threshold)
        elif (running := self._usable("failing")) is not None:
            step = await self._step(running, kind, max_in_flight)
        else:
            arm = plan.failing if not self._failing_used and plan.failing is not None else plan.restart
            if arm is None:
                live = plan.failing or ArmPlan("baseline", plan.baseline_url)
                step = replace(self._base(live, kind, max_in_flight, None), error=self._no_restart())
            else:
                self._failing_used = True
                if arm.argv is None:  # the live server: nothing to start
                    self._current = _Running(arm, None, self._base(arm, kind, max_in_flight, None))
                    step = await self._step(self._current, kind, max_in_flight)
                else:
                    running, step = await self._fresh(arm, "failing", self._base(arm, kind, max_in_flight, None))
                    if running is not None:
                        step = await self._step(running, kind, max_in_flight)
        self._steps.append(step)
        return step

    def _no_restart(self) -> str:
        died = next((n for n, s in enumerate(self._steps, 1) if s.alive_after is False), None)
        return (f"the live server died in step {died}" if died else "the live server is gone") + (
            " and no GPU is free to start another")

    async def _reuse_off(self, failing: ArmEvidence, max_in_flight: int | None) -> ArmEvidence | None:
        """Reuse off at a load: namespaces on the failing server while it is fit, a server started
        with SGLANG_RADIX_FORCE_MISS=1 otherwise; None (and why, in unasked) when neither can be."""
        plan = self.plan
        if (running := self._usable("failing")) is not None:
            step = await self._step(running, "reuse-off", max_in_flight, NAMESPACES)
        elif (running := self._usable("force-miss")) is not None:
            step = await self._step(running, "reuse-off", max_in_flight, FORCE_MISS)
        elif plan.restart is not None:
            running, step = await self._fresh(plan.restart, "force-miss",
                                              self._base(plan.restart, "reuse-off", max_in_flight, FORCE_MISS))
            if running is not None:
                step = await self._step(running, "reuse-off", max_in_flight, FORCE_MISS)
        else:
            self._unasked["reuse"] = self._no_restart()
            return None
        self._steps.append(step)
        return step

    async def _cache_off(self, max_in_flight: int | None) -> ArmEvidence:
        plan = self.plan
        assert plan.control is not None
        if (running := self._usable("control")) is not None:
            step = await self._step(running, "cache-off", max_in_flight)
        else:
            running, step = await self._fresh(plan.control, "control",
                                              self._base(plan.control, "cache-off", max_in_flight, None))
            if running is not None:
                step = await self._step(running, "cache-off", max_in_flight)
        self._steps.append(step)
        return step

    def _loads_from(self, failing: ArmEvidence) -> list[int | None]:
        """The failing load, then more, up to the workload as recorded: where a changed step is
        tried until it reaches the pressure the failure came at."""
        loads: list[int | None] = [failing.max_in_flight]
        k = failing.max_in_flight
        while k is not None:
            k *= 2
            loads.append(k if self.plan.max_running is not None and k < self.plan.max_running else None)
            k = loads[-1]
        return loads

    async def _ladder(self) -> ArmEvidence | None:
        """The pressure ladder from the lowest rung up; when the lowest already fails under pressure,
        down until a rung is clean. The failing step at the least load, or None."""
        plan = self.plan
        rungs: list[int | None] = [*plan.ladder, None]
        first = await self._rung(rungs[0])
        if failed(first):
            lowest, k = first, rungs[0] if rungs[0] is not None else plan.max_running
            while k is not None and k > 1 and under_pressure(lowest):
                k //= 2
                step = await self._rung(k)
                if not failed(step):
                    break
                lowest = step
            return lowest
        if not ran(first):
            return None
        for k in rungs[1:]:
            step = await self._rung(k)
            if failed(step):
                return step
            if not ran(step):
                return None
        return None

    async def _until_matched(self, failing: ArmEvidence, one: Callable[[int | None], Awaitable[ArmEvidence | None]]
                             ) -> ArmEvidence | None:
        """A changed step at the failing load, then at more while it stays clean below the pressure the
        failure came at and more load still raises its pressure."""
        step = None
        for k in self._loads_from(failing):
            before = step
            step = await one(k)
            if step is None or failed(step) or not ran(step) or step.after_failure:
                return step
            if matched(step, failing, failing_floor(self._steps)):
                return step
            if before is not None and (step.peak_token_usage or 0.0) <= (before.peak_token_usage or 0.0) + PLATEAU:
                return step  # more calls in flight no longer raise its token usage: as high as it gets
        return step

    async def _experiment(self) -> None:
        """The steps, each only while its question is open (radixtop/incident/confirm/judge.py)."""
        failing = await self._ladder()
        if failing is None:
            return
        account = failing.cached_tokens or {}
        reuse = None
        if not (account.get("calls") and account.get("cached_tokens") == 0):  # with no hit, reuse is not needed
            reuse = await self._until_matched(failing, lambda k: self._reuse_off(failing, k))
        if reuse is not None and ran(reuse) and not failed(reuse) and not reuse.after_failure and matched(
                reuse, failing, failing_floor(self._steps)):
            return  # reuse needed: the cache is, too
        if self.plan.control is not None:
            await self._until_matched(failing, self._cache_off)

    async def run(self) -> Verdict:
        from radixtop.diagnosis.severity import severity_rank

        if self._started:
            raise RuntimeError("a ConfirmationRun runs once; make a new one from the plan")
        if self.plan.blockers:
            raise PlanError(self.plan.blockers[0])
        self._started = True
        plan = self.plan
        self._threshold = severity_rank(plan.options.min_severity)
        self._began = time.monotonic()
        try:
            vocab = plan.vocab if plan.vocab is not None else SIM_VOCABULARY  # not None: no vocabulary is a blocker
            # the same prompts for every step
            self._planned = await asyncio.to_thread(plan_requests, plan.trace, 0, vocab)
            if plan.stops_original:
                self._emit("stop-original", f"stopping the live server (pid {plan.server_pid}) as approved")
                stopped = await asyncio.to_thread(_stop_original, plan.server_pid)
                self._emit("stop-original", stopped)
            await self._experiment()
            await self._retire(self._current)
            self._current = None
            return await self._finish()
        except ConfirmCancelled:
            self._emit("cancelled", "cancelled; stopping the servers radixtop started")
            raise
        finally:
            for server in self.servers:
                if server.proc is not None and server.exited() is None:
                    await asyncio.to_thread(server.stop)

    async def _write(self, name: str, doc: Any) -> None:
        """A work file, written without blocking the loop (a UI shares it; the disk may be slow)."""
        import aiofiles

        text = json.dumps(self.plan.redactor.json(doc), indent=2) + "\n"
        async with aiofiles.open(Path(self.plan.options.workdir) / name, "w", encoding="utf-8") as fh:
            await fh.write(text)

    async def _finish(self) -> Verdict:
        plan = self.plan
        decision = judge(self._steps, unasked=self._unasked)
        skipped = [f"{what} stayed open: {why}" for what, why in self._unasked.items()
                   if what not in plan.unasked]
        result = Verdict(
            verdict=decision.verdict,
            reason=decision.reason,
            conditions=decision.conditions,
            steps=tuple(self._steps),
            bundle=None if plan.bundle is None else str(plan.bundle.path),
            repeat=plan.repeat_command(),
            workdir=str(plan.options.workdir),
            mode=plan.mode,
            planned_from=plan.planned_from,
            assumption=("the original's crash log stands for a run of this workload: the workload that crashed it "
                        "may have differed") if plan.mode == "crash-log" else None,
            notes=[*plan.notes, *skipped],
            timings={**plan.timings, "run_s": round(time.monotonic() - self._began, 2),
                     **{f"stop_{role}_s": s for role, s in self._stop_s.items()}},
        )
        doc = self.plan.redactor.json(result.to_json())
        await self._write("verdict.json", doc)
        if plan.bundle is not None:  # the post-mortem holds the outcome beside the evidence it began with
            from radixtop.incident.bundle.experiment import add_experiment

            try:
                await asyncio.to_thread(add_experiment, plan.bundle.path, doc)
            except (OSError, ValueError, KeyError) as exc:
                result.notes.append(f"the verdict was not added to the evidence bundle: {exc}")
        self.verdict = result
        self._emit("verdict", f"{decision.verdict}: {decision.reason}", verdict=decision.verdict)
        return result


def _crash_log_arm(plan: Plan, threshold: int) -> ArmEvidence:
    """The original's logs as the failing side (--no-reproduction): its signatures as they are."""
    from radixtop.diagnosis.catalog import load_catalog
    from radixtop.diagnosis.findings import FindingsBuilder
    from radixtop.diagnosis.matcher import Matcher
    from radixtop.probes.logscan import ScanInputError, scan_into

    arm = ArmEvidence("crash-log", url=plan.baseline_url, logs=tuple(plan.baseline_logs), healthy=True)
    paths = [p for p in plan.baseline_logs if Path(p).is_file()]
    if not paths:
        return replace(arm, note="no log of the original to read")
    catalog = load_catalog(list(plan.options.signature_files))
    matcher = Matcher(catalog.signatures)
    builder = FindingsBuilder(catalog, matcher=matcher)
    try:
        scan_into(builder, paths, matcher)
    except ScanInputError as exc:
        return replace(arm, note=f"its log could not be read: {exc}")
    report = builder.report()
    usages = [b.token_usage for b in report.batch_at_failure.values() if b.token_usage is not None]
    return replace(
        _with_signatures(arm, report, threshold), peak_token_usage=max(usages) if usages else None,
        retractions=sum(f.count for f in report.findings if f.signature.id == "kv-pool-retract"),
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


