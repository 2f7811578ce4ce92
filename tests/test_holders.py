"""The requests holding tree locks (radixtop/instrument/holders.py) and the node a failing lock
operation was on: read from scheduler-shaped objects, kept with the time each lock was first seen,
named as a snapshot's rows name nodes, in the simulator as in SGLang (tests/test_sglang_server.py
checks them on a real server)."""

from __future__ import annotations

import asyncio
import json
import os
import types
from pathlib import Path

import pytest
from test_instrument import filled_sim_cache, insert
from test_sim_server import inproc

from radixtop.instrument import holders as holders_mod
from radixtop.instrument.endpoint import Instrumentation
from radixtop.instrument.flight import record_name
from radixtop.instrument.holders import MAX_WAITING_SCAN, HolderTracker
from radixtop.schema import FlightRecord, Snapshot
from radixtop.sim.engine import Engine, SimConfig
from radixtop.sim.radix import RadixKey, TreeNode


def req(rid: str, node: object = None, prompt: int = 5, locked: bool = True) -> types.SimpleNamespace:
    lock = types.SimpleNamespace(node=node) if locked else None
    return types.SimpleNamespace(rid=rid, origin_input_ids=list(range(prompt)), output_ids=[], lock=lock)


def scheduler(**places: object) -> types.SimpleNamespace:
    """SGLang's names: running_batch / cur_batch / last_batch (each with .reqs), chunked_req, waiting_queue."""
    s = types.SimpleNamespace()
    for name, value in places.items():
        setattr(s, name, types.SimpleNamespace(reqs=value) if name.endswith("batch") else value)
    return s


def states(tracker: HolderTracker) -> list[tuple[str, str]]:
    assert tracker.latest is not None
    return [(s.req.rid, s.state) for s in tracker.latest]


# ----------------------------------------------------------------------------------------------
# The reader


def test_the_reader_finds_every_holder_once_in_the_place_that_names_its_state() -> None:
    chunked, running, waiting = req("c"), req("r"), req("w")
    tracker = HolderTracker()
    tracker.observe(scheduler(
        chunked_req=chunked, running_batch=[running, req("free", locked=False)], last_batch=[chunked, running],
        waiting_queue=[waiting],
    ))
    assert states(tracker) == [("c", "chunked"), ("r", "running"), ("w", "waiting")]
    tracker.observe(scheduler())  # a scheduler with none of the places: no holders, not unknown
    assert tracker.latest == []


def test_the_reader_is_bounded_and_never_raises() -> None:
    tracker = HolderTracker(max_holders=3)
    tracker.observe(scheduler(running_batch=[req(str(i)) for i in range(10)]))
    assert [rid for rid, _ in states(tracker)] == ["0", "1", "2"]
    waiting = [req(f"x{i}", locked=False) for i in range(MAX_WAITING_SCAN)] + [req("past the scan")]
    tracker = HolderTracker()
    tracker.observe(scheduler(waiting_queue=waiting))
    assert tracker.latest == []

    class Broken:
        @property
        def running_batch(self) -> object:
            raise RuntimeError("a scheduler we do not understand")

    tracker.observe(Broken())
    assert tracker.latest is None and tracker.errors == 1
    tracker.observe(None)
    assert tracker.latest is None


def test_a_lock_keeps_the_time_it_was_first_seen_and_is_forgotten_once_gone() -> None:
    a, b = req("a"), req("b")
    tracker = HolderTracker()
    tracker.observe(scheduler(running_batch=[a]), now=10.0)
    tracker.observe(scheduler(running_batch=[a, b]), now=12.0)
    assert [(s.req.rid, s.first_seen) for s in tracker.latest or ()] == [("a", 10.0), ("b", 12.0)]
    tracker.observe(scheduler(running_batch=[b]), now=13.0)  # a's lock is gone: forgotten
    tracker.observe(scheduler(running_batch=[a, b]), now=14.0)
    assert [(s.req.rid, s.first_seen) for s in tracker.latest or ()] == [("a", 14.0), ("b", 12.0)]
    a.lock = types.SimpleNamespace(node=None)  # a checkpoint's new lock: held since it was taken
    tracker.observe(scheduler(running_batch=[a, b]), now=15.0)
    assert [s.first_seen for s in tracker.latest or ()] == [15.0, 12.0]
    assert len(tracker._first) == 2


def test_a_lock_let_go_is_remembered_with_its_node_newest_last_and_bounded() -> None:
    a, b = req("a", node=7), req("b", node=types.SimpleNamespace(id=8))  # a NodeId; a TreeNode's id
    tracker = HolderTracker(max_released=3)
    tracker.observe(scheduler(running_batch=[a, b]), now=10.0)
    assert not tracker.released
    a.lock = types.SimpleNamespace(node=9)  # a checkpoint: the lock moves deeper
    tracker.observe(scheduler(running_batch=[a, b]), now=11.0)
    tracker.observe(scheduler(running_batch=[a]), now=12.0)  # b finished
    assert [(r.rid, r.node, r.released) for r in tracker.released.values()] == [("a", 7, 11.0), ("b", 8, 12.0)]
    assert tracker.released["b", 8].prompt == list(range(5))
    for i in range(5):
        tracker.observe(scheduler(running_batch=[req(f"x{i}", node=100 + i)]), now=13.0 + i)
    assert [r.rid for r in tracker.released.values()] == ["x1", "x2", "x3"]  # the newest three


def test_the_requests_that_let_go_are_named_once_each_and_gone_nodes_are_forgotten() -> None:
    tracker = HolderTracker()
    a, b, c = req("a", node=1), req("b", node=2), req("c", node=3)
    tracker.observe(scheduler(running_batch=[a, b, c]), now=0.0)
    a.lock = types.SimpleNamespace(node=4)  # a moves deeper, then finishes: two nodes remembered
    tracker.observe(scheduler(running_batch=[a, b, c]), now=1.0)
    tracker.observe(scheduler(running_batch=[a, c]), now=2.0)
    tracker.observe(scheduler(running_batch=[c]), now=3.0)
    still = tracker.latest or []
    # Python cores: the node's id, one entry per rid (its newest), none for a request holding a lock.
    got = holders_mod.raw_sharers(tracker.released, still, now=5.0)
    assert [(h.rid, h.node, h.held_s, h.state) for h in got] == [("a", 4, 2.0, "released"), ("b", 2, 3.0, "released")]
    # The Rust core: a node the core no longer has raises, and is forgotten; the older one stands in.
    paths = {1: [10], 2: [10, 20]}
    got = holders_mod.raw_sharers(tracker.released, still, now=5.0, path_of=lambda node: paths[node])
    assert [(h.rid, h.node) for h in got] == [("b", [10, 20]), ("a", [10])]  # newest let go first
    assert got[1].ids == (list(range(5)), [])
    assert ("a", 4) not in tracker.released and ("a", 1) in tracker.released
    named = holders_mod.named_sharers(got, (55, None))
    assert [(s.rid, s.node, s.released_s) for s in named] == [("b", 55, 3.0), ("a", None, 4.0)]
    assert all(r.rid != "c" for r in tracker.released.values())  # c holds its lock still


# ----------------------------------------------------------------------------------------------
# In a snapshot


def serving(cache: object) -> Instrumentation:
    inst = Instrumentation(cache, rank=0, port=0, min_interval_s=0.0)
    assert inst.start()
    return inst


def captured(inst: Instrumentation, requests: object = None) -> Snapshot:
    inst.endpoint.want_capture()
    inst.endpoint._next_at = 0.0  # the duty cap's rest, over for the test
    assert inst.safe_point(requests)
    snap, _ = inst.endpoint.latest()
    assert snap is not None
    return Snapshot.from_dict(json.loads(snap.to_json()))  # as a reader gets it


def test_a_snapshot_names_each_holders_node_as_its_rows_do() -> None:
    cache = filled_sim_cache(n_prompts=10)
    node = insert(cache, list(range(5000, 5040)))
    lock = cache.lock(node)
    holder = types.SimpleNamespace(rid="r" * 300, origin_input_ids=list(range(5000, 5040)), output_ids=[], lock=lock)
    inst = serving(cache)
    try:
        snap = captured(inst, scheduler(running_batch=[holder]))
        (got,) = snap.holders or ()
        assert got.rid == "r" * 200 and got.prompt_tokens == 40 and got.state == "running"
        assert got.node == node.id and got.held_s >= 0.0
        row = next(r for r in snap.tree.nodes if r.id == got.node)
        assert row.lock_ref == 1 and row.head[:3] == (5000, 5001, 5002)
        cache.unlock(holder.lock)
        holder.lock = None
        assert captured(inst, scheduler(running_batch=[holder])).holders == ()
        assert captured(inst).holders is None  # a cache instrumented without its scheduler: unknown
    finally:
        inst.close()


# ----------------------------------------------------------------------------------------------
# The node a failing lock operation was on


def test_a_lock_and_an_unlock_that_raise_name_their_node_in_the_flight_record(tmp_path: Path) -> None:
    cache = filled_sim_cache(n_prompts=10)
    stray = TreeNode(id=4242)  # a node of no tree: the cache's walk up from it fails, as SGLang's does
    stray.key = RadixKey([1, 2])
    inst = Instrumentation(cache, rank=0, port=0, flight_dir=tmp_path)
    try:
        with pytest.raises(AttributeError):  # past the stray node there is no parent to lock
            cache.inc_lock_ref(stray)
        with pytest.raises(AssertionError, match="another tree"):
            cache.dec_lock_ref(stray)
        with pytest.raises(TypeError):
            cache.evict(object())
    finally:
        inst.close()
    record = FlightRecord.from_dict(json.loads((tmp_path / record_name(0, os.getpid())).read_bytes()))
    assert [(t.kind, t.node) for t in record.triggers] == [
        ("lock_failure", 4242), ("unlock_failure", 4242), ("evict_failure", None)
    ]


# ----------------------------------------------------------------------------------------------
# The simulator


def test_the_simulators_requests_are_its_snapshots_holders_and_then_its_sharers() -> None:
    engine = Engine(SimConfig(page_size=4, step_time_s=0, tp_size=2), lambda line: None)
    insts = [serving(cache) for _, cache in sorted(engine.caches.items())]
    try:
        from concurrent.futures import Future

        prompt = list(range(10, 50))
        future: Future = Future()
        engine.submit(prompt, max_new_tokens=30, future=future, rid="long")
        engine.submit(list(range(60, 70)), max_new_tokens=30, future=Future(), rid="other")
        for _ in range(3):
            engine.iterate()
        for rank, inst in enumerate(insts):
            snap = captured(inst, engine.rank_requests(rank))
            holders = {h.rid: h for h in snap.holders or ()}
            assert set(holders) == {"long", "other"}
            long = holders["long"]
            assert long.state == "running" and long.prompt_tokens == 40
            row = next(r for r in snap.tree.nodes if r.id == long.node)
            assert row.lock_ref == 1 and row.tokens == 40 and row.head[:4] == tuple(prompt[:4])
        while not future.done():
            engine.iterate()
        engine.iterate()
        snap = captured(insts[0], engine.rank_requests(0))
        later = [h.rid for h in snap.holders or ()]
        assert later == ["other"] or later == []
        # "long" let go of its lock and its node stays cached: the snapshot names it there.
        (used,) = [u for u in snap.sharers or () if u.rid == "long"]
        row = next(r for r in snap.tree.nodes if r.id == used.node)
        assert row.lock_ref == 0 and row.head[:4] == tuple(prompt[:4]) and used.prompt_tokens == 40
    finally:
        for inst in insts:
            inst.close()


@pytest.mark.parametrize("fault", ["double-unlock:probability=1"])
def test_a_simulated_faults_flight_record_names_the_node_it_concerns(
    fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The double unlock drives lock_ref below zero until a prefill's allocation fails: the record
    written as the scheduler dies names the node unlocked twice."""
    monkeypatch.setenv("RADIXTOP_FLIGHT_DIR", str(tmp_path / "flight"))

    async def run() -> None:
        flags = ("--max-total-tokens", "1024", "--page-size", "16", "--max-running-requests", "8", "--fault", fault)
        async with inproc(tmp_path, *flags) as (sim, client):

            async def one(i: int) -> None:  # four families of prompts sharing 48 tokens
                body = {"input_ids": [100 + i % 4] * 48 + [200 + i] * 60, "sampling_params": {"max_new_tokens": 40}}
                await client.post("/generate", json=body)

            for wave in range(10):
                if sim.engine.dead_reason is not None:
                    break
                await asyncio.gather(*(one(wave * 48 + i) for i in range(48)), return_exceptions=True)
            assert sim.engine.dead_reason is not None, "the double unlock did not kill the scheduler"
            assert sim.engine.dead_nodes, "the death names no node"

    asyncio.run(run())
    record = FlightRecord.from_dict(json.loads((tmp_path / "flight" / record_name(0, os.getpid())).read_bytes()))
    (trigger,) = record.triggers
    below_zero = {e.node_id for e in record.events if e.kind == "negative_lock_ref"}
    assert trigger.kind == "scheduler_exception" and trigger.node in below_zero
