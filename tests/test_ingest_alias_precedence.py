"""Which alias of the transaction id wins, and what a record says when two aliases disagree
(``collector.ingest.aliases``; parser only, no database).

Newcomer repro: a line with both ``"transaction.id":"ALIAS-A"`` and ``"txn_id":"ALIAS-B"`` was stored
as ALIAS-B with no warning, while the README listed ``transaction.id`` first. The order is the code's
(``DEFAULT_ALIASES``: the application's MDC keys first, ECS ``transaction.id`` — which the Elastic APM
agent fills with its own APM transaction id, log-formats.md §1.6 — last); the README and the
``missing-transaction-id`` quarantine reason list that order, and a record whose aliases disagree
says so in ``draudit.warnings``, the other value kept in its attributes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from collector.ingest import fastpath, parse_pool
from collector.ingest.aliases import DEFAULT_ALIASES, DEFAULT_MDC_PREFIXES, AliasTable
from collector.ingest.parser import LineParser
from tests.test_ingest_fastpath import K8S, NESTED, SOURCE, fluent

README = Path(__file__).resolve().parent.parent / "README.md"
ORDER = DEFAULT_ALIASES["transaction_id"]


def test_the_transaction_id_order_puts_the_mdc_keys_first_and_ecs_transaction_id_last():
    assert ORDER[0] == "txn_id" and ORDER[-1] == "transaction.id"
    a = AliasTable()
    # every pair: the earlier name wins, whatever the order of the keys in the line
    for i, first in enumerate(ORDER):
        for later in ORDER[i + 1:]:
            for flat in ({first: "TX-EARLY", later: "TX-LATE"}, {later: "TX-LATE", first: "TX-EARLY"}):
                assert a.lookup(flat, "transaction_id") == (first, "TX-EARLY")
    # an MDC-prefixed name comes after every bare name, an empty value is absent
    assert a.lookup({"mdc.txn_id": "TX-MDC", "transaction.id": "TX-APM"}, "transaction_id") == ("transaction.id", "TX-APM")
    assert a.lookup({"txn_id": "", "transaction.id": "TX-APM"}, "transaction_id") == ("transaction.id", "TX-APM")


def test_the_readme_lists_the_names_in_the_codes_order():
    text = " ".join(README.read_text(encoding="utf-8").split())
    m = re.search(r"The transaction id is looked up under (.*?), in this order", text)
    assert m, "README 'Sending logs' names the transaction id's fields"
    assert re.findall(r"`([^`]+)`", m.group(1)) == list(ORDER)
    m = re.search(r"then the same names under the MDC containers (.*?) \(", text)
    assert m and tuple(re.findall(r"`([^`]+)`", m.group(1))) == DEFAULT_MDC_PREFIXES


def test_the_missing_id_reason_lists_the_same_order():
    parser = LineParser()
    [out] = parser.feed_bytes(b'{"@timestamp":"2025-03-04T10:15:00Z","decision":"APPROVE"}', "test", "1")
    assert out.record is None
    assert out.reason == ("missing-transaction-id: no transaction id field (looked for " + ", ".join(ORDER)
                          + ", each also under mdc., MDC., context., contextMap., labels.; configure more with --aliases)")


def test_disagreement_names_the_fields_not_the_values():
    a = AliasTable()
    flat = {"transaction.id": "ALIAS-A", "txn_id": "ALIAS-B", "transactionId": "ALIAS-C"}
    hit = a.lookup(flat, "transaction_id")
    assert hit == ("txn_id", "ALIAS-B")
    assert a.disagreement(flat, "transaction_id", hit) == (
        "transaction_id fields disagree: 'txn_id' taken (first in the alias order), "
        "'transactionId', 'transaction.id' held another value (kept in attributes)")
    # agreeing copies (spacing, a number and its text), one name, empty or null others: no warning
    for agree in ({"txn_id": "T-1", "transaction.id": " T-1 "}, {"txn_id": 42, "transactionId": "42"},
                  {"txn_id": "T-1"}, {"txn_id": "T-1", "transaction.id": ""}, {"txn_id": "T-1", "txnId": None}):
        assert a.disagreement(agree, "transaction_id", a.lookup(agree, "transaction_id")) is None, agree
    # a bool is not the text "True"; other canonical fields too
    flat = {"txn_id": "True", "txnId": True}
    assert a.disagreement(flat, "transaction_id", a.lookup(flat, "transaction_id")) is not None
    flat = {"decision": "APPROVE", "verdict": "DECLINE"}
    assert "'verdict'" in a.disagreement(flat, "decision", a.lookup(flat, "decision"))
    # a custom table's order is the one that counts
    custom = AliasTable.from_mapping({"transaction_id": ["transaction.id", "txn_id"]})
    flat = {"transaction.id": "ALIAS-A", "txn_id": "ALIAS-B"}
    hit = custom.lookup(flat, "transaction_id")
    assert hit == ("transaction.id", "ALIAS-A")
    assert "'transaction.id' taken" in custom.disagreement(flat, "transaction_id", hit)


def _line(**app_changes) -> bytes:
    app = dict(NESTED)
    app.update(app_changes)
    return fluent(app).encode()


def test_a_line_with_both_aliases_stores_the_first_and_keeps_the_other():
    parser = LineParser()
    [out] = parser.feed_bytes(_line(**{"transaction.id": "ALIAS-A", "txn_id": "ALIAS-B"}), SOURCE, "1")
    rec = out.record
    assert rec.transaction_id == "ALIAS-B"
    assert rec.attributes["transaction.id"] == "ALIAS-A"
    assert "txn_id" not in rec.attributes
    assert rec.pod_uid == K8S["pod_id"]


def test_both_paths_agree_on_lines_with_several_aliases():
    """The parse workers' fast path answers exactly as the general path (tests/test_ingest_fastpath.py)."""
    lines = [_line(**{"transaction.id": "ALIAS-A", "txn_id": "ALIAS-B"}),
             _line(**{"transaction.id": "T-000193"}),  # agreeing copies
             _line(txn_id=None, **{"transaction.id": "ALIAS-A", "transactionId": "ALIAS-C"}),
             _line(txn_id=None, **{"transaction.id": "ALIAS-A"})]
    fast_parser, general_parser = LineParser(), LineParser()
    for n, data in enumerate(lines, start=1):
        fast = fastpath.unit(fast_parser, data, SOURCE, str(n))
        general = [parse_pool._unit(o) for o in general_parser.feed_bytes(data, SOURCE, str(n))]
        assert fast is not None
        assert [fast] == general


def _warnings(data: bytes) -> list[str]:
    [out] = LineParser().feed_bytes(data, SOURCE, "1")
    return out.record.attributes.get("draudit.warnings", [])


def test_a_line_whose_aliases_disagree_carries_a_warning():
    assert _warnings(_line(**{"transaction.id": "ALIAS-A", "txn_id": "ALIAS-B"})) == [
        "transaction_id fields disagree: 'txn_id' taken (first in the alias order), "
        "'transaction.id' held another value (kept in attributes)"]
    assert _warnings(_line(**{"transaction.id": "T-000193"})) == []


def test_the_demo_lines_ecs_transaction_id_alone_is_still_the_id():
    [out] = LineParser().feed_bytes(_line(txn_id=None, **{"transaction": {"id": "TXN-9D8484720BFB"}}), SOURCE, "1")
    assert out.record.transaction_id == "TXN-9D8484720BFB"
    assert "draudit.warnings" not in out.record.attributes
    assert json.loads(json.dumps(out.record.attributes))  # JSON-serialisable, as stored
