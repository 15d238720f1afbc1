"""Check that the projections are exactly what the ledgered object versions produce.

The projection tables (pods, claims, allocation episodes, consumers, devices) are derived data:
attribution, policies and packs read them, but the ledger covers their source, ``object_versions``,
not them. An edit to a projection row (say, an allocation result moved to another device) would
therefore go unnoticed by the hash chain alone. This check rebuilds the projections from the
versions inside a savepoint, compares the two as multisets of rows (surrogate ids replaced by
natural keys), and rolls the rebuild back: the store is never changed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from collector.kube.projections import PROJECTION_MODELS, rebuild
from collector.store.models import AllocationEpisode, AllocationResult


@dataclass(frozen=True)
class ProjectionDifference:
    """One row present on one side only: ``table``, the row (natural key form) and which side."""

    table: str
    row: tuple
    problem: str  # "not derivable from the object versions" | "missing from the store"

    def describe(self) -> str:
        return f"{self.table}: {self.problem}: {self.row}"


def _snapshot(session: Session, cluster: str | None) -> dict[str, Counter]:
    episodes = {r.id: (r.cluster, r.claim_uid, r.first_rv) for r in session.execute(
        select(AllocationEpisode.id, AllocationEpisode.cluster, AllocationEpisode.claim_uid, AllocationEpisode.first_rv))}
    out: dict[str, Counter] = {}
    for model in PROJECTION_MODELS:
        table = model.__table__
        cols = [c for c in table.columns if c.name != "id"]
        stmt = select(*cols)
        if cluster is not None and "cluster" in table.c:
            stmt = stmt.where(table.c.cluster == cluster)
        rows: Counter = Counter()
        for row in session.execute(stmt):
            values: list[Any] = []
            for col, value in zip(cols, row):
                if col.name == "episode_id":
                    value = episodes.get(value, ("?", value))
                values.append(_hashable(value))
            if model is AllocationResult and cluster is not None and values[[c.name for c in cols].index("episode_id")][0] != cluster:
                continue
            rows[tuple(values)] += 1
        out[table.name] = rows
    return out


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def audit_projections(session: Session, cluster: str | None = None, limit: int = 20) -> list[ProjectionDifference]:
    """Rebuild the projections from ``object_versions`` in a savepoint and compare; roll back.

    Args:
        session: a session outside any other write (the rebuild runs in a nested transaction).
        cluster: only this cluster (``None`` = all).
        limit: at most this many differences are returned.

    Returns:
        The differences (empty when the projections are exactly derivable from the ledgered source).
    """
    stored = _snapshot(session, cluster)
    savepoint = session.begin_nested()
    try:
        rebuild(session, cluster)
        derived = _snapshot(session, cluster)
    finally:
        savepoint.rollback()
    diffs: list[ProjectionDifference] = []
    for table in stored:
        extra = stored[table] - derived[table]
        missing = derived[table] - stored[table]
        diffs += [ProjectionDifference(table, row, "not derivable from the object versions") for row in sorted(extra, key=repr)]
        diffs += [ProjectionDifference(table, row, "missing from the store") for row in sorted(missing, key=repr)]
    return diffs[:limit]


__all__ = ["ProjectionDifference", "audit_projections"]
