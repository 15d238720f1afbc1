"""Strict multi-format timestamp parsing to integer nanoseconds with an explicit precision.

Accepted (log-formats.md §0, §5.3): ISO 8601 / RFC 3339 with 0-9 fraction digits and ``Z`` or
``±hh:mm``/``±hhmm`` (Spring ECS, logstash/LLE, CRI, Vector, Filebeat, Fluent Bit ``iso8601``);
``YYYY-MM-DD HH:MM:SS.ffffff`` without zone only when a zone is configured; epoch numbers (GELF
seconds with 3 decimals, epoch s/ms/µs/ns chosen by magnitude) and OTLP decimal-string
nanoseconds. Floats are never used for the value: a JSON number is re-read from its shortest
``repr`` as a ``Decimal``, so ``1749032100.067`` is exactly ``…067 000 000`` ns.

A time without a zone is rejected (``NaiveTimestamp``) unless the caller passes a default zone
(``settings.ingest_default_tz``, an IANA name): we never guess a zone. Read in that zone, a local
time the daylight-saving change skips (``2026-03-29T02:30`` in Europe/Warsaw) is no clock reading
and is rejected too (``NonexistentLocalTime``); one it repeats (``2026-10-25T02:30``) is read as
the earlier instant (PEP 495 ``fold=0``) with its precision widened to reach the later one's
interval (``[t, t + precision)`` then holds both: attribution calls a transition inside it
ambiguous), and ``ambiguous_local_time`` says so for the record's warning.

An epoch number whose digits read as a card number (13-19 digits, Luhn, a card's issuer prefix:
``"4111111111111111"``) is not a time (``pan.number_holds_pan``): read as one, the PAN's digits
would be stored in ``event_time_ns``.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from collector.errors import UserError
from collector.ingest.pan import PAN_MIN_DIGITS, number_holds_pan

NS_PER_S = 1_000_000_000

_ISO = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?\s*(Z|z|UTC|[+-]\d{2}(?::?\d{2})?)?$"
)
_DIGITS = re.compile(r"^-?\d+(?:\.\d+)?$")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class BadTimestamp(ValueError):
    """A timestamp we cannot read (the message names the value's shape, never the whole line)."""


class NaiveTimestamp(BadTimestamp):
    """A timestamp without a zone, and no default zone configured."""


class NonexistentLocalTime(NaiveTimestamp):
    """A timestamp without a zone that the default zone's clocks never show: the daylight-saving
    change skips it (a naive time the zone cannot read, as one without any zone)."""


class TimeReading(tuple):
    """``(epoch_ns, precision_ns)`` as ``parse_iso`` reads a zone-less local time in the default zone,
    with ``warning``: why the precision is wider than its digits (a repeated local time), or None."""

    warning: str | None = None


def ambiguous_local_time(reading: tuple[int, int]) -> str | None:
    """The warning for a record whose time ``parse_any`` / ``parse_iso`` read as a local time the
    default zone shows twice (``TimeReading.warning``); None for any other reading."""
    return getattr(reading, "warning", None)


def _local_offset_s(text: str, y: int, mo: int, d: int, hour: int, minute: int, second: int,
                    zone_name: str, precision: int) -> tuple[int, int, str | None]:
    """The UTC offset (seconds) of the zone-less local time in ``zone_name``, the precision to store,
    and a warning when the local time occurs twice (fold: the earlier instant, precision widened by
    the clocks' step so that ``[t, t + precision)`` reaches the later reading's interval too).

    Raises:
        NonexistentLocalTime: the clocks skip this local time (spring forward, PEP 495 gap).
    """
    tz = zone(zone_name)
    local = datetime(y, mo, d, hour, minute, min(second, 59), tzinfo=tz)
    first, second_reading = local.utcoffset(), local.replace(fold=1).utcoffset()
    assert first is not None and second_reading is not None
    if first == second_reading:
        return int(first.total_seconds()), precision, None
    step_ns = int(abs((first - second_reading).total_seconds())) * NS_PER_S
    if first < second_reading:  # fold=0 reads a gap with the offset before it: the clocks jumped over it
        raise NonexistentLocalTime(
            f"timestamp {text} does not exist in {zone_name} (the clocks skip it at the daylight-saving change); "
            "no instant to store")
    return int(first.total_seconds()), precision + step_ns, (
        f"event time {text} occurs twice in {zone_name} (daylight-saving change): stored as the earlier, "
        f"precision widened by {step_ns // NS_PER_S} s to cover both")


@lru_cache(maxsize=64)
def zone(name: str, setting: str = "DRAUDIT_INGEST_DEFAULT_TZ") -> ZoneInfo:
    """The IANA zone ``name`` (e.g. ``Europe/Berlin``).

    ``setting`` names where the value came from in the error: the environment variable, or the
    flag (``--default-tz``) when the user gave it there.

    Raises:
        UserError: unknown zone name.
    """
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise UserError(f"{setting}={name!r} is not an IANA time zone name (e.g. UTC, Europe/Berlin)") from None


@lru_cache(maxsize=4096)
def _midnight_ns(year: int, month: int, day: int) -> int:
    d = datetime(year, month, day, tzinfo=timezone.utc) - _EPOCH
    return d.days * 86_400 * NS_PER_S


# The common shape YYYY-MM-DDTHH:MM:SS[.f{1,9}]Z (ASCII digits): one C match instead of _ISO's
# optional zone forms.
_UTC = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?Z", re.ASCII)


def _utc_groups(text: str) -> tuple[str, ...] | None:
    """``_ISO``'s groups for the common shape ``YYYY-MM-DDTHH:MM:SS[.f{1,9}]Z`` (ASCII digits);
    None for any other text (the regex then decides)."""
    m = _UTC.fullmatch(text)
    return None if m is None else (*m.groups(), "Z")


_UTC_SECOND = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})", re.ASCII)


@lru_cache(maxsize=4096)
def _second_ns(prefix: str) -> int | None:
    """Epoch ns of the UTC second ``YYYY-MM-DDTHH:MM:SS`` (``prefix``, 19 characters), or None when it
    is not one (not that shape, an impossible date or time of day: ``parse_iso`` says which).
    Cached: the lines of one second share it."""
    m = _UTC_SECOND.fullmatch(prefix)
    if m is None:
        return None
    y, mo, d, h, mi, s = m.groups()
    try:
        base = _midnight_ns(int(y), int(mo), int(d))
    except ValueError:
        return None
    hour, minute, second = int(h), int(mi), int(s)
    if hour > 23 or minute > 59 or second > 60:
        return None
    return base + (hour * 3600 + minute * 60 + second) * NS_PER_S


def _utc_fast(text: str) -> tuple[int, int] | None:
    """``parse_iso(text)`` for the common shape ``YYYY-MM-DDTHH:MM:SS[.f{1,9}]Z`` (``_UTC``, ASCII
    digits) with a valid date and time, the whole second from ``_second_ns``'s cache; None for any
    other text (``parse_iso`` then decides, and raises what it raises)."""
    n = len(text)
    if n < 20 or text[-1] != "Z":
        return None
    if n == 20:
        frac = ""
    else:
        frac = text[20:-1]
        if n > 30 or text[19] not in ".," or not (frac.isascii() and frac.isdigit()):
            return None
    base = _second_ns(text[:19])
    if base is None:
        return None
    if frac:
        return base + int(frac.ljust(9, "0")), 10 ** (9 - len(frac))
    return base, NS_PER_S


def parse_iso(text: str, default_tz: str | None = None) -> tuple[int, int]:
    """ISO 8601 / RFC 3339 text → ``(epoch_ns, precision_ns)``.

    Precision is ``10**(9 - fraction digits)`` ns (a whole second → 1 s).

    Raises:
        NaiveTimestamp: no zone designator and ``default_tz`` is None; ``NonexistentLocalTime``:
            none, and the default zone's clocks skip that local time.
        BadTimestamp: any other shape or an impossible date.

    A zone-less time read in ``default_tz`` is returned as a ``TimeReading`` (its ``warning``:
    ``ambiguous_local_time``).
    """
    text = text.strip()
    fast = _utc_fast(text)
    if fast is not None:
        return fast
    groups = _utc_groups(text)
    if groups is None:
        m = _ISO.match(text)
        if not m:
            raise BadTimestamp("timestamp is not ISO 8601 / RFC 3339")
        groups = m.groups()
    y, mo, d, h, mi, s, frac, zone_text = groups
    try:
        base = _midnight_ns(int(y), int(mo), int(d))
    except ValueError:
        raise BadTimestamp("timestamp has an impossible date") from None
    hour, minute, second = int(h), int(mi), int(s)
    if hour > 23 or minute > 59 or second > 60:
        raise BadTimestamp("timestamp has an impossible time of day")
    ns = base + (hour * 3600 + minute * 60 + second) * NS_PER_S
    precision = NS_PER_S
    if frac:
        ns += int(frac.ljust(9, "0"))
        precision = 10 ** (9 - len(frac))
    if zone_text is None:
        if default_tz is None:
            raise NaiveTimestamp("timestamp has no time zone and no default zone is configured (--default-tz or DRAUDIT_INGEST_DEFAULT_TZ)")
        offset_s, precision, warning = _local_offset_s(text, int(y), int(mo), int(d), hour, minute, second,
                                                       default_tz, precision)
        reading = TimeReading((ns - offset_s * NS_PER_S, precision))
        reading.warning = warning
        return reading
    if zone_text not in ("Z", "z", "UTC"):
        sign = 1 if zone_text[0] == "+" else -1
        digits = zone_text[1:].replace(":", "")
        off_h, off_m = int(digits[:2]), (int(digits[2:4]) if len(digits) >= 4 else 0)
        if off_h > 23 or off_m > 59:  # RFC 3339 time-numoffset: time-hour ":" time-minute
            raise BadTimestamp(f"timestamp has an impossible zone offset {zone_text!r}")
        ns -= sign * (off_h * 3600 + off_m * 60) * NS_PER_S
    return ns, precision


def parse_epoch(value: int | float | str | Decimal, unit: str | None = None) -> tuple[int, int]:
    """An epoch number → ``(epoch_ns, precision_ns)``.

    ``unit`` is ``s``/``ms``/``us``/``ns``; when None it follows from the magnitude (< 1e11 s,
    < 1e14 ms, < 1e17 µs, else ns — unambiguous for dates 1973…5138). A float is read through its
    shortest ``repr``; precision follows the decimals given (``1749032100.067`` → 1 ms).

    Raises:
        BadTimestamp: not a finite number, or one whose digits read as a card number
            (``pan.number_holds_pan`` with the issuer prefixes).
    """
    if isinstance(value, bool):
        raise BadTimestamp("timestamp is a boolean")
    try:
        dec = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    except (InvalidOperation, ValueError):
        raise BadTimestamp("timestamp is not a number") from None
    if not dec.is_finite() or dec <= 0:
        raise BadTimestamp("timestamp is not a positive finite number")
    if dec >= 10 ** (PAN_MIN_DIGITS - 1) and number_holds_pan(dec, card_issuer_only=True):
        raise BadTimestamp("timestamp not read: its digits read as a card number (PAN)")
    if unit is None:
        mag = abs(dec)
        unit = "s" if mag < Decimal(10) ** 11 else "ms" if mag < Decimal(10) ** 14 else "us" if mag < Decimal(10) ** 17 else "ns"
    scale = {"s": NS_PER_S, "ms": 1_000_000, "us": 1_000, "ns": 1}[unit]
    ns = int(dec * scale)
    exp = dec.normalize().as_tuple().exponent if dec != dec.to_integral_value() else 0
    decimals = -int(exp) if isinstance(exp, int) and exp < 0 else 0
    precision = max(1, scale // (10 ** decimals)) if decimals else scale
    return ns, precision


def parse_any(value: object, default_tz: str | None = None) -> tuple[int, int]:
    """A timestamp as found in a log record (string or number) → ``(epoch_ns, precision_ns)``.

    Raises:
        NaiveTimestamp, BadTimestamp: see ``parse_iso`` / ``parse_epoch``.
    """
    if value.__class__ is str:
        # The common shape first: a text ``_utc_fast`` reads starts with 4 digits and a dash (not an
        # epoch number) and has no space at either end (``strip`` keeps it): ``parse_iso``'s answer.
        fast = _utc_fast(value)
        if fast is not None:
            return fast
    if isinstance(value, str):
        text = value.strip()
        if text[4:5] != "-" and _DIGITS.match(text):  # "YYYY-…" cannot be an epoch number
            return parse_epoch(text)
        return parse_iso(text, default_tz)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return parse_epoch(value)
    raise BadTimestamp(f"timestamp is a {type(value).__name__}, not a string or number")
