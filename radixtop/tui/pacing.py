"""When the app draws: the log pane's frames, the status line, the findings list and the app's one timer.

`FramePacer` holds what was last drawn and when, and answers the app's questions with numbers the
app reads from its state (no Textual, no clock of its own: tests/test_pacing.py drives it with
made-up times). The app asks; the pacer decides; the app draws.

Following a log, each frame scrolls the pane, so Textual redraws every row of it whether one line
came or forty: the cost is per frame, not per line. A busy server log comes in a few writes a second
(the demo workload: ~5), each a frame at 20 Hz pacing; the pane alone took 4-7 % of a core for it
(benchmarks/README.md, "Panes"). So new lines are drawn at once after a quiet spell, then at most
every FRAME_MIN (5 Hz), every FRAME_FAST while lines come faster than that shows them, every
FRAME_BUSY once a screenful waits (a flood), every BULK_INTERVAL while a backlog is read. Lines
arriving between frames wait in the follower and are taken together: nothing redraws per line.
"""

from __future__ import annotations

from typing import Literal

REFRESH_HZ = 4  # the slow timer: notices, health, the lines/s figure; lines draw as they come
IDLE_TICK_S = 1.0  # ... and once nothing moves (no lines, nothing to draw, no finding waiting)
HEALTH_EVERY_S = 1.0  # the followed files' health is read this often
RECENT_LINES_S = 1.0  # the timer stays at REFRESH_HZ this long after the last new lines
FRAME_MIN = 0.2  # seconds between frames while lines trickle in (5 Hz; the first after a pause at once) ...
FRAME_FAST = 0.05  # ... while they come at half a screenful per FRAME_MIN or more: none scrolls past unseen ...
FRAME_BUSY = 1 / 40  # ... once a screenful waits anyway (a flood: the newest line at most a frame old)
INGEST_STEP_S = FRAME_BUSY  # between slower frames, the lines that came are taken and matched this often
BULK_LINES_PER_FRAME = 20_000  # more new lines than this since the last frame: a backlog is read
BULK_INTERVAL = 0.25  # seconds between frames while a backlog is read
STATUS_INTERVAL = 1.0  # the status line's counters (lines, lines/s over 2 s) are redrawn at most this often
FINDINGS_INTERVAL = 1.0  # a finding's count going up is redrawn at most this often (a new one at once)

# How the status line is redrawn: "now", or "after_frame" (once the log pane's frame is on screen).
StatusDraw = Literal["now", "after_frame"]


class FramePacer:
    """The pacing state of one app. Times are the caller's monotonic clock, in seconds."""

    def __init__(self) -> None:
        # The log pane's last frame: the state's version and line count it showed, and when.
        self.drawn_version = -1
        self.drawn_lines = 0
        self.drawn_at = 0.0
        # The line count at the previous tick, and when it last moved (the timer's pace).
        self.seen_lines = 0
        self.lines_at = -1e9
        self.health_at = 0.0  # when the followed files' health was last read
        # The status line: what it showed that shows at once when it changes (the app's status
        # key), when it was drawn, and whether a redraw waits for the log pane's frame.
        self.status_key: tuple | None = None
        self.status_at = 0.0
        self.status_pending = False
        # The findings list: the signatures it showed, and when.
        self.findings_ids: tuple[str, ...] | None = None
        self.findings_at = 0.0

    # -- the log pane's frames -----------------------------------------------------------------------

    def frame_interval(self, total_lines: int, height: int, rate: float | None) -> float:
        """Seconds between frames for `total_lines` read so far, a pane `height` rows high and
        lines coming at `rate` a second (None: unknown)."""
        new = total_lines - self.drawn_lines
        if new > BULK_LINES_PER_FRAME:
            return BULK_INTERVAL  # reading a backlog: nobody reads those frames
        if new >= height:
            return FRAME_BUSY
        # At 5 Hz, lines coming faster than a screenful per frame would scroll past unseen: 20 Hz
        # then, up to a screenful per FRAME_FAST. The rate is over the last 2 s, not since the
        # last frame: a burst right after a frame is no rate.
        return FRAME_FAST if (rate or 0.0) * FRAME_MIN >= height / 2 else FRAME_MIN

    def frame_wait(self, now: float, total_lines: int, height: int, rate: float | None) -> float:
        """Seconds to wait before the next frame; 0 when it is due. At most FRAME_FAST: the wait
        is looked at again that often, so lines arriving faster than a screenful per frame bring
        the frame forward."""
        wait = self.drawn_at + self.frame_interval(total_lines, height, rate) - now
        return max(0.0, min(wait, FRAME_FAST))

    def frame_due(self, now: float, version: int, total_lines: int, height: int, rate: float | None,
                  force: bool = False) -> bool:
        """Whether to draw a frame now: only when the state's version moved, and then when the
        frame is due or `force` (a key, a message: those draw at once)."""
        if version == self.drawn_version:
            return False
        # The same sum as frame_wait's, so that a frame it says is due is drawn to the last bit.
        return force or self.drawn_at + self.frame_interval(total_lines, height, rate) <= now

    def drew_frame(self, now: float, version: int, total_lines: int) -> None:
        self.drawn_version, self.drawn_lines, self.drawn_at = version, total_lines, now

    # -- the timer -----------------------------------------------------------------------------------

    def note_lines(self, now: float, total_lines: int) -> bool:
        """Called on each tick: whether lines came since the previous one."""
        if total_lines == self.seen_lines:
            return False
        self.seen_lines, self.lines_at = total_lines, now
        return True

    def health_due(self, now: float) -> bool:
        """Whether to read the followed files' health now (then it is taken as read)."""
        if now - self.health_at < HEALTH_EVERY_S:
            return False
        self.health_at = now
        return True

    def timer_delay(self, now: float, version: int, waiting: bool) -> float:
        """The next tick: 1/REFRESH_HZ while something waits to be drawn, a hit waits for its
        lines-after (`waiting`) or lines came in the last RECENT_LINES_S (the counters' final
        figures); IDLE_TICK_S otherwise: new lines draw themselves, keys at once, the panes at
        most once a second anyway."""
        if version != self.drawn_version or waiting or now - self.lines_at < RECENT_LINES_S:
            return 1 / REFRESH_HZ
        return IDLE_TICK_S

    # -- the status line -----------------------------------------------------------------------------

    def status_draw(self, now: float, key: tuple, drew: bool, force: bool = False) -> StatusDraw | None:
        """How to redraw the status line on this tick, if at all. A change of `key` (the mode, a new
        initiating failure, a file's new state) shows at once; the counters move at most every
        STATUS_INTERVAL, and not in the log pane's frame (`drew`): Textual redraws every widget
        inside the box around all changed regions, and a full-width status line makes that box the
        whole screen instead of the log pane alone. The timer keeps its fast pace for
        RECENT_LINES_S >= STATUS_INTERVAL after the last lines, so the final count still shows."""
        if force or key != self.status_key:
            return "now"
        if now - self.status_at < STATUS_INTERVAL or self.status_pending:
            return None
        if drew:
            self.status_pending = True
            return "after_frame"
        return "now"

    def status_drawn(self, now: float, key: tuple) -> None:
        self.status_pending = False
        self.status_at, self.status_key = now, key

    # -- the findings list ---------------------------------------------------------------------------

    def findings_due(self, now: float, ids: tuple[str, ...], force: bool = False) -> bool:
        """Whether to rebuild the findings list for the signatures `ids` (then it is taken as
        rebuilt): a new signature at once, a count going up only every FINDINGS_INTERVAL
        (rebuilding the list each frame costs more than the log pane)."""
        if not force and ids == self.findings_ids and now - self.findings_at < FINDINGS_INTERVAL:
            return False
        self.findings_ids, self.findings_at = ids, now
        return True
