"""Spring Boot GELF lines (``logging.structured.format.console=gelf``, log-formats.md §1.4, §7.1)
through ``draudit ingest`` into the store, bare and inside a Fluent Bit envelope.

The lines are shaped like Spring's ``GraylogExtendedLogFormatStructuredLogFormatter`` output:
``timestamp`` is epoch seconds written with exactly 3 decimals (``….500``, ``….000``), which a
JSON decoder turns into a float that no longer shows them.
"""

from __future__ import annotations

import json

from click.testing import CliRunner
from sqlalchemy import select

from collector.cli import cli
from collector.ingest.aliases import gelf_fields, gelf_timestamp
from collector.store.models import InferenceRecord

POD_UID = "0b7f3a5e-1111-4222-8333-444455556666"
KUBERNETES = {"pod_name": "fraud-api-0", "namespace_name": "payments", "pod_id": POD_UID, "host": "gpu-node-07",
              "container_name": "api", "docker_id": "a3f1c9e2" * 8}
# 2025-06-04T10:15:00.500Z as Spring writes it; its ms value ends in zeros.
SCORED = ('{"version":"1.1","short_message":"scored","timestamp":1749032100.500,"level":6,"_level_name":"INFO",'
          '"_process_pid":1,"_process_thread_name":"http-nio-8080-exec-3","host":"fraud-api",'
          '"_service_version":"2.7.1","_log_logger":"com.example.fraud.ScoringService",'
          '"_traceId":"4bf92f3577b34da6a3ce929d0e0e4736","_spanId":"00f067aa0ba902b7","_transaction_id":"T-000201",'
          '"_model_name":"fraud_xgb","_decision":"DECLINE","_latency_ms":12.4,"_message":"an MDC key named message"}')
# On a whole second, with a throwable; no _level_name (a GELF writer that only sends the syslog level).
FAILED = ('{"version":"1.1","short_message":"scoring failed","full_message":"scoring failed\\n\\n'
          'java.lang.IllegalStateException: boom\\n\\tat com.example.fraud.ScoringService.score(ScoringService.java:42)",'
          '"timestamp":1749032101.000,"level":3,"host":"fraud-api","_log_logger":"com.example.fraud.ScoringService",'
          '"_txn_id":"T-000202","_error_type":"java.lang.IllegalStateException","_error_message":"boom"}')
T201_NS = 1_749_032_100_500_000_000
T202_NS = 1_749_032_101_000_000_000


def _fluentbit(app_line: str, merged: bool) -> str:
    """The app line as Fluent Bit's kubernetes filter ships it: the raw ``log`` string (Merge_Log Off)
    or its members at the top level (Merge_Log On, Keep_Log Off)."""
    envelope = {"date": 1749032102.123456, "time": "2025-06-04T10:15:02.123456789Z", "stream": "stdout", "_p": "F",
                "kubernetes": KUBERNETES}
    if merged:
        return json.dumps({**envelope, **json.loads(app_line)})
    return json.dumps({**envelope, "log": app_line})


def _ingest(tmp_path, database_url: str, lines: list[str]) -> list[InferenceRecord]:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", database_url]).exit_code == 0
    path = tmp_path / "gelf.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = runner.invoke(cli, ["ingest", str(path), "--database-url", database_url, "--output", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stored"] == len(lines)
    engine = create_engine(database_url)
    try:
        with Session(engine) as s:
            return list(s.scalars(select(InferenceRecord).order_by(InferenceRecord.transaction_id,
                                                                   InferenceRecord.envelope)))
    finally:
        engine.dispose()


def test_spring_gelf_maps_message_time_level_logger_and_mdc(tmp_path, database_url):
    scored, failed = _ingest(tmp_path, database_url, [SCORED, FAILED])
    assert (scored.transaction_id, scored.source_format, scored.envelope) == ("T-000201", "gelf", "none")
    # Milliseconds, also when the value ends in zeros or is a whole second (Spring writes 3 decimals).
    assert (scored.event_time_ns, scored.event_time_precision_ns) == (T201_NS, 1_000_000)
    assert (failed.event_time_ns, failed.event_time_precision_ns) == (T202_NS, 1_000_000)
    assert (scored.trace_id, scored.span_id, scored.model_name, scored.decision, scored.latency_ms) == (
        "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "fraud_xgb", "DECLINE", 12.4)
    a = scored.attributes
    # short_message is the message; the MDC key "message" (written _message) does not replace it.
    assert a["message"] == "scored" and a["_message"] == "an MDC key named message"
    assert (a["log.level"], a["log.syslog.severity.code"], a["log.logger"]) == (
        "INFO", 6, "com.example.fraud.ScoringService")
    assert (a["process.pid"], a["process.thread.name"], a["service.version"]) == (1, "http-nio-8080-exec-3", "2.7.1")
    for gone in ("short_message", "level", "level_name", "_level_name", "log_logger", "transaction_id", "timestamp"):
        assert gone not in a
    f = failed.attributes
    assert f["message"] == "scoring failed" and f["full_message"].startswith("scoring failed\n\njava.lang.Illegal")
    assert f["log.level"] == "ERROR"  # from the syslog severity 3
    assert (f["error.type"], f["error.message"]) == ("java.lang.IllegalStateException", "boom")


def test_spring_gelf_inside_a_fluent_bit_envelope(tmp_path, database_url):
    merged_line = SCORED.replace("T-000201", "T-000203")
    rows = _ingest(tmp_path, database_url, [_fluentbit(SCORED, merged=False), _fluentbit(merged_line, merged=True)])
    assert [(r.transaction_id, r.envelope) for r in rows] == [("T-000201", "fluentbit"), ("T-000203", "fluentbit")]
    assert rows[1].attributes["envelope.merged_top_level"] is True
    for r in rows:
        assert (r.source_format, r.pod_uid, r.container_name) == ("gelf", POD_UID, "api")
        # The application's time, not Fluent Bit's, with the application's precision.
        assert (r.event_time_ns, r.event_time_precision_ns) == (T201_NS, 1_000_000)
        assert r.attributes["envelope.runtime_time_ns"] == 1_749_032_102_123_456_789
        assert (r.attributes["message"], r.attributes["log.level"], r.attributes["log.logger"]) == (
            "scored", "INFO", "com.example.fraud.ScoringService")


def test_gelf_timestamp_keeps_the_decimals_given_and_at_least_milliseconds():
    assert gelf_timestamp(1749032100.5) == "2025-06-04T10:15:00.500Z"
    assert gelf_timestamp(1749032100.0) == "2025-06-04T10:15:00.000Z"
    assert gelf_timestamp(1749032100.067) == "2025-06-04T10:15:00.067Z"
    assert gelf_timestamp(1749032100.067462) == "2025-06-04T10:15:00.067462Z"  # a µs producer (graypy)
    # No decimals (an integer), text, and ms-magnitude numbers are left to the timestamp parser.
    assert gelf_timestamp(1749032100) == 1749032100
    assert gelf_timestamp("1749032100.5") == "1749032100.5"
    assert gelf_timestamp(1749032100500.0) == 1749032100500.0


def test_gelf_additional_field_that_collides_keeps_its_underscore():
    flat = {"version": "1.1", "short_message": "m", "timestamp": 1.5, "_short_message": "mdc",
            "_log.level": "mdc level", "_level_name": "WARN", "_txn_id": "T-1", "_": "bare underscore"}
    out = gelf_fields(flat)
    assert out["message"] == "m" and out["_short_message"] == "mdc"
    assert out["log.level"] == "WARN" and out["_log.level"] == "mdc level"
    assert out["txn_id"] == "T-1" and out["_"] == "bare underscore"
