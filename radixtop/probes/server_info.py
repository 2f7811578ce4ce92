"""A server's /server_info read within bounds, and the numbers radixtop sizes work from, checked.

Every reader of /server_info goes through ``read_server_info`` (a capped, deadline-bound GET and
radixtop.bounded's JSON load: nothing nests deeper than it can walk) and every number a plan or a
replay is sized from through ``ServerLimits.read``: a value that is not a whole number in a sane
range is one line naming the field, never a traceback or a workload that eats memory. The server
may be remote (``--url``): its answer is input like any other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

__all__ = ["MAX_SERVER_INFO_BYTES", "LimitError", "ServerLimits", "decode_server_info", "read_server_info",
           "read_server_info_now"]

MAX_SERVER_INFO_BYTES = 8 << 20  # SGLang's is a few KB; with internal_states, tens
PATHS = ("/server_info", "/get_server_info")  # the second: SGLang before 0.4.5

# The ranges a real server's numbers fall in, with room to spare: a pool of 2^28 tokens is tens of
# H200s of KV cache. Past them, the answer is not a server's (or not one radixtop can size work from).
MAX_POOL_TOKENS = 1 << 28
MAX_PAGE_SIZE = 1 << 16
MAX_RUNNING = 1 << 20


class LimitError(ValueError):
    """A /server_info number radixtop cannot size work from; str() is one line saying what to do."""


def decode_server_info(body: bytes, url: str = "") -> dict[str, Any]:
    """/server_info's JSON object; ValueError with one line when it is not one."""
    from radixtop.bounded import load_json

    where = f"{url}/server_info" if url else "/server_info"
    doc = load_json(body, where, max_bytes=MAX_SERVER_INFO_BYTES)
    if not isinstance(doc, dict):
        raise ValueError(f"{where} is not a JSON object (got {type(doc).__name__})")
    return doc


async def read_server_info(client: httpx.AsyncClient, url: str, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """The server's /server_info (or SGLang's older /get_server_info), whole within ``timeout_s``;
    None when it gives no JSON object."""
    from radixtop.probes.http import fetch

    for path in PATHS:
        got = await fetch(client, f"{url}{path}", max_bytes=MAX_SERVER_INFO_BYTES, timeout_s=timeout_s)
        if got.status is None:
            return None
        if not got.ok:
            continue
        try:
            return decode_server_info(got.body, url)
        except ValueError:
            return None
    return None


def read_server_info_now(
    url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 5.0
) -> dict[str, Any] | None:
    """read_server_info for a caller without an event loop (a command's start)."""
    from radixtop.probes.http import make_client

    async def go() -> dict[str, Any] | None:
        async with make_client(timeout_s) as client:
            if headers:
                client.headers.update(headers)
            return await read_server_info(client, url, timeout_s)

    return asyncio.run(go())


def _number(info: Mapping[str, Any], key: str, low: int, high: int, where: str) -> int | None:
    value = info.get(key)
    if value is None:
        return None
    if type(value) is not int or not low <= value <= high:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise LimitError(f"{where}'s {key} is {shown}, not a whole number in {low:,}..{high:,} as a server "
                         "gives; check that the URL is the SGLang server's")
    return value


@dataclass(frozen=True)
class ServerLimits:
    """The numbers of /server_info that size a workload; None where the server does not say."""

    max_total_num_tokens: int | None = None  # the KV pool, in tokens
    page_size: int | None = None
    max_req_input_len: int | None = None
    max_running_requests: int | None = None  # the server argument (None: SGLang sizes it)
    effective_max_running_requests: int | None = None  # what the scheduler settled on (per DP rank)

    @classmethod
    def read(cls, info: Mapping[str, Any] | None, where: str = "/server_info") -> ServerLimits:
        """LimitError (one line) when a number is there but is not one a server gives."""
        if not info:
            return cls()
        states = info.get("internal_states")
        first = states[0] if isinstance(states, list) and states and isinstance(states[0], Mapping) else {}
        return cls(
            max_total_num_tokens=_number(info, "max_total_num_tokens", 16, MAX_POOL_TOKENS, where),
            page_size=_number(info, "page_size", 1, MAX_PAGE_SIZE, where),
            max_req_input_len=_number(info, "max_req_input_len", 1, MAX_POOL_TOKENS, where),
            max_running_requests=_number(info, "max_running_requests", 1, MAX_RUNNING, where),
            effective_max_running_requests=_number(first, "effective_max_running_requests_per_dp", 1, MAX_RUNNING,
                                                   f"{where} internal_states[0]"),
        )
