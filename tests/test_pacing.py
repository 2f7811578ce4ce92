"""The frame pacer (radixtop/tui/pacing.py) on a made-up clock: when the log pane, the status line
and the findings list are drawn, and how fast the app's timer runs."""

from __future__ import annotations

import pytest

from radixtop.tui.pacing import (
    BULK_INTERVAL,
    BULK_LINES_PER_FRAME,
    FINDINGS_INTERVAL,
    FRAME_BUSY,
    FRAME_FAST,
    FRAME_MIN,
    HEALTH_EVERY_S,
    IDLE_TICK_S,
    RECENT_LINES_S,
    REFRESH_HZ,
    STATUS_INTERVAL,
    FramePacer,
)

HEIGHT = 28  # the log pane's rows at 120x30
RATE_WINDOW = 2.0  # lines/s is over the last 2 s, as IncidentState.lines_per_second has it
EPS = 1e-9


def follow(writes: list[tuple[float, int]], height: int = HEIGHT) -> tuple[list[tuple[float, int]], list[float]]:
    """What the app's log consumer draws for `writes` (time, lines), as RadixtopApp._consume does
    it: a write is taken when it comes; then the consumer waits for the pacer, taking whatever
    came meanwhile, and draws. Returns the frames (time, lines shown) and each write's wait
    before its lines were first on screen."""
    pacer = FramePacer()
    frames: list[tuple[float, int]] = []
    came: list[tuple[float, int, int]] = []  # (arrival, lines, lines read by then)
    pending = sorted(writes)
    now = total = 0

    def take(until: float) -> None:
        nonlocal total
        while pending and pending[0][0] <= until:
            at, n = pending.pop(0)
            total += n
            came.append((at, n, total))

    def rate(at: float) -> float:  # over the last RATE_WINDOW, or since the first line, at least a quarter of it
        recent = sum(n for t, n, _ in came if t > at - RATE_WINDOW)
        start = max(at - RATE_WINDOW, came[0][0]) if came else at
        return recent / max(at - start, RATE_WINDOW / 4)

    while pending:
        now = max(now, pending[0][0])
        take(now)
        for _ in range(100):
            wait = pacer.frame_wait(now, total, height, rate(now))
            if wait <= 0:
                break
            now += wait
            take(now)
        if pacer.frame_due(now, total, total, height, rate(now)):  # the version moves with the lines
            pacer.drew_frame(now, total, total)
            frames.append((now, total))
    waits = [next(t for t, shown in frames if shown >= read) - at for at, _, read in came]
    return frames, waits


def test_the_interval_shortens_once_a_screenful_waits_and_lengthens_while_a_backlog_is_read() -> None:
    pacer = FramePacer()
    assert FRAME_BUSY < FRAME_FAST < FRAME_MIN
    total = 50_000
    pacer.drew_frame(1.0, 1, total)
    assert pacer.frame_interval(total, HEIGHT, 0.0) == FRAME_MIN  # nothing or a few lines new: paced
    assert pacer.frame_interval(total, HEIGHT, None) == FRAME_MIN  # the rate unknown: the same
    # Lines coming at half a screenful per FRAME_MIN or more: frames often enough that each is on
    # screen (a screenful per FRAME_FAST), as with 20 Hz pacing.
    assert pacer.frame_interval(total, HEIGHT, HEIGHT / 2 / FRAME_MIN) == FRAME_FAST
    assert pacer.frame_interval(total, HEIGHT, HEIGHT / 3 / FRAME_MIN) == FRAME_MIN
    pacer.drew_frame(1.0, 1, total - HEIGHT)
    assert pacer.frame_interval(total, HEIGHT, 0.0) == FRAME_BUSY  # a screenful would scroll past unseen
    pacer.drew_frame(1.0, 1, total - BULK_LINES_PER_FRAME - 1)
    assert pacer.frame_interval(total, HEIGHT, 0.0) == BULK_INTERVAL


def test_a_line_after_a_quiet_spell_is_drawn_at_once() -> None:
    frames, waits = follow([(10.0, 1), (30.0, 1)])
    assert frames == [(10.0, 1), (30.0, 2)]
    assert waits == [0.0, 0.0]


def test_a_trickle_is_drawn_a_few_frames_a_second_with_every_line_within_a_frame() -> None:
    """40 writes a second of one line each: at 20 Hz each write was a frame; paced, at most 5 a
    second, and no line waits longer than FRAME_MIN."""
    writes = [(10.0 + i * 0.025, 1) for i in range(60)]  # 1.5 s
    frames, waits = follow(writes)
    assert max(waits) <= FRAME_MIN + EPS
    assert len(frames) <= 1.5 / FRAME_MIN + 2
    assert frames[-1][1] == 60, "the last line is drawn"


def test_lines_coming_faster_than_a_frame_shows_them_are_drawn_every_frame_fast() -> None:
    """Half a screenful per FRAME_MIN or more (here 100 lines/s in writes of 5): at 5 Hz a
    screenful would scroll past between two frames."""
    writes = [(10.0 + i * 0.05, 5) for i in range(60)]  # 3 s
    frames, waits = follow(writes)
    steady = [w for w, (at, _) in zip(waits, writes) if at >= 10.0 + RATE_WINDOW / 4]  # the rate is known
    assert max(steady) <= FRAME_FAST + EPS
    assert max(waits) <= FRAME_MIN + EPS


def test_a_burst_is_drawn_within_the_busy_frame_budget() -> None:
    """A flood (10,000 lines/s in writes of 500): a frame every FRAME_BUSY, no more, and no line
    waits longer than that."""
    writes = [(10.0 + i * 0.05, 500) for i in range(40)]  # 2 s
    frames, waits = follow(writes)
    assert max(waits) <= FRAME_BUSY + EPS
    assert len(frames) <= 2.0 / FRAME_BUSY + 2
    gaps = [b - a for (a, _), (b, _) in zip(frames, frames[1:])]
    assert min(gaps) >= FRAME_BUSY - EPS


def test_a_screenful_arriving_while_a_frame_waits_brings_the_frame_forward() -> None:
    """The consumer looks at its wait again every FRAME_FAST: a flood starting right after a
    trickle's line is not held back for the rest of FRAME_MIN."""
    frames, waits = follow([(10.0, 1), (10.05, 1), (10.06, 100)])
    assert frames[0] == (10.0, 1)
    assert waits[2] <= FRAME_FAST + EPS, frames


def test_a_backlog_is_drawn_every_bulk_interval() -> None:
    """Reading a backlog moves tens of thousands of lines per frame: nobody reads those frames."""
    writes = [(10.0 + i * 0.01, 30_000) for i in range(100)]  # 3 million lines in 1 s
    frames, _ = follow(writes)
    assert frames[0] == (10.0, 30_000), "the first lines at once"
    gaps = [b - a for (a, _), (b, _) in zip(frames, frames[1:])]
    assert min(gaps) >= BULK_INTERVAL - EPS
    assert len(frames) <= 1.0 / BULK_INTERVAL + 2
    assert frames[-1][1] == 3_000_000


def test_nothing_new_draws_nothing() -> None:
    pacer = FramePacer()
    pacer.drew_frame(5.0, 7, 100)
    for later in (5.0, 5.5, 60.0):
        assert not pacer.frame_due(later, 7, 100, HEIGHT, 0.0)
        assert not pacer.frame_due(later, 7, 100, HEIGHT, 0.0, force=True)  # not even for a key
    assert not pacer.frame_due(5.1, 8, 101, HEIGHT, 0.0), "a frame before FRAME_MIN is up"
    assert pacer.frame_due(5.1, 8, 101, HEIGHT, 0.0, force=True), "a key draws at once"
    assert pacer.frame_due(5.0 + FRAME_MIN, 8, 101, HEIGHT, 0.0)
    assert pacer.frame_wait(5.0 + FRAME_MIN, 101, HEIGHT, 0.0) == 0.0


def test_the_timer_runs_slowly_while_nothing_moves_and_fast_while_something_waits() -> None:
    pacer = FramePacer()
    pacer.drew_frame(1.0, 3, 0)
    assert pacer.timer_delay(2.0, 3, waiting=False) == IDLE_TICK_S, "an idle app woke 4+ times a second"
    assert pacer.timer_delay(2.0, 4, waiting=False) == 1 / REFRESH_HZ, "something to draw"
    assert pacer.timer_delay(2.0, 3, waiting=True) == 1 / REFRESH_HZ, "a finding waits for its lines-after"
    assert pacer.note_lines(2.0, 10)
    assert not pacer.note_lines(2.1, 10)
    pacer.drew_frame(2.1, 4, 10)
    assert pacer.timer_delay(2.2, 4, waiting=False) == 1 / REFRESH_HZ, "lines just came: the counters' final figures"
    assert pacer.timer_delay(2.0 + RECENT_LINES_S, 4, waiting=False) == IDLE_TICK_S
    assert RECENT_LINES_S >= STATUS_INTERVAL, "the final count shows before the timer slows"


def test_health_is_read_once_per_interval() -> None:
    pacer = FramePacer()
    assert pacer.health_due(10.0)
    assert not pacer.health_due(10.0 + HEALTH_EVERY_S / 2)
    assert pacer.health_due(10.0 + HEALTH_EVERY_S)


@pytest.mark.parametrize("drew", [False, True])
def test_the_status_counters_move_once_an_interval_and_a_change_shows_at_once(drew: bool) -> None:
    pacer = FramePacer()
    key = ("FOLLOW", None)
    assert pacer.status_draw(1.0, key, drew) == "now", "the first status"
    pacer.status_drawn(1.0, key)
    assert pacer.status_draw(1.5, key, drew) is None, "the counters wait"
    assert pacer.status_draw(1.5, key, drew, force=True) == "now"
    assert pacer.status_draw(1.5, ("PAUSED", None), drew) == "now", "a new mode shows at once"
    later = 1.0 + STATUS_INTERVAL
    if drew:
        # Not in the log pane's frame: after it, and asked for once.
        assert pacer.status_draw(later, key, drew) == "after_frame"
        assert pacer.status_draw(later + 0.1, key, drew) is None
        pacer.status_drawn(later + 0.1, key)
        assert pacer.status_draw(later + 0.2, key, drew) is None
    else:
        assert pacer.status_draw(later, key, drew) == "now"


def test_the_findings_list_is_rebuilt_for_a_new_signature_at_once_and_a_count_once_an_interval() -> None:
    pacer = FramePacer()
    assert pacer.findings_due(1.0, ())
    assert not pacer.findings_due(1.1, ())
    assert pacer.findings_due(1.1, ("cuda_oom",)), "a new signature"
    assert not pacer.findings_due(1.2, ("cuda_oom",)), "its count going up waits"
    assert pacer.findings_due(1.2, ("cuda_oom",), force=True)
    assert pacer.findings_due(1.2 + FINDINGS_INTERVAL, ("cuda_oom",))
