"""Policy input facts, computed in SQL from the projection tables for a period ``[from, to)``.

The Rego never joins raw rows pairwise: overlaps, handovers, idle stretches, coverage gaps and
attribution counts are set-based SQL here, and the policies decide on these compact facts.
Namespace → tenant mapping is the bundle's job (``data.draudit.params.tenants``), so facts carry
namespaces; because a namespace has exactly one tenant, pairs and handovers inside one namespace
are dropped here unless they matter for another reason (same device).

Every time is integer nanoseconds since the epoch (UTC). ``from_ns``/``to_ns`` of a fact are
clipped to the period; a handover's predecessor that ended before the period keeps its real bounds.
An allocation still held when evaluated ends at its cluster's *last observation*: now while the
ResourceClaim watch is live, else the moment that watch lost its stream or the collector stopped
(``watch_state``), and never after the period's end. A fact is never stated beyond what was seen:
the scheduler evaluates the current UTC day, whose end is still in the future. An allocation,
overlap or idle stretch of which nothing was observed within the period (the collector stopped
before the period started) is not a fact of the period: facts never carry an empty interval.

The document (``build_facts(...)``)::

    {
      "period": {"from_ns": int, "to_ns": int, "cluster": str | null,
                 "observed_until_ns": {cluster: int}},  # clusters whose ResourceClaim watch is not live
                                        # (stopped or in a gap) before the period end: their last observation
      "allocation_groups": [                # device results of allocations overlapping the period,
        {"namespace", "device_class": str | null,   # grouped by what the per-allocation rules
         "admin_access": bool, "known_device": bool, # decide on
         "allocations": [Member]}],
      "overlaps": [                         # two allocations at once on one physical GPU
        {"physical_gpu_uuid": str | null, "same_device": bool, "from_ns": int, "to_ns": int,
         "a": Side, "b": Side}],            # a started first; never the same claim allocation
      "handovers": [                        # a GPU passing to another namespace's claim
        {"physical_gpu_uuid": str | null, "released_ns": int, "acquired_ns": int, "gap_ns": int,
         "from": Side, "to": Side}],
      "idle_allocations": [                 # stretches of an allocation with no consumer
        {"episode_id", "cluster", "claim_uid", "namespace", "claim", "idle_from_ns",
         "idle_to_ns": int | null (still open), "duration_ns", "from_ns", "to_ns"}],
      "coverage_gaps": [                    # watcher gaps: closed (coverage_intervals) or open (watch_state)
        {"id": int | null, "cluster", "kind", "started_ns", "ended_ns": int | null, "open": bool,
         "duration_ns", "from_ns", "to_ns", "reason",
         "state": "gap" | "stopped"}],      # stopped: the collector was not running (shut down or crashed)
      "attribution": {"records", "exact", "ambiguous", "unattributed", "pending",
                      "unattributed_records": [{"record_id", "transaction_id", "event_time_ns",
                                                "reason", "pod_namespace", "pod_name"}]}
    }

    Member = [id (allocation_results.id), claim, driver, pool, device,
              physical_gpu_uuid | null, from_ns, to_ns]   (known_device false: no ResourceSlice record)
    Side = {"id", "claim_uid", "namespace", "claim", "driver", "pool", "device", "mig": bool,
            "share_id": str | null, "allow_multiple_allocations": bool}

Allocations are the large part of the document (one per device result), so they come grouped by
the attributes the per-allocation rules decide on, each member a short array; the rules decide
once per group and expand members only for groups that break a rule. Pairs and handovers carry
their own small sides. ``iter_allocations(facts)`` gives the members back as objects.

Rules of the facts (sources: dra-api.md §2.3, §5.2, §6.3, §6.5):
- The device of a result is the ``device_states`` row of (cluster, driver, pool, device) valid
  at the allocation's start (of the highest pool generation when several slices publish it, as
  attribution resolves it: ``collector.lineage``), else the first one published during the
  allocation. Its physical
  GPU is ``physical_gpu_uuid`` (a MIG device's ``parent_uuid``); without a record the device
  key ``cluster/driver/pool/device`` stands in, so same-device overlaps are still found. A
  device whose record says it is no GPU (``collector.kube.projections.is_gpu_device``: a NIC
  driver's device, with a ``uuid`` of its own) has no physical GPU (null) and takes part in no
  overlap or handover; its allocations are still in ``allocation_groups``.
- ``adminAccess`` results are monitoring access, not "served by": they take no part in overlaps
  or handovers (the adminAccess rule sees them in ``allocation_groups``).
- Results of one claim allocation (episode) never pair with each other: pods sharing one claim
  (time-slicing, MPS) are one allocation inside one namespace.
- A handover's predecessor is the allocation that released the GPU last before the next one
  started: for a full GPU any earlier allocation on the physical GPU, for a MIG partition its own
  earlier allocations and full-GPU allocations of its parent (two MIG partitions of one GPU are
  separate memory). It is looked for up to ``handover_lookback_ns`` before the period.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from collector.kube.projections import not_gpu_sql
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
    non_gpu INTEGER NOT NULL,
    gpu_key VARCHAR(1100) NOT NULL,
    device_key VARCHAR(1100) NOT NULL,
    from_ns BIGINT NOT NULL,
    to_ns BIGINT NOT NULL,
    in_period INTEGER NOT NULL
)
"""

_CREATE_EPISODES = f"""
CREATE TEMPORARY TABLE {_TEMP}_episodes (
    episode_id BIGINT PRIMARY KEY,
    cluster VARCHAR(253) NOT NULL,
    claim_uid VARCHAR(64) NOT NULL,
    namespace VARCHAR(253) NOT NULL,
    claim_name VARCHAR(253) NOT NULL,
    from_ns BIGINT NOT NULL,
    to_ns BIGINT NOT NULL
)
"""

# A device record that is not a GPU (collector.kube.projections.is_gpu_device, in SQL: not type
# gpu/mig, and a driver whose first DNS label is not "gpu", e.g. a NIC driver's device with a uuid
# of its own, or its SR-IOV virtual function of type vfio): it takes part in no overlap or handover
# (no GPU is shared or handed over).
NOT_GPU = not_gpu_sql("ds.")

# One row per allocation result of an allocation episode overlapping [lookback_from, to), with
# the device record resolved by a correlated lookup on ix_device_states_key.
_FILL = f"""
INSERT INTO {_TEMP}
SELECT b.id, b.episode_id, b.cluster, b.claim_uid, b.namespace, b.claim_name, b.request, b.driver,
       b.pool, b.device, b.device_class, b.admin_access, b.share_id, ds.id,
       COALESCE(ds.physical_gpu_uuid, ds.parent_uuid, ds.uuid),
       CASE WHEN ds.device_type = 'mig' OR ds.parent_uuid IS NOT NULL THEN 1 ELSE 0 END,
       CASE WHEN ds.allow_multiple_allocations THEN 1 ELSE 0 END,
       CASE WHEN ds.id IS NOT NULL AND {NOT_GPU} THEN 1 ELSE 0 END,
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
               ORDER BY ds.pool_generation DESC, ds.valid_from_ns DESC, ds.id DESC LIMIT 1),
             (SELECT ds.id FROM device_states ds
               WHERE ds.cluster = e.cluster AND ds.driver = r.driver AND ds.pool = r.pool AND ds.device = r.device
                 AND ds.valid_from_ns > e.valid_from_ns AND ds.valid_from_ns < COALESCE(e.valid_to_ns, :open_end)
               ORDER BY ds.valid_from_ns, ds.pool_generation DESC, ds.id LIMIT 1)) AS device_state_id
      FROM allocation_results r
      JOIN allocation_episodes e ON e.id = r.episode_id
     WHERE e.valid_from_ns < :period_to
       AND COALESCE(e.valid_to_ns, :open_end) > :lookback_from
       {{cluster_filter}}
) b
LEFT JOIN device_states ds ON ds.id = b.device_state_id
"""

_SELECT_INTERVALS = f"""
SELECT id, episode_id, cluster, claim_uid, namespace, claim_name, driver, pool, device, device_class,
       admin_access, share_id, device_state_id, physical_gpu_uuid, is_mig, allow_multiple, from_ns, to_ns, in_period
  FROM {_TEMP}
"""

# Each unordered pair once. Only an allocation that starts while an earlier one on its GPU still
# runs (running maximum of earlier ends, in start order) can be the later side of a pair, so the
# range join runs for those few candidates only (CROSS JOIN fixes the join order in SQLite).
_OVERLAPS = f"""
WITH ordered AS (
    SELECT id, gpu_key, from_ns,
           MAX(to_ns) OVER (PARTITION BY gpu_key ORDER BY from_ns, id
                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
      FROM {_TEMP} WHERE admin_access = 0 AND non_gpu = 0
), later AS (
    SELECT t.* FROM ordered o JOIN {_TEMP} t ON t.id = o.id WHERE o.prev_end > o.from_ns
)
SELECT a.id, b.id, b.from_ns, CASE WHEN a.to_ns < b.to_ns THEN a.to_ns ELSE b.to_ns END,
       CASE WHEN a.device_key = b.device_key THEN 1 ELSE 0 END
  FROM later b CROSS JOIN {_TEMP} a
 WHERE a.gpu_key = b.gpu_key AND a.from_ns <= b.from_ns AND a.to_ns > b.from_ns
   AND (a.from_ns < b.from_ns OR a.id < b.id)
   AND a.admin_access = 0 AND a.non_gpu = 0 AND a.episode_id <> b.episode_id
   AND (a.device_key = b.device_key OR a.namespace <> b.namespace)
   AND b.from_ns < :period_to AND a.to_ns > :period_from AND b.to_ns > :period_from
 ORDER BY a.id, b.id
"""

# The predecessor of an allocation is the one that ended last before it started. Full GPUs are
# sequenced per physical GPU (every allocation on it, MIG partitions included, can precede); a
# MIG partition is sequenced with its own earlier allocations and the full-GPU allocations of its
# parent. A running maximum of ends finds the release time; usually the previous row is the
# releaser (LAG), otherwise an index lookup by end time names it.
_HANDOVERS = f"""
WITH lanes AS (
    SELECT t.gpu_key AS lane, t.id, t.from_ns, t.to_ns, t.namespace, t.is_mig, 1 AS gpu_lane
      FROM {_TEMP} t WHERE t.admin_access = 0 AND t.non_gpu = 0
    UNION ALL
    SELECT t.device_key, t.id, t.from_ns, t.to_ns, t.namespace, t.is_mig, 0
      FROM {_TEMP} t WHERE t.admin_access = 0 AND t.non_gpu = 0 AND t.is_mig = 1
    UNION ALL
    SELECT m.device_key, t.id, t.from_ns, t.to_ns, t.namespace, t.is_mig, 0
      FROM (SELECT DISTINCT gpu_key, device_key FROM {_TEMP} WHERE is_mig = 1 AND admin_access = 0 AND non_gpu = 0) m
      JOIN {_TEMP} t ON t.gpu_key = m.gpu_key AND t.is_mig = 0 AND t.admin_access = 0 AND t.non_gpu = 0
), seq AS (
    SELECT lane, id, from_ns, namespace, is_mig, gpu_lane,
           MAX(to_ns) OVER w AS released,
           LAG(id) OVER (PARTITION BY lane ORDER BY from_ns, id) AS lag_id,
           LAG(to_ns) OVER (PARTITION BY lane ORDER BY from_ns, id) AS lag_to,
           LAG(namespace) OVER (PARTITION BY lane ORDER BY from_ns, id) AS lag_ns
      FROM lanes
    WINDOW w AS (PARTITION BY lane ORDER BY from_ns, id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
), handed AS (
    SELECT s.id AS to_id, s.released, s.from_ns,
           CASE WHEN s.lag_to = s.released THEN s.lag_id ELSE
             (SELECT p.id FROM lanes p WHERE p.lane = s.lane AND p.to_ns = s.released ORDER BY p.id DESC LIMIT 1)
           END AS from_id
      FROM seq s
     WHERE s.released <= s.from_ns AND s.from_ns >= :period_from AND s.from_ns < :period_to
       AND s.gpu_lane = CASE WHEN s.is_mig = 1 THEN 0 ELSE 1 END
       AND (s.lag_to <> s.released OR s.lag_ns <> s.namespace)
)
SELECT h.from_id, h.to_id, h.released, h.from_ns
  FROM handed h
  JOIN {_TEMP} p ON p.id = h.from_id
  JOIN {_TEMP} n ON n.id = h.to_id
 WHERE p.namespace <> n.namespace
 ORDER BY h.to_id
"""

_EPISODES = f"""
INSERT INTO {_TEMP}_episodes
SELECT episode_id, MIN(cluster), MIN(claim_uid), MIN(namespace), MIN(claim_name), MIN(from_ns), MAX(to_ns)
  FROM {_TEMP} WHERE in_period = 1 GROUP BY episode_id
"""

# Stretches of an allocation episode not covered by any reservedFor consumer: before the first
# consumer (or the whole episode when there is none), after the last, and between consumers
# (a running maximum of earlier consumers' ends finds holes even when consumers overlap).
_IDLE = f"""
WITH cons AS (
    SELECT c.episode_id, c.valid_from_ns AS f, COALESCE(c.valid_to_ns, :open_end) AS t
      FROM {_TEMP}_episodes e JOIN claim_consumers c ON c.episode_id = e.episode_id
), ordered AS (
    SELECT episode_id, f,
           MAX(t) OVER (PARTITION BY episode_id ORDER BY f, t ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
      FROM cons
), bounds AS (
    SELECT episode_id, MIN(f) AS first_f, MAX(t) AS last_t FROM cons GROUP BY episode_id
), stretches AS (
    SELECT e.episode_id, e.from_ns AS s, COALESCE(b.first_f, e.to_ns) AS en
      FROM {_TEMP}_episodes e LEFT JOIN bounds b ON b.episode_id = e.episode_id
    UNION ALL
    SELECT e.episode_id, b.last_t, e.to_ns FROM {_TEMP}_episodes e JOIN bounds b ON b.episode_id = e.episode_id
    UNION ALL
    SELECT episode_id, prev_end, f FROM ordered WHERE prev_end IS NOT NULL
)
SELECT s.episode_id, e.cluster, e.claim_uid, e.namespace, e.claim_name, s.s, s.en
  FROM stretches s JOIN {_TEMP}_episodes e ON e.episode_id = s.episode_id
 WHERE s.en > s.s AND s.s < :period_to AND s.en > :period_from
 ORDER BY s.episode_id, s.s
"""

_CLOSED_GAPS = """
SELECT id, cluster, kind, started_ns, ended_ns, reason, state FROM coverage_intervals
 WHERE state IN ('gap', 'stopped') AND started_ns < :period_to AND ended_ns > :period_from {cluster_filter}
 ORDER BY cluster, kind, started_ns, id
"""

# An open gap (410 Gone, relist pending) or a collector that stopped and has not come back:
# either way nothing is being observed now (DORA RTS Art. 23: alert on incomplete collection).
_OPEN_GAPS = """
SELECT cluster, kind, state_since_ns,
       COALESCE(state_reason, CASE WHEN state = 'stopped' THEN 'collector stopped: not watching' END), state
  FROM watch_state
 WHERE state IN ('gap', 'stopped') AND state_since_ns < :period_to {cluster_filter}
 ORDER BY cluster, kind
"""

# Where each cluster's allocation knowledge ends: the ResourceClaim watch lost its stream (gap) or
# the collector stopped. A cluster absent here is being observed now.
_CLAIMS_UNOBSERVED_SINCE = """
SELECT cluster, MIN(state_since_ns) FROM watch_state
 WHERE kind = 'ResourceClaim' AND state IN ('gap', 'stopped') AND state_since_ns < :period_to {cluster_filter}
 GROUP BY cluster
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
    _drop(conn)
    conn.execute(text(_CREATE))
    conn.execute(text(_CREATE_EPISODES))
    try:
        conn.execute(text(_FILL.format(cluster_filter="AND e.cluster = :cluster" if cluster else "")), params)
        conn.execute(text(f"CREATE INDEX ix_{_TEMP}_gpu_from ON {_TEMP} (gpu_key, from_ns)"))
        conn.execute(text(_EPISODES))
        unobserved = dict(conn.execute(text(_CLAIMS_UNOBSERVED_SINCE.format(
            cluster_filter="AND cluster = :cluster" if cluster else "")), params).all())
        clip = _Clipper(period_from_ns, period_to_ns, now, unobserved)
        groups: dict[tuple[Any, ...], dict[str, Any]] = {}
        rows: dict[int, tuple[Any, ...]] = {}
        for row in conn.execute(text(_SELECT_INTERVALS)).all():
            (rid, _episode, row_cluster, _uid, namespace, claim, driver, pool, device, device_class, admin, _share,
             state_id, gpu, _mig, _multiple, start, end, in_period) = row
            rows[rid] = tuple(row)
            observed = clip.observed(start, end, row_cluster)
            if in_period and observed:
                key = (namespace, device_class, bool(admin), state_id is not None)
                group = groups.get(key)
                if group is None:
                    group = groups[key] = {"namespace": namespace, "device_class": device_class, "admin_access": key[2],
                                           "known_device": key[3], "allocations": []}
                group["allocations"].append([rid, claim, driver, pool, device, gpu, *observed])
        allocation_groups = [groups[k] for k in sorted(groups, key=lambda k: tuple("" if v is None else str(v) for v in k))]
        for group in allocation_groups:
            group["allocations"].sort()
        sides: dict[int, dict[str, Any]] = {}

        def side(allocation_id: int) -> dict[str, Any]:
            if allocation_id not in sides:
                sides[allocation_id] = _side(rows[allocation_id])
            return sides[allocation_id]

        overlaps = [
            {"physical_gpu_uuid": rows[a][_GPU] or rows[b][_GPU],
             "same_device": bool(same), "from_ns": seen[0], "to_ns": seen[1], "a": side(a), "b": side(b)}
            for a, b, start, end, same in conn.execute(text(_OVERLAPS), params).all()
            if (seen := clip.observed(start, end, rows[b][2])) is not None
        ]
        handovers = [
            {"physical_gpu_uuid": rows[n][_GPU] or rows[p][_GPU],
             "released_ns": released, "acquired_ns": acquired, "gap_ns": acquired - released,
             "from": side(p), "to": side(n)}
            for p, n, released, acquired in conn.execute(text(_HANDOVERS), params).all()
        ]
        idle = _idle_allocations(conn, params, clip)
    finally:
        _drop(conn)
    return {
        "period": {"from_ns": period_from_ns, "to_ns": period_to_ns, "cluster": cluster,
                   "observed_until_ns": dict(sorted(unobserved.items()))},
        "allocation_groups": allocation_groups,
        "overlaps": overlaps,
        "handovers": handovers,
        "idle_allocations": idle,
        "coverage_gaps": _coverage_gaps(conn, params, clip, now, cluster),
        "attribution": _attribution(conn, params, cluster),
    }


class _Clipper:
    """Clips instants to the period ``[lo, hi)``; ``OPEN_END_NS`` (still open) becomes the last
    observation of the row's cluster: ``unobserved_since[cluster]`` when its ResourceClaim watch is
    not live, else ``now_ns`` — in both cases at most the period's end."""

    def __init__(self, start_ns: int, end_ns: int, now_ns: int | None = None,
                 unobserved_since: dict[str, int] | None = None) -> None:
        self.lo, self.hi = start_ns, end_ns
        self.now = end_ns if now_ns is None else now_ns
        self.unobserved_since = unobserved_since or {}

    def start(self, value: int) -> int:
        return min(max(value, self.lo), self.hi)

    def horizon(self, cluster: str | None) -> int:
        """The last instant allocations of ``cluster`` were observed, within the period."""
        return min(self.hi, self.now, self.unobserved_since.get(cluster, self.now))

    def end(self, value: int, cluster: str | None = None) -> int:
        if value >= OPEN_END_NS:
            value = self.horizon(cluster)
        return max(min(value, self.hi), self.lo)

    def observed(self, start_ns: int, end_ns: int, cluster: str | None) -> tuple[int, int] | None:
        """``(from_ns, to_ns)`` of what was observed of ``[start_ns, end_ns)`` (``OPEN_END_NS``: still
        open) within the period, or None when nothing of it was: it lies outside the period, or it
        was still open and the cluster's last observation (``horizon``) is at or before the period
        start or before its own start. A fact is never the empty interval ``[t, t]``: a period after
        the collector stopped holds no allocation (nobody observed one then), not allocations of
        length zero at its start (newcomer finding: "held GPU … from 08:48:00Z to 08:48:00Z (0 s)")."""
        lo, hi = self.start(start_ns), self.end(end_ns, cluster)
        return (lo, hi) if hi > lo else None


def _drop(conn: Any) -> None:
    conn.execute(text(f"DROP TABLE IF EXISTS {_TEMP}_episodes"))
    conn.execute(text(f"DROP TABLE IF EXISTS {_TEMP}"))


_GPU = 13  # index of physical_gpu_uuid in a _SELECT_INTERVALS row


def _side(row: tuple[Any, ...]) -> dict[str, Any]:
    rid, _episode, _cluster, uid, namespace, claim, driver, pool, device, _class, _admin, share, _state, _gpu, mig, multiple = row[:16]
    return {"id": rid, "claim_uid": uid, "namespace": namespace, "claim": claim, "driver": driver, "pool": pool,
            "device": device, "mig": bool(mig), "share_id": share, "allow_multiple_allocations": bool(multiple)}


def iter_allocations(facts: dict[str, Any]):
    """Every allocation of ``facts["allocation_groups"]`` as an object (group fields + member fields)."""
    for g in facts["allocation_groups"]:
        for rid, claim, driver, pool, device, gpu, start, end in g["allocations"]:
            yield {"id": rid, "namespace": g["namespace"], "device_class": g["device_class"],
                   "admin_access": g["admin_access"], "known_device": g["known_device"], "claim": claim,
                   "driver": driver, "pool": pool, "device": device, "physical_gpu_uuid": gpu,
                   "from_ns": start, "to_ns": end}


def _idle_allocations(conn: Any, params: dict[str, Any], clip: _Clipper) -> list[dict[str, Any]]:
    out = []
    for episode_id, cluster, claim_uid, namespace, claim, start, end in conn.execute(text(_IDLE), params):
        real_end = None if end >= OPEN_END_NS else end
        measured_end = min(end, clip.horizon(cluster))
        if measured_end <= start or clip.end(measured_end) <= clip.start(start):
            continue  # not observed idle within the period (e.g. the collector stopped before it)
        out.append({"episode_id": episode_id, "cluster": cluster, "claim_uid": claim_uid, "namespace": namespace,
                    "claim": claim, "idle_from_ns": start, "idle_to_ns": real_end, "duration_ns": measured_end - start,
                    "from_ns": clip.start(start), "to_ns": clip.end(measured_end)})
    return out


def _coverage_gaps(conn: Any, params: dict[str, Any], clip: _Clipper, now_ns: int, cluster: str | None) -> list[dict[str, Any]]:
    gaps = []
    cluster_filter = "AND cluster = :cluster" if cluster else ""
    for gap_id, gap_cluster, kind, started, ended, reason, state in conn.execute(
            text(_CLOSED_GAPS.format(cluster_filter=cluster_filter)), params):
        gaps.append({"id": gap_id, "cluster": gap_cluster, "kind": kind, "started_ns": started, "ended_ns": ended,
                     "open": False, "duration_ns": ended - started, "from_ns": clip.start(started),
                     "to_ns": clip.end(ended), "reason": reason, "state": state})
    horizon = min(clip.hi, now_ns)
    for gap_cluster, kind, started, reason, state in conn.execute(text(_OPEN_GAPS.format(cluster_filter=cluster_filter)),
                                                                   params):
        if horizon <= max(started, clip.lo):
            continue
        gaps.append({"id": None, "cluster": gap_cluster, "kind": kind, "started_ns": started, "ended_ns": None,
                     "open": True, "duration_ns": horizon - started, "from_ns": clip.start(started),
                     "to_ns": clip.end(horizon), "reason": reason, "state": state})
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
