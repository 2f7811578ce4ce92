"""Files radixtop writes a server's log into when the log is not a file it can follow: a tmux pane's
output, a journald unit, a container runtime's log. The log follower (radixtop.probes.follow) then
follows the spool file like any other, so rotation, truncation, line cutting and ANSI stripping stay
in one place. One private directory per radixtop, removed at exit; each file is cut back to empty
past MAX_BYTES (the follower reports a truncation), so a long session cannot fill the disk.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Sequence

MAX_BYTES = 256 * 1024 * 1024
_UNSAFE = re.compile(r"[^\w .:%@+()-]+")


def spool_name(*parts: str) -> str:
    """A file name (the log pane's label for the source) from parts that may come from outside (a
    tmux session's name, a unit's): what is not a word character, space, dot, colon, %, @, +,
    parenthesis or - becomes '_'; at most 80 characters."""
    return _UNSAFE.sub("_", " ".join(p for p in parts if p)).strip("_ ")[:80] or "log"


class Spool:
    """A private directory (0700) of spool files."""

    def __init__(self, base: str | None = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="radixtop-logs-", dir=base)
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen] = []

    def path(self, name: str) -> str:
        return os.path.join(self.dir, spool_name(name))

    def append(self, path: str, lines: Iterable[str]) -> None:
        text = "".join(line + "\n" for line in lines)
        if not text:
            return
        with self._lock, open(path, "a", encoding="utf-8", errors="replace") as f:
            f.write(text)
        cap(path)

    def run_into(self, argv: Sequence[str], path: str) -> subprocess.Popen:
        """Start a reader process (argv, never a shell) whose stdout is appended to `path`."""
        with open(path, "ab") as out:
            proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._procs.append(proc)
        return proc

    def close(self) -> None:
        """Stop the reader processes and remove the directory."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(2)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(2)
        self._procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def cap(path: str, limit: int = MAX_BYTES) -> None:
    """Cut a spool file back to empty once past `limit` (writers append: they go on at its end)."""
    with contextlib.suppress(OSError):
        if os.path.getsize(path) > limit:
            os.truncate(path, 0)
