"""Another node's bundle stream unpacked as hostile (radixtop.incident.bundle.untar): a bundle's
files come out as they went in; a link, a device, an absolute name, `..`, a second top folder,
too many members or too many bytes refuse the whole archive in one line and leave nothing."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from radixtop.incident.bundle import untar
from radixtop.incident.bundle.untar import UnpackError, unpack_bundle

TOP = "radixtop-bundle-20261205-120000-manual"


def archive(path: Path, members: list[tuple[str, bytes | str | None]]) -> Path:
    """A .tar.gz of (name, content): bytes a file, None a folder, str a symlink to it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in members:
            info = tarfile.TarInfo(name)
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    path.write_bytes(buf.getvalue())
    return path


def test_a_bundles_files_come_out_as_they_went_in(tmp_path: Path) -> None:
    src = archive(tmp_path / "b.tar.gz", [(TOP, None), (f"{TOP}/MANIFEST.json", b"{}"),
                                          (f"{TOP}/evidence/01-x.log", b"line\n")])
    assert unpack_bundle(src, tmp_path / "node") == 2
    assert (tmp_path / "node" / "evidence" / "01-x.log").read_bytes() == b"line\n"
    assert (tmp_path / "node" / "MANIFEST.json").read_bytes() == b"{}"


FIRST = (f"{TOP}/first.txt", b"written, then removed with the rest")


@pytest.mark.parametrize(("members", "says"), [
    ([FIRST, (f"{TOP}/../../x", b"x")], "climbs out of its folder"),
    ([FIRST, (f"{TOP}/passwd", "/etc/passwd")], "is a link or a device"),
    ([FIRST, ("radixtop-bundle-other/x", b"x")], "lies outside its bundle folder"),
    ([("/etc/radixtop-bundle-x", b"x")], "has an absolute name"),
    ([("home", None)], "its top folder 'home' is not a radixtop bundle's"),
    ([], "the archive is empty"),
])
def test_an_archive_that_is_not_a_bundle_is_refused_whole(tmp_path: Path, members: list, says: str) -> None:
    src = archive(tmp_path / "b.tar.gz", members)
    with pytest.raises(UnpackError, match=says):
        unpack_bundle(src, tmp_path / "node")
    assert not (tmp_path / "node").exists() and not (tmp_path / "x").exists()


def test_a_fifo_and_junk_are_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        fifo = tarfile.TarInfo(f"{TOP}/pipe")
        fifo.type = tarfile.FIFOTYPE
        tar.addfile(fifo)
    (tmp_path / "fifo.tar.gz").write_bytes(buf.getvalue())
    with pytest.raises(UnpackError, match="is a link or a device"):
        unpack_bundle(tmp_path / "fifo.tar.gz", tmp_path / "a")
    (tmp_path / "junk.tar.gz").write_bytes(b"Welcome to gpu-7!\n")
    with pytest.raises(UnpackError, match="^not a readable tar.gz"):
        unpack_bundle(tmp_path / "junk.tar.gz", tmp_path / "b")


def test_too_many_members_or_bytes_are_refused_before_they_are_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(untar, "MAX_MEMBERS", 3)
    src = archive(tmp_path / "many.tar.gz", [(f"{TOP}/{i}", b"x") for i in range(5)])
    with pytest.raises(UnpackError, match="more than 3 members"):
        unpack_bundle(src, tmp_path / "a")
    monkeypatch.setattr(untar, "MAX_MEMBERS", 50_000)
    monkeypatch.setattr(untar, "MAX_TOTAL_BYTES", 10)
    src = archive(tmp_path / "big.tar.gz", [(f"{TOP}/a", b"123456"), (f"{TOP}/b", b"123456")])
    with pytest.raises(UnpackError, match="its members hold more than"):
        unpack_bundle(src, tmp_path / "b")
    assert not (tmp_path / "b").exists()
