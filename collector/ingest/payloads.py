"""Application payloads: which structured-logging format, and the mapping to the canonical record.

Format signatures (log-formats.md §7.3 rule 1): ``ecs.version`` / dotted ``log.level`` → Spring
ECS 3.4 (flat); an ``ecs`` or ``log`` object → Spring ECS 3.5+ (nested); ``@version`` +
``logger_name``/``level_value`` → logstash (Spring or logstash-logback-encoder); ``version: "1.1"``
+ ``short_message`` → GELF; anything else → generic ``json``. After flattening to dotted paths
and stripping GELF's ``_`` every format maps through the same alias table (§7.1), so 3.4 flat and
3.5 nested lines of the same event give the same record.
"""

from __future__ import annotations

from typing import Any, Callable

from collector.ingest import timestamps
from collector.ingest.aliases import AliasTable, gelf_fields
from collector.ingest.envelopes import Envelope, is_gelf
from collector.ingest.jsondoc import flatten
from collector.ingest.pan import NullMasker, PanMasker, mask_names_in_arrays
from collector.ingest.record import (CanonicalRecord, OutOfRange, check_event_time_ns, coerce_latency_ms,
                                     normalise_span_id, normalise_trace_id)

PAYLOAD_FORMATS = ("spring_ecs_flat", "spring_ecs_nested", "logstash", "gelf", "json")


class Rejected(Exception):
    """The line cannot become a record; ``reason`` (``slug: detail``) goes to quarantine."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _in_range(time: tuple[int, int], what: str) -> tuple[int, int]:
    """``time`` when its ns fit the ``event_time_ns`` column; ``what`` names the field in the reason.

    Raises:
        Rejected: ``bad-timestamp: <what>: timestamp out of range …``.
    """
    try:
        check_event_time_ns(time[0])
    except OutOfRange as exc:
        raise Rejected(f"bad-timestamp: {what}: {exc}") from None
    return time


def detect_format(doc: dict[str, Any]) -> str:
    """The structured-logging format of an application record (see the module docstring)."""
    if isinstance(doc.get("ecs"), dict) or (isinstance(doc.get("log"), dict) and "@timestamp" in doc):
        return "spring_ecs_nested"
    if "ecs.version" in doc or "log.level" in doc:
        return "spring_ecs_flat"
    if "@version" in doc and ("logger_name" in doc or "level_value" in doc):
        return "logstash"
    if is_gelf(doc):
        return "gelf"
    return "json"


def prepare(doc: dict[str, Any], fmt: str) -> dict[str, Any]:
    """Flatten to dotted paths; GELF's names then become the other formats' (``aliases.gelf_fields``)."""
    flat = flatten(doc)
    return gelf_fields(flat) if fmt == "gelf" else flat


def _scalar_text(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        return text or None
    if isinstance(value, (int, float)):
        return str(value)
    return None


def _what_it_is(value: Any) -> str:
    """What a JSON value that ``_scalar_text`` refuses is, for a quarantine reason."""
    if isinstance(value, str):
        return "is blank (only whitespace)"
    if isinstance(value, bool):
        return "is a boolean"
    if isinstance(value, dict):
        return "is an empty object"
    if isinstance(value, list):
        return "is an array"
    return f"is a {type(value).__name__}"


# The line's own clock and the container runtime's are the node's: an event time later than the
# runtime's write time of the same line is impossible, but for a clock step (slack).
AFTER_WRITE_SLACK_NS = timestamps.NS_PER_S


def logged_after_written(event_ns: int, runtime_ns: int | None) -> str | None:
    """A warning when the application's event time (``event_ns``, epoch ns UTC, the start of its
    precision interval) is more than ``AFTER_WRITE_SLACK_NS`` later than the time the container
    runtime (or the shipper reading it) stamped on the same line: a zone or parse problem on the
    application's side (log-formats.md §5.4: app event time ≤ CRI time, "a negative gap means a
    parser/zone bug"), such as local time written with a ``Z``. None otherwise, or without a runtime time."""
    if runtime_ns is None or event_ns <= runtime_ns + AFTER_WRITE_SLACK_NS:
        return None
    return (f"event time is {(event_ns - runtime_ns) / timestamps.NS_PER_S:.3f} s later than the runtime wrote the "
            "line: a zone or clock problem on the application's side (an event is logged before it is written); "
            "attribution uses the event time as logged")


class RecordBuilder:
    """Turns a flattened application record plus its envelope into a ``CanonicalRecord``.

    Every text that reaches the record is PAN-masked here (``masker`` counts the masks).
    ``default_tz`` is the IANA zone for zone-less timestamps (None → such lines are rejected).
    """

    def __init__(self, aliases: AliasTable, default_tz: str | None, cluster: str | None) -> None:
        self.aliases = aliases
        self.default_tz = default_tz
        self.cluster = cluster
        self.logged_after_written = 0  # records built with that warning (``logged_after_written``)

    def event_time(self, flat: dict[str, Any], consumed: set[str]) -> tuple[int, int] | None:
        """``(epoch_ns, precision_ns)`` from the payload, or None when it has no time field.

        Raises:
            Rejected: ``naive-timestamp`` or ``bad-timestamp`` (also for a time outside the
                ``event_time_ns`` column's signed 64-bit range).
        """
        sec, nano = flat.get("instant.epochSecond"), flat.get("instant.nanoOfSecond")
        if isinstance(sec, int) and not isinstance(sec, bool):  # Log4j2 JsonLayout / JsonTemplateLayout
            consumed.update(("instant.epochSecond", "instant.nanoOfSecond"))
            ns = sec * timestamps.NS_PER_S + (nano if isinstance(nano, int) and not isinstance(nano, bool) else 0)
            return _in_range((ns, 1), "field 'instant.epochSecond'")
        hit = self.aliases.lookup(flat, "event_time")
        if hit is None:
            return None
        name, value = hit
        consumed.add(name)
        try:
            return _in_range(timestamps.parse_any(value, self.default_tz), f"field {name!r}")
        except timestamps.NaiveTimestamp as exc:
            raise Rejected(f"naive-timestamp: field {name!r}: {exc}") from None
        except timestamps.BadTimestamp as exc:
            raise Rejected(f"bad-timestamp: field {name!r}: {exc}") from None

    @staticmethod
    def _masked_attributes(attributes: dict[str, Any], env: Envelope, masker: PanMasker | NullMasker) -> dict[str, Any]:
        """``attributes`` PAN-masked, but for the nanosecond times draudit put there itself
        (``envelope.runtime_time_ns``, ``envelope.observed_time_ns``: 19 digits pass Luhn one time
        in ten and must not be garbled). Only those: a value the input wrote under one of these
        names, or under ``timeUnixNano``, is masked as any other (an application's
        ``"timeUnixNano": 4111111111111111`` was stored in clear when every integer under those
        names was kept)."""
        own = {}
        if env.kind != "none" and env.runtime_time_ns is not None:
            own["envelope.runtime_time_ns"] = env.runtime_time_ns
        if isinstance(env.extras.get("observed_time_ns"), int):
            own["envelope.observed_time_ns"] = env.extras["observed_time_ns"]
        if not own:
            return _names_in_arrays_masked(masker.value(attributes), masker)
        masked = masker.value({k: (None if k in own else v) for k, v in attributes.items()})
        masked.update(own)  # the keys are there already: their places stay
        return _names_in_arrays_masked(masked, masker)

    def build(self, flat: dict[str, Any], fmt: str, env: Envelope, masker: PanMasker | NullMasker, *, raw_sha256: str,
              source: str, position: str | None, event_time: tuple[int, int] | None = None,
              trace_id: Any = None, span_id: Any = None, extra_attributes: dict[str, Any] | None = None) -> CanonicalRecord:
        """Map ``flat`` (payload fields) and ``env`` to a masked ``CanonicalRecord``.

        ``masker`` is the parser's counting ``PanMasker``, or ``NULL_MASKER`` for a line proven
        PAN-free by ``pan.may_contain_pan``.

        ``event_time``/``trace_id``/``span_id`` given by the caller (OTLP record fields) win over
        the payload's.

        Raises:
            Rejected: missing/invalid transaction id, missing/naive/bad event time (also one
                outside the ``event_time_ns`` column's range), a value too long for its column. A
                latency that is not a finite double is a warning, kept in the attributes as text.
        """
        a = self.aliases
        consumed: set[str] = set()
        warnings = list(env.warnings)

        hit = a.lookup(flat, "transaction_id")
        if hit is None:
            unusable = a.unusable(flat, "transaction_id")
            if unusable is not None:
                raise Rejected(f"bad-transaction-id: field {unusable[0]!r} {unusable[1]}, not a transaction id "
                               "(a non-blank string or a number)")
            raise Rejected("missing-transaction-id: no transaction id field (looked for "
                           + ", ".join(a.names["transaction_id"]) + ", each also under "
                           + ", ".join(a.mdc_prefixes) + "; configure more with --aliases)")
        txn_name, txn_value = hit
        txn = _scalar_text(txn_value)
        if txn is None:
            raise Rejected(f"bad-transaction-id: field {txn_name!r} {_what_it_is(txn_value)}, not a transaction id "
                           "(a non-blank string or a number)")
        consumed.add(txn_name)
        disagree = a.disagreement(flat, "transaction_id", hit)
        if disagree is not None:
            warnings.append(disagree)

        payload_time = self.event_time(flat, consumed)
        time = _in_range(event_time, "the OTLP timeUnixNano") if event_time else payload_time
        twice = timestamps.ambiguous_local_time(payload_time) if time is payload_time and payload_time else None
        if twice:
            warnings.append(twice)  # a local time the default zone shows twice
        late = None
        if time is None:
            if env.runtime_time_ns is None:
                if env.extras.get("observed_time_ns"):
                    # OTLP: the observed time is when a collector saw the record, on its node's clock,
                    # not the event's time (log-formats.md §7.1: it goes to observed_time_ns only)
                    raise Rejected("missing-event-time: the OTLP record has no timeUnixNano and its body no "
                                   "timestamp; its observedTimeUnixNano is when a collector saw it, not when the "
                                   "transaction was scored, so it is not taken as the event time")
                raise Rejected("missing-event-time: neither the application line nor the envelope has a timestamp")
            time = _in_range((env.runtime_time_ns, env.runtime_precision_ns), f"the {env.kind} envelope's timestamp")
            warnings.append("event time taken from the envelope (runtime) timestamp")
            extra = {"draudit.event_time_source": "envelope"}
        else:
            extra = {}
            late = logged_after_written(time[0], env.runtime_time_ns) if env.kind != "none" else None
            if late:
                warnings.append(late)

        model_name, model_version, decision = (aliased_text(a.lookup, flat, name, consumed)
                                               for name in ("model_name", "model_version", "decision"))
        latency = None
        unbounded_latency = None
        h = a.lookup(flat, "latency_ms")
        if h is not None:
            try:
                latency = coerce_latency_ms(h[1])
            except OutOfRange as exc:
                # NaN, infinity, 1e400, a card number: the transaction is still evidence; only its
                # latency is not a number the column holds (it was the whole line's quarantine)
                unbounded_latency = h[0]
                warnings.append(f"latency field {h[0]!r} holds a card number; kept in attributes as masked text"
                                if "card number" in str(exc) else
                                f"latency field {h[0]!r} is not a finite number of milliseconds; kept in attributes as text")
            else:
                if latency is None:
                    warnings.append(f"latency field {h[0]!r} is not a number; kept in attributes")
                else:
                    consumed.add(h[0])
        tid = normalise_trace_id(trace_id) if trace_id else None
        if tid is None:
            tid = aliased_id(a.lookup, flat, "trace_id", consumed, warnings)
        sid = normalise_span_id(span_id) if span_id else None
        if sid is None:
            sid = aliased_id(a.lookup, flat, "span_id", consumed, warnings)
        tid, sid = _no_card_number(masker, tid, "trace id", warnings), _no_card_number(masker, sid, "span id", warnings)

        attributes = {k: v for k, v in flat.items() if k not in consumed}
        if unbounded_latency is not None and not isinstance(attributes[unbounded_latency], str):
            attributes[unbounded_latency] = repr(attributes[unbounded_latency])  # JSON has no NaN or infinity
        attributes.update(extra)
        for k, v in env.extras.items():
            if not k.startswith("_"):
                attributes[f"envelope.{k}"] = v
        if env.kind != "none":
            if env.stream:
                attributes["envelope.stream"] = env.stream
            if env.container_id:
                attributes["envelope.container_id"] = env.container_id
            if env.runtime_time_ns is not None:
                attributes["envelope.runtime_time_ns"] = env.runtime_time_ns
        if extra_attributes:
            attributes.update(extra_attributes)
        if warnings:
            attributes["draudit.warnings"] = warnings

        m = masker.text
        rec = CanonicalRecord(
            transaction_id=masker.identifier(txn), event_time_ns=time[0], event_time_precision_ns=time[1],
            source_format=fmt, envelope=env.kind, raw_sha256=raw_sha256, source=m(source),
            position=position, cluster=self.cluster,
            pod_uid=env.pod_uid, pod_uid_source="envelope" if env.pod_uid else None,
            pod_namespace=m(env.namespace) if env.namespace else None,
            pod_name=m(env.pod_name) if env.pod_name else None,
            container_name=m(env.container_name) if env.container_name else None,
            node_name=m(env.node_name) if env.node_name else None,
            model_name=m(model_name) if model_name else None,
            model_version=m(model_version) if model_version else None,
            decision=m(decision) if decision else None,
            latency_ms=latency, trace_id=tid, span_id=sid,
            attributes=self._masked_attributes(attributes, env, masker),
        )
        col = rec.too_long()
        if col:
            raise Rejected(f"field-too-long: {col} is longer than its column allows")
        if late:
            self.logged_after_written += 1
        return rec


def _names_in_arrays_masked(attributes: dict[str, Any], masker: PanMasker | NullMasker) -> dict[str, Any]:
    """``attributes`` with the card numbers that names nested in their arrays' objects form starred
    (``pan.mask_names_in_arrays``; flattening joined the other nested names already), counted by
    ``masker``; as given with the null masker (no PAN can be there: ``record_names_may_contain_pan``)."""
    if not isinstance(masker, PanMasker):
        return attributes
    for k, v in attributes.items():
        if v.__class__ is list:
            attributes[k], n = mask_names_in_arrays(v)
            masker.masked += n
    return attributes


def aliased_text(lookup: Callable[[dict[str, Any], str], tuple[str, Any] | None], flat: dict[str, Any],
                 field_name: str, consumed: set[str]) -> str | None:
    """The canonical text field ``field_name`` (model name, version, decision) found through the alias
    table: a scalar as text (its key then consumed), else None (absent, or an object or array: it
    stays in the attributes)."""
    h = lookup(flat, field_name)
    if h is None:
        return None
    value = _scalar_text(h[1])
    if value is not None:
        consumed.add(h[0])
    return value


_ID_SHAPES = {"trace_id": (normalise_trace_id, "trace id", "16/32 hex digits"),
              "span_id": (normalise_span_id, "span id", "16 hex digits")}


def aliased_id(lookup: Callable[[dict[str, Any], str], tuple[str, Any] | None], flat: dict[str, Any], field_name: str,
               consumed: set[str], warnings: list[str]) -> str | None:
    """The application's ``trace_id`` or ``span_id`` (``field_name``) found through the alias table,
    normalised to lower-case hex (its key then consumed), or None: absent, or not of the W3C Trace
    Context shape (a warning says so; the value stays in the attributes)."""
    h = lookup(flat, field_name)
    if h is None:
        return None
    normalise, what, shape = _ID_SHAPES[field_name]
    value = normalise(h[1], h[0])
    if value is None:
        warnings.append(f"{what} field {h[0]!r} is not {shape}; kept in attributes")
    else:
        consumed.add(h[0])
    return value


def _no_card_number(masker: PanMasker | NullMasker, value: str | None, what: str, warnings: list[str]) -> str | None:
    """A trace or span id (lower-case hex) whose digits, leading zeros aside, read as a card number
    (``PanMasker.identifier``: a numeric id padded to 32 or 16 digits, or either 64-bit half of a
    trace id) is not stored: its column holds hex, not a masked number. The warning says so; the
    masker counts it."""
    if value is None:
        return value
    parts = (value, value[:16], value[16:]) if len(value) == 32 else (value,)
    if all(masker.identifier(p.lstrip("0")) == p.lstrip("0") for p in parts):
        return value
    warnings.append(f"{what} not stored: its digits read as a card number (PAN)")
    return None
