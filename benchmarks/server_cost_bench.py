"""What watching costs a real SGLang server, and what radixtop itself costs the node.

A real SGLang 0.5.23 server on this CPU (the tests' recipe, from the environment that
`.ci/sglang-tests --build-only` builds, found as the tests find it), two of them up at once: one
plain (the peer), one with radixtop's instrument (`RADIXTOP_INSTRUMENT=1`), on the Rust radix core
and, with `--core python`, SGLang's Python core too.

Both servers keep to the last CPU (one torch thread each); the load, radixtop and the peer keep
to the others, as on a GPU node the server's cores are its own: the instrument's cost is then what
it adds inside the server's process, not two processes contending for a core. Each server's
collector is frozen once it has started (`start_frozen`): SGLang's own freeze races its HTTP
server's bind under --skip-server-warmup and is refused at random, and a server left unfrozen is
4 % slower whatever it runs.

1. **The instrument's cost where it runs.** Each round sends the same closed-loop load to four
   arms in turn: the plain server; the instrumented one with nobody watching; the instrumented
   one while radixtop watches it (in tmux, 160x48, every pane, `radixtop --url URL --log LOG`,
   started once and stopped with SIGSTOP outside its arm, so that it polls only in it); the plain
   server again, the A/A control that shows what the method reads when nothing differs. The load:
   `--concurrency` workers sending shared-prefix prompts (8 groups of a 64-token system prompt and
   a 64-token question, ids inside the model's vocabulary) for 64 new tokens at temperature 0 with
   `ignore_eos`, for `--seconds`. Every arm starts from an empty cache (POST /flush_cache): each
   round's prompts are the same in every arm, and a server's second arm would otherwise find its
   first arm's prompts cached. The arms go in turn forward in odd rounds and backward in even ones:
   the machine drifts within a round (the same server, a few seconds later, 10 % slower or faster),
   and a fixed order would put that drift on the arms that come last. Each arm is compared with the
   same round's plain server (a drift across rounds falls on both): generated tokens/s, the
   server's CPU seconds (every process) per generated token, and the p99 of a call's latency;
   medians over the rounds.
   With `--switch`, one instrumented server per core and its instrument switched inside the
   process (`benchmarks/instrument_switch/sitecustomize.py`, on the server's PYTHONPATH, takes
   the hooks, the endpoint and the census off at the scheduler's safe point and puts them back):
   arms off, on, off again (the A/A control), so that no two server processes are compared.
   `--fresh --switch` starts every server of a round with the plugin and the switch, the plain
   ones switched off before attaching: processes that differ only in the instrument's work.
   `--switch --spy` also has py-spy sample the scheduler (100 Hz, without pausing it) in every
   arm and counts the samples in the instrument's own code: its cost in the scheduler measured
   directly, where the throughput of 10 s arms moves by 10 % or more round to round.
2. **radixtop's footprint.** The same radixtop, the server idle, for `--idle-seconds`: CPU of the
   radixtop process (every thread, user+system, as `top` shows it) and its RSS. Peer in the same
   window: `top -d 1` in a tmux of the same size (the monitor one runs on a node anyway).

Targets: the instrumented server, watched or not, within 2 % of the plain one in tokens/s and CPU
per token (the median over the rounds), with the noise shown: the 95 % bootstrap interval of that
median, which must reach no higher than the A/A control's (as far as the rounds can tell, no cost
at all); radixtop at most 3 % of a core idle.

    python benchmarks/server_cost_bench.py --quick
    python benchmarks/server_cost_bench.py --core both       # 8 rounds of 10 s per arm, about 25 min
    python benchmarks/server_cost_bench.py --core python --switch --rounds 12
    python benchmarks/server_cost_bench.py --core python --fresh --switch    # about 28 min
    python benchmarks/server_cost_bench.py --core python --switch --rounds 20 --spy   # about 14 min
    python benchmarks/server_cost_bench.py --core both --footprint-only --idle-seconds 120
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench_rows import row  # noqa: E402  (benchmarks/ is the script's own directory)
from tmux_helpers import kill_server  # noqa: E402  (tests/, for the tmux servers' end)
from tree_launch import compile_tree  # noqa: E402  (benchmarks/)

WIDTH, HEIGHT = 160, 48
GROUPS, SYSTEM_LEN, QUESTION_LEN, NEW_TOKENS = 8, 64, 64, 64
VOCAB_LOW, VOCAB_HIGH = 10, 2000  # inside the tiny model's vocabulary (the tests' range)
SETTLE_PCT, SETTLE_S, SETTLE_TIMEOUT_S = 5.0, 1.0, 60.0


@dataclass
class Round:
    tokens_per_s: float
    p99_ms: float
    calls: int
    cpu_ms_per_token: float  # every process of the server, user+system


def server_cpu(server) -> float:  # noqa: ANN001 (tests/real_sglang.RealServer)
    total = 0.0
    for proc in server.tree():
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


async def _load(url: str, concurrency: int, seconds: float, seed: int) -> tuple[float, list[float], int]:
    rnd = random.Random(seed)
    systems = [[rnd.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(SYSTEM_LEN)] for _ in range(GROUPS)]
    latencies: list[float] = []
    tokens = 0
    deadline = time.monotonic() + seconds

    async def worker(client: httpx.AsyncClient, w: int) -> None:
        nonlocal tokens
        mine = random.Random(seed * 1000 + w)
        while time.monotonic() < deadline:
            ids = systems[mine.randrange(GROUPS)] + [mine.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(QUESTION_LEN)]
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0,
                                                          "ignore_eos": True}}
            began = time.monotonic()
            r = await client.post(f"{url}/generate", json=body)
            r.raise_for_status()
            latencies.append(time.monotonic() - began)
            tokens += int(r.json()["meta_info"]["completion_tokens"])

    began = time.monotonic()
    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(worker(client, w) for w in range(concurrency)))
    return time.monotonic() - began, latencies, tokens


def load(server, concurrency: int, seconds: float, seed: int) -> Round:  # noqa: ANN001
    httpx.post(f"{server.url}/flush_cache", timeout=30).raise_for_status()
    cpu0 = server_cpu(server)
    wall, latencies, tokens = asyncio.run(_load(server.url, concurrency, seconds, seed))
    cpu = server_cpu(server) - cpu0
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    return Round(tokens / wall, p99 * 1000.0, len(latencies), cpu * 1000.0 / max(1, tokens))


class Watcher:
    """A command in a tmux server of its own at WIDTH x HEIGHT; its pane's process is measured."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.socket = f"radixtop-bench-{random.randrange(1 << 30):x}"
        line = f"cd {shlex.quote(str(cwd))} && exec " + " ".join(shlex.quote(a) for a in argv)
        self._tmux("-f", "/dev/null", "new-session", "-d", "-s", "b", "-x", str(WIDTH), "-y", str(HEIGHT), line)
        self.proc = psutil.Process(int(self._tmux("display", "-p", "-t", "b", "#{pane_pid}").strip()))

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True,
                              timeout=10).stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "b")

    def cpu(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system

    def settle(self) -> float:
        """Seconds until the process's CPU stays under SETTLE_PCT of a core for SETTLE_S."""
        began = time.monotonic()
        while time.monotonic() - began < SETTLE_TIMEOUT_S:
            c0 = self.cpu()
            time.sleep(SETTLE_S)
            if (self.cpu() - c0) / SETTLE_S * 100.0 < SETTLE_PCT:
                return time.monotonic() - began
        raise SystemExit(f"{self.proc.cmdline()[:3]} did not settle within {SETTLE_TIMEOUT_S:.0f} s")

    def share(self, seconds: float) -> float:
        """Per cent of one core over the next ``seconds``."""
        c0, t0 = self.cpu(), time.monotonic()
        time.sleep(seconds)
        return (self.cpu() - c0) / (time.monotonic() - t0) * 100.0

    def pause(self) -> None:
        """SIGSTOP: it polls nothing until resumed (its screen stays)."""
        self.proc.suspend()

    def resume(self) -> None:
        self.proc.resume()

    def stop(self) -> None:
        with contextlib.suppress(psutil.Error):
            self.proc.resume()
        kill_server(self.socket)


# What says radixtop reads every source: its status line, or where a first finding takes that
# room (a warning at start-up), its panes.
WATCHING = (("server ok", "r0 ok", "procs ok"), ("Vital signs  from /metrics", "snapshot #", "alive  ok"))


def radixtop_watching(server, workdir: Path) -> Watcher:  # noqa: ANN001 (tests/real_sglang.RealServer)
    watcher = Watcher([sys.executable, "-m", "radixtop", "--url", server.url, "--log", str(server.log)], workdir)
    deadline = time.monotonic() + 60
    while not any(all(w in watcher.screen() for w in words) for words in WATCHING):
        if time.monotonic() > deadline:
            screen = watcher.screen()
            watcher.stop()
            raise SystemExit(f"radixtop found no server, debug endpoint or processes in 60 s:\n{screen}")
        time.sleep(0.2)
    watcher.settle()
    return watcher


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} (min {min(values):,.1f}, max {max(values):,.1f})"


def median_interval(values: list[float], resamples: int = 4000) -> tuple[float, float]:
    """The 95 % bootstrap interval of the median: how far the rounds' noise lets it move."""
    rnd = random.Random(0)
    medians = sorted(statistics.median(rnd.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


@contextlib.contextmanager
def on_server_cpu():  # noqa: ANN201
    """Servers started inside keep to the last CPU (a process inherits its parent's affinity); this
    process, its load and radixtop then keep to the other CPUs, as a node's GPUs leave a server its
    own cores."""
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus, other_cpus = ({cpus[-1]}, set(cpus[:-1])) if len(cpus) > 1 else (set(cpus), set(cpus))
    os.sched_setaffinity(0, server_cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, other_cpus)


def start_frozen(workdir: Path, **kwargs: Any) -> Any:
    """start_server, then what SGLang's start-up means to do once warmed up: POST /freeze_gc, which
    takes the objects of its start-up out of the collector's sight in every process. With
    --skip-server-warmup (the tests' recipe) SGLang's own call races its HTTP server's bind and is
    often refused ("post-warmup freeze_gc failed": 5 of 6 starts, plain and instrumented alike, in
    one check). A server left so walks some 700,000 objects at every full collection, about 4 % of
    a Python-core scheduler's CPU under this load: more than the instrument could cost, and down to
    chance for each server started."""
    from real_sglang import start_server

    server = start_server(workdir, **kwargs)
    refused = "post-warmup freeze_gc failed" in server.text()
    try:
        httpx.post(f"{server.url}/freeze_gc", timeout=30).raise_for_status()
    except BaseException:
        server.stop()
        raise
    note = " (SGLang's own freeze was refused)" if refused else ""
    print(f"  {kwargs.get('name', 'server')}: gc frozen{note}")
    return server


def start_pinned(core: str, workdir: Path, *, second_plain: bool = False, registered: bool = False) -> list:  # noqa: ANN201
    """The plain and the instrumented server (and with second_plain another plain one), all on the
    last CPU, one torch thread each. With `registered` every server starts with the plugin and
    SWITCH_DIR's switch, the plain ones switched off before their scheduler's first loop: they
    differ from the instrumented one only in the instrument's work, not in what the plugin loads."""
    def start(name: str, instrumented: bool, model: Path | None) -> Any:
        env = {"OMP_NUM_THREADS": "1"}
        if registered:
            flag = workdir / f"{core}-{name}-on"
            workdir.mkdir(parents=True, exist_ok=True)
            if instrumented:
                flag.touch()
            env |= {"PYTHONPATH": str(SWITCH_DIR), "RADIXTOP_BENCH_SWITCH": str(flag)}
        return start_frozen(workdir / f"{core}-{name}", plugin=instrumented or registered, core=core, name=name,
                            model=model, env=env)

    servers = []
    with on_server_cpu():
        try:
            servers.append(start("plain", False, None))
            model = servers[0].model
            servers.append(start("instrumented", True, model))
            if second_plain:
                servers.append(start("plain-b", False, model))
        except BaseException:
            for server in servers:
                server.stop()
            raise
    return servers


def check_switched(core: str, workdir: Path) -> None:
    """Each registered server's scheduler said it is as asked: the instrumented one attached, the
    plain ones switched off before attaching."""
    for name, want in (("plain", "0"), ("instrumented", "1"), ("plain-b", "0")):
        ack = workdir / f"{core}-{name}-on.ack"
        said = ack.read_text() if ack.exists() else "nothing"
        if said != want:
            raise SystemExit(f"the {name} server's scheduler said {said!r} of its instrument, not {want!r}")


ARMS = ("plain", "instrumented", "watched", "plain again")
ARM_NAMES = {"plain": "plain", "instrumented": "instrumented, nobody watching",
             "watched": "instrumented, radixtop watching", "plain again": "plain again (the A/A control)"}
SWITCH_NAMES = {"plain": "instrument off", "instrumented": "instrument on, nobody watching",
                "plain again": "instrument off again (the A/A control)"}
SWITCH_DIR = ROOT / "benchmarks" / "instrument_switch"  # its sitecustomize.py switches the instrument
SWITCH_TIMEOUT_S = 60.0
CATCH_UP_S = 2.0  # a resumed radixtop first asks what it missed: part of watching, but not of the round


def run_core(core: str, args: argparse.Namespace, workdir: Path) -> None:
    """The rounds on one pair of servers, or with --fresh on servers of each round's own."""
    rounds: dict[str, list[Round]] = {arm: [] for arm in ARMS}
    watcher_cpu: list[float] = []
    servers = start_pinned(core, workdir / "round-0", second_plain=args.fresh, registered=args.switch)
    try:
        for i in range(args.rounds):
            if args.fresh and i:
                for server in servers:
                    server.stop()
                servers = start_pinned(core, workdir / f"round-{i}", second_plain=True, registered=args.switch)
            if args.fresh or not i:
                for server in servers:
                    load(server, args.concurrency, min(5.0, args.seconds), 0)  # warm: first calls compile
                if args.switch:
                    check_switched(core, workdir / f"round-{i}")
            run_round(core, i, servers, rounds, watcher_cpu, args, workdir)
        report_load(core, rounds, watcher_cpu, args)
        footprint(core, servers[1], workdir, args)
    finally:
        for server in servers:
            server.stop()


class Switch:
    """One instrumented server whose instrument is switched off and on inside its process."""

    def __init__(self, core: str, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.flag = workdir / "instrument-on"
        self.flag.touch()
        env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(SWITCH_DIR), "RADIXTOP_BENCH_SWITCH": str(self.flag)}
        with on_server_cpu():
            self.server = start_frozen(workdir / f"{core}-switched", plugin=True, core=core, name="switched", env=env)
        self.on = True

    def set(self, on: bool) -> None:
        """Switch, and return once the scheduler says it has (it looks between loop iterations:
        short calls keep its loop turning meanwhile)."""
        if on:
            self.flag.touch()
        else:
            self.flag.unlink(missing_ok=True)
        ack, want = Path(f"{self.flag}.ack"), "1" if on else "0"
        deadline = time.monotonic() + SWITCH_TIMEOUT_S
        while time.monotonic() < deadline:
            said = ack.read_text() if ack.exists() else ""
            if said == want:
                self.on = on
                return
            if said == "not attached":
                raise SystemExit(f"the instrument did not attach again:\n{self.server.text()[-2000:]}")
            httpx.post(f"{self.server.url}/generate", json={"input_ids": [VOCAB_LOW] * 4,
                       "sampling_params": {"max_new_tokens": 1}}, timeout=30).raise_for_status()
            time.sleep(0.1)
        raise SystemExit(f"the scheduler did not switch its instrument {'on' if on else 'off'} "
                         f"within {SWITCH_TIMEOUT_S:.0f} s (is {SWITCH_DIR}/sitecustomize.py on its PYTHONPATH?)")

    def stop(self) -> None:
        self.server.stop()


def run_footprint(core: str, args: argparse.Namespace, workdir: Path) -> None:
    """radixtop's footprint alone, on an instrumented server of its own."""
    with on_server_cpu():
        server = start_frozen(workdir / f"{core}-idle", plugin=True, core=core, name="idle",
                              env={"OMP_NUM_THREADS": "1"})
    try:
        footprint(core, server, workdir, args)
    finally:
        server.stop()


def _is_ours(frame: str) -> bool:
    return "radixtop/" in frame or "instrument_switch/" in frame


def own_samples(raw: str) -> tuple[int, int]:
    """(samples in the instrument's own code, all samples) of a `py-spy record --format raw` file.
    A sample is the instrument's own where its innermost radixtop frame calls no host code (SGLang,
    torch) below it: a wrapper's call of the method it wraps is the host's work, not ours. The
    bench's switch (its check at the safe point) counts as the instrument's, in every arm."""
    own = total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        total += int(count)
        ours = [i for i, frame in enumerate(frames) if _is_ours(frame)]
        if ours and not any("sglang/" in f or "torch/" in f for f in frames[ours[-1] + 1 :]):
            own += int(count)
    return own, total


class Spy:
    """py-spy sampling the scheduler's threads (100 Hz, without pausing it) for one arm."""

    def __init__(self, pid: int, seconds: float, out: Path) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            [spy_binary(), "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-r", "100", "--nonblocking",
             "--format", "raw", "-o", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )

    def samples(self) -> tuple[int, int]:
        _, err = self.proc.communicate(timeout=60)
        if self.proc.returncode != 0 or not self.out.exists():
            raise SystemExit(f"py-spy failed (it needs ptrace: root, or kernel.yama.ptrace_scope=0): {err[-500:]}")
        return own_samples(self.out.read_text(encoding="utf-8"))


def spy_binary() -> str:
    """py-spy beside this interpreter (radixtop depends on it), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else "py-spy"


def run_switched(core: str, args: argparse.Namespace, workdir: Path) -> None:
    """The rounds on one server, the instrument switched for each arm: off, on, off again (the A/A
    control), forward in odd rounds and backward in even ones. With --spy, py-spy samples the
    scheduler during each arm: the instrument's own share of its samples, on and off."""
    rounds: dict[str, list[Round]] = {arm: [] for arm in SWITCH_NAMES}
    spied: dict[str, list[tuple[int, int]]] = {arm: [] for arm in SWITCH_NAMES}
    switch = Switch(core, workdir)
    try:
        switch.set(True)  # attached: what the plugin did at start-up
        load(switch.server, args.concurrency, min(5.0, args.seconds), 0)  # warm: first calls compile
        for i in range(args.rounds):
            for arm in list(SWITCH_NAMES) if i % 2 == 0 else list(SWITCH_NAMES)[::-1]:
                switch.set(arm == "instrumented")
                spy = None
                if args.spy:
                    spy = Spy(switch.server.scheduler().pid, args.seconds, workdir / f"spy-{i}-{arm}.txt")
                rounds[arm].append(load(switch.server, args.concurrency, args.seconds, i + 1))
                if spy is not None:
                    spied[arm].append(spy.samples())
            said = "; ".join(f"{SWITCH_NAMES[k]} {v[-1].tokens_per_s:,.0f} tok/s, {v[-1].cpu_ms_per_token:.2f} "
                             f"CPU ms/token, p99 {v[-1].p99_ms:,.0f} ms" for k, v in rounds.items())
            print(f"  {core} round {i + 1}: {said}", flush=True)
        report_load(core, rounds, [], args)
        # "on" always runs between the two off arms (off, on, off again; then backward), so their
        # mean is a control that a steady drift within the round moves as much as it moves "on".
        flanked = []
        for on, off, off_again in zip(rounds["instrumented"], rounds["plain"], rounds["plain again"], strict=True):
            control = statistics.fmean((off.tokens_per_s, off_again.tokens_per_s))
            flanked.append((control - on.tokens_per_s) / control * 100.0)
        low, high = median_interval(flanked)
        print(f"  instrument on against the mean of the round's two off arms, tokens/s: {spread(flanked)} "
              f"[{low:+.1f}, {high:+.1f}]")
        if args.spy:
            report_spied(core, spied)
    finally:
        switch.stop()


def report_spied(core: str, spied: dict[str, list[tuple[int, int]]]) -> None:
    """The instrument's own share of the scheduler's samples per arm, pooled over the rounds, with
    the 95 % interval of a share of that many samples (normal approximation)."""
    shares = {}
    for arm, counts in spied.items():
        own, total = sum(c[0] for c in counts), sum(c[1] for c in counts)
        share = own / max(1, total)
        half = 1.96 * (share * (1 - share) / max(1, total)) ** 0.5
        shares[arm] = (share * 100, half * 100, own, total)
        print(f"  py-spy, {SWITCH_NAMES[arm]}: the instrument's own code in {own} of the scheduler's {total} "
              f"samples: {share * 100:.2f} % [{(share - half) * 100:.2f}, {(share + half) * 100:.2f}]")
    on, off = shares["instrumented"], shares["plain"]
    row(f"real SGLang server ({core} core, one server switched): the instrument's own code in the scheduler's "
        "py-spy samples while the load runs, instrument on [95 % interval]",
        f"{on[0]:.2f} % [{on[0] - on[1]:.2f}, {on[0] + on[1]:.2f}] ({on[2]} of {on[3]})",
        f"instrument off: {off[0]:.2f} % ({off[2]} of {off[3]})", "<= 2 %", on[0] + on[1] <= 2.0)


def run_round(core: str, i: int, servers: list, rounds: dict[str, list[Round]], watcher_cpu: list[float],
              args: argparse.Namespace, workdir: Path) -> None:
    """Each arm's load once, forward in odd rounds and backward in even ones. The A/A control is
    the plain server again, or with --fresh a second plain server (another process, as the
    instrumented one is)."""
    plain, instrumented = servers[0], servers[1]
    again = servers[2] if len(servers) > 2 else plain
    watcher = radixtop_watching(instrumented, workdir)
    watcher.pause()
    try:
        for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
            server = {"plain": plain, "plain again": again}.get(arm, instrumented)
            if arm == "watched":
                watcher.resume()
                time.sleep(CATCH_UP_S)
                c0, t0 = watcher.cpu(), time.monotonic()
            rounds[arm].append(load(server, args.concurrency, args.seconds, i + 1))
            if arm == "watched":
                watcher_cpu.append((watcher.cpu() - c0) / (time.monotonic() - t0) * 100.0)
                watcher.pause()
    finally:
        watcher.stop()
    said = "; ".join(f"{k} {v[-1].tokens_per_s:,.0f} tok/s, {v[-1].cpu_ms_per_token:.2f} CPU ms/token, "
                     f"p99 {v[-1].p99_ms:,.0f} ms" for k, v in rounds.items())
    print(f"  {core} round {i + 1}: {said}; radixtop {watcher_cpu[-1]:.1f} % of a core", flush=True)


def paired(rounds: dict[str, list[Round]], arm: str, field: str) -> list[float]:
    """Per round, the arm against that round's plain server, in per cent (positive: costlier)."""
    out = []
    for mine, base in zip(rounds[arm], rounds["plain"], strict=True):
        a, b = getattr(mine, field), getattr(base, field)
        out.append((b - a) / b * 100.0 if field == "tokens_per_s" else (a - b) / b * 100.0)
    return out


def report_load(core: str, rounds: dict[str, list[Round]], watcher_cpu: list[float], args: argparse.Namespace) -> None:
    switched = args.switch and not args.fresh
    names = SWITCH_NAMES if switched else ARM_NAMES
    fresh = ("; one server, its instrument switched off and on for the arms" if switched else
             "; fresh servers each round, the A/A control a second plain server" if args.fresh else "")
    if args.fresh and args.switch:
        fresh += ", every server with the plugin loaded, the plain ones' instrument switched off before attaching"
    print(f"{core} core, {args.rounds} rounds of {args.seconds:g} s per arm at {args.concurrency} in flight{fresh}; "
          f"each arm against the same round's {names['plain']} arm, in % (positive: costlier), median (min, max) "
          "[95 % interval of the median]:")
    fields = (("tokens_per_s", "tokens/s"), ("cpu_ms_per_token", "server CPU per token"), ("p99_ms", "p99"))
    control = {f: paired(rounds, "plain again", f) for f, _ in fields}
    control_band = {f: median_interval(control[f]) for f, _ in fields}
    for arm in [arm for arm in ARMS[1:] if arm in rounds]:
        costs = {f: paired(rounds, arm, f) for f, _ in fields}
        bands = {f: median_interval(costs[f]) for f, _ in fields}
        print(f"  {names[arm]:34} " + "; ".join(
            f"{what} {spread(costs[f])} [{bands[f][0]:+.1f}, {bands[f][1]:+.1f}]" for f, what in fields))
        if arm == "plain again":
            continue
        # Met: the median costs at most 2 %, and the most the noise allows (the interval's top) is
        # no more than the A/A control's: as far as these rounds can tell, it costs nothing.
        cost = {f: statistics.median(costs[f]) for f, _ in fields}
        within = all(cost[f] <= 2.0 and bands[f][1] <= max(2.0, control_band[f][1])
                     for f in ("tokens_per_s", "cpu_ms_per_token"))
        how = (", one server switched" if switched else ", fresh servers each round, the plugin loaded in each"
               if args.fresh and args.switch else ", fresh servers each round" if args.fresh else "")
        row(f"real SGLang server ({core} core{how}), {names[arm]}, "
            f"{args.concurrency} in flight: cost in tokens/s "
            f"/ server CPU per token, paired with the same round's {names['plain']} arm, median [95 % interval]",
            f"{cost['tokens_per_s']:+.1f} % [{bands['tokens_per_s'][0]:+.1f}, {bands['tokens_per_s'][1]:+.1f}] / "
            f"{cost['cpu_ms_per_token']:+.1f} % [{bands['cpu_ms_per_token'][0]:+.1f}, "
            f"{bands['cpu_ms_per_token'][1]:+.1f}]",
            f"{names['plain again']}: {statistics.median(control['tokens_per_s']):+.1f} % "
            f"[{control_band['tokens_per_s'][0]:+.1f}, {control_band['tokens_per_s'][1]:+.1f}] / "
            f"{statistics.median(control['cpu_ms_per_token']):+.1f} % [{control_band['cpu_ms_per_token'][0]:+.1f}, "
            f"{control_band['cpu_ms_per_token'][1]:+.1f}]",
            "median within 2 %, interval within the A/A control's", within)
    if watcher_cpu:
        print(f"  radixtop while the load ran: {spread(watcher_cpu)} % of a core")


def footprint(core: str, server, workdir: Path, args: argparse.Namespace) -> None:  # noqa: ANN001
    watcher = radixtop_watching(server, workdir)
    top = Watcher(["top", "-d", "1"], workdir)
    try:
        top.settle()
        c_rt, c_top, t0 = watcher.cpu(), top.cpu(), time.monotonic()
        time.sleep(args.idle_seconds)
        wall = time.monotonic() - t0
        ours, theirs = (watcher.cpu() - c_rt) / wall * 100.0, (top.cpu() - c_top) / wall * 100.0
        rss = watcher.proc.memory_info().rss / (1 << 20)
    finally:
        top.stop()
        watcher.stop()
    print(f"  idle {args.idle_seconds:g} s, every pane on the instrumented server: radixtop {ours:.2f} % of a core, "
          f"RSS {rss:.0f} MiB; top -d 1: {theirs:.2f} %")
    row(f"radixtop watching a real idle SGLang server ({core} core), every pane, % of one core",
        f"{ours:.2f} % (RSS {rss:.0f} MiB)", f"top -d 1: {theirs:.2f} %", "<= 3 %", ours <= 3.0)


def main() -> None:
    compile_tree(ROOT)  # radixtop as installed: its bytecode written (tree_launch.py)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 rounds of 5 s, 20 s idle (default 8 of 10 s, 60 s)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None, help="each round's load")
    parser.add_argument("--idle-seconds", type=float, default=None)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--core", choices=("rust", "python", "both"), default="rust")
    parser.add_argument("--fresh", action="store_true",
                        help="start each round's servers afresh, and a second plain server for the A/A control: "
                             "two server processes can differ by 10 %% for a whole run")
    parser.add_argument("--switch", action="store_true",
                        help="one instrumented server per core, its instrument switched off and on inside the "
                             "process for the arms (no watching arm, no footprint): no two processes compared")
    parser.add_argument("--spy", action="store_true",
                        help="with --switch: py-spy samples the scheduler in each arm (the instrument's own share)")
    parser.add_argument("--footprint-only", action="store_true", help="only radixtop watching an idle server")
    args = parser.parse_args()
    args.rounds = args.rounds or (4 if args.quick else 8)  # even: as many rounds forward as backward
    args.seconds = args.seconds or (5.0 if args.quick else 10.0)
    args.idle_seconds = args.idle_seconds or (20.0 if args.quick else 60.0)
    if not (1 <= args.rounds <= 40 and 1 <= args.seconds <= 600 and 1 <= args.concurrency <= 64):
        raise SystemExit("--rounds 1-40, --seconds 1-600, --concurrency 1-64")
    from sglang_gate import why_no_server

    why = why_no_server()
    if why is not None:
        raise SystemExit(f"error: {why}")
    print(f"load average before: {psutil.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="server-cost-") as tmp:
        for core in (("rust", "python") if args.core == "both" else (args.core,)):
            run = (run_footprint if args.footprint_only else run_switched if args.switch and not args.fresh
                   else run_core)
            run(core, args, Path(tmp))
    print(f"load average after: {psutil.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
