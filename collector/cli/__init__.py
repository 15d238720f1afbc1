"""``draudit`` command line: one click module per command group, registered below."""

from __future__ import annotations

import gzip
import importlib
import tarfile
import zlib
import logging
import sys

import click
import sqlalchemy.exc

from collector import __version__
from collector.errors import UserError

# Each module defines ``commands``: a list of click commands/groups added to ``draudit``.
COMMAND_MODULES = [
    "collector.cli.db",
    "collector.cli.ingest",
    "collector.cli.quarantine",
    "collector.cli.lineage",
    "collector.cli.watch",
    "collector.cli.policy",
    "collector.cli.findings",
    "collector.cli.report",
    "collector.cli.demo",
]


def _database_shown(ctx: click.Context) -> str:
    """The database URL the command used (``options.settings_from`` records it), password hidden,
    followed by a space; empty before any was resolved."""
    from collector.cli.options import DATABASE_URL_META
    from collector.store.db import shown_url

    url = ctx.meta.get(DATABASE_URL_META)
    return shown_url(url) + " " if url else ""


class _Main(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            click.echo(f"draudit: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except sqlalchemy.exc.DBAPIError as exc:
            # The store cannot be used (server down, not a database file, disk full, locked): an
            # environment problem, one line. Errors of our own SQL (IntegrityError, ProgrammingError…)
            # are bugs and keep their traceback.
            if type(exc) not in (sqlalchemy.exc.OperationalError, sqlalchemy.exc.DatabaseError, sqlalchemy.exc.InterfaceError):
                raise
            first = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
            click.echo(f"draudit: error: the database {_database_shown(ctx)}cannot be used: {first} "
                       "(check --database-url / DRAUDIT_DATABASE_URL)", err=True)
            sys.exit(2)
        except (EOFError, gzip.BadGzipFile, zlib.error, tarfile.ReadError) as exc:
            # click would print only "Aborted!" for EOFError: say what happened instead.
            click.echo(f"draudit: error: an input file ended early or is not valid gzip/tar ({type(exc).__name__}: {exc}); "
                       "check that the file was copied completely", err=True)
            sys.exit(2)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="draudit")
@click.option("--log-level", default=None, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Logging detail on stderr (env DRAUDIT_LOG_LEVEL, default WARNING).")
def cli(log_level: str | None) -> None:
    """draudit: which physical GPU served which transaction — evidence for DORA/NIS2 audits."""
    import os

    level = (log_level or os.environ.get("DRAUDIT_LOG_LEVEL") or "WARNING").upper()
    logging.basicConfig(level=getattr(logging, level, logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # WeasyPrint warns on every font when HarfBuzz-Subset is missing (it falls back to fontTools,
    # with identical output); that is not the user's concern.
    # urllib3 logs each of its transparent retries; our own backoff logs the failure that matters.
    for noisy in ("weasyprint", "fontTools", "urllib3.connectionpool"):
        logging.getLogger(noisy).setLevel(max(logging.ERROR, logging.getLogger().level))


for _name in COMMAND_MODULES:
    for _cmd in importlib.import_module(_name).commands:
        cli.add_command(_cmd)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="draudit")
