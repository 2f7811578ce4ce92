"""Dispatch lateness of a replay at 200 calls/s, against the trace's own offsets, with dispatching on
the caller's asyncio loop as the peer in the same run.

A trace of generate calls at Poisson-spaced offsets (seeded; 200 calls/s by default) is replayed
against `radixtop sim` (a subprocess on 127.0.0.1) several times in each of these ways, and each
run's lateness (when a call's bytes were written to the socket, minus when the trace says it is
due) is printed as p50 / p99 / max:

- the trace's own offsets: lateness 0 by definition, the figure every way is held to;
- the asyncio loop (peer): the caller's loop sleeps to each offset and creates an httpx task per
  call (a copy lives below, as the peer only). Two figures: what it records (stamped when the
  task is created) and when httpx really writes the request (httpcore's trace);
- the dispatcher process: `replay_once`;
- the same dispatcher on a thread of the calling process instead (why it is a process; in the
  first run only: with the loop busy it falls seconds behind, and the run takes as long);
- each again while the calling loop is busy: a coroutine burning the CPU in 20 ms chunks, as the
  TUI's rendering does to the confirmation run that shares its loop.

    python benchmarks/replay_bench.py --quick     # ~3 s per run, 3 runs per way
    python benchmarks/replay_bench.py             # 10 s per run, 5 runs per way
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runs from a checkout, like the other benchmarks

from bench_rows import row  # noqa: E402  (benchmarks/ is the script's own directory)

from radixtop.incident.replay.dispatch import Dispatcher, Plan  # noqa: E402
from radixtop.incident.replay.replay import dispatch_plan, generate_payload, replay_once  # noqa: E402
from radixtop.incident.replay.trace import PlannedRequest, Trace, TraceRequest, plan_requests  # noqa: E402
from radixtop.sim.cli import sim_argv  # noqa: E402

BUSY_CHUNK_S = 0.020
SIM_FLAGS = ("--log-level", "warning", "--step-ms", "0.5", "--max-running-requests", "512",
             "--max-total-tokens", "400000", "--page-size", "16")


def poisson_trace(seconds: float, rate: float, seed: int) -> Trace:
    """Calls at Poisson-spaced offsets: 8 groups sharing 32-token prefixes, 4 new tokens each."""
    rng = random.Random(seed)
    requests, at = [], 0.0
    while at < seconds:
        i = len(requests)
        requests.append(TraceRequest(f"q{i}", offset_ms=round(at * 1000.0, 3), prompt_len=64, prefix_len=32,
                                     group=f"g{i % 8}", max_tokens=4))
        at += rng.expovariate(rate)
    return Trace("poisson", 16, tuple(requests))


# -- the peer: dispatching on the caller's loop ----------------------------------------------------


async def loop_replay(
    client: httpx.AsyncClient, url: str, planned: Sequence[PlannedRequest]
) -> tuple[list[float], list[float], int]:
    """Sleep on the loop to each offset, create a task per call. Returns (lateness stamped at task
    creation, lateness when httpx wrote the request, failed calls)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    stamped: list[float] = []
    written: list[float] = []

    async def send(item: PlannedRequest) -> bool:
        due = start + item.offset_s

        async def trace(event: str, info: dict) -> None:
            if event == "http11.send_request_body.complete":
                written.append(max(0.0, (loop.time() - due) * 1000.0))

        try:
            response = await client.post(
                f"{url}/generate", json=generate_payload(item, 0.0), extensions={"trace": trace}
            )
            return response.status_code == 200
        except httpx.HTTPError:
            return False

    tasks = []
    for item in sorted(planned, key=lambda p: p.offset_s):
        delay = start + item.offset_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        stamped.append(max(0.0, (loop.time() - start - item.offset_s) * 1000.0))
        tasks.append(asyncio.create_task(send(item)))
    ok = await asyncio.gather(*tasks)
    return stamped, written, sum(1 for o in ok if not o)


# -- measuring -------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered), max(1, math.ceil(q / 100.0 * len(ordered)))) - 1]


async def burn(stop: asyncio.Event) -> None:
    """The busy loop: CPU in 20 ms chunks, yielding between them."""
    while not stop.is_set():
        end = time.perf_counter() + BUSY_CHUNK_S
        while time.perf_counter() < end:
            pass
        await asyncio.sleep(0)


async def one_run(way: str, url: str, planned: list[PlannedRequest], busy: bool) -> dict[str, list[float] | int]:
    stop = asyncio.Event()
    burner = asyncio.create_task(burn(stop)) if busy else None
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64, keepalive_expiry=1.0)
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0), limits=limits) as client:
            if way == "loop":
                stamped, written, failed = await loop_replay(client, url, planned)
                return {"asyncio loop (peer), as recorded (at task creation)": stamped,
                        "asyncio loop (peer), at the write": written, "failed": failed}
            if way == "thread":
                results: list[dict] = []
                plan = Plan.from_json(dispatch_plan(client, url, planned, 0.0))
                await asyncio.to_thread(Dispatcher(plan, results.append).run)
                calls = [r for r in results if "i" in r]
                return {"dispatcher on a thread of the caller": [r["late_ms"] for r in calls],
                        "failed": sum(1 for r in calls if "error" in r)}
            run = await replay_once(client, url, planned)
            return {"dispatcher process (replay_once)": [o.lateness_ms for o in run.outcomes], "failed": run.errors}
    finally:
        stop.set()
        if burner is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await burner


def start_sim(tmp: Path) -> tuple[subprocess.Popen, str]:
    ready = tmp / "sim.port"
    proc = subprocess.Popen(sim_argv(*SIM_FLAGS, ready_file=ready, log_file=tmp / "sim.log"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            start_new_session=True)  # a server of its own, as a real one is
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the simulator did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{int(ready.read_text())}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="~3 s runs, 3 per way (shared machines)")
    ap.add_argument("--seconds", type=float, default=None, help="length of the trace (default 10, quick 3)")
    ap.add_argument("--rate", type=float, default=200.0, help="calls per second (Poisson)")
    ap.add_argument("--runs", type=int, default=None, help="runs per way (default 5, quick 3)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    runs = args.runs or (3 if args.quick else 5)
    trace = poisson_trace(seconds, args.rate, args.seed)
    print(f"# replay dispatch lateness: {len(trace.requests)} calls in {seconds:.0f} s (Poisson, {args.rate:.0f}/s, "
          f"seed {args.seed}), {runs} runs per way; sim {' '.join(SIM_FLAGS)}")
    print(f"# python {platform.python_version()}, Linux {platform.release()}, {os.cpu_count()} CPUs; "
          f"load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows: list[tuple[str, int, int, int, list[float]]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        proc, url = start_sim(Path(tmp_name))
        try:
            for run in range(1, runs + 1):  # the ways interleaved, so each sees the same machine
                for way, busy in (("loop", False), ("process", False), ("thread", False), ("loop", True),
                                  ("process", True), ("thread", True)):
                    if way == "thread" and run > 1:
                        continue
                    planned = plan_requests(trace, seed=run)
                    result = asyncio.run(one_run(way, url, planned, busy))
                    failed = int(result.pop("failed"))  # type: ignore[arg-type]
                    for label, late in result.items():
                        rows.append((label + (", loop busy" if busy else ""), run, len(late), failed, late))  # type: ignore[arg-type]
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"# load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| way | run | calls | failed | p50 ms | p99 ms | max ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| the trace's own offsets (peer) | all | {len(trace.requests)} | 0 | 0.00 | 0.00 | 0.00 |")
    for label in dict.fromkeys(r[0] for r in rows):
        for name, run, calls, failed, late in (r for r in rows if r[0] == label):
            print(f"| {name} | {run} | {calls} | {failed} | {percentile(late, 50):.2f} | {percentile(late, 99):.2f} | "
                  f"{max(late, default=math.nan):.2f} |")
    print()
    print("| way | runs | p99 ms, median of runs | p99 ms, worst run | target p99 <= 2 ms |")
    print("| --- | ---: | ---: | ---: | --- |")
    for label in dict.fromkeys(r[0] for r in rows):
        p99s = sorted(percentile(r[4], 99) for r in rows if r[0] == label)
        met = sum(1 for p in p99s if p <= 2.0)
        print(f"| {label} | {len(p99s)} | {statistics.median(p99s):.2f} | {p99s[-1]:.2f} | "
              f"met in {met} of {len(p99s)} |")
    for busy in ("", ", loop busy"):
        ours = [percentile(r[4], 99) for r in rows if r[0] == "dispatcher process (replay_once)" + busy]
        peer = [percentile(r[4], 99) for r in rows if r[0] == "asyncio loop (peer), at the write" + busy]
        if ours and peer:
            where = ", the caller's loop busy" if busy else ""
            row(f"replay dispatch lateness p99 per run at {args.rate:.0f} calls/s{where}",
                " / ".join(f"{p:.2f} ms" for p in ours),
                "the trace's offsets: 0; the caller's asyncio loop + httpx: " + " / ".join(f"{p:.1f} ms" for p in peer),
                "<= 2 ms", max(ours) <= 2.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
