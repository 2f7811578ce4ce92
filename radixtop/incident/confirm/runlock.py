"""One confirmation run at a time per user on a node, and its progress for everyone watching.

Two engineers pairing on a node share its GPUs: two control servers started at once would fight
for them, and two verdicts would confuse. ``RunLock.acquire()`` takes an exclusive ``flock`` on
``confirm.lock`` in the user's runtime directory (the kernel drops it when the holder dies, so a
killed radixtop never leaves a stale lock). The holder writes ``confirm-status.json`` (phase,
recent lines, then the verdict) as it goes; a second radixtop, or a second ``c``, reads it and
shows the run in progress instead of starting another.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

from radixtop.rundir import open_lock_file, read_file, runtime_dir, write_file

__all__ = ["RunLock", "RunStatus", "read_status"]

STATUS_LINES = 60  # recent progress lines kept in the status file
LOCK_NAME = "confirm.lock"
STATUS_NAME = "confirm-status.json"
MAX_STATUS_BYTES = 1 << 20


class RunStatus(dict[str, Any]):
    """What a watcher reads: pid, started, workdir, url, phase, lines, done, headline, verdict."""

    @property
    def done(self) -> bool:
        return bool(self.get("done"))

    def summary(self) -> str:
        started = time.strftime("%H:%M:%S", time.localtime(self.get("started") or 0))
        return (f"a confirmation run is in progress on this node (radixtop pid {self.get('pid')}, started {started}, "
                f"against {self.get('url')}; work directory {self.get('workdir')}): phase {self.get('phase')}")


def read_status() -> RunStatus | None:
    """The status file as written last, or None."""
    try:
        data = read_file(runtime_dir() / STATUS_NAME, MAX_STATUS_BYTES)
        doc = json.loads(data) if data is not None else None
    except (OSError, ValueError, RecursionError):
        return None
    return RunStatus(doc) if isinstance(doc, dict) else None


def lock_held_by_other() -> bool:
    """Is a run in progress in another process (the lock taken)?"""
    try:
        fd = open_lock_file(runtime_dir() / LOCK_NAME)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


class RunLock:
    """The run's lock and status; ``acquire()`` False when another run holds it."""

    def __init__(self, url: str, workdir: str | Path) -> None:
        self.url = url
        self.workdir = str(workdir)
        self._fd: int | None = None
        self._lines: deque[str] = deque(maxlen=STATUS_LINES)
        self._noted = 0  # lines noted in all: a watcher prints those it has not seen
        self._status: dict[str, Any] = {}

    def acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = open_lock_file(runtime_dir() / LOCK_NAME)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        self._status = {"pid": os.getpid(), "started": time.time(), "url": self.url, "workdir": self.workdir,
                        "phase": "evidence", "lines": [], "done": False}
        self._write()
        return True

    @property
    def held(self) -> bool:
        return self._fd is not None

    def note(self, phase: str, message: str) -> None:
        if self._fd is None:
            return
        self._lines.append(f"[{phase}] {message}"[:400])
        self._noted += 1
        self._status.update(phase=phase, lines=list(self._lines), noted=self._noted, updated=time.time())
        self._write()

    def finish(self, headline: str, body: str = "", verdict: str | None = None) -> None:
        """The run's end for watchers (the verdict, a cancellation, an error), then the lock goes."""
        if self._fd is None:
            return
        self._status.update(done=True, phase="done", headline=headline, body=body[:60_000], verdict=verdict,
                            ended=time.time())
        self._write()
        self.release()

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _write(self) -> None:
        with contextlib.suppress(OSError):  # progress for watchers must never stop the run
            write_file(runtime_dir() / STATUS_NAME, json.dumps(self._status).encode())
