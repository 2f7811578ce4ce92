"""JSON and TOML from outside (a server's answer, a trace, a keymap, a catalog) decoded within
bounds: a size cap before parsing, the parser's recursion turned into one line, and values nested
deeper than MAX_DEPTH cut (so nothing that walks the result recurses without end). Every failure
is a ValueError with one line that names what was read; standard library only, imported lazily
(the scan path starts without json's and tomllib's import costs)."""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_DEPTH", "load_json", "load_toml", "prune_depth", "read_user_file"]

MAX_DEPTH = 64  # no document radixtop reads nests deeper; a hostile one nests thousands deep


def read_user_file(path: str, max_bytes: int) -> bytes:
    """A file the user named (a keymap, a signature catalog): followed through links as the user
    would, but only a regular file of at most `max_bytes` is read; a FIFO or a device (which would
    block or never end) is refused at once, in a ValueError of one line. OSError as the system
    raises it (FileNotFoundError for a file that is not there)."""
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: not a regular file (a FIFO or a device?); give a file")
        _size_check(info.st_size, path, max_bytes)
        data = fh.read(max_bytes + 1)
    _size_check(len(data), path, max_bytes)
    return data


def _size_check(size: int, what: str, max_bytes: int) -> None:
    if size > max_bytes:
        raise ValueError(f"{what}: {size} bytes is more than the limit of {max_bytes}; refusing it")


def load_json(data: bytes | bytearray | memoryview | str, what: str, *, max_bytes: int,
              cut_depth: int | None = MAX_DEPTH) -> Any:
    """A JSON value; ``cut_depth``: objects and arrays nested deeper are replaced by a string
    saying so (None keeps the value whole, for callers that check every level they read)."""
    import json

    _size_check(len(data), what, max_bytes)
    try:
        value = json.loads(bytes(data) if isinstance(data, (bytearray, memoryview)) else data)
    except RecursionError:
        raise ValueError(f"{what}: JSON nested too deeply; refusing it") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except ValueError as exc:  # UnicodeDecodeError, and any other the parser raises
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{what}: not valid JSON ({first[:120]})") from None
    return value if cut_depth is None else prune_depth(value, cut_depth)


def load_toml(data: bytes | str, what: str, *, max_bytes: int, cut_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """A TOML document; tomllib.TOMLDecodeError (a ValueError) passes through for callers that
    point at its line, every other failure is a one-line ValueError."""
    import tomllib

    _size_check(len(data), what, max_bytes)
    try:
        text = data if isinstance(data, str) else data.decode("utf-8")
    except UnicodeDecodeError as exc:
        assert isinstance(data, bytes)
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{what}:{line}: not UTF-8 text (byte {data[exc.start]:#04x}); save it as UTF-8") from None
    try:
        doc = tomllib.loads(text)
    except RecursionError:
        raise ValueError(f"{what}: TOML nested too deeply; refusing it") from None
    return prune_depth(doc, cut_depth)


def prune_depth(obj: Any, limit: int = MAX_DEPTH) -> Any:
    """A copy of a JSON value whose objects and arrays nested deeper than ``limit`` are replaced
    by a string saying so; the rest is kept. Iterative: it must not recurse itself."""
    holder: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(obj, holder, 0, 0)]
    while stack:
        value, parent, key, depth = stack.pop()
        if isinstance(value, (dict, list, tuple)) and depth >= limit:
            parent[key] = f"[nested deeper than {limit} levels: cut]"
        elif isinstance(value, dict):
            mapping = parent[key] = dict.fromkeys(value)  # keys in order; values filled below
            stack.extend((v, mapping, k, depth + 1) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            items = parent[key] = [None] * len(value)
            stack.extend((v, items, i, depth + 1) for i, v in enumerate(value))
        else:
            parent[key] = value
    return holder[0]
