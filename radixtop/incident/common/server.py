"""The live server, as the incident actions see it: its URL, its process, its argv, its logs.

Everything here reads; nothing starts, stops or changes a process. Each lookup that can fail
(another user's process, a server in a container, a dead pid) returns None and the caller writes
a note, because evidence must be collected even when half the world is unreadable.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

__all__ = [
    "API_KEY_ENV",
    "ServerError",
    "auth_headers",
    "base_url",
    "directory_trust",
    "executable_trust",
    "listening_pid",
    "process_argv",
    "process_cwd",
    "process_environ",
    "process_python",
    "process_tree",
    "server_interpreter",
    "snapshot_process",
    "stdout_log_paths",
    "url_port",
]

# The live server's API key, when it runs with --api-key: read from the environment, never a flag
# (a flag would land in shell history and in `ps`).
API_KEY_ENV = "RADIXTOP_API_KEY"


class ServerError(ValueError):
    """A URL or server that cannot be used: one line saying what to do."""


def base_url(url: str) -> str:
    """``http://host:port`` without a trailing slash; one-line error for anything else."""
    text = (url or "").strip().rstrip("/")
    if "://" not in text:
        text = f"http://{text}"
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerError(f"--url {url!r} is not an http URL; pass e.g. --url http://127.0.0.1:30000")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ServerError(f"--url {url!r} has a bad port; pass e.g. --url http://127.0.0.1:30000") from None
    if parts.path not in ("", "/") or parts.query:
        raise ServerError(f"--url {url!r} has a path; pass the server's base URL, e.g. http://127.0.0.1:30000")
    return f"{parts.scheme}://{parts.netloc}"


def url_port(url: str) -> int | None:
    parts = urlsplit(url)
    try:
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def auth_headers(env: Mapping[str, str] | None = None) -> dict[str, str]:
    key = (os.environ if env is None else env).get(API_KEY_ENV, "")
    return {"Authorization": f"Bearer {key}"} if key else {}


def listening_pid(port: int | None) -> int | None:
    """The pid listening on this TCP port on this machine, or None (not found, not ours to see)."""
    if not port:
        return None
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return conn.pid
    return None


def _proc(pid: int | None) -> psutil.Process | None:
    if pid is None:
        return None
    try:
        return psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def process_tree(pid: int | None) -> list[psutil.Process]:
    """The process and its descendants (those still there), parent first."""
    proc = _proc(pid)
    if proc is None:
        return []
    try:
        return [proc, *proc.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return [proc]


def process_argv(pid: int | None) -> list[str] | None:
    proc = _proc(pid)
    if proc is None:
        return None
    try:
        return list(proc.cmdline()) or None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def process_environ(pid: int | None) -> dict[str, str] | None:
    proc = _proc(pid)
    try:
        return dict(proc.environ()) if proc is not None else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return None


def process_cwd(pid: int | None) -> str | None:
    proc = _proc(pid)
    try:
        return proc.cwd() if proc is not None else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return None


def executable_trust(path: str) -> str | None:
    """Why radixtop must not run this program, or None when it may.

    Whoever can write a program, or the directory that holds it, chooses what it does: the file
    (a link and its target), the directories holding them and a virtual environment's
    ``pyvenv.cfg`` (it names the interpreter's home) must belong to radixtop's own user or root
    and be writable by neither group nor others.
    """
    link = os.path.abspath(path)
    real = os.path.realpath(link)
    checks = [real, os.path.dirname(real), os.path.dirname(link)]
    for cfg in (os.path.join(os.path.dirname(link), "pyvenv.cfg"),
                os.path.join(os.path.dirname(os.path.dirname(link)), "pyvenv.cfg")):
        if os.path.exists(cfg):
            checks += [cfg, os.path.dirname(cfg)]
    for item in dict.fromkeys(checks):
        why = _ownership_problem(item)
        if why is not None:
            return why
    return None


def directory_trust(path: str) -> str | None:
    """Why radixtop must not load code from (or start a server in) this directory, or None:
    it must belong to radixtop's user or root and be writable by neither group nor others, and
    every directory above it likewise, or sticky (as /tmp is: nobody else can rename it away)."""
    real = os.path.realpath(path)
    current = real
    while True:
        why = _ownership_problem(current, sticky_ok=current != real)
        if why is not None:
            return why
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _ownership_problem(path: str, *, sticky_ok: bool = False) -> str | None:
    """The ownership rule for one path: radixtop's user's or root's, writable by neither group
    nor others (`sticky_ok`: unless sticky, for a directory above the one that matters)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{path} cannot be checked ({exc.strerror or exc})"
    if st.st_uid not in (os.geteuid(), 0):
        return f"{path} belongs to uid {st.st_uid}, neither you nor root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def server_interpreter(pid: int | None) -> tuple[str | None, str]:
    """The server's Python interpreter if radixtop may run it (for collect_env), and why or why not.

    The program is the one the kernel says the process runs (``/proc/PID/exe``). argv[0] is the
    process's own choice (``exec -a /any/dir/python``) and never names what runs; it is used only
    as a path to that same file (a virtual environment's python is a link to the base
    interpreter, and run through the link the environment's packages are seen). Whichever path
    is run must pass :func:`executable_trust`.
    """
    proc = _proc(pid)
    if proc is None:
        return None, f"process {pid} is gone or not readable"
    try:
        exe = proc.exe()
        argv0 = (proc.cmdline() or [""])[0]
        cwd = proc.cwd()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return None, f"the executable of process {pid} is not readable (another user's process?)"
    if not exe or "python" not in Path(exe).name.lower():
        return None, f"process {pid} runs {exe or 'an unknown program'}, not a Python interpreter"
    real = os.path.realpath(exe)
    link = _argv0_path(proc, argv0, cwd)
    if link and link != exe and os.path.realpath(link) == real and executable_trust(link) is None:
        return link, (
            f"process {pid} runs {real}; its argv[0] {link} is a link to that same file (its virtual "
            "environment), and both belong to you or root and are writable by no one else"
        )
    why = executable_trust(exe)
    if why is not None:
        return None, f"process {pid}'s interpreter {exe} is not run: {why}"
    return exe, f"process {pid} runs {exe}, which belongs to you or root and is writable by no one else"


def _argv0_path(proc: psutil.Process, argv0: str, cwd: str) -> str | None:
    """argv[0] as a path: relative to the process's directory, or looked up on its PATH."""
    if not argv0:
        return None
    if os.sep in argv0:
        return os.path.normpath(os.path.join(cwd, argv0))
    try:
        search = proc.environ().get("PATH")
    except (psutil.Error, OSError):
        return None
    return shutil.which(argv0, path=search) if search else None


def process_python(pid: int | None) -> str | None:
    """The server's interpreter, when radixtop may run it (see :func:`server_interpreter`)."""
    return server_interpreter(pid)[0]


def stdout_log_paths(pid: int | None) -> list[str]:
    """Regular files the process writes its stdout/stderr to: where SGLang's log goes when the
    server was started with ``> server.log 2>&1``."""
    paths: list[str] = []
    if pid is None:
        return paths
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if stat.S_ISREG(os.stat(target).st_mode) and target not in paths:
                paths.append(target)
        except OSError:
            continue
    return paths


def snapshot_process(proc: psutil.Process) -> dict[str, Any]:
    """One process as JSON (what psutil can read of it; unreadable fields say why)."""
    out: dict[str, Any] = {"pid": proc.pid}
    readers = {
        "ppid": proc.ppid,
        "name": proc.name,
        "exe": proc.exe,
        "cmdline": proc.cmdline,
        "status": proc.status,
        "create_time": proc.create_time,
        "cwd": proc.cwd,
        "username": proc.username,
        "num_threads": proc.num_threads,
        "cpu_times": lambda: proc.cpu_times()._asdict(),
        "memory_info": lambda: proc.memory_info()._asdict(),
        "open_files": lambda: [f.path for f in proc.open_files()][:200],
        "listening": lambda: sorted(
            {f"{c.laddr.ip}:{c.laddr.port}" for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        ),
        "environ": lambda: dict(proc.environ()),
    }
    for key, read in readers.items():
        try:
            out[key] = read()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            out[key] = None
            out.setdefault("unreadable", {})[key] = "process gone"
        except (psutil.AccessDenied, OSError) as exc:
            out[key] = None
            out.setdefault("unreadable", {})[key] = type(exc).__name__
    return out
