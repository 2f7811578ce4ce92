"""The server a bundle is about when the user named no log: the one discovery finds on this node
(`radixtop bundle --stream` on another node, and this node's part of `--node`), with its log, pid
and ranks' debug endpoints. With a URL, the server listening on its port, or, once it has died, the
log its sighting names (what a radixtop here saw of it while it lived)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from radixtop.incident.common.server import base_url, url_port
from radixtop.incident.common.sighting import load_sighting
from radixtop.probes.discovery import FoundServer, discover

__all__ = ["Here", "find_here"]


@dataclass(frozen=True, slots=True)
class Here:
    url: str | None = None
    logs: tuple[str, ...] = ()
    pid: int | None = None
    instruments: tuple[str, ...] = ()
    said: str = ""  # which server was taken, and the others, or why none: one line


def find_here(url: str | None = None, *, timeout_s: float = 1.0) -> Here:
    """The server to bundle on this node; with none found, only the URL given (its log then is
    for the user to name)."""
    port = url_port(url) if url else None
    found = asyncio.run(discover(port=port, timeout_s=timeout_s))
    servers: list[FoundServer] = list(found.servers)
    if url:
        servers = [s for s in servers if (s.url and base_url(s.url) == url) or (port in s.ports)]
    if not servers:
        seen = load_sighting(url) if url else None
        if seen is not None and seen.logs:  # a server that died: its log as radixtop saw it here
            when = time.strftime("%H:%M:%S", time.localtime(seen.last_seen))
            return Here(url=url, logs=tuple(seen.logs),
                        said=f"no server at {url} now; bundled its log, as a radixtop here saw it at {when}")
        where = f" at {url}" if url else ""
        return Here(url=url, said=f"no server found{where} on this node (a server that died is no process): "
                                  "its log is bundled only when --log names it")
    server, others = servers[0], servers[1:]
    said = f"bundled {server.name} pid {server.pid}" + (f" at {server.url}" if server.url else "")
    if others:
        said += f"; {len(others)} more here ({', '.join(f'pid {s.pid}' for s in others[:4])}): pass --url for another"
    return Here(
        url=server.url or url,
        logs=(server.log_path,) if server.log_path else (),
        pid=server.pid,
        instruments=server.instrument_urls,
        said=said,
    )
