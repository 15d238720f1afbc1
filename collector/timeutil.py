"""UTC time conversions shared by every stage.

Times are aware UTC ``datetime`` objects or integer nanoseconds since the Unix epoch
(``*_ns``); never floats for storage.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

NS_PER_S = 1_000_000_000
NS_PER_US = 1_000

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|z|[+-]\d{2}:?\d{2})?$"
)


def utcnow() -> datetime:
    """Current time as an aware UTC datetime (microsecond precision)."""
    return datetime.now(timezone.utc)


def now_ns() -> int:
    """Current wall-clock time in integer nanoseconds since the epoch (UTC)."""
    import time

    return time.time_ns()


def dt_to_ns(value: datetime) -> int:
    """Aware datetime → integer nanoseconds since the epoch.

    Raises:
        ValueError: if ``value`` is naive (no zone): we never guess a zone.
    """
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value.isoformat()} has no time zone")
    delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * NS_PER_S + delta.microseconds * NS_PER_US


def ns_to_dt(value_ns: int) -> datetime:
    """Integer nanoseconds → aware UTC datetime (truncated to microseconds)."""
    seconds, rem = divmod(int(value_ns), NS_PER_S)
    return datetime.fromtimestamp(seconds, tz=timezone.utc).replace(microsecond=rem // NS_PER_US)


def ns_to_rfc3339(value_ns: int | None) -> str | None:
    """Integer nanoseconds → RFC 3339 UTC text with the sub-second digits that are non-zero.

    ``None`` stays ``None``. Example: ``1764441600123000000`` → ``2025-11-29T18:40:00.123Z``.
    """
    if value_ns is None:
        return None
    seconds, rem = divmod(int(value_ns), NS_PER_S)
    base = datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    if rem:
        frac = f"{rem:09d}".rstrip("0")
        return f"{base}.{frac}Z"
    return base + "Z"


def parse_rfc3339_ns(text: str) -> tuple[int, int]:
    """Parse an RFC 3339 / ISO 8601 timestamp with an explicit zone.

    Returns:
        ``(epoch_ns, precision_ns)`` where precision is 10**(9-digits) of the fraction given.

    Raises:
        ValueError: malformed text, or no zone designator (naive time).
    """
    m = _RFC3339.match(text.strip())
    if not m:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    year, month, day, hour, minute, second, frac, zone = m.groups()
    if zone is None:
        raise ValueError(f"timestamp {text!r} has no time zone")
    base = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=timezone.utc)
    ns = dt_to_ns(base)
    precision = NS_PER_S
    if frac:
        ns += int(frac.ljust(9, "0"))
        precision = 10 ** (9 - len(frac))
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        if int(digits[:2]) > 23 or int(digits[2:]) > 59:  # RFC 3339 §5.6: time-hour 00-23, time-minute 00-59
            raise BadZoneOffset(f"timestamp {text!r}: zone offset {zone} is not a valid offset (at most ±23:59)")
        offset_s = int(digits[:2]) * 3600 + int(digits[2:]) * 60
        ns -= sign * offset_s * NS_PER_S
    return ns, precision


class BadZoneOffset(ValueError):
    """An RFC 3339 zone offset beyond ±23:59 (``parse_rfc3339_ns``)."""


# The instants the store can hold: integer nanoseconds in a signed 64-bit column.
MIN_NS, MAX_NS = -(2**63), 2**63 - 1


def parse_cli_time(text: str) -> datetime:
    """Parse a CLI ``--from``/``--to`` value: RFC 3339 with zone, or a date ``YYYY-MM-DD`` (00:00 UTC),
    between 1677-09-21 and 2262-04-11 (what 64-bit nanoseconds since the epoch hold, as every stored time).

    Raises:
        ValueError: with a message naming the accepted forms, or the range.
    """
    t = text.strip()
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", t):
            ns = dt_to_ns(datetime.fromisoformat(t).replace(tzinfo=timezone.utc))
        else:
            ns = parse_rfc3339_ns(t)[0]
    except ValueError as exc:
        raise ValueError(f"{text!r}: use RFC 3339 with a zone (2026-11-29T10:00:00Z) or a date (2026-11-29)"
                         + (f" ({exc})" if isinstance(exc, BadZoneOffset) else "")) from exc
    if not MIN_NS <= ns <= MAX_NS:
        raise ValueError(f"{text!r}: out of range; times are stored as 64-bit nanoseconds since 1970, "
                         "from 1677-09-21T00:12:44Z to 2262-04-11T23:47:16Z")
    return ns_to_dt(ns)
