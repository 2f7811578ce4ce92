"""The simulator's crash dumps: SGLang's file, folder, log lines and pickle, read back by radixtop.

A simulator with --crash-dump-folder (or armed by POST /configure_logging) that the lock race kills
writes DIR/<host>/crash_dump_<time>.pkl before its crash diagnostics, logs the line radixtop looks
for, and the dump holds what it was sent: the exact input_ids, sampling params, rids and cache
namespaces, the answers it gave, and the requests still in flight marked as such.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import sys
import time
import types
from pathlib import Path
from typing import Any

import httpx
import pytest
from incident_helpers import LOCK_RACE_FLAGS, Sim, start_sim

from radixtop.incident.replay.crash_dump import DUMPED, dump_trace_of, read_dump
from radixtop.incident.replay.replay import replay_once
from radixtop.incident.replay.trace import plan_requests
from radixtop.incident.replay.workloads import pressure_trace
from radixtop.sim.request_log import FINISHED_WINDOW_S, GenerateReqInput, RequestLog

IO_STRUCT = "sglang.srt.managers.io_struct"
SERVER_ARGS = "sglang.srt.server_args"
SGLANG_GLOBALS = {(IO_STRUCT, "GenerateReqInput"), (SERVER_ARGS, "ServerArgs"), (SERVER_ARGS, "_rebuild_server_args")}


class _Record:
    """What a test loads SGLang's classes as: an empty object that takes the pickled state."""


class _Loader(pickle.Unpickler):
    """The dump's raw structure, in its own order, with only SGLang's names allowed."""

    def find_class(self, module: str, name: str) -> Any:
        assert (module, name) in SGLANG_GLOBALS, f"the dump names {module}.{name}"
        if name == "_rebuild_server_args":
            return lambda cls, fields, extra: types.SimpleNamespace(module=cls.module, **fields, **extra)
        return type(name, (_Record,), {"module": module})


def raw(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        return _Loader(fh).load()


def crash_under_pressure(sim: Sim) -> list[tuple[int, ...]]:
    """The pressure workload until the lock race kills the simulator; the prompts it was sent."""
    planned = plan_requests(pressure_trace(1024, 8, page_size=16))

    async def load() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(8):
                if sim.proc.poll() is not None:
                    break
                await replay_once(client, sim.url, planned)

    asyncio.run(load())
    sim.proc.wait(timeout=30)
    assert sim.proc.returncode not in (None, 0), "the lock race did not kill the simulator"
    return [tuple(p.input_ids) for p in planned]


def dumped(log: Path) -> tuple[Path, int, int]:
    """The dump the log names, with the counts it gives; exactly one such line."""
    lines = [line for line in log.read_text().splitlines() if DUMPED.search(line)]
    assert len(lines) == 1, lines
    words = lines[0].split("Dumped ", 1)[1].split()
    return Path(DUMPED.search(lines[0]).group(1)), int(words[0]), int(words[3])


def test_a_sim_the_lock_race_kills_dumps_the_requests_it_was_sent_as_sglang(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    began = time.time()
    sim = start_sim(tmp_path / "sim", *LOCK_RACE_FLAGS, "--crash-dump-folder", str(folder))
    try:
        assert httpx.get(f"{sim.url}/server_info", timeout=10).json()["crash_dump_folder"] == str(folder)
        ids = [7, 8, 9] * 20
        mine = httpx.post(f"{sim.url}/generate", json={
            "input_ids": ids, "rid": "mine-ids", "extra_key": "tenant-a",
            "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True},
        }, timeout=30).json()
        text = httpx.post(f"{sim.url}/generate", json={"text": "a b c", "rid": "mine-text"}, timeout=30)
        batch = httpx.post(f"{sim.url}/generate", json={"input_ids": [[11, 12, 13], [14, 15]], "rid": ["b0", "b1"],
                                                        "sampling_params": {"max_new_tokens": 2}}, timeout=30)
        completion = httpx.post(f"{sim.url}/v1/completions", json={"prompt": [21, 22, 23], "max_tokens": 3}, timeout=30)
        assert text.status_code == batch.status_code == completion.status_code == 200
        assert httpx.get(f"{sim.url}/health", timeout=30).status_code == 200
        sent = crash_under_pressure(sim)
    finally:
        sim.stop()
    ended = time.time()
    path, n_finished, n_unfinished = dumped(sim.log)
    # SGLang's place and name for it, written whole, private to its owner.
    host = os.environ.get("HOSTNAME") or socket.gethostname()  # SGLang's host folder
    assert path.parent == folder / host and path.name.startswith("crash_dump_")
    assert os.listdir(path.parent) == [path.name]  # no temporary file left beside it
    assert path.stat().st_mode & 0o777 == 0o600
    assert folder.stat().st_mode & 0o777 == path.parent.stat().st_mode & 0o777 == 0o700  # both made here
    log = sim.log.read_text()
    order = [
        "SIGQUIT received", "Dumping requests before crash. self.crash_dump_folder=", "Dumped ", "kill_process_tree"
    ]
    at = [log.index(text) for text in order]
    assert at == sorted(at), list(zip(order, at, strict=True))

    # As radixtop reads it.
    dump = read_dump(path)
    assert dump.page_size == 16 and "--crash-dump-folder" in (dump.launch_command or "")
    assert dump.in_flight == n_unfinished >= 1 and len(dump.requests) == n_finished + n_unfinished
    assert dump.skipped == {}
    by_rid = {r.rid: r for r in dump.requests}
    own = by_rid["mine-ids"]
    assert own.input_ids == tuple(ids) and own.extra_key == "tenant-a" and own.ignore_eos and own.max_new_tokens == 4
    assert own.finished is not None and own.prompt_tokens == len(ids) == mine["meta_info"]["prompt_tokens"]
    assert by_rid["mine-text"].text == "a b c" and by_rid["mine-text"].input_ids is None
    assert by_rid["mine-text"].max_new_tokens == 128  # SGLang's default, as the sim answered it
    assert (by_rid["b0"].input_ids, by_rid["b1"].input_ids) == ((11, 12, 13), (14, 15))  # a batch: one per prompt
    pressured = [r for r in dump.requests if r.rid not in ("mine-ids", "mine-text", "b0", "b1")]
    assert sum(1 for r in pressured if r.input_ids == (21, 22, 23) and r.max_new_tokens == 3) == 1  # the completion
    assert all(r.input_ids in sent for r in pressured if r.input_ids != (21, 22, 23))  # exactly what was sent
    assert all(began <= r.created <= (r.finished or r.created) <= ended for r in dump.requests)
    trace = dump_trace_of(dump)
    assert sum(r.in_flight for r in trace.requests) == n_unfinished

    # As SGLang wrote it: its dict, finished requests first, SGLang's names by reference only.
    doc = raw(path)
    assert list(doc) == ["server_args", "config_updates", "resolved_config", "requests", "launch_command"]
    assert doc["resolved_config"]["page_size"] == 16 and doc["server_args"].page_size == 16
    assert doc["server_args"].module == SERVER_ARGS
    requests = doc["requests"]
    done = [bool(out) for _, out, _, _ in requests]
    assert done == sorted(done, reverse=True) and done.count(False) == n_unfinished
    req, out, created, finished = next(r for r in requests if r[0].rid == "mine-ids")
    assert req.module == IO_STRUCT and type(req).__name__ == "GenerateReqInput"
    fields = list(vars(req))  # SGLang's fields in SGLang's order, then those normalizing sets
    assert fields[:3] == ["text", "input_ids", "input_embeds"] and fields[-3:] == [
        "is_single", "batch_size", "parallel_sample_num"
    ]
    assert len(fields) == 75 and vars(req)["cache_salt"] is None and vars(req)["logprob_start_len"] == -1
    assert req.sampling_params == {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    assert req.text is None and req.stream is False and req.log_metrics is True
    assert out == mine and finished >= created  # the answer it gave, as it gave it
    assert not any(r[0].rid.startswith("HEALTH_CHECK") for r in requests)  # a finished health check is not kept
    for req, out, created, finished in requests:
        if not out:  # in flight: no answer, the dump's time as its end, as SGLang
            assert finished >= created and tuple(req.input_ids) in sent


def test_configure_logging_arms_a_running_sim_and_answers_as_sglang(tmp_path: Path) -> None:
    folder = tmp_path / "armed"
    sim = start_sim(tmp_path / "sim", *LOCK_RACE_FLAGS)
    try:
        url = f"{sim.url}/configure_logging"
        before = httpx.post(f"{sim.url}/generate", json={"input_ids": [5] * 20, "rid": "before",
                                                         "sampling_params": {"max_new_tokens": 2}}, timeout=30)
        assert before.status_code == 200
        bad = httpx.post(url, json={"crash_dump_folder": 5}, timeout=10)  # SGLang's 400 for what FastAPI refuses
        assert bad.status_code == 400 and bad.json()["object"] == "error" and bad.json()["type"] == "Bad Request"
        assert bad.json()["message"].startswith("1 validation error:") and "string_type" in bad.json()["message"]
        assert httpx.post(url, content=b"[]", timeout=10).status_code == 400
        assert httpx.get(url, timeout=10).status_code == 400  # a body is required
        armed = httpx.post(
            url, json={"crash_dump_folder": str(folder), "log_requests": "no", "not_sglangs": 1}, timeout=10
        )
        assert (armed.status_code, armed.content) == (200, b"")
        # SGLang keeps the launch's arguments in /server_info: the folder is the tokenizer manager's.
        assert httpx.get(f"{sim.url}/server_info", timeout=10).json()["crash_dump_folder"] is None
        after = httpx.post(f"{sim.url}/generate", json={"input_ids": [6] * 20, "rid": "after",
                                                        "sampling_params": {"max_new_tokens": 2}}, timeout=30)
        assert after.status_code == 200
        crash_under_pressure(sim)
    finally:
        sim.stop()
    log = sim.log.read_text()
    assert "Config logging: obj=ConfigureLoggingReq(rid=None, http_worker_ipc=None, log_requests=False," in log
    assert f"crash_dump_folder={str(folder)!r}" in log
    path, _, n_unfinished = dumped(sim.log)
    assert path.parent.parent == folder
    rids = {r.rid for r in read_dump(path).requests}
    # Finished requests are kept only once a folder is set, as SGLang's tokenizer manager keeps them.
    assert "after" in rids and "before" not in rids and n_unfinished >= 1


def test_a_sim_without_a_folder_dumps_nothing(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "sim", *LOCK_RACE_FLAGS)
    try:
        crash_under_pressure(sim)
    finally:
        sim.stop()
    log = sim.log.read_text()
    assert "Dumping requests" not in log and "Dumped " not in log


# ----------------------------------------------------------------------------------------------
# The request log itself (in process, on a clock of the test's)
# ----------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_796_466_513.0

    def __call__(self) -> float:
        return self.now


def req(rid: str, ids: list[int], **fields: Any) -> GenerateReqInput:
    return GenerateReqInput(input_ids=ids, sampling_params={"max_new_tokens": 8}, rid=rid, **fields)


def _sglang_modules() -> set[str]:
    return {name for name in sys.modules if name.split(".")[0] == "sglang"}


def test_the_log_keeps_300_s_of_finished_requests_then_those_in_flight(tmp_path: Path) -> None:
    before = _sglang_modules()  # another test may have left a stand-in: compare, do not assume
    clock, lines = Clock(), []
    log = RequestLog(str(tmp_path / "d"), clock=clock)
    old = log.start(req("old", [1, 2]))
    log.finish(old, {"text": "x", "meta_info": {"prompt_tokens": 2}})
    clock.now += 100
    kept = log.start(req("kept", [1, 2, 3]))
    health = log.start(req("HEALTH_CHECK_1", [0], log_metrics=False))
    log.finish(health, {})
    log.finish(kept, {"text": "y", "meta_info": {"prompt_tokens": 3}})
    log.start(req("flying", [4, 5]))
    left = log.start(req("left", [6]))
    log.drop(left)  # a client that went away while the server lived
    clock.now += FINISHED_WINDOW_S - 50  # "old" finished 350 s ago, "kept" 250 s ago
    path = log.dump_before_crash({"page_size": 4}, "radixtop sim --page-size 4", lines.append)
    assert path is not None and lines[-1] == f"Dumped 1 finished and 1 unfinished requests before crash to {path}"
    assert lines[0] == f"Dumping requests before crash. self.crash_dump_folder={str(tmp_path / 'd')!r}"
    doc = raw(path)
    assert [(r[0].rid, r[1] != {}, r[3]) for r in doc["requests"]] == [
        ("kept", True, clock.now - 250),
        ("flying", False, clock.now),
    ]
    assert log.in_flight == 1
    assert log.dump_before_crash({}, "", lines.append) is None and len(lines) == 2  # once per process
    assert _sglang_modules() == before  # what it put in is taken out again


def test_no_folder_nothing_to_dump_and_an_unwritable_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sglang_before = sys.modules.get("sglang")  # another test may have left a stand-in: compare, do not assume
    lines: list[str] = []
    off = RequestLog(None)
    off.start(req("a", [1]))
    assert off.dump_before_crash({}, "", lines.append) is None and lines == []
    empty = RequestLog(str(tmp_path / "empty"))
    assert empty.dump_before_crash({}, "", lines.append) is None
    assert lines == [f"Dumping requests before crash. self.crash_dump_folder={str(tmp_path / 'empty')!r}"]
    assert not (tmp_path / "empty").exists()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    failing = RequestLog(str(blocked))
    failing.start(req("a", [1]))
    lines.clear()
    assert failing.dump_before_crash({}, "", lines.append) is None
    assert len(lines) == 2 and lines[1].startswith(f"Failed to dump requests before crash to {blocked}/")
    # Another module of that name, were one loaded (never sglang itself), is put back as it was.
    stand_in = types.ModuleType(IO_STRUCT)
    monkeypatch.setitem(sys.modules, IO_STRUCT, stand_in)
    monkeypatch.setenv("HOSTNAME", "node-7")
    log = RequestLog(str(tmp_path / "d"))
    log.start(req("a", [1]))
    path = log.dump_before_crash({}, "", lines.append)
    assert path is not None and path.parent == tmp_path / "d" / "node-7"  # SGLang's $HOSTNAME first
    assert sys.modules[IO_STRUCT] is stand_in and sys.modules.get("sglang") is sglang_before
    assert [r.rid for r in read_dump(path).requests] == ["a"]
