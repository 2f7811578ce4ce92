"""`radixtop analyze` reports what the simulator's reference path reports, figure for figure.

The expected figures below are the reports of the engine as it was before analyze had its own
fast paths (every KV slot written and read back, every evictable leaf ordered on every eviction,
log lines formatted): on small traces that exercise
every eviction policy, page sizes 1 to 16, retractions, prefix_of chains, copies and identical
recorded prompts whose outputs share the tree. Any change of behaviour in the faster path moves
one of them. They rest on what the synthesized prompts share, not on the drawn tokens' values,
which are pinned on their own. The pieces each fast path rests on are checked against their
reference here too.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import math
import random
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixtop.incident.analyze.analyze import analyze
from radixtop.incident.replay.draws import draws_below
from radixtop.incident.replay.trace import Trace, TraceRequest, plan_requests
from radixtop.incident.replay.vocab import SIM_VOCABULARY, Vocabulary
from radixtop.sim.engine import (
    CLIP_MAX_NEW_TOKENS,
    Engine,
    EngineStats,
    GenerateResult,
    SimConfig,
    _Scheduler,
    check_token_ids,
)
from radixtop.sim.faults import FaultSpec
from radixtop.sim.model import VOCAB_SIZE, PromptFolds, SimModel, _hash64, _stem
from radixtop.sim.offline import OfflineCall, run_offline
from radixtop.sim.pool import TokenToKVPoolAllocator


def shared_trace() -> Trace:
    """The benchmark's shape, small: 8 groups sharing a 128-token base, 256-token prompts."""
    return Trace("shared", 16, tuple(TraceRequest(f"r{i}", i * 2.0, 256, 128, f"g{i % 8}", 8) for i in range(240)))


def tree_trace() -> Trace:
    """Varied lengths and outputs, copies, and every fourth request starting with an earlier one's prefix."""
    return Trace("tree", 16, tuple(
        TraceRequest(f"m{i}", i * 0.7, 40 + (i * 37) % 300, (i * 13) % 90, f"g{i % 5}", 1 + i % 40, 1 + i % 3,
                     prefix_of=f"m{i - 3}" if i % 4 == 3 and i >= 3 else None)
        for i in range(120)))


def repeat_trace() -> Trace:
    """Recorded prompts, three of them again and again: identical prompts give identical outputs."""
    return Trace("repeat", 16, tuple(
        TraceRequest(f"d{i}", i * 1.5, 60 + 17 * (i % 3), 0, f"d{i}", 10 + (i % 4) * 9,
                     input_ids=tuple(range(100 + i % 3, 160 + i % 3 + 17 * (i % 3))))
        for i in range(60)))


CASES: dict[str, tuple[Callable[[], Trace], SimConfig]] = {
    "shared-lru-16": (shared_trace, SimConfig(page_size=16, max_total_tokens=8192, max_running_requests=32)),
    "shared-mru-1": (shared_trace, SimConfig(page_size=1, max_total_tokens=3000, max_running_requests=32,
                                            radix_eviction_policy="mru", step_time_s=0.0005)),
    "tree-lfu-4": (tree_trace, SimConfig(page_size=4, max_total_tokens=4000, max_running_requests=16,
                                        radix_eviction_policy="lfu")),
    "tree-fifo-16": (tree_trace, SimConfig(page_size=16, max_total_tokens=4096, max_running_requests=64,
                                          radix_eviction_policy="fifo")),
    "tree-filo-8": (tree_trace, SimConfig(page_size=8, max_total_tokens=3000, max_running_requests=12,
                                         radix_eviction_policy="filo")),
    "tree-priority-2": (tree_trace, SimConfig(page_size=2, max_total_tokens=3000, max_running_requests=12,
                                             radix_eviction_policy="priority")),
    "repeat-lru-1": (repeat_trace, SimConfig(page_size=1, max_total_tokens=2048, max_running_requests=8)),
    "shared-retract-16": (shared_trace, SimConfig(page_size=16, max_total_tokens=3000, max_running_requests=32)),
    "tree-retract-1": (tree_trace, SimConfig(page_size=1, max_total_tokens=1500, max_running_requests=32)),
    "repeat-retract-16": (repeat_trace, SimConfig(page_size=16, max_total_tokens=1500, max_running_requests=64)),
    "tree-off": (tree_trace, SimConfig(page_size=16, max_total_tokens=4096, disable_radix_cache=True)),
}

# (hit rate, tokens saved, missed by reason, evicted tokens, peak usage, retractions, failed calls,
# simulated seconds, digest of every call's cached tokens and reason): the reference engine's.
EXPECTED = {
    "shared-lru-16": (0.483333, 29696, {"first-of-group": [8, 1024]}, 23808, 0.6875, 0, 0, 0.494, "b48ec657668f623b"),
    "shared-mru-1": (0.483333, 29696, {"first-of-group": [8, 1024]}, 30510, 0.259, 0, 0, 0.482, "b48ec657668f623b"),
    "tree-lfu-4": (0.207628, 9472, {"first-of-group": [6, 200], "evicted": [5, 143], "shorter-than-page": [12, 22],
                                    "last-token": [8, 32], "page-tail": [156, 501]},
                   36676, 0.887, 0, 0, 0.992, "8a715d28f373b3f7"),
    "tree-fifo-16": (0.154318, 7040, {"first-of-group": [5, 170], "evicted": [34, 1576],
                                      "shorter-than-page": [44, 467], "last-token": [5, 20], "page-tail": [137, 1097]},
                     37696, 0.976562, 0, 0, 0.79, "a6a28af9d5952662"),
    "tree-filo-8": (0.172205, 7856, {"first-of-group": [5, 170], "evicted": [35, 1493], "shorter-than-page": [22, 73],
                                     "last-token": [5, 12], "page-tail": [148, 766]},
                    38880, 0.968, 0, 0, 1.194, "36a067f1e9e505c2"),
    "tree-priority-2": (0.179833, 8204, {"first-of-group": [6, 235], "evicted": [39, 1753],
                                         "shorter-than-page": [4, 4], "last-token": [5, 6], "page-tail": [103, 168]},
                        39346, 0.968, 0, 0, 1.166, "40d17687556eadf9"),
    "repeat-lru-1": (0.937662, 4332, {}, 0, 0.187988, 0, 0, 0.426, "7a2a49051deb54ba"),
    "shared-retract-16": (0.483333, 29696, {"first-of-group": [8, 1024]}, 31232, 0.967914, 18, 0, 0.506,
                          "b48ec657668f623b"),
    "tree-retract-1": (0.160368, 7316, {"first-of-group": [7, 300], "evicted": [63, 2750], "last-token": [4, 4]},
                       41946, 0.996667, 1, 0, 1.636, "8c140a60885ece1b"),
    "repeat-retract-16": (0.78961, 3648, {}, 0, 1.0, 2, 0, 0.202, "b781ff6abb1bd884"),
    "tree-off": (0.0, 0, {"cache-disabled": [238, 10370]}, 0, 0.976562, 0, 0, 0.846, "03536aea6d36a982"),
}


def digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", list(CASES))
def test_analyze_reports_the_reference_engines_figures(name: str) -> None:
    make, config = CASES[name]
    a = analyze(make(), config, seed=1)
    s = a.summary
    rows = digest([[r.exp.request_id, r.exp.copy, list(r.cached), r.reason] for r in a.rows])
    assert (round(s.hit_rate, 6), s.cached_tokens, {k: list(v) for k, v in s.missed.items()}, a.evicted_tokens,
            round(a.peak_token_usage, 6), a.retractions, len(a.failed), round(a.duration_s, 6), rows) == EXPECTED[name]


def test_synthesized_prompts_are_the_reference_draws_token_for_token() -> None:
    def prompts(trace: Trace, vocab: Vocabulary = SIM_VOCABULARY) -> str:
        return digest([p.input_ids for p in plan_requests(trace, seed=3, vocab=vocab)])

    assert prompts(tree_trace()) == "82abf2107a9b0ac7"
    assert prompts(shared_trace()) == "399d203b326b315e"
    # A vocabulary listed in a table, and one past the table's size (special ids skipped by bisection).
    assert prompts(tree_trace(), Vocabulary(50000, (0, 1, 2, 49999, 1000), "t")) == "ad0c6f17b45bd275"
    assert prompts(tree_trace(), Vocabulary(1 << 21, (5, 77777), "t")) == "a68d3c1a68cfa6ac"
    # A prompt's private tokens are its key's draws below the ordinary half of the usable ids,
    # and its group's base past the band token the group's key's draws.
    vocab = Vocabulary(50000, (0, 1, 2, 49999, 1000), "t")
    planned = {(p.request_id, p.copy): p.input_ids for p in plan_requests(tree_trace(), seed=3, vocab=vocab)}
    ordinary = vocab.usable // 2
    m7 = planned["m7", 1]  # 299 tokens: the first of m4, a band token, its own draws
    assert m7[2:] == [vocab.nth(v) for v in reference_draws(b"own\x1ftree\x1fm7\x1f1\x1f3", ordinary, 297)]
    m2 = planned["m2", 0]  # 114 tokens sharing the first 26 of group g2's base
    assert m2[1:26] == [vocab.nth(v) for v in reference_draws(b"group\x1ftree\x1fg2\x1f3", ordinary, 25)]


def reference_draws(key: bytes, n: int, count: int) -> list[int]:
    """draws_below one lane at a time: SHAKE-128's output in little-endian lanes of 4 bytes (n's
    byte width above 2^32), each cut to n's bit width, those below n kept."""
    bits = (n - 1).bit_length()
    width = max(4, -(-bits // 8))
    stream = hashlib.shake_128(key).digest(width * (4 * count + 64))
    lanes = (int.from_bytes(stream[i : i + width], "little") & ((1 << bits) - 1) for i in range(0, len(stream), width))
    return list(itertools.islice((v for v in lanes if v < n), count))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, (1 << 40) + 5), st.binary(max_size=40), st.integers(0, 600))
def test_bulk_draws_are_the_lanes_read_one_by_one(n: int, key: bytes, count: int) -> None:
    draws = draws_below(key, n, count)
    assert draws == reference_draws(key, n, count)
    assert len(draws) == count and all(0 <= v < n for v in draws)


@pytest.mark.parametrize("bits", [0, 1, 7, 8, 9, 16, 23, 24, 25, 31, 32, 33])
def test_bulk_draws_below_a_power_of_two_keep_every_lane(bits: int) -> None:
    for n in (1 << bits, (1 << bits) + 1, max(1, (1 << bits) - 1)):
        for count in (0, 1, 300, 2000):
            assert draws_below(b"k%d" % bits, n, count) == reference_draws(b"k%d" % bits, n, count)


def test_bulk_draws_are_fixed_by_their_key_and_longer_ones_start_with_shorter_ones() -> None:
    n = 1 << 23
    assert draws_below(b"own\x1fa", n, 500) == draws_below(b"own\x1fa", n, 500)
    assert draws_below(b"own\x1fa", n, 500) != draws_below(b"own\x1fb", n, 500)
    assert draws_below(b"own\x1fa", 3000, 900)[:400] == draws_below(b"own\x1fa", 3000, 400)
    assert draws_below(b"own\x1fa", n, 900)[:400] == draws_below(b"own\x1fa", n, 400)
    with pytest.raises(ValueError, match="empty range"):
        draws_below(b"k", 0, 3)


@pytest.mark.parametrize("n", [2, 10, 3000, 1 << 23, 75821])
def test_bulk_draws_fall_evenly_below_n(n: int) -> None:
    draws = draws_below(b"even", n, 100_000)
    tenths = collections.Counter(v * 10 // n for v in draws)
    assert set(tenths) <= set(range(10))
    if n >= 10:
        assert all(9_000 < tenths[t] < 11_000 for t in range(10))
    else:
        assert all(49_000 < c < 51_000 for c in collections.Counter(draws).values())


@pytest.mark.parametrize(
    "vocab", [SIM_VOCABULARY, Vocabulary(3000, (0, 2, 2999), "t"), Vocabulary(1 << 21, (3, 9), "t")]
)
def test_a_vocabularys_bulk_lookup_is_its_one_by_one_lookup(vocab: Vocabulary) -> None:
    indices = [0, 1, 2, 7, vocab.usable // 2, vocab.usable - 1]
    assert vocab.nth_many(indices) == [vocab.nth(i) for i in indices]
    assert vocab.nth_many_in_range(list(indices)) == [vocab.nth(i) for i in indices]
    assert vocab.nth_many([]) == []
    with pytest.raises(IndexError, match="outside"):
        vocab.nth_many([0, vocab.usable])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, (1 << 24) - 1), max_size=2600), st.integers(0, 1 << 20), st.integers(0, (1 << 61) - 2))
def test_folding_tokens_is_reading_the_slots_that_hold_them(tokens: list[int], first: int, state: int) -> None:
    pool = TokenToKVPoolAllocator(4096, 1)
    slots = random.Random(len(tokens)).sample(range(1, 4097), len(tokens))
    pool.write(slots, tokens, first)
    assert SimModel.fold(state, tokens, first) == SimModel.read_kv(state, pool, slots)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, (1 << 61) - 2), st.integers(0, (1 << 24) - 1), st.integers(0, 1 << 20),
       st.integers(0, (1 << 24) - 1), st.integers(0, (1 << 62) - 1), st.integers(0, 3))
def test_a_decode_steps_fold_and_token_are_the_general_ones(
    state: int, token: int, position: int, stem: int, noise: int, seed: int
) -> None:
    assert SimModel.fold_token(state, token, position) == SimModel.fold(state, [token], position)
    reference = _stem(seed, stem) << 11 | _hash64(seed, 2, state, position, noise) & 2047
    assert SimModel(seed).next_token(state, position, stem, noise) == reference


def test_prompt_folds_start_from_a_remembered_head_and_give_the_same_digest() -> None:
    rng = random.Random(3)
    head = [rng.randrange(1 << 24) for _ in range(128)]
    prompts = [head + [rng.randrange(1 << 24) for _ in range(n)] for n in (1, 50, 300)]
    folds = PromptFolds(max_tokens=300)
    for tokens in prompts + prompts:
        assert folds.fold(tokens, 128) == SimModel.fold(0, tokens, 0)
        assert folds.fold(tokens, 0) == SimModel.fold(0, tokens, 0)
    for n in (16, 32, 48):  # more heads than it keeps: the oldest go, the digests stay right
        assert folds.fold(prompts[2], n) == SimModel.fold(0, prompts[2], 0)


def run_engine(
    config: SimConfig, prompts: list[list[int]], max_new: int, *, kv_contents: bool, result_outputs: bool = True
) -> tuple[list[tuple[list[int], int, int, str]], EngineStats, list[tuple[int, list[int], list[int] | None]]]:
    """Every prompt submitted at once, the engine iterated until all are answered; the stats
    without the generation throughput, which is timed on the wall clock; the tree at the end."""
    engine = Engine(config, None, wall_clock=lambda: 0.0, kv_contents=kv_contents, result_outputs=result_outputs)
    futures: list[Future[GenerateResult]] = []
    for tokens in prompts:
        future: Future[GenerateResult] = Future()
        engine.submit(tokens, max_new_tokens=max_new, future=future)
        futures.append(future)
    for _ in range(100_000):
        if all(f.done() for f in futures):
            break
        engine.iterate()
    answers = [(r.output_ids, r.cached_tokens, r.completion_tokens, r.finish_reason)
               for r in (f.result() for f in futures)]
    tree = sorted((n.id, n.key.token_ids, n.value) for n in engine.caches[0].iter_nodes())
    return answers, replace(engine.stats(), gen_throughput=0), tree


@pytest.mark.parametrize("page_size", [1, 16])
def test_an_engine_without_kv_contents_answers_what_one_with_them_answers(page_size: int) -> None:
    rng = random.Random(11)
    families = [[9_000_000 + f] + [rng.randrange(1 << 20) for _ in range(40)] for f in range(4)]
    prompts = [families[i % 4] + [rng.randrange(1 << 20) for _ in range(20 + i % 90)] for i in range(60)]
    prompts += prompts[:12]  # identical prompts: their outputs share the tree
    config = SimConfig(page_size=page_size, max_total_tokens=1200, max_running_requests=24, step_time_s=0)
    with_contents = run_engine(config, prompts, 40, kv_contents=True)
    without = run_engine(config, prompts, 40, kv_contents=False)
    assert with_contents == without
    assert with_contents[1].evicted_tokens_total > 0 and with_contents[1].num_retracted_reqs > 0
    # Made only where the tree or a retracted request reads them, the outputs the tree holds are
    # the same tokens, and so is everything else but the results' output ids.
    answers, stats, tree = run_engine(config, prompts, 40, kv_contents=False, result_outputs=False)
    assert (stats, tree) == with_contents[1:]
    assert answers == [([], *rest) for _, *rest in with_contents[0]]
    assert any(len(key) > 1 and key[-1] > 1 << 22 for _, key, _ in tree)  # outputs (u-stems) in the tree


@pytest.mark.parametrize("name", ["shared-lru-16", "shared-retract-16", "tree-retract-1", "repeat-retract-16"])
def test_the_reserved_tokens_kept_between_prefills_are_the_running_batchs_sum(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept_reads = []
    kept = _Scheduler._reserved_tokens

    def checked(self: _Scheduler) -> int:
        kept_reads.append(self._reserved is not None)
        ratio = self.new_token_ratio
        fresh = sum(math.ceil(min(r.max_new_tokens - len(r.output_ids), CLIP_MAX_NEW_TOKENS) * ratio)
                    for r in self.running)
        assert kept(self) == fresh
        return fresh

    monkeypatch.setattr(_Scheduler, "_reserved_tokens", checked)
    make, config = CASES[name]
    analyze(make(), config, seed=1)
    assert any(kept_reads) and not all(kept_reads)


def test_outputs_without_kv_contents_wait_only_where_no_result_carries_them() -> None:
    with pytest.raises(ValueError, match="result_outputs"):
        Engine(SimConfig(), None, result_outputs=False)


def test_the_simulators_vocabulary_is_the_plans_so_drawn_ids_need_no_check() -> None:
    assert SIM_VOCABULARY.size == VOCAB_SIZE and not SIM_VOCABULARY.special
    ids = [t for p in plan_requests(tree_trace(), seed=2) for t in p.input_ids]
    check_token_ids(ids)


def test_recorded_ids_are_checked_once_and_a_bad_one_fails_its_calls_as_the_engine_words_it() -> None:
    good = tuple(range(100, 140))
    requests = (TraceRequest("ok", 0.0, 40, 0, "a", 4, input_ids=good),
                TraceRequest("neg", 1.0, 40, 0, "b", 4, 2, input_ids=(*good[:5], -3, *good[6:])),
                TraceRequest("bool", 2.0, 40, 0, "c", 4, input_ids=(True, *good[1:])),
                TraceRequest("drawn", 3.0, 64, 16, "d", 4))
    a = analyze(Trace("bad-ids", 16, requests), SimConfig(page_size=16, max_total_tokens=4096))
    assert dict(a.failed) == {
        ("neg", 0): f"input_ids[5]=-3 is outside the vocabulary [0, {VOCAB_SIZE})",
        ("neg", 1): f"input_ids[5]=-3 is outside the vocabulary [0, {VOCAB_SIZE})",
        ("bool", 0): "input_ids[0] must be an integer token id, got True",
    }
    assert a.summary.calls == 2  # the two whose ids are good


def test_calls_whose_ids_are_checked_get_what_calls_checked_by_the_engine_get() -> None:
    prompts = [p.input_ids for p in plan_requests(shared_trace(), seed=1)][:80]
    config = SimConfig(page_size=16, max_total_tokens=3000, max_running_requests=32)

    def run(checked: bool) -> object:
        calls = [OfflineCall(i, i * 0.002, ids, 8, ids_checked=checked) for i, ids in enumerate(prompts)]
        return run_offline(config, calls)

    before = [list(ids) for ids in prompts]
    assert run(True) == run(False)
    assert prompts == before  # the engine keeps the calls' own lists and changes none of them


def test_an_engine_with_faults_keeps_the_kv_contents_the_faults_read() -> None:
    with pytest.raises(ValueError, match="kv_contents"):
        Engine(SimConfig(faults=(FaultSpec("leak"),)), None, kv_contents=False)


def test_a_planned_calls_repr_leaves_its_prompt_out() -> None:
    trace = Trace("secret", 16, (TraceRequest("r", 0.0, 4, 0, "g", 2, text="the secret prompt"),))
    (planned,) = plan_requests(trace)
    assert planned.text == "the secret prompt"
    assert "secret prompt" not in repr(planned) and "input_ids" not in repr(planned)
    assert repr(planned).startswith("PlannedRequest(offset_s=0.0, request_id='r', copy=0, max_tokens=2")
