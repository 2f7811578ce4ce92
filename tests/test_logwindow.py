"""What a confirmation run's log window keeps besides signatures: the peak token usage (from the
batch lines and from any line that reports it, such as the lock race's warning, written between
two batch lines) and the retractions (counted once, not once per TP rank)."""

from __future__ import annotations

from pathlib import Path

from radixtop.diagnosis.catalog import load_catalog
from radixtop.incident.confirm.logwindow import LogWindow


def test_the_window_keeps_the_peak_token_usage_and_the_retractions(tmp_path: Path) -> None:
    log = tmp_path / "sim.log"
    log.write_text("[2026-12-03 10:00:00 TP0] old line, token usage: 0.99\n")
    window = LogWindow([str(log)], load_catalog())
    window.start()  # what was there before the window does not count
    with open(log, "a") as fh:
        fh.write("[2026-12-03 10:00:01 TP0] Decode batch, #running-req: 30, #token: 3400, token usage: 0.83, "
                 "cuda graph: True, gen throughput (token/s): 1200.00, #queue-req: 2\n")
        fh.write("[2026-12-03 10:00:01 TP1] WARNING: radix cache eviction contended with a page lock on node 7 "
                 "(token usage 0.93); retrying\n")
        for rank in ("TP0", "TP1"):
            fh.write(f"[2026-12-03 10:00:02 {rank}] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
                     "#new_tokens_gained: 512\n")
    window.poll()
    assert window.peak_token_usage == 0.93
    assert window.retracted == 2
