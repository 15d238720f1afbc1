"""``draudit db upgrade|current|downgrade`` and ``draudit ledger verify``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

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
@click.option("--anchor", "anchors", multiple=True, metavar="SEQ:HASH",
              help="Also check that the ledger still holds entry SEQ with entry_hash HASH (a pack's ledger anchor, "
                   "as `draudit verify` prints it): a tail cut back past it fails. Repeatable.")
@click.option("--pack", "packs", multiple=True, type=click.Path(path_type=Path), metavar="PATH",
              help="Also check the ledger anchor recorded in this pack's manifest (pack directory or .tar.gz). "
                   "Repeatable.")
@click.option("--public-key", "public_key", default=None, metavar="KEY",
              help="Ed25519 public key (PEM): each --pack's manifest signature must verify before its anchor counts.")
def ledger_verify(database_url: str | None, output: str, projections: bool, lineage: bool, anchors: tuple[str, ...],
                  packs: tuple[Path, ...], public_key: str | None) -> None:
    """Recompute the hash chain and every covered row; exit 1 naming the first broken entry.

    The derived tables that attribution and policies read are checked against what the ledgered
    object versions produce, and the lineage rows against what attribution recomputes from the
    ledgered records and versions, so an edit there shows too. The chain alone cannot show a tail
    cut back with its head rewound: --anchor / --pack check it against anchors recorded outside the
    store (a signed pack's manifest records the entry it was rendered at).
    """
    from collector.kube.projection_audit import audit_projections
    from collector.lineage import verify_lineage
    from collector.store.ledger import check_anchor, verify

    wanted = _anchors_to_check(anchors, packs, public_key)  # input problems before the store is read
    settings = settings_from(database_url=database_url)
    _engine, sessions = open_store(settings)
    with sessions() as session:
        result = verify(session)
        anchor_results = [(a, check_anchor(session, a.seq, a.entry_hash) if a.problem is None else None)
                          for a in wanted]
    diffs = []
    if projections:
        with sessions() as session:
            diffs = audit_projections(session)
    audit = None
    if lineage:
        with sessions() as session:
            audit = verify_lineage(session)
    anchors_ok = all(chk is not None and chk.ok for _a, chk in anchor_results)
    ok = result.ok and not diffs and (audit is None or audit.ok) and anchors_ok
    if output == "json":
        brk = result.first_break
        echo_json({"ok": ok, "entries": result.entries, "head_seq": result.head.seq,
                   "head_hash": result.head.entry_hash,
                   "first_break": None if brk is None else {"seq": brk.seq, "table": brk.table_name,
                                                            "key": brk.row_key, "problem": brk.problem},
                   "anchors": [{"seq": a.seq, "entry_hash": a.entry_hash, "source": a.source,
                                "ok": chk is not None and chk.ok,
                                "detail": a.problem if chk is None else chk.detail} for a, chk in anchor_results],
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
    for a, chk in anchor_results:
        if chk is None:
            click.echo(f"anchor {a.seq}:{a.entry_hash} from {a.source}: NOT CHECKED — {a.problem}")
        elif chk.ok:
            click.echo(f"anchor {a.seq}:{a.entry_hash} from {a.source}: present — {chk.detail}")
        else:
            click.echo(f"anchor {a.seq}:{a.entry_hash} from {a.source}: FAILED — {chk.detail}")
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


class _Anchor:
    """An anchor to check: (seq, entry_hash), where it came from, and why it cannot be checked (or None)."""

    __slots__ = ("seq", "entry_hash", "source", "problem")

    def __init__(self, seq: int, entry_hash: str, source: str, problem: str | None = None) -> None:
        self.seq, self.entry_hash, self.source, self.problem = seq, entry_hash, source, problem


_ANCHOR = re.compile(r"(\d+):([0-9a-fA-F]{64})")


def _anchors_to_check(anchors: tuple[str, ...], packs: tuple[Path, ...], public_key: str | None) -> list[_Anchor]:
    """The anchors of ``--anchor SEQ:HASH`` and of each ``--pack``'s manifest (its signature checked
    with ``public_key`` when given: a pack whose signature fails gives an anchor marked not checked,
    which fails the command).

    Raises:
        UserError: a malformed --anchor, an unreadable pack or manifest, a manifest without an
            anchor, or --public-key without --pack.
    """
    from collector.cli.report import read_public_key
    from collector.errors import UserError
    from reports.manifest import check_signature, ledger_anchor, parse_manifest
    from reports.verify import read_manifest

    out: list[_Anchor] = []
    for value in anchors:
        m = _ANCHOR.fullmatch(value.strip())
        if m is None or not m.group(1).isascii() or int(m.group(1)) >= 2**63:  # ledger.seq is a signed 64-bit integer
            raise UserError(f"--anchor {value}: expected SEQ:HASH, the ledger entry number and its 64-hex entry_hash "
                            "(as `draudit verify` prints a pack's ledger anchor)")
        out.append(_Anchor(int(m.group(1)), m.group(2).lower(), "--anchor"))
    if public_key and not packs:
        raise UserError("--public-key checks the signature of each --pack's manifest; give --pack PATH too")
    key = read_public_key(public_key) if public_key else None
    for path in packs:
        data, signature = read_manifest(path)
        manifest, parsed = parse_manifest(data)
        if manifest is None:
            raise UserError(f"--pack {path}: {parsed.detail}")
        anchor = ledger_anchor(manifest)
        if anchor is None:
            raise UserError(f"--pack {path}: its manifest records no ledger anchor (ledger seq and entry_hash)")
        signed = check_signature(manifest, data, signature, key)
        source = f"pack {manifest.get('pack_id')} ({path})"
        if signed.ok is True:
            out.append(_Anchor(*anchor, f"{source}, signature verified"))
        elif signed.ok is None:
            out.append(_Anchor(*anchor, f"{source}, signature NOT checked ({signed.detail})"))
        else:
            out.append(_Anchor(*anchor, source, f"the pack's signature fails ({signed.detail}): its anchor is not "
                                                "evidence; verify the pack with `draudit verify`"))
    return out


commands = [db_group, ledger_group]
