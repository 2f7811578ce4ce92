"""A default workload for a confirmation run: token pressure sized to the server it runs against.

Without a trace of the user's own traffic, the confirmation run needs a workload that puts the
live server's KV pool under the pressure the seed describes (evictions while pages are locked),
and that the control's bounded concurrency keeps well below it. ``pressure_trace`` builds one
from what ``/server_info`` says: two bursts of ``2 x R`` requests (R = max running requests, at
most 64), each needing about ``1.5 x capacity / R`` tokens, half prompt and half generated (decode
growth is what fills a pool while cached prefixes are being evicted), so that R running requests
overflow the pool by half while a quarter of them use about 40 % of it. Requests share a few system-prompt
prefixes (two pages each), so the radix cache has locked, shared paths to evict around.
"""

from __future__ import annotations

import math

from radixtop.incident.replay.trace import Trace, TraceRequest

__all__ = ["pressure_trace"]

MAX_CONCURRENCY = 64
GROUPS = 4
BURST_GAP_MS = 400.0
SPACING_MS = 2.0


def pressure_trace(
    capacity_tokens: int,
    max_running: int,
    *,
    page_size: int = 1,
    max_input_len: int | None = None,
    overflow: float = 1.5,
    bursts: int = 2,
) -> Trace:
    if capacity_tokens < 16 or max_running < 1:
        raise ValueError(f"capacity {capacity_tokens} tokens / {max_running} running requests is too small to pressure")
    page_size = max(1, page_size)
    concurrency = min(max_running, MAX_CONCURRENCY)
    per_request = max(8, math.ceil(overflow * capacity_tokens / concurrency))
    max_tokens = max(4, per_request // 2)  # half generated: decode growth drives evictions
    prompt_len = max(4, per_request - max_tokens)
    if max_input_len:
        prompt_len = min(prompt_len, max(4, max_input_len - 1))
    prefix = min(2 * page_size, prompt_len // 2)
    requests = []
    for burst in range(bursts):
        for i in range(2 * concurrency):
            requests.append(
                TraceRequest(
                    id=f"p{burst}-{i:03d}",
                    offset_ms=burst * BURST_GAP_MS + i * SPACING_MS,
                    prompt_len=prompt_len,
                    prefix_len=prefix,
                    group=f"sys-{i % GROUPS}",
                    max_tokens=max_tokens,
                    n=1,
                )
            )
    return Trace(
        name="pressure",
        page_size_hint=page_size,
        requests=tuple(requests),
        source=(
            f"radixtop confirm: {bursts} bursts of {2 * concurrency} requests x {prompt_len}+{max_tokens} tokens "
            f"against a {capacity_tokens}-token pool and {max_running} running requests"
        ),
    )
