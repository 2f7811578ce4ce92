"""The live panes inside the app: Pilot against a real simulator (attach, layouts and keys, a server
that dies and comes back, vLLM as the target), and screenshots from constructed state.

Screenshots are deterministic on purpose: no probes run (LiveOptions(discover=False, gpu=False)),
the live state is filled by the test, times are fixed and rendered in UTC. Update them after an
intended change with `pytest tests/test_app_panes.py --snapshot-update` and look at the SVGs.
"""

from __future__ import annotations

import calendar
import re
import time
from importlib import resources
from pathlib import Path

import pytest
from pane_helpers import Answer, make_snapshot, start_sim, stop, stub_server

from radixtop.probes.gpu import GpuInfo, GpuProcess, GpuSample
from radixtop.probes.procs import ProcInfo, ProcsSample
from radixtop.probes.radix import RadixSample
from radixtop.probes.radix_tree import TreeIndex
from radixtop.probes.sglang import ServerInfo, ServerMetrics, ServerSample
from radixtop.probes.status import SourceState
from radixtop.schema import Counters, Event
from radixtop.tui.app import RadixtopApp
from radixtop.tui.panes import LiveOptions
from radixtop.widgets.radix import RadixPane, RadixTreeView

SAMPLE = resources.files("radixtop") / "data" / "sample_incident.log"
T0 = calendar.timegm((2026, 12, 2, 14, 3, 20, 0, 0, 0))  # just after the sample incident's last line
GiB = 1024**3


async def _until(pilot, predicate, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.1)


def _text(app, selector: str) -> str:
    return app.query_one(selector).render().plain


def _status(app) -> str:
    return str(app.status_line.render())


def _shown(app) -> set[str]:
    names = {
        "#main": "log", "#radix-pane": "radix", "#gpu-pane": "gpu", "#procs-pane": "procs", "#vitals-pane": "vitals"
    }
    out = set()
    for selector, name in names.items():
        widget = app.query_one(selector)
        if widget.display and widget.parent.display:
            out.add(name)
    return out


@pytest.fixture
def sim(tmp_path: Path):
    proc, url, log = start_sim(tmp_path / "sim", "--tp-size", "2", "--enable-metrics")
    yield proc, url, log
    stop(proc)


def live_app(url: str, log: Path, **kw) -> RadixtopApp:
    return RadixtopApp(log_patterns=[str(log)], from_start=True,
                       live=LiveOptions(url=url, logs=(str(log),), **kw))


# ----------------------------------------------------------------------------------------------
# Against the simulator


async def test_attaches_to_the_simulator_and_shows_every_pane(sim) -> None:
    proc, url, log = sim
    app = live_app(url, log)
    async with app.run_test(size=(160, 48)) as pilot:
        await _until(
            pilot, lambda: app.panes is not None and app.panes.mounted, "the panes mounted after the first frame"
        )
        await _until(pilot, lambda: "rank 1" in _text(app, "#radix-title"), "both ranks in the radix pane")
        assert _shown(app) == {"log", "radix", "gpu", "procs", "vitals"}
        await _until(
            pilot, lambda: "server ok" in _status(app) and "r0 ok" in _status(app), "sources in the status line"
        )
        await _until(pilot, lambda: str(proc.pid) in _text(app, "#procs-body"), "the server's pid")
        await _until(pilot, lambda: "from /metrics" in _text(app, "#vitals-title"), "vitals from /metrics")
        assert "pool 16,384" in _text(app, "#radix-summary")
        # The simulator's model folder has no tokenizer.json: said once, above the tree.
        assert app.query_one(RadixTreeView).render_line(0).text.startswith("token ids only: no tokenizer.json in ")
        assert "root ·" in app.query_one(RadixTreeView).render_line(1).text
        gpu = _text(app, "#gpu-body")
        assert gpu.startswith(("unavailable:", "GPU 0")), gpu  # this machine's NVML decides which
        await pilot.press("right_square_bracket")
        assert app.query_one(RadixPane).selected.endswith(app.panes.targets.instruments[1].rsplit(":", 1)[1])


async def test_small_screen_one_pane_at_a_time_and_big_screen_zoom(sim) -> None:
    _, url, log = sim
    app = live_app(url, log, gpu=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await _until(
            pilot, lambda: app.panes is not None and app.panes.mounted, "the panes mounted after the first frame"
        )
        assert _shown(app) == {"log"}
        for key, name in (("2", "radix"), ("3", "gpu"), ("4", "procs"), ("5", "vitals"), ("1", "log"), ("2", "radix")):
            await pilot.press(key)
            await pilot.pause()
            assert _shown(app) == {name}, key
        assert app.focused is app.query_one(RadixTreeView), "the radix pane takes the keys when shown"
        await pilot.press("0")
        assert _shown(app) == {"log"}
        await pilot.resize_terminal(160, 48)
        await pilot.pause()
        assert _shown(app) == {"log", "radix", "gpu", "procs", "vitals"}
        await pilot.press("5")
        await pilot.pause()
        assert _shown(app) == {"vitals"}, "a key zooms one pane on a big screen"
        await pilot.press("5")
        await pilot.pause()
        assert len(_shown(app)) == 5, "the same key again shows everything"
        await pilot.resize_terminal(60, 20)
        await pilot.pause()
        assert app.is_running and len(_shown(app)) == 1


async def test_a_dead_server_is_down_with_its_time_and_panes_keep_their_values(tmp_path: Path) -> None:
    proc, url, log = start_sim(tmp_path / "a", "--tp-size", "2", "--enable-metrics")
    port = url.rsplit(":", 1)[1]
    app = live_app(url, log, gpu=False)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await _until(
                pilot, lambda: app.panes is not None and app.panes.mounted, "the panes mounted after the first frame"
            )
            await _until(
                pilot, lambda: "rank 1" in _text(app, "#radix-title") and "procs ok" in _status(app), "attached"
            )
            stop(proc)
            await _until(pilot, lambda: re.search(r"\bserver\b[\w ]* DOWN since \d\d:\d\d:\d\d", _status(app)),
                         "server DOWN in the status line, with its time")
            await _until(pilot, lambda: "DOWN since" in _text(app, "#radix-title"), "the radix pane marked DOWN")
            assert "last values from" in _text(app, "#radix-title")
            assert "root ·" in app.query_one(RadixTreeView).render_line(1).text, "the tree stays on screen"
            assert "pool 16,384" in _text(app, "#radix-summary")
            await _until(pilot, lambda: "DOWN since" in _text(app, "#procs-body"), "the processes pane marked DOWN")
            assert str(proc.pid) in _text(app, "#procs-body"), "the gone process stays listed"
            again, _, _ = start_sim(tmp_path / "b", "--port", port, "--tp-size", "2", "--enable-metrics")
            try:
                await _until(pilot, lambda: "server ok" in _status(app), "the server back", 30)
                await _until(pilot, lambda: "DOWN" not in _text(app, "#radix-title"), "the radix pane back", 30)
                await _until(pilot, lambda: f"pid {again.pid}" in _text(app, "#procs-title"), "the new pid", 30)
            finally:
                stop(again)
    finally:
        stop(proc)


VLLM_METRICS = b"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.5
"""


async def test_vllm_feeds_the_vitals_and_the_radix_pane_says_it_needs_sglang(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(
        "INFO 12-02 14:00:03 [loggers.py:123] Engine 000: Running: 3 reqs, Waiting: 1 reqs, "
        "GPU KV cache usage: 50.0%, Prefix cache hit rate: 40.0%\n"
    )
    with stub_server() as stub:
        stub.answers["/health"] = Answer(body=b"")
        stub.answers["/v1/models"] = Answer(body=b'{"data":[{"id":"m","owned_by":"vllm"}]}')
        stub.answers["/metrics"] = Answer(body=VLLM_METRICS, content_type="text/plain")
        app = RadixtopApp(log_patterns=[str(log)], from_start=True,
                          live=LiveOptions(url=stub.url, logs=(str(log),), gpu=False, discover=False))
        async with app.run_test(size=(160, 48)) as pilot:
            await _until(
                pilot, lambda: app.panes is not None and app.panes.mounted, "the panes mounted after the first frame"
            )
            await _until(pilot, lambda: "vLLM has no such endpoint" in _text(app, "#radix-summary"), "the vLLM note")
            await _until(pilot, lambda: "from /metrics" in _text(app, "#vitals-title"), "vLLM gauges in the vitals")
            assert "50% /metrics" in _text(app, "#vitals-body")


# ----------------------------------------------------------------------------------------------
# Screenshots from constructed state


def _fill(app: RadixtopApp, *, down: bool = False) -> None:
    panes = app.panes
    assert panes is not None
    panes.clock = lambda: T0
    st = panes.state
    ok = SourceState("ok", "", T0 - 100)
    info = ServerInfo("http://127.0.0.1:30000", "sglang", version="0.5.23", tp_size=2)
    for i in range(60):
        m = ServerMetrics("sglang", {"token_usage": min(1.0, 0.5 + i / 100), "running": float(20 + i % 12),
                                     "queued": float(max(0, i - 40)), "cache_hit_rate": 0.6,
                                     "evicted_tokens_total": float(i * i * 10), "retracted": float(i > 50)})
        st.apply(ServerSample(info.url, ok, T0 - 60 + i, info=info, metrics=m))
    anomaly = Event(9, T0 - 12, "negative_lock_ref", node_id=4, lock_ref=-1, message="double unlock")
    for rank in (0, 1):
        for seq in (1, 2):
            snap = make_snapshot(rank=rank, seq=seq, when=T0 - 4 + 2 * seq,
                                 counters=Counters(lock_ops=100 * seq, unlock_ops=99 * seq, evictions=10 * seq,
                                                   evicted_tokens=160 * seq, negative_lock_ref=1))
            st.apply(RadixSample(f"http://127.0.0.1:3910{rank}", ok, T0 - 4 + 2 * seq, rank=rank, snapshot=snap,
                                 index=TreeIndex.build(snap), events=(anomaly,) if (rank, seq) == (0, 2) else ()))
    procs = (
        ProcInfo(
            100, 1, "server", None, "python -m sglang.launch_server --tp 2", "sleeping", 2 * GiB, 3.0, 40, T0 - 600
        ),
        ProcInfo(101, 100, "scheduler", "TP0", "sglang::scheduler_TP0", "running", 12 * GiB, 99.0, 80, T0 - 590),
        ProcInfo(102, 100, "scheduler", "TP1", "sglang::scheduler_TP1", "running", 12 * GiB, 98.0, 80, T0 - 590),
    )
    st.apply(ProcsSample(ok, T0, 100, procs))
    gpus = tuple(GpuInfo(i, "NVIDIA H200", f"GPU-{i}", 120 * GiB, 140 * GiB, 97, 66, 512.0, 700.0,
                         (GpuProcess(101 + i, 110 * GiB),)) for i in range(2))
    st.apply(GpuSample(ok, T0, gpus, driver="550.54.15", seconds=0.004))
    if down:
        gone = SourceState("down", "connection refused (is the server running?)", T0 - 3)
        st.apply(ServerSample(info.url, gone, T0, info=info))
        for rank in (0, 1):
            st.apply(RadixSample(f"http://127.0.0.1:3910{rank}", gone, T0))


def _shot_app() -> RadixtopApp:
    return RadixtopApp(log_patterns=[str(SAMPLE)], from_start=True, clock=lambda: 0.0,
                       live=LiveOptions(discover=False, gpu=False))


def _before(keys: tuple[str, ...] = (), down: bool = False):
    async def run(pilot) -> None:
        app = pilot.app
        deadline = time.monotonic() + 15
        while app.state.report is None or app.ingestor.waiting:
            assert time.monotonic() < deadline, "the sample log did not load"
            await pilot.pause(0.05)
        _fill(app, down=down)
        for key in keys:
            await pilot.press(key)
        app.panes.redraw(force=True)
        app._update_status()
        await pilot.pause(0.3)

    return run


def test_all_panes_160x48(snap_compare, utc) -> None:
    assert snap_compare(_shot_app(), terminal_size=(160, 48), run_before=_before())


def test_radix_pane_80x24(snap_compare, utc) -> None:
    assert snap_compare(_shot_app(), terminal_size=(80, 24), run_before=_before(("2",)))


def test_server_down_160x48(snap_compare, utc) -> None:
    assert snap_compare(_shot_app(), terminal_size=(160, 48), run_before=_before(down=True))


def test_help_lists_the_pane_keys() -> None:
    from rich.console import Console

    from radixtop.tui.help import help_text

    console = Console(width=200, record=True)
    console.print(help_text())
    text = console.export_text()
    for key, pane in (("1", "log pane"), ("2", "radix tree pane"), ("3", "GPU pane"), ("4", "processes pane"),
                      ("5", "vital signs pane"), ("0", "all panes")):
        assert re.search(rf"^{key} +{pane}", text, re.MULTILINE), text
    assert re.search(r"^\[ +previous rank in the radix pane", text, re.MULTILINE)
    assert re.search(r"^\] +next rank in the radix pane", text, re.MULTILINE)
    assert "DOWN since the time it went" in text


@pytest.mark.parametrize(
    ("size", "keys", "shown"),
    [
        ((80, 24), ("3", "2"), {"radix"}),
        ((160, 48), ("4",), {"procs"}),
        ((160, 48), ("4", "0"), {"log", "radix", "gpu", "procs", "vitals"}),
    ],
)
async def test_a_pane_key_pressed_before_the_panes_are_mounted_is_applied_when_they_are(size, keys, shown) -> None:
    """The panes mount after the log's first frame; a key pressed before then must not be dropped
    (the tmux check at 80x24 pressed 2 as soon as the log showed, and sometimes stayed on the log).
    The mount is held back here until the keys are in, so the order is certain."""
    app = RadixtopApp(log_patterns=[str(SAMPLE)], from_start=True, live=LiveOptions(discover=False, gpu=False))
    held: list[object] = []
    mount = app._mount_panes
    app._mount_panes = lambda: held.append(True)  # what on_mount schedules after the first frame
    async with app.run_test(size=size) as pilot:
        await _until(pilot, lambda: bool(held), "the first frame (the panes' mount is due)")
        for key in keys:
            await pilot.press(key)
        assert not app.panes.mounted
        app.call_later(mount)
        await _until(pilot, lambda: app.panes.mounted, "the panes mounted")
        await pilot.pause()
        assert _shown(app) == shown
        if shown == {"radix"}:
            assert app.focused is app.query_one(RadixTreeView), "the radix pane takes the keys, as after a key"
        if size == (160, 48):
            await pilot.press("5")
            await pilot.press("0")
            await pilot.pause()
            assert len(_shown(app)) == 5, "0 shows everything on a big screen (it does not zoom the log)"


async def test_a_tree_printed_in_the_lines_read_before_the_first_frame_reaches_the_radix_pane(tmp_path) -> None:
    """radixtop opened after the server died: the tree it printed at its failure is among the
    log's last lines, read before the first frame (the panes' state is made only after it, so the
    first frame does not wait for their imports); the radix pane still turns to it."""
    from test_printed_tree import LEGACY, OOM

    log = tmp_path / "server.log"
    log.write_text("\n".join(["[2026-12-05 09:59:59 TP1] Decode batch. #running-req: 4", *OOM, *LEGACY]) + "\n")
    app = RadixtopApp(log_patterns=[str(log)], live=LiveOptions(discover=False, gpu=False))
    held: list[object] = []
    mount = app._mount_panes
    app._mount_panes = lambda: held.append(True)
    async with app.run_test(size=(160, 48)) as pilot:
        await _until(pilot, lambda: bool(held), "the first frame (the panes' mount is due)")
        assert app.panes.live is None, "the panes' state was made before the first frame"
        app.call_later(mount)
        await _until(pilot, lambda: app.panes.mounted, "the panes mounted")
        await _until(pilot, lambda: "printed TP1" in {v.name for v in app.panes.state.board.ranks.values()},
                     "the printed tree on the radix pane's board")
        view = next(v for v in app.panes.state.board.ranks.values() if v.name == "printed TP1")
        assert app.panes.state.board.focus == view.url and view.snapshot.tree.walked_nodes == 4


async def test_the_collector_the_command_line_turned_off_is_on_again_after_the_first_frame(tmp_path) -> None:
    """`radixtop` starts with the cyclic collector off (radixtop/cli.py: start-up's objects all live
    on); the first frame turns it on again, or a long session would keep every cycle it makes."""
    import gc

    log = tmp_path / "server.log"
    log.write_text("[2026-12-05 09:59:59 TP0] Decode batch. #running-req: 4\n")
    gc.disable()
    try:
        app = RadixtopApp(log_patterns=[str(log)], live=None)
        async with app.run_test(size=(120, 40)) as pilot:
            await _until(pilot, gc.isenabled, "the collector on again after the first frame")
            assert gc.get_freeze_count() > 0
    finally:
        gc.enable()
        gc.unfreeze()
