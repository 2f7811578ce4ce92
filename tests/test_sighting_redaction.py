"""A sighting's /server_info is redacted once while it stays the same, and anew when what the
redaction learns from (the server's environment and argv) or the info itself changes."""

from __future__ import annotations

import json

import pytest

from radixtop.incident.common import redact
from radixtop.incident.common.sighting import Sighting

TOKEN = "q7Vx2LmPz9Rt4WbN"  # no secret shape: only learning it from the environment redacts it


@pytest.fixture
def redactions(monkeypatch) -> list[int]:
    calls: list[int] = []  # one per whole value redacted (json() recurses into its items)
    original = redact.Redactor.json
    depth = [0]

    def counting(self, obj):  # noqa: ANN001, ANN202
        if not depth[0]:
            calls.append(1)
        depth[0] += 1
        try:
            return original(self, obj)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(redact.Redactor, "json", counting)
    return calls


def sighting(info: dict, env: dict, last_seen: float) -> Sighting:
    return Sighting(url="http://127.0.0.1:30000", first_seen=1.0, last_seen=last_seen, argv=("python", "-m", "x"),
                    server_info=info, env=env)


def test_an_unchanged_server_info_is_redacted_once(redactions: list[int]) -> None:
    info = {"served_model_name": "m", "launch": f"serve --model m # {TOKEN}", "api_key": "k" * 12}
    env = {"HF_TOKEN": TOKEN}
    first = sighting(info, env, 2.0).to_json()
    second = sighting(info, dict(env), 3.0).to_json()
    assert len(redactions) == 1
    assert second["last_seen"] == 3.0
    assert second["server_info"] == first["server_info"]
    text = json.dumps(second["server_info"])
    assert TOKEN not in text and "k" * 12 not in text


def test_a_new_secret_in_the_environment_is_redacted_from_the_same_info(redactions: list[int]) -> None:
    info = {"launch": f"serve --model m # {TOKEN}"}
    before = sighting(info, {"SGLANG_X": "1"}, 2.0).to_json()
    assert TOKEN in json.dumps(before["server_info"])  # nothing told the redactor it is a secret
    after = sighting(info, {"SGLANG_X": "1", "HF_TOKEN": TOKEN}, 3.0).to_json()
    assert TOKEN not in json.dumps(after["server_info"])
    assert len(redactions) == 2


def test_a_changed_server_info_is_redacted_anew(redactions: list[int]) -> None:
    env = {"HF_TOKEN": TOKEN}
    sighting({"launch": "a"}, env, 2.0).to_json()
    changed = sighting({"launch": f"b {TOKEN}"}, env, 3.0).to_json()
    assert changed["server_info"]["launch"].startswith("b ") and TOKEN not in json.dumps(changed["server_info"])
    assert len(redactions) == 2
