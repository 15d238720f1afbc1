"""Shortcuts for the common shape answer as the general code does.

``timestamps.parse_any`` reads a ``YYYY-MM-DDTHH:MM:SS[.f]Z`` string through ``_utc_fast`` first, and
``record._hex_id`` returns a lower-case hex id of the right length as it is. Both take the shortcut
only for an exact ``str``: a ``str`` subclass with the same text goes the general way, which makes
the reference here. Inputs: realistic values and the edges of each shape.
"""

from __future__ import annotations

import pytest

from collector.ingest import timestamps
from collector.ingest.record import normalise_span_id, normalise_trace_id


class Text(str):
    """The same text, not an exact ``str``: the general way."""


def _outcome(fn, *args):
    try:
        return fn(*args)
    except timestamps.BadTimestamp as exc:
        return type(exc).__name__, str(exc)


TIMES = [
    "2025-11-29T08:00:00.412337000Z", "2025-11-29T08:00:00.412337Z", "2025-11-29T08:00:00Z",
    "2025-11-29T08:00:00.4Z", "2025-11-29T08:00:00,412Z", "2025-11-29t08:00:00.412Z", "2025-11-29 08:00:00.412Z",
    "2025-11-29T08:00:00.4123370001Z", "2025-11-29T08:00:00.Z", "2025-11-29T08:00:00.41a Z",
    " 2025-11-29T08:00:00.412Z", "2025-11-29T08:00:00.412Z ", "2025-11-29T08:00:00.412Z\n",
    "2025-02-30T08:00:00Z", "2025-11-29T24:00:00Z", "2025-11-29T23:59:60Z", "2025-11-29T08:00:00.412+01:00",
    "2025-11-29T08:00:00.412", "２０２５-11-29T08:00:00Z", "2025-11-29T08:00:00.٤١٢Z", "1764403200", "1764403200.5",
    "1764403200412", "17644032004123370000", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59.999999999Z", "", "Z",
    "2025-11-29T08:00:00ZZ", "2025-11-29T08:00:00.412z", "yesterday",
]


@pytest.mark.parametrize("text", TIMES)
@pytest.mark.parametrize("zone", [None, "UTC", "Europe/Paris"])
def test_parse_any_reads_a_utc_text_as_the_general_way_does(text, zone):
    fast = _outcome(timestamps.parse_any, text, zone)
    assert fast == _outcome(timestamps.parse_any, Text(text), zone)
    if text == "2025-11-29T08:00:00.412337000Z":
        assert fast == (1_764_403_200_412_337_000, 1)
    if text == "2025-11-29T08:00:00.4Z":
        assert fast == (1_764_403_200_400_000_000, 100_000_000)


IDS = [
    "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "4BF92F3577B34DA6A3CE929D0E0E4736", "0" * 32, "0" * 16,
    "4bf92f3577b34da6", " 4bf92f3577b34da6a3ce929d0e0e4736", "4bf92f3577b34da6a3ce929d0e0e473g",
    "4bf92f3577b34da6a3ce929d0e0e47361", "12345678901234567890123456789012", "1234567890123456", "",
]


@pytest.mark.parametrize("value", IDS)
@pytest.mark.parametrize("name", ["traceId", "spanId", "dd.trace_id", "dd.span_id", ""])
def test_hex_ids_read_as_the_general_way_does(value, name):
    assert normalise_trace_id(value, name) == normalise_trace_id(Text(value), name)
    assert normalise_span_id(value, name) == normalise_span_id(Text(value), name)


def test_a_datadog_decimal_id_is_still_converted():
    # 32 decimal digits under a dd.* name are a number, not hex: the shortcut leaves them to the general way
    n = 12345678901234567890123456789012
    assert normalise_trace_id(str(n), "dd.trace_id") == f"{n:032x}" != str(n)
    assert normalise_span_id("1234567890123456", "dd.span_id") == f"{1234567890123456:016x}"
    assert normalise_span_id("1234567890123456", "spanId") == "1234567890123456"


def test_a_kept_decoding_is_returned_once_for_the_same_text_and_flag():
    from collector.ingest.jsondoc import Decoder

    d = Decoder()
    line = '{"kubernetes":{"pod_name":"p"},"log":"{\\"txn_id\\":\\"T-1\\"}","n":1.5}'
    kept = d.decode(line, unicode_escapes=False, keep=True)
    assert kept.by_orjson and kept.value["n"] == 1.5
    assert d.decode(line, unicode_escapes=False) is kept          # the general path's decode of that line
    again = d.decode(line, unicode_escapes=False)
    assert again is not kept and again.value == kept.value        # once only
    d.decode(line, unicode_escapes=False, keep=True)
    assert d.decode(line, unicode_escapes=True) is not kept       # another flag: decoded anew
    first = d.decode(line, unicode_escapes=False, keep=True)
    d.forget()
    assert d.decode(line, unicode_escapes=False) is not first
    spaced = '{"a": 1}'                                             # not orjson's encoding: nothing kept
    first = d.decode(spaced, keep=True)
    assert d.decode(spaced) is not first
    other = d.decode('{"b":2}', keep=True)
    assert d.decode('{"c":3}').value == {"c": 3} and d.decode('{"b":2}') is not other  # any call drops it
