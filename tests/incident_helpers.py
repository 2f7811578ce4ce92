"""Shared by the incident tests: simulators as real processes on loopback, small traces, checks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from radixtop.demo import stop_process
from radixtop.incident.replay.trace import Trace, TraceRequest
from radixtop.sim.cli import sim_argv

READY_TIMEOUT_S = 20.0
# Small and fast: one rank, a 1 ms scheduler step, a small pool so that pressure is cheap.
FAST = ("--tp-size", "1", "--step-ms", "1", "--enable-metrics")
# A healthy server and one whose lock race fires under the default pressure workload.
HEALTHY_FLAGS = ("--max-total-tokens", "4096", "--page-size", "16", "--max-running-requests", "8")
LOCK_RACE_FLAGS = (
    "--max-total-tokens", "1024", "--page-size", "16", "--max-running-requests", "8", "--fault", "lock-race:7"
)


@dataclass
class Sim:
    proc: subprocess.Popen
    url: str
    log: Path
    out: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc)


def start_sim(workdir: Path, *flags: str, env: Mapping[str, str] | None = None, name: str = "sim") -> Sim:
    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / f"{name}.port"
    log = workdir / f"{name}.log"
    out = workdir / f"{name}.out"
    argv = sim_argv(*FAST, *flags, ready_file=ready, log_file=log)
    with open(out, "ab") as sink:
        proc = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise AssertionError(f"the simulator did not start: {out.read_text(errors='replace')[-500:]}")
        time.sleep(0.05)
    return Sim(proc, f"http://127.0.0.1:{int(ready.read_text())}", log, out)


def small_trace(name: str = "small", requests: int = 4, prompt_len: int = 48, max_tokens: int = 8,
                prefix_len: int = 16) -> Trace:
    return Trace(
        name=name,
        page_size_hint=16,
        requests=tuple(
            TraceRequest(
                f"s{i}", offset_ms=i * 5.0, prompt_len=prompt_len, prefix_len=prefix_len, group="sys",
                max_tokens=max_tokens, n=1,
            )
            for i in range(requests)
        ),
    )


def gone(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(predicate, timeout_s: float, step_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())


def radixtop(
    *args: str, timeout_s: float = 60.0, stdin=subprocess.DEVNULL, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "radixtop", *args], capture_output=True, text=True, timeout=timeout_s,
        stdin=stdin, env={**os.environ, **(env or {})}, check=False,
    )


def all_bytes(root: Path) -> list[tuple[str, bytes]]:
    return [(str(p), p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()]


def write_lines(path: Path, lines: Sequence[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def lock_race_bundle(tmp_path: Path) -> tuple[Sim, Path]:
    """The seed's failure on two ranks (the lock race under pressure, until the server dies), then
    a headless `radixtop bundle` of the dead server by its pid: (the stopped simulator, the bundle)."""
    import asyncio
    import json

    import httpx

    from radixtop.incident.replay.replay import replay_once
    from radixtop.incident.replay.trace import plan_requests
    from radixtop.incident.replay.workloads import pressure_trace

    flags = (
        "--max-total-tokens", "1024", "--page-size", "16", "--tp-size", "2", "--fault", "lock-race:1:probability=1"
    )
    sim = start_sim(tmp_path / "sim", *flags)
    planned = plan_requests(pressure_trace(1024, 8, page_size=16))

    async def load() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(5):
                if sim.proc.poll() is not None:
                    break
                await replay_once(client, sim.url, planned)

    try:
        asyncio.run(load())
        sim.proc.wait(timeout=30)
    finally:
        sim.stop()
    assert sim.proc.returncode != 0, "the lock race did not kill the server"
    done = radixtop("bundle", "--out", str(tmp_path / "out"), "--url", sim.url, "--pid", str(sim.pid),
                    "--log", str(sim.log), "--json")
    assert done.returncode == 0, done.stderr
    return sim, Path(json.loads(done.stdout)["path"])
