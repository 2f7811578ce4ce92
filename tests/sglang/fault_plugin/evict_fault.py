"""A fault in the real UnifiedRadixCache, for radixtop's tests: an eviction under pressure fails.

SGLang's plugin loader calls `register()` in every process. With SGLANG_TEST_EVICT_FAULT=1 in the
server's environment (an SGLANG_ key, so radixtop remembers it and its reproduction carries it),
it wraps `UnifiedRadixCache.evict` and `evict_for_alloc` (the allocators' path, which does not
call evict) through SGLang's HookRegistry: an eviction asked while the pool is under pressure
(the cache's locked tokens past half the pool) raises the seed incident's error, inside the
cache, in the scheduler's own thread. Below that pressure, and with the radix
cache disabled, nothing happens, so the failure depends on pressure, as the seed's lock race does.
"""

from __future__ import annotations

import os

CACHE = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache"
TARGETS = (f"{CACHE}.evict", f"{CACHE}.evict_for_alloc")
LOCKED_SHARE = 0.5  # of the pool's tokens, locked by running requests when evict is asked


def _locked_share(cache) -> float:
    pool = getattr(cache, "token_to_kv_pool_allocator", None)
    size = getattr(pool, "size", None) if pool is not None else None
    try:
        protected = cache.protected_size()
    except Exception:  # a cache whose sizes cannot be read raises nothing of ours
        return 0.0
    return protected / size if size else 0.0


def around_evict(original, cache, *args, **kwargs):
    if _locked_share(cache) >= LOCKED_SHARE:
        raise RuntimeError("RadixCacheError: Failed to lock memory page during dynamic prefix eviction")
    return original(cache, *args, **kwargs)


def register() -> None:
    if os.environ.get("SGLANG_TEST_EVICT_FAULT") != "1":
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target in TARGETS:
        HookRegistry.register(target, around_evict, HookType.AROUND)
