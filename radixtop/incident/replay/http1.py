"""The replay dispatcher's HTTP/1.1, through h11 (the sans-I/O protocol library httpx stands on):
a call's POST, and its answer parsed as the bytes come from a non-blocking socket.

One `h11.Connection` per socket keeps the protocol's state: whether the answer is whole, and
whether the connection may carry the next call (keep-alive, nothing left over).
"""

from __future__ import annotations

from collections.abc import Iterable

import h11

__all__ = ["MAX_ANSWER_BYTES", "Answer", "Call", "new_connection"]

MAX_ANSWER_BYTES = 16 << 20  # a generate answer is kilobytes; more is a broken server
MAX_HEAD_BYTES = 64 << 10


def new_connection() -> h11.Connection:
    return h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)


class Call:
    """A POST with a JSON body, checked once when the plan is read (h11 refuses a header with a
    line break or a bad name: ValueError here), written on whichever connection is free."""

    __slots__ = ("body", "request")

    def __init__(self, authority: str, path: str, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        fields = [
            ("Host", authority),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            *headers,
        ]
        try:
            self.request = h11.Request(method="POST", target=path, headers=fields)
        except h11.LocalProtocolError as exc:
            raise ValueError(f"a header holds a line break or a character HTTP forbids ({exc})") from None
        self.body = body

    def bytes_on(self, conn: h11.Connection) -> bytes:
        """The call's bytes, as written on ``conn`` (whose next cycle this starts)."""
        return b"".join(
            conn.send(event) or b"" for event in (self.request, h11.Data(data=self.body), h11.EndOfMessage())
        )


class Answer:
    """One call's answer on ``conn``, fed as it arrives; ``done`` once whole."""

    __slots__ = ("_body", "_conn", "body", "done", "started", "status")

    def __init__(self, conn: h11.Connection) -> None:
        self._conn = conn
        self._body = bytearray()
        self.status = 0
        self.body = b""
        self.done = False
        self.started = False  # any byte of it came

    @property
    def keep_alive(self) -> bool:
        """The connection may carry the next call: both sides done, and no byte past the answer."""
        conn = self._conn
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE and not conn.trailing_data[0]

    def feed(self, data: bytes) -> None:
        """Add bytes; an empty ``data`` is the server closing. Raises ValueError on a malformed or
        cut answer."""
        if self.done:
            return
        self.started = self.started or bool(data)
        conn = self._conn
        try:
            conn.receive_data(data)
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    if not data:
                        raise ValueError("connection closed before the whole answer")
                    return
                if isinstance(event, h11.Response):
                    self.status = event.status_code
                elif isinstance(event, h11.Data):
                    self._body += event.data
                    if len(self._body) > MAX_ANSWER_BYTES:
                        raise ValueError(f"answer over {MAX_ANSWER_BYTES >> 20} MiB")
                elif isinstance(event, h11.EndOfMessage):
                    self.body, self.done = bytes(self._body), True
                    return
                elif isinstance(event, h11.ConnectionClosed):
                    raise ValueError("connection closed before the whole answer")
                # an InformationalResponse (1xx): the real answer follows
        except h11.RemoteProtocolError as exc:
            raise ValueError(str(exc) or "not an HTTP/1.1 answer") from None
