"""``draudit quarantine``: the refused lines with reason, source and position, filterable, masked."""

from __future__ import annotations

import json

from click.testing import CliRunner

from collector.cli import cli

LINES = [
    '{"@timestamp":"2026-11-30T08:00:00Z","txn_id":"T-1","decision":"APPROVE"}',
    '{"@timestamp":"garbage","txn_id":"T-2","decision":"APPROVE"}',
    '{"@timestamp":"2026-11-30T08:00:01Z","decision":"APPROVE","message":"card 4111 1111 1111 1111"}',
    'not json at all',
]


def _run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_quarantined_lines_are_listed_with_reason_position_and_masked_text(tmp_path, database_url):
    path = tmp_path / "app.log"
    path.write_text("\n".join(LINES) + "\n")
    assert _run("db", "upgrade", "--database-url", database_url).exit_code == 0
    ingest = _run("ingest", str(path), "--database-url", database_url)
    assert ingest.exit_code == 0, ingest.output
    assert f"the quarantined lines: draudit quarantine --source {path}" in ingest.output

    out = _run("quarantine", "--database-url", database_url, "--source", str(path), "--output", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["total"] == doc["shown"] == 3
    got = [(d["position"], d["reason"].split(":")[0]) for d in doc["lines"]]
    assert got == [("2", "bad-timestamp"), ("3", "missing-transaction-id"), ("4", "unparseable")]
    assert "4111 1111 1111 1111" not in out.stdout and "411111" in doc["lines"][1]["raw_text"]

    only = json.loads(_run("quarantine", "--database-url", database_url, "--reason", "unparseable",
                           "--output", "json").stdout)
    assert [d["position"] for d in only["lines"]] == ["4"]

    table = _run("quarantine", "--database-url", database_url, "--limit", "2")
    assert table.exit_code == 0
    assert f"{path}:3" in table.output and f"{path}:4" in table.output and f"{path}:2" not in table.output
    assert "(2 of 3 shown" in table.output

    none = _run("quarantine", "--database-url", database_url, "--run", "no-such-run")
    assert none.output.strip() == "no quarantined line matches"

    typo = _run("quarantine", "--database-url", database_url, "--reason", "missing-txn", "--output", "json")
    assert typo.exit_code == 0 and json.loads(typo.stdout)["total"] == 0
    assert typo.stderr == ("draudit: no quarantined line has a reason starting 'missing-txn'; their reasons: "
                           "bad-timestamp (1), missing-transaction-id (1), unparseable (1)\n")
    scoped = _run("quarantine", "--database-url", database_url, "--reason", "zzz", "--source", "nope")
    assert scoped.stderr == ("draudit: no quarantined line selected by --source/--run has a reason starting 'zzz'; "
                             "their reasons: none (--source/--run match no line)\n")


def test_source_given_relative_or_by_file_name_finds_the_recorded_absolute_path(tmp_path, database_url, monkeypatch):
    """A newcomer's finding: `--source fluentbit.jsonl` (the name the pack shows) and a path relative
    to the directory they ingested from matched nothing, silently: only the absolute path the run
    recorded did. A path that names the file from here now matches; a bare name lists the sources of
    that name."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "app.log").write_text("\n".join(LINES) + "\n")
    assert _run("db", "upgrade", "--database-url", database_url).exit_code == 0
    monkeypatch.chdir(tmp_path)
    assert _run("ingest", "logs/app.log", "--database-url", database_url).exit_code == 0
    relative = json.loads(_run("quarantine", "--database-url", database_url, "--source", "logs/app.log",
                               "--output", "json").stdout)
    assert relative["total"] == 3 and {d["source"] for d in relative["lines"]} == {str(logs / "app.log")}
    monkeypatch.chdir(logs.parent.parent)  # elsewhere: the bare name no longer names the file
    bare = _run("quarantine", "--database-url", database_url, "--source", "app.log")
    assert bare.exit_code == 0 and bare.stdout == "no quarantined line matches\n"
    assert bare.stderr == (f"draudit: no quarantined line has source 'app.log'; sources of that name: "
                           f"{logs / 'app.log'} (give one of them to --source)\n")


def test_a_line_refused_again_for_another_reason_is_listed_with_the_new_reason(tmp_path, database_url):
    path = tmp_path / "local.log"
    path.write_text('{"@timestamp":"2026-03-29T02:30:00","txn_id":"T-1","decision":"APPROVE"}\n')
    assert _run("db", "upgrade", "--database-url", database_url).exit_code == 0
    for extra in ([], [], ["--default-tz", "Europe/Berlin"]):  # the same reason twice, then another one
        _run("ingest", str(path), "--database-url", database_url, *extra)
    doc = json.loads(_run("quarantine", "--database-url", database_url, "--output", "json").stdout)
    reasons = [d["reason"].split(":")[0] for d in doc["lines"]]
    assert reasons == ["naive-timestamp", "naive-timestamp"] and doc["total"] == 2
    assert "does not exist in Europe/Berlin" in doc["lines"][-1]["reason"]
    assert doc["lines"][0]["run_id"] != doc["lines"][1]["run_id"]


def test_a_parse_worker_killed_during_ingest_is_one_clear_error(tmp_path, database_url, monkeypatch):
    from collector.ingest import parse_pool
    from collector.ingest.pipeline import IngestRun

    def killed(self, stream, source, on_line=None, *, first_line=1):  # IngestRun.ingest_stream's signature
        raise parse_pool.WorkerEnded("parse worker 4242 ended without answering (exit code -9)")

    monkeypatch.setattr(IngestRun, "ingest_stream", killed)
    path = tmp_path / "app.log"
    path.write_text(LINES[0] + "\n")
    assert _run("db", "upgrade", "--database-url", database_url).exit_code == 0
    result = _run("ingest", str(path), "--database-url", database_url)
    assert result.exit_code == 2
    assert result.output.startswith("draudit: error: parse worker 4242 ended without answering (exit code -9): "
                                    "killed, most likely by the out-of-memory killer")


def test_a_file_name_that_is_not_utf8_is_recorded_with_its_bytes_escaped(tmp_path, database_url):
    """A tester's finding: ``ingest`` of a file whose name holds a non-UTF-8 byte (Latin-1 on an old
    share) died with a 46-line traceback storing the rows (the name as Python holds it, with a lone
    surrogate, is no database text). The source is the path with that byte written ``\\xff``."""
    import os

    name = os.fsdecode(b"bad\xffname.jsonl")
    (tmp_path / name).write_text("\n".join(LINES) + "\n")
    assert _run("db", "upgrade", "--database-url", database_url).exit_code == 0
    ingest = _run("ingest", str(tmp_path / name), "--database-url", database_url, "--output", "json")
    assert ingest.exit_code == 0, ingest.output
    assert {k: json.loads(ingest.stdout)[k] for k in ("read", "stored", "quarantined")} == {
        "read": 4, "stored": 1, "quarantined": 3}
    shown = str(tmp_path) + "/bad\\xffname.jsonl"
    out = json.loads(_run("quarantine", "--database-url", database_url, "--source", shown, "--output", "json").stdout)
    assert out["total"] == 3 and {d["source"] for d in out["lines"]} == {shown}


def test_an_alias_file_that_is_not_utf8_is_one_clear_error(tmp_path, database_url):
    aliases = tmp_path / "aliases.yaml"
    aliases.write_bytes(b"transaction_id: [\xff]\n")
    log = tmp_path / "app.log"
    log.write_text(LINES[0] + "\n")
    result = _run("ingest", str(log), "--aliases", str(aliases), "--database-url", database_url)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert f"alias file {aliases}: not UTF-8 text (byte 0xff at offset 17); save it as UTF-8" in result.output


def test_ingest_under_a_cluster_the_watcher_never_recorded_is_refused_or_warned(tmp_path, database_url, monkeypatch):
    """A newcomer ingested without --cluster into the store `draudit run` fills: the records went in
    as 'default', for ever unattributable, and only `attribute` said so, later. Without --cluster it
    is refused before anything is stored, naming the watched clusters; so is an explicit --cluster
    the watcher never recorded (a newcomer's typo, `bank-eu-inference-l`, was stored for good with a
    warning), unless --allow-unwatched-cluster: then it is stored, with a warning naming the watched ones."""
    from sqlalchemy import insert

    from collector.store.db import make_engine
    from collector.store.models import CoverageInterval

    assert _run("db", "upgrade", "--database-url", database_url).exit_code == 0
    engine = make_engine(database_url)
    with engine.begin() as conn:
        conn.execute(insert(CoverageInterval).values(cluster="bank-eu-inference-1", kind="Pod", state="synced",
                                                     started_ns=1, ended_ns=2))
    engine.dispose()
    path = tmp_path / "app.log"
    path.write_text(LINES[0] + "\n")
    monkeypatch.delenv("DRAUDIT_CLUSTER", raising=False)
    refused = _run("ingest", str(path), "--database-url", database_url)
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert ("no --cluster given: this store's watcher recorded 'bank-eu-inference-1', not 'default' (the default)"
            in refused.output)
    typo = _run("ingest", str(path), "--database-url", database_url, "--cluster", "bank-eu-inference-l")
    assert typo.exit_code == 2 and typo.output == (
        "draudit: error: --cluster 'bank-eu-inference-l': this store's watcher recorded 'bank-eu-inference-1', not it "
        "(did you mean 'bank-eu-inference-1'?); records stored under it could not be attributed until the watcher "
        "records it, and would stay (the store is append-only) — check the name, or give --allow-unwatched-cluster "
        "for a cluster the watcher will record later\n")
    upper = _run("ingest", str(path), "--database-url", database_url, "--cluster", "BANK-EU-INFERENCE-1")
    assert upper.exit_code == 2 and "(did you mean 'bank-eu-inference-1'?)" in upper.output
    engine = make_engine(database_url)
    with engine.connect() as conn:  # nothing stored
        assert conn.exec_driver_sql("SELECT count(*) FROM inference_records").scalar_one() == 0
    engine.dispose()
    result = _run("ingest", str(path), "--database-url", database_url, "--cluster", "default", "--allow-unwatched-cluster")
    assert result.exit_code == 0
    assert ("warning: cluster 'default' has no watch history in this store (watched: bank-eu-inference-1)"
            in result.output)
    quiet = _run("ingest", str(path), "--database-url", database_url, "--cluster", "bank-eu-inference-1")
    assert quiet.exit_code == 0 and "warning" not in quiet.output, quiet.output


def test_the_hint_after_several_inputs_names_each_input_that_had_lines_refused(tmp_path, database_url):
    """It named the first input, which may have had none: pasted, it found nothing (a newcomer's
    finding); with two inputs refused, only the first."""
    assert _run("db", "upgrade", "--database-url", database_url).exit_code == 0
    clean, bad, other = tmp_path / "clean.log", tmp_path / "app.log", tmp_path / "other.log"
    clean.write_text(LINES[0] + "\n")
    bad.write_text("\n".join(LINES) + "\n")
    other.write_text("not json either\n")
    out = _run("ingest", str(clean), str(bad), str(other), "--database-url", database_url)
    assert out.exit_code == 0, out.output
    hints = [line for line in out.output.splitlines() if "draudit quarantine" in line]
    assert hints == [f"  the quarantined lines: draudit quarantine --source {p} --database-url {database_url}"
                     for p in (bad, other)]
    listed = json.loads(_run("quarantine", "--source", str(other), "--database-url", database_url,
                             "--output", "json").stdout)
    assert [d["position"] for d in listed["lines"]] == ["1"]
