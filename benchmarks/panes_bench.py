"""Benchmark the live panes: what polling costs, and whether a huge tree freezes the UI.

    python benchmarks/panes_bench.py --quick                 # shared machine: short windows
    python benchmarks/panes_bench.py                         # longer windows, more polls
    python benchmarks/panes_bench.py --only snapshot         # one part: snapshot | polling | app
    python benchmarks/panes_bench.py --quick --only app --scene quiet --lines 0   # one app scene

1. snapshot: a 100,000-node snapshot (random tree, 2 % of nodes locked, ~6 MB of JSON) served by a
   loopback HTTP server in another process, two versions alternating so every poll parses anew.
   radixtop's RadixProbe + RadixPane run in a headless Textual app (App.run_test) exactly as the
   app runs them; a task on the app's event loop sleeps 5 ms at a time and records how late it
   wakes: the longest stall is the longest the UI could not draw (a frame runs on that loop).
   Peer in the same run: Textual's own Tree widget filled with the same 100,000 nodes on the UI
   loop (the straightforward way to show a tree), stall measured the same way.
2. polling: every live source at its default rate (server /health + /metrics, two ranks' debug
   endpoints, the process tree, NVML) against `radixtop sim` under the demo workload, folded into
   the panes' state as the app does, without drawing: CPU seconds of this process
   (time.process_time) per wall second, and RSS. Peer: nvitop (a GPU monitor, installed in a
   throwaway venv: --nvitop PATH) run for the same window in tmux; skipped with a note where it
   cannot run (no NVIDIA driver).
3. app: `radixtop --log SIM_LOG` (discovery attaches to the simulator writing it) in tmux at
   160x48, every pane on screen, and in the same run the log pane alone (RADIXTOP_PANES=0) as the
   baseline: CPU share of one core and RSS over the window, the first frame's time from the
   command (the status line on screen; with the panes, also when they are on screen, for they
   are mounted after the first frame), and RSS after a million log lines have been appended to
   the followed log and read.
   Three scenes: the simulator idle with its access log off (what watching costs), idle with its
   access log on (radixtop's own /metrics and /health polls then add a log line a second or so,
   which the log pane draws), and under the demo workload.

Targets: at most 3 % of one core and under 150 MiB RSS after a million lines; first frame within
1 s; no stall over 100 ms while a 100,000-node snapshot is fetched, parsed and displayed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench_rows import row  # noqa: E402  (benchmarks/ is the script's own directory)
from tmux_helpers import kill_server  # noqa: E402  (tests/, for the tmux servers' end)
from tree_launch import compile_tree  # noqa: E402  (benchmarks/)

WIDTH, HEIGHT = 160, 48


# -- helpers -----------------------------------------------------------------------------------


def big_snapshot_bytes(n: int, seed: int) -> bytes:
    from radixtop.schema import (
        SCHEMA_VERSION,
        Census,
        Counters,
        NodeRow,
        Snapshot,
        TreeView,
    )

    rng = random.Random(seed)
    rows = [NodeRow(0, -1, 0, 1, False, 0, 100.0, 0, None, ())]
    for i in range(1, n + 1):
        parent = rng.randrange(max(0, i - 50), i) if rng.random() < 0.7 else rng.randrange(0, min(i, 100))
        tokens = rng.choice((16, 32, 64, 128))
        rows.append(
            NodeRow(i, parent, tokens, 1 if rng.random() < 0.02 else 0, False, rng.randrange(20),
                    100.0 - rng.random() * 50, 0, tokens, tuple(rng.randrange(50_000) for _ in range(4)))
        )
    tree = TreeView(n, n, sum(r.tokens for r in rows), 0, 0, True, tuple(rows))
    census = Census(True, n, tree.walked_tokens, {0: n - n // 50, 1: n // 50}, f"{seed:016x}", 0.1, 0.5)
    snap = Snapshot(SCHEMA_VERSION, 0, "beef", seed, time.time(), 110.0, 0.5, "RadixCache", True, "", 16,
                    10_000_000, 100_000, 5_000_000, 100_000, "active", Counters(), 0, census, tree)
    return snap.to_json()


SERVER = textwrap.dedent(
    """
    import itertools, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    bodies = [open(p, "rb").read() for p in sys.argv[2:]]
    turn = itertools.cycle(bodies)
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"
        def do_GET(self):
            if self.path.startswith("/radixtop/v1/snapshot"):
                body = next(turn)
            elif self.path.startswith("/radixtop/v1/health"):
                body = (
                    b'{"schema_version":1,"rank":0,"instance":"beef","status":"ok","hooks_state":"active",'
                    b'"snapshots":1,"safe_points":1,"last_snapshot_age_s":0.1,"last_snapshot_seconds":0.5,'
                    b'"snapshot_interval_s":2.0,"max_budget":200000}'
                )
            else:
                self.send_response(404); self.end_headers(); return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    s = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
    print("ready", flush=True)
    s.serve_forever()
    """
)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LagMonitor:
    """Sleeps `step` at a time on the event loop and records how late each wake-up is."""

    def __init__(self, step: float = 0.005) -> None:
        self.step = step
        self.gaps: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(self.step)
            now = time.perf_counter()
            self.gaps.append(now - last - self.step)
            last = now

    def start(self) -> None:
        self.gaps = []
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> dict[str, float]:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        g = sorted(self.gaps) or [0.0]
        return {"max_ms": g[-1] * 1000, "p99_ms": g[int(len(g) * 0.99)] * 1000, "over_100ms": sum(x > 0.1 for x in g)}


# -- 1. snapshot -------------------------------------------------------------------------------


def bench_snapshot(polls: int, nodes: int) -> None:
    from textual.app import App, ComposeResult
    from textual.widgets import Tree

    from radixtop.probes.radix import RadixProbe
    from radixtop.schema import parse_snapshot
    from radixtop.session.radix_board import RadixBoard
    from radixtop.widgets.radix import RadixPane

    work = Path(tempfile.mkdtemp(prefix="radixtop-panes-bench-"))
    files = []
    for seed in (1, 2):
        path = work / f"snap{seed}.json"
        path.write_bytes(big_snapshot_bytes(nodes, seed))
        files.append(str(path))
    size_mb = Path(files[0]).stat().st_size / 1e6
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), *files], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    url = f"http://127.0.0.1:{port}"

    class Bench(App):
        def compose(self) -> ComposeResult:
            yield RadixPane(id="radix")

    async def ours() -> dict:
        app = Bench()
        out: dict = {"poll_s": [], "show_ms": []}
        async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
            pane = app.query_one(RadixPane)
            board = RadixBoard()
            probe = RadixProbe(url, budget=nodes, timeout_s=60)
            monitor = LagMonitor()
            monitor.start()
            for _ in range(polls):
                t0 = time.perf_counter()
                sample = await probe.poll()
                out["poll_s"].append(time.perf_counter() - t0)
                assert sample.status.ok, sample.status
                board.add(sample)
                t1 = time.perf_counter()
                pane.show(board)
                out["show_ms"].append((time.perf_counter() - t1) * 1000)
                await pilot.pause(0.3)  # frames drawn meanwhile
            out["lag"] = await monitor.stop()
            out["rows_listed"] = len(pane.tree_view.rows)
            await probe.aclose()
        return out

    async def peer() -> dict:
        snap = parse_snapshot(Path(files[0]).read_bytes())
        nodes_ = snap.tree.nodes

        class PeerApp(App):
            def compose(self) -> ComposeResult:
                yield Tree("root", id="tree")

        app = PeerApp()
        out: dict = {}
        async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
            tree = app.query_one(Tree)
            monitor = LagMonitor()
            monitor.start()
            await pilot.pause(0.1)
            t0 = time.perf_counter()
            handles = [tree.root]
            for node in nodes_[1:]:
                handles.append(handles[node.parent].add(f"#{node.id} {node.tokens} tok lock {node.lock_ref}"))
            tree.root.expand()
            out["build_ms"] = (time.perf_counter() - t0) * 1000
            await pilot.pause(0.5)
            out["lag"] = await monitor.stop()
        return out

    try:
        got = asyncio.run(ours())
        print(f"\nsnapshot: {nodes:,} nodes, {size_mb:.1f} MB of JSON, {polls} polls (each a new tree)")
        print(f"  radixtop  poll (fetch+parse+index) median {statistics.median(got['poll_s']):.2f} s, "
              f"show() median {statistics.median(got['show_ms']):.1f} ms, rows listed {got['rows_listed']}")
        lag = got["lag"]
        print(f"  radixtop  UI loop stall max {lag['max_ms']:.0f} ms, p99 {lag['p99_ms']:.0f} ms, "
              f"{lag['over_100ms']} over 100 ms; RSS {psutil.Process().memory_info().rss / 2**20:.0f} MiB")
        p = asyncio.run(peer())
        print(f"  peer: textual Tree filled with every node on the UI loop: {p['build_ms']:.0f} ms to build, "
              f"stall max {p['lag']['max_ms']:.0f} ms")
        row(f"{nodes:,}-node snapshot: longest UI stall", f"{lag['max_ms']:.0f} ms (p99 {lag['p99_ms']:.0f} ms)",
            f"Textual `Tree` with every node: {p['build_ms']:,.0f} ms", "no stall over 100 ms", lag["over_100ms"] == 0)
    finally:
        server.kill()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)


# -- 2. polling --------------------------------------------------------------------------------


def start_demo_sim(
    work: Path, with_load: bool = True, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, subprocess.Popen | None, str, Path]:
    from radixtop.demo import SIM_FLAGS
    from radixtop.sim.cli import sim_argv

    ready = work / "sim.port"
    log = work / "sim.log"
    sim = subprocess.Popen(sim_argv(*SIM_FLAGS, *extra, ready_file=ready, log_file=log), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text().strip()):
        if time.monotonic() > deadline or sim.poll() is not None:
            raise SystemExit("the simulator did not start")
        time.sleep(0.05)
    url = f"http://127.0.0.1:{int(ready.read_text())}"
    load = None
    if with_load:
        load = subprocess.Popen([sys.executable, "-m", "radixtop.incident.replay.load", "--url", url],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return sim, load, url, log


def stop_all(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def bench_polling(seconds: float, nvitop: str | None) -> None:
    from radixtop.session.live import LiveSources, LiveState, resolve_targets

    work = Path(tempfile.mkdtemp(prefix="radixtop-panes-bench-"))
    sim, load, url, _ = start_demo_sim(work)
    try:

        async def run() -> tuple[float, float, LiveState]:
            targets = await resolve_targets(url=url)
            state = LiveState()
            sources = LiveSources(targets, state)
            task = asyncio.create_task(sources.run())
            await asyncio.sleep(3)  # warm up: first contact, imports, /server_info
            cpu0, t0 = time.process_time(), time.monotonic()
            await asyncio.sleep(seconds)
            cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            return cpu, wall, state

        cpu, wall, state = asyncio.run(run())
        sources = ", ".join(f"{label} {st.state}" for label, st in state.sources())
        print(f"\npolling: every live source at its default rate for {wall:.0f} s against the simulator under load")
        print(f"  radixtop probes: {100 * cpu / wall:.2f} % of one core, "
              f"RSS {psutil.Process().memory_info().rss / 2**20:.0f} MiB ({sources})")
        row("panes: polling every source, % of one core", f"{100 * cpu / wall:.2f} %",
            "nvitop: " + ("not run (no NVML here)" if nvitop is None else "see the report"), "3 %",
            100 * cpu / wall <= 3)
        if nvitop is None:
            print("  peer nvitop: not run (pass --nvitop PATH to an nvitop in a throwaway venv)")
        else:
            print("  peer nvitop: " + run_nvitop(nvitop, seconds))
    finally:
        stop_all(*(p for p in (load, sim) if p is not None))
        shutil.rmtree(work, ignore_errors=True)


def run_nvitop(path: str, seconds: float) -> str:
    probe = subprocess.run([path, "--once"], capture_output=True, text=True, timeout=60, check=False)
    if probe.returncode != 0:
        lines = (probe.stderr or probe.stdout).strip().splitlines() or ["?"]
        why = next((line for line in lines if "ERROR" in line), lines[-1])
        return f"cannot run here ({why.strip()[:100]})"
    tmux = Tmux([path])
    try:
        tmux.start()
        time.sleep(3)
        proc = psutil.Process(tmux.pid())
        c0 = sum(proc.cpu_times()[:2])
        time.sleep(seconds)
        c1 = sum(proc.cpu_times()[:2])
        return f"{100 * (c1 - c0) / seconds:.2f} % of one core, RSS {proc.memory_info().rss / 2**20:.0f} MiB"
    finally:
        tmux.kill()


# -- 3. the app --------------------------------------------------------------------------------


class Tmux:
    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        self.socket = f"radixtop-bench-{uuid.uuid4().hex[:8]}"
        self.command = command
        self.env = env

    def run(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True, timeout=10
        ).stdout

    def start(self) -> float:
        line = f"cd {shlex.quote(str(ROOT))} && exec " + " ".join(shlex.quote(part) for part in self.command)
        # The tmux server takes our environment: a COLUMNS/LINES from a parent would fix Textual's size.
        env = {k: v for k, v in (self.env or os.environ).items() if k not in ("COLUMNS", "LINES")}
        t0 = time.monotonic()
        subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", "new-session", "-d", "-s", "bench", "-x",
                        str(WIDTH), "-y", str(HEIGHT), line], check=True, env=env, timeout=10)
        return t0

    def pid(self) -> int:
        return int(self.run("display-message", "-p", "-t", "bench", "#{pane_pid}").strip())

    def capture(self) -> str:
        try:
            return self.run("capture-pane", "-p", "-t", "bench")
        except subprocess.CalledProcessError:
            raise SystemExit(f"the command in tmux exited: {' '.join(self.command)}") from None

    def kill(self) -> None:
        kill_server(self.socket)


def sglang_lines(n: int, start: int = 0) -> list[str]:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    out = []
    for i in range(start, start + n):
        if i % 3:
            out.append(f"[{stamp} TP0] Decode batch, #running-req: {i % 32}, #token: {i % 4096}, "
                       f"token usage: 0.{i % 100:02d}, "
                       f"cuda graph: True, gen throughput (token/s): 812.4, #queue-req: {i % 7}, ")
        else:
            out.append(f'[{stamp}] INFO:     127.0.0.1:{40000 + i % 20000} - "POST /generate HTTP/1.1" 200 OK')
    return out


def _steady(tmux: Tmux, seconds: float) -> tuple[float, int]:
    proc = psutil.Process(tmux.pid())
    c0 = sum(proc.cpu_times()[:2])
    time.sleep(seconds)
    c1 = sum(proc.cpu_times()[:2])
    return 100 * (c1 - c0) / seconds, proc.memory_info().rss


def _first_frame(tmux: Tmux, t0: float, needles: tuple[str, ...]) -> float | None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        screen = tmux.capture()
        if all(n in screen for n in needles):
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


SCENES = {
    "quiet": ("idle sim, quiet log", False, ("--log-level", "warning")),
    "idle": ("idle sim", False, ()),
    "workload": ("workload", True, ()),
}


def bench_app(seconds: float, lines: int, scenes: list[str] | None = None) -> None:
    """radixtop with every pane, and the log pane alone (RADIXTOP_PANES=0) as the in-run baseline,
    against the simulator idle (the log quiet: what watching costs) and under the demo workload.
    First frame: the status line on screen (the log pane's first frame, both runs); panes: the
    radix and vitals panes on screen too (they are mounted after the first frame)."""
    print(f"\napp: radixtop --log SIM_LOG in tmux {WIDTH}x{HEIGHT} (discovery attaches to the simulator writing it)")
    for scene, loaded, extra in (SCENES[name] for name in (scenes or list(SCENES))):
        figures: dict[bool, tuple[float, float | None]] = {}  # every pane? -> (CPU %, first frame s)
        work = Path(tempfile.mkdtemp(prefix="radixtop-panes-bench-"))
        sim, load, _, log = start_demo_sim(work, with_load=loaded, extra=extra)
        try:
            for panes in (True, False):
                env = dict(os.environ, RADIXTOP_PANES="1" if panes else "0")
                # --log alone: discovery finds the server writing that log (works whether or not this
                # radixtop's parser has --url yet).
                tmux = Tmux([sys.executable, "-m", "radixtop", "--log", str(log)], env=env)
                try:
                    t0 = tmux.start()
                    first = _first_frame(tmux, t0, ("FOLLOW",))
                    shown = _first_frame(tmux, t0, ("Radix cache", "Vital signs")) if panes else None
                    attached = _first_frame(tmux, t0, ("Radix cache", "Vital signs", "server ok")) if panes else None
                    time.sleep(3)
                    cpu, rss = _steady(tmux, seconds)
                    what = "every pane" if panes else "log pane alone"
                    ff = f"{first * 1000:.0f} ms" if first else "never"
                    at = f", panes {shown * 1000:.0f} ms" if shown else ""
                    at += f", attached (server ok) {attached * 1000:.0f} ms" if attached else ""
                    print(f"  {scene:19} {what:15} first frame {ff}{at}; {cpu:.1f} % of one core over {seconds:.0f} s, "
                          f"RSS {rss / 2**20:.0f} MiB")
                    figures[panes] = (cpu, first)
                    if loaded and lines:
                        _million(tmux, log, lines, what)
                finally:
                    tmux.kill()
        finally:
            stop_all(*(p for p in (load, sim) if p is not None))
            shutil.rmtree(work, ignore_errors=True)
        if len(figures) == 2:
            (cpu, first), (alone, first_alone) = figures[True], figures[False]
            row(f"panes: app CPU, {scene}", f"{cpu:.1f} %", f"log pane alone: {alone:.1f} %", "3 %", cpu <= 3)
            if first is not None and first_alone is not None:
                row(f"first frame (status line on screen), {scene}", f"{first * 1000:.0f} ms",
                    f"log pane alone: {first_alone * 1000:.0f} ms", "within 1 s", first <= 1.0)


def _million(tmux: Tmux, log: Path, lines: int, what: str) -> None:
    proc = psutil.Process(tmux.pid())
    t1 = time.monotonic()
    written = 0
    with open(log, "a", encoding="utf-8") as f:
        while written < lines:
            chunk = sglang_lines(min(50_000, lines - written), written)
            f.write("\n".join(chunk) + "\n")
            f.flush()
            written += len(chunk)
    write_s = time.monotonic() - t1
    time.sleep(max(5.0, write_s))
    peak = proc.memory_info().rss
    time.sleep(5)
    print(f"      after {lines:,} more log lines (written in {write_s:.1f} s): RSS {peak / 2**20:.0f} MiB, "
          f"{proc.memory_info().rss / 2**20:.0f} MiB 5 s later")
    row(f"RSS after {lines:,} more log lines, {what}", f"{peak / 2**20:.0f} MiB", "none", "< 150 MiB",
        peak < 150 * 2**20)


def main() -> None:
    compile_tree(ROOT)  # radixtop as installed: its bytecode written (tree_launch.py)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short windows (shared machine)")
    ap.add_argument("--only", choices=("snapshot", "polling", "app"), action="append")
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--nvitop", default=None, metavar="PATH", help="an nvitop executable (throwaway venv)")
    ap.add_argument("--scene", choices=list(SCENES), action="append", help="app scenes to run (default: all)")
    ap.add_argument("--lines", type=int, default=1_000_000,
                    help="log lines appended after the workload scene (0: none)")
    ap.add_argument("--seconds", type=float, default=None, help="CPU window per app run (default 15 quick, 60)")
    args = ap.parse_args()
    parts = args.only or ["snapshot", "polling", "app"]
    print(f"load average at start: {', '.join(f'{x:.1f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs")
    if "polling" in parts:  # first: its RSS figure is this process's, before the big snapshots
        bench_polling(15 if args.quick else 60, args.nvitop)
    if "snapshot" in parts:
        bench_snapshot(3 if args.quick else 10, args.nodes)
    if "app" in parts:
        bench_app(args.seconds or (15 if args.quick else 60), args.lines, args.scene)


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
