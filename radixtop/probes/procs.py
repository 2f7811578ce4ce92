"""The server's process tree (psutil): pid, role and rank, state, RSS, CPU.

SGLang names its processes with setproctitle: `sglang::scheduler_TP3` (`sglang::scheduler_DP1_TP3`
with data parallelism, plain `sglang::scheduler` at TP=1), `sglang::detokenizer`,
`sglang::data_parallel_controller`; vLLM's are `VLLM::EngineCore_DP0`, `VLLM::Worker_TP1`. Those
titles give the role and the rank. A process seen once and gone now stays listed as gone (with the
time it went) for a while, and a zombie is named as one: a dead scheduler must be obvious.

`ProcTree.read()` is synchronous (it reads /proc); `ProcProbe.poll()` runs it in a thread.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import psutil

from radixtop.probes.status import SourceState, StateClock

DEFAULT_INTERVAL_S = 2.0
MAX_PROCS = 256  # a server tree is a few dozen processes; more is not one server
GONE_KEEP_S = 600.0
MAX_GONE = 32

_TITLE = re.compile(
    r"^(?P<who>sglang|VLLM|vllm)::(?P<role>[A-Za-z]+(?:_[a-z]+)*?)(?P<ranks>(?:_(?:DP|PP|TP|EP|CP)\d+)*)\b"
)
_ROLES = {
    "scheduler": "scheduler",
    "detokenizer": "detokenizer",
    "tokenizer": "tokenizer",
    "data_parallel_controller": "dp-controller",
    "EngineCore": "engine-core",
    "Worker": "worker",
    "APIServer": "api-server",
}


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    ppid: int | None
    role: str  # "server", "scheduler", "detokenizer", "worker", ..., or "other"
    rank: str | None  # "TP3", "DP0 TP3"; None when the title has none
    name: str  # the process title, or a short command line
    status: str  # psutil's: running, sleeping, disk-sleep, stopped, zombie, dead; "gone" once vanished
    rss: int | None = None  # bytes
    cpu_percent: float | None = None  # of one core, since the previous read (None on the first)
    threads: int | None = None
    started: float | None = None  # create_time (epoch)
    gone_at: float | None = None  # time.time() it was first seen gone

    @property
    def label(self) -> str:
        return f"{self.role} {self.rank}" if self.rank else self.role

    @property
    def dead(self) -> bool:
        return self.status in ("zombie", "dead", "gone")


@dataclass(frozen=True, slots=True)
class ProcsSample:
    status: SourceState
    time: float
    root_pid: int | None
    procs: tuple[ProcInfo, ...] = ()  # the root first, then its descendants by pid; gone ones last
    problems: tuple[str, ...] = ()  # "scheduler TP3 (pid 123) is a zombie", ...
    seconds: float = 0.0

    def first_death(self) -> tuple[float, str] | None:
        """When the first of the server's children was seen gone, and which ("scheduler TP0 (pid
        6489)"): a crash begins with one child's death, seconds before the server itself exits."""
        gone = [p for p in self.procs if p.gone_at is not None and p.role not in ("other", "server")]
        if not gone:
            return None
        first = min(gone, key=lambda p: p.gone_at or 0.0)
        assert first.gone_at is not None
        return first.gone_at, f"{first.label} (pid {first.pid})"


def role_and_rank(cmdline: list[str] | str) -> tuple[str | None, str | None]:
    """('scheduler', 'DP0 TP3') for 'sglang::scheduler_DP0_TP3'; (None, None) for untitled ones."""
    text = cmdline if isinstance(cmdline, str) else " ".join(cmdline)
    m = _TITLE.match(text.strip())
    if m is None:
        return None, None
    role = m.group("role")
    ranks = m.group("ranks").strip("_").replace("_", " ") or None
    return _ROLES.get(role, role.lower()), ranks


def short_command(cmdline: list[str], limit: int = 80) -> str:
    if not cmdline:
        return ""
    parts = [os.path.basename(cmdline[0]), *cmdline[1:]]
    text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ProcTree:
    """Reads the tree under root_pid. Keeps psutil.Process objects between reads (CPU percent is a
    difference between two reads) and the processes that vanished."""

    def __init__(self, root_pid: int, *, clock: Callable[[], float] = time.time) -> None:
        self.root_pid = root_pid
        self._clock = clock
        self._state = StateClock(clock)
        self._procs: dict[tuple[int, float], psutil.Process] = {}
        self._seen: dict[tuple[int, float], ProcInfo] = {}
        self._gone: list[ProcInfo] = []
        self._root_start: float | None = None
        self._lock = threading.Lock()

    def read(self) -> ProcsSample:
        with self._lock:
            started = time.monotonic()
            try:
                sample = self._read()
            except Exception as exc:  # never into the app
                sample = ProcsSample(
                    self._state.update("error", f"reading processes failed: {type(exc).__name__}: {exc}"),
                    self._clock(),
                    self.root_pid,
                    tuple(self._seen.values()),
                )
            return replace(sample, seconds=time.monotonic() - started)

    def _process(self, proc: psutil.Process) -> psutil.Process:
        try:
            key = (proc.pid, proc.create_time())
        except psutil.Error:
            return proc
        known = self._procs.get(key)
        if known is None:
            self._procs[key] = proc
            return proc
        return known

    def _read(self) -> ProcsSample:
        now = self._clock()
        try:
            root = psutil.Process(self.root_pid)
            root_start = root.create_time()
        except psutil.NoSuchProcess:
            return self._root_gone(now, f"server process {self.root_pid} is gone")
        except psutil.AccessDenied:
            return ProcsSample(
                self._state.update("error", f"no permission to read process {self.root_pid} (run as its user or root)"),
                now,
                self.root_pid,
            )
        if self._root_start is not None and root_start != self._root_start:
            return self._root_gone(
                now, f"server process {self.root_pid} is gone (the pid now belongs to another process)"
            )
        self._root_start = root_start
        try:
            members = [root, *self._descendants(root)[: MAX_PROCS - 1]]
        except psutil.NoSuchProcess:
            return self._root_gone(now, f"server process {self.root_pid} is gone")
        except psutil.AccessDenied:
            members = [root]
        current: dict[tuple[int, float], ProcInfo] = {}
        for proc in members:
            info = self._info(self._process(proc), is_root=proc.pid == self.root_pid)
            if info is not None and info.started is not None:
                current[(info.pid, info.started)] = info
        self._note_gone(current, now)
        self._seen = current
        live = set(current)
        self._procs = {k: p for k, p in self._procs.items() if k in live}
        procs = tuple(sorted(current.values(), key=lambda p: (p.pid != self.root_pid, p.pid)))
        problems = self._problems(procs)
        root_info = current.get((self.root_pid, root_start))
        if root_info is not None and root_info.status == "zombie":
            state, message = (
                "down", f"server process {self.root_pid} is a zombie (exited; its parent has not reaped it)"
            )
        elif problems:
            state, message = "degraded", problems[0]
        else:
            state, message = "ok", ""
        return ProcsSample(self._state.update(state, message), now, self.root_pid, procs + tuple(self._gone), problems)

    def _descendants(self, root: psutil.Process) -> list[psutil.Process]:
        """The tree under root. Linux lists each thread's children in /proc/<pid>/task/<tid>/children:
        reading those costs what the tree costs, where psutil's children() reads every process on
        the node to find parents. Falls back to psutil where that file does not exist."""
        out: list[psutil.Process] = []
        queue = [root.pid]
        seen = {root.pid}
        while queue and len(out) < MAX_PROCS:
            pid = queue.pop()
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except FileNotFoundError:
                continue
            except OSError:
                return root.children(recursive=True)
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                        kids = f.read().split()
                except FileNotFoundError:
                    if os.path.exists(f"/proc/{pid}/task/{tid}"):
                        return root.children(recursive=True)  # this kernel has no children files
                    continue  # the thread ended meanwhile
                except OSError:
                    continue
                for kid in kids:
                    child = int(kid)
                    if child not in seen:
                        seen.add(child)
                        queue.append(child)
                        try:
                            out.append(psutil.Process(child))
                        except psutil.NoSuchProcess:
                            continue
        return out

    def _root_gone(self, now: float, message: str) -> ProcsSample:
        self._note_gone({}, now)
        self._seen = {}
        self._procs = {}
        return ProcsSample(self._state.update("down", message), now, self.root_pid, tuple(self._gone), (message,))

    def _note_gone(self, current: dict[tuple[int, float], ProcInfo], now: float) -> None:
        for key, info in self._seen.items():
            if key not in current:
                self._gone.append(replace(info, status="gone", gone_at=now, cpu_percent=None))
        self._gone = [g for g in self._gone if g.gone_at is not None and now - g.gone_at <= GONE_KEEP_S][-MAX_GONE:]

    def _info(self, proc: psutil.Process, *, is_root: bool) -> ProcInfo | None:
        try:
            with proc.oneshot():
                status = proc.status()
                started = proc.create_time()
                ppid = proc.ppid()
                try:
                    cmdline = proc.cmdline()
                except (psutil.AccessDenied, psutil.ZombieProcess):
                    cmdline = []
                rss: int | None
                threads: int | None
                cpu: float | None
                try:
                    rss = proc.memory_info().rss
                    threads = proc.num_threads()
                    first = (proc.pid, started) not in self._seen
                    cpu = proc.cpu_percent(None)
                except (psutil.AccessDenied, psutil.ZombieProcess):
                    rss = threads = cpu = None
                    first = True
        except psutil.NoSuchProcess:
            return None
        except psutil.AccessDenied:
            return ProcInfo(proc.pid, None, "other", None, "(no permission)", "unknown")
        known = self._seen.get((proc.pid, started))
        if not cmdline and known is not None:  # a zombie's command line is gone: keep what we knew
            return replace(known, status=str(status), rss=rss, cpu_percent=None, threads=threads)
        role, rank = role_and_rank(cmdline)
        name = " ".join(cmdline) if role else short_command(cmdline)
        if not name:
            try:
                name = proc.name()
            except psutil.Error:
                name = "?"
        if role is None:
            role = "server" if is_root else "other"
        return ProcInfo(
            pid=proc.pid,
            ppid=ppid,
            role=role,
            rank=rank,
            name=name[:120],
            status=str(status),
            rss=rss,
            cpu_percent=None if first else cpu,
            threads=threads,
            started=started,
        )

    def _problems(self, procs: tuple[ProcInfo, ...]) -> tuple[str, ...]:
        out = []
        for p in procs:
            if p.status in ("zombie", "dead"):
                out.append(f"{p.label} (pid {p.pid}) is a {p.status}")
            elif p.status == "stopped":
                out.append(f"{p.label} (pid {p.pid}) is stopped (SIGSTOP, or a debugger)")
        for g in self._gone:
            if g.role in ("scheduler", "worker", "engine-core", "detokenizer", "tokenizer"):
                when = time.strftime("%H:%M:%S", time.localtime(g.gone_at or 0))
                out.append(f"{g.label} (pid {g.pid}) is gone since {when}")
        return tuple(out)


class ProcProbe:
    """Async face of ProcTree (reads in a thread)."""

    def __init__(self, root_pid: int, *, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.tree = ProcTree(root_pid)

    @property
    def root_pid(self) -> int:
        return self.tree.root_pid

    async def poll(self) -> ProcsSample:
        try:
            return await asyncio.to_thread(self.tree.read)
        except Exception as exc:
            return ProcsSample(
                SourceState("error", f"reading processes failed: {type(exc).__name__}", time.time()),
                time.time(),
                self.root_pid,
            )

    async def aclose(self) -> None:
        return None
