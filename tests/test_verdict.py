"""The verdict's rules on the arms' evidence (the arms themselves are run in test_confirm_arms.py
and, against a real SGLang server, in test_sglang_server.py)."""

from __future__ import annotations

from dataclasses import replace

from radixtop.incident.verdict import ArmEvidence, ArmRole, decide


def arm(role: ArmRole, *, signatures: tuple[str, ...] = (), answered: int = 96, failed: int = 0, alive: bool = True) -> ArmEvidence:
    return ArmEvidence(role, url="http://127.0.0.1:1", healthy=True, signatures=signatures, calls=96, calls_per_run=32,
                       runs=3, answered_calls=answered, failed_calls=failed, alive_after=alive, peak_token_usage=0.5)  # fmt: skip


CRASH = ("scheduler-exception", "subprocess-crashed")


def test_both_arms_failing_the_same_way_at_once_is_the_workloads_fault_not_persistence() -> None:
    decision = decide(arm("reproduction", signatures=CRASH, answered=0, failed=8, alive=False),
                      arm("control", signatures=CRASH, answered=1, failed=7, alive=False),
                      control_summary="--max-running-requests 2, --disable-radix-cache", cache_disabled=True)  # fmt: skip
    assert decision.verdict == "inconclusive"
    assert "both arms failed the same way (scheduler-exception, subprocess-crashed)" in decision.reason
    assert "0 and 1 calls answered" in decision.reason


def test_a_failure_that_came_after_the_workload_ran_and_stays_under_the_control_persists() -> None:
    late = arm("reproduction", signatures=CRASH, answered=70, failed=26, alive=False)
    decision = decide(late, arm("control", signatures=CRASH, answered=0, failed=8, alive=False),
                      control_summary="c", cache_disabled=True)  # fmt: skip
    assert decision.verdict == "persists-under-control"
    # Different failures at once are not "the same way".
    other = arm("control", signatures=("cuda-oom",), answered=0, failed=8, alive=False)
    assert decide(arm("reproduction", signatures=CRASH, answered=0, failed=8, alive=False), other,
                  control_summary="c", cache_disabled=True).verdict == "persists-under-control"  # fmt: skip


def test_a_failure_gone_under_the_control_is_not_touched_by_the_rule() -> None:
    failing = arm("reproduction", signatures=("radix-page-lock-eviction",), answered=10, failed=22, alive=False)
    failing = replace(failing, peak_token_usage=0.97)
    assert decide(failing, arm("control"), control_summary="c", cache_disabled=True).verdict == "pressure-dependent"
