"""The experiment's rules on the steps' evidence (the steps themselves run in test_confirm.py and
test_confirm_arms.py, and against a real SGLang server in test_sglang_server.py)."""

from __future__ import annotations

from dataclasses import replace

from radixtop.incident.confirm.judge import judge
from radixtop.incident.confirm.verdict import ArmEvidence, ArmRole, StepKind, Verdict

LOCK = ("radix-page-lock-eviction",)
CRASH = ("scheduler-exception", "subprocess-crashed")


def step(
    kind: StepKind = "as-run",
    role: ArmRole = "reproduction",
    *,
    signatures: tuple[str, ...] = (),
    diverged: tuple[str, ...] = (),
    answered: int = 96,
    failed: int = 0,
    alive: bool = True,
    usage: float | None = 0.5,
    in_flight: int | None = None,
    cached: int | None = 800,
    reuse_off: str | None = None,
) -> ArmEvidence:
    account = None if cached is None else {"calls": 96, "cached_tokens": cached, "prompt_tokens": 9600}
    return ArmEvidence(role, url="http://127.0.0.1:1", healthy=True, signatures=signatures, diverged=diverged,
                       calls=96, calls_per_run=32, runs=3, answered_calls=answered, failed_calls=failed,
                       alive_after=alive, peak_token_usage=usage, step=kind, max_in_flight=in_flight,
                       cached_tokens=account, reuse_off=reuse_off)


def states(decision) -> tuple[str, str, str]:
    c = decision.conditions
    return c.pressure.state, c.reuse.state, c.cache.state


def test_the_lock_race_needs_pressure_and_the_caches_eviction_path_not_reuse() -> None:
    steps = [
        step("lower-pressure", "baseline", usage=0.61, in_flight=8),
        step("as-run", "baseline", signatures=LOCK, usage=0.97, answered=40, failed=56, alive=False),
        step("reuse-off", signatures=LOCK, usage=0.91, cached=0, reuse_off="SGLANG_RADIX_FORCE_MISS=1",
             answered=50, failed=46, alive=False),
        step("cache-off", "control", usage=0.93, cached=0),
    ]
    # Clean without the cache only below every pressure it failed at: the change lowered the pressure too.
    low = judge([*steps[:3], replace(steps[3], peak_token_usage=0.89)])
    assert low.conditions.cache.state == "open" and "0.89 against 0.91" in low.conditions.cache.why
    decision = judge(steps)  # clean at 0.93, where it failed with reuse off (0.91): the cache is needed
    assert decision.verdict == "pressure-dependent", decision.reason
    assert states(decision) == ("needed", "not-needed", "needed")
    assert decision.conditions.pressure.to_json() == {
        "state": "needed", "why": "fails at peak token usage 0.97 (as recorded), clean at 0.61 (at most 8 in flight)",
        "fails_at": 0.97, "clean_at": 0.61}
    assert "persists with reuse off, gone with the cache disabled" in decision.conditions.cache.why


def test_a_control_at_a_usage_the_log_cannot_tell_from_the_failures_is_at_its_pressure() -> None:
    """SGLang logs token usage to two places: a control that reached 0.897 where the failure came at
    0.901 (both "0.90") ran at the failure's pressure; one a logged step lower did not."""
    steps = [
        step("lower-pressure", "baseline", usage=0.61, in_flight=8),
        step("as-run", "baseline", signatures=LOCK, usage=0.901, answered=40, failed=56, alive=False),
        step("reuse-off", signatures=LOCK, usage=0.95, cached=0, reuse_off="SGLANG_RADIX_FORCE_MISS=1",
             answered=50, failed=46, alive=False),
    ]
    same = judge([*steps, step("cache-off", "control", usage=0.897, cached=0)])
    assert states(same) == ("needed", "not-needed", "needed"), same.conditions.cache.why
    lower = judge([*steps, step("cache-off", "control", usage=0.89, cached=0)])
    assert lower.conditions.cache.state == "open" and "0.89 against 0.90" in lower.conditions.cache.why


def test_a_stale_page_at_low_usage_needs_reuse_not_pressure() -> None:
    steps = [step("lower-pressure", "baseline", diverged=("r02",), usage=0.2, in_flight=4),
             step("reuse-off", "baseline", usage=0.2, in_flight=4, cached=0, reuse_off="a namespace per request")]
    decision = judge(steps)
    assert decision.verdict == "cache-dependent" and states(decision) == ("not-needed", "needed", "needed")
    assert "below pressure" in decision.conditions.pressure.why
    assert decision.conditions.pressure.fails_at == 0.2


def test_reuse_that_was_not_off_decides_nothing() -> None:
    steps = [step("as-run", diverged=("r02",), usage=0.2),
             step("reuse-off", usage=0.2, cached=320, reuse_off="a namespace per request")]
    decision = judge(steps)
    assert decision.conditions.reuse.state == "open" and "reuse was not off: 320 cached tokens" in (
        decision.conditions.reuse.why)


def test_a_failure_with_no_prefix_hit_does_not_need_reuse() -> None:
    decision = judge([step("as-run", signatures=LOCK, usage=0.3, cached=0)], unasked={"cache": "no GPU is free"})
    assert states(decision) == ("not-needed", "not-needed", "open")
    assert decision.verdict == "persists-under-control" and "open: cache" in decision.reason
    assert decision.conditions.cache.why == "no GPU is free"


def test_steps_failing_the_same_way_at_once_is_the_workloads_fault_not_persistence() -> None:
    decision = judge([step("lower-pressure", signatures=CRASH, answered=0, failed=8, alive=False, in_flight=2),
                      step("reuse-off", signatures=CRASH, answered=1, failed=7, alive=False, cached=0,
                           reuse_off="SGLANG_RADIX_FORCE_MISS=1")])
    assert decision.verdict == "inconclusive"
    assert "2 steps failed the same way (scheduler-exception, subprocess-crashed)" in decision.reason
    assert "0 and 1 calls answered" in decision.reason
    # Different failures at once are not "the same way".
    other = judge([step("lower-pressure", signatures=CRASH, answered=0, failed=8, alive=False, in_flight=2),
                   step("cache-off", "control", signatures=("cuda-oom",), answered=0, failed=8, alive=False)])
    assert other.verdict != "inconclusive"


def test_clean_as_recorded_is_not_reproduced_and_an_open_ladder_says_why() -> None:
    assert judge([step("lower-pressure", in_flight=2), step("as-run")]).verdict == "not-reproduced"
    # The live server died, no other may start: the ladder's top could not run.
    gone = replace(step("as-run", "baseline"), healthy=False, answered_calls=0, runs=None,
                   error="the live server died in step 1 and no GPU is free to start another")
    decision = judge([step("lower-pressure", "baseline", in_flight=2), gone])
    assert decision.verdict == "inconclusive" and "no GPU is free" in decision.reason
    # The lowest rung still under pressure: the ladder did not get below it.
    high = judge([step("lower-pressure", signatures=LOCK, usage=0.95, in_flight=2)])
    assert high.conditions.pressure.state == "open" and "did not get below pressure" in high.conditions.pressure.why


def clean_below_failing_above() -> Verdict:
    steps = (step("lower-pressure", "baseline", usage=0.5, in_flight=8),
             step("as-run", "baseline", signatures=LOCK, usage=1.0, alive=False))
    decision = judge(steps)
    return Verdict(decision.verdict, decision.reason, steps, bundle=None, repeat=["radixtop"], workdir="/w",
                   conditions=decision.conditions)


def test_the_verdict_shows_the_steps_as_a_table_and_the_ladder_as_a_picture() -> None:
    verdict = clean_below_failing_above()
    picture = verdict.ladder_picture()
    assert picture[1].split() == ["8", "in", "flight", "██████████··········", "0.50", "clean"]
    assert picture[2].split() == ["as", "recorded", "████████████████████", "1.00", "FAIL"]
    table = verdict.table()
    assert table[2].split()[:7] == ["2", "as", "run", "as", "recorded", "live", "radix-page-lock-eviction"]
    doc = verdict.to_json()
    assert [s["step"] for s in doc["steps"]] == ["lower-pressure", "as-run"]
    assert doc["ladder"] == [{"max_in_flight": 8, "peak_token_usage": 0.5, "failed": False, "role": "baseline"},
                             {"max_in_flight": None, "peak_token_usage": 1.0, "failed": True, "role": "baseline"}]
    assert all(len(line) <= 100 for line in table)


def test_a_narrow_screen_gets_the_table_without_its_least_columns() -> None:
    verdict = clean_below_failing_above()
    wide = verdict.table()
    assert wide[0].split()[-3:] == ["evict/s", "retr", "cached"] and verdict.table(200) == wide
    narrow = verdict.table(72)  # an 80-column terminal's run screen
    assert all(len(line) <= 72 for line in narrow), narrow
    assert narrow[0].split() == ["#", "change", "in", "flight", "result", "peak"]
    assert narrow[2].split()[:5] == ["2", "as", "run", "as", "recorded"] and narrow[2].split()[-1] == "1.00"
    assert verdict.summary(72)[-len(verdict.ladder_picture()) - 3:-len(verdict.ladder_picture())] == narrow
