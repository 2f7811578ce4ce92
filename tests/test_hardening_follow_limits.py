"""The limits of following a log by path, said rather than lost silently: rotation faster than the
follower polls, and copytruncate with no pause. Real files renamed, copied and truncated; the
follower's core (_Tailer) polled by hand, so that the race is the same every run."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from radixtop.probes.tailer import Tailer as _Tailer


def _lines(start: int, n: int) -> str:
    return "".join(f"[2026-12-02 14:00:01 TP0] line {i}\n" for i in range(start, start + n))


def _tailer(path: Path) -> _Tailer:
    tailer = _Tailer([str(path)], from_start=True, max_line=65536)
    tailer.start()
    return tailer


def _poll(tailer: _Tailer) -> tuple[list[str], list[tuple[str, str]]]:
    texts: list[str] = []
    notices: list[tuple[str, str]] = []
    for _ in range(20):  # a rotated file is read out first, then the new one
        tailer.poll(time.monotonic())
        runs, got, _ = tailer.take_runs()
        texts += [t for run in runs for t in run.texts]
        notices += [(n.kind, n.message) for n in got]
        time.sleep(0.06)
    return texts, notices


def test_copytruncate_without_a_pause_reads_the_unread_tail_from_the_copy(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(_lines(0, 1000))
    tailer = _tailer(log)
    try:
        texts, _ = _poll(tailer)
        assert len(texts) == 1000
        with open(log, "a") as f:  # written, then copied and emptied before the follower looks
            f.write(_lines(1000, 500))
        shutil.copyfile(log, tmp_path / "server.log.1")
        os.truncate(log, 0)
        with open(log, "a") as f:
            f.write(_lines(1500, 10))
        texts, notices = _poll(tailer)
    finally:
        tailer.close()
    assert texts == _lines(1000, 510).splitlines(), "lines lost to the truncation"
    assert any(kind == "truncated" and "(500 lines) were read; they were read from its copy server.log.1" in msg
               for kind, msg in notices), notices


def test_copytruncate_with_no_copy_left_counts_the_bytes_it_could_not_read(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(_lines(0, 100))
    tailer = _tailer(log)
    try:
        _poll(tailer)
        with open(log, "a") as f:  # more than one poll reads (4 MiB a file)
            f.write(_lines(100, 150_000))
        size = log.stat().st_size
        tailer.poll(time.monotonic())
        runs, _, _ = tailer.take_runs()
        read = sum(len(t) + 1 for run in runs for t in run.texts) + len(_lines(0, 100))
        assert read < size
        os.truncate(log, 0)  # the copy went elsewhere
        _, notices = _poll(tailer)
    finally:
        tailer.close()
    lost = [msg for kind, msg in notices if kind == "lost"]
    assert len(lost) == 1, notices
    m = re.search(r"truncated before ([\d,]+) bytes after byte ([\d,]+) were read; they could not be read", lost[0])
    unread, offset = (int(x.replace(",", "")) for x in m.groups())
    assert unread + offset == size and read <= offset < read + 200  # (a partial last line was read too)


def test_rotation_faster_than_the_poll_counts_the_files_never_read(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(_lines(0, 10))
    old = tmp_path / "server.log.9"
    old.write_text("an old rotation, long read\n")
    os.utime(old, (1_700_000_000, 1_700_000_000))
    tailer = _tailer(log)
    try:
        _poll(tailer)
        sizes = []
        for i in range(1, 4):  # three rotations between two polls
            log.rename(tmp_path / f"server.log.{i}")
            log.write_text(_lines(i * 100, 20))
            sizes.append(log.stat().st_size)
        texts, notices = _poll(tailer)
    finally:
        tailer.close()
    assert texts[-20:] == _lines(300, 20).splitlines()  # the newest file
    lost = [msg for kind, msg in notices if kind == "lost"]
    assert len(lost) == 1 and "2 file(s)" in lost[0] and f"{sum(sizes[:2]):,} bytes" in lost[0], notices
    assert "server.log.2" in lost[0] and "server.log.3" in lost[0] and "server.log.9" not in lost[0]
