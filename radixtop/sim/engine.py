"""The simulator's engine: SGLang's scheduler loop over the sim radix cache, in-process.

One :class:`Engine` is one SGLang server: ``dp_size`` data-parallel schedulers, each with
``tp_size`` tensor-parallel ranks. Every rank owns a :class:`~radixtop.sim.radix.RadixCache` and a
:class:`~radixtop.sim.pool.TokenToKVPoolAllocator`; within a DP group rank 0 drives and every
cache operation is replayed on the other ranks, so their trees are identical (same node ids,
same slots), as on a real server where each rank runs the same scheduler decisions. With
``nnodes`` > 1 the engine is one node of a TP group spread over machines and holds only that
node's ranks (``SimConfig.tp_ranks``), keyed and prefixed by their global TP rank.

Each loop iteration (SGLang's ``event_loop_normal``): admit waiting requests into a prefill
batch when they fit (match_prefix, lock the matched node, allocate the rest, evicting LRU
unlocked leaves when short), else run one decode step for the running batch (retracting
requests when a step cannot get its tokens); then call every ``on_safe_point`` hook once and
sleep ``step_time_s`` of emulated GPU time. After prefill a request's prompt is inserted into the
tree (0.5.23's ``checkpoint``, the old ``cache_unfinished_req``) so others can match it while it
runs; on finish the whole sequence is inserted and the lock released.

Logging follows SGLang 0.5.23 (see :mod:`radixtop.sim.logfmt`): scheduler startup lines on every
rank when :meth:`Engine.run` starts; ``Prefill batch, ...`` / ``Decode batch, ...`` from the first
TP rank of each DP group only (SGLang's ``is_stats_logging_rank``); retraction, leak and failure
lines on every rank that has them. ``The server is fired up and ready to roll!`` comes from the
main process once the HTTP server listens, so the engine does not write it from ``run()``: the
HTTP layer (or an in-process user) calls :meth:`Engine.emit_ready`.

Simplifications, each documented where it lives: no chunked prefill (a prompt is one extend);
in-batch prefix deduplication applies under FCFS with a one-page threshold (SGLang applies it for
the LPM policy with a 32-token threshold); ``enable_deterministic_inference`` only makes sampling
at temperature > 0 reproducible per prompt (the sim is otherwise deterministic already).

All methods must be called from the thread running the event loop that runs :meth:`run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import operator
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from radixtop.sim.faults import (
    LOCK_RACE_MESSAGE,
    FaultSet,
    FaultSpec,
    leak_traceback,
    lock_race_traceback,
)
from radixtop.sim.logfmt import SIGQUIT_LINE, format_line, rank_prefix
from radixtop.sim.model import VOCAB_SIZE, PromptFolds, SimModel, SimTokenizer
from radixtop.sim.pool import TokenToKVPoolAllocator
from radixtop.sim.radix import (
    EVICTION_POLICIES,
    CacheInitParams,
    EvictParams,
    MatchPrefixParams,
    MatchResult,
    RadixCache,
    RadixCacheError,
    RadixKey,
    TreeLock,
    TreeNode,
)

__all__ = [
    "SimConfig",
    "check_token_ids",
    "Engine",
    "EngineDead",
    "EngineStats",
    "GenerateResult",
    "RankInfo",
    "FaultSpec",
]

log = logging.getLogger(__name__)

# SGLang 0.5.23 defaults (environ.py / schedule_policy.py).
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096
LEAK_LOG_INTERVAL = 1000  # raise_error_or_warn logs the 1st, 1001st, ... failed check
IDLE_POLL_S = 0.05  # an idle scheduler still iterates (safe points, idle checks) this often

# Qwen2.5-0.5B's KV geometry, only for the startup lines' sizes.
_KV_BYTES_PER_TOKEN = 24 * 2 * 64 * 2  # layers * kv heads * head dim * bf16 bytes, for K (same for V)
_GPU_MEM_GB = 139.0


def check_token_ids(input_ids: list[int] | tuple[int, ...]) -> None:
    """ValueError naming the first id that is not an int of the vocabulary (bool is not a token id either)."""
    if not set(map(type, input_ids)) <= {int}:
        i, tok = next((i, t) for i, t in enumerate(input_ids) if type(t) is not int)
        raise ValueError(f"input_ids[{i}] must be an integer token id, got {tok!r}")
    if input_ids and (min(input_ids) < 0 or max(input_ids) >= VOCAB_SIZE):
        i, tok = next((i, t) for i, t in enumerate(input_ids) if not 0 <= t < VOCAB_SIZE)
        raise ValueError(f"input_ids[{i}]={tok} is outside the vocabulary [0, {VOCAB_SIZE})")


class EngineDead(RuntimeError):
    """The engine's scheduler died (or was stopped); the message says why."""


@dataclass(frozen=True)
class SimConfig:
    page_size: int = 1
    max_running_requests: int = 32
    max_total_tokens: int = 16384
    disable_radix_cache: bool = False
    radix_eviction_policy: str = "lru"
    tp_size: int = 1
    dp_size: int = 1
    decode_log_interval: int = 40
    enable_deterministic_inference: bool = False
    log_ms: bool = True
    faults: tuple[FaultSpec, ...] = ()
    step_time_s: float = 0.002  # emulated GPU time per scheduler step
    max_prefill_tokens: int = 16384  # SGLang's --max-prefill-tokens: new tokens per prefill batch
    device: str = "cuda"  # SGLang's --device: its batch lines say "cuda graph" or "cpu graph"
    force_miss: bool = False  # SGLANG_RADIX_FORCE_MISS: every match finds nothing; the tree runs on
    # SGLang's --nnodes / --node-rank: the TP group spans nnodes machines and this engine runs
    # node_rank's share of its ranks (node 1 of 2 at tp_size 4: TP2 and TP3).
    nnodes: int = 1
    node_rank: int = 0

    @property
    def tp_ranks(self) -> range:
        """The TP ranks this node runs, as SGLang deals them out: consecutive, tp_size / nnodes each."""
        per_node = self.tp_size // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        checks: list[tuple[bool, str]] = [
            (self.page_size >= 1, f"page_size must be >= 1, got {self.page_size}"),
            (
                self.max_running_requests >= 1,
                f"max_running_requests must be >= 1, got {self.max_running_requests}",
            ),
            (
                self.max_total_tokens >= self.page_size,
                f"max_total_tokens ({self.max_total_tokens}) must hold at least one page of {self.page_size}",
            ),
            (
                self.radix_eviction_policy.lower() in EVICTION_POLICIES,
                f"radix_eviction_policy must be one of {', '.join(EVICTION_POLICIES)}, "
                f"got {self.radix_eviction_policy!r}",
            ),
            (1 <= self.tp_size <= 64, f"tp_size must be within 1..64, got {self.tp_size}"),
            (1 <= self.dp_size <= 64, f"dp_size must be within 1..64, got {self.dp_size}"),
            (1 <= self.nnodes <= 64, f"nnodes must be within 1..64, got {self.nnodes}"),
            (
                0 <= self.node_rank < self.nnodes,
                f"node_rank must be below the number of nodes ({self.nnodes}), got {self.node_rank}",
            ),
            (
                self.nnodes >= 1 and self.tp_size % self.nnodes == 0,
                f"tp_size must be a multiple of the number of nodes ({self.nnodes}), each node running "
                f"an equal share of the TP ranks; got {self.tp_size}",
            ),
            # SGLang lays DP groups over nodes in ways of their own; the simulator splits one TP group.
            (
                self.dp_size == 1 or self.nnodes == 1,
                f"dp_size must be 1 when the TP group spans several nodes, got {self.dp_size}",
            ),
            (
                self.decode_log_interval >= 1,
                f"decode_log_interval must be >= 1, got {self.decode_log_interval}",
            ),
            (self.step_time_s >= 0, f"step_time_s must be >= 0, got {self.step_time_s}"),
            (
                self.max_prefill_tokens >= 1,
                f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        race = FaultSet(self.faults).lock_race  # validates names and parameters
        if race is not None and race.named_rank is not None and race.named_rank not in self.tp_ranks:
            ranks = ", ".join(map(str, self.tp_ranks))
            raise ValueError(
                f"fault 'lock-race': rank={race.named_rank} is not a TP rank this node runs ({ranks})"
            )


class GenerateResult(NamedTuple):
    """One request's answer (a named tuple: one is made per request, without a frozen
    dataclass's setattr per field)."""

    output_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str  # "length" (max_new_tokens reached) or "abort"
    rid: str = ""

    @property
    def text(self) -> str:
        """The output as the simulator's tokenizer writes it, made when asked (an in-process
        driver never asks)."""
        return SimTokenizer().decode(self.output_ids)


@dataclass(frozen=True)
class EngineStats:
    token_usage: float
    num_running_reqs: int
    num_queue_reqs: int
    cache_hit_rate: float
    max_total_num_tokens: int
    available_tokens: int
    evictable_tokens: int
    protected_tokens: int
    evicted_tokens_total: int
    num_retracted_reqs: int
    gen_throughput: float


@dataclass(frozen=True)
class RankInfo:
    rank: int  # dp_rank * tp_size + tp_rank (the key of Engine.caches)
    dp_rank: int
    tp_rank: int
    prefix: str  # the log prefix, e.g. " DP1 TP0" ("" when all sizes are 1)
    cache: RadixCache
    pool: TokenToKVPoolAllocator


class _ReqView:
    """A request as one rank's cache sees it (see radix.CacheReq): each rank has its own row."""

    __slots__ = ("req", "kv_indices", "cache_protected_len", "last_node", "lock", "origin_input_ids", "output_ids",
                 "extra_key")

    def __init__(self, req: _Req, root: TreeNode) -> None:
        """A view with nothing cached yet, as _Scheduler._reset_views leaves it: its rank's root."""
        self.req = req
        self.kv_indices: list[int] = []
        self.cache_protected_len = 0
        self.last_node: TreeNode | None = root
        self.lock: TreeLock | None = None
        # The request's own lists (never replaced, only added to) and namespace.
        self.origin_input_ids = req.origin_input_ids
        self.output_ids = req.output_ids
        self.extra_key = req.extra_key

    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def rid(self) -> str:
        return self.req.rid


class _Batch:
    __slots__ = ("reqs",)

    def __init__(self, reqs: list[_ReqView]) -> None:
        self.reqs = reqs


class RankRequests:
    """One rank's requests under the names SGLang's scheduler keeps them by (`running_batch.reqs`,
    `waiting_queue`, `chunked_req`), each as that rank's cache sees it (its own `lock`): what the
    instrument's holder reader looks at (radixtop.instrument.holders). No chunked prefill here."""

    chunked_req = None

    def __init__(self, sched: _Scheduler, tp_rank: int) -> None:
        self._sched = sched
        self._view = sched.local_index(tp_rank)

    @property
    def running_batch(self) -> _Batch:
        return _Batch([req.views[self._view] for req in self._sched.running])

    @property
    def waiting_queue(self) -> list[_ReqView]:
        return [req.views[self._view] for req in self._sched.waiting]


class _Req:
    def __init__(
        self,
        rid: str,
        input_ids: list[int],
        max_new_tokens: int,
        temperature: float,
        future: asyncio.Future,
        roots: list[TreeNode],
        rng: random.Random | None,
        extra_key: str | None = None,
    ) -> None:
        """``roots``: the root of each rank's tree, in the order of the scheduler's ranks."""
        self.rid = rid
        self.extra_key = extra_key  # the cache namespace: keys with another never match
        self.origin_input_ids = input_ids
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.future = future
        self.rng = rng
        self.output_ids: list[int] = []
        self.made = 0  # without KV contents: the output tokens with their values (the rest may wait)
        self.views = [_ReqView(self, root) for root in roots]
        self.lead = self.views[0]  # the first rank's view: its row is the one every read uses
        self.mirrors = self.views[1:]  # every other rank's view: its row holds the same slots as the lead's
        self.digest = 0
        # Block-boundary fault: page index within this request -> the page read instead.
        self.stale_pages: dict[int, int] = {}
        self.cached_tokens: int | None = None
        self.aborted = False
        self.extend_from = 0  # first position this prefill computes (the matched prefix length)

    @property
    def done(self) -> bool:
        return len(self.output_ids) >= self.max_new_tokens

    @property
    def kv_len(self) -> int:
        return len(self.lead.kv_indices)


# Getters for any() and map() over a queue or a scheduler's ranks.
_ABORTED = operator.attrgetter("aborted")
_RANK_ROOT = operator.attrgetter("cache.root_node")


# An output token whose value is not made yet (see Engine's result_outputs): never a token id.
_UNMADE = -1


def _first_pages(pages: list[int] | None) -> str:
    return "none" if pages is None else f"{pages[:4]}..."


class _LockRaceFired(RadixCacheError):
    """Raised by the loop when the lock-race fault's delay has run out."""

    def __init__(self, dp_rank: int, tp_rank: int) -> None:
        super().__init__(LOCK_RACE_MESSAGE)
        self.dp_rank = dp_rank
        self.tp_rank = tp_rank


class _StrictLeakError(ValueError):
    def __init__(self, message: str, dp_rank: int) -> None:
        super().__init__(message)
        self.dp_rank = dp_rank


class _Scheduler:
    """One DP group: a waiting queue, a running batch and its TP ranks' caches and pools."""

    def __init__(self, engine: Engine, dp_rank: int) -> None:
        cfg = engine.config
        self.engine = engine
        self.cfg = cfg
        self.dp_rank = dp_rank
        self.page_size = cfg.page_size
        self.ranks: list[RankInfo] = []  # this node's TP ranks; a request's views follow their order
        for tp_rank in cfg.tp_ranks:
            # The first rank here holds the contents every read uses (pool0): the others replicate.
            pool = TokenToKVPoolAllocator(
                cfg.max_total_tokens,
                cfg.page_size,
                store_contents=not self.ranks and engine.kv_contents,
                stamp_pages=engine.faults.block_boundary is not None,  # the fault's page ages
            )
            cache = RadixCache(
                CacheInitParams(
                    disable=cfg.disable_radix_cache,
                    token_to_kv_pool_allocator=pool,
                    page_size=cfg.page_size,
                    eviction_policy=cfg.radix_eviction_policy,
                )
            )
            prefix = rank_prefix(dp_rank=dp_rank, tp_rank=tp_rank, dp_size=cfg.dp_size, tp_size=cfg.tp_size)
            self.ranks.append(
                RankInfo(dp_rank * cfg.tp_size + tp_rank, dp_rank, tp_rank, prefix, cache, pool)
            )
        self.pool0 = self.ranks[0].pool
        self.cache0 = self.ranks[0].cache
        self.prompt_folds = PromptFolds()
        self.capacity = self.pool0.size
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        # The running batch's reserved tokens while only prefills changed the batch since they
        # were summed (each adds its requests' shares); None after a decode step (outputs, the
        # ratio and the batch all move), a retraction or a ratio reset.
        self._reserved: int | None = None
        self.forward_ct_decode = 0
        self.num_generated_tokens = 0
        self.last_decode_tic = time.perf_counter()
        self.last_prefill_tic = time.perf_counter()
        self.gen_throughput = 0.0
        self.evicted_tokens_total = 0
        self.num_retracted_reqs = 0
        self.cached_tokens_total = 0
        self.prompt_tokens_total = 0
        # The node the latest fault that fired concerns (the lock race's contended node, the last
        # node a double unlock drove below zero): the same id on every rank of the group, whose
        # trees are replicas.
        self.fault_node: int | None = None

    # ----- accounting (rank 0 speaks for the group: ranks are identical) -----

    def available(self) -> int:
        return self.pool0.available_size()

    def evictable(self) -> int:
        return self.cache0.evictable_size()

    def protected(self) -> int:
        return self.cache0.protected_size()

    def num_used(self) -> int:
        return self.capacity - (self.pool0.available_size() + self.cache0.evictable_size())

    def token_usage(self) -> float:
        return self.num_used() / self.capacity

    # ----- logging -----

    def local_index(self, tp_rank: int) -> int:
        """Where TP rank `tp_rank` sits in `ranks` and in each request's `views`."""
        index = tp_rank - self.ranks[0].tp_rank
        if not 0 <= index < len(self.ranks):
            raise ValueError(f"TP rank {tp_rank} does not run on this node")
        return index

    def log_rank(self, tp_rank: int, message: str) -> None:
        """A line on TP rank `tp_rank`; none when that rank runs on another node, so what SGLang
        writes on TP0 alone (batch lines, the pool's size) is absent from other nodes' logs."""
        if tp_rank in self.cfg.tp_ranks:
            self.engine._emit(message, self.ranks[self.local_index(tp_rank)].prefix)

    def log_batch_line(self, message: str) -> None:
        """A stats line (on TP rank 0, as SGLang's), then the engine's batch-line subscribers; a
        node without TP0 writes none (SGLang's stats-logging rank is TP0)."""
        if 0 not in self.cfg.tp_ranks:
            return
        self.log_rank(0, message)
        for subscriber in self.engine.on_batch_line:
            subscriber(message)

    def log_all(self, message: str) -> None:
        for info in self.ranks:
            self.engine._emit(message, info.prefix)

    # ----- mirrored cache operations -----

    def _evict(self, num_tokens: int) -> None:
        """Evict for room on every rank; the lock-race fault looks at each of these."""
        engine = self.engine
        race = engine.faults.lock_race
        # Without the radix cache SGLang runs a chunk cache: no tree, no prefix eviction, no race.
        if race is not None and race.fired_at is None and not self.cfg.disable_radix_cache:
            usage = self.token_usage()
            rank = race.consider(usage, engine.iteration, self.cfg.tp_ranks)
            if rank is not None:
                engine._lock_race_dp = self.dp_rank
                node = self.fault_node = self._contended_node(rank)
                self.log_rank(
                    rank,
                    f"WARNING: radix cache eviction contended with a page lock on node {node} "
                    f"(token usage {usage:.2f}); retrying",
                )
        evicted = 0
        for i, info in enumerate(self.ranks):
            result = info.cache.evict(EvictParams(num_tokens=num_tokens))
            if i == 0:
                evicted = result.num_tokens_evicted
        self.evicted_tokens_total += evicted

    def _contended_node(self, tp_rank: int) -> int:
        index = self.local_index(tp_rank)
        for req in reversed(self.running):
            node = req.views[index].last_node
            if node is not None and node.lock_ref > 0 and node.parent is not None:
                return node.id
        return self.ranks[index].cache.root_node.id

    def _alloc_pages(self, num_pages: int) -> list[int] | None:
        need = num_pages * self.page_size
        pool = self.pool0
        if pool.available_size() < need:
            self._evict(need - pool.available_size())
            if pool.available_size() < need:
                return None
        pages = pool.alloc_pages(num_pages)
        for info in self.ranks[1:]:
            mirror = info.pool.alloc_pages(num_pages)
            if mirror != pages:
                raise RuntimeError(
                    f"TP rank {info.tp_rank} allocated pages {_first_pages(mirror)} "
                    f"where rank 0 got {_first_pages(pages)}: replicated ranks diverged"
                )
        return pages

    def _prefill_out_of_memory(self, tokens: int) -> None:
        """SGLang's alloc_paged_token_slots_extend on failure: the error on each rank, each rank's
        tree printed to stdout (here: the log, as a server run with `> log 2>&1` writes it), then
        the exception that ends the scheduler."""
        available, evictable = self.available(), self.evictable()
        message = (
            "Prefill out of memory. Try to lower your batch size.\n"
            f"Try to allocate {tokens} tokens.\n"
            f"Available tokens: {available + evictable} (available_size={available} + evictable_size={evictable})"
        )
        for info in self.ranks:
            self.log_rank(info.tp_rank, message)
            if self.engine._emit_fn is not None:
                for line in info.cache.printed_lines():
                    self.engine._emit_fn(line)
        raise RuntimeError(message)

    def _release(self, req: _Req, *, insert: bool) -> None:
        if insert and not self.cfg.disable_radix_cache:
            # The tree takes the request's whole pages of KV: their output tokens need values.
            held = req.kv_len // self.page_size * self.page_size
            self._make_outputs(req, held - len(req.origin_input_ids))
        for info, view in zip(self.ranks, req.views):
            info.cache.cache_finished_req(view, is_insert=insert)

    def _reset_views(self, req: _Req) -> None:
        for info, view in zip(self.ranks, req.views):
            view.kv_indices = []
            view.cache_protected_len = 0
            view.last_node = info.cache.root_node
            view.lock = None

    # ----- one iteration -----

    def step(self) -> bool:
        """Run one prefill or decode batch; False when there was nothing to do."""
        self._drop_aborted_waiting()
        batch = self._get_new_batch_prefill()
        if batch:
            self._run_prefill(batch)
            return True
        if self.running:
            self._run_decode()
            return True
        return False

    def _drop_aborted_waiting(self) -> None:
        if any(map(_ABORTED, self.waiting)):
            for req in [r for r in self.waiting if r.aborted]:
                self.waiting.remove(req)
                self.engine._resolve(req, "abort")

    def _reserved_tokens(self) -> int:
        """Sum of ceil(min(tokens left to generate, CLIP_MAX_NEW_TOKENS) * ratio) over the running
        batch: every prefill iteration reads it, most of them with only prefills in between."""
        if self._reserved is None:
            self._reserved = self._reserved_by(self.running)
        return self._reserved

    def _reserved_by(self, reqs: list[_Req]) -> int:
        """The reserved tokens of ``reqs`` at the current ratio. (A plain loop: chained maps over
        getters and operators cost three times as much on a full batch, more on one request.)"""
        ratio = self.new_token_ratio
        total = 0
        for req in reqs:
            left = req.max_new_tokens - len(req.output_ids)
            total += math.ceil((left if left < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS) * ratio)
        return total

    def _get_new_batch_prefill(self) -> list[_Req]:
        cfg = self.cfg
        if not self.waiting or len(self.running) >= cfg.max_running_requests:
            return []
        page_size = self.page_size
        rem_total = self.pool0.available_size() + self.cache0.evictable_size() - self._reserved_tokens()
        rem_input = cfg.max_prefill_tokens
        batch: list[_Req] = []
        # (extra_key, matched length, the page after it) -> the tokens of the batch's requests
        # about to compute that page after that prefix length.
        batch_pages: dict[tuple[str | None, int, tuple[int, ...]], list[list[int]]] = {}
        keep: list[_Req] = []
        blocked = False
        for req in self.waiting:
            if blocked or len(self.running) + len(batch) >= cfg.max_running_requests:
                keep.append(req)
                continue
            tokens = req.origin_input_ids + req.output_ids if req.output_ids else req.origin_input_ids
            n = len(tokens)
            # At least one token must be computed to get logits: match at most n - 1 (whole pages:
            # the cache would cut the key to them). SGLANG_RADIX_FORCE_MISS: reuse off, the tree's
            # inserts, locks and evictions on.
            wanted = [] if cfg.force_miss else tokens[: (n - 1) // page_size * page_size]
            params = MatchPrefixParams(key=RadixKey(wanted, req.extra_key))  # read, not kept, by each rank
            if len(self.ranks) == 1:
                matches = [self.cache0.match_prefix(params)]
            else:
                matches = [info.cache.match_prefix(params) for info in self.ranks]
            m = len(matches[0].device_indices)
            # In-batch prefix sharing: a request whose next page another request of this batch
            # is about to compute waits one iteration and then matches it from the tree.
            if not cfg.disable_radix_cache and not cfg.force_miss and m + page_size <= n - 1:
                first_new_page = (req.extra_key, m, tuple(tokens[m : m + page_size]))
                computing = batch_pages.get(first_new_page)
                if computing and any(other[:m] == tokens[:m] for other in computing):
                    keep.append(req)
                    continue
            else:
                first_new_page = None
            new_pages = -(-n // page_size) - m // page_size
            remaining_new = min(req.max_new_tokens - len(req.output_ids), CLIP_MAX_NEW_TOKENS)
            cost = new_pages * page_size + remaining_new
            lone = not self.running and not batch
            if not lone and (cost > rem_total or n - m > rem_input):
                blocked = True  # FCFS: nothing overtakes a request that does not fit
                keep.append(req)
                continue
            if not self._admit(req, matches, m, new_pages):
                blocked = True
                keep.append(req)
                continue
            rem_total -= cost
            rem_input -= n - m
            if first_new_page is not None:
                batch_pages.setdefault(first_new_page, []).append(tokens)
            batch.append(req)
        self.waiting = keep
        if batch:
            self._log_prefill(batch)
        return batch

    def _admit(self, req: _Req, matches: list[MatchResult], m: int, new_pages: int) -> bool:
        for info, view, match in zip(self.ranks, req.views, matches):
            view.last_node = match.last_device_node
            view.lock = info.cache.lock(match.last_device_node)
            view.kv_indices = match.device_indices  # a list made for this match alone
            view.cache_protected_len = m
        pages = self._alloc_pages(new_pages)
        if pages is None and self.available() + self.evictable() >= new_pages * self.page_size:
            # The tree counts as evictable more than an eviction could free (a lock_ref driven
            # below zero): SGLang's admission trusts that size, and its allocation fails.
            self._prefill_out_of_memory(new_pages * self.page_size)
        if pages is None:
            for info, view in zip(self.ranks, req.views):
                info.cache.unlock(view.lock)
            self._reset_views(req)
            return False
        n = len(req.origin_input_ids) + len(req.output_ids)
        slots = self.pool0.page_slots(pages)  # a list of its own: cut in place, not copied again
        del slots[n - m :]
        for view in req.views:
            view.kv_indices.extend(slots)
        if req.cached_tokens is None:
            req.cached_tokens = m
            self.cached_tokens_total += m
            self.prompt_tokens_total += len(req.origin_input_ids)
        req.extend_from = m
        if req.stale_pages or self.engine.faults.block_boundary is not None:
            self._maybe_stale_read(req, m)
        return True

    def _maybe_stale_read(self, req: _Req, prefix_len: int) -> None:
        fault = self.engine.faults.block_boundary
        req.stale_pages = {}
        if fault is None or prefix_len == 0:
            return
        page = self.pool0.page_of(req.views[0].kv_indices[0])
        age = time.monotonic() - self.pool0.page_alloc_time[page]
        if fault.applies(prefix_len, self.page_size, age):
            substitute = fault.pick(page, self.pool0.written_pages)
            if substitute is not None:
                req.stale_pages[0] = substitute

    def _read_slots(self, req: _Req, upto: int) -> list[int]:
        slots = req.views[0].kv_indices[:upto]
        page_size = self.page_size
        for page_index, substitute in req.stale_pages.items():
            base = page_index * page_size
            for i in range(page_size):
                if base + i < len(slots):
                    slots[base + i] = substitute * page_size + i
        return slots

    def _run_prefill(self, batch: list[_Req]) -> None:
        engine = self.engine
        joined = len(self.running)
        for req in batch:
            done = len(req.output_ids) >= req.max_new_tokens  # req.done, read without the property
            if self.pool0.store_contents:
                req.digest = self._read_prompt(req, req.origin_input_ids + req.output_ids)
                if not done:
                    req.output_ids.append(engine._next_token(req, req.kv_len))
            elif not done:
                self._add_output(req)
            done = len(req.output_ids) >= req.max_new_tokens
            if done or req.aborted:
                self._finish(req, "abort" if req.aborted and not done else "length")
            else:
                for info, view in zip(self.ranks, req.views):
                    info.cache.checkpoint(view, up_to=len(view.kv_indices))
                self.running.append(req)
        if self._reserved is not None:
            self._reserved += self._reserved_by(self.running[joined:])

    def _read_prompt(self, req: _Req, tokens: list[int]) -> int:
        """Write the KV the prefill computes and read the whole prompt's back, as attention does."""
        pool = self.pool0
        kv = req.views[0].kv_indices
        start = req.extend_from
        pool.write(kv[start:], tokens[start:], start)
        return self.engine.model.read_kv(0, pool, self._read_slots(req, len(kv)))

    def _add_output(self, req: _Req) -> None:
        """The request's next output token, without KV contents: its value made now, or where
        something reads it when no result carries output ids (Engine's result_outputs)."""
        req.output_ids.append(_UNMADE)
        if self.engine.result_outputs:
            self._make_outputs(req, len(req.output_ids))

    def _make_outputs(self, req: _Req, count: int) -> None:
        """Give the request's first ``count`` output tokens their values. Without KV contents a
        request reads back what it wrote, so each token is the model's function of the prompt
        and the tokens before it, whenever it is made: the prompt's digest (from the cached
        prefix's, as the first prefill matched it), then a token and its fold at a time."""
        if count <= req.made or self.pool0.store_contents:
            return  # with contents every value is made as its token is, from the KV read back
        engine = self.engine
        fold_token = engine.model.fold_token
        out = req.output_ids
        length = len(req.origin_input_ids)
        if req.made == 0:
            req.digest = self.prompt_folds.fold(req.origin_input_ids, req.extend_from)
        for k in range(req.made, count):
            out[k] = engine._next_token(req, length + k)
            req.digest = fold_token(req.digest, out[k], length + k)
        req.made = count

    def _decode_pages_needed(self, reqs: list[_Req]) -> int:
        """How many of ``reqs`` start a new page with their next token (every decode step asks)."""
        page_size = self.page_size
        count = 0
        for req in reqs:
            if len(req.lead.kv_indices) % page_size == 0:
                count += 1
        return count

    def _run_decode(self) -> None:
        self._reserved = None
        for req in [r for r in self.running if r.aborted]:
            self.running.remove(req)
            self._finish(req, "abort")
        if not self.running:
            return
        need = self._decode_pages_needed(self.running) * self.page_size
        if self.available() < need:
            self._evict(need - self.available())
        if self.available() < need:
            self._retract()
        else:
            self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        if not self.running:
            return
        engine = self.engine
        pool = self.pool0
        contents = pool.store_contents
        make_now = engine.result_outputs
        page_size = self.page_size
        finished: list[_Req] = []
        model = engine.model
        mirrored = len(self.ranks) > 1
        for req in self.running:
            row = req.lead.kv_indices
            position = len(row)
            if position % page_size == 0:
                pages = self._alloc_pages(1)
                if pages is None:  # cannot happen after _retract; fail loudly like SGLang
                    raise RuntimeError("Decode out of memory. Try to lower your batch size.")
                slot = pages[0] * page_size
            else:
                slot = row[-1] + 1
            row.append(slot)
            if mirrored:
                for view in req.mirrors:
                    view.kv_indices.append(slot)
            output_ids = req.output_ids
            if contents:
                pool.write((slot,), (output_ids[-1],), position)
                req.digest = model.read_kv(req.digest, pool, (slot,))
                output_ids.append(engine._next_token(req, position + 1))
            else:
                output_ids.append(_UNMADE)  # self._add_output(req), inline: a step per token
                if make_now:
                    self._make_outputs(req, len(output_ids))
            if len(output_ids) >= req.max_new_tokens:  # req.done
                finished.append(req)
        self.num_generated_tokens += len(self.running)
        self.forward_ct_decode += 1
        if self.forward_ct_decode % self.cfg.decode_log_interval == 0:
            self._log_decode()
        for req in finished:
            self.running.remove(req)
            self._finish(req, "length")

    def _retract(self) -> None:
        """SGLang's retract_decode: free the least-advanced requests until one step fits."""
        old_available = self.available()
        old_ratio = self.new_token_ratio
        order = sorted(
            self.running,
            key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)),
            reverse=True,
        )
        retracted: list[_Req] = []
        first = True
        while first or self.available() < self._decode_pages_needed(order) * self.page_size:
            if len(order) == 1:
                break
            first = False
            victim = order.pop()
            self._make_outputs(victim, len(victim.output_ids))  # its next admission matches them
            self._release(victim, insert=False)
            self._reset_views(victim)
            victim.stale_pages = {}
            retracted.append(victim)
            need = self._decode_pages_needed(order) * self.page_size
            if self.available() < need:
                self._evict(need - self.available())
        aborted: list[_Req] = []
        if len(order) <= 1 and self.available() < self._decode_pages_needed(order) * self.page_size:
            last = order.pop()
            aborted.append(last)
            self.log_all(f"retract_decode: aborted last request {last.rid} due to OOM")
        self.running = [r for r in self.running if r in order]
        total_decoded = sum(len(r.output_ids) for r in self.running)
        total_max_new = sum(r.max_new_tokens for r in self.running)
        self.new_token_ratio = min(
            1.0, (total_decoded + RETRACT_DECODE_STEPS * len(self.running)) / (total_max_new + 1)
        )
        self.num_retracted_reqs += len(retracted)
        gained = self.available() - old_available
        self.log_all(
            "KV cache pool is full. Retract requests. "
            f"#retracted_reqs: {len(retracted)}, #new_tokens_gained: {gained}, "
            f"#new_token_ratio: {old_ratio:.4f} -> {self.new_token_ratio:.4f}"
        )
        self.waiting.extend(retracted)
        for req in aborted:
            self._finish(req, "abort")

    def _finish(self, req: _Req, reason: str) -> None:
        engine = self.engine
        leak = engine.faults.leak
        if leak is not None and req.kv_len > req.views[0].cache_protected_len and leak.fires():
            # Drop the last page of the request's private KV from its row: it is never freed.
            page_size = self.page_size
            start = (req.kv_len - 1) // page_size * page_size
            start = max(start, req.views[0].cache_protected_len)
            for view in req.views:
                del view.kv_indices[start:]
            leak.leaked_tokens += page_size
        self._release(req, insert=True)
        double = engine.faults.double_unlock
        if double is not None and not self.cfg.disable_radix_cache and double.fires():
            double.count += 1
            for info, view in zip(self.ranks, req.views):
                if view.last_node is not None:  # always set: a finishing request was admitted
                    info.cache.dec_lock_ref(view.last_node)
                    if view.last_node.lock_ref < 0:  # unlocked once too often: what the fault breaks
                        self.fault_node = view.last_node.id
        engine._resolve(req, reason)

    # ----- idle -----

    def fully_idle(self) -> bool:
        return not self.waiting and not self.running

    def on_idle(self) -> None:
        """SGLang's idle housekeeping: the memory check, then the token ratio reset."""
        if not self.fully_idle():
            return
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self._reserved = None
        leak = self.engine.faults.leak
        if leak is None:
            return
        total, available = self.capacity, self.available()
        evictable, protected = self.evictable(), self.protected()
        if available + evictable + protected == total:
            return
        message = leak.message(total=total, available=available, evictable=evictable, protected=protected)
        if leak.strict:
            raise _StrictLeakError(message, self.dp_rank)
        if leak.warnings % LEAK_LOG_INTERVAL == 0:
            self.log_all(message)
        leak.warnings += 1

    # ----- stats lines -----

    def _log_prefill(self, batch: list[_Req]) -> None:
        now = time.perf_counter()
        gap = now - self.last_prefill_tic
        self.last_prefill_tic = now
        if not self.engine.writes_lines():
            return
        new_tokens = sum(len(r.origin_input_ids) + len(r.output_ids) - r.extend_from for r in batch)
        cached = sum(r.extend_from for r in batch)
        throughput = new_tokens / gap if gap > 0 else 0.0
        self.log_batch_line(
            f"Prefill batch, #new-seq: {len(batch)}, #new-token: {new_tokens}, "
            f"#cached-token: {cached}, token usage: {self.token_usage():.2f}, "
            f"#running-req: {len(self.running)}, #queue-req: {len(self.waiting)}, "
            f"#pending-token: 0, {self.cfg.device} graph: False, input throughput (token/s): {throughput:.2f}",
        )

    def _log_decode(self) -> None:
        now = time.perf_counter()
        gap = now - self.last_decode_tic
        self.last_decode_tic = now
        self.gen_throughput = self.num_generated_tokens / gap if gap > 0 else 0.0
        self.num_generated_tokens = 0
        if not self.engine.writes_lines():
            return
        self.log_batch_line(
            f"Decode batch, #running-req: {len(self.running)}, #token: {self.num_used()}, "
            f"token usage: {self.token_usage():.2f}, {self.cfg.device} graph: {self.cfg.device == 'cuda'}, "
            f"gen throughput (token/s): {self.gen_throughput:.2f}, #queue-req: {len(self.waiting)}",
        )

    def startup_lines(self) -> None:
        cfg = self.cfg
        kv_gb = self.capacity * _KV_BYTES_PER_TOKEN / 1e9
        for info in self.ranks:
            self.engine._emit(f"Load weight begin. avail mem={_GPU_MEM_GB:.2f} GB", info.prefix)
            self.engine._emit(
                "Load weight end. elapsed=0.01 s, type=SimForCausalLM, "
                f"avail mem={_GPU_MEM_GB - 1:.2f} GB, mem usage=1.00 GB.",
                info.prefix,
            )
            self.engine._emit(
                f"KV Cache is allocated. #tokens: {self.capacity}, "
                f"K size: {kv_gb:.2f} GB, V size: {kv_gb:.2f} GB",
                info.prefix,
            )
            self.engine._emit(f"Memory pool end. avail mem={_GPU_MEM_GB - 1 - 2 * kv_gb:.2f} GB", info.prefix)
        self.log_rank(
            0,
            f"max_total_num_tokens={self.capacity}, chunked_prefill_size=8192, "
            f"max_prefill_tokens={cfg.max_prefill_tokens}, "
            f"max_running_requests={cfg.max_running_requests}, context_len={self.capacity}, "
            f"available_gpu_mem={_GPU_MEM_GB - 1 - 2 * kv_gb:.2f} GB",
        )

    def flush(self) -> None:
        for info in self.ranks:
            info.cache.reset()
            info.pool.clear()
        self.forward_ct_decode = 0
        self.num_generated_tokens = 0


class Engine:
    """An SGLang-shaped server core: queue, continuous batching, radix cache, faults, logs."""

    def __init__(
        self,
        config: SimConfig,
        emit: Callable[[str], None] | None,
        *,
        wall_clock: Callable[[], float] = time.time,
        kv_contents: bool = True,
        result_outputs: bool = True,
    ) -> None:
        """``emit`` writes each log line (None: the engine makes none, as an in-process driver
        with no reader wants). ``kv_contents=False``: the pools keep no contents and the model
        folds the tokens each request writes, which is what it would read back while no fault
        makes a slot hold something else (so a config with faults needs the contents).
        ``result_outputs=False`` (without contents only): the results carry no output ids, for
        a driver that counts tokens only; an output token's value is then made only where the
        tree takes it or a retracted request will match it, and until then a request's own
        lists (its views') hold _UNMADE in its place."""
        config.validate()
        if config.faults and not kv_contents:
            raise ValueError("faults read what a KV slot held before: they need kv_contents")
        if kv_contents and not result_outputs:
            raise ValueError("with kv_contents the model reads every token as it is made: result_outputs stays on")
        self.kv_contents = kv_contents
        self.result_outputs = result_outputs
        self.config = config
        self._emit_fn = emit
        self._wall_clock = wall_clock
        self.faults = FaultSet(config.faults)
        self.tokenizer = SimTokenizer()
        self.model = SimModel()
        self.dead_reason: str | None = None
        self.on_safe_point: list[Callable[[], None]] = []
        # Called with the exception's line when the scheduler dies, before its lines are written:
        # SGLang's exception handler is where the instrument's flight recorder writes.
        self.on_death: list[Callable[[str], None]] = []
        # Called with each `Prefill batch` / `Decode batch` line once it is written: SGLang's
        # scheduler sets its /metrics gauges there (radixtop.sim.metrics.StatsLatch subscribes).
        self.on_batch_line: list[Callable[[str], None]] = []
        self.safe_point_errors = 0
        self.iteration = 0
        self._schedulers = [_Scheduler(self, dp) for dp in range(config.dp_size)]
        self._next_dp = 0
        self._req_counter = 0
        self._wake: asyncio.Event | None = None
        self._running = False
        self._stopped = False
        self._stop_requested = False
        self._lock_race_dp = 0
        self._stepping: _Scheduler | None = None  # the group being stepped, named if it raises
        # Rank -> the node its death concerns, where a fault names one (set before on_death runs).
        self.dead_nodes: dict[int, int] = {}

    # ----- public surface -----

    @property
    def caches(self) -> dict[int, RadixCache]:
        return {info.rank: info.cache for s in self._schedulers for info in s.ranks}

    @property
    def ranks(self) -> list[RankInfo]:
        return [info for s in self._schedulers for info in s.ranks]

    @property
    def max_total_num_tokens(self) -> int:
        return self._schedulers[0].capacity

    def rank_requests(self, rank: int) -> RankRequests:
        """That rank's requests as SGLang's scheduler names them (for the instrument's holders)."""
        info = next(i for i in self.ranks if i.rank == rank)
        return RankRequests(self._schedulers[info.dp_rank], info.tp_rank)

    def ready_line(self) -> str:
        return format_line(
            "The server is fired up and ready to roll!",
            when=self._wall_clock(),
            log_ms=self.config.log_ms,
        )

    def emit_ready(self) -> None:
        """Write SGLang's ready line (the main process writes it once the HTTP server listens)."""
        if self._emit_fn is not None:
            self._emit_fn(self.ready_line())

    async def run(self) -> None:
        if self._running or self._stopped:
            raise RuntimeError("Engine.run() can be called once")
        self._running = True
        self._wake = asyncio.Event()
        for sched in self._schedulers:
            sched.startup_lines()
        try:
            while not self._stop_requested:
                if self.iterate():
                    await asyncio.sleep(self.config.step_time_s)
                else:
                    await self._idle_wait()
        except Exception as exc:  # noqa: BLE001 - any scheduler exception kills the server, as SGLang
            self._die(exc, self._stepping)
        finally:
            self._running = False
            self._stopped = True
            reason = self.dead_reason or "engine stopped"
            for sched in self._schedulers:
                for req in sched.waiting + sched.running:
                    if req.aborted:
                        req.future.cancel()  # nobody awaits it any more
                    elif not req.future.done():
                        req.future.set_exception(EngineDead(reason))
                sched.waiting.clear()
                sched.running.clear()
                sched._reserved = None

    def iterate(self) -> bool:
        """One scheduler loop iteration (a batch per DP group, then the safe point; idle
        housekeeping when no group had work). False when there was nothing to run. ``run`` calls
        it between sleeps; an in-process driver (``radixtop.sim.offline``) calls it on its own clock."""
        self.iteration += 1
        race = self.faults.lock_race
        if race is not None and race.due(self.iteration):
            raise _LockRaceFired(self._lock_race_dp, race.rank or 0)
        worked = False
        for sched in self._schedulers:
            self._stepping = sched
            worked = sched.step() or worked
        self._stepping = None
        if self.on_safe_point:
            self._safe_point()
        if not worked:
            for sched in self._schedulers:
                self._stepping = sched
                sched.on_idle()
            self._stepping = None
        return worked

    def stop(self) -> None:
        self._stop_requested = True
        if self._wake is not None:
            self._wake.set()

    async def generate(
        self,
        input_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        rid: str | None = None,
        extra_key: str | None = None,
    ) -> GenerateResult:
        future: asyncio.Future[GenerateResult] = asyncio.get_running_loop().create_future()
        req = self.submit(input_ids, max_new_tokens=max_new_tokens, temperature=temperature, rid=rid,
                          future=future, extra_key=extra_key)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # The caller went away (client disconnect): abort as SGLang does, freeing its KV.
            req.aborted = True
            raise

    def submit(
        self,
        input_ids: list[int],
        *,
        max_new_tokens: int,
        future: Any,
        temperature: float = 0.0,
        rid: str | None = None,
        extra_key: str | None = None,
        ids_checked: bool = False,
        keep_ids: bool = False,
    ) -> _Req:
        """Queue one request; its GenerateResult is set on ``future`` (an asyncio or a
        concurrent.futures Future: the in-process driver has no event loop). ``ids_checked``: the
        caller made the ids from the vocabulary or passed them through :func:`check_token_ids`
        (the engine still checks the rest of the request). ``keep_ids``: a list ``input_ids`` that
        nobody changes while the engine runs is kept as it is, not copied (the engine never
        changes a prompt)."""
        self._validate(input_ids, max_new_tokens, temperature, ids_checked=ids_checked)
        if not (keep_ids and type(input_ids) is list):
            input_ids = list(input_ids)
        if self.dead_reason is not None:
            raise EngineDead(self.dead_reason)
        if self._stopped or self._stop_requested:
            raise EngineDead("engine stopped")
        self._req_counter += 1
        rid = rid or f"sim-{self._req_counter}"
        rng = None
        if temperature > 0:
            if self.config.enable_deterministic_inference:
                rng = random.Random(hash(tuple(input_ids)) ^ max_new_tokens)
            else:
                rng = random.Random(self._req_counter * 0x9E3779B1)
        sched = self._schedulers[self._next_dp]
        self._next_dp = (self._next_dp + 1) % len(self._schedulers)
        roots = list(map(_RANK_ROOT, sched.ranks))  # read now: a flush gives a tree a new root
        req = _Req(rid, input_ids, max_new_tokens, temperature, future, roots, rng, extra_key)
        sched.waiting.append(req)
        if self._wake is not None:
            self._wake.set()
        return req

    def flush_cache(self) -> bool:
        busy = [s for s in self._schedulers if not s.fully_idle()]
        if busy:
            for sched in self._schedulers:
                sched.log_all(
                    "Cache not flushed because there are pending requests. "
                    f"#queue-req: {len(sched.waiting)}, #running-req: {len(sched.running)}"
                )
            return False
        for sched in self._schedulers:
            sched.flush()
            sched.log_rank(sched.ranks[0].tp_rank, "Cache flushed successfully!")  # the node's first rank
        return True

    def pool_usage(self) -> tuple[float, int]:
        """The token usage and the tokens evicted so far, as :meth:`stats` says them: for a caller
        that asks after every iteration."""
        s = self._schedulers
        if len(s) == 1:
            return s[0].token_usage(), s[0].evicted_tokens_total
        capacity = sum(x.capacity for x in s)
        used = sum(x.num_used() for x in s)
        return used / capacity, sum(x.evicted_tokens_total for x in s)

    def stats(self) -> EngineStats:
        s = self._schedulers
        capacity = sum(x.capacity for x in s)
        available = sum(x.available() for x in s)
        evictable = sum(x.evictable() for x in s)
        prompt_total = sum(x.prompt_tokens_total for x in s)
        usage, _ = self.pool_usage()
        return EngineStats(
            token_usage=usage,
            num_running_reqs=sum(len(x.running) for x in s),
            num_queue_reqs=sum(len(x.waiting) for x in s),
            cache_hit_rate=(sum(x.cached_tokens_total for x in s) / prompt_total) if prompt_total else 0.0,
            max_total_num_tokens=capacity,
            available_tokens=available,
            evictable_tokens=evictable,
            protected_tokens=sum(x.protected() for x in s),
            evicted_tokens_total=sum(x.evicted_tokens_total for x in s),
            num_retracted_reqs=sum(x.num_retracted_reqs for x in s),
            gen_throughput=sum(x.gen_throughput for x in s),
        )

    # ----- internals -----

    def writes_lines(self) -> bool:
        """Whether a log line has a reader: the emitter, or a batch line's subscribers."""
        return self._emit_fn is not None or bool(self.on_batch_line)

    def _emit(self, message: str, prefix: str = "") -> None:
        if self._emit_fn is None:
            return
        self._emit_fn(format_line(message, when=self._wall_clock(), prefix=prefix, log_ms=self.config.log_ms))

    def _validate(self, input_ids: Any, max_new_tokens: Any, temperature: Any, *, ids_checked: bool) -> None:
        if not isinstance(input_ids, (list, tuple)):
            raise ValueError(f"input_ids must be a list of token ids, got {type(input_ids).__name__}")
        if len(input_ids) == 0:
            raise ValueError("input_ids is empty: send at least one token")
        if not ids_checked:
            check_token_ids(input_ids)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise ValueError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
        total = len(input_ids) + max_new_tokens
        capacity = self.max_total_num_tokens
        if total > capacity:
            raise ValueError(
                f"prompt ({len(input_ids)} tokens) + max_new_tokens ({max_new_tokens}) = {total} "
                f"tokens exceeds the KV pool ({capacity} tokens); shorten the prompt or lower max_new_tokens"
            )

    def _next_token(self, req: _Req, position: int) -> int:
        noise = req.rng.getrandbits(62) if req.rng is not None else 0
        return self.model.next_token(req.digest, position, req.origin_input_ids[-1], noise)

    def _resolve(self, req: _Req, reason: str) -> None:
        if req.future.done():
            return
        req.future.set_result(
            GenerateResult(  # output_ids, prompt_tokens, cached_tokens, completion_tokens, finish_reason, rid
                list(req.output_ids) if self.result_outputs else [],
                len(req.origin_input_ids),
                req.cached_tokens or 0,
                len(req.output_ids),
                reason,
                req.rid,
            )
        )

    def _safe_point(self) -> None:
        for hook in list(self.on_safe_point):
            try:
                hook()
            except Exception:  # noqa: BLE001 - a broken observer must not kill the scheduler
                self.safe_point_errors += 1
                log.exception("on_safe_point hook failed")

    async def _idle_wait(self) -> None:
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(IDLE_POLL_S):
                await self._wake.wait()
        self._wake.clear()

    def _die(self, exc: BaseException, stepping: _Scheduler | None) -> None:
        if isinstance(exc, _LockRaceFired):
            sched = self._schedulers[exc.dp_rank]
            tp_rank = exc.tp_rank
            text = lock_race_traceback()
            self.dead_reason = f"RadixCacheError: {LOCK_RACE_MESSAGE}"
        elif isinstance(exc, _StrictLeakError):
            sched = self._schedulers[exc.dp_rank]
            tp_rank = sched.ranks[0].tp_rank  # the node's first rank (TP0 on a single node)
            text = leak_traceback(str(exc))
            self.dead_reason = f"ValueError: {exc}"
        else:
            sched = stepping or self._schedulers[0]
            tp_rank = sched.ranks[0].tp_rank
            text = "".join(traceback.format_exception(exc))
            self.dead_reason = f"{type(exc).__name__}: {exc}"
        if sched.fault_node is not None:
            self.dead_nodes = {info.rank: sched.fault_node for info in sched.ranks}
        for hook in list(self.on_death):
            try:
                hook(self.dead_reason)
            except Exception:  # noqa: BLE001 - an observer must not change how the server dies
                log.exception("on_death hook failed")
        sched.log_rank(tp_rank, f"Scheduler hit an exception: {text.rstrip()}")
        # The failing child sends its parent SIGQUIT; the parent's handler says so (no rank: it is
        # the tokenizer manager's line) and takes the server down (radixtop.sim.cli).
        self._emit(SIGQUIT_LINE, "")
