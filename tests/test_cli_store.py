"""`draudit db` and `draudit ledger verify` as a user runs them: clear one-line errors, exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner
from sqlalchemy import delete, text, update

from collector.cli import cli
from collector.store.models import LedgerEntry, ObjectVersion
from tests.test_store import _claim, _store_versions, _version_row


def draudit(*args: str, env_url: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "collector.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_upgrade_downgrade_base_and_upgrade_again(database_url):
    assert draudit("db", "upgrade", "--database-url", database_url).returncode == 0
    cur = draudit("db", "current", "--database-url", database_url)
    assert "up to date" in cur.stdout
    down = draudit("db", "downgrade", "base", "--database-url", database_url)
    assert down.returncode == 0 and "revision base" in down.stdout
    assert "not migrated" in draudit("db", "current", "--database-url", database_url).stdout
    assert draudit("db", "upgrade", "--database-url", database_url).returncode == 0


def test_ledger_verify_exit_codes_name_the_broken_entry(database_url, engine, sessions):
    inserted = _store_versions(sessions, [_version_row(_claim(str(500 + i))) for i in range(4)])
    ok = draudit("ledger", "verify", "--database-url", database_url)
    assert ok.returncode == 0 and "intact: 4 entries" in ok.stdout
    with sessions.begin() as s:
        s.execute(update(ObjectVersion).where(ObjectVersion.id == inserted[1]["id"]).values(name="edited-by-hand"))
    bad = draudit("ledger", "verify", "--database-url", database_url)
    assert bad.returncode == 1
    assert f"ledger entry 2 (object_versions key {inserted[1]['id']})" in bad.stdout and "changed" in bad.stdout
    with sessions.begin() as s:
        s.execute(update(ObjectVersion).where(ObjectVersion.id == inserted[1]["id"]).values(name=inserted[1]["name"]))
        s.execute(delete(LedgerEntry).where(LedgerEntry.seq == 3))
    gone = draudit("ledger", "verify", "--database-url", database_url)
    assert gone.returncode == 1 and "ledger entry 3" in gone.stdout and "missing" in gone.stdout


def test_bad_database_inputs_give_one_line_and_no_traceback(tmp_path, database_url, engine):
    cases = [
        ("not a url at all", "is not a URL"),
        ("mysql://root@127.0.0.1/test", "not supported"),
        ("postgresql://root@127.0.0.1:1/nowhere", "cannot connect to database"),
        ("postgresql://root@127.0.0.1:5432/draudit_no_such_db", "does not exist — create it (createdb -h 127.0.0.1 -p 5432 -U root draudit_no_such_db, "
         "or CREATE DATABASE) or fix DRAUDIT_DATABASE_URL / --database-url, then `draudit db upgrade`"),
        (f"sqlite:///{tmp_path / 'never-migrated.db'}",
         f"run `draudit db upgrade --database-url sqlite:///{tmp_path / 'never-migrated.db'}` first"),
        (f"sqlite:///{tmp_path / 'typo.db'}", "does not exist; give the store's URL with --database-url (or DRAUDIT_DATABASE_URL), e.g. the one `draudit run` or `draudit demo` uses; to create a new, empty store instead: `draudit db upgrade"),
        (f"sqlite:///{tmp_path / 'scoring.jsonl'}",
         f"the database sqlite:///{tmp_path / 'scoring.jsonl'} cannot be used: file is not a database"),
    ]
    (tmp_path / "never-migrated.db").touch()  # exists, but holds no schema
    (tmp_path / "scoring.jsonl").write_text('{"transaction.id": "TXN-1", "@timestamp": "2026-11-28T10:00:00Z"}\n' * 200)
    for url, expected in cases:
        r = draudit("ledger", "verify", "--database-url", url)
        assert r.returncode == 2, (url, r.stderr)
        assert expected in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))
    r = draudit("ledger", "verify", "--database-url", database_url)
    assert r.returncode == 2 and "does not know" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("command", [["trace", "TXN-1"], ["attribute"], ["jobs", "list"]])
def test_commands_on_a_missing_sqlite_store_do_not_create_it(tmp_path, command):
    path = tmp_path / "typo.db"
    res = CliRunner().invoke(cli, [*command, "--database-url", f"sqlite:///{path}"])
    assert res.exit_code == 2, res.output
    assert f"database file {path} does not exist" in res.output and "draudit db upgrade" in res.output
    assert not path.exists()


def test_db_current_of_a_missing_sqlite_file_does_not_create_it(tmp_path):
    path = tmp_path / "none.db"
    result = CliRunner().invoke(cli, ["db", "current", "--database-url", f"sqlite:///{path}"])
    assert result.exit_code == 2
    assert f"database file {path} does not exist; give the store's URL with --database-url (or DRAUDIT_DATABASE_URL), e.g. the one `draudit run` or `draudit demo` uses; to create a new, empty store instead: `draudit db upgrade" in result.output
    assert not path.exists()


@pytest.mark.parametrize("url, shown", [
    ("postgresql://user@127.0.0.1:1/x?password=secret", "postgresql+psycopg://user@127.0.0.1:1/x?password=***"),
    ("postgresql://u:secret@127.0.0.1:1/x?sslpassword=secret", "postgresql+psycopg://u:***@127.0.0.1:1/x?sslpassword=***"),
    ("user:secret@127.0.0.1", "user:***@127.0.0.1"),
])
def test_no_error_prints_a_database_password(url, shown):
    """A tester's finding: a password given as a query parameter (libpq's ``?password=``), or in a
    URL without a scheme, was printed in full by the connection and 'not a URL' errors."""
    r = draudit("jobs", "list", "--database-url", url)
    assert r.returncode == 2 and "secret" not in r.stdout + r.stderr
    assert shown in r.stderr, r.stderr
