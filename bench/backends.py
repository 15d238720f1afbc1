"""Run a benchmark once per backend: a temporary SQLite file and a throwaway PostgreSQL database.

``run(url)`` is called with each database URL; the PostgreSQL database is created on the
administrative connection ``pg_url`` and dropped afterwards.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
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


class ServerCpu:
    """CPU seconds used by the PostgreSQL backends serving ``database`` since construction.

    Read from ``/proc/<pid>/stat`` (utime + stime) of the ``postgres: … <database> …`` processes;
    0 on SQLite (``database`` None) or where ``/proc`` is not readable. Backends that exit between
    two samples are not counted.
    """

    def __init__(self, database: str | None) -> None:
        self.database = database
        self.tick = os.sysconf("SC_CLK_TCK")
        self.start = self._sample()

    def _sample(self) -> dict[int, float]:
        out: dict[int, float] = {}
        if not self.database:
            return out
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmd = (d / "cmdline").read_bytes()
                if not cmd.startswith(b"postgres: ") or f" {self.database} ".encode() not in cmd:
                    continue
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                out[int(d.name)] = (int(fields[11]) + int(fields[12])) / self.tick
            except (OSError, IndexError, ValueError):
                continue
        return out

    def used_s(self) -> float:
        """CPU seconds since construction."""
        end = self._sample()
        return sum(v - self.start.get(pid, 0.0) for pid, v in end.items())
