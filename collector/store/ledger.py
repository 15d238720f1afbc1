"""The append-only ledger: a hash chain over every row that evidence depends on.

Entry ``n`` covers one row (table, primary key) and stores
``content_hash = SHA-256(canonical_json(row content))`` and
``entry_hash = SHA-256(entry[n-1].entry_hash || content_hash)`` (the genesis predecessor is 64
zeros). Separating the leaf hash from the chain, as Certificate Transparency does (RFC 9162 §2.1),
lets ``verify`` check the chain even for rows that retention has deleted (tombstones), and check
each surviving row against its leaf.

Appends are serialised: PostgreSQL takes a transaction-scoped advisory lock, SQLite takes the
database write lock by updating the head row first. Either way the head read and the entry writes
happen in the caller's transaction, so a rollback leaves no trace. A writer may take the chain's
lock earlier in its transaction (``lock_chain``) to serialise its own reads and inserts with every
other appender (the ingest writer does, before it looks up known transaction ids).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from functools import lru_cache
from hashlib import sha256
from operator import itemgetter
from typing import Any, Iterable, Iterator, Mapping, Sequence

import orjson
from sqlalchemy import JSON, Table, func, select, text
from sqlalchemy.orm import Session

from collector.store.bulk import core_bind
from collector.store.canonical import GENESIS_HASH, canonical_json, chain_hash, sha256_hex
from collector.store.canonical import _default as _canonical_default
from collector.store.models import Base, LedgerEntry, LedgerHead

CHAIN = "main"
_PG_LOCK_KEY = 0x6472617564  # "draud": the advisory lock id of the ledger chain
VERIFY_BATCH = 5_000


@lru_cache(maxsize=None)
def ledgered_table(name: str) -> Table:
    """The SQLAlchemy ``Table`` called ``name``; it must have a single-column primary key.

    Raises:
        KeyError: no such table in the metadata.
    """
    import collector.store.schema  # noqa: F401  (registers every model module on Base.metadata)

    return Base.metadata.tables[name]


def _normalise(value: Any) -> Any:
    if isinstance(value, datetime):
        return _utc_text(value)
    return value


def _utc_text(value: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (naive values are taken as UTC)."""
    if value.tzinfo is not timezone.utc:
        value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    if value.year < 1000:  # strftime does not pad the year here: keep the historical bytes
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # isoformat with fixed microseconds is several times faster than strftime; "+00:00" → "Z".
    return value.isoformat(timespec="microseconds")[:-6] + "Z"


def row_content(table: Table, row: Mapping[str, Any]) -> dict[str, Any]:
    """The content of a row that the ledger covers: every column of ``table``, normalised.

    Datetimes become ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (UTC, µs) so that the value written and the
    value read back (SQLite text, PostgreSQL timestamptz) hash the same.
    """
    return {name: _normalise(row.get(name)) for name in _column_names(table)}


@lru_cache(maxsize=None)
def _column_names(table: Table) -> tuple[str, ...]:
    return tuple(col.name for col in table.columns)


@lru_cache(maxsize=None)
def _datetime_columns(table: Table) -> tuple[str, ...]:
    out = []
    for col in table.columns:
        # UTCDateTime is a TypeDecorator, whose own python_type raises: ask the type it wraps.
        col_type = getattr(col.type, "impl_instance", col.type)
        try:
            if issubclass(col_type.python_type, datetime):
                out.append(col.name)
        except NotImplementedError:
            continue
    return tuple(out)


class _NotFast(Exception):
    """A value the fast leaf encoding does not take (a datetime not in a datetime column, …)."""


def _fast_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview, Decimal)):
        return _canonical_default(value)
    raise _NotFast


_FAST_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME


def leaf_hash(table: Table, row: Mapping[str, Any]) -> str:
    """``SHA-256(canonical_json(row_content(table, row)))`` as lower-case hex.

    Fast path, same bytes: the declared datetime columns are normalised up front and the content
    is encoded by orjson with datetimes passed through to a default that refuses them, so any
    other datetime (a naive one in a text column, one nested in a JSON value) and integers beyond
    64 bits fall back to ``canonical_json(row_content(...))`` itself.
    """
    names = _column_names(table)
    content = {name: row.get(name) for name in names}
    for name in _datetime_columns(table):
        value = content[name]
        if isinstance(value, datetime):
            content[name] = _utc_text(value)
    try:
        data = orjson.dumps(content, default=_fast_default, option=_FAST_OPTS)
    except (_NotFast, orjson.JSONEncodeError):
        data = canonical_json(row_content(table, row))
    return sha256(data).hexdigest()


def _pk(table: Table):
    cols = list(table.primary_key.columns)
    if len(cols) != 1:
        raise ValueError(f"table {table.name} needs a single-column primary key to be ledgered")
    return cols[0]


@dataclass(frozen=True)
class Head:
    """Position of the chain: last sequence number (0 when empty) and its entry hash."""

    seq: int
    entry_hash: str


def lock_chain(session: Session) -> None:
    """PostgreSQL: take the chain's transaction-scoped advisory lock now (held until the caller's
    transaction ends; reentrant, so the appends that follow take it again at no wait). Other
    dialects: nothing (SQLite's ``BEGIN IMMEDIATE`` already serialises whole write transactions).

    Once granted, every transaction that held it before has committed or rolled back, so a
    statement run after this one (READ COMMITTED: a snapshot per statement) sees all their rows.
    Must be its own statement, before those reads: a statement's snapshot is taken when it starts.
    """
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%s)", (_PG_LOCK_KEY,))


def _lock_and_read_head(session: Session) -> Head:
    conn = session.connection()
    mark = _PLACEHOLDER.get(conn.dialect.name)
    if mark is None:  # another dialect: through SQLAlchemy
        return _lock_and_read_head_core(session)
    # Driver-level statements: building the ORM select and its comparison cost milliseconds per
    # batch, more than the database's work.
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({mark})", (_PG_LOCK_KEY,))
    else:
        # The first write of the transaction takes SQLite's RESERVED lock: one appender at a time.
        conn.exec_driver_sql(f"UPDATE ledger_head SET seq = seq WHERE chain = {mark}", (CHAIN,))
    row = conn.exec_driver_sql(f"SELECT seq, entry_hash FROM ledger_head WHERE chain = {mark}", (CHAIN,)).first()
    if row is None:
        return _create_head(session)
    return Head(row[0], row[1])


_PLACEHOLDER = {"postgresql": "%s", "sqlite": "?"}  # positional parameter of each driver we talk to directly


def _lock_and_read_head_core(session: Session) -> Head:
    session.execute(text("UPDATE ledger_head SET seq = seq WHERE chain = :c"), {"c": CHAIN})
    head = session.execute(select(LedgerHead).where(LedgerHead.chain == CHAIN)).scalar_one_or_none()
    if head is None:
        return _create_head(session)
    return Head(head.seq, head.entry_hash)


def _create_head(session: Session) -> Head:
    session.add(LedgerHead(chain=CHAIN, seq=0, entry_hash=GENESIS_HASH, updated_at=datetime.now(timezone.utc)))
    session.flush()
    return Head(0, GENESIS_HASH)


def _write_head(session: Session, seq: int, entry_hash: str, now: datetime) -> None:
    """Move the recorded head (the caller holds the chain's lock)."""
    conn = session.connection()
    mark = _PLACEHOLDER.get(conn.dialect.name)
    table = LedgerHead.__table__
    if mark is None:
        session.execute(table.update().where(LedgerHead.chain == CHAIN).values(seq=seq, entry_hash=entry_hash, updated_at=now))
        return
    conn.exec_driver_sql(f"UPDATE ledger_head SET seq = {mark}, entry_hash = {mark}, updated_at = {mark} WHERE chain = {mark}",
                         (seq, entry_hash, core_bind(table.c.updated_at, conn.dialect)(now), CHAIN))


def append(session: Session, table_name: str, rows: Sequence[Mapping[str, Any]]) -> Head:
    """Append one ledger entry per row of ``table_name`` (rows already inserted, with their keys).

    Args:
        session: the session whose transaction also inserted the rows; commit is the caller's.
        table_name: a table with a single-column primary key.
        rows: column → value mappings as stored (must include the primary key).

    Returns:
        The new head. An empty ``rows`` appends nothing.
    """
    if not rows:
        return current_head(session)
    table = ledgered_table(table_name)
    pk = _pk(table)
    return _append_entries(session, ((table_name, str(r[pk.name]), "insert", leaf_hash(table, r), None) for r in rows))


def append_values(session: Session, table_name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Head:
    """``append`` for rows given as value tuples in ``columns`` order (a bulk writer's own tuples),
    without building a mapping per row; the entries are the ones ``append`` writes for
    ``dict(zip(columns, row))`` (``leaf_values`` gives ``leaf_hash``'s bytes).

    Args:
        session: as for ``append``.
        table_name: a table with a single-column primary key, which ``columns`` must name.
        columns: the column of each tuple position; columns of the table not named are None.
        rows: the tuples, in the order the entries are to be appended.
    """
    if not rows:
        return current_head(session)
    table = ledgered_table(table_name)
    key_at = list(columns).index(_pk(table).name)
    leaf = _values_leaf(table, tuple(columns))
    return _append_entries(session, ((table_name, str(r[key_at]), "insert", leaf(r), None) for r in rows))


@lru_cache(maxsize=None)
def _values_leaf(table: Table, columns: tuple[str, ...]):
    """A function: value tuple in ``columns`` order → ``leaf_hash(table, dict(zip(columns, values)))``.

    The content mapping is built in C (``itemgetter`` + ``zip``) with the table's column names in
    the order ``leaf_hash`` builds them; a table column not in ``columns`` reads the None appended
    to each tuple. Values that need ``leaf_hash``'s normalisation (a datetime anywhere, an integer
    beyond 64 bits) take ``leaf_hash`` itself, so the bytes are always its bytes.
    """
    names = _column_names(table)
    missing = len(columns)
    at = [columns.index(n) if n in columns else missing for n in names]
    pick = itemgetter(*at) if len(at) > 1 else (lambda v: (v[at[0]],))
    plain = not _datetime_columns(table)

    def leaf(values: Sequence[Any]) -> str:
        if plain:
            content = dict(zip(names, pick((*values, None))))
            try:
                return sha256(orjson.dumps(content, default=_fast_default, option=_FAST_OPTS)).hexdigest()
            except (_NotFast, orjson.JSONEncodeError):
                pass
        return leaf_hash(table, dict(zip(columns, values)))

    return leaf


def values_leaf(table_name: str, columns: Sequence[str]):
    """The function ``append_values`` hashes each tuple with: value tuple in ``columns`` order →
    ``leaf_hash`` of ``dict(zip(columns, values))`` (for rows whose leaf a caller computes itself)."""
    return _values_leaf(ledgered_table(table_name), tuple(columns))


LeafTemplate = bytes  # a leaf's encoding with a %b hole per late value (leaf_template)


def leaf_template(table_name: str, columns: Sequence[str], values: Sequence[Any],
                  late: Sequence[str]) -> LeafTemplate | None:
    """The leaf encoding of a row whose ``late`` columns are not known yet, with a hole where each goes.

    For the row ``dict(zip(columns, values))`` completed with the ``late`` values (table columns
    in neither are None), the bytes ``leaf_hash`` hashes are ``t % (enc(late[0]), …)`` (bytes
    ``%b`` formatting; ``enc``: the value's leaf encoding, ``orjson.dumps``, or a JSON column's
    exact text) — ``leaf_from_template``. The leaf is one compact, key-sorted JSON object whose
    members are each encoded on their own, whatever their neighbours' values, so it can be cut
    where the late values go (``leaf_template_function``). Lets a parse worker do the costly part
    (the row's text) and the writer only fill in and hash once the id is known.

    Args:
        table_name: a ledgered table (``leaf_hash``'s column set).
        columns, values: the row's known columns and their values (a JSON column's value may be
            an ``orjson.Fragment`` of its exact leaf text, as the writer passes it).
        late: the columns filled in later, in sorted order (the order the leaf's keys take).

    Returns:
        The template (bytes, every ``%`` of the encoding doubled, a ``%b`` per late value), or
        None where ``leaf_hash`` would not take its fast encoding (a datetime column, a value
        orjson refuses: a datetime, an integer beyond 64 bits): the caller then hashes the
        completed row the usual way.
    """
    return leaf_template_function(table_name, tuple(columns), tuple(late))(values)


@lru_cache(maxsize=None)
def leaf_template_function(table_name: str, columns: tuple[str, ...], late: tuple[str, ...]):
    """``leaf_template`` for rows of ``columns`` with holes at ``late``, as a function of the value tuple.

    One ``orjson.dumps`` of the whole leaf content with each late column's value a NUL byte (an
    ``orjson.Fragment``, written as given), then ``%`` doubled and each NUL made ``%b``: orjson
    writes no NUL byte of its own (a NUL in a string is escaped), so the holes are exactly where
    the late values go (a row whose values hold a NUL some other way, a fragment, gives a hole too
    many: None).
    """
    table = ledgered_table(table_name)
    names = _column_names(table)
    if list(late) != sorted(late) or not set(late) <= set(names) or _datetime_columns(table):
        return lambda values: None
    missing, marker = len(columns), len(columns) + 1  # positions of the two values appended to each tuple
    # The members in sorted order already (ASCII column names): orjson need not sort them, unless a
    # JSON column's value (a dict whose keys need sorting too) is written here rather than filled in.
    names = tuple(sorted(names))
    nested = any(isinstance(table.c[n].type, JSON) for n in names if n not in late)
    options = _FAST_OPTS if nested else _FAST_OPTS & ~orjson.OPT_SORT_KEYS
    pick = itemgetter(*[marker if n in late else columns.index(n) if n in columns else missing for n in names])
    nul = orjson.Fragment(b"\x00")
    holes = len(late)

    def template(values: Sequence[Any]) -> LeafTemplate | None:
        try:
            data = orjson.dumps(dict(zip(names, pick((*values, None, nul)))), default=_fast_default, option=options)
        except (_NotFast, orjson.JSONEncodeError):
            return None
        if data.count(b"\x00") != holes:
            return None
        return data.replace(b"%", b"%%").replace(b"\x00", b"%b") if b"%" in data else data.replace(b"\x00", b"%b")

    return template


def leaf_from_template(template: LeafTemplate, late_values: tuple[bytes, ...]) -> str:
    """``leaf_hash`` of the completed row: ``late_values`` are the late columns' leaf encodings
    (``orjson.dumps`` of the value; a JSON column's exact text), in the order of ``late``."""
    return sha256(template % late_values).hexdigest()


def append_leaves(session: Session, table_name: str, entries: Iterable[tuple[str, str]]) -> Head:
    """``append`` for rows whose leaf hashes the caller computed (``leaf_template`` /
    ``values_leaf``): ``entries`` are ``(row key as text, leaf hash)``, in append order."""
    return _append_entries(session, ((table_name, key, "insert", leaf, None) for key, leaf in entries))


def append_tombstone(session: Session, table_name: str, row: Mapping[str, Any], reason: str) -> Head:
    """Record that a covered row is being deleted (retention), before the caller deletes it.

    The tombstone content names the table, the key, the deleted row's leaf hash and the reason, so
    the chain still accounts for the row after it is gone.
    """
    table = ledgered_table(table_name)
    key = str(row[_pk(table).name])
    tomb = {"table": table_name, "key": key, "leaf": leaf_hash(table, row), "reason": reason}
    return _append_entries(session, [(table_name, key, "tombstone", sha256_hex(canonical_json(tomb)), tomb)])


def _append_entries(session: Session, entries: Iterable[tuple[str, str, str, str, Any]]) -> Head:
    head = _lock_and_read_head(session)
    now = datetime.now(timezone.utc)
    seq, prev = head.seq, head.entry_hash
    batch: list[tuple[int, str, str, str, str, str, str, Any]] = []
    for table_name, key, op, leaf, tomb in entries:
        seq += 1
        # chain_hash(prev, leaf) inlined: SHA-256 over the two ASCII hex strings.
        entry_hash = sha256((prev + leaf).encode("ascii")).hexdigest()
        batch.append((seq, table_name, key, op, leaf, prev, entry_hash, tomb))
        prev = entry_hash
    if batch:
        _insert_entries(session, batch, now)
        _write_head(session, seq, prev, now)
    return Head(seq, prev)


_ENTRY_COLUMNS = ("seq", "table_name", "row_key", "op", "content_hash", "prev_hash", "entry_hash", "tombstone",
                  "appended_at")


def _insert_entries(session: Session, batch: list[tuple[int, str, str, str, str, str, str, Any]], now: datetime) -> None:
    """Write ledger entries with the values bound once per batch, straight to the driver.

    The stored values are what SQLAlchemy's types would write (the JSON column's serializer, with
    ``None`` as JSON ``null``; ``appended_at`` through ``UTCDateTime``'s processor): only the
    per-row Core machinery is skipped. PostgreSQL: ``COPY``; SQLite: ``executemany``; other
    dialects: Core executemany.
    """
    conn = session.connection()
    dialect = conn.dialect
    table = LedgerEntry.__table__
    if dialect.name not in ("postgresql", "sqlite"):
        session.execute(table.insert(), [dict(zip(_ENTRY_COLUMNS, (*e, now))) for e in batch])
        return
    dumps = getattr(dialect, "_json_serializer", None) or json.dumps
    # The dialect's own processor, as Core applies it: on SQLite the text SQLAlchemy writes (also
    # ".000000" for a whole second), bound once per batch instead of sqlite3 adapting each row.
    at = core_bind(table.c.appended_at, dialect)(now)
    if dialect.name == "postgresql":
        with conn.connection.driver_connection.cursor() as cur:
            with cur.copy(f"COPY ledger ({', '.join(_ENTRY_COLUMNS)}) FROM STDIN") as copy:
                for e in batch:
                    copy.write_row((*e[:7], "null" if e[7] is None else dumps(e[7]), at))
        return
    conn.exec_driver_sql(
        f"INSERT INTO ledger ({', '.join(_ENTRY_COLUMNS)}) VALUES ({', '.join('?' for _ in _ENTRY_COLUMNS)})",
        [(*e[:7], "null" if e[7] is None else dumps(e[7]), at) for e in batch])


def current_head(session: Session) -> Head:
    """The head as recorded (no lock taken); ``Head(0, GENESIS_HASH)`` for an empty chain."""
    head = session.execute(select(LedgerHead).where(LedgerHead.chain == CHAIN)).scalar_one_or_none()
    return Head(head.seq, head.entry_hash) if head else Head(0, GENESIS_HASH)


@dataclass(frozen=True)
class Break:
    """The first problem ``verify`` found: which entry, which row, what is wrong."""

    seq: int | None
    table_name: str | None
    row_key: str | None
    problem: str

    def describe(self) -> str:
        where = f"ledger entry {self.seq}" if self.seq is not None else "ledger"
        if self.table_name:
            where += f" ({self.table_name} key {self.row_key})"
        return f"{where}: {self.problem}"


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of ``verify``: entries checked, the head, and the first break (None when intact)."""

    entries: int
    head: Head
    first_break: Break | None

    @property
    def ok(self) -> bool:
        return self.first_break is None


def _entries(session: Session) -> Iterator[list[Any]]:
    """Ledger entries in sequence order, in batches (Core rows: attribute access, no ORM identity map)."""
    table = LedgerEntry.__table__
    last = 0
    while True:
        batch = list(
            session.execute(select(table).where(table.c.seq > last).order_by(table.c.seq).limit(VERIFY_BATCH)).all()
        )
        if not batch:
            return
        yield batch
        last = batch[-1].seq


def _rows_by_key(session: Session, table_name: str, keys: list[str]) -> dict[str, Mapping[str, Any]]:
    table = ledgered_table(table_name)
    pk = _pk(table)
    typed = [int(k) for k in keys] if pk.type.python_type is int else keys
    rows = session.execute(select(table).where(pk.in_(typed))).mappings()
    return {str(r[pk.name]): r for r in rows}


def verify(session: Session) -> VerifyResult:
    """Recompute the whole chain and every covered row; report the first break.

    Checks, in sequence order: numbering is dense from 1 (a deleted entry leaves a hole),
    ``prev_hash`` links to the previous entry, ``entry_hash`` recomputes, each covered row still
    exists (unless a tombstone accounts for it) and hashes to its ``content_hash``, the recorded
    head matches the last entry (a truncated tail shows), and every row of a covered table has an
    entry (a row added or an entry deleted behind the ledger's back shows).
    """
    tombstoned = {
        (t, k) for t, k in session.execute(select(LedgerEntry.table_name, LedgerEntry.row_key).where(LedgerEntry.op == "tombstone"))
    }
    expected_seq, prev = 1, GENESIS_HASH
    count = 0
    for batch in _entries(session):
        by_table: dict[str, list[str]] = {}
        for e in batch:
            if e.op == "insert":
                by_table.setdefault(e.table_name, []).append(e.row_key)
        rows = {t: _rows_by_key(session, t, keys) for t, keys in by_table.items()}
        for e in batch:
            brk = _check_entry(e, expected_seq, prev, rows, tombstoned)
            if brk:
                return VerifyResult(count, Head(expected_seq - 1, prev), brk)
            expected_seq, prev, count = e.seq + 1, e.entry_hash, count + 1
    head = current_head(session)
    if head.seq != count or head.entry_hash != prev:
        return VerifyResult(count, Head(count, prev), Break(
            count + 1 if head.seq > count else head.seq, None, None,
            f"recorded head is entry {head.seq} but the chain ends at entry {count}: entries were deleted from the tail"
            if head.seq > count else "recorded head does not match the last entry's hash"))
    brk = _check_uncovered_rows(session)
    return VerifyResult(count, Head(count, prev), brk)


def _check_entry(e: Any, expected_seq: int, prev: str, rows: dict[str, dict[str, Mapping[str, Any]]],
                 tombstoned: set[tuple[str, str]]) -> Break | None:
    if e.seq != expected_seq:
        return Break(expected_seq, None, None, f"entry missing (next entry present is {e.seq})")
    if e.prev_hash != prev:
        return Break(e.seq, e.table_name, e.row_key, "prev_hash does not link to the previous entry")
    if chain_hash(prev, e.content_hash.encode("ascii")) != e.entry_hash:
        return Break(e.seq, e.table_name, e.row_key, "entry_hash does not recompute")
    if e.op == "tombstone":
        if sha256_hex(canonical_json(e.tombstone)) != e.content_hash:
            return Break(e.seq, e.table_name, e.row_key, "tombstone record was altered")
        return None
    row = rows.get(e.table_name, {}).get(e.row_key)
    if row is None:
        if (e.table_name, e.row_key) in tombstoned:
            return None
        return Break(e.seq, e.table_name, e.row_key, "covered row was deleted")
    if leaf_hash(ledgered_table(e.table_name), row) != e.content_hash:
        return Break(e.seq, e.table_name, e.row_key, "covered row content was changed")
    return None


@dataclass(frozen=True)
class AnchorCheck:
    """Outcome of ``check_anchor``: the anchor (seq, entry_hash) and what the store holds there."""

    seq: int
    entry_hash: str
    ok: bool
    detail: str


def check_anchor(session: Session, seq: int, entry_hash: str) -> AnchorCheck:
    """Check that the store's ledger still holds entry ``seq`` with ``entry_hash`` (a pack's anchor).

    ``verify`` proves the chain consistent with itself and with its recorded head, so a tail cut
    back with the head rewound to match passes it; an anchor recorded elsewhere (a signed pack's
    manifest) does not move with it. Because each entry hash chains every earlier one, a matching
    hash at ``seq`` also shows entries 1..seq were not rewritten (given ``verify`` passes). Seq 0
    is the empty chain, whose hash is ``GENESIS_HASH``.
    """
    if seq == 0:
        if entry_hash == GENESIS_HASH:
            return AnchorCheck(seq, entry_hash, True, "the empty ledger (genesis): nothing to check")
        return AnchorCheck(seq, entry_hash, False, f"entry 0 is the genesis, whose hash is {GENESIS_HASH}, not {entry_hash}")
    stored = session.execute(select(LedgerEntry.entry_hash).where(LedgerEntry.seq == seq)).scalar_one_or_none()
    if stored is None:
        last = session.execute(select(func.max(LedgerEntry.seq))).scalar_one_or_none() or 0
        what = (f"it ends at entry {last}, so its tail was cut back by at least entries {last + 1}..{seq}"
                if last < seq else "that entry was deleted")
        return AnchorCheck(seq, entry_hash, False,
                           f"the store's ledger has no entry {seq}: {what} since the anchor was recorded "
                           "(or this is not the store it was recorded from)")
    if stored != entry_hash:
        return AnchorCheck(seq, entry_hash, False,
                           f"ledger entry {seq} has entry_hash {stored}, the anchor records {entry_hash}: the ledger up "
                           "to that entry was rewritten since the anchor was recorded (or this is not the store it "
                           "was recorded from)")
    return AnchorCheck(seq, entry_hash, True, f"ledger entry {seq} holds entry_hash {entry_hash}")


def _check_uncovered_rows(session: Session) -> Break | None:
    tables = [t for (t,) in session.execute(select(LedgerEntry.table_name).distinct())]
    for table_name in sorted(set(tables) | set(LEDGERED_TABLES)):
        table = ledgered_table(table_name)
        pk = _pk(table)
        covered = select(LedgerEntry.row_key).where(LedgerEntry.table_name == table_name, LedgerEntry.op == "insert")
        key_text = func.cast(pk, LedgerEntry.row_key.type)
        stray = session.execute(select(pk).where(key_text.not_in(covered)).order_by(pk).limit(1)).scalar_one_or_none()
        if stray is not None:
            return Break(None, table_name, str(stray), "row has no ledger entry (inserted behind the ledger, or its entry was deleted)")
    return None


# Tables whose every row must be covered by the ledger. Stages register theirs here.
LEDGERED_TABLES: set[str] = {"object_versions", "coverage_intervals", "quarantine", "inference_records", "findings", "evidence_packs",
                              "attribution_settings"}
