"""The live server's launch command, the control command built from it, and the control process.

A launch command is an argv list, always: psutil's cmdline of the listening process, or SGLang's
``/server_info`` ``launch_command`` string split with ``shlex.split``. It is never handed to a
shell; the control server is started with ``subprocess.Popen(argv)``.

The control command (the cache off) and the reproduction keep every flag of the live one except
what must change:

* the control adds ``--disable-radix-cache``; its load is set by the experiment's calls in flight,
  so ``--max-running-requests`` stays the original's (one condition changes at a time);
* ``--host 127.0.0.1`` and ``--port`` a free loopback port: the control is never reachable from
  outside and never collides with the live server;
* flags that would make the control share the live server's resources are dropped or redirected:
  ``--nccl-port`` (SGLang picks a free one), ``--api-key``/``--admin-api-key`` (the control is
  loopback-only and short-lived, and the replay sends no key), and for the simulator
  ``--log-file``/``--ready-file`` (redirected into the run's directory) and ``--instrument-port``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import httpx

__all__ = [
    "ControlProcess",
    "LaunchCommand",
    "LaunchError",
    "build_control_argv",
    "build_reproduction_argv",
    "exit_reason",
    "flag_value",
    "free_loopback_port",
    "port_free",
    "launch_from_argv",
    "parse_launch_command",
    "remove_flag",
    "set_flag",
]

SIM_VERSION_MARK = "radixtop-sim"
STOP_GRACE_S = 5.0
CACHE_MODES = ("disable", "keep")
_DROPPED_FLAGS = ("--nccl-port", "--api-key", "--admin-api-key", "--instrument-port")
# Flags that make the server load code named by a path or a model repository. Named by
# /server_info (network text) rather than by the user or the live process, they are not carried
# into a command radixtop runs; the plan says how to add them back.
_CODE_LOADING_FLAGS = ("--trust-remote-code", "--custom-weight-loader", "--enable-custom-logit-processor")
# Flags that send data to another host or write to a path, likewise not taken from network text.
_DESTINATION_FLAGS = ("--dist-init-addr", "--otlp-traces-endpoint", "--crash-dump-folder", "--log-requests-target")
# SGLang parses with argparse's allow_abbrev: `--trust-remote-cod` is --trust-remote-code. A flag
# from network text is dropped when it is any unambiguous-looking prefix of one of these.
_MIN_ABBREV = 4


class LaunchError(ValueError):
    """A launch command that cannot be used: one line saying what to do."""


LaunchKind = Literal["sglang", "radixtop-sim", "unknown"]
# Where the command was read: the process, /server_info, the user, or the sighting kept while it lived.
CommandSource = Literal["psutil", "server_info", "given", "seen"]


@dataclass(frozen=True)
class LaunchCommand:
    """An argv split into the program part (``python -m sglang.launch_server``) and its flags."""

    program: tuple[str, ...]
    flags: tuple[str, ...]
    kind: LaunchKind
    source: CommandSource
    cwd: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def argv(self) -> list[str]:
        return [*self.program, *self.flags]


def _kind(program: Sequence[str]) -> LaunchKind:
    joined = " ".join(program)
    if "sglang" in joined:
        return "sglang"
    if "radixtop" in joined and "sim" in program:
        return "radixtop-sim"
    return "unknown"


def _split_program(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Everything before the first ``--flag`` is the program (python's own options have one dash)."""
    for i, token in enumerate(argv):
        if token.startswith("--"):
            return list(argv[:i]), list(argv[i:])
    return list(argv), []


def launch_from_argv(argv: Sequence[str], *, source: CommandSource, cwd: str | None = None) -> LaunchCommand:
    argv = [str(a) for a in argv]
    if not argv:
        raise LaunchError("the launch command is empty; pass --launch-command")
    program, flags = _split_program(argv)
    return LaunchCommand(tuple(program), tuple(flags), _kind(program), source, cwd)


def parse_launch_command(
    text: str, *, source: CommandSource = "server_info", version: str | None = None, python: str | None = None
) -> LaunchCommand:
    """SGLang's ``launch_command`` string as an argv (shlex.split; never a shell).

    From ``/server_info`` (network text) only the flags are kept: the program is always the
    server's own interpreter (``python``, from psutil) running ``-m sglang.launch_server``, or the
    simulator when its version says so, and the plan notes what the server claimed instead. A
    program is taken as written only from the user (``--launch-command``, source "given").
    """
    try:
        argv = shlex.split(text or "")
    except ValueError as exc:
        raise LaunchError(f"the launch command cannot be split ({exc}); pass --launch-command") from None
    if not argv:
        raise LaunchError("the server reports an empty launch command; pass --launch-command")
    python = python or sys.executable
    claimed, flags = _split_program(argv)
    if claimed and claimed[0].endswith("launch_server.py"):  # sys.argv of `python -m sglang.launch_server`
        claimed = [python, "-m", "sglang.launch_server", *claimed[1:]]
    if claimed and source != "server_info":
        return launch_from_argv([*claimed, *flags], source=source)
    if version and SIM_VERSION_MARK in version:
        program = [python, "-m", "radixtop", "sim"]
    else:
        program = [python, "-m", "sglang.launch_server"]
    if not claimed:
        note = f"the launch command has no program; assumed {shlex.join(program)}"
    elif claimed == program:
        note = ""
    else:
        note = (
            f"the server reports the program {shlex.join(claimed)!r}; a program named by the network is never "
            f"run: using {shlex.join(program)} (pass --launch-command to choose)"
        )
    cmd = launch_from_argv([*program, *flags], source=source)
    return replace(cmd, notes=(note,) if note else ())


# -- flag editing ---------------------------------------------------------------------------------


def _names(token: str, name: str, abbrev: bool) -> bool:
    """Does the flag token (before any "=") name ``name``, or, with ``abbrev``, a prefix of it
    that argparse would take for it?"""
    if token == name:
        return True
    return abbrev and token.startswith("--") and len(token) >= 2 + _MIN_ABBREV and name.startswith(token)


def _find(flags: Sequence[str], name: str, *, abbrev: bool = False) -> list[tuple[int, int]]:
    """(start, length) of every occurrence of ``name`` (``--x v``, ``--x=v`` or a bare switch);
    ``abbrev``: its abbreviations too."""
    spans = []
    i = 0
    while i < len(flags):
        token = flags[i]
        if _names(token, name, abbrev):
            has_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
            spans.append((i, 2 if has_value else 1))
            i += 2 if has_value else 1
            continue
        if "=" in token and _names(token.split("=", 1)[0], name, abbrev):
            spans.append((i, 1))
        i += 1
    return spans


def flag_value(flags: Sequence[str], name: str) -> str | None:
    """The last value given to ``name`` ("" for a bare switch), or None when absent."""
    spans = _find(flags, name)
    if not spans:
        return None
    start, length = spans[-1]
    token = flags[start]
    if "=" in token:
        return token.split("=", 1)[1]
    return flags[start + 1] if length == 2 else ""


def remove_flag(flags: Sequence[str], name: str, *, abbrev: bool = False) -> list[str]:
    out = list(flags)
    for start, length in reversed(_find(out, name, abbrev=abbrev)):
        del out[start : start + length]
    return out


def set_flag(flags: Sequence[str], name: str, value: str | None) -> list[str]:
    """``name value`` (or the bare switch when value is None) replacing every earlier occurrence."""
    out = remove_flag(flags, name)
    out += [name] if value is None else [name, value]
    return out


def _relocated(live: LaunchCommand, port: int, log_file: str | Path | None) -> tuple[list[str], list[str]]:
    """The live flags made safe to start beside it: loopback, a free port, no shared resources."""
    flags = list(live.flags)
    changes: list[str] = []
    for name in _DROPPED_FLAGS:
        if flag_value(flags, name) is not None:
            flags = remove_flag(flags, name)
            changes.append(f"dropped {name}")
    if live.source == "server_info":
        for name in (*_CODE_LOADING_FLAGS, *_DESTINATION_FLAGS):
            kept = remove_flag(flags, name, abbrev=True)
            if kept != flags:
                flags = kept
                changes.append(f"dropped {name}: named by /server_info, not by you (add it with --control-arg={name})")
    flags = set_flag(flags, "--host", "127.0.0.1")
    flags = set_flag(flags, "--port", str(port))
    changes.append(f"--host 127.0.0.1 --port {port} (loopback, free)")
    if live.kind == "radixtop-sim":
        for name in ("--ready-file", "--log-file"):
            if flag_value(flags, name) is not None:
                flags = remove_flag(flags, name)
        if log_file is not None:
            flags = set_flag(flags, "--log-file", str(log_file))
            changes.append(f"--log-file {log_file}")
    return flags, changes


def build_reproduction_argv(
    live: LaunchCommand, *, port: int, log_file: str | Path | None = None
) -> tuple[list[str], list[str]]:
    """The original server again, as it was launched, on a free loopback port."""
    flags, changes = _relocated(live, port, log_file)
    return [*live.program, *flags], changes


def build_control_argv(
    live: LaunchCommand,
    *,
    port: int,
    log_file: str | Path | None = None,
    extra: Sequence[str] = (),
) -> tuple[list[str], list[str]]:
    """The control's argv (the original's, without the radix cache) and what changed, for the plan.
    Its load is the experiment's to set, by calls in flight: its flags keep the original's."""
    flags, changes = _relocated(live, port, log_file)
    if flag_value(flags, "--disable-radix-cache") is None:
        flags = set_flag(flags, "--disable-radix-cache", None)
        changes.append("added --disable-radix-cache")
    else:
        changes.append("kept --disable-radix-cache (the live server already runs without the radix cache)")
    i = 0
    while i < len(extra):  # extra control flags override: --flag value, --flag=value, --switch
        name, eq, value = extra[i].partition("=")
        if not name.startswith("--"):
            raise LaunchError(f"control argument {extra[i]!r} is not a --flag; give flags with their values")
        if not eq and i + 1 < len(extra) and not extra[i + 1].startswith("--"):
            value, eq, i = extra[i + 1], "=", i + 1
        flags = set_flag(flags, name, value if eq else None)
        changes.append(f"control argument {name}" + (f" {value}" if eq else ""))
        i += 1
    return [*live.program, *flags], changes


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
PORT_TRIES = 64


def free_loopback_port() -> int:
    """A free port on 127.0.0.1 below the kernel's ephemeral range: an outgoing connection (a
    replay's, a starting server's own) takes its source port from that range, so a port picked
    there can be in use again by the time an arm starts on it."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(PORT_TRIES if low > 2048 else 0):
        port = rng.randrange(max(1024, low - 12000), low)
        if port_free(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        picked: int = sock.getsockname()[1]
        return picked


def port_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:port now, judged as it binds (SO_REUSEADDR, as
    uvicorn and SGLang do): what a server's own closed connections left in TIME_WAIT does not
    count, a listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    try:
        with open(EPHEMERAL_RANGE_FILE, encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


# -- the control process --------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent goes, whatever killed it (Linux).

    PR_SET_PDEATHSIG fires when the *thread* that forked exits, so the control must be started
    from a thread that outlives it (the event loop's thread, not a short-lived worker)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


@dataclass
class ControlProcess:
    """The control server: started from an argv list in its own session, output to a file."""

    argv: list[str]
    output: Path
    cwd: str | None = None
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.output.parent.mkdir(parents=True, exist_ok=True)
        with open(self.output, "ab") as sink:
            try:
                self.proc = subprocess.Popen(
                    self.argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                    cwd=self.cwd, env=self.env, start_new_session=True, preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only
                )
            except OSError as exc:
                raise LaunchError(f"the control command could not start: {exc.strerror or exc}") from None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the control's process group, SIGKILL after grace_s; waits, so nothing is left."""
        proc = self.proc
        if proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                proc.wait(timeout=grace_s)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        # The group may outlive its leader (SGLang's schedulers): make sure it is gone.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def tail(self, lines: int = 30) -> str:
        try:
            with open(self.output, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - 64 * 1024))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])


def exit_reason(code: int) -> str:
    """ "exited with status 1" / "was killed by signal 9 (SIGKILL)" from a Popen returncode."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "?"
        return f"was killed by signal {-code} ({name})"
    return f"exited with status {code}"


async def wait_healthy(
    url: str,
    server: ControlProcess,
    *,
    timeout_s: float,
    what: str = "the control server",
    should_stop: Callable[[], bool] = lambda: False,
    on_tick: Callable[[float], Awaitable[None]] | None = None,
    tick_s: float = 1.0,
) -> str | None:
    """Poll ``/health`` until 200. None when healthy, else why not (exited, timed out, stopped).
    await on_tick(seconds waited) every tick_s: the caller shows the server's own progress lines."""
    began = time.monotonic()
    last_tick = 0.0
    from radixtop.probes.http import SHORT_ANSWER_BYTES, fetch

    async with httpx.AsyncClient(timeout=httpx.Timeout(2.0)) as client:
        while True:
            code = server.exited()
            if code is not None:
                return f"{what} {exit_reason(code)} before it was healthy"
            if should_stop():
                return "cancelled"
            # A whole answer within 2 s: a server dripping bytes must not hold the wait past its timeout.
            got = await fetch(client, f"{url}/health", max_bytes=SHORT_ANSWER_BYTES, timeout_s=2.0)
            if got.ok:
                return None
            waited = time.monotonic() - began
            if waited > timeout_s:
                return (
                    f"{what} was not healthy within {timeout_s:.0f} s "
                    "(raise --control-timeout for a slow model load)"
                )
            if on_tick is not None and waited - last_tick >= tick_s:
                last_tick = waited
                await on_tick(waited)
            await asyncio.sleep(0.2)
