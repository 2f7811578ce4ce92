"""Benchmark `radixtop scan --matches` against ripgrep on one big SGLang-format log.

    python benchmarks/scan_bench.py                 # 1 GiB log, 3 alternating runs each
    python benchmarks/scan_bench.py --size-mb 200   # quick check

The log is generated once and cached under benchmarks/data/ (git-ignored): interleaved TP0..TP7
Prefill/Decode batch lines, HTTP access lines, and a few dozen failure lines for the catalog's
signatures (tracebacks included) scattered through it. Both tools read it warm from the page
cache. rg gets one `-e` per catalog pattern; radixtop runs end to end as a subprocess (the CLI,
startup included). Both must find the same set of (line number, text), or the run fails. The
figure that matters is the wall-time ratio radixtop/rg (target: at most 0.8) with the best engine;
the fallback engines (RADIXTOP_SCAN_ENGINE=re2 / re) are timed too, fewer times.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(ROOT))


from bench_rows import row  # noqa: E402  (benchmarks/ is the script's own directory)
from tree_launch import compile_tree  # noqa: E402  (benchmarks/)

from radixtop.diagnosis.catalog import load_catalog
from radixtop.diagnosis.matcher import Matcher
from radixtop.probes.logscan import CHUNK_SIZE, _worth_a_worker

RANKS = 8
# One failure line (or block) per line; "{r}" is the rank, "{t}" the time prefix's clock part.
FAILURES = [
    "[{t} TP{r}] RadixCacheError: Failed to lock memory page during dynamic prefix eviction",
    "[{t} TP{r}] Radix cache eviction contended with a page lock; retrying",
    "[{t} TP{r}] FULL segment release hit lock_ref=0 on node 1234",
    "[{t} TP{r}] Rust TreeCore panicked: index out of bounds",
    (
        "[{t} TP{r}] token_to_kv_pool_allocator memory leak detected! available_size=10, "
        "evictable_size=20, protected_size=0"
    ),
    "[{t} TP{r}] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.5",
    "[{t} TP{r}] Prefill out of memory. Try to lower your batch size.",
    "[{t} TP{r}] Decode out of memory. Try to lower your batch size.",
    (
        "[{t} TP{r}] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2612, in run_scheduler_process\n'
        "    scheduler.event_loop_overlap()\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered"
    ),
    "[{t} TP{r}] Received sigquit from a child process. It usually means the child failed.",
    "[{t} TP{r}] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
    "[{t} TP{r}] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "[{t} TP{r}] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=99)",
    "[{t} TP{r}] NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:275",
    "[{t} TP{r}] The server is fired up and ready to roll!",
    "[{t} TP{r}] Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0.",
    "[{t} TP{r}] Capture cuda graph failed: CUDA error: out of memory",
]


def _clock(second: int, ms: int) -> str:
    minute, sec = divmod(second, 60)
    hour, minute = divmod(minute, 60)
    return f"2026-12-02 {10 + hour % 14:02d}:{minute:02d}:{sec:02d}.{ms:03d}"


def generate(path: Path, size: int, seed: int = 7) -> None:
    """Write an SGLang-format log of about `size` bytes (a few dozen failure lines in it)."""
    rng = random.Random(seed)
    approx_lines = size // 170
    failure_at = sorted(rng.sample(range(1000, max(approx_lines - 10, 2000)), 48))
    tmp = path.with_suffix(".tmp")
    written = 0
    line_no = 0
    second = 0
    next_failure = 0
    usage = [0.3] * RANKS
    with open(tmp, "w", encoding="utf-8") as f:
        block: list[str] = []
        while written < size:
            if line_no % 40 == 0:
                second += 1
            ms = (line_no * 37) % 1000
            t = _clock(second, ms)
            r = line_no % RANKS
            if next_failure < len(failure_at) and line_no >= failure_at[next_failure]:
                line = FAILURES[next_failure % len(FAILURES)].format(t=t, r=r)
                next_failure += 1
            elif line_no % 97 == 0:
                line = f'[{t}] INFO:     127.0.0.1:{40000 + line_no % 20000} - "POST /generate HTTP/1.1" 200 OK'
            elif line_no % 5 == 0:
                usage[r] = min(0.99, max(0.01, usage[r] + rng.uniform(-0.02, 0.025)))
                line = (
                    f"[{t} TP{r}] Prefill batch, #new-seq: {rng.randint(1, 8)}, "
                    f"#new-token: {rng.randint(16, 8192)}, #cached-token: {rng.randint(0, 65536)}, "
                    f"token usage: {usage[r]:.2f}, #running-req: {rng.randint(0, 256)}, "
                    f"#queue-req: {rng.randint(0, 64)}, "
                )
            else:
                line = (
                    f"[{t} TP{r}] Decode batch, #running-req: {rng.randint(1, 256)}, "
                    f"#token: {rng.randint(1000, 900000)}, token usage: {usage[r]:.2f}, "
                    f"cuda graph: True, gen throughput (token/s): {rng.uniform(100, 9000):.2f}, "
                    f"#queue-req: {rng.randint(0, 64)}, "
                )
            block.append(line)
            written += len(line) + 1
            line_no += line.count("\n") + 1
            if len(block) >= 4096:
                f.write("\n".join(block) + "\n")
                block.clear()
        if block:
            f.write("\n".join(block) + "\n")
    tmp.replace(path)


def check_failure_lines(matcher: Matcher) -> None:
    for block in FAILURES:
        last = block.format(t=_clock(0, 0), r=0).split("\n")
        if not any(matcher.match(line) for line in last):
            raise SystemExit(f"benchmark failure line matches no catalog signature: {block[:80]!r}")


def timed(argv: list[str], *, check: bool, **kwargs) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run argv to the end: (wall seconds, CPU seconds user+system of the child, the result).

    CPU time is the steadier figure on a shared machine: other people's work stretches wall time
    but not the CPU time the tool itself needs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=check, **kwargs)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done


def run_radixtop(path: Path, engine: str | None) -> tuple[float, float, set[tuple[int, str]]]:
    env = dict(os.environ)
    env.pop("RADIXTOP_SCAN_ENGINE", None)
    if engine:
        env["RADIXTOP_SCAN_ENGINE"] = engine
    wall, cpu, done = timed(
        [sys.executable, "-m", "radixtop", "scan", "--matches", str(path)], env=env, cwd=ROOT, check=True
    )
    found = set()
    prefix = f"{path}:".encode()
    for match in done.stdout.splitlines():
        assert match.startswith(prefix), match[:120]
        line, _sig, text = match[len(prefix) :].split(b":", 2)
        found.add((int(line), text.decode("utf-8", "replace")))
    return wall, cpu, found


def run_rg(rg: str, path: Path, patterns: list[str]) -> tuple[float, float, set[tuple[int, str]]]:
    argv = [rg, "--no-config", "-n"]
    for pattern in patterns:
        argv += ["-e", pattern]
    argv.append(str(path))
    wall, cpu, done = timed(argv, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"rg failed: {done.stderr.decode(errors='replace').strip()}")
    found = set()
    for match in done.stdout.splitlines():
        line, text = match.split(b":", 1)
        found.add((int(line), text.decode("utf-8", "replace")))
    return wall, cpu, found


def in_process(path: Path, matcher: Matcher, threads: bool) -> float:
    from radixtop.probes.logscan import LogScanner

    start = time.perf_counter()
    LogScanner(matcher, details=False, threads=threads).scan(str(path), lambda hit: None)
    return time.perf_counter() - start


def startup(path: Path, rg: str, patterns: list[str], runs: int) -> dict[str, float]:
    """Median wall on a 100-line file (mostly start-up) of radixtop, rg and a bare Python, in
    alternating runs."""
    small = DATA / "small.log"
    with open(path, "rb") as f, open(small, "wb") as out:
        out.writelines(f.readline() for _ in range(100))
    walls: dict[str, list[float]] = {"radixtop": [], "rg": [], "python -c pass": []}
    # The command a user types: the installed entry point (beside this Python), not `python -m`.
    entry = Path(sys.executable).with_name("radixtop")
    command = [str(entry)] if entry.exists() else [sys.executable, "-m", "radixtop"]
    for _ in range(runs):
        walls["radixtop"].append(timed([*command, "scan", "--matches", str(small)], cwd=ROOT, check=True)[0])
        walls["rg"].append(run_rg(rg, small, patterns)[0])
        walls["python -c pass"].append(timed([sys.executable, "-c", "pass"], check=True)[0])
    return {name: statistics.median(values) for name, values in walls.items()}


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    compile_tree(ROOT)  # radixtop as installed: its bytecode written (tree_launch.py)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="log size in MiB (default 1024)")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs per tool (default 3)")
    parser.add_argument(
        "--fallback-runs", type=int, default=1, help="runs for the re2 and re engines (0 skips them)"
    )
    parser.add_argument(
        "--startup-runs", type=int, default=15, help="alternating runs on the 100-line file (default 15)"
    )
    args = parser.parse_args()
    rg = shutil.which("rg")
    if rg is None:
        raise SystemExit("rg (ripgrep) is not installed; install it to run this benchmark")

    catalog = load_catalog()
    patterns = [sig.pattern for sig in catalog.signatures]
    best = Matcher(catalog.signatures)
    check_failure_lines(best)
    DATA.mkdir(parents=True, exist_ok=True)
    path = DATA / f"sglang-{args.size_mb}mb.log"
    if not path.exists():
        print(f"generating {path} ...", flush=True)
        generate(path, args.size_mb << 20)
    size = path.stat().st_size
    with open(path, "rb") as f:  # warm the page cache
        while f.read(8 << 20):
            pass

    print(f"log: {path} ({size / (1 << 20):.0f} MiB), {len(patterns)} patterns, cpus: {os.cpu_count()}")
    print(f"best engine: {best.engine}" + (f" ({best.fallback_note})" if best.fallback_note else ""))
    worker = _worth_a_worker(size, CHUNK_SIZE)
    print(f"load average (1/5/15 min) before: {load()}; scan worker thread (auto): {'on' if worker else 'off'}")
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    reference: set[tuple[int, str]] | None = None
    for _ in range(args.runs):
        wall, cpu, found_rg = run_rg(rg, path, patterns)
        theirs.append((wall, cpu))
        wall, cpu, found = run_radixtop(path, None)
        ours.append((wall, cpu))
        if found != found_rg:
            only_us = sorted(found - found_rg)[:5]
            only_rg = sorted(found_rg - found)[:5]
            raise SystemExit(f"results differ: only radixtop {only_us}, only rg {only_rg}")
        reference = found
    assert reference is not None
    rg_wall = statistics.median(w for w, _ in theirs)
    rg_cpu = statistics.median(c for _, c in theirs)
    our_wall = statistics.median(w for w, _ in ours)
    our_cpu = statistics.median(c for _, c in ours)
    print(f"hits: {len(reference)} lines, identical in radixtop and rg")
    print(
        f"rg -n:                  median {rg_wall:.3f} s (cpu {rg_cpu:.3f} s)  "
        f"runs {[round(w, 3) for w, _ in theirs]}"
    )
    print(
        f"radixtop scan ({best.engine}): median {our_wall:.3f} s (cpu {our_cpu:.3f} s)  "
        f"runs {[round(w, 3) for w, _ in ours]}  ratio {our_wall / rg_wall:.2f} "
        f"(cpu ratio {our_cpu / rg_cpu:.2f})"
    )
    print(f"load average (1/5/15 min) after: {load()}")
    ratio = our_wall / rg_wall
    row(f"scan {size / (1 << 30):.2g} GiB, `radixtop scan --matches`, {len(patterns)}-signature catalog",
        f"{our_wall:.3f} s (CPU {our_cpu:.3f} s)", f"`rg -n`: {rg_wall:.3f} s (CPU {rg_cpu:.3f} s)",
        "ratio <= 0.5", ratio <= 0.5)
    for threads in (False, True):
        walls = [in_process(path, best, threads) for _ in range(args.runs)]
        label = "scan on a worker thread, next read ahead" if threads else "one thread"
        print(f"  in process, {label}: median {statistics.median(walls):.3f} s")
    start = startup(path, rg, patterns, args.startup_runs)
    print(
        "start-up (100-line file, median of "
        f"{args.startup_runs}): "
        + ", ".join(f"{name} {wall * 1000:.0f} ms" for name, wall in start.items())
    )
    row(f"scan start-up, 100-line file, median of {args.startup_runs}", f"{start['radixtop'] * 1000:.0f} ms",
        f"`rg -n`: {start['rg'] * 1000:.0f} ms; `python -c pass`: {start['python -c pass'] * 1000:.0f} ms",
        "<= 80 ms", start["radixtop"] <= 0.080)
    for engine in ("re2", "re") if args.fallback_runs > 0 else ():
        if engine == best.engine:
            continue
        walls = []
        for _ in range(args.fallback_runs):
            wall, _cpu, found = run_radixtop(path, engine)
            if found != reference:
                raise SystemExit(f"engine {engine} found different lines than rg")
            walls.append(wall)
        wall = statistics.median(walls)
        print(f"radixtop scan ({engine}): median {wall:.3f} s  ratio {wall / rg_wall:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
