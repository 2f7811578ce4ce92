"""A container runtime's log file, decoded into a spool file: the server's own lines, as the log
follower expects them.
- docker's json-file: one JSON object a record, `{"log": "text\\n", "stream": "stdout", "time": ...}`;
  a line longer than 16 KiB comes in several records, only the last ending with a newline;
- podman's (and CRI's) k8s-file: `2026-12-02T14:00:00.123456789+00:00 stdout F text`, P for a
  partial record continued by the next.
It starts with the file's last BACKLOG_BYTES and follows it (reopened when the runtime rotates it).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable

from radixtop.probes.spool import Spool

BACKLOG_BYTES = 4 * 1024 * 1024
POLL_S = 0.25
MAX_PARTIAL = 1024 * 1024  # a line is cut here if the runtime never ends it


def decode_docker_json(record: str) -> tuple[str, bool] | None:
    """(text, ends a line) of one json-file record; None when it is no record."""
    try:
        obj = json.loads(record)
        text = obj["log"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(text, str):
        return None
    return (text[:-1], True) if text.endswith("\n") else (text, False)


def decode_k8s_file(record: str) -> tuple[str, bool] | None:
    parts = record.split(" ", 3)
    if len(parts) < 3 or parts[1] not in ("stdout", "stderr") or parts[2] not in ("F", "P"):
        return None
    return (parts[3] if len(parts) == 4 else ""), parts[2] == "F"


DECODERS: dict[str, Callable[[str], tuple[str, bool] | None]] = {
    "docker-json": decode_docker_json,
    "k8s-file": decode_k8s_file,
}


class RuntimeLog:
    def __init__(self, name: str, path: str, fmt: str, spool: Spool, *, poll_s: float = POLL_S) -> None:
        self.name = name
        self.source = path
        self.decode = DECODERS[fmt]
        self.spool = spool
        self.path = spool.path(name)
        self.poll_s = poll_s
        self.on_note: Callable[[str], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._partial = ""

    def start(self) -> str:
        try:
            f = open(self.source, "rb")  # noqa: SIM115 - the thread owns it
        except OSError as exc:
            return f"cannot read {self.source}: {exc.strerror or exc}"
        size = os.fstat(f.fileno()).st_size
        if size > BACKLOG_BYTES:
            f.seek(size - BACKLOG_BYTES)
            f.readline()  # the first record there is cut
        self._thread = threading.Thread(target=self._follow, args=(f,), name=f"radixtop {self.name}", daemon=True)
        self._thread.start()
        return ""

    def _lines(self, records: list[bytes]) -> list[str]:
        out = []
        for raw in records:
            got = self.decode(raw.decode("utf-8", errors="replace"))
            if got is None:
                continue
            text, ends = got
            self._partial += text
            if ends or len(self._partial) >= MAX_PARTIAL:
                out.append(self._partial)
                self._partial = ""
        return out

    def _follow(self, f) -> None:
        pending = b""
        try:
            while not self._stop.is_set():
                chunk = f.read(1024 * 1024)
                if chunk:
                    records = (pending + chunk).split(b"\n")
                    pending = records.pop()
                    self.spool.append(self.path, self._lines(records))
                    continue
                if self._rotated(f):
                    f.close()
                    try:
                        f = open(self.source, "rb")  # noqa: SIM115
                    except OSError:
                        self._stop.wait(self.poll_s)
                        continue
                    pending = b""
                    continue
                self._stop.wait(self.poll_s)
        finally:
            f.close()

    def _rotated(self, f) -> bool:
        try:
            now = os.stat(self.source)
        except OSError:
            return False
        mine = os.fstat(f.fileno())
        return (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev) or now.st_size < f.tell()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
