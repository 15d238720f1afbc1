"""Which stored policy findings belong in a pack's scope (clusters, namespaces), and why.

A finding as stored (``collector.policy.findings``) carries a ``cluster`` (NULL when ``draudit
policy eval`` ran without ``--cluster``: one evaluation over every cluster), ``subjects`` as the
bundle names them (``claims`` as ``namespace/name``, ``namespaces``, ``tenants``, ``devices``,
``cluster``, ``kinds``, ``transactions``) and ``evidence`` ids of store rows
(``allocation_results``, ``allocation_episodes``, ``coverage_intervals``, ``inference_records``,
``watch_state`` as ``cluster/kind``). The rules, stated in the pack's methodology (``RULES``):

* **Cluster.** A finding stored with a cluster is in scope when that cluster is. A finding stored
  without one is placed by what it names: ``subjects.cluster`` and the clusters of the rows its
  evidence ids name. It is in scope when one of those clusters is; when it names none (an
  attribution ratio computed over every cluster) it is left out and counted (``excluded``).
* **Namespace.** The namespaces a finding names are those of its claims, its ``namespaces`` and
  any ``*namespace*`` field, and those of the rows its evidence ids name (a transaction's claim
  namespace, else its pod's). It is in scope when one of them is a scoped namespace; a finding
  naming no namespace (an observation gap, an attribution ratio, a device) concerns the whole
  cluster and is kept (counted as ``cluster_wide``).

The same decision evaluated several times is kept once: the evaluation of its identity that states its latest end
(``collector.policy.findings.finding_identity``: rule, cluster, subjects, start; an interval still
open when evaluated ends later in a later evaluation). So is the same decision stated by several
bundle revisions (the demo's bank bundle and the shipped one both find the cross-tenant incident):
one finding, shown with every revision that found it (``bundles``; ``bundle_revision`` and
``bundle_digest`` list them joined by ``BUNDLE_SEPARATOR``, oldest first), its text from the
latest evaluation. Counting it once per bundle made one incident two "high" findings. And so is
one incident stored from several starts by evaluation windows that began inside it (``_incidents``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from collector.policy.findings import finding_identity, seen_until_ns
from collector.store.models import (AllocationEpisode, AllocationResult, CoverageInterval, Finding, InferenceRecord,
                                     PolicyEvaluation,
                                    Lineage)
from collector.timeutil import dt_to_ns, ns_to_rfc3339
from reports import policy_coverage as polcov
from reports.populations import SEVERITY_ORDER, Scope

RULES = ("A finding is in the pack's scope when one of its subjects is: a finding stored with a cluster when that "
         "cluster is in scope; a finding stored without a cluster (evaluated over every cluster) when its subjects or "
         "the store rows it names as evidence belong to a scoped cluster; with a namespace scope, when one of the "
         "namespaces it names (its claims', its namespaces', or those of the transactions and allocations it names "
         "as evidence) is scoped. A finding that names no namespace (an observation gap, an attribution ratio) "
         "concerns the whole cluster and is kept.")
_ID_BATCH = 500
BUNDLE_SEPARATOR = "; "
ANY_BUNDLE = "*"  # the bundle digest a pack's decision key is computed with: any bundle


@dataclass
class ScopedFindings:
    """``findings`` as the pack lists them (dicts, ordered by severity, rule, start, key), with
    counts for the pack's statement: ``cluster_wide`` kept without a namespaced subject;
    ``outside_namespaces`` left out (they name only other namespaces); ``excluded``: rule →
    number of findings stored without a cluster that name none, left out of a cluster-scoped pack."""

    findings: list[dict[str, Any]]
    cluster_wide: int = 0
    outside_namespaces: int = 0
    excluded: dict[str, int] = field(default_factory=dict)

    def statement(self) -> dict[str, Any]:
        """The manifest's ``findings_scope`` entry: the rule and the counts."""
        return {"rule": RULES, "cluster_wide_kept": self.cluster_wide,
                "outside_namespaces_left_out": self.outside_namespaces,
                "without_cluster_left_out": dict(sorted(self.excluded.items()))}


def _claim_namespaces(value: Any) -> set[str]:
    """Namespaces of claim subjects given as ``ns/name`` strings (objects: ``_fields_named_namespace``)."""
    found = set()
    for c in value if isinstance(value, list) else []:
        if isinstance(c, str) and "/" in c:
            found.add(c.split("/", 1)[0])
    return found


def _fields_named_namespace(value: Any, key: str = "") -> set[str]:
    """String values under any key containing ``namespace`` (``{"namespace": ...}`` claim objects,
    ``namespaces`` lists), at any depth."""
    found: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            found |= _fields_named_namespace(v, k)
    elif isinstance(value, list):
        for v in value:
            found |= _fields_named_namespace(v, key)
    elif isinstance(value, str) and "namespace" in key.lower():
        found.add(value)
    return found


def subject_namespaces(subjects: Any) -> set[str]:
    """Namespaces a finding's subjects name (claims ``ns/name``, ``namespaces``, ``*namespace*`` fields)."""
    if not isinstance(subjects, dict):
        return set()
    return _claim_namespaces(subjects.get("claims")) | _fields_named_namespace(subjects)


def _ids(evidence: Any, key: str) -> list[int]:
    value = evidence.get(key) if isinstance(evidence, dict) else None
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)] if isinstance(value, list) else []


def _batched(ids: Iterable[int]) -> Iterable[list[int]]:
    ids = sorted(set(ids))
    for i in range(0, len(ids), _ID_BATCH):
        yield ids[i:i + _ID_BATCH]


class _EvidenceIndex:
    """Cluster and namespace of each store row the findings name as evidence, read in batches."""

    def __init__(self, session: Session, rows: list[Finding]) -> None:
        self.results: dict[int, tuple[str, str]] = {}
        self.episodes: dict[int, tuple[str, str]] = {}
        self.coverage: dict[int, tuple[str, None]] = {}
        self.records: dict[int, tuple[str | None, str | None]] = {}
        e, r, c, i, lin = AllocationEpisode, AllocationResult, CoverageInterval, InferenceRecord, Lineage
        wanted = {k: [x for row in rows for x in _ids(row.evidence, k)] for k in
                  ("allocation_results", "allocation_episodes", "coverage_intervals", "inference_records")}
        for batch in _batched(wanted["allocation_results"]):
            for rid, cluster, ns in session.execute(select(r.id, e.cluster, e.claim_namespace)
                                                    .join(e, e.id == r.episode_id).where(r.id.in_(batch))):
                self.results[rid] = (cluster, ns)
        for batch in _batched(wanted["allocation_episodes"]):
            for eid, cluster, ns in session.execute(select(e.id, e.cluster, e.claim_namespace).where(e.id.in_(batch))):
                self.episodes[eid] = (cluster, ns)
        for batch in _batched(wanted["coverage_intervals"]):
            for cid, cluster in session.execute(select(c.id, c.cluster).where(c.id.in_(batch))):
                self.coverage[cid] = (cluster, None)
        for batch in _batched(wanted["inference_records"]):
            for rid, cluster, ns in session.execute(
                    select(i.id, i.cluster, func.coalesce(lin.claim_namespace, i.pod_namespace))
                    .outerjoin(lin, lin.record_id == i.id).where(i.id.in_(batch))):
                self.records[rid] = (cluster, ns)

    def named(self, evidence: Any) -> tuple[set[str], set[str]]:
        """(clusters, namespaces) of the rows ``evidence`` names; ids no longer in the store add nothing."""
        clusters: set[str] = set()
        namespaces: set[str] = set()
        for key, index in (("allocation_results", self.results), ("allocation_episodes", self.episodes),
                           ("coverage_intervals", self.coverage), ("inference_records", self.records)):
            for x in _ids(evidence, key):
                cluster, ns = index.get(x, (None, None))
                clusters.update([cluster] if cluster else [])
                namespaces.update([ns] if ns else [])
        watch = evidence.get("watch_state") if isinstance(evidence, dict) else None
        for ref in watch if isinstance(watch, list) else []:
            if isinstance(ref, str) and "/" in ref:
                clusters.add(ref.rsplit("/", 1)[0])
        return clusters, namespaces


def scoped_evaluations(session: Session, scope: Scope) -> list[dict[str, Any]]:
    """Policy evaluations whose period overlaps the pack's, of a cluster in scope or of all clusters,
    oldest first: ``{bundle_revision, bundle_digest, engine, evaluated_at (RFC 3339 text, as findings
    carry it), findings, cluster (None: every cluster), period_from_ns, period_to_ns, evaluated_at_ns
    (UTC ns)}``. They say which bundles checked the period, also when nothing was found; how much of
    it they covered is ``reports.policy_coverage``'s (an overlap is not the whole period)."""
    e = PolicyEvaluation
    where = [e.period_from_ns < scope.to_ns, e.period_to_ns > scope.from_ns]
    if scope.clusters:
        where.append(or_(e.cluster.in_(scope.clusters), e.cluster.is_(None)))
    rows = session.execute(select(e).where(*where).order_by(e.evaluated_at, e.id)).scalars()
    return [{"bundle_revision": r.bundle_revision, "bundle_digest": r.bundle_digest, "engine": r.engine,
             "evaluated_at": r.evaluated_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "findings": r.findings,
             "cluster": r.cluster, "period_from_ns": r.period_from_ns, "period_to_ns": r.period_to_ns,
             "evaluated_at_ns": dt_to_ns(r.evaluated_at)} for r in rows]


def _end_key(to_ns: int | None) -> float:
    return float("inf") if to_ns is None else to_ns


def _states_more(row: Finding, held: Finding, scope: Scope) -> bool:
    """Whether ``row`` (evaluated later than or with ``held``, the same decision) is the one to show.

    An incident: the evaluation stating its latest end. A finding about its whole evaluation
    period (no interval: a share of the period's transactions): the evaluation whose period covers
    the most of the pack's — it counted the most of it; a window of the last hours, evaluated
    later, stated "0 of 3" for a day of "197 of 200". Ties go to the later evaluation."""
    if row.from_ns is None:
        return polcov.covered_ns(_span(row), scope) >= polcov.covered_ns(_span(held), scope)
    return _end_key(row.to_ns) >= _end_key(held.to_ns)


def _span(row: Finding) -> polcov.Span:
    """What the evaluation stating ``row`` decided: its period up to when it ran, as packs count
    policy coverage (``reports.policy_coverage.span_of``)."""
    return polcov.span_of({"cluster": row.cluster, "bundle_revision": row.bundle_revision,
                           "bundle_digest": row.bundle_digest, "period_from_ns": row.period_from_ns,
                           "period_to_ns": row.period_to_ns, "evaluated_at_ns": dt_to_ns(row.evaluated_at)})


def _owner(row: Finding, named: set[str]) -> str | None:
    """The cluster a finding is about: its own, or — stored by an evaluation of all clusters — the
    one cluster its evidence and subjects name (several or none: None). So one incident stated by
    an evaluation of its cluster and by one of all clusters is one row, not two, and two clusters'
    incidents that an evaluation of all clusters stated alike (same claim names) stay two."""
    if row.cluster is not None:
        return row.cluster
    return next(iter(named)) if len(named) == 1 else None


# per (cluster, bundle digest): each evaluation's period and what it decided (``policy_coverage.Span``)
Evaluations = dict[tuple[str | None, str], list[tuple[int, int, polcov.Span]]]


def _evaluations_by_bundle(session: Session, scope: Scope) -> Evaluations:
    """Per cluster (None: evaluations of all clusters) and bundle digest, the evaluations in scope
    as ``(period_from_ns, period_to_ns, Span)``."""
    out: Evaluations = {}
    for e in scoped_evaluations(session, scope):
        out.setdefault((e["cluster"], e["bundle_digest"]), []).append(
            (e["period_from_ns"], e["period_to_ns"], polcov.span_of(e)))
    return out


def _overtaken(row: Finding, evaluations: Evaluations, scope: Scope) -> bool:
    """A finding about its whole evaluation period that another evaluation of its cluster by the
    same bundle decided over again and did not state: one that decided all the finding's
    evaluation decided, and more of the pack's period (or as much, later). Shown, a 3-second
    window's "215 of 228 below 0.99" stood for a period whose whole evaluation found no such thing
    (a tester's finding). Not overtaken: by an evaluation of the same period (a re-run: a finding is
    stored once, under its first run, so a re-run's silence cannot be told from a repeat — taken for
    silence, every re-run hid it), by a window that did not decide the finding's own stretch, nor
    by another bundle (revision), which may not have the rule at all."""
    if row.from_ns is not None:
        return False
    own = _span(row)
    mark = (polcov.covered_ns(own, scope), own.evaluated_at_ns)
    for e_from, e_to, e in evaluations.get((row.cluster, row.bundle_digest), []):
        if (e_from, e_to) == (row.period_from_ns, row.period_to_ns) or e.from_ns > own.from_ns or e.to_ns < own.to_ns:
            continue
        if (polcov.covered_ns(e, scope), e.evaluated_at_ns) > mark:
            return True
    return False


def _incidents(widest: dict[str, Finding], owners: dict[int, str | None] | None = None
               ) -> list[tuple[Finding, int | None, int | None, list[str]]]:
    """One incident per rule, cluster and subjects over overlapping or touching intervals:
    ``(row shown, from_ns, to_ns, decision keys merged)``, in ``widest``'s order of first key.

    Why: an evaluation window that starts inside an incident stores it from the window's start
    (facts are clipped to the period), so two windows starting at different instants store one
    incident under two starts, two decision keys. The row shown is the one stating the incident's
    end (its severity and text: messages name no times but the gap's and idle stretch's own, which
    then match the interval shown); ``to_ns`` None (open) is the latest end.
    A finding without an interval (``from_ns`` None: about the whole period) is never merged.
    ``widest``: per decision key, the evaluation that stated the latest end (a window that ended
    earlier states less of a gap that went on, not that it stopped; its text measures its own end).
    ``owners``: the cluster each row is about (``_owner``; default its own ``cluster``)."""
    groups: dict[str, list[tuple[str, Finding]]] = {}
    for key, row in widest.items():
        cluster = owners.get(row.id, row.cluster) if owners else row.cluster
        subject = key if row.from_ns is None else finding_identity(row.rule, cluster, row.subjects, None, ANY_BUNDLE)
        groups.setdefault(subject, []).append((key, row))
    out: list[tuple[Finding, int | None, int | None, list[str]]] = []
    for members in groups.values():
        members.sort(key=lambda kr: kr[1].from_ns or 0)
        current: list | None = None
        for key, row in members:
            touches = current is not None and row.from_ns is not None and (current[2] is None or row.from_ns <= current[2])
            if not touches:
                if current is not None:
                    out.append(tuple(current))
                current = [row, row.from_ns, row.to_ns, [key]]
                continue
            if _end_key(row.to_ns) >= _end_key(current[2]):  # the row that states the incident's end is shown
                current[0], current[2] = row, row.to_ns
            current[3].append(key)
        out.append(tuple(current))
    return out


def scoped_findings(session: Session, scope: Scope) -> ScopedFindings:
    """Policy findings whose interval (or evaluation period) overlaps the period and that are in
    the scope by the module's rules, one per incident (``_incidents``: the evaluation stating its latest end).
    Findings are few (decisions, not rows): held in memory. Counts in the result are of decisions
    (identities), not of stored evaluations."""
    f = Finding
    start, end = func.coalesce(f.from_ns, f.period_from_ns), func.coalesce(f.to_ns, f.period_to_ns)
    where = [start < scope.to_ns, end > scope.from_ns]
    if scope.clusters:
        where.append(or_(f.cluster.in_(scope.clusters), f.cluster.is_(None)))
    # ascending recency (as collector.policy.findings.latest_per_identity): of equal ends the later row wins
    rows = list(session.execute(select(f).where(*where).order_by(f.evaluated_at, func.coalesce(f.to_ns, -1), f.id))
                .scalars())
    index = _EvidenceIndex(session, rows)
    out = ScopedFindings([])
    widest: dict[str, Finding] = {}  # per decision, the evaluation stating the latest end (windows differ)
    wide: set[str] = set()
    outside: set[str] = set()
    excluded: dict[str, set[str]] = {}
    found_by: dict[str, dict[tuple[str, str], list]] = {}  # key → (revision, digest) → [first, last evaluation, engine]
    owners: dict[int, str | None] = {}
    for row in rows:
        clusters, namespaces = index.named(row.evidence)
        if row.cluster is None:
            subject_cluster = (row.subjects or {}).get("cluster") if isinstance(row.subjects, dict) else None
            clusters |= {subject_cluster} if isinstance(subject_cluster, str) else set()
        owners[row.id] = owner = _owner(row, clusters)
        key = finding_identity(row.rule, owner, row.subjects, row.from_ns, ANY_BUNDLE)
        if scope.clusters and row.cluster is None:
            if not clusters:
                excluded.setdefault(row.rule, set()).add(key)
                continue
            if not clusters & set(scope.clusters):
                continue  # another cluster's finding
        if scope.namespaces:
            named = subject_namespaces(row.subjects) | namespaces
            if named and not named & set(scope.namespaces):
                outside.add(key)
                continue
            if not named:
                wide.add(key)
        if key not in widest or _states_more(row, widest[key], scope):  # ascending recency: ties go to the later
            widest[key] = row
        seen = found_by.setdefault(key, {}).setdefault((row.bundle_revision, row.bundle_digest),
                                                       [row.evaluated_at, row.evaluated_at, row.engine])
        if row.evaluated_at >= seen[1]:  # rows come in ascending recency: the last is the latest
            seen[1:] = [row.evaluated_at, row.engine]
    out.cluster_wide, out.outside_namespaces = len(wide), len(outside)
    out.excluded = {rule: len(keys) for rule, keys in excluded.items()}
    evaluations = _evaluations_by_bundle(session, scope)
    for key in [k for k, row in widest.items() if _overtaken(row, evaluations, scope)]:
        del widest[key]
    for row, from_ns, to_ns, keys in _incidents(widest, owners):
        by_bundle: dict[tuple[str, str], list] = {}
        for key in keys:
            for bundle, (first, last, engine) in found_by[key].items():
                held = by_bundle.setdefault(bundle, [first, last, engine])
                held[0] = min(held[0], first)
                if last >= held[1]:
                    held[1:] = [last, engine]
        bundles = [{"revision": rev, "digest": digest, "engine": engine,
                    "evaluated_at": last.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
                   for (rev, digest), (_first, last, engine) in
                   sorted(by_bundle.items(), key=lambda kv: (kv[1][0], kv[0]))]
        # still going on as far as its evaluation saw: open, "seen until" (a sharing going on read as
        # ended at the scheduler's run, after the pack's own period: a newcomer's finding)
        seen_ns = seen_until_ns(from_ns, to_ns, row.period_to_ns, row.evaluated_at)
        if seen_ns is not None:
            to_ns = None
        out.findings.append({
            "rule": row.rule, "severity": row.severity, "kind": row.kind, "message": row.message,
            "cluster": owners[row.id], "physical_gpu_uuid": row.physical_gpu_uuid,
            "from": ns_to_rfc3339(from_ns), "to": ns_to_rfc3339(to_ns), "from_ns": from_ns,
            "to_ns": to_ns, "seen_until": ns_to_rfc3339(seen_ns), "seen_until_ns": seen_ns,
            "subjects": row.subjects, "evidence": row.evidence,
            "bundle_revision": BUNDLE_SEPARATOR.join(b["revision"] for b in bundles),
            "bundle_digest": BUNDLE_SEPARATOR.join(b["digest"] for b in bundles), "bundles": bundles,
            "decided_by": {"revision": row.bundle_revision, "digest": row.bundle_digest}, "engine": row.engine,
            "evaluated_at": row.evaluated_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "finding_key": row.finding_key,
            "period_from_ns": row.period_from_ns, "period_to_ns": row.period_to_ns})
    out.findings.sort(key=_finding_order)
    return out


def _finding_order(d: dict[str, Any]) -> tuple:
    """Severity first; within one severity a finding about one transaction (its subjects name only
    ``transactions``) after those about allocations, coverage or inventory: a burst of per-transaction
    warnings must not push an incident out of the findings the pack spells out (the first
    ``FINDING_DETAIL_LIMIT``; all are in data/findings.*). Then rule, start, key: a stable order."""
    subjects = d["subjects"] if isinstance(d["subjects"], dict) else {}
    per_transaction = bool(subjects) and set(subjects) <= {"transactions"}
    return (SEVERITY_ORDER.get(d["severity"], 9), per_transaction, d["rule"], d["from_ns"] or 0, d["finding_key"])
