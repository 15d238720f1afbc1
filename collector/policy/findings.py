"""Evaluate a bundle over a period and store its findings (idempotently, in the ledger).

Flow: ``facts.build_facts`` (SQL) → ``engine.evaluate`` (Rego) → validated ``Finding`` rows. A
finding's key is SHA-256 of the canonical JSON of (rule, cluster, subjects, from_ns, to_ns,
period, bundle digest): evaluating the same period with the same bundle again inserts nothing,
whichever engine runs it. New rows are appended to the ledger in the same transaction.

A finding on an interval still open when evaluated (a gap, an idle allocation, an allocation still
held, the time since the collector stopped) ends at the evaluation's horizon — the last observation,
never after the period's end (``facts``) — so each later evaluation stores a row with a moved
end: the earlier rows stay (the ledger never forgets what was once concluded). Its
*identity* (``finding_identity``: rule, cluster, subjects, start, bundle digest — not the end, not
the evaluation period) names them as one finding; readers show the latest evaluation of each
identity, and an evaluation reports such rows as *updated*, not new.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import insert, or_, select
from sqlalchemy.orm import Session, sessionmaker

from collector.errors import UserError
from collector.policy.bundle import Bundle
from collector.policy.engines import PolicyEngine
from collector.policy.facts import build_facts
from collector.store import ledger
from collector.store.canonical import content_hash
from collector.store.models import Finding, PolicyEvaluation
from collector.timeutil import dt_to_ns, ns_to_dt, utcnow

SEVERITIES = ("critical", "high", "medium", "low", "info")
KINDS = ("violation", "warning", "observation")
_KEY_BATCH = 500


@dataclass
class Evaluation:
    """Outcome of one evaluation.

    ``findings``: every finding of the period as stored (column → value mappings, including rows
    stored by an earlier identical evaluation); ``inserted``: how many were new. Times in seconds.
    """

    findings: list[dict[str, Any]]
    inserted: int
    facts_s: float
    rego_s: float
    store_s: float
    counts: dict[str, int] = field(default_factory=dict)
    updated: int = 0  # of ``inserted``, rows whose identity was stored before (the end moved)
    # cluster → last observation, for clusters of which nothing in the period was observed (the
    # collector stopped, or lost the ResourceClaim stream, at or before the period start)
    unobserved: dict[str, int] = field(default_factory=dict)


def finding_key(finding: dict[str, Any], cluster: str | None, period_from_ns: int, period_to_ns: int, digest: str) -> str:
    """The idempotency key of a finding (see module docstring)."""
    return content_hash({"rule": finding["rule"], "cluster": cluster, "subjects": finding["subjects"],
                         "from_ns": finding.get("from_ns"), "to_ns": finding.get("to_ns"),
                         "period": [period_from_ns, period_to_ns], "bundle_digest": digest})


def seen_until_ns(from_ns: int | None, to_ns: int | None, period_to_ns: int, evaluated_at: datetime | str) -> int | None:
    """For a finding interval still going on as far as the evaluation stating it could see, that
    instant — the end of its period, or when it ran if earlier — else None. The facts cut an
    interval still open at that instant (``collector.policy.facts``), so an end there is the
    evaluation's, not the incident's: readers show such an interval open, "seen until" it.
    A finding without an interval (``from_ns`` None) has none. ``evaluated_at``: as stored, or as
    RFC 3339 text (a row once ledgered)."""
    if from_ns is None:
        return None
    if isinstance(evaluated_at, str):
        evaluated_at = datetime.fromisoformat(evaluated_at.replace("Z", "+00:00"))
    seen = min(period_to_ns, dt_to_ns(evaluated_at))
    return seen if to_ns is None or to_ns >= seen else None


def finding_identity(rule: str, cluster: str | None, subjects: Any, from_ns: int | None, bundle_digest: str) -> str:
    """What a finding is about, whatever its end and evaluation period (see module docstring):
    SHA-256 of the canonical JSON of (rule, cluster, subjects, from_ns, bundle digest)."""
    return content_hash({"rule": rule, "cluster": cluster, "subjects": subjects, "from_ns": from_ns,
                         "bundle_digest": bundle_digest})


def row_identity(row: dict[str, Any]) -> str:
    """``finding_identity`` of a ``findings`` row (a mapping of its columns)."""
    return finding_identity(row["rule"], row["cluster"], row["subjects"], row["from_ns"], row["bundle_digest"])


def latest_per_identity(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of ``findings`` rows, the latest evaluation of each identity (by ``evaluated_at``, then the
    later end, then id), in the input order of the kept rows."""
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = row_identity(row)
        held = best.get(key)
        if held is None or _recency(row) > _recency(held):
            best[key] = row
    kept = {id(r) for r in best.values()}
    return [r for r in rows if id(r) in kept]


def _recency(row: dict[str, Any]) -> tuple:
    return (row["evaluated_at"], row["to_ns"] if row["to_ns"] is not None else -1, row.get("id") or 0)


def _check(finding: Any, package: str) -> dict[str, Any]:
    if not isinstance(finding, dict):
        raise UserError(f"data.{package}.findings holds {finding!r}; each finding must be an object with rule, severity, kind, message, subjects")
    rule = finding.get("rule")
    where = f"data.{package}.findings (rule {rule!r})"
    if not isinstance(rule, str) or not rule:
        raise UserError(f"data.{package}.findings has a finding without a \"rule\" string")
    if finding.get("severity") not in SEVERITIES:
        raise UserError(f"{where}: severity {finding.get('severity')!r} is not one of {', '.join(SEVERITIES)}")
    if finding.get("kind") not in KINDS:
        raise UserError(f"{where}: kind {finding.get('kind')!r} is not one of {', '.join(KINDS)}")
    if not isinstance(finding.get("message"), str):
        raise UserError(f"{where}: \"message\" must be a string")
    if not isinstance(finding.get("subjects"), dict):
        raise UserError(f"{where}: \"subjects\" must be an object")
    for bound in ("from_ns", "to_ns"):
        value = finding.get(bound)
        if value is not None and not isinstance(value, int):
            raise UserError(f"{where}: \"{bound}\" must be integer nanoseconds, got {value!r}")
    return finding


def to_rows(results: dict[str, list[dict[str, Any]]], bundle: Bundle, engine_name: str, cluster: str | None,
            period_from_ns: int, period_to_ns: int, evaluated_at: datetime) -> list[dict[str, Any]]:
    """Engine output → ``findings`` rows (without ids), one per distinct finding key.

    Raises:
        UserError: a finding with a missing field, an unknown severity or kind.
    """
    rows: dict[str, dict[str, Any]] = {}
    for package in sorted(results):
        for raw in results[package]:
            f = _check(raw, package)
            key = finding_key(f, cluster, period_from_ns, period_to_ns, bundle.digest)
            rows.setdefault(key, {
                "finding_key": key, "cluster": cluster, "rule": f["rule"], "severity": f["severity"],
                "kind": f["kind"], "message": f["message"], "subjects": f["subjects"], "evidence": f.get("evidence"),
                "physical_gpu_uuid": f.get("physical_gpu_uuid"), "from_ns": f.get("from_ns"), "to_ns": f.get("to_ns"),
                "period_from_ns": period_from_ns, "period_to_ns": period_to_ns,
                "bundle_revision": bundle.revision, "bundle_digest": bundle.digest,
                "engine": engine_name, "evaluated_at": evaluated_at,
            })
    return list(rows.values())


def store_findings(session: Session, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Insert the rows whose key is new and ledger them; return (all rows as stored, inserted count)."""
    keys = [r["finding_key"] for r in rows]
    existing: dict[str, dict[str, Any]] = {}
    for i in range(0, len(keys), _KEY_BATCH):
        batch = keys[i:i + _KEY_BATCH]
        for row in session.execute(select(Finding.__table__).where(Finding.finding_key.in_(batch))).mappings():
            existing[row["finding_key"]] = dict(row)
    new = [r for r in rows if r["finding_key"] not in existing]
    inserted: list[dict[str, Any]] = []
    if new:
        ids = session.execute(insert(Finding).returning(Finding.id, Finding.finding_key, sort_by_parameter_order=True), new).all()
        inserted = [{**row, "id": fid} for row, (fid, _key) in zip(new, ids)]
        ledger.append(session, "findings", inserted)
    by_key = {**existing, **{r["finding_key"]: r for r in inserted}}
    return [by_key[k] for k in keys], len(inserted)


def record_evaluation(session: Session, bundle: Bundle, engine_name: str, cluster: str | None, period_from_ns: int,
                      period_to_ns: int, evaluated_at: datetime, findings: int) -> int:
    """Store (and ledger) that ``bundle`` was evaluated over ``[period_from_ns, period_to_ns)`` for
    ``cluster`` (None: all) at ``evaluated_at`` and returned ``findings`` decisions; returns its id.

    Packs read these to state which bundles checked the period, also when nothing was found.
    """
    row = {"cluster": cluster, "period_from_ns": period_from_ns, "period_to_ns": period_to_ns,
           "bundle_revision": bundle.revision, "bundle_digest": bundle.digest, "engine": engine_name,
           "evaluated_at": evaluated_at, "findings": findings}
    evaluation_id = session.execute(insert(PolicyEvaluation).returning(PolicyEvaluation.id), [row]).scalar_one()
    ledger.append(session, "policy_evaluations", [{**row, "id": evaluation_id}])
    return evaluation_id


def evaluate_period(sessions: sessionmaker[Session], bundle: Bundle, engine: PolicyEngine, period_from_ns: int,
                    period_to_ns: int, cluster: str | None = None, *, now_ns: int | None = None) -> Evaluation:
    """Facts for the period → ``engine`` (with ``bundle`` loaded) → stored findings, in one transaction.

    Raises:
        UserError: the engine failed (OPA down, evaluation error) or produced malformed findings;
            nothing is stored then.
        ValueError: an empty period.
    """
    # One instant: the facts are cut at it (open gaps, allocations still going on) and the
    # evaluation is stamped with it, so a reader can tell "lasted to when it ran" (still going on)
    # from "ended before"; stamped a few ms after its cut, a scheduled run's ongoing allocation
    # read as ended then.
    evaluated_at = utcnow() if now_ns is None else ns_to_dt(now_ns)
    now_ns = dt_to_ns(evaluated_at)
    with sessions.begin() as session:
        started = time.perf_counter()
        facts = build_facts(session, period_from_ns, period_to_ns, cluster, now_ns=now_ns)
        facts_done = time.perf_counter()
        results = engine.evaluate(facts)
        rego_done = time.perf_counter()
        rows = to_rows(results, bundle, engine.name, cluster, period_from_ns, period_to_ns, evaluated_at)
        prior = _stored_identities(session, rows)
        stored, inserted = store_findings(session, rows)
        record_evaluation(session, bundle, engine.name, cluster, period_from_ns, period_to_ns, evaluated_at, len(rows))
        updated = sum(1 for r in rows if r["finding_key"] not in prior.get(row_identity(r), {r["finding_key"]}))
        stored_done = time.perf_counter()
    counts = {"allocations": sum(len(g["allocations"]) for g in facts["allocation_groups"]), "overlaps": len(facts["overlaps"]),
              "handovers": len(facts["handovers"]), "idle_allocations": len(facts["idle_allocations"]),
              "coverage_gaps": len(facts["coverage_gaps"]), "records": facts["attribution"]["records"]}
    stored.sort(key=lambda r: (r["from_ns"] if r["from_ns"] is not None else -1, r["rule"], r["finding_key"]))
    unobserved = {c: t for c, t in facts["period"]["observed_until_ns"].items() if t <= period_from_ns}
    return Evaluation(stored, inserted, facts_done - started, rego_done - facts_done, stored_done - rego_done, counts,
                      updated, unobserved)


def _stored_identities(session: Session, rows: list[dict[str, Any]]) -> dict[str, set[str]]:
    """identity → finding keys already stored with it, for the identities of ``rows``."""
    if not rows:
        return {}
    table = Finding.__table__
    starts = sorted({r["from_ns"] for r in rows if r["from_ns"] is not None})
    start_match = table.c.from_ns.in_(starts) if starts else None
    if any(r["from_ns"] is None for r in rows):
        start_match = table.c.from_ns.is_(None) if start_match is None else or_(start_match, table.c.from_ns.is_(None))
    stmt = select(table.c.finding_key, table.c.rule, table.c.cluster, table.c.subjects, table.c.from_ns, table.c.bundle_digest).where(
        table.c.bundle_digest.in_(sorted({r["bundle_digest"] for r in rows})),
        table.c.rule.in_(sorted({r["rule"] for r in rows})), start_match)
    out: dict[str, set[str]] = {}
    for row in session.execute(stmt).mappings():
        out.setdefault(row_identity(row), set()).add(row["finding_key"])
    return out
