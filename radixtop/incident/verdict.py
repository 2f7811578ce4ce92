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
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from radixtop.incident.reuse import format_reuse

__all__ = ["PRESSURE_USAGE", "VERDICTS", "Verdict", "decide"]

VERDICTS = ("pressure-dependent", "cache-dependent", "persists-under-control", "not-reproduced", "inconclusive")
PRESSURE_USAGE = 0.85  # token usage (evictable counted free) at which the pool is under pressure
# Signatures that are themselves capacity pressure: a failing arm that shows them was under it.
PRESSURE_SIGNATURES = frozenset({"kv-pool-retract", "prefill-oom", "decode-oom", "req-slots-oom", "vllm-preemption"})
ROLE_NAMES = {
    "baseline": "the live server",
    "reproduction": "the reproduction",
    "crash-log": "the original's crash log",
    "control": "the control",
}


def _bad(arm: dict[str, Any]) -> str:
    parts = []
    if arm.get("signatures"):
        parts.append(f"signature {', '.join(arm['signatures'])}")
    if arm.get("diverged"):
        parts.append(f"divergence in {', '.join(arm['diverged'])}")
    return " and ".join(parts)


def _under_pressure(arm: dict[str, Any]) -> bool:
    usage = arm.get("peak_token_usage")
    return bool(
        (usage is not None and usage >= PRESSURE_USAGE)
        or arm.get("retractions")
        or PRESSURE_SIGNATURES & set(arm.get("signatures") or ()) | PRESSURE_SIGNATURES & set(arm.get("other_signatures") or ())
    )


def _usage(arm: dict[str, Any]) -> str:
    usage = arm.get("peak_token_usage")
    return "unknown" if usage is None else f"{usage:.2f}"


def _failed_at_once(arm: dict[str, Any]) -> bool:
    """The arm failed before it had answered one run's calls (and so never ran the workload)."""
    per_run = arm.get("calls_per_run")
    answered = arm.get("answered_calls", 0)
    return bool(_bad(arm)) and isinstance(per_run, int) and answered < per_run and (
        bool(arm.get("failed_calls")) or arm.get("alive_after") is False)  # fmt: skip


def _same_failure(failing: dict[str, Any], control: dict[str, Any]) -> list[str]:
    """The signatures both arms failed with, when both failed at once."""
    if failing.get("role") == "crash-log" or not (_failed_at_once(failing) and _failed_at_once(control)):
        return []
    return sorted(set(failing.get("signatures") or ()) & set(control.get("signatures") or ()))


def decide(failing: dict[str, Any], control: dict[str, Any], *, control_summary: str, cache_disabled: bool) -> tuple[str, str]:
    """(verdict, reason) from the two arms' evidence."""
    name = ROLE_NAMES.get(failing.get("role", ""), "the failing side")
    if failing.get("role") == "reproduction" and not failing.get("healthy"):
        return "inconclusive", f"the reproduction could not run: {failing.get('error') or 'it did not start'}"
    if failing.get("role") == "reproduction" and failing.get("error"):
        return "inconclusive", f"{failing['error']}: the reproduction's evidence is incomplete"
    what = _bad(failing)
    if not control.get("healthy"):
        why = control.get("error") or "the control server did not run"
        return "inconclusive", f"the control could not run: {why}; {name} showed {what or 'nothing'}"
    if control.get("answered_calls", 0) == 0 and not control.get("signatures"):
        return "inconclusive", "the control answered none of the workload's calls (see its output)"
    if control.get("error"):  # died mid-run without a signature of its own: killed from outside
        return "inconclusive", f"{control['error']}: the control's evidence is incomplete; {name} showed {what or 'nothing'}"
    if not what:
        if failing.get("role") != "crash-log" and failing.get("answered_calls", 0) == 0:
            return "inconclusive", failing.get("note") or f"{name} answered no call"
        extra = _bad(control)
        return "not-reproduced", (f"{name} stayed clean under this workload: no signature, no divergence"
                                  + (f" (the control showed {extra})" if extra else ""))  # fmt: skip
    still = _bad(control)
    same = _same_failure(failing, control)
    if same:
        return "inconclusive", (
            f"both arms failed the same way ({', '.join(same)}) before answering one run of the workload "
            f"({failing.get('answered_calls', 0)} and {control.get('answered_calls', 0)} calls answered): the workload "
            "or the environment fails them alike, whatever the control changes (see each arm's output)"
        )
    if still:
        return "persists-under-control", (
            f"{name} showed {what}; under the control ({control_summary}) there is still {still}: "
            "an unconditional defect or another cause (the competing hypothesis stays open)"
        )
    if _under_pressure(failing) or not cache_disabled:
        return "pressure-dependent", (
            f"{name} showed {what} under capacity pressure (peak token usage {_usage(failing)}, "
            f"{failing.get('retractions') or 0} retractions); under the control ({control_summary}) it is gone "
            f"(peak token usage {_usage(control)}): resume only with bounded pressure (the control's settings)"
            + ("; to tell pressure from the cache itself, repeat with --control-cache keep" if cache_disabled else "")
        )
    return "cache-dependent", (
        f"{name} showed {what} with no capacity pressure (peak token usage {_usage(failing)}, no retractions); "
        f"without the radix cache ({control_summary}) it is gone: the prefix cache's own behaviour is the "
        "condition, not load (run with --disable-radix-cache until it is fixed, and report it upstream)"
    )


def _signature_cell(arm: dict[str, Any]) -> str:
    details = arm.get("signature_detail") or []
    if not details:
        return "none"
    return "; ".join(
        f"{d['id']} ×{d.get('count', 1)}" + (f" first {str(d['first_time'])[11:] or d['first_time']}" if d.get("first_time") else "")
        for d in details[:4]
    ) + (f"; +{len(details) - 4} more" if len(details) > 4 else "")


def _cache_lines(role: str, account: dict[str, Any] | None) -> list[str]:
    """An arm's cached tokens (radixtop.incident.reuse): the totals and the calls short of their prefix or diverged."""
    if not account or not account.get("calls"):
        return []
    lines = [f"Cached tokens ({role}): {account['cached_tokens']:,} of {account['prompt_tokens']:,} prompt tokens "
             f"(hit rate {account['hit_rate']:.1%}, page size {account.get('page_size', '?')}; "
             f"{account['expected_cached_tokens']:,} expected from the trace)"]  # fmt: skip
    return lines + format_reuse(account.get("rows") or [], title="short of their prefix, or diverged")


def _rate(value: Any, fmt: str) -> str:
    return "unknown" if value is None else format(value, fmt)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    baseline: dict[str, Any]  # the failing side (its "role" says which)
    control: dict[str, Any]
    bundle: str | None
    repeat: list[str]
    workdir: str
    mode: str = "live"
    planned_from: str | None = None
    assumption: str | None = None
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # seconds: evidence, plan, run

    def table(self) -> list[str]:
        """The arms side by side, one row per piece of evidence."""
        b, c = self.baseline, self.control
        rows = [
            ("", ROLE_NAMES.get(b.get("role", ""), "failing side"), "the control"),
            ("server", b.get("url") or "-", c.get("url") or "-"),
            ("ran", "yes" if b.get("healthy", True) else "no", "yes" if c.get("healthy") else "no"),
            ("signatures", _signature_cell(b), _signature_cell(c)),
            ("diverged", ", ".join(b.get("diverged") or []) or "none", ", ".join(c.get("diverged") or []) or "none"),
            ("failed calls", f"{b.get('failed_calls', 0)} of {b.get('calls', '?')}", f"{c.get('failed_calls', 0)} of {c.get('calls', '?')}"),
            ("peak token usage", _usage(b), _usage(c)),
            ("evicted tok/s", _rate(b.get("evicted_tokens_per_s"), ",.0f"), _rate(c.get("evicted_tokens_per_s"), ",.0f")),
            ("retractions", str(b.get("retractions", 0)), str(c.get("retractions", 0))),
            ("alive after", str(b.get("alive_after", "-")), str(c.get("alive_after", "-"))),
        ]  # fmt: skip
        left = max(len(r[0]) for r in rows)
        mid = min(60, max(len(r[1]) for r in rows))
        out = []
        for label, x, y in rows:
            x = x if len(x) <= mid else x[: mid - 1] + "…"
            out.append(f"  {label.ljust(left)}  {x.ljust(mid)}  {y}")
        return out

    def summary(self) -> list[str]:
        """What was planned from, what it assumes, and the arms side by side."""
        lines = [f"Planned from: {self.planned_from}"] if self.planned_from else []
        if self.assumption:
            lines.append(f"Assumes: {self.assumption}")
        return lines + self.table()

    def details(self) -> list[str]:
        """The evidence behind the table: first occurrences, errors, output tails, the commands."""
        lines = []
        for role, arm in (("failing side", self.baseline), ("control", self.control)):
            firsts = arm.get("first_occurrences") or []
            if firsts:
                lines.append(f"First occurrences ({role}):")
                lines += [f"  {f}" for f in firsts[:5]]
            if arm.get("error"):
                lines.append(f"{role.capitalize()} error: {arm['error']}")
            if arm.get("death_signatures"):
                lines.append(f"{role.capitalize()} died with: {', '.join(arm['death_signatures'])}")
            if arm.get("output_tail"):
                lines.append(f"{role.capitalize()}'s output ended with:")
                lines += [f"    {line}" for line in arm["output_tail"].splitlines()[-15:]]
        for role, arm in (("failing side", self.baseline), ("control", self.control)):
            lines += _cache_lines(role, arm.get("cached_tokens"))
        for arm in (self.baseline, self.control):
            if arm.get("argv"):
                lines.append(f"{ROLE_NAMES.get(arm.get('role', ''), arm.get('role', '?')).capitalize()}: {shlex.join(arm['argv'])}")
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
            "verdict": self.verdict,
            "reason": self.reason,
            "mode": self.mode,
            "planned_from": self.planned_from,
            "assumption": self.assumption,
            "baseline": self.baseline,
            "control": self.control,
            "table": self.table(),
            "bundle": self.bundle,
            "repeat": self.repeat,
            "workdir": self.workdir,
            "notes": list(self.notes),
            "timings": dict(self.timings),
        }
