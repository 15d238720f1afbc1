"""Quarantine reasons say what is wrong with the transaction id, not something else.

A newcomer test found a whitespace-only id reported as "not a string or number" and an object as
"missing-transaction-id" (an object is flattened into ``transaction.id.<member>`` keys, so the
name itself was not found).
"""

from __future__ import annotations

import json

import pytest

from collector.ingest.otlp import records_from_json
from collector.ingest.parser import LineParser

EXPECTED = "not a transaction id (a non-blank string or a number)"


@pytest.mark.parametrize("value, what", [
    ("   ", "is blank (only whitespace)"),
    ("\t\n", "is blank (only whitespace)"),
    ("", "is an empty string"),
    ({"value": "TXN-1"}, "is an object"),
    ({}, "is an empty object"),
    (["TXN-1"], "is an array"),
    (True, "is a boolean"),
])
def test_an_unusable_transaction_id_is_named_with_what_it_is(value, what):
    line = json.dumps({"@timestamp": "2026-11-30T08:46:18Z", "transaction.id": value, "decision": "APPROVE"})
    (out,) = LineParser().feed_text(line, "app.log", "1")
    assert out.reason == f"bad-transaction-id: field 'transaction.id' {what}, {EXPECTED}"
    nested = json.dumps({"@timestamp": "2026-11-30T08:46:18Z", "transaction": {"id": value}})  # ECS 3.5 nested
    (out,) = LineParser().feed_text(nested, "app.log", "2")
    assert out.reason.startswith("bad-transaction-id: field 'transaction.id' ")


def test_an_object_id_in_an_otlp_attribute_and_a_missing_id_keep_their_reasons():
    otlp = {"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"timeUnixNano": "1796028378000000000", "attributes": [
            {"key": "txn_id", "value": {"kvlistValue": {"values": [{"key": "v", "value": {"stringValue": "T"}}]}}}]},
        {"timeUnixNano": "1796028378000000000", "attributes": [{"key": "note", "value": {"stringValue": "x"}}]},
        {"timeUnixNano": "1796028378000000000", "attributes": [{"key": "txn_id", "value": {"stringValue": "T-OK"}},
                                                              {"key": "transaction.id", "value": {"stringValue": " "}}]}]}]}]}
    bad, missing, ok = LineParser().feed_otlp_records(records_from_json(otlp), "http:x")
    assert bad.reason == f"bad-transaction-id: field 'txn_id' is an object, {EXPECTED}"
    assert missing.reason.startswith("missing-transaction-id: no transaction id field")
    assert ok.record.transaction_id == "T-OK"  # the first alias with a usable value wins, as before
