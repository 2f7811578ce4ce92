"""The live panes inside the whole app (Pilot): the first finding's mark on the vitals, the GPU pane
with NVML faked at the pynvml seam against the simulator, and the vitals across a resize."""

from __future__ import annotations

from importlib import resources

from test_app_panes import T0, _fill, _shot_app, _until

from radixtop.tui.app import RadixtopApp
from radixtop.tui.panes import LiveOptions
from radixtop.widgets.rows import TextRows

SAMPLE = resources.files("radixtop") / "data" / "sample_incident.log"


def _screen_rows(app, widget) -> list[str]:
    """What the screen shows where `widget` is (the compositor's output, not the widget's own)."""
    region = widget.content_region
    strips = app.screen._compositor.render_strips()
    return [strips[y].crop(region.x, region.right).text for y in range(region.y, region.bottom)]


async def _loaded(pilot) -> None:
    app = pilot.app
    await _until(pilot, lambda: app.state.report is not None and not app.ingestor.waiting and app.panes.mounted,
                 "the sample log loaded and the panes mounted")


async def test_vitals_rows_follow_a_resize_from_60x20_to_80x24(utc) -> None:
    app = _shot_app()
    async with app.run_test(size=(60, 20)) as pilot:
        await _loaded(pilot)
        _fill(app)
        await pilot.press("5")
        app.panes.redraw(force=True)
        await pilot.pause(0.3)
        body = app.query_one("#vitals-body", TextRows)
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.5)
        want = [body.render_line(y).text for y in range(body.content_region.height)]
        got = _screen_rows(app, body)
        assert got == want, "\n".join(got)
        pane = app.query_one("#vitals-pane")
        below = _screen_rows(app, pane)[1 + len(want):]
        assert not any(row.strip() for row in below), "\n".join(below)


def _vitals(app) -> str:
    return app.query_one("#vitals-body").render().plain


async def test_the_first_signature_in_the_log_is_marked_on_the_vitals(tmp_path, utc) -> None:
    """panes.note_report -> LiveState.mark -> the ▼ over every plot, from a line written to a
    followed log while the app runs."""
    lines = SAMPLE.read_text().splitlines()
    before = [line for line in lines[:369] if "Decode batch" in line or "Prefill batch" in line]
    assert before, "the sample has batch lines before the incident"
    log = tmp_path / "server.log"
    log.write_text("\n".join(before) + "\n")
    app = RadixtopApp(log_patterns=[str(log)], from_start=True, live=LiveOptions(discover=False, gpu=False))
    async with app.run_test(size=(160, 48)) as pilot:
        await _until(pilot, lambda: app.panes is not None and app.panes.mounted, "the panes mounted")
        app.panes.clock = lambda: T0
        await _until(pilot, lambda: "token usage" in _vitals(app) and "no signature yet" in _vitals(app),
                     "the vitals from the batch lines, no mark yet")
        assert "first signature" not in _vitals(app)
        with log.open("a") as f:
            f.write(lines[369] + "\n")  # the KV cache pool is full: the first signature
        await _until(pilot, lambda: "first signature" in _vitals(app), "the first signature's mark on the vitals")
        rows = _vitals(app).splitlines()
        assert "first signature 14:03:13: TP1 " in rows[0] and "▼" in rows[0], rows[0]
        assert app.panes.state.vitals.first_mark[0] == T0 - 7 + 0.007
        col = rows[0].index("▼")
        for row in rows[1:8]:
            assert len(row) > col and row[col] != " ", "every plot marks the column: " + row


async def test_the_gpu_pane_in_the_app_against_the_simulator_with_nvml_faked(tmp_path, monkeypatch) -> None:
    """NVML faked at the pynvml functions (no GPU here); everything else real: the simulator, its
    process found by discovery, the GPU probe's worker. The server's pid is matched by pid."""
    from pane_helpers import start_sim, stop
    from test_app_panes import live_app
    from test_probe_gpu import FakeNvml

    nvml = FakeNvml(monkeypatch)
    proc, url, log = start_sim(tmp_path / "sim", "--tp-size", "1")
    GiB = 1024**3
    nvml.set("nvmlDeviceGetComputeRunningProcesses", lambda h: [
        type("P", (), {"pid": proc.pid, "usedGpuMemory": (70 + h[1]) * GiB})(),
        type("P", (), {"pid": 999_999, "usedGpuMemory": None})(),
    ])
    try:
        app = live_app(url, log, gpu=True)
        async with app.run_test(size=(160, 48)) as pilot:
            await _until(pilot, lambda: app.panes is not None and app.panes.mounted, "the panes mounted")
            body = lambda: app.query_one("#gpu-pane").query_one("#gpu-body").render().plain  # noqa: E731
            await _until(pilot, lambda: f"pid {proc.pid}" in body() and "not the server" in body()
                         and "not the server" not in next(l for l in body().splitlines() if f"pid {proc.pid}" in l),
                         "the server's pid matched on the GPU pane", 30)
            text = body()
            assert "GPU 0 H200" in text and "GPU 1 H200" in text
            assert "100 GiB/140 GiB" in text and "101 GiB/140 GiB" in text
            assert "util 97%" in text and "66°C" in text and "512/700 W" in text
            mine = [l for l in text.splitlines() if f"pid {proc.pid}" in l]
            assert any("70.0 GiB" in l for l in mine) and any("71.0 GiB" in l for l in mine), mine
            assert "pid 999999" in text
            assert "gpu ok" in str(app.status_line.render())
    finally:
        stop(proc)


async def test_the_radix_pane_repeats_the_logs_radix_cache_signatures(tmp_path, utc) -> None:
    """The rank that raised RadixCacheError is dead before its endpoint is read again: the radix
    pane says what the log saw about the radix cache (when, which rank, how often), with no
    endpoint at all too."""
    lines = SAMPLE.read_text().splitlines()
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines[:370]) + "\n")
    app = RadixtopApp(log_patterns=[str(log)], from_start=True, live=LiveOptions(discover=False, gpu=False))
    async with app.run_test(size=(160, 48)) as pilot:
        await _until(pilot, lambda: app.panes is not None and app.panes.mounted, "the panes mounted")
        await pilot.pause(0.5)
        summary = lambda: app.query_one("#radix-summary").render().plain  # noqa: E731
        assert "Radix cache" not in summary()
        with log.open("a") as f:
            f.write("\n".join(lines[370:]) + "\n")  # the contention warning, then two RadixCacheErrors
        await _until(pilot, lambda: "page lock failed" in summary(), "the lock failure in the radix pane", 15)
        rows = summary().splitlines()
        warn = next(r for r in rows if "contended" in r)
        fail = next(r for r in rows if "page lock failed" in r)
        assert warn.startswith("log 14:03:14 TP1 Radix cache eviction contended"), warn
        assert fail.startswith("log ") and fail.endswith("×2"), fail
        assert rows.index(warn) < rows.index(fail)  # in the order they first came
        await pilot.resize_terminal(150, 48)  # a redraw without new findings keeps them
        await pilot.pause(0.3)
        assert "page lock failed" in summary()
