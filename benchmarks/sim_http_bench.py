"""Requests per second of `radixtop sim` over loopback HTTP, against a named peer in the same run.

The peer is the floor the simulator stands on: a bare Starlette app under uvicorn with the same
settings (one route answering a constant JSON), i.e. the HTTP stack alone. The simulator's numbers
are read against it: `/health` measures what the sim adds to a trivial request; `/generate` adds
parsing, tokenizing, the engine's scheduling (prefill + decode steps at --step-ms 0) and the reply.

Both servers run as subprocesses on 127.0.0.1 (free ports), the client is http.client in threads
with keep-alive connections and a fixed concurrency, and each measurement is a fixed number of
requests after a warm-up, repeated a few times (the best round is reported). Usage:

    python benchmarks/sim_http_bench.py            # full run (lead, quiet machine)
    python benchmarks/sim_http_bench.py --quick    # a few seconds, for a shared machine
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runs from a checkout, like the other benchmarks

from bench_rows import row  # noqa: E402  (benchmarks/ is the script's own directory)

from radixtop.sim.cli import sim_argv  # noqa: E402

PEER_APP = """
import socket, sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

async def ok(request):
    return JSONResponse({"ok": True})

app = Starlette(routes=[Route("/health", ok), Route("/generate", ok, methods=["POST"])])
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
sock.bind(("127.0.0.1", 0))
sock.listen(2048)
open(sys.argv[1], "w").write(str(sock.getsockname()[1]))
config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", timeout_keep_alive=5)
uvicorn.Server(config).run(sockets=[sock])
"""


def _wait_port(path: Path, proc: subprocess.Popen, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early with {proc.returncode}")
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.02)
    proc.kill()
    raise SystemExit("server did not start in time")


def start_sim(tmp: Path) -> tuple[subprocess.Popen, int]:
    ready = tmp / "sim.port"
    flags = (
        "--log-level",
        "warning",
        "--step-ms",
        "0",
        "--max-running-requests",
        "64",
        "--max-total-tokens",
        "65536",
    )
    cmd = sim_argv(*flags, ready_file=ready, log_file=tmp / "sim.log")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, _wait_port(ready, proc)


def start_peer(tmp: Path) -> tuple[subprocess.Popen, int]:
    ready = tmp / "peer.port"
    proc = subprocess.Popen(
        [sys.executable, "-c", PEER_APP, str(ready)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return proc, _wait_port(ready, proc)


def measure(port: int, method: str, path: str, body: dict | None, total: int, concurrency: int) -> float:
    """Requests/s over `concurrency` keep-alive connections, each driven by its own thread.

    The client is http.client (the lightest in the standard library) so that, on a small machine,
    the numbers say more about the server than about the client sharing its CPUs."""
    payload = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if payload is not None else {}

    def worker(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            for _ in range(n):
                conn.request(method, path, body=payload, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if resp.status != 200:
                    raise SystemExit(f"{path}: HTTP {resp.status}: {data[:200]!r}")
        finally:
            conn.close()

    def run(per: int) -> float:
        threads = [threading.Thread(target=worker, args=(per,)) for _ in range(concurrency)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return per * concurrency / (time.perf_counter() - started)

    run(max(1, total // 20 // concurrency))  # warm-up: connections, caches, the prompt in the tree
    return run(max(1, total // concurrency))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds in all (shared machines)")
    ap.add_argument("--requests", type=int, default=None, help="requests per measurement")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument(
        "--rounds", type=int, default=3, help="measure each case this many times, report the best"
    )
    args = ap.parse_args(argv)
    total = args.requests or (400 if args.quick else 4000)
    prompt = " ".join(f"w{j}" for j in range(32))
    cases = [
        ("GET /health", "GET", "/health", None),
        (
            "POST /generate, 32-token prompt, 1 new token",
            "POST",
            "/generate",
            {"text": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
        ),
        (
            "POST /generate, 32-token prompt, 16 new tokens",
            "POST",
            "/generate",
            {"text": prompt, "sampling_params": {"max_new_tokens": 16, "temperature": 0}},
        ),
    ]
    print(
        f"# radixtop sim HTTP benchmark: {total} requests per case, best of {args.rounds}, "
        f"concurrency {args.concurrency}"
    )
    print(f"# python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        servers = {"bare uvicorn+starlette (peer)": start_peer(tmp), "radixtop sim": start_sim(tmp)}
        try:
            results: dict[str, dict[str, float]] = {}
            for label, method, path, body in cases:
                for name, (_, port) in servers.items():
                    peer_body = body if name.startswith("radixtop") else (body and {"x": 1})
                    if name.startswith("bare") and "16 new" in label:
                        continue  # the peer answers /generate at once: one row is enough
                    # Best of a few rounds: on a shared machine the slow rounds measure the neighbours.
                    rate = max(
                        measure(port, method, path, peer_body, total, args.concurrency)
                        for _ in range(args.rounds)
                    )
                    results.setdefault(label, {})[name] = rate
            print("| case | server | requests/s |")
            print("| --- | --- | ---: |")
            for label, by_server in results.items():
                for name, rate in by_server.items():
                    print(f"| {label} | {name} | {rate:,.0f} |")
                peer = by_server.get("bare uvicorn+starlette (peer)")
                if peer is not None:
                    row(f"simulator HTTP, {label}, requests/s", f"{by_server['radixtop sim']:,.0f}",
                        f"bare uvicorn+Starlette: {peer:,.0f}")
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
