"""Run every benchmark and print one table: each headline figure beside its peer, with its target.

    python benchmarks/run_all.py --quick          # every benchmark in its short mode (tens of minutes)
    python benchmarks/run_all.py                  # the full runs (hours on a 2-core machine)
    python benchmarks/run_all.py --only screen,scan --quick

Each benchmark runs as a subprocess, one after the other (never two at once: they would measure
each other), with RADIXTOP_BENCH_ROWS pointing at a file its `bench_rows.row` calls append to.
Its own report goes to benchmarks/data/run_all/<name>.txt (git-ignored); a benchmark that fails
or is skipped says so in the table. The ones that need SGLang (instrument on SGLang's cache, the
Rust TreeCore walk) run with --sglang-python, an interpreter of an environment with sglang and
torch (`.ci/sglang-tests` builds one), and are skipped without it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "data" / "run_all"

# name -> (script, quick arguments, full arguments, needs SGLang)
BENCHMARKS: dict[str, tuple[str, list[str], list[str], bool]] = {
    "scan": ("scan_bench.py", ["--runs", "1", "--fallback-runs", "0", "--startup-runs", "21"], ["--runs", "3"], False),
    "screen": ("screen_bench.py", ["--quick", "--tools", "radixtop,lnav"], ["--tools", "radixtop,lnav"], False),
    "tail": ("tail_bench.py", ["--quick"], [], False),
    "replay": ("replay_bench.py", ["--quick"], [], False),
    "panes": ("panes_bench.py", ["--quick", "--lines", "200000"], [], False),
    "confirm": ("confirm_bench.py", ["--rounds", "1"], ["--rounds", "3"], False),
    "analyze": ("analyze_bench.py", ["--requests", "10000"], [], False),
    "sim-http": ("sim_http_bench.py", ["--quick"], [], False),
    "sim": ("sim_bench.py", [], ["--full"], False),
    "instrument": ("instrument_bench.py", ["--quick"], [], False),
    "instrument-sglang": ("instrument_bench.py", ["--real", "--quick"], ["--real"], True),
    "rust-walk": ("rust_walk_bench.py", ["--quick"], [], True),
    # Starts its real servers from the SGLang environment itself; radixtop runs from this one.
    "server-cost": ("server_cost_bench.py", ["--quick"], ["--core", "both", "--seconds", "30"], False),
}


def run_one(name: str, quick: bool, sglang_python: str | None, timeout: float) -> tuple[list[dict], str, str]:
    """(rows, the command, what went wrong or "")."""
    script, quick_args, full_args, needs_sglang = BENCHMARKS[name]
    python = sglang_python if needs_sglang else sys.executable
    command = ["python" if not needs_sglang else "<sglang env>/bin/python", f"benchmarks/{script}",
               *(quick_args if quick else full_args)]
    if needs_sglang and not sglang_python:
        return [], " ".join(command), "skipped: needs --sglang-python"
    if not (HERE / script).exists():
        return [], " ".join(command), f"skipped: {script} is missing"
    with tempfile.NamedTemporaryFile(prefix="rows-", suffix=".jsonl", delete=False) as f:
        rows_path = f.name
    env = dict(os.environ, RADIXTOP_BENCH_ROWS=rows_path)
    OUT.mkdir(parents=True, exist_ok=True)
    report = OUT / f"{name}.txt"
    problem = ""
    try:
        with open(report, "wb") as out:
            done = subprocess.run([python, str(HERE / script), *command[2:]], stdout=out, stderr=subprocess.STDOUT,
                                  env=env, cwd=HERE.parent, timeout=timeout, check=False)
        if done.returncode != 0:
            problem = f"exit status {done.returncode} (see {report.relative_to(HERE.parent)})"
    except subprocess.TimeoutExpired:
        problem = f"over {timeout:.0f} s: stopped"
    rows = [json.loads(line) for line in Path(rows_path).read_text(encoding="utf-8").splitlines() if line.strip()]
    Path(rows_path).unlink(missing_ok=True)
    return rows, " ".join(command), problem


def met_text(met: bool | None, target: str) -> str:
    if met is None:
        return target
    return f"{target}: {'met' if met else 'NOT met'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's short mode")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--sglang-python", default=None, metavar="PATH", help="python of an environment with sglang")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per benchmark (default 3600)")
    args = parser.parse_args()
    names = list(BENCHMARKS) if args.only is None else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{len(names)} benchmarks, {'quick' if args.quick else 'full'}; {os.cpu_count()} CPUs, load average {load}")
    table = ["| what is measured | radixtop | peer and its figure | target | command |",
             "| --- | --- | --- | --- | --- |"]
    failed = 0
    for name in names:
        began = time.monotonic()
        rows, command, problem = run_one(name, args.quick, args.sglang_python, args.timeout)
        print(f"  {name}: {len(rows)} figures in {time.monotonic() - began:.0f} s{'; ' + problem if problem else ''}",
              flush=True)
        for r in rows:
            table.append(
                f"| {r['what']} | {r['radixtop']} | {r['peer']} | {met_text(r['met'], r['target'])} | `{command}` |"
            )
        if problem and not problem.startswith("skipped"):
            failed += 1
            table.append(f"| {name} | {problem} | | | `{command}` |")
        elif problem:
            table.append(f"| {name} | {problem} | | | `{command}` |")
    print(f"\nload average after: {', '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print("\n".join(table))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
