"""`radixtop sim --kv-events-config ... --no-instrument` (SGLang publishing kv-events, without
radixtop's plugin) and `radixtop --url`: the radix pane shows each DP rank's mirrored tree, names
its source and shows lock counts as unknown. In the app (Textual's Pilot) and in a real terminal."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest
from pane_helpers import start_sim, stop
from tmux_helpers import Tmux

from radixtop.tui.app import RadixtopApp
from radixtop.tui.panes import LiveOptions
from radixtop.widgets.radix import RadixPane, RadixTreeView

pytestmark = pytest.mark.slow


def free_port_pair() -> int:
    """A free loopback port whose successor is free too (DP rank 1 publishes on base + 1)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            base = a.getsockname()[1]
            if base >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", base + 1))
                except OSError:
                    continue
                return base
    raise AssertionError("no two consecutive free ports on 127.0.0.1")


def kv_sim(workdir: Path):
    config = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port_pair()}",
              "replay_endpoint": f"tcp://127.0.0.1:{free_port_pair()}"}
    return start_sim(workdir, "--dp-size", "2", "--no-instrument", "--kv-events-config", json.dumps(config))


def send_prompts(url: str, n: int = 6) -> None:
    with httpx.Client(timeout=10) as client:
        for i in range(n):
            text = "the shared system prompt of every request " + f"and question number {i} " * 3
            r = client.post(url + "/generate", json={"text": text, "sampling_params": {"max_new_tokens": 4}})
            assert r.status_code == 200, r.text


async def _until(pilot, predicate, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.1)


def _summary(app) -> str:
    return app.query_one("#radix-summary").render().plain


async def test_the_radix_pane_shows_the_mirrored_tree_of_each_dp_rank(tmp_path: Path) -> None:
    proc, url, log = kv_sim(tmp_path / "sim")
    try:
        send_prompts(url)  # before radixtop subscribes: the replay endpoint brings these
        info = httpx.get(url + "/server_info", timeout=5).json()
        assert info["radixtop_instrument"] == [] and "tcp://127.0.0.1" in info["kv_events_config"]
        app = RadixtopApp(log_patterns=[str(log)], from_start=True, live=LiveOptions(url=url, logs=(str(log),)))
        async with app.run_test(size=(160, 48)) as pilot:
            await _until(pilot, lambda: app.panes is not None and app.panes.mounted, "the panes mounted")
            title = lambda: app.query_one("#radix-title").render().plain  # noqa: E731
            await _until(pilot, lambda: "dp 0" in title() and "dp 1" in title(), "both DP ranks in the radix pane")
            pane = app.query_one(RadixPane)
            tree = app.query_one(RadixTreeView)

            def blocks_shown() -> bool:
                view = pane._board.ranks.get(pane.selected) if pane._board else None
                return view is not None and view.snapshot is not None and view.snapshot.tree.walked_tokens > 0

            for _ in range(2):  # the prompts went to one rank or both: find one holding blocks
                if blocks_shown():
                    break
                await pilot.press("right_square_bracket")
                await pilot.pause(0.5)
            await _until(pilot, blocks_shown, "a rank with mirrored blocks")
            summary = _summary(app)
            assert "source kv-events: blocks, no locks" in summary
            assert "lock counts unknown" in summary and "blocks" in summary
            root = tree.render_line(1).text  # below the line saying why the rows are ids
            assert "root ·" in root and " ? " in root, root
            assert re.search(r"pool [\d,]+", summary) is None  # the pool's sizes are not in kv-events: no numbers
            send_prompts(url, 3)  # live events move the tree
            before = pane._board.version
            await _until(pilot, lambda: pane._board.version > before, "the live events in the pane")
    finally:
        stop(proc)


@pytest.mark.tmux
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_radixtop_url_shows_the_mirrored_tree_in_a_real_terminal(tmp_path: Path) -> None:
    proc, url, log = kv_sim(tmp_path / "sim")
    tmux = Tmux(160, 48)
    repo = Path(__file__).resolve().parents[1]
    try:
        send_prompts(url)
        tmux.start([sys.executable, "-m", "radixtop", "--url", url, "--log", str(log)], repo,
                   env={**os.environ, "TMPDIR": str(tmp_path)})  # its runtime files in the test's own
        screen = tmux.wait_for(lambda s: "dp 0" in s and "dp 1" in s and "kv-events: blocks, no locks" in s,
                               "the kv-events ranks in the radix pane", 60)
        assert "lock counts unknown" in screen
        for _ in range(2):  # the rank holding the prompts' blocks
            if "root ·" in screen and "blocks ·" in screen and " 0 blocks" not in screen:
                break
            tmux.send("]")
            time.sleep(1.0)
            screen = tmux.capture()
        screen = tmux.wait_for(lambda s: " 0 blocks" not in s and "root ·" in s, "a rank's mirrored blocks", 30)
        root = next(line for line in screen.splitlines() if "root ·" in line)
        assert " ? " in root, root  # the lock column: unknown, never 0
    finally:
        tmux.kill()
        stop(proc)
