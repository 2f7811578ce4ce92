"""Another node's bundle, as its `radixtop bundle --stream` sent it (a .tar.gz of one folder),
unpacked into a folder of this bundle: the archive came from another machine, so it is taken as
hostile.

Only regular files and folders under one top folder named like a bundle are taken; a link, a
device, an absolute name or one with `..` refuses the whole archive (tarfile's "data" filter is
applied as well, and the file is opened without following a link), as do more than MAX_MEMBERS
members, a member over MAX_MEMBER_BYTES or more than MAX_TOTAL_BYTES in all (the sizes the tar
headers declare, counted before a byte is written). What was unpacked before a refusal is removed.
"""

from __future__ import annotations

import re
import shutil
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from radixtop.textsafe import printable_line

__all__ = ["MAX_MEMBERS", "MAX_MEMBER_BYTES", "MAX_TOTAL_BYTES", "UnpackError", "unpack_bundle"]

MAX_MEMBERS = 50_000
MAX_MEMBER_BYTES = 256 << 20  # as verify_bundle: far above any file a bundle writes
MAX_TOTAL_BYTES = 2 << 30
_TOP = re.compile(r"radixtop-bundle-[A-Za-z0-9._-]{1,120}")


class UnpackError(Exception):
    """The archive is refused; one line saying why."""


def unpack_bundle(archive: Path, dest: Path) -> int:
    """Unpack `archive` (a .tar.gz of one bundle folder) into `dest` (created here; it must not
    exist; its parent must), the top folder's contents directly in it. Returns the number of
    files; raises UnpackError, with `dest` removed, when the archive is refused."""
    dest.mkdir()
    try:
        return _unpack(archive, dest)
    except UnpackError:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise UnpackError(f"not a readable tar.gz ({printable_line(str(exc), 120)})") from None


def _unpack(archive: Path, dest: Path) -> int:
    top: str | None = None
    members = files = total = 0
    with tarfile.open(archive, "r|gz") as tar:  # a stream: each member read once, in order
        for member in tar:
            members += 1
            if members > MAX_MEMBERS:
                raise UnpackError(f"more than {MAX_MEMBERS:,} members; not a radixtop bundle")
            parts = _parts(member.name)
            if top is None:
                top = parts[0]
                if not _TOP.fullmatch(top):
                    raise UnpackError(f"its top folder {printable_line(top, 60)!r} is not a radixtop bundle's")
            elif parts[0] != top:
                raise UnpackError(f"member {printable_line(member.name, 80)!r} lies outside its bundle folder")
            if not (member.isfile() or member.isdir()):
                raise UnpackError(f"member {printable_line(member.name, 80)!r} is a link or a device, "
                                  "which a bundle never holds")
            if len(parts) == 1:
                continue  # the top folder itself
            if member.isfile():
                if member.size > MAX_MEMBER_BYTES:
                    raise UnpackError(f"member {printable_line(member.name, 80)!r} says it holds "
                                      f"{member.size:,} bytes, more than a bundle ever writes")
                total += member.size
                if total > MAX_TOTAL_BYTES:
                    raise UnpackError(f"its members hold more than {MAX_TOTAL_BYTES:,} bytes, more than a bundle holds")
                files += 1
            inner = member.replace(name="/".join(parts[1:]), mode=0o755 if member.isdir() else 0o644,
                                   uid=0, gid=0, uname="", gname="", deep=False)
            try:
                tar.extract(inner, dest, set_attrs=False, filter="data")
            except tarfile.FilterError as exc:
                raise UnpackError(f"member {printable_line(member.name, 80)!r} refused: "
                                  f"{printable_line(str(exc), 80)}") from None
    if top is None:
        raise UnpackError("the archive is empty")
    return files


def _parts(name: str) -> tuple[str, ...]:
    """A member's name as its parts; an absolute name or `..` refuses the archive."""
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith("/") or "\\" in name:
        raise UnpackError(f"member {printable_line(name, 80)!r} has an absolute name")
    parts = tuple(p for p in path.parts if p != ".")
    if not parts or ".." in parts:
        raise UnpackError(f"member {printable_line(name, 80)!r} climbs out of its folder (..)")
    return parts
