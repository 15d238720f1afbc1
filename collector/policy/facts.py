"""Policy input facts, computed in SQL from the projection tables for a period ``[from, to)``.

The Rego never joins raw rows pairwise: overlaps, handovers, idle stretches, coverage gaps and
attribution counts are set-based SQL here, and the policies decide on these compact facts.
Namespace → tenant mapping is the bundle's job (``data.draudit.params.tenants``), so facts carry
namespaces; because a namespace has exactly one tenant, pairs and handovers inside one namespace
are dropped here unless they matter for another reason (same device).

Every time is integer nanoseconds since the epoch (UTC). ``from_ns``/``to_ns`` of a fact are
clipped to the period (an allocation still held ends at the period's end); a handover's
predecessor that ended before the period keeps its real bounds.

The document (``build_facts(...)``)::

    {
      "period": {"from_ns": int, "to_ns": int, "cluster": str | null},
      "allocations": [Allocation],          # device results of allocations overlapping the period
      "overlaps": [                         # two allocations at once on one physical GPU
        {"physical_gpu_uuid": str | null, "same_device": bool, "from_ns": int, "to_ns": int,
         "a": Allocation, "b": Allocation}],  # a started first; never the same claim allocation
      "handovers": [                        # a GPU passing to another namespace's claim
        {"physical_gpu_uuid": str | null, "released_ns": int, "acquired_ns": int, "gap_ns": int,
         "from": Allocation, "to": Allocation}],
      "idle_allocations": [                 # stretches of an allocation with no consumer
        {"episode_id", "cluster", "claim_uid", "namespace", "claim", "idle_from_ns",
         "idle_to_ns", "duration_ns", "from_ns", "to_ns"}],
      "coverage_gaps": [                    # watcher gaps: closed (coverage_intervals) or open (watch_state)
        {"id": int | null, "cluster", "kind", "started_ns", "ended_ns": int | null, "open": bool,
         "duration_ns", "from_ns", "to_ns", "reason"}],
      "attribution": {"records", "exact", "ambiguous", "unattributed", "pending",
                      "unattributed_records": [{"record_id", "transaction_id", "event_time_ns",
                                                "reason", "pod_namespace", "pod_name"}]}
    }

    Allocation = {"id": allocation_results.id, "episode_id", "cluster", "claim_uid", "namespace",
                  "claim", "request", "driver", "pool", "device", "device_class",
                  "admin_access": bool, "share_id": str | null,
                  "device_state_id": int | null (no ResourceSlice record → null),
                  "physical_gpu_uuid": str | null, "mig": bool,
                  "allow_multiple_allocations": bool, "from_ns", "to_ns"}

Rules of the facts (sources: dra-api.md §2.3, §5.2, §6.3, §6.5):
- The device of a result is the ``device_states`` row of (cluster, driver, pool, device) valid
  at the allocation's start, else the first one published during the allocation. Its physical
  GPU is ``physical_gpu_uuid`` (a MIG device's ``parent_uuid``); without a record the device
  key ``cluster/driver/pool/device`` stands in, so same-device overlaps are still found.
- ``adminAccess`` results are monitoring access, not "served by": they take no part in overlaps
  or handovers (the adminAccess rule sees them in ``allocations``).
- Results of one claim allocation (episode) never pair with each other: pods sharing one claim
  (time-slicing, MPS) are one allocation inside one namespace.
- A handover's predecessor is the allocation on the same GPU that ended last before the next
  one started, on the same device or where either side is a full GPU (two MIG partitions of
  one GPU are separate memory); it is looked for up to ``handover_lookback_ns`` before the period.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from collector.timeutil import NS_PER_S, now_ns as _now_ns

OPEN_END_NS = 2**62  # stands for "still open" inside SQL; never leaves this module
DEFAULT_HANDOVER_LOOKBACK_NS = 24 * 3600 * NS_PER_S

_TEMP = "policy_intervals"

_CREATE = f"""
CREATE TEMPORARY TABLE {_TEMP} (
    id BIGINT PRIMARY KEY,
    episode_id BIGINT NOT NULL,
    cluster VARCHAR(253) NOT NULL,
    claim_uid VARCHAR(64) NOT NULL,
    namespace VARCHAR(253) NOT NULL,
    claim_name VARCHAR(253) NOT NULL,
    request VARCHAR(253) NOT NULL,
    driver VARCHAR(253) NOT NULL,
    pool VARCHAR(253) NOT NULL,
    device VARCHAR(253) NOT NULL,
    device_class VARCHAR(253),
    admin_access INTEGER NOT NULL,
    share_id VARCHAR(64),
    device_state_id BIGINT,
    physical_gpu_uuid VARCHAR(128),
    is_mig INTEGER NOT NULL,
    allow_multiple INTEGER NOT NULL,
    gpu_key VARCHAR(1100) NOT NULL,
    device_key VARCHAR(1100) NOT NULL,
    from_ns BIGINT NOT NULL,
    to_ns BIGINT NOT NULL,
    in_period INTEGER NOT NULL
)
"""

# One row per allocation result of an allocation episode overlapping [lookback_from, to), with
# the device record resolved by a correlated lookup on ix_device_states_key.
_FILL = f"""
INSERT INTO {_TEMP}
SELECT b.id, b.episode_id, b.cluster, b.claim_uid, b.namespace, b.claim_name, b.request, b.driver,
       b.pool, b.device, b.device_class, b.admin_access, b.share_id, ds.id,
       COALESCE(ds.physical_gpu_uuid, ds.parent_uuid, ds.uuid),
       CASE WHEN ds.device_type = 'mig' OR ds.parent_uuid IS NOT NULL THEN 1 ELSE 0 END,
       CASE WHEN ds.allow_multiple_allocations THEN 1 ELSE 0 END,
       COALESCE(ds.physical_gpu_uuid, ds.parent_uuid, ds.uuid, b.device_key),
       b.device_key, b.from_ns, b.to_ns,
       CASE WHEN b.from_ns < :period_to AND b.to_ns > :period_from THEN 1 ELSE 0 END
FROM (
    SELECT r.id, e.id AS episode_id, e.cluster, e.claim_uid, e.claim_namespace AS namespace,
           e.claim_name, r.request, r.driver, r.pool, r.device, r.device_class_name AS device_class,
           CASE WHEN r.admin_access THEN 1 ELSE 0 END AS admin_access, r.share_id,
           e.cluster || '/' || r.driver || '/' || r.pool || '/' || r.device AS device_key,
           e.valid_from_ns AS from_ns, COALESCE(e.valid_to_ns, :open_end) AS to_ns,
           COALESCE(
             (SELECT ds.id FROM device_states ds
               WHERE ds.cluster = e.cluster AND ds.driver = r.driver AND ds.pool = r.pool AND ds.device = r.device
                 AND ds.valid_from_ns <= e.valid_from_ns AND COALESCE(ds.valid_to_ns, :open_end) > e.valid_from_ns
               ORDER BY ds.valid_from_ns DESC, ds.id DESC LIMIT 1),
             (SELECT ds.id FROM device_states ds
               WHERE ds.cluster = e.cluster AND ds.driver = r.driver AND ds.pool = r.pool AND ds.device = r.device
                 AND ds.valid_from_ns > e.valid_from_ns AND ds.valid_from_ns < COALESCE(e.valid_to_ns, :open_end)
               ORDER BY ds.valid_from_ns, ds.id LIMIT 1)) AS device_state_id
      FROM allocation_results r
      JOIN allocation_episodes e ON e.id = r.episode_id
     WHERE e.valid_from_ns < :period_to
       AND COALESCE(e.valid_to_ns, :open_end) > :lookback_from
       {{cluster_filter}}
) b
LEFT JOIN device_states ds ON ds.id = b.device_state_id
"""

_SELECT_INTERVALS = f"""
SELECT id, episode_id, cluster, claim_uid, namespace, claim_name, request, driver, pool, device,
       device_class, admin_access, share_id, device_state_id, physical_gpu_uuid, is_mig,
       allow_multiple, from_ns, to_ns, in_period
  FROM {_TEMP} ORDER BY id
"""

# Each unordered pair once: b starts at or after a (ties broken by id), and before a ends.
_OVERLAPS = f"""
SELECT a.id, b.id, b.from_ns, CASE WHEN a.to_ns < b.to_ns THEN a.to_ns ELSE b.to_ns END,
       CASE WHEN a.device_key = b.device_key THEN 1 ELSE 0 END
  FROM {_TEMP} a
  JOIN {_TEMP} b
    ON b.gpu_key = a.gpu_key AND b.from_ns >= a.from_ns AND b.from_ns < a.to_ns
   AND (b.from_ns > a.from_ns OR b.id > a.id)
 WHERE a.admin_access = 0 AND b.admin_access = 0
   AND a.episode_id <> b.episode_id
   AND (a.device_key = b.device_key OR a.namespace <> b.namespace)
   AND b.from_ns < :period_to AND a.to_ns > :period_from AND b.to_ns > :period_from
 ORDER BY a.id, b.id
"""

_HANDOVERS = f"""
SELECT h.from_id, h.to_id, p.to_ns, n.from_ns
  FROM (SELECT n.id AS to_id,
               (SELECT p.id FROM {_TEMP} p
                 WHERE p.gpu_key = n.gpu_key AND p.to_ns <= n.from_ns AND p.admin_access = 0
                   AND p.episode_id <> n.episode_id
                   AND (p.device_key = n.device_key OR p.is_mig = 0 OR n.is_mig = 0)
                 ORDER BY p.to_ns DESC, p.id DESC
                 LIMIT 1) AS from_id
          FROM {_TEMP} n
         WHERE n.admin_access = 0 AND n.from_ns >= :period_from AND n.from_ns < :period_to) h
  JOIN {_TEMP} p ON p.id = h.from_id
  JOIN {_TEMP} n ON n.id = h.to_id
 WHERE p.namespace <> n.namespace
 ORDER BY h.to_id
"""

# Stretches of an allocation episode not covered by any reservedFor consumer: before the first
# consumer (or the whole episode when there is none), after the last, and between consumers
# (a running maximum of earlier consumers' ends finds holes even when consumers overlap).
_IDLE = f"""
WITH eps AS (
    SELECT DISTINCT episode_id, cluster, claim_uid, namespace, claim_name, from_ns, to_ns
      FROM {_TEMP} WHERE in_period = 1
), cons AS (
    SELECT c.episode_id, c.valid_from_ns AS f, COALESCE(c.valid_to_ns, :open_end) AS t
      FROM claim_consumers c JOIN eps ON eps.episode_id = c.episode_id
), ordered AS (
    SELECT episode_id, f,
           MAX(t) OVER (PARTITION BY episode_id ORDER BY f, t ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
      FROM cons
), bounds AS (
    SELECT episode_id, MIN(f) AS first_f, MAX(t) AS last_t FROM cons GROUP BY episode_id
), stretches AS (
    SELECT e.episode_id, e.from_ns AS s, COALESCE(b.first_f, e.to_ns) AS en
      FROM eps e LEFT JOIN bounds b ON b.episode_id = e.episode_id
    UNION ALL
    SELECT e.episode_id, b.last_t, e.to_ns FROM eps e JOIN bounds b ON b.episode_id = e.episode_id
    UNION ALL
    SELECT episode_id, prev_end, f FROM ordered WHERE prev_end IS NOT NULL
)
SELECT s.episode_id, e.cluster, e.claim_uid, e.namespace, e.claim_name, s.s, s.en
  FROM stretches s JOIN eps e ON e.episode_id = s.episode_id
 WHERE s.en > s.s AND s.s < :period_to AND s.en > :period_from
 ORDER BY s.episode_id, s.s
"""

_CLOSED_GAPS = """
SELECT id, cluster, kind, started_ns, ended_ns, reason FROM coverage_intervals
 WHERE state = 'gap' AND started_ns < :period_to AND ended_ns > :period_from {cluster_filter}
 ORDER BY cluster, kind, started_ns, id
"""

_OPEN_GAPS = """
SELECT cluster, kind, state_since_ns, state_reason FROM watch_state
 WHERE state = 'gap' AND state_since_ns < :period_to {cluster_filter}
 ORDER BY cluster, kind
"""

_ATTRIBUTION_COUNTS = """
SELECT COALESCE(l.status, 'pending'), COUNT(*)
  FROM inference_records r LEFT JOIN lineage l ON l.record_id = r.id
 WHERE r.event_time_ns >= :period_from AND r.event_time_ns < :period_to {cluster_filter}
 GROUP BY COALESCE(l.status, 'pending')
"""

_UNATTRIBUTED = """
SELECT r.id, r.transaction_id, r.event_time_ns, l.reason, r.pod_namespace, r.pod_name
  FROM inference_records r JOIN lineage l ON l.record_id = r.id
 WHERE l.status = 'unattributed' AND r.event_time_ns >= :period_from AND r.event_time_ns < :period_to {cluster_filter}
 ORDER BY r.event_time_ns, r.id
"""


def build_facts(session: Session, period_from_ns: int, period_to_ns: int, cluster: str | None = None, *,
                now_ns: int | None = None, handover_lookback_ns: int = DEFAULT_HANDOVER_LOOKBACK_NS) -> dict[str, Any]:
    """The policy input document for ``[period_from_ns, period_to_ns)`` (shape in the module docstring).

    Args:
        session: an open session; a temporary table is created and dropped inside its transaction.
        cluster: restrict to one cluster (inference records without a cluster are kept).
        now_ns: the end of gaps that are still open (default: the current time).
        handover_lookback_ns: how far before the period a handover's predecessor is looked for.

    Raises:
        ValueError: an empty or inverted period.
    """
    if period_to_ns <= period_from_ns:
        raise ValueError(f"empty period [{period_from_ns}, {period_to_ns})")
    now = _now_ns() if now_ns is None else now_ns
    params = {"period_from": period_from_ns, "period_to": period_to_ns, "open_end": OPEN_END_NS,
              "lookback_from": period_from_ns - handover_lookback_ns, "cluster": cluster}
    conn = session.connection()
    conn.execute(text(f"DROP TABLE IF EXISTS {_TEMP}"))
    conn.execute(text(_CREATE))
    try:
        conn.execute(text(_FILL.format(cluster_filter="AND e.cluster = :cluster" if cluster else "")), params)
        conn.execute(text(f"CREATE INDEX ix_{_TEMP}_gpu_from ON {_TEMP} (gpu_key, from_ns)"))
        conn.execute(text(f"CREATE INDEX ix_{_TEMP}_gpu_to ON {_TEMP} (gpu_key, to_ns)"))
        clip = _Clipper(period_from_ns, period_to_ns)
        by_id: dict[int, dict[str, Any]] = {}
        allocations = []
        for row in conn.execute(text(_SELECT_INTERVALS)):
            fact = _allocation(row, clip)
            by_id[fact["id"]] = fact
            if row.in_period:
                allocations.append(fact)
        overlaps = [
            {"physical_gpu_uuid": by_id[a]["physical_gpu_uuid"] or by_id[b]["physical_gpu_uuid"],
             "same_device": bool(same), "from_ns": clip.start(start), "to_ns": clip.end(end),
             "a": by_id[a], "b": by_id[b]}
            for a, b, start, end, same in conn.execute(text(_OVERLAPS), params)
        ]
        handovers = [
            {"physical_gpu_uuid": by_id[n]["physical_gpu_uuid"] or by_id[p]["physical_gpu_uuid"],
             "released_ns": released, "acquired_ns": acquired, "gap_ns": acquired - released,
             "from": by_id[p], "to": by_id[n]}
            for p, n, released, acquired in conn.execute(text(_HANDOVERS), params)
        ]
        idle = _idle_allocations(conn, params, clip, now)
    finally:
        conn.execute(text(f"DROP TABLE IF EXISTS {_TEMP}"))
    return {
        "period": {"from_ns": period_from_ns, "to_ns": period_to_ns, "cluster": cluster},
        "allocations": allocations,
        "overlaps": overlaps,
        "handovers": handovers,
        "idle_allocations": idle,
        "coverage_gaps": _coverage_gaps(conn, params, clip, now, cluster),
        "attribution": _attribution(conn, params, cluster),
    }


class _Clipper:
    """Clips instants to the period; ``OPEN_END_NS`` (still open) becomes the period's end."""

    def __init__(self, start_ns: int, end_ns: int) -> None:
        self.lo, self.hi = start_ns, end_ns

    def start(self, value: int) -> int:
        return min(max(value, self.lo), self.hi)

    def end(self, value: int) -> int:
        return max(min(value, self.hi), self.lo)


def _allocation(row: Any, clip: _Clipper) -> dict[str, Any]:
    in_period = bool(row.in_period)
    return {
        "id": row.id, "episode_id": row.episode_id, "cluster": row.cluster, "claim_uid": row.claim_uid,
        "namespace": row.namespace, "claim": row.claim_name, "request": row.request, "driver": row.driver,
        "pool": row.pool, "device": row.device, "device_class": row.device_class,
        "admin_access": bool(row.admin_access), "share_id": row.share_id, "device_state_id": row.device_state_id,
        "physical_gpu_uuid": row.physical_gpu_uuid, "mig": bool(row.is_mig),
        "allow_multiple_allocations": bool(row.allow_multiple),
        "from_ns": clip.start(row.from_ns) if in_period else row.from_ns,
        "to_ns": clip.end(row.to_ns) if in_period else row.to_ns,
    }


def _idle_allocations(conn: Any, params: dict[str, Any], clip: _Clipper, now_ns: int) -> list[dict[str, Any]]:
    out = []
    horizon = min(clip.hi, now_ns)
    for episode_id, cluster, claim_uid, namespace, claim, start, end in conn.execute(text(_IDLE), params):
        real_end = None if end >= OPEN_END_NS else end
        measured_end = min(end, horizon)
        if measured_end <= start:
            continue
        out.append({"episode_id": episode_id, "cluster": cluster, "claim_uid": claim_uid, "namespace": namespace,
                    "claim": claim, "idle_from_ns": start, "idle_to_ns": real_end, "duration_ns": measured_end - start,
                    "from_ns": clip.start(start), "to_ns": clip.end(measured_end)})
    return out


def _coverage_gaps(conn: Any, params: dict[str, Any], clip: _Clipper, now_ns: int, cluster: str | None) -> list[dict[str, Any]]:
    gaps = []
    cluster_filter = "AND cluster = :cluster" if cluster else ""
    for gap_id, gap_cluster, kind, started, ended, reason in conn.execute(
            text(_CLOSED_GAPS.format(cluster_filter=cluster_filter)), params):
        gaps.append({"id": gap_id, "cluster": gap_cluster, "kind": kind, "started_ns": started, "ended_ns": ended,
                     "open": False, "duration_ns": ended - started, "from_ns": clip.start(started),
                     "to_ns": clip.end(ended), "reason": reason})
    horizon = min(clip.hi, now_ns)
    for gap_cluster, kind, started, reason in conn.execute(text(_OPEN_GAPS.format(cluster_filter=cluster_filter)), params):
        if horizon <= max(started, clip.lo):
            continue
        gaps.append({"id": None, "cluster": gap_cluster, "kind": kind, "started_ns": started, "ended_ns": None,
                     "open": True, "duration_ns": horizon - started, "from_ns": clip.start(started),
                     "to_ns": clip.end(horizon), "reason": reason})
    return gaps


def _attribution(conn: Any, params: dict[str, Any], cluster: str | None) -> dict[str, Any]:
    cluster_filter = "AND (r.cluster = :cluster OR r.cluster IS NULL)" if cluster else ""
    counts = {"exact": 0, "ambiguous": 0, "unattributed": 0, "pending": 0}
    for status, n in conn.execute(text(_ATTRIBUTION_COUNTS.format(cluster_filter=cluster_filter)), params):
        counts[status] = counts.get(status, 0) + n
    records = [
        {"record_id": rid, "transaction_id": txn, "event_time_ns": t, "reason": reason,
         "pod_namespace": pod_ns, "pod_name": pod_name}
        for rid, txn, t, reason, pod_ns, pod_name in conn.execute(
            text(_UNATTRIBUTED.format(cluster_filter=cluster_filter)), params)
    ]
    return {"records": sum(counts.values()), **counts, "unattributed_records": records}
