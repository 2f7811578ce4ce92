"""The user's runtime directory for radixtop: what one radixtop leaves for another on this node.

It holds what was seen of each server while it lived (``servers/``, incident/common/sighting.py), the
lock and status of the confirmation run in progress (incident/confirm/runlock.py), and the instrument's
flight records (``flight/``, instrument/flight.py: written inside the server as it fails), so
that a second radixtop, a bundle, or a headless ``radixtop confirm`` after the server died, finds
them. Standard library only: the instrument inside SGLang uses it too. It is private to the user:
``$XDG_RUNTIME_DIR/radixtop`` (a tmpfs that systemd empties at logout), else
``<tmp>/radixtop-<uid>``, mode 0700; ``RADIXTOP_RUNTIME_DIR`` chooses another. A directory that is
a symlink, owned by someone else, or open to others (group or other bits) is refused, never
chmod'ed: another user could have planted files in it, and a shared directory the user named is
not radixtop's to close. Files in it are written and read only through `write_file` and
`read_file`: a temporary created exclusively then renamed into place, never through a planted
link, FIFO or another user's file.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ENV_RUNTIME_DIR", "RuntimeDirError", "default_runtime_dir", "open_lock_file", "private_dir_problem",
           "read_checked", "read_file", "runtime_dir", "write_file"]

ENV_RUNTIME_DIR = "RADIXTOP_RUNTIME_DIR"


class RuntimeDirError(OSError):
    """The runtime directory cannot be used safely: one line saying what to do."""


def default_runtime_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The directory without RADIXTOP_RUNTIME_DIR, for this process's environment or another's."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "radixtop"
    return Path(tempfile.gettempdir()) / f"radixtop-{os.getuid()}"


def private_dir_problem(path: Path) -> str | None:
    """Why `path` is not a private directory of this user's, or None when it is."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        return f"{path} is not a directory of yours (a symlink, or another user's)"
    if info.st_mode & 0o077:
        return (
            f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}): "
            "another user may have put files in it"
        )
    return None


def make_private_dirs(path: Path) -> None:
    """`path` and each of its missing parents, made 0700. Path.mkdir(parents=True) makes the
    parents with the umask's mode: an instrumented server's first flight record made the runtime
    directory 0755 that way, and every radixtop after refused it as open to other users."""
    missing = []
    part = path
    while not os.path.lexists(part) and part != part.parent:  # bounded by the path's depth
        missing.append(part)
        part = part.parent
    for part in reversed(missing):
        part.mkdir(mode=0o700, exist_ok=True)


def runtime_dir(sub: str | None = None) -> Path:
    """The directory (created 0700), or a subdirectory of it; RuntimeDirError when unsafe."""
    base = Path(os.environ.get(ENV_RUNTIME_DIR) or default_runtime_dir())
    path = base / sub if sub else base
    for part in (base, path) if sub else (base,):
        try:
            part.mkdir(mode=0o700, parents=part is base, exist_ok=True)
        except OSError as exc:
            raise RuntimeDirError(
                f"cannot use {part} for radixtop's state: {exc.strerror or exc}; "
                f"set {ENV_RUNTIME_DIR} to a private directory"
            ) from None
        why = private_dir_problem(part)
        if why is not None:
            raise RuntimeDirError(f"{why}: radixtop will not keep state there; remove it, or set {ENV_RUNTIME_DIR} to "
                                  "a private directory (mode 700) of yours")
    return path


def write_file(path: Path, data: bytes) -> None:
    """Replace `path` with `data`, readable by this user alone: a temporary of a random name
    created exclusively (never through a link or onto an existing file), then renamed over `path`
    (a rename replaces a planted link, never follows it)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_file(path: Path, limit: int, *, owners: tuple[int, ...] | None = None) -> bytes | None:
    """`path`'s bytes if it is a regular file of this user's (or of one of `owners`) of at most
    `limit` bytes, else None (absent, a link, a FIFO or device, someone else's, too big). Never
    blocks on a FIFO; what is checked is the file that is read (fstat on the open descriptor)."""
    read = read_checked(path, limit, owners=owners)
    return read[0] if read is not None else None


def read_checked(
    path: Path, limit: int, *, owners: tuple[int, ...] | None = None
) -> tuple[bytes, os.stat_result] | None:
    """read_file's bytes with the stat of the file they came from."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in (owners or (os.geteuid(),)) or info.st_size > limit:
            return None
        data = fh.read(limit + 1)
    return (data, info) if len(data) <= limit else None


def open_lock_file(path: Path) -> int:
    """A descriptor on the lock file `path` (created 0600), for flock; OSError when it is not a
    regular file of this user's (a planted link, FIFO or another user's file)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise RuntimeDirError(f"{path} is not a file of yours: remove it")
    return fd
