"""Deeply nested JSON from a client or a server: the simulator answers 400 as SGLang does, and a
bundle keeps everything but the part nested too deeply. Real processes on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from hardening_helpers import start_standin
from incident_helpers import start_sim

from radixtop.incident.bundle.bundle import take_bundle, verify_bundle


def test_the_simulator_answers_400_to_a_body_nested_100k_deep(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "sim")
    try:
        body = b'{"text": "hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        answer = httpx.post(sim.url + "/generate", content=body, headers={"Content-Type": "application/json"},
                            timeout=30)
        assert answer.status_code == 400 and "nested too deeply" in answer.text
        ok = httpx.post(
            sim.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=30
        )
        assert ok.status_code == 200  # and it serves on
    finally:
        sim.stop()
    out = (sim.out.read_text(errors="replace") + sim.log.read_text(errors="replace"))
    assert "RecursionError" not in out and "Traceback" not in out


def test_a_bundle_keeps_the_server_section_when_server_info_nests_900_deep(tmp_path: Path) -> None:
    sim = start_sim(tmp_path / "sim")
    try:
        endpoint = httpx.get(sim.url + "/server_info", timeout=10).json()["radixtop_instrument"][0]
        server = start_standin(tmp_path / "srv", "--mode", "deep", "--list-instrument", endpoint)
        try:
            result = take_bundle(tmp_path / "out", url=server.url, pid=server.pid, archive=False)
        finally:
            server.stop()
    finally:
        sim.stop()
    assert not any(rel.startswith("errors/") for rel in result.notes), result.notes
    info = json.loads((result.path / "server/server_info.json").read_text())
    assert info["version"] == "0.5-standin" and info["max_total_num_tokens"] == 4096
    assert "nested deeper than 64 levels: cut" in json.dumps(info["deep"])
    assert json.loads((result.path / "radix/rank0-snapshot.json").read_text())["schema_version"] == 1
    assert verify_bundle(result.path) == []


def test_a_keymap_nested_30k_deep_is_a_notice_and_the_default_keys(tmp_path: Path) -> None:
    from radixtop.tui.keys import load_keymap

    keymap = tmp_path / "keymap.toml"
    keymap.write_text("[keys]\nquit = " + "[" * 30_000 + "]" * 30_000 + "\n")
    table, problem = load_keymap(keymap)
    assert table == {} and problem is not None and "\n" not in problem
    assert "nested too deeply" in problem and "the default keys are in use" in problem


def test_a_catalog_nested_50k_deep_is_one_line(tmp_path: Path) -> None:
    import pytest

    from radixtop.diagnosis.catalog import CatalogError, load_catalog

    catalog = tmp_path / "deep.toml"
    catalog.write_text("[[signature]]\nid = 'x'\ncompeting = " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(CatalogError) as info:
        load_catalog([catalog])
    assert "\n" not in str(info.value) and "nested too deeply" in str(info.value)
