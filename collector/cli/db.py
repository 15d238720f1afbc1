"""``draudit db upgrade|current|downgrade`` and ``draudit ledger verify``."""

from __future__ import annotations

import sys

import click

from collector.cli.options import (database_option, echo_json, open_store, output_option, require_existing_sqlite_file,
                                   settings_from)
from collector.store import migrate
from collector.store.db import make_engine, shown_url


@click.group("db")
def db_group() -> None:
    """Create and migrate the store's schema (Alembic)."""


@db_group.command("upgrade")
@click.argument("revision", default="head")
@database_option
def db_upgrade(revision: str, database_url: str | None) -> None:
    """Upgrade the schema to REVISION (default: head)."""
    settings = settings_from(database_url=database_url)
    engine = make_engine(settings.database_url)
    migrate.upgrade(engine, revision)
    click.echo(f"database {shown_url(engine.url)} at revision {migrate.current_revision(engine)}")


@db_group.command("downgrade")
@click.argument("revision")
@database_option
@click.option("--yes", is_flag=True, help="Confirm: a downgrade drops tables, and with them recorded evidence.")
def db_downgrade(revision: str, database_url: str | None, yes: bool) -> None:
    """Downgrade the schema to REVISION (``base`` drops every draudit table and all evidence in them)."""
    from collector.errors import UserError

    settings = settings_from(database_url=database_url)
    engine = make_engine(settings.database_url)
    entries = migrate.ledger_entries(engine)
    if entries and not yes:
        raise UserError(f"database {shown_url(engine.url)} holds {entries} ledger entries of evidence; "
                        f"a downgrade to {revision} may delete them — export a pack first, then repeat with --yes")
    migrate.downgrade(engine, revision)
    click.echo(f"database {shown_url(engine.url)} at revision {migrate.current_revision(engine) or 'base'}")


@db_group.command("current")
@database_option
def db_current(database_url: str | None) -> None:
    """Print the schema revision of the database and of this draudit version."""
    settings = settings_from(database_url=database_url)
    require_existing_sqlite_file(settings.database_url)  # connecting would create an empty file
    engine = make_engine(settings.database_url)
    current = migrate.current_revision(engine)
    head = migrate.head_revision()
    state = "up to date" if current == head else ("not migrated" if current is None else "needs `draudit db upgrade`")
    click.echo(f"current: {current or 'base'}\nhead:    {head}\n{state}")
    sys.exit(0 if current == head else 1)


@click.group("ledger")
def ledger_group() -> None:
    """The tamper-evident hash chain over stored evidence."""


@ledger_group.command("verify")
@database_option
@output_option
@click.option("--projections/--no-projections", default=True, show_default=True,
              help="Also rebuild the derived tables (pods, claims, episodes, devices) from the ledgered object "
                   "versions and compare (read-only; the rebuild is rolled back).")
@click.option("--lineage/--no-lineage", default=True, show_default=True,
              help="Also re-run attribution for every lineage row with the settings it was computed with and "
                   "compare (read-only; rolled back).")
def ledger_verify(database_url: str | None, output: str, projections: bool, lineage: bool) -> None:
    """Recompute the hash chain and every covered row; exit 1 naming the first broken entry.

    The derived tables that attribution and policies read are checked against what the ledgered
    object versions produce, and the lineage rows against what attribution recomputes from the
    ledgered records and versions, so an edit there shows too.
    """
    from collector.kube.projection_audit import audit_projections
    from collector.lineage import verify_lineage
    from collector.store.ledger import verify

    settings = settings_from(database_url=database_url)
    _engine, sessions = open_store(settings)
    with sessions() as session:
        result = verify(session)
    diffs = []
    if projections:
        with sessions() as session:
            diffs = audit_projections(session)
    audit = None
    if lineage:
        with sessions() as session:
            audit = verify_lineage(session)
    ok = result.ok and not diffs and (audit is None or audit.ok)
    if output == "json":
        brk = result.first_break
        echo_json({"ok": ok, "entries": result.entries, "head_seq": result.head.seq,
                   "head_hash": result.head.entry_hash,
                   "first_break": None if brk is None else {"seq": brk.seq, "table": brk.table_name,
                                                            "key": brk.row_key, "problem": brk.problem},
                   "projections_checked": projections,
                   "projection_differences": [{"table": d.table, "problem": d.problem, "description": d.describe(),
                                               "row": repr(d.row)} for d in diffs],
                   "lineage_checked": None if audit is None else audit.checked,
                   "lineage_differing": None if audit is None else audit.differing,
                   "lineage_first_difference": None if audit is None or audit.first is None else {
                       "record_id": audit.first.record_id, "transaction_id": audit.first.transaction_id,
                       "column": audit.first.column, "stored": audit.first.stored,
                       "recomputed": audit.first.recomputed}})
        sys.exit(0 if ok else 1)
    if result.ok:
        click.echo(f"ledger intact: {result.entries} entries, head {result.head.seq} {result.head.entry_hash}")
    else:
        click.echo(f"ledger BROKEN after {result.entries} good entries: {result.first_break.describe()}")
    if projections:
        if diffs:
            click.echo(f"projections DIFFER from what the ledgered object versions produce ({len(diffs)} shown):")
            for d in diffs:
                click.echo(f"  {d.describe()}")
        else:
            click.echo("projections: exactly what the ledgered object versions produce")
    if audit is not None:
        if audit.ok:
            click.echo(f"lineage: {audit.checked} rows checked, exactly what attribution recomputes")
        else:
            click.echo(f"lineage DIFFERS from what attribution recomputes: {audit.differing} of {audit.checked} "
                       f"rows; first: {audit.first.describe()}")
    sys.exit(0 if ok else 1)


commands = [db_group, ledger_group]
