"""Prometheus's HTTP API, read as untrusted: an instant query (`/api/v1/query`) within a deadline,
its answer capped in size, decoded through bounded.py, and every series turned into a typed
`Series` (labels as bounded text, the value a finite float or None).

Whatever Prometheus (or whatever answers at its URL) hands back (a refused connection, a 4xx or
5xx, an HTML page, JSON of the wrong shape, "NaN", a label of a megabyte) becomes either series or
`QueryAnswer.error`: one line that says what to do. Nothing here raises into a caller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from radixtop.bounded import load_json
from radixtop.probes.http import fetch
from radixtop.textsafe import printable_line

if TYPE_CHECKING:
    import httpx

__all__ = ["MAX_ANSWER_BYTES", "MAX_SERIES", "Labels", "QueryAnswer", "Series", "check_url", "instant_query",
           "shown_url"]

QUERY_PATH = "/api/v1/query"
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # a few thousand ranks' series fit many times over
MAX_SERIES = 50_000  # per query: more is a selector that matched far more than radixtop's metrics
MAX_LABELS = 64  # per series; Prometheus's own default limit is unlimited, a sane target has a dozen
MAX_LABEL_CHARS = 256  # a label's name or value is cut here


@dataclass(frozen=True, slots=True)
class Labels:
    """A series' labels as Prometheus gave them, each name and value bounded text (not yet made
    printable: that happens where they are shown)."""

    pairs: tuple[tuple[str, str], ...] = ()

    def get(self, name: str, default: str = "") -> str:
        for key, value in self.pairs:
            if key == name:
                return value
        return default


@dataclass(frozen=True, slots=True)
class Series:
    labels: Labels
    value: float | None  # None: absent, or not a finite number ("NaN", "+Inf", text)


@dataclass(frozen=True, slots=True)
class QueryAnswer:
    query: str
    series: tuple[Series, ...] = ()
    error: str | None = None  # one line saying what happened and what to do
    note: str = ""  # one line about what was left out (series past MAX_SERIES, malformed entries)

    @property
    def ok(self) -> bool:
        return self.error is None


def check_url(url: str) -> str:
    """The base URL, without a trailing slash, or ValueError with one line saying what to give."""
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{printable_line(url, 80)!r} is not an http(s) URL; give Prometheus's address, "
                         "e.g. http://prometheus:9090")
    if parts.query or parts.fragment:
        raise ValueError("give Prometheus's base URL without a query, e.g. http://prometheus:9090")
    return url.rstrip("/")


def shown_url(url: str) -> str:
    """The URL as it may be shown: a user:password in it (httpx sends it as basic auth) is masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return printable_line(url, 200)
    if parts.password is None and parts.username is None:
        return printable_line(url, 200)
    host = parts.netloc.rpartition("@")[2]
    return printable_line(parts._replace(netloc=f"***@{host}").geturl(), 200)


async def instant_query(client: httpx.AsyncClient, base_url: str, query: str, *, timeout_s: float,
                        max_bytes: int = MAX_ANSWER_BYTES) -> QueryAnswer:
    """`query` evaluated now; Prometheus is asked to give up at the same deadline (its `timeout`)."""
    url = base_url + QUERY_PATH
    fetched = await fetch(client, url, max_bytes=max_bytes, timeout_s=timeout_s,
                          params={"query": query, "timeout": f"{max(0.1, timeout_s):.3g}s"})
    where = f"Prometheus at {shown_url(base_url)}"
    if fetched.error is not None:
        if fetched.refused:
            return QueryAnswer(query, error=f"{where}: connection refused; is it running, and is the URL its "
                                             "address (e.g. http://host:9090)?")
        return QueryAnswer(query, error=f"{where}: {fetched.error}; check the URL and that Prometheus answers")
    if fetched.status in (401, 403):
        return QueryAnswer(query, error=f"{where} answered HTTP {fetched.status}: it wants credentials, and radixtop "
                                        "sends none; give an address that answers without them (e.g. from inside "
                                        "the cluster)")
    try:
        doc = load_json(fetched.body, "the answer", max_bytes=max_bytes)
    except ValueError as exc:
        status = fetched.status
        hint = ("no Prometheus API there; give Prometheus's base URL (e.g. http://host:9090)"
                if status in (200, 404) else "check the URL and that Prometheus is healthy")
        return QueryAnswer(query, error=f"{where} answered HTTP {status} that is not Prometheus's JSON "
                                        f"({printable_line(str(exc), 120)}): {hint}")
    if not isinstance(doc, dict):
        return QueryAnswer(query, error=f"{where} answered JSON that is not Prometheus's (not an object); "
                                        "give Prometheus's base URL")
    if fetched.status != 200 or doc.get("status") != "success":
        said = doc.get("error")
        said_text = printable_line(said, 160) if isinstance(said, str) else "no reason given"
        return QueryAnswer(query, error=f"{where} refused the query (HTTP {fetched.status}: {said_text}); "
                                        "check the URL, and that this is Prometheus 2.x or later")
    return _vector(query, doc.get("data"), where)


def _vector(query: str, data: Any, where: str) -> QueryAnswer:
    if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        return QueryAnswer(query, error=f"{where} answered a result that is not an instant vector; "
                                        "give Prometheus's base URL")
    result: list[Any] = data["result"]
    series: list[Series] = []
    malformed = 0
    for entry in result[:MAX_SERIES]:
        one = _series(entry)
        if one is None:
            malformed += 1
        else:
            series.append(one)
    notes = []
    if len(result) > MAX_SERIES:
        notes.append(f"{len(result):,} series answered, the first {MAX_SERIES:,} read")
    if malformed:
        notes.append(f"{malformed:,} malformed series skipped")
    return QueryAnswer(query, tuple(series), note="; ".join(notes))


def _series(entry: Any) -> Series | None:
    if not isinstance(entry, dict):
        return None
    metric, sample = entry.get("metric"), entry.get("value")
    if not isinstance(metric, dict) or not isinstance(sample, list) or len(sample) != 2:
        return None
    text = ((key[:MAX_LABEL_CHARS], value[:MAX_LABEL_CHARS]) for key, value in metric.items()
            if isinstance(key, str) and isinstance(value, str))
    pairs = tuple(islice(text, MAX_LABELS))
    return Series(Labels(pairs), number(sample[1]))


def number(value: Any) -> float | None:
    """A sample's value (Prometheus writes it as a string) as a finite float, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if len(value) > 64:
            return None
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, (int, float)):
        try:
            result = float(value)
        except OverflowError:  # an integer past a float's range
            return None
        return result if math.isfinite(result) else None
    return None
