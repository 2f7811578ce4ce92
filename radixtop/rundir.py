"""The user's runtime directory for radixtop: what one radixtop leaves for another on this node.

It holds what was seen of each server while it lived (``servers/``, incident/sighting.py), the
lock and status of the confirmation run in progress (incident/runlock.py), and the instrument's
flight records (``flight/``, instrument/flight.py: written inside the server as it fails), so
that a second radixtop, a bundle, or a headless ``radixtop confirm`` after the server died, finds
them. Standard library only: the instrument inside SGLang uses it too. It is private to the user:
``$XDG_RUNTIME_DIR/radixtop`` (a tmpfs that systemd empties at logout), else
``<tmp>/radixtop-<uid>``, mode 0700; ``RADIXTOP_RUNTIME_DIR`` chooses another. A directory that is
a symlink, or owned by someone else, is refused: another user could plant or read what we write.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ENV_RUNTIME_DIR", "RuntimeDirError", "default_runtime_dir", "runtime_dir"]

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


def runtime_dir(sub: str | None = None) -> Path:
    """The directory (created 0700), or a subdirectory of it; RuntimeDirError when unsafe."""
    base = Path(os.environ.get(ENV_RUNTIME_DIR) or default_runtime_dir())
    path = base / sub if sub else base
    for part in (base, path) if sub else (base,):
        try:
            part.mkdir(mode=0o700, parents=part is base, exist_ok=True)
            info = os.lstat(part)
        except OSError as exc:
            raise RuntimeDirError(
                f"cannot use {part} for radixtop's state: {exc.strerror or exc}; set {ENV_RUNTIME_DIR} to a private directory"
            ) from None
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise RuntimeDirError(
                f"{part} is not a directory of yours (a symlink, or another user's): radixtop will not "
                f"keep state there; set {ENV_RUNTIME_DIR} to a private directory"
            )
        if info.st_mode & 0o077:
            os.chmod(part, 0o700)
    return path
