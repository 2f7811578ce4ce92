"""Where each scheduler was when SGLang took its own py-spy dumps, read back from the log.

Before it exits after a failure (SGLANG_PYSPY_DUMP_BEFORE_CRASH) or when its watchdog finds a step
stuck, SGLang 0.5.23 runs `py-spy dump [--native] --pid P` on each scheduler and logs
``Pyspy dump for PID P (cmd):`` followed by py-spy's output, unprefixed:

    Process 4242: python3 -m sglang.launch_server ...
    Python v3.11.7 (/usr/bin/python3.11)

    Thread 4242 (active): "MainThread"
        forward (sglang/srt/model_executor/model_runner.py:1520)
        ...

The innermost frame of each thread is the first under its `Thread` line: for a hang, the place it
was stuck. `read_dumps` keeps every thread's frames; `where` says it in one line per process.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from radixtop.diagnosis.logline import opens_record

_HEAD = re.compile(r"Pyspy dump for PID (\d+)")
_THREAD = re.compile(r'\s*Thread (0x[0-9a-fA-F]+|\d+) \(([\w-]+)\)(?:: "(.*)")?\s*$')
_FRAME = re.compile(r" {4}(\S.*) \(([^()]*)\)\s*$")
MAX_FRAMES = 200  # per thread
MAX_THREADS = 256  # per dump


@dataclass(frozen=True, slots=True)
class ThreadStack:
    pid: int
    thread: str  # py-spy's thread id
    state: str  # "active", "idle", "gil", ...
    name: str  # "MainThread"; "" when py-spy gives none
    frames: tuple[str, ...]  # innermost first, as "func (file:line)"


def read_dumps(lines: Iterable[str]) -> list[ThreadStack]:
    """Every thread of every `Pyspy dump for PID` block in these lines, in order."""
    out: list[ThreadStack] = []
    pid: int | None = None
    current: list[str] | None = None
    head: tuple[str, str, str] | None = None
    threads = 0

    def close() -> None:
        nonlocal current, head
        if pid is not None and head is not None and current is not None:
            out.append(ThreadStack(pid, head[0], head[1], head[2], tuple(current)))
        current, head = None, None

    for line in lines:
        m = _HEAD.search(line)
        if m is not None:
            close()
            pid, threads = int(m.group(1)), 0
            continue
        if pid is None:
            continue
        t = _THREAD.match(line)
        if t is not None:
            close()
            threads += 1
            if threads > MAX_THREADS:
                pid = None
                continue
            head, current = (t.group(1), t.group(2), t.group(3) or ""), []
            continue
        f = _FRAME.match(line)
        if f is not None and current is not None:
            if len(current) < MAX_FRAMES:
                current.append(f"{f.group(1)} ({f.group(2)})")
            continue
        if line.startswith(("Process ", "Python v")) or not line.strip() or line.startswith("    "):
            continue  # py-spy's own header, blank lines, frame details (locals)
        if opens_record(line):
            close()
            pid = None  # the next log record: the dump is over
    close()
    return out


def where(stacks: Iterable[ThreadStack], frames: int = 3) -> list[str]:
    """One line per process: its active threads (else its first thread) and their innermost frames."""
    by_pid: dict[int, list[ThreadStack]] = {}
    for s in stacks:
        by_pid.setdefault(s.pid, []).append(s)
    lines = []
    for pid, threads in by_pid.items():
        shown = [t for t in threads if t.state == "active"] or threads[:1]
        for t in shown:
            name = f' "{t.name}"' if t.name else ""
            path = " <- ".join(t.frames[:frames]) or "(no Python frame)"
            others = len(threads) - len(shown)
            more = f" ({others} other thread(s))" if t is shown[-1] and others else ""
            lines.append(f"PID {pid} thread {t.thread}{name} {t.state}: {path}{more}")
    return lines
