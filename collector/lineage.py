"""Attribution: transaction → pod → claim → request → device → physical GPU, as set-based SQL.

One ``INSERT INTO lineage ... SELECT`` (portable SQLAlchemy Core, CTEs, no Python loop over rows)
attributes every inference record that has no lineage row yet (or all of them after a history
correction). Per record at ``t = event_time_ns`` (design.md "Attribution", dra-api.md §5.2):

1. **coverage** — ``t`` must lie in a *synced* coverage interval of ``Pod``, ``ResourceClaim`` and
   ``ResourceSlice`` (a closed ``coverage_intervals`` row ``[started_ns, ended_ns)`` or the open
   ``watch_state`` interval since ``state_since_ns``). Otherwise the record is ``unattributed`` /
   ``coverage-gap``: a gap, or a time before the watcher ever synced, is not evidence.
2. **pod** — by ``pod_uid``; else namespace + name → the ``pod_states`` row valid at ``t``
   (several uids → ``ambiguous`` / ``several-pods``; none → ``no-pod``). A given uid whose pod has
   ``pod_states`` rows, none valid at ``t``, is ``no-pod``; a uid never projected is kept (only pods
   that reference claims are projected, so the chain then ends in ``no-claim``).
3. **claims and requests** — the containers whose claims count: the logging container if it has
   ``pod_container_claims`` rows; else the container pinned by ``serving_containers``; else every
   container of the pod (the sidecar pattern: ``risk-api`` logs, ``triton-sidecar`` holds the GPU).
   Their pod claim names → ``pod_claim_refs`` valid at ``t`` (a NULL ``claim_name`` means "no claim
   needed") → none: ``no-claim``.
4. **allocation** — the ``allocation_episodes`` of (claim namespace, claim name) valid at ``t`` that
   reserved this pod (``claim_consumers``: a pod runs only once it is in ``status.reservedFor``,
   dra-api.md §5.2), where the reservation is valid at ``t`` or the pod owns the claim (template
   claim: its reservation may be observed a moment after the log's clock says); then the episode's
   ``allocation_results`` passing the kubelet's request filter
   ``ref.request == "" or r.request == ref.request or r.request.split("/")[0] == ref.request``;
   ``adminAccess`` results are monitoring access, never "served by". None: ``no-allocation``.
5. **device** — ``device_states`` of (cluster, driver, pool, device) valid at ``t`` (the highest
   pool generation when several slices publish it); the physical GPU is ``physical_gpu_uuid``
   (falling back to ``parent_uuid`` then ``uuid``: a MIG device's parent, dra-api.md §6.3).
   No device record with a GPU identity: ``no-device-record``.
6. **status** — ``exact`` when exactly one physical GPU results, every served result has a device
   record and no transition used (pod state, claim ref, episode, consumer and device-state interval
   bounds) lies within ``clock_skew_s`` of the record's time interval ``[t, t + precision)``
   (log-formats.md §5.4); otherwise ``ambiguous`` with ``several-devices`` or ``skew-window``.

Lineage columns filled per status: ``pod_uid``/``node_name`` whenever one pod resolved; the device
columns (driver/pool/device, device uuid, state id) only when exactly one device of the GPU served;
claim columns only when exactly one claim served; ``physical_gpu_uuid``/product/profile whenever a
single GPU resulted (also for ``skew-window``, where it is the candidate, not a verdict).
``candidates`` counts the distinct GPUs plus the results without a device record (the pods, for
``several-pods``). Rows inside a coverage gap carry only the record's own pod uid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    case,
    delete,
    distinct,
    exists,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.orm import Session

from collector.errors import UserError
from collector.store.models import (
    AllocationEpisode,
    AllocationResult,
    ClaimConsumer,
    CoverageInterval,
    DeviceState,
    InferenceRecord,
    Lineage,
    PodClaimRef,
    PodContainerClaim,
    PodState,
    UTCDateTime,
    WatchState,
)
from collector.timeutil import NS_PER_S, ns_to_rfc3339

STATUSES = ("exact", "ambiguous", "unattributed")
COVERAGE_KINDS = ("Pod", "ResourceClaim", "ResourceSlice")
DEFAULT_CLUSTER = "default"

R = InferenceRecord.__table__
L = Lineage.__table__
PS = PodState.__table__
PCR = PodClaimRef.__table__
PCC = PodContainerClaim.__table__
AE = AllocationEpisode.__table__
AR = AllocationResult.__table__
CC = ClaimConsumer.__table__
DS = DeviceState.__table__
CI = CoverageInterval.__table__
WS = WatchState.__table__

LINEAGE_COLUMNS = (
    "record_id", "status", "reason", "candidates", "pod_uid", "node_name", "claim_uid", "claim_namespace",
    "claim_name", "request", "episode_id", "driver", "pool", "device", "device_state_id", "device_uuid",
    "physical_gpu_uuid", "product_name", "mig_profile", "attributed_at",
)


# --------------------------------------------------------------------------------------------
# Small SQL building blocks
# --------------------------------------------------------------------------------------------


def _valid_at(table: Any, t: ColumnElement) -> ColumnElement[bool]:
    """``t`` in ``[valid_from_ns, valid_to_ns)`` (NULL ``valid_to_ns`` = still valid)."""
    return and_(table.c.valid_from_ns <= t, or_(table.c.valid_to_ns.is_(None), t < table.c.valid_to_ns))


def _near(bounds: Sequence[ColumnElement], lo: ColumnElement, hi: ColumnElement) -> ColumnElement[int]:
    """1 when any non-NULL bound lies in ``[lo, hi]``, else 0 (for MAX() aggregation)."""
    return case((or_(*[and_(b.is_not(None), b >= lo, b <= hi) for b in bounds]), 1), else_=0)


def _only(value: ColumnElement) -> ColumnElement:
    """Aggregate: the value if the group has exactly one distinct non-NULL value, else NULL.

    MIN = MAX instead of COUNT(DISTINCT) = 1: same result, no per-group sort.
    """
    return case((func.min(value) == func.max(value), func.min(value)), else_=null())


def _pins_cte(serving_containers: Mapping[str, str]):
    """The ``serving_containers`` map as rows (namespace, prefix, container); validates the keys."""
    rows = []
    for key, container in sorted(serving_containers.items()):
        ns, sep, prefix = key.partition("/")
        if not sep or not ns or not prefix or not container:
            raise UserError(
                f"serving container {key!r}={container!r}: use NAMESPACE/WORKLOAD=CONTAINER, "
                "e.g. payments/risk-api=triton-sidecar"
            )
        rows.append(select(literal(ns).label("ns"), literal(prefix).label("prefix"), literal(container).label("container")))
    return (union_all(*rows) if len(rows) > 1 else rows[0]).cte("pins")


# --------------------------------------------------------------------------------------------
# The attribution query
# --------------------------------------------------------------------------------------------


def lineage_select(
    *,
    all: bool = False,
    clock_skew_s: float = 2.0,
    serving_containers: Mapping[str, str] | None = None,
    cluster: str = DEFAULT_CLUSTER,
    record_ids: Sequence[int] | None = None,
    attributed_at: datetime | None = None,
) -> Select:
    """The SELECT producing one ``lineage`` row per inference record (columns ``LINEAGE_COLUMNS``).

    Args:
        all: include records that already have a lineage row (default: only those without).
        clock_skew_s: tolerance in seconds around every interval bound used (node ↔ API server
            clock skew plus API seconds truncation, log-formats.md §5.4).
        serving_containers: ``"namespace/workload-or-pod-prefix" → container``: which container's
            claims count when the logging container holds none. The part after ``/`` matches a pod
            name exactly or as a prefix followed by ``-`` (``payments/risk-api`` matches pod
            ``risk-api-7d9f8c-x2x9z``); the longest matching key wins.
        cluster: the cluster of records whose ``cluster`` is NULL (``DRAUDIT_CLUSTER``).
        record_ids: restrict to these ``inference_records.id`` values.
        attributed_at: the aware UTC time written to ``attributed_at`` (default: now).

    Raises:
        UserError: negative ``clock_skew_s`` or a malformed ``serving_containers`` key.
    """
    if clock_skew_s < 0:
        raise UserError(f"clock skew {clock_skew_s} s: must be a non-negative number of seconds (--clock-skew-s)")
    skew_ns = int(round(clock_skew_s * NS_PER_S))
    attributed_at = attributed_at or datetime.now(timezone.utc)

    # rec: the records to attribute, their effective cluster and whether t is outside coverage.
    rec_cluster = func.coalesce(R.c.cluster, literal(cluster))
    uncovered = []
    for kind in COVERAGE_KINDS:
        closed = exists().where(CI.c.cluster == rec_cluster, CI.c.kind == kind, CI.c.state == "synced",
                                CI.c.started_ns <= R.c.event_time_ns, R.c.event_time_ns < CI.c.ended_ns)
        open_ = exists().where(WS.c.cluster == rec_cluster, WS.c.kind == kind, WS.c.state == "synced",
                               WS.c.state_since_ns <= R.c.event_time_ns)
        uncovered.append(and_(~closed, ~open_))
    rec_q = select(
        R.c.id.label("rec_id"),
        R.c.event_time_ns.label("t"),
        # the record's own time interval [t, t + precision), widened by the skew tolerance
        (R.c.event_time_ns - skew_ns).label("lo"),
        (R.c.event_time_ns + func.coalesce(R.c.event_time_precision_ns, 1) + skew_ns).label("hi"),
        rec_cluster.label("cluster"),
        R.c.pod_uid, R.c.pod_namespace, R.c.pod_name, R.c.container_name,
        case((or_(*uncovered), 1), else_=0).label("in_gap"),
    )
    if not all:
        rec_q = rec_q.where(~exists().where(L.c.record_id == R.c.id))
    if record_ids is not None:
        rec_q = rec_q.where(R.c.id.in_(list(record_ids)))
    rec = rec_q.cte("rec")

    # podcand: candidate pods (by uid, or by namespace/name valid at t), outside coverage gaps.
    ps_any = PS.alias("ps_any")
    by_uid = select(
        rec.c.rec_id, rec.c.pod_uid.label("pod_uid"), PS.c.namespace, PS.c.name, PS.c.node_name,
        PS.c.valid_from_ns, PS.c.valid_to_ns, rec.c.lo, rec.c.hi,
    ).select_from(
        rec.outerjoin(PS, and_(PS.c.cluster == rec.c.cluster, PS.c.pod_uid == rec.c.pod_uid, _valid_at(PS, rec.c.t)))
    ).where(
        rec.c.in_gap == 0, rec.c.pod_uid.is_not(None),
        or_(PS.c.id.is_not(None),
            ~exists().where(ps_any.c.cluster == rec.c.cluster, ps_any.c.pod_uid == rec.c.pod_uid)),
    )
    by_name = select(
        rec.c.rec_id, PS.c.pod_uid, PS.c.namespace, PS.c.name, PS.c.node_name,
        PS.c.valid_from_ns, PS.c.valid_to_ns, rec.c.lo, rec.c.hi,
    ).select_from(
        rec.join(PS, and_(PS.c.cluster == rec.c.cluster, PS.c.namespace == rec.c.pod_namespace,
                          PS.c.name == rec.c.pod_name, _valid_at(PS, rec.c.t)))
    ).where(rec.c.in_gap == 0, rec.c.pod_uid.is_(None))
    podcand = union_all(by_uid, by_name).cte("podcand")

    podagg = select(
        podcand.c.rec_id,
        # 1 = one pod; 2 = several (counted only when reported, below)
        case((func.min(podcand.c.pod_uid) == func.max(podcand.c.pod_uid), 1), else_=2).label("n_pods"),
        func.min(podcand.c.pod_uid).label("pod_uid"),
        func.min(podcand.c.namespace).label("namespace"),
        func.min(podcand.c.name).label("name"),
        func.min(podcand.c.node_name).label("node_name"),
        func.max(_near([podcand.c.valid_from_ns, podcand.c.valid_to_ns], podcand.c.lo, podcand.c.hi)).label("near"),
    ).group_by(podcand.c.rec_id).cte("podagg")

    # podone: records whose pod resolved to exactly one uid.
    pod_ns = func.coalesce(podagg.c.namespace, rec.c.pod_namespace)
    pod_name = func.coalesce(podagg.c.name, rec.c.pod_name)
    own = exists().where(PCC.c.cluster == rec.c.cluster, PCC.c.pod_uid == podagg.c.pod_uid,
                         PCC.c.container_name == rec.c.container_name)
    if serving_containers:
        pins = _pins_cte(serving_containers)
        matches = and_(pins.c.ns == pod_ns,
                       or_(pod_name == pins.c.prefix,
                           func.substr(pod_name, 1, func.length(pins.c.prefix) + 1) == pins.c.prefix + "-"))
        pin_container = (select(pins.c.container).where(matches)
                         .order_by(func.length(pins.c.prefix).desc(), pins.c.prefix).limit(1)
                         .correlate(rec, podagg).scalar_subquery())
        pinned_has_claims = exists().where(PCC.c.cluster == rec.c.cluster, PCC.c.pod_uid == podagg.c.pod_uid,
                                           PCC.c.container_name == pin_container)
        sel_container = case((own, rec.c.container_name), (pinned_has_claims, pin_container), else_=null())
    else:
        sel_container = case((own, rec.c.container_name), else_=null())
    podone = select(
        rec.c.rec_id, rec.c.t, rec.c.lo, rec.c.hi, rec.c.cluster, podagg.c.pod_uid,
        sel_container.label("sel_container"),
    ).select_from(rec.join(podagg, podagg.c.rec_id == rec.c.rec_id)).where(podagg.c.n_pods == 1).cte("podone")

    # claimreq: (record, claim valid at t, request) for the selected containers' claim references.
    claimreq = select(
        podone.c.rec_id, podone.c.t, podone.c.lo, podone.c.hi, podone.c.cluster, podone.c.pod_uid,
        PCR.c.namespace.label("claim_namespace"), PCR.c.claim_name, PCC.c.request.label("ref_request"),
        PCR.c.valid_from_ns.label("ref_from"), PCR.c.valid_to_ns.label("ref_to"),
    ).select_from(
        podone.join(PCC, and_(PCC.c.cluster == podone.c.cluster, PCC.c.pod_uid == podone.c.pod_uid,
                              or_(podone.c.sel_container.is_(None), PCC.c.container_name == podone.c.sel_container)))
        .join(PCR, and_(PCR.c.cluster == podone.c.cluster, PCR.c.pod_uid == podone.c.pod_uid,
                        PCR.c.pod_claim_name == PCC.c.pod_claim_name, PCR.c.claim_name.is_not(None),
                        _valid_at(PCR, podone.c.t)))
    ).distinct().cte("claimreq")

    # The allocation chain, left-joined so that the counts show where it breaks.
    ds_newer = DS.alias("ds_newer")
    newer_generation = exists().where(
        ds_newer.c.cluster == DS.c.cluster, ds_newer.c.driver == DS.c.driver, ds_newer.c.pool == DS.c.pool,
        ds_newer.c.device == DS.c.device, _valid_at(ds_newer, claimreq.c.t),
        ds_newer.c.pool_generation > DS.c.pool_generation,
    )
    base = AR.c.request
    ref = claimreq.c.ref_request
    request_matches = or_(ref == "", base == ref, func.substr(base, 1, func.length(ref) + 1) == ref + "/")
    chain = (
        claimreq
        # The pod's reservedFor entries (any time) lead to its episodes by primary key; an episode
        # counts if the pod is reserved at t, or owns the claim (template claim, reservation
        # observed earlier or later than the log's clock says).
        .outerjoin(CC, and_(CC.c.cluster == claimreq.c.cluster, CC.c.consumer_uid == claimreq.c.pod_uid))
        .outerjoin(AE, and_(AE.c.id == CC.c.episode_id, AE.c.claim_namespace == claimreq.c.claim_namespace,
                            AE.c.claim_name == claimreq.c.claim_name, _valid_at(AE, claimreq.c.t),
                            or_(_valid_at(CC, claimreq.c.t), AE.c.owner_pod_uid == claimreq.c.pod_uid)))
        .outerjoin(AR, and_(AR.c.episode_id == AE.c.id, AR.c.admin_access == False, request_matches))  # noqa: E712
        .outerjoin(DS, and_(DS.c.cluster == claimreq.c.cluster, DS.c.driver == AR.c.driver, DS.c.pool == AR.c.pool,
                            DS.c.device == AR.c.device, _valid_at(DS, claimreq.c.t), ~newer_generation))
    )
    gpu = func.coalesce(DS.c.physical_gpu_uuid, DS.c.parent_uuid, DS.c.uuid)
    is_gpu = gpu.is_not(None)
    # results that may have served the transaction: GPUs and results without a device record
    served = and_(AR.c.id.is_not(None), or_(is_gpu, DS.c.id.is_(None)))
    bounds = [claimreq.c.ref_from, claimreq.c.ref_to, AE.c.valid_from_ns, AE.c.valid_to_ns,
              case((AE.c.id.is_not(None), CC.c.valid_from_ns)), case((AE.c.id.is_not(None), CC.c.valid_to_ns)),
              DS.c.valid_from_ns, DS.c.valid_to_ns]

    def gpu_only(col: ColumnElement) -> ColumnElement:
        return case((is_gpu, col))

    def served_only(col: ColumnElement) -> ColumnElement:
        return case((served, col))

    # paths: one row per (record, claim reference, reservation, result, device state).
    paths = select(
        claimreq.c.rec_id,
        AR.c.id.label("result_id"),
        served_only(gpu).label("gpu"),
        served_only(case((DS.c.id.is_(None), AR.c.id))).label("unresolved_id"),
        _near(bounds, claimreq.c.lo, claimreq.c.hi).label("near"),
        gpu_only(AR.c.driver + "/" + AR.c.pool + "/" + AR.c.device).label("device_key"),
        gpu_only(AR.c.driver).label("driver"),
        gpu_only(AR.c.pool).label("pool"),
        gpu_only(AR.c.device).label("device"),
        gpu_only(DS.c.uuid).label("device_uuid"),
        gpu_only(DS.c.id).label("device_state_id"),
        gpu_only(DS.c.product_name).label("product_name"),
        gpu_only(DS.c.profile).label("mig_profile"),
        gpu_only(DS.c.node_name).label("device_node"),
        served_only(AR.c.request).label("request"),
        served_only(AE.c.id).label("episode_id"),
        served_only(AE.c.claim_uid).label("claim_uid"),
        served_only(AE.c.claim_namespace).label("claim_namespace"),
        served_only(AE.c.claim_name).label("claim_name"),
    ).select_from(chain).cte("paths")

    # candidates: the distinct GPUs and the served results without a device record, per record.
    cand = select(paths.c.rec_id, paths.c.gpu, paths.c.unresolved_id).where(
        or_(paths.c.gpu.is_not(None), paths.c.unresolved_id.is_not(None))).distinct().subquery("cand")
    candagg = select(cand.c.rec_id, func.count().label("n_candidates"), func.count(cand.c.gpu).label("n_gpus")
                     ).group_by(cand.c.rec_id).cte("candagg")

    one_device = func.min(paths.c.device_key) == func.max(paths.c.device_key)
    pathagg = select(
        paths.c.rec_id,
        func.count(paths.c.result_id).label("n_results"),
        func.max(paths.c.near).label("near"),
        _only(paths.c.gpu).label("physical_gpu_uuid"),
        _only(paths.c.product_name).label("product_name"),
        _only(paths.c.mig_profile).label("mig_profile"),
        _only(paths.c.device_node).label("device_node"),
        *[case((one_device, _only(paths.c[col]))).label(col)
          for col in ("driver", "pool", "device", "device_uuid", "device_state_id")],
        *[_only(paths.c[col]).label(col) for col in ("request", "episode_id", "claim_uid", "claim_namespace", "claim_name")],
    ).group_by(paths.c.rec_id).cte("pathagg")

    # Final decision, in the order of the chain (coverage first: inside a gap nothing is exact).
    n_results = func.coalesce(pathagg.c.n_results, 0)
    n_gpus = func.coalesce(candagg.c.n_gpus, 0)
    n_candidates = func.coalesce(candagg.c.n_candidates, 0)
    near = func.coalesce(podagg.c.near, 0) + func.coalesce(pathagg.c.near, 0) > 0
    decisions: list[tuple[ColumnElement[bool], str, str | None]] = [
        (rec.c.in_gap == 1, "unattributed", "coverage-gap"),
        (podagg.c.rec_id.is_(None), "unattributed", "no-pod"),
        (podagg.c.n_pods > 1, "ambiguous", "several-pods"),
        (pathagg.c.rec_id.is_(None), "unattributed", "no-claim"),
        (n_results == 0, "unattributed", "no-allocation"),
        (n_gpus == 0, "unattributed", "no-device-record"),
        (n_candidates > 1, "ambiguous", "several-devices"),
        (near, "ambiguous", "skew-window"),
    ]
    status = case(*[(cond, literal(s)) for cond, s, _ in decisions], else_=literal("exact"))
    reason = case(*[(cond, literal(r)) for cond, _, r in decisions], else_=null())
    one_pod = podagg.c.n_pods == 1
    n_pods_exact = (select(func.count(distinct(podcand.c.pod_uid))).where(podcand.c.rec_id == rec.c.rec_id)
                    .scalar_subquery())
    single_gpu = and_(one_pod, n_gpus == 1)
    one_claim = and_(one_pod, pathagg.c.claim_uid.is_not(None))
    def with_gpu(col: ColumnElement) -> ColumnElement:
        return case((single_gpu, col), else_=null())

    return select(
        rec.c.rec_id.label("record_id"),
        status.label("status"),
        reason.label("reason"),
        case((podagg.c.n_pods > 1, n_pods_exact), else_=n_candidates).label("candidates"),
        case((one_pod, podagg.c.pod_uid), else_=rec.c.pod_uid).label("pod_uid"),
        case((one_pod, func.coalesce(podagg.c.node_name, pathagg.c.device_node)), else_=null()).label("node_name"),
        case((one_claim, pathagg.c.claim_uid), else_=null()).label("claim_uid"),
        case((one_claim, pathagg.c.claim_namespace), else_=null()).label("claim_namespace"),
        case((one_claim, pathagg.c.claim_name), else_=null()).label("claim_name"),
        case((one_claim, pathagg.c.request), else_=null()).label("request"),
        case((one_claim, pathagg.c.episode_id), else_=null()).label("episode_id"),
        with_gpu(pathagg.c.driver).label("driver"),
        with_gpu(pathagg.c.pool).label("pool"),
        with_gpu(pathagg.c.device).label("device"),
        with_gpu(pathagg.c.device_state_id).label("device_state_id"),
        with_gpu(pathagg.c.device_uuid).label("device_uuid"),
        with_gpu(pathagg.c.physical_gpu_uuid).label("physical_gpu_uuid"),
        with_gpu(pathagg.c.product_name).label("product_name"),
        with_gpu(pathagg.c.mig_profile).label("mig_profile"),
        literal(attributed_at, UTCDateTime()).label("attributed_at"),
    ).select_from(
        rec.outerjoin(podagg, podagg.c.rec_id == rec.c.rec_id).outerjoin(pathagg, pathagg.c.rec_id == rec.c.rec_id)
        .outerjoin(candagg, candagg.c.rec_id == rec.c.rec_id)
    )


@dataclass(frozen=True)
class AttributionSummary:
    """Rows written by one attribution run: counts by status (all three keys) and by reason."""

    by_status: dict[str, int]
    by_reason: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """``{"exact": n, "ambiguous": n, "unattributed": n, "by_reason": {...}}``."""
        return {**self.by_status, "by_reason": dict(self.by_reason)}


def _lineage_counts(session: Session) -> dict[tuple[str, str | None], int]:
    rows = session.execute(select(L.c.status, L.c.reason, func.count()).group_by(L.c.status, L.c.reason))
    return {(s, r): n for s, r, n in rows}


def attribute_run(
    session: Session,
    *,
    all: bool = False,
    clock_skew_s: float = 2.0,
    serving_containers: Mapping[str, str] | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> AttributionSummary:
    """Attribute inference records and write one ``lineage`` row each, in the caller's transaction.

    Incremental by default (records without a lineage row); ``all=True`` deletes every lineage
    row and recomputes (after a history correction). Idempotent: a second run without new records
    writes nothing. Arguments as in ``lineage_select``.

    Returns:
        Counts of the rows written by this run, by status and by reason (exact rows have no reason).

    Raises:
        UserError: bad ``clock_skew_s`` or ``serving_containers``.
    """
    query = lineage_select(all=all, clock_skew_s=clock_skew_s, serving_containers=serving_containers,
                           cluster=cluster)
    if session.get_bind().dialect.name == "postgresql":
        # JIT-compiling this wide query costs about a second and gains nothing at these row counts
        session.execute(text("SET LOCAL jit = off"))
    before = {} if all else _lineage_counts(session)
    if all:
        session.execute(delete(L))
    session.execute(insert(L).from_select(list(LINEAGE_COLUMNS), query))
    after = _lineage_counts(session)
    by_status = {s: 0 for s in STATUSES}
    by_reason: dict[str, int] = {}
    for (status, reason), n in sorted(after.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        written = n - before.get((status, reason), 0)
        if written:
            by_status[status] = by_status.get(status, 0) + written
            if reason:
                by_reason[reason] = by_reason.get(reason, 0) + written
    return AttributionSummary(by_status, by_reason)


def attribute(
    session: Session,
    *,
    all: bool = False,
    clock_skew_s: float = 2.0,
    serving_containers: dict[str, str] | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> dict[str, int]:
    """Attribute inference records to physical GPUs; returns ``{"exact": n, "ambiguous": n, "unattributed": n}``.

    See ``attribute_run`` (same arguments; it also returns counts by reason) and the module
    docstring for the rule (design.md "Attribution", dra-api.md §5.2, §6.3; log-formats.md §5.4).
    The caller commits.
    """
    return attribute_run(session, all=all, clock_skew_s=clock_skew_s, serving_containers=serving_containers,
                         cluster=cluster).by_status


# --------------------------------------------------------------------------------------------
# trace: one transaction's lineage, with the other tenants of its GPU at that instant
# --------------------------------------------------------------------------------------------


def co_tenants(session: Session, *, cluster: str, physical_gpu_uuid: str, t_ns: int,
               exclude_pod_uid: str | None) -> list[dict[str, Any]]:
    """Consumers of any device of ``physical_gpu_uuid`` at ``t_ns`` other than ``exclude_pod_uid``.

    A consumer is a ``reservedFor`` entry (``claim_consumers`` valid at ``t_ns``) of an allocation
    episode valid at ``t_ns`` with a non-adminAccess result on a device whose ``device_states`` row
    valid at ``t_ns`` belongs to the GPU (its own UUID or its MIG parent's).

    Returns:
        ``[{"namespace", "pod", "pod_uid", "claim"}]`` sorted by namespace, pod, claim.
    """
    gpu = func.coalesce(DS.c.physical_gpu_uuid, DS.c.parent_uuid, DS.c.uuid)
    q = (
        select(AE.c.claim_namespace, CC.c.consumer_name, CC.c.consumer_uid, AE.c.claim_name)
        .select_from(
            DS.join(AR, and_(AR.c.driver == DS.c.driver, AR.c.pool == DS.c.pool, AR.c.device == DS.c.device,
                             AR.c.admin_access == False))  # noqa: E712
            .join(AE, and_(AE.c.id == AR.c.episode_id, AE.c.cluster == DS.c.cluster, _valid_at(AE, literal(t_ns))))
            .join(CC, and_(CC.c.episode_id == AE.c.id, _valid_at(CC, literal(t_ns))))
        )
        .where(DS.c.cluster == cluster, gpu == physical_gpu_uuid, _valid_at(DS, literal(t_ns)))
        .distinct()
    )
    if exclude_pod_uid is not None:
        q = q.where(CC.c.consumer_uid != exclude_pod_uid)
    rows = session.execute(q).all()
    return [{"namespace": ns, "pod": pod, "pod_uid": uid, "claim": claim}
            for ns, pod, uid, claim in sorted(rows, key=lambda r: (r[0], r[1], r[3], r[2]))]


def _empty_trace(transaction_id: str) -> dict[str, Any]:
    return {
        "transaction_id": transaction_id, "time": None, "status": "not-found", "reason": None,
        "pod": {"namespace": None, "name": None, "uid": None, "node": None},
        "claim": {"namespace": None, "name": None, "uid": None, "request": None},
        "device": {"driver": None, "pool": None, "device": None},
        "device_uuid": None, "physical_gpu_uuid": None, "product": None, "mig_profile": None, "co_tenants": [],
    }


def trace(session: Session, transaction_ids: Iterable[str], *, cluster: str = DEFAULT_CLUSTER,
          clock_skew_s: float = 2.0, serving_containers: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The lineage of each transaction id, in the order given, as JSON-ready documents.

    Each stored record of the id yields one document (an id stored twice with different content —
    ``conflict`` — yields two). A record not yet attributed is attributed on the fly with the given
    settings (nothing is written). An unknown id yields one document with status ``not-found``.

    Returns:
        ``[{"transaction_id", "time" (RFC 3339 UTC), "status", "reason",
        "pod": {namespace, name, uid, node}, "claim": {namespace, name, uid, request},
        "device": {driver, pool, device}, "device_uuid", "physical_gpu_uuid", "product",
        "mig_profile", "co_tenants": [{namespace, pod, pod_uid, claim}]}]``.
    """
    out: list[dict[str, Any]] = []
    for txn in transaction_ids:
        records = session.execute(
            select(R.c.id, R.c.event_time_ns, R.c.cluster, R.c.pod_uid, R.c.pod_namespace, R.c.pod_name)
            .where(R.c.transaction_id == txn).order_by(R.c.event_time_ns, R.c.id)
        ).all()
        if not records:
            out.append(_empty_trace(txn))
            continue
        ids = [r.id for r in records]
        stored = {row.record_id: row for row in session.execute(select(L).where(L.c.record_id.in_(ids)))}
        missing = [i for i in ids if i not in stored]
        if missing:
            live = lineage_select(all=True, clock_skew_s=clock_skew_s, serving_containers=serving_containers,
                                  cluster=cluster, record_ids=missing)
            stored.update({row.record_id: row for row in session.execute(live)})
        for rec in records:
            out.append(_trace_document(session, txn, rec, stored[rec.id], cluster))
    return out


def _trace_document(session: Session, txn: str, rec: Any, lin: Any, default_cluster: str) -> dict[str, Any]:
    cluster = rec.cluster or default_cluster
    t = rec.event_time_ns
    pod_ns, pod_name = rec.pod_namespace, rec.pod_name
    if lin.pod_uid is not None:
        state = session.execute(
            select(PS.c.namespace, PS.c.name).where(PS.c.cluster == cluster, PS.c.pod_uid == lin.pod_uid)
            .order_by(_valid_at(PS, literal(t)).desc(), PS.c.valid_from_ns.desc()).limit(1)
        ).first()
        if state is not None:
            pod_ns, pod_name = state.namespace, state.name
    doc = _empty_trace(txn)
    doc.update({
        "time": ns_to_rfc3339(t), "status": lin.status, "reason": lin.reason,
        "pod": {"namespace": pod_ns, "name": pod_name, "uid": lin.pod_uid, "node": lin.node_name},
        "claim": {"namespace": lin.claim_namespace, "name": lin.claim_name, "uid": lin.claim_uid,
                  "request": lin.request},
        "device": {"driver": lin.driver, "pool": lin.pool, "device": lin.device},
        "device_uuid": lin.device_uuid, "physical_gpu_uuid": lin.physical_gpu_uuid,
        "product": lin.product_name, "mig_profile": lin.mig_profile,
    })
    if lin.physical_gpu_uuid is not None:
        doc["co_tenants"] = co_tenants(session, cluster=cluster, physical_gpu_uuid=lin.physical_gpu_uuid,
                                       t_ns=t, exclude_pod_uid=lin.pod_uid)
    return doc
