"""probes/procs on real processes: a parent with children titled the way SGLang titles its
schedulers; a killed child shows as a zombie, then (reaped) as gone with its time; a dead root
is DOWN."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from radixtop.probes.procs import ProcTree, role_and_rank

# The parent starts two "schedulers" (argv[0] set as setproctitle would), then reaps a child only
# when the file `reap` appears: a killed child stays a zombie until then.
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    here = sys.argv[1]
    kids = [subprocess.Popen([f"sglang::scheduler_TP{r}", "-c", "import time; time.sleep(60)"],
                             executable=sys.executable) for r in range(2)]
    open(os.path.join(here, "ready"), "w").write(" ".join(str(k.pid) for k in kids))
    deadline = time.time() + 60
    while time.time() < deadline:
        if os.path.exists(os.path.join(here, "reap")):
            for k in kids:
                k.poll()
        time.sleep(0.05)
    """
)


def _wait(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def family(tmp_path: Path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)])
    ready = tmp_path / "ready"
    assert _wait(lambda: ready.exists() and ready.read_text().strip()), "the parent did not start its children"
    kids = [int(p) for p in ready.read_text().split()]
    yield parent, kids, tmp_path
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    parent.kill()
    parent.wait(10)


def test_titles_give_role_and_rank() -> None:
    assert role_and_rank(["sglang::scheduler_TP3"]) == ("scheduler", "TP3")
    assert role_and_rank(["sglang::scheduler_DP1_TP3", "-c", "x"]) == ("scheduler", "DP1 TP3")
    assert role_and_rank("sglang::scheduler") == ("scheduler", None)
    assert role_and_rank("sglang::detokenizer") == ("detokenizer", None)
    assert role_and_rank("sglang::data_parallel_controller") == ("dp-controller", None)
    assert role_and_rank("VLLM::Worker_TP1") == ("worker", "TP1")
    assert role_and_rank(["python", "-m", "sglang.launch_server"]) == (None, None)


def test_tree_zombie_then_gone(family) -> None:
    parent, kids, here = family
    tree = ProcTree(parent.pid)
    first = tree.read()
    assert first.status.state == "ok", first.status
    by_pid = {p.pid: p for p in first.procs}
    assert by_pid[parent.pid].role == "server" and first.procs[0].pid == parent.pid
    assert {by_pid[k].label for k in kids} == {"scheduler TP0", "scheduler TP1"}
    assert all(by_pid[k].rss and by_pid[k].rss > 0 for k in kids)
    assert by_pid[kids[0]].cpu_percent is None, "no CPU figure before a second read"
    second = tree.read()
    assert {p.pid: p for p in second.procs}[kids[0]].cpu_percent is not None

    os.kill(kids[1], signal.SIGKILL)
    zombie = _wait(lambda: next(
        (s for s in [tree.read()] if any(p.pid == kids[1] and p.status == "zombie" for p in s.procs)), None
    ))
    assert zombie, "the killed scheduler should be a zombie until reaped"
    assert zombie.status.state == "degraded"
    assert f"scheduler TP1 (pid {kids[1]}) is a zombie" in zombie.problems

    (here / "reap").write_text("")
    gone = _wait(lambda: next(
        (s for s in [tree.read()] if any(p.pid == kids[1] and p.status == "gone" for p in s.procs)), None
    ))
    assert gone, "the reaped scheduler should be listed as gone"
    entry = next(p for p in gone.procs if p.pid == kids[1])
    assert entry.gone_at is not None and entry.dead
    assert any(f"scheduler TP1 (pid {kids[1]}) is gone since" in p for p in gone.problems)
    # The incident began with this child's death, before the server itself goes.
    assert gone.first_death() == (entry.gone_at, f"scheduler TP1 (pid {kids[1]})")
    assert first.first_death() is None


def test_a_plan_after_the_crash_dates_it_by_its_first_death() -> None:
    from radixtop.incident.common.sighting import Sighting

    t0 = time.mktime((2026, 12, 4, 21, 27, 0, 0, 0, -1))
    seen = Sighting("http://127.0.0.1:30000", t0 - 60, t0)
    said = seen.died(t0 + 2, "scheduler TP0 (pid 6489)").describe_age()
    assert said == "its scheduler TP0 (pid 6489) died at 21:27:02; planned from what was seen at 21:27:00"
    assert (
        Sighting.from_json(seen.died(t0 + 2, "scheduler TP0 (pid 6489)").to_json()).died_first
        == "scheduler TP0 (pid 6489)"
    )
    assert seen.died(t0 + 6).describe_age().startswith("the server died at 21:27:06")


def test_a_dead_root_is_down_and_keeps_what_it_saw(family) -> None:
    parent, _, _ = family
    tree = ProcTree(parent.pid)
    assert tree.read().status.state == "ok"
    parent.kill()
    parent.wait(10)
    sample = tree.read()
    assert sample.status.state == "down"
    assert f"server process {parent.pid} is gone" in sample.status.message
    assert {p.pid for p in sample.procs} >= {parent.pid}, "what was seen stays listed as gone"
    assert all(p.status == "gone" for p in sample.procs)


def test_a_pid_that_never_existed_is_down() -> None:
    sample = ProcTree(2**22 + 12345).read()
    assert sample.status.state == "down"
    assert "is gone" in sample.status.message
