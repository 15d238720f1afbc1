"""The canonical inference record (log-formats.md §7) and its deduplication key.

``CanonicalRecord`` mirrors the ``inference_records`` columns. Every text in it has been through
PAN masking before it exists (``payloads.build_record`` masks as it builds), so nothing here can
carry a full card number to disk.

``dedup_key`` = SHA-256 of the canonical JSON of the *business content* only — transaction id,
event time and its precision, cluster, pod identity, container, model, decision, latency, trace
and span ids — never the envelope (shipper, runtime time, labels) or the free-text attributes, so
the same transaction delivered twice, or by two shippers, is stored once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from collector.store.canonical import content_hash

SOURCE_FORMATS = ("spring_ecs_flat", "spring_ecs_nested", "logstash", "gelf", "otlp", "json")

# Column widths of inference_records (collector/store/models.py); longer values are quarantined.
COLUMN_LIMITS = {
    "transaction_id": 256, "pod_namespace": 253, "pod_name": 253, "container_name": 253,
    "node_name": 253, "model_name": 253, "model_version": 64, "decision": 64, "cluster": 253,
}

_HEX = re.compile(r"^[0-9a-f]+$")


def _hex_id(value: Any, name: str, hex_len: int, pad_from: int | None = None) -> str | None:
    """A W3C trace-context id as ``hex_len`` lower-case hex digits, or None.

    Integers and Datadog's decimal ``dd.*`` ids are converted; a ``pad_from``-digit id is
    left-padded (64-bit trace ids); absent, all-zero ("invalid" in W3C) or malformed ids give None.
    """
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


def coerce_latency_ms(value: Any) -> float | None:
    """A latency in milliseconds from a JSON number or an MDC string (``"12.4"``); None if not finite."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        f = float(value)
    elif isinstance(value, str):
        try:
            f = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return f if math.isfinite(f) else None


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
        """The fields that identify the transaction's content (the dedup key's input)."""
        return {
            "transaction_id": self.transaction_id, "event_time_ns": self.event_time_ns,
            "event_time_precision_ns": self.event_time_precision_ns, "cluster": self.cluster,
            "pod_uid": self.pod_uid, "pod_namespace": self.pod_namespace, "pod_name": self.pod_name,
            "container_name": self.container_name, "model_name": self.model_name,
            "model_version": self.model_version, "decision": self.decision, "latency_ms": self.latency_ms,
            "trace_id": self.trace_id, "span_id": self.span_id,
        }

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
