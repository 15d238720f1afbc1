"""``draudit quarantine``: the lines ingestion refused, with reason, source and position, to fix the input."""

from __future__ import annotations

import click

from collector.cli.options import database_option, echo_json, open_store, output_option, settings_from

_TEXT_CHARS = 160  # of the raw text shown per line in the table (JSON carries it whole)


@click.command("quarantine")
@click.option("--reason", default=None, metavar="REASON",
              help="Only this reason (its slug, e.g. missing-transaction-id, or the start of the full text).")
@click.option("--source", default=None, metavar="SOURCE", help="Only lines of this source (a path, stdin, or http:body-<digest> for an HTTP request body: the source in its answer; --run takes its request id).")
@click.option("--run", "run_id", default=None, metavar="RUN_ID", help="Only lines of this ingest run (its id: the run_id column of --output json, or the run line draudit ingest prints).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1), help="Newest lines shown at most.")
@database_option
@output_option
def quarantine_cmd(reason: str | None, source: str | None, run_id: str | None, limit: int,
                   database_url: str | None, output: str) -> None:
    """List the newest quarantined input lines (in the order they were read): when, source and position (file line number or
    request id), the reason, and the raw text as stored (card numbers already masked).

    A line quarantined again by a later run (same source, position and content) is stored once,
    under the run that first quarantined it.
    """
    from sqlalchemy import func, select

    from collector.cli.ingest import _source
    from collector.ingest.writer import quarantine_reason_slugs
    from collector.store.models import Quarantine

    settings = settings_from(database_url=database_url)
    _engine, sessions = open_store(settings)
    q = select(Quarantine).order_by(Quarantine.id.desc())
    counted = select(func.count()).select_from(Quarantine)
    filters = []
    if reason:
        filters.append(Quarantine.reason.startswith(reason, autoescape=True))
    if source:
        # also a file named as `draudit ingest` was given it (relative to here): the source it recorded
        filters.append(Quarantine.source.in_(sorted({source, _source(source)})))
    if run_id:
        filters.append(Quarantine.run_id == run_id)
    for f in filters:
        q, counted = q.where(f), counted.where(f)
    with sessions() as session:
        total = session.execute(counted).scalar_one()
        rows = session.execute(q.limit(limit)).scalars().all()[::-1]  # the newest, in the order they came
        docs = [{"id": r.id, "received_at": r.received_at.isoformat().replace("+00:00", "Z"), "run_id": r.run_id,
                 "source": r.source, "position": r.position, "reason": r.reason, "raw_sha256": r.raw_sha256,
                 "raw_text": r.raw_text} for r in rows]
        # the reasons of the lines the other filters select (a --source or --run that matches nothing lists none)
        stored_reasons = quarantine_reason_slugs(session, *filters[1:]) if reason and not total else None
        near = _sources_like(session, source) if source and not total else None
    if stored_reasons is not None:  # a reason that matches nothing: a typo, or a slug of another release
        scope = " selected by --source/--run" if len(filters) > 1 else ""
        click.echo(f"draudit: no quarantined line{scope} has a reason starting {reason!r}; their reasons: "
                   + (", ".join(f"{slug} ({n})" for slug, n in stored_reasons)
                      or "none (--source/--run match no line)"), err=True)
    if near:  # a source that matches nothing: a file name without its directory, a path from elsewhere
        click.echo(f"draudit: no quarantined line has source {source!r}; sources of that name: "
                   + ", ".join(near) + " (give one of them to --source)", err=True)
    if output == "json":
        echo_json({"total": total, "shown": len(docs), "lines": docs})
        return
    if not docs:
        click.echo("no quarantined line matches" if filters else "nothing is quarantined")
        return
    for d in docs:
        where = f"{d['source']}:{d['position']}" if d["position"] else d["source"]
        text = d["raw_text"] if len(d["raw_text"]) <= _TEXT_CHARS else d["raw_text"][:_TEXT_CHARS] + "…"
        click.echo(f"{d['received_at']}  {where}\n  reason: {d['reason']}\n  line:   {text!r}")
    if total > len(docs):
        click.echo(f"({len(docs)} of {total} shown, the newest; --limit shows more, --output json gives whole lines)")


def _sources_like(session, given: str, most: int = 5) -> list[str]:
    """Up to ``most`` stored sources whose last path component is that of ``given``, sorted."""
    import posixpath

    from sqlalchemy import select

    from collector.store.models import Quarantine

    name = posixpath.basename(given.rstrip("/")) or given
    q = (select(Quarantine.source).where(Quarantine.source.endswith("/" + name, autoescape=True) | (Quarantine.source == name))
         .distinct().order_by(Quarantine.source).limit(most))
    return list(session.execute(q).scalars())


commands = [quarantine_cmd]
