"""Canonical JSON and content hashes for integrity (no I/O, tested exhaustively).

Canonical form, in the style of RFC 8785 (JSON Canonicalization Scheme): object keys sorted,
no insignificant whitespace, UTF-8 without escaping non-ASCII. Deliberate
differences from strict JCS, so that values we store survive unchanged: integers are written
exactly (nanosecond timestamps exceed 2**53), and keys sort by code point (identical to JCS'
UTF-16 order for the ASCII keys Kubernetes and our rows use).

Serialisation is orjson's (fast enough to hash every stored row on the hot path); integers beyond
64 bits fall back to the standard library encoder with the same options. NaN and Infinity (not
JSON) serialise as ``null``, the same way on append and on verify.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import orjson

_ORJSON_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"cannot canonicalise {type(value).__name__}")


def canonical_json(value: Any) -> bytes:
    """Serialise ``value`` to canonical JSON bytes (UTF-8).

    Datetimes become RFC 3339 UTC text (``...Z``; naive ones are taken as UTC), bytes base64,
    Decimals strings.

    Raises:
        TypeError: a value of an unsupported type.
    """
    try:
        return orjson.dumps(value, default=_default, option=_ORJSON_OPTS)
    except orjson.JSONEncodeError as exc:
        if "Integer exceeds 64-bit range" not in str(exc):
            raise TypeError(str(exc)) from None
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                          default=_default).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    """Lower-case hex SHA-256 of ``data`` (FIPS 180-4)."""
    return hashlib.sha256(data).hexdigest()


def content_hash(value: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of ``value``."""
    return sha256_hex(canonical_json(value))


GENESIS_HASH = "0" * 64


def chain_hash(prev_hash: str, content: bytes) -> str:
    """Hash of one ledger entry: SHA-256 over the previous entry's hash (64 hex chars, ASCII) + content.

    ``prev_hash`` is ``GENESIS_HASH`` for the first entry. Pure function: the verifier and the
    appender must agree byte for byte.
    """
    h = hashlib.sha256()
    h.update(prev_hash.encode("ascii"))
    h.update(content)
    return h.hexdigest()
