"""The confirmation run's outcome as records: each step's evidence, the conditions, the verdict.

An experiment (radixtop/incident/confirm/confirm_run.py) runs the incident's workload in steps on
the failing server (the live one, or a reproduction of it), on servers started to change one
condition, or reads the original's crash log; each step's evidence is an :class:`ArmEvidence`.
radixtop/incident/confirm/judge.py decides from them what the failure needs (:class:`Conditions`:
capacity pressure, prefix reuse, the radix cache's machinery, each ``needed``, ``not-needed`` or
``open`` with why) and the verdict's name; :class:`Verdict` is the run's outcome as shown and
written to verdict.json, with the steps as a table and the pressure ladder as a picture.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from radixtop.incident.replay.reuse import format_reuse

__all__ = ["PRESSURE_USAGE", "VERDICTS", "ArmEvidence", "ArmRole", "Condition", "Conditions", "SignatureSeen",
           "StepKind", "USAGE_STEP", "Verdict", "VerdictKind", "usage_below"]


class VerdictKind(StrEnum):
    """What the run concludes; the values are what users read and what JSON holds."""

    PRESSURE_DEPENDENT = "pressure-dependent"
    CACHE_DEPENDENT = "cache-dependent"
    PERSISTS_UNDER_CONTROL = "persists-under-control"
    NOT_REPRODUCED = "not-reproduced"
    INCONCLUSIVE = "inconclusive"


VERDICTS = tuple(VerdictKind)
PRESSURE_USAGE = 0.85  # token usage (evictable counted free) at which the pool is under pressure
USAGE_STEP = 0.01  # SGLang logs token usage to two places: a smaller difference is no difference
# Signatures that are themselves capacity pressure: a failing arm that shows them was under it.
PRESSURE_SIGNATURES = frozenset({"kv-pool-retract", "prefill-oom", "decode-oom", "req-slots-oom", "vllm-preemption"})
# Which side an arm is: the live server, a reproduction of it, the original's crash log, or the control.
ArmRole = Literal["baseline", "reproduction", "crash-log", "control"]
# What a step changes against the workload as recorded (radixtop/incident/confirm/judge.py).
StepKind = Literal["lower-pressure", "as-run", "reuse-off", "cache-off"]
SHORT_REUSE_OFF = {"a namespace per request": "namespace", "SGLANG_RADIX_FORCE_MISS=1": "force-miss"}
SHORT_ROLES = {"baseline": "live", "reproduction": "repro", "crash-log": "crash log", "control": "no cache"}
ROLE_NAMES: dict[str, str] = {
    "baseline": "the live server",
    "reproduction": "the reproduction",
    "crash-log": "the original's crash log",
    "control": "the server without the cache",
}


def usage_below(value: float, than: float) -> bool:
    """``value`` is a lower token usage than ``than``, by more than half the step the log resolves."""
    return than - value > USAGE_STEP / 2


@dataclass(frozen=True, slots=True)
class SignatureSeen:
    """One signature at or above the run's severity threshold in an arm's log."""

    id: str
    """The catalog's signature id."""
    count: int
    """How many times it matched."""
    first_time: str | None
    """The first match's timestamp as the log wrote it; None when the line had none."""
    rank: str | None
    """The rank the first match came from, when the log says."""
    first_line: str
    """The first matching line, stripped and cut at 300 characters."""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "count": self.count, "first_time": self.first_time, "rank": self.rank,
                "first_line": self.first_line}


@dataclass(frozen=True, slots=True)
class ArmEvidence:
    """What one side of the comparison showed: the failing side (the live server, a reproduction,
    or the original's crash log) or the control.

    An arm holds what it got as far as: one that never ran has its role and error alone; one that
    never became healthy has no replay (``runs`` is None); the crash log has no calls. The JSON
    (``to_json``) has only the keys the arm reached, in the order the run learns them.
    """

    role: ArmRole
    """Which side this is."""
    url: str | None = None
    """The server the arm ran against (the original's URL for the crash log); None: it never ran."""
    argv: tuple[str, ...] | None = None
    """The started server's command line, redacted; None: radixtop did not start it."""
    output: str | None = None
    """The started server's stdout and stderr file."""
    calls: int | None = None
    """Calls planned over all runs; None: the arm replays nothing (the crash log, an arm not run)."""
    calls_per_run: int | None = None
    """Calls in one run of the workload."""
    logs: tuple[str, ...] = ()
    """The log files watched (read, for the crash log) for signatures."""
    healthy: bool = False
    """It ran: the live server and the crash log from the start, a started server once its health answered."""
    pid: int | None = None
    """The started server's pid."""
    start_s: float | None = None
    """Seconds from the start to its health answering (or to giving up)."""
    error: str | None = None
    """Why it did not run, or ran incompletely (died mid-run without a signature of its own)."""
    output_tail: str | None = None
    """The last lines of a started server's output, redacted, when it did not start or died."""
    note: str | None = None
    """Why the crash log was not read."""
    signatures: tuple[str, ...] = ()
    """Signatures at or above the severity threshold, the failure itself."""
    other_signatures: tuple[str, ...] = ()
    """Signatures below the threshold."""
    first_occurrences: tuple[str, ...] = ()
    """Each threshold signature's first line, as ``id at file:line: text``."""
    signature_detail: tuple[SignatureSeen, ...] = ()
    """Each threshold signature's count and first occurrence."""
    death_signatures: tuple[str, ...] | None = None
    """Every signature of a server that died before its health answered; None: it did not die so."""
    diverged: tuple[str, ...] = ()
    """Requests whose answers at temperature 0 differed between copies or runs."""
    runs: int | None = None
    """Runs of the workload made; None: it never replayed."""
    replay_s: float | None = None
    """Seconds the replay took."""
    stop_s: float | None = None
    """Seconds stopping the started server took."""
    failed_calls: int = 0
    """Calls that got no answer."""
    answered_calls: int = 0
    """Calls answered."""
    alive_after: bool | None = None
    """Whether its health answered after the replay; None: not asked."""
    dispatch_jitter_ms: Mapping[str, float] | None = None
    """How late the replay wrote its calls (p50, p99, max, calls)."""
    stopped_early: str | None = None
    """Why the replay stopped before its last run, if it did."""
    peak_token_usage: float | None = None
    """The highest token usage its log or /metrics showed (evictable counted free); None: unknown."""
    retractions: int = 0
    """Requests the scheduler retracted for want of room."""
    evicted_tokens_per_s: float | None = None
    """Evicted tokens per second over the replay, from /metrics; None: unknown."""
    cached_tokens: Mapping[str, Any] | None = None
    """Its cached-token account as radixtop.incident.replay.reuse writes it (summary, page_size, rows)."""
    step: StepKind = "as-run"
    """What the step changes against the workload as recorded."""
    max_in_flight: int | None = None
    """The client-side cap on calls in flight; None: the workload's own timing (as recorded)."""
    reuse_off: str | None = None
    """How prefix reuse was off (a namespace per request, SGLANG_RADIX_FORCE_MISS=1); None: it was on."""
    after_failure: bool = False
    """It ran on a server that had already shown the failure's signature: what a failure leaves
    (leaked slots, a tree out of step, a line SGLang logs once) may hide it, so clean decides nothing."""

    def load(self) -> str:
        return "as recorded" if self.max_in_flight is None else f"{self.max_in_flight} in flight"

    def change(self) -> str:
        """What the step changes, in a few words."""
        return {"lower-pressure": "lower load", "as-run": "as run", "cache-off": "cache off",
                "reuse-off": f"reuse off/{SHORT_REUSE_OFF.get(self.reuse_off or '', self.reuse_off or '?')}",
                }[self.step]

    def label(self) -> str:
        """The step in a few words: what it changed, at which load, on which server."""
        return f"{self.change()}, {self.load()}, on {ROLE_NAMES.get(self.role, self.role)}"

    def _scan_json(self) -> dict[str, Any]:
        return {"other_signatures": list(self.other_signatures), "first_occurrences": list(self.first_occurrences),
                "signature_detail": [d.to_json() for d in self.signature_detail]}

    def to_json(self) -> dict[str, Any]:
        """The arm as verdict.json holds it: the keys it reached, in the order the run learns them."""
        step = {"step": self.step, "label": self.label(), "max_in_flight": self.max_in_flight,
                "reuse_off": self.reuse_off, "after_failure": self.after_failure}
        if self.url is None:  # never ran: the control after a reproduction that could not start
            return {**step, "role": self.role, "error": self.error}
        if self.role == "crash-log":
            doc: dict[str, Any] = {**step, "role": self.role, "url": self.url, "logs": list(self.logs),
                                   "signatures": list(self.signatures), "diverged": list(self.diverged),
                                   "healthy": self.healthy}
            if self.note is not None:
                return {**doc, "note": self.note}
            return {
                **doc,
                **self._scan_json(),
                "peak_token_usage": self.peak_token_usage,
                "retractions": self.retractions,
            }
        doc = {
            **step, "role": self.role, "url": self.url, "argv": None if self.argv is None else list(self.argv),
            "output": self.output, "calls": self.calls, "calls_per_run": self.calls_per_run,
            "signatures": list(self.signatures), "diverged": list(self.diverged), "healthy": self.healthy,
            "logs": list(self.logs), **_present(pid=self.pid, start_s=self.start_s),
        }
        if self.runs is None:  # it never replayed: why, then what its log said as it died
            doc.update(_present(error=self.error, output_tail=self.output_tail))
            if self.death_signatures is not None:
                doc.update(self._scan_json(), death_signatures=list(self.death_signatures))
            return doc
        doc.update(_present(evicted_tokens_per_s=self.evicted_tokens_per_s, replay_s=self.replay_s, stop_s=self.stop_s))
        doc.update(self._scan_json())
        doc.update(
            runs=self.runs, failed_calls=self.failed_calls, alive_after=self.alive_after,
            answered_calls=self.answered_calls,
            dispatch_jitter_ms=None if self.dispatch_jitter_ms is None else dict(self.dispatch_jitter_ms),
            stopped_early=self.stopped_early, peak_token_usage=self.peak_token_usage, retractions=self.retractions,
        )
        doc.update(_present(error=self.error, output_tail=self.output_tail, cached_tokens=self.cached_tokens))
        return doc


def _present(**values: Any) -> dict[str, Any]:
    """The keys whose values are known: an arm's JSON leaves out what it never learned."""
    return {k: v for k, v in values.items() if v is not None}


ConditionState = Literal["needed", "not-needed", "open"]


@dataclass(frozen=True, slots=True)
class Condition:
    """Whether the failure needs one condition, and the evidence that says so."""

    state: ConditionState
    """needed (gone without it, all else equal), not-needed (fails without it) or open (no arm
    changed it alone)."""
    why: str
    """The evidence, in a few words."""
    fails_at: float | None = None
    """Pressure only: the peak token usage of the side that failed."""
    clean_at: float | None = None
    """Pressure only: the peak token usage of the side that stayed clean."""

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "why": self.why, **_present(fails_at=self.fails_at, clean_at=self.clean_at)}

    def text(self) -> str:
        return f"{self.state} ({self.why})"


@dataclass(frozen=True, slots=True)
class Conditions:
    """What the failure needs, as far as the arms that ran can tell."""

    pressure: Condition
    """Capacity pressure: KV token usage near the pool's size, retractions."""
    reuse: Condition
    """Prefix reuse: requests matching pages other requests cached."""
    cache: Condition
    """The radix cache's machinery itself (its tree, locks and evictions), with or without reuse."""

    def named(self) -> tuple[tuple[str, Condition], ...]:
        return (("pressure", self.pressure), ("reuse", self.reuse), ("cache", self.cache))

    def line(self) -> str:
        """One line: each condition's state."""
        return "Needs: " + " · ".join(f"{name} {c.state}" for name, c in self.named())

    def lines(self) -> list[str]:
        """Each condition with why."""
        return [f"  {name:<9}{c.text()}" for name, c in self.named()]

    def to_json(self) -> dict[str, Any]:
        return {"pressure": self.pressure.to_json(), "reuse": self.reuse.to_json(), "cache": self.cache.to_json()}


UNDECIDED = Conditions(*(Condition("open", "no failure to condition"),) * 3)


def _cache_lines(role: str, account: Mapping[str, Any] | None, *, rows: bool = True) -> list[str]:
    """An arm's cached tokens (radixtop.incident.replay.reuse): the totals and the calls short of their
    prefix or diverged."""
    if not account or not account.get("calls"):
        return []
    lines = [f"Cached tokens ({role}): {account['cached_tokens']:,} of {account['prompt_tokens']:,} prompt tokens "
             f"(hit rate {account['hit_rate']:.1%}, page size {account.get('page_size', '?')}; "
             f"{account['expected_cached_tokens']:,} expected from the trace)"]
    return lines + (format_reuse(account.get("rows") or [], title="short of their prefix, or diverged") if rows else [])


def _usage(arm: ArmEvidence, unknown: str = "unknown") -> str:
    usage = arm.peak_token_usage
    return unknown if usage is None else f"{usage:.2f}"


def _known(value: object, unknown: str = "-") -> str:
    return unknown if value is None else str(value)


def _rate(value: float | None, fmt: str) -> str:
    return "?" if value is None else format(value, fmt)


def _result_cell(step: ArmEvidence) -> str:
    if step.signatures or step.diverged:
        return ", ".join([*step.signatures, *(f"diverged {r}" for r in step.diverged)])
    if step.error or step.note:
        return "did not run"
    return "clean"


def _cached_cell(step: ArmEvidence) -> str:
    account = step.cached_tokens
    return "-" if not account or not account.get("calls") else f"{account['cached_tokens']:,}"


LADDER_WIDTH = 20  # the ladder picture's bar, in cells, for token usage 1.0


@dataclass(frozen=True)
class Verdict:
    """The run's outcome: the decision, the steps behind it, and where its evidence is."""

    verdict: VerdictKind
    """What the steps show."""
    reason: str
    """Why, with the evidence that decided it."""
    steps: tuple[ArmEvidence, ...]
    """Every step in the order it ran (the crash log standing for the workload as run, too)."""
    bundle: str | None
    """The evidence bundle's directory; None: none was taken."""
    repeat: list[str]
    """The command that repeats this run."""
    workdir: str
    """Where the plan, the servers' output, the replays and verdict.json are."""
    mode: str = "live"
    """The plan's mode: live, live-only, relaunch or crash-log."""
    planned_from: str | None = None
    """What the plan was made from, when not the live server."""
    assumption: str | None = None
    """What the comparison assumes (the crash log standing for a run of the workload)."""
    notes: list[str] = field(default_factory=list)
    """The plan's notes, then why a step was not run."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent on the evidence, the plan and the run."""
    conditions: Conditions = UNDECIDED
    """What the failure needs, as far as the steps tell."""

    def step(self, kind: StepKind) -> ArmEvidence | None:
        """The first step of that kind, if one ran."""
        return next((s for s in self.steps if s.step == kind), None)

    def table(self, width: int | None = None) -> list[str]:
        """The steps, one row each: what failed, peak usage, evictions, retractions, cached tokens.
        Narrower than the whole table (`width`), the cached, retraction, eviction and server columns
        go, in that order (the details and verdict.json keep them)."""
        rows = [("#", "change", "in flight", "server", "result", "peak", "evict/s", "retr", "cached")] + [
            (str(n), s.change(), _known(s.max_in_flight, "as recorded"), SHORT_ROLES.get(s.role, s.role),
             _result_cell(s), _usage(s, "?"), _rate(s.evicted_tokens_per_s, ",.0f"), str(s.retractions),
             _cached_cell(s))
            for n, s in enumerate(self.steps, 1)
        ]
        result_width = min(24, max(len(r[4]) for r in rows))
        # (column, its format) in order; the droppable ones go from the end of DROPS first
        columns = [(0, ">1"), (1, "<20"), (2, "<11"), (3, "<8"), (4, f"<{result_width}"), (5, ">5"), (6, ">7"),
                   (7, ">4"), (8, ">7")]
        for drop in (8, 7, 6, 3):
            if width is None or 2 + sum(int(f[1:]) + 1 for _, f in columns) <= width:
                break
            columns = [(c, f) for c, f in columns if c != drop]

        def cut(text: str) -> str:
            return text if len(text) <= result_width else text[: result_width - 1] + "…"

        return ["  " + " ".join(f"{cut(r[c]) if c == 4 else r[c]:{f}}" for c, f in columns).rstrip() for r in rows]

    def ladder(self) -> list[dict[str, Any]]:
        """The pressure ladder: each rung's load, peak token usage and whether it failed."""
        return [{"max_in_flight": s.max_in_flight, "peak_token_usage": s.peak_token_usage,
                 "failed": bool(s.signatures or s.diverged), "role": s.role}
                for s in self.steps if s.step in ("lower-pressure", "as-run")]

    def ladder_picture(self) -> list[str]:
        """The ladder as bars of peak token usage, each rung marked failed or clean."""
        rungs = self.ladder()
        if len(rungs) < 2 and not any(r["failed"] for r in rungs):
            return []
        lines = ["Pressure ladder (peak token usage; FAIL or clean):"]
        for rung in rungs:
            value = rung["peak_token_usage"]
            filled = 0 if value is None else round(min(1.0, max(0.0, value)) * LADDER_WIDTH)
            load = "as recorded" if rung["max_in_flight"] is None else f"{rung['max_in_flight']} in flight"
            shown = "unknown" if value is None else f"{value:.2f}"
            lines.append(f"  {load:>13} {'█' * filled}{'·' * (LADDER_WIDTH - filled)} {shown:>7}  "
                         + ("FAIL" if rung["failed"] else "clean"))
        return lines

    def summary(self, width: int | None = None) -> list[str]:
        """The conditions, what was planned from, what it assumes, and the steps as a table."""
        lines = [self.conditions.line()]
        if self.planned_from:
            lines.append(f"Planned from: {self.planned_from}")
        if self.assumption:
            lines.append(f"Assumes: {self.assumption}")
        return lines + self.table(width) + self.ladder_picture()

    def details(self) -> list[str]:
        """The evidence behind the table: first occurrences, errors, output tails, the commands."""
        lines = ["Conditions the failure needs:", *self.conditions.lines()]
        for n, step in enumerate(self.steps, 1):
            name = f"step {n} ({step.label()})"
            if step.first_occurrences:
                lines.append(f"First occurrences, {name}:")
                lines += [f"  {f}" for f in step.first_occurrences[:5]]
            if step.error:
                lines.append(f"Error, {name}: {step.error}")
            if step.death_signatures:
                lines.append(f"Died, {name}, with: {', '.join(step.death_signatures)}")
            if step.output_tail:
                lines.append(f"Output of {name} ended with:")
                lines += [f"    {line}" for line in step.output_tail.splitlines()[-15:]]
        for n, step in enumerate(self.steps, 1):  # per call only where reuse was on: elsewhere every call is short
            lines += _cache_lines(f"step {n}", step.cached_tokens, rows=step.step in ("lower-pressure", "as-run"))
        started = {s.argv: s for s in self.steps if s.argv}
        for argv, step in started.items():
            lines.append(f"{ROLE_NAMES.get(step.role, step.role).capitalize()}: {shlex.join(argv)}")
        return lines + [f"Note: {n}" for n in self.notes]

    def format(self) -> str:
        lines = [f"VERDICT: {self.verdict}", f"  {self.reason}", "", *self.summary(), *self.details()]
        lines += [
            "",
            f"Evidence bundle: {self.bundle or '(none)'}",
            f"Work directory:  {self.workdir}",
            f"Repeat: {shlex.join(self.repeat)}",
        ]
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": str(self.verdict),
            "reason": self.reason,
            "conditions": self.conditions.to_json(),
            "mode": self.mode,
            "planned_from": self.planned_from,
            "assumption": self.assumption,
            "steps": [s.to_json() for s in self.steps],
            "ladder": self.ladder(),
            "table": self.table(),
            "bundle": self.bundle,
            "repeat": self.repeat,
            "workdir": self.workdir,
            "notes": list(self.notes),
            "timings": dict(self.timings),
        }
