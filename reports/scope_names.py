"""Whether the store ever recorded the clusters and namespaces a pack is scoped to, and anything before its period.

A typo in ``--cluster`` or ``--namespace`` otherwise renders an official-looking pack that
observed nothing and found nothing; a period before the collector first ran otherwise reads as
"the last state observed before the period" although there was none. The pack and the CLI say so
instead (newcomer findings F5, F5b).

Queries: one existence test per name given, through an index where there is one
(``object_versions`` leads with the cluster); the list of known clusters only when a cluster is
unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from sqlalchemy import exists, or_, select, true, union
from sqlalchemy.orm import Session

from collector.store.models import (AllocationEpisode, CoverageInterval, InferenceRecord, ObjectVersion,
                                    WatchState)


@dataclass(frozen=True)
class NeverRecorded:
    """Scope names of no row in the store: ``clusters`` (no watched object, watch state or logged
    transaction of that cluster), ``namespaces`` (no object, claim or logged transaction in that
    namespace, in any cluster); ``known_clusters``: the clusters the store has watched (filled only
    when a cluster is unknown, else empty)."""

    clusters: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    known_clusters: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.clusters or self.namespaces)

    def warning(self, consequence: str = "the pack says so on its cover") -> str:
        """One line for the CLI's standard error, naming the known clusters, ending with
        ``consequence`` in parentheses (what the command does about it); empty when nothing is unknown."""
        parts = []
        if self.clusters:
            known = ", ".join(self.known_clusters) or "none: no cluster was ever watched"
            parts.append(f"no object of cluster {', '.join(self.clusters)} was ever recorded in this store "
                         f"(known clusters: {known})")
        if self.namespaces:
            parts.append(f"no object of namespace {', '.join(self.namespaces)} was ever recorded in this store")
        return "warning: " + "; ".join(parts) + f" ({consequence})" if parts else ""

    def doc(self) -> dict[str, list[str]]:
        """For the manifest: ``{"clusters": [...], "namespaces": [...], "known_clusters": [...]}``."""
        return {"clusters": list(self.clusters), "namespaces": list(self.namespaces),
                "known_clusters": list(self.known_clusters)}


def never_recorded(session: Session, clusters: Sequence[str], namespaces: Sequence[str]) -> NeverRecorded:
    """The names among ``clusters`` and ``namespaces`` that no row of the store carries (``NeverRecorded``)."""
    unknown_clusters = tuple(c for c in sorted(set(clusters)) if not _cluster_seen(session, c))
    unknown_namespaces = tuple(n for n in sorted(set(namespaces)) if not _namespace_seen(session, n))
    known = known_clusters(session) if unknown_clusters else ()
    return NeverRecorded(unknown_clusters, unknown_namespaces, known)


def _cluster_seen(session: Session, cluster: str) -> bool:
    # ordered by cost: the indexed and small tables first; inference_records has no cluster index
    return any(session.execute(select(exists().where(column == cluster))).scalar()
               for column in (ObjectVersion.cluster, WatchState.cluster, InferenceRecord.cluster))


def _namespace_seen(session: Session, namespace: str) -> bool:
    return any(session.execute(select(exists().where(column == namespace))).scalar()
               for column in (AllocationEpisode.claim_namespace, ObjectVersion.namespace, InferenceRecord.pod_namespace))


def known_clusters(session: Session) -> tuple[str, ...]:
    """Clusters the store has watched (watch state, coverage records, objects), sorted."""
    rows = session.execute(union(select(WatchState.cluster), select(CoverageInterval.cluster),
                                 select(ObjectVersion.cluster).distinct())).scalars()
    return tuple(sorted(set(rows)))


def observed_before(session: Session, from_ns: int, clusters: Sequence[str]) -> bool:
    """Whether the collector observed any of ``clusters`` (all when empty) before ``from_ns``: a
    coverage interval or an open watch state starting before it."""
    c, w = CoverageInterval, WatchState
    in_c = c.cluster.in_(clusters) if clusters else true()
    in_w = w.cluster.in_(clusters) if clusters else true()
    return bool(session.execute(select(or_(exists().where(c.started_ns < from_ns, in_c),
                                           exists().where(w.state_since_ns < from_ns, in_w)))).scalar())
