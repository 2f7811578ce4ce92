"""tools/mine_strings.py reads messages out of source with `ast` (no download here: a module's text)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "tools" / "mine_strings.py"
_spec = importlib.util.spec_from_file_location("mine_strings", _PATH)
assert _spec is not None and _spec.loader is not None
mine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mine)

SOURCE = '''
import logging
logger = logging.getLogger(__name__)

def dec_lock_ref(node):
    assert node.swa_lock_ref > 0, f"dec_lock_ref on node with {node.swa_lock_ref=}, {node.id=}"
    assert node.lock_ref >= 0
    if node.id < 0:
        raise RuntimeError("NCCL error: " + str(node))
    logger.info(
        "KV cache pool is full. Retract requests. "
        f"#retracted_reqs: {len(node.reqs)}, "
    )
    logger.warning("Port %d is already in use, trying port %d", 1, 2)
    self.logger.error("{} watchdog timeout".format(node))
    msg = "SWA Radix tree sanity check failed" if node.swa else "Mamba Radix tree sanity check failed"
    print(f"evicted {node.id}")
    other.debug("not a logger call")
'''


def test_messages_become_templates_with_placeholders() -> None:
    found = set(mine.messages(SOURCE))
    assert found == {
        ("assert", "dec_lock_ref on node with node.swa_lock_ref={}, node.id={}"),
        ("assert-condition", "assert node.lock_ref >= 0"),
        ("raise RuntimeError", "NCCL error: {}"),
        ("logger.info", "KV cache pool is full. Retract requests. #retracted_reqs: {}, "),
        ("logger.warning", "Port %d is already in use, trying port %d"),
        ("logger.error", "{} watchdog timeout"),
        ("message variable", "SWA Radix tree sanity check failed"),
        ("message variable", "Mamba Radix tree sanity check failed"),
        ("print", "evicted {}"),
    }


def test_a_module_that_does_not_parse_gives_nothing() -> None:
    assert mine.messages("def broken(:\n") == []


def test_release_ranges_join_runs_of_mined_releases() -> None:
    mined = ("0.3.6", "0.4.0", "0.4.6", "0.5.1", "0.5.6")
    assert mine.release_ranges(["0.4.0", "0.4.6", "0.5.1"], mined) == "0.4.0..0.5.1"
    assert mine.release_ranges(["0.3.6", "0.4.6", "0.5.1", "0.5.6"], mined) == "0.3.6,0.4.6..0.5.6"
    assert mine.release_ranges(["0.5.6"], mined) == "0.5.6"


def test_only_the_cache_scheduler_and_distributed_code_is_read() -> None:
    assert mine._in_scope("sglang", "sglang/srt/mem_cache/radix_cache.py")
    assert mine._in_scope("sglang", "sglang/srt/managers/scheduler.py")
    assert not mine._in_scope("sglang", "sglang/srt/layers/linear.py")
    assert not mine._in_scope("sglang", "sglang/srt/mem_cache/rust_tree_core/mem_cache.so")
    assert mine._in_scope("vllm", "vllm/v1/core/kv_cache_manager.py")
