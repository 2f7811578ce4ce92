"""`radixtop fleet --prometheus URL`: every rank the fleet's own Prometheus scrapes (radixtop's
debug endpoints' /metrics), per node and rank, and the ranks that stand out, each with why and the
command that opens its node in the TUI. One poll (probes/fleet.py), the analysis of
session/fleet.py, printed as a table or one JSON object.

Exit status: 0 when Prometheus answered (ranks standing out or not), 1 when it could not be read
(one line on stderr says why and what to do).
"""

from __future__ import annotations

import asyncio
import json
import sys
from argparse import Namespace
from typing import Any

from radixtop.errors import ExitStatus, UsageError
from radixtop.probes.fleet import FleetSample, RankFigures
from radixtop.probes.fleet_probe import FleetProbe
from radixtop.probes.prometheus import check_url, shown_url
from radixtop.session.fleet import HEADER, FleetState, FleetView, open_command, rank_row
from radixtop.textsafe import printable

__all__ = ["describe", "run_fleet", "to_json"]

def run_fleet(args: Namespace) -> int:
    try:
        url = check_url(args.prometheus)
    except ValueError as exc:
        raise UsageError(f"--prometheus: {exc}") from None
    sample = asyncio.run(_poll_once(url, args.timeout))
    state = FleetState(shown_url(url))  # what is printed: a password in the URL masked
    state.apply(sample)
    if sample.status.state not in ("ok", "degraded"):
        print(f"radixtop: {sample.status.message}", file=sys.stderr)
        return ExitStatus.ERROR
    view = state.view
    if args.json:
        print(json.dumps(to_json(view), indent=1))
    else:
        print("\n".join(describe(view)))
    return ExitStatus.OK


async def _poll_once(url: str, timeout_s: float) -> FleetSample:
    probe = FleetProbe(url, timeout_s=timeout_s)
    try:
        return await probe.poll()
    finally:
        await probe.aclose()


def describe(view: FleetView) -> list[str]:
    lines = [
        f"Prometheus {printable(view.url)}: {len(view.ranks)} rank{'s' * (len(view.ranks) != 1)} on "
        f"{view.nodes} node{'s' * (view.nodes != 1)}, {len(view.standouts)} standing out",
    ]
    sample = view.sample
    if sample is not None and sample.status.message:
        lines.append(f"  {printable(sample.status.message)}")
    if sample is not None:
        lines += [f"  note: {printable(note)}" for note in sample.notes]
    if view.ranks:
        lines += ["", HEADER, *(rank_row(r) for r in view.ranks)]
    if view.standouts:
        lines += ["", "Standing out:"]
        for s in view.standouts:
            lines.append(f"  {printable(s.rank.node)} rank {printable(s.rank.rank)} ({printable(s.rank.instance)})")
            lines += [f"    - {reason}" for reason in s.reasons]
            lines.append(f"    open it: {s.command}")
    return lines


def _rank_json(r: RankFigures) -> dict[str, Any]:
    return {
        "node": r.node, "rank": r.rank, "instance": r.instance, "job": r.job, "scrape": r.scrape,
        "token_usage": r.usage, "capacity_tokens": r.capacity, "available_tokens": r.available,
        "evictable_tokens": r.evictable, "locked_tokens": r.locked, "evictions": r.evictions,
        "negative_lock_ref": r.negative_lock_ref, "nodes_below_zero": r.nodes_below_zero,
        "lock_failures": r.lock_failures, "unlock_failures": r.unlock_failures, "hooks_active": r.hooks_active,
        "lock_anomalies": r.lock_anomalies,
    }


def to_json(view: FleetView) -> dict[str, Any]:
    """The view as one JSON object (json.dumps escapes every control character of the labels)."""
    sample = view.sample
    return {
        "prometheus": view.url,
        "state": sample.status.state if sample is not None else None,
        "message": sample.status.message if sample is not None else "",
        "notes": list(sample.notes) if sample is not None else [],
        "ranks": [_rank_json(r) for r in view.ranks],
        "standouts": [
            {"node": s.rank.node, "rank": s.rank.rank, "instance": s.rank.instance, "reasons": list(s.reasons),
             "command": open_command(s.rank.node)}
            for s in view.standouts
        ],
    }
