"""A compressed log given to the UI (`radixtop --log server.log.gz`) is read, decompressed, once:
its lines and findings appear, and a notice says it is not followed. Real files; tmux end to end."""

from __future__ import annotations

import asyncio
import gzip
import shutil
import sys
from pathlib import Path

import pytest
from tmux_helpers import Tmux

from radixtop.probes.follow import LogFollower

SIGNATURE = (
    "[2026-12-02 14:00:03 TP0] sglang.srt.mem_cache.radix_cache.RadixCacheError: "
    "Failed to lock memory page during dynamic prefix eviction"
)


def _write_gz(path: Path, lines: list[str], members: int = 1) -> None:
    per = -(-len(lines) // members)
    with open(path, "wb") as f:  # concatenated members, as `cat a.gz b.gz` makes
        for i in range(members):
            f.write(gzip.compress("".join(f"{x}\n" for x in lines[i * per : (i + 1) * per]).encode()))


async def _follow(pattern: str, want: int) -> tuple[list[str], list[tuple[str, str]]]:
    texts: list[str] = []
    notices: list[tuple[str, str]] = []
    async with LogFollower([pattern]) as follower:  # as the UI: a file that exists starts at its end
        for _ in range(200):
            batch = follower.take()
            if batch is not None:
                texts += [r.text for r in batch.records]
                notices += [(n.kind, n.message) for n in batch.notices]
            if len(texts) >= want and notices:
                break
            await asyncio.sleep(0.02)
    return texts, notices


def test_a_compressed_log_is_read_once_with_a_notice(tmp_path: Path) -> None:
    lines = [f"[2026-12-02 14:00:01 TP0] line {i}" for i in range(20000)] + [SIGNATURE]
    log = tmp_path / "server.log.1.gz"
    _write_gz(log, lines, members=3)
    texts, notices = asyncio.run(_follow(str(log), len(lines)))
    assert texts == lines
    assert ("compressed", f"{log} is compressed: read once from its start, not followed") in notices
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(log.read_bytes()[:-20])  # a copy cut short
    texts, notices = asyncio.run(_follow(str(cut), 1))
    assert texts and texts == lines[: len(texts)]
    assert any(kind == "error" and "ends before its end-of-stream marker" in msg for kind, msg in notices)


@pytest.mark.tmux
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_ui_shows_a_compressed_logs_lines_and_findings(tmp_path: Path) -> None:
    log = tmp_path / "server.log.gz"
    _write_gz(log, [f"[2026-12-02 14:00:01 TP0] line {i}" for i in range(100)] + [SIGNATURE])
    tmux = Tmux(120, 40)
    try:
        tmux.start([sys.executable, "-m", "radixtop", "--log", str(log), "--no-discover", "--no-gpu"], tmp_path)
        screen = tmux.wait_for(lambda s: "Findings (1)" in s, "the finding from the .gz", timeout=30)
        assert "RadixCacheError" in screen and "line 99" in screen
    finally:
        tmux.kill()
