"""Shared fixtures: every store test runs on SQLite and on PostgreSQL.

PostgreSQL: ``DRAUDIT_TEST_PG_URL`` (default ``postgresql://root@127.0.0.1:5432/test``) names an
administrative connection; each test session creates its own throwaway database there so parallel
runs never collide. In CI (``CI=true``) an unreachable PostgreSQL fails the run instead of
skipping: the PostgreSQL half of the suite must really run.
"""

from __future__ import annotations

import os
import uuid

import pytest
from sqlalchemy import text

from collector.store import migrate
from collector.store.db import make_engine, make_session_factory

PG_ADMIN_URL = os.environ.get("DRAUDIT_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _pg_available() -> str | None:
    try:
        eng = make_engine(PG_ADMIN_URL)
        with eng.connect() as conn:
            conn.execute(text("SELECT 1"))
        eng.dispose()
        return None
    except Exception as exc:  # noqa: BLE001 - reported below
        return str(exc).splitlines()[0]


@pytest.fixture(scope="session")
def pg_database_url():
    """URL of a fresh PostgreSQL database for this test session (dropped at the end)."""
    problem = _pg_available()
    if problem:
        if IN_CI:
            pytest.fail(f"PostgreSQL tests cannot run in CI: {problem}")
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {problem}")
    name = f"draudit_t_{uuid.uuid4().hex[:12]}"
    admin = make_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    base = admin.url.set(database=name)
    yield base.render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"))
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    """An empty database URL, once per backend. PostgreSQL databases are emptied between tests."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'draudit.db'}"
        return
    url = request.getfixturevalue("pg_database_url")
    _reset_pg(url)
    yield url


def _reset_pg(url: str) -> None:
    eng = make_engine(url)
    with eng.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    eng.dispose()


@pytest.fixture
def engine(database_url):
    """An engine on a database migrated to head (``draudit db upgrade``), per backend."""
    eng = make_engine(database_url)
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def sessions(engine):
    """Session factory bound to the migrated ``engine``."""
    return make_session_factory(engine)


@pytest.fixture
def srv():
    """A started fake Kubernetes API server (``collector.sim``) on a free loopback port. It sends a
    BOOKMARK every 0.3 s to watches that ask, as a real API server does about every minute: the
    watcher tests' read timeout (1 s, ``watch_support.FAST``) then fires only on a silent stream,
    as the 75 s default does against a real server (not on a quiet one)."""
    from collector.sim import FakeApiServer

    server = FakeApiServer(bookmark_interval_s=0.3)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def backend(database_url) -> str:
    """``'sqlite'`` or ``'postgresql'`` for the current parametrisation."""
    return "sqlite" if database_url.startswith("sqlite") else "postgresql"
