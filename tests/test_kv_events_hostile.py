"""The kv-events mirror against a misbehaving publisher, a real process on 127.0.0.1
(tests/kv_publisher.py): an oversized frame is refused by libzmq before it is held, a silent
replay endpoint stalls at most one catch-up per poll and says so, a sequence that jumps far ahead
and comes back starts the mirror over, and a parent removed and stored again never leaves a stale
root."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_kv_events import free_port

from radixtop.demo import stop_process
from radixtop.kv_wire import BlockRemoved, BlockStored
from radixtop.probes.kv_events import KvEventsProbe
from radixtop.probes.kv_events_config import KvEventsSource
from radixtop.probes.kv_mirror import BlockMirror

PUBLISHER = Path(__file__).with_name("kv_publisher.py")
ROOT = Path(__file__).resolve().parent.parent


class Publisher:
    """tests/kv_publisher.py in MODE, with its ports and the source that names them."""

    def __init__(self, mode: str, *args: str) -> None:
        self.pub_port, self.replay_port = free_port(), free_port()
        self.source = KvEventsSource(0, f"tcp://127.0.0.1:{self.pub_port}", "",
                                     f"tcp://127.0.0.1:{self.replay_port}")
        self.proc = subprocess.Popen(
            [sys.executable, str(PUBLISHER), mode, str(self.pub_port), str(self.replay_port), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
        )

    def said(self, word: str, timeout_s: float = 60.0) -> None:
        """Wait for the publisher's line `word` (its stdout is line-buffered)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.strip() == word:
                return
            if not line:
                break
        raise AssertionError(f"the publisher did not say {word!r}")

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        stop_process(self.proc)


def poll_until(probe: KvEventsProbe, predicate, timeout_s: float = 30.0, polls: int = 200):
    deadline = time.monotonic() + timeout_s
    sample = None
    for _ in range(polls):
        sample = asyncio.run(probe.poll())
        if predicate(sample) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return sample


# The subscriber as a process of its own, so that its peak memory is its alone: it polls until the
# file `done` appears (at most 90 s), then prints its note and status and its peak RSS (VmHWM).
SUBSCRIBER = """
import asyncio, json, os, sys, time
from radixtop.probes.kv_events import KvEventsProbe
from radixtop.probes.kv_events_config import KvEventsSource
pub, replay, done = sys.argv[1:4]
probe = KvEventsProbe(KvEventsSource(0, pub, "", replay))
deadline = time.monotonic() + 90
sample = None
while time.monotonic() < deadline and not os.path.exists(done):
    sample = asyncio.run(probe.poll())
    time.sleep(0.1)
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]
print(json.dumps({"note": probe.note(), "status": sample.status.message if sample else "", "hwm_kib": int(hwm),
                  "blocks": len(probe.mirror.blocks)}))
asyncio.run(probe.aclose())
"""


def test_an_oversized_frame_is_refused_by_libzmq_before_it_is_held(tmp_path: Path) -> None:
    size_mib = 384  # one frame from the replay endpoint and one from the live stream
    publisher = Publisher("huge", str(size_mib))
    done = tmp_path / "done"
    sub = subprocess.Popen(
        [sys.executable, "-c", SUBSCRIBER, publisher.source.endpoint, str(publisher.source.replay_endpoint),
         str(done)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
    )
    try:
        publisher.said("sent")
        time.sleep(3.0)  # the live frame reaches the subscriber's socket
        done.touch()
        out, _ = sub.communicate(timeout=120)
    finally:
        publisher.stop()
        stop_process(sub)
    report = json.loads(out.strip().splitlines()[-1])
    # Received whole, one frame would have cost its size at least; refused, the subscriber holds
    # what Python, pyzmq and msgspec cost.
    assert report["hwm_kib"] >> 10 < size_mib // 2, report
    assert report["blocks"] == 0
    assert "connection dropped" in report["note"] or "did not answer" in report["status"], report


def test_a_silent_replay_endpoint_stalls_one_catch_up_per_poll_and_the_note_says_so() -> None:
    publisher = Publisher("gaps")
    probe = KvEventsProbe(publisher.source)
    try:
        asyncio.run(probe.poll())  # subscribes; its catch-up from the start waits for the silent endpoint
        publisher.said("subscribed")
        publisher.said("sent")
        time.sleep(0.5)
        began = time.monotonic()
        # 40 batches, each after a gap: asked once per gap, the endpoint would hold one poll 80 s.
        sample = poll_until(probe, lambda s: len(probe.mirror.blocks) == 40, timeout_s=40, polls=20)
        took = time.monotonic() - began
    finally:
        asyncio.run(probe.aclose())
        publisher.stop()
    assert len(probe.mirror.blocks) == 40, probe.note()
    assert took < 40, f"40 gaps took {took:.0f} s"
    assert probe.stalls >= 1 and "replay silent: waited" in probe.note()
    assert "replay endpoint" in sample.status.message or "lost" in sample.status.message, sample.status
    assert probe.lost >= 30  # gaps past the one catch-up are counted, not waited for


def test_a_sequence_that_jumps_far_ahead_and_comes_back_starts_the_mirror_over() -> None:
    publisher = Publisher("far")
    probe = KvEventsProbe(publisher.source)
    try:
        asyncio.run(probe.poll())
        publisher.said("subscribed")
        publisher.said("sent")
        sample = poll_until(probe, lambda s: len(probe.mirror.blocks) == 99, timeout_s=30)
    finally:
        asyncio.run(probe.aclose())
        publisher.stop()
    # Batches 1..99 are mirrored; the block of the batch numbered 2**63 - 1 is gone with it.
    assert set(probe.mirror.blocks) == {100 + i for i in range(1, 100)}, probe.note()
    assert probe.restarts + probe.resyncs == 1 and "started over 1x" in probe.note()
    assert sample is not None and "the mirror starts over" in sample.status.message, sample.status
    assert probe.lost == 0


def test_a_parent_stored_again_under_its_child_leaves_no_stale_root() -> None:
    publisher = Publisher("stale_root")
    probe = KvEventsProbe(publisher.source)
    try:
        asyncio.run(probe.poll())
        publisher.said("subscribed")
        publisher.said("sent")
        sample = poll_until(probe, lambda s: len(probe.mirror.blocks) == 11, timeout_s=30)
        again = asyncio.run(probe.poll())
    finally:
        asyncio.run(probe.aclose())
        publisher.stop()
    assert sample is not None and sample.status.state == "ok", sample.status
    tree = sample.snapshot.tree
    assert tree.walked_tokens == 11  # A (now a root) and the ten roots after it
    assert again.status.state == "ok" and again.snapshot.tree.walked_tokens == 11


def test_a_view_that_fails_is_built_again_not_cached_as_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = KvEventsProbe(KvEventsSource(0, "tcp://127.0.0.1:1"))
    probe._version = 1
    probe._connected = True
    broken = {"calls": 0}
    real = BlockMirror.snapshot

    def failing_once(self, **kw):
        broken["calls"] += 1
        if broken["calls"] == 1:
            raise KeyError(2)
        return real(self, **kw)

    monkeypatch.setattr(BlockMirror, "snapshot", failing_once)
    with pytest.raises(KeyError):
        probe._view()
    sample = probe._view()  # nothing changed since: the view is built now, not taken as sampled
    assert broken["calls"] == 2 and sample.snapshot is not None and not sample.unchanged


def test_removing_a_block_always_takes_it_out_of_the_roots() -> None:
    m = BlockMirror()

    def stored(h: int, parent: int | None, token: int) -> BlockStored:
        return BlockStored(block_hashes=[h], parent_block_hash=parent, token_ids=[token], block_size=1, lora_id=None)

    m.apply([stored(1, None, 1), stored(2, 1, 2), BlockRemoved(block_hashes=[1]), stored(1, 2, 3),
             BlockRemoved(block_hashes=[2])])
    assert m.roots == {1} and set(m.blocks) == {1} and m.blocks[1].parent is None
    assert m.prefixes() == {(3,)}
    assert m.snapshot(rank=0, instance="x", seq=5, budget=100).tree.walked_tokens == 1


def test_a_far_jump_mid_stream_is_not_counted_lost_and_the_way_back_starts_over() -> None:
    from radixtop.kv_wire import EventBatch, encode_batch, seq_bytes

    probe = KvEventsProbe(KvEventsSource(0, "tcp://127.0.0.1:1"))  # no replay endpoint: nothing to ask

    def batch(seq: int, block: int) -> list[bytes]:
        stored = BlockStored(block_hashes=[block], parent_block_hash=None, token_ids=[block], block_size=1,
                             lora_id=None)
        return [b"", seq_bytes(seq), encode_batch(EventBatch(ts=0.0, events=[stored]))]

    for seq in range(5):
        probe._receive(batch(seq, 100 + seq), live=True)
    probe._receive(batch(1 << 62, 999), live=True)  # a malformed number, far ahead
    assert probe.lost == 0 and "jumps" in probe._problem
    for seq in range(5, 8):
        probe._receive(batch(seq, 100 + seq), live=True)
    assert probe.resyncs == 1 and "jumped far ahead" in probe._problem and "starts over" in probe._problem
    assert set(probe.mirror.blocks) == {105, 106, 107} and probe.lost == 0
    assert "started over 1x" in probe.note()
    # Numbering from 0 behind what only the replay brought: a restart, not "already applied".
    fresh = KvEventsProbe(KvEventsSource(0, "tcp://127.0.0.1:1"))
    for seq in range(4):
        fresh._receive(batch(seq, 200 + seq), live=False)
    fresh._receive(batch(0, 300), live=True)
    assert fresh.restarts == 1 and set(fresh.mirror.blocks) == {300}
