"""A Spring service puts the transaction id in the MDC, so every log line of a request carries it:
those lines are the transaction's log events, not re-sends. Only a transaction *scored* twice with
different content (two records with a decision) is a conflict."""

from __future__ import annotations

import json

from sqlalchemy import select

from collector.store import ledger
from collector.store.models import InferenceRecord
from tests.test_ingest_store import ingest_paths, settings_for


def _line(ms: int, message: str, **fields) -> str:
    doc = {"@timestamp": f"2026-11-30T09:15:02.{ms:03d}Z", "log": {"level": "INFO", "logger": "com.bank.risk.Scoring"},
           "message": message, "transaction": {"id": "TX-8812"}, "service": {"name": "risk-api"}}
    doc.update(fields)
    return json.dumps(doc)


REQUEST = [
    _line(101, "Received scoring request"),
    _line(104, "Calling Triton fraud_xgb"),
    _line(131, "Transaction scored", decision="APPROVE", model_name="fraud_xgb", model_version="7", latency_ms=27.4),
]


def _rows(sessions):
    with sessions() as s:
        rows = s.execute(select(InferenceRecord.decision, InferenceRecord.conflict)
                         .where(InferenceRecord.transaction_id == "TX-8812").order_by(InferenceRecord.id)).all()
        assert ledger.verify(s).ok
    return [tuple(r) for r in rows]


def test_the_log_lines_of_one_request_are_not_conflicts(sessions, database_url, tmp_path):
    path = tmp_path / "risk-api.log"
    path.write_text("\n".join(REQUEST) + "\n")
    counts = ingest_paths(sessions, settings_for(database_url), [path])
    assert counts.as_dict() == {"read": 3, "stored": 3, "duplicates": 0, "conflicts": 0, "quarantined": 0, "pan_masked": 0}
    assert _rows(sessions) == [(None, False), (None, False), ("APPROVE", False)]

    # the request's lines again (a shipper retry): duplicates; one more context line: stored, not flagged
    again = tmp_path / "again.log"
    again.write_text("\n".join(REQUEST + [_line(140, "Response sent")]) + "\n")
    counts = ingest_paths(sessions, settings_for(database_url), [again])
    assert (counts.stored, counts.duplicates, counts.conflicts) == (1, 3, 0)


def test_a_transaction_scored_again_differently_is_a_conflict_in_a_later_run_and_in_one_batch(sessions, database_url, tmp_path):
    first = tmp_path / "first.log"
    first.write_text("\n".join(REQUEST) + "\n")
    ingest_paths(sessions, settings_for(database_url), [first])
    rescored = _line(131, "Transaction scored", decision="DECLINE", model_name="fraud_xgb", model_version="7",
                     latency_ms=27.4)
    rescored_later = _line(480, "Transaction scored", decision="REVIEW", model_name="fraud_xgb", model_version="7",
                           latency_ms=30.1)
    second = tmp_path / "second.log"
    second.write_text("\n".join([rescored, _line(481, "Response sent"), rescored_later]) + "\n")
    counts = ingest_paths(sessions, settings_for(database_url), [second])
    assert (counts.stored, counts.conflicts) == (3, 2)
    assert _rows(sessions) == [(None, False), (None, False), ("APPROVE", False), ("DECLINE", True), (None, False),
                               ("REVIEW", True)]


def test_two_lines_of_one_transaction_in_the_same_millisecond_are_both_kept(sessions, database_url, tmp_path):
    """Spring logs several lines per millisecond: without a decision the message tells them apart;
    the same line delivered again is still one."""
    lines = [_line(100, "Received scoring request"), _line(100, "Calling Triton fraud_xgb")]
    path = tmp_path / "same-ms.log"
    path.write_text("\n".join(lines + lines[:1]) + "\n")
    counts = ingest_paths(sessions, settings_for(database_url), [path])
    assert (counts.read, counts.stored, counts.duplicates, counts.conflicts) == (3, 2, 1, 0)
    assert _rows(sessions) == [(None, False), (None, False)]


def test_a_dotted_card_number_cut_between_two_files_is_masked_in_both_halves(sessions, database_url, tmp_path):
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_text('2025-06-04T10:15:06.1Z stdout P {"txn_id":"T-9","message":"card 4111.1111.1111.1\n')
    second.write_text('2025-06-04T10:15:06.1Z stdout F 111.1111 end"}\n')
    for path in (first, second):
        ingest_paths(sessions, settings_for(database_url), [path])
    from collector.store.models import Quarantine

    with sessions() as s:
        texts = s.execute(select(Quarantine.raw_text).order_by(Quarantine.id)).scalars().all()
    assert texts[0].endswith("card 411111*******") and "F ***1111 end" in texts[1], texts
