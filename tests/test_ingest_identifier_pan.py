"""Card numbers in identifiers: a transaction id is masked only when it can be a card's PAN.

Newcomer repro: one number in ten passes the Luhn check, so numeric and date-based transaction ids
(``20261130-00012341``, ``1000000000000107``) were masked like card numbers: ``draudit trace`` could
not find them, and two ids masked alike with the same content were stored as one transaction.
A card number in a trace or span id reached the database unmasked.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select, text

from collector.ingest.pan import card_issuer_prefix, luhn_ok, mask_identifier
from collector.lineage import trace
from collector.store.models import InferenceRecord
from tests.test_ingest_store import ingest_paths, settings_for

# Luhn-valid numbers that are identifiers (their first digits no card has) and card numbers.
IDS = ["20261130-00012341", "20261130-00045341", "20261130-00125341", "1000000000000107", "7000000000000005",
       "1234567890123452", "9000000000000001"]
CARDS = ["4111111111111111", "5555555555554444", "378282246310005", "6011111111111117", "3530111333300000",
         "2223003122003222", "30569309025904", "6200000000000005", "8171999927660000"]


def test_luhn_valid_identifiers_are_kept_and_card_numbers_masked():
    for value in IDS + CARDS:
        assert luhn_ok(value.replace("-", "")), value
    for value in IDS:
        assert mask_identifier(value) == (value, 0), value
        assert mask_identifier(f"TX-{value}") == (f"TX-{value}", 0)
    for value in CARDS:
        masked, n = mask_identifier(value)
        assert n == 1 and masked == value[:6] + "*" * (len(value) - 10) + value[-4:]
        masked, n = mask_identifier(f"TX-{value[:4]}-{value[4:8]}-{value[8:]}-7")
        assert (masked, n) == (f"TX-{value[:6]}{'*' * (len(value) - 10)}{value[-4:]}-7", 1)
    # the ranges: years, snowflake and sequence ids start outside them; every network inside
    assert [card_issuer_prefix(*f"{n:02d}") for n in (10, 19, 20, 21, 28, 29, 70, 80, 83, 90, 99, 0)] == [False] * 12
    assert all(card_issuer_prefix(*f"{n:02d}") for n in (22, 27, 30, 34, 35, 37, 40, 51, 55, 60, 62, 65, 69, 81, 82))


def _line(txn: str, **extra) -> str:
    doc = {"@timestamp": "2026-11-30T10:15:00.067Z", "ecs.version": "8.11", "txn_id": txn, "decision": "APPROVE",
           "kubernetes": {"namespace": "risk-inference", "pod": {"name": "fraud-0"}}}
    doc.update(extra)
    return json.dumps(doc)


@pytest.fixture
def ingested(sessions, database_url, tmp_path):
    path = tmp_path / "scoring.jsonl"
    lines = [_line(i) for i in ("20261130-00045341", "20261130-00125341", "1000000000000107")]
    lines.append(_line("4111111111111111"))
    lines.append(_line("TX-42", traceId="5555555555554444", spanId="4111111111111111"))
    lines.append(_line("TX-43", traceId="4bf92f3577b34da6a3ce929d0e0e4736", spanId="00f067aa0ba902b7"))
    lines.append(_line("TX-44", traceId="41111111111111110000000000000000"))  # a card in the high half
    path.write_text("\n".join(lines) + "\n")
    return ingest_paths(sessions, settings_for(database_url), [path])


def test_identifier_ids_are_stored_distinct_and_traced(sessions, ingested):
    assert ingested.as_dict() == {"read": 7, "stored": 7, "duplicates": 0, "conflicts": 0, "quarantined": 0,
                                  "pan_masked": 4}  # the card-number id, two trace ids, the span id
    with sessions() as s:
        ids = s.execute(select(InferenceRecord.transaction_id).order_by(InferenceRecord.id)).scalars().all()
        docs = trace(s, ["20261130-00045341", "20261130-00125341", "1000000000000107", "4111111111111111"],
                     cluster="prod-eu")
    assert ids == ["20261130-00045341", "20261130-00125341", "1000000000000107", "411111******1111", "TX-42", "TX-43",
                   "TX-44"]
    assert [d["status"] for d in docs].count("not-found") == 0
    assert docs[3]["transaction_id"] == "411111******1111" and docs[3]["record_id"] is not None  # never echoed whole


def test_card_numbers_in_trace_and_span_ids_are_not_stored(sessions, ingested, database_url):
    with sessions() as s:
        rows = {r.transaction_id: r for r in s.execute(select(InferenceRecord)).scalars()}
        dump = "\n".join(str(tuple(row)) for table in ("inference_records", "ledger")
                         for row in s.execute(text(f"SELECT * FROM {table}")))
    card = rows["TX-42"]
    assert (card.trace_id, card.span_id) == (None, None)
    assert "trace id not stored: its digits read as a card number (PAN)" in card.attributes["draudit.warnings"]
    assert "span id not stored: its digits read as a card number (PAN)" in card.attributes["draudit.warnings"]
    assert rows["TX-44"].trace_id is None
    plain = rows["TX-43"]
    assert (plain.trace_id, plain.span_id) == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    for value in ("5555555555554444", "4111111111111111"):
        assert value not in dump


def test_with_a_token_key_masked_ids_stay_distinct_and_traceable(sessions, database_url, tmp_path):
    """Second newcomer: ids that do start as a card can (``261130…``: a YYMMDD date inside
    Mastercard's 2-series; snowflake ids from 4…) were masked alike and stored as one id, and trace
    returned the other transaction too. With DRAUDIT_PAN_TOKEN_KEY each masked id carries a keyed
    token (HMAC-SHA256): distinct ids stay distinct, trace finds each by the id as logged, and its
    documents name the masked form, never the card number."""
    ids = ["2611300000014242", "2611300000194242", "412345678901234579", "412345999901234579"]
    path = tmp_path / "scoring.jsonl"
    path.write_text("\n".join(_line(i) for i in ids) + "\n")
    key_file = tmp_path / "pan-token.key"
    key_file.write_text("an-operator-secret\n")
    settings = settings_for(database_url, pan_token_key_file=str(key_file))
    counts = ingest_paths(sessions, settings, [path])
    assert (counts.stored, counts.duplicates, counts.conflicts, counts.pan_masked) == (4, 0, 0, 4)
    key = settings.resolved_pan_token_key()
    assert key == b"an-operator-secret"
    with sessions() as s:
        stored = s.execute(select(InferenceRecord.transaction_id).order_by(InferenceRecord.id)).scalars().all()
        docs = trace(s, ids, cluster="prod-eu", pan_token_key=key)
        keyless = trace(s, ids[:1], cluster="prod-eu")
        by_masked_form = trace(s, ["261130******4242"], cluster="prod-eu", pan_token_key=key)
    assert stored == [mask_identifier(i, key)[0] for i in ids] and len(set(stored)) == 4
    assert stored[0].startswith("261130******4242~") and len(stored[0]) == len("261130******4242~") + 16
    assert len({d["record_id"] for d in docs}) == 4 and all(d["status"] != "not-found" for d in docs)
    assert [d["transaction_id"] for d in docs] == stored
    # without the key (or given the masked form) every tokened id of that masked form is a candidate,
    # each named by its own stored id (third newcomer pass: both were "not-found")
    assert [d["transaction_id"] for d in keyless] == sorted(stored[:2])
    assert [d["transaction_id"] for d in by_masked_form] == sorted(stored[:2])
    assert all(d["status"] != "not-found" for d in keyless + by_masked_form)
    for doc in docs + keyless:
        assert not any(i in json.dumps(doc) for i in ids)


def test_an_empty_key_file_is_an_error_not_no_key(tmp_path):
    from collector.errors import UserError

    empty = tmp_path / "key"
    empty.write_text("\n")
    with pytest.raises(UserError, match="the file is empty"):
        settings_for("sqlite://", pan_token_key_file=str(empty)).resolved_pan_token_key()
    assert settings_for("sqlite://", pan_token_key="k", pan_token_key_file=str(empty)).resolved_pan_token_key() == b"k"
