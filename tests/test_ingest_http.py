"""HTTP ingestion: /v1/ingest (Fluent Bit / Vector bodies) and /v1/logs (OTLP/HTTP), on both backends.

Bodies are what the shippers send (docs/shippers.md): Fluent Bit ``format json_lines`` + gzip,
Vector ``codec: json`` (a JSON array), the OpenTelemetry SDK's own OTLP/HTTP log exporter against
a real uvicorn server on a loopback port.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import sessionmaker
from starlette.applications import Starlette
from starlette.testclient import TestClient

from collector.ingest.http import gunzip_limited, HttpProblem, ingest_routes, split_json_array
from collector.settings import Settings
from collector.store import ledger
from collector.store.models import InferenceRecord, Quarantine

DATA = Path(__file__).parent / "data" / "logs"
TOKEN = "s3cr3t-ingest-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make_client(sessions, database_url, **kw) -> TestClient:
    settings = Settings(database_url=database_url, ingest_token=TOKEN, cluster="prod-eu", **kw)
    return TestClient(Starlette(routes=ingest_routes(settings, sessions)))


def count(sessions, model, **where):
    with sessions() as s:
        stmt = select(func.count()).select_from(model)
        for k, v in where.items():
            stmt = stmt.where(getattr(model, k) == v)
        return s.scalar(stmt)


def test_fluentbit_json_lines_gzip_then_retry_is_deduplicated(sessions, database_url):
    client = make_client(sessions, database_url)
    body = gzip.compress((DATA / "fluentbit_merge_log_key.jsonl").read_bytes())
    headers = {**AUTH, "Content-Type": "application/x-ndjson", "Content-Encoding": "gzip", "X-Request-Id": "fb-0001"}
    r = client.post("/v1/ingest", content=body, headers=headers)
    assert r.status_code == 200, r.text
    source = r.json()["source"]  # the body's, whatever the request id (a retry's may differ)
    assert source.startswith("http:body-")
    assert r.json() == {"request_id": "fb-0001", "source": source, "read": 3, "stored": 2, "duplicates": 0,
                        "conflicts": 0, "quarantined": 1, "pan_masked": 0}
    with sessions() as s:
        q = s.execute(select(Quarantine)).scalar_one()
        rec = s.execute(select(InferenceRecord).where(InferenceRecord.transaction_id == "T-000193")).scalar_one()
    assert (q.source, q.position, q.reason.split(":")[0], q.run_id) == (source, "3", "missing-transaction-id", "fb-0001")
    assert (rec.source, rec.position, rec.envelope, rec.pod_uid) == (
        source, "1", "fluentbit", "0f3c2a9e-6a51-4d0e-9d7e-1b2c3d4e5f60")
    again = client.post("/v1/ingest", content=body, headers={**headers, "X-Request-Id": "fb-0002"})
    assert (again.json()["stored"], again.json()["duplicates"]) == (0, 2)
    assert count(sessions, InferenceRecord) == 2


def test_a_retried_body_without_request_id_is_quarantined_once(sessions, database_url):
    """Newcomer: the same body posted again (a shipper's retry, Fluent Bit and Vector send no
    X-Request-Id) added its quarantined lines again (26 -> 36 -> 46). The id now derives from the
    body: a retry counts its lines as before (read = stored + duplicates + quarantined) but stores
    no new quarantine row; another body is a new source. A client's own X-Request-Id names the
    request but not the source (tests/test_http_ingest_rejections.py: a proxy sets a new one per
    attempt)."""
    client = make_client(sessions, database_url)
    body = (DATA / "fluentbit_merge_log_key.jsonl").read_bytes()
    headers = {**AUTH, "Content-Type": "application/x-ndjson"}
    first = client.post("/v1/ingest", content=body, headers=headers).json()
    again = client.post("/v1/ingest", content=gzip.compress(body), headers={**headers, "Content-Encoding": "gzip"}).json()
    assert first["request_id"] == again["request_id"] and first["request_id"].startswith("body-")
    assert (first["read"], first["stored"], first["quarantined"]) == (3, 2, 1)
    assert (again["read"], again["stored"], again["duplicates"], again["quarantined"]) == (3, 0, 2, 1)
    assert count(sessions, Quarantine) == 1
    other = client.post("/v1/ingest", content=body + b"\n", headers=headers).json()
    assert other["request_id"] != first["request_id"]
    named = client.post("/v1/ingest", content=body, headers={**headers, "X-Request-Id": "fb-7"}).json()
    assert named["request_id"] == "fb-7" and named["source"] == f"http:{first['request_id']}"
    card = client.post("/v1/ingest", content=body, headers={**headers, "X-Request-Id": "4111111111111111"}).json()
    assert card["request_id"] == first["request_id"]  # a card number is never echoed nor stored as the source
    assert count(sessions, Quarantine) == 2
    with sessions() as s:
        assert ledger.verify(s).ok


def test_the_body_derived_request_id_is_keyed_and_gives_no_masked_card_number_back(sessions, database_url):
    """A tester's finding: the id was the plain SHA-256 of the body, stored as every row's source;
    for a body holding one card number, stored masked (first 6 / last 4), hashing the stored text
    with each of the 10^6 middles found the number in 0.4 s. The id is now an HMAC under the
    server's ingest token: the same body gets the same id (retries dedupe), another token another."""
    import hashlib
    import hmac

    body = b'{"@timestamp":"2025-06-04T10:15:00Z","decision":"A","message":"no txn here, card 5425233430109903"}\n'
    headers = {**AUTH, "Content-Type": "application/x-ndjson"}
    answer = make_client(sessions, database_url).post("/v1/ingest", content=body, headers=headers).json()
    assert answer["quarantined"] == 1
    expected = "body-" + hmac.new(TOKEN.encode(), body, hashlib.sha256).hexdigest()[:32]
    assert answer["request_id"] == expected != "body-" + hashlib.sha256(body).hexdigest()[:32]
    with sessions() as s:
        [q] = s.execute(select(Quarantine)).scalars().all()
    assert q.source == f"http:{expected}" and "542523******9903" in q.raw_text
    # what the brute force tried: the stored masked text with a middle filled in hashes to no stored value
    candidate = q.raw_text.replace("542523******9903", "5425233430109903").encode() + b"\n"
    assert candidate == body and hashlib.sha256(candidate).hexdigest()[:32] not in q.source
    other = Settings(database_url=database_url, ingest_token="another-token", cluster="prod-eu")
    client = TestClient(Starlette(routes=ingest_routes(other, sessions)))
    again = client.post("/v1/ingest", content=body, headers={**headers, "Authorization": "Bearer another-token"}).json()
    assert again["request_id"].startswith("body-") and again["request_id"] != expected


def test_a_gzip_body_sent_without_content_encoding_is_gunzipped(sessions, database_url):
    """``curl --data-binary @file.jsonl.gz`` sends the gzip bytes with no Content-Encoding: the
    magic bytes tell, and the lines are ingested rather than quarantined as binary noise."""
    client = make_client(sessions, database_url)
    body = gzip.compress((DATA / "fluentbit_merge_log_key.jsonl").read_bytes())
    r = client.post("/v1/ingest", content=body, headers={**AUTH, "Content-Type": "application/gzip",
                                                          "X-Request-Id": "curl-gz"})
    assert r.status_code == 200, r.text
    assert (r.json()["read"], r.json()["stored"], r.json()["quarantined"]) == (3, 2, 1)
    assert count(sessions, InferenceRecord, source=r.json()["source"]) == 2
    truncated = client.post("/v1/ingest", content=body[:-9], headers=AUTH)
    assert truncated.status_code == 400 and "gzip" in truncated.text


def test_vector_json_array_body_elements_are_units(sessions, database_url):
    client = make_client(sessions, database_url)
    events = [json.loads(line) for line in (DATA / "vector.jsonl").read_text().splitlines()]
    body = json.dumps(events[:2] + ["not an object"] + events[2:], indent=1).encode()
    r = client.post("/v1/ingest", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200
    assert r.json()["read"] == 4 and r.json()["stored"] == 2 and r.json()["quarantined"] == 2
    with sessions() as s:
        positions = s.execute(select(Quarantine.position, Quarantine.reason).order_by(Quarantine.id)).all()
        assert ledger.verify(s).ok
    assert [(p, reason.split(":")[0]) for p, reason in positions] == [
        ("element 3", "unparseable"), ("element 4", "missing-transaction-id")]


def test_split_json_array_handles_brackets_in_strings_and_truncation():
    elements, rest = split_json_array(b' [ {"a":"],[{"}, [1,2], "x,y" ] trailing')
    assert elements == [b'{"a":"],[{"}', b"[1,2]", b'"x,y"'] and rest == b"trailing"
    elements, rest = split_json_array(b'[{"a":1},{"b":')
    assert elements == [b'{"a":1}'] and rest == b'{"b":'


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}])
def test_requests_without_the_token_get_401(sessions, database_url, headers):
    client = make_client(sessions, database_url)
    body = (DATA / "vector.jsonl").read_bytes()
    r = client.post("/v1/ingest", content=body, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    r = client.post("/v1/logs", content=b"{}", headers={**headers, "Content-Type": "application/json"})
    assert r.status_code == 401 and r.json()["code"] == 16
    assert count(sessions, InferenceRecord) == 0


def test_no_configured_token_closes_ingestion(sessions, database_url):
    settings = Settings(database_url=database_url)
    client = TestClient(Starlette(routes=ingest_routes(settings, sessions)))
    r = client.post("/v1/ingest", content=b"{}", headers={"Authorization": "Bearer "})
    assert r.status_code == 401 and "no ingest token configured" in r.json()["error"]


def test_oversize_bodies_get_413_compressed_or_not(sessions, database_url):
    client = make_client(sessions, database_url, ingest_max_body_bytes=4096)
    line = (DATA / "vector.jsonl").read_text().splitlines()[0] + "\n"
    big = (line * 4).encode()
    assert client.post("/v1/ingest", content=big, headers=AUTH).status_code == 413
    bomb = gzip.compress(b"{}\n" * 1_000_000)  # 3 MB of content in a few kB
    assert len(bomb) < 4096
    r = client.post("/v1/ingest", content=bomb, headers={**AUTH, "Content-Encoding": "gzip"})
    assert r.status_code == 413 and "decompressed" in r.json()["error"]
    assert count(sessions, InferenceRecord) == 0 and count(sessions, Quarantine) == 0


def test_gunzip_limited_rejects_garbage_and_reads_multi_member():
    assert gunzip_limited(gzip.compress(b"a\n") + gzip.compress(b"b\n"), 100) == b"a\nb\n"
    with pytest.raises(HttpProblem) as exc:
        gunzip_limited(b"\x1f\x8bnot gzip", 100)
    assert exc.value.status == 400


def test_otlp_json_partial_success_reports_quarantined_records(sessions, database_url):
    client = make_client(sessions, database_url)
    body = (DATA / "otlp_logs.json").read_bytes()
    r = client.post("/v1/logs", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert doc["partialSuccess"]["rejectedLogRecords"] == "1"
    assert "missing-transaction-id" in doc["partialSuccess"]["errorMessage"]
    with sessions() as s:
        rec = s.execute(select(InferenceRecord).where(InferenceRecord.transaction_id == "T-000201")).scalar_one()
    assert rec.trace_id == "0af7651916cd43dd8448eb211c80319c" and rec.envelope == "otlp_app"
    # Everything accepted this time (duplicates are accepted, not rejected): empty response.
    body2 = json.dumps({"resourceLogs": [json.loads(body)["resourceLogs"][1]]}).encode()
    r = client.post("/v1/logs", content=gzip.compress(body2),
                    headers={**AUTH, "Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 200 and r.json() == {}


def test_otlp_protobuf_request_and_response(sessions, database_url):
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
    from test_ingest_formats import _to_protobuf

    client = make_client(sessions, database_url)
    body = _to_protobuf(json.loads((DATA / "otlp_logs.json").read_text()))
    r = client.post("/v1/logs", content=body, headers={**AUTH, "Content-Type": "application/x-protobuf"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
    resp = ExportLogsServiceResponse.FromString(r.content)
    assert resp.partial_success.rejected_log_records == 1
    assert count(sessions, InferenceRecord) == 3
    bad = client.post("/v1/logs", content=b"\xff\xff\xff", headers={**AUTH, "Content-Type": "application/x-protobuf"})
    assert bad.status_code == 400
    from google.rpc.status_pb2 import Status

    assert Status.FromString(bad.content).code == 3
    assert client.post("/v1/logs", content=b"x", headers={**AUTH, "Content-Type": "text/plain"}).status_code == 415


def test_database_down_is_503_so_the_shipper_retries(tmp_path):
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    client = make_client(sessionmaker(bind=engine), "postgresql://nobody@127.0.0.1:1/none")
    r = client.post("/v1/ingest", content=(DATA / "vector.jsonl").read_bytes(), headers=AUTH)
    assert r.status_code == 503 and r.headers["retry-after"] == "5"


def test_a_connection_pool_timeout_is_503_so_the_otlp_exporter_retries(sessions, database_url):
    """Every pooled connection busy (concurrent requests serialised on the ledger lock): it was a 500,
    which OTLP exporters never retry, so the batch was lost (a reviewer's finding)."""
    from collector.store.db import make_engine

    engine = make_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=0.3)
    client = make_client(sessionmaker(bind=engine), database_url)
    held = engine.connect()  # the pool's one connection, busy
    try:
        r = client.post("/v1/logs", content=(DATA / "otlp_logs.json").read_bytes(),
                        headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
    finally:
        held.close()
    r = client.post("/v1/logs", content=(DATA / "otlp_logs.json").read_bytes(),
                    headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200
    engine.dispose()


def test_official_otel_sdk_exporter_to_a_real_server(sessions, database_url):
    """opentelemetry-sdk + opentelemetry-exporter-otlp-proto-http → uvicorn on a free loopback port."""
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from collector.server import HttpServer

    settings = Settings(database_url=database_url, ingest_token=TOKEN, cluster="prod-eu")
    server = HttpServer(Starlette(routes=ingest_routes(settings, sessions)), "127.0.0.1", 0)
    server.start()
    try:
        resource = Resource.create({"service.name": "fraud-api", "k8s.namespace.name": "risk-inference",
                                    "k8s.pod.name": "fraud-api-6f5b4-q9z7m", "k8s.container.name": "api",
                                    "k8s.pod.uid": "7d1e4b2a-93c5-4f60-8a1b-2c3d4e5f6a7b"})
        exporter = OTLPLogExporter(endpoint=f"http://127.0.0.1:{server.port}/v1/logs", headers=AUTH,
                                   compression=Compression.Gzip, timeout=10)
        provider = LoggerProvider(resource=resource)
        provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
        logger = provider.get_logger("com.example.fraud.ScoringService")
        tracer = TracerProvider(resource=resource).get_tracer("fraud")
        sent_ns = time.time_ns()
        with tracer.start_as_current_span("score") as span:
            logger.emit(timestamp=sent_ns, severity_text="INFO", body="scored",
                        attributes={"txn_id": "T-SDK-1", "model_name": "fraud_xgb", "model_version": "8",
                                    "decision": "DECLINE", "latency_ms": 11.5})
            trace_id = format(span.get_span_context().trace_id, "032x")
            span_id = format(span.get_span_context().span_id, "016x")
        logger.emit(timestamp=sent_ns + 1000, severity_text="WARN", body="no txn here")
        provider.force_flush()
        provider.shutdown()
    finally:
        server.stop()
    with sessions() as s:
        rec = s.execute(select(InferenceRecord).where(InferenceRecord.transaction_id == "T-SDK-1")).scalar_one()
        quarantined = s.execute(select(Quarantine.reason)).scalars().all()
    assert (rec.event_time_ns, rec.event_time_precision_ns, rec.decision, rec.latency_ms) == (sent_ns, 1, "DECLINE", 11.5)
    assert (rec.trace_id, rec.span_id) == (trace_id, span_id)
    assert (rec.pod_uid, rec.pod_uid_source, rec.container_name) == ("7d1e4b2a-93c5-4f60-8a1b-2c3d4e5f6a7b", "envelope", "api")
    assert (rec.envelope, rec.source_format, rec.cluster) == ("otlp_app", "otlp", "prod-eu")
    assert [q.split(":")[0] for q in quarantined] == ["missing-transaction-id"]


def test_one_out_of_range_value_quarantines_its_line_not_the_request(sessions, database_url):
    """A shipper retrying a 500 forever would never store the chunk's valid lines. (A latency beyond a
    double keeps its transaction, the latency as text in the attributes.)"""
    client = make_client(sessions, database_url)
    good = '{"@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-%d","decision":"APPROVE"}'
    body = "\n".join([good % 1, '{"@timestamp":"9999-12-31T23:59:59.999999999Z","txn_id":"T-X"}',
                      '{"@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-Y","latency_ms":1' + "0" * 400 + "}", good % 2])
    r = client.post("/v1/ingest", content=body.encode(), headers=AUTH)
    assert r.status_code == 200, r.text
    assert {k: r.json()[k] for k in ("read", "stored", "quarantined")} == {"read": 4, "stored": 3, "quarantined": 1}
    otlp = {"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"timeUnixNano": "10000000000000000000", "attributes": [{"key": "txn_id", "value": {"stringValue": "T-Z"}}]},
        {"timeUnixNano": "1741083300000000000", "attributes": [{"key": "txn_id", "value": {"stringValue": "T-3"}}]}]}]}]}
    r = client.post("/v1/logs", content=json.dumps(otlp), headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["partialSuccess"]["rejectedLogRecords"] == "1"
    assert count(sessions, InferenceRecord) == 4


def _fluentbit_records() -> list[dict]:
    return [json.loads(line) for line in (DATA / "fluentbit_merge_log_key.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("content_type", ["application/msgpack", "application/x-msgpack", None])
def test_a_msgpack_body_gets_415_naming_the_fluent_bit_setting(sessions, database_url, content_type):
    """Older Fluent Bit releases default the http output to msgpack: [time, record] arrays."""
    client = make_client(sessions, database_url)
    # msgpack of [1741083300, {"log": "x"}]: fixarray(2), uint32, fixmap(1), fixstr "log", fixstr "x"
    body = b"\x92\xce\x67\xc6\xd2\x24\x81\xa3log\xa1x"
    headers = {**AUTH, "Content-Type": content_type} if content_type else AUTH
    r = client.post("/v1/ingest", content=gzip.compress(body), headers={**headers, "Content-Encoding": "gzip"})
    assert r.status_code == 415, r.text
    assert "Format json_lines" in r.json()["error"]
    assert count(sessions, Quarantine) == 0 and count(sessions, InferenceRecord) == 0


@pytest.mark.parametrize("content_type", ["application/x-protobuf", "application/octet-stream", None])
def test_an_otlp_protobuf_body_sent_to_v1_ingest_gets_415_naming_v1_logs(sessions, database_url, content_type):
    """An otlphttp exporter whose logs endpoint names the wrong path: read as lines, the request was
    81 junk quarantine rows answered 200, the batch lost as delivered (breaker's finding)."""
    from test_ingest_formats import _to_protobuf

    client = make_client(sessions, database_url)
    body = _to_protobuf(json.loads((DATA / "otlp_logs.json").read_text()))
    headers = {**AUTH, "Content-Type": content_type} if content_type else AUTH
    for content, extra in ((body, {}), (gzip.compress(body), {"Content-Encoding": "gzip"})):
        r = client.post("/v1/ingest", content=content, headers={**headers, **extra})
        assert r.status_code == 415, r.text
        assert "send OTLP to /v1/logs" in r.json()["error"]
    assert count(sessions, Quarantine) == 0 and count(sessions, InferenceRecord) == 0


def test_fluent_bit_json_stream_objects_back_to_back_are_units(sessions, database_url):
    """``Format json_stream``: one JSON object per record with nothing between them."""
    client = make_client(sessions, database_url)
    records = _fluentbit_records()
    body = "".join(json.dumps(r, separators=(",", ":")) for r in records) + ' {"half":'
    r = client.post("/v1/ingest", content=body.encode(), headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert {k: r.json()[k] for k in ("read", "stored", "quarantined")} == {"read": 4, "stored": 2, "quarantined": 2}
    with sessions() as s:
        positions = s.execute(select(Quarantine.position, Quarantine.reason).order_by(Quarantine.id)).all()
    # the cut object after the last one: the rest of its line, line 1 (as text after objects is read)
    assert [(p, reason.split(":")[0]) for p, reason in positions] == [
        ("object 3", "missing-transaction-id"), ("1", "unparseable")]


def test_a_pretty_printed_body_is_one_unit_per_object(sessions, database_url):
    """A script posting ``jq .`` output: read line by line, each of its lines was a junk quarantine row."""
    client = make_client(sessions, database_url)
    records = _fluentbit_records()
    body = "\n".join(json.dumps(r, indent=4) for r in records)
    r = client.post("/v1/ingest", content=body.encode(), headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    # the same three records as in the json_stream test: two scored, one start-up line without an id
    assert {k: r.json()[k] for k in ("read", "stored", "quarantined")} == {"read": 3, "stored": 2, "quarantined": 1}
    with sessions() as s:
        positions = s.execute(select(InferenceRecord.position).order_by(InferenceRecord.id)).scalars().all()
    assert positions == ["object 1", "object 2"]


def _post_body(sessions, database_url: str, body: str) -> tuple[dict, list[tuple[str, str]]]:
    """POST ``body`` to /v1/ingest: its read/stored/quarantined counts, and (position, transaction id)
    of the stored records in id order."""
    r = make_client(sessions, database_url).post("/v1/ingest", content=body.encode(),
                                                 headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    with sessions() as s:
        stored = s.execute(select(InferenceRecord.position, InferenceRecord.transaction_id).order_by(InferenceRecord.id)).all()
    return {k: r.json()[k] for k in ("read", "stored", "quarantined")}, [tuple(row) for row in stored]


def _ecs(txn: str, **fields: str) -> str:
    """A Spring Boot ECS decision line of transaction ``txn``."""
    return json.dumps({"@timestamp": "2025-06-04T10:15:00.067Z", "txn_id": txn, "decision": "APPROVE",
                       "message": "scored", **fields})


def test_a_body_of_text_lines_and_array_lines_is_read_line_by_line(sessions, database_url):
    """A body starting with ``[`` was read as one array: a Logback ``[main]`` first line lost every
    record after it, and of arrays one per line only the first was read."""
    ecs = _ecs
    body = f"[main] INFO o.s.b.StartupInfoLogger - Starting\n{ecs('L-1')}\n[{ecs('L-2')},{ecs('L-3')}]\n[{ecs('L-4')}]\n"
    counts, stored = _post_body(sessions, database_url, body)
    assert counts == {"read": 5, "stored": 4, "quarantined": 1}
    assert stored == [("2", "L-1"), ("3 element 1", "L-2"), ("3 element 2", "L-3"), ("4 element 1", "L-4")]
    with sessions() as s:
        assert s.execute(select(Quarantine.position)).scalars().all() == ["1"]


def test_an_array_line_of_a_body_over_the_line_limit_is_read_record_by_record(sessions, database_url):
    """Arrays one per line after a text line: a batch line of 800 records (~150 KB, over the 64 KiB
    line limit) is held to the body limit, its records to the line limit; it was one
    ``line-too-long`` unit and its records were never read."""
    batch = "[" + ",".join(_ecs(f"HB-{i}", model_name="fraud_xgb", model_version="7") for i in range(1, 801)) + "]"
    assert len(batch) > 65536
    counts, stored = _post_body(sessions, database_url, f"[main] INFO o.s.b.StartupInfoLogger - Starting\n{batch}\n")
    assert counts == {"read": 801, "stored": 800, "quarantined": 1}
    assert (stored[0], stored[-1]) == (("2 element 1", "HB-1"), ("2 element 800", "HB-800"))


def test_a_body_whose_first_array_line_is_broken_loses_only_that_line(sessions, database_url):
    """Arrays one per line whose first is cut short: the body was read as one unterminated array,
    every later line lost in its tail, and the answer was 200."""
    first = "[" + ",".join(_ecs(f"BB-{i}") for i in range(1, 4))  # no closing bracket
    body = f"{first}\n[{_ecs('BB-4')},{_ecs('BB-5')}]\n[{_ecs('BB-6')}]\n"
    counts, stored = _post_body(sessions, database_url, body)
    assert counts == {"read": 4, "stored": 3, "quarantined": 1}
    assert stored == [("2 element 1", "BB-4"), ("2 element 2", "BB-5"), ("3 element 1", "BB-6")]


def test_split_json_stream_handles_braces_in_strings_and_separators():
    from collector.ingest.jsonarray import split_json_stream

    values, rest = split_json_stream(b'{"a":"}{"} {"b":[{}]}\r\n{"c":1}')
    assert values == [b'{"a":"}{"}', b'{"b":[{}]}', b'{"c":1}'] and rest is None
    values, rest = split_json_stream(b'{"a":1}{"b":2} garbage {"c":3}')
    assert values == [b'{"a":1}', b'{"b":2}'] and rest == b'garbage {"c":3}'


def test_a_body_starting_with_a_byte_order_mark_is_read(sessions, database_url):
    client = make_client(sessions, database_url)
    events = [json.loads(line) for line in (DATA / "vector.jsonl").read_text().splitlines()]
    body = b"\xef\xbb\xbf" + json.dumps(events).encode()
    r = client.post("/v1/ingest", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert (r.status_code, r.json()["read"], r.json()["stored"]) == (200, 3, 2)
