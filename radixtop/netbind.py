"""A listening socket bound before the server that serves on it starts.

Shared by the simulator (`radixtop sim`) and the recording proxy (`radixtop record`); the standard
library and radixtop.errors only.
"""

from __future__ import annotations

import errno
import socket

from radixtop.errors import UsageError


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before uvicorn starts, so a taken port is a clean one-line error and no race follows."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it every response waits out Nagle + delayed ACK (~40 ms) on loopback.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only; never a live listener
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"port {port} on {host} is in use; pick another with --port") from None
        raise UsageError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --host/--port"
        ) from None
    sock.set_inheritable(True)
    return sock
