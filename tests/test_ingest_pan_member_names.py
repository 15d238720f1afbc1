"""A card number that only the flattened record shows: nested member names joined by dots.

Spring Boot 3.5's nested ECS turns a dotted MDC name into nested objects (log-formats.md §1.2), so
``{"4790":{"4242":{"7528":{"3271":"x"}}}}`` is the attribute ``4790.4242.7528.3271`` — a card in
dotted 4-digit groups, which the README says is masked. The raw line shows its groups apart,
between quotes and braces, so the line pre-filter let it through unmasked (breaker's finding).
Both stores; the parse workers' fast path declines such a line."""

from __future__ import annotations

import hashlib
import json
import re

from click.testing import CliRunner
from sqlalchemy import select

from collector.cli import cli
from collector.ingest import fastpath
from collector.ingest.pan import mask_text, member_names_may_contain_pan
from collector.ingest.parser import LineParser
from collector.store.models import InferenceRecord
from tests.test_ingest_pan_separators_numbers import _dump

APP = {"@timestamp": "2025-06-04T10:15:00.067Z", "ecs": {"version": "8.11"}, "log": {"level": "INFO"},
       "message": "scored", "txn_id": "NK-1", "decision": "APPROVE",
       "4790": {"4242": {"7528": {"3271": "x"}}}, "card": {"5830": {"3296": {"9699": {"4241": 1}}}}}
K8S = {"pod_name": "fraud-api-7c9d8-x2k4q", "namespace_name": "risk-inference",
       "pod_id": "0f3c2a9e-6a51-4d0e-9d7e-1b2c3d4e5f60", "host": "gpu-node-07", "container_name": "api"}


def test_nested_member_names_that_join_into_a_card_are_masked(tmp_path, database_url, sessions, engine):
    raw = json.dumps(APP, separators=(",", ":"))
    fluent = {"time": "2025-06-04T10:15:00.1Z", "stream": "stdout", "_p": "F", "log": raw, "app": APP,
              "kubernetes": K8S}
    path = tmp_path / "app.jsonl"
    path.write_text(raw.replace("NK-1", "NK-2") + "\n" + json.dumps(fluent, separators=(",", ":")) + "\n")
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", database_url]).exit_code == 0
    res = runner.invoke(cli, ["ingest", str(path), "--database-url", database_url, "--output", "json"])
    assert json.loads(res.stdout) == {"read": 2, "stored": 2, "duplicates": 0, "conflicts": 0, "quarantined": 0,
                                      "pan_masked": 4}
    with sessions() as s:
        rows = s.execute(select(InferenceRecord.transaction_id, InferenceRecord.attributes, InferenceRecord.raw_sha256)
                         .order_by(InferenceRecord.transaction_id)).all()
    for _txn, attributes, raw_sha256 in rows:
        assert "479042******3271" in attributes and attributes["card.583032******4241"] == 1
        assert not any(re.sub(r"\D", "", k).startswith(("4790424275283271", "5830329699424241")) for k in attributes)
    # the raw hash is over the line with its digits hidden: a hash over the groups in clear gives them away
    assert rows[1][2] == hashlib.sha256(re.sub(r"\d", "*", mask_text(raw.replace("NK-1", "NK-2"))[0]).encode()).hexdigest()
    dump = re.sub(r"[ .\-]", "", _dump(engine, database_url))  # every row, and SQLite's file and WAL
    assert "4790424275283271" not in dump and "5830329699424241" not in dump


def test_the_fast_path_declines_it_and_the_names_prefilter_is_conservative():
    parser = LineParser(cluster="prod-eu")
    line = json.dumps({"time": "2025-06-04T10:15:00.1Z", "stream": "stdout", "_p": "F",
                       "log": json.dumps(APP, separators=(",", ":")), "app": APP, "kubernetes": K8S},
                      separators=(",", ":")).encode()
    assert fastpath.unit(parser, line, "src", "1") is None
    assert member_names_may_contain_pan(["log.level", "process.thread.name", "2024.0611"]) is False
    assert member_names_may_contain_pan(["a.4111", "1111.1111.1111"]) is True  # a run across two names: conservative
    assert member_names_may_contain_pan(["x.4111.1111.1111.1111"]) is True
    assert member_names_may_contain_pan(["ｘ.４１１１"]) is True  # non-ASCII digits: the full test


NESTED_PAN = {"4111": {"1111": {"1111": {"1111": "x"}}}}


def test_nested_names_in_quarantine_and_in_arrays_are_starred(tmp_path, database_url, sessions, engine):
    """The final tester's findings: the same nesting in a line that is quarantined (any reason: here
    no transaction id; also escaped inside a Fluent Bit ``log`` string, and an OTLP record's kvlist),
    and inside an array (flattening keeps arrays as values; OTLP ``arrayValue``) — stored in clear."""
    otlp = {"resourceLogs": [{"resource": {"attributes": [{"key": "k8s.namespace.name", "value": {"stringValue": "fraud"}}]},
                              "scopeLogs": [{"logRecords": [
                                  {"timeUnixNano": "1796094302000000000", "body": {"stringValue": "scored"},
                                   "attributes": [{"key": "txn_id", "value": {"stringValue": "NA-O"}},
                                                  {"key": "x", "value": {"arrayValue": {"values": [{"kvlistValue": {"values": [
                                                      {"key": "4111", "value": {"kvlistValue": {"values": [
                                                          {"key": "1111", "value": {"kvlistValue": {"values": [
                                                              {"key": "1111", "value": {"kvlistValue": {"values": [
                                                                  {"key": "1111", "value": {"stringValue": "v"}}]}}}]}}}]}}}]}}]}}}]},
                                  {"timeUnixNano": "1796094303000000000", "body": {"stringValue": "no txn"},
                                   "attributes": [{"key": "4111", "value": {"kvlistValue": {"values": [
                                       {"key": "1111", "value": {"kvlistValue": {"values": [
                                           {"key": "1111", "value": {"kvlistValue": {"values": [
                                               {"key": "1111", "value": {"stringValue": "v"}}]}}}]}}}]}}}]}]}]}]}
    app_no_txn = {"@timestamp": "2026-12-01T03:00:05.100Z", "message": "hello", **NESTED_PAN}
    lines = [json.dumps(app_no_txn),
             json.dumps({"time": "2026-12-01T03:00:05.2Z", "stream": "stdout", "_p": "F",
                         "log": json.dumps(app_no_txn), "kubernetes": K8S}),
             json.dumps({"@timestamp": "2026-12-01T03:04:01.100Z", "message": "scored", "txn_id": "NA-1",
                         "kv": [NESTED_PAN, {"deeper": [NESTED_PAN]}]}),
             json.dumps(otlp)]
    path = tmp_path / "nested.jsonl"
    path.write_text("\n".join(lines) + "\n")
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", database_url]).exit_code == 0
    res = runner.invoke(cli, ["ingest", str(path), "--database-url", database_url, "--output", "json"])
    counts = json.loads(res.stdout)
    assert (counts["read"], counts["stored"], counts["quarantined"]) == (5, 2, 3)
    assert counts["pan_masked"] >= 5
    with sessions() as s:
        stored = dict(s.execute(select(InferenceRecord.transaction_id, InferenceRecord.attributes)).all())
    assert stored["NA-1"]["kv"] == [{"****": {"****": {"****": {"****": "x"}}}}, {"deeper": [{"****": {"****": {"****": {"****": "x"}}}}]}]
    assert stored["NA-O"]["x"] == [{"****": {"****": {"****": {"****": "v"}}}}]
    dump = _dump(engine, database_url)
    for shown in ('"4111": {"1111"', '"4111":{"1111"', '\\\\"4111\\\\":{\\\\"1111', "'4111': {'1111'", '\\"4111\\": {\\"1111'):
        assert shown not in dump, shown
    quarantined = runner.invoke(cli, ["quarantine", "--database-url", database_url]).output
    assert quarantined.count('"****":{"****"') + quarantined.count('\\"****\\": {\\"****') >= 2 and "4111" not in quarantined


def test_the_names_a_reader_joins_are_its_paths_not_the_names_in_text_order():
    """A sibling with a digit between the groups (``{"4111":{"a1":0,"1111":…}}``) hid the card from a
    check that joined every digit-holding name in text order; the paths ``4111.1111.1111.1111`` and
    ``4111.a1`` are what a reader gets. Conversely, names of different paths never form one card."""
    from collector.ingest.pan import mask_member_name_digits, mask_names_in_arrays, record_names_may_contain_pan

    interleaved = {"4111": {"a1": 0, "1111": {"1111": {"1111": "x"}}}}
    line = json.dumps({"message": "x", **interleaved}, separators=(",", ":"))
    assert mask_member_name_digits(line) == (line.replace("4111", "****").replace("1111", "****").replace("a1", "a*"), 1)
    in_log = json.dumps({"log": line, "stream": "stdout"})  # escaped inside a Fluent Bit log string
    assert mask_member_name_digits(in_log)[1] == 1 and "4111" not in mask_member_name_digits(in_log)[0]
    assert record_names_may_contain_pan({"kv": [interleaved]})
    assert mask_names_in_arrays([interleaved]) == ([{"****": {"a*": 0, "****": {"****": {"****": "x"}}}}], 1)
    apart = json.dumps({"c": {"4111": 1}, "d": {"1111": {"1111": {"1111": 1}}}})
    assert mask_member_name_digits(apart) == (apart, 0)  # two paths, no card in either
    cut = 'not json "4111":{"1111":{"1111":{"1111":1'  # undecodable: the names in text order
    assert mask_member_name_digits(cut)[1] == 1
