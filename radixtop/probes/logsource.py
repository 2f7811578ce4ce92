"""Open a server's log that is no file (radixtop.probes.discovery.LogElsewhere) as a spool file the
log follower can follow: a tmux pane (radixtop.probes.panelog), a reader process's output
(`journalctl -u UNIT -f -o cat`, `docker logs -f ID`), or a container runtime's log file decoded line
by line (radixtop.probes.runtimelog).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

from radixtop.probes.panelog import PaneLog
from radixtop.probes.spool import Spool


class ReaderLog:
    """A reader process whose stdout is the log, appended to a spool file."""

    def __init__(self, name: str, argv: tuple[str, ...], spool: Spool) -> None:
        self.name = name
        self.argv = argv
        self.spool = spool
        self.path = spool.path(name)
        self.proc: subprocess.Popen | None = None
        self.on_note: Callable[[str], None] | None = None

    def start(self) -> str:
        try:
            self.proc = self.spool.run_into(self.argv, self.path)
        except OSError as exc:
            return f"cannot run {self.argv[0]}: {exc.strerror or exc}"
        return ""

    def stop(self) -> None:
        self.spool.close()


class LogSource:
    """One opened source: `path` is what the follower follows; `stop()` undoes everything (the
    reader, a tmux pipe, the spool directory). `pane` is set for a tmux pane (the app offers to
    pipe it)."""

    def __init__(self, name: str, impl: Any, spool: Spool) -> None:
        self.name = name
        self.impl = impl
        self.spool = spool
        self.path: str = impl.path
        self.pane: PaneLog | None = impl if isinstance(impl, PaneLog) else None

    def set_notes(self, on_note: Callable[[str], None]) -> None:
        self.impl.on_note = on_note

    def stop(self) -> None:
        try:
            self.impl.stop()
        finally:
            self.spool.close()


def open_source(where: Any) -> tuple[LogSource | None, str]:
    """Start reading `where` (a LogElsewhere) into a spool file: (source, "") or (None, why)."""
    spool = Spool()
    impl: Any
    if where.pane is not None:
        impl = PaneLog(where.pane, spool)
    elif where.argv:
        impl = ReaderLog(where.name, tuple(where.argv), spool)
    elif where.path:
        from radixtop.probes.runtimelog import RuntimeLog

        impl = RuntimeLog(where.name, where.path, where.path_format, spool)
    else:
        spool.close()
        return None, f"{where.name}: nothing to read"
    why = impl.start()
    if why:
        impl.stop()
        spool.close()
        return None, why
    return LogSource(where.name, impl, spool), ""
