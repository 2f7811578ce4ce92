"""A radixtop command on another node, through the user's own OpenSSH: `ssh -o BatchMode=yes ...
HOST -- radixtop ARGS` (`run_remote`); the node's report that way (`reach`: `radixtop discover
--json`) and the clock skew measured over that channel.

It is the user's ssh, with their ~/.ssh/config (or the file `ssh_config` names), agent, keys and
known_hosts: radixtop holds no key and never asks for a password (BatchMode: what would prompt
fails instead, and radixtop says what to run). The ssh is an argv list, never a shell line; a
HOST that ssh would read as an option, or with whitespace or control characters in it, is refused
first, and every remote argument is quoted for the node's shell (ssh joins them into one line).
Its output is read up to a size cap (into memory, or into a file for a bundle), within a deadline,
then it is killed with its process group; every failure is one line (radixtop.probes.ssh_failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shlex
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

from radixtop.probes.node_report import MAX_REPORT_BYTES, NodeReport, parse_node_report
from radixtop.probes.ssh_failure import explain_bad_answer, explain_failure, explain_timeout

__all__ = [
    "ClockSkew", "NodeAnswer", "RemoteRun", "at_most", "check_host", "check_remote_command", "reach", "reach_all",
    "run_remote", "ssh_argv", "ssh_options",
]

DEFAULT_TIMEOUT_S = 30.0
MAX_STDERR_BYTES = 64 * 1024  # ssh's messages and a shell's complaints; the rest is dropped
_CHUNK = 64 * 1024
_REMOTE_COMMAND = re.compile(r"[A-Za-z0-9_./~+-]+")
DISCOVER = ("discover", "--json")
MAX_AT_ONCE = 16  # ssh sessions reaching nodes at once
_T = TypeVar("_T")


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

    def text(self) -> str:
        """The skew as radixtop says it: "clock +0.004 s ± 0.150 s against this one"."""
        return f"clock {self.offset_s:+.3f} s ± {self.uncertainty_s:.3f} s against this one"

    @property
    def correction_s(self) -> float:
        """What to subtract from the node's times to put them on this clock: the offset, unless it
        is within its uncertainty of zero. Then the clocks agree as far as one round trip can tell,
        and moving the node's times would only add the measurement's noise (on one machine, the
        time radixtop takes to start there reads as tenths of a second of skew)."""
        return 0.0 if abs(self.offset_s) <= self.uncertainty_s else self.offset_s


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
             command: str = "radixtop", args: Sequence[str] = DISCOVER) -> list[str]:
    """The ssh command line running `command ARGS` there. -T: no terminal; ClearAllForwardings: a
    LocalForward in the user's config for that host must not fail this run; LogLevel=ERROR: ssh's
    own failures are said, its warnings are not (a Host key "Permanently added" line is not an
    error). ARGS are quoted: ssh hands the node's shell one line, and a path or URL the user gave
    must reach radixtop as one word."""
    argv = ssh_options(ssh_config=ssh_config, connect_timeout_s=connect_timeout_s)
    return [*argv, check_host(host), "--", check_remote_command(command), *(shlex.quote(a) for a in args)]


def ssh_options(*, ssh_config: str | None = None, connect_timeout_s: int = 10, forwarding: bool = False) -> list[str]:
    """ssh and the options every session of radixtop's takes; a session made for its -L forwards
    (forwarding=True) keeps the user's forwarding settings, any other clears them."""
    argv = ["ssh", "-T", "-x", "-a", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, connect_timeout_s)}"]
    if not forwarding:
        argv += ["-o", "ClearAllForwardings=yes"]
    argv += ["-o", "LogLevel=ERROR"]
    if ssh_config is not None:
        argv += ["-F", ssh_config]
    return argv


@dataclass(frozen=True, slots=True)
class RemoteRun:
    """What one `ssh HOST -- radixtop ARGS` gave: `error` (one line with what to do) when it gave
    nothing usable (ssh missing, the deadline, over the cap, a failure), else its exit status 0
    and its output (`out`, or in the sink the caller passed: `out_bytes` of it)."""

    host: str
    error: str = ""
    out: bytes = b""
    out_bytes: int = 0
    sent: float = 0.0  # the wall clock when ssh started
    seconds: float = 0.0  # from start to exit

    @property
    def ok(self) -> bool:
        return not self.error


async def run_remote(host: str, args: Sequence[str], *, ssh_config: str | None = None,
                     timeout_s: float = DEFAULT_TIMEOUT_S, command: str = "radixtop", max_bytes: int,
                     sink: BinaryIO | None = None) -> RemoteRun:
    """`command ARGS` on the node; its stdout kept (up to `max_bytes`), or written to `sink`.
    Never raises (but for CancelledError); ssh and what it started are gone when it returns."""
    started = time.monotonic()
    sent = time.time()
    try:
        argv = ssh_argv(host, ssh_config=ssh_config, connect_timeout_s=int(min(10.0, max(1.0, timeout_s / 2))),
                        command=command, args=args)
    except ValueError as exc:
        return RemoteRun(host, error=str(exc))
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout kills ssh and whatever it started
        )
    except FileNotFoundError:
        return RemoteRun(host, error="the OpenSSH client (ssh) is not installed here: install openssh-client")
    except OSError as exc:
        return RemoteRun(host, error=f"{host}: could not start ssh ({exc.strerror or exc})")
    try:
        async with asyncio.timeout(timeout_s):
            got = await _run(proc, max_bytes, sink)
        elapsed = time.monotonic() - started
    except TimeoutError:
        return RemoteRun(host, error=explain_timeout(host, timeout_s, command, args), sent=sent,
                         seconds=time.monotonic() - started)
    finally:
        await _reap(proc)
    out, count, too_big, err, code = got
    if too_big:
        return RemoteRun(host, error=f"{host}: its answer is over {max_bytes} bytes, more than `{command} "
                                     f"{_shown(args)}` ever writes; try `ssh {host} {command} {_shown(args)}`",
                         sent=sent, seconds=elapsed)
    if code != 0:
        return RemoteRun(host, error=explain_failure(host, code, err.decode("utf-8", "replace"), command, args),
                         sent=sent, seconds=elapsed)
    return RemoteRun(host, out=out, out_bytes=count, sent=sent, seconds=elapsed)


async def reach(host: str, *, ssh_config: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                command: str = "radixtop", max_bytes: int = MAX_REPORT_BYTES) -> NodeAnswer:
    """The node's report, or the one line why not; never raises (but for CancelledError)."""
    run = await run_remote(host, DISCOVER, ssh_config=ssh_config, timeout_s=timeout_s, command=command,
                           max_bytes=max_bytes)
    if not run.ok:
        return NodeAnswer(host, error=run.error, seconds=run.seconds)
    try:
        report = parse_node_report(run.out, "the answer")
    except ValueError as exc:
        return NodeAnswer(host, error=explain_bad_answer(host, str(exc), command), seconds=run.seconds)
    received = run.sent + run.seconds  # the wall clock at the answer, on the monotonic clock's count
    skew = ClockSkew(report.time - (run.sent + received) / 2, run.seconds)
    return NodeAnswer(host, report, skew=skew, seconds=run.seconds)


def _shown(args: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


async def _run(proc: asyncio.subprocess.Process, max_bytes: int,
               sink: BinaryIO | None) -> tuple[bytes, int, bool, bytes, int]:
    """(stdout up to max_bytes, its length, whether it said more, stderr's first MAX_STDERR_BYTES,
    exit status). An answer over the cap kills ssh at once: left blocked on a full pipe it would
    never exit."""
    assert proc.stdout is not None and proc.stderr is not None
    out_task = asyncio.ensure_future(_read(proc.stdout, max_bytes, sink=sink))
    err_task = asyncio.ensure_future(_read(proc.stderr, MAX_STDERR_BYTES, drain=True))
    try:
        out, count, too_big = await out_task
        if too_big:
            _kill(proc)
            return out, count, True, b"", -1
        err, _, _ = await err_task
        return out, count, False, err, await proc.wait()
    finally:
        out_task.cancel()
        err_task.cancel()


async def _read(stream: asyncio.StreamReader, limit: int, *, drain: bool = False,
                sink: BinaryIO | None = None) -> tuple[bytes, int, bool]:
    """Up to `limit` bytes of the stream, kept or written to `sink`; (what was kept, how many
    bytes came, whether there was more). Without `drain` it stops at the cap; with it, it reads on
    to the end (within the caller's deadline) keeping nothing more, so the writer never blocks on
    a full pipe."""
    buf = bytearray()
    count = 0
    more = False
    while True:  # ends at EOF, at the cap without drain, or at the caller's deadline
        chunk = await stream.read(_CHUNK)
        if not chunk:
            return bytes(buf), count, more
        if not more:
            kept = chunk[:max(0, limit - count)]
            if sink is not None:
                sink.write(kept)
            else:
                buf += kept
            count += len(kept)
            more = len(kept) < len(chunk)
            if more and not drain:
                return bytes(buf), count, True


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """ssh and its process group gone, waited for, and its pipes read to their end (a timeout, a
    cap, a cancel end here too): a pipe left unread keeps asyncio's transport open past the loop."""
    _kill(proc)
    with contextlib.suppress(TimeoutError, ProcessLookupError):
        async with asyncio.timeout(5.0):
            await _drain(proc)


async def _drain(proc: asyncio.subprocess.Process) -> None:
    for stream in (proc.stdout, proc.stderr):
        while stream is not None and await stream.read(_CHUNK):  # the group is killed: EOF comes
            pass
    await proc.wait()


async def reach_all(hosts: Sequence[str], *, ssh_config: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                    command: str = "radixtop") -> list[NodeAnswer]:
    """Every node's answer, in the order given, at most MAX_AT_ONCE ssh sessions at a time."""
    return await at_most(MAX_AT_ONCE, [
        functools.partial(reach, h, ssh_config=ssh_config, timeout_s=timeout_s, command=command) for h in hosts
    ])


async def at_most(n: int, calls: Sequence[Callable[[], Awaitable[_T]]]) -> list[_T]:
    """Each call's result, in the order given, at most `n` of them running at a time (one ssh
    session per node: a fleet's worth at once would exhaust this node's sockets and the user's
    agent)."""
    gate = asyncio.Semaphore(max(1, n))

    async def one(call: Callable[[], Awaitable[_T]]) -> _T:
        async with gate:
            return await call()

    return list(await asyncio.gather(*(one(c) for c in calls)))
