"""Files radixtop can always rebuild (the validated built-in catalog, compiled hyperscan databases),
kept between runs so that `radixtop scan` starts like a grep.

One directory: $RADIXTOP_CACHE_DIR (empty turns caching off), else $XDG_CACHE_HOME/radixtop, else
~/.cache/radixtop. Every file starts with the exact key it was built from, which the reader
compares byte for byte, so a file name is only a hint (a crc32) and a collision or a stale file
costs a rebuild, never a wrong result. Reads and writes never raise: a cache that cannot be used
is the same as no cache. Only the standard library, nothing slow to import.
"""

from __future__ import annotations

import os
import zlib

CACHE_ENV = "RADIXTOP_CACHE_DIR"
_MAGIC = b"radixtop-cache 1\n"


def cache_dir() -> str | None:
    """Where cached files go, or None when caching is off."""
    configured = os.environ.get(CACHE_ENV)
    if configured is not None:
        return configured or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "radixtop")


def cache_path(prefix: str, key: bytes, suffix: str) -> str | None:
    """A file name for `key` (e.g. "hs-1a2b3c4d.db"), or None when caching is off."""
    directory = cache_dir()
    if directory is None:
        return None
    return os.path.join(directory, f"{prefix}-{zlib.crc32(key):08x}{suffix}")


def read(path: str | None, key: bytes) -> bytes | None:
    """The payload stored for exactly `key` at `path`, or None (absent, stale, damaged, unreadable)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    head = _header(key)
    if not data.startswith(head) or len(data) < len(head) + 4:
        return None
    payload = data[len(head) + 4 :]
    if zlib.crc32(payload) != int.from_bytes(data[len(head) : len(head) + 4], "little"):
        return None  # damaged (truncated by a full disk, a bit flip): rebuild
    return payload


def write(path: str | None, key: bytes, payload: bytes) -> None:
    """Store payload for `key` atomically (readers see the old file or the new one); errors ignored."""
    if path is None:
        return
    tmp = f"{path}.{os.getpid()}-{os.urandom(4).hex()}.tmp"  # unique per process and thread
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(_header(key) + zlib.crc32(payload).to_bytes(4, "little") + payload)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _header(key: bytes) -> bytes:
    return _MAGIC + len(key).to_bytes(8, "little") + key
