"""Where a server's kv-events publishers are: from /server_info's `kv_events` block (SGLang's own
description), else its `kv_events_config`, else `--kv-events-config` on the command line.

One publisher per DP rank, on the configured port + rank (SGLang's offset_endpoint_port). The
addresses are network content: a wildcard host means the server's own host, and only loopback
publishers are kept (the one rule of radixtop.probes.radix.instrument_urls).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from radixtop.probes.http import is_loopback_host

WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]")


@dataclass(frozen=True, slots=True)
class KvEventsSource:
    dp_rank: int
    endpoint: str  # tcp://HOST:PORT of the publisher's PUB socket
    topic: str = ""
    replay_endpoint: str | None = None  # its ROUTER, for batches missed
    sub_binds: bool = False  # the publisher connects (a concrete host without bind: true): we bind

    @property
    def url(self) -> str:
        """The key the radix board files this rank under."""
        return f"kv-events+{self.endpoint}"


def _split(endpoint: str) -> tuple[str, int] | None:
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return None
    return host, int(port)


def _endpoint(host: str, port: int, server_host: str) -> str | None:
    host = server_host if host in WILDCARD_HOSTS else host
    if not is_loopback_host(host) or not 0 < port <= 65535:
        return None
    return f"tcp://{host}:{port}"


def _server_host(server_url: str | None) -> str:
    host = urlsplit(server_url).hostname if server_url else None
    return host or "127.0.0.1"


def from_config(
    text: str, *, dp_size: int = 1, server_url: str | None = None
) -> tuple[list[KvEventsSource], str]:
    """--kv-events-config's JSON -> the publishers, and a line when there are none to read."""
    try:
        cfg = json.loads(text)
    except ValueError:
        return [], "its --kv-events-config is not JSON"
    if not isinstance(cfg, dict):
        return [], "its --kv-events-config is not a JSON object"
    if cfg.get("publisher", "null") != "zmq":
        return [], "its kv-events publisher is not zmq"
    split = _split(str(cfg.get("endpoint") or "tcp://*:5557"))
    if split is None:
        return [], "its kv-events endpoint is not tcp://HOST:PORT (ipc and inproc are not read)"
    host, port = split
    bind = cfg.get("bind")
    publisher_binds = bind if isinstance(bind, bool) else host in WILDCARD_HOSTS
    replay = _split(str(cfg.get("replay_endpoint") or ""))
    topic = str(cfg.get("topic") or "")
    return _sources(host, port, replay, topic, dp_size, _server_host(server_url), not publisher_binds)


def _sources(
    host: str, port: int, replay: tuple[str, int] | None, topic: str, dp_size: int, server_host: str, sub_binds: bool
) -> tuple[list[KvEventsSource], str]:
    out = []
    for r in range(max(1, min(dp_size, 1024))):
        endpoint = _endpoint(host, port + r, server_host)
        if endpoint is None:
            return [], f"its kv-events publisher {host}:{port} is not on loopback: radixtop reads only this machine's"
        replay_endpoint = _endpoint(replay[0], replay[1] + r, server_host) if replay else None
        out.append(KvEventsSource(r, endpoint, topic, replay_endpoint, sub_binds))
    return out, ""


def from_server_info(info: Mapping[str, Any], server_url: str | None) -> tuple[list[KvEventsSource], str]:
    """/server_info's kv_events_config (SGLang's server args), else its `kv_events` block
    (endpoint_host, endpoint_port_base, topic, dp_size, replay_endpoint_port_base); ([], why)
    when neither is usable."""
    text = info.get("kv_events_config")
    if isinstance(text, str) and text:  # the config says who binds; the block does not
        dp = info.get("dp_size")
        return from_config(text, dp_size=dp if type(dp) is int else 1, server_url=server_url)
    block = info.get("kv_events")
    if isinstance(block, Mapping) and block.get("publisher") == "zmq":
        host, port = block.get("endpoint_host"), block.get("endpoint_port_base")
        dp = block.get("dp_size")
        replay_port = block.get("replay_endpoint_port_base")
        if isinstance(host, str) and type(port) is int:
            replay = (host, replay_port) if type(replay_port) is int else None
            return _sources(host, port, replay, str(block.get("topic") or ""), dp if type(dp) is int else 1,
                            _server_host(server_url), False)
    return [], ""


def from_argv(argv: Sequence[str], server_url: str | None = None) -> tuple[list[KvEventsSource], str]:
    """--kv-events-config (and --dp-size) from a server's command line."""
    text, dp = None, 1
    args = list(argv)
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if name == "--kv-events-config":
            text = value
        elif name in ("--dp-size", "--data-parallel-size", "--dp") and value.isdigit():
            dp = int(value)
    if not text:
        return [], ""
    return from_config(text, dp_size=dp, server_url=server_url)
