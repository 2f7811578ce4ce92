"""The real-SGLang environment is shared by every checkout on a machine, and the last build points
its editable radixtop at its own checkout: the gate runs the real-server tests only where that
radixtop is this checkout's, and says what to run where it is not."""

from __future__ import annotations

import shutil
import sys

import pytest
import sglang_gate


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("RADIXTOP_REQUIRE_SGLANG", raising=False)
    monkeypatch.delenv("RADIXTOP_REQUIRE_SGLANG_SERVER", raising=False)
    sglang_gate._radixtop_in.cache_clear()
    yield
    sglang_gate._radixtop_in.cache_clear()


@pytest.mark.skipif(shutil.which("python3", path="/usr/bin") is None, reason="needs /usr/bin/python3")
def test_an_environment_whose_radixtop_is_not_this_checkouts_is_no_place_for_the_server_tests(monkeypatch):
    monkeypatch.setenv("RADIXTOP_SGLANG_PYTHON", "/usr/bin/python3")  # a Python without this radixtop
    why = sglang_gate.why_no_server()
    assert why is not None and "imports radixtop from nowhere, not from this checkout" in why
    assert "bash .ci/sglang-tests --build-only` here" in why
    sglang_gate._radixtop_in.cache_clear()
    monkeypatch.setenv("RADIXTOP_REQUIRE_SGLANG_SERVER", "1")
    with pytest.raises(RuntimeError, match="not from this checkout"):
        sglang_gate.why_no_server()


def test_an_environment_importing_this_checkouts_radixtop_passes(monkeypatch):
    monkeypatch.setenv("RADIXTOP_SGLANG_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", str(sglang_gate.REPO))  # this checkout first, however it is installed
    assert sglang_gate.why_no_server() is None


@pytest.mark.parametrize("plugin", [True, False])
def test_a_server_that_could_not_load_the_plugin_is_no_instrumented_server(tmp_path, monkeypatch, plugin):
    """SGLang logs the plugin's import error and serves on, uninstrumented: a test or a benchmark
    asking for the instrument must not measure that server."""
    from real_sglang import start_server

    launcher = tmp_path / "python"
    launcher.write_text("#!/bin/sh\necho 'Failed to load plugin radixtop from group sglang.srt.plugins'\n"
                        "echo 'The server is fired up and ready to roll!'\nexec sleep 30\n")
    launcher.chmod(0o755)
    monkeypatch.setenv("RADIXTOP_SGLANG_PYTHON", str(launcher))
    if plugin:
        with pytest.raises(AssertionError, match="could not load radixtop's plugin"):
            start_server(tmp_path / "s", plugin=True, model=tmp_path)
    else:
        start_server(tmp_path / "s", plugin=False, model=tmp_path).stop()
