"""Concurrent ingest requests, on SQLite and PostgreSQL: a transaction id re-sent with different
content by writers whose transactions overlap is kept and flagged (never overwritten, never left
unflagged), the same content is stored once, and no pair of writers deadlocks.

Each writer is what one ``POST /v1/ingest`` does (``collector/ingest/http.py``): its own
``IngestRun`` in ``one_transaction`` mode, committed at ``finish()``. The overlap is made certain:
the first writer to reach its commit holds its transaction open until every other writer is
waiting for the store (PostgreSQL: an ungranted advisory lock in ``pg_locks`` — the ledger chain's,
which the writers take before looking up known transaction ids, and which older writers took only
after inserting; SQLite: each has started and is queued behind ``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import event, func, select, text

from collector.ingest.pipeline import IngestCounts, IngestRun
from collector.settings import Settings
from collector.store import ledger
from collector.store.db import make_session_factory
from collector.store.models import InferenceRecord

HOLD_TIMEOUT_S = 30.0


def _lines(txn_ids: list[str], decision: str) -> bytes:
    return b"".join(b'{"@timestamp":"2025-03-04T10:15:00Z","txn_id":"%s","decision":"%s"}\n'
                    % (t.encode(), decision.encode()) for t in txn_ids)


def _waiting_writers(engine) -> int:
    """PostgreSQL backends of this database waiting for an advisory lock."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")).scalar_one()


def _concurrent_requests(engine, database_url: str, bodies: list[bytes], batch_size: int) -> list[IngestCounts]:
    """Run one one-transaction ``IngestRun`` per body, all at once; the first to commit waits
    (its transaction open) until every other one is waiting for the store."""
    sessions = make_session_factory(engine)
    settings = Settings(database_url=database_url, cluster="prod-eu")
    others = len(bodies) - 1
    started = threading.Semaphore(0)
    state = {"held": False}
    guard = threading.Lock()

    @event.listens_for(sessions, "before_commit")
    def _hold_first(session) -> None:
        with guard:
            if state["held"]:
                return
            state["held"] = True
        for _ in range(others):
            assert started.acquire(timeout=HOLD_TIMEOUT_S), "a writer did not start"
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        if engine.dialect.name == "postgresql":
            while _waiting_writers(engine) < others:
                assert time.monotonic() < deadline, "the other writers never waited for this transaction"
                time.sleep(0.01)
        else:
            time.sleep(0.3)  # they are in BEGIN IMMEDIATE (busy timeout 30 s), behind this transaction

    barrier = threading.Barrier(len(bodies))

    def request(i: int) -> IngestCounts:
        run = IngestRun(sessions, settings, one_transaction=True, run_id=f"req-{i}", batch_size=batch_size)
        run.ingest_stream(io.BytesIO(bodies[i]), f"http:req-{i}")
        barrier.wait(timeout=HOLD_TIMEOUT_S)
        started.release()
        return run.finish()

    with ThreadPoolExecutor(len(bodies)) as pool:
        return [f.result() for f in [pool.submit(request, i) for i in range(len(bodies))]]


def _stored(engine) -> tuple[int, int, int]:
    """Rows, flagged rows, distinct transaction ids of ``inference_records``."""
    with make_session_factory(engine)() as s:
        return (s.scalar(select(func.count()).select_from(InferenceRecord)),
                s.scalar(select(func.count()).select_from(InferenceRecord).where(InferenceRecord.conflict.is_(True))),
                s.scalar(select(func.count(InferenceRecord.transaction_id.distinct()))))


def _ledger_ok(engine) -> ledger.VerifyResult:
    with make_session_factory(engine)() as s:
        return ledger.verify(s)


@pytest.mark.parametrize("writers", [2, 6])
def test_overlapping_resends_with_different_decisions_are_all_kept_and_flagged(engine, database_url, writers):
    ids = [f"T-{n:06d}" for n in range(200)]
    bodies = [_lines(ids, f"DECISION-{i}") for i in range(writers)]
    counts = _concurrent_requests(engine, database_url, bodies, batch_size=1000)
    # Every request's rows are stored; only the first writer of each id is unflagged.
    assert sorted(c.conflicts for c in counts) == [0] + [len(ids)] * (writers - 1)
    assert all((c.read, c.stored, c.duplicates, c.quarantined) == (len(ids), len(ids), 0, 0) for c in counts)
    assert _stored(engine) == (len(ids) * writers, len(ids) * (writers - 1), len(ids))
    with make_session_factory(engine)() as s:
        unflagged = s.execute(select(InferenceRecord.run_id, func.count()).where(InferenceRecord.conflict.is_(False))
                              .group_by(InferenceRecord.run_id)).all()
    assert len(unflagged) == 1 and unflagged[0][1] == len(ids)  # one request's rows are the originals
    result = _ledger_ok(engine)
    assert result.ok, result.first_break and result.first_break.describe()
    assert result.entries == len(ids) * writers


def test_overlapping_identical_requests_store_once_without_deadlock(engine, database_url):
    # Several batches per transaction, the ids in opposite orders: a writer that inserted its first
    # batch before taking the ledger's lock and a second one holding the lock while inserting a key
    # the first stored would each wait for the other.
    ids = [f"T-{n:06d}" for n in range(200)]
    bodies = [_lines(ids, "APPROVE"), _lines(ids[::-1], "APPROVE")]
    counts = _concurrent_requests(engine, database_url, bodies, batch_size=50)
    assert sorted((c.stored, c.duplicates, c.conflicts) for c in counts) == [(0, len(ids), 0), (len(ids), 0, 0)]
    assert _stored(engine) == (len(ids), 0, len(ids))
    result = _ledger_ok(engine)
    assert result.ok, result.first_break and result.first_break.describe()
    assert result.entries == len(ids)


def test_the_postgresql_lookup_uses_the_transaction_index_on_a_table_never_analyzed(engine, database_url):
    """A new store's first backfill: no statistics yet, and the planner scanned the whole table for
    every batch's lookup (0.26 s per batch at 1 M rows, server time growing with the table)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("the SQLite lookup is an IN list on the index")
    from sqlalchemy import text

    from collector.ingest.writer import PG_KNOWN_SQL, _known
    from collector.store.db import make_session_factory

    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO inference_records (transaction_id, event_time_ns, event_time_precision_ns, cluster, "
            "source_format, envelope, source, position, raw_sha256, dedup_key, received_ns, run_id, conflict, attributes) "
            "SELECT 'T-' || g, g, 1, 'c', 'x', 'x', 's', g::text, md5(g::text), md5(g::text) || md5((g + 1)::text), "
            "0, 'r', false, 'null'::jsonb FROM generate_series(1, 50000) g"))
    ids = [f"T-{i}" for i in range(49000, 51000)]
    with make_session_factory(engine)() as session:
        conn = session.connection()
        conn.exec_driver_sql("SET LOCAL enable_seqscan = on")
        keys, _, _ = _known(session, ids)
        assert len(keys) == 1001  # T-49000 .. T-50000
        assert conn.exec_driver_sql("SELECT current_setting('enable_seqscan')").scalar_one() == "on"  # restored
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + PG_KNOWN_SQL, (ids,)))
    assert "ix_inference_records_txn" in plan and "Seq Scan" not in plan, plan
