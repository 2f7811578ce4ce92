"""The signature catalog: real example lines per signature (on every matcher engine), ordinary
lines that must never match, and user catalogs merged over the built-in one with one-line errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from radixtop.diagnosis import catalog as catalog_module
from radixtop.diagnosis.catalog import (
    ORDINARY_LINES,
    SEVERITIES,
    Catalog,
    CatalogError,
    load_catalog,
    pattern_problem,
)
from radixtop.diagnosis.matcher import Matcher

REQUIRED_IDS = {
    "radix-page-lock-eviction",
    "kv-pool-memory-leak",
    "kv-pool-retract",
    "prefill-oom",
    "decode-oom",
    "lock-ref-release-underflow",
    "rust-tree-core-panic",
    "scheduler-exception",
    "child-sigquit",
    "cuda-oom",
    "cuda-illegal-memory-access",
    "nccl-watchdog-timeout",
    "watchdog-timeout",
    "server-ready",
    "radix-eviction-lock-contention",
    "kv-canary-violation",
    "kv-canary-stalled",
    "kv-canary-verify-skipped",
    "kv-page-use-after-free",
    "kv-double-free",
    "kv-page-length-invariant",
    "radix-tree-leaf-invariant",
    "hicache-write-ack-unknown",
    "hicache-load-back-no-value",
    "crash-dump-requests",
    "crash-diagnostics-sleep",
    "pyspy-dump",
    "kill-process-tree",
    "nccl-watchdog-failure",
    "vllm-free-block-queue-corrupt",
    "vllm-block-hash-reassigned",
}

# Real lines as the programs print them (SGLang 0.5.5-0.5.23, vLLM, FlashInfer, Triton, PyTorch),
# plus the seed's literal and the simulator's contention warning. Each must match its signature;
# `also` lists the only other signatures allowed to match the same line.
EXAMPLES: list[tuple[str, str, frozenset[str]]] = [
    (
        "vllm-engine-dead",
        "ERROR 12-05 10:00:01 [core.py:720] EngineCore encountered a fatal error.",
        frozenset(),
    ),
    (
        "committed-kv-freed",
        "AssertionError: Committed KV cache already freed (self.kv_committed_len=128)",
        frozenset(),
    ),
    (
        "mamba-cache-exhausted",
        "AssertionError: Can not alloc mamba cache",
        frozenset(),
    ),
    (
        "mamba-cache-exhausted",
        "AssertionError: Not enough space for mamba ping pong idx, try to increase --mamba-full-memory-ratio.",
        frozenset(),
    ),
    (
        "radix-tree-corrupt-child",
        "AssertionError: parent does not have child key, (12, 40)",
        frozenset(),
    ),
    (
        "radix-page-lock-eviction",
        "RadixCacheError: Failed to lock memory page during dynamic prefix eviction",
        frozenset(),
    ),
    (
        "radix-page-lock-eviction",
        "sglang RadixCacheError Failed to lock memory page during dynamic prefix eviction",
        frozenset(),
    ),
    (
        "radix-eviction-lock-contention",
        "[2026-12-02 14:03:14.702 TP1] WARNING: radix cache eviction contended with a page lock on node 4711 "
        "(token usage 0.93); retrying",
        frozenset(),
    ),
    (
        "lock-ref-release-underflow",
        "AssertionError: FULL segment release hit lock_ref=0 on node 42",
        frozenset(),
    ),
    (
        "lock-ref-release-underflow",
        "AssertionError: SWA segment release hit host_lock_ref=0 on node 7",
        frozenset(),
    ),
    (
        "rust-tree-core-panic",
        "RuntimeError: Rust TreeCore panicked: called `Option::unwrap()` on a `None` value",
        frozenset(),
    ),
    (
        "rust-tree-core-panic",
        "RuntimeError: Rust TreeCore mutex poisoned; refusing to reuse state after an earlier panic",
        frozenset(),
    ),
    (
        "lock-ref-release-underflow",
        "AssertionError: dec_lock_ref on node with node.swa_lock_ref=0, node.id=381",
        frozenset(),
    ),
    ("lock-ref-release-underflow", "AssertionError: SWA window release hit lock_ref=0 on node 12", frozenset()),
    (
        "radix-tree-sanity-check-failed",
        "[2025-09-01 10:00:00 TP0] SWA Radix tree sanity check failed, ping @hanming-lu: self.swa=True, "
        "total nodes: 12, total lru plus 1: 11, evictable size: 64 != lru list evictable size: 32",
        frozenset(),
    ),
    (
        "radix-tree-sanity-check-failed",
        "AssertionError: Sanity check FAILED (2 violations across 40 nodes):",
        frozenset(),
    ),
    ("radix-evict-locked-node", "AssertionError: node is in use, x.id=77", frozenset()),
    ("radix-evict-locked-node", "AssertionError: node is in use by mamba kv indices, x.id=5", frozenset()),
    ("radix-evict-locked-node", "    assert cd.lock_ref == 0", frozenset()),
    (
        "radix-lock-invariant",
        "AssertionError: tombstone swa_lock_ref should always be 0, node.full_lock_ref=1, node.swa_lock_ref=1, "
        "node.id=9",
        frozenset(),
    ),
    (
        "radix-cache-finished-req-crash",
        '  File "/usr/local/lib/python3.11/dist-packages/sglang/srt/mem_cache/radix_cache.py", line 402, '
        "in cache_finished_req",
        frozenset(),
    ),
    (
        "kv-pool-memory-leak",
        "[2025-06-01 10:00:00 TP0] token_to_kv_pool_allocator memory leak detected! available_size=410000, "
        "protected_size=0, self.max_total_num_tokens=412345",
        frozenset(),
    ),
    (
        "kv-pool-memory-leak",
        "ValueError: pool memory leak detected! [full] total=412345, available=410000, evictable=0, "
        "protected=0, session_held=0, uncached=0",
        frozenset(),
    ),
    (
        "kv-pool-memory-leak",
        "req_to_token_pool memory leak detected!available_size=63, session_held=0, total_size=64",
        frozenset(),
    ),
    (
        "kv-pool-memory-leak",
        "AssertionError: Full Pool Mem Leak Detected! [full] total=100, available=90",
        frozenset(),
    ),
    (
        "kv-pool-retract",
        "[2026-12-02 14:03:13.007 TP1] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
        "#new_token_ratio: 0.4000 -> 0.5000",
        frozenset(),
    ),
    (
        "prefill-oom",
        "[2026-12-02 14:00:00 TP0] Prefill out of memory. Try to lower your batch size.",
        frozenset(),
    ),
    ("prefill-oom", "Prefill out of memory. This should never happen.", frozenset()),
    (
        "decode-oom",
        "RuntimeError: Decode out of memory. Try to lower your batch size.",
        frozenset(),
    ),
    (
        "kv-slots-oom",
        "RuntimeError: Out of memory. Try to lower your batch size. Try to allocate 64 tokens.",
        frozenset(),
    ),
    (
        "decode-oom",
        "ValueError: Failed to retract any request. No space left for only one request.",
        frozenset(),
    ),
    (
        "kv-pool-retract",
        "[2024-12-01 10:00:00 TP0] Decode out of memory happened. "
        "#retracted_reqs: 3, #new_token_ratio: 0.4000 -> 0.5500",
        frozenset(),
    ),
    (
        "req-slots-oom",
        "RuntimeError: alloc_req_slots runs out of memory. Please set a smaller number for "
        "`--max-running-requests`. req_to_token_pool.available_size()=0, num_reqs=4, ",
        frozenset(),
    ),
    (
        "scheduler-exception",
        "[2026-01-04 01:42:55 TP1] Scheduler hit an exception: Traceback (most recent call last):",
        frozenset(),
    ),
    (
        "child-sigquit",
        "[2026-12-02 14:03:14.964] Received sigquit from a child process. It usually means the child failed.",
        frozenset(),
    ),
    (
        "child-sigquit",
        "[2026-01-01 00:00:00] SIGQUIT received. signum=3, frame=None. It usually means one child failed.",
        frozenset(),
    ),
    (
        "subprocess-crashed",
        "[2026-01-01 00:00:00] Subprocess scheduler_0 (pid=4242) crashed with exit code -6. Triggering SIGQUIT for "
        "cleanup...",
        frozenset(),
    ),
    (
        "subprocess-killed",
        "[2026-01-01 00:00:00] Subprocess scheduler_0 (pid=4242) crashed with exit code -9. Triggering SIGQUIT for "
        "cleanup...",
        frozenset(),
    ),
    (
        "subprocess-terminated",
        "[2026-01-01 00:00:00] Subprocess scheduler_0 (pid=4242) crashed with exit code -15. Triggering SIGQUIT for "
        "cleanup...",
        frozenset(),
    ),
    (
        "subprocess-crashed",
        "(VllmWorkerProcess pid=161) ERROR 08-22 06:24:42 multiproc_worker_utils.py:120] Worker VllmWorkerProcess "
        "pid 162 died, exit code: -6",
        frozenset(),
    ),
    (
        "watchdog-timeout",
        "[2026-12-02 14:10:00 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
        frozenset(),
    ),
    (
        "watchdog-timeout",
        "[2025-01-01 00:00:00 TP3] Watchdog timeout (self.watchdog_timeout=300)",
        frozenset(),
    ),
    (
        "cuda-graph-capture-failed",
        "Exception: Capture cuda graph failed: invalid argument",
        frozenset(),
    ),
    (
        "sglang-not-enough-memory",
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.5",
        frozenset(),
    ),
    (
        "server-ready",
        "[2026-12-02 14:00:16.616] The server is fired up and ready to roll!",
        frozenset(),
    ),
    (
        "cuda-oom",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 79.15 GiB of which 1.50 GiB is free.",
        frozenset(),
    ),
    ("cuda-oom", "torch.cuda.OutOfMemoryError: CUDA out of memory.", frozenset()),
    ("cuda-oom", "RuntimeError: CUDA error: out of memory", frozenset()),
    (
        "cuda-illegal-memory-access",
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        frozenset(),
    ),
    (
        "cuda-illegal-memory-access",
        "[rank2]:[E323 21:33:26.170490902 ProcessGroupNCCL.cpp:1896] [PG ID 2 PG GUID 3 Rank 2] Process group "
        "watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered",
        frozenset(),
    ),
    ("cuda-device-assert", "RuntimeError: CUDA error: device-side assert triggered", frozenset()),
    (
        "nccl-watchdog-timeout",
        "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, "
        "Timeout(ms)=600000) ran for 600081 milliseconds before timing out.",
        frozenset(),
    ),
    (
        "nccl-error",
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
        frozenset(),
    ),
    ("nccl-error", "ncclUnhandledCudaError: Call to CUDA function failed.", frozenset()),
    ("nccl-error", "RuntimeError: NCCL error: unhandled system error", frozenset()),
    (
        "nccl-aborted",
        "[rank1]:[E1218 20:27:21.431 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0(default_pg) Rank 1] To avoid "
        "data inconsistency, we are taking the entire process down.",
        frozenset(),
    ),
    ("nccl-aborted", "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3.", frozenset()),
    (
        "cuda-illegal-memory-access",
        "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered",
        frozenset(),
    ),
    (
        "cuda-illegal-memory-access",
        "RuntimeError: Error in function 'BatchPrefillWithPagedKVCache' at /flashinfer/include/flashinfer/attention/"
        "prefill.cuh:2404: an illegal memory access was encountered",
        frozenset(),
    ),

    (
        "flashinfer-workspace-overflow",
        "RuntimeError: Error in function 'aligned_alloc' at /workspace/include/flashinfer/allocator.h:49: "
        "Buffer overflow when allocating memory for batch_prefill_tmp_v with size 536346624 and alignment 16, "
        "but only 413138944 bytes available in AlignedAllocator. Increase the workspace buffer size.",
        frozenset(),
    ),
    (
        "flashinfer-jit-build-failed",
        "(EngineCore pid=3164713) ERROR 09-23 10:35:19 [core.py:1374] RuntimeError: Ninja build failed. Ninja output:",
        frozenset(),
    ),
    (
        "flashinfer-internal-error",
        "RuntimeError: FlashInfer Internal Error: Invalid configuration in BatchPrefillWithRaggedKVCacheDispatched",
        frozenset(),
    ),
    (
        "flashinfer-jit-fallback",
        "2025-03-06 07:48:39,911 - INFO - flashinfer.jit: Prebuilt kernels not found, using JIT backend",
        frozenset(),
    ),
    (
        "fp8-unsupported-arch",
        "ValueError: type fp8e4nv not supported in this architecture. The supported fp8 dtypes are "
        "('fp8e4b15', 'fp8e5')",
        frozenset(),
    ),
    (
        "fp8-unsupported-arch",
        "RuntimeError: torch._scaled_mm is only supported on CUDA devices with compute capability >= 9.0 or 8.9, "
        "or ROCm MI300+",
        frozenset(),
    ),
    (
        "fp8-kv-no-scales",
        "[2026-12-02 14:00:09 TP0] Using FP8 KV cache but no scaling factors provided. Defaulting to scaling "
        "factors of 1.0.",
        frozenset(),
    ),
    (
        "kv-cache-dtype-unsupported",
        "ValueError: Unsupported kv_cache_dtype: fp4_e2m1.",
        frozenset(),
    ),
    (
        "kv-cache-dtype-unsupported",
        "ValueError: --kv-cache-dtype fp8_e5m2 is not supported on CPU.",
        frozenset(),
    ),
    (
        "vllm-shm-no-available-block",
        "(VllmWorkerProcess pid=161) WARNING 08-22 06:24:42 shm_broadcast.py:386] No available block found in "
        "60 second. ",
        frozenset(),
    ),
    (
        "vllm-preemption",
        "WARNING 05-09 00:49:33 scheduler.py:1057 Sequence group 0 is preempted by PreemptionMode.RECOMPUTE mode "
        "because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
        "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
        "total_cumulative_preemption_cnt=1",
        frozenset(),
    ),
    ("vllm-no-free-blocks", "ValueError: Out of memory! No free blocks are available.", frozenset()),
    ("vllm-prefix-cache-evictor", "ValueError: Attempting to remove block that's not in the evictor", frozenset()),
    (
        "vllm-engine-dead",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for "
        "the root cause.",
        frozenset(),
    ),
    (
        "vllm-async-engine-dead",
        "vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.",
        frozenset(),
    ),
    (
        "vllm-kv-cache-insufficient",
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.",
        frozenset(),
    ),
    (
        "vllm-kv-cache-insufficient",
        "ValueError: To serve at least one request with the model's max seq len (131072), 15.5 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (13.15 GiB).",
        frozenset(),
    ),
    # SGLang 0.5.23's own corruption detectors, each line formatted from SGLang's format string.
    # The KV canary (sglang/srt/kv_canary/runner/violation_reporter.py): a warning under --kv-canary log,
    (
        "kv-canary-violation",
        "[2026-12-05 10:00:00 TP0] kv_canary violation: launch_tag=SWEEP_K_FULL fail_reason=verify_chain_hash "
        "slot_idx=18342 position=517 stored_token=9906 expected_token=9906 stored_chain_hash=0x3f1c2a9be07d4411 "
        "expected_aux=0x7a55e01c9d2b3e08",
        frozenset(),
    ),
    (
        "kv-canary-violation",
        "[2026-12-05 10:00:00 TP0] kv_canary violation: launch_tag=TAIL_K_FULL "
        "fail_reason=verify_chain_hash+verify_real_kv_hash slot_idx=4100 position=96 stored_token=318 "
        "expected_token=318 stored_chain_hash=0x0000000000000abc expected_aux=0x0000000000000def",
        frozenset(),
    ),
    # and the same text raised under --kv-canary raise.
    (
        "kv-canary-violation",
        "RuntimeError: kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=write_token slot_idx=777 "
        "position=12 stored_token=220 expected_token=1734 stored_chain_hash=0x0000000000000011 "
        "expected_aux=0x000000000000000c",
        frozenset(),
    ),
    (
        "kv-canary-stalled",
        "RuntimeError: kv-canary: kernel_run_counter did not increase since previous check for "
        "tags=[SWEEP_K_FULL, SWEEP_V_FULL] at step=1200; canary path is not executing",
        frozenset(),
    ),
    (
        "kv-canary-verify-skipped",
        "[2026-12-05 10:00:00 TP0] kv-canary: per-forward verify skipped this step due to overflow "
        "(total=3, capacity=8192); check ServerArgs / pool sizing",
        frozenset(),
    ),
    # The KV page invariants (sglang/srt/managers/scheduler_components/invariant_checker.py): a warning
    # with SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=0, a ValueError with its default 1.
    (
        "kv-page-use-after-free",
        "[2026-12-05 10:00:00 TP0] KV page use-after-free: 3 owner page refs are in the free pool, "
        "sample pages=[1187, 1188, 2051].",
        frozenset(),
    ),
    (
        "kv-page-use-after-free",
        "ValueError: KV page use-after-free: 1 owner page refs are in the free pool, sample pages=[40].",
        frozenset(),
    ),
    ("kv-double-free", "[2026-12-05 10:00:00 TP0] KV double free: sub-pool 0 has 2 duplicate pages.", frozenset()),
    ("kv-double-free", "ValueError: KV double free: sub-pool 1 has 1 duplicate pages.", frozenset()),
    # SGLANG_DEBUG_MEMORY_POOL=1: the allocators' own check at the free (mem_cache/allocator/).
    ("kv-double-free", "AssertionError: double free: duplicate pages in class 1", frozenset()),
    ("kv-double-free", "    assert len(torch.unique(pages)) == len(pages)", frozenset()),
    (
        "kv-page-length-invariant",
        "    assert 0 <= kv.kv_committed_len <= kv.kv_allocated_len <= row_width",
        frozenset(),
    ),
    # Radix tree corruption seen in eviction: a leaf with children (SWA / Mamba / HiCache caches' asserts,
    # 0.4.10-0.5.12), the unified cache's D-leaf and H-leaf checks (0.5.12-0.5.23), and the Rust TreeCore,
    # whose panics come as "Rust TreeCore panicked: <message>" (as the 0.5.23 binding raised it here).
    ("radix-tree-leaf-invariant", "AssertionError: leaf node has children, node.id=4711", frozenset()),
    ("radix-tree-leaf-invariant", "AssertionError: non-leaf, node.id=88", frozenset()),
    ("radix-tree-leaf-invariant", "AssertionError: Cannot tombstone a leaf node, node.id=301", frozenset()),
    ("radix-tree-leaf-invariant", "AssertionError: node 57 is not a D-leaf", frozenset()),
    ("radix-tree-leaf-invariant", "AssertionError: node 912 is not an H-leaf", frozenset()),
    (
        "radix-tree-leaf-invariant",
        "RuntimeError: Rust TreeCore panicked: node 2 is not a D-leaf",
        frozenset({"rust-tree-core-panic"}),
    ),
    # Messages of the Rust TreeCore's errors (the .so's strings), with plausible values: the strings do not
    # show which exception class carries them, so only the message is quoted.
    ("radix-tree-leaf-invariant", "cannot free non-leaf node 12: it has 2 children", frozenset()),
    (
        "radix-tree-corrupt-child",
        "detach_from_parent: parent 3 has no child 7 under key 1734 (found None)",
        frozenset(),
    ),
    (
        "hicache-load-back-no-value",
        "SWA load-back traversal reached node 57 without a device or host value",
        frozenset(),
    ),
    # HiCache: a KeyError at writing_check's pop of an unknown acknowledgement (the frame's source line in
    # HiRadixCache 0.5.6-0.5.12, UnifiedRadixCache 0.5.12 and 0.5.23, its buffer pipeline 0.5.23).
    ("hicache-write-ack-unknown", "    backuped_node = self.ongoing_write_through.pop(ack_id)", frozenset()),
    ("hicache-write-ack-unknown", "    del self.ongoing_write_through[ack_id]", frozenset()),
    ("hicache-write-ack-unknown", "    node, params = self.ongoing_write_through.pop(ack_id)", frozenset()),
    (
        "hicache-write-ack-unknown",
        "    lock_node_id, lock_params, publish_node_ids = self.ongoing_write_through.pop(",
        frozenset(),
    ),
    ("hicache-write-ack-unknown", "    entry = self.ongoing_write_through.pop(ack_id)", frozenset()),
    # HiCache load-back of a node with neither a host nor a device value.
    (
        "hicache-load-back-no-value",
        "AssertionError: No backup available on evicted nodes, should not happen",
        frozenset(),
    ),
    ("hicache-load-back-no-value", "AssertionError: No backup on evicted node 4711", frozenset()),
    ("hicache-load-back-no-value", "    assert cd.host_value is not None or cd.value is not None", frozenset()),
    # The dying server's way out (0.5.23): the watcher's line, the crash dump, py-spy, the kill.
    (
        "subprocess-crashed",
        "[2026-12-05 10:00:02] Subprocess scheduler_1 (pid=4243) crashed with exit code 1. Triggering SIGQUIT for "
        "cleanup...",
        frozenset(),
    ),
    (
        "crash-dump-requests",
        "[2026-12-05 10:00:03] Dumping requests before crash. self.crash_dump_folder='/tmp/crash_dump'",
        frozenset(),
    ),
    (
        "crash-dump-requests",
        "[2026-12-05 10:00:03] Dumped 12 finished and 3 unfinished requests before crash to "
        "/tmp/crash_dump/node-0/crash_dump_2026-12-05_10-00-03.pkl",
        frozenset(),
    ),
    (
        "crash-diagnostics-sleep",
        "[2026-12-05 10:00:03] Sleeping 5 seconds before crash diagnostics to let GPU activity settle.",
        frozenset(),
    ),
    (
        "pyspy-dump",
        "[2026-12-05 10:00:08] Pyspy dump for PID 4242 (py-spy dump --native --pid 4242):",
        frozenset(),
    ),
    (
        "pyspy-dump",
        "[2025-06-01 00:00:00] Pyspy dump for PID 4242: Process 4242: sglang::scheduler_TP0",
        frozenset(),
    ),
    (
        "kill-process-tree",
        "[2026-12-05 10:00:10] kill_process_tree called: parent_pid=4200, include_parent=True, pid=4200",
        frozenset(),
    ),
    # PyTorch's NCCL watchdog (ProcessGroupNCCL.cpp), for a timeout and an error alike.
    (
        "nccl-watchdog-failure",
        "[rank0]:[E1205 10:00:00.123456789 ProcessGroupNCCL.cpp:2057] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
        "failure detected by watchdog at work sequence id: 1234 PG status: last enqueued work: 1234, "
        "last completed work: 1233",
        frozenset(),
    ),
    # vLLM V1's block pool (vllm/v1/core/kv_cache_utils.py and block_pool.py, 0.8-0.34).
    (
        "vllm-free-block-queue-corrupt",
        "AssertionError: num_free_blocks (3) is out of sync with the free list.",
        frozenset(),
    ),
    (
        "vllm-free-block-queue-corrupt",
        "RuntimeError: Invalid block found in popleft() which doesn't have a valid next_free_block",
        frozenset(),
    ),
    (
        "vllm-free-block-queue-corrupt",
        "RuntimeError: remove() called on an invalid block: KVCacheBlock(block_id=17, ref_cnt=0, _block_hash=None, "
        "prev_free_block=None, next_free_block=None)",
        frozenset(),
    ),
    (
        "vllm-free-block-queue-corrupt",
        "RuntimeError: next_free_block of fake_free_list_head should always exist",
        frozenset(),
    ),
    (
        "vllm-free-block-queue-corrupt",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/core/kv_cache_utils.py", line 296, in popleft_n',
        frozenset(),
    ),
    ("vllm-block-hash-reassigned", "    assert blk.block_hash is None", frozenset()),
    ("vllm-block-hash-reassigned", "    assert dst_block.block_hash is None", frozenset()),
    (
        "vllm-block-hash-reassigned",
        "AssertionError: The block already has a hash. This should not happen.",
        frozenset(),
    ),
    ("gc-not-frozen", "[2026-12-07 19:28:34] post-warmup freeze_gc failed", frozenset()),
]

# Real lines next to each detector's that its signature must not match: the rest of the same record,
# the detector's routine lines, and the same words from another check.
NEAR_MISSES: list[tuple[str, str]] = [
    # The freeze that worked, and the refused one's own traceback: one finding per refusal.
    ("gc-not-frozen", '[2026-12-07 19:27:40] INFO:     127.0.0.1:38784 - "POST /freeze_gc HTTP/1.1" 200 OK'),
    (
        "gc-not-frozen",
        "requests.exceptions.ConnectionError: HTTPConnectionPool(host='127.0.0.1', port=60063): Max retries "
        "exceeded with url: /freeze_gc (Caused by NewConnectionError(\"HTTPConnection(host='127.0.0.1', "
        "port=60063): Failed to establish a new connection: [Errno 111] Connection refused\"))",
    ),
    ("gc-not-frozen", "[2026-12-07 19:27:40] GC start: Time 1796670460.1 | Generation 2"),
    # The canary's violation record goes on over continuation lines: one finding per violation.
    (
        "kv-canary-violation",
        "KV cache canary violation detected (kernel_kind=SWEEP_K_FULL, slot_idx=18342, position=517)",
    ),
    ("kv-canary-violation", "  total_violations=1 ring_overflow=False step_when_pumped=2300"),
    (
        "kv-canary-violation",
        "[2026-12-05 10:00:00 TP0] [canary] step=2300 protected_tokens=183420 sweep_passes=23 violations=1 "
        "launch_tags_active=6/12",
    ),
    (
        "kv-canary-stalled",
        "RuntimeError: kv-canary: expected_inputs.tokens shape 64 != num_tokens 65; caller must slice before invoking",
    ),
    ("kv-canary-stalled", "[2026-12-05 10:00:00 TP0] [canary] sweep succeeded 23 times (last_step=2300)"),
    (
        "kv-canary-verify-skipped",
        "[2026-12-05 10:00:00 TP0] Post-capture KV sizing: KV-canary per-forward workspace 0.12 GB",
    ),
    ("kv-page-use-after-free", "ValueError: KV double free: sub-pool 0 has 2 duplicate pages."),
    (
        "kv-page-use-after-free",
        "AssertionError: Full Pool Mem Leak Detected! [full] total=100, available=90",
    ),
    ("kv-double-free", "AssertionError: double free? mamba_index is None"),
    ("kv-double-free", "ValueError: Double free! 12 is already freed."),
    (
        "kv-double-free",
        "ValueError: KV page use-after-free: 3 owner page refs are in the free pool, sample pages=[1187, 1188, 2051].",
    ),
    (
        "kv-page-length-invariant",
        "AssertionError: Unexpected overallocated KV cache, req.kv.kv_committed_len=130, req.kv.kv_allocated_len=128",
    ),
    ("kv-page-length-invariant", "    assert max_alloc_len <= row_width, ("),
    # The assertion's own source line above its message: one finding per failure, on the message.
    ("radix-tree-leaf-invariant", '    assert len(node.children) == 0, f"leaf node has children, {node.id=}"'),
    ("radix-tree-leaf-invariant", "AssertionError: Invariant violated: leaf node is a tombstone, node.id=3"),
    ("radix-tree-leaf-invariant", "AssertionError: leaf node with full lock must also have swa lock, x.id=5"),
    # The safe lookups of the same table, and the KeyError line itself, which says nothing on its own.
    ("hicache-write-ack-unknown", "    entry = self.ongoing_write_through.pop(ack_id, None)"),
    ("hicache-write-ack-unknown", "    pending = self.ongoing_write_through.get(ack_id)"),
    ("hicache-write-ack-unknown", "    assert len(self.ongoing_write_through) == 0"),
    ("hicache-write-ack-unknown", "KeyError: 17"),
    # The host-eviction paths' check of the same field, and a load-back that falls back to recomputing.
    ("hicache-load-back-no-value", "    assert cd.host_value is not None"),
    (
        "hicache-load-back-no-value",
        "[2026-12-05 10:00:00 TP0] load_back: FAILED to load 512 tokens for node 88 even after eviction "
        "(evictable_size=0)",
    ),
    (
        "crash-dump-requests",
        "[2026-12-05 10:00:03] SIGTERM/SIGQUIT/Exception triggered, but crash dump already performed, skipping.",
    ),
    ("crash-dump-requests", "RuntimeError: Test crash after stream_output called 3 times"),
    ("crash-diagnostics-sleep", "[2026-12-05 10:00:08] Waiting 30.0 seconds for CUDA coredumps before exiting."),
    ("pyspy-dump", "[2026-12-05 10:00:08] Pyspy failed (py-spy dump --native --pid 4242). Error: Permission denied"),
    ("pyspy-dump", "[2026-12-05 10:00:08] All pyspy dump attempts failed for PID 4242."),
    (
        "kill-process-tree",
        "[2026-12-05 10:00:15] kill_process_tree: 2 process(es) still alive after 5.0s SIGKILL; continuing to wait "
        "up to 60.0s total. pids=[4242, 4243]",
    ),
    (
        "nccl-watchdog-failure",
        "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, "
        "Timeout(ms)=600000) ran for 600081 milliseconds before timing out.",
    ),
    (
        "nccl-watchdog-failure",
        "[rank0]:[I1205 10:00:00.123 ProcessGroupNCCL.cpp:1900] Process group watchdog thread started!",
    ),
    ("vllm-free-block-queue-corrupt", "ValueError: No free blocks available"),
    ("vllm-free-block-queue-corrupt", "ValueError: Cannot get 12 free blocks from the pool"),
    (
        "vllm-free-block-queue-corrupt",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/core/kv_cache_utils.py", line 244, in popleft',
    ),
    ("vllm-block-hash-reassigned", "    assert prev_block.block_hash is not None"),
    ("vllm-block-hash-reassigned", "    assert block.block_hash not in self.evictor"),
]

ENGINES = ["re", "re2", "hyperscan"]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="module", params=ENGINES)
def matcher(request: pytest.FixtureRequest, catalog: Catalog) -> Matcher:
    return Matcher(catalog.signatures, engine=request.param)


def test_builtin_catalog_shape(catalog: Catalog) -> None:
    assert len(catalog.signatures) >= 25
    ids = catalog.ids
    assert len(set(ids)) == len(ids)
    assert REQUIRED_IDS <= set(ids)
    assert catalog.notes == ()
    for sig in catalog.signatures:
        assert sig.severity in SEVERITIES
        assert sig.title and sig.meaning and sig.subsystem
        assert sig.first_checks and sig.competing
        assert sig.origin == "builtin"
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", sig.id)
    assert catalog.get("server-ready").severity == "info"
    assert catalog.get("radix-eviction-lock-contention").severity == "warning"
    assert catalog.get("radix-page-lock-eviction").subsystem == "radix-cache"
    with pytest.raises(KeyError):
        catalog.get("no-such-signature")


def test_every_signature_has_a_real_example() -> None:
    assert {sig_id for sig_id, _, _ in EXAMPLES} == set(load_catalog().ids)


def test_patterns_compile_on_every_engine(catalog: Catalog) -> None:
    import hyperscan
    import re2

    for sig in catalog.signatures:
        re.compile(sig.pattern)
        re2.compile(sig.pattern)
        db = hyperscan.Database()
        db.compile(expressions=[sig.pattern.encode()], ids=[0], elements=1)
        assert pattern_problem(sig.pattern) is None, sig.id


@pytest.mark.parametrize(
    ("sig_id", "line", "also"), EXAMPLES, ids=[f"{e[0]}-{i}" for i, e in enumerate(EXAMPLES)]
)
def test_example_matches_its_signature_only(
    matcher: Matcher, catalog: Catalog, sig_id: str, line: str, also: frozenset[str]
) -> None:
    found = {catalog.signatures[i].id for i in matcher.match(line)}
    assert sig_id in found
    assert found - {sig_id} <= also, f"{line!r} also matched {sorted(found - {sig_id} - also)}"


@pytest.mark.parametrize(("sig_id", "line"), NEAR_MISSES, ids=[f"{e[0]}-{i}" for i, e in enumerate(NEAR_MISSES)])
def test_near_miss_does_not_match_its_signature(matcher: Matcher, catalog: Catalog, sig_id: str, line: str) -> None:
    assert sig_id in catalog.ids
    assert sig_id not in {catalog.signatures[i].id for i in matcher.match(line)}


def test_ordinary_lines_never_match(matcher: Matcher) -> None:
    ordinary = list(ORDINARY_LINES) + [
        "[2026-12-02 14:00:05 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=70.87 GB",
        "[2026-12-02 14:00:10 TP1] KV Cache is allocated. #tokens: 412345, K size: 25.17 GB, V size: 25.17 GB",
        "[2026-12-02 14:00:14 TP0] Capture cuda graph end. "
        "Time elapsed: 3.71 s. mem usage=0.61 GB. avail mem=15.80 GB.",
        "[2026-12-02 14:00:15] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)",
        "Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:03<00:00, 1.30it/s]",
        "INFO 12-02 14:00:00 [gpu_model_runner.py:2000] Model loading took 15.0 GiB",
    ]
    for line in ordinary:
        assert matcher.match(line) == (), line


def test_sample_log_only_matches_expected_signatures(matcher: Matcher, catalog: Catalog) -> None:
    path = Path(__file__).resolve().parents[1] / "radixtop" / "data" / "sample_incident.log"
    found = set()
    for line in path.read_text("utf-8").splitlines():
        found |= {catalog.signatures[i].id for i in matcher.match(line)}
    assert found == {
        "server-ready",
        "kv-pool-retract",
        "radix-eviction-lock-contention",
        "scheduler-exception",
        "radix-page-lock-eviction",
        "child-sigquit",
    }


# -- user catalogs ------------------------------------------------------------------------------

GOOD = """
[[signature]]
id = "{id}"
title = "A custom failure"
pattern = '{pattern}'
severity = "{severity}"
subsystem = "custom"
meaning = "Something specific to this deployment."
first_checks = ["look here"]
competing = ["something else"]
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_user_catalog_adds_and_replaces(tmp_path: Path) -> None:
    first = write(
        tmp_path,
        "site.toml",
        GOOD.format(id="site-disk-full", pattern=r"No space left on device", severity="error")
        + GOOD.format(id="kv-pool-retract", pattern=r"KV cache pool is full\.", severity="error"),
    )
    catalog = load_catalog([first])
    builtin = load_catalog()
    assert catalog.ids[: len(builtin.ids)] == builtin.ids  # a replaced id keeps its place
    assert catalog.ids[-1] == "site-disk-full"
    replaced = catalog.get("kv-pool-retract")
    assert (replaced.severity, replaced.origin) == ("error", str(first))
    assert catalog.notes == (f'signature "kv-pool-retract" from {first} replaces the built-in one',)

    second = write(
        tmp_path,
        "team.toml",
        GOOD.format(id="site-disk-full", pattern="ENOSPC", severity="critical"),
    )
    catalog = load_catalog([first, second])
    assert catalog.get("site-disk-full").severity == "critical"
    assert catalog.notes[-1] == f'signature "site-disk-full" from {second} replaces the {first} one'
    matcher = Matcher(catalog.signatures)
    hits = {catalog.signatures[i].id for i in matcher.match("OSError: [Errno 28] ENOSPC")}
    assert hits == {"site-disk-full"}


def _error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, "bad.toml", text)
    with pytest.raises(CatalogError) as caught:
        load_catalog([path])
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:")
    assert "; " in message  # what is wrong; what to do
    return message[len(str(path)) + 1 :]


def test_error_toml_syntax_has_line(tmp_path: Path) -> None:
    text = (
        GOOD.format(id="a", pattern="x1", severity="error")
        + '\n[[signature]]\nid = "b\ntitle = 3\n'
    )
    message = _error(tmp_path, text)
    line = text.splitlines().index('id = "b') + 1
    assert message.startswith(f"{line}: invalid TOML (")
    assert "column" in message


def test_error_toml_truncated_file_points_at_its_end(tmp_path: Path) -> None:
    text = GOOD.format(id="a", pattern="x1", severity="error") + 'competing = ["never closed",\n'
    message = _error(tmp_path, text)
    assert message.startswith(f"{len(text.splitlines())}: invalid TOML (")
    assert "at the end of the file" in message


def test_error_missing_field_names_the_table_line(tmp_path: Path) -> None:
    text = GOOD.format(id="a", pattern="x1", severity="error") + GOOD.format(
        id="x", pattern="x2", severity="error"
    ).replace("pattern = 'x2'\n", "")
    message = _error(tmp_path, text)
    header = [i for i, line in enumerate(text.splitlines(), 1) if line == "[[signature]]"][1]
    assert message == f'{header}: signature "x" has no pattern; add pattern = "..."'


def test_error_missing_id(tmp_path: Path) -> None:
    text = GOOD.format(id="a", pattern="x1", severity="error").replace('id = "a"\n', "")
    assert (
        _error(tmp_path, text) == '2: a [[signature]] table has no id; add id = "kebab-case-name"'
    )


def test_error_bad_severity_points_at_the_key(tmp_path: Path) -> None:
    text = GOOD.format(id="a", pattern="x1", severity="fatal")
    message = _error(tmp_path, text)
    line = [i for i, x in enumerate(text.splitlines(), 1) if x.startswith("severity")][0]
    assert (
        message
        == f'{line}: signature "a" has severity "fatal"; use one of info, warning, error, critical'
    )


def test_user_signature_role_defaults_to_cause_and_is_checked(tmp_path: Path) -> None:
    plain = write(tmp_path, "plain.toml", GOOD.format(id="site-a", pattern="x1", severity="error"))
    assert load_catalog([plain]).get("site-a").role == "cause"
    noticed = write(
        tmp_path, "notice.toml", GOOD.format(id="site-b", pattern="x1", severity="warning") + 'role = "notice"\n'
    )
    assert load_catalog([noticed]).get("site-b").role == "notice"
    text = GOOD.format(id="a", pattern="x1", severity="error") + 'role = "symptom"\n'
    message = _error(tmp_path, text)
    assert message == (
        f'{len(text.splitlines())}: signature "a" has role "symptom"; use one of cause, consequence, notice'
    )


def test_error_unknown_key(tmp_path: Path) -> None:
    text = GOOD.format(id="a", pattern="x1", severity="error") + 'patern = "oops"\n'
    message = _error(tmp_path, text)
    assert message.startswith(
        f'{len(text.splitlines())}: signature "a" has unknown key "patern"; use only id, '
    )


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("Failed to (lock", "does not compile (missing ), unterminated subpattern at position 10)"),
        ("lock(?=ed)", 'uses a lookaround at "(?="'),
        ("(?<!un)locked page", 'uses a lookaround at "(?<!"'),
        (r"(page) \1", r'uses a backreference at "\1"'),
        (r"final line\Z", r"uses an escape only Python knows"),
        ("(?P<what>page) lock", 'uses a named group at "(?P<w"'),
        ("a++b", 'uses a possessive quantifier at "++"'),
        ("(?>atomic)x", 'uses an atomic group at "(?>"'),
        ("x*", "matches an empty line"),
        ("token usage", "matches an ordinary Prefill/Decode batch line"),
        ("[[:alpha:]]+ page", "has a set that Python's re reads otherwise than RE2 and hyperscan"),
        (r"(\w+\s?){1,2000}QZX", '"(\\w+\\s?){1,2000}QZX" has a repeat inside a repeat'),
    ],
)
def test_error_bad_pattern_points_at_the_pattern_line(
    tmp_path: Path, pattern: str, expected: str
) -> None:
    text = GOOD.format(id="a", pattern=pattern, severity="error")
    message = _error(tmp_path, text)
    line = [i for i, x in enumerate(text.splitlines(), 1) if x.startswith("pattern")][0]
    assert message.startswith(f'{line}: signature "a" pattern {expected}')


def test_validating_a_nested_repeat_ends_and_says_nothing_on_stderr(tmp_path: Path) -> None:
    # `re` over the ordinary batch lines tried 2**60 splits of "Prefill batch(.*)*QZX"; RE2 answers
    # at once. A POSIX class made `re` print a FutureWarning.
    path = write(tmp_path, "nested.toml", GOOD.format(id="a", pattern="Prefill batch(.*)*QZX", severity="error")
                 + GOOD.format(id="b", pattern="[[:alpha:]]+ page", severity="error"))
    code = ("from radixtop.diagnosis.catalog import CatalogError, load_catalog\n"
            f"try:\n    load_catalog([{str(path)!r}])\nexcept CatalogError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert 'signature "b" pattern has a set that Python' in done.stdout


def test_escaped_constructs_are_literals_and_allowed() -> None:
    assert pattern_problem(r"literal \(\?= and a\+\+ plus") is None
    assert (
        pattern_problem(r"path\\1 and \\Z text") is None
    )  # an escaped backslash, then a literal 1 / Z
    assert pattern_problem(r"C:\\dir") is None


def test_error_duplicate_id(tmp_path: Path) -> None:
    text = GOOD.format(id="a", pattern="x1", severity="error") + GOOD.format(
        id="a", pattern="x2", severity="error"
    )
    message = _error(tmp_path, text)
    assert 'signature "a" is defined twice (first at line 2)' in message


def test_error_wrong_types(tmp_path: Path) -> None:
    text = GOOD.format(id="a", pattern="x1", severity="error").replace(
        'first_checks = ["look here"]', 'first_checks = "look"'
    )
    assert 'signature "a" first_checks must be a list of non-empty strings' in _error(
        tmp_path, text
    )
    text = GOOD.format(id="Not Kebab", pattern="x1", severity="error")
    assert 'signature "Not Kebab" id is not kebab-case' in _error(tmp_path, text)
    text = GOOD.format(id="a", pattern="x1", severity="error").replace(
        'title = "A custom failure"', "title = 5"
    )
    assert 'signature "a" title must be a non-empty string' in _error(tmp_path, text)


def test_error_file_level_problems(tmp_path: Path) -> None:
    assert _error(tmp_path, "").startswith("1: no [[signature]] tables found;")
    assert _error(tmp_path, "version = 2\n").startswith('1: unknown top-level key "version";')
    assert _error(tmp_path, '[signature]\nid = "a"\n').startswith(
        "1: no [[signature]] tables found;"
    )

    missing = tmp_path / "missing.toml"
    with pytest.raises(CatalogError) as caught:
        load_catalog([missing])
    assert str(caught.value).startswith(f"{missing}:1: cannot read the signature file (")

    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"# ok\n# ok\n\xff\xfe\n")
    with pytest.raises(CatalogError) as caught:
        load_catalog([binary])
    assert (
        str(caught.value) == f"{binary}:3: the file is not UTF-8 text (byte 0xff); save it as UTF-8"
    )


# -- the cache of the validated built-in catalog --------------------------------------------------

BUILTIN_TOML = Path(catalog_module.__file__).with_name("signatures.toml")


@pytest.fixture()
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("RADIXTOP_CACHE_DIR", str(directory))
    return directory


@pytest.fixture()
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources parse_catalog is called for (a cache hit calls it for none)."""
    calls: list[str] = []
    real = catalog_module.parse_catalog

    def spy(text: str, source: str, *, origin: str):
        calls.append(source)
        return real(text, source, origin=origin)

    monkeypatch.setattr(catalog_module, "parse_catalog", spy)
    return calls


def _cache_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("catalog-*")) if directory.exists() else []


def test_builtin_catalog_from_the_cache_equals_a_fresh_parse(cache_dir: Path, parses: list[str]) -> None:
    fresh = catalog_module.parse_catalog(
        BUILTIN_TOML.read_text(encoding="utf-8"), "signatures.toml (built-in)", origin="builtin"
    )
    parses.clear()
    first = load_catalog()  # parses, then writes the cache
    assert parses == ["signatures.toml (built-in)"] and len(_cache_files(cache_dir)) == 1
    second = load_catalog()  # from the cache: nothing parsed
    assert parses == ["signatures.toml (built-in)"]
    assert first.signatures == second.signatures == fresh
    assert all(sig.origin == "builtin" for sig in second.signatures)


def test_builtin_cache_rebuilt_when_the_toml_changes_even_with_same_size_and_mtime(
    tmp_path: Path, cache_dir: Path, parses: list[str]
) -> None:
    toml = write(tmp_path, "signatures.toml", BUILTIN_TOML.read_text(encoding="utf-8"))
    before = catalog_module._builtin_signatures(str(toml))
    stat = toml.stat()
    text = toml.read_text(encoding="utf-8")
    old_title = before[0].title
    new_title = old_title[:-1] + ("X" if old_title[-1] != "X" else "Y")  # same length
    toml.write_text(text.replace(f'title = "{old_title}"', f'title = "{new_title}"', 1), encoding="utf-8")
    os.utime(toml, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert toml.stat().st_size == stat.st_size
    after = catalog_module._builtin_signatures(str(toml))
    assert after[0].title == new_title and after[1:] == before[1:]
    assert len(parses) == 2
    assert catalog_module._builtin_signatures(str(toml))[0].title == new_title
    assert len(parses) == 2  # the rebuilt cache is used again
    assert len(_cache_files(cache_dir)) == 1  # and it replaced the stale one


def test_builtin_cache_rebuilt_when_the_validating_code_changes(
    tmp_path: Path, cache_dir: Path, parses: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code = write(tmp_path, "catalog.py", "# stands in for catalog.py\n")
    monkeypatch.setattr(catalog_module, "__file__", str(code))
    catalog_module._builtin_signatures(str(BUILTIN_TOML))
    catalog_module._builtin_signatures(str(BUILTIN_TOML))
    assert len(parses) == 1
    code.write_text("# stands in for catalog.py, edited\n")
    catalog_module._builtin_signatures(str(BUILTIN_TOML))
    assert len(parses) == 2


@pytest.mark.parametrize(
    "damage",
    ["garbage", "truncated", "flipped byte", "empty", "not marshal", "wrong shape", "bad severity"],
)
def test_damaged_builtin_cache_falls_back_to_the_toml_and_is_rewritten(
    cache_dir: Path, parses: list[str], damage: str
) -> None:
    good = load_catalog()
    [cache] = _cache_files(cache_dir)
    data = cache.read_bytes()
    if damage == "garbage":
        cache.write_bytes(b"\x00\xff" * 100)
    elif damage == "truncated":
        cache.write_bytes(data[: len(data) // 2])
    elif damage == "flipped byte":
        cache.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif damage == "empty":
        cache.write_bytes(b"")
    else:
        # A well-formed cache file whose payload is not what this code writes.
        import marshal

        from radixtop.diagnosis import diskcache

        rows = [tuple(getattr(s, f) for f in catalog_module._FIELDS) for s in good.signatures]
        bad = list(rows[0])
        bad[3] = "fatal"
        payload = {
            "not marshal": b"\xff\xfe not marshal",
            "wrong shape": marshal.dumps(tuple(row[:5] for row in rows)),
            "bad severity": marshal.dumps((tuple(bad), *rows[1:])),
        }[damage]
        path = catalog_module._BUILTIN_FILE
        key = catalog_module._cache_key(path, Path(path).read_bytes())
        diskcache.write(str(cache), key, payload)
        assert diskcache.read(str(cache), key) == payload  # the damage is past the checksum
    parses.clear()
    assert load_catalog().signatures == good.signatures
    assert parses == ["signatures.toml (built-in)"]
    parses.clear()
    assert load_catalog().signatures == good.signatures
    assert parses == []  # rewritten, and good again


def test_unusable_cache_directory_still_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = write(tmp_path, "not-a-dir", "a file where the cache directory should be")
    monkeypatch.setenv("RADIXTOP_CACHE_DIR", str(blocker / "radixtop"))
    assert load_catalog().ids == load_catalog().ids
    monkeypatch.setenv("RADIXTOP_CACHE_DIR", "")  # caching off
    assert len(load_catalog().signatures) >= 25


def test_user_catalogs_are_never_cached(tmp_path: Path, cache_dir: Path, parses: list[str]) -> None:
    user = write(
        tmp_path,
        "site.toml",
        GOOD.format(id="site-disk-full", pattern="No space left on device", severity="error")
        + GOOD.format(id="kv-pool-retract", pattern=r"KV cache pool is full\.", severity="error"),
    )
    first = load_catalog([user])
    assert first.get("site-disk-full").severity == "error"
    user.write_text(
        GOOD.format(id="site-disk-full", pattern="No space left on device", severity="critical"),
        encoding="utf-8",
    )
    second = load_catalog([user])
    assert second.get("site-disk-full").severity == "critical"
    assert second.get("kv-pool-retract").origin == "builtin"  # the replacement went with the file
    assert parses.count(str(user)) == 2
    builtin = load_catalog()
    assert "site-disk-full" not in builtin.ids and builtin.get("kv-pool-retract").origin == "builtin"
    cached = b"".join(path.read_bytes() for path in _cache_files(cache_dir))
    assert b"No space left on device" not in cached and str(user).encode() not in cached


def test_invalid_builtin_toml_is_an_error_and_never_cached(tmp_path: Path, cache_dir: Path) -> None:
    toml = write(tmp_path, "signatures.toml", GOOD.format(id="x-y", pattern="(?=a)b", severity="error"))
    for _ in range(2):
        with pytest.raises(CatalogError, match="lookaround"):
            catalog_module._builtin_signatures(str(toml))
    assert _cache_files(cache_dir) == []
