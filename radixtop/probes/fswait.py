"""Sleep until a followed file may have changed: what the log follower's reader thread waits on
once its files are quiet, instead of polling them (`tail -F` does the same).

`FileWaiter` watches the directories of the followed files with inotify (through `inotify_simple`)
and wakes when one of the names it was given is written, created, moved, deleted or truncated in
them, when the watch itself goes (the directory was removed or moved), when the kernel's event
queue overflowed, when `wake()` is called (stop), or after the timeout, whichever comes first.
Events for other names in the same directories (a server's stdout file beside its log) are read
and dropped without waking. Watching directories rather than files is what catches a rotation
(the name moves to another inode), a file created later and a deletion. Where inotify cannot be
had (not Linux, the per-user instance or watch limit reached, the package missing)
`FileWaiter.create()` returns None and the caller keeps polling.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import select
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["FileWaiter", "glob_base"]


def glob_base(pattern: str) -> tuple[str, str] | None:
    """(directory, name pattern) for a glob whose directory part has no wildcard, else None:
    "/var/log/sglang/*.log" -> ("/var/log/sglang", "*.log")."""
    directory, name = os.path.split(os.path.abspath(pattern))
    if glob.has_magic(directory) or not name:
        return None
    return directory, name


class FileWaiter:
    """inotify on a set of directories, each with the names (or glob patterns) that matter in it."""

    def __init__(self, inotify: Any, flags: Any) -> None:
        self._ino = inotify
        self._mask = (
            flags.MODIFY | flags.ATTRIB | flags.CLOSE_WRITE | flags.CREATE | flags.DELETE
            | flags.MOVED_FROM | flags.MOVED_TO | flags.DELETE_SELF | flags.MOVE_SELF
        )
        self._self_gone = flags.DELETE_SELF | flags.MOVE_SELF | flags.IGNORED | flags.Q_OVERFLOW
        self._wd_dir: dict[int, str] = {}
        self._dir_wd: dict[str, int] = {}
        self._names: dict[str, tuple[set[str], tuple[str, ...]]] = {}  # dir -> (names, glob patterns)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closed = False
        self._close_lock = threading.Lock()  # wake() from another thread never writes to a reused fd
        self._poller = select.poll()
        self._poller.register(inotify.fileno(), select.POLLIN)
        self._poller.register(self._wake_r, select.POLLIN)
        self.missing: set[str] = set()  # directories asked for that could not be watched (yet)

    @classmethod
    def create(cls) -> FileWaiter | None:
        try:
            from inotify_simple import INotify, flags

            return cls(INotify(), flags)
        except (ImportError, OSError, AttributeError):
            return None

    def watch(self, wanted: Mapping[str, Iterable[str]]) -> bool:
        """Watch exactly these directories, each for these names (fnmatch patterns allowed). True
        when a directory was added: what changed in it before now sent no event, so the caller
        looks at its files once more before waiting."""
        added = False
        for directory in list(self._dir_wd):
            if directory not in wanted:
                wd = self._dir_wd.pop(directory)
                self._wd_dir.pop(wd, None)
                try:
                    self._ino.rm_watch(wd)
                except OSError:
                    pass  # the directory went away: the kernel removed the watch already
        self.missing = set()
        names: dict[str, tuple[set[str], tuple[str, ...]]] = {}
        for directory, items in wanted.items():
            plain = {n for n in items if not _has_magic(n)}
            names[directory] = (plain, tuple(n for n in items if _has_magic(n)))
            if directory in self._dir_wd:
                continue
            try:
                wd = self._ino.add_watch(directory, self._mask)
            except OSError:
                self.missing.add(directory)  # not there yet, or not ours to watch: the timeout covers it
                continue
            self._dir_wd[directory] = wd
            self._wd_dir[wd] = directory
            added = True
        self._names = names
        return added

    def wait(self, timeout: float) -> bool:
        """Block until something that matters happened (True) or `timeout` seconds (False)."""
        deadline_ms = max(0, int(timeout * 1000))
        remaining = deadline_ms
        start = time.monotonic()
        while True:
            ready = self._poller.poll(remaining)
            if not ready:
                return False
            for fd, _ in ready:
                if fd == self._wake_r:
                    self._drain_wake()
                    return True
            if self._relevant(self._ino.read(timeout=0)):
                return True
            remaining = deadline_ms - int((time.monotonic() - start) * 1000)
            if remaining <= 0:
                return False

    def _relevant(self, events: Iterable[Any]) -> bool:
        hit = False
        for event in events:
            if event.mask & self._self_gone:
                if event.wd in self._wd_dir and not event.name:
                    gone = self._wd_dir.pop(event.wd)
                    self._dir_wd.pop(gone, None)
                hit = True
                continue
            directory = self._wd_dir.get(event.wd)
            if directory is None:
                continue
            plain, patterns = self._names.get(directory, (set(), ()))
            if event.name in plain or any(fnmatch.fnmatchcase(event.name, p) for p in patterns):
                hit = True
        return hit

    def wake(self) -> None:
        """Make the current (or next) wait() return at once; safe from any thread."""
        with self._close_lock:
            if self._closed:
                return
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass  # the pipe is full: a wake-up is pending already

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 64):
                pass
        except OSError:
            pass

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self._ino.close()
        except OSError:
            pass


def _has_magic(name: str) -> bool:
    return any(c in name for c in "*?[")
