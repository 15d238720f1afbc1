"""OTLP logs (``ExportLogsServiceRequest``) as JSON or protobuf → one view per LogRecord.

OTLP/JSON is walked by hand instead of ``google.protobuf.json_format.Parse``, which reads the
hex ``traceId``/``spanId`` as base64 and silently produces wrong bytes (log-formats.md §3.5,
verified pitfall). Rules followed (opentelemetry-proto ``docs/specification.md``): keys are
lowerCamelCase, int64 values arrive as decimal strings (numbers accepted too), ids are hex
(case-insensitive), unknown fields are ignored. Protobuf bodies are decoded with the official
generated classes (``opentelemetry.proto.collector.logs.v1.logs_service_pb2``).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from collector.ingest.pan import mask_binary, mask_text, number_holds_pan

_HEX = re.compile(r"^[0-9a-fA-F]*$")
# An AnyValue's kinds (a protobuf oneof), in the order json_any_value looks for the one that is set.
_ANY_VALUE_KINDS = ("stringValue", "boolValue", "intValue", "doubleValue", "bytesValue", "arrayValue", "kvlistValue")
OTLP_SNIFF_BYTES = 256  # how far into a line ``looks_like_export_request`` looks for "resourceLogs"


# JSON levels above an attribute's ``AnyValue`` object in an ExportLogsServiceRequest (request,
# resourceLogs, ResourceLogs, scopeLogs, ScopeLogs, logRecords, LogRecord, attributes, KeyValue, AnyValue),
# and per map level of a value (kvlistValue, values, KeyValue, AnyValue; an array level takes 3).
_WRAPPER_LEVELS, _LEVELS_PER_MAP = 10, 4


def json_depth_limit(max_depth: int) -> int:
    """The JSON nesting limit of an OTLP/JSON request whose record values may nest ``max_depth``
    levels (dicts and lists, as a JSON line's may): the encoding spends 10 levels on the request's
    structure and 4 per map level of a value, so 64 levels of JSON held a map only 13 deep. The
    record's own limit is checked on its decoded values (``value_depth``): a record too deep is
    quarantined alone, not the whole request — up to twice the limit; a request nested deeper than
    that is refused whole (the decoder's guard against nesting attacks)."""
    return _WRAPPER_LEVELS + _LEVELS_PER_MAP * 2 * max_depth


def value_depth(value: Any) -> int:
    """Nesting depth of a decoded value in dicts and lists (a scalar: 0; ``{"a": [1]}``: 2)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
        else:
            continue
        deepest = max(deepest, depth + 1)
    return deepest


# Bytes of a protobuf message that no text log holds: C0 controls other than tab, LF, FF, CR, ESC.
_BINARY_BYTES = frozenset(range(0x20)) - {0x09, 0x0A, 0x0C, 0x0D, 0x1B}
PROTOBUF_PEEK_BYTES = 256


def looks_like_otlp_protobuf(head: bytes) -> bool:
    """True when ``head`` (the first bytes of an input, gunzipped) starts like a binary OTLP
    ``ExportLogsServiceRequest``: field 1 (``resource_logs``, length-delimited: byte 0x0a), a
    varint length, then a field 1-3 tag of ``ResourceLogs`` (0x0a, 0x12, 0x1a), and a control byte
    no text log holds within the first ``PROTOBUF_PEEK_BYTES`` bytes (a text file that starts with
    blank lines also starts with 0x0a)."""
    if len(head) < 3 or head[0] != 0x0A:
        return False
    i = 1
    while i < len(head) and head[i] & 0x80:  # varint continuation bytes
        i += 1
    return i + 1 < len(head) and head[i + 1] in (0x0A, 0x12, 0x1A) and any(b in _BINARY_BYTES for b in head[:PROTOBUF_PEEK_BYTES])


def looks_like_export_request(prefix: bytes) -> bool:
    """True when ``prefix`` (the start of a line) is the start of an OTLP/JSON
    ``ExportLogsServiceRequest``: a JSON object with ``"resourceLogs"`` in its first
    ``OTLP_SNIFF_BYTES`` bytes (the OpenTelemetry Collector ``file`` exporter writes one request
    per line, ``{"resourceLogs":[…]}``, often hundreds of KB long)."""
    head = prefix[:OTLP_SNIFF_BYTES]
    return head.lstrip()[:1] == b"{" and b'"resourceLogs"' in head


@dataclass
class OtlpLogRecord:
    """One LogRecord with its resource and scope; ids as lower-case hex, times as integer ns.

    ``position`` is ``rl<i>.sl<j>.lr<k>`` (indices in the request). Times are 0 when unknown.
    """

    position: str
    resource: dict[str, Any]
    scope_name: str | None
    scope_version: str | None
    time_unix_nano: int
    observed_time_unix_nano: int
    severity_number: int
    severity_text: str | None
    body: Any
    attributes: dict[str, Any]
    trace_id: str | None
    span_id: str | None
    flags: int = 0
    event_name: str | None = None
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why the record cannot be stored (a time that is no number)
    # card numbers masked inside its bytes values (resource's included) while decoding: base64
    # text shows no digits, so the parser's masker cannot count them; it adds this (``pan_masked``)
    bytes_pans_masked: int = 0
    # attribute keys (dotted paths into maps; ``resource.`` for its resource's) given twice with
    # different values: the record is quarantined (``duplicate-key``), never stored with one of them
    duplicate_keys: list[str] = field(default_factory=list)

    def view(self) -> dict[str, Any]:
        """A JSON-able document of the record (the "raw line" we hash and quarantine)."""
        return {
            "resource": self.resource,
            "scope": {"name": self.scope_name, "version": self.scope_version},
            "logRecord": {
                "timeUnixNano": self.time_unix_nano, "observedTimeUnixNano": self.observed_time_unix_nano,
                "severityNumber": self.severity_number, "severityText": self.severity_text, "body": self.body,
                "attributes": self.attributes, "traceId": self.trace_id, "spanId": self.span_id,
                "flags": self.flags, "eventName": self.event_name,
            },
        }


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# proto3 JSON's integer text: ASCII digits only (``str.isdigit`` also takes "²", which ``int`` refuses).
# At most 20 digits: every 64-bit value, and no text Python's int() refuses for its length.
_DECIMAL = re.compile(r"\s*-?[0-9]{1,20}\s*\Z")
_UNSIGNED = re.compile(r"\s*[0-9]{1,20}\s*\Z")


def _int(value: Any) -> int:
    """An integer field as proto3 JSON writes it (a number or a decimal string); 0 for anything else
    (``check_export_request`` has refused a wrong type where the value matters)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**64:  # 1.0: orjson's reading of 1.0
        return int(value)
    if isinstance(value, str) and _DECIMAL.match(value):
        return int(value)
    return 0


def without_nul(text: str) -> str:
    """``text`` as stored: NUL (which PostgreSQL text and jsonb refuse; a ``copytruncate``
    rotation leaves runs of them) becomes U+FFFD — a protobuf string here, every string of a JSON
    line in ``parser.storable``."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def _finite(value: float) -> Any:
    return value if math.isfinite(value) else repr(value)


@dataclass
class Tally:
    """What decoding one record's values found besides the values: card numbers masked in bytes
    values (``pans``) and keys given twice with different values (``duplicates``, dotted paths)."""

    pans: int = 0
    duplicates: list[str] = field(default_factory=list)

    def copy(self) -> "Tally":
        return Tally(self.pans, list(self.duplicates))


def bytes_value_text(raw: bytes, tally: Tally | None = None) -> str:
    """An ``AnyValue.bytes_value`` as stored: base64 (RFC 4648) of the bytes with any card number in
    them masked first — base64 hides digits from the masker that reads the stored text, so a PAN in a
    bytes attribute would be stored whole. Read as Latin-1 (one character per byte): a PAN written
    as text (``pan.mask_text``) and, in binary data, every run of 13+ digits (``pan.mask_binary``)
    keep their first 6 and last 4 digits. ``tally.pans`` (when given) grows by the number masked."""
    text = raw.decode("latin-1")
    masked, found = mask_text(text)
    masked, runs = mask_binary(masked)
    if found or runs:
        raw = masked.encode("latin-1", "replace")
        if tally is not None:
            tally.pans += found + runs
    return base64.b64encode(raw).decode("ascii")


def _json_bytes(value: str, tally: Tally | None) -> str:
    """OTLP/JSON ``bytesValue`` (base64 text) as ``bytes_value_text`` stores it; text that is not
    base64 stays as given (the masker reads it as text)."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value
    return bytes_value_text(raw, tally)


def json_any_value(value: Any, tally: Tally | None = None, path: str = "") -> Any:
    """An OTLP/JSON ``AnyValue`` object → Python value (``kvlistValue`` → dict, ``arrayValue`` → list).
    ``tally`` (when given) counts the card numbers masked in its bytes values and names the map keys
    given twice with different values (``path``: the dotted key of this value)."""
    v = _dict(value)
    # The kind set (``check_export_request`` has refused two kinds and wrong types); null is unset.
    kind = next((k for k in _ANY_VALUE_KINDS if v.get(k) is not None), None)
    if kind is None:
        return None
    x = v[kind]
    if kind == "stringValue":
        return x if isinstance(x, str) else str(x)
    if kind == "boolValue":
        return x is True
    if kind == "intValue":
        return _int(x)
    if kind == "doubleValue":
        try:
            return _finite(float(x))
        except (TypeError, ValueError):
            return None
    if kind == "bytesValue":
        return _json_bytes(x, tally) if isinstance(x, str) else None
    if kind == "arrayValue":
        return [json_any_value(y, tally, path) for y in _list(_dict(x).get("values"))]
    return json_key_values(_dict(x).get("values"), tally, f"{path}.")


def json_key_values(items: Any, tally: Tally | None = None, prefix: str = "") -> dict[str, Any]:
    """A list of OTLP/JSON ``KeyValue`` → dict. A key given twice with the same value is one entry;
    with different values the later wins here and ``tally`` names it (``prefix`` + key): the OTLP
    data model says keys MUST be unique, and the caller refuses such a record rather than keep one
    value silently (issue 4: "duplicate keys that disagree" are quarantined)."""
    return _key_values(((kv.get("key"), kv.get("value")) for kv in map(_dict, _list(items))), json_any_value,
                       tally, prefix)


def _key_values(pairs: Iterable[tuple[Any, Any]], convert: Callable[..., Any], tally: Tally | None,
                prefix: str) -> dict[str, Any]:
    """``{key: convert(value, tally, prefix + key)}`` of string keys, duplicates that disagree named in ``tally``."""
    out: dict[str, Any] = {}
    for key, raw in pairs:
        if not isinstance(key, str):
            continue
        value = convert(raw, tally, prefix + key)
        if key in out and out[key] != value and tally is not None and prefix + key not in tally.duplicates:
            tally.duplicates.append(prefix + key)
        out[key] = value
    return out


def _hex_id(value: Any, length: int, what: str, warnings: list[str]) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str) or len(value) != length or not _HEX.match(value):
        warnings.append(f"OTLP {what} is not {length} hex digits; ignored")
        return None
    text = value.lower()
    return None if text == "0" * length else text


class OtlpMalformed(ValueError):
    """An OTLP request that is not a well-formed ``ExportLogsServiceRequest``.

    ``reason`` is the quarantine reason / HTTP 400 message: ``malformed-otlp: <path>: <problem>``,
    the path in the JSON member names (``resourceLogs[0].scopeLogs: not an array``). OTLP/HTTP
    answers a malformed request 400, not to be retried (opentelemetry-proto
    ``docs/specification.md``, "Failures"); a file holding one is quarantined as one unit.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.reason = f"malformed-otlp: {path}: {problem}"
        super().__init__(self.reason)


_JSON_TYPE = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
              float: "a number", type(None): "null"}


def _expect(value: Any, kind: type, path: str) -> None:
    """Raise ``OtlpMalformed`` unless ``value`` is a ``kind`` (dict or list) or null / absent
    (proto3 JSON: null is the field's default)."""
    if value is not None and not isinstance(value, kind):
        raise OtlpMalformed(path, f"not {_JSON_TYPE[kind]} but {_JSON_TYPE.get(type(value), type(value).__name__)}")


def _check_key_values(items: Any, path: str) -> None:
    _expect(items, list, path)
    for n, kv in enumerate(items or ()):
        _expect(kv, dict, f"{path}[{n}]")
        if kv is None:
            raise OtlpMalformed(f"{path}[{n}]", "null is not a KeyValue")
        key = kv.get("key")
        if key is not None and not isinstance(key, str):
            raise OtlpMalformed(f"{path}[{n}].key", f"not a string but {_JSON_TYPE.get(type(key), 'a value')}")
        _check_any_value(kv.get("value"), f"{path}[{n}].value")


def _check_any_value(value: Any, path: str) -> None:
    """An ``AnyValue`` is an object; its ``arrayValue``/``kvlistValue`` hold a ``values`` array (iterative:
    nesting is bounded by the JSON decoder's depth limit, not by Python's stack)."""
    stack = [(value, path)]
    while stack:
        value, path = stack.pop()
        _expect(value, dict, path)
        if not value:
            continue
        _check_scalar_value(value, path)
        for member, item_kind in (("arrayValue", "AnyValue"), ("kvlistValue", "KeyValue")):
            if member not in value:
                continue
            inner = value[member]
            _expect(inner, dict, f"{path}.{member}")
            values = (inner or {}).get("values")
            _expect(values, list, f"{path}.{member}.values")
            for n, item in enumerate(values or ()):
                if item_kind == "AnyValue":
                    stack.append((item, f"{path}.{member}.values[{n}]"))
                    continue
                _expect(item, dict, f"{path}.{member}.values[{n}]")
                if item is None:
                    raise OtlpMalformed(f"{path}.{member}.values[{n}]", "null is not a KeyValue")
                key = item.get("key")
                if key is not None and not isinstance(key, str):
                    raise OtlpMalformed(f"{path}.{member}.values[{n}].key", "not a string")
                stack.append((item.get("value"), f"{path}.{member}.values[{n}].value"))


_DOUBLE_WORDS = frozenset({"NaN", "Infinity", "-Infinity"})


def _check_scalar_value(value: dict[str, Any], path: str) -> None:
    """Raise ``OtlpMalformed`` when the ``AnyValue`` object ``value`` sets more than one kind (a
    protobuf ``oneof``) or a scalar kind of the wrong JSON type, as proto3 JSON parsing
    (``json_format.Parse``) refuses them: ``stringValue`` a string, ``boolValue`` true or false
    (``"false"`` read as a truth value was stored true), ``intValue`` an integer or its decimal
    string within int64, ``doubleValue`` a number or its text (``"NaN"``, ``"Infinity"`` too),
    ``bytesValue`` a string. null is the field's default."""
    kinds = [k for k in _ANY_VALUE_KINDS if value.get(k) is not None]
    if len(kinds) > 1:
        raise OtlpMalformed(path, f"sets {' and '.join(kinds)}; an AnyValue holds one of them")
    if not kinds:
        return
    kind = kinds[0]
    v = value[kind]
    if kind == "stringValue" and not isinstance(v, str) \
            or kind == "boolValue" and not isinstance(v, bool) \
            or kind == "bytesValue" and not isinstance(v, str) \
            or kind == "intValue" and not _is_int64(v) \
            or kind == "doubleValue" and not _is_double(v):
        shown = _JSON_TYPE.get(type(v), type(v).__name__)
        raise OtlpMalformed(f"{path}.{kind}", f"{shown} that proto3 JSON does not read as a {_KIND_TYPE[kind]}")


_KIND_TYPE = {"stringValue": "string", "boolValue": "boolean (true or false)", "bytesValue": "base64 string",
              "intValue": "64-bit integer (a number or a decimal string)",
              "doubleValue": "double (a number, its text, NaN or Infinity)"}


def _is_int64(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, float):  # orjson reads 5.0 and 1e3 as floats: proto3 JSON takes integral ones
        return v.is_integer() and -2**63 <= v < 2**63
    if isinstance(v, str):
        if not _DECIMAL.match(v):
            return False
        v = int(v)
    return isinstance(v, int) and -2**63 <= v < 2**63


def _is_double(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, float):
        return True
    if isinstance(v, int):
        return abs(v) < 2**1024  # beyond the largest double: float() raises OverflowError
    if not isinstance(v, str):
        return False
    if v in _DOUBLE_WORDS:
        return True
    try:
        float(v)
    except ValueError:
        return False
    return not v.strip().lower().lstrip("+-").startswith(("inf", "nan"))  # only the three words spell those


def _check_record_scalars(lr: dict[str, Any], path: str) -> None:
    """The LogRecord's ``severityNumber`` (an integer or a ``SEVERITY_NUMBER_*`` name) and ``flags``
    (a uint32: an integer or its decimal string), which proto3 JSON parsing refuses otherwise: read
    as 0 they were silently lost."""
    sev = lr.get("severityNumber")
    if sev is not None and not (isinstance(sev, int) and not isinstance(sev, bool) and -2**31 <= sev < 2**31) \
            and not (isinstance(sev, str) and sev in _severity_numbers()):
        raise OtlpMalformed(f"{path}.severityNumber", "neither a 32-bit integer nor a SEVERITY_NUMBER_* name")
    flags = lr.get("flags")
    if flags is not None and not (_is_int64(flags) and 0 <= _int(flags) < 2**32):
        raise OtlpMalformed(f"{path}.flags", "not a 32-bit unsigned integer")


def _severity_numbers() -> dict[str, int]:
    """``SEVERITY_NUMBER_*`` enum names → numbers (opentelemetry-proto ``logs.proto``)."""
    global _SEVERITY_NUMBERS
    if _SEVERITY_NUMBERS is None:
        from opentelemetry.proto.logs.v1.logs_pb2 import SeverityNumber

        _SEVERITY_NUMBERS = dict(SeverityNumber.items())
    return _SEVERITY_NUMBERS


_SEVERITY_NUMBERS: dict[str, int] | None = None


def _severity(value: Any) -> int:
    """A checked ``severityNumber``: its integer, or the number of its enum name."""
    if isinstance(value, str):
        return _severity_numbers().get(value, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def check_export_request(doc: dict[str, Any]) -> None:
    """Raise ``OtlpMalformed`` naming the first member of the message tree of the OTLP/JSON
    ``doc`` that has the wrong JSON type: each repeated field an array of objects, each message
    an object (``resourceLogs``, ``resource``, ``scopeLogs``, ``scope``, ``logRecords``,
    ``attributes``, ``body`` and the ``AnyValue``/``KeyValue`` inside). ``json_format.Parse``
    rejects the whole request for these too; before, they were read as empty and the request
    answered 200 with nothing stored. A scalar field's bad value (``timeUnixNano: "abc"``) is the
    record's problem: ``OtlpLogRecord.problems``, its record quarantined with that reason.
    """
    for p, rl in _messages(doc.get("resourceLogs"), "resourceLogs", "ResourceLogs"):
        _expect(rl.get("resource"), dict, f"{p}.resource")
        _check_key_values((rl.get("resource") or {}).get("attributes"), f"{p}.resource.attributes")
        for q, sl in _messages(rl.get("scopeLogs"), f"{p}.scopeLogs", "ScopeLogs"):
            _expect(sl.get("scope"), dict, f"{q}.scope")
            _check_key_values((sl.get("scope") or {}).get("attributes"), f"{q}.scope.attributes")
            for r, lr in _messages(sl.get("logRecords"), f"{q}.logRecords", "LogRecord"):
                _check_record_scalars(lr, r)
                _check_key_values(lr.get("attributes"), f"{r}.attributes")
                if lr.get("body") is not None:
                    _check_any_value(lr["body"], f"{r}.body")


def _messages(items: Any, path: str, message: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(path[i], object)`` of each element of the repeated message field ``items`` (null: none);
    ``OtlpMalformed`` at the field or the first element that is not an object."""
    _expect(items, list, path)
    for i, item in enumerate(items or ()):
        at = f"{path}[{i}]"
        if not isinstance(item, dict):
            _expect(item, dict, at)
            raise OtlpMalformed(at, f"null is not a {message}")
        yield at, item


def _time_problem(lr: dict[str, Any], name: str) -> str | None:
    """Why ``lr[name]`` (a fixed64 nanosecond time: a decimal string or a number) cannot be read, or None."""
    value = lr.get(name)
    if value is None:
        return None
    if (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64) or \
            (isinstance(value, str) and _UNSIGNED.match(value) and int(value) < 2**64):
        return _pan_time_problem(name, value)
    if number_holds_pan(value):  # a float or a signed string: its text is not repeated in the reason
        return f"OTLP {name} is not a whole number of nanoseconds since the epoch (its digits read as a card number)"
    return f"OTLP {name} {value!r} is not a whole number of nanoseconds since the epoch"


def _pan_time_problem(name: str, value: Any) -> str | None:
    """Why a well-formed time ``value`` of field ``name`` is not stored: its digits read as a card
    number (``pan.number_holds_pan`` with the issuer rule: epoch nanoseconds start with 1 until
    2033, 20-21 until 2039), so storing it as a time would keep the PAN in a number column. None otherwise."""
    if number_holds_pan(value, card_issuer_only=True):
        return f"OTLP {name}: its digits read as a card number (PAN), not a time"
    return None


def _observed_time(value: int, problem: str | None, warnings: list[str]) -> int:
    """``observedTimeUnixNano`` as kept: 0 (unknown), with a warning, when it cannot be read or its
    digits read as a card number. It is the collector's receive time, never the event time, so an
    unreadable one is dropped rather than the record refused (as an unreadable ``timeUnixNano`` is)."""
    if problem is None:
        return value
    warnings.append(f"{problem}; dropped")
    return 0


def records_from_json(doc: dict[str, Any]) -> Iterator[OtlpLogRecord]:
    """Every LogRecord of an OTLP/JSON ``ExportLogsServiceRequest`` (already decoded JSON).

    Raises:
        OtlpMalformed: the document's structure is wrong (``check_export_request``), before any
            record is produced.
    """
    check_export_request(doc)
    return _records_from_json(doc)


def _records_from_json(doc: dict[str, Any]) -> Iterator[OtlpLogRecord]:
    for i, rl in enumerate(_list(doc.get("resourceLogs"))):
        rl = _dict(rl)
        in_resource = Tally()
        resource = json_key_values(_dict(rl.get("resource")).get("attributes"), in_resource, "resource.")
        for j, sl in enumerate(_list(rl.get("scopeLogs"))):
            sl = _dict(sl)
            scope = _dict(sl.get("scope"))
            for k, lr in enumerate(_list(sl.get("logRecords"))):
                lr = _dict(lr)
                warnings: list[str] = []
                sev = lr.get("severityNumber")
                problem = _time_problem(lr, "timeUnixNano")
                observed = _observed_time(_int(lr.get("observedTimeUnixNano")),
                                          _time_problem(lr, "observedTimeUnixNano"), warnings)
                tally = in_resource.copy()  # every record carries its resource's values
                body = json_any_value(lr.get("body"), tally, "body") if "body" in lr else None
                attributes = json_key_values(lr.get("attributes"), tally)
                yield OtlpLogRecord(
                    position=f"rl{i}.sl{j}.lr{k}", resource=resource,
                    scope_name=scope.get("name") if isinstance(scope.get("name"), str) else None,
                    scope_version=scope.get("version") if isinstance(scope.get("version"), str) else None,
                    time_unix_nano=_int(lr.get("timeUnixNano")),
                    observed_time_unix_nano=observed,
                    severity_number=_severity(sev),
                    severity_text=lr.get("severityText") if isinstance(lr.get("severityText"), str) else None,
                    body=body, attributes=attributes, bytes_pans_masked=tally.pans,
                    duplicate_keys=tally.duplicates,
                    trace_id=_hex_id(lr.get("traceId"), 32, "traceId", warnings),
                    span_id=_hex_id(lr.get("spanId"), 16, "spanId", warnings),
                    flags=_int(lr.get("flags")),
                    event_name=lr.get("eventName") if isinstance(lr.get("eventName"), str) else None,
                    warnings=warnings, problems=[problem] if problem else [],
                )


def _pb_any_value(v: Any, tally: Tally | None = None, path: str = "") -> Any:
    """A protobuf ``AnyValue`` → Python value, as ``json_any_value``."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "string_value":
        return without_nul(v.string_value)
    if kind == "bool_value":
        return v.bool_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return _finite(v.double_value)
    if kind == "bytes_value":
        return bytes_value_text(v.bytes_value, tally)
    if kind == "array_value":
        return [_pb_any_value(x, tally, path) for x in v.array_value.values]
    if kind == "kvlist_value":
        return _pb_key_values(v.kvlist_value.values, tally, f"{path}.")
    return None


def _pb_key_values(items: Any, tally: Tally | None, prefix: str = "") -> dict[str, Any]:
    """Repeated protobuf ``KeyValue`` → dict, as ``json_key_values``."""
    return _key_values(((without_nul(kv.key), kv.value) for kv in items), _pb_any_value, tally, prefix)


def _pb_id(raw: bytes, length: int, what: str, warnings: list[str]) -> str | None:
    if not raw:
        return None
    if len(raw) != length:
        warnings.append(f"OTLP {what} has {len(raw)} bytes, not {length}; ignored")
        return None
    text = raw.hex()
    return None if text == "0" * (2 * length) else text


def records_from_protobuf(data: bytes) -> Iterator[OtlpLogRecord]:
    """Every LogRecord of a binary ``ExportLogsServiceRequest``.

    Raises:
        google.protobuf.message.DecodeError: the bytes are not a valid message.
        OtlpMalformed: a field came with the wrong wire type (``check_protobuf_request``).
    """
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    req = ExportLogsServiceRequest.FromString(data)
    check_protobuf_request(req)
    return _records_from_request(req)


_WIRE_TYPES = {0: "varint", 1: "64-bit", 2: "length-delimited", 3: "group start", 4: "group end", 5: "32-bit"}


def check_protobuf_request(req: Any) -> None:
    """Raise ``OtlpMalformed`` when a field of the decoded protobuf message tree ``req`` came with
    the wrong wire type (``resource_logs`` sent as a varint…). The protobuf runtime keeps such a
    field as an *unknown* field and decodes the request as empty; unknown field numbers stay
    allowed (a newer sender's fields, ignored as the spec says). The walk runs only when the
    request holds unknown fields at all (its size with and without them differs)."""
    from google.protobuf import unknown_fields
    from google.protobuf.message import Message

    probe = type(req)()
    probe.CopyFrom(req)
    probe.DiscardUnknownFields()
    if probe.ByteSize() == req.ByteSize():
        return
    stack: list[tuple[Any, str]] = [(req, "")]
    while stack:
        message, path = stack.pop()
        fields = message.DESCRIPTOR.fields_by_number
        for unknown in unknown_fields.UnknownFieldSet(message):
            known = fields.get(unknown.field_number)
            if known is not None:
                raise OtlpMalformed(f"{path}{known.json_name}",
                                    f"field {unknown.field_number} ({known.name}) came with protobuf wire type "
                                    f"{unknown.wire_type} ({_WIRE_TYPES.get(unknown.wire_type, 'unknown')}), "
                                    "which its type does not use")
        for fd, value in message.ListFields():
            if fd.message_type is None:
                continue
            if isinstance(value, Message):
                stack.append((value, f"{path}{fd.json_name}."))
            else:  # a repeated field
                stack.extend((v, f"{path}{fd.json_name}[{n}].") for n, v in enumerate(value))


def _records_from_request(req: Any) -> Iterator[OtlpLogRecord]:
    for i, rl in enumerate(req.resource_logs):
        in_resource = Tally()
        resource = _pb_key_values(rl.resource.attributes, in_resource, "resource.")
        for j, sl in enumerate(rl.scope_logs):
            for k, lr in enumerate(sl.log_records):
                warnings: list[str] = []
                tally = in_resource.copy()
                body = _pb_any_value(lr.body, tally, "body") if lr.HasField("body") else None
                attributes = _pb_key_values(lr.attributes, tally)
                problem = _pan_time_problem("timeUnixNano", lr.time_unix_nano)
                observed = _observed_time(lr.observed_time_unix_nano,
                                          _pan_time_problem("observedTimeUnixNano", lr.observed_time_unix_nano), warnings)
                yield OtlpLogRecord(
                    position=f"rl{i}.sl{j}.lr{k}", resource=resource, problems=[problem] if problem else [],
                    scope_name=without_nul(sl.scope.name) or None, scope_version=without_nul(sl.scope.version) or None,
                    time_unix_nano=lr.time_unix_nano, observed_time_unix_nano=observed,
                    severity_number=int(lr.severity_number), severity_text=without_nul(lr.severity_text) or None,
                    body=body, attributes=attributes, bytes_pans_masked=tally.pans,
                    duplicate_keys=tally.duplicates,
                    trace_id=_pb_id(lr.trace_id, 16, "trace_id", warnings),
                    span_id=_pb_id(lr.span_id, 8, "span_id", warnings),
                    flags=lr.flags, event_name=without_nul(getattr(lr, "event_name", "")) or None, warnings=warnings,
                )


def export_response(rejected: int, error_message: str | None, as_json: bool) -> tuple[bytes, str]:
    """``ExportLogsServiceResponse`` body and content type (OTLP/HTTP: same encoding as the request).

    ``partial_success`` is set only when some records were rejected (spec: the client must not
    retry them).
    """
    if as_json:
        import json

        doc: dict[str, Any] = {}
        if rejected:
            doc["partialSuccess"] = {"rejectedLogRecords": str(rejected), "errorMessage": error_message or ""}
        return json.dumps(doc).encode(), "application/json"
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

    resp = ExportLogsServiceResponse()
    if rejected:
        resp.partial_success.rejected_log_records = rejected
        resp.partial_success.error_message = error_message or ""
    return resp.SerializeToString(), "application/x-protobuf"
