"""Another node's findings (`radixtop scan --node HOST`): `radixtop scan --json` run there through
the user's ssh (radixtop.probes.remote, after `discover --json` for the clock skew), on the logs
the user named there or, without any, on the log of each server radixtop finds there (`--found`).
Its answer is decoded as hostile by radixtop.diagnosis.node_findings, its times put on this
node's clock. Never raises: a node that gives no findings is one line."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from radixtop.bounded import load_json
from radixtop.diagnosis.node_findings import NodeScan, read_scan
from radixtop.probes.remote import ClockSkew, at_most, reach, run_remote

__all__ = ["MAX_SCAN_BYTES", "ScanAnswer", "scan_nodes"]

MAX_SCAN_BYTES = 64 << 20  # a scan's JSON: each finding's context, a few hundred lines at most
MAX_AT_ONCE = 16
DISCOVER_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class ScanAnswer:
    host: str
    scan: NodeScan | None = None
    error: str = ""  # one line, with what to do, when there is no scan
    skew: ClockSkew | None = None


async def scan_nodes(targets: Sequence[tuple[str, Sequence[str]]], *, ssh_config: str | None, timeout_s: float,
                     command: str) -> list[ScanAnswer]:
    """Each (host, logs there)'s findings, in the order given."""
    return await at_most(MAX_AT_ONCE, [
        functools.partial(_scan_node, h, logs, ssh_config=ssh_config, timeout_s=timeout_s, command=command)
        for h, logs in targets
    ])


async def _scan_node(host: str, logs: Sequence[str], *, ssh_config: str | None, timeout_s: float,
                     command: str) -> ScanAnswer:
    answer = await reach(host, ssh_config=ssh_config, command=command, timeout_s=min(DISCOVER_TIMEOUT_S, timeout_s))
    if answer.report is None:
        return ScanAnswer(host, error=answer.error)
    args = ["scan", "--json", *(logs or ["--found"])]
    run = await run_remote(host, args, ssh_config=ssh_config, timeout_s=timeout_s, command=command,
                           max_bytes=MAX_SCAN_BYTES)
    if not run.ok:
        return ScanAnswer(host, error=run.error, skew=answer.skew)
    correction = answer.skew.correction_s if answer.skew is not None else 0.0
    try:
        scan = read_scan(load_json(run.out, "the answer", max_bytes=MAX_SCAN_BYTES), host, correction)
    except ValueError as exc:
        return ScanAnswer(host, skew=answer.skew,
                          error=f"{host}: its answer is not radixtop's scan report ({exc}); "
                                f"try `ssh {host} {command} {' '.join(args)}`")
    return ScanAnswer(host, scan, skew=answer.skew)
