"""Wall time of the confirmation run in the demo's case, phase by phase, against doing it by hand.

The case: `radixtop demo`'s simulated server (2 TP ranks, 4,096-token pool, 32 running requests,
the lock race) under the demo's load until it dies; what was seen of it while it lived is kept
(as the TUI keeps it); then `radixtop confirm --yes --json` plans from that and runs the
reproduction and the control (3 runs each of the pressure workload it sizes to the server).

Peer, in the same run: the same two arms by hand, the floor of any tool doing this: start the
simulator with the reproduction's flags, wait for /health, `radixtop replay` the same workload
(3 runs), stop it; then the same with the control's flags. No bundle, no log watching, no plan.

    python benchmarks/confirm_bench.py            # one round
    python benchmarks/confirm_bench.py --rounds 3
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
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from bench_rows import row  # noqa: E402  (benchmarks/ is the script's own directory)

from radixtop.demo import start_demo, stop_process  # noqa: E402
from radixtop.incident.common.sighting import observe, save_sighting  # noqa: E402

CRASH_TIMEOUT_S = 120


def crashed_demo(workdir: Path) -> str:
    """A demo server seen alive, then dead by the lock race; its URL."""
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
    return demo.url


def confirm(url: str, workdir: Path) -> tuple[float, dict]:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "radixtop", "confirm", "--url", url, "--yes", "--json", "--workdir", str(workdir)],
        capture_output=True, text=True, timeout=900, check=False,
    )
    wall = time.monotonic() - began
    if done.returncode not in (0, 1):
        raise SystemExit(f"confirm failed: {done.stderr[-2000:]}")
    return wall, json.loads(done.stdout)


def by_hand(doc: dict, workdir: Path) -> float:
    """The two arms as a person would run them: start, wait for health, replay, stop."""
    trace = doc["plan"]["workload"]["path"]
    began = time.monotonic()
    for arm in doc["plan"]["arms"]:
        argv = arm["argv"]
        out = open(workdir / f"hand-{arm['role']}.out", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{arm['url']}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"{arm['role']} did not start by hand")
                time.sleep(0.2)
            subprocess.run([sys.executable, "-m", "radixtop", "replay", trace, "--url", arm["url"], "--runs", "3"],
                           capture_output=True, timeout=600, check=False)
        finally:
            stop_process(proc)
            out.close()
    return time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    rows: list[dict[str, float]] = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="confirm-bench-") as tmp:
            os.environ["RADIXTOP_RUNTIME_DIR"] = str(Path(tmp, "runtime"))
            url = crashed_demo(Path(tmp, "demo"))
            wall, doc = confirm(url, Path(tmp, "confirm"))
            repro, control = doc["baseline"], doc["control"]
            t = doc["timings"]
            phases = {
                "evidence": t["evidence_s"], "plan (rest)": t["plan_s"] - t["evidence_s"],
                "reproduction start": repro.get("start_s", 0), "reproduction replay": repro.get("replay_s", 0),
                "reproduction stop": repro.get("stop_s", 0), "control start": control.get("start_s", 0),
                "control replay": control.get("replay_s", 0), "control stop": control.get("stop_s", 0),
                "confirm total (wall)": wall, "by hand (peer)": by_hand(doc, Path(tmp)),
            }
            print(
                f"round {i + 1}: {doc['verdict']}; " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()),
                flush=True,
            )
            rows.append(phases)
    print(f"\n| phase | seconds (median of {len(rows)}) |\n| --- | ---: |")
    for key in rows[0]:
        print(f"| {key} | {statistics.median(r[key] for r in rows):.1f} |")
    row(f"confirmation run after the demo's crash (reproduction + control, 3 runs each), wall, median of {len(rows)}",
        f"{statistics.median(r['confirm total (wall)'] for r in rows):.1f} s",
        f"the same two arms by hand: {statistics.median(r['by hand (peer)'] for r in rows):.1f} s")


if __name__ == "__main__":
    main()
