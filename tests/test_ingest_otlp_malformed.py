"""A malformed OTLP request is refused (HTTP 400) or quarantined (a file) with the member named, never dropped.

Before: ``{"resourceLogs":5}`` posted to ``/v1/logs`` answered ``200 {}`` and ``draudit ingest`` of
``{"resourceLogs":[{"scopeLogs":"x"}]}`` said read 0, quarantined 0, exit 0 — every member of the
wrong type was read as empty. OTLP/HTTP (opentelemetry-proto ``docs/specification.md``, "Failures"):
a malformed request is answered 400 and not retried. A file holding one is one quarantined unit,
so ``read = stored + duplicates + quarantined`` still shows it.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import select
from starlette.applications import Starlette
from starlette.testclient import TestClient

from collector.cli import cli
from collector.ingest.http import ingest_routes
from collector.ingest.otlp import OtlpMalformed, records_from_json, records_from_protobuf
from collector.ingest.pipeline import IngestRun
from collector.settings import Settings
from collector.store.models import InferenceRecord, Quarantine

TOKEN = "dev-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TIME = "1796028378000000000"  # 2026-11-30T08:46:18Z


def _record(txn: str, **fields) -> dict:
    return {"timeUnixNano": TIME, "body": {"stringValue": "scored"},
            "attributes": [{"key": "txn_id", "value": {"stringValue": txn}}], **fields}


def _request(*records: dict) -> dict:
    return {"resourceLogs": [{"resource": {"attributes": [{"key": "k8s.pod.name", "value": {"stringValue": "p"}}]},
                              "scopeLogs": [{"scope": {"name": "fraud"}, "logRecords": list(records)}]}]}


MALFORMED = [
    ({"resourceLogs": 5}, "resourceLogs: not an array but a number"),
    ({"resourceLogs": [{"scopeLogs": "x"}]}, "resourceLogs[0].scopeLogs: not an array but a string"),
    ({"resourceLogs": [None]}, "resourceLogs[0]: null is not a ResourceLogs"),
    ({"resourceLogs": [{"resource": []}]}, "resourceLogs[0].resource: not an object but an array"),
    ({"resourceLogs": [{"scopeLogs": [{"logRecords": {"a": 1}}]}]},
     "resourceLogs[0].scopeLogs[0].logRecords: not an array but an object"),
    (_request(_record("T-1"), 7), "resourceLogs[0].scopeLogs[0].logRecords[1]: not an object but a number"),
    (_request(_record("T-1", body="scored")), "resourceLogs[0].scopeLogs[0].logRecords[0].body: not an object but a string"),
    (_request(_record("T-1", attributes={"txn_id": "T-1"})),
     "resourceLogs[0].scopeLogs[0].logRecords[0].attributes: not an array but an object"),
    (_request(_record("T-1", attributes=[{"key": "k", "value": {"arrayValue": {"values": [{"kvlistValue": {
        "values": [{"key": 3}]}}]}}}])),
     "resourceLogs[0].scopeLogs[0].logRecords[0].attributes[0].value.arrayValue.values[0].kvlistValue.values[0].key: "
     "not a string"),
]


@pytest.mark.parametrize("doc, reason", MALFORMED)
def test_the_reason_names_the_member_of_the_wrong_type(doc, reason):
    with pytest.raises(OtlpMalformed) as caught:
        records_from_json(doc)
    assert caught.value.reason == f"malformed-otlp: {reason}"


@pytest.mark.parametrize("doc", [{"resourceLogs": []}, {"resourceLogs": None}, {"resourceLogs": [{}]},
                                 _request(_record("T-1", body=None, attributes=None)),
                                 _request(_record("T-1", unknownField={"x": 1}))])
def test_empty_null_and_unknown_members_are_well_formed(doc):
    records_from_json(doc)  # null is a field's default (proto3 JSON); unknown fields are ignored


def _client(sessions, database_url) -> TestClient:
    settings = Settings(database_url=database_url, ingest_token=TOKEN, cluster="prod-eu")
    return TestClient(Starlette(routes=ingest_routes(settings, sessions)))


def _rows(sessions):
    with sessions() as s:
        return (s.execute(select(InferenceRecord.transaction_id)).scalars().all(),
                s.execute(select(Quarantine.position, Quarantine.reason, Quarantine.raw_text)).all())


@pytest.mark.parametrize("doc, reason", MALFORMED[:2] + MALFORMED[5:6])
def test_http_otlp_json_malformed_request_is_400_naming_the_member(sessions, database_url, doc, reason):
    r = _client(sessions, database_url).post("/v1/logs", content=json.dumps(doc),
                                             headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json() == {"code": 3, "message": f"OTLP/JSON body rejected: malformed-otlp: {reason}"}
    assert _rows(sessions) == ([], [])  # nothing of a refused request is stored: the client must not retry it


def test_http_otlp_protobuf_field_of_the_wrong_wire_type_is_400(sessions, database_url):
    from google.rpc.status_pb2 import Status

    client = _client(sessions, database_url)
    headers = {**AUTH, "Content-Type": "application/x-protobuf"}
    # field 1 (resource_logs, a message: length-delimited) sent as the varint 5; the protobuf runtime
    # keeps it as an unknown field and decodes an empty request
    r = client.post("/v1/logs", content=b"\x08\x05", headers=headers)
    assert r.status_code == 400
    assert Status.FromString(r.content).message == (
        "protobuf body rejected: malformed-otlp: resourceLogs: field 1 (resource_logs) came with protobuf wire "
        "type 0 (varint), which its type does not use")
    # an unknown field number stays allowed (a newer sender); an empty request is well-formed
    assert client.post("/v1/logs", content=b"\xa0\x06\x01", headers=headers).status_code == 200
    assert list(records_from_protobuf(b"")) == []


def test_a_malformed_otlp_file_is_quarantined_and_counted(sessions, engine, database_url, tmp_path):
    runner = CliRunner()
    url = ["--database-url", database_url]
    doc = tmp_path / "o.json"
    doc.write_text(json.dumps({"resourceLogs": [{"scopeLogs": "x"}]}, indent=2))  # one pretty-printed document
    result = runner.invoke(cli, ["ingest", str(doc), *url, "--output", "json"])
    assert result.exit_code == 1  # read, none stored
    counts = json.loads(result.stdout)
    assert {k: counts[k] for k in ("read", "stored", "quarantined")} == {"read": 1, "stored": 0, "quarantined": 1}
    lines = tmp_path / "otel-file-exporter.jsonl"  # the collector's file exporter: one request per line
    lines.write_text(json.dumps(_request(_record("T-OK"))) + "\n" + json.dumps(MALFORMED[5][0]) + "\n")
    run = IngestRun(sessions, Settings(database_url=database_url, cluster="prod-eu"))
    with open(lines, "rb") as f:
        run.ingest_stream(f, str(lines))
    counts = run.finish()
    assert (counts.read, counts.stored, counts.quarantined) == (2, 1, 1) and counts.reconciles
    stored, quarantined = _rows(sessions)
    assert stored == ["T-OK"]
    assert sorted(((q.position or ""), q.reason) for q in quarantined) == [
        ("2", f"malformed-otlp: {MALFORMED[5][1]}"),
        ("document", "malformed-otlp: resourceLogs[0].scopeLogs: not an array but a string"),  # the whole document
    ]
    assert any('"scopeLogs":"x"' in q.raw_text for q in quarantined)


@pytest.mark.parametrize("field, value", [("timeUnixNano", "abc"), ("timeUnixNano", -5), ("timeUnixNano", 1.5e18)])
def test_an_unreadable_otlp_time_is_a_bad_timestamp_not_a_missing_one(field, value):
    from collector.ingest.parser import LineParser

    (out,) = LineParser().feed_otlp_records(records_from_json(_request(_record("T-T", **{field: value}))), "http:x")
    assert out.reason == f"bad-timestamp: OTLP {field} {value!r} is not a whole number of nanoseconds since the epoch"
    (ok,) = LineParser().feed_otlp_records(records_from_json(_request(_record("T-T", timeUnixNano=int(TIME)))), "http:x")
    assert ok.record is not None and ok.record.event_time_ns == int(TIME)


@pytest.mark.parametrize("value, problem", [
    ("2026-11-30T08:46:18Z", "OTLP observedTimeUnixNano '2026-11-30T08:46:18Z' is not a whole number of nanoseconds since the epoch"),
    ("4111111111111111", "OTLP observedTimeUnixNano: its digits read as a card number (PAN), not a time")])
def test_an_unreadable_observed_time_is_dropped_with_a_warning_not_the_record(value, problem):
    """The observed time is the collector's receive time, not the event's: unreadable (or a card
    number), it is dropped with a warning and the record stored; the raw view keeps no card number."""
    from collector.ingest.parser import LineParser

    parser = LineParser()
    (out,) = parser.feed_otlp_records(records_from_json(_request(_record("T-O", observedTimeUnixNano=value))), "http:x")
    assert out.record is not None and out.record.event_time_ns == int(TIME)
    assert out.record.attributes["draudit.warnings"] == [f"{problem}; dropped"]
    assert "envelope.observed_time_ns" not in out.record.attributes
    assert "4111111111111111" not in json.dumps(out.record.attributes)


def _surrogate_request() -> str:
    """An OTLP/JSON request whose first record's body and an attribute key hold lone surrogate
    escapes (\\ud800, \\udfff: valid JSON, no Unicode text), pretty-printed as a file exporter may."""
    bad = _record("T-SUR-1", body={"stringValue": "x\ud800y"})
    bad["attributes"].append({"key": "k\udfff", "value": {"stringValue": "v"}})
    return json.dumps(_request(bad, _record("T-SUR-2")), indent=2)  # json.dumps writes them as escapes


def test_lone_surrogates_in_an_otlp_document_are_replaced_not_a_crash(sessions, database_url, tmp_path):
    """A tester's finding: an OTLP/JSON document (a file read whole, or a POST /v1/logs body) with a
    lone surrogate escape crashed the ingest with a traceback (orjson refuses the string) and the
    request answered 500, losing the valid record beside it. As in a JSON line, each becomes "?"."""
    text = _surrogate_request()
    assert "\\ud800" in text and "\\udfff" in text
    doc = tmp_path / "otel.json"
    doc.write_text(text)
    result = CliRunner().invoke(cli, ["ingest", str(doc), "--database-url", database_url, "--output", "json"])
    assert result.exit_code == 0, result.output
    assert {k: json.loads(result.stdout)[k] for k in ("read", "stored", "quarantined")} == {
        "read": 2, "stored": 2, "quarantined": 0}
    with sessions() as s:
        attrs = dict(s.execute(select(InferenceRecord.transaction_id, InferenceRecord.attributes)).all())
    assert attrs["T-SUR-1"]["message"] == "x?y" and attrs["T-SUR-1"]["k?"] == "v"

    r = _client(sessions, database_url).post("/v1/logs", content=text.replace("T-SUR", "T-HTTP"),
                                             headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    stored, _ = _rows(sessions)
    assert sorted(t for t in stored if t.startswith("T-HTTP")) == ["T-HTTP-1", "T-HTTP-2"]


def test_otlp_attribute_keys_given_twice_with_different_values_are_quarantined():
    """A tester's finding: an OTLP record whose attributes repeat ``txn_id`` (T-A, then T-B) and
    ``decision`` was stored as T-B / DECLINE, silently; the same JSON line is quarantined as
    ``duplicate-key``. The OTLP data model requires unique keys; a record that breaks it with two
    values is quarantined (JSON and protobuf alike), one that repeats the same value is stored."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue, KeyValueList

    from collector.ingest.otlp import records_from_protobuf
    from collector.ingest.parser import LineParser

    def kv(key, value):
        return {"key": key, "value": {"stringValue": value}}

    twice = _record("T-A", attributes=[kv("txn_id", "T-A"), kv("decision", "APPROVE"), kv("decision", "DECLINE"),
                                       kv("txn_id", "T-B")])
    same = _record("T-C", attributes=[kv("txn_id", "T-C"), kv("decision", "APPROVE"), kv("decision", "APPROVE")])
    nested = _record("T-D", attributes=[kv("txn_id", "T-D"), {"key": "req", "value": {"kvlistValue": {"values": [
        kv("amount", "12"), kv("amount", "13")]}}}])
    doc = _request(twice, same, nested)
    doc["resourceLogs"][0]["resource"]["attributes"] += [kv("k8s.pod.uid", "a"), kv("k8s.pod.uid", "b")]
    one_resource = _request(same)
    parser = LineParser(cluster="c")
    out = parser.feed_bytes(json.dumps(doc).encode(), "otel.jsonl", "1")
    assert [o.reason for o in out] == [
        "duplicate-key: OTLP attribute 'resource.k8s.pod.uid', 'decision', 'txn_id' appears twice with different values",
        "duplicate-key: OTLP attribute 'resource.k8s.pod.uid' appears twice with different values",
        "duplicate-key: OTLP attribute 'resource.k8s.pod.uid', 'req.amount' appears twice with different values"]
    [ok] = parser.feed_bytes(json.dumps(one_resource).encode(), "otel.jsonl", "2")
    assert ok.record is not None and ok.record.transaction_id == "T-C" and ok.record.decision == "APPROVE"

    req = ExportLogsServiceRequest()
    lr = req.resource_logs.add().scope_logs.add().log_records.add()
    lr.time_unix_nano = int(TIME)
    lr.attributes.extend([KeyValue(key="txn_id", value=AnyValue(string_value="T-E")),
                          KeyValue(key="decision", value=AnyValue(string_value="APPROVE")),
                          KeyValue(key="m", value=AnyValue(kvlist_value=KeyValueList(values=[
                              KeyValue(key="x", value=AnyValue(int_value=1)),
                              KeyValue(key="x", value=AnyValue(int_value=2))])))])
    [record] = records_from_protobuf(req.SerializeToString())
    assert record.duplicate_keys == ["m.x"]
    [refused] = LineParser(cluster="c").feed_otlp_records([record], "http:r1")
    assert refused.reason == "duplicate-key: OTLP attribute 'm.x' appears twice with different values"


def _nested_map(levels: int) -> dict:
    """An OTLP ``AnyValue`` map nested ``levels`` deep, a string at the bottom."""
    value: dict = {"stringValue": "bottom"}
    for i in range(levels):
        value = {"kvlistValue": {"values": [{"key": f"l{i}", "value": value}]}}
    return value


def test_otlp_json_nesting_is_limited_per_record_not_by_the_requests_own_levels(sessions, database_url, tmp_path):
    """A tester's finding: the OTLP/JSON encoding spends 4 JSON levels per map level (and 10 on the
    request), so the 64-level JSON limit refused a whole request — 400, which a collector does not
    retry, the good records lost — for a map 14 deep, which a JSON line or protobuf carries. The
    limit now holds per record on its values: a record 14 deep is stored, one deeper than 64 is
    quarantined alone as nesting-too-deep, JSON line, document and HTTP alike."""
    from collector.ingest.parser import LineParser

    ok14 = _record("T-N14", attributes=[{"key": "txn_id", "value": {"stringValue": "T-N14"}},
                                        {"key": "deep", "value": _nested_map(14)}])
    too_deep = _record("T-N70", attributes=[{"key": "txn_id", "value": {"stringValue": "T-N70"}},
                                            {"key": "deep", "value": _nested_map(70)}])
    good = _record("T-GOOD")
    doc = _request(ok14, too_deep, good)
    out = LineParser(cluster="c").feed_bytes(json.dumps(doc).encode(), "otel.jsonl", "1")
    assert [o.record.transaction_id if o.record else o.reason for o in out] == [
        "T-N14", "nesting-too-deep: OTLP record value nested 71 levels, over the limit of 64", "T-GOOD"]

    r = _client(sessions, database_url).post("/v1/logs", content=json.dumps(doc),
                                             headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["partialSuccess"]["rejectedLogRecords"] in (1, "1")
    stored, quarantined = _rows(sessions)
    assert sorted(stored) == ["T-GOOD", "T-N14"]
    assert [q.reason.split(":")[0] for q in quarantined] == ["nesting-too-deep"]

    path = tmp_path / "otel.json"
    path.write_text(json.dumps(_request(ok14, good), indent=1).replace("T-", "T-F"))
    result = CliRunner().invoke(cli, ["ingest", str(path), "--database-url", database_url, "--output", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["stored"] == 2, result.output


_VALUE_PATH = "resourceLogs[0].scopeLogs[0].logRecords[0].attributes[1].value"


def _attr(value: dict) -> dict:
    record = _record("T-V")
    record["attributes"].append({"key": "fraud.flagged", "value": value})
    return _request(record)


@pytest.mark.parametrize("value, reason", [
    # proto3 JSON takes only true/false: "false" read as a truth value was stored as true
    ({"boolValue": "false"}, f"{_VALUE_PATH}.boolValue: a string that proto3 JSON does not read as a boolean (true or false)"),
    ({"intValue": "abc"}, f"{_VALUE_PATH}.intValue: a string that proto3 JSON does not read as a 64-bit integer "
                          "(a number or a decimal string)"),
    # str.isdigit() is true for superscripts, which int() refuses: a ValueError answered 500, batch lost
    ({"intValue": "\u00b2"}, f"{_VALUE_PATH}.intValue: a string that proto3 JSON does not read as a 64-bit integer "
                             "(a number or a decimal string)"),
    ({"intValue": "--5"}, f"{_VALUE_PATH}.intValue: a string that proto3 JSON does not read as a 64-bit integer "
                          "(a number or a decimal string)"),
    ({"intValue": str(2**63)}, f"{_VALUE_PATH}.intValue: a string that proto3 JSON does not read as a 64-bit integer "
                               "(a number or a decimal string)"),
    ({"doubleValue": "abc"}, f"{_VALUE_PATH}.doubleValue: a string that proto3 JSON does not read as a double "
                             "(a number, its text, NaN or Infinity)"),
    ({"bytesValue": 123}, f"{_VALUE_PATH}.bytesValue: a number that proto3 JSON does not read as a base64 string"),
    ({"stringValue": "a", "intValue": "5"}, f"{_VALUE_PATH}: sets stringValue and intValue; an AnyValue holds one of them"),
])
def test_an_any_value_of_the_wrong_type_is_refused_naming_it(value, reason):
    with pytest.raises(OtlpMalformed) as caught:
        records_from_json(_attr(value))
    assert caught.value.reason == f"malformed-otlp: {reason}"


@pytest.mark.parametrize("value, read", [
    ({"boolValue": False}, False), ({"intValue": "-42"}, -42), ({"intValue": 7}, 7), ({"intValue": 5.0}, 5),
    ({"doubleValue": "1.5"}, 1.5), ({"doubleValue": "NaN"}, "nan"), ({"doubleValue": 2}, 2.0),
    ({"stringValue": None, "intValue": "3"}, 3),  # null is the field's default: intValue is the kind set
])
def test_well_typed_any_values_are_read_as_proto3_json_says(value, read):
    (record,) = records_from_json(_attr(value))
    assert record.attributes["fraud.flagged"] == read


@pytest.mark.parametrize("fields, member", [
    ({"severityNumber": "warn"}, "severityNumber: neither a 32-bit integer nor a SEVERITY_NUMBER_* name"),
    ({"severityNumber": 2**40}, "severityNumber: neither a 32-bit integer nor a SEVERITY_NUMBER_* name"),
    ({"flags": "x"}, "flags: not a 32-bit unsigned integer"),
    ({"flags": -1}, "flags: not a 32-bit unsigned integer"),
])
def test_record_scalars_of_the_wrong_type_are_refused(fields, member):
    with pytest.raises(OtlpMalformed) as caught:
        records_from_json(_request(_record("T-S", **fields)))
    assert caught.value.reason == f"malformed-otlp: resourceLogs[0].scopeLogs[0].logRecords[0].{member}"


def test_a_severity_number_given_by_its_enum_name_is_its_number():
    (record,) = records_from_json(_request(_record("T-S", severityNumber="SEVERITY_NUMBER_WARN", flags="1")))
    assert (record.severity_number, record.flags) == (13, 1)
    (record,) = records_from_json(_request(_record("T-S", flags=1.0)))  # orjson reads 1.0 as a float
    assert record.flags == 1


def test_a_superscript_time_is_a_bad_timestamp_and_its_digits_are_not_echoed():
    from collector.ingest.parser import LineParser

    doc = _request(_record("T-T", timeUnixNano="4111111111111111\u00b2"))
    (out,) = LineParser().feed_otlp_records(records_from_json(doc), "http:x")
    assert out.reason.startswith("bad-timestamp: OTLP timeUnixNano")
    assert "4111111111111111" not in out.reason


def test_http_wrong_typed_value_is_400_and_a_bug_is_a_masked_500(sessions, database_url, monkeypatch, caplog):
    client = _client(sessions, database_url)
    headers = {**AUTH, "Content-Type": "application/json"}
    r = client.post("/v1/logs", content=json.dumps(_attr({"intValue": "4111111111111111\u00b2"})), headers=headers)
    assert r.status_code == 400 and "intValue" in r.json()["message"]
    assert _rows(sessions) == ([], [])

    # Any unexpected exception: 500, and the log has the traceback with card numbers masked.
    import collector.ingest.http as http

    def broken(*_a, **_k):
        raise ValueError("invalid literal for int() with base 10: '4111111111111111\u00b2'")

    monkeypatch.setattr(http, "records_from_json", broken)
    with caplog.at_level("ERROR", logger="collector.ingest.http"):
        r = client.post("/v1/logs", content=json.dumps(_request(_record("T-B"))), headers=headers)
    assert r.status_code == 500
    assert r.json()["message"].startswith("internal error handling request ")
    assert "ValueError" in caplog.text and "411111******1111" in caplog.text
    assert "4111111111111111" not in caplog.text and "4111111111111111" not in r.text
    assert _rows(sessions) == ([], [])


def test_nul_in_an_otlp_protobuf_string_is_stored_as_a_replacement_character(sessions, database_url):
    """PostgreSQL refuses NUL in text and jsonb: a protobuf body with one answered 500 and lost its batch."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

    req = ExportLogsServiceRequest()
    scope_logs = req.resource_logs.add().scope_logs.add()
    scope_logs.scope.name = "fraud\x00"
    scope_logs.log_records.append(LogRecord(
        time_unix_nano=int(TIME), body=AnyValue(string_value="Transaction scored\x00\x00"), severity_text="INFO\x00",
        attributes=[KeyValue(key="txn_id", value=AnyValue(string_value="T-NUL")),
                    KeyValue(key="k\x00", value=AnyValue(string_value="v"))]))
    r = _client(sessions, database_url).post("/v1/logs", content=req.SerializeToString(),
                                             headers={**AUTH, "Content-Type": "application/x-protobuf"})
    assert r.status_code == 200, r.content
    with sessions() as s:
        (attributes,) = s.execute(select(InferenceRecord.attributes)).scalars().all()
    text = json.dumps(attributes)
    assert "\\u0000" not in text and "Transaction scored\ufffd\ufffd" in json.dumps(attributes, ensure_ascii=False)


@pytest.mark.parametrize("time_field", [{"timeUnixNano": "0"}, {}], ids=["zero", "absent"])
def test_a_record_with_only_an_observed_time_is_quarantined_saying_why(time_field):
    """log-formats.md §7.1: the observed time goes to observed_time_ns only — a collector's receive
    time, on its node's clock, would place the transaction on a GPU it may have left. The reason
    says that, instead of "the envelope has no timestamp"."""
    from collector.ingest.parser import LineParser

    record = {k: v for k, v in _record("T-OBS").items() if k != "timeUnixNano"} | time_field
    (out,) = LineParser().feed_otlp_records(records_from_json(_request(record | {"observedTimeUnixNano": TIME})), "h")
    assert out.reason.startswith("missing-event-time: the OTLP record has no timeUnixNano and its body no timestamp; "
                                 "its observedTimeUnixNano is when a collector saw it")
    (plain,) = LineParser().feed_otlp_records(records_from_json(_request(record)), "h")
    assert plain.reason == "missing-event-time: neither the application line nor the envelope has a timestamp"


def test_numbers_too_long_for_python_are_refused_not_a_crash(sessions, database_url, tmp_path):
    """A JSON integer of more than 4300 digits raised ValueError in the decoder (Python's int limit),
    a 400-digit one as doubleValue OverflowError: a traceback for a file, a 500 for the whole batch."""
    headers = {**AUTH, "Content-Type": "application/json"}
    client = _client(sessions, database_url)
    huge = "9" * 5000
    body = json.dumps(_attr({"intValue": 1})).replace('"intValue": 1', f'"intValue": {huge}')
    r = client.post("/v1/logs", content=body, headers=headers)
    assert r.status_code == 400 and "a number too long to read" in r.json()["message"]
    body = json.dumps(_attr({"doubleValue": 1})).replace('"doubleValue": 1', f'"doubleValue": {"9" * 400}')
    r = client.post("/v1/logs", content=body, headers=headers)
    assert r.status_code == 400 and r.json()["message"].endswith(
        f"{_VALUE_PATH}.doubleValue: a number that proto3 JSON does not read as a double (a number, its text, NaN or Infinity)")
    r = client.post("/v1/logs", content=json.dumps(_attr({"intValue": huge})), headers=headers)  # as a string
    assert r.status_code == 400 and "intValue" in r.json()["message"]
    assert _rows(sessions) == ([], [])
    # a file: that line quarantined, the others stored
    good = json.dumps({"@timestamp": "2025-06-04T10:15:00.067Z", "txn_id": "T-BIG-1", "decision": "APPROVE"})
    path = tmp_path / "big.jsonl"
    path.write_text(good + "\n" + good.replace("T-BIG-1", "T-BIG-2")[:-1] + f', "n": {huge}}}' + "\n"
                    + good.replace("T-BIG-1", "T-BIG-3") + "\n")
    result = CliRunner().invoke(cli, ["ingest", str(path), "--database-url", database_url, "--output", "json"])
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)
    assert (counts["read"], counts["stored"], counts["quarantined"]) == (3, 2, 1)
    stored, quarantined = _rows(sessions)
    assert sorted(stored) == ["T-BIG-1", "T-BIG-3"]
    assert [(q.position, q.reason.split(" (")[0]) for q in quarantined] == [("2", "unparseable: a number too long to read")]
