"""The instrument's flight recorder on the simulator's radix cache (the same instrument code runs
in SGLang; tests/sglang/ checks it on the real caches): a cache that raises leaves a record on
disk whose figures are the cache's at that moment, the endpoint names where, and a recorder never
fails its host nor writes without bound."""

from __future__ import annotations

import json
import logging
import os
import stat
import types
from pathlib import Path

import httpx
import pytest
from test_instrument import direct_walk, filled_sim_cache, insert

from radixtop.instrument import flight
from radixtop.instrument.endpoint import Instrumentation
from radixtop.instrument.flight import MAX_WRITES, FlightRecorder, flight_dir, record_name
from radixtop.schema import HEALTH_PATH, FlightRecord
from radixtop.sim.radix import EvictParams, RadixCache, RadixCacheError

LOCK_MESSAGE = "Failed to lock memory page during dynamic prefix eviction"


class FailingEvict(RadixCache):
    fail = False

    def evict(self, params):  # SGLang >= 0.5's shape
        if self.fail:
            raise RadixCacheError(LOCK_MESSAGE)
        return super().evict(params)


def read_record(path: Path) -> FlightRecord:
    return FlightRecord.from_dict(json.loads(path.read_bytes()))


def test_an_evict_that_raises_leaves_a_record_with_the_caches_figures_at_that_moment(tmp_path: Path):
    cache = filled_sim_cache(n_prompts=30)
    cache.__class__ = FailingEvict
    locked = [insert(cache, list(range(2000, 2000 + n))) for n in (5, 9)]
    for node in locked:
        cache.inc_lock_ref(node)
    inst = Instrumentation(cache, rank=3, port=0, flight_dir=tmp_path)
    try:
        cache.evict(EvictParams(num_tokens=4))
        cache.inc_lock_ref(locked[0])  # one more lock: the record must see it
        expected = (cache.evictable_size(), cache.protected_size(), direct_walk(cache))
        cache.fail = True
        with pytest.raises(RadixCacheError, match=LOCK_MESSAGE):
            cache.evict(EvictParams(num_tokens=64))
        path = tmp_path / record_name(3, os.getpid())
        record = read_record(path)
        snap = record.snapshot
        assert (snap.evictable_tokens, snap.protected_tokens) == expected[:2]
        count, _, histogram = expected[2]
        assert snap.census is not None and snap.census.complete
        assert snap.census.node_count == count and dict(snap.census.lock_ref_histogram) == histogram
        assert (snap.counters.lock_ops, snap.counters.evict_failures) == (1, 1)  # counted since installed
        assert record.rank == 3 and record.pid == os.getpid()
        assert [t.kind for t in record.triggers] == ["evict_failure"]
        assert record.triggers[0].message == f"RadixCacheError: {LOCK_MESSAGE}"
        assert record.events[-1].kind == "evict_failure"
        assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file, renamed
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    finally:
        inst.close()


def test_the_hosts_exception_handler_adds_its_trigger_to_the_first_and_the_endpoint_names_the_directory(tmp_path: Path):
    cache = filled_sim_cache(n_prompts=5)
    inst = Instrumentation(cache, rank=0, port=0, flight_dir=tmp_path / "flight")
    assert inst.start()
    try:
        health = httpx.get(f"{inst.endpoint.url}{HEALTH_PATH}", timeout=5).json()
        assert health["flight_dir"] == str(tmp_path / "flight")
        assert inst.flight_record("lock_failure", "RadixCacheError: first")
        assert inst.flight_record("scheduler_exception", "Scheduler hit an exception: Traceback ...")
        record = read_record(tmp_path / "flight" / record_name(0, os.getpid()))
        assert [(t.kind, t.message) for t in record.triggers] == [
            ("lock_failure", "RadixCacheError: first"),
            ("scheduler_exception", "Scheduler hit an exception: Traceback ..."),
        ]
    finally:
        inst.close()


def test_a_cache_failing_in_a_loop_writes_a_bounded_number_of_times(tmp_path: Path):
    recorder = FlightRecorder(filled_sim_cache(n_prompts=3), rank=0, directory=tmp_path)
    written = [recorder.record("evict_failure", f"failure {i}") for i in range(MAX_WRITES + 5)]
    assert written == [True] * MAX_WRITES + [False] * 5
    record = read_record(tmp_path / record_name(0, os.getpid()))
    assert len(record.triggers) == MAX_WRITES  # the file holds what was known at its last write
    assert record.triggers[0].message == "failure 0"  # the first one first


def test_a_directory_it_cannot_write_costs_the_host_nothing(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    recorder = FlightRecorder(filled_sim_cache(n_prompts=3), rank=0, directory=blocker / "flight")
    assert recorder.record("evict_failure", "x") is False
    assert recorder.last_error.startswith(("NotADirectoryError", "FileExistsError"))


def test_a_huge_tree_is_cut_to_fit_the_size_cap(tmp_path: Path, monkeypatch):
    cache = filled_sim_cache(n_prompts=400)
    assert FlightRecorder(cache, rank=0, directory=tmp_path / "whole").record("evict_failure", "x")
    whole = (tmp_path / "whole" / record_name(0, os.getpid())).stat().st_size
    monkeypatch.setattr(flight, "MAX_RECORD_BYTES", whole // 2)
    assert FlightRecorder(cache, rank=0, directory=tmp_path / "cut").record("evict_failure", "x")
    path = tmp_path / "cut" / record_name(0, os.getpid())
    record = read_record(path)
    assert path.stat().st_size <= whole // 2 and record.snapshot.tree is not None
    assert record.snapshot.census is not None and record.snapshot.census.node_count >= len(record.snapshot.tree.nodes)
    assert record.snapshot.tree.cut_nodes > 0  # and it says so


def test_a_first_record_makes_the_runtime_directory_private_so_radixtop_keeps_using_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """On a node where nothing of radixtop ran yet, an instrumented server's first flight record
    makes the runtime directory: 0700 like radixtop's own (made with the umask's 0755, every
    radixtop after refused it as open to other users: its sightings, its node bundles)."""
    from radixtop.rundir import runtime_dir

    base = tmp_path / "not-yet" / "radixtop"
    monkeypatch.setenv("RADIXTOP_RUNTIME_DIR", str(base))
    monkeypatch.delenv("RADIXTOP_FLIGHT_DIR", raising=False)
    old_umask = os.umask(0o022)
    try:
        recorder = FlightRecorder(filled_sim_cache(n_prompts=3), rank=0, directory=flight_dir())
        assert recorder.record("evict_failure", "x"), recorder.last_error
    finally:
        os.umask(old_umask)
    for made in (base.parent, base, base / "flight"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made
    assert runtime_dir("sightings") == base / "sightings"  # radixtop takes it as its own


def test_the_directory_follows_the_environment(tmp_path: Path):
    assert flight_dir({"RADIXTOP_FLIGHT_DIR": str(tmp_path / "x")}) == tmp_path / "x"
    assert flight_dir({"RADIXTOP_RUNTIME_DIR": str(tmp_path / "rt")}) == tmp_path / "rt" / "flight"
    assert flight_dir({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / "radixtop" / "flight"


def test_the_schedulers_exception_handler_records_every_rank_of_the_process(caplog):
    """SGLang's run_scheduler_process logs "Scheduler hit an exception: <traceback>" and SIGQUITs
    its parent: the glue's log handler records the rank there, with the traceback's last line."""
    from radixtop.instrument.config import InstrumentConfig
    from radixtop.instrument.sglang import SCHEDULER_MODULE, SafePoints

    points = SafePoints(config_source=lambda: InstrumentConfig(base_port=0))
    scheduler = types.SimpleNamespace(tree_cache=filled_sim_cache(n_prompts=5), tp_rank=1, tp_size=2)
    try:
        points.at(scheduler)
        (inst,) = points.instruments()
        logging.getLogger(SCHEDULER_MODULE).error(
            "Scheduler hit an exception: Traceback (most recent call last):\n  File \"scheduler.py\", line 1\n"
            f"radixtop.sim.radix.RadixCacheError: {LOCK_MESSAGE}\n"
        )
        record = read_record(Path(inst.endpoint.flight_dir) / record_name(1, os.getpid()))
        assert [(t.kind, t.message) for t in record.triggers] == [
            ("scheduler_exception", f"Scheduler hit an exception: radixtop.sim.radix.RadixCacheError: {LOCK_MESSAGE}")
        ]
        assert record.snapshot.evictable_tokens == scheduler.tree_cache.evictable_size()
        logging.getLogger(SCHEDULER_MODULE).error("Scheduler: an ordinary error")  # not the handler's line
        assert len(read_record(Path(inst.endpoint.flight_dir) / record_name(1, os.getpid())).triggers) == 1
    finally:
        points.close()


def test_a_directory_that_is_a_symlink_is_refused(tmp_path: Path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "flight").symlink_to(tmp_path / "elsewhere")
    recorder = FlightRecorder(filled_sim_cache(n_prompts=3), rank=0, directory=tmp_path / "flight")
    assert recorder.record("evict_failure", "x") is False
    assert "is not a directory of yours" in recorder.last_error and not any((tmp_path / "elsewhere").iterdir())


def test_a_directory_open_to_others_is_refused_and_a_planted_fifo_never_hangs_the_failing_thread(tmp_path: Path):
    """In a flight directory others may write, a FIFO at the temporary's old name would block
    the failing scheduler thread in open(); such a directory is refused, and the record's
    temporary is created exclusively under a random name in a private one."""
    shared = tmp_path / "flight"
    shared.mkdir()
    shared.chmod(0o777)
    os.mkfifo(shared / ".rank0-pid1.json.tmp")
    recorder = FlightRecorder(filled_sim_cache(n_prompts=3), rank=0, directory=shared)
    assert recorder.record("evict_failure", "x") is False
    assert "open to other users" in recorder.last_error
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.mkfifo(private / f".{record_name(0, os.getpid())}.tmp")
    recorder = FlightRecorder(filled_sim_cache(n_prompts=3), rank=0, directory=private)
    assert recorder.record("evict_failure", "x") is True
    assert stat.S_IMODE(recorder.path.stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_the_bundle_collects_only_records_written_by_the_servers_user_and_never_through_a_link(tmp_path: Path):
    """A record is read through the descriptor that was checked (no link swapped in between),
    and a record planted by another user under the server's pid is not the server's evidence."""
    from radixtop.incident.bundle.evidence import collect_flight

    class Sink:
        def __init__(self) -> None:
            self.files: dict[str, object] = {}
            self.notes: dict[str, str] = {}

        def json(self, name: str, obj: object) -> None:
            self.files[name] = obj

        def note(self, name: str, text: str) -> None:
            self.notes[name] = text

    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    recorder = FlightRecorder(filled_sim_cache(n_prompts=3), rank=0, directory=ours)
    assert recorder.record("evict_failure", "x") is True
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o755)
    forged = planted / record_name(1, os.getpid())
    forged.write_bytes(recorder.path.read_bytes())
    os.chown(forged, 65534, 65534)
    (planted / record_name(2, os.getpid())).symlink_to(recorder.path)
    sink = Sink()
    found = collect_flight(sink, os.getpid(), [ours, planted])
    assert list(sink.files) == [f"flight/{recorder.path.name}"] and len(found) == 1, (sink.files, sink.notes)
