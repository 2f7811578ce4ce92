"""`radixtop demo`: a failing SGLang-like server, a workload that makes it fail, and the TUI on it.

The simulator and the load generator run as child processes in their own sessions (so the
terminal's Ctrl-C reaches only the UI) and die with the parent even if it is killed outright
(PR_SET_PDEATHSIG). Quitting the UI stops both; their logs stay on disk as evidence, and so does
the simulator's crash dump (SGLang's, of the requests it saw), which the UI's confirmation run
replays as the crash's own workload.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from argparse import Namespace
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

FAULTS = ("lock-race", "block-boundary", "leak", "double-unlock", "none")
DEFAULT_FAULT = "lock-race"
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 3.0
# A small pool and a bounded batch: the built-in workload's bursts outgrow it within ~15-30 s,
# which is when the lock-race fault (token usage >= 0.85 during eviction) can fire. At 0.85 it
# fires with reuse off too, as the seed's race does: the admission reserve keeps a server without
# prefix hits near 0.89 here, whatever the load.
SIM_FLAGS = (
    "--max-total-tokens", "4096", "--page-size", "16", "--max-running-requests", "32",
    "--tp-size", "2", "--enable-metrics",
)
CRASH_DUMP_FOLDER = "crash-dumps"  # in the demo's directory: DIR/<host>/crash_dump_<time>.pkl


class DemoError(Exception):
    """The demo could not start: one line saying why."""


def _die_with_parent() -> None:
    """Runs in the child before exec: get SIGTERM when the parent dies, whatever killed it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the parent's cleanup still stops the children on a normal exit


def _spawn(argv: Sequence[str], out: Path) -> subprocess.Popen:
    with open(out, "ab") as sink:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only, async-signal-safe
        )
    # Reaped the moment it exits: the demo's server dies by design, and an unreaped child would
    # show in the processes pane as a zombie of radixtop's making, not the incident's.
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    return proc


def stop_process(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the child's process group, then SIGKILL it if it has not gone within grace_s."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class DemoRun:
    """The children of one demo and where they write."""

    workdir: Path
    sim: subprocess.Popen
    load: subprocess.Popen | None
    url: str
    fault: str

    @property
    def log_file(self) -> Path:
        return self.workdir / "sim.log"

    @property
    def crash_dump_folder(self) -> Path:
        return self.workdir / CRASH_DUMP_FOLDER

    def stop(self) -> None:
        if self.load is not None:
            stop_process(self.load)
        stop_process(self.sim)


def _tail(path: Path, limit: int = 300) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return (text[-1] if text else "")[:limit]


def start_demo(fault: str = DEFAULT_FAULT, *, seed: int = 7, workdir: Path | None = None,
               with_load: bool = True, extra_flags: Sequence[str] = ()) -> DemoRun:
    """Start the simulator (and the load), wait until it serves; raise DemoError if it cannot."""
    from radixtop.sim.cli import sim_argv

    if fault not in FAULTS:
        raise DemoError(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")
    workdir = Path(workdir or tempfile.mkdtemp(prefix="radixtop-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / "sim.port"
    ready.unlink(missing_ok=True)
    # SGLang's crash dump of the requests the server saw: the confirmation run (c) replays them.
    flags = [*SIM_FLAGS, "--crash-dump-folder", str((workdir / CRASH_DUMP_FOLDER).absolute()), *extra_flags]
    if fault != "none":
        flags += ["--fault", f"{fault}:seed={seed}" + (",threshold=0.85" if fault == "lock-race" else "")]
    argv = sim_argv(*flags, ready_file=ready, log_file=workdir / "sim.log")
    sim = _spawn(argv, workdir / "sim.out")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not (ready.exists() and ready.read_text().strip()):
        if sim.poll() is not None:
            raise DemoError(f"the simulator exited ({sim.returncode}): {_tail(workdir / 'sim.out')}")
        if time.monotonic() > deadline:
            stop_process(sim)
            raise DemoError(f"the simulator did not answer within {READY_TIMEOUT_S:.0f} s; see {workdir / 'sim.out'}")
        time.sleep(0.05)
    url = f"http://127.0.0.1:{int(ready.read_text().strip())}"
    load = None
    if with_load:
        load = _spawn([sys.executable, "-m", "radixtop.incident.replay.load", "--url", url], workdir / "load.out")
    return DemoRun(workdir, sim, load, url, fault)


def run_demo(args: Namespace) -> int:
    """Entry point for `radixtop demo`."""
    from radixtop.errors import UsageError
    from radixtop.options import TuiOptions
    from radixtop.tui.app import run_tui

    try:
        demo = start_demo(args.fault, seed=args.seed)
    except DemoError as exc:
        raise UsageError(f"demo: {exc}") from exc
    # Ctrl-C must reach the UI (which quits cleanly), never leave the children behind.
    try:
        options = replace(
            TuiOptions.from_args(args), logs=(str(demo.log_file),), from_start=True, url=demo.url,
            actions_dir=str(demo.workdir),  # bundles and confirmation runs beside the demo's logs
            banner=(f"demo: simulated SGLang at {demo.url}, fault {demo.fault}; logs, bundles (b) and "
                    f"confirmation runs (c) in {demo.workdir}"),
        )
        return run_tui(options)
    finally:
        demo.stop()
        print(
            f"radixtop demo: stopped the simulator; its log, bundles and runs are kept in {demo.workdir}",
            file=sys.stderr,
        )
