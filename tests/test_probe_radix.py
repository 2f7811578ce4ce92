"""probes/radix: the debug-endpoint client against a real simulator and a real loopback server
that misbehaves in every way we could think of; each misbehaviour is a status, never an exception."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pane_helpers import (
    Answer,
    event_page,
    health_body,
    make_snapshot,
    start_sim,
    stop,
    stub_server,
    wide_snapshot,
)

from radixtop.probes.radix import RadixProbe
from radixtop.probes.radix_tree import TreeIndex, parse_and_index
from radixtop.schema import (
    EVENTS_PATH,
    HEALTH_PATH,
    SNAPSHOT_PATH,
    Counters,
    Event,
    encode_json,
)
from radixtop.session.radix_board import RadixBoard, rank_groups


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    proc, url, _ = start_sim(tmp_path_factory.mktemp("sim"), "--tp-size", "2", "--enable-metrics")
    yield url
    stop(proc)


def _instrument(url: str) -> list[str]:
    return httpx.get(url + "/server_info", timeout=5, trust_env=False).json()["radixtop_instrument"]


# ----------------------------------------------------------------------------------------------
# Against the simulator


async def test_each_rank_of_the_simulator_gives_a_snapshot_and_an_index(sim) -> None:
    urls = _instrument(sim)
    assert len(urls) == 2
    for rank, url in enumerate(urls):
        probe = RadixProbe(url)
        try:
            sample = await probe.poll()
            for _ in range(50):  # the endpoint answers 503 until the scheduler's first safe point
                if sample.status.state != "starting":
                    break
                await asyncio.sleep(0.1)
                sample = await probe.poll()
            assert sample.status.state == "ok", sample.status
            assert sample.rank == rank
            snap = sample.snapshot
            assert snap is not None and snap.tree is not None and snap.capacity_tokens == 16384
            index = sample.index
            assert index is not None and len(index.children) == len(snap.tree.nodes)
            again = await probe.poll()
            assert again.status.since == sample.status.since, "a state that did not change keeps its since"
            assert again.snapshot is not None
        finally:
            await probe.aclose()


async def test_a_server_that_is_not_the_endpoint_says_so(sim) -> None:
    probe = RadixProbe(sim)  # the SGLang API itself, not a debug endpoint
    try:
        sample = await probe.poll()
    finally:
        await probe.aclose()
    assert sample.status.state == "error"
    assert "has no radixtop debug endpoint (HTTP 404" in sample.status.message
    assert sample.snapshot is None


async def test_down_then_back_keeps_the_time_it_went_down() -> None:
    with stub_server() as stub:
        url = stub.url
    probe = RadixProbe(url, timeout_s=1.0)
    try:
        first = await probe.poll()
        second = await probe.poll()
        assert first.status.state == second.status.state == "down"
        assert "connection refused" in first.status.message
        assert second.status.since == first.status.since
    finally:
        await probe.aclose()


# ----------------------------------------------------------------------------------------------
# Against a misbehaving server


async def _poll(stub, **kw):
    probe = RadixProbe(stub.url, **kw)
    try:
        return await probe.poll()
    finally:
        await probe.aclose()


@pytest.mark.parametrize(
    "answer, state, expect",
    [
        (Answer(body=b"<html>hello</html>"), "error", "snapshot: not valid JSON"),
        (Answer(body=b'{"schema_version": 1}'), "error", "snapshot: missing field"),
        (Answer(body=b"[1, 2, 3]"), "error", "expected a JSON object"),
        (Answer(503, b'{"schema_version":1,"error":"no snapshot yet: retry shortly"}'), "starting", "no snapshot yet"),
        (Answer(500, b"Internal Server Error"), "error", "HTTP 500: error response without a radixtop message"),
        (Answer(401, b'{"schema_version":1,"error":"missing or wrong bearer token"}'), "error", "bearer token"),
    ],
)
async def test_bad_answers_are_a_status(answer, state, expect) -> None:
    with stub_server() as stub:
        stub.answers[SNAPSHOT_PATH] = answer
        sample = await _poll(stub)
    assert sample.status.state == state
    assert expect in sample.status.message
    assert "\n" not in sample.status.message
    assert sample.snapshot is None


async def test_wrong_schema_version_says_what_to_do() -> None:
    body = json.loads(make_snapshot().to_json())
    body["schema_version"] = 2
    with stub_server() as stub:
        stub.answers[SNAPSHOT_PATH] = Answer(body=json.dumps(body).encode())
        sample = await _poll(stub)
    assert sample.status.state == "error"
    assert "schema version 2 is not supported" in sample.status.message
    assert "matching radixtop versions" in sample.status.message


async def test_a_timeout_is_a_status() -> None:
    with stub_server() as stub:
        stub.answers[SNAPSHOT_PATH] = Answer(body=make_snapshot().to_json(), delay_s=1.0)
        sample = await _poll(stub, timeout_s=0.2)
    assert sample.status.state == "error"
    assert "no answer within 0.2 s" in sample.status.message


@pytest.mark.parametrize("with_length", [True, False])
async def test_a_50_mb_answer_is_refused_without_holding_it(with_length) -> None:
    with stub_server() as stub:
        stub.answers[SNAPSHOT_PATH] = Answer(stream_bytes=50 * 1024 * 1024, length=with_length)
        sample = await _poll(stub, max_bytes=8 * 1024 * 1024)
    assert sample.status.state == "error"
    assert "radixtop accepts" in sample.status.message and "8 MiB" in sample.status.message


async def test_events_are_read_incrementally_and_restart_resets_them() -> None:
    events = [Event(i, 1_700_000_000.0 + i, "evict", tokens=16) for i in range(1, 4)]
    events.append(Event(4, 1_700_000_004.0, "negative_lock_ref", node_id=7, lock_ref=-1, message="double unlock"))

    def page(query):
        since = int(query.get("since", ["0"])[0])
        return event_page([e for e in events if e.seq > since], since=since)

    with stub_server() as stub:
        stub.answers[SNAPSHOT_PATH] = Answer(body=make_snapshot(events_seq=4).to_json())
        stub.answers[EVENTS_PATH] = Answer(body=page)
        stub.answers[HEALTH_PATH] = Answer(body=health_body())
        probe = RadixProbe(stub.url)
        board = RadixBoard()
        try:
            first = await probe.poll()
            board.add(first)
            assert [e.seq for e in first.events] == [1, 2, 3, 4]
            second = await probe.poll()
            assert second.events == () and second.unchanged
            assert stub.hits[EVENTS_PATH] == 1, "no events request while the snapshot names no new event"
            # A restart: new instance, its events start at 1 again.
            events[:] = [Event(1, 1_700_000_010.0, "lock_failure", node_id=3, message="boom")]
            stub.answers[SNAPSHOT_PATH] = Answer(body=make_snapshot(instance="bb22", events_seq=1).to_json())
            stub.answers[EVENTS_PATH] = Answer(body=lambda q: event_page(
                [e for e in events if e.seq > int(q["since"][0])], since=int(q["since"][0]), instance="bb22"))
            third = await probe.poll()
            board.add(third)
        finally:
            await probe.aclose()
    assert third.restarted and [e.kind for e in third.events] == ["lock_failure"]
    assert [a.kind for a in board.anomalies] == ["negative_lock_ref", "lock_failure"]
    assert board.anomalies[0].time == 1_700_000_004.0 and board.anomalies[0].lock_ref == -1
    assert board.ranks[stub.url].restarts == 1


async def test_a_degraded_endpoint_says_why() -> None:
    with stub_server() as stub:
        stub.answers[SNAPSHOT_PATH] = Answer(body=make_snapshot(hooks_state="disabled").to_json())
        stub.answers[HEALTH_PATH] = Answer(body=health_body(status="degraded", message="hooks disabled: 21 errors"))
        sample = await _poll(stub)
    assert sample.status.state == "degraded"
    assert "hooks disabled: 21 errors" in sample.status.message
    assert sample.snapshot is not None  # still shown


async def test_a_big_snapshot_is_parsed_off_the_loop_and_indexed() -> None:
    snap = wide_snapshot(20_000)
    with stub_server() as stub:
        stub.answers[SNAPSHOT_PATH] = Answer(body=snap.to_json())
        sample = await _poll(stub)
    assert sample.status.state == "ok"
    assert sample.size > 64 * 1024
    index = sample.index
    assert index is not None and len(index.children[0]) == 20_000
    # locked children first
    first = [sample.snapshot.tree.nodes[r].lock_ref for r in index.children[0][:2000]]
    assert all(lr == 1 for lr in first)


# ----------------------------------------------------------------------------------------------
# The board and the index (pure)


def test_index_marks_locked_and_negative_paths() -> None:
    snap = make_snapshot()
    index = TreeIndex.build(snap)
    assert index is not None
    nodes = snap.tree.nodes
    assert index.marks[1] & TreeIndex.LOCKED and index.marks[2] & TreeIndex.LOCKED
    assert index.marks[3] & TreeIndex.NEGATIVE, "the parent of a negative lock_ref leads to it"
    assert index.marks[5] == 0
    assert index.children[0][0] == 3, "a path to a negative lock_ref sorts first"
    assert [nodes[r].id for r in index.children[0]] == [3, 1, 5]


def test_board_rates_freeze_and_disagreement() -> None:
    from radixtop.probes.radix import RadixSample
    from radixtop.probes.status import SourceState

    board = RadixBoard()
    ok = SourceState("ok", "", 1.0)
    s0 = make_snapshot(rank=0, when=100.0, counters=Counters(evictions=10, evicted_tokens=160))
    s1 = make_snapshot(rank=0, when=102.0, seq=2, counters=Counters(evictions=14, evicted_tokens=224))
    board.add(RadixSample("u0", ok, 100.0, rank=0, snapshot=s0))
    board.add(RadixSample("u0", ok, 102.0, rank=0, snapshot=s1))
    view = board.ranks["u0"]
    assert view.evictions_per_s == pytest.approx(2.0) and view.evicted_tokens_per_s == pytest.approx(32.0)
    board.add(RadixSample("u0", SourceState("down", "connection refused", 103.0), 103.0))
    assert view.snapshot is s1 and view.status.state == "down", "a down rank keeps its last snapshot"
    assert board.disagreement() is None
    board.add(RadixSample("u0", ok, 104.0, rank=0, snapshot=make_snapshot(rank=0, seq=3)))
    other = "fedcba9876543210"
    board.add(RadixSample("u1", ok, 104.0, rank=1, snapshot=make_snapshot(rank=1, digest=other)))
    assert board.disagreement() is None, "one snapshot of rank 1: its tree may still be moving"
    board.add(RadixSample("u1", ok, 106.0, rank=1, snapshot=make_snapshot(rank=1, seq=2, digest=other)))
    assert "ranks disagree: tree digests r0=01234567 r1=fedcba98" in board.disagreement()
    assert board.disagreement(rank_groups(1)) is None, "different DP groups may hold different trees"
    board.add(RadixSample("u1", ok, 108.0, rank=1, snapshot=make_snapshot(rank=1, seq=3, digest="00000000000000aa")))
    assert board.disagreement() is None, "a tree that is changing is not compared"


def test_disagreement_compares_only_censuses_the_server_says_are_at_rest() -> None:
    """A census assembled over minutes repeats its digest in every snapshot: with Census.at_rest
    the board compares only trees unmoved since their census began, whatever the repeats."""
    from dataclasses import replace

    from radixtop.probes.radix import RadixSample
    from radixtop.probes.status import SourceState

    def told(rank: int, seq: int, digest: str, at_rest: bool | None):
        snap = make_snapshot(rank=rank, seq=seq, digest=digest)
        return replace(snap, census=replace(snap.census, at_rest=at_rest))

    ok = SourceState("ok", "", 1.0)
    other = "fedcba9876543210"
    board = RadixBoard()
    for seq in (1, 2, 3):  # the same digests over and over, but both trees moving
        board.add(RadixSample("u0", ok, 100.0 + seq, rank=0, snapshot=told(0, seq, "0123456789abcdef", False)))
        board.add(RadixSample("u1", ok, 100.0 + seq, rank=1, snapshot=told(1, seq, other, False)))
    assert board.disagreement() is None, "moving trees are not compared, however often their digest repeats"
    board.add(RadixSample("u0", ok, 110.0, rank=0, snapshot=told(0, 4, "0123456789abcdef", True)))
    assert board.disagreement() is None, "rank 1 is still moving"
    board.add(RadixSample("u1", ok, 110.0, rank=1, snapshot=told(1, 4, other, True)))
    assert "ranks disagree: tree digests r0=01234567 r1=fedcba98" in board.disagreement()
    fresh = RadixBoard()  # at rest in its first snapshot: the server said so, no second one needed
    fresh.add(RadixSample("u0", ok, 100.0, rank=0, snapshot=told(0, 1, "0123456789abcdef", True)))
    fresh.add(RadixSample("u1", ok, 100.0, rank=1, snapshot=told(1, 1, other, True)))
    assert fresh.disagreement() is not None


# ----------------------------------------------------------------------------------------------
# Fuzzing the parser path: anything but a ValueError is a bug


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200) | _json.map(lambda v: json.dumps(v).encode()))
def test_fuzz_garbage_bytes(data: bytes) -> None:
    try:
        parse_and_index(data)
    except ValueError as exc:
        assert "\n" not in str(exc)


_base = json.loads(make_snapshot().to_json())


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


_PATHS = [p for p in _paths(_base) if p]


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(_PATHS), _json)
def test_fuzz_one_field_of_a_valid_snapshot(path, value) -> None:
    obj = json.loads(json.dumps(_base))
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        snap, index = parse_and_index(encode_json(obj))
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    if snap.tree is not None:  # whatever was accepted indexes cleanly
        assert index is not None and len(index.children) == len(snap.tree.nodes)


def test_module_does_not_import_textual() -> None:
    import subprocess
    import sys

    code = (
        "import sys, radixtop.probes.radix, radixtop.probes.sglang, radixtop.probes.gpu, radixtop.probes.procs, "
        "radixtop.probes.discovery, radixtop.session.vitals; print('textual' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[1],
    )
    assert out.stdout.strip() == "False", out.stderr


# ----------------------------------------------------------------------------------------------
# The big-snapshot path (rows decoded one by one, GC paused) must agree with the schema exactly


def test_big_snapshot_path_agrees_with_the_schema() -> None:
    from radixtop.probes import radix_tree as radix_probe
    from radixtop.schema import parse_snapshot

    snap = wide_snapshot(30_000)
    data = snap.to_json()
    assert len(data) > radix_probe.SPLICE_PARSE_BYTES
    got, index = parse_and_index(data)
    assert got == parse_snapshot(data) == snap
    assert index is not None and len(index.children[0]) == 30_000
    pretty = json.dumps(json.loads(data), indent=2).encode()  # other whitespace: still the same
    assert parse_and_index(pretty)[0] == snap


@pytest.mark.parametrize(
    "mutate, expect",
    [
        (lambda o: o["tree"]["nodes"][7].__setitem__(2, -5), "snapshot.tree.nodes[7].tokens: expected an integer"),
        (
            lambda o: o["tree"]["nodes"][9].__setitem__(1, 50),
            "snapshot.tree.nodes[9].parent: expected an integer in [0, 8]",
        ),
        (
            lambda o: o["tree"].__setitem__("walked_nodes", 3),
            "snapshot.tree.walked_nodes: says 3 but 30000 non-root rows",
        ),
        (lambda o: o["tree"]["nodes"].__setitem__(5, "x"), "snapshot.tree.nodes[5]: expected a row of 10 values"),
        (lambda o: o.__setitem__("schema_version", 9), "schema version 9 is not supported"),
    ],
)
def test_big_snapshot_errors_are_the_schemas(mutate, expect) -> None:
    from radixtop.schema import parse_snapshot

    obj = json.loads(wide_snapshot(30_000).to_json())
    mutate(obj)
    data = encode_json(obj)
    with pytest.raises(ValueError) as big:
        parse_and_index(data)
    with pytest.raises(ValueError) as reference:
        parse_snapshot(data)
    assert expect in str(big.value)
    assert str(big.value) == str(reference.value)


def test_the_cyclic_gc_is_back_on_after_a_big_parse() -> None:
    import gc

    assert gc.isenabled()
    parse_and_index(wide_snapshot(30_000).to_json())
    assert gc.isenabled()
    with pytest.raises(ValueError):
        parse_and_index(b'{"tree": {"nodes": [' + b"[1]," * 100_000 + b"[1]]}}")
    assert gc.isenabled()
