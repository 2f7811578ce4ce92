"""Benchmark the live log follower (radixtop.probes.follow.LogFollower) against `tail -F`.

    python benchmarks/tail_bench.py            # 200,000 lines/s for 10 s per tool
    python benchmarks/tail_bench.py --quick    # 2 s per tool
    python benchmarks/tail_bench.py --rate 10000 --duration 5

A writer process appends SGLang-like lines (~190 bytes) to a fresh file at the target rate, one
write per millisecond or so; every line carries its sequence number and the writer's time.time()
just before the write. Two phases, one after the other, with identical writers (running both
tools at once on a small machine would make each slow the other):

- radixtop: LogFollower in this process; an asyncio consumer stamps time.time() when each batch
  reaches it (the lag a UI would see), reads the lines' texts from the batch's runs as the TUI
  does (no LogRecord per line), and keeps sequence numbers and stamps in arrays with C-level
  calls; lost / duplicated (must be 0) and the lag percentiles are worked out after the run.
  CPU: the follower's reader thread, and the whole process (which also pays for the consumer).
- tail -F -n 0: its stdout is a pipe read by a separate counting process (so the counting does not
  steal the CPU being measured); lag is stamped when a chunk comes out of the pipe. CPU: tail's.

CPU % is CPU seconds spent until the last line arrived, per second of writing (% of one core at
the rate). Then 3 s with no writes: idle CPU. Targets: p99 lag < 25 ms, < 25 % of one core at
200k lines/s, idle near zero.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import operator
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_rows import row  # noqa: E402  (benchmarks/ is the script's own directory)

from radixtop.probes.follow import LogFollower  # noqa: E402

# "<seq 12 digits> <time.time() with 6 decimals> <SGLang decode-batch line>"
BODY = (
    "[2025-06-01 12:00:00 TP3] Decode batch, #running-req: 57, #token: 48213, token usage: 0.71, "
    "cuda graph: True, gen throughput (token/s): 3121.55, #queue-req: 4"
)
STAMP = re.compile(rb"^(\d{12}) (\d+\.\d{6}) ", re.MULTILINE)
SEQ_PART, STAMP_PART = operator.itemgetter(slice(0, 12)), operator.itemgetter(slice(13, 30))
IDLE_SECONDS = 3.0


def writer(path: str, rate: int, duration: float, written: mp.Value) -> None:  # type: ignore[valid-type]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    start = time.perf_counter()
    seq = 0
    while True:
        elapsed = time.perf_counter() - start
        target = int(min(elapsed, duration) * rate)
        if target > seq:
            stamp = f"{time.time():.6f}"
            os.write(fd, "".join([f"{i:012d} {stamp} {BODY}\n" for i in range(seq, target)]).encode())
            seq = target
        if elapsed >= duration:
            break
        time.sleep(0.001)
    os.close(fd)
    written.value = seq


class Tally:
    """Sequence numbers and lags of what a tool delivered. The hot path only appends to arrays
    with C-level map/extend, so the counting costs the measured process as little as possible;
    lost/duplicated and the lag percentiles are worked out after the run."""

    def __init__(self) -> None:
        self.seqs, self.stamps = array("q"), array("d")
        self.arrivals: list[tuple[float, int]] = []  # (time.time() on arrival, how many lines)

    def add(self, now: float, seqs, stamps) -> None:
        before = len(self.seqs)
        self.seqs.extend(map(int, seqs))
        self.stamps.extend(map(float, stamps))
        self.arrivals.append((now, len(self.seqs) - before))

    def result(self, written: int) -> dict:
        lags, i = array("d"), 0
        for now, count in self.arrivals:
            lags.extend(now - stamp for stamp in self.stamps[i : i + count])
            i += count
        seen = bytearray(written)
        duplicated = 0
        for seq in self.seqs:
            if seen[seq]:
                duplicated += 1
            seen[seq] = 1
        return {
            "lines_written": written,
            "lines_received": len(self.seqs),
            "lost": written - sum(seen),
            "duplicated": duplicated,
            **percentiles(lags),
        }


def percentiles(lags: array) -> dict[str, float]:
    if not lags:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    ordered = sorted(lags)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": ordered[-1] * 1000}


def thread_cpu(native_id: int, pid: int | None = None) -> float:
    """CPU seconds of one thread (or a single-threaded process): /proc schedstat has nanoseconds,
    psutil's times have 10 ms ticks, too coarse for an idle follower."""
    path = f"/proc/{pid}/schedstat" if pid else f"/proc/self/task/{native_id}/schedstat"
    try:
        with open(path) as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:
        pass
    if pid:
        return sum(psutil.Process(pid).cpu_times()[:2])
    for t in psutil.Process().threads():
        if t.id == native_id:
            return t.user_time + t.system_time
    return 0.0


def process_cpu() -> float:
    return time.process_time()  # all threads of this process, nanosecond clock


# -- radixtop ------------------------------------------------------------------------------------------


async def bench_radixtop(path: str, rate: int, duration: float) -> dict:
    Path(path).write_bytes(b"")
    follower = LogFollower([path])
    tally = Tally()
    notices: list[str] = []
    text_of = operator.attrgetter("text")

    async def consume() -> None:
        async for batch in follower.batches():
            now = time.time()
            notices.extend(f"{n.kind}: {n.message}" for n in batch.notices)
            runs = getattr(batch.records, "runs", None)
            if runs is not None:  # the texts as the UI takes them: no object per line
                texts = [text for run in runs for text in run.texts]
            else:
                texts = list(map(text_of, batch.records))
            tally.add(now, map(SEQ_PART, texts), map(STAMP_PART, texts))

    async with follower:
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)  # the reader thread is up
        native_id = follower._thread.native_id  # type: ignore[union-attr]
        written = mp.Value("q", 0)
        proc = mp.Process(target=writer, args=(path, rate, duration, written))
        cpu_thread0, cpu_proc0 = thread_cpu(native_id), process_cpu()
        proc.start()
        await asyncio.get_running_loop().run_in_executor(None, proc.join)
        deadline = time.monotonic() + 10
        while len(tally.seqs) < written.value and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        cpu_thread, cpu_proc = thread_cpu(native_id) - cpu_thread0, process_cpu() - cpu_proc0
        await asyncio.sleep(0.2)  # anything late (duplicates) shows up now
        idle_thread0, idle_proc0 = thread_cpu(native_id), process_cpu()
        await asyncio.sleep(IDLE_SECONDS)
        idle_thread, idle_proc = thread_cpu(native_id) - idle_thread0, process_cpu() - idle_proc0
    async with asyncio.timeout(10):
        await task
    return {
        "tool": "radixtop LogFollower",
        **tally.result(written.value),
        # CPU spent on the whole workload (until the last line arrived) per second of writing.
        "cpu_pct": 100 * cpu_thread / duration,
        "cpu_pct_whole_process": 100 * cpu_proc / duration,
        "idle_cpu_pct": 100 * idle_thread / IDLE_SECONDS,
        "idle_cpu_pct_whole_process": 100 * idle_proc / IDLE_SECONDS,
        "notices": notices,
    }


# -- tail -F ------------------------------------------------------------------------------------------


def tail_counter(path: str, ready, written, results, duration: float) -> None:
    """Runs tail -F and tallies what comes out of its pipe, in a process of its own, until the
    writer is done (written > 0) and every line came out, or 10 s after; then 3 s idle."""
    tail = subprocess.Popen(["tail", "-F", "-n", "0", path], stdout=subprocess.PIPE, bufsize=0)
    tally = Tally()
    rest = b""
    fd = tail.stdout.fileno()  # type: ignore[union-attr]
    time.sleep(0.3)  # tail has opened the file and sits at its end
    cpu0 = thread_cpu(0, tail.pid)
    ready.set()
    deadline = None
    while True:
        total = written.value
        if total:
            deadline = deadline or time.monotonic() + 10
            if len(tally.seqs) >= total or time.monotonic() > deadline:
                break
        readable, _, _ = select.select([fd], [], [], 0.05)
        if not readable:
            continue
        data = rest + os.read(fd, 1 << 20)
        now = time.time()
        cut = data.rfind(b"\n") + 1
        data, rest = data[:cut], data[cut:]
        pairs = STAMP.findall(data)
        tally.add(now, map(operator.itemgetter(0), pairs), map(operator.itemgetter(1), pairs))
    cpu = thread_cpu(0, tail.pid) - cpu0
    time.sleep(0.2)
    idle0 = thread_cpu(0, tail.pid)
    time.sleep(IDLE_SECONDS)
    idle = thread_cpu(0, tail.pid) - idle0
    tail.terminate()
    tail.wait(5)
    results.put(
        {
            "tool": "tail -F (GNU coreutils)",
            **tally.result(written.value),
            "cpu_pct": 100 * cpu / duration,
            "idle_cpu_pct": 100 * idle / IDLE_SECONDS,
        }
    )


def bench_tail(path: str, rate: int, duration: float) -> dict:
    Path(path).write_bytes(b"")
    ready, written, results = mp.Event(), mp.Value("q", 0), mp.Queue()
    counter = mp.Process(target=tail_counter, args=(path, ready, written, results, duration))
    counter.start()
    ready.wait(10)
    proc = mp.Process(target=writer, args=(path, rate, duration, written))
    proc.start()
    proc.join()
    out = results.get(timeout=IDLE_SECONDS + 30)
    counter.join(10)
    return out


# -- main -------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=200_000, help="lines per second (default 200000)")
    parser.add_argument(
        "--duration", type=float, default=10.0, help="seconds of writing per tool (default 10)"
    )
    parser.add_argument("--quick", action="store_true", help="2 s of writing per tool")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()
    duration = 2.0 if args.quick else args.duration
    if shutil.which("tail") is None:
        print("tail not found: install GNU coreutils to compare against tail -F", file=sys.stderr)
        return 2
    workdir = tempfile.mkdtemp(prefix="radixtop-tail-bench-")
    try:
        ours = asyncio.run(bench_radixtop(os.path.join(workdir, "ours.log"), args.rate, duration))
        os.unlink(os.path.join(workdir, "ours.log"))
        peer = bench_tail(os.path.join(workdir, "tail.log"), args.rate, duration)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"rate {args.rate:,} lines/s target, {duration:g} s per tool, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    header = (
        f"{'tool':26} {'written':>9} {'received':>9} {'lost':>5} {'dup':>4} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'CPU %':>6} {'idle CPU %':>10}"
    )
    print(header)
    for r in (ours, peer):
        print(
            f"{r['tool']:26} {r['lines_written']:>9,} {r['lines_received']:>9,} {r['lost']:>5} "
            f"{r['duplicated']:>4} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} {r['max_ms']:>7.1f} "
            f"{r['cpu_pct']:>6.1f} {r['idle_cpu_pct']:>10.2f}"
        )
    print(
        "radixtop whole process (incl. the benchmark's consumer): "
        f"{ours['cpu_pct_whole_process']:.1f} % busy, {ours['idle_cpu_pct_whole_process']:.2f} % idle"
    )
    if ours["notices"]:
        print("notices:", *ours["notices"], sep="\n  ")
    if args.json:
        print(json.dumps({"radixtop": ours, "tail": peer}, indent=2))
    ok = ours["lost"] == 0 and ours["duplicated"] == 0 and ours["lines_received"] == ours["lines_written"]
    rate = f"{args.rate // 1000}k lines/s"
    row(f"live tail at {rate}: lines lost", str(ours["lost"]), f"tail -F: {peer['lost']}", "0", ours["lost"] == 0)
    row(f"live tail at {rate}: lag p50 / p99", f"{ours['p50_ms']:.1f} / {ours['p99_ms']:.1f} ms",
        f"tail -F: {peer['p50_ms']:.1f} / {peer['p99_ms']:.1f} ms", "p99 < 25 ms", ours["p99_ms"] < 25)
    row(f"live tail at {rate}: reader thread CPU, % of one core", f"{ours['cpu_pct']:.1f} %",
        f"tail -F: {peer['cpu_pct']:.1f} %", "< 25 %", ours["cpu_pct"] < 25)
    row("live tail, idle CPU", f"{ours['idle_cpu_pct']:.2f} %", f"tail -F: {peer['idle_cpu_pct']:.2f} %", "near zero",
        ours["idle_cpu_pct"] < 0.5)
    print("radixtop: no line lost or duplicated" if ok else "radixtop: LINES LOST OR DUPLICATED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
