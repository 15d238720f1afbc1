"""Alembic, driven programmatically: ``draudit db upgrade|current|downgrade`` and start-up checks.

Schema changes happen only through the revisions in ``migrations/versions``.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

import migrations
from collector.errors import UserError
from collector.store.db import check_connection, shown_url

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent
_MIGRATION_LOCK_KEY = 0x6472616D6967  # "dramig"


def alembic_config(engine: Engine) -> Config:
    """An Alembic ``Config`` for ``engine``'s database using the packaged ``migrations/``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def _run(engine: Engine, fn, *args) -> None:
    check_connection(engine)
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Replicas starting together (init containers) migrate one at a time; the others
            # wait, then find the schema already at head.
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        cfg.attributes["connection"] = conn
        try:
            fn(cfg, *args)
        except CommandError as exc:
            raise UserError(f"migration failed: {exc}") from None


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade the schema to ``revision`` (default: the newest).

    Raises:
        UserError: database unreachable, or a revision Alembic does not know.
    """
    _run(engine, command.upgrade, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade the schema to ``revision`` (``base`` removes every draudit table).

    Raises:
        UserError: database unreachable, or a revision Alembic does not know.
    """
    _run(engine, command.downgrade, revision)


def head_revision() -> str:
    """The newest revision id shipped with this version of draudit."""
    return ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (``None`` if never migrated).

    Raises:
        UserError: database unreachable.
    """
    check_connection(engine)
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def require_current_schema(engine: Engine) -> None:
    """Refuse to run on a database that is not at this version's head revision.

    Raises:
        UserError: never migrated, behind, or at a revision this version does not know
        (a newer draudit migrated it), each with the command that fixes it.
    """
    current = current_revision(engine)
    head = head_revision()
    where = shown_url(engine.url)
    if current == head:
        return
    if current is None:
        raise UserError(f"database {where} has no draudit schema; run `draudit db upgrade --database-url {where}` "
                        "first (the same URL, also when it came from DRAUDIT_DATABASE_URL)")
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    try:
        script.get_revision(current)
    except Exception:
        raise UserError(
            f"database {where} is at migration revision {current!r}, which this draudit version does not know "
            f"(a newer draudit migrated it); upgrade draudit, or run `draudit db downgrade {head}` with the newer version"
        ) from None
    raise UserError(f"database {where} is at revision {current}, behind {head}; run `draudit db upgrade`")


def ledger_entries(engine: Engine) -> int:
    """How many ledger entries the database holds (0 when there is no ledger table yet)."""
    check_connection(engine)
    with engine.connect() as conn:
        if not inspect(conn).has_table("ledger"):
            return 0
        return int(conn.execute(text("SELECT count(*) FROM ledger")).scalar_one())
