"""`radixtop follow --json`: this node's server logs as a stream of JSON lines, for the radixtop on
another node that watches this one through ssh (`radixtop --node HOST` runs it here).

The logs are the ones `--log` names, else the log of the server `--url` names as discovery finds
it (noted in that server's sighting, incident/common/sighting.py, so that once the server has
died `radixtop bundle --url URL` here still finds its log), else the logs of every server found.
The first line says which: `{"logs": [...], "time": T}`. Then each run of lines read together is
one `{"log": PATH, "lines": [...]}`, flushed as it is read (probes/follow.py: rotation,
truncation and late creation handled as `tail -F` does, lines cleaned and capped), and every
HEARTBEAT_S `{"time": T, "report": R}`, R a node report holding only the GPUs (one NVML read): the
reader shows them, knows the node is there, and a reader gone away (ssh's connection closed) is
found by the next write's broken pipe even while the logs are quiet. With `--url`, every flight
record the server's ranks write here (the tree as a rank failed, in the folders their /health
names, asked once at the start, and the default one; probes/flight.py's checks) comes as
`{"flight": NAME, "record": R}` within a second. The
stream ends when its reader is gone, or at SIGTERM / SIGHUP.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import httpx

from radixtop.errors import ExitStatus, UsageError
from radixtop.incident.bundle.here import Here, find_here
from radixtop.instrument.flight import flight_dir
from radixtop.probes.flight import FLIGHT_POLL_S, read_flight_records
from radixtop.probes.follow import LogFollower
from radixtop.probes.node_local import gpu_reports, local_report
from radixtop.probes.node_report import NodeReport
from radixtop.schema import HEALTH_PATH, parse_health

__all__ = ["follow_record", "run_follow"]

MAX_LINE = 64 * 1024  # characters per line sent, as the local follower caps them
MAX_RUN = 2_000  # lines per record: the reader's per-record cap (probes/node_link.py) is met with room
HEARTBEAT_S = 5.0


def run_follow(args: Namespace) -> int:
    server = _found(args.url) if not args.log else None
    logs = list(args.log) or (list(server.logs) if server is not None else [])
    if not logs:
        which = f"of the server at {args.url}" if args.url else "of a server"
        raise UsageError(f"no log {which} found on this node: give --log PATH (radixtop discover says what it sees)")
    dirs = _flight_dirs(server.instruments) if server is not None and args.url is not None else []
    return asyncio.run(_stream(logs, args.backlog, sys.stdout.buffer, server.pid if server else None, dirs))


def _found(url: str | None) -> Here:
    """The server at `url` (found live, its sighting noted; else, once it has died, its log as its
    sighting names it: incident/bundle/here.py's rule), else the logs of every server found here."""
    if url is not None:
        here = find_here(url.rstrip("/"))
        if here.pid is not None and here.logs:
            _note_sighting(url.rstrip("/"), here.pid, list(here.logs))
        return here
    report = asyncio.run(local_report())
    return Here(logs=tuple(dict.fromkeys(s.log_path for s in report.servers if s.log_path)))


def _flight_dirs(instruments: Sequence[str]) -> list[Path]:
    """Where the server's ranks write their flight records: what each rank's /health names (its
    instrument's environment, not this session's), and the default place."""
    named: list[Path] = []
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        for url in instruments[:64]:
            try:
                answer = client.get(url.rstrip("/") + HEALTH_PATH)
                health = parse_health(answer.content[:256 * 1024])
            except (httpx.HTTPError, ValueError):
                continue
            if health.flight_dir:
                named.append(Path(health.flight_dir))
    return list(dict.fromkeys([*named, flight_dir()]))


def _note_sighting(url: str, pid: int, logs: list[str]) -> None:
    """What this node's radixtop keeps of the server while it lives (its pid, argv, logs)."""
    from radixtop.incident.common.sighting import load_sighting, observe, save_sighting

    try:
        save_sighting(observe(url, pid, logs=logs, previous=load_sighting(url)))
    except OSError:  # no runtime directory (RuntimeDirError): the stream goes on without the note
        pass


def follow_record(obj: object) -> bytes:
    """One record: one line of ASCII JSON (whatever a log line holds, the reader can decode it)."""
    return json.dumps(obj, separators=(",", ":")).encode("ascii") + b"\n"


async def _stream(logs: list[str], backlog: int, out: BinaryIO, pid: int | None, flights: list[Path]) -> int:
    follower = LogFollower(logs, backlog_lines=backlog, max_line=MAX_LINE)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(signum, follower.stop)
    tasks = [asyncio.ensure_future(_heartbeat(out, follower))]
    if flights:
        tasks.append(asyncio.ensure_future(_flights(out, follower, flights, pid)))
    try:
        out.write(follow_record({"logs": logs, "time": time.time()}))
        out.flush()
        async for batch in follower.batches():
            runs = getattr(batch.records, "runs", ())
            for run in runs:
                for start in range(0, len(run.texts), MAX_RUN):
                    out.write(follow_record({"log": run.source, "lines": run.texts[start : start + MAX_RUN]}))
            out.flush()
    except BrokenPipeError:  # the reader went away: the stream is over (and stdout's last flush too)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    finally:
        for task in tasks:
            task.cancel()
        follower.stop()
    return ExitStatus.OK


async def _flights(out: BinaryIO, follower: LogFollower, dirs: list[Path], pid: int | None) -> None:
    """The server's flight records as they appear (or are rewritten) in `dirs`."""
    seen: dict[Path, float] = {}
    while True:  # until the stream ends (cancelled) or its reader is gone
        read = await asyncio.to_thread(read_flight_records, dirs, pid, seen=seen)
        try:
            for found in read.records:
                out.write(follow_record({"flight": found.path.name, "record": found.record.to_dict()}))
            out.flush()
        except BrokenPipeError:
            follower.stop()
            return
        await asyncio.sleep(FLIGHT_POLL_S)


async def _heartbeat(out: BinaryIO, follower: LogFollower) -> None:
    hostname = socket.gethostname()
    while True:  # until the stream ends (cancelled) or its reader is gone
        await asyncio.sleep(HEARTBEAT_S)
        gpus, unavailable = await asyncio.to_thread(gpu_reports)
        report = NodeReport(hostname=hostname, time=time.time(), gpus=gpus, gpus_unavailable=unavailable)
        try:
            out.write(follow_record({"time": report.time, "report": report.to_dict()}))
            out.flush()
        except BrokenPipeError:
            follower.stop()
            return
