"""The wire format between continuous tasks and the driver's epoch coordinator.

A frame is a 4-byte big-endian header length, a JSON header, then ``payload`` bytes
when the header's ``"payload"`` gives their length. Payloads carry rows (a sink's
commit message, a driver-fed source's records) in the row codec of
:mod:`lockgate.row_codec`. Nothing in this format is persisted.
"""

from __future__ import annotations

import json
import select
import socket
import struct
from typing import Any

_HEADER = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024


class ProtocolError(ConnectionError):
    pass


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    remaining = n
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise ProtocolError("connection closed by the peer")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def send_frame(sock: socket.socket, header: dict[str, Any], payload: bytes | None = None) -> None:
    if payload is not None:
        header = dict(header, payload=len(payload))
    body = json.dumps(header, separators=(",", ":")).encode("utf-8")
    sock.sendall(_HEADER.pack(len(body)) + body + (payload or b""))


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes | None]:
    (length,) = _HEADER.unpack(_read_exactly(sock, _HEADER.size))
    if length > MAX_FRAME:
        raise ProtocolError(f"frame header of {length} bytes is too large")
    header = json.loads(_read_exactly(sock, length).decode("utf-8"))
    if not isinstance(header, dict):
        raise ProtocolError("frame header is not a JSON object")
    size = header.pop("payload", None)
    payload = None
    if size is not None:
        if not isinstance(size, int) or size < 0 or size > MAX_FRAME:
            raise ProtocolError(f"bad payload size {size!r}")
        payload = _read_exactly(sock, size)
    return header, payload


class CoordinatorClient:
    """A task's connection to the epoch coordinator (one request, one reply)."""

    def __init__(self, host: str, port: int, secret: str, timeout_s: float = 60.0) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reply, _ = self.call({"type": "Hello", "secret": secret})
        if not reply.get("ok"):
            self.close()
            raise ProtocolError(f"epoch coordinator refused the connection: {reply.get('error')}")

    def call(
        self, message: dict[str, Any], payload: bytes | None = None
    ) -> tuple[dict[str, Any], bytes | None]:
        send_frame(self._sock, message, payload)
        reply, data = recv_frame(self._sock)
        if "error" in reply and reply.get("ok") is False and message.get("type") != "Hello":
            raise ProtocolError(f"epoch coordinator failed {message.get('type')}: {reply['error']}")
        return reply, data

    def send(self, message: dict[str, Any]) -> None:
        """Sends a request without waiting: :meth:`reply` takes its answer later. No other
        request may go out on this connection before that."""
        send_frame(self._sock, message)

    def reply(self) -> dict[str, Any] | None:
        """The answer to the request :meth:`send` sent, or ``None`` when it has not come
        yet (never waits for its first byte)."""
        ready, _, _ = select.select([self._sock], [], [], 0)
        if not ready:
            return None
        reply, _ = recv_frame(self._sock)
        if "error" in reply and reply.get("ok") is False:
            raise ProtocolError(f"epoch coordinator failed a request: {reply['error']}")
        return reply

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
