"""Fixtures shared by the test modules."""

from __future__ import annotations

import time

import pytest


@pytest.fixture
def utc(monkeypatch):
    """Times rendered in UTC (screenshots and clock strings do not depend on the machine's zone)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.delenv("TZ")
    time.tzset()


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path_factory, monkeypatch):
    """Each test its own runtime directory: what one radixtop leaves for another (sightings, the
    confirmation run's lock and status) never leaks between tests or into the user's."""
    path = tmp_path_factory.mktemp("runtime")
    monkeypatch.setenv("RADIXTOP_RUNTIME_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def quick_simulated_deaths(monkeypatch):
    """Simulated servers die without SGLang's five seconds before crash diagnostics, as a real one
    does with these switches off (tests/test_sim_parity.py holds the sequence with them on); real
    servers (tests/real_sglang.py) keep SGLang's defaults."""
    monkeypatch.setenv("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "0")
    monkeypatch.setenv("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "0")
