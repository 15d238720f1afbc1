"""Input line → canonical record or quarantine entry: the ingest rules in one place.

Per line (log-formats.md §7.3): size limit and UTF-8 on the bytes (the limit is
``max_line_bytes`` for a line that is one record, the body limit ``max_document_bytes`` for a line
that is a whole OTLP/JSON export request, as the OpenTelemetry Collector ``file`` exporter writes
them: that line is a request body, like a ``POST /v1/logs``); CRI line or JSON; envelope
(``envelopes.detect``) then payload format (``payloads.detect_format``), unless ``--format``
forces one; partial lines (CRI ``P``, Fluent Bit ``_p``, docker json-file without ``\\n``) are
reassembled per (source, envelope, pod, container, stream) before the payload is decoded; OTLP
requests give one unit per LogRecord.

Every unit ends as exactly one ``Outcome``: a record, or a rejection with its reason, the source
and the position. Rejected text is PAN-masked and, for oversize lines, truncated *after* masking
(a PAN cut by the truncation is removed, not half-kept). A partial line never completed keeps the
first 6 digits of a run that ends its payload (in every envelope: the end of a CRI line, the end
of the Fluent Bit ``log`` string…), and a line quarantined with no partial pending for its stream
(the continuation of one whose first chunks came in another request or file) the last 4 of a run
that starts its payload: the two pieces of a PAN cut between them show no more than a masked PAN.

Reason slugs: ``line-too-long``, ``not-utf8``, ``unparseable``, ``nesting-too-deep``,
``duplicate-key``, ``wrong-format``, ``missing-payload``, ``missing-transaction-id``,
``bad-transaction-id``, ``missing-event-time``, ``naive-timestamp``, ``bad-timestamp`` (also a time
outside the signed 64-bit nanosecond range of ``event_time_ns``), ``field-too-long``, ``incomplete-partial``, ``malformed-otlp`` (an OTLP/JSON
request with a member of the wrong type, named: ``otlp.OtlpMalformed``). Every numeric column value is
range-checked while the record is built (``payloads.RecordBuilder``), never left to the database.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from json.decoder import scanstring
from typing import Any, Callable, Iterable

import orjson

from collector.ingest import envelopes
from collector.ingest.aliases import AliasTable
from collector.ingest.envelopes import CRI_LINE, Envelope
from collector.ingest.jsonarray import starts_record_array
from collector.ingest.jsondoc import DEFAULT_MAX_DEPTH, Decoder, JsonRejected, flatten
from collector.ingest.otlp import (OTLP_SNIFF_BYTES, OtlpLogRecord, OtlpMalformed, json_depth_limit,
                                   looks_like_export_request, records_from_json, value_depth, without_nul)
from collector.ingest.pan import (ANY_DIGIT, NULL_MASKER, TRAILING_DIGIT_RUN, PanMasker, has_unicode_escape,
                                  mask_binary, mask_cut_end, mask_cut_start, mask_exponent_numbers,
                                  mask_member_name_digits, mask_text, may_contain_pan, number_holds_pan,
                                  record_names_may_contain_pan)
from collector.ingest.payloads import PAYLOAD_FORMATS, RecordBuilder, Rejected, detect_format, prepare
from collector.ingest.record import CanonicalRecord
from collector.ingest.rotation import log_stream
from collector.store.canonical import canonical_json

ENVELOPE_FORMATS = ("cri", "docker_json", "fluentbit", "fluentd", "vector", "elastic", "otlp")
FORMATS = ("auto",) + ENVELOPE_FORMATS + PAYLOAD_FORMATS
QUARANTINE_TEXT_CHARS = 4096  # prefix of an oversize line kept in quarantine

# -- the two ends of a line cut inside a PAN -------------------------------------------------------
# A PAN cut between two partial chunks that the parser does not see together (the ``P`` chunk at
# the end of one HTTP request or file, the ``F`` chunk in the next) is quarantined twice: the
# unfinished partial (``incomplete-partial``) and the continuation (``unparseable``). Each piece
# alone is no PAN, so PAN masking keeps both, and together they give the PAN back. The end of the
# first keeps its first 6 digits (``pan.mask_cut_end``), the start of the second its last 4
# (``pan.mask_cut_start``): together no more than a masked PAN shows. Where each piece's payload
# is written in its raw line: ``_payload_spans``.


_JSON_KIND = {str: "a JSON string", int: "a JSON number", float: "a JSON number", list: "a JSON array",
              bool: "a JSON boolean", type(None): "JSON null"}


def _json_or_error(body: str) -> tuple[Any, orjson.JSONDecodeError | None]:
    """``(value, None)`` when ``body`` is JSON (orjson), else ``(None, the error)``."""
    try:
        return orjson.loads(body), None
    except orjson.JSONDecodeError as exc:
        return None, exc


def _not_an_object(body: str, decoded: tuple[Any, orjson.JSONDecodeError | None]) -> str:
    """The quarantine reason of a line that does not start with ``{``: what it is, when it is JSON
    (``decoded``: ``_json_or_error(body)``)."""
    value, exc = decoded
    if exc is not None:
        # an array cut or broken after its first element, not deep nesting nor a text line that
        # starts with a bracket (a JVM "[0.011s][warning]…", Logback "[main] INFO …": its first
        # "element" is already no JSON)
        first_end = min((i for i in (body.find(","), body.find("]")) if i >= 0), default=len(body))
        records = body[1:].lstrip()[:1] == "{"  # an array of records (a batch), however long
        if body[:1] == "[" and (records or len(body) <= 4096 and body.count("[") < 64) and exc.pos > first_end:
            return f"unparseable: invalid JSON array ({exc})"
        return "unparseable: not JSON and not a CRI log line (plain text)"
    return f"unparseable: {_JSON_KIND.get(type(value), 'a JSON value')}, not an object (a log record is a JSON object)"


def _string_spans(raw: str) -> list[tuple[int, int, str]]:
    """``(start, end, value)`` of every JSON string in ``raw`` (keys too): ``raw[start:end]`` is its
    text between the quotes, ``value`` the string it decodes to. Outside a string JSON has no quote."""
    spans = []
    i = raw.find('"')
    while i != -1:
        try:
            value, end = scanstring(raw, i + 1, False)
        except ValueError:  # unterminated: not JSON after all
            break
        spans.append((i + 1, end - 1, value))
        i = raw.find('"', end)
    return spans


def _payload_spans(raw: str, payload: str, kind: str) -> list[tuple[int, int]]:
    """Where the application line ``payload`` (an envelope's text payload) is written in its input
    line ``raw``: the content at the end of a CRI line; in a JSON envelope the string that decodes
    to it (Fluent Bit / Fluentd ``log`` or ``message``, Vector and Elastic ``message``, docker
    ``log`` with its newline). When no string is found to be it (a sanitised value), every string
    of the line: the cut ends of each are masked, conservatively."""
    if kind == "cri" or not raw.lstrip().startswith("{"):
        return [(len(raw) - len(payload), len(raw))] if raw.endswith(payload) else [(0, len(raw))]
    spans = _string_spans(raw)
    found = [(s, e) for s, e, v in spans if _is_payload(v, payload)]
    return found or [(s, e) for s, e, _ in spans]


def _is_payload(value: str, payload: str) -> bool:
    """True when the JSON string ``value`` is the envelope payload ``payload`` (sanitised as the
    decoded line is, its final newline dropped as ``envelopes.docker_json`` drops it)."""
    if value == payload:
        return True
    value = _sanitise(value)
    return value == payload or value.rstrip("\r\n") == payload


def _mask_cut_payload(text: str) -> tuple[str, int]:
    """A rejected payload's text (in its raw line) with its PANs masked and a PAN cut at either end
    masked as cut (``pan.mask_cut_start``: last 4 kept; ``pan.mask_cut_end``: first 6 kept); the count."""
    text, whole = mask_text(text)
    text, start = mask_cut_start(text)
    text, end = mask_cut_end(text)
    return text, whole + start + end


def _mask_spans(raw: str, spans: list[tuple[int, int]], mask: Callable[[str], tuple[str, int]]) -> tuple[str, int]:
    """``raw`` with ``mask`` applied to each span (a payload's text), and the number masked."""
    count = 0
    for s, e in sorted(spans, reverse=True):
        text, n = mask(raw[s:e])
        if n:
            raw, count = raw[:s] + text + raw[e:], count + n
    return raw, count



@dataclass
class Outcome:
    """One input unit's result: ``record`` or (``reason``, ``raw_text``) for quarantine."""

    source: str
    position: str | None
    record: CanonicalRecord | None = None
    reason: str | None = None
    raw_text: str | None = None
    raw_sha256: str | None = None


@dataclass
class _Partial:
    env: Envelope
    source: str = ""  # the input of its first chunk (the next file of the stream may hold the rest)
    chunks: list[str] = field(default_factory=list)
    raws: list[str] = field(default_factory=list)
    position: str | None = None
    size: int = 0
    overflow: bool = False


def _sanitise(value: Any) -> Any:
    """Replace NUL (PostgreSQL text/jsonb reject it) and lone surrogates (not UTF-8) in strings."""
    if isinstance(value, str):
        value = without_nul(value)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "replace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_sanitise(k): _sanitise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_sanitise(v) for v in value]
    return value


def storable(doc: Any, text: str | None = None) -> Any:
    """``doc`` (a decoded JSON value) with NUL and lone surrogates replaced in every string and key,
    as a line's values are (``_sanitise``: PostgreSQL refuses NUL, UTF-8 has no lone surrogates,
    and orjson, which hashes every stored row, refuses them). ``text``, the JSON ``doc`` was decoded
    from, spares the walk when it shows neither (a literal NUL, ``\\u0000``, ``\\ud…``)."""
    if text is not None and not ("\x00" in text or "\\u0000" in text or "\\ud" in text or "\\uD" in text):
        return doc
    return _sanitise(doc)


def _strip(text: str) -> str:
    """``text.strip()``, without a copy when nothing is to be stripped (a whole line is long)."""
    return text if text and not text[0].isspace() and not text[-1].isspace() else text.strip()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class LineParser:
    """Stateful parser for one input stream (holds partial lines between calls).

    Args:
        aliases: the alias table (defaults when None).
        default_tz: IANA zone for zone-less timestamps (``settings.ingest_default_tz``); None → reject.
        cluster: stored in every record's ``cluster``.
        max_line_bytes: longer lines (and reassembled partial lines) are quarantined.
        max_document_bytes: the limit for a line that is a whole OTLP/JSON export request
            (``otlp.looks_like_export_request``; with ``forced`` None, ``auto`` or ``otlp``): such a
            line is a request body, not one record, so it is held to the body limit
            (``settings.ingest_max_body_bytes``) instead of ``max_line_bytes``.
        max_depth: deeper JSON nesting is quarantined.
        forced: a name from ``FORMATS``; ``auto``/None detects per line.

    ``masker.masked`` counts the PANs masked so far.
    """

    def __init__(self, *, aliases: AliasTable | None = None, default_tz: str | None = None,
                 cluster: str | None = None, max_line_bytes: int = 64 * 1024,
                 max_document_bytes: int = 16 * 1024 * 1024, max_depth: int = DEFAULT_MAX_DEPTH,
                 forced: str | None = None, pan_token_key: bytes | None = None) -> None:
        if forced not in (None, "auto") and forced not in FORMATS:
            raise ValueError(f"unknown format {forced!r}; use one of {', '.join(FORMATS)}")
        self.aliases = aliases or AliasTable()
        self.builder = RecordBuilder(self.aliases, default_tz, cluster)
        self.masker = PanMasker(pan_token_key)
        self.max_line_bytes = max_line_bytes
        self.max_document_bytes = max(max_document_bytes, max_line_bytes)
        self.max_depth = max_depth
        self.forced = None if forced in (None, "auto") else forced
        self._partials: dict[tuple[Any, ...], _Partial] = {}
        # source → the log stream it belongs to, where its name does not tell (``rotation``): a live
        # log named through a symlink (``/var/log/containers``) beside its rotated files
        self.streams: dict[str, str] = {}
        self._last_source, self._last_source_pan = "", False
        self._decoder = Decoder(max_depth)
        self._line_without_escapes: str | None = None  # the line being parsed, once known to hold no \u or NUL
        names = self.aliases.names
        self._app_keys = frozenset(names["transaction_id"] + names["event_time"])

    # -- rejections ----------------------------------------------------------------------------

    def reject(self, text: str, reason: str, source: str, position: str | None, *, truncated: bool = False,
               premasked: bool = False) -> Outcome:
        """A quarantine outcome: ``text`` masked (then truncated for oversize input), reason masked.

        The nanosecond times of a raw OTLP/JSON line are not taken for PANs
        (``pan.mask_text``'s ``keep_otlp_times``), as in a parsed OTLP record. Binary text (a
        protobuf file read as lines) has every run of 13+ digits masked (``pan.mask_binary``). A
        rejected line may have been cut before it arrived (a truncated file, an unterminated
        partial), so a run of digits at its end is masked as the start of a PAN (``pan.mask_cut_end``).
        """
        # Masked before NUL is replaced: UTF-16 text read as UTF-8 has a NUL between its digits, a
        # separator to the masker (``pan._ENCODING_DEBRIS``); the U+FFFD put there for storage is not.
        masked = _sanitise(text if premasked else self.masker.text(text, keep_otlp_times=True))
        masked, name_pans = mask_member_name_digits(masked)  # {"4111":{"1111":…}}: the names hold one
        masked, exponent_pans = mask_exponent_numbers(masked)  # 4.111111111111111e15 shows a PAN's digits
        masked, binary_runs = mask_binary(masked)
        self.masker.masked += name_pans + exponent_pans + binary_runs
        if truncated or len(masked) > QUARANTINE_TEXT_CHARS:
            masked = masked[:QUARANTINE_TEXT_CHARS]
            # never keep a PAN cut in half (nor behind the U+FFFD of a multi-byte character cut there)
            masked = TRAILING_DIGIT_RUN.sub("", masked.rstrip("\ufffd")) + "…"
        else:
            masked, cut = mask_cut_end(masked)
            self.masker.masked += cut
        return Outcome(self.masker.text(source), position, reason=self.masker.text(reason), raw_text=masked,
                       raw_sha256=hashlib.sha256(masked.encode("utf-8")).hexdigest())

    # -- entry points ----------------------------------------------------------------------------

    def feed_bytes(self, data: bytes, source: str, position: str | None, total_bytes: int | None = None) -> list[Outcome]:
        """One physical line as bytes (newline stripped). ``total_bytes`` is the full length when
        the reader kept only a prefix of an oversize line."""
        size = total_bytes if total_bytes is not None else len(data)
        if size > self.max_line_bytes:
            if self.reads_documents(data):
                if size > self.max_document_bytes:
                    prefix = data[: self.max_line_bytes].decode("utf-8", "replace")
                    what = "JSON array" if starts_record_array(data) else "OTLP export request"
                    return [self.reject(prefix, f"line-too-long: {what} line of {size} bytes exceeds the "
                                                f"limit of {self.max_document_bytes} (DRAUDIT_INGEST_MAX_BODY_BYTES)",
                                        source, position, truncated=True)]
            else:
                prefix = data[: self.max_line_bytes].decode("utf-8", "replace")
                return [self.reject(prefix, f"line-too-long: {size} bytes exceeds the limit of {self.max_line_bytes} "
                                            "(DRAUDIT_INGEST_MAX_LINE_BYTES)", source, position, truncated=True)]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"not-utf8: invalid UTF-8 byte at offset {exc.start}"
            # Latin-1 (or Windows-1252) text: a card number grouped by its no-break space (0xA0) or
            # middle dot (0xB7) bytes shows only when each byte is read as its character; so does
            # UTF-16 after its byte order mark. A PAN found in that reading is quarantined masked
            # in it; otherwise the bytes are shown escaped (``\xNN``).
            latin, found = mask_text(data.decode("latin-1"))
            if found:
                self.masker.masked += found
                return [self.reject(latin, reason, source, position, premasked=True)]
            shown = data.decode("utf-8", "backslashreplace")
            return [self.reject(shown, reason, source, position)]
        return self.feed_text(text, source, position)

    def reads_documents(self, prefix: bytes) -> bool:
        """True when a line starting with ``prefix`` is held to ``max_document_bytes``: an OTLP/JSON
        export request, read as OTLP (``forced`` None or ``otlp``), or a JSON array of records (a
        saved HTTP batch, one per line: ``_array_line``; not under ``--format cri``), whose
        elements are each held to ``max_line_bytes``. Before, a batch line over the line limit was
        one ``line-too-long`` unit: its records, each within the limit, were never read."""
        if self.forced in (None, "otlp") and looks_like_export_request(prefix):
            return True
        return self.forced != "cri" and starts_record_array(prefix)

    def feed_text(self, text: str, source: str, position: str | None) -> list[Outcome]:
        """One physical line as text. Blank lines produce nothing (they are not counted). A leading
        byte order mark (U+FEFF, which Windows tools write at the start of a UTF-8 file) is dropped."""
        line = text.rstrip("\r\n")
        if line.startswith("\ufeff"):
            line = line[1:]
        if not line or line.isspace():  # what ``not line.strip()`` says, without copying the line
            return []
        self._decoder.saw_exponent = False
        try:
            return self._line(line, source, position)
        except Rejected as exc:
            return [self.reject(line, exc.reason, source, position)]
        except JsonRejected as exc:
            return [self.reject(line, exc.reason, source, position)]

    def _array_line(self, body: str, source: str, position: str) -> list[Outcome]:
        """A line that is one JSON array (a saved HTTP batch: Fluent Bit ``format json``, Vector
        ``codec: json``, one per line): each element one unit positioned ``<line> element <i>``, as
        an array file's elements are, so ``read`` counts elements. An element that is itself an
        array is not expanded (its reason says it is no object)."""
        from collector.ingest.jsonarray import JsonArrayElements

        data = body.encode("utf-8", "surrogatepass")
        outcomes: list[Outcome] = []
        elements = JsonArrayElements(io.BytesIO(data), len(data), chunk_bytes=max(len(data), 1), rest_bytes=None)
        for n, (element, _total) in enumerate(elements, start=1):
            where = f"{position} element {n}"
            if len(element) > self.max_line_bytes:
                # the line may be up to the body limit (``reads_documents``); each record is held to the line limit
                outcomes.extend(self.feed_bytes(element, source, where))
                continue
            outcomes.extend(self.feed_text(element.decode("utf-8", "surrogatepass"), source, where))
        return outcomes

    def feed_otlp_document(self, doc: dict[str, Any], source: str) -> list[Outcome]:
        """The records of a decoded OTLP/JSON export request read as one document (a file), one
        outcome each; a request whose structure is wrong (``otlp.OtlpMalformed``) is one
        quarantined unit, its reason naming the member (position ``document``: the whole of it)."""
        doc = storable(doc)  # a lone surrogate escape in a string: "?" as in a line, not a crash
        try:
            records = records_from_json(doc)
        except OtlpMalformed as exc:
            return [self.reject(canonical_json(doc).decode("utf-8"), exc.reason, source, "document")]
        return self.feed_otlp_records(records, source)

    def feed_otlp_records(self, records: Iterable[OtlpLogRecord], source: str, position_prefix: str = "") -> list[Outcome]:
        """Records of one OTLP request (JSON or protobuf), one outcome each."""
        return [self._otlp(r, source, f"{position_prefix}{r.position}") for r in records]

    @property
    def has_pending_partials(self) -> bool:
        """True while a partial line (CRI ``P``, Fluent Bit ``_p``…) waits for its final chunk."""
        return bool(self._partials)

    def drop_pending_partials(self) -> None:
        """Forget partial lines held so far (a parse worker whose chunk the caller re-parses in order)."""
        self._partials.clear()

    def finish(self) -> list[Outcome]:
        """End of input: partial lines never completed are quarantined (``incomplete-partial``)."""
        out = [self._incomplete(p) for p in self._partials.values()]
        self._partials.clear()
        return out

    def end_of_source(self, source: str, *, continued: bool = False) -> list[Outcome]:
        """The input ``source`` (a file) ended: the partial lines of its log stream that are still
        open are quarantined (``incomplete-partial``), unless ``continued`` — the next input is the
        next file of the same stream (``rotation.continues``), where their final chunk may be.
        Held on instead, an open partial kept every later chunk of the run out of the parse workers."""
        stream = self._stream(source)
        ended = [key for key in self._partials if key[0] == stream] if not continued else []
        return [self._incomplete(self._partials.pop(key)) for key in ended]

    def _linked(self, env: Envelope, source: str) -> Envelope:
        """``env`` of a kubelet log file, with what the file a ``/var/log/containers`` symlink
        points to adds (``streams``: the real file the CLI resolved) — the pod UID. Without it the
        same lines ingested under the link and under the real path were two pod identities."""
        target = self.streams.get(source)
        if target is not None and target != source:
            env.fill_from_link_target(target)
        return env

    def _stream(self, source: str) -> str:
        """The log stream of ``source``: as named in ``streams``, else by its name (``rotation.log_stream``)."""
        return self.streams.get(source) or log_stream(source)

    def _incomplete(self, p: _Partial) -> Outcome:
        return self.reject(self._partial_text(p.raws, p.chunks, kind=p.env.kind),
                           "incomplete-partial: partial line (P) never completed by a final chunk before the end of "
                           "input", p.source, p.position, truncated=p.overflow)

    def _partial_text(self, raws: list[str], chunks: list[str], masker: PanMasker | None = None, *,
                      kind: str = "cri") -> str:
        """What to quarantine for the chunks of a partial line: the raw lines joined by newlines,
        each masked, a run of digits at the end of each masked as a cut PAN (``pan.mask_cut_end``:
        every chunk ends where its writer cut the line). When the chunks' payloads joined hold
        more PANs than they do one by one, a PAN spans a chunk boundary, which masking each raw
        line cannot see: then the joined payload, masked, is quarantined instead of the raw lines.

        Also the text a reassembled record's ``raw_sha256`` is taken over (``masker``: a
        throw-away one, so the PANs are counted once, in the record's fields): the raw lines
        joined hold a PAN that spans chunks unmasked, and a hash of them gives it away to a brute
        force over its middle digits (PCI DSS 3.5.1.1).

        In a JSON envelope (Fluent Bit ``_p``/``logtag``, docker json-file, ``kind`` the first
        chunk's envelope) a chunk's payload does not end its raw line (``…card 41111111",
        "kubernetes": {…}}``): the digits at the end of the payload's string are the cut ones
        (``_payload_spans``), masked before the rest of the line."""
        masker = masker or self.masker
        joined = "".join(chunks)
        if sum(mask_text(c)[1] for c in chunks) < mask_text(joined)[1]:
            return masker.text(joined, keep_otlp_times=True)
        out = []
        for i, raw in enumerate(raws):
            chunk = chunks[i] if i < len(chunks) else None
            if kind != "cri" and chunk is not None and mask_cut_end(chunk)[1]:
                raw, cut = _mask_spans(raw, _payload_spans(raw, chunk, kind), mask_cut_end)
                raw = masker.text(raw, keep_otlp_times=True)
            else:
                raw, cut = mask_cut_end(masker.text(raw, keep_otlp_times=True))
            out.append(raw)
            masker.masked += cut
        return "\n".join(out)

    # -- one line ----------------------------------------------------------------------------------

    def _line(self, line: str, source: str, position: str | None) -> list[Outcome]:
        self._line_without_escapes = None
        forced = self.forced
        if forced in (None, "cri"):
            m = CRI_LINE.match(line) if line[:1].isdigit() or forced == "cri" else None  # CRI lines start with a digit
            if m:
                return self._enveloped(self._linked(envelopes.cri(m, source), source), line, source, position)
            if forced == "cri":
                raise Rejected("wrong-format: not a CRI log line (<time> <stream> <P|F> <content>) but --format cri")
        body = _strip(line)
        if not body.startswith("{"):
            decoded = _json_or_error(body)
            # a JSON array (not a ``[main] INFO …`` text line), one level deep
            if isinstance(decoded[0], list) and position is not None and "element" not in position:
                return self._array_line(body, source, position)
            raise Rejected(_not_an_object(body, decoded))
        # one scan decides whether the slow sanitising checks run
        special = "\x00" in body or has_unicode_escape(body) is not None
        if not special:
            self._line_without_escapes = line  # the PAN pre-filter need not look for \u in it again
        # an OTLP/JSON request spends 4 JSON levels per map level of its values (otlp.json_depth_limit)
        depth = (json_depth_limit(self.max_depth) if self.forced in (None, "otlp")
                 and looks_like_export_request(body[:OTLP_SNIFF_BYTES].encode("utf-8", "surrogatepass")) else None)
        decoded = self._decoder.decode(self._maybe_sanitise_text(body) if special else body, unicode_escapes=special,
                                       max_depth=depth)
        doc = decoded.value
        if not isinstance(doc, dict):
            raise Rejected("unparseable: JSON value is not an object")
        if special:
            doc = self._maybe_sanitise(body, doc)
        if "resourceLogs" in doc and forced in (None, "otlp"):
            if decoded.conflicts:
                raise Rejected(self._dup_reason(decoded.conflicts))
            try:
                records = records_from_json(doc)
            except OtlpMalformed as exc:
                raise Rejected(exc.reason) from None
            return [self._otlp(r, source, f"{position}:{r.position}" if position else r.position) for r in records]
        if forced == "otlp":
            raise Rejected("wrong-format: no resourceLogs (OTLP/JSON ExportLogsServiceRequest) but --format otlp")
        if forced in PAYLOAD_FORMATS:
            kind = "none"
        elif forced in ENVELOPE_FORMATS:
            kind = forced
        else:
            kind = envelopes.detect(doc)
        if kind == "cri":
            raise Rejected("wrong-format: JSON line but --format cri")
        if kind in ("fluentbit", "fluentd"):
            env = envelopes.fluent(doc, kind, decoded.top_conflicts, self._app_keys)
        elif kind == "vector":
            env = envelopes.vector(doc, self._app_keys)
        elif kind == "elastic":
            env = envelopes.elastic(doc, self._app_keys)
        elif kind == "docker_json":
            env = self._linked(envelopes.docker_json(doc, source), source)
        else:
            if decoded.conflicts:
                raise Rejected(self._dup_reason(decoded.conflicts))
            return [self._payload(Envelope("none", payload=doc), line, source, position)]
        if special or not decoded.by_orjson:
            env.merged = None  # only orjson's values re-encode to the text they came from (no NaN, no big integer)
        conflicts = decoded.conflicts
        if "_reconcile_log" in env.extras:
            conflicts = [c for c in conflicts if c[0] != "log"]  # checked once the raw line is parsed
        if conflicts and kind in ("fluentbit", "fluentd") and isinstance(env.payload, str):
            conflicts = self._merge_collisions(conflicts, decoded.top_conflicts, env)
        if conflicts:
            raise Rejected(self._dup_reason(conflicts))
        return self._enveloped(env, line, source, position)

    @staticmethod
    def _merge_collisions(conflicts: list[tuple[str, Any, Any]], top: dict[str, list[Any]],
                          env: Envelope) -> list[tuple[str, Any, Any]]:
        """The conflicts left once those of Fluent Bit's ``Merge_Log`` (no ``Merge_Log_Key``) with
        ``Keep_Log On`` are taken as warnings: the application's keys appended at the top level
        collide with the record's own (``json_date_key @timestamp``, an MDC ``stream``) —
        log-formats §2.2 says such duplicates occur. The application line is read from the raw
        ``log`` string (``env.payload``) and the envelope keeps the record's first value, which
        Fluent Bit writes before the merged keys. Never the ``kubernetes`` map: two pod identities
        in one record stay a quarantined line."""
        collided = sorted({c[0] for c in conflicts if c[0] in top and c[0] != "kubernetes"
                           and c[1] in top[c[0]] and c[2] in top[c[0]]})
        if collided:
            env.warnings.append("duplicate top-level member " + ", ".join(repr(n) for n in collided[:5])
                                + " (Fluent Bit Merge_Log without Merge_Log_Key appends the application's keys beside "
                                "its own): the record's first value kept, the application line read from 'log'")
        return [c for c in conflicts if c[0] not in collided]

    @staticmethod
    def _dup_reason(conflicts: list[tuple[str, Any, Any]]) -> str:
        names = sorted({c[0] for c in conflicts})
        return "duplicate-key: member " + ", ".join(repr(n) for n in names[:5]) + " appears twice with different values"

    @staticmethod
    def _maybe_sanitise_text(text: str) -> str:
        return text.replace("\x00", "\ufffd") if "\x00" in text else text

    @staticmethod
    def _maybe_sanitise(text: str, doc: Any) -> Any:
        # NUL (literal or \u0000) and \ud800-\udfff escapes (lone surrogates) need the slow walk.
        return storable(doc, text)

    def _enveloped(self, env: Envelope, raw: str, source: str, position: str | None) -> list[Outcome]:
        if env.partial and not isinstance(env.payload, str):
            env.partial = False
        key: tuple[Any, ...] | None = None
        pending = None
        if env.partial or self._partials:
            # by log stream, not file: a rotation between two chunks leaves them in two files (``rotation``)
            # a CRI file is one container's log: its pod identity comes from the file's name, which
            # differs between a live log named through a symlink and its rotated files
            key = ((self._stream(source), env.kind, env.stream) if env.kind == "cri" else
                   (self._stream(source), env.kind, env.namespace, env.pod_name, env.container_name, env.stream))
            pending = self._partials.get(key)
        if env.partial:
            if pending is None:
                pending = self._partials[key] = _Partial(env=env, source=source, position=position)
            pending.size += len(env.payload.encode("utf-8"))
            if pending.size > self.max_line_bytes:
                pending.overflow = True
            if not pending.overflow:
                pending.chunks.append(env.payload)
                pending.raws.append(raw)
            return []
        if pending is not None:
            del self._partials[key]
            total = pending.size + len(env.payload.encode("utf-8")) if isinstance(env.payload, str) else pending.size
            joined_raw = "\n".join(pending.raws + [raw])
            chunks = pending.chunks + ([env.payload] if isinstance(env.payload, str) else [])
            first_kind = pending.env.kind
            source = pending.source  # the outcome is positioned where its first chunk is
            if pending.overflow or total > self.max_line_bytes:
                reason = (f"line-too-long: reassembled partial line of {total} bytes exceeds the limit of "
                          f"{self.max_line_bytes} (DRAUDIT_INGEST_MAX_LINE_BYTES)")
                return [self.reject(self._partial_text(pending.raws + [raw], chunks, kind=first_kind), reason, source,
                                    pending.position, truncated=True)]
            first = pending.env
            first.payload = "".join(pending.chunks) + (env.payload if isinstance(env.payload, str) else "")
            first.partial = False
            first.extras["partial_chunks"] = len(pending.chunks) + 1
            try:
                return [self._payload(first, joined_raw, source, pending.position,
                                      hashed=lambda: self._partial_text(pending.raws + [raw], chunks, PanMasker(),
                                                                        kind=first_kind))]
            except (Rejected, JsonRejected) as exc:
                return [self.reject(self._partial_text(pending.raws + [raw], chunks, kind=first_kind), exc.reason,
                                    source, pending.position)]
        try:
            return [self._payload(env, raw, source, position)]
        except (Rejected, JsonRejected) as exc:
            # No partial pending for this stream: the line may be the continuation of one whose
            # first chunks the parser did not see (an earlier request or file), and the digits it
            # starts with the end of a PAN cut there: quarantined, they keep their last 4 only. Or
            # its payload was cut at its end (a shipper's line limit, Fluent Bit's or Vector's,
            # truncating the application's line inside a complete JSON envelope), and the digits
            # ending the payload string — not the raw line, whose end ``reject`` looks at — are the
            # start of a PAN cut there: they keep their first 6 only.
            payload = env.payload
            if not isinstance(payload, str) or not (mask_cut_start(payload)[1] or mask_cut_end(mask_text(payload)[0])[1]):
                raise
            text, cut = _mask_spans(raw, _payload_spans(raw, payload, env.kind), _mask_cut_payload)
            self.masker.masked += cut
            return [self.reject(text, exc.reason, source, position)]

    def _decode_payload(self, text: str,
                        merged: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[tuple[str, Any, Any]]]:
        body = _strip(text)
        if body.startswith("\ufeff"):  # the application wrote a byte order mark first
            body = body[1:].lstrip()
        if not body.startswith("{"):
            raise Rejected("unparseable: the application line is plain text, not JSON")
        special = "\x00" in body or has_unicode_escape(body) is not None
        if merged is not None and not special and self._same_as_merged(body, merged):
            return merged, []
        decoded = self._decoder.decode(self._maybe_sanitise_text(body) if special else body, unicode_escapes=special)
        if not isinstance(decoded.value, dict):
            raise Rejected("unparseable: the application line is not a JSON object")
        return (self._maybe_sanitise(body, decoded.value) if special else decoded.value), decoded.conflicts

    @staticmethod
    def _same_as_merged(body: str, merged: dict[str, Any]) -> bool:
        """True when decoding ``body`` gives ``merged`` (an orjson-decoded object of the same line,
        ``Envelope.merged``), and exactly as ``Decoder.decode`` would take it: ``body`` is orjson's
        encoding of ``merged`` byte for byte, and orjson decodes its own encoding to an equal value
        (same keys in the same order, no key twice, every number spelled as decoded); it holds no
        ``\\u`` escape (the caller checked) and no ``e+`` (which sends ``Decoder.decode`` to the
        standard decoder); its nesting is that of a member of the line, within the limit."""
        try:
            encoded = orjson.dumps(merged)
        except orjson.JSONEncodeError:
            return False
        return not (b"+" in encoded and b"e+" in encoded) and encoded == body.encode("utf-8", "surrogatepass")

    def _payload(self, env: Envelope, raw: str, source: str, position: str | None,
                 hashed: Callable[[], str] | None = None) -> Outcome:
        """The record of one application line (``env.payload``), ``raw`` the input line(s) it came
        from. ``raw_sha256`` is the hash of ``raw``, PAN-masked when a PAN may be in it (the hash is
        over the *masked* text: an unkeyed hash of a line holding a PAN, next to its masked first 6 /
        last 4, would let anyone brute-force the middle digits, PCI DSS 3.5.1.1); ``hashed``
        gives the masked text to hash instead (a line reassembled from partial chunks, where a PAN
        may span two raw lines: ``_partial_text``)."""
        payload = env.payload
        if payload is None:
            raise Rejected(f"missing-payload: the {env.kind} record carries no application line")
        if isinstance(payload, str):
            doc, conflicts = self._decode_payload(payload, env.merged)
            if conflicts:
                raise Rejected(self._dup_reason(conflicts))
            reconcile = env.extras.pop("_reconcile_log", None)
            if reconcile is not None and reconcile[1] is not None and doc.get("log") != reconcile[1]:
                raise Rejected("duplicate-key: member 'log' appears twice and the merged object differs from the raw line")
            if reconcile is not None:
                env.warnings.append("duplicate 'log' key (Fluent Bit Merge_Log + Keep_Log) reconciled with the raw line")
        elif isinstance(payload, dict):
            doc = payload
            env.extras.pop("_reconcile_log", None)
        else:
            raise Rejected(f"unparseable: the {env.kind} application field is a {type(payload).__name__}")
        fmt = self.forced if self.forced in PAYLOAD_FORMATS else detect_format(doc)
        flat = prepare(doc, fmt)
        # A line joined from partial chunks (``hashed``) is scanned whatever its raw lines show: a PAN
        # cut between two chunks has a newline and a runtime's or shipper's prefix between its
        # digits there, which the raw lines' pre-filter cannot join.
        names_pan = record_names_may_contain_pan(flat)  # nested member names joined into a card layout
        if hashed is not None or may_contain_pan(raw, unicode_escapes=raw is not self._line_without_escapes) \
                or self._decoder.saw_exponent or self._source_may_contain_pan(source) or names_pan:
            masker = self.masker
            hash_text = hashed() if hashed is not None else mask_text(raw)[0]
            if self._decoder.saw_exponent:  # 4.111111111111111e15 is a PAN that mask_text does not read
                hash_text = mask_exponent_numbers(hash_text)[0]
            if names_pan:  # the line shows the PAN's groups apart, which mask_text does not join
                hash_text = ANY_DIGIT.sub("*", hash_text)
            raw_sha256 = _sha256(hash_text)
        else:  # nothing decoded from this line can hold a PAN: skip the per-field scan
            masker, raw_sha256 = NULL_MASKER, _sha256(raw)
        record = self.builder.build(flat, fmt, env, masker, raw_sha256=raw_sha256, source=source, position=position)
        return Outcome(source, position, record=record)

    def _source_may_contain_pan(self, source: str) -> bool:
        if source != self._last_source:
            self._last_source, self._last_source_pan = source, may_contain_pan(source)
        return self._last_source_pan

    # -- OTLP ----------------------------------------------------------------------------------------

    def _otlp(self, r: OtlpLogRecord, source: str, position: str) -> Outcome:
        # Card numbers masked in bytes values while decoding count as masked, stored or quarantined.
        self.masker.masked += r.bytes_pans_masked
        # The record's "raw line" is the canonical JSON of its view, masked with our own times kept.
        raw = canonical_json(self._masked_view(r, PanMasker())).decode("utf-8")
        try:
            return Outcome(source, position, record=self._otlp_record(r, raw, source, position))
        except (Rejected, JsonRejected) as exc:
            counted = canonical_json(self._masked_view(r, self.masker)).decode("utf-8")
            return self.reject(counted, exc.reason, source, position, premasked=True)

    @staticmethod
    def _masked_view(r: OtlpLogRecord, masker: PanMasker) -> dict[str, Any]:
        """``r.view()`` PAN-masked but for the record's own ``timeUnixNano`` and
        ``observedTimeUnixNano`` (integers we parsed: 19 digits pass Luhn one time in ten). Only
        those two: an attribute or body member of the same name is masked as any other value."""
        view = r.view()
        view["logRecord"]["timeUnixNano"] = view["logRecord"]["observedTimeUnixNano"] = None
        masked = masker.value(view)
        for name, value in (("timeUnixNano", r.time_unix_nano), ("observedTimeUnixNano", r.observed_time_unix_nano)):
            # kept as parsed, unless its digits read as a card number (then it is no time: otlp._pan_time_problem)
            masked["logRecord"][name] = masker.value(value) if number_holds_pan(value, card_issuer_only=True) else value
        return masked

    def _otlp_record(self, r: OtlpLogRecord, raw: str, source: str, position: str) -> CanonicalRecord:
        deepest = max(value_depth(r.body), value_depth(r.attributes), value_depth(r.resource))
        if deepest > self.max_depth:  # the limit of a JSON line's values, whatever the encoding spent
            raise Rejected(f"nesting-too-deep: OTLP record value nested {deepest} levels, over the limit of "
                           f"{self.max_depth}")
        if r.duplicate_keys:  # as a JSON line's duplicate members (_dup_reason): never one of them kept silently
            raise Rejected("duplicate-key: OTLP attribute " + ", ".join(repr(k) for k in r.duplicate_keys[:5])
                           + " appears twice with different values")
        if r.problems:
            raise Rejected(f"bad-timestamp: {r.problems[0]}")
        res = r.resource
        attrs = r.attributes
        env = Envelope("otlp_app", warnings=list(r.warnings))
        env.namespace = res.get("k8s.namespace.name") if isinstance(res.get("k8s.namespace.name"), str) else None
        env.pod_name = res.get("k8s.pod.name") if isinstance(res.get("k8s.pod.name"), str) else None
        envelopes.set_pod_uid(env, res.get("k8s.pod.uid"), "k8s.pod.uid")
        env.container_name = res.get("k8s.container.name") if isinstance(res.get("k8s.container.name"), str) else None
        env.node_name = res.get("k8s.node.name") if isinstance(res.get("k8s.node.name"), str) else None
        env.container_id = envelopes.normalise_container_id(res.get("container.id"))
        stream = attrs.get("log.iostream")
        env.stream = stream if isinstance(stream, str) else None
        path = attrs.get("log.file.path")
        if isinstance(path, str):
            env.fill_from_path(path)
        if r.observed_time_unix_nano:
            env.extras["observed_time_ns"] = r.observed_time_unix_nano
        resource_rest = {f"resource.{k}": v for k, v in res.items()
                         if k not in ("k8s.namespace.name", "k8s.pod.name", "k8s.pod.uid", "k8s.container.name",
                                      "k8s.node.name", "container.id")}
        otel = {"otel.severity_number": r.severity_number or None, "otel.severity_text": r.severity_text,
                "otel.scope.name": r.scope_name, "otel.event_name": r.event_name}
        extra = {k: v for k, v in {**resource_rest, **otel}.items() if v is not None}
        body = r.body
        time = (r.time_unix_nano, 1) if r.time_unix_nano > 0 else None
        if isinstance(body, str) and body.lstrip().startswith("{") or isinstance(path, str):
            # A log line collected from a file (filelog receiver): the body is the application line;
            # its own timestamp is the event time, timeUnixNano is the runtime's.
            env.kind = "otlp_filelog"
            env.runtime_time_ns = r.time_unix_nano or None
            if not isinstance(body, str):
                raise Rejected("unparseable: OTLP filelog record body is not a string")
            doc, conflicts = self._decode_payload(body)
            if conflicts:
                raise Rejected(self._dup_reason(conflicts))
            fmt = self.forced if self.forced in PAYLOAD_FORMATS else detect_format(doc)
            flat = prepare(doc, fmt)
            extra.update({f"envelope.otel.{k}": v for k, v in attrs.items()
                          if k not in ("log.iostream", "log.file.path", "logtag")})
            return self.builder.build(flat, fmt, env, self.masker, raw_sha256=_sha256(raw), source=source,
                                      position=position, trace_id=r.trace_id, span_id=r.span_id,
                                      extra_attributes=extra)
        flat = flatten(body) if isinstance(body, dict) else ({"message": body} if body is not None else {})
        flat.update(flatten(attrs))
        return self.builder.build(flat, "otlp", env, self.masker, raw_sha256=_sha256(raw), source=source,
                                  position=position, event_time=time, trace_id=r.trace_id, span_id=r.span_id,
                                  extra_attributes=extra)
