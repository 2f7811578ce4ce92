"""The kv-events mirror's subscriber: one DP rank's SGLang publisher (ZMQ PUB, with its replay
ROUTER) read into a BlockMirror (probes/kv_mirror.py), sampled as a RadixSample for the board.

It catches up from the replay endpoint when it starts and after a gap in the sequence numbers, at
most once per poll (a silent replay endpoint stalls a poll for REPLAY_TIMEOUT_S, and the note says
so); a gap the replay cannot fill, a malformed message, a sequence that goes backwards (the
publisher restarted, or a batch jumped far ahead: the mirror starts over) or a publisher that is
not there is one line in the sample's status, never an exception: the mirror keeps what it has.
libzmq itself refuses a frame over kv_wire.MAX_BATCH_BYTES (ZMQ_MAXMSGSIZE drops the peer), so a
hostile frame is never held in memory. The sockets are used from
one worker thread at a time (asyncio.to_thread), never concurrently. Needs pyzmq and msgspec (the
`kv-events` extra); without them the status says how to install them.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from typing import Any

from radixtop.probes.kv_events_config import KvEventsSource
from radixtop.probes.kv_mirror import SOURCE, BlockMirror
from radixtop.probes.radix import RadixSample
from radixtop.probes.radix_tree import TreeIndex
from radixtop.probes.status import StateClock, one_line

DEFAULT_INTERVAL_S = 0.5
DEFAULT_BUDGET = 5_000  # nodes in the view, as the debug endpoint's probe asks
MAX_BATCHES_PER_POLL = 20_000  # the rest stays queued in ZMQ for the next poll
REPLAY_TIMEOUT_S = 2.0  # the whole answer; a publisher that does not answer in time is a line
MAX_REPLAY_BATCHES = 200_000  # SGLang keeps buffer_steps (10,000 by default)
# A forward jump this far is no run of lost batches (no publisher steps that far): it is not
# counted as lost, and a sequence that comes back after it starts the mirror over.
FAR_JUMP = 1 << 32
INSTALL_HINT = "kv-events need pyzmq and msgspec: pip install 'radixtop[kv-events]'"


class KvEventsProbe:
    """Subscribes to one publisher; poll() returns a RadixSample of the mirrored tree."""

    def __init__(
        self,
        source: KvEventsSource,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        budget: int = DEFAULT_BUDGET,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.url = source.url
        self.interval_s = interval_s
        self.budget = budget
        self._clock = clock
        self._state = StateClock(clock)
        self.mirror = BlockMirror()
        self._instance = secrets.token_hex(8)  # a new one when the publisher restarts
        self._last_seq: int | None = None
        self._live_seq: int | None = None  # the last sequence number the live stream gave
        self._far_jump = False  # the last live batch jumped FAR_JUMP or more ahead
        self._caught_up = False  # this poll asked the replay endpoint already
        self._ctx: Any = None
        self._sub: Any = None
        self._monitor: Any = None
        self._connected = False
        self._problem = ""  # the latest trouble, shown until the next one
        self._problem_at = 0.0
        self.lost = 0  # batches known to be missing from the mirror
        self.malformed = 0
        self.restarts = 0
        self.began_mid_stream = False
        self.resyncs = 0  # the sequence went backwards without a restart at 0 or 1
        self.drops = 0  # the publisher's connection dropped (libzmq drops one that sends an oversized frame)
        self.stalls = 0  # polls that waited REPLAY_TIMEOUT_S for a silent replay endpoint
        self._version = 0
        self._sampled_version = -1
        self._view_cache: tuple[Any, Any] | None = None

    # -- the async face --------------------------------------------------------------------------

    async def poll(self) -> RadixSample:
        try:
            return await asyncio.to_thread(self._poll)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a gap in our own handling must not take the app down
            return self._sample(
                "error", f"kv-events {self.source.endpoint}: radixtop failed: {type(exc).__name__}: {exc}"
            )

    async def aclose(self) -> None:
        await asyncio.to_thread(self._close)

    # -- the worker-thread side ------------------------------------------------------------------

    def _sample(self, state: str, message: str = "", **kw: Any) -> RadixSample:
        return RadixSample(
            self.url, self._state.update(state, message), self._clock(), rank=self.source.dp_rank,
            source=SOURCE, locks_known=False, **kw,
        )

    def _open(self) -> str:
        try:
            import zmq

            from radixtop.kv_wire import MAX_BATCH_BYTES
        except ImportError:
            return INSTALL_HINT
        self._ctx = zmq.Context()
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES)  # refused while read, never held whole
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        self._monitor = sub.get_monitor_socket()
        try:
            if self.source.sub_binds:
                sub.bind(self.source.endpoint)
            else:
                sub.connect(self.source.endpoint)
        except zmq.ZMQError as exc:
            sub.close(0)
            return f"cannot {'bind' if self.source.sub_binds else 'connect'} {self.source.endpoint}: {exc}"
        self._sub = sub
        self._catch_up(0)  # what the publisher kept from before we subscribed
        return ""

    def _close(self) -> None:
        for sock in (self._monitor, self._sub):
            if sock is not None:
                sock.close(0)
        self._monitor = self._sub = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def _note(self, problem: str) -> None:
        self._problem, self._problem_at = one_line(problem), self._clock()

    def _poll(self) -> RadixSample:
        self._caught_up = False
        if self._sub is None:
            why = self._open()
            if why:
                return self._sample("error", f"kv-events {self.source.endpoint}: {why}")
        self._watch_connection()
        self._drain()
        return self._view()

    def _watch_connection(self) -> None:
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        for _ in range(1_000):
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            if event in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
                self._connected = True
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                if self._connected:
                    self.drops += 1
                self._connected = False

    def _drain(self) -> None:
        import zmq

        for _ in range(MAX_BATCHES_PER_POLL):
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._receive(frames, live=True)

    def _receive(self, frames: list[bytes], *, live: bool) -> None:
        from radixtop.kv_wire import decode_batch, seq_of

        seq = seq_of(frames[1]) if len(frames) == 3 else None
        if seq is None:
            self.malformed += 1
            self._note(f"a message of {len(frames)} frames is not topic, sequence, batch: skipped")
            return
        if live and seq == self._live_seq:
            return  # the same batch twice
        # A live stream never goes back unless its publisher began again; numbering from 0 behind
        # what the replay brought is a restart too.
        if live and ((self._live_seq is not None and seq < self._live_seq) or (seq == 0 and (self._last_seq or 0) > 0)):
            self._start_over(seq)
        last = self._last_seq
        if live:
            self._far_jump = last is not None and seq - last > FAR_JUMP
            self._live_seq = seq
        if last is not None and seq <= last:
            return  # already applied (a replay overlaps the live stream)
        if live and last is not None and seq > last + 1:
            if self._far_jump:
                self._note(f"batch #{seq} jumps {seq - last:,} ahead of #{last}: a malformed sequence, or the "
                           "publisher restarted; not counted as lost")
            else:
                self._catch_up(last + 1)  # to the replay's end: this batch and any after it come too
                last = self._last_seq
                if last is not None and seq <= last:
                    return
                if last is not None and seq > last + 1:
                    missing = seq - last - 1
                    self.lost += missing
                    self._note(f"lost {missing:,} batches (seq {last + 1}..{seq - 1}) the replay did not bring: "
                               "blocks may be missing or stale")
        if last is None and seq > 0 and not self.mirror.blocks and not self.began_mid_stream:
            self.began_mid_stream = True
            if not (self.restarts or self.resyncs):  # else the line says why the mirror started over
                self._note(f"subscribed mid-stream (first batch #{seq}): blocks stored before it are not shown")
        try:
            batch = decode_batch(frames[2])
        except ValueError as exc:
            self.malformed += 1
            self._note(f"batch #{seq}: {exc}")
        else:
            self.mirror.apply(batch.events)
        self._last_seq = seq
        self._version += 1

    def _start_over(self, seq: int) -> None:
        """The live sequence went back to `seq`: the blocks mirrored so far belong to a publisher
        that is gone, or came with a malformed number; forget them and catch up again."""
        if seq <= 1:
            self.restarts += 1
            why = f"the publisher restarted (sequence back to {seq})"
        else:
            self.resyncs += 1
            why = f"the sequence went back from #{self._live_seq} to #{seq}"
            why += (": that batch jumped far ahead (malformed, or the publisher restarted)" if self._far_jump
                    else ": the publisher restarted, or a batch was malformed")
        self.mirror.clear()
        self._instance = secrets.token_hex(8)
        self._last_seq = self._live_seq = None
        self._far_jump = self.began_mid_stream = False
        self._note(f"{why}: the mirror starts over")
        if seq > 0:
            self._catch_up(0)  # what the new publisher kept before this batch

    def _catch_up(self, start: int) -> None:
        """Ask the replay endpoint for the batches from `start` on and apply them in order; at most
        once per poll: a silent endpoint stalls the poll for REPLAY_TIMEOUT_S each time it is asked."""
        if self.source.replay_endpoint is None:
            if start > 0:
                self._note("no replay endpoint: missed batches cannot be fetched")
            return
        if self._caught_up:
            return  # the gap is counted as lost; the next gap, in a later poll, asks again
        self._caught_up = True
        import zmq

        from radixtop.kv_wire import END_SEQ, MAX_BATCH_BYTES, seq_bytes

        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES)
        deadline = time.monotonic() + REPLAY_TIMEOUT_S
        try:
            dealer.connect(self.source.replay_endpoint)
            dealer.send_multipart([b"", seq_bytes(start)])
            for _ in range(MAX_REPLAY_BATCHES):
                left = deadline - time.monotonic()
                if left <= 0 or not dealer.poll(int(left * 1000)):
                    self.stalls += 1
                    self._note(f"replay endpoint {self.source.replay_endpoint} did not answer in "
                               f"{REPLAY_TIMEOUT_S:g} s: the mirror waited for it")
                    return
                frames = dealer.recv_multipart()
                if len(frames) == 4 and frames[2] == END_SEQ:
                    return
                if len(frames) != 4 or frames[0] != b"":
                    self.malformed += 1
                    self._note(f"a replay message of {len(frames)} frames is not SGLang's: skipped")
                    continue
                self._receive(frames[1:], live=False)
        finally:
            dealer.close(0)

    def _view(self) -> RadixSample:
        unchanged = self._version == self._sampled_version
        state, message = "ok", ""
        if not self._connected:
            verb = "no publisher has connected to" if self.source.sub_binds else "no publisher answers at"
            state, message = "down", f"kv-events: {verb} {self.source.endpoint} (the mirror keeps what it had)"
        elif self._problem and self._clock() - self._problem_at < 60.0:
            state, message = "degraded", f"kv-events: {self._problem}"
        if not unchanged or self._view_cache is None:  # an idle cache costs no rebuild
            snapshot = self.mirror.snapshot(
                rank=self.source.dp_rank, instance=self._instance, seq=self._last_seq or 0, budget=self.budget
            )
            self._view_cache = (snapshot, TreeIndex.build(snapshot))
        self._sampled_version = self._version  # only once built: a view that failed is built again
        snapshot, index = self._view_cache
        return self._sample(
            state, message, snapshot=snapshot, index=index, unchanged=unchanged,
            events_dropped=0, source_note=self.note(),
        )

    def note(self) -> str:
        """One line of what the mirror holds and what it missed."""
        m = self.mirror
        parts = [
            f"{len(m.blocks):,} blocks",
            f"{m.tokens:,} tokens",
            f"batch #{self._last_seq}" if self._last_seq is not None else "no batch yet",
        ]
        if self.lost:
            parts.append(f"{self.lost:,} batches lost")
        if self.malformed:
            parts.append(f"{self.malformed:,} malformed")
        if self.began_mid_stream:
            parts.append("began mid-stream")
        if self.restarts or self.resyncs:
            parts.append(f"started over {self.restarts + self.resyncs:,}x")
        if self.stalls:
            polls = f"{self.stalls:,} poll" + ("s" if self.stalls != 1 else "")
            parts.append(f"replay silent: waited {self.stalls * REPLAY_TIMEOUT_S:g} s in {polls}")
        if self.drops:
            parts.append(f"connection dropped {self.drops:,}x (a restart, or a frame over 16 MiB refused)")
        if m.unknown_parents:
            parts.append(f"{m.unknown_parents:,} blocks under unseen parents")
        return f"{self.source.endpoint}: " + " · ".join(parts)

