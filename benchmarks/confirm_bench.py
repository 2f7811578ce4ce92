"""Wall time of the confirmation run's experiment, step by step, against the same steps by hand.

Cases:

* the demo (always): `radixtop demo`'s simulated server (2 TP ranks, 4,096-token pool, 32 running
  requests, the lock race) under the demo's load until it dies; what was seen of it while it lived
  is kept (as the TUI keeps it); then `radixtop confirm --yes --json` plans from that and runs the
  experiment (3 runs per step of the workload it sizes to the server);
* a real SGLang 0.5.23 server (`--real`: the tests' CPU recipe, `.ci/sglang-tests --build-only`
  builds its environment) with the tests' fault inside its cache (its evict raises while running
  requests lock half the pool), crashed by the tests' pressure traffic, then the same command.

Peer, in the same run: the same steps by hand, the way a person without radixtop runs an
experiment: a fresh server for every step (the step's flags and environment), wait for /health,
`radixtop replay` the same workload at the step's calls in flight, stop. No bundle, no log
watching, no plan; what it saves is what reusing a server across steps saves.

    python benchmarks/confirm_bench.py            # the demo, one round
    python benchmarks/confirm_bench.py --rounds 3 --real
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


from bench_rows import row  # noqa: E402  (benchmarks/ is the script's own directory)
from tree_launch import compile_tree  # noqa: E402  (benchmarks/)

from radixtop.demo import start_demo, stop_process  # noqa: E402
from radixtop.incident.common.sighting import observe, save_sighting  # noqa: E402

CRASH_TIMEOUT_S = 120
HEALTH_TIMEOUT_S = 600  # a real server loads for a while


def crashed_demo(workdir: Path) -> tuple[str, list[str]]:
    """A demo server seen alive, then dead by the lock race: its URL and extra confirm flags."""
    demo = start_demo("lock-race", workdir=workdir)
    try:
        info = httpx.get(f"{demo.url}/server_info", timeout=5).json()
        save_sighting(observe(demo.url, demo.sim.pid, server_info=info, logs=[str(demo.log_file)]))
        deadline = time.monotonic() + CRASH_TIMEOUT_S
        while demo.sim.poll() is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"the demo's server did not crash within {CRASH_TIMEOUT_S} s")
            time.sleep(0.2)
    finally:
        demo.stop()
    return demo.url, []


def crashed_real(workdir: Path) -> tuple[str, list[str]]:
    """A real SGLang server with the tests' fault in its cache, seen alive, crashed by pressure."""
    from real_sglang import start_server
    from sglang_gate import sglang_python
    from test_sglang_server import pressure_traffic

    if sglang_python() is None:
        raise SystemExit("the real-SGLang environment is missing: run bash .ci/sglang-tests --build-only")
    server = start_server(workdir, name="server", env={"SGLANG_TEST_EVICT_FAULT": "1"})
    try:
        info = httpx.get(f"{server.url}/server_info", timeout=10).json()
        assert server.proc is not None
        save_sighting(observe(server.url, server.proc.pid, server_info=info, logs=[str(server.log)]))
        pressure_traffic(server)
        server.proc.wait(120)
    finally:
        server.stop()
    return server.url, ["--log", str(server.log)]


def confirm(url: str, extra: list[str], workdir: Path) -> tuple[float, dict]:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "radixtop", "confirm", "--url", url, "--yes", "--json", "--workdir", str(workdir),
         *extra],
        capture_output=True, text=True, timeout=3600, check=False,
    )
    wall = time.monotonic() - began
    if done.returncode not in (0, 1):
        raise SystemExit(f"confirm failed: {done.stderr[-2000:]}")
    return wall, json.loads(done.stdout)


def _healthy(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"{what} did not start by hand")
        time.sleep(0.2)


def by_hand(doc: dict, workdir: Path) -> float:
    """Every step as a person runs it: a fresh server, health, replay at the step's load, stop."""
    plan = doc["plan"]
    trace = plan["workload"]["path"]
    arms = {a["role"]: a for a in plan["arms"]}
    env = {**os.environ, **(plan["environment"] or {}).get("env", {})}
    began = time.monotonic()
    for n, step in enumerate(s for s in doc["steps"] if s["role"] != "crash-log"):
        arm = arms["control" if step["step"] == "cache-off" else "reproduction"]
        step_env = {**env, "SGLANG_RADIX_FORCE_MISS": "1"} if step["reuse_off"] == "SGLANG_RADIX_FORCE_MISS=1" else env
        with open(workdir / f"hand-{n}.out", "wb") as out:
            proc = subprocess.Popen(arm["argv"], stdout=out, stderr=subprocess.STDOUT, env=step_env,
                                    cwd=(plan["environment"] or {}).get("cwd"), start_new_session=True)
        try:
            _healthy(arm["url"], proc, f"step {n + 1}")
            flags = [*(["--max-in-flight", str(step["max_in_flight"])] if step["max_in_flight"] else []),
                     *(["--namespace-per-request"] if step["reuse_off"] == "a namespace per request" else [])]
            subprocess.run([sys.executable, "-m", "radixtop", "replay", trace, "--url", arm["url"],
                            "--runs", str(plan["runs"]), *flags], capture_output=True, timeout=1800, check=False)
        finally:
            stop_process(proc)
    return time.monotonic() - began


def one_round(case: str, crash: Callable[[Path], tuple[str, list[str]]], i: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="confirm-bench-") as tmp:
        os.environ["RADIXTOP_RUNTIME_DIR"] = str(Path(tmp, "runtime"))
        url, extra = crash(Path(tmp, "crash"))
        wall, doc = confirm(url, extra, Path(tmp, "confirm"))
        t = doc["timings"]
        phases = {"evidence": t["evidence_s"], "plan (rest)": t["plan_s"] - t["evidence_s"]}
        for n, step in enumerate(doc["steps"], 1):
            label = f"step {n}: {step['label']}"
            if step.get("start_s") is not None and step.get("runs") is not None:
                phases[f"{label}, start"] = step["start_s"]
            phases[f"{label}, replay"] = step.get("replay_s") or 0.0
        phases.update({f"stop {k[5:-2]}": v for k, v in t.items() if k.startswith("stop_")})
        phases["confirm total (wall)"] = wall
        phases["by hand, a server per step (peer)"] = by_hand(doc, Path(tmp))
        conditions = " · ".join(f"{k} {v['state']}" for k, v in doc["conditions"].items())
        print(f"{case} round {i + 1}: {doc['verdict']} ({conditions}); "
              + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()), flush=True)
        return phases


def report(case: str, rows: list[dict[str, float]]) -> None:
    print(f"\n{case}\n\n| phase | seconds (median of {len(rows)}) |\n| --- | ---: |")
    for key in rows[0]:
        values = [r[key] for r in rows if key in r]
        print(f"| {key} | {statistics.median(values):.1f} |")
    steps = sum(1 for k in rows[0] if k.endswith(", replay"))
    row(f"confirmation run, {case} ({steps} steps, 3 runs each), wall, median of {len(rows)}",
        f"{statistics.median(r['confirm total (wall)'] for r in rows):.1f} s",
        f"the same steps by hand, a server per step: "
        f"{statistics.median(r['by hand, a server per step (peer)'] for r in rows):.1f} s")


def main() -> None:
    compile_tree(ROOT)  # radixtop as installed: its bytecode written (tree_launch.py)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--real", action="store_true", help="also a real SGLang server (its environment built)")
    args = parser.parse_args()
    cases: list[tuple[str, Callable[[Path], tuple[str, list[str]]]]] = [("after the demo's crash", crashed_demo)]
    if args.real:
        cases.append(("after a real SGLang server's crash (CPU)", crashed_real))
    for case, crash in cases:
        report(case, [one_round(case, crash, i) for i in range(args.rounds)])


if __name__ == "__main__":
    main()
