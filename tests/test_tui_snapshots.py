"""Screenshots of the log pane over the bundled sample incident (tests/__snapshots__/).

Deterministic on purpose: a fixed log read from its start, and a frozen clock (the lines/s figure
then reads "—"). Update after an intended change with `pytest tests/test_tui_snapshots.py
--snapshot-update`, and look at the SVGs before committing them.
"""

from __future__ import annotations

import time
from importlib import resources

from radixtop.tui.app import RadixtopApp

SAMPLE = resources.files("radixtop") / "data" / "sample_incident.log"
SAMPLE_LINES = sum(1 for _ in SAMPLE.open(encoding="utf-8"))


def sample_app(**kwargs) -> RadixtopApp:
    return RadixtopApp(log_patterns=[str(SAMPLE)], from_start=True, clock=lambda: 0.0, **kwargs)


async def loaded(pilot) -> None:
    app = pilot.app
    deadline = time.monotonic() + 15
    # All lines read, and every finding reported (the last ones wait for lines after them).
    while app.state.total_lines < SAMPLE_LINES or app.ingestor.waiting or app.state.report is None:
        assert time.monotonic() < deadline, "the sample log did not load"
        await pilot.pause(0.05)
    app._poll_health()
    await pilot.pause(0.5)


def test_sample_incident_120x40_dark(snap_compare) -> None:
    assert snap_compare(sample_app(), terminal_size=(120, 40), run_before=loaded)


def test_sample_incident_80x24(snap_compare) -> None:
    assert snap_compare(sample_app(), terminal_size=(80, 24), run_before=loaded)


def test_sample_incident_120x40_light(snap_compare) -> None:
    assert snap_compare(sample_app(theme="light"), terminal_size=(120, 40), run_before=loaded)


def test_first_occurrence_after_enter_160x48(snap_compare) -> None:
    async def jump(pilot) -> None:
        await loaded(pilot)
        await pilot.press("tab", "down", "enter")  # the second finding: the first retraction warning
        await pilot.pause(0.3)

    assert snap_compare(sample_app(), terminal_size=(160, 48), run_before=jump)


# The confirmation run's approval modal (radixtop/widgets/confirm.py) over the sample incident, with a
# plan as Plan.describe() writes it (fixed here: a real one names ports and times).
PLAN_LINES = [
    "Live server   http://127.0.0.1:30000  pid 4242  0.5.23",
    "  DOWN: the server died at 14:04:41; planned from what was seen at 14:04:30",
    "  launched as (seen): python3 -m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct --port 30000 "
    "--tp-size 4 --max-running-requests 64",
    "  logs watched: /var/log/sglang/server.log",
    "Evidence      /srv/incidents/radixtop-confirm-20261202-140500/evidence/radixtop-bundle-20261202-140500-confirm",
    "Workload      pressure: 128 requests, 128 calls over 0.5 s at temperature 0 "
    "(/srv/incidents/radixtop-confirm-20261202-140500/workload.json)",
    "Runs          3 per step, the same workload and prompts; the cache is flushed before each run "
    "(POST /flush_cache)",
    "GPUs          GPU 4, GPU 5, GPU 6, GPU 7 (idle, 70.2 GiB or more free each; a started server needs 4): "
    "CUDA_VISIBLE_DEVICES=GPU-4,GPU-5,GPU-6,GPU-7",
    "Experiment    one condition changed per step, from the lowest load up; a step runs only while its question "
    "is open (a clean rung leaves the server up, a failing one may end it)",
    "  1 lower load: at most 16 calls in flight on the reproduction: does it fail below the pressure of the "
    "workload as recorded? (failing under pressure already: down by halves until clean)",
    "  2 lower load: at most 32 calls in flight on the reproduction: does it fail below the pressure of the "
    "workload as recorded?",
    "  3 as run: the workload as recorded on the reproduction: does it fail at all?",
    "  4 reuse off at the failing load: a cache namespace per request on the same server (or, if the server "
    "died, a reproduction restarted with SGLANG_RADIX_FORCE_MISS=1, ~212 s to load, as the original took): "
    "does it fail without prefix hits?",
    "  5 cache off at the failing load: a server started with --disable-radix-cache, ~212 s to load, as the "
    "original took, unless reuse was needed: does it fail without the cache?",
    "  a changed step clean below the pressure the failure came at is tried again at more load: a change that "
    "also lowers the pressure decides nothing",
    "  a failing server that dies is replaced by a reproduction (~212 s to load, as the original took)",
    "Server        the reproduction: python3 -m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct "
    "--tp-size 4 --max-running-requests 64 --host 127.0.0.1 --port 40113",
    "  on http://127.0.0.1:40113, output in /srv/incidents/radixtop-confirm-20261202-140500/reproduction.out",
    "Server        the server without the cache: python3 -m sglang.launch_server --model-path "
    "Qwen/Qwen2.5-7B-Instruct --tp-size 4 --max-running-requests 64 --host 127.0.0.1 --port 40117 "
    "--disable-radix-cache",
    "  on http://127.0.0.1:40117, output in /srv/incidents/radixtop-confirm-20261202-140500/control.out",
    "  change: --host 127.0.0.1 --port 40117 (loopback, free)",
    "  change: added --disable-radix-cache",
    "  change: CUDA_VISIBLE_DEVICES=GPU-4,GPU-5,GPU-6,GPU-7",
    "Live server   already down: nothing of it is touched",
]


def test_confirm_plan_modal_120x40(snap_compare) -> None:
    from radixtop.widgets.confirm import PlanScreen

    async def plan(pilot) -> None:
        await loaded(pilot)
        await pilot.app.push_screen(PlanScreen(PLAN_LINES))
        await pilot.pause(0.3)

    assert snap_compare(sample_app(), terminal_size=(120, 40), run_before=plan)
