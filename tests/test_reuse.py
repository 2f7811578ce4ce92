"""Expected cached tokens from a trace, and the reason for each shortfall (radixtop.incident.replay.reuse)."""

from __future__ import annotations

from radixtop.incident.replay.reuse import evicted_between, expectations, explain
from radixtop.incident.replay.trace import Trace, TraceRequest


def trace_of(*requests: TraceRequest) -> Trace:
    return Trace("t", 64, tuple(requests))


def req(
    rid: str,
    offset: float,
    prefix: int,
    prompt: int = 256,
    group: str = "g",
    n: int = 1,
    extra_key: str | None = None,
) -> TraceRequest:
    return TraceRequest(rid, offset, prompt, prefix, group, 8, n, extra_key=extra_key)


def by_id(t: Trace, page: int = 64):
    return {(e.request_id, e.copy): e for e in expectations(t, page)}


def test_a_group_shares_its_shortest_prefix_and_copies_share_their_whole_prefix() -> None:
    exps = by_id(trace_of(req("a", 0, 128, n=2), req("b", 10, 200), req("c", 20, 64, group="other")))
    assert exps["a", 0].shared == 0 and exps["a", 0].expected == 0 and exps["a", 0].sharer is None
    assert exps["a", 1].shared == 128 and exps["a", 1].expected == 128 and exps["a", 1].sharer == ("a", 0)
    assert exps["a", 1].with_sharer  # sent at the same instant as copy 0
    assert exps["b", 0].shared == 128 and exps["b", 0].expected == 128 and not exps["b", 0].with_sharer
    assert exps["c", 0].shared == 0  # another group shares nothing


def test_each_reason_in_its_place() -> None:
    t = trace_of(
        req("first", 0, 64), req("one-page", 10, 64), req("short", 20, 63, group="s"), req("short2", 30, 63, group="s"),
        req("tail", 40, 100, group="t"), req("tail2", 50, 100, group="t"),
        req("whole", 60, 128, prompt=128, group="w"), req("whole2", 70, 128, prompt=128, group="w"),
        req("ns", 80, 64, group="n", extra_key="lora:a"), req("ns2", 90, 64, group="n", extra_key="lora:b"),
    )
    e = by_id(t)
    assert explain(e["first", 0], 0) == "first-of-group"
    assert explain(e["one-page", 0], 64) is None  # the seed's one-page prefix, served whole
    assert explain(e["one-page", 0], 0, evicted=True) == "evicted"
    assert explain(e["one-page", 0], 0, evicted=False) == "not-cached-yet"
    assert explain(e["one-page", 0], 0, evicted=None) == "unexplained"
    assert explain(e["one-page", 0], 0, cache_disabled=True) == "cache-disabled"
    assert e["short2", 0].expected == 0 and explain(e["short2", 0], 0) == "shorter-than-page"
    assert e["tail2", 0].expected == 64 and explain(e["tail2", 0], 64) == "page-tail"
    assert e["whole2", 0].expected == 64 and explain(e["whole2", 0], 64) == "last-token"  # 127 tokens -> one page
    assert e["ns2", 0].shared == 64 and e["ns2", 0].expected == 0 and explain(e["ns2", 0], 0) == "namespace"
    # At page 1 the page-size reasons vanish: only the last token stays computed.
    e1 = by_id(t, 1)
    assert explain(e1["short2", 0], 63) is None and explain(e1["tail2", 0], 100) is None
    assert e1["whole2", 0].expected == 127 and explain(e1["whole2", 0], 127) == "last-token"


def test_a_copy_sent_with_its_sharer_that_computed_the_prefix_is_first_of_its_group() -> None:
    e = by_id(trace_of(req("a", 0, 64, n=3)))
    # The server let copy 2 compute the prefix (it arrived first); copy 0 then hit.
    assert explain(e["a", 2], 0, evicted=False) == "first-of-group"


def test_evicted_between_is_inclusive_and_sorted() -> None:
    times = (1.0, 5.0, 9.0)
    assert evicted_between(times, 5.0, 5.0) and evicted_between(times, 2.0, 6.0)
    assert not evicted_between(times, 5.5, 8.9) and not evicted_between((), 0, 10)


def test_a_namespace_per_request_expects_no_reuse_and_says_why() -> None:
    t = trace_of(req("a", 0, 128, n=2), req("b", 10, 200), req("c", 20, 32), req("d", 30, 64, extra_key="lora:a"))
    plain = by_id(t)
    apart = {(e.request_id, e.copy): e for e in expectations(t, 64, namespace_per_request=True)}
    assert list(apart) == list(plain)  # the same calls in the same order
    assert plain["a", 1].expected == 128 and plain["b", 0].expected == 128
    for call, exp in apart.items():
        assert exp.expected == 0 and exp.sharer is None and not exp.with_sharer, call
        assert exp.shared == plain[call].shared  # what it shares with earlier calls is unchanged: only unreachable
    assert explain(apart["a", 0], 0) == "first-of-group"
    assert explain(apart["a", 1], 0) == "namespace" and explain(apart["b", 0], 0) == "namespace"
    assert explain(apart["c", 0], 0) == "shorter-than-page"  # 32 shared tokens: less than a page either way
