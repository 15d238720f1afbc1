"""Bytes on the socket: Status bodies, chunked framing and abrupt connection ends.

Framing rules (watch-semantics.md §4): a watch response is ``HTTP/1.1 200`` with
``Content-Type: application/json`` and ``Transfer-Encoding: chunked``, flushed before any event;
each event is one JSON document followed by ``\\n``; a chunk may hold several events or part of
one; the normal end is the zero-length chunk ``0\\r\\n\\r\\n``. Abnormal ends are FIN without the
terminating chunk, and RST (``SO_LINGER`` 0 then close).
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

#: Status ``reason`` per HTTP code (k8s.io/apimachinery metav1.StatusReason).
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

#: Body of the max-in-flight filter's 429 (apiserver ``filters/maxinflight.go``, §8).
TOO_MANY_REQUESTS_TEXT = "Too many requests, please try again later.\n"


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON (multi-byte characters kept raw, as Go's encoder writes them)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def status(
    code: int,
    message: str,
    reason: str | None = None,
    details: dict | None = None,
    metadata: dict | None = None,
) -> dict:
    """A ``v1 Status`` failure object (as in HTTP error bodies and ERROR watch events)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": metadata or {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, "Unknown"),
    }
    if details:
        body["details"] = details
    body["code"] = code
    return body


def too_old_status(requested_rv: int, oldest_rv: int) -> dict:
    """The watch cache's ERROR object for an expired start RV (watch-semantics.md §5.5)."""
    return status(410, f"too old resource version: {requested_rv} ({oldest_rv})", "Expired")


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (``<hex size>\\r\\n<data>\\r\\n``); empty data is not allowed here."""
    if not data:
        raise ValueError("an empty chunk would end the stream; use LAST_CHUNK")
    return b"%x\r\n" % len(data) + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def reset(sock: socket.socket) -> None:
    """Abort the connection with a TCP RST: linger on with timeout 0, then close."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def fin(sock: socket.socket) -> None:
    """Close the connection with a FIN (orderly TCP close), whatever the HTTP framing says."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def peer_closed(sock: socket.socket) -> bool:
    """True when the client has closed its side (readable with EOF), without consuming data."""
    import select

    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True
