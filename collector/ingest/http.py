"""HTTP ingestion for ``draudit run``: ``POST /v1/ingest`` (JSON lines / JSON array) and ``POST /v1/logs`` (OTLP/HTTP).

- ``/v1/ingest`` takes what shippers send unchanged: Fluent Bit ``http`` output with
  ``format json_lines`` (NDJSON), ``json`` (one array) or ``json_stream`` (objects back to back,
  nothing between them), Vector ``http`` sink with ``codec: json`` (array) or NDJSON framing,
  scripts posting lines. Each line / array element / object is one unit, parsed exactly like a
  file line (``LineParser``), so an NDJSON body can quarantine one bad event by its line number.
  A msgpack body (``Content-Type: application/msgpack``, the ``format`` older Fluent Bit releases
  default to, or a body starting with a msgpack array byte) is answered 415 naming the setting to
  change: it cannot be read, and quarantining it as text would answer 200 for lost records.
- ``/v1/logs`` implements the OTLP/HTTP logs receiver (opentelemetry-proto
  ``docs/specification.md``): ``application/x-protobuf`` or ``application/json`` in, the
  ``ExportLogsServiceResponse`` out in the same encoding, ``partial_success.rejected_log_records``
  = records quarantined (the client must not retry those); 400 for an undecodable body or a
  malformed request (``otlp.OtlpMalformed``: a member of the wrong type, named in the message;
  ``google.rpc.Status``), 415 for another content type. A JSON object with no ``resourceLogs``
  but other members (a shipper's record sent to the wrong path) is answered 400 naming
  ``/v1/ingest`` (``_misrouted_otlp_json``).

Both: ``Authorization: Bearer <token>`` (``settings.resolved_ingest_token()``; 401 otherwise,
also when no token is configured — fail closed), ``Content-Encoding: gzip`` accepted, body size
limited to ``settings.ingest_max_body_bytes`` before *and* after decompression (413), and the 2xx
is sent only after the request's single transaction committed — a shipper that sees anything
else retries, and the retry is deduplicated. Database unavailable → 503 with ``Retry-After``.

Every answer is counted (``metrics.observe_request``: ``draudit_ingest_requests_total{path,code}``,
and a 4xx in ``draudit_ingest_requests_rejected_total{path,reason}``), and each 4xx is logged as a
WARNING naming the path, status, reason, client address and request id with the answer's message
(never the token nor the body): shippers drop what is answered 4xx without retrying, so a
rejection is data lost that only this server sees.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import re
import traceback
import uuid
import zlib
from typing import Any, Callable

from sqlalchemy.exc import OperationalError, TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from collector.errors import UserError
from collector.ingest.jsonarray import (JsonArrayElements, arrays_one_per_line, feed_elements, feed_pretty, feed_values,
                                       json_object_stream, starts_pretty_object, starts_record_array)
from collector.ingest.jsondoc import DEFAULT_MAX_DEPTH, JsonRejected, decode
from collector.ingest.metrics import observe_request
from collector.ingest.otlp import (PROTOBUF_PEEK_BYTES, OtlpMalformed, export_response, json_depth_limit,
                                   looks_like_otlp_protobuf, records_from_json, records_from_protobuf)
from collector.ingest.pan import mask_text
from collector.ingest.parser import storable
from collector.ingest.pipeline import IngestRun
from collector.ingest.timestamps import zone
from collector.settings import Settings

log = logging.getLogger(__name__)

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
RETRY_AFTER_S = 5
_UTF8_BOM = b"\xef\xbb\xbf"  # a byte order mark some tools write before UTF-8 text; dropped
_LOGGED_MESSAGE_CHARS = 300  # of an answer's message in the rejection log line


_ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class HttpProblem(Exception):
    """An HTTP error answer: status code and a one-line message naming the fix."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def _check_token(request: Request, settings: Settings) -> str:
    """The server's ingest token, once the request's bearer token matched it.

    Raises:
        HttpProblem: 401 (no token configured: fail closed; missing or wrong token), 503 when the
            token file became unusable since start-up (unreadable, emptied: ``draudit run`` refuses
            to start so): the shipper retries and loses nothing meanwhile; the server log names it.
    """
    try:
        expected = settings.resolved_ingest_token()
    except UserError as exc:
        log.error("ingestion refused: %s", exc)
        raise HttpProblem(503, "the server's ingest token is unusable (the server log says why); retry later",
                          {"Retry-After": str(RETRY_AFTER_S)}) from None
    challenge = {"WWW-Authenticate": 'Bearer realm="draudit-ingest"'}
    if not expected:
        raise HttpProblem(401, "ingestion is closed: no ingest token configured on the server "
                               "(DRAUDIT_INGEST_TOKEN or DRAUDIT_INGEST_TOKEN_FILE)", challenge)
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise HttpProblem(401, "missing or wrong bearer token (Authorization: Bearer <token>)", challenge)
    return expected


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, gunzipped when ``Content-Encoding: gzip``, never more than ``max_bytes``.

    A body sent without ``Content-Encoding`` that starts with the gzip magic bytes (RFC 1952 §2.3.1:
    ``1f 8b``; JSON text never starts so) is gunzipped too: ``curl --data-binary @day.jsonl.gz``
    sends the file as it is, and storing its bytes as unparseable lines would lose the records.

    Raises:
        HttpProblem: 413 (too large, compressed or not), 415 (unknown encoding), 400 (bad gzip).
    """
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > max_bytes:
        raise HttpProblem(413, f"request body of {length} bytes exceeds the limit of {max_bytes} (DRAUDIT_INGEST_MAX_BODY_BYTES)")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise HttpProblem(413, f"request body exceeds the limit of {max_bytes} bytes (DRAUDIT_INGEST_MAX_BODY_BYTES)")
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return gunzip_limited(body, max_bytes) if body[:2] == b"\x1f\x8b" else body
    if encoding not in ("gzip", "x-gzip"):
        raise HttpProblem(415, f"Content-Encoding {encoding!r} is not supported; send gzip or identity")
    return gunzip_limited(body, max_bytes)


def gunzip_limited(data: bytes, max_bytes: int) -> bytes:
    """Decompress gzip ``data`` (all members) without ever producing more than ``max_bytes``.

    Raises:
        HttpProblem: 413 when the content is larger (a "zip bomb" stops here), 400 when not gzip.
    """
    out: list[bytes] = []
    produced = 0
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            piece = d.decompress(data, max_bytes - produced + 1)
        except zlib.error as exc:
            raise HttpProblem(400, f"body is not valid gzip ({exc})") from None
        produced += len(piece)
        if produced > max_bytes or d.unconsumed_tail:
            raise HttpProblem(413, f"decompressed body exceeds the limit of {max_bytes} bytes (DRAUDIT_INGEST_MAX_BODY_BYTES)")
        if not d.eof:
            raise HttpProblem(400, "body is truncated gzip")
        out.append(piece)
        data = d.unused_data.lstrip(b"\x00")
    return b"".join(out)


def split_json_array(body: bytes) -> tuple[list[bytes], bytes | None]:
    """Elements of a JSON array as byte slices, found without decoding (``jsonarray``).

    Returns:
        ``(elements, rest)``: ``rest`` holds text after the closing bracket, or the unterminated
        tail, when there is any (quarantined by the caller), else None.
    """
    elements = JsonArrayElements(io.BytesIO(body), len(body), chunk_bytes=max(len(body), 1), rest_bytes=None)
    return [data for data, _total in elements], elements.rest


def _reject_msgpack(content_type: str, body: bytes | None = None) -> None:
    """Raise 415 for a msgpack body: by its content type, or by its first byte (a msgpack fixarray,
    0x90-0x9F, which no UTF-8 text starts with; Fluent Bit sends ``[time, record]`` arrays)."""
    if "msgpack" in content_type or (body and 0x90 <= body[0] <= 0x9F):
        raise HttpProblem(415, f"body is msgpack (Content-Type {content_type or '(none)'!r}); /v1/ingest reads JSON: "
                               "set the Fluent Bit http output to 'Format json_lines' (or 'json')")


def _reject_protobuf(content_type: str, body: bytes | None = None) -> None:
    """Raise 415 for an OTLP protobuf body sent to ``/v1/ingest`` (an ``otlphttp`` exporter whose
    logs endpoint names the wrong path): by its content type, or by its first bytes
    (``otlp.looks_like_otlp_protobuf``). Read as lines it was junk quarantine rows, answered 200 —
    the exporter dropped the batch as delivered."""
    if content_type == "application/x-protobuf" or (body and looks_like_otlp_protobuf(body[:PROTOBUF_PEEK_BYTES])):
        raise HttpProblem(415, f"body is OTLP protobuf (Content-Type {content_type or '(none)'!r}); /v1/ingest reads "
                               "JSON lines or a JSON array: send OTLP to /v1/logs (an otlphttp exporter's "
                               "logs_endpoint ends with /v1/logs)")


def _new_run(settings: Settings, sessions: sessionmaker[Session], request_id: str) -> IngestRun:
    return IngestRun(sessions, settings, one_transaction=True, run_id=request_id)


def _given_request_id(request: Request) -> str | None:
    """The client's ``X-Request-Id`` when it is a valid id and holds no card number (it would be
    echoed and stored as the rows' source), else None."""
    given = request.headers.get("x-request-id", "")
    return given if _REQUEST_ID.match(given) and not mask_text(given)[1] else None


def _request_id(request: Request) -> str:
    return _given_request_id(request) or uuid.uuid4().hex


def _body_digest(body: bytes, token: str) -> str:
    """``body-`` and the first 32 hex digits of the HMAC-SHA256 (RFC 2104) of the (decompressed)
    ``body`` under the server's ingest ``token`` (``_check_token`` has let the request in, so there
    is one): the request's rows' source is ``http:`` and this (``_body_ids``).

    Keyed: the digest is echoed and stored in every row's source, and the body may hold a card
    number that is stored masked (first 6 / last 4); an unkeyed hash of the body would give the
    masked digits back to a brute force over a million candidates (PCI DSS 3.5.1.1 asks for keyed
    hashes). A token rotation changes the digests of bodies re-sent afterwards (a quarantined line
    of such a retry is stored once more).
    """
    return "body-" + hmac.new(token.encode("utf-8"), body, hashlib.sha256).hexdigest()[:32]


def _body_ids(request: Request, body: bytes, token: str) -> tuple[str, str]:
    """``(request id, source)`` of a request once its body is read.

    The source of its rows is always ``http:`` and the body's digest (``_body_digest``); the
    request id (answered, logged, stored as the rows' ``run_id``) is the client's ``X-Request-Id``
    (``_given_request_id``) when it sends one, else that digest.

    Why: a shipper that did not get the answer (timeout, restart) sends the same body again.
    Records are deduplicated by content anyway, but a quarantined line is keyed by its source and
    position: with a source per request id, each retry quarantined it again — with a random id,
    and with the client's own one too, since a proxy (Envoy, an Istio sidecar) sets a new
    ``x-request-id`` per attempt. The same body now has the same source, whatever its request id,
    so a retry adds nothing.
    """
    digest = _body_digest(body, token)
    return _given_request_id(request) or digest, f"http:{digest}"


def ingest_lines_body(run: IngestRun, body: bytes, source: str) -> None:
    """Feed an NDJSON body, a JSON-array body or a JSON-object stream to ``run`` (no commit).

    Units are positioned ``<line>``, ``element <i>`` (``jsonarray.feed_elements``) or ``object <i>``.
    """
    body = body.removeprefix(_UTF8_BOM)
    head = body.lstrip()[:1]
    newline = body.find(b"\n")
    if head == b"[" and starts_record_array(body[:4096]) and not (
            newline >= 0 and arrays_one_per_line(body[:newline + 1], body[newline + 1:newline + 4096])):
        # One array (every element kept whole: the body limit already bounds them); anything after
        # it (arrays one per line, text) makes the body lines, each array line's elements units.
        elements = JsonArrayElements(io.BytesIO(body), len(body), chunk_bytes=max(len(body), 1), keep_after=True)
        values = list(elements)
        if elements.after is None or not elements.after.strip():
            feed_elements(run, elements, source, read=values)
            return
    if head == b"{" and starts_pretty_object(body[:4096]):
        feed_pretty(run, body, source)
        return
    stream = json_object_stream(body) if head == b"{" else None
    if stream is not None:
        objects, end = stream
        feed_values(run, source, objects, "object")
        _feed_lines(run, body[end:], source, body.count(b"\n", 0, end) + 1)
        return
    _feed_lines(run, body, source, 1)


def _feed_lines(run: IngestRun, text: bytes, source: str, first: int) -> None:
    """Each line of ``text`` one unit, positioned by its number (``first`` for the first)."""
    parser = run.parser
    for n, line in enumerate(text.split(b"\n"), start=first):
        run.add(parser.feed_bytes(line, source, str(n)))


def ingest_routes(settings: Settings, session_factory: sessionmaker[Session]) -> list[Route]:
    """Starlette routes ``POST /v1/ingest`` and ``POST /v1/logs`` for the ``draudit run`` server.

    Args:
        settings: token, body limit, line limit, default zone and cluster come from here.
        session_factory: sessions on the migrated store.

    Raises:
        UserError: ``settings.ingest_default_tz`` is not an IANA zone (found at start-up, not per line).
    """
    if settings.ingest_default_tz:
        zone(settings.ingest_default_tz)

    async def guarded(request: Request, path: str, handler: Callable[[Request, str, str], Any],
                      otlp_json: bool | None) -> Response:
        request.state.request_id = _request_id(request)  # the handler sets the body's once read
        try:
            try:
                if request.method != "POST":  # answered here, not by the router, so that it is counted and logged
                    raise HttpProblem(405, f"{request.method} is not accepted on {path}; send the records with POST",
                                      {"Allow": "POST"})
                token = _check_token(request, settings)
                response = await handler(request, request.state.request_id, token)
            except (OperationalError, PoolTimeout) as exc:
                # A pool timeout (every connection busy under load) is as transient as a database down:
                # a 500 is not retried by OTLP exporters (log-formats §3.1), so their batch would be lost.
                log.warning("ingest request %s: database unavailable: %s", request.state.request_id,
                            str(getattr(exc, "orig", None) or exc).splitlines()[0])
                raise HttpProblem(503, "database unavailable; retry later", {"Retry-After": str(RETRY_AFTER_S)}) from None
        except HttpProblem as exc:
            _log_rejection(request, path, exc, observe_request(path, exc.status))
            return _problem(exc, otlp_json, request.state.request_id)
        except Exception:  # noqa: BLE001 - a bug: logged with card numbers masked, answered 500
            # The default handler logs the traceback as is, and an exception's message can quote the
            # body (``int()`` of an attribute value): a card number in it would reach the log.
            request_id = request.state.request_id
            log.error("ingest request %s failed (its transaction rolled back):\n%s", request_id,
                      mask_text(traceback.format_exc())[0])
            observe_request(path, 500)
            return _problem(HttpProblem(500, f"internal error handling request {request_id} (the server log has "
                                             "the details); a retry is deduplicated"), otlp_json, request_id)
        observe_request(path, response.status_code)
        return response

    async def ingest(request: Request, request_id: str, token: str) -> Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        _reject_msgpack(ctype)
        _reject_protobuf(ctype)
        body = await read_body(request, settings.ingest_max_body_bytes)
        request_id, source = _body_ids(request, body, token)
        request.state.request_id = request_id
        _reject_msgpack(ctype, body)
        _reject_protobuf(ctype, body)

        def work() -> dict[str, Any]:
            run = _new_run(settings, session_factory, request_id)
            ingest_lines_body(run, body, source)
            counts = run.finish()
            return {"request_id": request_id, "source": source, **counts.as_dict()}

        return JSONResponse(await run_in_threadpool(work))

    async def logs(request: Request, request_id: str, token: str) -> Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/x-protobuf", "application/json"):
            raise HttpProblem(415, f"Content-Type {ctype or '(none)'!r} is not OTLP; send application/x-protobuf or application/json")
        as_json = ctype == "application/json"
        body = await read_body(request, settings.ingest_max_body_bytes)
        request_id, source = _body_ids(request, body, token)
        request.state.request_id = request_id

        def work() -> tuple[bytes, str]:
            run = _new_run(settings, session_factory, request_id)
            if as_json:
                try:
                    text = body.removeprefix(_UTF8_BOM).decode("utf-8")
                    decoded = decode(text, max_depth=json_depth_limit(DEFAULT_MAX_DEPTH))
                except UnicodeDecodeError:
                    raise HttpProblem(400, "OTLP/JSON body is not UTF-8") from None
                except JsonRejected as exc:
                    raise HttpProblem(400, f"OTLP/JSON body rejected: {exc.reason}") from None
                if decoded.conflicts:
                    raise HttpProblem(400, "OTLP/JSON body has duplicate keys with different values")
                if not isinstance(decoded.value, dict):
                    raise HttpProblem(400, "OTLP/JSON body is not an ExportLogsServiceRequest object")
                misrouted = _misrouted_otlp_json(decoded.value)
                if misrouted:
                    raise HttpProblem(400, misrouted)
                try:
                    records = list(records_from_json(storable(decoded.value, text)))
                except OtlpMalformed as exc:  # the spec: a malformed request is 400, not retried
                    raise HttpProblem(400, f"OTLP/JSON body rejected: {exc.reason}") from None
            else:
                from google.protobuf.message import DecodeError

                try:
                    records = list(records_from_protobuf(body))
                except DecodeError as exc:
                    raise HttpProblem(400, f"protobuf body is not an ExportLogsServiceRequest ({exc})") from None
                except OtlpMalformed as exc:
                    raise HttpProblem(400, f"protobuf body rejected: {exc.reason}") from None
            run.add(run.parser.feed_otlp_records(records, source))
            counts = run.finish()
            message = None
            if counts.quarantined:
                reasons = ", ".join(f"{r} ({n})" for r, n in sorted(counts.reasons.items()))
                message = f"{counts.quarantined} log records quarantined: {reasons} (draudit quarantine --source {source})"
            return export_response(counts.quarantined, message, as_json)

        payload, media = await run_in_threadpool(work)
        return Response(payload, media_type=media)

    async def ingest_endpoint(request: Request) -> Response:
        return await guarded(request, "/v1/ingest", ingest, None)

    async def logs_endpoint(request: Request) -> Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        return await guarded(request, "/v1/logs", logs, ctype != "application/x-protobuf")

    # Every method reaches ``guarded``: a 405 from the router would be neither counted nor logged.
    return [Route("/v1/ingest", ingest_endpoint, methods=_ANY_METHOD),
            Route("/v1/logs", logs_endpoint, methods=_ANY_METHOD)]


def _misrouted_otlp_json(doc: dict[str, Any]) -> str | None:
    """The 400 message for an OTLP/JSON body that is no ``ExportLogsServiceRequest`` but almost
    surely a log record sent to the wrong path: an object with members and no ``resourceLogs``
    (one Fluent Bit / Vector record posted to ``/v1/logs``); None for any other object.

    The OTLP spec (opentelemetry-proto ``docs/specification.md``, "JSON Protobuf Encoding") says
    OTLP/JSON receivers MUST ignore fields with unknown names and unmarshal the message as if they
    were absent; read so, such a body is an empty request, which the server SHOULD answer with
    success ("Full Success": "If the server receives an empty request … SHOULD respond with
    success"). That SHOULD is the one not followed here, deliberately: the unknown-field rule exists
    so that a sender of a newer OTLP version can add fields to a message (spec, "Future Versions and
    Interoperability"), and ``ExportLogsServiceRequest`` has had ``resourceLogs`` as its only field
    since OTLP 1.0 — no OTLP sender of any version sends an object without it but with other
    members (a sender SHOULD NOT even send an empty request: "Empty Telemetry Envelopes"). Answered
    200 ``{}``, the record was lost with nothing stored, quarantined or counted, while the same
    shipper's chunks of two records or more (NDJSON: not one JSON value) were answered 400: the
    misconfiguration showed only now and then. ``{}``, ``{"resourceLogs": []}`` and a request
    with ``resourceLogs`` and unknown members stay accepted, as the spec requires. A
    ``resource_logs`` key (the proto field name, which the spec says is not valid in OTLP/JSON,
    though ``json_format`` accepts it) is named as such.
    """
    if not doc or "resourceLogs" in doc:
        return None
    if "resource_logs" in doc:
        return ("OTLP/JSON body has 'resource_logs' but no 'resourceLogs': OTLP/JSON keys are lowerCamelCase "
                "(opentelemetry-proto docs/specification.md); nothing was stored")
    keys = ", ".join(repr(mask_text(str(k)[:40])[0]) for k in list(doc)[:4]) + (", …" if len(doc) > 4 else "")
    return (f"OTLP/JSON body has no 'resourceLogs' but {keys}: not an ExportLogsServiceRequest but a log record; "
            "send records (JSON lines, a JSON array) to /v1/ingest — a Fluent Bit http output's URI, a Vector "
            "http sink's uri — and OTLP to /v1/logs; nothing was stored")


def _client_address(request: Request) -> str:
    client = request.client
    if client is None:
        return "(unknown)"
    host = f"[{client.host}]" if ":" in client.host else client.host
    return f"{host}:{client.port}"


def _log_rejection(request: Request, path: str, exc: HttpProblem, reason: str | None) -> None:
    """One WARNING line per 4xx answer: path, status, reason, client address, request id and the
    answer's message (card numbers masked, cut to ``_LOGGED_MESSAGE_CHARS``) — never the token
    nor the body. A 5xx is logged where it arises."""
    if reason is None:
        return
    message = mask_text(exc.message)[0]
    if len(message) > _LOGGED_MESSAGE_CHARS:
        message = message[:_LOGGED_MESSAGE_CHARS] + "…"
    log.warning("ingest request rejected: path=%s status=%d reason=%s client=%s request_id=%s: %s",
                path, exc.status, reason, _client_address(request), request.state.request_id, message)


def _problem(exc: HttpProblem, otlp_json: bool | None, request_id: str | None = None) -> Response:
    """Error body: ``{"error": …}`` for /v1/ingest; ``google.rpc.Status`` (JSON or protobuf) for /v1/logs.
    ``X-Request-Id`` names the request as the server log does."""
    headers = {**exc.headers, **({"X-Request-Id": request_id} if request_id else {})}
    if otlp_json is False:
        from google.rpc.status_pb2 import Status

        return Response(Status(code=_grpc_code(exc.status), message=exc.message).SerializeToString(),
                        status_code=exc.status, media_type="application/x-protobuf", headers=headers)
    if otlp_json is True:
        return Response(json.dumps({"code": _grpc_code(exc.status), "message": exc.message}), status_code=exc.status,
                        media_type="application/json", headers=headers)
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)


def _grpc_code(status: int) -> int:
    # google.rpc.Code: INVALID_ARGUMENT 3, UNAUTHENTICATED 16, RESOURCE_EXHAUSTED 8, UNAVAILABLE 14.
    return {400: 3, 401: 16, 413: 8, 415: 3, 503: 14}.get(status, 2)
