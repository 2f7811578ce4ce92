"""Where a server's log is: the file `--log-file` names, else the file its stdout (then stderr)
goes to (/proc/PID/fd/1), read through /proc/PID/root/ when the server runs in a container; else
where its output goes instead (`LogElsewhere`): a tmux pane (radixtop.probes.terminal), the journal
of its systemd unit (radixtop.probes.journal), its container runtime's log
(radixtop.probes.container). Anything else is said in one line with what to pass.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from radixtop.probes.container import Container, logs_argv, readable_root, runtime_log_files
from radixtop.probes.journal import can_read, journal_argv, read_cgroup, stdout_is_socket, unit_of
from radixtop.probes.server_cmdline import flag
from radixtop.probes.terminal import Pane, locate, terminal_of


@dataclass(frozen=True, slots=True)
class LogElsewhere:
    """A log that is no file radixtop can follow as it is: read into a spool file instead
    (radixtop.probes.logsource opens it)."""

    kind: str  # "tmux" (a pane), "journald" (a unit), "container" (a runtime's log)
    name: str  # for people: "tmux pane %3 (work:1.0)", "journald unit sglang.service"
    pane: Pane | None = None
    argv: tuple[str, ...] = ()  # a reader whose output is the log (journalctl -f, docker logs -f)
    path: str = ""  # a runtime's log file to decode (docker json-file, podman k8s-file)
    path_format: str = ""  # "docker-json" | "k8s-file"


def _log_target(pid: int, fd: int, container: Container | None) -> tuple[str | None, str]:
    """(path, "") when the fd is a regular file; (None, why) otherwise."""
    link = f"/proc/{pid}/fd/{fd}"
    try:
        target = os.readlink(link)
    except PermissionError:
        return None, f"cannot read {link}: permission denied (run radixtop as the server's user, or pass --log)"
    except OSError as exc:
        return None, f"cannot read {link}: {exc.strerror or exc}"
    if target.endswith(" (deleted)"):
        return None, f"its {'stdout' if fd == 1 else 'stderr'} goes to a deleted file ({target[:-10]})"
    if not target.startswith("/"):
        kind = target.split(":", 1)[0]  # pipe:[123], socket:[456], anon_inode:...
        return None, (
            f"its {'stdout' if fd == 1 else 'stderr'} is a {kind} (journald, docker or a terminal pipe?); pass --log"
        )
    try:
        mode = os.stat(link).st_mode
    except OSError as exc:
        return None, f"cannot stat {target}: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        try:
            return (container.host_path(target) if container is not None else target), ""
        except OSError as exc:
            return None, (
                f"its {'stdout' if fd == 1 else 'stderr'} cannot be resolved inside "
                f"{container.name if container else 'its container'}: {exc}"
            )
    what = "a terminal" if stat.S_ISCHR(mode) and target.startswith(("/dev/pts", "/dev/tty")) else target
    return None, f"its {'stdout' if fd == 1 else 'stderr'} goes to {what}, not a file; pass --log"


def find_log(
    proc: psutil.Process, args: Sequence[str], container: Container | None = None
) -> tuple[str | None, str, list[str]]:
    """(path, how, problems) for a server process's log file; paths of a container's are given as
    this node sees them (/proc/PID/root/...)."""
    problems: list[str] = []
    if container is not None and container.own_root:
        why = readable_root(container)
        if why:
            given = flag(args, "--log-file")
            where = f" (its --log-file {given})" if given else ""
            return None, "", [
                f"its log{where} is inside {container.name}, whose files radixtop cannot read ({why}): run radixtop "
                "as root, or pass --log with the file's path on this node (the volume it is on)"
            ]
    given = flag(args, "--log-file")
    if given:
        path: str | None = given
        if not os.path.isabs(given):
            try:
                path = os.path.join(proc.cwd(), given)
            except psutil.Error:
                problems.append(f"--log-file {given} is relative and the server's working directory is unreadable")
                path = None
        if path:
            path = os.path.normpath(path)
            if container is None and not os.path.exists(path) and _root_unreadable(proc.pid):
                return None, "", [
                    f"its --log-file {given} is not on this node's filesystem as radixtop sees it and the server's "
                    "root cannot be read (a container, or another user's process): run radixtop as root, or pass "
                    "--log with the file's path on this node"
                ]
            if container is None:
                return path, "--log-file", problems
            try:
                return container.host_path(path), "--log-file", problems
            except OSError as exc:
                return None, "", [f"its --log-file {given} cannot be resolved inside {container.name}: {exc}"]
    for fd, how in ((1, "stdout"), (2, "stderr")):
        path, why = _log_target(proc.pid, fd, container)
        if path is not None:
            return path, how, problems
        if why and why not in problems:
            problems.append(why)
    return None, "", ["no log file found: " + "; ".join(problems)] if problems else ["no log file found; pass --log"]


def _root_unreadable(pid: int) -> bool:
    try:
        os.stat(f"/proc/{pid}/root/")
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def log_elsewhere(
    proc: psutil.Process, problems: list[str], container: Container | None = None
) -> tuple[LogElsewhere | None, str, list[str]]:
    """A server without a log file: where its output goes instead, with how radixtop reads it;
    else (None, "", the lines saying why and what to pass)."""
    if container is not None:
        return _container_log(proc, container, problems)
    tty = terminal_of(proc.pid)
    if tty is not None:
        pane, why = locate(proc, tty)
        if pane is not None:
            return LogElsewhere("tmux", pane.name, pane=pane), "terminal", []
        return None, "", [why]
    if stdout_is_socket(proc.pid):
        found = unit_of(read_cgroup(proc.pid))
        if found is not None:
            unit, user = found
            why = can_read(unit, user)
            if why:
                return None, "", [why]
            name = f"journal of {'user unit' if user else 'unit'} {unit}"
            return LogElsewhere("journald", name, argv=tuple(journal_argv(unit, user))), "output", []
    return None, "", problems


def _container_log(
    proc: psutil.Process, container: Container, problems: list[str]
) -> tuple[LogElsewhere | None, str, list[str]]:
    try:
        uid: int | None = proc.uids().real
    except psutil.Error:
        uid = None
    denied = ""
    for path, fmt in runtime_log_files(container, uid):
        try:
            with open(path, "rb"):
                pass
        except PermissionError:
            denied = path
            continue
        except OSError:
            continue
        return LogElsewhere("container", f"{container.name} log", path=path, path_format=fmt), "output", []
    argv = logs_argv(container)
    if argv is not None:
        return LogElsewhere("container", f"{container.name} log", argv=tuple(argv)), "output", []
    cli = container.runtime if container.runtime in ("docker", "podman") else "docker"
    read = f"{denied} is not readable" if denied else "no runtime log file or CLI answers for it"
    return None, "", [
        f"its output goes to {container.name}'s runtime ({read}): run radixtop as root (or in the {cli} group), "
        f"or pass --log with a file of it (`{cli} logs -f {container.id[:12] or 'ID'} > server.log`)"
    ]
