"""The little of HTTP/1.1 the replay's dispatcher speaks: one POST's bytes, and its answer read
incrementally from a non-blocking socket (Content-Length, chunked, or until the server closes).

Standard library only: the dispatcher process imports it and must start fast.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MAX_ANSWER_BYTES", "Answer", "request_bytes"]

MAX_ANSWER_BYTES = 16 << 20  # a generate answer is kilobytes; more is a broken server


def request_bytes(host: str, path: str, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    """A POST with a JSON body; headers with a line break are refused (they would inject lines)."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
             f"Content-Length: {len(body)}"]  # fmt: skip
    for name, value in headers:
        if any(c in name + value for c in "\r\n\0") or not name or ":" in name:
            raise ValueError(f"header {name!r} cannot be sent: it holds a line break or a colon")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Answer:
    """One response, fed as it arrives; ``done`` once whole. ``keep_alive``: the connection may
    carry the next request."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._head_end = -1
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.done = False
        self.keep_alive = False
        self._length: int | None = None
        self._chunked = False

    @property
    def started(self) -> bool:
        return bool(self._buf)

    def feed(self, data: bytes) -> None:
        """Add bytes; an empty ``data`` is the server closing. Raises ValueError on a malformed answer."""
        if self.done:
            return
        closed = not data
        self._buf += data
        if len(self._buf) > MAX_ANSWER_BYTES:
            raise ValueError(f"answer over {MAX_ANSWER_BYTES >> 20} MiB")
        if self._head_end < 0 and not self._parse_head():
            if closed:
                raise ValueError("connection closed before the answer's headers")
            return
        body = bytes(self._buf[self._head_end :])
        if self._chunked:
            decoded = _dechunk(body)
            if decoded is not None:
                self._finish(decoded[0], decoded[1])
            elif closed:
                raise ValueError("connection closed inside a chunked answer")
        elif self._length is not None:
            if len(body) >= self._length:
                self._finish(body[: self._length], self._length)
            elif closed:
                raise ValueError(f"connection closed after {len(body)} of {self._length} bytes")
        elif closed:  # no length: the body runs to the close
            self.keep_alive = False
            self._finish(body, len(body))

    def _parse_head(self) -> bool:
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > 65536:
                    raise ValueError("answer headers over 64 KiB")
                return False
            lines = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
            status = int(parts[1])
            if 100 <= status < 200:  # an interim answer: the real one follows
                del self._buf[: end + 4]
                continue
            self.status = status
            for line in lines[1:]:
                name, _, value = line.partition(":")
                self.headers[name.strip().lower()] = value.strip()
            self._head_end = end + 4
            self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
            length = self.headers.get("content-length")
            if not self._chunked and length is not None:
                if not length.isdigit():
                    raise ValueError(f"bad Content-Length {length[:40]!r}")
                self._length = int(length)
            connection = self.headers.get("connection", "").lower()
            self.keep_alive = parts[0] == "HTTP/1.1" and "close" not in connection
            return True

    def _finish(self, body: bytes, consumed: int) -> None:
        self.body = body
        self.done = True
        # bytes past the answer belong to no request: such a connection is not reused
        self.keep_alive = self.keep_alive and len(self._buf) == self._head_end + consumed
        self._buf = bytearray()


def _dechunk(raw: bytes) -> tuple[bytes, int] | None:
    """(the body, bytes consumed) of a whole chunked message, or None while it is incomplete
    (trailers are skipped)."""
    out = bytearray()
    pos = 0
    while True:
        eol = raw.find(b"\r\n", pos)
        if eol < 0:
            return None
        size_text = raw[pos:eol].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ValueError(f"bad chunk size {size_text[:20]!r}") from None
        if size == 0:
            end = raw.find(b"\r\n\r\n", eol)  # the trailer section ends with an empty line
            return None if end < 0 else (bytes(out), end + 4)
        start = eol + 2
        if len(raw) < start + size + 2:
            return None
        out += raw[start : start + size]
        pos = start + size + 2
