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
found by the next write's broken pipe even while the logs are quiet. The stream ends then, or at
SIGTERM / SIGHUP.
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
from typing import BinaryIO

from radixtop.errors import ExitStatus, UsageError
from radixtop.incident.bundle.here import find_here
from radixtop.probes.follow import LogFollower
from radixtop.probes.node_local import gpu_reports, local_report
from radixtop.probes.node_report import NodeReport

__all__ = ["follow_record", "run_follow"]

MAX_LINE = 64 * 1024  # characters per line sent, as the local follower caps them
MAX_RUN = 2_000  # lines per record: a reader's per-record cap (probes/node_stream.py) stays small
HEARTBEAT_S = 5.0


def run_follow(args: Namespace) -> int:
    logs = list(args.log) or _found_logs(args.url)
    if not logs:
        which = f"of the server at {args.url}" if args.url else "of a server"
        raise UsageError(f"no log {which} found on this node: give --log PATH (radixtop discover says what it sees)")
    return asyncio.run(_stream(logs, args.backlog, sys.stdout.buffer))


def _found_logs(url: str | None) -> list[str]:
    """The logs of the server at `url` (found live, its sighting noted; else, once it has died,
    as its sighting names them: incident/bundle/here.py's rule), else of every server found here."""
    if url is not None:
        here = find_here(url.rstrip("/"))
        if here.pid is not None and here.logs:
            _note_sighting(url.rstrip("/"), here.pid, list(here.logs))
        return list(here.logs)
    report = asyncio.run(local_report())
    return list(dict.fromkeys(s.log_path for s in report.servers if s.log_path))


def _note_sighting(url: str, pid: int, logs: list[str]) -> None:
    """What this node's radixtop keeps of the server while it lives (its pid, argv, logs)."""
    from radixtop.incident.common.sighting import load_sighting, observe, save_sighting

    try:
        save_sighting(observe(url, pid, logs=logs, previous=load_sighting(url)))
    except OSError:  # no runtime directory (RuntimeDirError): the stream goes on without the note
        pass


def follow_record(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass") + b"\n"


async def _stream(logs: list[str], backlog: int, out: BinaryIO) -> int:
    follower = LogFollower(logs, backlog_lines=backlog, max_line=MAX_LINE)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(signum, follower.stop)
    beat = asyncio.ensure_future(_heartbeat(out, follower))
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
        beat.cancel()
        follower.stop()
    return ExitStatus.OK


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
