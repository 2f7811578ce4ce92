"""A server run by systemd whose output goes to the journal: its stdout is a socket (journald's
stream) and its cgroup names its unit (`0::/system.slice/sglang.service`; a user's
`.../user@1000.service/app.slice/sglang.service`). Its log is then `journalctl -u UNIT -f -o cat`
(`--user-unit` for a user's unit), when journalctl can read that journal.
"""

from __future__ import annotations

import os
import shutil
import subprocess

BACKLOG_LINES = 5_000
_CHECK_TIMEOUT_S = 3.0


def read_cgroup(pid: int) -> str:
    """The process's /proc/PID/cgroup ("" when unreadable)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            return f.read(64 * 1024)
    except OSError:
        return ""


def unit_of(cgroup: str) -> tuple[str, bool] | None:
    """(unit, is a user's unit) for the service a /proc/PID/cgroup text places the process in
    (the unified hierarchy, else systemd's named one); None outside a service."""
    paths = {}
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths[parts[1]] = parts[2]
    # Hybrid hosts keep the unified hierarchy at "/" and systemd's own one in name=systemd.
    path = next((p for p in (paths.get(""), paths.get("name=systemd")) if p and p != "/"), "")
    parts = [p for p in path.split("/") if p]
    user = False
    unit = None
    for i, part in enumerate(parts):
        if part.startswith("user@") and part.endswith(".service"):
            user = True
            continue
        if part.endswith(".service") and not (part.startswith("user@") or i == 0 and part == "init.scope"):
            unit = part
    if unit is None or unit.startswith(("docker-", "libpod-", "cri-containerd-", "crio-")):
        return None
    return unit, user


def stdout_is_socket(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/fd/1").startswith("socket:")
    except OSError:
        return False


def journal_argv(unit: str, user: bool, lines: int = BACKLOG_LINES) -> list[str]:
    """The reader: the unit's last `lines` lines, then every new one, message text only."""
    return ["journalctl", "--user-unit" if user else "-u", unit, "-f", "-o", "cat", "-n", str(lines), "--no-pager"]


def can_read(unit: str, user: bool) -> str:
    """"" when journalctl runs and reads that unit's journal; else why not, as one line."""
    exe = shutil.which("journalctl")
    if exe is None:
        return f"its output goes to the journal (unit {unit}) and journalctl is not installed here; pass --log"
    argv = [exe, "--user-unit" if user else "-u", unit, "-n", "1", "--no-pager"]  # not -q: it hides the hints
    try:
        got = subprocess.run(argv, capture_output=True, text=True, timeout=_CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"journalctl failed ({exc}); pass --log"
    said = (got.stderr or "").strip().splitlines()
    if got.returncode != 0 or any("not seeing messages" in s or "No journal files" in s for s in said):
        why = said[0] if said else f"exit status {got.returncode}"
        return (f"its output goes to the journal (unit {unit}) but journalctl cannot read it here ({why}): run "
                "radixtop as root or in group systemd-journal or adm, or pass --log")
    return ""
