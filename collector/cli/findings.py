"""``draudit findings``: the stored policy findings, one per incident as evidence packs list them.

Source: the ``findings`` rows stored by ``draudit policy eval`` and by ``draudit run``'s scheduler
(``collector.policy.findings``), read and merged by ``reports.finding_scope.scoped_findings`` — the
function packs use — so one incident stated by several evaluation windows, or found by several
bundle revisions, is one row here as in a pack (``_incidents``, ``finding_identity``). A listing:
exit status 0 whether or not findings exist; 2 for an input the user can fix.

Two statements the stored interval alone would get wrong:

* An end the evaluation did not see. The policies clip an interval still going on (an allocation
  not released) to what the evaluation could see: its period's end, or when it ran if earlier. A
  finding whose end is there was still going on as far as its evaluation saw: listed as open
  (``to`` null) with ``seen_until``, not as if it ended then (``collector.policy.findings.seen_until_ns``,
  as packs show it).
* A window evaluated in part. With ``--from`` and ``--to``, the share of the window the policy
  evaluations covered is computed as packs compute it (``reports.policy_coverage``: evaluations cut
  at when they ran, the least evaluated cluster) and, when below 100 %, a note on stderr names the
  stretches not evaluated (``_coverage_note``): findings, or their absence, say nothing about them.
"""

from __future__ import annotations

from typing import Any

import click

from collector.cli.options import database_option, echo_json, open_store, output_option, settings_from
from collector.errors import UserError
from collector.timeutil import dt_to_ns, ns_to_rfc3339, parse_cli_time

# collector.policy.findings.SEVERITIES, not imported: it would load the policy stage at every
# command's start-up for a --help text (a test holds the two equal)
SEVERITIES = ("critical", "high", "medium", "low", "info")
# Bounds of an unbounded listing (no --from / --to): the signed 64-bit range of the ns columns.
_MIN_NS, _MAX_NS = -(2 ** 63), 2 ** 63 - 1
_SUBJECT_ITEMS = 4  # values of one subject list shown in the table before "+N more" (JSON: all)
JSON_KEYS = ("rule", "severity", "kind", "cluster", "subjects", "physical_gpu_uuid", "from", "to", "seen_until",
             "whole_period", "message", "bundle_revision", "bundle_digest", "last_evaluated_at", "finding_key")

_HELP = """List the stored policy findings whose interval (or evaluation period, for a finding that has
no interval of its own; an interval still open counts until its evaluation period's end) overlaps
[--from, --to), newest first (by start, then end: open ends first),
one row per incident as evidence packs show it: the same incident stated by several evaluation
windows or bundle revisions is one row over its whole interval, with the text of the evaluation
stating its latest end.

\b
--output json prints one JSON array; each object has exactly these keys:
  rule               rule id, e.g. isolation/cross-tenant-sharing
  severity           critical | high | medium | low | info
  kind               violation | warning | observation
  cluster            the evaluated cluster; null: evaluated over all clusters
  subjects           the finding's subjects as the bundle states them (object)
  physical_gpu_uuid  GPU the finding is about, or null
  from, to           RFC 3339 UTC; to null: still going on as far as the evaluation
                     stating it could see (the policies cut such an interval at the
                     end of the evaluation period, or when it ran if earlier)
  seen_until         when to is null: RFC 3339 UTC up to which that evaluation saw it
                     (its period's end, or when it ran if earlier); else null.
                     The table shows such an end as "open (seen until T)".
  whole_period       true when the finding has no interval of its own:
                     from/to are then its evaluation period
  message            the finding's text
  bundle_revision    bundle revision(s) that found it, oldest first, joined by "; "
  bundle_digest      their SHA-256 digests, same order and separator
  last_evaluated_at  RFC 3339 UTC of the latest evaluation that stated it
  finding_key        key of the stored finding row shown (in the ledger)

Exit status: 0 whether or not findings exist (a listing); 2 for a bad input (one line on stderr).
A --cluster never recorded in the store, or never covered by an evaluation, is warned about on
stderr: 0 findings there says nothing about it. With both --from and --to, a window the policy
evaluations covered only in part (as packs count it: each evaluation up to when it ran; the
--cluster, else each cluster observed or evaluated in the window, the least evaluated named) gets
a note on stderr naming its share and the stretches not evaluated: findings, or their absence,
say nothing about those. An unbounded listing has no window to cover: no note."""


def _time(value: str | None, flag: str) -> int | None:
    """``--from``/``--to`` text → UTC ns (``parse_cli_time``: RFC 3339 with a zone, or a date), None when absent.

    Raises:
        UserError: naming the flag and the accepted forms.
    """
    if value is None:
        return None
    try:
        return dt_to_ns(parse_cli_time(value))
    except ValueError as exc:
        raise UserError(f"{flag} {exc}") from None


def _severity(value: str | None) -> str | None:
    """``--severity`` checked here rather than by ``click.Choice``: a bad value is one line naming the allowed ones."""
    if value is None:
        return None
    if value.strip().lower() not in SEVERITIES:
        raise UserError(f"--severity {value!r} is not one of {', '.join(SEVERITIES)}")
    return value.strip().lower()


@click.command("findings", help=_HELP)
@click.option("--from", "from_", default=None, metavar="TIME",
              help="Period start, inclusive: RFC 3339 with zone or YYYY-MM-DD (00:00 UTC); default: no bound.")
@click.option("--to", "to", default=None, metavar="TIME", help="Period end, exclusive; default: no bound.")
@click.option("--cluster", default=None, metavar="NAME",
              help="Only this cluster (findings evaluated over all clusters count when their subjects or evidence "
                   "name it, as in packs).")
@click.option("--rule", default=None, metavar="RULE", help="Only this rule (exact id, e.g. isolation/cross-tenant-sharing).")
@click.option("--severity", default=None, metavar="SEVERITY", help="Only this severity: " + ", ".join(SEVERITIES) + ".")
@click.option("--limit", default=None, type=click.IntRange(min=1), help="Newest findings shown at most (default: all).")
@database_option
@output_option
def findings_cmd(from_: str | None, to: str | None, cluster: str | None, rule: str | None, severity: str | None,
                 limit: int | None, database_url: str | None, output: str) -> None:
    from reports.finding_scope import scoped_evaluations, scoped_findings
    from reports.populations import Scope

    start, end = _time(from_, "--from"), _time(to, "--to")
    if start is not None and end is not None and end <= start:
        raise UserError(f"--from {ns_to_rfc3339(start)} is not before --to {ns_to_rfc3339(end)}")
    severity = _severity(severity)
    settings = settings_from(database_url=database_url)
    _engine, sessions = open_store(settings)
    scope = Scope(_MIN_NS if start is None else start, _MAX_NS if end is None else end, (cluster,) if cluster else ())
    with sessions() as session:
        cluster_warnings, rule_warnings = _warnings(session, cluster, rule)
        for warning in cluster_warnings + rule_warnings:
            click.echo(warning, err=True)
        incidents = scoped_findings(session, scope).findings
        docs = [_doc(f) for f in incidents if (rule is None or f["rule"] == rule)
                and (severity is None or f["severity"] == severity)]
        evaluated = bool(scoped_evaluations(session, scope)) if not docs else True
        # a cluster warning already says that no evaluation covered it
        note = (_coverage_note(session, scope)
                if start is not None and end is not None and not cluster_warnings else None)
    if note:
        click.echo(note, err=True)
    docs.sort(key=_newest_first)
    total = len(docs)
    shown = docs[:limit] if limit else docs
    if output == "json":
        echo_json([{k: d[k] for k in JSON_KEYS} for d in shown])
        return
    if not shown:
        filtered = any(v is not None for v in (from_, to, cluster, rule, severity))
        click.echo("no finding matches" if filtered else "no finding is stored")
        if not evaluated and not cluster_warnings:  # a cluster warning already says why
            click.echo("(no policy evaluation covers this period" + (f" for cluster {cluster}" if cluster else "")
                       + ": run `draudit policy eval`)")
        return
    for d in shown:
        click.echo(_table_entry(d))
    click.echo(f"({len(shown)} of {total} shown, the newest; --limit shows more)" if total > len(shown)
               else f"{total} finding{'s' if total != 1 else ''}")


def _warnings(session, cluster: str | None, rule: str | None) -> tuple[list[str], list[str]]:
    """Lines for stderr when a filter names something that makes "0 findings" say nothing: a
    ``--cluster`` the store never recorded (the line ``draudit policy eval`` prints,
    ``reports.scope_names.NeverRecorded.warning``) or that no evaluation covered (one of that
    cluster, or of all clusters), a ``--rule`` no stored finding has: ``(cluster lines, rule lines)``."""
    from sqlalchemy import exists, or_, select

    from collector.store.models import Finding, PolicyEvaluation
    from reports.scope_names import never_recorded

    out, rules = [], []
    if cluster:
        unknown = never_recorded(session, (cluster,), ())
        if unknown:
            out.append(unknown.warning("no evaluation can have covered it: 0 findings says nothing about it"))
        elif not session.execute(select(exists().where(or_(PolicyEvaluation.cluster == cluster,
                                                             PolicyEvaluation.cluster.is_(None))))).scalar():
            out.append(f"warning: no policy evaluation ever covered cluster {cluster} (`draudit policy eval --cluster "
                       f"{cluster}` evaluates it): 0 findings says nothing about it")
    if rule and not session.execute(select(exists().where(Finding.rule == rule))).scalar():
        known = session.execute(select(Finding.rule).distinct().order_by(Finding.rule)).scalars().all()
        rules.append(f"warning: no stored finding has rule {rule} (rules stored: {', '.join(known) or 'none'})")
    return out, rules


def _coverage_note(session, scope) -> str | None:
    """The stderr note when policy evaluations covered less than the whole window, else None.

    Computed as a pack computes its policy coverage (``reports.policy_coverage.scope_rows``): the
    evaluations in scope (``scoped_evaluations``) and
    those the findings rows name (``finding_evaluations``), each covering its period up to when it
    ran (``spans``), per cluster: the ``--cluster``, else the clusters observed in the window
    (``reports.populations.coverage``) and those the evaluations name; the least evaluated deciding
    row (``lowest``) is named, as ``draudit report`` names it. None when no cluster is in question
    and no evaluation overlaps (nothing observed, nothing evaluated: nothing to note)."""
    from reports import policy_coverage as polcov
    from reports import populations as pop
    from reports.controls import share_text, stretches_text
    from reports.finding_scope import scoped_evaluations

    observed = (k["cluster"] for k in pop.coverage_summary(pop.coverage(session, scope), scope))
    low = polcov.lowest(polcov.scope_rows(session, scope, scoped_evaluations(session, scope), observed))
    if low is None or low.share >= 1:
        return None
    stretches = stretches_text(low.not_evaluated, low.more)
    others = f" (the least evaluated of {low.partial} clusters not wholly evaluated)" if low.partial > 1 else ""
    return (f"note: policy evaluations cover {share_text(low.share)} of the window for {low.where()}{others}; "
            f"not evaluated: {stretches} — findings, or their absence, say nothing about those stretches")


def _doc(f: dict[str, Any]) -> dict[str, Any]:
    """A pack finding (``reports.finding_scope.scoped_findings``) → this command's row (``JSON_KEYS``,
    plus ``from_ns``/``to_ns`` ints for ordering). A finding without an interval (``whole_period``)
    takes the period of the evaluation shown as from/to; one still going on when evaluated is open
    (``to`` null) with ``seen_until`` (``collector.policy.findings.seen_until_ns``). ``last_evaluated_at``: the
    latest of the evaluations of every bundle that found it (``bundles[*].evaluated_at``,
    ``%Y-%m-%dT%H:%M:%S.%fZ``)."""
    whole = f["from_ns"] is None
    from_ns, to_ns = (f["period_from_ns"], f["period_to_ns"]) if whole else (f["from_ns"], f["to_ns"])
    return {"rule": f["rule"], "severity": f["severity"], "kind": f["kind"], "cluster": f["cluster"],
            "subjects": f["subjects"], "physical_gpu_uuid": f["physical_gpu_uuid"], "from": ns_to_rfc3339(from_ns),
            "to": ns_to_rfc3339(to_ns), "seen_until": f["seen_until"], "whole_period": whole, "message": f["message"],
            "bundle_revision": f["bundle_revision"], "bundle_digest": f["bundle_digest"],
            "last_evaluated_at": max([b["evaluated_at"] for b in f["bundles"]] or [f["evaluated_at"]]),
            "finding_key": f["finding_key"], "from_ns": from_ns, "to_ns": to_ns}


def _newest_first(d: dict[str, Any]) -> tuple:
    """Sort key: later start first, then later end (an open end, None, latest), then severity, rule, key."""
    end = _MAX_NS if d["to_ns"] is None else d["to_ns"]
    return (-d["from_ns"], -end, SEVERITIES.index(d["severity"]) if d["severity"] in SEVERITIES else 9, d["rule"],
            d["finding_key"])


def _compact(subjects: Any) -> str:
    """Subjects on one line: ``key=v1,v2; key=v`` (lists cut after ``_SUBJECT_ITEMS`` values, ``+N more``)."""
    import json

    if not isinstance(subjects, dict):
        return json.dumps(subjects, separators=(",", ":"))
    parts = []
    for key, value in subjects.items():
        if isinstance(value, list):
            shown = [v if isinstance(v, str) else json.dumps(v, separators=(",", ":")) for v in value[:_SUBJECT_ITEMS]]
            more = f",+{len(value) - _SUBJECT_ITEMS} more" if len(value) > _SUBJECT_ITEMS else ""
            parts.append(f"{key}={','.join(shown)}{more}")
        else:
            parts.append(f"{key}={value if isinstance(value, str) else json.dumps(value, separators=(',', ':'))}")
    return "; ".join(parts)


def _table_entry(d: dict[str, Any]) -> str:
    """Three or four lines for one finding: interval, severity, rule, cluster; subjects; message; bundle."""
    end = d["to"] or f"open (seen until {d['seen_until']})"
    interval = f"{d['from']} .. {end}" + (" (evaluation period)" if d["whole_period"] else "")
    gpu = f"\n  gpu:      {d['physical_gpu_uuid']}" if d["physical_gpu_uuid"] else ""
    from reports.finding_scope import BUNDLE_SEPARATOR

    digests = BUNDLE_SEPARATOR.join(x[:12] for x in d["bundle_digest"].split(BUNDLE_SEPARATOR))
    return (f"{interval}  {d['severity'].upper()} {d['kind']}  {d['rule']}  cluster {d['cluster'] or '(all)'}\n"
            f"  subjects: {_compact(d['subjects'])}{gpu}\n  message:  {d['message']}\n"
            f"  bundle:   {d['bundle_revision']} sha256:{digests}, last evaluated {d['last_evaluated_at']}")


commands = [findings_cmd]
