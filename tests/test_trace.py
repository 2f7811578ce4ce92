"""Workload traces: the versioned format, its errors, and prompt synthesis that shares exactly what it says."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixtop.incident.replay.trace import (
    Trace,
    TraceError,
    TraceRequest,
    builtin_trace,
    dump_trace,
    load_trace,
    parse_trace,
    plan_requests,
    rescale_prefixes,
    save_trace,
    scale_offsets,
    synthesize_input_ids,
)
from radixtop.incident.replay.vocab import SIM_VOCABULARY, Vocabulary

# The simulator's vocabulary, and a small one whose first ids are the model's special tokens.
SMALL = Vocabulary(2048, (0, 1, 2), "a test model")


def shared_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def good() -> dict:
    return {
        "version": 1,
        "name": "t",
        "page_size_hint": 64,
        "requests": [
            {
                "id": "a",
                "offset_ms": 0,
                "prompt_len": 128,
                "prefix_len": 64,
                "group": "g",
                "max_tokens": 8,
                "n": 2,
            },
            {"id": "b", "offset_ms": 10.5, "prompt_len": 100, "prefix_len": 0, "group": "g", "max_tokens": 8},
        ],
    }


def test_finding_03330_is_the_seed_table():
    trace = builtin_trace("finding_03330")
    assert trace.name == "finding_03330" and trace.page_size_hint == 64 and trace.expect_diverged == ("r02",)
    assert len(trace.requests) == 11 and all(r.n == 4 and r.max_tokens == 32 for r in trace.requests)
    r02 = trace.request("r02")
    assert (r02.offset_ms, r02.prompt_len, r02.prefix_len, r02.group) == (45, 256, 64, "r02")
    assert [r.id for r in trace.requests if r.prefix_len == 64] == ["r02", "r02_b_s_b_s_s_s", "r02_b_s_s_s_s"]
    assert {r.group for r in trace.requests} == {"r01", "r02", "r03", "r04"}
    assert trace.request("r04_b_s_s_s_s").offset_ms == 542


def test_roundtrip_through_a_real_file(tmp_path):
    trace = parse_trace(good())
    path = tmp_path / "trace.json"
    save_trace(trace, path)
    assert load_trace(path) == trace
    assert json.loads(path.read_text())["requests"][1]["n"] == 1  # n defaults to 1 and is written out
    assert dump_trace(builtin_trace("finding_03330"))["source"].startswith("sgl-project/sglang#22819")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("version"), "version is missing"),
        (lambda d: d.update(version=2), "version is 2; this radixtop reads version 1"),
        (lambda d: d.update(page_size_hint="64"), "page_size_hint must be int"),
        (lambda d: d.update(requests=[]), "requests is empty"),
        (lambda d: d.update(extra=1), "unknown key 'extra'"),
        (lambda d: d["requests"][1].pop("prompt_len"), r"requests\[1\]\.prompt_len is missing"),
        (lambda d: d["requests"][0].update(prompt_len=True), r"requests\[0\]\.prompt_len must be int"),
        (
            lambda d: d["requests"][0].update(prefix_len=200),
            r"requests\[0\]\.prefix_len must be within 0\.\.prompt_len \(128\)",
        ),
        (lambda d: d["requests"][1].update(id="a"), r"requests\[1\]\.id 'a' appears twice"),
        (lambda d: d["requests"][0].update(offset_ms=-1), r"requests\[0\]\.offset_ms must be within 0\.\."),
        (lambda d: d["requests"][0].update(n=0), r"requests\[0\]\.n must be within 1\.\.1,024"),
        # Sizes that would build prompts without end, and offsets the clock cannot hold.
        (lambda d: d["requests"][0].update(prompt_len=10**12), r"requests\[0\]\.prompt_len must be within 1\.\."),
        (lambda d: d["requests"][0].update(n=10**9), r"requests\[0\]\.n must be within 1\.\.1,024, got 1000000000"),
        (lambda d: d["requests"][0].update(max_tokens=10**12), r"requests\[0\]\.max_tokens must be within 0\.\."),
        (lambda d: d["requests"][0].update(offset_ms=1e300), r"requests\[0\]\.offset_ms must be within 0\.\."),
        (lambda d: d["requests"][0].update(offset_ms=float("inf")), r"requests\[0\]\.offset_ms must be within"),
        (lambda d: d["requests"][0].update(offset_ms=float("nan")), r"requests\[0\]\.offset_ms must be within"),
        (lambda d: d["requests"].extend({**d["requests"][0], "id": f"big{i}", "prompt_len": 1 << 21, "prefix_len": 0,
                                         "n": 1024} for i in range(1)),
         r"its calls hold [\d,]+ prompt tokens \(prompt_len x n\), more than the 33,554,432"),
        (lambda d: d["requests"][0].update(prompt=1), r"requests\[0\]\.prompt is not a request field"),
        (lambda d: d.update(expect_diverged=["zz"]), "expect_diverged names 'zz'"),
    ],
)
def test_loader_errors_are_one_line_and_name_the_field(tmp_path, mutate, message):
    data = good()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TraceError, match=message) as info:
        load_trace(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(path))


def test_loader_errors_for_unreadable_and_invalid_json(tmp_path):
    with pytest.raises(TraceError, match="cannot read the trace"):
        load_trace(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1,\n  "name": }')
    with pytest.raises(TraceError, match=r"not valid JSON \(line 2, column"):
        load_trace(bad)
    with pytest.raises(TraceError, match="no built-in trace named 'nope'"):
        builtin_trace("nope")
    deep = tmp_path / "deep.json"
    deep.write_text('{"version": 1, "name": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(TraceError, match="JSON nested too deeply"):
        load_trace(deep)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"version": 1, "name": "caf\xe9"}')
    with pytest.raises(TraceError, match=r"not valid JSON \(.*utf-8"):
        load_trace(latin)


@pytest.mark.parametrize("vocab", [SIM_VOCABULARY, SMALL], ids=["sim", "small"])
def test_synthesis_shares_exactly_the_group_prefix_and_nothing_else(vocab):
    trace = builtin_trace("finding_03330")
    prompts = {
        (r.id, c): synthesize_input_ids(r, trace, seed=11, copy=c, vocab=vocab)
        for r in trace.requests
        for c in range(r.n)
    }
    for (rid, copy), ids in prompts.items():
        req = trace.request(rid)
        assert len(ids) == req.prompt_len and all(0 <= t < vocab.size for t in ids)
        assert not set(ids) & set(vocab.special)
        assert ids == synthesize_input_ids(req, trace, seed=11, copy=copy, vocab=vocab)  # deterministic
    keys = list(prompts)
    for i, ka in enumerate(keys):
        for kb in keys[i + 1 :]:
            a, b = trace.request(ka[0]), trace.request(kb[0])
            expected = min(a.prefix_len, b.prefix_len) if a.group == b.group else 0
            assert shared_len(prompts[ka], prompts[kb]) == expected, (ka, kb)
    # Another seed gives other prompts with the same sharing.
    assert synthesize_input_ids(trace.request("r01"), trace, seed=12, vocab=vocab) != prompts[("r01", 0)]


def test_a_pressure_workload_fits_a_small_vocabulary_and_a_trace_too_big_for_it_is_one_line():
    from radixtop.incident.replay.workloads import pressure_trace

    trace = pressure_trace(4096, 8, page_size=16)
    ids = [t for p in plan_requests(trace, vocab=SMALL) for t in p.input_ids]
    assert ids and max(ids) < 2048 and min(ids) > 2
    many = parse_trace(good() | {"requests": [dict(good()["requests"][0], id=f"q{i}", n=1, prefix_len=0)
                                              for i in range(40)]})
    with pytest.raises(TraceError, match=r"needs 40 distinct first tokens; a vocabulary of 64 ids has room for 15"):
        plan_requests(many, vocab=Vocabulary(64, (0,)))


def test_recorded_prompts_with_ids_the_model_lacks_are_refused_before_anything_is_sent():
    rec = parse_trace(good() | {"requests": [dict(good()["requests"][0], input_ids=[5, 9000, 7])]})
    assert plan_requests(rec)[0].input_ids == [5, 9000, 7]
    with pytest.raises(TraceError, match=r"token id 9,000, outside the model's vocabulary of 2,048 token ids"):
        plan_requests(rec, vocab=SMALL)


def test_rescale_prefixes_moves_pages_from_the_hint_to_another_page_size():
    trace = builtin_trace("finding_03330")
    small = rescale_prefixes(trace, 16)
    assert small.page_size_hint == 16
    assert [r.prefix_len for r in small.requests] == [16 if r.prefix_len == 64 else 0 for r in trace.requests]
    assert [r.prompt_len for r in small.requests] == [r.prompt_len for r in trace.requests]
    odd = parse_trace(good() | {"page_size_hint": 64})
    assert rescale_prefixes(odd, 1).requests[0].prefix_len == 1
    with pytest.raises(TraceError, match="page_size must be >= 1"):
        rescale_prefixes(trace, 0)


def test_scale_offsets_and_plan():
    trace = scale_offsets(builtin_trace("finding_03330"), 0.2)
    assert trace.request("r02").offset_ms == pytest.approx(9.0)
    plan = plan_requests(trace, seed=1)
    assert len(plan) == 44
    assert [p.offset_s for p in plan] == sorted(p.offset_s for p in plan)
    assert [(p.request_id, p.copy) for p in plan[:5]] == [
        ("r01", 0),
        ("r01", 1),
        ("r01", 2),
        ("r01", 3),
        ("r02", 0),
    ]
    with pytest.raises(TraceError, match="must be > 0"):
        scale_offsets(trace, 0)


def test_synthesis_rejects_foreign_requests_and_bad_copies():
    trace = parse_trace(good())
    with pytest.raises(TraceError, match="copy must be within 0..1"):
        synthesize_input_ids(trace.requests[0], trace, copy=2)
    stranger = TraceRequest("zz", 0, 4, 0, "g", 1)
    with pytest.raises(TraceError, match="not part of trace"):
        synthesize_input_ids(stranger, trace)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 40), st.integers(0, 40), st.sampled_from("xyz"), st.integers(1, 3)),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, 2**32),
)
def test_synthesis_sharing_property(rows, seed):
    requests = tuple(
        TraceRequest(f"r{i}", float(i), plen, min(prefix, plen), group, 1, n)
        for i, (plen, prefix, group, n) in enumerate(rows)
    )
    trace = Trace("prop", 1, requests)
    prompts = [(r, synthesize_input_ids(r, trace, seed, c)) for r in requests for c in range(r.n)]
    for i, (ra, a) in enumerate(prompts):
        for rb, b in prompts[i + 1 :]:
            if ra.group == rb.group and ra.prefix_len and rb.prefix_len:
                want = min(ra.prefix_len, rb.prefix_len)
            else:
                want = 0
            assert shared_len(a, b) == want


def tree() -> dict:
    """A system prompt (request s), two conversations on it (c1, c2), a later turn of c1 (c1b)."""
    req = {"group": "g", "max_tokens": 4}
    return {"version": 1, "name": "tree", "page_size_hint": 16, "requests": [
        {"id": "s", "offset_ms": 0, "prompt_len": 60, "prefix_len": 0, **req},
        {"id": "c1", "offset_ms": 1, "prompt_len": 90, "prefix_len": 48, "prefix_of": "s", **req},
        {"id": "c2", "offset_ms": 2, "prompt_len": 70, "prefix_len": 48, "prefix_of": "s", **req, "n": 2},
        {"id": "c1b", "offset_ms": 3, "prompt_len": 120, "prefix_len": 90, "prefix_of": "c1", **req},
    ]}


@pytest.mark.parametrize("vocab", [SIM_VOCABULARY, SMALL])
def test_prefix_of_shares_along_the_tree_and_nothing_more(vocab) -> None:
    trace = parse_trace(tree(), "tree")
    assert parse_trace(dump_trace(trace), "again") == trace
    made = {(p.request_id, p.copy): p.input_ids for p in plan_requests(trace, seed=3, vocab=vocab)}
    assert all(made[key] == synthesize_input_ids(trace.request(key[0]), trace, seed=3, copy=key[1], vocab=vocab)
               for key in made)
    expected = {("c1", "s"): 48, ("c2", "s"): 48, ("c2", "c1"): 48, ("c1b", "c1"): 90, ("c1b", "s"): 48,
                ("c1b", "c2"): 48}
    for (a, b), shared in expected.items():
        assert shared_len(made[a, 0], made[b, 0]) == shared, (a, b)
    assert shared_len(made["c2", 0], made["c2", 1]) == 48  # copies share the prefix, then part
    assert [len(made[r.id, 0]) for r in trace.requests] == [60, 90, 70, 120]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["requests"][1].update(prefix_of="c1b"),
            "prefix_of names 'c1b', which is not an earlier request's id",
        ),
        (
            lambda d: d["requests"][1].update(prefix_of="c1"),
            "prefix_of names 'c1', which is not an earlier request's id",
        ),
        (lambda d: d["requests"][1].update(prefix_len=0), "prefix_len must be within 1..60"),
        (lambda d: d["requests"][3].update(prefix_len=100), "prefix_len must be within 1..90 (the prompt_len of 'c1'"),
        (lambda d: d["requests"][3].update(offset_ms=0.5), "offset_ms 0.5 is before that of 'c1', its prefix_of"),
    ],
)
def test_prefix_of_errors_are_one_line(mutate, message) -> None:
    data = tree()
    mutate(data)
    with pytest.raises(TraceError) as caught:
        parse_trace(data, "tree.json")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_rescaling_keeps_a_prefix_within_the_prompt_it_names() -> None:
    small = rescale_prefixes(parse_trace(tree(), "tree"), 1)  # 48 tokens at 16 -> 3 pages of 1
    assert [r.prefix_len for r in small.requests] == [0, 3, 3, 5]
    big = rescale_prefixes(parse_trace(tree(), "tree"), 64)
    assert [r.prefix_len for r in big.requests] == [0, 60, 60, 90]  # capped by s's and c1's prompts
    assert parse_trace(dump_trace(big), "again") == big


def test_a_trace_of_real_prompts_is_never_rescaled_and_says_so_in_its_file() -> None:
    """Recorded traffic, a dump or a Mooncake file: its prefixes are what the prompts shared, so a
    server of another page size gets the same sharing, not the same number of pages."""
    data = tree()
    data["prefix_unit"] = "tokens"
    trace = parse_trace(data, "tokens")
    assert rescale_prefixes(trace, 64) == trace and rescale_prefixes(trace, 1) == trace
    assert dump_trace(trace)["prefix_unit"] == "tokens" and "prefix_unit" not in dump_trace(parse_trace(tree(), "t"))
    with pytest.raises(TraceError, match='prefix_unit must be "pages" or "tokens"'):
        parse_trace({**tree(), "prefix_unit": "bytes"}, "bad")
