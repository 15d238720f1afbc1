"""The configurable alias table: which flattened field names mean which canonical field.

Spring Boot 3.4+ lets teams rename any member (``logging.structured.json.rename``), MDC keys are
whatever the app chose, and each producer spells trace ids differently (log-formats.md §1.5,
§1.6, §7.1). Names are looked up after flattening to dotted paths and stripping GELF's ``_``;
each name is also tried under the usual MDC containers (``mdc.``, ``context.``, ``contextMap.``,
``labels.``; Spring 3.5's ``logging.structured.json.context.prefix`` is added with ``--aliases``).
The first name present wins, so the order of a list is its priority.

A YAML/JSON file replaces the default list of each canonical field it names::

    transaction_id: [payment_ref, txn_id]
    mdc_prefixes: [mdc., ctx.]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from collector.errors import UserError

CANONICAL_FIELDS = (
    "transaction_id", "event_time", "model_name", "model_version", "decision", "latency_ms",
    "trace_id", "span_id", "message",
)

DEFAULT_ALIASES: dict[str, tuple[str, ...]] = {
    # ``transaction.id`` is also Elastic APM's own id: it comes last (log-formats.md §1.6).
    "transaction_id": ("txn_id", "txnId", "transaction_id", "transactionId", "txn.id", "txnid",
                       "transaction.id"),
    "event_time": ("@timestamp", "timestamp", "time", "ts", "timeMillis", "eventTime"),
    "model_name": ("model_name", "modelName", "model.name", "triton.model_name", "model"),
    "model_version": ("model_version", "modelVersion", "model.version", "triton.model_version"),
    "decision": ("decision", "fraud_decision", "fraudDecision", "fraud.decision", "verdict"),
    "latency_ms": ("latency_ms", "latencyMs", "latency.ms", "inference_latency_ms", "duration_ms",
                   "durationMs", "elapsed_ms"),
    "trace_id": ("traceId", "trace_id", "trace.id", "traceid", "dd.trace_id"),
    "span_id": ("spanId", "span_id", "span.id", "spanid", "dd.span_id"),
    "message": ("message", "short_message", "msg"),
}
DEFAULT_MDC_PREFIXES: tuple[str, ...] = ("mdc.", "MDC.", "context.", "contextMap.", "labels.")


@dataclass(frozen=True)
class AliasTable:
    """Canonical field → ordered candidate names, plus the MDC container prefixes to try."""

    names: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_ALIASES))
    mdc_prefixes: tuple[str, ...] = DEFAULT_MDC_PREFIXES

    def lookup(self, flat: Mapping[str, Any], canonical: str) -> tuple[str, Any] | None:
        """The first ``(name, value)`` in ``flat`` for ``canonical``, or None.

        Names are tried in priority order: every name as given, then every name under each MDC
        prefix in turn. Empty strings and nulls count as absent.
        """
        get = flat.get
        for name in self._candidates[canonical]:
            v = get(name)
            if v is not None and v != "":
                return name, v
        return None

    @cached_property
    def _candidates(self) -> dict[str, tuple[str, ...]]:
        return {canonical: tuple(names) + tuple(p + n for p in self.mdc_prefixes for n in names)
                for canonical, names in self.names.items()}

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], origin: str = "alias table") -> "AliasTable":
        """Defaults overridden by ``doc`` (canonical field → list of names; ``mdc_prefixes`` → list).

        Raises:
            UserError: unknown canonical field or a value that is not a list of strings.
        """
        names = dict(DEFAULT_ALIASES)
        prefixes = DEFAULT_MDC_PREFIXES
        for key, value in doc.items():
            if not (isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)):
                raise UserError(f"{origin}: {key!r} must be a non-empty list of field names")
            if key == "mdc_prefixes":
                prefixes = tuple(value)
            elif key in names:
                names[key] = tuple(value)
            else:
                raise UserError(f"{origin}: unknown field {key!r}; use one of {', '.join(CANONICAL_FIELDS)} or mdc_prefixes")
        return cls(names, prefixes)

    @classmethod
    def from_file(cls, path: str | Path) -> "AliasTable":
        """Load a YAML (or JSON) alias file.

        Raises:
            UserError: unreadable file, not a mapping, or invalid entries.
        """
        import yaml

        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise UserError(f"alias file {path}: cannot read it ({exc.strerror})") from None
        except yaml.YAMLError as exc:
            raise UserError(f"alias file {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(doc, dict):
            raise UserError(f"alias file {path}: must be a mapping of field → list of names")
        return cls.from_mapping(doc, origin=f"alias file {path}")
