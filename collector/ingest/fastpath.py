"""The parse workers' fast path for the dominant input: a Fluent Bit record around a Spring Boot line.

Shape (docs/shippers.md: ``tail`` + ``kubernetes`` filter, ``Merge_Log_Key``, ``Keep_Log On``,
``json_lines``): one compact JSON object per line, Fluent Bit's ``kubernetes`` metadata, the
application's line as the ``log`` string and the same object already decoded under the merge key
(Spring ECS 3.4 flat or 3.5 nested, or any other payload format). ``unit`` turns such a line into
the ``parse_pool.Unit`` the general path gives (``LineParser.feed_bytes`` → ``_unit``), in one
function: no ``Envelope``, ``CanonicalRecord`` or ``Outcome`` object, no masker calls, the same
decisions in the same order (``LineParser._line`` → ``envelopes.fluent`` → ``_enveloped`` →
``_payload`` → ``RecordBuilder.build`` → ``CanonicalRecord.prepared``).

It answers None — the caller then runs the general path on the line, from its start — for anything
else: a line that is not exactly that shape (a ``\\u`` escape or NUL, whitespace around it, a
``--format``, a partial line or one pending, another envelope, no merged object, a merged object
that is not exactly the ``log`` text), a line in which a PAN may hide (``pan.may_contain_pan``, an
exponent number, a source name: the general path masks), and every line the general path
rejects. So it never masks, never rejects and never changes the PAN counter: those decisions stay
in one place. ``tests/test_ingest_fastpath.py`` runs both paths over realistic and hostile lines.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from collector.ingest import envelopes, timestamps
from collector.ingest.jsondoc import JsonRejected
from collector.ingest.pan import has_unicode_escape, may_contain_pan, record_names_may_contain_pan
from collector.ingest.payloads import (Rejected, _in_range, _scalar_text, aliased_id, aliased_text, detect_format,
                                       logged_after_written, prepare)
from collector.ingest.record import (COLUMN_LIMITS, POSITION_CHARS, OutOfRange, attributes_json, coerce_latency_ms,
                                     event_text, ledger_template)
from collector.store.canonical import content_hash

if TYPE_CHECKING:
    from collector.ingest.parser import LineParser

_MERGE_KEYS = envelopes._MERGE_LOG_KEY_GUESSES
# envelopes.fluent's extras (kubernetes key, extras key) with the attribute name RecordBuilder.build gives each
_EXTRAS = tuple((src, f"envelope.{src}") for src in ("container_image", "pod_ip", "labels"))
_NOT_EXTRA = (None, "", {})
# The limited columns in the order ``_record`` checks them; a column added to COLUMN_LIMITS must be added there too.
_LIMITED_COLUMNS = ("transaction_id", "pod_namespace", "pod_name", "container_name", "node_name", "model_name",
                    "model_version", "decision", "cluster")
if tuple(COLUMN_LIMITS) != _LIMITED_COLUMNS:
    raise ImportError("fastpath: record.COLUMN_LIMITS changed; check its columns in fastpath._record")
_LIMITS = tuple(COLUMN_LIMITS[name] for name in _LIMITED_COLUMNS)


def unit(parser: "LineParser", data: bytes, source: str, position: str) -> tuple[Any, ...] | None:
    """The unit of one physical line (``data`` without its newline, not truncated), or None: run
    the general path (see the module docstring). ``parser`` is the worker's ``LineParser``; only
    its decoder's per-line exponent flag changes, as the general path changes it."""
    if (len(data) > parser.max_line_bytes or parser._partials or parser.forced is not None
            or data[:1] != b"{" or data[-1:] != b"}"):
        return None
    try:
        line = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\x00" in line or has_unicode_escape(line):  # the general path's "special" lines (sanitising, escapes)
        return None
    # The raw text's PAN pre-filter first: a line that may hold a PAN (one in twenty in the bench)
    # goes to the general path before it is decoded here, not after (it is decoded there again).
    if may_contain_pan(line, unicode_escapes=False) or parser._source_may_contain_pan(source):
        return None
    decoder = parser._decoder
    decoder.saw_exponent = False
    try:
        # kept for the general path, which decodes the line again when this one declines it
        decoded = decoder.decode(line, unicode_escapes=False, keep=True)
    except JsonRejected:
        return None
    doc = decoded.value
    if not decoded.by_orjson or doc.__class__ is not dict or "resourceLogs" in doc \
            or envelopes.detect(doc) != "fluentbit":
        return None
    if doc.get("_p") == "P" or doc.get("logtag") == "P":
        return None
    log = doc.get("log")
    # No NUL and no \u in ``log`` (the general path's "special" payload) without a look: the line
    # has neither, and a decoded JSON string shows one only where its text has a \u escape (the
    # JSON text of a NUL is \u0000, of a backslash before a u \\u or \u005c).
    if log.__class__ is not str or log[:1] != "{" or log[-1:] != "}":
        return None
    merged = next((doc[k] for k in _MERGE_KEYS if isinstance(doc.get(k), dict)), None)
    if merged is None or not parser._same_as_merged(log, merged):
        return None
    if decoder.saw_exponent:  # a number whose digits the text need not show: the general path masks
        return None
    try:
        u = _record(parser, doc, merged, data, source, position)
    except (Rejected, OutOfRange):
        return None
    if u is not None:
        decoder.forget()
    return u


def _envelope_time(value: Any, warnings: list[str]) -> tuple[int | None, int]:
    """``envelopes._runtime_time`` without the ``Envelope``: ``(ns or None, precision)``."""
    if value is None:
        return None, 1
    try:
        return timestamps.parse_any(value, "UTC")
    except timestamps.BadTimestamp as exc:
        warnings.append(f"envelope time unreadable: {exc}")
        return None, 1


def _record(parser: "LineParser", doc: dict[str, Any], app: dict[str, Any], data: bytes, source: str,
            position: str) -> tuple[Any, ...] | None:
    # -- LineParser._payload, the part a line without a transaction id is rejected by (the general
    # path then quarantines it): the merged object is the payload --------------------------------------
    fmt = detect_format(app)  # no --format (checked)
    flat = prepare(app, fmt)
    if record_names_may_contain_pan(flat):  # nested names joined into a card layout: the general path masks
        return None
    builder = parser.builder
    lookup = builder.aliases.lookup
    hit = lookup(flat, "transaction_id")
    if hit is None:
        return None
    txn = _scalar_text(hit[1])
    if txn is None:
        return None

    # -- envelopes.fluent, for a "fluentbit" record whose payload is the raw ``log`` line --------------
    k8s = doc["kubernetes"]  # a dict: envelopes.detect said fluentbit by looking into it
    namespace, pod_name, pod_uid, node_name, container_name, container_id = _pod(k8s)
    if pod_uid is None and k8s.get("pod_id") not in (None, ""):
        return None  # a pod_id that is not a UUID: the general path warns (envelopes.set_pod_uid)
    extras = [(name, k8s[src]) for src, name in _EXTRAS if k8s.get(src) not in _NOT_EXTRA]
    stream = envelopes._s(doc.get("stream"))
    env_warnings: list[str] = []
    if "time" in doc or "date" in doc:
        value = doc["time"] if "time" in doc else doc["date"]
        # parse_any's first step for the usual UTC text, without its frames
        runtime = timestamps._utc_fast(value) if value.__class__ is str else None
        runtime_ns, runtime_precision = runtime if runtime is not None else _envelope_time(value, env_warnings)
    else:
        runtime_ns, runtime_precision = None, 1

    raw_sha256 = _sha256(data)

    # -- RecordBuilder.build with the null masker (the transaction id found above) ----------------
    consumed: set[str] = {hit[0]}
    warnings = env_warnings
    disagree = builder.aliases.disagreement(flat, "transaction_id", hit)
    if disagree is not None:
        warnings.append(disagree)
    time = builder.event_time(flat, consumed)
    twice = timestamps.ambiguous_local_time(time) if time is not None else None
    if twice:
        warnings.append(twice)  # as RecordBuilder.build
    late = None
    if time is None:
        if runtime_ns is None:
            return None
        time = _in_range((runtime_ns, runtime_precision), "the fluentbit envelope's timestamp")
        warnings.append("event time taken from the envelope (runtime) timestamp")
        extra = {"draudit.event_time_source": "envelope"}
    else:
        extra = None
        late = logged_after_written(time[0], runtime_ns)
        if late:
            warnings.append(late)

    model_name = aliased_text(lookup, flat, "model_name", consumed)
    model_version = aliased_text(lookup, flat, "model_version", consumed)
    decision = aliased_text(lookup, flat, "decision", consumed)
    latency = None
    h = lookup(flat, "latency_ms")
    if h is not None:
        latency = coerce_latency_ms(h[1])  # OutOfRange: the general path keeps it as text, with a warning
        if latency is None:
            warnings.append(f"latency field {h[0]!r} is not a number; kept in attributes")
        else:
            consumed.add(h[0])
    tid = aliased_id(lookup, flat, "trace_id", consumed, warnings)
    sid = aliased_id(lookup, flat, "span_id", consumed, warnings)

    # ``{k: v for k, v in flat.items() if k not in consumed}`` (a C copy, then the few consumed keys
    # out; the order of keys does not matter: the text is written with its keys sorted)
    attributes = dict(flat)
    for k in consumed:
        attributes.pop(k, None)
    if extra:
        attributes.update(extra)
    for k, v in extras:
        attributes[k] = v
    if stream:
        attributes["envelope.stream"] = stream
    if container_id:
        attributes["envelope.container_id"] = container_id
    if runtime_ns is not None:
        attributes["envelope.runtime_time_ns"] = runtime_ns
    if warnings:
        attributes["draudit.warnings"] = warnings

    cluster = builder.cluster
    namespace = namespace or None
    model_name, model_version, decision = model_name or None, model_version or None, decision or None
    # CanonicalRecord.too_long (the values in COLUMN_LIMITS' order): the general path rejects (field-too-long)
    for v, limit in zip((txn, namespace, pod_name, container_name, node_name, model_name, model_version, decision,
                         cluster), _LIMITS):
        if v is not None and len(v) > limit:
            return None

    # -- CanonicalRecord.prepared ------------------------------------------------------------------------
    event_ns, precision = time
    content = {
        "transaction_id": txn, "event_time_ns": event_ns, "event_time_precision_ns": precision, "cluster": cluster,
        "pod_uid": pod_uid, "pod_namespace": namespace, "pod_name": pod_name, "container_name": container_name,
        "model_name": model_name, "model_version": model_version, "decision": decision, "latency_ms": latency,
        "trace_id": tid, "span_id": sid,
    }
    if decision is None:
        content["message"] = event_text(attributes)
    dedup_key = content_hash(content)
    attributes_text, exact = attributes_json(attributes)
    # Values that repeat from line to line (one pod's, one model's) as one object each: pickle sends
    # an object once per chunk and refers to it after, so the writer's process unpickles fewer.
    values = (txn, event_ns, precision, cluster, pod_uid, "envelope" if pod_uid else None, namespace,
              pod_name, container_name, node_name, _same(model_name), _same(model_version),
              _same(decision), latency, tid, sid, fmt, "fluentbit", source, position and position[:POSITION_CHARS],
              raw_sha256, dedup_key, attributes_text)
    if late:
        builder.logged_after_written += 1
    return source, position, values, exact, ledger_template(values, exact)


_SEEN: dict[str, str] = {}
_SEEN_MAX = 4096
_PODS: dict[tuple[Any, ...], tuple[str | None, ...]] = {}


def _pod(k8s: dict[str, Any]) -> tuple[str | None, ...]:
    """``(namespace, pod_name, pod_uid, node_name, container_name, container_id)`` of a Fluent Bit
    ``kubernetes`` map as ``envelopes.fluent`` reads them (``_s``, ``normalise_pod_uid``,
    ``normalise_container_id`` of ``docker_id``: detect said fluentbit, not fluentd, so ``docker``
    holds no container_id), each one object per distinct value (``_same``).

    Cached by the six raw values (a pod's lines repeat them): each result depends only on its own
    value, and on a string's value alone (any other type reads as None), so equal keys give equal
    results. A value that cannot be a key (a list, an object) is read uncached."""
    key = (k8s.get("namespace_name"), k8s.get("pod_name"), k8s.get("pod_id"), k8s.get("host"),
           k8s.get("container_name"), k8s.get("docker_id"))
    try:
        cached = _PODS.get(key)
    except TypeError:  # unhashable
        cached, key = None, None
    if cached is None:
        s = envelopes._s
        cached = (_same(s(k8s.get("namespace_name"))), _same(s(k8s.get("pod_name"))), _same(envelopes.normalise_pod_uid(k8s.get("pod_id"))),
                  _same(s(k8s.get("host"))), _same(s(k8s.get("container_name"))),
                  _same(envelopes.normalise_container_id(k8s.get("docker_id") or None)))
        if key is not None:
            if len(_PODS) >= _SEEN_MAX:
                _PODS.clear()
            _PODS[key] = cached
    return cached


def _same(value: str | None) -> str | None:
    """One object per distinct string among the last few thousand (an equal value, so an equal unit)."""
    if value is None:
        return None
    seen = _SEEN.get(value)
    if seen is None:
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        seen = _SEEN[value] = value
    return seen


def _sha256(data: bytes) -> str:
    """``parser._sha256`` (the raw line's hash when no PAN is in it) of the line decoded from
    ``data``, valid UTF-8: the line encoded again is ``data`` itself."""
    return hashlib.sha256(data).hexdigest()
