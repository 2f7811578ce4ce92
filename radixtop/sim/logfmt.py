"""SGLang's log-line shape, written the way SGLang 0.5.23 writes it.

SGLang configures ``logging`` with ``[%(asctime)s{.%(msecs)03d}{prefix}] %(message)s`` and
datefmt ``%Y-%m-%d %H:%M:%S`` (``.mmm`` only when ``SGLANG_LOG_MS`` is set). The scheduler's
prefix is built from its ranks: `` DP{n}`` when data parallelism is on, `` PP{n}`` when
pp_size > 1, `` TP{n}`` when tp_size > 1; a TP=1, DP=1 server has no prefix at all. The main
process (HTTP server, sigquit handler) never has a prefix. A message with newlines (a traceback)
is written as-is: only its first line carries the prefix.
"""

from __future__ import annotations

import time

__all__ = ["rank_prefix", "format_line"]

# The parent's line when a child fails, as SGLang 0.5.23's SIGQUIT handler writes it.
SIGQUIT_LINE = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."


def rank_prefix(
    *,
    dp_rank: int = 0,
    pp_rank: int = 0,
    tp_rank: int = 0,
    dp_size: int = 1,
    pp_size: int = 1,
    tp_size: int = 1,
) -> str:
    """The text SGLang puts after the timestamp, e.g. ``" DP1 TP3"``; ``""`` when all sizes are 1."""
    prefix = ""
    if dp_size > 1:
        prefix += f" DP{dp_rank}"
    if pp_size > 1:
        prefix += f" PP{pp_rank}"
    if tp_size > 1:
        prefix += f" TP{tp_rank}"
    return prefix


def format_line(message: str, *, when: float, prefix: str = "", log_ms: bool = True) -> str:
    """One log record as SGLang prints it; ``when`` is seconds since the epoch (local time, as logging)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))
    if log_ms:
        # logging computes msecs from the fractional part and truncates, as here.
        stamp += f".{int((when - int(when)) * 1000) % 1000:03d}"
    return f"[{stamp}{prefix}] {message}"
