"""Run a benchmark once per backend: a temporary SQLite file and a throwaway PostgreSQL database.

``run(url)`` is called with each database URL; the PostgreSQL database is created on the
administrative connection ``pg_url`` and dropped afterwards.
"""

from __future__ import annotations

import tempfile
import uuid
from typing import Callable

from sqlalchemy import text

from collector.store.db import make_engine

DEFAULT_PG_URL = "postgresql://root@127.0.0.1:5432/test"
BACKENDS = ("sqlite", "postgresql")


def for_each_backend(run: Callable[[str], None], pg_url: str = DEFAULT_PG_URL,
                     backends: tuple[str, ...] = ("sqlite", "postgresql")) -> None:
    """Call ``run`` on SQLite, then on PostgreSQL (skipped with a note if it is unreachable).

    ``backends`` restricts the run to some of them (names as in ``BACKENDS``).
    """
    if "sqlite" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            run(f"sqlite:///{tmp}/bench.db")
    if "postgresql" not in backends:
        return
    admin = make_engine(pg_url, isolation_level="AUTOCOMMIT")
    name = f"draudit_bench_{uuid.uuid4().hex[:8]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001 - a benchmark reports and goes on
        print(f"postgresql skipped: {str(exc).splitlines()[0]}")
        return
    try:
        run(admin.url.set(database=name).render_as_string(hide_password=False))
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"))
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()
