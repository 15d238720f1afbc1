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


def test_a_context_line_re_sent_with_less_pod_identity_is_a_duplicate(sessions, database_url, tmp_path):
    """A tester's finding: the scored event re-sent without ``kubernetes.pod_id`` (Fluent Bit's API
    lookup failed) or as the bare application line was a duplicate, but the request's other lines
    were stored twice. They follow the same rule now, across runs and within one batch; a copy that
    adds pod identity the stored one lacked is stored beside it, and another message is another line."""
    kubernetes = {"pod_name": "risk-api-5f7c9-qx2lm", "namespace_name": "risk", "container_name": "risk-api",
                  "pod_id": "5b0c6a4e-2f1d-4c3b-9a8e-7d6c5b4a3f21", "host": "gpu-node-07"}

    def fluent(line: str, **k8s_changes) -> str:
        k8s = {k: v for k, v in dict(kubernetes, **k8s_changes).items() if v is not None}
        return json.dumps({"date": 1764494102.5, "stream": "stdout", "log": line, "kubernetes": k8s})

    def run(name: str, *lines: str):
        path = tmp_path / name
        path.write_text("".join(line + "\n" for line in lines))
        return ingest_paths(sessions, settings_for(database_url), [path]).as_dict()

    received, calling = REQUEST[0], REQUEST[1]
    assert run("full.log", fluent(received), fluent(calling))["stored"] == 2
    # a later run: the same lines without the pod uid, and bare: duplicates, stored nowhere again
    counts = run("resend.log", fluent(received, pod_id=None), received, fluent(calling, pod_id=None), calling)
    assert (counts["stored"], counts["duplicates"], counts["conflicts"]) == (0, 4, 0)
    with sessions() as s:
        rows = s.execute(select(InferenceRecord.pod_uid, InferenceRecord.attributes["message"].as_string())
                         .where(InferenceRecord.transaction_id == "TX-8812").order_by(InferenceRecord.id)).all()
    assert [tuple(r) for r in rows] == [(kubernetes["pod_id"], "Received scoring request"),
                                        (kubernetes["pod_id"], "Calling Triton fraud_xgb")]
    # another pod's line with the same message is not a copy of this one; nor is another message
    other_pod = run("other.log", fluent(received, pod_name="risk-api-5f7c9-zz9aa", pod_id=None),
                    fluent(_line(104, "Calling Triton fraud_lgbm"), pod_id=None))
    assert (other_pod["stored"], other_pod["duplicates"]) == (2, 0)

    # one batch, the bare line first: the copy adding the pod uid is stored beside it, the copies
    # after it add nothing
    line = _line(222, "Received scoring request").replace("TX-8812", "TX-8813")
    counts = run("batch.log", line, fluent(line, pod_id=None), fluent(line), fluent(line, pod_id=None), line)
    assert (counts["stored"], counts["duplicates"], counts["conflicts"]) == (3, 2, 0)
