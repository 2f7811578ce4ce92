"""Mooncake traces (JSON Lines of hash ids): written from a trace so that the whole blocks its
prompts share get equal ids, read back as a trace whose prompts share exactly those blocks, replayed
by `radixtop analyze` as they are, and refused in one line naming the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixtop.cli import main
from radixtop.incident.replay import mooncake
from radixtop.incident.replay.mooncake import (
    dump_mooncake,
    is_mooncake,
    mooncake_records,
    parse_mooncake,
    read_mooncake,
)
from radixtop.incident.replay.trace import (
    Trace,
    TraceError,
    TraceRequest,
    dump_trace,
    parse_trace,
    plan_requests,
    save_trace,
)

# The shape of the example in Mooncake's trace release (FAST'25): four requests on one shared
# 512-token block, and a later turn of the first conversation that shares its 13 whole blocks.
PAPER = [
    {"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": list(range(14))},
    {"timestamp": 0, "input_length": 7319, "output_length": 490, "hash_ids": [0, *range(14, 28)]},
    {"timestamp": 3052, "input_length": 7234, "output_length": 794, "hash_ids": [0, *range(28, 42)]},
    {"timestamp": 3052, "input_length": 2287, "output_length": 316, "hash_ids": [0, *range(42, 46)]},
    {"timestamp": 6000, "input_length": 8000, "output_length": 64, "hash_ids": [*range(13), 46, 47, 48]},
]


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def shared_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def calls_in_send_order(trace: Trace) -> list[tuple[TraceRequest, int]]:
    """(request, copy) in the order a replay sends them, which is the order of a Mooncake export's lines."""
    return sorted(((r, c) for r in trace.requests for c in range(r.n)), key=lambda rc: rc[0].offset_ms)


def shared_pages(trace: Trace, page: int, *, namespaces: bool) -> dict[tuple[int, int], int]:
    """Whole pages each pair of calls shares (with namespaces: 0 across cache namespaces), by send order."""
    made = {(p.request_id, p.copy): p.input_ids for p in plan_requests(trace, seed=7)}
    calls = calls_in_send_order(trace)
    out = {}
    for i, (ra, ca) in enumerate(calls):
        for j in range(i + 1, len(calls)):
            rb, cb = calls[j]
            same = not namespaces or ra.extra_key == rb.extra_key
            out[i, j] = shared_len(made[ra.id, ca], made[rb.id, cb]) // page if same else 0
    return out


def round_trip(trace: Trace, tmp_path: Path, block: int) -> Trace:
    path = tmp_path / "t.jsonl"
    path.write_bytes(dump_mooncake(trace, block))
    back, _ = read_mooncake(path, block)
    return back


def tree() -> Trace:
    """A system prompt on a group base, conversations on it (prefix_of), copies, and prefixes that end
    inside a page, at page 16."""
    def r(rid: str, offset: float, prompt: int, prefix: int, prefix_of: str | None = None, n: int = 1) -> TraceRequest:
        return TraceRequest(rid, offset, prompt, prefix, "sys", 4 + len(rid), n, prefix_of=prefix_of)

    return Trace("tree", 16, (
        r("a", 0, 100, 40), r("b", 0, 90, 70, n=2), r("c1", 5, 150, 90, "b"), r("c2", 5.4, 60, 60, "b"),
        r("c1b", 9.6, 220, 150, "c1"), r("d", 12, 33, 0), r("e", 12, 64, 33, "d", n=3),
    ))


def test_a_tree_of_shared_prefixes_keeps_its_whole_pages_through_mooncake_and_back(tmp_path: Path) -> None:
    trace = tree()
    records = mooncake_records(trace, 16)
    assert len(records) == sum(r.n for r in trace.requests) == 10  # one line a copy
    assert [rec["timestamp"] for rec in records] == [0, 0, 0, 5, 5, 10, 12, 12, 12, 12]
    base = [rec["hash_ids"][:2] for rec in records[:3]]  # the 40-token base: 2 whole pages
    assert base[0] == base[1] == base[2]
    assert records[0]["hash_ids"][2] != records[1]["hash_ids"][2]
    back = round_trip(trace, tmp_path, 16)
    assert back.page_size_hint == 16
    assert [(r.prompt_len, r.max_tokens) for r in back.requests] == [
        (r.prompt_len, r.max_tokens) for r, _ in calls_in_send_order(trace)
    ]
    assert shared_pages(back, 16, namespaces=False) == shared_pages(trace, 16, namespaces=True)
    again = round_trip(back, tmp_path, 16)
    assert dump_mooncake(again, 16) == dump_mooncake(back, 16) == dump_mooncake(trace, 16)


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    requests: list[TraceRequest] = []
    offset = 0.0
    for i in range(draw(st.integers(1, 8))):
        offset += draw(st.sampled_from([0.0, 0.4, 1.0, 7.5]))
        prompt = draw(st.integers(1, 70))
        parent = draw(st.none() | st.sampled_from(requests)) if requests else None
        if parent is not None:
            prefix = draw(st.integers(1, min(prompt, parent.prompt_len)))
        else:
            prefix = draw(st.integers(0, prompt))
        recorded = draw(st.none() | st.lists(st.sampled_from([5, 6]), min_size=prompt, max_size=prompt))  # by content
        requests.append(TraceRequest(
            f"r{i}", offset, prompt, prefix, draw(st.sampled_from("xy")), draw(st.integers(0, 9)),
            draw(st.integers(1, 3)),
            extra_key=draw(st.sampled_from([None, None, "tenant"])), prefix_of=parent.id if parent else None,
            input_ids=tuple(recorded) if recorded else None,
        ))
    return parse_trace(dump_trace(Trace("prop", 1, tuple(requests))), "prop")


@settings(max_examples=60, deadline=None)
@given(traces(), st.sampled_from([1, 4, 16]))
def test_any_trace_keeps_exactly_its_whole_shared_pages_through_mooncake(trace: Trace, block: int) -> None:
    back, _ = parse_mooncake(dump_mooncake(trace, block), "prop.jsonl", block_size=block)
    assert shared_pages(back, block, namespaces=False) == shared_pages(trace, block, namespaces=True)


def test_recorded_prompts_share_ids_by_content_and_a_partial_block_gets_its_own() -> None:
    system = list(range(100, 132))  # two pages of 16
    trace = Trace("rec", 16, (
        TraceRequest("a", 0, 40, 0, "a", 4, 2, input_ids=tuple(system + [1] * 8)),
        TraceRequest("b", 1, 36, 32, "a", 4, input_ids=tuple(system + [2] * 4)),
        TraceRequest("c", 2, 48, 40, "a", 4, prefix_of="a"),  # synthesized on a's recorded prompt
        TraceRequest("t", 3, 40, 0, "t", 4, 2, text="a text prompt"),
    ))
    ids = [rec["hash_ids"] for rec in mooncake_records(trace, 16)]
    assert ids[0] == [0, 1, 2] and ids[1] == [0, 1, 3]  # copies: the same whole pages, each its own partial page
    assert ids[2] == [0, 1, 4]  # b's prompt shares a's two pages
    assert ids[3] == [0, 1, 5]  # c starts with a's first 40 tokens: its two whole pages
    assert ids[4][:2] == ids[5][:2] != ids[4][2:] and ids[4][2] != ids[5][2]  # a text's copies are one text
    assert [rec["input_length"] for rec in mooncake_records(trace, 16)] == [40, 40, 36, 48, 40, 40]


def test_cache_namespaces_never_share_an_id_and_the_block_size_is_the_writers_choice() -> None:
    trace = Trace("ns", 4, (
        TraceRequest("a", 0, 8, 8, "g", 1), TraceRequest("b", 0, 8, 8, "g", 1, extra_key="lora:x"),
        TraceRequest("c", 0, 8, 8, "g", 1),
    ))
    assert [rec["hash_ids"] for rec in mooncake_records(trace, 4)] == [[0, 1], [2, 3], [0, 1]]
    assert [rec["hash_ids"] for rec in mooncake_records(trace, 8)] == [[0], [1], [0]]
    assert [rec["hash_ids"] for rec in mooncake_records(trace, 16)] == [[0], [1], [2]]  # one partial block each
    with pytest.raises(TraceError, match="block size must be >= 1"):
        mooncake_records(trace, 0)


def test_reading_builds_the_tree_the_ids_say(tmp_path: Path) -> None:
    path = tmp_path / "paper.jsonl"
    path.write_bytes(jsonl(PAPER))
    trace, label = read_mooncake(path)
    assert trace.name == "paper" and trace.page_size_hint == 512
    assert "5 requests, block size 512, 4 share a prefix with an earlier one" in label
    shape = [(r.id, r.offset_ms, r.prompt_len, r.max_tokens, r.prefix_of, r.prefix_len) for r in trace.requests]
    assert shape == [
        ("line1", 0, 6755, 500, None, 0), ("line2", 0, 7319, 490, "line1", 512),
        ("line3", 3052, 7234, 794, "line1", 512), ("line4", 3052, 2287, 316, "line1", 512),
        ("line5", 6000, 8000, 64, "line1", 13 * 512),
    ]
    assert parse_trace(dump_trace(trace), "again") == trace


def test_reading_sorts_by_time_counts_from_the_first_and_shares_a_partial_block_only_as_far_as_both_go() -> None:
    rows = [
        {"timestamp": 2500, "input_length": 20, "output_length": 1, "hash_ids": [7, 8, 9], "session_id": "s"},
        {"timestamp": 1000.5, "input_length": 10, "output_length": 1, "hash_ids": [7, 8]},
        {"timestamp": 3000, "input_length": 10, "output_length": 2, "hash_ids": [7, 8]},  # the same prompt again
        {"timestamp": 3000, "input_length": 5, "output_length": 2},  # no hash ids: shares nothing
    ]
    trace, label = parse_mooncake(jsonl(rows), "x.jsonl", block_size=8)
    assert [(r.id, r.offset_ms, r.prefix_of, r.prefix_len) for r in trace.requests] == [
        ("line2", 0.0, None, 0),
        ("line1", 1499.5, "line2", 10),
        ("line3", 1999.5, "line2", 10),
        ("line4", 1999.5, None, 0),
    ]
    assert "offsets count from its first timestamp, 1,000.5 ms" in label and "ignored keys: session_id" in label
    made = {p.request_id: p.input_ids for p in plan_requests(trace)}
    assert (
        made["line3"] == made["line2"]
        and made["line1"][:10] == made["line2"]
        and made["line1"][10] != made["line2"][-1]
    )


def test_a_file_is_taken_as_mooncake_by_its_extension_or_its_first_line(tmp_path: Path) -> None:
    plain = tmp_path / "trace"
    plain.write_bytes(b"\n" + jsonl(PAPER[:2]))
    assert is_mooncake(plain) and is_mooncake(tmp_path / "absent.jsonl")
    own = tmp_path / "own.json"
    save_trace(tree(), own)
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(dump_trace(tree())))
    assert not is_mooncake(own) and not is_mooncake(compact) and not is_mooncake(tmp_path)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", "line 2: not valid JSON (Expecting property name"),
        ("[1, 2]", "line 2: a request is a JSON object, got list"),
        ('{"timestamp": 1, "input_length": 10}', "line 2: output_length is missing"),
        ('{"timestamp": -1, "input_length": 10, "output_length": 1}', "line 2: timestamp must be >= 0, got -1"),
        ('{"timestamp": 1, "input_length": 0, "output_length": 1}', "line 2: input_length must be >= 1, got 0"),
        ('{"timestamp": 1, "input_length": 1.5, "output_length": 1}', "line 2: input_length must be a whole number"),
        ('{"timestamp": 1, "input_length": 9, "output_length": true}', "line 2: output_length must be a whole number"),
        ('{"timestamp": 1, "input_length": 9, "output_length": 1, "hash_ids": ["a"]}',
         "line 2: hash_ids must be a list"),
        ('{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1, 2, 3]}',
         "line 2: 3 hash_ids for input_length 600, which is 2 blocks of 512 tokens: is the block size 512?"),
        ("[" * 100_000, "line 2: nested too deeply"),
    ],
)
def test_a_bad_line_is_one_line_naming_the_file_and_the_line(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(jsonl(PAPER[:1]) + line.encode() + b"\n")
    with pytest.raises(TraceError) as caught:
        read_mooncake(path)
    assert str(caught.value).startswith(f"{path}: ") and says in str(caught.value) and "\n" not in str(caught.value)


def test_the_input_is_bounded_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(jsonl(PAPER))

    def refused(**limits: int) -> str:
        with monkeypatch.context() as patch:
            for name, value in limits.items():
                patch.setattr(mooncake, name, value)
            with pytest.raises(TraceError) as caught:
                read_mooncake(path)
        assert "\n" not in str(caught.value)
        return str(caught.value)

    assert "a Mooncake trace radixtop reads is at most 100" in refused(MAX_FILE_BYTES=100)
    assert "line 1: " in refused(MAX_LINE_BYTES=50) and "a line is at most 50" in refused(MAX_LINE_BYTES=50)
    assert "line 4: more than 3 requests; take a part of the trace (head -n N)" in refused(MAX_REQUESTS=3)
    assert "line 3: the prompts so far add up to more than 20,000 tokens" in refused(MAX_PROMPT_TOKENS=20_000)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(TraceError, match="no requests"):
        read_mooncake(empty)
    with pytest.raises(TraceError, match="cannot read the trace"):
        read_mooncake(tmp_path / "absent.jsonl")


def test_analyze_replays_the_papers_example_with_its_hits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "paper.jsonl"
    path.write_bytes(jsonl(PAPER))
    code = main(["analyze", str(path), "--page-size", "16", "--max-total-tokens", "65536", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    rows = {r["id"]: r for r in doc["calls"]}
    assert {rid: (r["prefix_len"], r["cached_tokens"], r["reason"]) for rid, r in rows.items()} == {
        "line1": (0, [0], None), "line2": (512, [512], None), "line3": (512, [512], None),
        "line4": (512, [512], None), "line5": (6656, [6656], None),
    }
    assert doc["cached_tokens"] == doc["expected_cached_tokens"] == 3 * 512 + 13 * 512
    assert "a Mooncake trace: 5 requests" in doc["source"]


def test_convert_writes_either_format_privately_and_says_the_block_size(tmp_path: Path, capsys) -> None:
    source = tmp_path / "tree.json"
    save_trace(tree(), source)
    out = tmp_path / "tree.jsonl"
    assert main(["trace", "convert", str(source), "--format", "mooncake", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "10 Mooncake requests (one a copy), 16 tokens a hash id (the trace's page_size_hint)" in err
    assert "--isl-block-size 16" in err and "--timed-trace-chunk-hash-size 16" in err
    assert out.stat().st_mode & 0o777 == 0o600 and out.read_bytes() == dump_mooncake(tree(), 16)
    assert main(["trace", "convert", str(source), "--format", "mooncake", "--block-size", "32", "-o", str(out)]) == 0
    assert "32 tokens a hash id (--block-size)" in capsys.readouterr().err
    assert out.read_bytes() == dump_mooncake(tree(), 32)
    back = tmp_path / "back.json"
    assert main(["trace", "convert", str(out), "--block-size", "32", "-o", str(back)]) == 0
    assert "(a Mooncake trace: 10 requests, block size 32" in capsys.readouterr().err
    assert back.stat().st_mode & 0o777 == 0o600 and json.loads(back.read_text())["page_size_hint"] == 32
    code = main(["trace", "convert", str(out), "-o", str(back)])  # read at 512: the ids do not fit
    err = capsys.readouterr().err
    assert (
        code == 2
        and f"{out}: line 1: " in err
        and "is the block size 512?" in err
        and len(err.strip().splitlines()) == 1
    )
