"""Follow log files the way `tail -F` does, as an async source of line batches (`LogFollower`).

One daemon thread reads every followed file (probes/tailer.py) and hands the lines to the asyncio
loop as runs, a batch at a time (probes/logbatch.py). The team measured plain reads at about 3.5x
less CPU than aiofiles at 10k lines/s: aiofiles pays a thread-pool round trip per read, this pays
one wake-up per poll. While lines come, the thread polls every `poll_interval` (lines arriving
meanwhile are taken together); once a poll finds nothing it sleeps on inotify
(radixtop.probes.fswait: the followed files' directories) until one of its files changes, with a
poll every second anyway, and polls as before (backing off to 50 ms) where inotify cannot be had
or while a rotated file is read out.

Where following starts in a file, and how line numbers stay true past line 1: probes/backlog.py.
What following survives (rotation, copytruncate, deletion, globs) and how lines are cleaned:
probes/tailer.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from radixtop.probes.logbatch import LogBatch, LogLines, SourceHealth
from radixtop.probes.tailer import GLOB_EVERY, Tailer

if TYPE_CHECKING:
    from radixtop.probes.fswait import FileWaiter

_IDLE_BACKOFF_AFTER = 1.0  # seconds without data before polling slower ...
_IDLE_MAX_INTERVAL = 0.05  # ... up to this: near-zero idle CPU, at most 50 ms extra first-line lag
# Once the files are quiet the reader sleeps on inotify (radixtop.probes.fswait) instead of polling,
# and polls anyway this often: a filesystem that sends no events (NFS written from another host),
# a glob whose directories have wildcards, a file we could not open and retry.
_INOTIFY_FALLBACK_S = 1.0
# The reader polls for this long after it starts before it makes its inotify waiter: importing
# ctypes on the reader thread took the GIL from the caller's first frame (20-100 ms of it here).
_WAITER_AFTER_S = 1.0
# read_now() reads in the caller's thread only while the reader's own reads take less than this:
# a file that reads slowly (a network filesystem) is left to the reader thread, off the UI's.
_READ_NOW_MAX_S = 0.002
# While the caller reads the files itself (read_now), the reader sleeps this many poll intervals
# at a time: at most that much later, it polls again once the caller stops.
_READ_NOW_YIELDS = 4


class LogFollower:
    """Follow files and globs; `async for batch in follower.batches()` until stop().

    The files are opened (and, unless from_start, positioned at their end, or `backlog_lines`
    before it) in __init__, so lines written after construction are delivered even if iteration
    starts a little later. Reading starts with the first batches() call, or earlier with start()
    (before an event loop runs: the UI starts it while it draws its first frame); take() and
    wait_caught_up() let a caller pick up what is there without a loop. One consumer at a time.
    count_delay > 0 holds the count of the lines before a backlog (which needs the CPU the caller's
    start-up needs too) until start_counting() or that many seconds.
    Memory stays bounded: when the consumer falls behind, the reader thread stops reading once
    max_batch lines wait (the bytes stay on disk; the initial backlog may add backlog_lines) and the
    next batch carries them all, instead of a queue of batches growing.
    """

    def __init__(
        self,
        patterns: Sequence[str],
        *,
        from_start: bool = False,
        poll_interval: float = 0.01,
        max_line: int = 65536,
        max_batch: int = 10000,
        backlog_lines: int = 0,
        history: bool = False,
        count_delay: float = 0.0,
        idle_wait: str = "auto",
    ) -> None:
        if isinstance(patterns, str):
            raise TypeError("patterns must be a sequence of paths or globs, not a single string")
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        if idle_wait not in ("auto", "poll"):
            raise ValueError(f"idle_wait must be 'auto' (inotify where it works) or 'poll', got {idle_wait!r}")
        if max_line < 1 or max_batch < 1 or backlog_lines < 0:
            raise ValueError(
                f"max_line and max_batch must be >= 1 and backlog_lines >= 0, "
                f"got {max_line!r}, {max_batch!r} and {backlog_lines!r}"
            )
        self._poll_interval = poll_interval
        self._max_batch = max_batch
        self._room_limit = max_batch + backlog_lines  # the initial backlog may wait whole
        self._tailer = Tailer(
            list(patterns),
            from_start=from_start,
            max_line=max_line,
            backlog_lines=backlog_lines,
            history=history,
            count_delay=count_delay,
        )
        self._tailer.start()
        # Runs and notices waiting for the consumer (a depth-one queue that coalesces), starting
        # with the initial scan's notices ("waiting", "error").
        self._room = threading.Condition()
        self._runs, self._notices, self._skipped = self._tailer.take_runs()
        self._waiting = 0  # lines in self._runs
        self._stop = self._tailer.stopping
        self._caught_up = threading.Event()  # every file read to where it was when we began
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._done = False  # the reader thread has ended (or will never start)
        self._idle_wait = idle_wait
        self._waiter: FileWaiter | None = None  # made on the reader thread when it first idles
        self._waiter_tried = False
        self._started = 0.0  # monotonic, when the reader thread started
        self._waiter_lock = threading.Lock()
        self.wait_mode = "poll"  # "inotify" once the reader sleeps on inotify (health, tests)
        self.polls = 0  # passes over the files (tests and benchmarks count them)
        self._poll_lock = threading.Lock()  # one pass over the files at a time (the tailer is not shared)
        self._poll_s = 1.0  # how long the last pass took, the reader's or read_now's (read_now's guard)
        self._read_now_at = -1e9  # when read_now last read the files (the reader's poll waits after it)
        self._consumer_waiting = False  # batches() waits on _wake: only then is the loop woken

    # -- consumer side (event loop) ----------------------------------------------------------------

    async def __aenter__(self) -> LogFollower:
        self._bind_loop()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start reading now, on the reader thread (batches() does it too). Idempotent."""
        if self._thread is not None or self._done:
            return
        if self._stop.is_set():
            self._done = True
            self._caught_up.set()
            return
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="radixtop-log-follower", daemon=True)
        self._thread.start()

    def _bind_loop(self) -> None:
        if self._loop is None:
            self._wake = asyncio.Event()  # before _loop: the reader reads _loop first, then _wake
            self._loop = asyncio.get_running_loop()
        self.start()

    async def batches(self) -> AsyncIterator[LogBatch]:
        """Batches as they come (each at most max_batch lines); ends after stop()."""
        self._bind_loop()
        assert self._wake is not None
        while True:
            self._wake.clear()  # before taking: a wake-up sent after this is not lost ...
            self._consumer_waiting = True  # ... and is sent (a publish after the take sees this)
            done = self._done
            batch = self.take()
            if batch is not None:
                self._consumer_waiting = False
                yield batch
                continue
            if done:
                return
            try:
                await self._wake.wait()
            finally:
                self._consumer_waiting = False

    def take(self) -> LogBatch | None:
        """What is waiting now (at most max_batch lines), or None; never blocks on the reader."""
        with self._room:
            if not self._runs and not self._notices and not self._skipped:
                return None
            if self._waiting <= self._max_batch:
                runs, self._runs, self._waiting = self._runs, [], 0
            else:
                runs = []
                room = self._max_batch
                while room:
                    run = self._runs[0]
                    if len(run.texts) <= room:
                        runs.append(self._runs.pop(0))
                        room -= len(run.texts)
                    else:
                        runs.append(run.part(0, room))
                        self._runs[0] = run.part(room, len(run.texts))
                        room = 0
                self._waiting -= self._max_batch
            notices, self._notices = self._notices, []
            skipped, self._skipped = self._skipped, []
            self._room.notify()
        return LogBatch(LogLines(runs), tuple(notices), tuple(skipped))

    def read_now(self) -> None:
        """Read what the files hold now, in the caller's thread, for a take() right after: a frame
        about to be drawn then shows the lines written up to it, not those of the reader's last
        poll (up to a poll interval older). Skipped while the reader is reading (its lines come
        with its own poll), before the backlog is in, when the consumer is a batch behind, and
        for files whose reads are slow."""
        if (self._thread is None or self._done or not self._caught_up.is_set() or self._poll_s > _READ_NOW_MAX_S
                or self._waiting >= self._max_batch or not self._poll_lock.acquire(blocking=False)):
            return
        try:
            if not self._stop.is_set():  # stopping: the reader closes the files
                now = self._read_now_at = time.monotonic()
                self._tailer.poll(now)
                self._publish()
                self._poll_s = time.monotonic() - now
        finally:
            self._poll_lock.release()

    def start_counting(self) -> None:
        """Count the lines before where following began now, not after count_delay: a caller
        that has drawn its first screen lets the count have the CPU."""
        self._tailer.count_gate.set()

    def wait_caught_up(self, timeout: float) -> bool:
        """Wait (at most timeout seconds) until every file has been read up to where it ended
        when following began (its backlog is all waiting to be taken). True if it has."""
        self.start()
        return self._caught_up.wait(timeout)

    def stop(self) -> None:
        """Stop reading and close the files; idempotent. batches() ends once it has yielded the rest.

        Joins the reader thread: from the event loop that blocks for at most one poll interval
        (<= 50 ms by default; an inotify wait is woken at once) plus the read in progress."""
        self._stop.set()
        with self._room:
            self._room.notify()
        with self._waiter_lock:
            if self._waiter is not None:
                self._waiter.wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        if thread is None:
            self._tailer.close()
            self._done = True
            self._caught_up.set()
            self._wake_consumer(always=True)

    def health(self) -> list[SourceHealth]:
        return self._tailer.health()

    # -- reader thread -----------------------------------------------------------------------------

    def _wake_consumer(self, *, always: bool = False) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None:
            return
        if not (always or self._consumer_waiting):
            # The consumer is busy or between frames and takes what waits when it is ready: a
            # wake-up of the loop per poll would cost the loop a pass each time for nothing.
            return
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError:
            pass  # the loop is closed: nobody is listening any more

    def _publish(self) -> None:
        runs, notices, skipped = self._tailer.take_runs()
        if not runs and not notices and not skipped:
            return
        with self._room:
            self._runs.extend(runs)
            self._waiting += sum(len(run.texts) for run in runs)
            self._notices.extend(notices)
            self._skipped.extend(skipped)
        self._wake_consumer()

    def _wait_for_room(self) -> None:
        with self._room:
            limit = self._room_limit if not self._caught_up.is_set() else self._max_batch
            while self._waiting >= limit and not self._stop.is_set():
                self._room.wait(0.1)

    def _file_waiter(self, now: float) -> FileWaiter | None:
        """The inotify waiter, made the first time the reader idles a while after it started (its
        import and set-up stay out of the caller's start-up); None until then and where inotify is
        not to be had."""
        if not self._waiter_tried and now - self._started >= _WAITER_AFTER_S:
            self._waiter_tried = True
            if self._idle_wait == "auto":
                from radixtop.probes.fswait import FileWaiter

                waiter = FileWaiter.create()
                with self._waiter_lock:
                    if self._stop.is_set() and waiter is not None:
                        waiter.close()
                        waiter = None
                    self._waiter = waiter
        return self._waiter

    def _run(self) -> None:
        interval = self._poll_interval
        last_data = time.monotonic()
        next_watch = 0.0
        try:
            while not self._stop.is_set():
                self._wait_for_room()
                now = time.monotonic()
                # The consumer read the files within the interval (a flood's frames read them
                # first): its read stands for this poll, which would wake the thread, take the
                # GIL from the frames and find the lines of a few milliseconds. The thread looks
                # again a few intervals later, not at each: the frames keep reading meanwhile.
                if now - self._read_now_at < interval:
                    time.sleep(interval * _READ_NOW_YIELDS)
                    continue
                with self._poll_lock:
                    busy = self._tailer.poll(now)
                    got_lines = bool(self._tailer.runs)
                    self._publish()
                self._poll_s = time.monotonic() - now
                self.polls += 1
                if not busy and not self._caught_up.is_set():
                    self._caught_up.set()
                if got_lines or busy:
                    last_data, interval = now, self._poll_interval
                    if busy:
                        continue  # more bytes are waiting: read them now rather than after a sleep
                else:
                    waiter = self._file_waiter(now) if self._caught_up.is_set() else None
                    targets = None
                    if waiter is not None:
                        with self._poll_lock:  # read_now may be reading the files
                            if self._tailer.rotating():
                                waiter = None
                            elif now >= next_watch or waiter.missing:
                                targets = self._tailer.watch_targets()
                    if waiter is not None:
                        # Quiet: sleep until the kernel says a followed file changed (tail -F's
                        # way; the polling below cost 0.3-0.9 % of a core doing nothing).
                        if targets is not None:
                            next_watch = now + GLOB_EVERY
                            if waiter.watch(targets):
                                self._tailer.next_glob = 0.0
                                continue  # a new watch sees nothing written before it: look once more
                        self.wait_mode = "inotify"
                        if waiter.wait(_INOTIFY_FALLBACK_S):
                            self._tailer.next_glob = 0.0  # a name appeared, say: expand the globs now
                        continue
                    self.wait_mode = "poll"
                    if now - last_data > _IDLE_BACKOFF_AFTER:
                        # Idle for a while: poll slower (up to 50 ms) so an idle follower costs little.
                        interval = max(self._poll_interval, min(interval * 1.5, _IDLE_MAX_INTERVAL))
                # Polls on a steady cadence while lines come (they are taken together): the time
                # spent reading counts toward the interval. time.sleep, not Event.wait(timeout):
                # half the CPU per wake-up here, and stop() waits at most one interval.
                time.sleep(max(0.0, now + interval - time.monotonic()))
        except Exception as exc:  # a bug here must not vanish silently with the thread
            message = f"the log follower stopped on an internal error: {exc!r}"
            self._tailer.notice("radixtop", "error", message)
            self._publish()
        finally:
            try:
                with self._poll_lock:
                    self._tailer.close()
                with self._waiter_lock:
                    if self._waiter is not None:
                        self._waiter.close()
            finally:
                self._done = True  # whatever happened, batches() must end
                self._caught_up.set()
                self._wake_consumer(always=True)
