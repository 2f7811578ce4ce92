"""Another node's report, through the user's own OpenSSH: `ssh -o BatchMode=yes ... HOST --
radixtop discover --json`, and the clock skew measured over that channel.

It is the user's ssh, with their ~/.ssh/config (or the file `ssh_config` names), agent, keys and
known_hosts: radixtop holds no key and never asks for a password (BatchMode: what would prompt
fails instead, and radixtop says what to run). The ssh is an argv list, never a shell line; a
HOST that ssh would read as an option, or with whitespace or control characters in it, is refused
first. Its output is read up to a size cap, within a deadline, then it is killed with its process
group; every failure is one line (radixtop.probes.ssh_failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass

from radixtop.probes.node_report import MAX_REPORT_BYTES, NodeReport, parse_node_report
from radixtop.probes.ssh_failure import explain_bad_answer, explain_failure, explain_timeout

__all__ = ["ClockSkew", "NodeAnswer", "check_host", "check_remote_command", "reach", "ssh_argv"]

DEFAULT_TIMEOUT_S = 30.0
MAX_STDERR_BYTES = 64 * 1024  # ssh's messages and a shell's complaints; the rest is dropped
_CHUNK = 64 * 1024
_REMOTE_COMMAND = re.compile(r"[A-Za-z0-9_./~+-]+")


@dataclass(frozen=True, slots=True)
class ClockSkew:
    """The node's clock minus this one's: its report's time minus the midpoint of sending and
    receiving. The report was made somewhere in that round trip, so the truth lies within
    offset_s ± round_trip_s / 2."""

    offset_s: float
    round_trip_s: float

    @property
    def uncertainty_s(self) -> float:
        return self.round_trip_s / 2


@dataclass(frozen=True, slots=True)
class NodeAnswer:
    host: str
    report: NodeReport | None = None
    error: str = ""  # one line, with what to do, when there is no report
    skew: ClockSkew | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.report is not None


def check_host(host: str) -> str:
    """The host as given (`name`, `user@name`, an ssh-config alias), or ValueError (one line)."""
    if not host:
        raise ValueError("--node: empty host name")
    if host.startswith("-"):
        raise ValueError(f"--node: {host[:40]!r} starts with '-', which ssh would read as an option; give a host name")
    if any(c.isspace() or not c.isprintable() for c in host):
        raise ValueError(f"--node: {host[:40]!r} has whitespace or control characters; give a host name")
    if len(host) > 255:
        raise ValueError("--node: a host name is at most 255 characters")
    return host


def check_remote_command(command: str) -> str:
    """The radixtop command to run on the node: a path or a name, in characters no shell reads
    specially (ssh hands the remote command to the node's shell as one line)."""
    if not _REMOTE_COMMAND.fullmatch(command) or command.startswith("-"):
        raise ValueError(f"--remote-radixtop: {command[:60]!r}: give a path or a name (letters, digits, _ . / ~ + -)")
    return command


def ssh_argv(host: str, *, ssh_config: str | None = None, connect_timeout_s: int = 10,
             command: str = "radixtop") -> list[str]:
    """The ssh command line. -T: no terminal; ClearAllForwardings: a LocalForward in the user's
    config for that host must not fail this run; LogLevel=ERROR: ssh's own failures are said,
    its warnings are not (a Host key "Permanently added" line is not an error)."""
    argv = ["ssh", "-T", "-x", "-a",
            "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, connect_timeout_s)}",
            "-o", "ClearAllForwardings=yes", "-o", "LogLevel=ERROR"]
    if ssh_config is not None:
        argv += ["-F", ssh_config]
    return [*argv, check_host(host), "--", check_remote_command(command), "discover", "--json"]


async def reach(host: str, *, ssh_config: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                command: str = "radixtop", max_bytes: int = MAX_REPORT_BYTES) -> NodeAnswer:
    """The node's report, or the one line why not; never raises (but for CancelledError)."""
    started = time.monotonic()
    sent = time.time()
    try:
        argv = ssh_argv(host, ssh_config=ssh_config, connect_timeout_s=int(min(10.0, max(1.0, timeout_s / 2))),
                        command=command)
    except ValueError as exc:
        return NodeAnswer(host, error=str(exc))
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout kills ssh and whatever it started
        )
    except FileNotFoundError:
        return NodeAnswer(host, error="the OpenSSH client (ssh) is not installed here: install openssh-client")
    except OSError as exc:
        return NodeAnswer(host, error=f"{host}: could not start ssh ({exc.strerror or exc})")
    try:
        got = await asyncio.wait_for(_run(proc, max_bytes), timeout_s)
        elapsed = time.monotonic() - started
    except TimeoutError:
        return NodeAnswer(host, error=explain_timeout(host, timeout_s, command), seconds=time.monotonic() - started)
    finally:
        await _reap(proc)
    out, too_big, err, code = got
    if too_big:
        return NodeAnswer(host, error=f"{host}: its answer is over {max_bytes} bytes, more than a node report; "
                                      f"try `ssh {host} {command} discover --json`", seconds=elapsed)
    stderr = err.decode("utf-8", "replace")
    if code != 0:
        return NodeAnswer(host, error=explain_failure(host, code, stderr, command), seconds=elapsed)
    try:
        report = parse_node_report(out, "the answer")
    except ValueError as exc:
        return NodeAnswer(host, error=explain_bad_answer(host, str(exc), command), seconds=elapsed)
    received = sent + elapsed  # the wall clock at the answer, on the monotonic clock's count
    skew = ClockSkew(report.time - (sent + received) / 2, elapsed)
    return NodeAnswer(host, report, skew=skew, seconds=elapsed)


async def _run(proc: asyncio.subprocess.Process, max_bytes: int) -> tuple[bytes, bool, bytes, int]:
    """(stdout up to max_bytes, whether it said more, stderr's first MAX_STDERR_BYTES, exit status).
    An answer over the cap kills ssh at once: left blocked on a full pipe it would never exit."""
    assert proc.stdout is not None and proc.stderr is not None
    out_task = asyncio.ensure_future(_read(proc.stdout, max_bytes))
    err_task = asyncio.ensure_future(_read(proc.stderr, MAX_STDERR_BYTES, drain=True))
    try:
        out, too_big = await out_task
        if too_big:
            _kill(proc)
            return out, True, b"", -1
        err, _ = await err_task
        return out, False, err, await proc.wait()
    finally:
        out_task.cancel()
        err_task.cancel()


async def _read(stream: asyncio.StreamReader, limit: int, *, drain: bool = False) -> tuple[bytes, bool]:
    """Up to `limit` bytes of the stream; (what was kept, whether there was more). Without `drain`
    it stops at the cap; with it, it reads on to the end (within the caller's deadline) keeping
    nothing more, so the writer never blocks on a full pipe."""
    buf = bytearray()
    more = False
    while True:  # ends at EOF, at the cap without drain, or at the caller's deadline
        chunk = await stream.read(_CHUNK)
        if not chunk:
            return bytes(buf), more
        if not more:
            buf += chunk
        if len(buf) > limit:
            del buf[limit:]
            more = True
            if not drain:
                return bytes(buf), True


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """ssh and its process group gone, waited for, and its pipes read to their end (a timeout, a
    cap, a cancel end here too): a pipe left unread keeps asyncio's transport open past the loop."""
    _kill(proc)
    with contextlib.suppress(TimeoutError, ProcessLookupError):
        await asyncio.wait_for(_drain(proc), 5.0)


async def _drain(proc: asyncio.subprocess.Process) -> None:
    for stream in (proc.stdout, proc.stderr):
        while stream is not None and await stream.read(_CHUNK):  # the group is killed: EOF comes
            pass
    await proc.wait()
