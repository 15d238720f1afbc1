"""Quarantine reasons say what the line is, so the user knows what to fix."""

from __future__ import annotations

import pytest

from collector.ingest.parser import LineParser


@pytest.mark.parametrize("line, reason", [
    ('"junk"', "unparseable: a JSON string, not an object (a log record is a JSON object)"),
    ("42", "unparseable: a JSON number, not an object (a log record is a JSON object)"),
    ('[{"txn_id":"T-1"}]', "unparseable: a JSON array, not an object (a log record is a JSON object)"),
    ("null", "unparseable: JSON null, not an object (a log record is a JSON object)"),
    ("2025-06-04 10:15:06 INFO started", "unparseable: not JSON and not a CRI log line (plain text)"),
    ("[" * 5000, "unparseable: not JSON and not a CRI log line (plain text)"),
    ('{"txn_id":"T-1","decision":"APPROVE"}{"txn_id":"T-2"}',
     "unparseable: a second JSON value starts at character 37; one JSON object per line (or one JSON array of them)"),
])
def test_a_line_that_is_not_one_json_object_is_quarantined_with_what_it_is(line, reason):
    [outcome] = LineParser().feed_bytes(line.encode(), "app.log", "1")
    assert outcome.record is None and outcome.reason == reason
