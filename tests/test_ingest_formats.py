"""Every supported log format → the canonical record (parser only, no database).

Sample lines live in tests/data/logs (hand-written Spring Boot lines from log-formats.md §1 and
envelopes composed by compose_envelopes.py from the field tables of §2–3). The same transaction
T-000193 appears in every format; the tests check each reader recovers the same business content.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from collector.ingest.aliases import AliasTable
from collector.ingest.otlp import records_from_json, records_from_protobuf
from collector.ingest.parser import LineParser, Outcome
from collector.ingest.pipeline import iter_chunks

DATA = Path(__file__).parent / "data" / "logs"
POD_UID = "0f3c2a9e-6a51-4d0e-9d7e-1b2c3d4e5f60"
POD_NAME = "fraud-api-7c9d8-x2k4q"
NAMESPACE = "risk-inference"
# 2025-03-04T10:15:00.067462Z
T193_NS = 1_741_083_300_067_462_000
BUSINESS_193 = {
    "transaction_id": "T-000193", "event_time_ns": T193_NS, "event_time_precision_ns": 1_000,
    "model_name": "fraud_xgb", "model_version": "7", "decision": "DECLINE", "latency_ms": 12.4,
    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7",
}


def parse_stream(data: bytes, source: str = "test", **kwargs) -> list[Outcome]:
    parser = LineParser(**kwargs)
    out: list[Outcome] = []
    for chunk in iter_chunks(io.BytesIO(data), parser.max_line_bytes):
        for n, line, total in chunk.lines():
            out += parser.feed_bytes(line, source, str(n), total)
    return out + parser.finish()


def read_lines(stream, max_line_bytes: int, **kwargs) -> list[tuple[bytes, int]]:
    """``(data, total bytes)`` of each line ``iter_chunks`` reads (the ingest's reader)."""
    return [(data, len(data) if total is None else total)
            for chunk in iter_chunks(stream, max_line_bytes, **kwargs) for _, data, total in chunk.lines()]


def parse_file(name: str, source: str | None = None, **kwargs) -> list[Outcome]:
    path = DATA / name
    return parse_stream(path.read_bytes(), source or str(path), **kwargs)


def records(outcomes: list[Outcome]):
    return [o.record for o in outcomes if o.record is not None]


def rejected(outcomes: list[Outcome]) -> list[tuple[str | None, str]]:
    return [(o.position, o.reason.split(":", 1)[0]) for o in outcomes if o.record is None]


def business(rec) -> dict:
    return {k: getattr(rec, k) for k in BUSINESS_193}


# -- Spring Boot payload formats ------------------------------------------------------------------


def test_spring_ecs_34_flat_and_35_nested_give_the_same_record():
    flat = parse_file("spring_ecs_34_flat.jsonl", source="app.log")
    nested = parse_file("spring_ecs_35_nested.jsonl", source="app.log")
    rf, rn = records(flat), records(nested)
    assert [r.source_format for r in rf] == ["spring_ecs_flat"] * 2
    assert [r.source_format for r in rn] == ["spring_ecs_nested"] * 2
    assert business(rf[0]) == BUSINESS_193 == business(rn[0])
    # MDC values are strings ("9.75"): coerced to a number.
    assert rf[1].latency_ms == 9.75 and rf[1].decision == "APPROVE"
    assert rf[1].event_time_ns == 1_741_083_300_112_000_000 and rf[1].event_time_precision_ns == 1_000_000
    # Same flattened attributes whichever the shape; canonical fields are not repeated there.
    assert rf[0].attributes == rn[0].attributes
    assert rf[0].attributes["log.logger"] == "com.example.fraud.ScoringService"
    assert "txn_id" not in rf[0].attributes and "@timestamp" not in rf[0].attributes
    assert rf[0].dedup_key() == rn[0].dedup_key()
    # The start-up line has no transaction id: quarantined at its line number.
    assert rejected(flat) == [("3", "missing-transaction-id")] == rejected(nested)


def test_logstash_offset_time_is_converted_to_utc():
    out = parse_file("logstash.jsonl", source="app.log")
    r = records(out)
    assert business(r[0]) == BUSINESS_193  # 11:15:00.067462+01:00 == 10:15:00.067462Z
    assert r[0].source_format == "logstash" and r[0].attributes["level_value"] == 20000
    assert r[1].event_time_ns == 1_741_083_300_112_000_000


def test_gelf_underscore_fields_and_millisecond_epoch():
    r = records(parse_file("gelf.jsonl", source="app.log"))
    assert r[0].source_format == "gelf"
    expected = dict(BUSINESS_193, event_time_ns=1_741_083_300_067_000_000, event_time_precision_ns=1_000_000)
    assert business(r[0]) == expected  # epoch seconds with 3 decimals: exact, never via float
    assert r[0].attributes["log.level"] == "INFO" and r[0].attributes["host"] == "fraud-api"
    assert not any(k.startswith("_") for k in r[0].attributes)


# -- Envelopes --------------------------------------------------------------------------------------

SAME_POD_FILES = [
    "fluentbit_merge_off.jsonl", "fluentbit_merge_keep_log.jsonl", "fluentbit_merge_log_key.jsonl",
    "fluentbit_merge_keep_log_off.jsonl", "fluentbit_merge_log_key_keep_off.jsonl", "fluentd.jsonl",
    "vector.jsonl", "filebeat.jsonl",
]


@pytest.mark.parametrize("name", SAME_POD_FILES)
def test_collector_envelopes_carry_pod_identity(name):
    out = parse_file(name, source="http:req-1")
    recs = records(out)
    assert len(recs) == 2 and rejected(out) == [("3", "missing-transaction-id")]
    r = recs[0]
    assert business(r) == BUSINESS_193
    assert (r.pod_uid, r.pod_uid_source, r.pod_namespace, r.pod_name, r.container_name, r.node_name) == (
        POD_UID, "envelope", NAMESPACE, POD_NAME, "api", "gpu-node-07")
    assert r.attributes["envelope.container_id"].startswith("a3f1c9e2")  # runtime prefix stripped (Vector)
    assert r.attributes["envelope.stream"] == "stdout"


def test_vector_with_the_application_merged_at_the_root():
    """``. = merge(., parse_json!(.message))`` in a Vector remap (log-formats §2.4): the app's fields
    at the root, its own ``message`` text in place of the raw line — quarantined as "plain text"
    before (a breaker's finding). The same record as Vector's plain event, with a warning."""
    doc = json.loads((DATA / "vector.jsonl").read_text().splitlines()[0])
    app = json.loads(doc["message"])
    merged = {**doc, **app}
    assert isinstance(merged["message"], str) and not merged["message"].startswith("{")
    r = records(parse_stream(json.dumps(merged).encode(), "http:req-1"))[0]
    assert business(r) == BUSINESS_193 and r.envelope == "vector"
    assert (r.pod_uid, r.node_name, r.container_name) == (POD_UID, "gpu-node-07", "api")
    assert r.attributes["message"] == app["message"]
    assert any("merged at the root of the Vector event" in w for w in r.attributes["draudit.warnings"])
    assert r.dedup_key() == records(parse_file("vector.jsonl", source="x"))[0].dedup_key()


def test_vector_with_a_gelf_line_merged_at_the_root_and_its_message_deleted():
    """``. = merge(., parse_json!(.message)); del(.message)`` around a Spring GELF line: no
    ``message`` left, GELF's ``_``-names at the root and its epoch ``timestamp`` over Vector's. It was
    quarantined ``missing-payload`` (a known gap). The same transaction as the GELF line read alone."""
    doc = json.loads((DATA / "vector.jsonl").read_text().splitlines()[0])
    gelf_line = (DATA / "gelf.jsonl").read_text().splitlines()[0]
    merged = {**doc, **json.loads(gelf_line)}
    del merged["message"]
    assert isinstance(merged["timestamp"], float)  # GELF's number replaced Vector's RFC 3339 text
    out = parse_stream(json.dumps(merged).encode(), "http:req-1")
    assert rejected(out) == []
    [r] = records(out)
    alone = records(parse_file("gelf.jsonl", source="app.log"))[0]
    assert (r.envelope, r.source_format) == ("vector", "gelf")
    assert business(r) == business(alone)  # GELF's millisecond time, not the envelope's
    assert (r.event_time_ns, r.event_time_precision_ns) == (1_741_083_300_067_000_000, 1_000_000)
    assert (r.pod_uid, r.node_name, r.container_name) == (POD_UID, "gpu-node-07", "api")
    assert "envelope.runtime_time_ns" not in r.attributes  # no runtime time: GELF's is no write time
    assert any("without a message" in w for w in r.attributes["draudit.warnings"])


def test_all_shippers_give_one_dedup_key_for_one_transaction(tmp_path):
    keys = {name: records(parse_file(name, source="x"))[0].dedup_key() for name in SAME_POD_FILES}
    cri = tmp_path / "var/log/pods" / f"{NAMESPACE}_{POD_NAME}_{POD_UID}" / "api" / "0.log"
    cri.parent.mkdir(parents=True)
    shutil.copy(DATA / "cri_containerd.log", cri)
    keys["cri"] = records(parse_stream(cri.read_bytes(), str(cri)))[0].dedup_key()
    otlp = [o.record for o in parse_file("otlp_logs.json") if o.record and o.record.transaction_id == "T-000193"]
    keys["otlp_filelog"] = otlp[0].dedup_key()
    assert len(set(keys.values())) == 1, keys


def test_fluentbit_merge_log_keep_log_duplicate_log_key_is_reconciled():
    raw = (DATA / "fluentbit_merge_keep_log.jsonl").read_text().splitlines()[0]
    assert raw.count('"log":') == 2  # the raw string, then Spring 3.5's own `log` object
    r = records(parse_stream(raw.encode()))[0]
    assert r.envelope == "fluentbit" and r.source_format == "spring_ecs_nested"
    assert any("Merge_Log" in w for w in r.attributes["draudit.warnings"])
    assert r.attributes["log.level"] == "INFO"


def test_fluentbit_merge_log_collisions_with_the_records_own_keys_are_warnings():
    """``Merge_Log On`` without ``Merge_Log_Key`` and ``Keep_Log On``: the application's keys are
    appended beside Fluent Bit's own, ``json_date_key @timestamp`` or an MDC ``stream`` collide
    (log-formats §2.2). The raw ``log`` string is intact: the record is read from it, the envelope
    keeps Fluent Bit's value, a warning names the member; a second ``kubernetes`` map is still refused."""
    app = {"@timestamp": "2025-03-04T10:15:00.067462Z", "log.level": "INFO", "message": "scored",
           "txn_id": "T-000193", "decision": "DECLINE", "stream": "payments", "ecs.version": "8.11"}
    raw = json.dumps(app, separators=(",", ":"))
    k8s = {"pod_name": POD_NAME, "namespace_name": NAMESPACE, "pod_id": POD_UID, "host": "gpu-node-07",
           "container_name": "api"}
    head = ('{"@timestamp":"2025-03-04T10:15:00.067901Z","time":"2025-03-04T10:15:00.067901337Z","stream":"stdout",'
            f'"_p":"F","log":{json.dumps(raw)},')
    merged = raw[1:-1]
    line = head + merged + ',"kubernetes":' + json.dumps(k8s) + "}"
    r = records(parse_stream(line.encode()))[0]
    assert (r.transaction_id, r.event_time_ns, r.pod_uid) == ("T-000193", T193_NS, POD_UID)
    assert r.attributes["envelope.stream"] == "stdout" and r.attributes["stream"] == "payments"
    assert [w for w in r.attributes["draudit.warnings"] if "duplicate top-level" in w] == [
        "duplicate top-level member '@timestamp', 'stream' (Fluent Bit Merge_Log without Merge_Log_Key appends the "
        "application's keys beside its own): the record's first value kept, the application line read from 'log'"]
    other_pod = line[:-1] + ',"kubernetes":' + json.dumps(dict(k8s, pod_name="other")) + "}"
    assert rejected(parse_stream(other_pod.encode())) == [("1", "duplicate-key")]


def test_duplicate_keys_that_disagree_are_quarantined():
    raw = (DATA / "fluentbit_merge_keep_log.jsonl").read_text().splitlines()[0]
    tampered = raw[: raw.rindex('"level":"INFO"')] + '"level":"WARN"' + raw[raw.rindex('"level":"INFO"') + 14:]
    app = ('{"@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-1","decision":"APPROVE","decision":"DECLINE"}')
    same = ('{"@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-2","decision":"APPROVE","decision":"APPROVE"}')
    out = parse_stream("\n".join([tampered, app, same]).encode())
    assert rejected(out) == [("1", "duplicate-key"), ("2", "duplicate-key")]
    assert [r.transaction_id for r in records(out)] == ["T-2"]
    assert "'decision'" in out[1].reason


def test_fluentbit_classic_parser_without_pod_uid_keeps_namespace_and_name():
    r = records(parse_file("fluentbit_classic_parser.jsonl"))[0]
    assert business(r) == BUSINESS_193
    assert (r.pod_uid, r.pod_uid_source, r.pod_namespace, r.pod_name) == (None, None, NAMESPACE, POD_NAME)


def test_docker_json_file_line():
    r = records(parse_file("docker_json.log", source="/var/lib/docker/containers/abc/abc-json.log"))[0]
    assert r.envelope == "docker_json" and business(r) == BUSINESS_193
    assert r.attributes["envelope.runtime_time_ns"] == 1_741_083_300_067_901_337


def test_cri_partial_lines_are_reassembled_per_stream(tmp_path):
    path = tmp_path / "var/log/pods" / f"{NAMESPACE}_{POD_NAME}_{POD_UID}" / "api" / "2.log"
    path.parent.mkdir(parents=True)
    shutil.copy(DATA / "cri_containerd.log", path)
    out = parse_stream(path.read_bytes(), str(path))
    recs = records(out)
    # 6 physical lines: P, (stderr F), P, F, F, F → 4 units (P+P+F is one): 2 records, 2 quarantined.
    assert len(out) == 4
    assert [(r.transaction_id, r.position) for r in recs] == [("T-000193", "1"), ("T-000194", "5")]
    assert business(recs[0]) == BUSINESS_193
    assert recs[0].envelope == "cri" and recs[0].attributes["envelope.partial_chunks"] == 3
    assert (recs[0].pod_uid, recs[0].pod_namespace, recs[0].pod_name, recs[0].container_name) == (
        POD_UID, NAMESPACE, POD_NAME, "api")
    assert recs[0].attributes["envelope.restart_count"] == 2
    assert recs[0].attributes["envelope.runtime_time_ns"] == 1_741_083_300_067_901_337  # first chunk's time
    assert rejected(out) == [("2", "unparseable"), ("6", "missing-transaction-id")]


def test_cri_partial_never_completed_is_quarantined():
    line = "2025-03-04T10:15:00.067901337Z stdout P {\"@timestamp\":\"2025-03-04T10:15:00Z\",\"txn_id\":"
    out = parse_stream(line.encode(), "node.log")
    assert rejected(out) == [("1", "incomplete-partial")]


def test_otlp_json_hex_ids_app_and_filelog_records():
    out = parse_file("otlp_logs.json", source="otel-file-exporter.jsonl")
    recs = {r.transaction_id: r for r in records(out)}
    assert set(recs) == {"T-000201", "T-000202", "T-000193"}
    app = recs["T-000201"]
    assert (app.envelope, app.source_format) == ("otlp_app", "otlp")
    assert app.trace_id == "0af7651916cd43dd8448eb211c80319c" and app.span_id == "b7ad6b7169203331"
    assert app.event_time_ns == 1_741_083_302_250_123_456 and app.event_time_precision_ns == 1
    assert (app.pod_uid, app.pod_name, app.node_name, app.model_version, app.latency_ms) == (
        "7d1e4b2a-93c5-4f60-8a1b-2c3d4e5f6a7b", "fraud-api-6f5b4-q9z7m", "gpu-node-03", "8", 7.9)
    assert app.attributes["message"] == "scored" and app.attributes["otel.scope.name"] == "com.example.fraud.ScoringService"
    assert recs["T-000202"].model_version == "8" and recs["T-000202"].latency_ms == 15.25  # intValue, string MDC
    filelog = recs["T-000193"]
    assert (filelog.envelope, filelog.source_format) == ("otlp_filelog", "spring_ecs_nested")
    assert business(filelog) == BUSINESS_193  # the app's own @timestamp, not the CRI time in timeUnixNano
    assert filelog.attributes["envelope.runtime_time_ns"] == 1_741_083_300_067_901_337
    # The WARN record without a transaction id is quarantined with its place in the request.
    assert rejected(out) == [("1:rl0.sl0.lr2", "missing-transaction-id")]


def _to_protobuf(doc: dict) -> bytes:
    """OTLP/JSON → protobuf bytes with the official classes, ids converted from hex (not base64)."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def any_value(v: dict) -> AnyValue:
        if "stringValue" in v:
            return AnyValue(string_value=v["stringValue"])
        if "intValue" in v:
            return AnyValue(int_value=int(v["intValue"]))
        if "doubleValue" in v:
            return AnyValue(double_value=v["doubleValue"])
        raise AssertionError(v)

    def kvs(items):
        return [KeyValue(key=i["key"], value=any_value(i["value"])) for i in items]

    req = ExportLogsServiceRequest()
    for rl in doc["resourceLogs"]:
        prl = req.resource_logs.add()
        prl.resource.attributes.extend(kvs(rl["resource"]["attributes"]))
        for sl in rl["scopeLogs"]:
            psl = prl.scope_logs.add()
            psl.scope.name = sl["scope"].get("name", "")
            for lr in sl["logRecords"]:
                p = psl.log_records.add()
                p.time_unix_nano = int(lr.get("timeUnixNano", 0))
                p.observed_time_unix_nano = int(lr.get("observedTimeUnixNano", 0))
                p.severity_number = lr.get("severityNumber", 0)
                p.severity_text = lr.get("severityText", "")
                p.body.CopyFrom(any_value(lr["body"]))
                p.attributes.extend(kvs(lr["attributes"]))
                if "traceId" in lr:
                    p.trace_id = bytes.fromhex(lr["traceId"])
                    p.span_id = bytes.fromhex(lr["spanId"])
    return req.SerializeToString()


def test_otlp_protobuf_gives_the_same_records_as_otlp_json():
    doc = json.loads((DATA / "otlp_logs.json").read_text())
    parser_j, parser_p = LineParser(), LineParser()
    from_json = parser_j.feed_otlp_records(records_from_json(doc), "http:a")
    from_pb = parser_p.feed_otlp_records(records_from_protobuf(_to_protobuf(doc)), "http:a")
    assert [o.reason for o in from_json] == [o.reason for o in from_pb]
    for a, b in zip(from_json, from_pb):
        if a.record:
            assert a.record.business_content() == b.record.business_content()
            assert a.record.dedup_key() == b.record.dedup_key()
    assert sum(1 for o in from_pb if o.record) == 3


def test_protobuf_json_format_would_misread_hex_ids():
    """The pitfall the hand-written OTLP/JSON walker avoids (log-formats.md §3.5)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    doc = json.loads((DATA / "otlp_logs.json").read_text())
    msg = json_format.Parse(json.dumps(doc), ExportLogsServiceRequest(), ignore_unknown_fields=True)
    assert len(msg.resource_logs[0].scope_logs[0].log_records[0].trace_id) != 16  # base64-decoded garbage
    ours = next(records_from_json(doc))
    assert ours.trace_id == "0af7651916cd43dd8448eb211c80319c"


# -- Timestamps, aliases, forced formats -----------------------------------------------------------

NAIVE = b'{"@timestamp":"2025-03-04 11:15:00.500","@version":"1","logger_name":"x","level":"INFO","txn_id":"T-9"}'


def test_naive_timestamp_is_quarantined_without_a_default_zone():
    assert rejected(parse_stream(NAIVE)) == [("1", "naive-timestamp")]


def test_naive_timestamp_uses_the_configured_zone():
    r = records(parse_stream(NAIVE, default_tz="Europe/Berlin"))[0]
    assert r.event_time_ns == 1_741_083_300_500_000_000  # 11:15:00.5 CET = 10:15:00.5Z
    r = records(parse_stream(NAIVE.replace(b"2025-03-04", b"2025-07-04"), default_tz="Europe/Berlin"))[0]
    assert r.event_time_ns == 1_751_620_500_500_000_000  # CEST, +02:00


def test_configurable_aliases_and_mdc_containers():
    line = (b'{"@timestamp":"2025-03-04T10:15:00.067462Z","mdc":{"payment_ref":"PR-77","verdict":"DECLINE"},'
            b'"inference":{"ms":3.5},"dd.trace_id":"5044603616094826305"}')
    assert rejected(parse_stream(line)) == [("1", "missing-transaction-id")]
    table = AliasTable.from_mapping({"transaction_id": ["payment_ref"], "latency_ms": ["inference.ms"]})
    r = records(parse_stream(line, aliases=table))[0]
    assert (r.transaction_id, r.decision, r.latency_ms) == ("PR-77", "DECLINE", 3.5)
    assert r.trace_id == f"{5044603616094826305:032x}"  # Datadog decimal 64-bit id → hex


def test_forced_format():
    cri = DATA.joinpath("cri_containerd.log").read_bytes()
    assert {reason for _, reason in rejected(parse_stream(cri.splitlines()[4], forced="fluentbit"))} == {"unparseable"}
    json_line = DATA.joinpath("spring_ecs_35_nested.jsonl").read_bytes().splitlines()[0]
    assert rejected(parse_stream(json_line, forced="cri")) == [("1", "wrong-format")]
    r = records(parse_stream(json_line, forced="logstash"))[0]
    assert r.source_format == "logstash" and business(r) == BUSINESS_193


# -- Hostile lines ---------------------------------------------------------------------------------


def test_hostile_lines_end_in_quarantine_with_their_reason():
    deep = b'{"txn_id":"T-1","a":' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    deep_inside = json.dumps({"time": "2025-03-04T10:15:00Z", "stream": "stdout", "_p": "F",
                              "log": '{"x":' + "{" * 10_000 + "}" * 10_000 + "}",
                              "kubernetes": {"pod_name": "p", "namespace_name": "n"}}).encode()
    huge = b'{"txn_id":"T-2","message":"' + b"x" * 10_000_000 + b'"}'
    bad_utf8 = b'{"txn_id":"T-3","message":"caf\xe9"}'
    good = DATA.joinpath("spring_ecs_34_flat.jsonl").read_bytes().splitlines()[0]
    data = b"\n".join([deep, deep_inside, huge, bad_utf8, good])
    out = parse_stream(data, "hostile.log")
    assert rejected(out) == [("1", "nesting-too-deep"), ("2", "nesting-too-deep"), ("3", "line-too-long"),
                             ("4", "not-utf8")]
    assert [r.transaction_id for r in records(out)] == ["T-000193"]
    huge_out = out[2]
    assert len(huge_out.raw_text) <= 4097 and "10000029 bytes" in huge_out.reason
    assert "\\xe9" in out[3].raw_text


def test_reader_keeps_memory_bounded_for_a_huge_line():
    stream = io.BytesIO(b"a" * 5_000_000 + b"\nshort\n")
    lines = read_lines(stream, 1024)
    assert [(len(d), total) for d, total in lines] == [(1025, 5_000_000), (5, 5)]


def test_nul_and_lone_surrogate_escapes_are_made_storable():
    line = b'{"@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-5","message":"a\\u0000b\\ud800c"}'
    r = records(parse_stream(line))[0]
    assert r.attributes["message"] == "a\ufffdb?c"
    r.attributes["message"].encode("utf-8")


def test_app_lines_that_look_a_little_like_envelopes_stay_app_lines():
    lines = [b'{"date":"2025-03-04","message":"scored","@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-1"}',
             b'{"input":{"amount":12},"@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-2"}']
    recs = records(parse_stream(b"\n".join(lines)))
    assert [(r.envelope, r.transaction_id) for r in recs] == [("none", "T-1"), ("none", "T-2")]
    assert recs[0].attributes["message"] == "scored" and recs[1].attributes["input.amount"] == 12


def test_reader_keeps_otlp_request_lines_whole_up_to_the_document_limit():
    doc = b'{"resourceLogs":[' + b" " * 300 + b"]}"
    other = b'{"log":"' + b"y" * 300 + b'"}'
    data = other + b"\n" + doc + b"\n" + doc + b" " * 500 + b"\n" + doc
    lines = read_lines(io.BytesIO(data), 100, max_document_bytes=400, is_document=LineParser().reads_documents)
    assert [(len(line), total) for line, total in lines] == [(101, 310), (len(doc), len(doc)),
                                                              (101, len(doc) + 500), (len(doc), len(doc))]


def test_a_leading_byte_order_mark_is_dropped():
    line = (DATA / "spring_ecs_34_flat.jsonl").read_bytes().splitlines()[0]
    cri = b"2025-03-04T10:15:00.067901337Z stdout F " + line
    app_bom = b"2025-03-04T10:15:00.067901337Z stdout F \xef\xbb\xbf" + line  # the application wrote it
    out = parse_stream(b"\xef\xbb\xbf" + line + b"\n\xef\xbb\xbf" + cri + b"\n" + app_bom + b"\n")
    assert rejected(out) == [] and len(records(out)) == 3
