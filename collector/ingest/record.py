"""The canonical inference record (log-formats.md §7) and its deduplication key.

``CanonicalRecord`` mirrors the ``inference_records`` columns. Every text in it has been through
PAN masking before it exists (``payloads.build_record`` masks as it builds), so nothing here can
carry a full card number to disk.

``dedup_key`` = SHA-256 of the canonical JSON of the *business content* only — transaction id,
event time and its precision, cluster, pod identity, container, model, decision, latency, trace
and span ids — never the envelope (shipper, runtime time, labels) or the free-text attributes, so
the same transaction delivered twice, or by two shippers, is stored once. A record without a
decision (one of the transaction's other log lines: Spring's MDC puts the id on "request
received", "calling Triton"…) adds its message (``event_text``): two such lines in the same
millisecond are two events, not one line delivered twice.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from collector.ingest.pan import number_holds_pan
from collector.store import ledger
from collector.store.canonical import canonical_json, content_hash

SOURCE_FORMATS = ("spring_ecs_flat", "spring_ecs_nested", "logstash", "gelf", "otlp", "json")

# Column widths of inference_records (collector/store/models.py); longer values are quarantined.
COLUMN_LIMITS = {
    "transaction_id": 256, "pod_namespace": 253, "pod_name": 253, "container_name": 253,
    "node_name": 253, "model_name": 253, "model_version": 64, "decision": 64, "cluster": 253,
}

_HEX = re.compile(r"^[0-9a-f]+$")
_LOWER_HEX = "0123456789abcdef"

POSITION_CHARS = 64  # inference_records.position / quarantine.position width; longer positions are cut
# inference_records columns a parsed record fills (the writer adds received_ns, run_id, conflict).
PREPARED_COLUMNS = (
    "transaction_id", "event_time_ns", "event_time_precision_ns", "cluster", "pod_uid", "pod_uid_source",
    "pod_namespace", "pod_name", "container_name", "node_name", "model_name", "model_version", "decision",
    "latency_ms", "trace_id", "span_id", "source_format", "envelope", "source", "position", "raw_sha256",
    "dedup_key", "attributes",
)


def _hex_id(value: Any, name: str, hex_len: int, pad_from: int | None = None) -> str | None:
    """A W3C trace-context id as ``hex_len`` lower-case hex digits, or None.

    Integers and Datadog's decimal ``dd.*`` ids are converted; a ``pad_from``-digit id is
    left-padded (64-bit trace ids); absent, all-zero ("invalid" in W3C) or malformed ids give None.
    """
    # The usual id: exactly ``hex_len`` lower-case hex digits, not all zero, under a name that is
    # not Datadog's (decimal ``dd.*`` ids are converted below): returned as it is, as below.
    if value.__class__ is str and len(value) == hex_len and not value.strip(_LOWER_HEX) \
            and not name.startswith("dd.") and value.strip("0"):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if name.startswith("dd.") and text.isdigit():
        n = int(text)
        text = f"{n:0{hex_len}x}" if n < 2 ** (4 * hex_len) else ""
    if pad_from is not None and len(text) == pad_from and _HEX.match(text):
        text = text.rjust(hex_len, "0")
    if len(text) != hex_len or not _HEX.match(text) or text == "0" * hex_len:
        return None
    return text


def normalise_trace_id(value: Any, name: str = "") -> str | None:
    """Trace id → 32 lower-case hex (16-hex ids left-padded; Datadog decimal ids converted).

    Returns None for absent, all-zero (W3C "invalid") or malformed ids.
    """
    return _hex_id(value, name, 32, pad_from=16)


def normalise_span_id(value: Any, name: str = "") -> str | None:
    """Span id → 16 lower-case hex; None for absent, all-zero or malformed ids."""
    return _hex_id(value, name, 16)


# inference_records.event_time_ns is a BIGINT: a signed 64-bit count of nanoseconds holds
# 1677-09-21T00:12:43.145224192Z … 2262-04-11T23:47:16.854775807Z.
EVENT_TIME_NS_MIN, EVENT_TIME_NS_MAX = -2 ** 63, 2 ** 63 - 1


class OutOfRange(ValueError):
    """A numeric value that cannot be stored in its column (the message says which range)."""


def check_event_time_ns(ns: int) -> int:
    """``ns`` when it fits ``inference_records.event_time_ns`` (a signed 64-bit integer).

    Raises:
        OutOfRange: outside 1677-09-21 … 2262-04-11 UTC.
    """
    if not EVENT_TIME_NS_MIN <= ns <= EVENT_TIME_NS_MAX:
        raise OutOfRange("timestamp out of range: a signed 64-bit nanosecond count holds 1677-09-21 to 2262-04-11 UTC")
    return ns


def coerce_latency_ms(value: Any) -> float | None:
    """A latency in milliseconds from a JSON number or an MDC string (``"12.4"``); None if not a number.

    Raises:
        OutOfRange: a number that is not a finite double (``1e400``, an integer of 400 digits,
            ``NaN``, ``"Infinity"``): ``inference_records.latency_ms`` is a double-precision column;
            or one whose integer digits read as a card number (``4111111111111111``,
            ``"5500000000000004.0"``: ``pan.number_holds_pan``): a double holds a 16-digit
            integer exactly, so the column would keep the PAN whole (PCI DSS v4.0 3.3-3.4). The
            caller keeps such a value as masked text in the attributes, as it does ``NaN``.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            f = float(value)
        except OverflowError:
            f = math.inf
    elif isinstance(value, str):
        try:
            f = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    if not math.isfinite(f):
        raise OutOfRange("latency out of range: not a finite number of milliseconds")
    if not -1e12 < f < 1e12 and number_holds_pan(value):  # 13 integer digits at least
        raise OutOfRange("latency not stored as a number: its digits read as a card number (PAN)")
    return f


# Where a line's message is, by format: ECS/logstash/Spring "message", GELF "short_message"/"full_message",
# other JSON loggers "msg", an OTLP record's body.
EVENT_TEXT_KEYS = ("message", "short_message", "full_message", "msg", "otel.body", "body")


def event_text(attributes: dict[str, Any] | None) -> Any:
    """The message of a line (the first of ``EVENT_TEXT_KEYS`` in its attributes), or None: what
    tells apart two log lines of one transaction that carry no decision (``business_content``)."""
    if attributes:
        for key in EVENT_TEXT_KEYS:
            if key in attributes:
                return attributes[key]
    return None


@dataclass(slots=True)
class CanonicalRecord:
    """One accepted inference line, normalised; field names are the ``inference_records`` columns.

    Times: ``event_time_ns`` integer ns since the epoch (UTC) with ``event_time_precision_ns``.
    ``pod_uid`` is set only when the envelope carried it (``pod_uid_source='envelope'``).
    """

    transaction_id: str
    event_time_ns: int
    event_time_precision_ns: int
    source_format: str
    envelope: str
    raw_sha256: str
    source: str
    position: str | None
    cluster: str | None = None
    pod_uid: str | None = None
    pod_uid_source: str | None = None
    pod_namespace: str | None = None
    pod_name: str | None = None
    container_name: str | None = None
    node_name: str | None = None
    model_name: str | None = None
    model_version: str | None = None
    decision: str | None = None
    latency_ms: float | None = None
    trace_id: str | None = None
    span_id: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)

    def business_content(self) -> dict[str, Any]:
        """The fields that identify the transaction's content (the dedup key's input); without a
        decision, also the line's message (``event_text``)."""
        content = {
            "transaction_id": self.transaction_id, "event_time_ns": self.event_time_ns,
            "event_time_precision_ns": self.event_time_precision_ns, "cluster": self.cluster,
            "pod_uid": self.pod_uid, "pod_namespace": self.pod_namespace, "pod_name": self.pod_name,
            "container_name": self.container_name, "model_name": self.model_name,
            "model_version": self.model_version, "decision": self.decision, "latency_ms": self.latency_ms,
            "trace_id": self.trace_id, "span_id": self.span_id,
        }
        if self.decision is None:
            content["message"] = event_text(self.attributes)
        return content

    def dedup_key(self) -> str:
        """SHA-256 (hex) of the canonical JSON of ``business_content()``."""
        return content_hash(self.business_content())

    def too_long(self) -> str | None:
        """The first column whose value exceeds its width, or None."""
        for name, limit in COLUMN_LIMITS.items():
            v = getattr(self, name)
            if v is not None and len(v) > limit:
                return name
        return None

    def row(self, received_ns: int, run_id: str | None) -> dict[str, Any]:
        """Column → value mapping for ``inference_records`` (without ``id`` and ``conflict``)."""
        return {
            "transaction_id": self.transaction_id, "event_time_ns": self.event_time_ns,
            "event_time_precision_ns": self.event_time_precision_ns, "received_ns": received_ns,
            "cluster": self.cluster, "pod_uid": self.pod_uid, "pod_uid_source": self.pod_uid_source,
            "pod_namespace": self.pod_namespace, "pod_name": self.pod_name,
            "container_name": self.container_name, "node_name": self.node_name,
            "model_name": self.model_name, "model_version": self.model_version, "decision": self.decision,
            "latency_ms": self.latency_ms, "trace_id": self.trace_id, "span_id": self.span_id,
            "source_format": self.source_format, "envelope": self.envelope, "source": self.source,
            "position": self.position, "raw_sha256": self.raw_sha256, "dedup_key": self.dedup_key(),
            "attributes": self.attributes or None, "run_id": run_id,
        }

    def prepared(self) -> "PreparedRecord":
        """The record's ``PREPARED_COLUMNS`` values with the attributes as JSON text, and its
        ledger leaf template (``ledger_template``)."""
        text, exact = attributes_json(self.attributes)
        values = (
            self.transaction_id, self.event_time_ns, self.event_time_precision_ns, self.cluster, self.pod_uid,
            self.pod_uid_source, self.pod_namespace, self.pod_name, self.container_name, self.node_name,
            self.model_name, self.model_version, self.decision, self.latency_ms, self.trace_id, self.span_id,
            self.source_format, self.envelope, self.source, self.position and self.position[:POSITION_CHARS],
            self.raw_sha256, self.dedup_key(), text,
        )
        return PreparedRecord(values, exact, ledger_template(values, exact))


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None (what orjson writes for them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def attributes_json(attributes: dict[str, Any] | None) -> tuple[str, bool]:
    """The ``attributes`` column's JSON text (keys sorted; ``null`` when empty) and whether it is
    exactly what the ledger's leaf encoding gives for the value read back (``ledger.leaf_hash``).

    Integers beyond 64 bits (which orjson refuses) take the canonical encoder's fallback; their
    text is not the leaf encoding (``exact`` False: the writer hashes the decoded value instead).
    """
    if not attributes:
        return "null", True
    try:
        return orjson.dumps(attributes, option=orjson.OPT_SORT_KEYS).decode("utf-8"), True
    except orjson.JSONEncodeError:
        return canonical_json(_finite(attributes)).decode("utf-8"), False


# The inference_records columns whose leaf encodings the writer fills into a record's ledger leaf
# template, in sorted order (``ledger.leaf_template``): those only it knows, and the attributes,
# whose text it has anyway (the template would carry it twice through the worker's pipe).
LATE_COLUMNS = ("attributes", "conflict", "id", "received_ns", "run_id")


def ledger_template(values: tuple[Any, ...], exact: bool) -> bytes | None:
    """The ``inference_records`` ledger leaf of a row with these ``PREPARED_COLUMNS`` values with
    a hole for each of ``LATE_COLUMNS`` (``ledger.leaf_template``); None when the attributes text
    is not exact (``attributes_json``: the leaf then holds the value read back, not the text) or
    the leaf's fast encoding does not take a value: the writer then hashes the row itself.

    Computed where the record is prepared (a parse worker, in parallel runs): the writer then
    fills five holes and hashes instead of encoding the row again.
    """
    return _leaf_template(values) if exact else None


_leaf_template = ledger.leaf_template_function("inference_records", PREPARED_COLUMNS, LATE_COLUMNS)


class PreparedRecord:
    """A record as ``PREPARED_COLUMNS`` values with ``attributes`` as JSON text: what the writer
    needs, and cheap to pickle (parse workers send these). Already PAN-masked, like its record.

    ``exact_json``: see ``attributes_json``. ``leaf``: ``ledger_template``'s template, or None.
    """

    __slots__ = ("values", "exact_json", "leaf")

    def __init__(self, values: tuple[Any, ...], exact_json: bool = True,
                 leaf: bytes | None = None) -> None:
        self.values = values
        self.exact_json = exact_json
        self.leaf = leaf

    def __reduce__(self) -> tuple[Any, ...]:
        return PreparedRecord, (self.values, self.exact_json, self.leaf)

    def prepared(self) -> "PreparedRecord":
        """Itself (the writer accepts ``CanonicalRecord`` and ``PreparedRecord`` alike)."""
        return self

    def row(self, received_ns: int, run_id: str | None) -> dict[str, Any]:
        """Column → value mapping, like ``CanonicalRecord.row`` (attributes decoded)."""
        row = dict(zip(PREPARED_COLUMNS, self.values))
        row["attributes"] = orjson.loads(row["attributes"]) if self.exact_json else json.loads(row["attributes"])
        row["received_ns"] = received_ns
        row["run_id"] = run_id
        return row
