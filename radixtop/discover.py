"""`radixtop discover`: what radixtop finds on this node (the servers, their URL and ports, logs,
the ranks' debug endpoints, processes, GPUs, the hostname and the clock), and with `--node HOST`
what it finds on other nodes, through the user's own ssh.

`--json` alone prints this node's report, one JSON object (radixtop.probes.node_report): what
another radixtop reads over ssh. With `--node`, one object holds every node's entry, this one's
first. A node that could not be reached is one line on stderr saying what to do (and its entry
says it too); the exit status is 1 only when every node failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from argparse import Namespace
from typing import Any, cast

from radixtop.errors import ExitStatus, UsageError
from radixtop.probes.discovery import Discovery, FoundServer
from radixtop.probes.node_local import local_report
from radixtop.probes.node_report import ServerReport
from radixtop.probes.remote import NodeAnswer, check_host, check_remote_command, reach_all
from radixtop.probes.server_cmdline import ServerKind
from radixtop.probes.serverlog import LogElsewhere

__all__ = ["run_discover"]

LOCAL = "local"  # this node's name in --node's output
MAX_NODES = 256


def run_discover(args: Namespace) -> int:
    hosts = _hosts(args.node)
    command = args.remote_radixtop
    try:
        check_remote_command(command)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.ssh_config is not None and not os.path.isfile(args.ssh_config):
        raise UsageError(f"--ssh-config: {args.ssh_config}: no such file; give the ssh config file to use")
    if not hosts and args.no_local:
        raise UsageError("--no-local leaves no node: add --node HOST")
    if not hosts:
        report = asyncio.run(local_report())
        if args.json:
            print(json.dumps(report.to_dict(), indent=1))
        else:
            print("\n".join(describe(LOCAL, NodeAnswer(LOCAL, report))))
        return ExitStatus.OK
    answers = asyncio.run(_gather(hosts, not args.no_local, args.ssh_config, args.timeout, command))
    if args.json:
        print(json.dumps({"nodes": [_entry(a) for a in answers]}, indent=1))
    else:
        print("\n".join(line for a in answers if a.ok for line in describe(a.host, a)))
    for a in answers:
        if not a.ok:
            print(f"radixtop: {a.error}", file=sys.stderr)
    return ExitStatus.OK if any(a.ok for a in answers) else ExitStatus.ERROR


def _hosts(given: list[str]) -> list[str]:
    hosts = list(dict.fromkeys(given))  # once each, in the order given
    if len(hosts) > MAX_NODES:
        raise UsageError(f"--node: {len(hosts)} nodes is more than {MAX_NODES}; ask in batches")
    for host in hosts:
        try:
            check_host(host)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return hosts


async def _gather(hosts: list[str], local: bool, ssh_config: str | None, timeout_s: float,
                  command: str) -> list[NodeAnswer]:
    async def here() -> list[NodeAnswer]:
        return [NodeAnswer(LOCAL, await local_report())] if local else []

    mine, theirs = await asyncio.gather(
        here(), reach_all(hosts, ssh_config=ssh_config, timeout_s=timeout_s, command=command)
    )
    return [*mine, *theirs]


def _entry(answer: NodeAnswer) -> dict[str, Any]:
    entry: dict[str, Any] = {"node": answer.host, "ok": answer.ok}
    if answer.report is None:
        entry["error"] = answer.error
    else:
        entry["report"] = answer.report.to_dict()
    if answer.skew is not None:
        entry["clock_skew_s"] = round(answer.skew.offset_s, 6)
        entry["clock_skew_uncertainty_s"] = round(answer.skew.uncertainty_s, 6)
    if answer.host != LOCAL:
        entry["seconds"] = round(answer.seconds, 3)
    return entry


def describe(name: str, answer: NodeAnswer) -> list[str]:
    """A node's report as lines for a person: a heading, discovery's own description of its
    servers, their processes, its GPUs."""
    report = answer.report
    assert report is not None
    head = f"{'this node' if name == LOCAL else name} (hostname {report.hostname}"
    if report.radixtop_version:
        head += f", radixtop {report.radixtop_version}"
    if answer.skew is not None:
        head += f"; {answer.skew.text()}"
    lines = [head + "):"]
    if not report.servers:
        lines += [f"  {line}" for line in Discovery((), report.notes).describe()]
    for s in report.servers:
        lines += [f"  {line}" for line in Discovery((_found(s),)).describe()]
        named = [f"{p.role}{' ' + p.rank if p.rank else ''} (pid {p.pid}{_unless_asleep(p.status)})"
                 for p in s.processes if p.role != "other"]
        if named:
            lines.append(f"    processes: {', '.join(named[:12])}{' …' if len(named) > 12 else ''}")
    if report.servers:
        lines += [f"  {note}" for note in report.notes]
    if report.gpus_unavailable:
        lines.append(f"  GPUs: unavailable: {report.gpus_unavailable}")
    for g in report.gpus:
        used = "memory unknown"
        if g.memory_used is not None and g.memory_total:
            used = f"{g.memory_used / 2**30:.1f} of {g.memory_total / 2**30:.1f} GiB"
        lines.append(f"  GPU {g.index} {g.name} ({g.state}): {used}, {len(g.pids)} processes")
    return lines


def _unless_asleep(status: str) -> str:
    return "" if status in ("sleeping", "running") else f", {status}"


def _found(s: ServerReport) -> FoundServer:
    """A reported server as discovery's own record, so that both read with one wording."""
    elsewhere = LogElsewhere("", s.log_elsewhere) if s.log_elsewhere else None
    return FoundServer(pid=s.pid, kind=cast(ServerKind, s.kind), cmdline=(), started=s.started, url=s.url,
                       ports=s.ports, log_path=s.log_path, log_how=s.log_how, instrument_urls=s.instrument_urls,
                       ranks=s.ranks, version=s.version, problems=s.problems, log_elsewhere=elsewhere, model=s.model)

