"""The verdict's rules on the arms' evidence (the arms themselves are run in test_confirm_arms.py
and, against a real SGLang server, in test_sglang_server.py)."""

from __future__ import annotations

from dataclasses import replace

from radixtop.incident.confirm.verdict import ArmEvidence, ArmRole, VerdictKind, decide


def arm(
    role: ArmRole,
    *,
    signatures: tuple[str, ...] = (),
    answered: int = 96,
    failed: int = 0,
    alive: bool = True,
) -> ArmEvidence:
    return ArmEvidence(role, url="http://127.0.0.1:1", healthy=True, signatures=signatures, calls=96, calls_per_run=32,
                       runs=3, answered_calls=answered, failed_calls=failed, alive_after=alive, peak_token_usage=0.5)


CRASH = ("scheduler-exception", "subprocess-crashed")


def test_both_arms_failing_the_same_way_at_once_is_the_workloads_fault_not_persistence() -> None:
    decision = decide(arm("reproduction", signatures=CRASH, answered=0, failed=8, alive=False),
                      arm("control", signatures=CRASH, answered=1, failed=7, alive=False),
                      control_summary="--max-running-requests 2, --disable-radix-cache", cache_disabled=True)
    assert decision.verdict == "inconclusive"
    assert "both arms failed the same way (scheduler-exception, subprocess-crashed)" in decision.reason
    assert "0 and 1 calls answered" in decision.reason


def test_a_failure_that_came_after_the_workload_ran_and_stays_under_the_control_persists() -> None:
    late = arm("reproduction", signatures=CRASH, answered=70, failed=26, alive=False)
    decision = decide(late, arm("control", signatures=CRASH, answered=0, failed=8, alive=False),
                      control_summary="c", cache_disabled=True)
    assert decision.verdict == "persists-under-control"
    # Different failures at once are not "the same way".
    other = arm("control", signatures=("cuda-oom",), answered=0, failed=8, alive=False)
    assert decide(arm("reproduction", signatures=CRASH, answered=0, failed=8, alive=False), other,
                  control_summary="c", cache_disabled=True).verdict == "persists-under-control"


def test_a_failure_gone_under_the_control_is_not_touched_by_the_rule() -> None:
    failing = arm("reproduction", signatures=("radix-page-lock-eviction",), answered=10, failed=22, alive=False)
    failing = replace(failing, peak_token_usage=0.97)
    assert decide(failing, arm("control"), control_summary="c", cache_disabled=True).verdict == "pressure-dependent"


def test_the_conditions_say_only_what_the_control_changed_alone() -> None:
    from radixtop.incident.confirm.verdict import conditions

    failing = replace(
        arm("reproduction", signatures=("radix-page-lock-eviction",), answered=10, failed=22, alive=False),
        peak_token_usage=0.97,
    )
    clean = replace(arm("control"), peak_token_usage=0.41)
    # The default control lowers the pressure and disables the cache together: neither alone is known.
    both = conditions(VerdictKind.PRESSURE_DEPENDENT, failing, clean, cache_disabled=True)
    assert (both.pressure.state, both.reuse.state, both.cache.state) == ("open", "open", "open")
    assert "0.97 to 0.41" in both.pressure.why and both.pressure.to_json()["fails_at"] == 0.97
    # --control-cache keep: the pressure alone changed.
    kept = conditions(VerdictKind.PRESSURE_DEPENDENT, failing, clean, cache_disabled=False)
    assert kept.pressure.state == "needed" and kept.pressure.to_json() == {
        "state": "needed", "why": "fails at peak token usage 0.97, clean at 0.41", "fails_at": 0.97, "clean_at": 0.41}
    assert kept.cache.state == "open" == kept.reuse.state
    # Clean without the cache at the same pressure: the cache is needed, the pressure is not.
    same = conditions(VerdictKind.CACHE_DEPENDENT, replace(failing, peak_token_usage=0.3),
                      replace(clean, peak_token_usage=0.3), cache_disabled=True)
    assert (same.pressure.state, same.reuse.state, same.cache.state) == ("not-needed", "open", "needed")
    # Still failing without the cache: neither the cache nor reuse is needed, nor the pressure.
    still = conditions(
        VerdictKind.PERSISTS_UNDER_CONTROL,
        failing,
        replace(clean, signatures=("radix-page-lock-eviction",)),
        cache_disabled=True,
    )
    assert (still.pressure.state, still.reuse.state, still.cache.state) == ("not-needed", "not-needed", "not-needed")
    assert conditions(VerdictKind.NOT_REPRODUCED, failing, clean, cache_disabled=True).pressure.state == "open"
