"""The confirmation run's verdict: what the failing arm and the control showed, side by side.

The failing side is the live server (the baseline), a reproduction of it started from what was
seen (when the original is gone or stopped), or the original's crash log (``--no-reproduction``).
The control is the same launch with bounded pressure (``--max-running-requests`` divided) and,
by default, no radix cache. The verdicts:

* ``pressure-dependent``: the failure (a signature, or a divergence at temperature 0) is gone under
  the control, and the failing side was under capacity pressure when it failed (token usage at or
  above PRESSURE_USAGE, or retractions) that the control removed: resume only with bounded
  pressure;
* ``cache-dependent``: gone under a control without the radix cache, while the failing side showed
  no capacity pressure: the cache's own behaviour (SGLang #22819's stale page at a one-page
  prefix), not load, is the condition;
* ``persists-under-control``: still there under the control: an unconditional defect or another
  cause (the competing hypothesis stays open);
* ``not-reproduced``: the failing side came out clean under this workload;
* ``inconclusive``: an arm could not run, or answered nothing (why, with its output's tail), or
  both arms failed the same way before they had answered one run of the workload: a workload the
  model cannot take or a broken environment fails every arm alike, whatever the control changes.

Beside the verdict, the conditions the failure needs (:class:`Conditions`): capacity pressure,
prefix reuse, and the radix cache itself, each ``needed``, ``not-needed`` or ``open`` with why.
Two arms decide only what their one difference decides: a control that lowers the pressure and
disables the cache together leaves open which of the two mattered, and says so.

Each arm's evidence is an :class:`ArmEvidence`; ``decide()`` turns two of them into a
:class:`Decision`, and :class:`Verdict` is the run's outcome as shown and written to verdict.json.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from radixtop.incident.replay.reuse import format_reuse

__all__ = ["PRESSURE_USAGE", "VERDICTS", "ArmEvidence", "ArmRole", "Condition", "Conditions", "Decision",
           "SignatureSeen", "Verdict", "VerdictKind", "conditions", "decide"]


class VerdictKind(StrEnum):
    """What the run concludes; the values are what users read and what JSON holds."""

    PRESSURE_DEPENDENT = "pressure-dependent"
    CACHE_DEPENDENT = "cache-dependent"
    PERSISTS_UNDER_CONTROL = "persists-under-control"
    NOT_REPRODUCED = "not-reproduced"
    INCONCLUSIVE = "inconclusive"


VERDICTS = tuple(VerdictKind)
PRESSURE_USAGE = 0.85  # token usage (evictable counted free) at which the pool is under pressure
# Signatures that are themselves capacity pressure: a failing arm that shows them was under it.
PRESSURE_SIGNATURES = frozenset({"kv-pool-retract", "prefill-oom", "decode-oom", "req-slots-oom", "vllm-preemption"})
# Which side an arm is: the live server, a reproduction of it, the original's crash log, or the control.
ArmRole = Literal["baseline", "reproduction", "crash-log", "control"]
ROLE_NAMES: dict[str, str] = {
    "baseline": "the live server",
    "reproduction": "the reproduction",
    "crash-log": "the original's crash log",
    "control": "the control",
}


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

    def _scan_json(self) -> dict[str, Any]:
        return {"other_signatures": list(self.other_signatures), "first_occurrences": list(self.first_occurrences),
                "signature_detail": [d.to_json() for d in self.signature_detail]}

    def to_json(self) -> dict[str, Any]:
        """The arm as verdict.json holds it: the keys it reached, in the order the run learns them."""
        if self.url is None:  # never ran: the control after a reproduction that could not start
            return {"role": self.role, "error": self.error}
        if self.role == "crash-log":
            doc: dict[str, Any] = {"role": self.role, "url": self.url, "logs": list(self.logs),
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
            "role": self.role, "url": self.url, "argv": None if self.argv is None else list(self.argv),
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


def _open(why: str) -> Condition:
    return Condition("open", why)


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


UNDECIDED = Conditions(_open("no failure to condition"), _open("no failure to condition"),
                       _open("no failure to condition"))


def conditions(verdict: VerdictKind, failing: ArmEvidence, control: ArmEvidence, *, cache_disabled: bool) -> Conditions:
    """What two arms decide: only a condition the control changed alone, or one a failure
    persisted without."""
    if verdict not in (VerdictKind.PRESSURE_DEPENDENT, VerdictKind.CACHE_DEPENDENT,
                       VerdictKind.PERSISTS_UNDER_CONTROL):
        return UNDECIDED
    f, c = failing.peak_token_usage, control.peak_token_usage
    if verdict == VerdictKind.PERSISTS_UNDER_CONTROL:
        pressure = Condition("not-needed", f"it fails under the control too (peak token usage {_usage(control)})",
                             fails_at=c if c is not None else f)
        if cache_disabled:
            gone = "it persists with the radix cache disabled"
            return Conditions(pressure, Condition("not-needed", gone), Condition("not-needed", gone))
        kept = "the control kept the radix cache"
        return Conditions(pressure, _open(kept), _open(kept))
    lowered = f is not None and c is not None and c < f
    if not cache_disabled:  # the control lowered the pressure alone
        pressure = Condition("needed", f"fails at peak token usage {_usage(failing)}, clean at {_usage(control)}",
                             fails_at=f, clean_at=c)
        kept = "the control kept the radix cache: its part is untested"
        return Conditions(pressure, _open(kept), _open(kept))
    if not lowered and f is not None and c is not None:  # the same pressure: the cache alone changed
        same = f"clean at the same pressure (peak token usage {_usage(control)}) with the cache disabled"
        return Conditions(Condition("not-needed", same, fails_at=f, clean_at=c),
                          _open("reuse off and the cache off were not tried apart"),
                          Condition("needed", "gone with the radix cache disabled at the same pressure"))
    both = (f"the control lowered the pressure ({_usage(failing)} to {_usage(control)}) and disabled the cache "
            "together: one of them is needed, not yet which")
    return Conditions(Condition("open", both, fails_at=f, clean_at=c), _open(both), _open(both))


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict on two arms, and why."""

    verdict: VerdictKind
    """What the arms show."""
    reason: str
    """One sentence saying why, with the evidence that decided it."""


def _bad(arm: ArmEvidence) -> str:
    parts = []
    if arm.signatures:
        parts.append(f"signature {', '.join(arm.signatures)}")
    if arm.diverged:
        parts.append(f"divergence in {', '.join(arm.diverged)}")
    return " and ".join(parts)


def _under_pressure(arm: ArmEvidence) -> bool:
    usage = arm.peak_token_usage
    return bool(
        (usage is not None and usage >= PRESSURE_USAGE)
        or arm.retractions
        or PRESSURE_SIGNATURES & set(arm.signatures) | PRESSURE_SIGNATURES & set(arm.other_signatures)
    )


def _usage(arm: ArmEvidence) -> str:
    usage = arm.peak_token_usage
    return "unknown" if usage is None else f"{usage:.2f}"


def _failed_at_once(arm: ArmEvidence) -> bool:
    """The arm failed before it had answered one run's calls (and so never ran the workload)."""
    per_run = arm.calls_per_run
    return bool(_bad(arm)) and per_run is not None and arm.answered_calls < per_run and (
        bool(arm.failed_calls) or arm.alive_after is False)


def _same_failure(failing: ArmEvidence, control: ArmEvidence) -> list[str]:
    """The signatures both arms failed with, when both failed at once."""
    if failing.role == "crash-log" or not (_failed_at_once(failing) and _failed_at_once(control)):
        return []
    return sorted(set(failing.signatures) & set(control.signatures))


def decide(failing: ArmEvidence, control: ArmEvidence, *, control_summary: str, cache_disabled: bool) -> Decision:
    """The verdict, and why, from the two arms' evidence."""
    inconclusive, name = VerdictKind.INCONCLUSIVE, ROLE_NAMES.get(failing.role, "the failing side")
    if failing.role == "reproduction" and not failing.healthy:
        return Decision(inconclusive, f"the reproduction could not run: {failing.error or 'it did not start'}")
    if failing.role == "reproduction" and failing.error:
        return Decision(inconclusive, f"{failing.error}: the reproduction's evidence is incomplete")
    what = _bad(failing)
    if not control.healthy:
        why = control.error or "the control server did not run"
        return Decision(inconclusive, f"the control could not run: {why}; {name} showed {what or 'nothing'}")
    if control.answered_calls == 0 and not control.signatures:
        return Decision(inconclusive, "the control answered none of the workload's calls (see its output)")
    if control.error:  # died mid-run without a signature of its own: killed from outside
        return Decision(
            inconclusive,
            f"{control.error}: the control's evidence is incomplete; {name} showed {what or 'nothing'}",
        )
    if not what:
        if failing.role != "crash-log" and failing.answered_calls == 0:
            return Decision(inconclusive, failing.note or f"{name} answered no call")
        extra = _bad(control)
        return Decision(
            VerdictKind.NOT_REPRODUCED,
            f"{name} stayed clean under this workload: no signature, no divergence"
            + (f" (the control showed {extra})" if extra else ""),
        )
    still = _bad(control)
    same = _same_failure(failing, control)
    if same:
        return Decision(inconclusive, (
            f"both arms failed the same way ({', '.join(same)}) before answering one run of the workload "
            f"({failing.answered_calls} and {control.answered_calls} calls answered): the workload "
            "or the environment fails them alike, whatever the control changes (see each arm's output)"
        ))
    if still:
        return Decision(VerdictKind.PERSISTS_UNDER_CONTROL, (
            f"{name} showed {what}; under the control ({control_summary}) there is still {still}: "
            "an unconditional defect or another cause (the competing hypothesis stays open)"
        ))
    if _under_pressure(failing) or not cache_disabled:
        return Decision(VerdictKind.PRESSURE_DEPENDENT, (
            f"{name} showed {what} under capacity pressure (peak token usage {_usage(failing)}, "
            f"{failing.retractions} retractions); under the control ({control_summary}) it is gone "
            f"(peak token usage {_usage(control)}): resume only with bounded pressure (the control's settings)"
            + ("; to tell pressure from the cache itself, repeat with --control-cache keep" if cache_disabled else "")
        ))
    return Decision(VerdictKind.CACHE_DEPENDENT, (
        f"{name} showed {what} with no capacity pressure (peak token usage {_usage(failing)}, no retractions); "
        f"without the radix cache ({control_summary}) it is gone: the prefix cache's own behaviour is the "
        "condition, not load (run with --disable-radix-cache until it is fixed, and report it upstream)"
    ))


def _signature_cell(arm: ArmEvidence) -> str:
    details = arm.signature_detail
    if not details:
        return "none"
    return "; ".join(
        f"{d.id} ×{d.count}" + (f" first {str(d.first_time)[11:] or d.first_time}" if d.first_time else "")
        for d in details[:4]
    ) + (f"; +{len(details) - 4} more" if len(details) > 4 else "")


def _cache_lines(role: str, account: Mapping[str, Any] | None) -> list[str]:
    """An arm's cached tokens (radixtop.incident.replay.reuse): the totals and the calls short of their
    prefix or diverged."""
    if not account or not account.get("calls"):
        return []
    lines = [f"Cached tokens ({role}): {account['cached_tokens']:,} of {account['prompt_tokens']:,} prompt tokens "
             f"(hit rate {account['hit_rate']:.1%}, page size {account.get('page_size', '?')}; "
             f"{account['expected_cached_tokens']:,} expected from the trace)"]
    return lines + format_reuse(account.get("rows") or [], title="short of their prefix, or diverged")


def _rate(value: float | None, fmt: str) -> str:
    return "unknown" if value is None else format(value, fmt)


def _known(value: object, unknown: str = "-") -> str:
    return unknown if value is None else str(value)


@dataclass(frozen=True)
class Verdict:
    """The run's outcome: the decision, the arms behind it, and where its evidence is."""

    verdict: VerdictKind
    """What the arms show."""
    reason: str
    """Why, with the evidence that decided it."""
    baseline: ArmEvidence
    """The failing side (its role says which)."""
    control: ArmEvidence
    """The control."""
    bundle: str | None
    """The evidence bundle's directory; None: none was taken."""
    repeat: list[str]
    """The command that repeats this run."""
    workdir: str
    """Where the plan, the servers' output, the replays and verdict.json are."""
    mode: str = "live"
    """The plan's mode: live, relaunch or crash-log."""
    planned_from: str | None = None
    """What the plan was made from, when not the live server."""
    assumption: str | None = None
    """What the comparison assumes (the crash log standing for a run of the workload)."""
    notes: list[str] = field(default_factory=list)
    """The plan's notes."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent on the evidence, the plan and the run."""
    conditions: Conditions = UNDECIDED
    """What the failure needs, as far as the arms tell."""

    def table(self) -> list[str]:
        """The arms side by side, one row per piece of evidence."""
        b, c = self.baseline, self.control
        rows = [
            ("", ROLE_NAMES.get(b.role, "failing side"), "the control"),
            ("server", b.url or "-", c.url or "-"),
            ("ran", "yes" if b.healthy else "no", "yes" if c.healthy else "no"),
            ("signatures", _signature_cell(b), _signature_cell(c)),
            ("diverged", ", ".join(b.diverged) or "none", ", ".join(c.diverged) or "none"),
            ("failed calls", f"{b.failed_calls} of {_known(b.calls, '?')}",
             f"{c.failed_calls} of {_known(c.calls, '?')}"),
            ("peak token usage", _usage(b), _usage(c)),
            ("evicted tok/s", _rate(b.evicted_tokens_per_s, ",.0f"), _rate(c.evicted_tokens_per_s, ",.0f")),
            ("retractions", str(b.retractions), str(c.retractions)),
            ("alive after", _known(b.alive_after), _known(c.alive_after)),
        ]
        left = max(len(r[0]) for r in rows)
        mid = min(60, max(len(r[1]) for r in rows))
        out = []
        for label, x, y in rows:
            x = x if len(x) <= mid else x[: mid - 1] + "…"
            out.append(f"  {label.ljust(left)}  {x.ljust(mid)}  {y}")
        return out

    def summary(self) -> list[str]:
        """What was planned from, what it assumes, and the arms side by side."""
        lines = [self.conditions.line()]
        if self.planned_from:
            lines.append(f"Planned from: {self.planned_from}")
        if self.assumption:
            lines.append(f"Assumes: {self.assumption}")
        return lines + self.table()

    def details(self) -> list[str]:
        """The evidence behind the table: first occurrences, errors, output tails, the commands."""
        lines = ["Conditions the failure needs:", *self.conditions.lines()]
        for role, arm in (("failing side", self.baseline), ("control", self.control)):
            if arm.first_occurrences:
                lines.append(f"First occurrences ({role}):")
                lines += [f"  {f}" for f in arm.first_occurrences[:5]]
            if arm.error:
                lines.append(f"{role.capitalize()} error: {arm.error}")
            if arm.death_signatures:
                lines.append(f"{role.capitalize()} died with: {', '.join(arm.death_signatures)}")
            if arm.output_tail:
                lines.append(f"{role.capitalize()}'s output ended with:")
                lines += [f"    {line}" for line in arm.output_tail.splitlines()[-15:]]
        for role, arm in (("failing side", self.baseline), ("control", self.control)):
            lines += _cache_lines(role, arm.cached_tokens)
        for arm in (self.baseline, self.control):
            if arm.argv:
                lines.append(f"{ROLE_NAMES.get(arm.role, arm.role).capitalize()}: {shlex.join(arm.argv)}")
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
            "baseline": self.baseline.to_json(),
            "control": self.control.to_json(),
            "table": self.table(),
            "bundle": self.bundle,
            "repeat": self.repeat,
            "workdir": self.workdir,
            "notes": list(self.notes),
            "timings": dict(self.timings),
        }
