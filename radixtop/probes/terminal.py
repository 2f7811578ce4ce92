"""A server whose output goes to a terminal: which one. A tmux pane (found by its tty among the panes
of the user's tmux server: the socket named in the server's TMUX variable, else radixtop's own, else
the default socket of the server's user), a GNU screen window, or a plain (ssh) terminal; for the
last two, one line saying what to do. tmux is run with argv lists, never through a shell.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass

import psutil

TMUX_TIMEOUT_S = 3.0
_FIELDS = "#{pane_tty}\t#{pane_id}\t#{session_name}:#{window_index}.#{pane_index}\t#{pane_pipe}"


@dataclass(frozen=True, slots=True)
class Pane:
    socket: str  # the tmux server's socket
    pane_id: str  # "%3": stays the pane's while it lives
    target: str  # "work:1.0" (session:window.pane), for people
    tty: str
    piped: bool = False  # the pane already pipes its output somewhere (tmux pipe-pane)

    @property
    def name(self) -> str:
        return f"tmux pane {self.pane_id} ({self.target})"


def tmux(socket: str, *args: str, timeout_s: float = TMUX_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run tmux against one server socket; raises OSError / subprocess.SubprocessError."""
    exe = shutil.which("tmux")
    if exe is None:
        raise FileNotFoundError("tmux is not installed")
    return subprocess.run([exe, "-S", socket, *args], capture_output=True, text=True, timeout=timeout_s,
                          check=False, stdin=subprocess.DEVNULL)


def terminal_of(pid: int) -> str | None:
    """The terminal the process's stdout (else stderr) writes to, or None."""
    for fd in (1, 2):
        link = f"/proc/{pid}/fd/{fd}"
        try:
            target = os.readlink(link)
            if stat.S_ISCHR(os.stat(link).st_mode) and target.startswith(("/dev/pts/", "/dev/tty")):
                return target
        except OSError:
            continue
    return None


def _sockets(proc: psutil.Process) -> list[str]:
    """Where the tmux server owning the server's terminal may listen, most likely first."""
    found: list[str] = []
    try:
        env = proc.environ()
    except (psutil.Error, OSError):
        env = {}
    for value in (env.get("TMUX", ""), os.environ.get("TMUX", "")):
        path = value.split(",", 1)[0]
        if path:
            found.append(path)
    try:
        uid = proc.uids().real
    except psutil.Error:
        uid = os.getuid()
    tmpdir = env.get("TMUX_TMPDIR") or os.environ.get("TMUX_TMPDIR") or "/tmp"
    found.append(os.path.join(tmpdir, f"tmux-{uid}", "default"))
    return list(dict.fromkeys(found))


def find_pane(proc: psutil.Process, tty: str) -> tuple[Pane | None, str]:
    """The tmux pane whose terminal is `tty`; else (None, why)."""
    if shutil.which("tmux") is None:
        return None, "tmux is not installed here"
    tried = []
    for socket in _sockets(proc):
        if not os.path.exists(socket):
            continue
        tried.append(socket)
        try:
            got = tmux(socket, "list-panes", "-a", "-F", _FIELDS)
        except (OSError, subprocess.SubprocessError):
            continue
        if got.returncode != 0:
            continue
        for line in got.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) == 4 and parts[0] == tty:
                return Pane(socket, parts[1], parts[2], tty, piped=parts[3] == "1"), ""
    return None, f"no tmux pane has {tty} (tmux servers asked: {', '.join(tried) or 'none found'})"


def _ancestors(proc: psutil.Process) -> list[str]:
    try:
        return [p.name() for p in proc.parents()]
    except psutil.Error:
        return []


def locate(proc: psutil.Process, tty: str) -> tuple[Pane | None, str]:
    """(the pane, "") for a tmux pane; else (None, one line: what the terminal is and what to do)."""
    pane, why = find_pane(proc, tty)
    if pane is not None:
        return pane, ""
    names = [n.lower() for n in _ancestors(proc)]
    if any(n.startswith("screen") for n in names):
        return None, (
            f"its output goes to a GNU screen window ({tty}), which radixtop cannot read: in that window press "
            "Ctrl-a H (screen logs it to screenlog.N in its directory), then radixtop --log screenlog.N"
        )
    where = "an ssh terminal" if "sshd" in names else "a terminal"
    return None, (
        f"its output goes to {where} ({tty}) that is no tmux pane radixtop can see ({why}): restart it with "
        "--log-file PATH (or `2>&1 | tee PATH`), or inside tmux, then radixtop --log PATH"
    )
