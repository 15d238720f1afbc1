"""``draudit attribute`` (transactions → physical GPUs) and ``draudit trace TX_ID...``."""

from __future__ import annotations

import math
import sys

import click

from collector.cli.options import database_option, echo_json, open_store, output_option, settings_from
from collector.errors import UserError


def _serving_containers(values: tuple[str, ...]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for value in values:
        key, sep, container = value.partition("=")
        if not sep:
            raise UserError(f"--serving-container {value!r}: use NAMESPACE/WORKLOAD=CONTAINER, "
                            "e.g. payments/risk-api=triton-sidecar")
        pins[key.strip()] = container.strip()
    return pins


def _seconds_in_range(maximum: str):
    """A click callback: the flag's value as given, or a one-line error naming the flag and the
    allowed range, 0 to ``collector.lineage.<maximum>`` (``inf`` and ``1e10`` were an OverflowError
    traceback from the attribution run; imported when called: the CLI loads collector.lineage lazily)."""
    def check(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
        import collector.lineage

        maximum_s = getattr(collector.lineage, maximum)
        if value is not None and not (math.isfinite(value) and 0 <= value <= maximum_s):
            raise UserError(f"{param.opts[0]} must be a non-negative number of seconds, at most {maximum_s:.0f} "
                            f"(got {value:g})")
        return value
    return check


def _skew_option(fn):
    return click.option("--clock-skew-s", "clock_skew_s", type=float, default=None, metavar="S",
                        callback=_seconds_in_range("MAX_CLOCK_SKEW_S"),
                        help="Tolerance in seconds around pod/claim/device transitions; a transaction "
                             "closer than this to one is 'ambiguous' (env DRAUDIT_CLOCK_SKEW_S, default 2).")(fn)


def _serving_option(fn):
    return click.option("--serving-container", "serving", multiple=True, metavar="NS/WORKLOAD=CONTAINER",
                        help="When the logging container holds no claim, count only this container's claims "
                             "for pods of WORKLOAD (a pod name or its prefix before '-'). Repeatable.")(fn)


@click.command("attribute")
@click.option("--all", "all_", is_flag=True, help="Recompute every transaction (after a history correction), "
                                                  "not only those without a lineage row.")
@click.option("--settle-s", "settle_s", type=float, default=600.0, show_default=True, metavar="S",
              callback=_seconds_in_range("MAX_SETTLE_S"),
              help="Re-evaluate unattributed/ambiguous transactions whose time is within S seconds of the "
                   "newest history the watcher has recorded (it may still arrive late), each with the settings "
                   "(clock-skew tolerance) it was attributed with; rewrite those that change. --all changes "
                   "the tolerance of stored rows.")
@_skew_option
@_serving_option
@database_option
@output_option
def attribute_cmd(all_: bool, settle_s: float, clock_skew_s: float | None, serving: tuple[str, ...],
                  database_url: str | None, output: str) -> None:
    """Attribute inference transactions to the physical GPU that served them; print counts by status.

    Concurrent runs (the scheduler, another CLI) wait for each other.
    """
    from collector.lineage import PENDING_FUTURE, PENDING_HISTORY, attribute_run, known_clusters, pending_counts

    settings = settings_from(database_url=database_url, clock_skew_s=clock_skew_s)
    _engine, sessions = open_store(settings)
    with sessions.begin() as session:
        summary = attribute_run(session, all=all_, clock_skew_s=settings.clock_skew_s,
                                serving_containers=_serving_containers(serving), cluster=settings.cluster,
                                settle_s=settle_s)
        clusters = known_clusters(session)
        pending = pending_counts(session, settings.clock_skew_s, settings.cluster, now=summary.run_at)
    if output == "json":
        # "pending": records left without lineage by this run, by pending reason (as `trace` names them)
        echo_json({**summary.as_json(), "pending": pending})
        return
    # new transactions and re-evaluated ones whose verdict changed are counted apart in the header
    changed = f"; {summary.revised} re-evaluated transaction(s) changed verdict" if summary.revised else ""
    click.echo(f"attributed {summary.new} transaction(s)" + (" (all recomputed)" if all_ else "") + changed)
    ambiguous_reasons = {"skew-window", "several-devices", "several-pods"}
    for status, n in summary.by_status.items():
        revised = summary.revised_by_status.get(status, 0)
        click.echo(f"  {status:<14}{n:>10}" + (f"  ({revised} of them re-evaluated, changed)" if revised else ""))
        # each reason under its own status: ambiguous ones under ambiguous, the rest under unattributed
        for reason, m in sorted(summary.by_reason.items()):
            if (reason in ambiguous_reasons) == (status == "ambiguous") and status != "exact":
                click.echo(f"    {reason:<20}{m:>6}")
    if summary.by_reason.get("unknown-cluster"):
        click.echo(f"hint: {summary.by_reason['unknown-cluster']} transaction(s) name a cluster the watcher never "
                   f"recorded (records without one count as {settings.cluster!r}); the store knows: "
                   f"{', '.join(clusters) or 'no cluster (run `draudit watch` first)'}. A record's cluster "
                   "must be the watcher's: ingest them again with `draudit ingest --cluster NAME` (or "
                   "DRAUDIT_CLUSTER); those copies are stored beside these, no conflict, and these stay (the "
                   "store is append-only): render packs with --cluster NAME to leave them out.")
    if pending[PENDING_HISTORY]:
        click.echo(f"pending: {pending[PENDING_HISTORY]} transaction(s) later than, or within {settings.clock_skew_s:g} s "
                   "of, what the live watcher has recorded so far wait for its history (a run once it has "
                   "caught up attributes them: `draudit run` runs one every minute)")
    if pending[PENDING_FUTURE]:
        click.echo(f"pending: {pending[PENDING_FUTURE]} transaction(s) have an event time in the future of the observed "
                   f"history (later than now + {settings.clock_skew_s:g} s): check the node's or the application's "
                   "clock; they are attributed once the watcher's history reaches them")
    if summary.revisited:
        # recent ones (the settle window) and unknown-cluster ones of a cluster watched since
        click.echo(f"re-evaluated {summary.revisited} unattributed/ambiguous transaction(s) whose history may have "
                   f"changed (settle window {settle_s:g} s, or a cluster first watched since), each with the "
                   f"clock-skew tolerance it was attributed with: {summary.revised} changed (counted above)")


# What trace says of a record an attribution run leaves pending (collector.lineage.PENDING_*).
_PENDING_NOTES = {
    "awaiting-history": "within the clock-skew tolerance of what the live watcher has recorded so far: "
                        "attributed by the first `draudit attribute` after its history passes this time",
    "future-event-time": "event time is in the future of the observed history (later than now + the clock-skew "
                         "tolerance): check the node's or the application's clock; attributed once the watcher's "
                         "history reaches it",
}


def _print_trace(doc: dict) -> None:
    pod, claim, device = doc["pod"], doc["claim"], doc["device"]
    status = doc["status"] + (f" ({doc['reason']})" if doc["reason"] else "")
    if doc.get("conflict"):
        status += "  [conflict: this id was stored before with different content]"
    lines = [
        ("transaction", doc["transaction_id"]),
        ("record", doc["record_id"]),
        ("cluster", doc["cluster"]),
        ("time", doc["time"]),
        ("container", doc["container"]),
        ("decision", doc["decision"]),
        ("status", status),
        ("candidates", doc["candidates"]),
        ("pod", f"{pod['namespace']}/{pod['name']} uid={pod['uid'] or '-'} node={pod['node'] or '-'}"
         if pod["uid"] or pod["name"] else None),
        ("claim", f"{claim['namespace']}/{claim['name']} uid={claim['uid']} request={claim['request']}" if claim["uid"] else None),
        ("device", f"{device['driver']}/{device['pool']}/{device['device']}" if device["device"] else None),
        ("device uuid", doc["device_uuid"]),
        ("physical GPU", doc["physical_gpu_uuid"]),
        ("product", doc["product"]),
        ("MIG profile", doc["mig_profile"]),
    ]
    for label, value in lines:
        click.echo(f"{label:<13} {value if value is not None else '-'}")
    if doc["reason"] in _PENDING_NOTES:
        click.echo(f"{'note':<13} {_PENDING_NOTES[doc['reason']]}")
    if doc["status"] == "not-found":
        click.echo(f"{'note':<13} no record of this transaction id is stored: check the id (a masked one, "
                   "411111******1111, is found too), or ingest its logs first")
    if doc.get("attribution") == "computed":
        click.echo(f"{'note':<13} computed now, not stored yet: no attribution run has attributed this record "
                   "(`draudit attribute`; packs show it as not-attributed-yet until one has)")
    for i, c in enumerate(doc.get("identity_conflict") or []):
        click.echo(f"{'conflict' if i == 0 else '':<13} the record's {c['field']} {c['record']!r}, "
                   f"observed {c['observed']!r} at that time")
    if doc["physical_gpu_uuid"]:
        if doc["co_tenants"]:
            for i, t in enumerate(doc["co_tenants"]):
                click.echo(f"{'co-tenants' if i == 0 else '':<13} {_tenant_line(t)}")
        else:
            click.echo(f"{'co-tenants':<13} none")
    click.echo("")


def _tenant_line(t: dict) -> str:
    """One ``co_tenants`` entry: a pod as ``namespace/pod uid=… claim=…``; another consumer (a
    ``reservedFor`` PodGroup) with its kind, never as a pod; one present only possibly (a transition
    within the clock-skew tolerance of the transaction) marked so."""
    who = (f"{t['namespace']}/{t['pod']} uid={t['pod_uid']}" if t["consumer"] == "pod" else
           f"{t['namespace']}/{t['name']} ({t['consumer']}, not a pod) uid={t['uid']}")
    maybe = "" if t["certain"] else " (possibly: it started or ended within the clock-skew tolerance)"
    return f"{who} claim={t['claim']}{maybe}"


@click.command("trace")
@click.argument("transaction_ids", nargs=-1, required=True, metavar="TX_ID...")
@_skew_option
@_serving_option
@database_option
@output_option
def trace_cmd(transaction_ids: tuple[str, ...], clock_skew_s: float | None, serving: tuple[str, ...],
              database_url: str | None, output: str) -> None:
    """Show the lineage of transactions: pod, claim, device, physical GPU and its other tenants around then.

    Exits 1 when an id is not found. A transaction not yet attributed is attributed on the fly
    (nothing is written).
    """
    from collector.lineage import trace

    settings = settings_from(database_url=database_url, clock_skew_s=clock_skew_s)
    _engine, sessions = open_store(settings)
    with sessions() as session:
        docs = trace(session, transaction_ids, cluster=settings.cluster, clock_skew_s=settings.clock_skew_s,
                     serving_containers=_serving_containers(serving), pan_token_key=settings.resolved_pan_token_key())
    if output == "json":
        echo_json(docs)
    else:
        for doc in docs:
            _print_trace(doc)
    sys.exit(1 if any(d["status"] == "not-found" for d in docs) else 0)


commands = [attribute_cmd, trace_cmd]
