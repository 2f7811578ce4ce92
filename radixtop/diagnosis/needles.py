"""The plain strings that tell a log reader which lines to read, apart from the readers.

The log pane's ingest looks for all of them in its one matcher pass a batch (session/needles.py).
They live here, not in their readers, so that the ingest needs neither reader before the first
frame: the printed-tree reader brings the snapshot schema with it (tens of milliseconds of import).
"""

from __future__ import annotations

# A radix tree SGLang printed (diagnosis/printed_tree.py): its rows, what prints one, the pool's
# line beside it, and its total.
TREE_ROW_NEEDLES = ("] r=", ") r=", " full_lock=")
TREE_TRIGGER_NEEDLES = ("out of memory", "Out of memory", "Sanity check FAILED")
TREE_POOL_NEEDLES = ("Try to allocate", "available_size=")
TREE_TOTAL_NEEDLE = "#tokens: "
PRINTED_TREE_NEEDLES = (*TREE_ROW_NEEDLES, *TREE_TRIGGER_NEEDLES, *TREE_POOL_NEEDLES, TREE_TOTAL_NEEDLE)

# What a retraction line and vLLM's stats line hold (session/vitals.py live_lines).
RARE_NEEDLES = ("etract", "KV cache usage")
