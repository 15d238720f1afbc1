"""The configurable alias table: which flattened field names mean which canonical field.

Spring Boot 3.4+ lets teams rename any member (``logging.structured.json.rename``), MDC keys are
whatever the app chose, and each producer spells trace ids differently (log-formats.md §1.5,
§1.6, §7.1). Names are looked up after flattening to dotted paths and stripping GELF's ``_``;
each name is also tried under the usual MDC containers (``mdc.``, ``context.``, ``contextMap.``,
``labels.``; Spring 3.5's ``logging.structured.json.context.prefix`` is added with ``--aliases``).
The first name present wins, so the order of a list is its priority. A record holding two names
of one field with different values keeps the first by that priority, and the other value stays in
its attributes under its own name; ``disagreement`` words the warning for such a record
(``draudit.warnings``: for the transaction id, ``RecordBuilder.build`` and ``fastpath`` alike).

The transaction id's names (``DEFAULT_ALIASES["transaction_id"]``; README "Sending logs" and the
``missing-transaction-id`` quarantine reason list them in this order): the application's own MDC
keys first, ECS's ``transaction.id`` last. ``transaction.id`` is the ECS / Elastic APM field of an
*APM transaction*, and the Elastic APM agent's log correlation writes that id into the MDC of every
line (log-formats.md §1.6): on a line with both, ``transaction.id`` is the APM agent's id and the
MDC key is the business transaction. A line carrying only ``transaction.id`` (the demo's ECS
lines) still has it as its transaction id.

A YAML/JSON file replaces the default list of each canonical field it names::

    transaction_id: [payment_ref, txn_id]
    mdc_prefixes: [mdc., ctx.]

GELF (``gelf_fields``) is renamed before the lookup: its standard fields and Spring Boot's GELF
additional fields take the names the other Spring formats use for the same thing (§1.4, §7.1:
``short_message`` → ``message``, ``_level_name`` → ``log.level``, ``_log_logger`` → ``log.logger``…),
every other ``_`` field (MDC / key-values) loses its ``_``, and the epoch-seconds ``timestamp``
keeps its millisecond precision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from collector.errors import UserError

CANONICAL_FIELDS = (
    "transaction_id", "event_time", "model_name", "model_version", "decision", "latency_ms",
    "trace_id", "span_id", "message",
)

DEFAULT_ALIASES: dict[str, tuple[str, ...]] = {
    # ``transaction.id`` is also Elastic APM's own id, written into the MDC by its agent: it comes
    # last (log-formats.md §1.6; module docstring).
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

    def disagreement(self, flat: Mapping[str, Any], canonical: str, hit: tuple[str, Any]) -> str | None:
        """The warning for a record in which a name of ``canonical`` other than ``hit`` (the
        ``(name, value)`` that ``lookup`` returned) holds another value, or None (the usual case:
        one name present, or all present names agree).

        Values are compared as text (strings stripped, numbers as written: ``"T-1"`` and ``" T-1"``,
        ``42`` and ``"42"`` agree); empty strings and nulls count as absent, as in ``lookup``. The
        warning names the fields, not the values (the losing value stays in the attributes, masked
        like them). One set intersection when a single name is present (the hot path).
        """
        if len(self._candidate_sets[canonical].intersection(flat)) < 2:
            return None
        winner, value = hit
        kept = _comparable(value)
        others = [name for name in self._candidates[canonical]
                  if name != winner and flat.get(name) not in (None, "") and _comparable(flat[name]) != kept]
        if not others:
            return None
        return (f"{canonical} fields disagree: {winner!r} taken (first in the alias order), "
                f"{', '.join(repr(n) for n in others)} held another value (kept in attributes)")

    def unusable(self, flat: Mapping[str, Any], canonical: str) -> tuple[str, str] | None:
        """Why ``lookup`` found nothing for ``canonical`` although ``flat`` holds one of its names:
        ``(name, what)`` for the first name (priority order) that holds an empty string, else for
        a name that holds an object (``flatten`` spreads it into ``name.<member>`` keys). None when
        no name is there at all: the field is missing. For the quarantine reason only (a slow scan)."""
        names = self._candidates[canonical]
        for name in names:
            if flat.get(name) == "":
                return name, "is an empty string"
        prefixes = tuple(name + "." for name in names)
        for key in flat:
            if key.startswith(prefixes):
                return next(n for n, p in zip(names, prefixes) if key.startswith(p)), "is an object"
        return None

    @cached_property
    def _candidates(self) -> dict[str, tuple[str, ...]]:
        return {canonical: tuple(names) + tuple(p + n for p in self.mdc_prefixes for n in names)
                for canonical, names in self.names.items()}

    @cached_property
    def _candidate_sets(self) -> dict[str, frozenset[str]]:
        return {canonical: frozenset(names) for canonical, names in self._candidates.items()}

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
            UserError: unreadable file, not UTF-8, not a mapping, or invalid entries.
        """
        import yaml

        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise UserError(f"alias file {path}: cannot read it ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise UserError(f"alias file {path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                            f"{exc.start}); save it as UTF-8") from None
        except yaml.YAMLError as exc:
            raise UserError(f"alias file {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(doc, dict):
            raise UserError(f"alias file {path}: must be a mapping of field → list of names")
        return cls.from_mapping(doc, origin=f"alias file {path}")


def _comparable(value: Any) -> Any:
    """``value`` as ``disagreement`` compares it: a string stripped, a number as its text (not a
    bool: ``True`` and ``"True"`` differ), anything else as it is."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


# GELF 1.1 standard fields and Spring Boot's GELF additional fields (log-formats.md §1.4; Spring
# ``GraylogExtendedLogFormatStructuredLogFormatter``) → the attribute names Spring's ECS format gives
# the same member (§1.2, §7.1), so a GELF record reads like the others. The syslog ``level`` number
# takes ECS's name for it. ``version``, ``host``, ``full_message`` and ``timestamp`` keep their names.
GELF_FIELDS: dict[str, str] = {
    "short_message": "message",
    "level": "log.syslog.severity.code",
    "_level_name": "log.level",
    "_log_logger": "log.logger",
    "_process_pid": "process.pid",
    "_process_thread_name": "process.thread.name",
    "_service_version": "service.version",
    "_error_type": "error.type",
    "_error_message": "error.message",
    "_error_stack_trace": "error.stack_trace",
}
# Syslog severity (RFC 5424 §6.2.1) → level name, for GELF lines without ``_level_name``. The
# inverse of Logback's ``LevelToSyslogSeverity`` (ERROR 3, WARN 4, INFO 6, DEBUG/TRACE 7) and of
# Log4j2's GELF layout (FATAL 2); emergency/alert → FATAL, notice → INFO.
SYSLOG_SEVERITY_LEVELS = ("FATAL", "FATAL", "FATAL", "ERROR", "WARN", "INFO", "INFO", "DEBUG")
_GELF_MAX_EPOCH_S = 10 ** 11  # parse_epoch reads larger numbers as ms; so do we (left unchanged)


def gelf_fields(flat: dict[str, Any]) -> dict[str, Any]:
    """A flattened GELF record with the names the alias table and the other formats use.

    - ``GELF_FIELDS`` renames; ``log.level`` comes from the syslog ``level`` when there is no
      ``_level_name`` (``SYSLOG_SEVERITY_LEVELS``).
    - Any other ``_name`` (Spring's MDC / key-values, ``_transaction_id``, ``_traceId``) becomes
      ``name``, unless ``name`` is taken by a field of the record or a renamed one: an MDC key
      ``message`` (written ``_message``) stays ``_message`` and never replaces ``short_message``.
    - ``timestamp``: see ``gelf_timestamp``.

    Returns a new dict; ``flat`` is not changed.
    """
    out: dict[str, Any] = {}
    for name, value in flat.items():
        target = GELF_FIELDS.get(name)
        if target is not None:
            out[target] = value
        elif name == "timestamp":
            out[name] = gelf_timestamp(value)
        elif name[:1] != "_":
            out[name] = value
    if "log.level" not in out:
        severity = out.get("log.syslog.severity.code")
        if isinstance(severity, int) and not isinstance(severity, bool) and 0 <= severity < len(SYSLOG_SEVERITY_LEVELS):
            out["log.level"] = SYSLOG_SEVERITY_LEVELS[severity]
    for name, value in flat.items():
        if name[:1] == "_" and name not in GELF_FIELDS:
            bare = name[1:]
            out[name if not bare or bare in out or bare in flat else bare] = value
    return out


def gelf_timestamp(value: Any) -> Any:
    """GELF ``timestamp`` → RFC 3339 text (UTC) with at least 3 fraction digits, so its precision is
    1 ms or finer.

    GELF 1.1 gives epoch seconds "with optional decimal places for milliseconds"; Spring writes
    exactly 3 (``1749032101.500``), but the JSON number arrives as the float ``1749032101.5``, whose
    shortest repr shows 1 digit, and would read as 100 ms precision (1 s for ``….000``). The value
    is taken from the float's shortest repr as a ``Decimal`` (never float arithmetic); more than 3
    decimals (a µs producer) are kept, up to 9. An integer (no decimals: 1 s precision), a string,
    and anything out of range are returned unchanged for the timestamp parser to judge.
    """
    if not isinstance(value, float) or not 0 < value < _GELF_MAX_EPOCH_S:
        return value
    dec = Decimal(repr(value))
    seconds = int(dec)
    fraction = dec - seconds
    exponent = fraction.normalize().as_tuple().exponent if fraction else 0
    digits = min(9, max(3, -exponent if isinstance(exponent, int) else 3))
    nanos = int(fraction.scaleb(9))
    whole = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{nanos:09d}"[:len(whole) + 1 + digits] + "Z"
