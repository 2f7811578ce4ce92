"""Fault injection for the simulator: the two seed incidents and two accounting bugs.

A fault is named by a :class:`FaultSpec` (``name``, ``seed``, ``params``); several may be active at
once. Every random choice comes from a ``random.Random`` seeded by the spec, so the same seed and
the same sequence of scheduler decisions give the same behaviour.

``lock-race`` (seed 000, ``RadixCacheError: Failed to lock memory page during dynamic prefix eviction``)
    Considered at every eviction the scheduler makes to find room (prefill admission or decode),
    and only while token usage (SGLang's: used / capacity, evictable counted as free) is at or
    above ``threshold`` (default 0.90). Each such eviction fires with ``probability`` (default
    0.5). Firing logs a WARNING on the initiating rank (``radix cache eviction contended with a
    page lock on node N (token usage 0.93); retrying``); ``delay_iters`` scheduler iterations later
    (default 3) that rank raises the RadixCacheError: ``Scheduler hit an exception: Traceback ...``,
    then the parent logs ``SIGQUIT received. signum=None, frame=None. It usually means one child
    failed.`` and the engine dies. Under bounded pressure (usage below the threshold) it never
    fires, which is what a confirmation run with lower ``--max-running-requests`` shows. The
    initiating rank is drawn by the seed from the TP ranks the engine runs (a node's share when
    the group spans nodes), unless ``rank`` names one of them.

``block-boundary`` (SGLang issue #22819)
    A request whose matched cached prefix is exactly one page (prefix_len == page_size) and that
    is admitted within ``window_ms`` (default 100 ms) of that page's allocation reads the page's
    slots with the contents of another page: one chosen from the pages ever written, by the seed
    and a per-engine counter, so the corruption differs from one replay to the next while each
    variant is internally consistent. Requests matching 0 or several pages, or matching an old
    page, are untouched; with ``disable_radix_cache`` nothing is matched and it never fires. It
    works for every page size, 1 included (then "one page" is one token).

``leak``
    With ``probability`` (default 1.0) per finished request, the last page of its private KV is
    dropped from its row instead of being freed: real slots leak. The idle memory check (run when
    no request is running or queued) then finds available + evictable + protected != total and
    logs SGLang 0.5.23's ``pool memory leak detected! [full] total=..., available=...,
    evictable=..., protected=..., session_held=0, uncached=0`` (``style="legacy"`` writes the
    0.5.5 ``token_to_kv_pool_allocator memory leak detected! ...`` wording). As SGLang's
    ``raise_error_or_warn``, the line is logged on the first failed check and every 1,000th after;
    ``strict=True`` (0.5.23's default SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE) raises instead
    and the scheduler dies with a ValueError traceback.

``double-unlock``
    With ``probability`` (default 0.1) per finished request, ``dec_lock_ref`` is called a second
    time on the node the request held, driving lock_ref below zero along the path, silently, as
    legacy SGLang does. What follows is left to happen: a protected prefix becomes evictable under
    a live request, the tree counts as evictable tokens no eviction can free, and a prefill's
    allocation fails as SGLang's does: ``Prefill out of memory`` on every rank, each rank's tree
    printed into the log (``pretty_print``), and the scheduler dies.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FAULTS",
    "BlockBoundaryFault",
    "DoubleUnlockFault",
    "FaultSet",
    "FaultSpec",
    "LeakFault",
    "LockRaceFault",
    "LOCK_RACE_MESSAGE",
    "leak_traceback",
    "lock_race_traceback",
]

LOCK_RACE_MESSAGE = "Failed to lock memory page during dynamic prefix eviction"

# name -> {param: (type, default)}
FAULTS: dict[str, dict[str, tuple[type, Any]]] = {
    "lock-race": {
        "threshold": (float, 0.90),
        "probability": (float, 0.5),
        "delay_iters": (int, 3),
        "rank": (int, None),  # the initiating TP rank; None: drawn by the seed
    },
    "block-boundary": {"window_ms": (float, 100.0)},
    "leak": {"probability": (float, 1.0), "strict": (bool, False), "style": (str, "0.5.23")},
    "double-unlock": {"probability": (float, 0.1)},
}


@dataclass(frozen=True)
class FaultSpec:
    name: str
    seed: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """``name`` or ``name:key=value,key=value`` (``seed`` is one of the keys), as on a command line."""
        name, _, rest = text.strip().partition(":")
        name = name.strip()
        seed = 0
        params: dict[str, Any] = {}
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq:
                raise ValueError(f"fault {text!r}: expected key=value, got {item!r}")
            key = key.strip()
            if key == "seed":
                try:
                    seed = int(value)
                except ValueError:
                    raise ValueError(f"fault {text!r}: seed must be an integer, got {value!r}") from None
            else:
                params[key] = value.strip()
        spec = cls(name, seed, params)
        _validate(spec)
        return spec


def _coerce(spec: FaultSpec, key: str, kind: type, value: Any) -> Any:
    try:
        if kind is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"fault {spec.name!r}: parameter {key!r} must be {kind.__name__}, got {value!r}"
        ) from None


def _validate(spec: FaultSpec) -> dict[str, Any]:
    if spec.name not in FAULTS:
        raise ValueError(f"unknown fault {spec.name!r}; known faults: {', '.join(FAULTS)}")
    known = FAULTS[spec.name]
    unknown = sorted(set(spec.params) - set(known))
    if unknown:
        raise ValueError(
            f"fault {spec.name!r}: unknown parameter(s) {', '.join(unknown)}; "
            f"known: {', '.join(known) or 'none'}"
        )
    values = {k: default for k, (_, default) in known.items()}
    for key, raw in spec.params.items():
        values[key] = _coerce(spec, key, known[key][0], raw)
    for key in ("probability", "threshold"):
        if key in values and not 0.0 <= values[key] <= 1.0:
            raise ValueError(f"fault {spec.name!r}: {key} must be within [0, 1], got {values[key]}")
    if values.get("delay_iters", 0) < 0 or values.get("window_ms", 0) < 0:
        raise ValueError(f"fault {spec.name!r}: delay_iters and window_ms must be >= 0")
    if values.get("rank") is not None and values["rank"] < 0:
        raise ValueError(f"fault {spec.name!r}: rank must be a TP rank (>= 0), got {values['rank']}")
    if spec.name == "leak" and values["style"] not in ("0.5.23", "legacy"):
        raise ValueError(f"fault 'leak': style must be '0.5.23' or 'legacy', got {values['style']!r}")
    return values


def _rng(spec: FaultSpec) -> random.Random:
    # A string seed is hashed with SHA-512 by random.Random: stable across runs and versions.
    return random.Random(f"{spec.name}:{spec.seed}")


class LockRaceFault:
    def __init__(self, spec: FaultSpec, values: dict[str, Any]) -> None:
        self.seed = spec.seed
        self.threshold: float = values["threshold"]
        self.probability: float = values["probability"]
        self.delay_iters: int = values["delay_iters"]
        self.named_rank: int | None = values["rank"]  # the engine checks it is one of its ranks
        self.rng = _rng(spec)
        self.fired_at: int | None = None  # scheduler iteration of the WARN
        self.rank: int | None = None  # initiating TP rank

    def consider(self, token_usage: float, iteration: int, tp_ranks: Sequence[int]) -> int | None:
        """Called at each eviction for room, with the TP ranks the engine runs; the initiating TP
        rank when the race happens now (only once), else None."""
        if self.fired_at is not None or token_usage < self.threshold:
            return None
        if self.rng.random() >= self.probability:
            return None
        self.fired_at = iteration
        if self.named_rank is not None:
            self.rank = self.named_rank
        else:  # the same draw as randrange(tp_size) on a single node: seeds keep their rank
            self.rank = tp_ranks[self.rng.randrange(len(tp_ranks))]
        return self.rank

    def due(self, iteration: int) -> bool:
        return self.fired_at is not None and iteration >= self.fired_at + self.delay_iters


class BlockBoundaryFault:
    def __init__(self, spec: FaultSpec, values: dict[str, Any]) -> None:
        self.seed = spec.seed
        self.window_s: float = values["window_ms"] / 1000.0
        self.counter = 0  # per engine: each firing picks a different page

    def applies(self, prefix_len: int, page_size: int, page_age_s: float) -> bool:
        return prefix_len == page_size and 0.0 <= page_age_s <= self.window_s

    def pick(self, true_page: int, written_pages: set[int]) -> int | None:
        """The page whose contents will be read instead of ``true_page``."""
        candidates = sorted(written_pages - {true_page})
        if not candidates:
            return None
        # Seeded start, then a stride through the candidates so successive firings differ.
        start = random.Random(f"block-boundary:{self.seed}").randrange(len(candidates))
        index = (start + self.counter * 7) % len(candidates)
        self.counter += 1
        return candidates[index]


class LeakFault:
    def __init__(self, spec: FaultSpec, values: dict[str, Any]) -> None:
        self.probability: float = values["probability"]
        self.strict: bool = values["strict"]
        self.style: str = values["style"]
        self.rng = _rng(spec)
        self.warnings = 0  # SGLang's count_memory_leak_warnings
        self.leaked_tokens = 0

    def fires(self) -> bool:
        return self.rng.random() < self.probability

    def message(self, *, total: int, available: int, evictable: int, protected: int) -> str:
        if self.style == "legacy":
            return (
                "token_to_kv_pool_allocator memory leak detected! "
                f"available_size={available}, evictable_size={evictable}, "
                f"protected_size={protected}, max_total_num_tokens={total}"
            )
        return (
            "pool memory leak detected! "
            f"[full] total={total}, available={available}, evictable={evictable}, "
            f"protected={protected}, session_held=0, uncached=0"
        )


class DoubleUnlockFault:
    def __init__(self, spec: FaultSpec, values: dict[str, Any]) -> None:
        self.probability: float = values["probability"]
        self.rng = _rng(spec)
        self.count = 0

    def fires(self) -> bool:
        return self.rng.random() < self.probability


class FaultSet:
    """The active faults of one engine, built (and validated) from its specs."""

    def __init__(self, specs: Sequence[FaultSpec]) -> None:
        self.lock_race: LockRaceFault | None = None
        self.block_boundary: BlockBoundaryFault | None = None
        self.leak: LeakFault | None = None
        self.double_unlock: DoubleUnlockFault | None = None
        seen: set[str] = set()
        for spec in specs:
            if not isinstance(spec, FaultSpec):
                raise ValueError(f"faults must be FaultSpec objects, got {type(spec).__name__}")
            values = _validate(spec)
            if spec.name in seen:
                raise ValueError(f"fault {spec.name!r} is given twice; give it once with all its parameters")
            seen.add(spec.name)
            if spec.name == "lock-race":
                self.lock_race = LockRaceFault(spec, values)
            elif spec.name == "block-boundary":
                self.block_boundary = BlockBoundaryFault(spec, values)
            elif spec.name == "leak":
                self.leak = LeakFault(spec, values)
            else:
                self.double_unlock = DoubleUnlockFault(spec, values)


_SITE = "/usr/local/lib/python3.12/dist-packages/sglang/srt"
_TORCH_CTX = "/usr/local/lib/python3.12/dist-packages/torch/utils/_contextlib.py"


def _traceback(frames: list[tuple[str, int, str, str]], final: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, lineno, func, code in frames:
        full = path if path.startswith("/") else f"{_SITE}/{path}"
        lines.append(f'  File "{full}", line {lineno}, in {func}')
        lines.append(f"    {code}")
    lines.append(final)
    return "\n".join(lines) + "\n"


_LOOP_FRAMES = [
    ("managers/scheduler.py", 6361, "run_scheduler_process", "scheduler.run_event_loop()"),
    ("managers/scheduler.py", 1482, "run_event_loop", "self.event_loop_normal()"),
    (_TORCH_CTX, 120, "decorate_context", "return func(*args, **kwargs)"),
]


def lock_race_traceback() -> str:
    """The traceback a scheduler would print for the lock race (SGLang 0.5.23's call path to evict)."""
    frames = _LOOP_FRAMES + [
        ("managers/scheduler.py", 1530, "event_loop_normal", "batch = self.get_next_batch_to_run()"),
        ("managers/scheduler.py", 2214, "get_next_batch_to_run", "new_batch = self.get_new_batch_prefill()"),
        ("managers/scheduler.py", 2398, "get_new_batch_prefill", "new_batch.prepare_for_extend()"),
        ("managers/schedule_batch.py", 1675, "prepare_for_extend", "out_cache_loc = alloc_for_extend(self)"),
        ("mem_cache/common.py", 512, "alloc_for_extend", "out_cache_loc = alloc_paged_token_slots_extend("),
        (
            "mem_cache/common.py",
            371,
            "alloc_paged_token_slots_extend",
            "evict_from_tree_cache(tree_cache, num_tokens)",
        ),
        (
            "mem_cache/common.py",
            318,
            "evict_from_tree_cache",
            "tree_cache.evict(EvictParams(num_tokens=num_tokens))",
        ),
        ("mem_cache/radix_cache.py", 571, "evict", "self._lock_page_for_eviction(x)"),
        (
            "mem_cache/radix_cache.py",
            618,
            "_lock_page_for_eviction",
            'raise RadixCacheError("Failed to lock memory page during dynamic prefix eviction")',
        ),
    ]
    return _traceback(frames, f"sglang.srt.mem_cache.radix_cache.RadixCacheError: {LOCK_RACE_MESSAGE}")


def leak_traceback(message: str) -> str:
    """The traceback of 0.5.23's strict idle memory check (SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1)."""
    frames = _LOOP_FRAMES + [
        ("managers/scheduler.py", 1561, "event_loop_normal", "self.on_idle()"),
        (
            "managers/scheduler.py",
            5296,
            "on_idle",
            'self.invariant_checker._report_leak("pool", "\\n".join(messages))',
        ),
        ("managers/scheduler_components/invariant_checker.py", 455, "_report_leak", "raise_error_or_warn("),
        ("utils/common.py", 5066, "raise_error_or_warn", "raise ValueError(message)"),
    ]
    return _traceback(frames, f"ValueError: {message}")
