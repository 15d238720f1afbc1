"""Prometheus metrics of the watcher (client conventions: units in names, ``_total`` counters,
bounded label cardinality: ``kind`` is one of four, ``type`` one of three)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class WatchMetrics:
    """The watcher's metrics, registered once per registry."""

    events: Counter
    relists: Counter
    gaps: Counter
    reconnects: Counter
    quarantined: Counter
    commit_lag: Histogram
    queue_depth: Gauge
    synced: Gauge
    leader: Gauge

    def declare_kind(self, kind: str) -> None:
        """Create the per-kind series at 0, so that ``rate()`` and alerts on gaps, reconnects,
        relists and quarantine see a series before the first increment (Prometheus practice)."""
        for counter in (self.relists, self.gaps, self.reconnects, self.quarantined):
            counter.labels(kind)
        self.synced.labels(kind)


_BY_REGISTRY: dict[int, WatchMetrics] = {}


def watch_metrics(registry: CollectorRegistry = REGISTRY) -> WatchMetrics:
    """The ``WatchMetrics`` of ``registry`` (created on first use, shared afterwards)."""
    key = id(registry)
    if key not in _BY_REGISTRY:
        _BY_REGISTRY[key] = WatchMetrics(
            events=Counter("draudit_watch_events_total", "Watch events received", ["kind", "type"], registry=registry),
            relists=Counter("draudit_watch_relists_total", "LISTs performed (initial and after 410 Gone)", ["kind"], registry=registry),
            gaps=Counter("draudit_watch_gaps_total", "Coverage gaps opened (history compacted while away)", ["kind"], registry=registry),
            reconnects=Counter("draudit_watch_reconnects_total", "Watch failures followed by a retry", ["kind"], registry=registry),
            quarantined=Counter("draudit_watch_quarantined_total", "Watch lines or objects quarantined", ["kind"], registry=registry),
            commit_lag=Histogram("draudit_watch_commit_lag_seconds", "Time from receiving an event to its commit",
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=registry),
            queue_depth=Gauge("draudit_watch_queue_depth", "Operations waiting for the recorder", registry=registry),
            synced=Gauge("draudit_watch_synced", "1 when the kind is synced and not in a gap", ["kind"], registry=registry),
            leader=Gauge("draudit_leader", "1 while this replica holds the leader Lease", registry=registry),
        )
    return _BY_REGISTRY[key]
