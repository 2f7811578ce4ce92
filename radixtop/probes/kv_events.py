"""The kv-events mirror's subscriber: one DP rank's SGLang publisher (ZMQ PUB, with its replay
ROUTER) read into a BlockMirror (probes/kv_mirror.py), sampled as a RadixSample for the board.

It catches up from the replay endpoint when it starts and after a gap in the sequence numbers; a
gap the replay cannot fill, a malformed message, or a publisher that is not there is one line in
the sample's status, never an exception: the mirror keeps what it has. The sockets are used from
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
        except ImportError:
            return INSTALL_HINT
        self._ctx = zmq.Context()
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
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
        last = self._last_seq
        if last is not None and seq <= last:
            if live and seq < last and seq == 0:  # numbering began again: the publisher restarted
                self.restarts += 1
                self.mirror.clear()
                self._instance = secrets.token_hex(8)
                self._note("the publisher restarted (sequence back to 0): the mirror starts over")
                last = self._last_seq = None
            else:
                return  # already applied (a replay overlaps the live stream)
        if live and last is not None and seq > last + 1:
            self._catch_up(last + 1)  # to the replay's end: this batch and any after it come too
            last = self._last_seq
            if last is not None and seq <= last:
                return
            if last is not None and seq > last + 1:
                missing = seq - last - 1
                self.lost += missing
                self._note(f"lost {missing:,} batches (seq {last + 1}..{seq - 1}) the replay no longer had: "
                           "blocks may be missing or stale")
        if last is None and seq > 0 and not self.mirror.blocks and not self.began_mid_stream:
            self.began_mid_stream = True
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

    def _catch_up(self, start: int) -> None:
        """Ask the replay endpoint for the batches from `start` on and apply them in order."""
        if self.source.replay_endpoint is None:
            if start > 0:
                self._note("no replay endpoint: missed batches cannot be fetched")
            return
        import zmq

        from radixtop.kv_wire import END_SEQ, seq_bytes

        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        deadline = time.monotonic() + REPLAY_TIMEOUT_S
        try:
            dealer.connect(self.source.replay_endpoint)
            dealer.send_multipart([b"", seq_bytes(start)])
            for _ in range(MAX_REPLAY_BATCHES):
                left = deadline - time.monotonic()
                if left <= 0 or not dealer.poll(int(left * 1000)):
                    self._note(
                        f"replay endpoint {self.source.replay_endpoint} did not answer in {REPLAY_TIMEOUT_S:g} s"
                    )
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
        self._sampled_version = self._version
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
        if m.unknown_parents:
            parts.append(f"{m.unknown_parents:,} blocks under unseen parents")
        return f"{self.source.endpoint}: " + " · ".join(parts)

