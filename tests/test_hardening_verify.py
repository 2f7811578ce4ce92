"""radixtop bundle --verify streams: a small .tar.gz that inflates to hundreds of MiB is refused
with one line, in little memory; a real bundle still verifies. Real archives and subprocesses."""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
import tarfile
from pathlib import Path

from incident_helpers import write_lines

from radixtop.incident.bundle.bundle import take_bundle, verify_bundle

BOMB = 300 << 20  # inflated bytes of the one member


class _Zeros(io.RawIOBase):
    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def _bomb(path: Path) -> None:
    with gzip.open(path, "wb", compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        manifest = b'{"format": "radixtop-bundle", "files": []}'
        info = tarfile.TarInfo("radixtop-bundle-x/MANIFEST.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        info = tarfile.TarInfo("radixtop-bundle-x/logs/zeros.log")
        info.size = BOMB
        tar.addfile(info, io.BufferedReader(_Zeros(BOMB), 1 << 20))


def test_a_compression_bomb_is_refused_in_one_line_and_little_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.tar.gz"
    _bomb(bomb)
    assert bomb.stat().st_size < 2 << 20
    done = subprocess.run(
        # The peak of this process's own memory (VmHWM): ru_maxrss would also count the parent's
        # pages a vfork'd child shared before its exec (pytest's, hundreds of MiB late in a run).
        [sys.executable, "-c", "import sys\nfrom radixtop.cli import main\nrc = main(sys.argv[1:])\n"
         "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1]\n"
         "print('maxrss_kib', hwm, file=sys.stderr)\nsys.exit(rc)",
         "bundle", "--verify", str(bomb)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 2, done.stderr
    assert "zeros.log" in lines[0] and "more than a bundle ever writes" in lines[0]
    assert "Traceback" not in done.stderr
    maxrss_mib = int(lines[1].split()[1]) >> 10
    assert maxrss_mib < 200, f"verify peaked at {maxrss_mib} MiB"


def test_a_real_bundle_still_verifies_from_its_archive_and_tampering_is_caught(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    write_lines(log, [f"[2026-12-02 14:00:01 TP0] line {i}" for i in range(300)])
    result = take_bundle(tmp_path / "out", logs=[str(log)])
    assert verify_bundle(result.path) == [] and verify_bundle(result.archive) == []
    (result.path / "README.txt").write_text("changed\n")
    assert verify_bundle(result.path) == ["README.txt: SHA-256 differs from the manifest"]
