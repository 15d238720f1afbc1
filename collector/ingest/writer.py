"""Writes parsed outcomes: ``inference_records`` (deduplicated, conflicts flagged) and ``quarantine``.

One call writes one batch inside the caller's transaction, in three set-based steps:

1. look up the batch's transaction ids once (``WHERE transaction_id IN …``) to learn which
   dedup keys exist and which transactions are already known;
2. ``INSERT … ON CONFLICT (dedup_key) DO NOTHING RETURNING id, dedup_key`` for the new rows; a
   row that loses a race with a concurrent writer is simply not returned and counts as a
   duplicate. The rows go straight to the driver with the values already bound the way
   SQLAlchemy's types would bind them (the per-row Core machinery, and psycopg parsing a
   2 000-row VALUES statement, cost more than the database's own work): PostgreSQL COPYs the
   batch into a TEMP staging table and inserts from there, SQLite runs a cached multi-row
   ``VALUES`` statement of ``SQLITE_ROWS_PER_STATEMENT`` rows;
3. ``INSERT … RETURNING id`` for quarantine rows, then one ledger entry per inserted row of both
   tables (``collector.store.ledger.append``), in the same transaction.

A record whose transaction id is already stored (or earlier in the batch) with *different*
content is stored with ``conflict = true``: never overwritten, never dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from operator import itemgetter
from typing import Any, Iterable, Iterator, Sequence

from sqlalchemy import bindparam, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from collector.ingest.parser import Outcome
from collector.store import ledger
from collector.store.bulk import pg_copy_insert
from collector.store.models import InferenceRecord, Quarantine

INFERENCE = InferenceRecord.__table__
QUARANTINE = Quarantine.__table__
LOOKUP_CHUNK = 1000  # transaction ids per IN (...) query
POSITION_CHARS = 64  # quarantine.position / inference_records.position width
# Rows per multi-row INSERT on SQLite: 500 rows x 26 columns stays under SQLite's 32 766 host
# parameters, and the statement text repeats, so sqlite3's statement cache prepares it once.
SQLITE_ROWS_PER_STATEMENT = 500
# inference_records columns written by the ingest (every column but the generated ``id``).
RECORD_COLUMNS = tuple(c.name for c in INFERENCE.columns if c.name != "id")


@dataclass
class BatchResult:
    """What one batch did: rows stored (of which ``conflicts`` flagged), duplicates, quarantined."""

    stored: int = 0
    duplicates: int = 0
    conflicts: int = 0
    quarantined: int = 0


def _insert_records_stmt(dialect: str):
    ins = pg_insert(INFERENCE) if dialect == "postgresql" else sqlite_insert(INFERENCE)
    return ins.on_conflict_do_nothing(index_elements=["dedup_key"]).returning(INFERENCE.c.id, INFERENCE.c.dedup_key)


def _pg_insert_records(session: Session, columns: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> list[tuple[int, str]]:
    """COPY through a TEMP staging table with the real column types (an over-long value fails as a
    plain INSERT would), then one ``INSERT … SELECT … ON CONFLICT DO NOTHING RETURNING``."""
    return pg_copy_insert(session, "inference_records", columns, rows, ("dedup_key",), ("id", "dedup_key"))


@lru_cache(maxsize=64)
def _sqlite_values_sql(n_rows: int) -> str:
    one = "(" + ", ".join("?" for _ in RECORD_COLUMNS) + ")"
    return (f"INSERT INTO inference_records ({', '.join(RECORD_COLUMNS)}) VALUES {', '.join([one] * n_rows)} "
            "ON CONFLICT (dedup_key) DO NOTHING RETURNING id, dedup_key")


def _json_text(dialect: Any) -> Any:
    """The text the ``attributes`` JSON column stores for a value, as SQLAlchemy's JSON type writes it
    (the engine's serializer; ``None`` is the JSON ``null``, the type's ``none_as_null=False``)."""
    dumps = getattr(dialect, "_json_serializer", None) or json.dumps
    return lambda value: "null" if value is None else dumps(value)


def _insert_records(session: Session, rows: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """Insert ``rows`` (dicts with every ``RECORD_COLUMNS`` key); ``(id, dedup_key)`` of those inserted."""
    conn = session.connection()
    dialect = conn.dialect
    if dialect.name not in ("postgresql", "sqlite"):
        return [tuple(r) for r in session.execute(_insert_records_stmt(dialect.name), rows).all()]
    attrs = _json_text(dialect)
    get = itemgetter(*RECORD_COLUMNS)
    a = RECORD_COLUMNS.index("attributes")
    if dialect.name == "postgresql":
        def bound() -> Iterator[tuple[Any, ...]]:
            for r in rows:
                values = list(get(r))
                values[a] = attrs(values[a])
                yield values

        return _pg_insert_records(session, RECORD_COLUMNS, bound())
    out: list[tuple[int, str]] = []
    for i in range(0, len(rows), SQLITE_ROWS_PER_STATEMENT):
        chunk = rows[i:i + SQLITE_ROWS_PER_STATEMENT]
        params: list[Any] = []
        for r in chunk:
            values = list(get(r))
            values[a] = attrs(values[a])
            params += values
        out += [tuple(r) for r in conn.exec_driver_sql(_sqlite_values_sql(len(chunk)), tuple(params)).all()]
    return out


def _known(session: Session, txn_ids: Sequence[str]) -> tuple[set[str], set[str]]:
    keys: set[str] = set()
    txns: set[str] = set()
    stmt = select(INFERENCE.c.transaction_id, INFERENCE.c.dedup_key).where(
        INFERENCE.c.transaction_id.in_(bindparam("ids", expanding=True)))
    for i in range(0, len(txn_ids), LOOKUP_CHUNK):
        for txn, key in session.execute(stmt, {"ids": list(txn_ids[i:i + LOOKUP_CHUNK])}):
            keys.add(key)
            txns.add(txn)
    return keys, txns


def write_batch(session: Session, outcomes: Iterable[Outcome], *, run_id: str | None,
                received_ns: int, received_at: datetime | None = None) -> BatchResult:
    """Insert one batch of outcomes (records and quarantine) and their ledger entries.

    The caller commits (HTTP: once per request, after which it answers 2xx; CLI: per batch).

    Args:
        session: an open session; its transaction receives every row and ledger entry.
        outcomes: parser outcomes, each a record or a rejection.
        run_id: stored in every row (one id per CLI run or HTTP request).
        received_ns: our receive time, integer ns UTC (``inference_records.received_ns``).
        received_at: the same instant as an aware datetime (``quarantine.received_at``).

    Returns:
        The counts of this batch.
    """
    result = BatchResult()
    received_at = received_at or datetime.fromtimestamp(received_ns / 1e9, tz=timezone.utc)
    rows: list[dict[str, Any]] = []
    quarantine_rows: list[dict[str, Any]] = []
    for o in outcomes:
        if o.record is not None:
            row = o.record.row(received_ns, run_id)
            if row["position"] is not None:
                row["position"] = row["position"][:POSITION_CHARS]
            rows.append(row)
        else:
            quarantine_rows.append({
                "stage": "ingest", "source": o.source, "position": (o.position or None) and o.position[:POSITION_CHARS],
                "reason": o.reason or "unknown", "raw_text": o.raw_text or "", "raw_sha256": o.raw_sha256 or "",
                "received_at": received_at, "run_id": run_id,
            })

    inserted: list[dict[str, Any]] = []
    if rows:
        existing_keys, existing_txns = _known(session, sorted({r["transaction_id"] for r in rows}))
        batch_keys: set[str] = set()
        batch_txn_key: dict[str, str] = {}
        fresh: list[dict[str, Any]] = []
        for row in rows:
            key, txn = row["dedup_key"], row["transaction_id"]
            if key in existing_keys or key in batch_keys:
                result.duplicates += 1
                continue
            batch_keys.add(key)
            row["conflict"] = txn in existing_txns or (txn in batch_txn_key and batch_txn_key[txn] != key)
            batch_txn_key.setdefault(txn, key)
            fresh.append(row)
        if fresh:
            by_key = {r["dedup_key"]: r for r in fresh}
            for rid, key in _insert_records(session, fresh):
                row = by_key.pop(key)
                row["id"] = rid
                inserted.append(row)
            result.duplicates += len(by_key)  # lost a race with a concurrent writer
        result.stored = len(inserted)
        result.conflicts = sum(1 for r in inserted if r["conflict"])
        inserted.sort(key=lambda r: r["id"])
        ledger.append(session, "inference_records", inserted)

    if quarantine_rows:
        ids = session.execute(insert(QUARANTINE).returning(QUARANTINE.c.id, sort_by_parameter_order=True),
                              quarantine_rows).scalars().all()
        for row, qid in zip(quarantine_rows, ids):
            row["id"] = qid
        ledger.append(session, "quarantine", quarantine_rows)
        result.quarantined = len(quarantine_rows)
    return result
