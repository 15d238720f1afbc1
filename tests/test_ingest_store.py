"""Ingestion into the store, on SQLite and PostgreSQL: counts reconcile, dedupe, conflicts,
quarantine, the ledger, the CLI, and no full card number anywhere in the database."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import REGISTRY
from sqlalchemy import func, select, text

from collector.cli import cli
from collector.ingest.pan import luhn_ok
from collector.ingest.pipeline import IngestRun
from collector.settings import Settings
from collector.store import ledger
from collector.store.db import make_engine
from collector.store.models import InferenceRecord, Quarantine

DATA = Path(__file__).parent / "data" / "logs"
POD_UID = "0f3c2a9e-6a51-4d0e-9d7e-1b2c3d4e5f60"
ALL_SAMPLES = sorted(p for p in DATA.iterdir() if p.suffix in (".jsonl", ".log", ".json"))


def settings_for(database_url: str, **kw) -> Settings:
    return Settings(database_url=database_url, cluster="prod-eu", **kw)


def ingest_paths(sessions, settings, paths, **kw):
    run = IngestRun(sessions, settings, **kw)
    for p in paths:
        with open(p, "rb") as f:
            run.ingest_stream(f, str(p))
    return run.finish()


def table_counts(sessions):
    with sessions() as s:
        records = s.scalar(select(func.count()).select_from(InferenceRecord))
        quarantined = s.scalar(select(func.count()).select_from(Quarantine).where(Quarantine.stage == "ingest"))
        conflicts = s.scalar(select(func.count()).select_from(InferenceRecord).where(InferenceRecord.conflict.is_(True)))
    return records, quarantined, conflicts


def test_every_sample_file_reconciles_and_the_ledger_covers_every_row(sessions, database_url):
    counts = ingest_paths(sessions, settings_for(database_url), ALL_SAMPLES, batch_size=7)
    assert counts.reconciles and counts.read > 0
    records, quarantined, conflicts = table_counts(sessions)
    assert (records, quarantined, conflicts) == (counts.stored, counts.quarantined, counts.conflicts)
    # T-000193 is one transaction shipped in 15 files: bare app lines (no pod identity), envelopes
    # with the pod UID, the classic Fluent Bit parser without pod_id (namespace + name only), GELF
    # (millisecond time). One event (writer._scored_again): the bare line, read first, is stored;
    # the first envelope with the pod identity it lacks is stored too (attribution needs it); every
    # other copy adds nothing and is a duplicate; none is a conflict (the application scored it once).
    with sessions() as s:
        rows = s.execute(select(InferenceRecord).where(InferenceRecord.transaction_id == "T-000193")
                         .order_by(InferenceRecord.id)).scalars().all()
        t = 1_741_083_300_067_462_000
        assert [(r.pod_uid, r.pod_name, r.event_time_ns, r.conflict, r.cluster) for r in rows] == [
            (None, None, t, False, "prod-eu"), (POD_UID, "fraud-api-7c9d8-x2k4q", t, False, "prod-eu")]
        verdict = ledger.verify(s)
    assert counts.duplicates >= 14 and counts.conflicts == 0
    assert verdict.ok, verdict.first_break
    assert verdict.entries == records + quarantined


def test_retried_lines_are_stored_once_and_changed_content_is_a_conflict(sessions, database_url):
    settings = settings_for(database_url)
    first = ingest_paths(sessions, settings, [DATA / "fluentbit_merge_off.jsonl"])
    assert first.as_dict() == {"read": 3, "stored": 2, "duplicates": 0, "conflicts": 0, "quarantined": 1, "pan_masked": 0}
    # The same lines again (a shipper retry) and through Vector (another shipper): duplicates.
    again = ingest_paths(sessions, settings, [DATA / "fluentbit_merge_off.jsonl", DATA / "vector.jsonl"])
    assert (again.stored, again.duplicates, again.quarantined) == (0, 4, 2)
    # Same transaction id, different decision: stored again, flagged.
    line = (DATA / "fluentbit_merge_off.jsonl").read_text().splitlines()[0].replace("DECLINE", "APPROVE")
    changed = DATA.parent.parent / "_changed.jsonl"
    try:
        changed.write_text(line + "\n" + line + "\n")
        third = ingest_paths(sessions, settings, [changed])
    finally:
        changed.unlink()
    assert (third.stored, third.conflicts, third.duplicates) == (1, 1, 1)
    with sessions() as s:
        rows = s.execute(select(InferenceRecord.decision, InferenceRecord.conflict)
                         .where(InferenceRecord.transaction_id == "T-000193").order_by(InferenceRecord.id)).all()
    assert [tuple(r) for r in rows] == [("DECLINE", False), ("APPROVE", True)]


def test_conflicts_within_one_batch(sessions, database_url, tmp_path):
    a = '{"@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-7","decision":"APPROVE"}'
    b = '{"@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-7","decision":"DECLINE"}'
    path = tmp_path / "app.log"
    path.write_text("\n".join([a, b, a, b]) + "\n")
    counts = ingest_paths(sessions, settings_for(database_url), [path])
    assert counts.as_dict() == {"read": 4, "stored": 2, "duplicates": 2, "conflicts": 1, "quarantined": 0, "pan_masked": 0}


def test_the_same_line_with_less_pod_identity_is_a_duplicate_not_a_conflict(sessions, database_url, tmp_path):
    """A tester's finding: a Fluent Bit record re-sent without ``kubernetes.pod_id`` (the filter's API
    lookup failed), or the bare application line sent by a second path without any envelope, was
    stored again and flagged ``conflict`` — which tells an auditor the application scored the
    transaction twice differently. The same event with more or less pod identity is a duplicate;
    another pod uid, or another decision, is still a conflict (in one batch and across runs)."""
    full = (DATA / "fluentbit_merge_off.jsonl").read_text().splitlines()[0]
    doc = json.loads(full)
    no_uid = dict(doc, kubernetes={k: v for k, v in doc["kubernetes"].items() if k != "pod_id"})
    bare = doc["log"]
    other_pod = dict(doc, kubernetes=dict(doc["kubernetes"], pod_id="7d1e2b3c-4a5f-4e6d-8c7b-9a0b1c2d3e4f"))
    settings = settings_for(database_url)

    def run(*lines):
        path = tmp_path / "resend.jsonl"
        path.write_text("".join(line + "\n" for line in lines))
        return ingest_paths(sessions, settings, [path]).as_dict()

    def stored():
        with sessions() as s:
            return [tuple(r) for r in s.execute(select(InferenceRecord.pod_uid, InferenceRecord.conflict)
                                                 .where(InferenceRecord.transaction_id == "T-000193")
                                                 .order_by(InferenceRecord.id))]

    assert run(full)["stored"] == 1
    again = run(json.dumps(no_uid), bare)  # a later run: looked up in the store
    assert (again["stored"], again["duplicates"], again["conflicts"]) == (0, 2, 0)
    assert stored() == [(POD_UID, False)]
    assert run(bare, json.dumps(no_uid), full)["duplicates"] == 3
    # another pod's uid for the same event: contradictory, stored and flagged
    assert (run(json.dumps(other_pod))["conflicts"], stored()[-1]) == (1, ("7d1e2b3c-4a5f-4e6d-8c7b-9a0b1c2d3e4f", True))

    # in one batch, the bare line first: each later copy that adds pod identity is stored (the
    # attribution needs it; the stored row cannot be edited), none flagged; a copy adding nothing
    # is a duplicate; another decision is a conflict
    line = bare.replace("T-000193", "T-000194")
    counts = run(line, json.dumps(dict(no_uid, log=line)), json.dumps(dict(doc, log=line)), line,
                 line.replace("DECLINE", "APPROVE"))
    assert {k: counts[k] for k in ("stored", "duplicates", "conflicts")} == {"stored": 4, "duplicates": 1, "conflicts": 1}

    # a newcomer's finding: ingested first under the default cluster name, then again with the
    # watcher's (--cluster, as `attribute`'s unknown-cluster hint says): the second copies are stored
    # (attributable), and are no conflict — the cluster is the collector's label, not the application's
    again = IngestRun(sessions, Settings(database_url=database_url, cluster="bank-eu-inference-1"))
    path = tmp_path / "recluster.jsonl"
    path.write_text(full.replace("T-000193", "T-000199") + "\n")
    first = ingest_paths(sessions, settings, [path]).as_dict()
    with open(path, "rb") as f:
        again.ingest_stream(f, str(path))
    second = again.finish().as_dict()
    assert (first["stored"], second["stored"], second["conflicts"], second["duplicates"]) == (1, 1, 0, 0)

    # a tester's finding: with the bare line first, another pod's uid was swallowed as a duplicate
    # (the bare copy matched any uid); it is a conflict in either order
    for n, order in enumerate(((bare, full, json.dumps(other_pod)), (json.dumps(other_pod), full, bare))):
        lines = [x.replace("T-000193", f"T-00030{n}") for x in order]
        counts = run(*lines)
        assert (counts["conflicts"], counts["stored"] + counts["duplicates"]) == (1, 3), (n, counts)

    # a breaker's finding: the node is not part of the dedup key (every shipper of a line gives one
    # key; a CRI file names no node), so the same event under another node was dropped as a
    # duplicate — the README promises a conflict, in either order, and the copy sent again is a duplicate
    host = doc["kubernetes"]["host"]
    other_node = json.dumps(dict(doc, kubernetes=dict(doc["kubernetes"], host=host + "-b")))
    no_node = json.dumps(dict(doc, kubernetes={k: v for k, v in doc["kubernetes"].items() if k != "host"}))
    for n, order in enumerate(((full, other_node, other_node), (other_node, full, full))):
        counts = run(*[x.replace("T-000193", f"T-00040{n}") for x in order])
        assert {k: counts[k] for k in ("stored", "duplicates", "conflicts")} == {"stored": 2, "duplicates": 1,
                                                                                 "conflicts": 1}, (n, counts)
    assert run(*[x.replace("T-000193", "T-000400") for x in (full, other_node)])["duplicates"] == 2  # a later run
    with sessions() as s:
        assert s.execute(select(InferenceRecord.node_name, InferenceRecord.conflict)
                         .where(InferenceRecord.transaction_id == "T-000401").order_by(InferenceRecord.id)).all() == [
            (host + "-b", False), (host, True)]
    # a copy without the node is a duplicate; one that adds it is stored beside, unflagged (as a copy
    # adding a pod uid is), and a later copy under another node contradicts it (the final tester's
    # finding: with the node-less copy first, both later nodes were duplicates of it)
    counts = run(*[x.replace("T-000193", "T-000410") for x in (no_node, full, no_node, full)])
    assert {k: counts[k] for k in ("stored", "duplicates", "conflicts")} == {"stored": 2, "duplicates": 2, "conflicts": 0}
    counts = run(*[x.replace("T-000193", "T-000411") for x in (no_node, full, other_node, other_node)])
    assert {k: counts[k] for k in ("stored", "duplicates", "conflicts")} == {"stored": 3, "duplicates": 1, "conflicts": 1}
    with sessions() as s:
        assert s.execute(select(InferenceRecord.node_name, InferenceRecord.conflict)
                         .where(InferenceRecord.transaction_id == "T-000411").order_by(InferenceRecord.id)).all() == [
            (None, False), (host, False), (host + "-b", True)]


PANS = ["4111111111111111", "5555555555554444", "378282246310005", "6011111111111117"]


def test_no_full_pan_reaches_the_database(sessions, engine, database_url, backend, tmp_path):
    pod = tmp_path / "var/log/pods" / f"risk-inference_fraud-api-7c9d8-x2k4q_{POD_UID}" / "api" / "0.log"
    pod.parent.mkdir(parents=True)
    app = {"@timestamp": "2025-03-04T10:15:00.067462Z", "log": {"level": "WARN", "logger": "com.example.fraud.ScoringService"},
           "message": "declined card 4111 1111 1111 1111 for velocity", "txn_id": "T-000300",
           "cardNumber": "5555-5555-5555-4444", "pan_number": 378282246310005, "decision": "DECLINE", "latency_ms": 3.1,
           "ecs": {"version": "8.11"}}
    txn_is_pan = dict(app, txn_id="6011111111111117", message="ok")
    lines = [
        f"2025-03-04T10:15:00.067901337Z stdout F {json.dumps(app)}",
        f"2025-03-04T10:15:00.067902Z stdout F {json.dumps(txn_is_pan)}",
        "2025-03-04T10:15:00.067903Z stderr F java.lang.IllegalStateException: card 4111111111111111 rejected",
        # oversize line with a PAN right where the quarantine prefix is cut
        "2025-03-04T10:15:00.067904Z stdout F {\"txn_id\":\"T-1\",\"m\":\"" + "x" * 4030 + " 5555555555554444" + "Y" * 70_000 + "\"}",
    ]
    data = ("\n".join(lines) + "\n").encode() + b'{"txn_id":"T-2","note":"\xff 4111111111111111"}\n'
    pod.write_bytes(data)
    counts = ingest_paths(sessions, settings_for(database_url), [pod])
    assert counts.as_dict() == {"read": 5, "stored": 2, "duplicates": 0, "conflicts": 0, "quarantined": 3,
                                "pan_masked": 9}
    with sessions() as s:
        rec = s.execute(select(InferenceRecord).where(InferenceRecord.transaction_id == "T-000300")).scalar_one()
        assert rec.attributes["message"] == "declined card 411111******1111 for velocity"
        assert rec.attributes["cardNumber"] == "555555******4444"
        assert rec.attributes["pan_number"] == "378282*****0005"
        assert s.scalar(select(func.count()).select_from(InferenceRecord)
                        .where(InferenceRecord.transaction_id == "601111******1117")) == 1
        reasons = s.execute(select(Quarantine.position, Quarantine.reason, Quarantine.raw_text)
                            .order_by(Quarantine.id)).all()
    assert [r.position for r in reasons] == ["3", "4", "5"]
    assert "411111******1111" in reasons[0].raw_text
    if backend == "postgresql":
        dump = []
        with engine.connect() as conn:
            for table in ("inference_records", "quarantine", "ledger"):
                dump += conn.execute(text(f"SELECT row_to_json(t)::text FROM {table} t")).scalars().all()
        blob = "\n".join(dump)
    else:
        engine.dispose()
        db = Path(database_url.removeprefix("sqlite:///"))
        blob = b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*")).decode("latin-1")
    assert "T-000300" in blob  # we are looking at the right data
    for pan in PANS:
        for form in (pan, " ".join([pan[:4], pan[4:8], pan[8:12], pan[12:]]), "-".join([pan[:4], pan[4:8], pan[8:12], pan[12:]])):
            assert form not in blob, f"full PAN {form} found in the {backend} database"


def test_hostile_lines_are_quarantined_with_reason_source_and_position(sessions, database_url, tmp_path):
    path = tmp_path / "hostile.log"
    good = (DATA / "spring_ecs_34_flat.jsonl").read_bytes().splitlines()[0]
    with open(path, "wb") as f:
        f.write(b'{"txn_id":"T-1","a":' + b"[" * 10_000 + b"]" * 10_000 + b"}\n")
        f.write(b'{"txn_id":"T-2","m":"' + b"z" * 10_000_000 + b'"}\n')
        f.write(b'{"txn_id":"T-3","m":"\xc3\x28"}\n')
        f.write(b'{"@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-4","decision":"APPROVE","decision":"DECLINE"}\n')
        f.write(b'{"@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-5","m":"nul \\u0000 here"}\n')
        f.write(b"Picked up JAVA_TOOL_OPTIONS: -javaagent:/otel/opentelemetry-javaagent.jar\n")
        f.write(good + b"\n")
    counts = ingest_paths(sessions, settings_for(database_url), [path])
    assert counts.as_dict() == {"read": 7, "stored": 2, "duplicates": 0, "conflicts": 0, "quarantined": 5, "pan_masked": 0}
    with sessions() as s:
        rows = s.execute(select(Quarantine).order_by(Quarantine.id)).scalars().all()
        nul = s.execute(select(InferenceRecord).where(InferenceRecord.transaction_id == "T-5")).scalar_one()
    assert [(r.position, r.reason.split(":")[0]) for r in rows] == [
        ("1", "nesting-too-deep"), ("2", "line-too-long"), ("3", "not-utf8"), ("4", "duplicate-key"), ("6", "unparseable")]
    assert all(r.source == str(path) and r.stage == "ingest" for r in rows)
    assert len(rows[1].raw_text) <= 4097 and rows[1].raw_text.startswith('{"txn_id":"T-2"')
    assert nul.attributes["m"] == "nul \ufffd here"


def test_metrics_count_committed_outcomes(sessions, database_url):
    def sample(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = (sample("draudit_ingest_lines_total", outcome="stored"), sample("draudit_ingest_lines_total", outcome="quarantined"))
    ingest_paths(sessions, settings_for(database_url), [DATA / "vector.jsonl"])
    after = (sample("draudit_ingest_lines_total", outcome="stored"), sample("draudit_ingest_lines_total", outcome="quarantined"))
    assert (after[0] - before[0], after[1] - before[1]) == (2, 1)


# -- CLI ----------------------------------------------------------------------------------------------


def _migrated(database_url):
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", database_url]).exit_code == 0
    return runner


def test_cli_json_output_is_one_object_with_the_counts(database_url, tmp_path):
    runner = _migrated(database_url)
    gz = tmp_path / "fluentbit.jsonl.gz"
    with gzip.open(gz, "wb") as f:
        f.write((DATA / "fluentbit_merge_log_key.jsonl").read_bytes())
    plain = tmp_path / "vector.jsonl"
    shutil.copy(DATA / "vector.jsonl", plain)
    result = runner.invoke(cli, ["ingest", str(gz), str(plain), "--database-url", database_url, "--output", "json",
                                 "--cluster", "prod-eu"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc == {"read": 6, "stored": 2, "duplicates": 2, "conflicts": 0, "quarantined": 2, "pan_masked": 0}


def test_cli_reads_stdin_and_prints_a_summary(database_url):
    runner = _migrated(database_url)
    body = (DATA / "gelf.jsonl").read_bytes() + b"not json at all\n"
    result = runner.invoke(cli, ["ingest", "-", "--database-url", database_url, "--format", "gelf"], input=body)
    assert result.exit_code == 0, result.output
    assert "read 3  stored 2 (conflicts 0)  duplicates 0  quarantined 1" in result.stdout
    assert "unparseable" in result.stdout


def test_cli_rejects_a_store_without_schema_and_a_missing_file(tmp_path):
    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    result = runner.invoke(cli, ["ingest", str(DATA / "gelf.jsonl"), "--database-url", url])
    assert result.exit_code != 0 and "draudit db upgrade" in result.stderr
    _migrated(url)
    result = runner.invoke(cli, ["ingest", str(tmp_path / "nope.log"), "--database-url", url])
    assert result.exit_code == 2 and "nope.log: cannot open it" in result.stderr


@pytest.mark.parametrize("zone_name", ["Mars/Olympus"])
def test_cli_rejects_an_unknown_default_zone_naming_the_flag_or_the_variable(tmp_path, zone_name, monkeypatch):
    url = f"sqlite:///{tmp_path / 'z.db'}"
    runner = _migrated(url)
    result = runner.invoke(cli, ["ingest", str(DATA / "gelf.jsonl"), "--database-url", url, "--default-tz", zone_name])
    assert result.exit_code == 2 and "IANA" in result.stderr
    assert f"--default-tz={zone_name!r}" in result.stderr and "DRAUDIT_INGEST_DEFAULT_TZ" not in result.stderr
    monkeypatch.setenv("DRAUDIT_INGEST_DEFAULT_TZ", zone_name)
    result = runner.invoke(cli, ["ingest", str(DATA / "gelf.jsonl"), "--database-url", url])
    assert result.exit_code == 2 and f"DRAUDIT_INGEST_DEFAULT_TZ={zone_name!r}" in result.stderr


def test_demo_scenario_logs_reconcile_with_the_generator_counts(sessions, database_url, tmp_path):
    """The fraud-scoring demo's Fluent Bit and OTLP logs: every valid record stored, every planted
    malformed line quarantined, the one card number masked (counts from the generator itself)."""
    from collector.demo_scenario import build_timeline, generate_logs

    logs = generate_logs(build_timeline(1_764_403_200_000_000_000), tmp_path / "logs", n_transactions=120)
    counts = ingest_paths(sessions, settings_for(database_url), [logs.fluentbit_path, logs.otlp_path])
    assert counts.as_dict() == {
        "read": logs.counts["valid"] + logs.counts["malformed"], "stored": logs.counts["valid"], "duplicates": 0,
        "conflicts": 0, "quarantined": logs.counts["malformed"], "pan_masked": logs.counts["pan_lines"]}
    with sessions() as s:
        for sample in logs.sample:
            rec = s.execute(select(InferenceRecord).where(
                InferenceRecord.transaction_id == sample["transaction_id"])).scalar_one()
            assert rec.pod_uid_source == "envelope" and rec.pod_uid
        assert ledger.verify(s).ok


def test_cli_reads_an_otlp_json_document_file_as_a_whole(database_url, engine, tmp_path):
    """An OTLP/JSON ExportLogsServiceRequest saved pretty-printed (collector file exporter, curl)."""
    import json as _json
    import subprocess
    import sys

    doc = _json.loads((DATA / "otlp_logs.json").read_text().splitlines()[0])
    expected = sum(len(sl["logRecords"]) for rl in doc["resourceLogs"] for sl in rl["scopeLogs"])
    pretty = tmp_path / "export.json"
    pretty.write_text(_json.dumps(doc, indent=2))
    out = subprocess.run([sys.executable, "-m", "collector.cli", "ingest", str(pretty), "--output", "json",
                          "--database-url", database_url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    counts = _json.loads(out.stdout)
    assert counts["read"] == expected and counts["stored"] + counts["quarantined"] == expected and counts["stored"] > 0


def test_reingesting_a_file_quarantines_each_line_once_and_still_counts_it(sessions, database_url, tmp_path):
    path = tmp_path / "mixed.log"
    good = (DATA / "spring_ecs_34_flat.jsonl").read_bytes().splitlines()[0]
    path.write_bytes(b"not json\n" + good + b"\n" + b'{"txn_id":"T-1"}\n')
    settings = settings_for(database_url)
    first = ingest_paths(sessions, settings, [path])
    again = ingest_paths(sessions, settings, [path])
    assert (first.stored, first.quarantined) == (1, 2)
    assert again.as_dict() == {"read": 3, "stored": 0, "duplicates": 1, "conflicts": 0, "quarantined": 2, "pan_masked": 0}
    assert again.reconciles
    copy = tmp_path / "copy.log"  # the same lines from another source are that source's quarantine
    shutil.copy(path, copy)
    ingest_paths(sessions, settings, [copy])
    with sessions() as s:
        rows = s.execute(select(Quarantine.source, Quarantine.position).order_by(Quarantine.id)).all()
        verdict = ledger.verify(s)
    assert [tuple(r) for r in rows] == [(str(path), "1"), (str(path), "3"), (str(copy), "1"), (str(copy), "3")]
    assert verdict.ok, verdict.first_break


@pytest.mark.parametrize("output", ["table", "json"])
def test_cli_exits_1_when_lines_were_read_but_none_stored(database_url, tmp_path, output):
    runner = _migrated(database_url)
    bad = tmp_path / "bad.log"
    bad.write_text("plain text\n{\"no\":\"transaction id\"}\n")
    result = runner.invoke(cli, ["ingest", str(bad), "--database-url", database_url, "--output", output])
    assert result.exit_code == 1
    assert "none of the 2 lines read could be stored" in result.stderr
    if output == "json":
        assert json.loads(result.stdout)["quarantined"] == 2
    # Lines already stored by an earlier run are accepted input: exit 0.
    good = tmp_path / "good.log"
    shutil.copy(DATA / "gelf.jsonl", good)
    assert runner.invoke(cli, ["ingest", str(good), "--database-url", database_url]).exit_code == 0
    assert runner.invoke(cli, ["ingest", str(good), "--database-url", database_url]).exit_code == 0
    empty = tmp_path / "empty.log"
    empty.write_text("\n")
    assert runner.invoke(cli, ["ingest", str(empty), "--database-url", database_url]).exit_code == 0


def test_an_integer_beyond_64_bits_is_stored_as_given_and_the_ledger_verifies(sessions, database_url, tmp_path):
    path = tmp_path / "big.log"
    path.write_text('{"@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-9","order":123456789012345678901234567890}\n')
    assert ingest_paths(sessions, settings_for(database_url), [path]).stored == 1
    with sessions() as s:
        (attributes,) = s.execute(select(InferenceRecord.attributes)).one()
        verdict = ledger.verify(s)
    assert attributes == {"order": 123456789012345678901234567890}
    assert verdict.ok, verdict.first_break


def _ecs(txn: str, **fields) -> str:
    doc = {"@timestamp": "2025-03-04T10:15:00.067Z", "ecs.version": "8.11", "txn_id": txn, "decision": "APPROVE",
           "latency_ms": 3.5}
    doc.update(fields)
    return json.dumps(doc)


def _otlp_line(txn: str, time_unix_nano: str) -> str:
    return json.dumps({"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [{"logRecords": [{
        "timeUnixNano": time_unix_nano, "body": {"stringValue": "scored"},
        "attributes": [{"key": "txn_id", "value": {"stringValue": txn}}]}]}]}]})


def test_out_of_range_numbers_are_quarantined_and_the_rest_of_the_file_is_stored(sessions, database_url, tmp_path):
    """A timestamp after 2262 (beyond a signed 64-bit ns count, the column's type) as ISO text, OTLP
    fixed64, CRI runtime time or Log4j epoch seconds: one bad value quarantines its line, never the
    run. A latency beyond a double (or NaN) keeps its transaction: the latency is kept as text in the
    attributes, with a warning (newcomer: "NaN" latency threw the transaction away)."""
    path = tmp_path / "app.log"
    lines = [
        _ecs("T-OK-1"),
        _ecs("T-LAT").replace('"latency_ms": 3.5', '"latency_ms": 1' + "0" * 400),
        _ecs("T-ISO", **{"@timestamp": "9999-12-31T23:59:59.999999999Z"}),
        _ecs("T-OLD", **{"@timestamp": "0001-01-01T00:00:00Z"}),
        _otlp_line("T-OTLP", "10000000000000000000"),
        "9999-12-31T23:59:59.999999999Z stdout F " + json.dumps({"txn_id": "T-CRI", "decision": "APPROVE"}),
        json.dumps({"instant": {"epochSecond": 10 ** 12, "nanoOfSecond": 0}, "txn_id": "T-L4J"}),
        _ecs("T-OK-2"),
    ]
    path.write_text("\n".join(lines) + "\n")
    counts = ingest_paths(sessions, settings_for(database_url), [path])
    assert counts.as_dict() == {"read": 8, "stored": 3, "duplicates": 0, "conflicts": 0, "quarantined": 5,
                                "pan_masked": 0}
    assert counts.reasons == {"bad-timestamp": 5}
    with sessions() as s:
        stored = s.execute(select(InferenceRecord.transaction_id).order_by(InferenceRecord.id)).scalars().all()
        reasons = dict(s.execute(select(Quarantine.position, Quarantine.reason)).all())
        lat = s.execute(select(InferenceRecord).where(InferenceRecord.transaction_id == "T-LAT")).scalar_one()
        assert ledger.verify(s).ok
    assert stored == ["T-OK-1", "T-LAT", "T-OK-2"]
    assert lat.latency_ms is None and lat.attributes["latency_ms"] == "1" + "0" * 400
    assert "latency field 'latency_ms' is not a finite number of milliseconds; kept in attributes as text" in \
        lat.attributes["draudit.warnings"]
    assert all("out of range" in reasons[p] for p in ("3", "4", "5:rl0.sl0.lr0", "6", "7"))


# Separators a PAN arrives with, as the application writes them (json.dumps turns a newline into
# the escape \n in the raw line; a shipper's envelope escapes it once more).
PAN_SPELLINGS = ["4111  1111  1111  1111", "4111\n1111\n1111\n1111", "4111/1111/1111/1111", "4111_1111_1111_1111",
                 "5555 - 5555 - 5555 - 4444", "3782\r\n822463\r\n10005"]
_SEPARATORS = re.compile(r"[\s\-/_.\u00a0]|\\+(?:[ntr/]|u00a0)")


def _database_text(engine, database_url, backend) -> str:
    if backend == "postgresql":
        dump = []
        with engine.connect() as conn:
            for table in ("inference_records", "quarantine", "ledger"):
                dump += conn.execute(text(f"SELECT row_to_json(t)::text FROM {table} t")).scalars().all()
        return "\n".join(dump)
    engine.dispose()
    db = Path(database_url.removeprefix("sqlite:///"))
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*")).decode("latin-1")


@pytest.mark.parametrize("spelling", PAN_SPELLINGS)
def test_no_pan_spelling_reaches_the_database_or_quarantine(sessions, engine, database_url, backend, tmp_path, spelling):
    app = {"@timestamp": "2025-03-04T10:15:00.067Z", "ecs.version": "8.11", "txn_id": "T-PAN",
           "message": f"declined card {spelling} for velocity", "card": spelling}
    fluent = {"log": json.dumps(app), "kubernetes": {"namespace_name": "risk-inference", "pod_name": "p",
                                                     "container_name": "api"}}
    lines = [json.dumps(app),                                       # stored: message and attribute
             json.dumps(dict(app, txn_id="T-PAN-2", card=None)).replace('"card": null', '"card": 1'),
             json.dumps(fluent).replace("T-PAN", "T-PAN-3"),        # escaped twice inside the envelope
             json.dumps({"no_txn": True, "note": f"card {spelling}"}),          # quarantined JSON
             json.dumps(dict(fluent, log=f"plain text card {spelling}")),      # quarantined, in an envelope
             f"plain text card {spelling}".replace("\n", " ").replace("\r", " ")]  # quarantined plain text
    path = tmp_path / "pans.log"
    path.write_text("\n".join(lines) + "\n")
    counts = ingest_paths(sessions, settings_for(database_url), [path])
    assert (counts.read, counts.stored, counts.quarantined) == (6, 3, 3) and counts.reconciles
    assert counts.pan_masked == 8  # 2 + 1 + 2 stored, 1 per quarantined line
    with sessions() as s:
        message = s.execute(select(InferenceRecord.attributes).where(InferenceRecord.transaction_id == "T-PAN")).scalar_one()
    digits = re.sub(r"\D", "", spelling)
    assert message["card"] == f"{digits[:6]}{'*' * (len(digits) - 10)}{digits[-4:]}"
    blob = _database_text(engine, database_url, backend)
    assert "T-PAN-3" in blob  # we are looking at the right data
    assert digits not in _SEPARATORS.sub("", blob), f"full PAN spelled {spelling!r} found in the {backend} database"


def _otlp_export_line(first_txn: int, n_records: int, time_ns: int = 1_741_083_300_067_462_000) -> str:
    """One OpenTelemetry Collector ``file`` exporter line: an ExportLogsServiceRequest, compact JSON."""
    records = [{"timeUnixNano": str(time_ns + i), "severityText": "INFO",
                "body": {"stringValue": "scored transaction " + "x" * 200},
                "attributes": [{"key": "txn_id", "value": {"stringValue": f"T-{first_txn + i:06d}"}},
                               {"key": "decision", "value": {"stringValue": "APPROVE"}}]} for i in range(n_records)]
    doc = {"resourceLogs": [{"resource": {"attributes": [
        {"key": "k8s.pod.uid", "value": {"stringValue": POD_UID}},
        {"key": "k8s.namespace.name", "value": {"stringValue": "risk-inference"}}]},
        "scopeLogs": [{"scope": {"name": "scoring"}, "logRecords": records}]}]}
    return json.dumps(doc, separators=(",", ":"))


@pytest.mark.parametrize("fmt", ["auto", "otlp"])
def test_otlp_file_exporter_lines_are_held_to_the_body_limit_not_the_line_limit(sessions, database_url, tmp_path, fmt):
    lines = [_otlp_export_line(0, 500), _otlp_export_line(500, 500), _otlp_export_line(1000, 2000)]
    assert 64 * 1024 < len(lines[0]) < 400_000 < len(lines[2])
    path = tmp_path / "otel-file-exporter.jsonl"
    path.write_text("\n".join(lines) + "\n")
    settings = settings_for(database_url, ingest_max_body_bytes=400_000)
    counts = ingest_paths(sessions, settings, [path], forced_format=fmt)
    # The quarantined prefix of line 3 shows 19-digit timeUnixNano values, about one in ten of
    # which passes Luhn: nanosecond times, not card numbers.
    assert counts.as_dict() == {"read": 1001, "stored": 1000, "duplicates": 0, "conflicts": 0, "quarantined": 1,
                                "pan_masked": 0}
    with sessions() as s:
        position, reason, raw_text = s.execute(select(Quarantine.position, Quarantine.reason, Quarantine.raw_text)).one()
    assert position == "3" and reason.startswith("line-too-long: OTLP export request line of")
    assert "DRAUDIT_INGEST_MAX_BODY_BYTES" in reason
    assert luhn_ok(str(1_741_083_300_067_462_000 + 4))  # the fifth record's time
    assert all(f'"timeUnixNano":"{1_741_083_300_067_462_000 + i}"' in raw_text for i in range(5))


def test_cli_reads_an_otlp_document_and_json_lines_that_start_with_a_byte_order_mark(database_url, tmp_path):
    runner = _migrated(database_url)
    doc = tmp_path / "export.json"
    doc.write_bytes(b"\xef\xbb\xbf" + json.dumps(json.loads((DATA / "otlp_logs.json").read_text()), indent=2).encode())
    lines = tmp_path / "gelf.jsonl"
    lines.write_bytes(b"\xef\xbb\xbf" + (DATA / "gelf.jsonl").read_bytes())
    # (read, stored): one OTLP record of the sample lacks its id; GELF's T-000193 is the OTLP
    # record's event (its millisecond time covers the other's), a duplicate
    expected = {doc: (4, 3), lines: (2, 1)}
    for path in (doc, lines):
        result = runner.invoke(cli, ["ingest", str(path), "--database-url", database_url, "--output", "json"])
        assert result.exit_code == 0, result.output
        counts = json.loads(result.stdout)
        assert (counts["read"], counts["stored"]) == expected[path], (path.name, counts)


@pytest.mark.parametrize("cut", [0.6, 0.02])
def test_cli_truncated_gzip_names_the_file_and_stores_what_came_before(database_url, engine, tmp_path, cut):
    runner = _migrated(database_url)
    line = (DATA / "spring_ecs_34_flat.jsonl").read_text().splitlines()[0]
    assert "T-000193" in line
    lines = [line.replace("T-000193", f"T-{i:06d}").replace("10:15:00", f"10:{i % 60:02d}:{i // 60 % 60:02d}")
             for i in range(5000)]
    whole = gzip.compress(("\n".join(lines) + "\n").encode())
    cut_file = tmp_path / "app.log.gz"
    cut_file.write_bytes(whole[:int(len(whole) * cut)])
    good = tmp_path / "gelf.jsonl"
    shutil.copy(DATA / "gelf.jsonl", good)
    result = runner.invoke(cli, ["ingest", str(cut_file), str(good), "--database-url", database_url, "--output", "json"])
    assert result.exit_code == 2
    assert f"{cut_file}: the gzip data ends early" in result.stderr and "counts above" in result.stderr
    counts = json.loads(result.stdout)
    with engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(InferenceRecord)).scalar_one()
    assert counts["stored"] == stored and counts["read"] == counts["stored"] + counts["quarantined"]
    readable = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut_file.read_bytes())  # all that can be read
    assert counts["read"] - 2 == readable.count(b"\n") + (not readable.endswith(b"\n")) > 0  # + gelf.jsonl's 2
    assert counts["quarantined"] == (not readable.endswith(b"\n"))  # the line cut in the middle


def test_cli_names_the_flag_for_a_bad_flag_value_and_the_variable_for_a_bad_environment_value(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'f.db'}"
    runner = _migrated(url)
    result = runner.invoke(cli, ["ingest", str(DATA / "gelf.jsonl"), "--database-url", url, "--cluster", " "])
    assert result.exit_code == 2 and "draudit: error: --cluster must not be empty" in result.stderr
    monkeypatch.setenv("DRAUDIT_CLUSTER", " ")
    result = runner.invoke(cli, ["ingest", str(DATA / "gelf.jsonl"), "--database-url", url])
    assert result.exit_code == 2 and "draudit: error: DRAUDIT_CLUSTER must not be empty" in result.stderr


def test_a_cluster_name_holding_a_card_number_is_refused_before_anything_is_stored(tmp_path, engine, database_url):
    """The cluster name is stored in every row as given: one holding a PAN was stored whole."""
    runner = _migrated(database_url)
    result = runner.invoke(cli, ["ingest", str(DATA / "gelf.jsonl"), "--database-url", database_url,
                                 "--cluster", "bank-4111 1111 1111 1111"])
    assert result.exit_code == 2
    assert "draudit: error: --cluster must not hold a card number (PAN)" in result.stderr
    assert "4111" not in result.stderr
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(InferenceRecord)).scalar_one() == 0
    ok = runner.invoke(cli, ["ingest", str(DATA / "gelf.jsonl"), "--database-url", database_url,
                             "--cluster", "bank-eu-inference-20251129-0001"])  # digits, no card number
    assert ok.exit_code == 0, ok.output


def _otlp_protobuf(body: str) -> bytes:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

    record = LogRecord(time_unix_nano=1_741_083_300_067_462_000, body=AnyValue(string_value=body),
                       attributes=[KeyValue(key="txn_id", value=AnyValue(string_value="T-PB"))])
    return ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=[record])])]).SerializeToString()


def test_no_pan_cut_off_before_arrival_or_inside_binary_data_reaches_quarantine(sessions, engine, database_url, backend, tmp_path):
    from collector.ingest.pipeline import open_input

    cut_json = tmp_path / "cut.log"  # the writer died mid-line: 15 of 16 digits, the 16th is the check digit
    cut_json.write_bytes(b'{"txn_id":"T-CUT","message":"card 4111 1111 1111 111\n')
    partial = tmp_path / "partial.log"  # a CRI partial never completed, cut right after 15 digits
    partial.write_bytes(b"2025-03-04T10:15:00.067Z stdout P card 411111111111111\n")
    whole = gzip.compress(b'{"txn_id":"T-GZ","message":"card 5555555555554444 declined"}\n', compresslevel=0)  # stored: cut anywhere
    cut_gz = tmp_path / "cut.log.gz"  # ends early, within the PAN
    cut_gz.write_bytes(next(whole[:n] for n in range(len(whole), 0, -1)
                            if zlib.decompressobj(31).decompress(whole[:n]).endswith(b"555555555555444")))
    protobuf = tmp_path / "otlp.pb"  # read as lines: a tag byte "2" touches the PAN (17 digits)
    protobuf.write_bytes(_otlp_protobuf("card 4111111111111111"))
    assert b"41111111111111112" in protobuf.read_bytes()
    run = IngestRun(sessions, settings_for(database_url))
    for path in (cut_json, partial, cut_gz, protobuf):
        stream, _position, _size = open_input(str(path))
        with stream:
            run.ingest_stream(stream, str(path))
    counts = run.finish()
    assert counts.stored == 0 and counts.quarantined == counts.read and counts.pan_masked >= 4
    with sessions() as s:
        raw = dict(s.execute(select(Quarantine.source, Quarantine.raw_text).where(Quarantine.source != str(protobuf))).all())
    assert raw[str(cut_json)] == '{"txn_id":"T-CUT","message":"card 411111*********'
    assert raw[str(partial)] == "2025-03-04T10:15:00.067Z stdout P card 411111*********"
    assert raw[str(cut_gz)] == '{"txn_id":"T-GZ","message":"card 555555*********'
    blob = _SEPARATORS.sub("", _database_text(engine, database_url, backend))
    assert "TCUT" in blob and "TGZ" in blob  # we are looking at the right data (separators removed)
    for prefix in ("411111111111111", "555555555555444"):
        assert prefix not in blob, f"15 digits of a PAN found in the {backend} database"


def test_cli_refuses_an_otlp_protobuf_file_naming_it_and_the_http_endpoint(database_url, engine, tmp_path):
    runner = _migrated(database_url)
    protobuf = tmp_path / "otlp.pb"
    protobuf.write_bytes(_otlp_protobuf("card 4111111111111111"))
    packed = tmp_path / "otlp.pb.gz"
    packed.write_bytes(gzip.compress(protobuf.read_bytes()))
    good = tmp_path / "gelf.jsonl"
    shutil.copy(DATA / "gelf.jsonl", good)
    for path in (protobuf, packed):
        result = runner.invoke(cli, ["ingest", str(good), str(path), "--database-url", database_url])
        assert result.exit_code == 2
        assert f"{path}: this is binary OTLP protobuf" in result.stderr and "POST /v1/logs" in result.stderr
    with engine.connect() as conn:  # refused before anything was read, also the good file
        assert conn.execute(select(func.count()).select_from(InferenceRecord)).scalar_one() == 0
    blank_lines_first = tmp_path / "blank-first.jsonl"  # starts with 0x0a too, and is text
    blank_lines_first.write_bytes(b"\n\n\n" + (DATA / "gelf.jsonl").read_bytes())
    result = runner.invoke(cli, ["ingest", str(blank_lines_first), "--database-url", database_url, "--output", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["stored"] == 2


def test_a_file_named_by_a_relative_path_is_the_same_source_from_any_directory(database_url, tmp_path, monkeypatch):
    # A CRI file under /var/log/pods/<ns>_<pod>_<uid>/<container>/: the path is the pod identity,
    # and (source, line) the quarantine position, whatever directory the command ran in.
    runner = _migrated(database_url)
    uid = "65a064e2-a545-43d8-8e05-8a93667967d6"
    container_dir = tmp_path / "var/log/pods" / f"risk-inference_fraud-scoring-service-h8z6kd726d-s2rld_{uid}" / "risk-api"
    container_dir.mkdir(parents=True)
    log = container_dir / "0.log"
    log.write_bytes((DATA / "cri_containerd.log").read_bytes() + b"2025-03-04T10:15:09.000000000Z stdout F not json\n")
    relative = log.relative_to(tmp_path)
    runs = []
    for cwd, path in ((tmp_path, relative), (container_dir, Path("0.log")), (tmp_path / "var", log.relative_to(tmp_path / "var"))):
        monkeypatch.chdir(cwd)
        result = runner.invoke(cli, ["ingest", str(path), "--database-url", database_url, "--output", "json",
                                     "--cluster", "prod-eu"])
        assert result.exit_code == 0, result.output
        runs.append(json.loads(result.stdout))
    assert runs[0]["stored"] >= 1 and runs[0]["quarantined"] >= 1
    assert [r["stored"] for r in runs[1:]] == [0, 0] and [r["conflicts"] for r in runs] == [0, 0, 0]
    engine = make_engine(database_url)
    with engine.connect() as c:
        uids = {u for (u,) in c.execute(select(InferenceRecord.pod_uid))}
        sources = {s for (s,) in c.execute(select(Quarantine.source))}
        quarantined = c.execute(select(func.count()).select_from(Quarantine)).scalar_one()
    engine.dispose()
    assert uids == {uid}
    assert sources == {str(log)} and quarantined == runs[0]["quarantined"]
