"""Alarms for what must be back to zero once the server is idle, not only for what it logs.

When nothing runs and nothing waits, every lock has been released and every KV slot is either
free or in the tree: SGLang's own idle check (`pool memory leak detected!`) catches slots that are
neither, but a lock that was never released keeps its tokens protected and passes that check. So:

- `leaked-lock`: the instrument's snapshot says tokens are locked (protected) while /metrics says
  nothing runs or waits;
- `pool-short`: the snapshot's free + evictable + locked tokens fall short of the pool while idle
  (slots held by nothing: leaked);
- `used-while-idle`: without the instrument, /metrics' token usage stays above zero while idle
  (locked or leaked, /metrics cannot tell which).

Each holds for HOLD_S before it is raised (a request finishing between two polls is not a leak),
once per episode: it is raised again only after the figure went back to zero or the server worked.
Idleness is read from /metrics (running and queued both 0); without metrics nothing is raised,
and nothing is guessed. SGLang 0.5.23 zeroes its running gauge when it turns idle but refreshes
its pool gauges only 30 s later (`_maybe_log_idle_metrics`; measured on the real server: usage
0.03 for 30 s, then 0.0), so the /metrics alarm waits METRICS_HOLD_S.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from radixtop.probes.sglang import ServerSample
from radixtop.schema import Snapshot

HOLD_S = 10.0
METRICS_HOLD_S = 45.0  # past SGLang's 30 s idle refresh of its pool gauges, and a poll or two
AlarmKind = Literal["leaked-lock", "pool-short", "used-while-idle"]


@dataclass(frozen=True, slots=True)
class IdleAlarm:
    kind: AlarmKind
    time: float  # when the condition began (with the server idle)
    rank: int | None  # None: the server's /metrics (every rank)
    tokens: int
    message: str


class IdleWatch:
    def __init__(self, *, hold_s: float = HOLD_S, metrics_hold_s: float = METRICS_HOLD_S) -> None:
        self.hold_s = hold_s
        self.metrics_hold_s = metrics_hold_s
        self._idle_since: float | None = None
        self._capacity: int | None = None
        self._since: dict[tuple[AlarmKind, int | None], float] = {}
        self._raised: set[tuple[AlarmKind, int | None]] = set()

    def server(self, sample: ServerSample) -> list[IdleAlarm]:
        info, metrics = sample.info, sample.metrics
        if info is not None and info.max_total_num_tokens:
            self._capacity = info.max_total_num_tokens
        if metrics is None:
            return []
        running, queued = metrics.get("running"), metrics.get("queued")
        if running is None or queued is None:
            self._idle_since = None
            return []
        if running > 0 or queued > 0:
            self._idle_since = None
            self._raised.clear()  # work again: a leak seen after it is a new one
            self._since.clear()
            return []
        if self._idle_since is None:
            self._idle_since = sample.time
        usage = metrics.get("token_usage")
        free, evictable, cap = metrics.get("available_tokens"), metrics.get("evictable_tokens"), self._capacity
        if cap and free is not None and evictable is not None:
            used = int(cap - free - evictable)
        elif usage is not None:
            used = round(usage * cap) if cap else int(usage > 0)
        else:
            return []
        what = f"{used:,} tokens" if cap else f"token usage {usage:.2f}"
        return self._check("used-while-idle", None, used, sample.time,
                           f"{what} in use while nothing runs or waits (locked or leaked KV; "
                           "the radixtop instrument tells which)", self.metrics_hold_s)

    def snapshot(self, rank: int | None, snap: Snapshot, now: float) -> list[IdleAlarm]:
        if self._idle_since is None:
            return []
        out: list[IdleAlarm] = []
        locked = snap.protected_tokens
        if locked is not None:
            out += self._check("leaked-lock", rank, locked, now,
                               f"{locked:,} tokens locked while nothing runs or waits: a lock was not released")
        cap, free, evictable = snap.capacity_tokens, snap.available_tokens, snap.evictable_tokens
        if cap and free is not None and evictable is not None and locked is not None:
            short = cap - free - evictable - locked
            out += self._check("pool-short", rank, short, now,
                               f"{short:,} of {cap:,} tokens neither free nor in the tree while idle: KV slots leaked")
        return out

    def _check(self, kind: AlarmKind, rank: int | None, tokens: int, now: float, message: str,
               hold_s: float | None = None) -> list[IdleAlarm]:
        key = (kind, rank)
        if tokens <= 0:
            self._since.pop(key, None)
            self._raised.discard(key)
            return []
        began = self._since.setdefault(key, max(now, self._idle_since or now))
        if key in self._raised or now - began < (self.hold_s if hold_s is None else hold_s):
            return []
        self._raised.add(key)
        return [IdleAlarm(kind, began, rank, tokens, f"{message} (for {now - began:.0f} s)")]
