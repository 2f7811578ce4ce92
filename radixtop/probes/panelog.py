"""Follow a tmux pane's output into a spool file (radixtop.probes.spool), which the log follower then
follows. At once: the pane's recent history (`capture-pane -p -J -S -N`). Then either
- reading: the pane's last lines every POLL_S, the lines after those already seen appended. This
  changes nothing in the user's tmux; lines scrolled past between two reads (a flood of more than
  POLL_LINES lines) are missed, and said so; or
- piping (only once the user agreed): `tmux pipe-pane -o` appends everything the pane prints to the
  spool file; undone at stop(), and ended by the pipe's own command if radixtop dies without
  stop() (radixtop.probes.panepipe). A pane that already pipes somewhere keeps its pipe: it is read
  instead.
A closed pane, or a pipe someone else closed, is said once through `on_note`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

from radixtop.probes.spool import Spool, cap
from radixtop.probes.terminal import Pane, tmux

HISTORY_LINES = 5_000
POLL_LINES = 1_000
POLL_S = 1.0
WATCH_S = 2.0  # a piped pane is checked this often (still there, still piped, spool size)
ANCHOR = 8  # the last lines of a read looked for in the next


def new_lines(seen: Sequence[str], now: Sequence[str], anchor: int = ANCHOR) -> tuple[list[str], bool]:
    """The lines of `now` after those of `seen` (two reads of a pane's bottom), and whether lines
    may have been missed between them (`seen`'s last lines are not in `now`)."""
    if not seen:
        return list(now), False
    tail = list(seen[-anchor:])
    k = len(tail)
    for start in range(len(now) - k, -1, -1):
        if list(now[start : start + k]) == tail:
            return list(now[start + k :]), False
    return list(now), True


def pipe_command(path: str) -> str:
    """What tmux runs (through its shell) for the pipe: only our interpreter, our script, our pid and
    the spool path we made, each quoted; it ends when radixtop does (radixtop.probes.panepipe)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "panepipe.py")
    parts = [sys.executable or "python3", "-I", script, str(os.getpid()), path]
    return " ".join(shlex.quote(p) for p in parts)


class PaneLog:
    def __init__(self, pane: Pane, spool: Spool, *, on_note: Callable[[str], None] | None = None,
                 poll_s: float = POLL_S, history: int = HISTORY_LINES) -> None:
        self.pane = pane
        self.spool = spool
        self.path = spool.path(pane.name)
        self.on_note = on_note
        self.poll_s = poll_s
        self.history = history
        self.mode = ""  # "reading" | "piped" | "closed"
        self._seen: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- reading the pane ---------------------------------------------------------------------

    def _capture(self, lines: int) -> list[str] | None:
        """The pane's last `lines` lines of history and its screen, trailing blank rows dropped;
        None when the pane is gone."""
        try:
            got = tmux(self.pane.socket, "capture-pane", "-p", "-J", "-S", f"-{lines}", "-t", self.pane.pane_id)
        except (OSError, subprocess.SubprocessError):
            return None
        if got.returncode != 0:
            return None
        rows = [row.rstrip() for row in got.stdout.split("\n")]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    def start(self) -> str:
        """Write the pane's history to the spool file and start reading it; "" or why not."""
        rows = self._capture(self.history)
        if rows is None:
            self.mode = "closed"
            return f"{self.pane.name} is gone"
        self._seen = rows
        self.spool.append(self.path, rows)
        self.mode = "reading"
        self._start_thread(self._read_forever)
        return ""

    def _read_once(self) -> bool:
        rows = self._capture(POLL_LINES)
        if rows is None:
            self._closed()
            return False
        fresh, gap = new_lines(self._seen, rows)
        if gap and self._seen:
            self._note(f"{self.pane.name}: lines may have been missed (more than {POLL_LINES} between two reads, "
                       "or the pane was cleared)")
        self._seen = rows[-POLL_LINES:]
        self.spool.append(self.path, fresh)
        return True

    def _read_forever(self) -> None:
        while not self._stop.wait(self.poll_s):
            with self._lock:
                if self.mode != "reading" or not self._read_once():
                    return

    # -- piping -------------------------------------------------------------------------------

    def pipe(self) -> str:
        """Switch to tmux pipe-pane; "" or why not (then reading goes on)."""
        with self._lock:
            if self.mode != "reading":
                return f"{self.pane.name} is not being read ({self.mode or 'not started'})"
            shown = tmux(self.pane.socket, "display-message", "-p", "-t", self.pane.pane_id, "#{pane_pipe}")
            if shown.returncode != 0:
                self._closed()
                return f"{self.pane.name} is gone"
            if shown.stdout.strip() == "1":
                return (
                    f"{self.pane.name} already pipes its output elsewhere (tmux pipe-pane): "
                    f"it is read every {self.poll_s:g} s instead"
                )
            if not self._read_once():  # what came while the user was asked
                return f"{self.pane.name} is gone"
            got = tmux(self.pane.socket, "pipe-pane", "-o", "-t", self.pane.pane_id, pipe_command(self.path))
            if got.returncode != 0:
                return f"tmux pipe-pane failed: {got.stderr.strip() or got.returncode}; the pane is read instead"
            self.mode = "piped"
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._stop = threading.Event()
        self._start_thread(self._watch_forever)
        return ""

    def _watch_forever(self) -> None:
        while not self._stop.wait(WATCH_S):
            try:
                got = tmux(self.pane.socket, "display-message", "-p", "-t", self.pane.pane_id, "#{pane_pipe}")
            except (OSError, subprocess.SubprocessError):
                continue
            if got.returncode != 0:
                self._closed()
                return
            if got.stdout.strip() != "1":
                with self._lock:
                    self.mode = "reading"
                self._note(f"{self.pane.name}: its pipe was closed outside radixtop; reading the pane instead")
                self._seen = self._capture(POLL_LINES) or []
                self._read_forever()
                return
            cap(self.path)

    # -- ending -------------------------------------------------------------------------------

    def _closed(self) -> None:
        if self.mode != "closed":
            self.mode = "closed"
            self._note(f"{self.pane.name} closed: its lines so far stay in view; pass --log for the server's next log")

    def _note(self, text: str) -> None:
        if self.on_note is not None:
            self.on_note(text)

    def _start_thread(self, target: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=target, name=f"radixtop {self.pane.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop reading; undo the pipe if radixtop set it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        if self.mode == "piped":
            try:
                tmux(self.pane.socket, "pipe-pane", "-t", self.pane.pane_id)  # no command: closes the pipe
            except (OSError, subprocess.SubprocessError):
                pass
            self.mode = "stopped"
