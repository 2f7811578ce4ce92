"""Shared by the hardening tests: the stand-in server as a real process on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from radixtop.demo import stop_process

STANDIN = Path(__file__).with_name("standin_server.py")


@dataclass
class Standin:
    proc: subprocess.Popen
    url: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc)


def start_standin(
    workdir: Path, *args: str, argv0: str | None = None, python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> Standin:
    """The stand-in server, run by ``python``; ``argv0``: the name it claims (``exec -a``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / f"standin-{time.monotonic_ns()}.port"
    argv = [python, str(STANDIN), "--ready", str(ready), *args]
    if argv0 is not None:
        argv = ["bash", "-c", 'exec -a "$0" "$@"', argv0, *argv]
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})}, start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise AssertionError(f"the stand-in server did not start ({argv})")
        time.sleep(0.05)
    return Standin(proc, f"http://127.0.0.1:{int(ready.read_text())}")


def argv_of(pid: int) -> Sequence[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")


# radixtop's CLI in a child that prints its own peak memory (VmHWM) on its last stderr line:
# ru_maxrss would also count the parent's pages a vfork'd child shared before its exec.
_PEAK = ("import sys\nfrom radixtop.cli import main\nrc = main(sys.argv[1:])\n"
         "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1]\n"
         "print('peak_kib', hwm, file=sys.stderr)\nsys.exit(rc)")


def radixtop_peak(
    *args: str, timeout_s: float = 120.0, cwd: Path | None = None, env: Mapping[str, str] | None = None,
    limit_mib: int = 4096,
) -> tuple[subprocess.CompletedProcess, int]:
    """`radixtop ARGS` run to its end: (the finished process, less its last stderr line; its peak RSS
    in MiB). Its address space is held to ``limit_mib``, so a run that would eat memory without end
    fails (MemoryError) instead of taking the machine's."""
    limit = f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({limit_mib << 20}, {limit_mib << 20}))\n"
    done = subprocess.run(
        [sys.executable, "-c", limit + _PEAK, *args], capture_output=True, text=True, timeout=timeout_s, check=False,
        # Not run from the checkout: `python -c` imports from its working directory first.
        stdin=subprocess.DEVNULL, cwd=cwd or Path(__file__).parent, env={**os.environ, **(env or {})},
    )
    head, _, last = done.stderr.rstrip("\n").rpartition("\n")
    if not last.startswith("peak_kib "):
        head, last = done.stderr, "peak_kib 0"
    elif head:
        head += "\n"
    done.stderr = head
    return done, int(last.split()[1]) >> 10
