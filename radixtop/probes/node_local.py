"""This node's report (radixtop.probes.node_report): discovery's servers with their process trees,
the GPUs through NVML, the hostname and the wall-clock time. Never raises: what could not be read
is a line in the report."""

from __future__ import annotations

import asyncio
import os
import socket
import time

from radixtop import __version__
from radixtop.probes.discovery import Discovery, FoundServer, discover
from radixtop.probes.gpu import GpuSample, read_once
from radixtop.probes.node_report import GpuReport, NodeReport, ProcessReport, ServerReport
from radixtop.probes.procs import ProcsSample, ProcTree

__all__ = ["local_report"]


async def local_report(*, timeout_s: float = 1.0) -> NodeReport:
    """What `radixtop` alone finds on this node. `timeout_s` bounds each HTTP question discovery asks."""
    gpu_read = asyncio.create_task(asyncio.to_thread(_read_gpus))  # NVML while discovery asks the servers
    found: Discovery = await discover(timeout_s=timeout_s)
    servers = []
    for server in found.servers:
        tree = await asyncio.to_thread(ProcTree(server.pid).read)
        servers.append(_server(server, tree))
    sample = await gpu_read
    gpus, unavailable = _gpus(sample)
    return NodeReport(
        hostname=socket.gethostname(),
        time=time.time(),  # last: the closer to the answer, the better the skew estimate
        radixtop_version=__version__,
        servers=tuple(servers),
        notes=found.notes,
        gpus=gpus,
        gpus_unavailable=unavailable,
    )


def gpu_reports() -> tuple[tuple[GpuReport, ...], str]:
    """This node's GPUs as a report holds them, or why there are none (one NVML read)."""
    return _gpus(_read_gpus())


def _read_gpus() -> GpuSample | str:
    try:
        return read_once()
    except Exception as exc:  # read_once catches NVML's own; anything else is one line too
        return f"GPU read failed: {type(exc).__name__}: {exc}"


def _server(s: FoundServer, tree: ProcsSample) -> ServerReport:
    return ServerReport(
        pid=s.pid,
        kind=s.kind,
        name=s.name,
        started=s.started,
        url=s.url,
        ports=s.ports,
        log_path=s.log_path,
        log_how=s.log_how,
        log_elsewhere=s.log_elsewhere.name if s.log_elsewhere is not None else "",
        instrument_urls=s.instrument_urls,
        ranks=s.ranks,
        version=s.version,
        model=s.model,
        problems=s.problems + tree.problems,
        processes=tuple(
            ProcessReport(p.pid, p.ppid, p.role, p.rank, _name(p.name, titled=p.role not in ("server", "other")),
                          p.status)
            for p in tree.procs
        ),
    )


def _name(name: str, *, titled: bool) -> str:
    """A titled process (sglang::scheduler_TP0) by its title; any other by its executable alone: a
    command line can hold an API key, and this report leaves the node."""
    if titled or not name:
        return name
    return os.path.basename(name.split()[0])


def _gpus(sample: GpuSample | str) -> tuple[tuple[GpuReport, ...], str]:
    if isinstance(sample, str):
        return (), sample
    if not sample.gpus:
        return (), sample.status.message or sample.status.state
    return tuple(
        GpuReport(
            index=g.index, name=g.name, uuid=g.uuid, state=g.state, memory_used=g.memory_used,
            memory_total=g.memory_total, util_percent=g.util_percent,
            pids=tuple(p.pid for p in g.processes), problems=g.problems,
        )
        for g in sample.gpus
    ), ""
