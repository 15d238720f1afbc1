"""Writes parsed outcomes: ``inference_records`` (deduplicated, conflicts flagged) and ``quarantine``.

One call writes one batch inside the caller's transaction, in three set-based steps:

1. look up the batch's transaction ids once to learn which dedup keys exist and which
   transactions are already known: SQLite ``WHERE transaction_id IN …``; PostgreSQL
   ``WHERE transaction_id = ANY(%s)`` with the ids as one array;
2. insert the new rows straight through the driver, with the values already bound the way
   SQLAlchemy's types would bind them (records arrive as ``record.PreparedRecord``: column values
   with the attributes as JSON text): PostgreSQL draws their ids from the sequence and COPYs them
   into the table under a savepoint (``bulk.pg_copy_new``); should a concurrent writer that does
   not take the chain's lock first (below) have stored one of the keys since the lookup, that
   COPY is rolled back and the rows go through a TEMP staging table and ``INSERT … SELECT … ON
   CONFLICT (dedup_key) DO NOTHING RETURNING id, dedup_key``, a row that lost the race not returned and counted as a duplicate. (Measured, 50 k
   records: the server's time per batch fell by a fifth against staging every batch, joining the
   lookup to it and inserting with ON CONFLICT.) SQLite
   runs one prepared ``INSERT … ON CONFLICT DO NOTHING`` per row (``executemany``) and reads the
   new ids back by range — the transaction holds SQLite's write lock from ``BEGIN IMMEDIATE``, so
   every row above the previous largest id is one of ours;
3. quarantine rows with ``ON CONFLICT (content_key) DO NOTHING`` (PostgreSQL: COPYed through a
   staging table; SQLite: one prepared statement through the driver): the same line of the same source, quarantined before for the same reason, is not stored twice
   (it still counts as quarantined in the run);
   then one ledger entry per inserted row of both tables (``collector.store.ledger.append``;
   records by their leaf hashes through ``ledger.append_leaves``: a record prepared with its
   leaf template, ``record.ledger_template``, is completed with its id, ``received_ns``,
   ``run_id`` and ``conflict`` and hashed, any other hashed from its row), in the same transaction.

A record with a decision whose transaction id is already stored (or earlier in the batch) with a
decision and *different* content — a transaction scored twice differently — is stored with
``conflict = true``: never overwritten, never dropped. Records without a decision (the
transaction's other log lines: "request received", "calling Triton", which Spring's MDC tags with
the same id) are stored and never flagged.

Concurrent writers (HTTP requests, several collectors): on PostgreSQL a batch first takes the
ledger chain's transaction-scoped advisory lock (``ledger.lock_chain``, the lock its ledger entries
take anyway, held until commit), before step 1. Without it, writers whose transactions overlap
could not see each other's uncommitted rows under READ COMMITTED, and the unique key is the
content's (``dedup_key``): the same transaction id with different content sent by two requests at
once was stored twice, neither flagged. Serialised, the lookup sees every row of every earlier
writer, committed. Deadlock-free: a transaction inserts rows into these tables only once it holds
the lock, so the holder never waits for a row of a writer that waits for the lock (taking it only
at the ledger step, a transaction of several batches did: its second batch's insert waited for a
concurrent writer's uncommitted key while that writer waited for the lock). A single writer (the
CLI) finds it free: one statement per batch. The savepoint fallback of step 2 stays for a
concurrent writer that does not take the lock first (an older collector). SQLite needs none of
this: ``BEGIN IMMEDIATE`` serialises whole write transactions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from operator import itemgetter
from typing import Any, Iterable, Iterator, Sequence

import orjson
from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from collector.ingest.parser import Outcome
from collector.ingest.record import POSITION_CHARS, PREPARED_COLUMNS, PreparedRecord, event_text
from collector.store import ledger
from collector.store.bulk import core_bind, pg_copy_insert, pg_copy_new, pg_insert_staged, pg_stage, sqlite_insert_new
from collector.store.canonical import content_hash
from collector.store.models import InferenceRecord, Quarantine

INFERENCE = InferenceRecord.__table__
QUARANTINE = Quarantine.__table__
LOOKUP_CHUNK = 1000  # transaction ids per IN (...) query
# inference_records columns in the order the writer binds them: the parsed values, then its own.
INSERT_COLUMNS = PREPARED_COLUMNS + ("received_ns", "run_id", "conflict")
LEDGER_COLUMNS = ("id",) + INSERT_COLUMNS  # the tuples hashed by ledger.values_leaf (rows without a template)
_TXN = PREPARED_COLUMNS.index("transaction_id")
# A scored record's event (what the application logged) and its pod identity (what the shipper
# added, when it could): ``_scored_again``.
EVENT_COLUMNS = ("event_time_ns", "event_time_precision_ns", "model_name", "model_version", "decision",
                 "latency_ms", "trace_id", "span_id")
IDENTITY_COLUMNS = ("pod_uid", "pod_namespace", "pod_name", "container_name", "node_name")
_CLUSTER = PREPARED_COLUMNS.index("cluster")
KNOWN_EVENT_COLUMNS = EVENT_COLUMNS + IDENTITY_COLUMNS + ("cluster",)  # what the lookup reads of a stored record
_EVENT = itemgetter(*[PREPARED_COLUMNS.index(c) for c in EVENT_COLUMNS])  # values → EVENT_COLUMNS tuple, in C
_IDENTITY = itemgetter(*[PREPARED_COLUMNS.index(c) for c in IDENTITY_COLUMNS])
_KEY = PREPARED_COLUMNS.index("dedup_key")
_DECISION = PREPARED_COLUMNS.index("decision")
_NODE = PREPARED_COLUMNS.index("node_name")
_ATTRS = PREPARED_COLUMNS.index("attributes")
# ``CanonicalRecord.business_content``'s columns but the message (a record without a decision's)
_CONTENT_COLUMNS = ("transaction_id", "event_time_ns", "event_time_precision_ns", "cluster", "pod_uid", "pod_namespace",
                    "pod_name", "container_name", "model_name", "model_version", "decision", "latency_ms", "trace_id",
                    "span_id")
_CONTENT = itemgetter(*[PREPARED_COLUMNS.index(c) for c in _CONTENT_COLUMNS])
_SQLITE_INSERT = (f"INSERT INTO inference_records ({', '.join(INSERT_COLUMNS)}) "
                  f"VALUES ({', '.join('?' for _ in INSERT_COLUMNS)}) ON CONFLICT (dedup_key) DO NOTHING")


@dataclass
class BatchResult:
    """What one batch did: rows stored (of which ``conflicts`` flagged), duplicates, quarantined
    (of which ``requarantined`` were already in quarantine from an earlier run)."""

    stored: int = 0
    duplicates: int = 0
    conflicts: int = 0
    quarantined: int = 0
    requarantined: int = 0


def quarantine_content_key(stage: str, source: str, position: str | None, raw_sha256: str, reason: str) -> str:
    """``quarantine.content_key``: SHA-256 of the canonical JSON of the five values, as stored.

    The reason is part of it: a line quarantined again for the same reason (a re-run, a shipper's
    retry) is one row, but a line refused again for another reason — after ``--format`` or
    ``--default-tz`` changed — is a row of its own, under the run that refused it, so
    ``draudit quarantine`` shows why the latest attempt failed."""
    return content_hash([stage, source, position, raw_sha256, reason])


def reason_slug(reason: str) -> str:
    """A quarantine reason's slug: its text up to the first colon (``missing-transaction-id: no
    field …`` → ``missing-transaction-id``)."""
    return reason.split(":", 1)[0]


def quarantine_reason_slugs(session: Session, *filters: Any) -> list[tuple[str, int]]:
    """``(slug, lines)`` of the reasons of the quarantine rows ``filters`` select (all when none),
    most lines first, then by slug (``reason_slug``)."""
    slugs: dict[str, int] = {}
    q = select(QUARANTINE.c.reason, func.count()).where(*filters).group_by(QUARANTINE.c.reason)
    for text, n in session.execute(q):
        slug = reason_slug(text)
        slugs[slug] = slugs.get(slug, 0) + int(n)
    return sorted(slugs.items(), key=lambda kv: (-kv[1], kv[0]))


def _insert_records(session: Session, params: list[tuple[Any, ...]]) -> list[tuple[int, str]]:
    """Insert rows (tuples in ``INSERT_COLUMNS`` order) that the lookup found new; ``(id, dedup_key)``
    of those inserted, in id order.

    PostgreSQL: one COPY straight into the table (``bulk.pg_copy_new``); if a concurrent writer
    that did not take the chain's lock first (an older collector) stored one of the keys since the
    lookup, that COPY is undone and the rows go through the staging table with ``ON CONFLICT
    (dedup_key) DO NOTHING``, the losers not returned.
    """
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        inserted = pg_copy_new(session, "inference_records", INSERT_COLUMNS, params, ("id", "dedup_key"))
        if inserted is not None:
            return inserted
        pg_stage(session, "inference_records", INSERT_COLUMNS, params)
        return sorted(pg_insert_staged(session, "inference_records", INSERT_COLUMNS, "draudit_stage_inference_records",
                                       ("dedup_key",), ("id", "dedup_key")))
    return sqlite_insert_new(session, "inference_records", _SQLITE_INSERT, params, ("id", "dedup_key"))


Event = tuple[tuple[Any, ...], tuple[Any, ...], str | None]  # (EVENT_COLUMNS values, IDENTITY_COLUMNS values, cluster)


def _known(session: Session, txn_ids: Sequence[str]
           ) -> tuple[set[str], dict[str, list[Event]], dict[str, list[tuple[Event, str]]]]:
    """The dedup keys already stored among ``txn_ids``; for the ids stored with a decision (a
    scored record: see ``_write_records``) the events stored under them; for the records stored
    without a decision, their events with their dedup keys (``_plain_copy_of``)."""
    keys: set[str] = set()
    scored: dict[str, list[Event]] = {}
    plain: dict[str, list[tuple[Event, str]]] = {}
    n_event = len(EVENT_COLUMNS)
    n_identity = len(IDENTITY_COLUMNS)
    for txn, key, has_decision, *rest in _known_rows(session, txn_ids):
        keys.add(key)
        event = (tuple(rest[:n_event]), tuple(rest[n_event:n_event + n_identity]), rest[n_event + n_identity])
        if has_decision:
            scored.setdefault(txn, []).append(event)
        else:
            plain.setdefault(txn, []).append((event, key))
    return keys, scored, plain


def _event(values: tuple[Any, ...]) -> Event:
    return _EVENT(values), _IDENTITY(values), values[_CLUSTER]


def _same_values(event: Event, other: Event) -> bool:
    """The same application event: event times whose intervals ``[t, t + precision)`` overlap
    (GELF keeps the milliseconds of the line's microseconds) and the same values in every other
    ``EVENT_COLUMNS`` column."""
    (t, precision, *rest), *_ = event
    (o_t, o_precision, *o_rest), *_ = other
    return rest == o_rest and t < o_t + (o_precision or 1) and o_t < t + (precision or 1)


def _scored_again(event: Event, stored: list[Event]) -> tuple[bool, bool]:
    """``(duplicate, conflict)`` for a record with a decision whose transaction already has the
    scored records ``stored`` (under other dedup keys).

    A duplicate: the same event as a stored one (``_same_values``) that adds no pod identity to it
    (each of ``IDENTITY_COLUMNS`` it gives, the stored one gives alike). A shipper that re-sends a
    line without the pod uid it gave before (Fluent Bit's ``kubernetes`` filter omits ``pod_id``
    when its API lookup fails; docs/shippers.md), or a second shipper that adds no envelope at all,
    delivers the same transaction again. The same event *with* identity a stored copy lacked (the
    bare line came first) is stored — it is what attribution needs, and the ledger forbids editing
    the stored row — and is no conflict unless it contradicts a stored record. A conflict: some stored
    record is another event (another decision, time, model…) or gives another value of an identity
    column (another pod uid, node): a transaction scored twice differently, which an auditor must see,
    whatever order the copies came in.

    The cluster is the collector's label, not the application's: the same event under another
    cluster name (ingested again with ``--cluster`` after a first run under the default) is stored
    — its records become attributable — and is no conflict either."""
    _, identity, cluster = event
    duplicate = any(_same_values(event, s) and cluster == s[2] and all(a is None or a == b for a, b in zip(identity, s[1]))
                    for s in stored)
    conflict = any(not _same_values(event, s) or any(a is not None and b is not None and a != b
                                                     for a, b in zip(identity, s[1]))
                   for s in stored)
    return duplicate, conflict


_IDENTITY_NODE = IDENTITY_COLUMNS.index("node_name")
_KEY_IDENTITY = ("pod_uid", "pod_namespace", "pod_name", "container_name")  # the pod identity in a dedup key


def _plain_copy_of(values: tuple[Any, ...], exact_json: bool, stored: list[tuple[Event, str]]) -> bool:
    """Whether a record without a decision (``values`` in ``PREPARED_COLUMNS`` order, its dedup key
    not stored) is a copy of one stored without a decision (``stored``: the events with their keys of
    its transaction, earlier in the batch included) that only lacks pod identity or has a coarser
    time: the rule ``_scored_again`` applies to scored events, for the transaction's other lines.

    Such a line's key also holds its message (``record.event_text``), which the lookup does not
    read. So for each stored record of the same event (``_same_values``) and cluster whose pod
    identity includes every value this one gives (a re-send without ``kubernetes.pod_id``, the bare
    application line through another path), the key this record would have with that record's
    identity and time is computed: equal to its key, the message is the same too. A copy that adds
    identity (the bare line came first) is stored beside it, as for scored events."""
    event = _event(values)
    identity, cluster = event[1], event[2]
    attributes: Any = None
    for s_event, s_key in stored:
        if s_event[2] != cluster or not _same_values(event, s_event) \
                or not all(a is None or a == b for a, b in zip(identity, s_event[1])):
            continue
        if attributes is None:  # decoded once, and only when a stored line may be this one
            text = values[_ATTRS]
            attributes = orjson.loads(text) if exact_json else json.loads(text)
        content = dict(zip(_CONTENT_COLUMNS, _CONTENT(values)))
        content.update(zip(_KEY_IDENTITY, s_event[1]))  # IDENTITY_COLUMNS start with the key's four
        content["event_time_ns"], content["event_time_precision_ns"] = s_event[0][0], s_event[0][1]
        content["message"] = event_text(attributes)
        if content_hash(content) == s_key:
            return True
    return False


def _node_news(event: Event, stored: list[Event]) -> bool:
    """Whether ``event``, whose content key a stored scored record holds, tells something about the
    node that no stored copy of the same event (``_same_values``, same cluster, same pod identity but
    the node) does: another node than one stored (a contradiction: ``_scored_again`` flags it), or a
    node where every stored copy has none (identity added: stored beside, unflagged, as a copy
    adding a pod uid is; a later copy under yet another node then contradicts it)."""
    identity, node = event[1], event[1][_IDENTITY_NODE]
    if node is None:
        return False
    copies = [s[1][_IDENTITY_NODE] for s in stored if _same_values(event, s) and event[2] == s[2]
              and all(a == b for i, (a, b) in enumerate(zip(identity, s[1])) if i != _IDENTITY_NODE)]
    return node not in copies


def _with_node_key(rec: PreparedRecord) -> tuple[PreparedRecord, tuple[Any, ...], str]:
    """``rec`` under the dedup key of its content and its node (``content_hash`` of both): a
    scored event whose content key a record of another node holds. Deterministic, so the same
    copy re-sent is a duplicate of it. Its ledger leaf template held the old key: dropped (the row
    is hashed whole)."""
    values = list(rec.values)
    values[_KEY] = content_hash({"dedup_key": rec.values[_KEY], "node_name": rec.values[_NODE]})
    values = tuple(values)
    return PreparedRecord(values, rec.exact_json, None), values, values[_KEY]


def _known_rows(session: Session, txn_ids: Sequence[str]) -> Iterator[tuple[Any, ...]]:
    """``(transaction_id, dedup_key, has a decision, *KNOWN_EVENT_COLUMNS)`` of the stored records among ``txn_ids``
    (PostgreSQL: one ``= ANY(array)`` query; SQLite and others: by ``IN`` lists of ``LOOKUP_CHUNK`` ids)."""
    conn = session.connection()
    if conn.dialect.name == "sqlite":
        # Straight to the driver: Core's expanding IN renders 1000 bind names on every call (≈ 5 µs
        # of the writer's CPU per record); the statement text is the same for every full chunk.
        for i in range(0, len(txn_ids), LOOKUP_CHUNK):
            part = tuple(txn_ids[i:i + LOOKUP_CHUNK])
            yield from conn.exec_driver_sql(_sqlite_known_sql(len(part)), part)
        return
    if conn.dialect.name == "postgresql":
        # One statement with the ids as one array parameter: no IN list to render, no staging table.
        # Through the transaction_id index whatever the statistics say: a table filled since its last
        # ANALYZE (a new store's first backfill) was planned as a sequential scan per batch — 0.26 s
        # at 1 M rows, 2 ms by the index (measured), the ingest's server time growing with the table.
        previous = conn.exec_driver_sql(
            "SELECT current_setting('enable_seqscan'), set_config('enable_seqscan', 'off', true)").scalar_one()
        try:
            rows = conn.exec_driver_sql(PG_KNOWN_SQL, (list(txn_ids),)).all()
        finally:
            conn.exec_driver_sql("SELECT set_config('enable_seqscan', %s, true)", (previous,))
        yield from rows
        return
    stmt = select(INFERENCE.c.transaction_id, INFERENCE.c.dedup_key, INFERENCE.c.decision.is_not(None),
                  *[INFERENCE.c[c] for c in KNOWN_EVENT_COLUMNS]).where(
        INFERENCE.c.transaction_id.in_(bindparam("ids", expanding=True)))
    for i in range(0, len(txn_ids), LOOKUP_CHUNK):
        yield from session.execute(stmt, {"ids": list(txn_ids[i:i + LOOKUP_CHUNK])})


_KNOWN_COLUMNS = "transaction_id, dedup_key, decision IS NOT NULL, " + ", ".join(KNOWN_EVENT_COLUMNS)
PG_KNOWN_SQL = f"SELECT {_KNOWN_COLUMNS} FROM inference_records WHERE transaction_id = ANY(%s)"


@lru_cache(maxsize=8)
def _sqlite_known_sql(count: int) -> str:
    return (f"SELECT {_KNOWN_COLUMNS} FROM inference_records WHERE transaction_id IN ("
            + ", ".join("?" for _ in range(count)) + ")")


def write_batch(session: Session, outcomes: Iterable[Outcome], *, run_id: str | None,
                received_ns: int, received_at: datetime | None = None) -> BatchResult:
    """Insert one batch of outcomes (records and quarantine) and their ledger entries.

    The caller commits (HTTP: once per request, after which it answers 2xx; CLI: per batch).

    Args:
        session: an open session; its transaction receives every row and ledger entry.
        outcomes: parser outcomes, each a record (``CanonicalRecord`` or ``PreparedRecord``) or a
            rejection.
        run_id: stored in every row (one id per CLI run or HTTP request).
        received_ns: our receive time, integer ns UTC (``inference_records.received_ns``).
        received_at: the same instant as an aware datetime (``quarantine.received_at``).

    Returns:
        The counts of this batch.
    """
    result = BatchResult()
    received_at = received_at or datetime.fromtimestamp(received_ns / 1e9, tz=timezone.utc)
    records: list[PreparedRecord] = []
    quarantine_rows: list[dict[str, Any]] = []
    for o in outcomes:
        if o.record is not None:
            records.append(o.record.prepared())
        else:
            quarantine_rows.append(_quarantine_row(o, run_id, received_at))
    if records or quarantine_rows:
        # Before the lookup and any insert (module docstring): serialises concurrent writers so
        # a transaction id re-sent with other content by an overlapping request is flagged.
        ledger.lock_chain(session)
    if records:
        _write_records(session, records, run_id, received_ns, result)
    if quarantine_rows:
        _write_quarantine(session, quarantine_rows, result)
    return result


def _write_records(session: Session, records: list[PreparedRecord], run_id: str | None, received_ns: int,
                   result: BatchResult) -> None:
    existing_keys, scored_txns, plain_txns = _known(session, sorted({r.values[_TXN] for r in records}))
    batch_keys: set[str] = set()
    fresh: dict[str, tuple[PreparedRecord, tuple[Any, ...]]] = {}
    for rec in records:
        values = rec.values
        key, txn = values[_KEY], values[_TXN]
        if key in existing_keys or key in batch_keys:
            # The key leaves the node out (every shipper of one line gives one key, a CRI file none),
            # so the same scored event under another node has the key of the stored one: a
            # contradiction to store, flagged (``_scored_again``), under a key of its own.
            if values[_DECISION] is None or not _node_news(_event(values), scored_txns.get(txn, [])):
                result.duplicates += 1
                continue
            rec, values, key = _with_node_key(rec)
            if key in existing_keys or key in batch_keys:  # that contradiction delivered again
                result.duplicates += 1
                continue
        # A conflict is a transaction scored twice with different content: this record has a
        # decision and one with a decision is stored (or earlier in the batch) under another key
        # that is another event or another pod (``_scored_again``; the same event with no more pod
        # identity is a duplicate). Lines without a decision are the transaction's other log events
        # (Spring puts the id in the MDC of every line of the request): stored, never flagged, and
        # they flag nothing.
        conflict = False
        if values[_DECISION] is not None:
            event = _event(values)
            stored = scored_txns.setdefault(txn, [])
            if stored:
                duplicate, conflict = _scored_again(event, stored)
                if duplicate:
                    result.duplicates += 1
                    continue
            stored.append(event)
        else:  # the transaction's other lines: a copy with less pod identity is a duplicate too
            plain = plain_txns.setdefault(txn, [])
            if plain and _plain_copy_of(values, rec.exact_json, plain):
                result.duplicates += 1
                continue
            plain.append((_event(values), key))
        batch_keys.add(key)
        fresh[key] = (rec, values + (received_ns, run_id, conflict))
    if not fresh:
        return
    # Ledger leaves: a record prepared with its leaf template (``record.ledger_template``) is
    # completed with its attributes text and the values only known here (``record.LATE_COLUMNS``:
    # conflict, id, received_ns, run_id) and hashed; any other is hashed from its row, as ``ledger.append_values``
    # would, with the attributes as the ledger reads them back.
    try:
        late: tuple[bytes, ...] | None = (orjson.dumps(received_ns), orjson.dumps(run_id))
    except orjson.JSONEncodeError:  # a run id orjson refuses (lone surrogate): every row hashed from its row
        late = None
    flags = {False: b"false", True: b"true"}
    leaf_of_row = ledger.values_leaf("inference_records", LEDGER_COLUMNS)
    entries: list[tuple[str, str]] = []
    conflicts = 0
    for rid, key in _insert_records(session, [p for _, p in fresh.values()]):
        rec, params = fresh.pop(key)
        conflicts += params[-1]
        if rec.leaf is not None and late is not None:
            leaf = ledger.leaf_from_template(rec.leaf, (params[_ATTRS].encode("utf-8"), flags[params[-1]], b"%d" % rid) + late)
        else:
            text = params[_ATTRS]
            attributes = orjson.Fragment(text) if rec.exact_json else json.loads(text)
            leaf = leaf_of_row((rid, *params[:_ATTRS], attributes, *params[_ATTRS + 1:]))
        entries.append((str(rid), leaf))
    result.duplicates += len(fresh)  # lost a race with a concurrent writer
    result.stored = len(entries)
    result.conflicts = conflicts
    if entries:
        ledger.append_leaves(session, "inference_records", entries)


def _quarantine_row(o: Outcome, run_id: str | None, received_at: datetime) -> dict[str, Any]:
    position = (o.position or None) and o.position[:POSITION_CHARS]
    raw_sha256 = o.raw_sha256 or ""
    reason = o.reason or "unknown"
    return {"stage": "ingest", "source": o.source, "position": position, "reason": reason,
            "raw_text": o.raw_text or "", "raw_sha256": raw_sha256, "received_at": received_at, "run_id": run_id,
            "content_key": quarantine_content_key("ingest", o.source, position, raw_sha256, reason)}


_QUARANTINE_COLUMNS = ("stage", "source", "position", "reason", "raw_text", "raw_sha256", "received_at", "run_id",
                       "content_key")
_SQLITE_INSERT_QUARANTINE = (f"INSERT INTO quarantine ({', '.join(_QUARANTINE_COLUMNS)}) "
                             f"VALUES ({', '.join('?' for _ in _QUARANTINE_COLUMNS)}) ON CONFLICT (content_key) DO NOTHING")


def _write_quarantine(session: Session, rows: list[dict[str, Any]], result: BatchResult) -> None:
    conn = session.connection()
    # Through the driver, received_at bound as Core binds it. PostgreSQL: COPY + INSERT … SELECT
    # (bulk.pg_copy_insert): the multi-row VALUES statement with RETURNING cost ≈ 10 ms of client
    # CPU per batch of 40 rows. SQLite: one prepared statement (bulk.sqlite_insert_new): Core
    # compiled its dialect insert for every batch (≈ 2 ms, 1 µs per line of the run).
    at = core_bind(QUARANTINE.c.received_at, conn.dialect)
    values = [(r["stage"], r["source"], r["position"], r["reason"], r["raw_text"], r["raw_sha256"],
               at(r["received_at"]), r["run_id"], r["content_key"]) for r in rows]
    if conn.dialect.name == "postgresql":
        returned = pg_copy_insert(session, "quarantine", _QUARANTINE_COLUMNS, values, ("content_key",), ("id", "content_key"))
    else:
        returned = sqlite_insert_new(session, "quarantine", _SQLITE_INSERT_QUARANTINE, values, ("id", "content_key"))
    ids = dict((key, qid) for qid, key in returned)
    stored = []
    for row in rows:
        qid = ids.pop(row["content_key"], None)
        if qid is not None:
            row["id"] = qid
            stored.append(row)
    stored.sort(key=lambda r: r["id"])
    ledger.append(session, "quarantine", stored)
    result.quarantined = len(rows)
    result.requarantined = len(rows) - len(stored)
