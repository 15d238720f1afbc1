"""Options shared by commands (``--database-url``, ``--output``) and the store they open."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from collector.errors import UserError
from collector.settings import ENV_VARS, Settings, load_settings
from collector.store.db import make_engine, make_session_factory
from collector.store.migrate import require_current_schema


def database_option(fn: Callable) -> Callable:
    """Add ``--database-url`` (env ``DRAUDIT_DATABASE_URL``, default ``sqlite:///./draudit.db``)."""
    return click.option("--database-url", "database_url", default=None, metavar="URL",
                        help="SQLAlchemy URL: sqlite:///draudit.db or postgresql://user@host/db "
                             "(env DRAUDIT_DATABASE_URL).")(fn)


def output_option(fn: Callable) -> Callable:
    """Add ``--output table|json``."""
    return click.option("--output", "output", type=click.Choice(["table", "json"]), default="table",
                        show_default=True, help="Human table or one JSON document for scripts.")(fn)


# Settings fields whose flag is not the field's name with dashes (``draudit run --host/--port``).
_FLAG_OF = {"http_host": "--host", "http_port": "--port"}


def settings_from(**overrides: Any) -> Settings:
    """Settings from the environment with the given CLI overrides (``None`` = not given).

    A bad value given by a flag is reported under the flag (``--cluster``: the field's name with
    dashes, as the validated flags are spelled), not under the environment variable.
    """
    settings = load_settings()  # a bad environment value fails here, named by its variable
    try:
        settings = settings.with_overrides(**overrides)
    except UserError as exc:
        message = str(exc)
        for name, value in overrides.items():
            var = next((k for k, v in ENV_VARS.items() if v == name), None)
            if value is not None and var and message.startswith((var + " ", var + "=")):
                message = _FLAG_OF.get(name, f"--{name.replace('_', '-')}") + message[len(var):]
        raise UserError(message, exc.exit_code) from None
    ctx = click.get_current_context(silent=True)
    if ctx is not None:  # the store this command uses, for an error about it (``cli._Main``)
        ctx.meta[DATABASE_URL_META] = settings.database_url
    return settings


DATABASE_URL_META = "draudit.database_url"


def open_store(settings: Settings, *, check_schema: bool = True):
    """Engine and session factory for ``settings.database_url``.

    Raises:
        UserError: bad URL, unreachable database, or a schema not at this version's head.
    """
    if check_schema:
        require_existing_sqlite_file(settings.database_url)
    engine = make_engine(settings.database_url)
    if check_schema:
        require_current_schema(engine)
    return engine, make_session_factory(engine)


def require_existing_sqlite_file(url: str) -> None:
    """A command that needs a migrated store must not create an empty SQLite file by connecting
    (SQLite creates a missing file on first connect); ``draudit db upgrade`` creates stores.

    Raises:
        UserError: ``url`` names a SQLite file that does not exist.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # make_engine reports a malformed URL
    path = parsed.database
    if not parsed.drivername.startswith("sqlite") or not path or path == ":memory:" or path.startswith("file:"):
        return
    if not Path(path).exists():
        raise UserError(f"database file {path} does not exist; give the store's URL with --database-url (or "
                        f"DRAUDIT_DATABASE_URL), e.g. the one `draudit run` or `draudit demo` uses; to create a new, "
                        f"empty store instead: `draudit db upgrade --database-url {url}`")


def echo_json(value: Any) -> None:
    """Print exactly one JSON document on stdout."""
    click.echo(json.dumps(value, indent=2, sort_keys=False, default=str))
