"""Another node's log stream (radixtop follow --json, probes/node_link.py) and its findings on this
node's clock: the stream as a real process following a file that grows, every record read as
hostile into the spool, the spool's name kept inside its folder, and a node's ranks tagged."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from radixtop.diagnosis.catalog import load_catalog
from radixtop.diagnosis.findings import FindingsBuilder, NodeClock
from radixtop.probes.node_link import MAX_RECORD_BYTES, NodeGpus, NodeLink
from radixtop.probes.node_report import GpuReport, NodeReport, ServerReport
from radixtop.probes.remote import ClockSkew, NodeAnswer
from radixtop.probes.spool import Spool
from radixtop.widgets.gpu import render_node_gpus

ROOT = Path(__file__).resolve().parent.parent


def test_follow_streams_a_growing_log_as_json_lines(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("one\ntwo\n")
    proc = subprocess.Popen([sys.executable, "-m", "radixtop", "follow", "--json", "--log", str(log), "--backlog", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert proc.stdout is not None
        header = json.loads(proc.stdout.readline())
        assert header["logs"] == [str(log)] and header["time"] > 0
        assert json.loads(proc.stdout.readline()) == {"log": str(log), "lines": ["two"]}  # the backlog: 1 line
        with open(log, "a") as out:
            out.write("three \x1b[31mred\x1b[0m\n")
        got = json.loads(proc.stdout.readline())
        assert got["log"] == str(log) and got["lines"][0].startswith("three")
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""


def test_follow_without_a_log_to_follow_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "radixtop", "follow", "--json", "--url", "http://127.0.0.1:9"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "no log of the server at http://127.0.0.1:9 found on this node: give --log PATH" in done.stderr


def _link(tmp_path: Path) -> NodeLink:
    report = NodeReport(hostname="n2", time=time.time(), servers=(
        ServerReport(pid=1, kind="sim", name="radixtop sim", started=0.0, url="http://127.0.0.1:30000",
                     log_path="/var/log/a.log",
                     instrument_urls=("http://127.0.0.1:39100", "http://10.0.0.9:39101")),))
    link = NodeLink(NodeAnswer("me@node2", report, skew=ClockSkew(5.0, 0.2)), Spool(str(tmp_path)))
    link.spool_dir.mkdir()
    return link


def test_each_record_is_read_as_hostile_and_lands_in_the_nodes_spool(tmp_path: Path) -> None:
    link = _link(tmp_path)
    assert link.name == "node2" and link.spool_dir.parent.parent == tmp_path
    spools: dict[str, Path] = {}
    ok = json.dumps({"log": "/var/log/a.log", "lines": ["x", "a\nb", "é"]}).encode() + b"\n"
    assert link._take(ok, spools) == ""
    spool = link.spool_dir / "a@node2.log"  # the log pane's label: the log's name at its node
    assert spool.read_text() == "x\na b\né\n"  # a line is one line, whatever the node sent
    assert link.health().lines == 3 and link.health().state == "streaming"
    for junk, said in [(b"not json\n", "not JSON"), (b"[1, 2]\n", "not an object"),
                       (b'{"log": 3, "lines": []}\n', "malformed"), (b'{"log": "x", "lines": [1]}\n', "malformed"),
                       (b'{"what": 1}\n', "no known kind"), (b"[" * 100_000 + b"\n", "not JSON")]:
        assert said in link._take(junk, spools), junk[:40]
    # A log named to climb out of the spool folder stays in it; another log of the same name keeps
    # apart from the first.
    for log in ("../../etc/passwd", "/other/a.log", "/var/log/a.log"):
        assert link._take(json.dumps({"log": log, "lines": ["y"]}).encode(), spools) == ""
    names = sorted(p.relative_to(link.spool_dir).as_posix() for p in tmp_path.rglob("*.log"))
    assert len(names) == 3 and "a@node2.log" in names and "passwd@node2.log" in names, names
    assert spool.read_text().endswith("é\ny\n")
    assert MAX_RECORD_BYTES >= 64 * 1024


def test_the_heartbeat_brings_the_nodes_gpus_read_as_hostile(tmp_path: Path) -> None:
    link = _link(tmp_path)
    report = NodeReport(hostname="n2", time=1.0, gpus=(GpuReport(0, "NVIDIA H100 80GB HBM3", memory_used=70 << 30,
                                                                 memory_total=80 << 30, util_percent=95, pids=(42,)),))
    assert link._take(json.dumps({"time": 1.0, "report": report.to_dict()}).encode(), {}) == ""
    got = link.gpus()
    assert got is not None and got.node == "node2" and got.gpus == report.gpus
    bad = report.to_dict()
    bad["gpus"][0]["util_percent"] = 250
    assert "its GPU report" in link._take(json.dumps({"time": 2.0, "report": bad}).encode(), {})
    assert link.gpus() == got  # a bad report changes nothing
    text = render_node_gpus([got], width=100, now=got.at + 20).plain
    assert "node2 GPU 0 H100 80GB HB" in text and "70.0 GiB/80.0 GiB  util 95%" in text, text
    assert "pids 42 (as of 20s ago)" in text
    none = NodeGpus("node3", (), "NVML: no NVIDIA driver", got.at)
    assert render_node_gpus([none], now=got.at).plain == "node3: NVML: no NVIDIA driver"


def test_a_flight_record_from_the_node_is_checked_before_it_lands(tmp_path: Path) -> None:
    link = _link(tmp_path)
    for name, record, said in [("../../x.json", {}, "not rankN-pidN.json"), ("rank3-pid7.json", {"rank": "x"}, "rank3"),
                               ("rank3-pid7.json", [1], "rank3-pid7.json")]:
        assert said in link._take(json.dumps({"flight": name, "record": record}).encode(), {}), name
    assert not link.flight_dir.exists()  # nothing written of what was refused


def test_only_the_nodes_own_loopback_endpoints_are_forwarded(tmp_path: Path) -> None:
    link = _link(tmp_path)
    assert link.endpoints() == ["http://127.0.0.1:30000", "http://127.0.0.1:39100"]  # 10.0.0.9: not the node's
    assert link.clock() == NodeClock("node2", -5.0)  # its times, minus its clock's lead
    link.url = "http://127.0.0.1:1"  # a server the report does not name: nothing of it
    assert link.endpoints() == [] and link.logs() == []


def test_a_nodes_ranks_are_tagged_and_its_times_put_on_this_clock() -> None:
    spool = "/run/nodes/1/node2/sim-1.log"
    builder = FindingsBuilder(load_catalog(), node_of=lambda f: NodeClock("node2", -5.0) if f == spool else None)
    # The node's clock runs 5 s ahead: its failure at :07 happened at :02 here, before this node's at :04.
    line = "[2026-12-05 10:00:{s:02d} TP{r}] RadixCacheError: Failed to lock memory page during dynamic prefix eviction"
    builder.feed("/here/sim.log", 1, line.format(s=4, r=1))
    builder.feed(spool, 1, line.format(s=7, r=3))
    report = builder.report()
    assert report.initiating is not None
    assert report.initiating[1].rank == "node2 TP3" and report.initiating[1].file == spool
    assert set(report.first_by_rank) == {"TP1", "node2 TP3"}
