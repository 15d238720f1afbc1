"""Quarantine reasons say what the line is, so the user knows what to fix."""

from __future__ import annotations

import pytest

from collector.ingest.parser import LineParser


@pytest.mark.parametrize("line, reason", [
    ('"junk"', "unparseable: a JSON string, not an object (a log record is a JSON object)"),
    ("42", "unparseable: a JSON number, not an object (a log record is a JSON object)"),
    # an array line's elements are units (below); an array inside it is no record
    ('[[{"txn_id":"T-1"}]]', "unparseable: a JSON array, not an object (a log record is a JSON object)"),
    ("null", "unparseable: JSON null, not an object (a log record is a JSON object)"),
    ("2025-06-04 10:15:06 INFO started", "unparseable: not JSON and not a CRI log line (plain text)"),
    ("[" * 5000, "unparseable: not JSON and not a CRI log line (plain text)"),
    ("[1,2", "unparseable: invalid JSON array (unexpected end of data: line 1 column 5 (char 4))"),
    ('[{"txn_id":"T-1"},{"txn_id":', "unparseable: invalid JSON array (unexpected end of data: line 1 column 29 (char 28))"),
    ("[0.011s][warning][os,thread] Failed to start thread", "unparseable: not JSON and not a CRI log line (plain text)"),
    ("[main] INFO  o.s.b.StartupInfoLogger - Starting", "unparseable: not JSON and not a CRI log line (plain text)"),
    ('{"txn_id":"T-1","decision":"APPROVE"}{"txn_id":"T-2"}',
     "unparseable: a second JSON value starts at character 37; one JSON object per line (or one JSON array of them)"),
    ('{"txn_id":"T-1","decision":"APPROVE"} trailing garbage', "unparseable: text after the JSON value at character 38"),
])
def test_a_line_that_is_not_one_json_object_is_quarantined_with_what_it_is(line, reason):
    [outcome] = LineParser().feed_bytes(line.encode(), "app.log", "1")
    assert outcome.record is None and outcome.reason == reason


def test_a_line_that_is_a_json_array_gives_one_unit_per_element():
    """A saved HTTP batch (Fluent Bit ``format json``), one per line: was one quarantined unit."""
    line = ('[{"@timestamp":"2025-06-04T10:15:00.067Z","txn_id":"T-1","decision":"APPROVE"},'
            '{"@timestamp":"2025-06-04T10:15:00.068Z","txn_id":"T-2","decision":"DECLINE"}, 7]')
    outcomes = LineParser().feed_bytes(line.encode(), "app.log", "12")
    assert [(o.position, o.record.transaction_id if o.record else o.reason) for o in outcomes] == [
        ("12 element 1", "T-1"), ("12 element 2", "T-2"),
        ("12 element 3", "unparseable: a JSON number, not an object (a log record is a JSON object)")]


def test_a_pod_uid_that_is_not_a_uuid_is_ignored_with_a_warning_not_silently():
    import json

    from tests.test_ingest_fastpath import K8S, NESTED, fluent

    bad = "x" * 100
    [outcome] = LineParser().feed_bytes(fluent(NESTED, k8s=dict(K8S, pod_id=bad)).encode(), "app.log", "1")
    record = outcome.record.prepared()
    values = dict(zip(("transaction_id", "pod_uid"), (record.values[0], record.values[4])))
    assert values == {"transaction_id": "T-000193", "pod_uid": None}
    warnings = json.loads(record.values[-1])["draudit.warnings"]
    assert warnings == [f"envelope pod_id {repr(bad)[:77]}... is not a pod UID (a UUID); ignored"]


def test_a_fluent_bit_record_with_part_of_its_kubernetes_metadata_is_read_as_one():
    """Only container_name in the kubernetes map (no pod name or namespace): still the filter's record,
    whose log line carries the transaction id (was quarantined as missing-transaction-id)."""
    import json

    app = {"@timestamp": "2026-11-30T09:15:02.131Z", "transaction": {"id": "AT-NOPODINFO"}, "decision": "APPROVE",
           "message": "Transaction scored"}
    line = json.dumps({"log": json.dumps(app), "kubernetes": {"container_name": "risk-api"}})
    [outcome] = LineParser().feed_bytes(line.encode(), "app.log", "1")
    assert outcome.reason is None
    record = outcome.record
    assert (record.transaction_id, record.container_name, record.pod_name, record.envelope) == \
        ("AT-NOPODINFO", "risk-api", None, "fluentbit")
