"""One rule for addresses that come from the network (a server's /server_info): radixtop contacts
them only on loopback, in the UI's probes and in the bundle alike; an address off this machine is
contacted only when the user types it. Real servers on loopback; nothing is sent elsewhere."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from hardening_helpers import start_standin
from incident_helpers import start_sim

from radixtop.incident.bundle.bundle import take_bundle
from radixtop.probes.sglang import ServerProbe

OFF_LOOPBACK = "http://192.0.2.7:39100"  # TEST-NET-1: never contacted, here or anywhere


def test_listed_endpoints_off_loopback_are_dropped_by_the_ui_probe_and_the_bundle(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "sim")
    try:
        endpoint = httpx.get(sim.url + "/server_info", timeout=10).json()["radixtop_instrument"][0]
        server = start_standin(tmp_path / "srv", "--list-instrument", OFF_LOOPBACK, "--list-instrument", endpoint,
                               "--list-instrument", "http://localhost.evil.example:1")
        try:
            sample = asyncio.run(ServerProbe(server.url).poll())
            assert sample.info is not None and sample.info.instrument_urls == (endpoint,)  # what the UI polls
            result = take_bundle(tmp_path / "out", url=server.url, pid=server.pid, archive=False)
        finally:
            server.stop()
    finally:
        sim.stop()
    note = result.notes["radix/listed-instruments"]
    assert OFF_LOOPBACK in note and "localhost.evil.example" in note and "--instrument" in note
    snapshot = json.loads((result.path / "radix/rank0-snapshot.json").read_text())
    assert snapshot["schema_version"] == 1  # the loopback one was read
    assert not (result.path / "radix/rank1-snapshot.json").exists()
    assert not (result.path / "radix/rank1-snapshot.json.note.txt").exists()  # not even tried
