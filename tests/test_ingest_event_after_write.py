"""An application time later than the runtime's write time of the same line cannot be right
(log-formats.md §5.4: app event time ≤ CRI time, "a negative gap means a parser/zone bug"): the
record keeps it, with a warning saying by how much, and ``draudit ingest`` counts such records on
stderr — also when parse workers parsed them. Both stores."""

from __future__ import annotations

import json

from click.testing import CliRunner
from sqlalchemy import select

from collector.cli import cli
from collector.ingest import parse_pool
from collector.store.models import InferenceRecord

K8S = {"pod_name": "fraud-api-7c9d8-x2k4q", "namespace_name": "risk-inference",
       "pod_id": "0f3c2a9e-6a51-4d0e-9d7e-1b2c3d4e5f60", "host": "gpu-node-07", "container_name": "api",
       "docker_id": "a3f1c9e27b5d4c8e9f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"}


def _app(txn: str, stamp: str) -> dict:
    return {"@timestamp": stamp, "log": {"level": "INFO", "logger": "com.example.fraud.Scoring"},
            "message": "scored", "txn_id": txn, "model_name": "fraud_xgb", "decision": "APPROVE",
            "ecs": {"version": "8.11"}}


def _fluent(txn: str, stamp: str, written: str) -> str:
    app = _app(txn, stamp)
    return json.dumps({"date": written, "time": written, "stream": "stdout", "_p": "F",
                       "log": json.dumps(app, separators=(",", ":")), "app": app, "kubernetes": K8S},
                      separators=(",", ":"))


def _cri(txn: str, stamp: str, written: str) -> str:
    return f"{written} stdout F {json.dumps(_app(txn, stamp), separators=(',', ':'))}"


def _ingest(database_url: str, path) -> tuple[dict, str]:
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", database_url]).exit_code == 0
    res = runner.invoke(cli, ["ingest", str(path), "--database-url", database_url, "--output", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), res.stderr


def _warnings(sessions) -> dict[str, list[str]]:
    with sessions() as s:
        rows = s.execute(select(InferenceRecord.transaction_id, InferenceRecord.attributes)).all()
    return {txn: (attrs or {}).get("draudit.warnings", []) for txn, attrs in rows}


def test_a_local_time_written_with_a_z_is_kept_with_a_warning(tmp_path, database_url, sessions):
    path = tmp_path / "0.log"
    path.write_text("\n".join([
        _cri("CRI-LATE", "2025-03-04T11:15:00.067Z", "2025-03-04T10:15:00.068000000Z"),  # CET with a Z
        _cri("CRI-OK", "2025-03-04T10:15:01.067Z", "2025-03-04T10:15:01.068000000Z"),
        _cri("CRI-SLACK", "2025-03-04T10:15:02.900Z", "2025-03-04T10:15:02.100000000Z"),  # 0.8 s: a clock step
        _fluent("FB-LATE", "2025-03-04T12:15:00.000Z", "2025-03-04T10:15:00.500Z"),
    ]) + "\n")
    counts, stderr = _ingest(database_url, path)
    assert counts["stored"] == 4
    warned = _warnings(sessions)
    assert warned["CRI-OK"] == [] and warned["CRI-SLACK"] == []
    assert [w for w in warned["CRI-LATE"] if "later than the runtime wrote" in w] == [
        "event time is 3599.999 s later than the runtime wrote the line: a zone or clock problem on the "
        "application's side (an event is logged before it is written); attribution uses the event time as logged"]
    assert any(w.startswith("event time is 7199.500 s later") for w in warned["FB-LATE"])
    with sessions() as s:  # the time as logged is the event time
        t = s.execute(select(InferenceRecord.event_time_ns).where(InferenceRecord.transaction_id == "CRI-LATE")).scalar_one()
    assert t == 1741086900_067000000
    assert "draudit: warning: 2 record(s) have an event time more than a second later than the container runtime" in stderr


def test_records_parsed_by_the_workers_are_counted(tmp_path, database_url, sessions, monkeypatch):
    monkeypatch.setattr(parse_pool, "CHUNK_LINES", 40)
    monkeypatch.setattr(parse_pool, "default_workers", lambda: 2)
    lines = []
    for i in range(200):
        second = f"{i % 60:02d}"
        stamp = f"2025-03-04T1{1 if i % 4 == 0 else 0}:15:{second}.067Z"  # every fourth an hour ahead
        lines.append(_fluent(f"W-{i}", stamp, f"2025-03-04T10:15:{second}.070Z"))
    path = tmp_path / "fb.jsonl"
    path.write_text("\n".join(lines) + "\n")
    counts, stderr = _ingest(database_url, path)
    assert counts["stored"] == 200
    assert sum(1 for w in _warnings(sessions).values() if any("later than the runtime wrote" in x for x in w)) == 50
    assert "draudit: warning: 50 record(s) have an event time" in stderr
