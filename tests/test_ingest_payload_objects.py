"""An application record that reaches us already decoded — an object under Fluent Bit's ``log``
(a parser or nest filter upstream, Fluentd's ``hash_value_field log``) or Filebeat's ``message``
(``decode_json_fields`` with ``target: message``) — is the record, as under Vector's ``message``."""

from __future__ import annotations

import json

from click.testing import CliRunner
from sqlalchemy import select

from collector.cli import cli
from collector.store.db import make_engine
from collector.store.models import InferenceRecord

POD = {"name": "fraud-scoring-service-h8z6kd726d-s2rld", "uid": "65a064e2-a545-43d8-8e05-8a93667967d6"}


def _spring(txn: str, at: str) -> dict:
    return {"@timestamp": at, "log": {"level": "INFO", "logger": "c.b.r.ScoringController"}, "message": "scored transaction",
            "ecs": {"version": "8.11"}, "transaction": {"id": txn}, "decision": "APPROVE"}


LINES = [
    {"date": 1796017637.1, "stream": "stdout", "log": _spring("OBJ-FB-1", "2026-11-30T05:47:17.100003Z"),
     "kubernetes": {"pod_name": POD["name"], "namespace_name": "risk-inference", "pod_id": POD["uid"],
                    "container_name": "risk-api", "host": "gpu-node-a"}},
    {"@timestamp": "2026-11-30T05:47:17.300Z", "message": _spring("OBJ-EL-1", "2026-11-30T05:47:17.200001Z"),
     "input": {"type": "filestream"}, "agent": {"type": "filebeat"}, "stream": "stdout",
     "kubernetes": {"pod": POD, "namespace": "risk-inference", "container": {"name": "risk-api"},
                    "node": {"name": "gpu-node-a"}}},
]


def test_decoded_application_objects_are_stored_with_their_own_time_and_the_envelope_pod(database_url, tmp_path):
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", database_url]).exit_code == 0
    path = tmp_path / "objects.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    result = runner.invoke(cli, ["ingest", str(path), "--database-url", database_url, "--output", "json",
                                 "--cluster", "bank-eu-inference-1"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"read": 2, "stored": 2, "duplicates": 0, "conflicts": 0, "quarantined": 0,
                                         "pan_masked": 0}
    engine = make_engine(database_url)
    with engine.connect() as c:
        rows = {r.transaction_id: r for r in c.execute(select(
            InferenceRecord.transaction_id, InferenceRecord.event_time_ns, InferenceRecord.pod_uid,
            InferenceRecord.container_name, InferenceRecord.node_name))}
    engine.dispose()
    assert rows["OBJ-FB-1"].event_time_ns == 1796017637100003000  # the application's time, not the envelope's
    assert rows["OBJ-EL-1"].event_time_ns == 1796017637200001000
    for r in rows.values():
        assert (r.pod_uid, r.container_name, r.node_name) == (POD["uid"], "risk-api", "gpu-node-a")
