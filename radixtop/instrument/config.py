"""The instrument's configuration from the RADIXTOP_INSTRUMENT_* variables: read by the
instrument inside SGLang (sglang.py) and by radixtop's discovery from a server's environment (to
know where the ranks' endpoints listen). Standard library only, and light to import."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from radixtop.instrument.snapshot import SnapshotConfig
from radixtop.schema import DEFAULT_BASE_PORT, DEFAULT_HOST, MAX_TREE_NODES

log = logging.getLogger("radixtop.instrument")

ENV_ENABLE = "RADIXTOP_INSTRUMENT"  # "1" turns everything on; anything else: nothing runs
ENV_PORT = "RADIXTOP_INSTRUMENT_PORT"  # base port: rank r serves on base + r or above (0: any free port)
ENV_HOST = "RADIXTOP_INSTRUMENT_HOST"  # bind address (default 127.0.0.1)
ENV_TOKEN = "RADIXTOP_INSTRUMENT_TOKEN"  # bearer token; required when the host is not loopback
ENV_BUDGET = "RADIXTOP_INSTRUMENT_BUDGET"  # nodes per snapshot (default SnapshotConfig.max_nodes, 128)
ENV_INTERVAL = "RADIXTOP_INSTRUMENT_INTERVAL"  # least seconds between snapshots (default 0.5); taken only when read


class EndpointPorts(TypedDict, total=False):
    """The endpoint's port options: exactly one of the two."""

    port: int
    base_port: int


@dataclass(frozen=True)
class InstrumentConfig:
    base_port: int = DEFAULT_BASE_PORT
    host: str = DEFAULT_HOST
    token: str | None = None
    budget: int = SnapshotConfig().max_nodes
    interval_s: float = 0.5

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, warn: bool = True) -> InstrumentConfig:
        """Read the RADIXTOP_INSTRUMENT_* variables; a bad value is logged once (unless not
        `warn`: radixtop reading a server's environment to find its endpoints) and the default kept."""
        env = os.environ if environ is None else environ
        default = cls()
        port = _env_number(env, ENV_PORT, int, default.base_port, 0, 65535, warn)
        budget = _env_number(env, ENV_BUDGET, int, default.budget, 1, MAX_TREE_NODES, warn)
        interval = _env_number(env, ENV_INTERVAL, float, default.interval_s, 0.05, 3600.0, warn)
        host = env.get(ENV_HOST, "").strip() or default.host
        token = env.get(ENV_TOKEN, "").strip() or None
        return cls(base_port=port, host=host, token=token, budget=budget, interval_s=interval)

    def endpoint_ports(self) -> EndpointPorts:
        """The endpoint's port options: any free port for base 0; else base + rank, or the next
        free port of the window discovery searches when another server on the node (a
        confirmation arm, a colleague's) has its instrument there."""
        return {"port": 0} if self.base_port == 0 else {"base_port": self.base_port}


def _env_number(
    env: Mapping[str, str], name: str, kind: type, default: Any, lo: Any, hi: Any, warn: bool = True
) -> Any:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        if warn:
            log.warning("radixtop: %s=%r is not a number in [%s, %s]; using %s", name, raw[:40], lo, hi, default)
        return default
    return value
