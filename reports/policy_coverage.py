"""Policy evaluation coverage of a pack's period: which stretches of ``[from, to)`` the stored policy
evaluations covered, per cluster in scope and per policy bundle, and which none did.

Why: a pack used to call a bundle "evaluated over the period" when any evaluation overlapped it. An
evaluation of two days of a month, or scheduled windows with a hole, then read as a check of the
whole month, and "no findings" as clean for stretches nobody evaluated. The pack states instead,
as it does for observation coverage (section 2, "partially evidenced"), what share of the period
was evaluated and the stretches that were not ("partially evaluated").

Sources (times in integer UTC nanoseconds):

* ``policy_evaluations`` rows (``collector.policy.findings.record_evaluation``), as
  ``reports.finding_scope.scoped_evaluations`` reads them (those of a cluster in scope or of every
  cluster, overlapping the period);
* the evaluation period each ``findings`` row carries (``finding_evaluations``): evaluations stored
  before ``policy_evaluations`` existed (migration 0003) are known only through their findings.
  An evaluation present in both is counted once (same cluster, bundle, period and ``evaluated_at``).

Rules (``RULE``, stated in the pack):

* An evaluation covers ``[period_from_ns, min(period_to_ns, evaluated_at))``: it cannot have decided
  on what happened after it ran (the scheduler evaluates the running UTC day: its stored period is
  the whole day, its facts end when it ran). Clipped to the pack period.
* Times are compared in whole microseconds: a pack's period and ``evaluated_at`` are timestamps of
  that precision, while an evaluation's period may be stamped in nanoseconds (the demo evaluates
  from the watcher's first sync). Its start is rounded down and its end up to the microsecond, so
  less than a microsecond at an edge is not reported as a stretch nobody evaluated.
* An evaluation stored with a cluster covers that cluster; one stored without (``draudit policy
  eval`` without ``--cluster``) covers every cluster.
* Per cluster in scope (the pack's clusters; without a cluster scope, the clusters observed in the
  period and those the evaluations name): one *overall* row (any bundle: the union of every
  evaluation of that cluster) and one row per bundle (revision and digest). A bundle revision
  changed inside the period shows as one row per revision, each covering its own stretches; the
  overall row is their union. The overall rows decide the wording and the control statuses: a
  stretch counts as evaluated when some bundle evaluated it, and the bundle rows say which.
* A row with cluster None states what the evaluations without a cluster covered by themselves
  (they are also counted in every cluster's rows). It decides only when there is no cluster row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from collector.store.models import Finding
from collector.timeutil import dt_to_ns, ns_to_rfc3339
from reports.controls import PolicyCoverage
from reports.populations import Scope

EVALUATED = "evaluated"
PARTIAL = "partially evaluated"
NOT = "not evaluated"
RULE = ("An evaluation covers its period up to when it ran (it cannot have decided on anything later), clipped to "
        "the pack period, in whole microseconds; one stored without a cluster covers every cluster. A stretch is "
        "evaluated when some policy bundle evaluated it; a period is partially evaluated when stretches of it were "
        "not, and findings (or their absence) say nothing about those stretches.")
COLUMNS = ("cluster", "overall", "bundle_revision", "bundle_digest", "status", "evaluated_share", "evaluated_s",
           "not_evaluated_s", "evaluations", "evaluated", "not_evaluated", "evaluated_ns", "not_evaluated_ns")
_US = 1_000  # ns per microsecond: the precision coverage is compared in (module docstring)
SHOWN_STRETCHES = 5  # stretches spelt out in a control's reason (all are in data/policy_coverage.*)


@dataclass(frozen=True)
class Span:
    """What one evaluation run covered: ``[from_ns, to_ns)`` (UTC ns, ``to_ns`` already cut at its
    ``evaluated_at``, not yet clipped to a pack), for ``cluster`` (None: every cluster), by one bundle."""

    cluster: str | None
    bundle_revision: str
    bundle_digest: str
    from_ns: int
    to_ns: int
    evaluated_at_ns: int


def finding_evaluations(session: Session, scope: Scope) -> list[dict[str, Any]]:
    """The evaluation runs the ``findings`` rows name (``cluster``, ``bundle_revision``,
    ``bundle_digest``, ``period_from_ns``, ``period_to_ns``, ``evaluated_at_ns``), one per distinct
    run, overlapping the period, of a cluster in scope or of every cluster. One SELECT DISTINCT."""
    f = Finding
    where = [f.period_from_ns < scope.to_ns, f.period_to_ns > scope.from_ns]
    if scope.clusters:
        where.append(or_(f.cluster.in_(scope.clusters), f.cluster.is_(None)))
    rows = session.execute(select(f.cluster, f.bundle_revision, f.bundle_digest, f.period_from_ns, f.period_to_ns,
                                  f.evaluated_at).where(*where).distinct()).all()
    return [{"cluster": c, "bundle_revision": rev, "bundle_digest": digest, "period_from_ns": lo, "period_to_ns": hi,
             "evaluated_at_ns": dt_to_ns(at)} for c, rev, digest, lo, hi, at in rows]


def span_of(e: dict[str, Any]) -> Span:
    """The ``Span`` of one evaluation run (a dict with the keys of ``finding_evaluations``;
    ``scoped_evaluations`` rows have them too): its period widened to whole microseconds, its end
    cut at ``evaluated_at``. A run that ended before it began (evaluated before the period start)
    covers nothing."""
    start = e["period_from_ns"] // _US * _US
    end = min(-(-e["period_to_ns"] // _US) * _US, e["evaluated_at_ns"])
    return Span(e["cluster"], e["bundle_revision"], e["bundle_digest"], start, end, e["evaluated_at_ns"])


def spans(evaluations: Iterable[dict[str, Any]]) -> list[Span]:
    """``span_of`` each distinct evaluation run among ``evaluations``, sorted."""
    return sorted({span_of(e) for e in evaluations},
                  key=lambda s: (s.cluster or "", s.from_ns, s.to_ns, s.evaluated_at_ns, s.bundle_digest))


def covered_ns(span: Span, scope: Scope) -> int:
    """Nanoseconds of the scope's period that ``span`` decided."""
    return max(0, min(span.to_ns, scope.to_ns) - max(span.from_ns, scope.from_ns))


def scope_rows(session: Session, scope: Scope, evaluations: list[dict[str, Any]],
               observed: Iterable[str]) -> list[dict[str, Any]]:
    """``coverage_rows`` of a scope, as a pack states them (``data/policy_coverage.*``) and
    ``draudit findings`` notes them: from ``evaluations`` (``scoped_evaluations``) and those the
    findings rows name (``finding_evaluations``), per cluster in scope — the scope's clusters, or
    without a cluster scope those ``observed`` in the period and those the evaluations name."""
    known = finding_evaluations(session, scope)
    clusters = scope.clusters or (set(observed) |
                                  {e["cluster"] for e in [*evaluations, *known] if e["cluster"] is not None})
    return coverage_rows(spans([*evaluations, *known]), scope, clusters)


def union_clipped(intervals: Iterable[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The union of half-open ``[start, end)`` intervals (ns) clipped to ``[lo, hi)``, as sorted,
    disjoint, non-touching intervals. Empty intervals are dropped."""
    merged: list[list[int]] = []
    for start, end in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def complement(covered: Sequence[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The stretches of ``[lo, hi)`` outside ``covered`` (sorted, disjoint: ``union_clipped``'s output)."""
    out, cursor = [], lo
    for start, end in covered:
        if start > cursor:
            out.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < hi:
        out.append((cursor, hi))
    return out


def _share(covered_ns: int, period_ns: int) -> float:
    """Evaluated share for the data files: 6 decimals, never rounded to 0 or 1 when partial (the
    status column says partial; a 1.0 beside it would contradict it)."""
    if period_ns <= 0:
        return 0.0
    share = round(covered_ns / period_ns, 6)
    if 0 < covered_ns < period_ns:
        share = min(max(share, 0.000001), 0.999999)
    return share


def _row(cluster: str | None, bundle: tuple[str, str] | None, runs: list[Span], scope: Scope) -> dict[str, Any]:
    """One row of ``data/policy_coverage.*`` (``COLUMNS``): what ``runs`` covered of the period."""
    lo, hi = scope.from_ns, scope.to_ns
    covered = union_clipped(((s.from_ns, s.to_ns) for s in runs), lo, hi)
    missing = complement(covered, lo, hi)
    covered_ns = sum(e - s for s, e in covered)
    status = EVALUATED if covered_ns == hi - lo else (NOT if covered_ns == 0 else PARTIAL)
    return {"cluster": cluster, "overall": bundle is None,
            "bundle_revision": bundle[0] if bundle else None, "bundle_digest": bundle[1] if bundle else None,
            "status": status, "evaluated_share": _share(covered_ns, hi - lo),
            "evaluated_s": round(covered_ns / 1e9, 3), "not_evaluated_s": round((hi - lo - covered_ns) / 1e9, 3),
            "evaluations": sum(1 for s in runs if min(s.to_ns, hi) > max(s.from_ns, lo)),
            "evaluated": [[ns_to_rfc3339(s), ns_to_rfc3339(e)] for s, e in covered],
            "not_evaluated": [[ns_to_rfc3339(s), ns_to_rfc3339(e)] for s, e in missing],
            "evaluated_ns": [[s, e] for s, e in covered], "not_evaluated_ns": [[s, e] for s, e in missing],
            "fraction": covered_ns / (hi - lo) if hi > lo else 0.0}


def _group_rows(cluster: str | None, runs: list[Span], scope: Scope) -> list[dict[str, Any]]:
    """The overall row of ``cluster`` then one row per bundle that covered some of the period, in
    order of the bundle's first evaluation."""
    bundles: dict[tuple[str, str], list[Span]] = {}
    for s in sorted(runs, key=lambda s: (s.evaluated_at_ns, s.bundle_revision, s.bundle_digest)):
        bundles.setdefault((s.bundle_revision, s.bundle_digest), []).append(s)
    per_bundle = [_row(cluster, b, r, scope) for b, r in bundles.items()]
    return [_row(cluster, None, runs, scope)] + [r for r in per_bundle if r["evaluations"]]


def coverage_rows(runs: Sequence[Span], scope: Scope, clusters: Iterable[str]) -> list[dict[str, Any]]:
    """Rows of ``data/policy_coverage.*`` (``COLUMNS``, plus ``fraction``: the unrounded share, for
    wording; not written): per cluster of ``clusters`` (sorted), its overall row then its bundle rows
    (a cluster no evaluation covered has its overall row only, ``not evaluated``); then, when some
    evaluation has no cluster, the rows of those evaluations alone (``cluster`` None). Pure function.
    """
    rows: list[dict[str, Any]] = []
    for cluster in sorted(set(clusters)):
        rows += _group_rows(cluster, [s for s in runs if s.cluster in (cluster, None)], scope)
    agnostic = [s for s in runs if s.cluster is None]
    if agnostic:
        rows += _group_rows(None, agnostic, scope)
    return rows


def deciding(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The overall rows that decide the wording and statuses: the clusters', else the row of the
    evaluations without a cluster (see the module docstring)."""
    overall = [r for r in rows if r["overall"]]
    return [r for r in overall if r["cluster"] is not None] or overall


def any_evaluated(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether some stretch of the period was evaluated in one of the deciding rows."""
    return any(r["fraction"] > 0 for r in deciding(rows))


def lowest(rows: Sequence[dict[str, Any]]) -> PolicyCoverage | None:
    """``reports.controls.PolicyCoverage`` of the least evaluated deciding row (lowest share, then
    cluster name); None when there is no row (no cluster in scope and no evaluation)."""
    decide = deciding(rows)
    if not decide:
        return None
    low = min(decide, key=lambda r: (r["fraction"], r["cluster"] or ""))
    stretches = tuple(tuple(p) for p in low["not_evaluated"])
    return PolicyCoverage(low["fraction"], low["cluster"], stretches[:SHOWN_STRETCHES],
                          max(0, len(stretches) - SHOWN_STRETCHES), sum(1 for r in decide if r["status"] != EVALUATED),
                          any_evaluated(rows))


def manifest_doc(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's ``policy_coverage`` entry: the rule and the overall rows (cluster, status,
    evaluated share, stretches not evaluated as RFC 3339 pairs); per bundle in data/policy_coverage.*."""
    return {"rule": RULE, "clusters": [{k: r[k] for k in ("cluster", "status", "evaluated_share", "evaluations",
                                                          "not_evaluated")} for r in rows if r["overall"]]}
