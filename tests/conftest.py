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
