"""The debug-endpoint contract: round trips, strict parsing, one-line errors, fuzzing."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixtop import schema
from radixtop.schema import (
    NODE_FIELDS,
    SCHEMA_VERSION,
    Census,
    Counters,
    Event,
    EventPage,
    Health,
    NodeRow,
    Snapshot,
    TreeView,
    parse_events,
    parse_health,
    parse_snapshot,
)


def _node(parent: int, tokens: int, lock_ref: int = 0, nid: int | None = None) -> NodeRow:
    return NodeRow(
        id=nid,
        parent=parent,
        tokens=tokens,
        lock_ref=lock_ref,
        evicted=False,
        hit_count=1,
        last_access=12.5,
        children=0,
        subtree_tokens=tokens,
        head=(1, 2, 3)[: min(tokens, 3)],
    )


def make_snapshot(**changes) -> Snapshot:
    nodes = (_node(-1, 0, 1, 0), _node(0, 10, 1, 1), _node(1, 4, 0, 2), _node(0, 7, 0, 3))
    tree = TreeView(
        budget=3, walked_nodes=3, walked_tokens=21, cut_nodes=2, cut_tokens=9, cut_exact=True, nodes=nodes
    )
    census = Census(
        complete=True,
        node_count=5,
        total_tokens=30,
        lock_ref_histogram={0: 3, 1: 1, -1: 1},
        digest="0123456789abcdef",
        age_s=0.25,
        seconds=0.001,
    )
    snap = Snapshot(
        schema_version=SCHEMA_VERSION,
        rank=2,
        instance="deadbeef",
        seq=7,
        time=1_700_000_000.5,
        monotonic=1234.5,
        seconds=0.002,
        cache_class="RadixCache",
        walkable=True,
        reason="",
        page_size=1,
        capacity_tokens=1000,
        available_tokens=400,
        evictable_tokens=20,
        protected_tokens=10,
        hooks_state="active",
        counters=Counters(lock_ops=5, unlock_ops=6, negative_lock_ref=1, evictions=2, evicted_tokens=40),
        events_seq=9,
        census=census,
        tree=tree,
    )
    return Snapshot(**{**{f: getattr(snap, f) for f in Snapshot.__dataclass_fields__}, **changes})


def test_routes_and_version_live_in_one_place():
    assert schema.SNAPSHOT_PATH == f"/radixtop/v{SCHEMA_VERSION}/snapshot"
    assert schema.EVENTS_PATH == f"/radixtop/v{SCHEMA_VERSION}/events"
    assert schema.HEALTH_PATH == f"/radixtop/v{SCHEMA_VERSION}/health"
    assert schema.METRICS_PATH == "/metrics"
    assert set(schema.ROUTES) == {schema.SNAPSHOT_PATH, schema.EVENTS_PATH, schema.HEALTH_PATH, "/metrics"}
    assert all(name.startswith("radixtop_") for name in schema.METRIC_NAMES.values())
    assert all(name.endswith("_total") for name in schema.METRIC_NAMES.values())


def test_snapshot_round_trips_through_json():
    snap = make_snapshot()
    data = snap.to_json()
    assert parse_snapshot(data) == snap
    # The tree travels as a table: rows of NODE_FIELDS, parents as row indices.
    raw = json.loads(data)
    assert raw["tree"]["fields"] == list(NODE_FIELDS)
    assert raw["tree"]["nodes"][2][NODE_FIELDS.index("parent")] == 1
    assert raw["census"]["lock_ref_histogram"] == {"-1": 1, "0": 3, "1": 1}


def test_census_slices_and_span_travel_and_an_older_server_without_them_still_parses():
    from dataclasses import replace

    snap = make_snapshot()
    sliced = replace(snap, census=replace(snap.census, slices=412, span_s=96.5))
    raw = json.loads(sliced.to_json())
    assert (raw["census"]["slices"], raw["census"]["span_s"]) == (412, 96.5)
    assert parse_snapshot(sliced.to_json()) == sliced
    # A server from before the incremental census sends neither: read as one pause.
    for key in ("slices", "span_s"):
        del raw["census"][key]
    old = parse_snapshot(json.dumps(raw).encode())
    assert (old.census.slices, old.census.span_s) == (1, 0.0)
    for bad in ({"slices": 0}, {"slices": "3"}, {"span_s": -1.0}):
        broken = json.loads(sliced.to_json())
        broken["census"].update(bad)
        with pytest.raises(ValueError, match=r"snapshot\.census\.(slices|span_s)"):
            parse_snapshot(json.dumps(broken).encode())


def test_census_at_rest_travels_and_an_older_server_without_it_reads_as_unknown():
    from dataclasses import replace

    snap = make_snapshot()
    assert "at_rest" not in json.loads(snap.to_json())["census"]  # unknown: sent as older servers do
    for rest in (True, False):
        told = replace(snap, census=replace(snap.census, at_rest=rest))
        assert json.loads(told.to_json())["census"]["at_rest"] is rest
        assert parse_snapshot(told.to_json()) == told
    assert parse_snapshot(snap.to_json()).census.at_rest is None
    broken = json.loads(snap.to_json())
    broken["census"]["at_rest"] = "yes"
    with pytest.raises(ValueError, match=r"snapshot\.census\.at_rest"):
        parse_snapshot(json.dumps(broken).encode())


def test_unwalkable_snapshot_round_trips():
    snap = make_snapshot(walkable=False, reason="sizes only", census=None, tree=None)
    assert parse_snapshot(snap.to_json()) == snap


def test_events_and_health_round_trip():
    page = EventPage(
        schema_version=SCHEMA_VERSION,
        rank=0,
        instance="ab12",
        since=3,
        next_since=5,
        latest_seq=9,
        dropped=1,
        more=True,
        events=(
            Event(seq=4, time=1.0, kind="evict", tokens=16, requested=32),
            Event(seq=5, time=2.0, kind="negative_lock_ref", node_id=7, lock_ref=-1, message="double unlock"),
        ),
    )
    assert parse_events(json.dumps(page.to_dict())) == page
    health = Health(
        schema_version=SCHEMA_VERSION,
        rank=1,
        instance="ab12",
        status="ok",
        hooks_state="active",
        snapshots=3,
        safe_points=100,
        last_snapshot_age_s=0.1,
        last_snapshot_seconds=0.002,
        snapshot_interval_s=0.5,
        max_budget=1000,
    )
    assert parse_health(json.dumps(health.to_dict())) == health


def test_truncated_tree_is_a_prefix_with_the_cut_recounted():
    snap = make_snapshot()
    small = snap.with_budget(1)
    assert small.tree.walked_nodes == 1
    assert small.tree.nodes == snap.tree.nodes[:2]
    assert small.tree.walked_tokens == 10
    assert small.tree.cut_nodes == 2 + 2
    assert small.tree.cut_tokens == 9 + 11
    assert parse_snapshot(small.to_json()) == small
    assert snap.with_budget(50) is snap


def _one_line_error(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and message
    return message


def _mutated(path: list, value) -> bytes:
    d = json.loads(make_snapshot().to_json())
    target = d
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return json.dumps(d).encode()


@pytest.mark.parametrize(
    "path, value, expect",
    [
        (["schema_version"], 2, "schema version 2 is not supported"),
        (["schema_version"], "1", "schema_version"),
        (["rank"], True, "snapshot.rank"),
        (["rank"], -1, "snapshot.rank"),
        (["time"], float("inf"), "snapshot.time"),  # json.loads accepts Infinity; the schema does not
        (["seq"], 2**70, "snapshot.seq"),
        (["instance"], "not hex!", "snapshot.instance"),
        (["hooks_state"], "sleeping", "snapshot.hooks_state"),
        (["counters", "lock_ops"], -5, "snapshot.counters.lock_ops"),
        (["counters"], [], "snapshot.counters"),
        (["census", "digest"], "xyz", "snapshot.census.digest"),
        (["census", "lock_ref_histogram"], {"one": 1}, "lock_ref_histogram"),
        (["tree", "fields"], ["id"], "snapshot.tree.fields"),
        (["tree", "nodes", 0, 1], 0, "snapshot.tree.nodes[0].parent"),
        (["tree", "nodes", 2, 1], 2, "snapshot.tree.nodes[2].parent"),  # must point to an earlier row
        (["tree", "nodes", 1, 2], -3, "snapshot.tree.nodes[1].tokens"),
        (["tree", "nodes", 1], [1, 2], "snapshot.tree.nodes[1]"),
        (["tree", "walked_nodes"], 10, "snapshot.tree.walked_nodes"),
        (["tree"], None, "snapshot.tree: missing although walkable"),
    ],
)
def test_bad_snapshots_get_one_line_errors(path, value, expect):
    if value == float("inf"):
        data = _mutated(path, 0).replace(b'"time":0', b'"time":Infinity').replace(b'"time": 0', b'"time": Infinity')
    else:
        data = _mutated(path, value)
    with pytest.raises(ValueError) as exc:
        parse_snapshot(data)
    assert expect in _one_line_error(exc)


def test_nan_from_a_lenient_encoder_is_refused():
    d = json.loads(make_snapshot().to_json())
    d["seconds"] = float("nan")
    with pytest.raises(ValueError) as exc:
        Snapshot.from_dict(d)
    assert "snapshot.seconds" in _one_line_error(exc)


def test_missing_field_is_named():
    d = json.loads(make_snapshot().to_json())
    del d["evictable_tokens"]
    with pytest.raises(ValueError) as exc:
        Snapshot.from_dict(d)
    assert "missing field 'evictable_tokens'" in _one_line_error(exc)


def test_unknown_fields_are_ignored_for_additive_changes():
    d = json.loads(make_snapshot().to_json())
    d["new_field_from_a_newer_server"] = {"x": 1}
    assert Snapshot.from_dict(d) == make_snapshot()


@pytest.mark.parametrize(
    "data, expect",
    [
        (b"", "not valid JSON"),
        (b"\xff\xfe garbage", "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"[1, 2]", "expected a JSON object"),
        (b"null", "expected a JSON object"),
        (b'{"schema_version": 1}', "missing field"),
    ],
)
def test_garbage_bytes_get_one_line_errors(data, expect):
    with pytest.raises(ValueError) as exc:
        parse_snapshot(data)
    assert expect in _one_line_error(exc)


def test_absurd_sizes_are_refused_before_parsing():
    with pytest.raises(ValueError) as exc:
        parse_snapshot(b" " * (schema.MAX_PAYLOAD_BYTES + 1))
    assert "more than the limit" in _one_line_error(exc)
    d = json.loads(make_snapshot().to_json())
    d["tree"]["nodes"] = [d["tree"]["nodes"][0]] * (schema.MAX_TREE_NODES + 2)
    with pytest.raises(ValueError) as exc:
        Snapshot.from_dict(d)
    assert "more than the limit" in _one_line_error(exc)
    page = {"schema_version": 1, "rank": 0, "instance": "a", "since": 0, "next_since": 0, "latest_seq": 0,
            "dropped": 0, "more": False, "events": [{}] * (schema.MAX_EVENTS_PER_PAGE + 1)}
    with pytest.raises(ValueError) as exc:
        EventPage.from_dict(page)
    assert "more than the limit" in _one_line_error(exc)


def test_event_pages_must_be_in_order():
    page = EventPage(schema_version=1, rank=0, instance="a", since=5, next_since=6, latest_seq=6, dropped=0,
                     more=False, events=(Event(seq=6, time=1.0, kind="evict"),))
    d = page.to_dict()
    d["events"][0]["seq"] = 5
    with pytest.raises(ValueError) as exc:
        EventPage.from_dict(d)
    assert "out of order" in _one_line_error(exc)


def test_health_with_the_wrong_version_says_what_to_do():
    with pytest.raises(ValueError) as exc:
        parse_health(b'{"schema_version": 99}')
    assert "use matching radixtop versions" in _one_line_error(exc)


def test_error_bodies():
    assert schema.parse_error(schema.error_body("bad budget\nsecond line")) == "bad budget"
    assert schema.parse_error(b"<html>") == "error response without a radixtop message"


# ---------------------------------------------------------------------------------------------
# Fuzz: whatever arrives, the parsers raise ValueError or return a value; nothing else.

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=30,
)


def _only_value_errors(fn, arg):
    try:
        fn(arg)
    except ValueError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_fuzz_from_dict_with_garbage(value):
    for parser in (Snapshot.from_dict, EventPage.from_dict, Health.from_dict):
        _only_value_errors(parser, value)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_parse_bytes(data):
    for parser in (parse_snapshot, parse_events, parse_health):
        _only_value_errors(parser, data)


_VALID = json.loads(make_snapshot().to_json())


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


_ALL_PATHS = [p for p in _paths(_VALID) if p]


@settings(max_examples=250, deadline=None)
@given(st.sampled_from(_ALL_PATHS), json_values)
def test_fuzz_one_field_of_a_valid_snapshot(path, value):
    d = copy.deepcopy(_VALID)
    target = d
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    _only_value_errors(Snapshot.from_dict, d)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_ALL_PATHS))
def test_fuzz_a_field_removed_from_a_valid_snapshot(path):
    d = copy.deepcopy(_VALID)
    target = d
    for key in path[:-1]:
        target = target[key]
    if isinstance(target, dict):
        del target[path[-1]]
    else:
        target.pop(path[-1])
    _only_value_errors(Snapshot.from_dict, d)
