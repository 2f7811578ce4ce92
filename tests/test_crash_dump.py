"""SGLang's crash dumps as workloads: read by an unpickler that runs nothing, converted exactly.

The dumps here are pickled from classes named as SGLang's own (its module paths, its field names,
the dict SGLang 0.5.23's dump_requests_before_crash writes); tests/test_sglang_server.py converts
one the real server wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hardening_helpers import start_standin
from incident_helpers import wait_for

from radixtop.incident.replay.crash_dump import DumpError, dump_trace_of, find_dumps, read_dump

SYSTEM = list(range(1000, 1048))
T0 = 1_796_466_513.0


@dataclass
class GenerateReqInput:  # the fields of SGLang's io_struct.GenerateReqInput a replay reads
    rid: str
    input_ids: Any = None
    text: Any = None
    sampling_params: dict = field(default_factory=dict)
    extra_key: str | None = None
    cache_salt: str | None = None
    lora_path: str | None = None
    image_data: Any = None
    stream: bool = False


def _as_sglangs(monkeypatch: pytest.MonkeyPatch) -> None:
    """GenerateReqInput pickles under SGLang's module path, as the server's does."""
    for name in ("sglang", "sglang.srt", "sglang.srt.managers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    io_struct = types.ModuleType("sglang.srt.managers.io_struct")
    io_struct.GenerateReqInput = GenerateReqInput  # type: ignore[attr-defined]
    monkeypatch.setattr(GenerateReqInput, "__module__", io_struct.__name__)
    monkeypatch.setitem(sys.modules, io_struct.__name__, io_struct)


def finished(i: int, ids: list[int], *, at: float, cached: int = 0, **params: Any) -> tuple:
    req = GenerateReqInput(
        rid=f"rid-{i}", input_ids=ids, sampling_params={"max_new_tokens": 8, "temperature": 0.0, **params}
    )
    out = {
        "text": "x",
        "meta_info": {"prompt_tokens": len(ids), "cached_tokens": cached, "finish_reason": {"type": "length"}},
    }
    return (req, out, T0 + at, T0 + at + 0.05)


def write_dump(path: Path, monkeypatch: pytest.MonkeyPatch, requests: list) -> Path:
    _as_sglangs(monkeypatch)
    doc = {"server_args": None, "config_updates": [], "resolved_config": {"page_size": 16, "model_path": "/m"},
           "requests": requests, "launch_command": "python -m sglang.launch_server --page-size 16"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL))
    return path


def sample(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Two conversations on a system prompt, one unfinished at the crash, a health check, a batch."""
    chat_a, chat_b = SYSTEM + [1, 2, 3] * 10, SYSTEM + [7, 8] * 12
    health = GenerateReqInput(rid="HEALTH_CHECK_1", input_ids=[0], sampling_params={"max_new_tokens": 1})
    batch = GenerateReqInput(rid="batch-1", input_ids=[[1, 2], [3, 4]])
    in_flight = GenerateReqInput(rid="rid-4", input_ids=chat_a + [9] * 40,
                                 sampling_params={"max_new_tokens": 64, "ignore_eos": True, "stop": ["</s>", "\n\n"]},
                                 extra_key="tenant-a")
    return write_dump(tmp_path / "dumps" / "node0" / "crash_dump_2026-12-05_10-28-34.pkl", monkeypatch, [
        finished(1, chat_a, at=0.0),
        finished(2, chat_b, at=0.5, cached=48),
        finished(3, chat_a + [5] * 16, at=1.0, cached=64),
        (health, {"meta_info": {}}, T0 + 1.1, T0 + 1.2), (batch, {}, T0 + 1.2, None), (in_flight, {}, T0 + 1.5, None),
    ])


def test_a_dump_shaped_as_sglangs_becomes_the_trace_of_its_own_requests(monkeypatch, tmp_path: Path) -> None:
    dump = read_dump(sample(monkeypatch, tmp_path))
    assert [r.rid for r in dump.requests] == ["rid-1", "rid-2", "rid-3", "rid-4"]
    assert dump.in_flight == 1 and dump.page_size == 16 and dump.launch_command.endswith("--page-size 16")
    assert dump.skipped == {"health checks": 1, "batches or prompts without ids or text": 1}
    assert "4 requests over 1.5 s, 1 in flight at the crash; left out: 1 batches" in dump.summary()
    trace = dump_trace_of(dump)
    by_id = {r.id: r for r in trace.requests}
    assert [r.offset_ms for r in trace.requests] == [0.0, 500.0, 1000.0, 1500.0]
    assert by_id["rid-1"].input_ids == tuple(SYSTEM + [1, 2, 3] * 10)  # exactly what the server got
    assert (by_id["rid-2"].prefix_of, by_id["rid-2"].prefix_len) == ("rid-1", 48)
    assert (by_id["rid-3"].prefix_of, by_id["rid-3"].prefix_len) == ("rid-1", 78)
    flight = by_id["rid-4"]
    assert flight.in_flight and flight.ignore_eos and flight.max_tokens == 64 and flight.extra_key == "tenant-a"
    assert flight.stop == ("</s>", "\n\n") and by_id["rid-1"].stop == ()
    assert not any(r.in_flight for r in trace.requests if r.id != "rid-4")
    assert trace.page_size_hint == 16


@pytest.mark.parametrize(
    ("target", "asks_for"),
    [(os.system, "posix.system"), (eval, "builtins.eval"), (subprocess.Popen, "subprocess.Popen"),
     (getattr, "builtins.getattr")],
)
def test_a_pickle_that_would_run_something_is_refused_in_one_line_and_runs_nothing(
    tmp_path: Path, target, asks_for
) -> None:
    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (target, (f"touch {marker}",) if target is not getattr else ("text", "upper"))

    path = tmp_path / "crash_dump.pkl"
    path.write_bytes(pickle.dumps({"requests": [Hostile()]}))
    with pytest.raises(DumpError) as caught:
        read_dump(path)
    message = str(caught.value)
    assert message == f"{path}: refused: it asks for {asks_for}, which radixtop never loads from a dump"
    assert not marker.exists()


def test_sglangs_names_are_inert_stand_ins_nothing_is_imported_or_called(tmp_path: Path) -> None:
    """A global under sglang (here one that would kill processes) becomes a stand-in that keeps its
    arguments: the module is not imported, the function not called."""
    wanted = "sglang.srt.utils.common"
    assert wanted not in sys.modules
    body = (b"\x80\x04" + b"\x8c" + bytes([len(wanted)]) + wanted.encode() + b"\x94"
            + b"\x8c\x11kill_process_tree\x94\x93\x94" + b"K\x01\x85\x94R\x94.")
    path = tmp_path / "d.pkl"
    path.write_bytes(body)
    with pytest.raises(DumpError, match="not an SGLang crash or request dump"):
        read_dump(path)
    assert wanted not in sys.modules


def test_a_huge_a_truncated_and_a_lying_file_are_one_line_each(monkeypatch, tmp_path: Path) -> None:
    huge = tmp_path / "huge.pkl"
    with open(huge, "wb") as f:
        f.truncate(1 << 30)  # a 1 GiB file (sparse): refused by its size, before a byte is read
    with pytest.raises(DumpError, match=r"1,073,741,824 bytes, more than the"):
        read_dump(huge)
    whole = sample(monkeypatch, tmp_path).read_bytes()
    cut = tmp_path / "cut.pkl"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DumpError, match="not a complete pickle .* was it copied while being written"):
        read_dump(cut)
    lying = tmp_path / "lying.pkl"  # claims a 1 GB bytes object, holds 3 bytes
    lying.write_bytes(b"\x80\x04\x8e" + (1 << 30).to_bytes(8, "little") + b"abc")
    with pytest.raises(DumpError, match="not a complete pickle"):
        read_dump(lying)
    for bad in (huge, cut, lying):
        with pytest.raises(DumpError) as caught:
            read_dump(bad)
        assert "\n" not in str(caught.value)


def test_links_and_other_users_dumps_and_folders_are_refused(monkeypatch, tmp_path: Path) -> None:
    real = sample(monkeypatch, tmp_path)
    link = tmp_path / "link.pkl"
    link.symlink_to(real)
    with pytest.raises(DumpError, match="it is a symbolic link"):
        read_dump(link)
    folder_link = tmp_path / "dumps-link"
    folder_link.symlink_to(tmp_path / "dumps")
    with pytest.raises(DumpError, match="the dump folder is a symbolic link"):
        find_dumps(folder_link)
    assert find_dumps(tmp_path / "dumps") == [real]  # the newest crash dump of each host folder
    if os.geteuid() == 0:  # only root can give a file away
        os.chown(real, 4242, 4242)
        with pytest.raises(DumpError, match="owned by uid 4242, not you or root"):
            read_dump(real)


def test_replay_sends_the_dumps_exact_prompts_and_convert_writes_a_private_trace(monkeypatch, tmp_path: Path) -> None:
    dump = sample(monkeypatch, tmp_path)
    out = tmp_path / "t.json"
    done = subprocess.run(
        [sys.executable, "-m", "radixtop", "trace", "convert", str(dump.parent.parent), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "the crash's own workload" in done.stderr and "4 requests over 1.5 s, 1 in flight" in done.stderr
    assert out.stat().st_mode & 0o777 == 0o600
    assert json.loads(out.read_text())["requests"][3]["in_flight"] is True
    calls = tmp_path / "calls.jsonl"
    standin = start_standin(tmp_path, "--mode", "generate", "--record", str(calls))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "radixtop", "replay", str(dump), "--url", standin.url, "--runs", "1",
             "--no-flush", "--vocab-size", "4096", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert wait_for(lambda: calls.exists() and len(calls.read_text().splitlines()) == 4, 10)
    finally:
        standin.stop()
    sent = sorted(json.loads(line)["prompt"] for line in calls.read_text().splitlines())
    trace = dump_trace_of(read_dump(dump))
    expected = sorted(hashlib.sha1(json.dumps(list(r.input_ids)).encode()).hexdigest()[:12] for r in trace.requests)
    assert sent == expected


def test_a_dumps_trace_exports_as_mooncake_with_its_shared_pages(monkeypatch, tmp_path: Path) -> None:
    """At the dump's page size (16): the system prompt's three pages shared, a conversation's fourth
    page shared with its next turn, each partial page its own, and another cache namespace apart."""
    dump = sample(monkeypatch, tmp_path)
    out = tmp_path / "crash.jsonl"
    done = subprocess.run([sys.executable, "-m", "radixtop", "trace", "convert", str(dump), "--format", "mooncake",
                           "-o", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "4 Mooncake requests (one a copy), 16 tokens a hash id (the trace's page_size_hint)" in done.stderr
    assert "cache namespaces (extra_key) are not written" in done.stderr
    assert out.stat().st_mode & 0o777 == 0o600
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["timestamp"], r["input_length"], r["output_length"]) for r in lines] == [
        (0, 78, 8), (500, 72, 8), (1000, 94, 8), (1500, 118, 64),
    ]
    assert [r["hash_ids"] for r in lines] == [[0, 1, 2, 3, 4], [0, 1, 2, 5, 6], [0, 1, 2, 3, 7, 8], list(range(9, 17))]


def test_the_plan_takes_the_crash_s_own_workload_from_the_dump_its_log_names(monkeypatch, tmp_path: Path) -> None:
    """A live server whose log says it dumped its requests: the confirmation plan replays those,
    and says so; without the line, the made-up pressure workload, named as the fallback."""
    import asyncio

    from incident_helpers import HEALTHY_FLAGS, start_sim

    from radixtop.incident.confirm.confirm import ConfirmOptions, prepare

    dump = sample(monkeypatch, tmp_path)
    sim = start_sim(tmp_path / "live", *HEALTHY_FLAGS)
    try:
        options = ConfirmOptions(url=sim.url, workdir=tmp_path / "c1", logs=(str(sim.log),), bundle=False)
        plan = asyncio.run(prepare(options))
        assert plan.workload_origin.startswith("made up: token pressure sized to the server"), plan.workload_origin
        with open(sim.log, "a") as log:
            log.write(f"[2026-12-05 10:28:34] Dumped 3 finished and 1 unfinished requests before crash to {dump}\n")
        plan = asyncio.run(
            prepare(ConfirmOptions(url=sim.url, workdir=tmp_path / "c2", logs=(str(sim.log),), bundle=False))
        )
    finally:
        sim.stop()
    assert (
        plan.workload_origin.startswith("the crash's own: ")
        and "4 requests over 1.5 s, 1 in flight" in plan.workload_origin
    )
    assert [r.id for r in plan.trace.requests] == ["rid-1", "rid-2", "rid-3", "rid-4"]
    assert any("the crash's own" in line for line in plan.describe())
    written = tmp_path / "c2" / "workload.json"
    assert written.stat().st_mode & 0o777 == 0o600 and json.loads(written.read_text())["requests"][0]["id"] == "rid-1"


def logged(event: str, rid: str | None, at: str, obj: dict, out: dict | None = None) -> str:
    """One line of SGLang's JSON request log, as 0.5.23 writes it (--log-requests-format json)."""
    record = {"timestamp": f"2026-12-05T10:38:{at}", "event": event, **({"rid": rid} if rid else {}), "obj": obj}
    if out is not None:
        record["out"] = out
    return f"[2026-12-05 10:38:42] {json.dumps(record)}\n"


def test_a_json_request_log_is_a_workload_too_in_flight_where_it_never_finished(tmp_path: Path) -> None:
    chat = SYSTEM + [4, 5] * 8
    first = {"rid": "r1", "text": None, "input_ids": chat, "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
    second = {**first, "rid": "r2", "input_ids": chat + [6] * 20, "extra_key": "t"}
    cut = {**first, "rid": "r3", "input_ids": chat[:10]}  # level 2 cuts long lists: the answer says 64 tokens
    meta = {"text": "x", "meta_info": {"prompt_tokens": len(chat), "cached_tokens": 0}}
    log = tmp_path / "node_0.log"
    log.write_text(
        logged("request.received.openai", None, "42.40", {"model": "m", "prompt": "hi"})
        + logged("request.received", "r1", "42.368623", first)
        + logged("request.finished", "r1", "42.403496", first, meta)
        + logged("request.received", "HEALTH_CHECK_9", "42.41", {**first, "rid": "HEALTH_CHECK_9"})
        + logged("request.received", "r2", "42.868623", second)
        + logged("request.received", "r3", "43.0", cut)
        + logged("request.finished", "r3", "43.1", cut, {"meta_info": {"prompt_tokens": 64}})
    )
    done = subprocess.run(
        [sys.executable, "-m", "radixtop", "trace", "convert", str(log), "-o", str(tmp_path / "t.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "the logged requests" in done.stderr and "2 requests over 0.5 s, 1 in flight" in done.stderr, done.stderr
    assert "1 health checks" in done.stderr and "1 prompts cut short (a request log below level 3)" in done.stderr
    requests = json.loads((tmp_path / "t.json").read_text())["requests"]
    assert [(r["id"], r["offset_ms"], r.get("in_flight", False)) for r in requests] == [
        ("r1", 0.0, False),
        ("r2", 500.0, True),
    ]
    assert requests[1]["input_ids"] == chat + [6] * 20 and requests[1]["prefix_of"] == "r1"
    assert requests[1]["prefix_len"] == len(chat) and requests[1]["extra_key"] == "t"
    broken = tmp_path / "broken.log"
    broken.write_text(logged("request.received", "r1", "42.1", first) + '[2026-12-05 10:38:42] {"timestamp": "nope"}\n')
    done = subprocess.run([sys.executable, "-m", "radixtop", "trace", "convert", str(broken)], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and f"{broken}:2: not a request log record" in done.stderr


def test_a_converted_trace_with_ignore_eos_and_in_flight_loads_again(monkeypatch, tmp_path: Path) -> None:
    from radixtop.incident.replay.trace import dump_trace, load_trace, save_trace

    trace = dump_trace_of(read_dump(sample(monkeypatch, tmp_path)))
    save_trace(trace, tmp_path / "t.json")
    again = load_trace(tmp_path / "t.json")
    assert again == trace and again.request("rid-4").ignore_eos and again.request("rid-4").in_flight
    assert dump_trace(again)["prefix_unit"] == "tokens"


def test_a_folder_is_one_incident_every_hosts_crash_dump_or_every_request_dump(monkeypatch, tmp_path: Path) -> None:
    from radixtop.incident.replay.crash_dump import find_dumps, merge_dumps

    def dump_of(path: Path, rids: range, at: float) -> Path:
        written = write_dump(path, monkeypatch, [finished(i, SYSTEM + [i] * 4, at=at + i) for i in rids])
        os.utime(written, (T0 + at, T0 + at))
        return written

    crashes = tmp_path / "crashes"
    old = dump_of(crashes / "node0" / "crash_dump_2026-12-01_00-00-00.pkl", range(0, 2), -86_400)
    a = dump_of(crashes / "node0" / "crash_dump_2026-12-05_10-28-34.pkl", range(2, 5), 0)
    b = dump_of(crashes / "node1" / "crash_dump_2026-12-05_10-28-35.pkl", range(4, 7), 1)  # rid-4 on both
    assert find_dumps(crashes) == [a, b] and old not in find_dumps(crashes)
    merged = merge_dumps(crashes, [read_dump(p) for p in find_dumps(crashes)])
    assert [r.rid for r in merged.requests] == [f"rid-{i}" for i in range(2, 7)]
    assert merged.parts == 2 and f"{crashes} (2 dumps): 5 requests" in merged.summary()
    periodic = tmp_path / "periodic"  # --dump-requests-folder: one file per K finished requests
    parts = [dump_of(periodic / f"2026-12-05_10-2{k}.pkl", range(3 * k, 3 * k + 3), 10.0 * k) for k in range(3)]
    assert find_dumps(periodic) == parts
    argv = [sys.executable, "-m", "radixtop", "trace", "convert", str(periodic), "-o", str(tmp_path / "p.json")]
    done = subprocess.run(argv,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "(3 dumps): 9 requests" in done.stderr, done.stderr


def test_a_bundle_keeps_the_crashs_workload_as_its_shape_without_a_prompt(monkeypatch, tmp_path: Path) -> None:
    dump = sample(monkeypatch, tmp_path)
    log = tmp_path / "server.log"
    log.write_text(f"[2026-12-05 10:28:34] Dumped 3 finished and 1 unfinished requests before crash to {dump}\n")
    done = subprocess.run([sys.executable, "-m", "radixtop", "bundle", "--log", str(log), "--out", str(tmp_path / "b"),
                           "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    bundle = Path(json.loads(done.stdout)["path"])
    shape = json.loads((bundle / "workload" / "crash.shape.json").read_text())
    assert [r["id"] for r in shape["requests"]] == ["rid-1", "rid-2", "rid-3", "rid-4"]
    assert shape["requests"][1]["prefix_of"] == "rid-1" and shape["requests"][3]["in_flight"] is True
    assert not any("input_ids" in r or "text" in r for r in shape["requests"])
    assert "1000, 1001" not in (bundle / "workload" / "crash.shape.json").read_text()  # no token of a prompt


def test_a_dumped_requests_sampling_needs_go_out_with_it_at_temperature_zero(monkeypatch, tmp_path: Path) -> None:
    from radixtop.incident.replay.replay import generate_payload
    from radixtop.incident.replay.trace import plan_requests

    trace = dump_trace_of(read_dump(sample(monkeypatch, tmp_path)))
    bodies = {p.request_id: generate_payload(p, 0.0) for p in plan_requests(trace)}
    assert bodies["rid-4"]["sampling_params"] == {"max_new_tokens": 64, "temperature": 0.0, "ignore_eos": True,
                                                  "stop": ["</s>", "\n\n"]}
    assert bodies["rid-1"]["sampling_params"] == {"max_new_tokens": 8, "temperature": 0.0}


def test_a_glob_of_dumps_is_one_workload_with_a_line_per_file(monkeypatch, tmp_path: Path) -> None:
    first = write_dump(tmp_path / "h0" / "crash_dump_a.pkl", monkeypatch, [finished(1, SYSTEM, at=0.0)])
    write_dump(tmp_path / "h1" / "crash_dump_b.pkl", monkeypatch, [finished(2, SYSTEM + [3], at=1.0)])
    pattern = str(tmp_path / "h*" / "*.pkl")
    argv = [sys.executable, "-m", "radixtop", "trace", "convert", pattern, "-o", str(tmp_path / "t.json")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "2 requests over" in done.stderr and f"\n  {first}: 1 requests" in done.stderr, done.stderr
    assert [r["id"] for r in json.loads((tmp_path / "t.json").read_text())["requests"]] == ["rid-1", "rid-2"]
    done = subprocess.run([*argv[:5], str(tmp_path / "none*.pkl")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "none*.pkl: matches no file" in done.stderr
