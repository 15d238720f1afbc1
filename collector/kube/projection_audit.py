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
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from collector.kube.projections import PROJECTION_MODELS, rebuild
from collector.store.models import AllocationEpisode, AllocationResult


@dataclass(frozen=True)
class ProjectionDifference:
    """A stored projection row that the ledgered object versions do not produce, or the reverse.

    ``row`` is the stored row (natural key form: ``episode_id`` as its episode's (cluster, claim
    uid, first resourceVersion)), ``columns`` its column names. ``problem``:
    ``"changed"`` (``derived`` holds the row the versions produce: same row, edited columns),
    ``"not derivable from the object versions"`` (stored only) or ``"missing from the store"``
    (derived only; ``row`` is the derived row).
    """

    table: str
    row: tuple
    problem: str
    columns: tuple[str, ...] = ()
    derived: tuple | None = None

    def describe(self) -> str:
        """One line naming the row by its first identifying columns, and for a changed row the
        columns whose stored value differs from the derived one."""
        if not self.columns:
            return f"{self.table}: {self.problem}: {self.row}"
        named = dict(zip(self.columns, self.row))
        key = ", ".join(f"{c}={_text(named[c])}" for c in _KEY_COLUMNS if c in named)
        if self.derived is None:
            rest = ", ".join(f"{c}={_text(v)}" for c, v in named.items() if c not in _KEY_COLUMNS)
            return f"{self.table} ({key}): {self.problem}: {rest}"
        changes = "; ".join(f"{c} stored {_text(a)}, derived {_text(b)}"
                            for c, a, b in zip(self.columns, self.row, self.derived) if a != b)
        return f"{self.table} ({key}): changed: {changes}"


# Columns that name a projection row to a reader (claim, pod or device, and its version).
_KEY_COLUMNS = ("cluster", "namespace", "claim_namespace", "claim_name", "name", "claim_uid", "uid", "driver", "pool",
                "device", "first_rv", "episode_id")


def _text(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, tuple) and len(value) == 3 and value[0] != "?":  # an episode's natural key
        return "/".join(str(v) for v in value)
    return "null" if value is None else str(value)


def _pair_changed(table: str, columns: tuple[str, ...], extra: list[tuple], missing: list[tuple]) -> list[ProjectionDifference]:
    """Stored-only and derived-only rows of one table, a stored row paired with the derived row it
    agrees with on most columns (at least half) as one ``changed`` difference."""
    diffs, unmatched = [], list(missing)
    for row in extra:
        best = max(unmatched, key=lambda m: sum(a == b for a, b in zip(row, m)), default=None)
        if best is not None and 2 * sum(a == b for a, b in zip(row, best)) >= len(columns):
            unmatched.remove(best)
            diffs.append(ProjectionDifference(table, row, "changed", columns, best))
        else:
            diffs.append(ProjectionDifference(table, row, "not derivable from the object versions", columns))
    return diffs + [ProjectionDifference(table, row, "missing from the store", columns) for row in unmatched]


def _snapshot(session: Session, cluster: str | None) -> dict[str, tuple[tuple[str, ...], Counter]]:
    episodes = {r.id: (r.cluster, r.claim_uid, r.first_rv) for r in session.execute(
        select(AllocationEpisode.id, AllocationEpisode.cluster, AllocationEpisode.claim_uid, AllocationEpisode.first_rv))}
    out: dict[str, tuple[tuple[str, ...], Counter]] = {}
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
        out[table.name] = (tuple(c.name for c in cols), rows)
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
    for table, (columns, rows) in stored.items():
        extra = sorted((rows - derived[table][1]).elements(), key=repr)
        missing = sorted((derived[table][1] - rows).elements(), key=repr)
        diffs += _pair_changed(table, columns, extra, missing)
    return diffs[:limit]


__all__ = ["ProjectionDifference", "audit_projections"]
