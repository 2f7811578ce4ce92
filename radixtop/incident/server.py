"""The live server, as the incident actions see it: its URL, its process, its argv, its logs.

Everything here reads; nothing starts, stops or changes a process. Each lookup that can fail
(another user's process, a server in a container, a dead pid) returns None and the caller writes
a note, because evidence must be collected even when half the world is unreadable.
"""

from __future__ import annotations

import ipaddress
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
    "is_loopback_url",
    "listening_pid",
    "process_argv",
    "process_cwd",
    "process_environ",
    "process_python",
    "process_tree",
    "snapshot_process",
    "stdout_log_paths",
    "url_port",
]

# The live server's API key, when it runs with --api-key: read from the environment, never a flag
# (a flag would land in shell history and in `ps`).
API_KEY_ENV = "RADIXTOP_API_KEY"
MAX_JSON_BYTES = 16 << 20


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


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


def process_python(pid: int | None) -> str | None:
    """The interpreter the process runs, when it is a Python (for collect_env).

    argv[0] first: a virtual environment's python is a symlink whose target (what exe() gives)
    would run without the environment's packages.
    """
    proc = _proc(pid)
    if proc is None:
        return None
    try:
        argv0 = (proc.cmdline() or [""])[0]
        cwd = proc.cwd()
        exe = proc.exe()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return None
    if "python" in Path(argv0).name:
        candidate = Path(cwd, argv0) if not os.path.isabs(argv0) and os.sep in argv0 else Path(argv0)
        if candidate.is_absolute() and candidate.is_file():
            return str(candidate)
        found = shutil.which(argv0) if os.sep not in argv0 else None
        if found and os.path.realpath(found) == os.path.realpath(exe):
            return found
    return exe if exe and "python" in Path(exe).name else None


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
