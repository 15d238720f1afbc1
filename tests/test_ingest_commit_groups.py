"""Per-batch mode commits groups of batches (``IngestRun.commit_units``), on SQLite and PostgreSQL:
a failure loses exactly the uncommitted group, a rerun stores those lines once and finds the rest
as duplicates, counts reconcile and the ledger verifies; HTTP mode still commits once, at the end."""

from __future__ import annotations

import io

import pytest
from sqlalchemy import func, select

from collector.ingest import pipeline
from collector.ingest.pipeline import IngestRun
from collector.settings import Settings
from collector.store import ledger
from collector.store.models import InferenceRecord, Quarantine

APP = ('{"@timestamp":"2025-03-04T10:15:00.067462Z","log":{"level":"INFO","logger":"c.e.Scoring"},'
       '"message":"scored","txn_id":"T-%d","decision":"DECLINE","latency_ms":12.4,"ecs":{"version":"8.11"}}')


def _input(n: int) -> bytes:
    """``n`` lines: Spring ECS decisions T-0…, every 10th a plain text line (quarantined)."""
    return "".join((APP % i if i % 10 != 9 else f"plain text line {i}") + "\n" for i in range(n)).encode()


def _stored(sessions) -> tuple[int, int]:
    with sessions() as s:
        return (s.scalar(select(func.count()).select_from(InferenceRecord)),
                s.scalar(select(func.count()).select_from(Quarantine)))


class _Crash(Exception):
    pass


def test_a_failure_loses_only_the_uncommitted_group_and_a_rerun_completes_it(sessions, monkeypatch):
    data = _input(95)
    written = []
    real_write = pipeline.write_batch

    def failing_write(session, outcomes, **kw):
        written.append(len(outcomes))
        if len(written) == 9:  # the first batch of the third group (groups: 4 batches of 5 units)
            raise _Crash
        return real_write(session, outcomes, **kw)

    monkeypatch.setattr(pipeline, "write_batch", failing_write)
    run = IngestRun(sessions, Settings(cluster="c1"), workers=1, batch_size=5, commit_units=20)
    with pytest.raises(_Crash):
        run.ingest_stream(io.BytesIO(data), "app.log")
    assert written == [5] * 9
    # Two groups of 20 lines committed (one line in 10 quarantined): 36 records, 4 quarantined.
    assert _stored(sessions) == (36, 4)
    assert (run.counts.stored, run.counts.quarantined) == (36, 4)

    monkeypatch.setattr(pipeline, "write_batch", real_write)
    rerun = IngestRun(sessions, Settings(cluster="c1"), workers=1, batch_size=5, commit_units=20)
    rerun.ingest_stream(io.BytesIO(data), "app.log")
    counts = rerun.finish()
    # The quarantined lines of the committed groups were quarantined before: counted, not stored again.
    assert counts.as_dict() == {"read": 95, "stored": 86 - 36, "duplicates": 36, "conflicts": 0,
                                "quarantined": 9, "pan_masked": 0}
    assert counts.reconciles
    assert _stored(sessions) == (86, 9)
    with sessions() as s:
        verdict = ledger.verify(s)
    assert verdict.ok, verdict.first_break
    assert verdict.entries == 86 + 9


def test_batches_are_written_per_batch_size_and_committed_per_commit_units(sessions, monkeypatch):
    commits = []
    real_write = IngestRun._write

    def recording_write(self, outcomes):
        commits.append(len(outcomes))
        real_write(self, outcomes)

    monkeypatch.setattr(IngestRun, "_write", recording_write)
    run = IngestRun(sessions, Settings(cluster="c1"), workers=1, batch_size=4, commit_units=10)
    run.ingest_stream(io.BytesIO(_input(25)), "app.log")
    counts = run.finish()
    # add() receives one line's outcome at a time: a group is written once 10 units are queued.
    assert commits == [10, 10, 5]
    assert counts.reconciles and (counts.stored, counts.quarantined) == (23, 2)


def test_commit_units_default_per_backend_at_least_the_batch_size_and_http_mode_commits_once(sessions, monkeypatch):
    assert IngestRun(sessions, Settings(cluster="c1"), batch_size=50, commit_units=10).commit_units == 50
    # Groups by default on SQLite only (PostgreSQL commits every batch: see DEFAULT_COMMIT_UNITS).
    sqlite = sessions.kw["bind"].dialect.name == "sqlite"
    assert IngestRun(sessions, Settings(cluster="c1")).commit_units == (pipeline.DEFAULT_COMMIT_UNITS if sqlite else 2000)
    assert IngestRun(None, Settings(cluster="c1")).commit_units == 2000
    commits = []
    real_write = IngestRun._write
    monkeypatch.setattr(IngestRun, "_write", lambda self, outcomes: (commits.append(len(outcomes)), real_write(self, outcomes)))
    run = IngestRun(sessions, Settings(cluster="c1"), one_transaction=True, batch_size=4, commit_units=4)
    run.ingest_stream(io.BytesIO(_input(30)), "http:1")
    assert commits == []  # nothing committed before finish(): the shipper's 2xx waits for it
    counts = run.finish()
    assert commits == [30] and counts.reconciles and _stored(sessions) == (27, 3)


def test_a_row_stored_by_a_concurrent_writer_after_the_lookup_counts_as_a_duplicate(sessions, monkeypatch):
    """PostgreSQL COPYs the rows its lookup found new straight into the table; a key stored since
    (simulated: the lookup is made to miss lines stored by an earlier run) makes that COPY fail
    under its savepoint, and the rows go through ON CONFLICT DO NOTHING instead: the new lines are
    stored once, the others count as duplicates, the ledger verifies. SQLite holds the write lock
    from BEGIN IMMEDIATE, so there the lookup cannot miss: the same outcome through its own path."""
    from collector.ingest import writer

    first = IngestRun(sessions, Settings(cluster="c1"), workers=1, batch_size=10)
    first.ingest_stream(io.BytesIO(_input(20)), "app.log")
    assert first.finish().stored == 18
    monkeypatch.setattr(writer, "_known", lambda session, txn_ids: (set(), {}, {}))
    run = IngestRun(sessions, Settings(cluster="c1"), workers=1, batch_size=10)
    run.ingest_stream(io.BytesIO(_input(30)), "app.log")
    counts = run.finish()
    assert counts.as_dict() == {"read": 30, "stored": 9, "duplicates": 18, "conflicts": 0, "quarantined": 3,
                                "pan_masked": 0}
    assert _stored(sessions) == (27, 3)
    with sessions() as s:
        ids = s.scalars(select(InferenceRecord.id).order_by(InferenceRecord.id)).all()
        verdict = ledger.verify(s)
    assert len(set(ids)) == 27
    assert verdict.ok, verdict.first_break
    assert verdict.entries == 27 + 3


def test_quarantine_rows_written_through_the_driver_compare_equal_through_core(sessions):
    """``received_at`` is stored as Core binds it (SQLite: its ISO text, ``.000000`` for a whole
    second), so a comparison made through Core finds the row; the ledger covers every row."""
    from datetime import datetime, timezone

    run = IngestRun(sessions, Settings(cluster="c1"), workers=1, batch_size=4)
    run._write = _write_at(run, datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc))
    run.ingest_stream(io.BytesIO(b"not json\nalso not json\n" + (APP % 1).encode() + b"\n"), "q.log")
    counts = run.finish()
    assert (counts.stored, counts.quarantined) == (1, 2)
    with sessions() as s:
        rows = s.scalars(select(Quarantine).where(
            Quarantine.received_at == datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)).order_by(Quarantine.id)).all()
        assert [(r.position, r.raw_text, r.reason.split(":")[0]) for r in rows] == [
            ("1", "not json", "unparseable"), ("2", "also not json", "unparseable")]
        verdict = ledger.verify(s)
    assert verdict.ok and verdict.entries == 3


def _write_at(run, now):
    """``run._write`` with the receive time fixed at ``now``."""
    from collector.ingest import writer

    def write(outcomes):
        with run.sessions() as session:
            results = [writer.write_batch(session, outcomes[i:i + run.batch_size], run_id=run.run_id,
                                          received_ns=int(now.timestamp()) * 1_000_000_000, received_at=now)
                       for i in range(0, len(outcomes), run.batch_size)]
            session.commit()
        run.counts.stored += sum(r.stored for r in results)
        run.counts.quarantined += sum(r.quarantined for r in results)
    return write
