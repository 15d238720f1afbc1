"""Engines and sessions for SQLite (embedded default) and PostgreSQL (production).

SQLite runs in WAL mode with a busy timeout and foreign keys on; every transaction starts with
``BEGIN IMMEDIATE`` (SQLAlchemy's recipe for pysqlite, with the write lock taken up front). A
deferred transaction that reads and then writes fails at once with "database is locked" when
another writer committed in between (SQLITE_BUSY_SNAPSHOT, which the busy timeout cannot wait
out); taking the lock first makes writers queue instead. SQLite is the single-process embedded
store, so serialising its transactions costs little; PostgreSQL is for concurrent production use. Connection problems surface as
``UserError`` with the fix, never as a traceback.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from collector.errors import UserError

SQLITE_BUSY_TIMEOUT_MS = 30_000


_SECRET_QUERY_KEYS = frozenset({"password", "passwd", "pwd", "sslpassword", "passfile"})


def shown_url(url: Any) -> str:
    """``url`` (a URL object or text) as it may be printed: the userinfo password and any query
    parameter that carries one (``?password=…``, libpq's ``sslpassword``) replaced by ``***``. Text
    that does not parse as a URL has a ``user:secret@`` part masked the same way."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        return re.sub(r"(?<=:)[^:@/\s]+(?=@)", "***", str(url))
    query = {k: ("***" if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in parsed.query.items()}
    return parsed.set(query=query).render_as_string(hide_password=True).replace("%2A%2A%2A", "***")


def normalise_url(url: str) -> str:
    """Map ``postgresql://`` and ``postgres://`` URLs to the psycopg 3 driver we ship.

    Raises:
        UserError: the URL cannot be parsed or names a backend we do not support.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UserError(
            f"database URL {shown_url(url)!r} is not a URL; use sqlite:///path/to/draudit.db or "
            "postgresql://user@host:5432/dbname (DRAUDIT_DATABASE_URL or --database-url)"
        ) from None
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif backend != "sqlite":
        raise UserError(
            f"database URL {shown_url(parsed)!r}: backend {backend!r} is not supported; "
            "use sqlite:/// or postgresql://"
        )
    return parsed.render_as_string(hide_password=False)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for ``url`` with draudit's connection settings.

    Raises:
        UserError: bad URL or unsupported backend (connection is not attempted here).
    """
    url = normalise_url(url)
    kwargs.setdefault("json_serializer", _json_dumps)
    try:
        if url.startswith("sqlite"):
            engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs)
            _configure_sqlite(engine)
        else:
            engine = create_engine(url, pool_pre_ping=True, **kwargs)
            _configure_postgresql(engine)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise UserError(f"database URL cannot be used: {exc}") from None
    return engine


def _configure_postgresql(engine: Engine) -> None:
    """Plan every prepared statement for its own parameters (``plan_cache_mode``, PostgreSQL 12+).

    psycopg prepares a statement server-side from its 6th execution, and PostgreSQL then switches
    to a generic plan if it is not costlier than the custom plans seen so far. Our statements run
    first against small tables (a fresh store, the start of an ingest), where a sequential scan is
    the cheapest plan; the generic plan kept from then scanned the whole ``inference_records`` table
    for each duplicate lookup once it held millions of rows (measured: 1 ms of server CPU per
    ingested line at 200 k lines). Custom plans cost a few tens of microseconds of planning per
    statement. Set per connection rather than as a startup option, which poolers such as
    PgBouncer reject."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):  # noqa: ANN001 - DBAPI types
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET plan_cache_mode = force_custom_plan")
        dbapi_connection.commit()


def _json_dumps(value: Any) -> str:
    """JSON columns are written with orjson (several times faster than the standard library);
    a value orjson refuses (an integer beyond 64 bits, e.g. in a ResourceClaim's opaque driver
    ``data``) is written by the standard library, exactly, instead of failing the transaction."""
    try:
        return orjson.dumps(value).decode("utf-8")
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let SQLAlchemy emit BEGIN IMMEDIATE itself (see below)
        cur = dbapi_conn.cursor()
        if engine.url.database not in (None, "", ":memory:"):
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def check_connection(engine: Engine) -> None:
    """Open one connection to prove the database is reachable.

    Raises:
        UserError: naming the database and the likely fix.
    """
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        where = shown_url(engine.url)
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        if engine.dialect.name == "postgresql" and f'database "{engine.url.database}" does not exist' in reason:
            u = engine.url
            where_flags = "".join(f" {flag} {value}" for flag, value in (("-h", u.host), ("-p", u.port),
                                                                            ("-U", u.username)) if value)
            fix = (f"create it (createdb{where_flags} {u.database}, or CREATE DATABASE) or fix DRAUDIT_DATABASE_URL / "
                   "--database-url, then `draudit db upgrade`")
        else:
            fix = "start the database or fix DRAUDIT_DATABASE_URL / --database-url"
        raise UserError(f"cannot connect to database {where}: {reason} — {fix}") from None


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Session factory bound to ``engine``; sessions do not expire objects on commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)
