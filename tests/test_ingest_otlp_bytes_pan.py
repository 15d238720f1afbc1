"""An OTLP ``bytesValue`` attribute is stored as base64, which hides its digits from the masker that
reads stored text: a card number in it is masked in the bytes before they are encoded."""

from __future__ import annotations

import base64
import json

from sqlalchemy import select, text

from collector.store.models import InferenceRecord
from tests.test_ingest_otlp_malformed import AUTH, _client, _record, _request

PAN = b"4111 1111 1111 1111"


def _stored_attributes(sessions) -> dict:
    with sessions() as s:
        [attrs] = s.execute(select(InferenceRecord.attributes)).scalars().all()
        everything = " ".join(str(v) for row in s.execute(text("SELECT * FROM inference_records")) for v in row)
    assert "4111111111111111" not in everything.replace(" ", "") and base64.b64encode(PAN).decode() not in everything
    return attrs


def test_a_card_number_in_a_json_bytes_value_is_masked(sessions, database_url):
    doc = _request(_record("T-B1", attributes=[
        {"key": "txn_id", "value": {"stringValue": "T-B1"}},
        {"key": "payload", "value": {"bytesValue": base64.b64encode(b"card " + PAN + b" ok").decode()}},
        {"key": "blob", "value": {"bytesValue": base64.b64encode(b"\x08\x01\x12\x13" + PAN.replace(b" ", b"")).decode()}},
        {"key": "plain", "value": {"bytesValue": base64.b64encode(b"\x00\x01hello").decode()}}]))
    r = _client(sessions, database_url).post("/v1/logs", content=json.dumps(doc),
                                             headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    attrs = _stored_attributes(sessions)
    assert base64.b64decode(attrs["payload"]) == b"card 411111******1111 ok"
    assert base64.b64decode(attrs["blob"]) == b"\x08\x01\x12\x13411111******1111"
    assert attrs["plain"] == base64.b64encode(b"\x00\x01hello").decode()  # untouched


def test_a_card_number_in_a_protobuf_bytes_value_is_masked(sessions, database_url):
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    req = ExportLogsServiceRequest()
    lr = req.resource_logs.add().scope_logs.add().log_records.add()
    lr.time_unix_nano = 1796028378000000000
    lr.body.string_value = "scored"
    lr.attributes.extend([KeyValue(key="txn_id", value=AnyValue(string_value="T-B2")),
                          KeyValue(key="payload", value=AnyValue(bytes_value=b"card " + PAN + b" ok"))])
    r = _client(sessions, database_url).post("/v1/logs", content=req.SerializeToString(),
                                             headers={**AUTH, "Content-Type": "application/x-protobuf"})
    assert r.status_code == 200, r.text
    assert base64.b64decode(_stored_attributes(sessions)["payload"]) == b"card 411111******1111 ok"


def test_card_numbers_masked_in_bytes_values_are_counted_once_per_record():
    """``pan_masked`` counts them as it counts a card number in a string: per record that carries
    it (a resource's value is carried by each of its records), quarantined records too."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    from collector.ingest.parser import LineParser

    card = base64.b64encode(b"card " + PAN + b" ok").decode()
    doc = _request(_record("T-B5", attributes=[{"key": "txn_id", "value": {"stringValue": "T-B5"}},
                                               {"key": "payload", "value": {"bytesValue": card}}]))
    doc["resourceLogs"][0]["resource"] = {"attributes": [{"key": "blob", "value": {"bytesValue": card}}]}
    no_txn = _record("ignored", attributes=[{"key": "payload", "value": {"arrayValue": {"values": [
        {"bytesValue": card}, {"kvlistValue": {"values": [{"key": "k", "value": {"bytesValue": card}}]}}]}}}])
    doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"].append(no_txn)
    parser = LineParser(cluster="c")
    stored, quarantined = parser.feed_bytes(json.dumps(doc).encode(), "otel.jsonl", "1")
    assert stored.record is not None and quarantined.record is None
    assert quarantined.reason.startswith("missing-transaction-id")
    assert parser.masker.masked == (1 + 1) + (1 + 2)  # resource + own bytes value; resource + two nested

    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.append(KeyValue(key="blob", value=AnyValue(bytes_value=b"x " + PAN)))
    lr = rl.scope_logs.add().log_records.add()
    lr.time_unix_nano = 1796028378000000000
    lr.attributes.extend([KeyValue(key="txn_id", value=AnyValue(string_value="T-B6")),
                          KeyValue(key="payload", value=AnyValue(bytes_value=PAN.replace(b" ", b"") + b"\x00"))])
    from collector.ingest.otlp import records_from_protobuf

    [record] = records_from_protobuf(req.SerializeToString())
    assert record.bytes_pans_masked == 2
    parser = LineParser(cluster="c")
    [out] = parser.feed_otlp_records([record], "http:req-1")
    assert out.record is not None and parser.masker.masked == 2


def test_an_otlp_time_whose_digits_read_as_a_card_number_is_not_stored_as_a_time():
    from collector.ingest.parser import LineParser

    for time in ("4111111111111111", 4111111111111111):
        line = json.dumps(_request(_record("T-B3", timeUnixNano=time)))
        [out] = LineParser(cluster="c").feed_bytes(line.encode(), "otel.jsonl", "1")
        assert out.record is None
        assert out.reason == "bad-timestamp: OTLP timeUnixNano: its digits read as a card number (PAN), not a time"
        assert "4111111111111111" not in out.raw_text and "411111" in out.raw_text
    # a real time stays a time
    [ok] = LineParser(cluster="c").feed_bytes(json.dumps(_request(_record("T-B4"))).encode(), "otel.jsonl", "1")
    assert ok.record is not None and ok.record.event_time_ns == 1796028378000000000


def test_an_otlp_protobuf_time_whose_digits_read_as_a_card_number_is_rejected():
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    from collector.ingest.otlp import records_from_protobuf

    req = ExportLogsServiceRequest()
    lr = req.resource_logs.add().scope_logs.add().log_records.add()
    lr.time_unix_nano = 4111111111111111
    [record] = records_from_protobuf(req.SerializeToString())
    assert record.problems == ["OTLP timeUnixNano: its digits read as a card number (PAN), not a time"]
