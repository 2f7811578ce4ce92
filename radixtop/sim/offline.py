"""The simulator's engine driven in-process on a virtual clock: no server, no sleeping.

`radixtop sim` runs :meth:`Engine.iterate` and sleeps ``step_time_s`` of emulated GPU time after
each iteration that had work. Here the same iterations run back to back and the clock moves by
``step_time_s`` per working iteration; calls join the queue when the clock reaches their offsets,
and an idle engine jumps to the next arrival. Admission, batching, eviction and retraction are the
served simulator's own, so a trace gets the cached tokens a replay against ``radixtop sim`` with the
same flags gets, without HTTP's timing noise and as fast as the CPU allows.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from radixtop.sim.engine import Engine, GenerateResult, SimConfig

__all__ = ["OfflineCall", "OfflineResult", "OfflineRun", "run_offline"]

# A bound on iterations per call: far above any trace's need (a call needs at most its tokens
# plus a few retractions' worth), so only a stuck engine reaches it.
_ITERATIONS_PER_CALL = 20_000

K = TypeVar("K", bound=Hashable)  # the caller's name for a call (e.g. (request id, copy))


# The calls and their results are records of one field each per call of a trace: named tuples,
# made without a frozen dataclass's setattr per field.
class OfflineCall(NamedTuple, Generic[K]):
    key: K
    offset_s: float
    input_ids: list[int]
    max_new_tokens: int
    extra_key: str | None = None
    ids_checked: bool = False  # every id is a token id of the vocabulary (Engine.submit's ids_checked)


class OfflineResult(NamedTuple, Generic[K]):
    key: K
    arrived_s: float
    finished_s: float | None  # None when the call failed
    prompt_tokens: int
    cached_tokens: int | None  # None when the call failed
    error: str | None


@dataclass(frozen=True)
class OfflineRun(Generic[K]):
    results: tuple[OfflineResult[K], ...]  # in the order the calls were given
    eviction_times_s: tuple[float, ...]  # the clock at each iteration that evicted tokens
    evicted_tokens: int
    peak_token_usage: float
    retractions: int
    iterations: int
    duration_s: float  # on the virtual clock


class _Clock:
    """The virtual clock, and how many calls the engine has answered by it."""

    __slots__ = ("now", "answered")

    def __init__(self) -> None:
        self.now = 0.0
        self.answered = 0


class _Answer:
    """The part of a Future the engine answers a call on, stamped with the clock's time."""

    __slots__ = ("_clock", "result", "finished_s")

    def __init__(self, clock: _Clock) -> None:
        self._clock = clock
        self.result: GenerateResult | None = None
        self.finished_s = 0.0

    def done(self) -> bool:
        return self.result is not None

    def set_result(self, result: GenerateResult) -> None:
        self.result = result
        self.finished_s = self._clock.now
        self._clock.answered += 1


def run_offline(config: SimConfig, calls: Sequence[OfflineCall[K]]) -> OfflineRun[K]:
    """Run every call through a fresh engine built from ``config``; raises ValueError for a bad config."""
    clock = _Clock()
    # Without faults every slot holds what its request wrote: the model need keep no KV contents,
    # and the output tokens' values wait for the tree (the results' output ids go unread here).
    contents = bool(config.faults)
    engine = Engine(config, emit=None, wall_clock=lambda: clock.now, kv_contents=contents, result_outputs=contents)
    offsets = [call.offset_s for call in calls]
    order = sorted(range(len(calls)), key=offsets.__getitem__)  # stable: given order within one instant
    answers: dict[int, _Answer] = {}
    arrived: dict[int, float] = {}
    errors: dict[int, str] = {}
    evictions: list[float] = []
    peak = 0.0
    last_evicted = 0
    next_call = 0
    iterations = 0
    limit = _ITERATIONS_PER_CALL * max(1, len(calls))
    while next_call < len(order) or clock.answered + len(errors) < len(calls):
        while next_call < len(order) and calls[order[next_call]].offset_s <= clock.now:
            index = order[next_call]
            next_call += 1
            arrived[index] = clock.now
            answer = _Answer(clock)
            try:
                call = calls[index]
                engine.submit(
                    call.input_ids, max_new_tokens=call.max_new_tokens, future=answer, extra_key=call.extra_key,
                    ids_checked=call.ids_checked, keep_ids=True,  # the calls' lists outlive the run, unchanged
                )
            except ValueError as exc:  # what the served simulator answers 400 to
                errors[index] = str(exc)
                continue
            answers[index] = answer
        iterations += 1
        if iterations > limit:
            raise RuntimeError(f"the engine made no progress in {limit} iterations")
        worked = engine.iterate()
        usage, evicted = engine.pool_usage()
        if usage > peak:
            peak = usage
        if evicted != last_evicted:
            last_evicted = evicted
            evictions.append(clock.now)
        if worked:
            clock.now += config.step_time_s
        elif next_call < len(order):
            clock.now = max(clock.now, calls[order[next_call]].offset_s)
        elif clock.answered + len(errors) < len(calls):
            raise RuntimeError("the engine is idle with calls unanswered")
    results = []
    for i, call in enumerate(calls):
        answered = answers.get(i)
        result = answered.result if answered is not None else None
        if answered is None or result is None or result.finish_reason == "abort":
            why = errors.get(i) or "aborted (retracted with no room left)"
            results.append(OfflineResult(call.key, arrived[i], None, len(call.input_ids), None, why))
        else:
            done_s, cached = answered.finished_s, result.cached_tokens
            results.append(OfflineResult(call.key, arrived[i], done_s, result.prompt_tokens, cached, None))
    stats = engine.stats()
    return OfflineRun(
        results=tuple(results),
        eviction_times_s=tuple(evictions),
        evicted_tokens=stats.evicted_tokens_total,
        peak_token_usage=peak,
        retractions=stats.num_retracted_reqs,
        iterations=iterations,
        duration_s=clock.now,
    )
