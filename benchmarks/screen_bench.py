"""Benchmark what the user sees: radixtop in a real terminal (tmux 160x48) against lnav and tail -f.

    python benchmarks/screen_bench.py --quick     # shared machine: 1 round, 5 s of appending
    python benchmarks/screen_bench.py             # 3 rounds, 10 s of appending

Two measurements, each tool run in its own tmux server (`tmux -L`), the screen read with
`tmux capture-pane -p` in a loop:

1. open: the time from starting the command until the last line of a 100 MB SGLang-format log is
   on screen: radixtop as it starts (its last few thousand lines, findings of the rest scanned in
   the background) and with --from-start (a whole ring's worth of lines in the view); lnav as it
   opens files; tail -f, which prints the last 10 lines. The log is generated once under
   benchmarks/data/ (git-ignored) and read once before timing, so the page cache is warm.
   Target for radixtop: 0.8 s.
   start-up: the same with a one-line file, with a minimal Textual app (one Static showing the
   file) as a peer: the floor any Textual UI starts from on this machine.
2. live: the tool opens a copy of the same 100 MB log (--live-history-mb; 0: a 100-line file)
   and, once its CPU has settled (under 5% of a core for half a second: the open test times what
   comes before), a thread of this script appends SGLang lines at --rate lines/s (default
   50,000) for --seconds, each carrying a sequence number and a timestamp. Each poll of the
   screen finds the newest sequence number on it; its on-screen lag is the time since that line
   was written (taken at the middle of the capture call). The tool's CPU is psutil's user+system
   time of the pane's process, every thread, over the appending window (as `top` shows the
   process), as a share of one core, and second by second. Targets for radixtop: lag median
   under 100 ms and at or under lnav's, at most 15% of one core. Two more peers, run when named
   in --tools: "python floor" and "radixtop pipeline" (benchmarks/floor_pane.py): a bare Python
   pane doing the same reading, splitting and drawing, and the same with radixtop's reader,
   ingest and ring in its place: what the pane costs without radixtop's app around it.
   With --at-first-screen the appending starts as soon as the last line is on screen: the
   window then also holds what the tool still does after its first screen (an engineer who
   opens it while the server floods the log pays that too).

A peer that is not installed is skipped with a note (`apt-get install -y lnav`). The capture
itself costs a few ms per poll and adds to every tool's figure alike.

--baseline DIR adds an earlier radixtop as a tool of its own, in the same run (before/after on a
shared machine): DIR holds that version's tree, e.g.
`mkdir /tmp/before && git archive 1ab9c69 | tar -x -C /tmp/before`. An earlier radixtop that only
shows existing lines with --from-start is timed that way in the open test.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import tree_launch
from bench_rows import row  # benchmarks/ is the script's own directory

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from tmux_helpers import kill_server  # noqa: E402  (tests/, for the tmux servers' end)

DATA = Path(__file__).resolve().parent / "data"
WIDTH, HEIGHT = 160, 48
LAST_MARKER = "BENCH-LAST-LINE-7f3a"
SEQ = re.compile(r"seq=(\d{10})")


# -- the log ---------------------------------------------------------------------------------------


def sglang_line(rng: random.Random, stamp: str) -> str:
    rank = f"TP{rng.randrange(8)}"
    roll = rng.random()
    if roll < 0.55:
        return (
            f"[{stamp} {rank}] Decode batch, #running-req: {rng.randrange(1, 64)}, "
            f"#token: {rng.randrange(10**5, 4 * 10**5)}, token usage: 0.{rng.randrange(10, 99)}, cuda graph: True, "
            f"gen throughput (token/s): {rng.uniform(800, 5000):.2f}, #queue-req: {rng.randrange(16)}"
        )
    if roll < 0.9:
        return (
            f"[{stamp} {rank}] Prefill batch, #new-seq: {rng.randrange(1, 8)}, #new-token: {rng.randrange(64, 8192)}, "
            f"#cached-token: {rng.randrange(0, 4096)}, token usage: 0.{rng.randrange(10, 99)}, "
            f"#running-req: {rng.randrange(64)}, #queue-req: {rng.randrange(16)}, #pending-token: 0, "
            f"cuda graph: False, input throughput (token/s): {rng.uniform(1000, 12000):.2f}"
        )
    if roll < 0.9995:
        return f'[{stamp}] INFO:     127.0.0.1:{rng.randrange(30000, 60000)} - "POST /generate HTTP/1.1" 200 OK'
    return (
        f"[{stamp} {rank}] KV cache pool is full. Retract requests. #retracted_reqs: {rng.randrange(1, 4)}, "
        "#new_token_ratio: 0.4000 -> 0.5000"
    )


def big_log(size_mb: int) -> Path:
    """A size_mb SGLang-format log whose last line carries LAST_MARKER (cached under data/)."""
    DATA.mkdir(exist_ok=True)
    path = DATA / f"screen-{size_mb}mb.log"
    if path.exists() and path.stat().st_size >= size_mb << 20:
        return path
    rng = random.Random(20261202)
    target = size_mb << 20
    written = 0
    t = 0.0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        while written < target:
            chunk = []
            for _ in range(5000):
                t += 0.0007
                stamp = (
                    time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1796212800 + int(t)))
                    + f".{int(t * 1000) % 1000:03d}"
                )
                chunk.append(sglang_line(rng, stamp))
            text = "\n".join(chunk) + "\n"
            f.write(text)
            written += len(text)
        f.write(f"[2026-12-02 23:59:59.999 TP0] {LAST_MARKER} the last line of the log\n")
    tmp.rename(path)
    return path


# -- the terminal ----------------------------------------------------------------------------------


class Tmux:
    """One tmux server of our own (-L), one session running one command as the pane's process."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        self.socket = f"radixtop-bench-{uuid.uuid4().hex[:8]}"
        self.command = command
        self.env = env

    def run(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True, timeout=10
        ).stdout

    def start(self) -> float:
        # exec: the tool itself is the pane's process, so psutil measures it and not a shell.
        line = "exec " + " ".join(shlex.quote(part) for part in self.command)
        t0 = time.monotonic()
        # A neutral working directory: `python -c` puts it first on sys.path, and the tree the
        # launcher names must decide which radixtop runs (this tree, or --baseline's).
        subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", "new-session", "-d", "-s", "bench", "-c", str(DATA / "home"),
             "-x", str(WIDTH), "-y", str(HEIGHT), line],
            check=True,
            env=self.env,
            timeout=10,
        )
        return t0

    def pid(self) -> int:
        return int(self.run("display-message", "-p", "-t", "bench", "#{pane_pid}").strip())

    def capture(self) -> tuple[str, float]:
        """The screen, and the time at the middle of the capture call."""
        before = time.monotonic()
        screen = self.run("capture-pane", "-p", "-t", "bench")
        return screen, (before + time.monotonic()) / 2

    def kill(self) -> None:
        """End the tool and wait (bounded) until it has exited: a tool still closing takes CPU from
        the next round."""
        try:
            pid: int | None = self.pid()
        except (subprocess.SubprocessError, ValueError):
            pid = None
        kill_server(self.socket)
        if pid is not None:
            try:
                psutil.Process(pid).wait(timeout=15)
            except psutil.NoSuchProcess:
                pass
            except psutil.TimeoutExpired:
                print(f"  (pid {pid} still running 15 s after its terminal closed)", file=sys.stderr)
        # tmux leaves its socket file behind: remove ours, so runs do not pile them up.
        tmpdir = os.environ.get("TMUX_TMPDIR", "/tmp")
        Path(tmpdir, f"tmux-{os.getuid()}", self.socket).unlink(missing_ok=True)


def tools(with_lnav: bool, baseline: str | None = None) -> dict[str, tuple[list[str] | None, list[str] | None]]:
    """name -> (command for the open test, command for the live test); the file is appended.
    None: the tool is not run in that test."""
    out: dict[str, tuple[list[str] | None, list[str] | None]] = {
        "radixtop": (tree_launch.command(ROOT, "--log"), tree_launch.command(ROOT, "--log")),
        "radixtop --from-start": (tree_launch.command(ROOT, "--from-start", "--log"), None),
    }
    if baseline:
        out["baseline --from-start"] = (tree_launch.command(Path(baseline), "--from-start", "--log"), None)
        out["baseline"] = (None, tree_launch.command(Path(baseline), "--log"))
    out["tail -f"] = (["tail", "-f"], ["tail", "-f"])
    # The floor of a log pane in Python, and radixtop's pipeline on it without its app (floor_pane.py).
    floor = [sys.executable, str(Path(__file__).resolve().parent / "floor_pane.py")]
    out["python floor"] = (None, floor)
    out["radixtop pipeline"] = (None, [*floor, "--parts", "pipeline"])
    if with_lnav:
        out["lnav"] = (["lnav"], ["lnav"])
    return out


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TMUX")}
    env["HOME"] = str(DATA / "home")  # lnav keeps state in ~/.lnav: start it fresh and out of the way
    (DATA / "home").mkdir(parents=True, exist_ok=True)
    return env


# -- 1. open ---------------------------------------------------------------------------------------

# The smallest Textual app that shows a file: what starting Textual costs here, whatever the app.
MINIMAL_TEXTUAL_APP = (
    "import sys\n"
    "from textual.app import App\n"
    "from textual.widgets import Static\n"
    "class Show(App):\n"
    "    def compose(self):\n"
    "        yield Static(open(sys.argv[1], encoding='utf-8').read())\n"
    "Show().run()\n"
)


def one_line_log() -> Path:
    path = DATA / "startup-1line.log"
    path.write_text(f"[2026-12-02 23:59:59.999 TP0] {LAST_MARKER} the only line\n", encoding="utf-8")
    return path


def time_to_last_line(command: list[str], path: Path, timeout: float) -> float | None:
    tmux = Tmux([*command, str(path)], environment())
    try:
        t0 = tmux.start()
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            screen, at = tmux.capture()
            if LAST_MARKER in screen:
                return at - t0
            time.sleep(0.01)
        return None
    finally:
        tmux.kill()


# -- 2. live ---------------------------------------------------------------------------------------


@dataclass
class Writer:
    path: Path
    rate: int
    seconds: float
    times: list[float] = field(default_factory=list)  # time of each chunk's write
    firsts: list[int] = field(default_factory=list)  # first seq of each chunk
    written: int = 0

    def run(self) -> None:
        rng = random.Random(7)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            start = time.monotonic()
            while True:
                now = time.monotonic()
                if now - start >= self.seconds:
                    break
                due = int((now - start) * self.rate) - self.written
                if due > 0:
                    stamp = time.strftime("%Y-%m-%d %H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
                    lines = []
                    for i in range(self.written, self.written + due):
                        # The sequence number comes first: every tool shows the start of a line.
                        lines.append(f"[{stamp} TP{i % 8}] seq={i:010d} " + sglang_line(rng, stamp).split("] ", 1)[1])
                    data = ("\n".join(lines) + "\n").encode()
                    self.firsts.append(self.written)
                    self.times.append(time.monotonic())
                    os.write(fd, data)
                    self.written += due
                time.sleep(0.005)
        finally:
            os.close(fd)

    def written_at(self, seq: int) -> float:
        return self.times[bisect_right(self.firsts, seq) - 1]


@dataclass
class Live:
    lags: list[float]
    cpu: float  # share of one core over the appending window
    cpu_seconds: float  # CPU seconds of the tool's process over the appending window
    written: int  # lines the writer wrote (fewer than rate x seconds if it could not keep up)
    drain: float | None  # after the last write, until the last line is on screen
    rss_mb: float
    threads: dict[str, float] = field(default_factory=dict)  # share of a core per thread
    per_second: list[float] = field(default_factory=list)  # share of a core, second by second
    settled: float | None = None  # seconds from the first screen until the CPU settled


def settle(proc: psutil.Process, timeout: float = 60.0) -> float | None:
    """Wait until the process uses under 5% of a core over half a second; the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        before = proc.cpu_times()
        time.sleep(0.5)
        after = proc.cpu_times()
        if (after.user - before.user) + (after.system - before.system) < 0.025:
            return time.monotonic() - t0
    return None


def live(
    command: list[str], workdir: Path, rate: int, seconds: float, ready: str | None, history: Path | None,
    settle_first: bool = True,
) -> Live | None:
    path = workdir / f"live-{uuid.uuid4().hex[:6]}.log"
    if history is not None:
        shutil.copyfile(history, path)
    else:
        path.write_text(
            "".join(f"[2026-12-02 00:00:00.000 TP0] warm-up line {i}\n" for i in range(100)), encoding="utf-8"
        )
    with open(path, "rb") as f:  # warm the page cache
        while f.read(16 << 20):
            pass
    tmux = Tmux([*command, str(path)], environment())
    try:
        tmux.start()
        deadline = time.monotonic() + 30
        while True:
            screen, _ = tmux.capture()
            if (ready or ("the last line of the log" if history else "warm-up line 99")) in screen:
                break
            if time.monotonic() > deadline:
                print(f"  {command[0]}: not ready after 30 s; skipped")
                return None
            time.sleep(0.05)
        proc = psutil.Process(tmux.pid())
        settled = settle(proc) if settle_first else None
        if settle_first and settled is None:
            print(f"  {command[0]}: still busy 60 s after start; measured anyway")
        writer = Writer(path, rate, seconds)
        thread = threading.Thread(target=writer.run, daemon=True)
        cpu0 = proc.cpu_times()
        threads0 = {t.id: t.user_time + t.system_time for t in proc.threads()}
        t0 = time.monotonic()
        thread.start()
        lags = []
        per_second: list[float] = []
        mark, cpu_mark = t0, cpu0
        while thread.is_alive():
            screen, at = tmux.capture()
            seqs = [int(m) for m in SEQ.findall(screen)]
            if seqs and at - t0 > 1.0:  # skip the first second: let every tool settle
                lags.append(at - writer.written_at(max(seqs)))
            if time.monotonic() - mark >= 1.0:
                now, cpu_now = time.monotonic(), proc.cpu_times()
                per_second.append(((cpu_now.user - cpu_mark.user) + (cpu_now.system - cpu_mark.system)) / (now - mark))
                mark, cpu_mark = now, cpu_now
            time.sleep(0.02)
        cpu1 = proc.cpu_times()
        wall = time.monotonic() - t0
        threads = {}
        for t in proc.threads():
            share = (t.user_time + t.system_time - threads0.get(t.id, 0.0)) / wall
            if share >= 0.01:
                threads[thread_name(proc.pid, t.id)] = threads.get(thread_name(proc.pid, t.id), 0.0) + share
        cpu_seconds = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        cpu = cpu_seconds / wall
        end = time.monotonic()
        last = writer.written - 1
        drain = None
        while time.monotonic() - end < 30:
            screen, at = tmux.capture()
            if f"seq={last:010d}" in screen:
                drain = at - end
                break
            time.sleep(0.02)
        rss = proc.memory_info().rss / 2**20
        return Live(lags, cpu, cpu_seconds, writer.written, drain, rss, threads, per_second, settled)
    finally:
        tmux.kill()
        path.unlink(missing_ok=True)


def thread_name(pid: int, tid: int) -> str:
    try:
        name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return str(tid)
    return "main" if tid == pid else name


def ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1000:,.0f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--rate", type=int, default=50_000, help="lines/s appended in the live test")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to append")
    parser.add_argument(
        "--live-history-mb", type=int, default=100,
        help="the live test's file starts as a copy of the big log (0: 100 lines)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 round, 5 s of appending (shared machine)")
    parser.add_argument("--only", choices=["open", "startup", "live"], default=None)
    parser.add_argument("--tools", default="radixtop,baseline,lnav,tail -f", help="comma-separated subset to run")
    parser.add_argument("--baseline", metavar="DIR", help="an earlier radixtop tree to run beside this one")
    parser.add_argument(
        "--at-first-screen", action="store_true",
        help="live test: start appending as soon as the last line is on screen, not once the tool has "
             "settled (its CPU then holds what it still does after its first screen)",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, min(args.seconds, 5.0)
    if shutil.which("tmux") is None:
        print("tmux is not installed: apt-get install -y tmux")
        return 1
    with_lnav = shutil.which("lnav") is not None
    if not with_lnav:
        print("note: lnav is not installed (apt-get install -y lnav); its rows are skipped")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; terminal {WIDTH}x{HEIGHT} in tmux")
    for tree in [ROOT, *([Path(args.baseline)] if args.baseline else [])]:
        tree_launch.compile_tree(tree)  # as installed (tree_launch.py)
        runs = tree_launch.package_dir(tree)
        if runs != (tree / "radixtop").resolve():
            sys.exit(f"error: the launcher runs {runs}, not {tree / 'radixtop'}; see benchmarks/tree_launch.py")

    opened: dict[str, float | None] = {}
    started: dict[str, float | None] = {}
    lived: dict[str, list[tuple[float, float]]] = {}  # tool -> (lag median, CPU share) per round
    if args.only in (None, "open"):
        path = big_log(args.size_mb)
        with open(path, "rb") as f:  # warm the page cache
            while f.read(16 << 20):
                pass
        size = path.stat().st_size / 2**20
        print(f"\n1. open: {path.name} ({size:.0f} MiB) until its last line is on screen")
        for name, (command, _) in tools(with_lnav, args.baseline).items():
            if command is None or name.split(" --")[0] not in args.tools.split(","):
                continue
            times = [time_to_last_line(command, path, timeout=60) for _ in range(args.rounds)]
            shown = ", ".join(ms(t) for t in times)
            best = min((t for t in times if t is not None), default=None)
            opened[name] = best
            print(f"  {name:22} best {ms(best):>9}   (runs: {shown})")
        if opened.get("radixtop") is not None:
            peers = "; ".join(
                f"{n}: {ms(t)}" for n, t in opened.items() if not n.startswith("radixtop") and t is not None
            )
            row(f"open a {args.size_mb} MB log, last line on screen (best of {args.rounds})", ms(opened["radixtop"]),
                peers or "none run", "0.8 s", opened["radixtop"] <= 0.8)

    if args.only in (None, "startup"):
        path = one_line_log()
        print("\n   start-up: a one-line file until that line is on screen")
        startup = {name: command for name, (command, _) in tools(with_lnav, args.baseline).items() if command}
        startup["minimal Textual app"] = [sys.executable, "-c", MINIMAL_TEXTUAL_APP]
        chosen = {name: command for name, command in startup.items()
                  if name == "minimal Textual app" or name.split(" --")[0] in args.tools.split(",")}
        # Round by round, every tool in turn: this machine's slow spells (its page cache is
        # reclaimed between runs) then fall on every tool alike.
        runs: dict[str, list[float | None]] = {name: [] for name in chosen}
        for _ in range(args.rounds):
            for name, command in chosen.items():
                runs[name].append(time_to_last_line(command, path, timeout=60))
        medians: dict[str, float | None] = {}
        for name, times in runs.items():
            done = [t for t in times if t is not None]
            started[name] = min(done, default=None)
            medians[name] = statistics.median(done) if done else None
            print(f"  {name:22} best {ms(started[name]):>9}   median {ms(medians[name]):>9}   "
                  f"(runs: {', '.join(ms(t) for t in times)})")
        mine = started.get("radixtop")
        if mine is not None:
            peers = "; ".join(
                f"{n}: {ms(t)} (median {ms(medians[n])})" for n, t in started.items()
                if not n.startswith("radixtop") and t is not None
            )
            row(f"TUI start-up, one-line file on screen (best of {args.rounds}, rounds interleaved)",
                f"{ms(mine)} (median {ms(medians['radixtop'])})", peers, "300 ms", mine <= 0.3)

    if args.only in (None, "live"):
        history = big_log(args.live_history_mb) if args.live_history_mb else None
        start = f"a copy of {history.name}" if history else "a 100-line file"
        print(f"\n2. live: {start}, then appending {args.rate:,} lines/s for {args.seconds:g} s")
        workdir = DATA
        chosen = [(name, command) for name, (_, command) in tools(with_lnav, args.baseline).items()
                  if command is not None and name in args.tools.split(",")]
        # Round by round, each tool in turn (as the start-up test): the machine drifts over minutes,
        # and one tool's rounds all together would take its drift for the tool's difference.
        for _ in range(args.rounds):
            for name, command in chosen:
                ready = "FOLLOW" if name in ("radixtop", "baseline") else None
                result = live(command, workdir, args.rate, args.seconds, ready, history,
                              settle_first=not args.at_first_screen)
                if result is None:
                    continue
                lags = sorted(result.lags)
                if lags:
                    med = statistics.median(lags)
                    p95 = lags[min(len(lags) - 1, int(len(lags) * 0.95))]
                else:
                    med = p95 = None
                if med is not None:
                    lived.setdefault(name, []).append((med, result.cpu))
                print(
                    f"  {name:10} on-screen lag median {ms(med):>8}  p95 {ms(p95):>8}  "
                    f"({len(lags)} polls)  CPU {result.cpu * 100:5.1f}% of a core "
                    f"({result.cpu_seconds / max(result.written, 1) * 1e6:.1f} us/line, "
                    f"{result.written / args.seconds:,.0f} lines/s written)  "
                    f"last line {ms(result.drain)} after the writer stopped  RSS {result.rss_mb:.0f} MiB"
                )
                seconds = ", ".join(f"{x * 100:.0f}" for x in result.per_second)
                if args.at_first_screen:
                    settled = "appending from the first screen"
                elif result.settled is None:
                    settled = "not settled"
                else:
                    settled = f"settled {result.settled:.1f} s after the first screen"

                print(f"  {'':10} CPU % second by second: {seconds}  ({settled})")
                if len(result.threads) > 1:
                    parts = ", ".join(
                        f"{k} {v * 100:.0f}%" for k, v in sorted(result.threads.items(), key=lambda kv: -kv[1])
                    )
                    print(f"  {'':10} CPU by thread: {parts}")
        ours = lived.get("radixtop")
        if ours:
            peers = {n: r for n, r in lived.items() if n != "radixtop"}
            what = f"log pane at {args.rate // 1000}k lines/s after opening {args.live_history_mb} MB"
            if args.at_first_screen:
                what += ", appending from the first screen"
            row(f"{what}: on-screen lag median", " / ".join(f"{lag * 1000:.0f} ms" for lag, _ in ours),
                "; ".join(f"{n}: " + " / ".join(f"{lag * 1000:.0f} ms" for lag, _ in r) for n, r in peers.items()),
                "< 100 ms", max(lag for lag, _ in ours) < 0.1)
            row(f"{what}: CPU of the whole process, % of one core", " / ".join(f"{cpu * 100:.1f} %" for _, cpu in ours),
                "; ".join(f"{n}: " + " / ".join(f"{cpu * 100:.1f} %" for _, cpu in r) for n, r in peers.items()),
                "<= 15 %", max(cpu for _, cpu in ours) <= 0.15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
