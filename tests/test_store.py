"""Store foundation: migrations, versioned rows, the ledger — on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import delete, func, insert, select, text, update

from collector.kube.projections import apply_versions
from collector.store import ledger, migrate
from collector.store.canonical import content_hash
from collector.store.models import LedgerEntry, ObjectVersion
from collector.store.schema import metadata

T0 = datetime(2026, 11, 29, 10, 0, 0, 123456, tzinfo=timezone.utc)


def _claim(rv: str, device: str = "gpu-0") -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "fraud-0-gpu-x8k2p", "namespace": "risk-inference", "uid": "5f0c1d2e-0000-4000-8000-000000000001",
                     "resourceVersion": rv},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-node-a", "device": device}]}}},
    }


def _version_row(raw: dict, event_type: str = "ADDED") -> dict:
    return {"cluster": "prod-eu-1", "api_group": "resource.k8s.io", "api_version": "v1", "kind": "ResourceClaim",
            "namespace": raw["metadata"]["namespace"], "name": raw["metadata"]["name"], "uid": raw["metadata"]["uid"],
            "resource_version": raw["metadata"]["resourceVersion"], "event_type": event_type, "observed_at": T0,
            "raw": raw, "content_hash": content_hash(raw)}


def _store_versions(sessions, rows, project: bool = True):
    """Insert versions, ignoring exact replays, ledger the new rows and project them (as the watcher does)."""
    with sessions.begin() as s:
        inserted = []
        for row in rows:
            exists = s.execute(select(ObjectVersion.id).where(
                ObjectVersion.cluster == row["cluster"], ObjectVersion.kind == row["kind"], ObjectVersion.uid == row["uid"],
                ObjectVersion.resource_version == row["resource_version"], ObjectVersion.event_type == row["event_type"])).first()
            if exists:
                continue
            new_id = s.execute(insert(ObjectVersion).values(**row).returning(ObjectVersion.id)).scalar_one()
            inserted.append({**row, "id": new_id})
        ledger.append(s, "object_versions", inserted)
        if project:
            apply_versions(s, inserted)
    return inserted


def test_models_and_migrations_agree(engine):
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
    assert diff == []


def test_downgrade_base_and_upgrade_again(engine):
    migrate.downgrade(engine, "base")
    assert migrate.current_revision(engine) is None
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()


def test_unique_version_makes_replays_harmless(engine, sessions):
    raw = _claim("48211")
    row = _version_row(raw)
    with sessions.begin() as s:
        s.execute(insert(ObjectVersion).values(**row))
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError):
        with sessions.begin() as s:
            s.execute(insert(ObjectVersion).values(**row))
    assert _store_versions(sessions, [row]) == []
    with sessions() as s:
        assert s.execute(select(func.count()).select_from(ObjectVersion)).scalar_one() == 1
        stored = s.execute(select(ObjectVersion)).scalar_one()
    assert stored.observed_at == T0  # aware UTC, microseconds kept, on both backends
    assert stored.raw == raw


def test_ledger_intact_then_edit_detected(sessions):
    rows = [_version_row(_claim(str(48211 + i), f"gpu-{i % 2}")) for i in range(5)]
    inserted = _store_versions(sessions, rows)
    with sessions() as s:
        result = ledger.verify(s)
    assert result.ok and result.entries == 5 and result.head.seq == 5
    target = inserted[2]["id"]
    tampered = dict(rows[2]["raw"])
    tampered["status"] = {}
    with sessions.begin() as s:
        s.execute(update(ObjectVersion).where(ObjectVersion.id == target).values(raw=tampered))
    with sessions() as s:
        result = ledger.verify(s)
    assert not result.ok
    assert (result.first_break.seq, result.first_break.table_name, result.first_break.row_key) == (3, "object_versions", str(target))
    assert "content was changed" in result.first_break.problem


def test_ledger_deleted_entry_detected(sessions):
    _store_versions(sessions, [_version_row(_claim(str(100 + i))) for i in range(4)])
    with sessions.begin() as s:
        s.execute(delete(LedgerEntry).where(LedgerEntry.seq == 2))
    with sessions() as s:
        brk = ledger.verify(s).first_break
    assert brk is not None and brk.seq == 2 and "missing" in brk.problem


def test_ledger_deleted_tail_entry_detected(sessions):
    _store_versions(sessions, [_version_row(_claim(str(100 + i))) for i in range(3)])
    with sessions.begin() as s:
        s.execute(delete(LedgerEntry).where(LedgerEntry.seq == 3))
    with sessions() as s:
        brk = ledger.verify(s).first_break
    assert brk is not None and brk.seq == 3


def test_ledger_row_inserted_behind_its_back_detected(sessions):
    _store_versions(sessions, [_version_row(_claim("7"))])
    with sessions.begin() as s:
        s.execute(insert(ObjectVersion).values(**_version_row(_claim("8"))))
    with sessions() as s:
        brk = ledger.verify(s).first_break
    assert brk is not None and brk.table_name == "object_versions" and "no ledger entry" in brk.problem


def test_ledger_tombstone_accounts_for_deleted_row(sessions):
    # no projections here: they reference their source version (retention deletes them first)
    inserted = _store_versions(sessions, [_version_row(_claim(str(10 + i))) for i in range(3)], project=False)
    victim = inserted[0]
    with sessions.begin() as s:
        ledger.append_tombstone(s, "object_versions", victim, reason="retention: object versions older than 400 days")
        s.execute(delete(ObjectVersion).where(ObjectVersion.id == victim["id"]))
    with sessions() as s:
        result = ledger.verify(s)
    assert result.ok and result.entries == 4


def test_ledger_chain_continues_across_transactions(sessions):
    _store_versions(sessions, [_version_row(_claim("1"))])
    _store_versions(sessions, [_version_row(_claim("2")), _version_row(_claim("3"))])
    with sessions() as s:
        entries = s.execute(select(LedgerEntry).order_by(LedgerEntry.seq)).scalars().all()
    assert [e.seq for e in entries] == [1, 2, 3]
    assert entries[1].prev_hash == entries[0].entry_hash and entries[2].prev_hash == entries[1].entry_hash


def test_ledger_fast_path_knows_every_utc_datetime_column():
    # UTCDateTime is a TypeDecorator: if its columns were missed, every leaf would silently take the
    # slow canonical path (same bytes, several times the cost per row).
    assert ledger._datetime_columns(ledger.ledgered_table("object_versions")) == ("observed_at",)
    assert ledger._datetime_columns(ledger.ledgered_table("quarantine")) == ("received_at",)


def test_postgresql_connections_plan_each_statement_for_its_parameters(engine):
    """psycopg prepares a statement from its 6th execution; PostgreSQL's generic plan for it, chosen
    while a table was small, later scanned millions of rows per duplicate lookup. Every pooled
    connection, including a fresh one after the pool recycles, must use custom plans."""
    if engine.dialect.name != "postgresql":
        pytest.skip("plan_cache_mode is a PostgreSQL setting")
    for _ in range(2):
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW plan_cache_mode").scalar_one() == "force_custom_plan"
            conn.invalidate()  # next connect opens a new DBAPI connection
