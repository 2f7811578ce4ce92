"""The experiment's rules: from the steps that ran, what the failure needs and the verdict.

An experiment runs the incident's workload in steps (radixtop/incident/confirm/confirm_run.py),
each changing one condition against the step that failed:

* ``lower-pressure``: the same server, at most K calls in flight (a rung of the pressure ladder);
* ``as-run``: the workload as recorded, on the failing server (or the original's crash log);
* ``reuse-off``: the same pressure with no prefix hit (a cache namespace per request on a running
  server, or a server started with ``SGLANG_RADIX_FORCE_MISS=1``: the tree still inserts, locks
  and evicts);
* ``cache-off``: the same pressure on a server started with ``--disable-radix-cache``.

Each condition is decided only by a step that changed it alone, or by the failing step itself
(a failure at low token usage does not need pressure; one with no cached token does not need
reuse). The failing step is the one at the least load. A clean step decides only where it is
fair: on a server that had not already failed with a signature (what a failure leaves, leaked
slots or a line SGLang logs once, can hide a repeat), and, for a failure under pressure, at a
token usage it has been seen failing at or more (a change that also lowers the pressure decides
nothing about itself). What no step decided stays ``open``, with why (no GPU free, the server
died, never at the failing pressure, not asked).

The verdict's name summarises the conditions: ``pressure-dependent`` (pressure needed),
``cache-dependent`` (reuse or the cache's machinery needed, not pressure), ``persists-under-control``
(every condition tried was not needed), ``not-reproduced`` (it ran clean as recorded),
``inconclusive`` (it could not run, or every step failed the same way before answering one run:
a workload the model cannot take fails every step alike).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from radixtop.incident.confirm.verdict import (
    PRESSURE_SIGNATURES,
    PRESSURE_USAGE,
    ROLE_NAMES,
    UNDECIDED,
    ArmEvidence,
    Condition,
    Conditions,
    VerdictKind,
    usage_below,
)

__all__ = ["Decision", "failed", "failing_floor", "judge", "load", "matched", "ran", "under_pressure"]


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict on the steps, why, and the conditions behind it."""

    verdict: VerdictKind
    """What the steps show."""
    reason: str
    """One sentence saying why, with the evidence that decided it."""
    conditions: Conditions = UNDECIDED
    """What the failure needs, as far as the steps tell."""


def bad(step: ArmEvidence) -> str:
    """What failed in the step: its signatures and diverged requests ("" when clean)."""
    parts = []
    if step.signatures:
        parts.append(f"signature {', '.join(step.signatures)}")
    if step.diverged:
        parts.append(f"divergence in {', '.join(step.diverged)}")
    return " and ".join(parts)


def failed(step: ArmEvidence) -> bool:
    return bool(bad(step))


def ran(step: ArmEvidence) -> bool:
    """The step gave evidence: it answered calls, or failed, or is the crash log read."""
    if step.role == "crash-log":
        return step.note is None
    return step.healthy and step.error is None and (step.answered_calls > 0 or failed(step))


def usage(step: ArmEvidence) -> str:
    value = step.peak_token_usage
    return "unknown" if value is None else f"{value:.2f}"


def under_pressure(step: ArmEvidence) -> bool:
    value = step.peak_token_usage
    return bool((value is not None and value >= PRESSURE_USAGE) or step.retractions
                or PRESSURE_SIGNATURES & {*step.signatures, *step.other_signatures})


def _failed_at_once(step: ArmEvidence) -> bool:
    """It failed before it had answered one run's calls (and so never ran the workload)."""
    per_run = step.calls_per_run
    return failed(step) and per_run is not None and step.answered_calls < per_run and (
        bool(step.failed_calls) or step.alive_after is False)


def _where(step: ArmEvidence) -> str:
    return "as recorded" if step.max_in_flight is None else f"at most {step.max_in_flight} in flight"


def load(step: ArmEvidence) -> float:
    """Calls in flight, for ordering: the workload as recorded is the most."""
    return math.inf if step.max_in_flight is None else step.max_in_flight


def _pressure(ladder: Sequence[ArmEvidence], failing: ArmEvidence) -> Condition:
    clean = [s for s in ladder if ran(s) and not failed(s) and not s.after_failure]
    above = [s for s in clean if load(s) > load(failing)]
    if above:  # clean at more load than a failing rung: the failure does not come every time
        return Condition("open", f"clean at {_where(above[0])} but failing at {_where(failing)}: the failure does "
                         "not come every time at this load (more runs would tell)", fails_at=failing.peak_token_usage)
    below = [s for s in clean if load(s) < load(failing)]
    if below:
        calm = max(below, key=lambda s: s.peak_token_usage or 0.0)
        fell = (failing.peak_token_usage is not None and calm.peak_token_usage is not None
                and usage_below(calm.peak_token_usage, failing.peak_token_usage))
        why = (f"fails at peak token usage {usage(failing)} ({_where(failing)}), clean at {usage(calm)} "
               f"({_where(calm)})" + ("" if fell else ": the load, not the token usage, fell"))
        return Condition("needed", why, fails_at=failing.peak_token_usage, clean_at=calm.peak_token_usage)
    if not under_pressure(failing):
        return Condition("not-needed", f"fails at peak token usage {usage(failing)} ({_where(failing)}), "
                         f"below pressure ({PRESSURE_USAGE:.2f}) and with no retraction",
                         fails_at=failing.peak_token_usage)
    if failing.max_in_flight is not None:
        return Condition("open", f"even the lowest rung ({_where(failing)}) reached peak token usage "
                         f"{usage(failing)}: the ladder did not get below pressure", fails_at=failing.peak_token_usage)
    return Condition("open", "no lower rung ran", fails_at=failing.peak_token_usage)


def failing_floor(steps: Sequence[ArmEvidence]) -> float | None:
    """The least peak token usage any step failed at: the pressure the failure is known to come at."""
    seen = [s.peak_token_usage for s in steps if failed(s) and s.peak_token_usage is not None]
    return min(seen) if seen else None


def matched(step: ArmEvidence, failing: ArmEvidence, floor: float | None) -> bool:
    """A clean step compares with the failure only at a pressure it has been seen failing at, or
    more (when it came under pressure): a step that also lowered the token usage tells nothing
    about its own change. Usages the log cannot tell apart are the same pressure."""
    if not under_pressure(failing):
        return True
    return (step.peak_token_usage is not None and floor is not None
            and not usage_below(step.peak_token_usage, floor)) or bool(step.retractions)


def _clean_verdict(tried: Sequence[ArmEvidence], failing: ArmEvidence, floor: float | None,
                   what: str) -> tuple[ArmEvidence | None, str]:
    """The clean step that decides a question, or None and why none does."""
    clean = [s for s in tried if ran(s) and not failed(s)]
    fresh = [s for s in clean if not s.after_failure]
    if not fresh:
        if clean:
            return None, (f"clean with {what} ({_where(clean[0])}), but on the server that had already failed: "
                          "what the failure left (leaked slots, a line logged once) can hide it; a fresh server "
                          "would tell")
        why = next((s.error or s.note for s in tried if s.error or s.note), None) or "it answered nothing"
        return None, f"the step with {what} could not run: {why}"
    fit = [s for s in fresh if matched(s, failing, floor)]
    if not fit:
        top = max(fresh, key=lambda s: s.peak_token_usage or 0.0)
        return None, (f"clean with {what}, but only below the pressure it failed at (peak token usage "
                      f"{usage(top)} against {'unknown' if floor is None else f'{floor:.2f}'}): the change "
                      "lowered the pressure too")
    return fit[0], ""


def _changed(tried: Sequence[ArmEvidence], failing: ArmEvidence, floor: float | None, what: str,
             how: Callable[[ArmEvidence], str]) -> tuple[Condition, ArmEvidence | None]:
    """A question from the steps that changed it: not-needed (the failure persists) or open, with
    no step; else the clean step that makes it needed."""
    still = next((s for s in tried if failed(s)), None)
    if still is not None:
        return Condition("not-needed", f"persists with {what} ({how(still)}, peak token usage {usage(still)}): "
                         f"{bad(still)}"), None
    gone, why = _clean_verdict(tried, failing, floor, what)
    return Condition("open", why), gone


def _reuse(failing: ArmEvidence, tried: Sequence[ArmEvidence], floor: float | None, unasked: str | None) -> Condition:
    hits = (failing.cached_tokens or {}).get("cached_tokens")
    if hits == 0 and failing.cached_tokens and failing.cached_tokens.get("calls"):
        return Condition("not-needed", "it failed with no prefix hit (0 cached tokens)")
    if not tried:
        return Condition("open", unasked or "reuse off was not tried")
    leaky = next((s for s in tried if (s.cached_tokens or {}).get("cached_tokens")), None)
    if leaky is not None:
        left = (leaky.cached_tokens or {})["cached_tokens"]
        return Condition("open", f"reuse was not off: {left:,} cached tokens with {leaky.reuse_off}")
    settled, gone = _changed(tried, failing, floor, "reuse off", lambda s: f"{s.reuse_off}, {_where(s)}")
    if gone is None:
        return settled
    return Condition("needed", f"gone without prefix hits at the same load ({gone.reuse_off}, {_where(gone)}, "
                     f"peak token usage {usage(gone)})")


def _cache(failing: ArmEvidence, reuse: Condition, tried: Sequence[ArmEvidence], floor: float | None,
           unasked: str | None) -> Condition:
    if reuse.state == "needed":
        return Condition("needed", "reuse is the cache's: gone with reuse off")
    if not tried:
        return Condition("open", unasked or "the cache off was not tried")
    settled, gone = _changed(tried, failing, floor, "the radix cache disabled", _where)
    if gone is None:
        return settled
    machinery = "persists with reuse off, " if reuse.state == "not-needed" else ""
    return Condition("needed", f"the cache's own machinery: {machinery}gone with the cache disabled "
                     f"(--disable-radix-cache, {_where(gone)}, peak token usage {usage(gone)})")


def _same_at_once(steps: Sequence[ArmEvidence]) -> tuple[list[ArmEvidence], list[str]]:
    """Steps that failed before answering one run, with the signatures they all share; none when
    a step ran the workload clean (the model can take it)."""
    if any(ran(s) and not failed(s) for s in steps):
        return [], []
    at_once = [s for s in steps if s.role != "crash-log" and _failed_at_once(s)]
    if len(at_once) < 2:
        return [], []
    shared = set(at_once[0].signatures).intersection(*(s.signatures for s in at_once[1:]))
    return (at_once, sorted(shared)) if shared else ([], [])


def _summary(c: Conditions) -> VerdictKind:
    states = [cond.state for _, cond in c.named()]
    if c.pressure.state == "needed":
        return VerdictKind.PRESSURE_DEPENDENT
    if "needed" in states:
        return VerdictKind.CACHE_DEPENDENT
    if "not-needed" in states:
        return VerdictKind.PERSISTS_UNDER_CONTROL
    return VerdictKind.INCONCLUSIVE


ADVICE = {
    VerdictKind.PRESSURE_DEPENDENT: "resume only with bounded load (no more in flight than the clean rung)",
    VerdictKind.CACHE_DEPENDENT: ("the prefix cache's own behaviour: run with --disable-radix-cache until it is "
                                  "fixed, and report it upstream"),
    VerdictKind.PERSISTS_UNDER_CONTROL: ("an unconditional defect or another cause (the competing hypothesis stays "
                                         "open)"),
    VerdictKind.INCONCLUSIVE: "no condition could be varied",
}


def _reason(verdict: VerdictKind, failing: ArmEvidence, c: Conditions) -> str:
    name = ROLE_NAMES.get(failing.role, "the failing side")
    shown = f"{name} showed {bad(failing)} ({_where(failing)}, peak token usage {usage(failing)})"
    parts = []
    for state, words in (("needed", "it needs"), ("not-needed", "not"), ("open", "open:")):
        names = [n for n, cond in c.named() if cond.state == state]
        if names:
            parts.append(f"{words} {' and '.join(names)}")
    return f"{shown}; {', '.join(parts)}: {ADVICE[verdict]}"


def judge(steps: Sequence[ArmEvidence], *, unasked: Mapping[str, str] | None = None) -> Decision:
    """The verdict on the steps in the order they ran. ``unasked``: for each question no step
    answered ("reuse", "cache"), why it was not asked."""
    unasked = unasked or {}
    inconclusive = VerdictKind.INCONCLUSIVE
    if not steps:
        return Decision(inconclusive, "no step ran")
    for step in steps:
        if step.role == "reproduction" and not step.healthy:
            return Decision(inconclusive, f"the reproduction could not run: {step.error or 'it did not start'}")
    ladder = [s for s in steps if s.step in ("lower-pressure", "as-run")]
    failing = min((s for s in ladder if failed(s)), key=load, default=None)  # the least load it failed at
    if failing is None:
        full = next((s for s in ladder if s.step == "as-run"), None)
        if full is not None and ran(full):
            extra = [f"{s.step}: {bad(s)}" for s in steps if failed(s)]
            return Decision(VerdictKind.NOT_REPRODUCED, (
                f"{ROLE_NAMES.get(full.role, 'the failing side')} stayed clean under this workload as recorded: "
                "no signature, no divergence" + (f" ({'; '.join(extra)})" if extra else "")))
        last = ladder[-1] if ladder else steps[-1]
        why = last.error or last.note or f"{ROLE_NAMES.get(last.role, 'it')} answered no call"
        return Decision(inconclusive, f"the workload could not run as recorded: {why}")
    if failing.role == "reproduction" and failing.error:
        return Decision(inconclusive, f"{failing.error}: the reproduction's evidence is incomplete")
    alike, shared = _same_at_once(steps)
    if shared:
        answered = " and ".join(str(s.answered_calls) for s in alike)
        return Decision(inconclusive, (
            f"{len(alike)} steps failed the same way ({', '.join(shared)}) before answering one run of the "
            f"workload ({answered} calls answered): the workload or the environment fails them alike, whatever "
            "the step changes (see each step's output)"))
    pressure = _pressure(ladder, failing)
    floor = failing_floor(steps)
    reuse = _reuse(failing, [s for s in steps if s.step == "reuse-off"], floor, unasked.get("reuse"))
    cache = _cache(failing, reuse, [s for s in steps if s.step == "cache-off"], floor, unasked.get("cache"))
    found = Conditions(pressure, reuse, cache)
    verdict = _summary(found)
    return Decision(verdict, _reason(verdict, failing, found), found)
