"""Bounded HTTP requests for the probes and the actions: a size cap while reading, a timeout,
one-line failures.

Every failure a server can hand us (refused connection, timeout, reset, an answer larger than we
will hold, a redirect elsewhere) becomes `Fetched.error`, a line that says what happened; nothing
here raises into a probe. Environment proxies are ignored (`trust_env=False`): the servers watched
are on this node, and an HTTP_PROXY meant for the internet must not swallow loopback traffic.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when first used: httpx costs ~70 ms of start-up, before the first frame
    import httpx

DEFAULT_TIMEOUT_S = 3.0
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
SHORT_ANSWER_BYTES = 64 * 1024  # /health, /flush_cache: a line of text, if anything


@dataclass(frozen=True, slots=True)
class Fetched:
    url: str
    status: int | None  # HTTP status, None when no answer came
    body: bytes
    error: str | None  # one line when the request failed (no answer, too big, ...)
    seconds: float
    refused: bool = False  # nothing listens there (the server is down, or not there yet)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200


_SSL_CONTEXT: Any = None


# SGLang's /health runs a one-token generation through the scheduler (its
# SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is on by default): polled, it puts batches into the log of
# the server under investigation and hangs with a wedged scheduler. /v1/models is answered by the
# HTTP front alone, on SGLang, vLLM and the simulator. vLLM's /health checks its engine without
# generating, so it stays the better liveness check there.
LIVENESS_PATH = "/v1/models"
# Statuses that say the server's HTTP front is up: an API key it wants is still an answer.
ANSWERING = frozenset({200, 401, 403})


def liveness_path(kind: str) -> str:
    """The route that says a server of `kind` ("sglang", "vllm", ...) is up without generating."""
    return "/health" if kind == "vllm" else LIVENESS_PATH


def is_loopback_url(url: str) -> bool:
    """Whether a URL's host is this machine's loopback (localhost, 127.0.0.0/8, ::1)."""
    from urllib.parse import urlsplit

    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    return is_loopback_host(host)


def is_loopback_host(host: str) -> bool:
    """Whether a host name or address (IPv6 bracketed or not) is this machine's loopback."""
    import ipaddress

    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ssl_context() -> Any:
    """One verifying SSL context for every client: httpx builds one per client otherwise, loading
    the CA bundle each time (40-90 ms of CPU here; discovery makes a client every 30 s)."""
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        import httpx

        _SSL_CONTEXT = httpx.create_ssl_context()
    return _SSL_CONTEXT


def make_client(timeout_s: float = DEFAULT_TIMEOUT_S) -> httpx.AsyncClient:
    import httpx

    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s),
        verify=ssl_context(),
        trust_env=False,
        follow_redirects=False,
        limits=httpx.Limits(max_connections=4, max_keepalive_connections=2),
        headers={"User-Agent": "radixtop"},
    )


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.0f} MiB" if n >= 1024 * 1024 else f"{n:,} bytes"


async def fetch(
    client: httpx.AsyncClient,
    url: str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    timeout_s: float | None = None,
    params: dict[str, str | int] | None = None,
    method: str = "GET",
) -> Fetched:
    """GET (or ``method``) url; the body is read up to max_bytes (a longer answer is abandoned, not
    buffered). ``timeout_s`` bounds the whole answer, not only each read as httpx's timeout does:
    a server that drips bytes cannot hold a probe past it (None: the client's own timeout, per read)."""
    import httpx

    started = time.monotonic()
    timeout = httpx.Timeout(timeout_s) if timeout_s is not None else httpx.USE_CLIENT_DEFAULT

    def failed(message: str, status: int | None = None, refused: bool = False) -> Fetched:
        return Fetched(url, status, b"", message, time.monotonic() - started, refused)

    try:
        async with asyncio.timeout(timeout_s), client.stream(method, url, params=params, timeout=timeout) as resp:
            length = resp.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > max_bytes:
                return failed(
                    f"answer of {_mib(int(length))} is larger than the {_mib(max_bytes)} radixtop accepts; refused it",
                    resp.status_code,
                )
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_bytes():  # decoded: the cap bounds what we hold
                size += len(chunk)
                if size > max_bytes:
                    return failed(
                        f"answer larger than the {_mib(max_bytes)} radixtop accepts; stopped reading it",
                        resp.status_code,
                    )
                chunks.append(chunk)
            return Fetched(url, resp.status_code, b"".join(chunks), None, time.monotonic() - started)
    except TimeoutError as exc:  # the whole answer's deadline (or an OS timeout httpx did not map)
        return failed(f"no whole answer within {timeout_s:g} s" if timeout_s is not None else f"TimeoutError: {exc}")
    except httpx.ConnectError as exc:
        if _refused(exc):
            return failed("connection refused (is the server running?)", refused=True)
        return failed(f"cannot connect: {_root_cause(exc)}")
    except httpx.TimeoutException:
        limit = timeout_s if timeout_s is not None else client.timeout.read
        return failed(f"no answer within {limit:g} s")
    except httpx.RemoteProtocolError as exc:
        return failed(f"the server broke the connection ({exc})")
    except httpx.HTTPError as exc:
        return failed(f"{type(exc).__name__}: {exc}")
    except (OSError, ValueError) as exc:  # a bad URL, a socket error outside httpx's mapping
        return failed(f"{type(exc).__name__}: {exc}")


def _chain(exc: BaseException):
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 10:
        yield cur
        cur = cur.__cause__ or cur.__context__
        seen += 1


def _refused(exc: BaseException) -> bool:
    return any(isinstance(e, ConnectionRefusedError) for e in _chain(exc))


def _root_cause(exc: BaseException) -> str:
    last = list(_chain(exc))[-1]
    return f"{type(last).__name__}: {last}" if str(last) else type(last).__name__


class PolledProbe:
    """What the HTTP probes share: a client made on first use (closed only if it is ours), and a
    poll() that turns a gap in our own handling into an "error" sample instead of a dead app.
    Subclasses set url, timeout_s, _client and _own_client, and define _poll() and _sample()."""

    url: str
    timeout_s: float
    _client: httpx.AsyncClient | None
    _own_client: bool

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = make_client(self.timeout_s)
        return self._client

    async def aclose(self) -> None:
        if self._own_client and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def poll(self) -> Any:
        try:
            return await self._poll()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a gap in our own handling must not take the app down
            return self._sample("error", f"radixtop failed reading {self.shown_url}: {type(exc).__name__}: {exc}")

    @property
    def shown_url(self) -> str:
        """The URL as messages say it (a probe whose URL may hold a password masks it)."""
        return self.url

    async def _poll(self) -> Any:
        raise NotImplementedError

    def _sample(self, state: str, message: str = "", **kw: Any) -> Any:
        raise NotImplementedError
