"""Attribution: transaction → pod → claim → request → device → physical GPU, as set-based SQL.

Portable SQLAlchemy Core (CTEs, window functions, temporary tables), no Python loop over rows.
Per record at ``t = event_time_ns`` (design.md "Attribution", dra-api.md §5.2):

0. **identity** — a record with neither a pod uid nor a namespace and name names no pod:
   ``unattributed`` / ``no-pod``, whatever the history.
1. **coverage** — the record's cluster (``cluster``, else the run's default) must have a watch
   history at all (``watch_state`` or ``coverage_intervals`` rows); otherwise ``unattributed`` /
   ``unknown-cluster`` (usually records ingested under another cluster name than the watcher's:
   ``draudit attribute`` names the clusters the store knows). Then ``t`` must lie in a *synced*
   coverage interval of ``Pod``, ``ResourceClaim`` and ``ResourceSlice`` (a closed
   ``coverage_intervals`` row ``[started_ns, ended_ns)`` or the open ``watch_state`` interval since
   ``state_since_ns``). Otherwise the record is ``unattributed`` / ``coverage-gap``: a gap, or a
   time before the watcher ever synced, is not evidence. A covered record within ``clock_skew_s``
   of a gap's edge (``_gap_edges``: where coverage starts or stops, not where two synced intervals
   merely abut) may have happened inside it: step 6 makes it ``skew-window``.
2. **pod** — by ``pod_uid``; else namespace + name → the ``pod_states`` row valid at ``t``
   (several uids → ``ambiguous`` / ``several-pods``; none → ``no-pod``). A given uid whose pod has
   ``pod_states`` rows, none valid at ``t``, or a uid never projected (every pod is projected, but
   an unseen uid may be mistyped, another cluster's, a pod recorded by an earlier release that kept
   only pods with claims, or one whose history was lost), is ``no-pod`` — unless the record's
   namespace and name are those of a pod observed at ``t`` (with another uid, then: a conflict, below).
   A uid whose pod state at ``t`` contradicts the record's own namespace, name or node (each
   compared when the record gives it), a uid with no pod state at ``t`` (unknown, or a pod observed
   at other times: a shipper's stale metadata after a same-name recreate) whose namespace and name
   are a pod observed at ``t``, and a record without a uid whose node contradicts every pod its namespace
   and name resolve to at ``t`` (a line of gpu-node-a is not the same-name pod recreated on
   gpu-node-b), is ``unattributed`` / ``pod-identity-conflict``: the record contradicts itself
   (a uid copied from another pod's line, a shipper's stale metadata cache), so the uid is no
   evidence of which pod logged and the chain stops there. A conflict is decided by pod states
   (the uid's own, those its namespace and name resolve to): when one of their bounds lies within
   ``clock_skew_s`` of ``t`` — a same-name pod recreated, a line of the new pod 50 ms before the
   watcher observed the old one's deletion — it is ``ambiguous`` / ``skew-window`` (step 6), never
   the verdict of one instant. A ``no-pod`` whose
   key (uid, or namespace/name) has a pod state bound within ``clock_skew_s`` of ``t`` — logged just
   before the pod was first observed or just after its last observation — is ``ambiguous`` /
   ``skew-window`` instead (step 6): observation lags creation, so that is no evidence either way.
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
5. **device** — each result's device *as allocated* (dra-api.md §0.2, §9: join at allocation time
   and keep the UUIDs; the slice can change or vanish later): the ``device_states`` row of
   (cluster, driver, pool, device) valid when the episode became valid (its ``valid_from_ns``), or,
   when none was (a slice observed a moment after the claim), the first row of that device after
   it within the episode's lifetime that started within ``clock_skew_s`` of the episode's start
   (or, when the ResourceSlice watch was not synced then, of that watch's first synced instant
   after it: ``_window_to``) — a record first seen later says nothing of the UUID the device had
   when allocated (a slice republished with another UUID seconds or hours later made earlier
   transactions exact on it), so the episode's transactions are then ``no-device-record``, before
   and after that record appeared; the highest pool generation when several slices publish it
   then (``_as_allocated``). Not the row valid at ``t``: a kubelet restart or a driver upgrade
   deletes a node's ResourceSlices while its claims stay allocated and pods keep running, and a
   slice republished with another UUID for the device does not move what was allocated. That row
   gives the physical GPU — ``physical_gpu_uuid``, falling back to ``parent_uuid`` then ``uuid``
   (a MIG device's parent, dra-api.md §6.3) —, product, MIG profile, node and, in ``trace``, the
   co-tenants (the consumers of episodes holding within the tolerance of ``t`` whose device as
   allocated is on that GPU, ``co_tenants``).
   The watcher orders the claim and slice streams only as it received them (watch-semantics.md §9:
   no ordering between watch streams), so the allocation's real instant is known within the
   tolerance only: every record of the device valid at some instant of
   ``[episode start - clock_skew_s, episode start + clock_skew_s]`` (within the episode, and not
   hidden over all of its part of that window by a record of a higher pool generation,
   ``_window_candidate``) is a candidate. An episode first seen within the tolerance after its
   ResourceClaim watch (re)synced — in the first listing after a coverage gap — was allocated at
   an unknown time inside the gap: its window begins where that kind's previous synced coverage
   ended (before any: at the beginning of the history), ``_window_from``. Candidates on the one physical GPU of the record as
   allocated change nothing (its record gives the columns); records of other GPUs make the
   result's candidates several: ``ambiguous`` / ``several-devices`` with ``candidates`` counting
   the GPUs — a slice republished with another UUID 40 ms before or after the claim was ``exact``
   on whichever the watcher ordered first. An instant of the window without any record is no
   candidate of its own: the scheduler allocates from a published slice, so it is a lag or a
   deletion, and the records around it are the candidates; when the record as allocated is none
   (deleted just before the claim's first sighting), a window candidate gives the device.
   No device record with a GPU identity in that window: ``no-device-record`` — also when the
   records say no device of the claim is a GPU (a NIC-only claim: the projection gives a device
   that is not a GPU no identity, ``collector.kube.projections.is_gpu_device``); such a device
   beside a GPU (a claim for a GPU and a NIC) is no candidate, the GPU is the one.
6. **status** — ``exact`` when exactly one physical GPU results, every served result has a device
   record and no transition used (pod state, claim ref, episode and consumer interval bounds,
   coverage gap edges; not a device record's: it is fixed for its episode) lies within ``clock_skew_s`` of an instant the record may mean —
   ``[t, t + precision)`` in whole ns (log-formats.md §5.4), so a transition at ``b`` counts when
   ``t - skew <= b < t + precision + skew`` —; otherwise ``ambiguous`` with ``several-devices`` or
   ``skew-window``. A chain that broke is ``skew-window`` too when the level it broke at has a row
   bound that close (``SKEWABLE_REASONS``): ``no-pod`` (the key's pod states, step 2),
   ``pod-identity-conflict`` (the uid's pod states and those of the record's namespace/name), ``no-claim``
   (the pod's claim references for the containers that count), ``no-allocation`` (the episodes and
   reservations of the pod's claims valid at ``t``), ``no-device-record`` (the episode's bounds, which
   its chain used) — the watcher's observation lags the change, so "none at t" is no evidence then.

Lineage columns filled per status: ``pod_uid``/``node_name`` whenever one pod resolved; the device
columns (driver/pool/device, device uuid, state id) only when exactly one device of the GPU served;
claim columns only when exactly one claim served; ``physical_gpu_uuid``/product/profile whenever a
single GPU resulted (also for ``skew-window``, where it is the candidate, not a verdict).
``candidates`` counts the distinct GPUs plus the results without a device record (the pods, for
``several-pods``). Rows inside a coverage gap, and ``pod-identity-conflict`` rows, carry only the
record's own pod uid.

How a run computes it (``attribute_run``)
-----------------------------------------
The rule above is one query (``_verdicts``) over a set of *points* (a time and a pod key: uid or
namespace/name, plus the logging container). ``lineage_select`` evaluates it with each record as
its own point (``trace`` uses that). A run over many records evaluates it far fewer times: the
answer for a key can only change where an interval bound of a row the chain may read (pod states,
claim refs, reservations, episodes, coverage) lies; a device record is read as allocated, fixed per
episode, so its bounds cut nothing. So per
key of the batch the run cuts the batch's time span ``[min t, max t]`` (which covers the key's
records) at those bounds into *segments*, evaluates the rule once at each segment's start, and
stores the verdict with the nearest bounds the chain used on either side (``near_lo`` ≤ start,
``near_hi`` > start). Each record
then takes its segment's verdict with one interval join; the skew test is made per record
(``near_lo >= t - skew`` or ``near_hi < t + precision + skew``), which equals testing every bound
because no bound lies inside a segment (every bound the test reads is a cut: the missing levels'
rows are rows the chain may read, the gap edges coverage bounds). Both paths share ``_verdicts``; tests hold them equal.

Records are taken in id chunks (``chunk_records``), the per-chunk keys, segments and verdicts
staged in temporary tables (ANALYZEd on PostgreSQL so the planner knows their size).

Late history (``settle_s``): a record may be attributed before the watcher has committed the
history of its time (the log shipper was faster than the watch) and get ``no-pod``, ``no-claim``,
``coverage-gap``... An incremental run therefore also re-evaluates every *non-exact* row whose
event time is later than ``horizon - settle_s``, where a cluster's horizon is the newest instant up
to which the watcher knew its history complete for all three kinds (per kind the latest of the open
interval's start, its last commit or bookmark, and the end of its closed intervals; the minimum
over kinds). Once the horizon has passed ``t + settle_s`` the row is settled and never revisited
(bounded work). A row is re-evaluated with the settings it was computed with (``settings_id``:
tolerance, default cluster, pins), not the run's, and keeps them — the window is for late history,
not another tolerance: a run with a smaller one turned the ``ambiguous`` rows of a wider ``all=True``
run ``exact``, and repeated runs ratcheted toward the smallest tolerance any used.
Only rows whose verdict changed are rewritten (their ``attributed_at`` moves),
so a run without new records or new history writes nothing. ``exact`` rows are not revisited;
a history correction is what ``all=True`` is for. A cluster the watcher never recorded has no
horizon, and its rows are ``unknown-cluster``: a verdict resting on the absence of any history.
Once the cluster has history (``watch_state`` or ``coverage_intervals`` rows) those rows are
re-evaluated by the next run whatever their time (usually into ``coverage-gap``: the first watch
started after them), and rewritten like the others; they then settle by the horizon rule. The
other reasons need no such rule: a ``coverage-gap``, ``no-pod``, ``no-claim``... of a time that
history may still reach is inside the settle window, and a cluster that is not being watched
cannot gain history before the instant its watch resumes (coverage never starts in the past).
Revisiting skips records a live watcher has not observed yet (below): they stay as they are and
are re-evaluated by a later run, once the horizon has passed ``t + skew``. Because exact rows
are final, a record later than a *live* cluster's horizon − skew (every kind synced: the history
still arrives) is not attributed yet — it stays pending (``awaiting-history``) until the horizon
has passed ``t + skew``; a transition committed late inside its window then makes it ``ambiguous``
as it must. A record later than the run's clock + skew, whatever its cluster, is pending too
(``future-event-time``: no watcher can have recorded that time; a verdict now would project
today's open states onto it) and counted apart, since it will not resolve within the tolerance
(a wrong clock on the node or in the application, usually). ``trace`` applies the same predicate
(``_awaiting_history``) before attributing a record on the fly.

Settings: each run records its clock-skew tolerance, default cluster and serving-container pins
once in ``attribution_settings`` and each row it writes names them (``lineage.settings_id``):
rows of several runs with different tolerances coexist, ``tolerances_in_use`` tells a pack which
are in force for its records, and ``verify_lineage`` (``draudit ledger verify``) recomputes every
row with its own settings in a rolled-back savepoint and names the first row that differs.

Concurrency: a run takes a PostgreSQL transaction-scoped advisory lock (``pg_advisory_xact_lock``)
and, on SQLite, the database write lock as its first statement, so concurrent runs (two
schedulers, the CLI) queue up; the second sees the first's rows and never collides on the
``lineage`` primary key.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Select,
    String,
    Table,
    and_,
    bindparam,
    case,
    cast,
    delete,
    distinct,
    exists,
    false,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    text,
    tuple_,
    union,
    union_all,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.functions import FunctionElement

from collector.errors import UserError
from collector.ingest.pan import mask_identifier
from collector.store import ledger
from collector.store.models import (
    AllocationEpisode,
    AttributionSettings,
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
from collector.timeutil import NS_PER_S, dt_to_ns, ns_to_rfc3339

STATUSES = ("exact", "ambiguous", "unattributed")
COVERAGE_KINDS = ("Pod", "ResourceClaim", "ResourceSlice")
DEFAULT_CLUSTER = "default"
DEFAULT_SETTLE_S = 600.0
DEFAULT_CHUNK_RECORDS = 250_000
# Upper bounds of the tolerances (s). A skew beyond a day would make every transition of a day
# "near" (nothing exact); both keep t ± bound far inside BIGINT ns and the sentinels below.
MAX_CLOCK_SKEW_S = 86_400.0
MAX_SETTLE_S = 365 * 86_400.0
# Sentinels for "no bound on this side" (ns since the epoch; far outside any real time, inside BIGINT).
NEG_INF_NS = -(1 << 62)
POS_INF_NS = 1 << 62
# pg_advisory_xact_lock key serialising attribution runs (first 8 bytes of SHA-256("draudit.lineage")).
LOCK_KEY = int.from_bytes(hashlib.sha256(b"draudit.lineage").digest()[:8], "big", signed=True)

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
AS = AttributionSettings.__table__

LINEAGE_COLUMNS = (
    "record_id", "status", "reason", "candidates", "pod_uid", "node_name", "claim_uid", "claim_namespace",
    "claim_name", "request", "episode_id", "driver", "pool", "device", "device_state_id", "device_uuid",
    "physical_gpu_uuid", "product_name", "mig_profile", "attributed_at", "settings_id",
)
# The predicate of the partial index ``ix_lineage_not_exact`` (models.Lineage), spelled as there: SQLite
# uses a partial index only for a query whose WHERE contains the index's WHERE term itself.
NOT_EXACT = L.c.status != literal_column("'exact'")
# What a point's evaluation yields (status before the per-record skew test), then the nearest bounds.
VERDICT_COLUMNS = LINEAGE_COLUMNS[1:-2]


# --------------------------------------------------------------------------------------------
# Small SQL building blocks
# --------------------------------------------------------------------------------------------


class _Greatest(FunctionElement):
    """``greatest(a, b, ...)`` of non-NULL BIGINT arguments (SQLite: the scalar ``max(a, b, ...)``)."""

    type = BigInteger()
    inherit_cache = True


class _Least(FunctionElement):
    """``least(a, b, ...)`` of non-NULL BIGINT arguments (SQLite: the scalar ``min(a, b, ...)``)."""

    type = BigInteger()
    inherit_cache = True


@compiles(_Greatest)
def _greatest_default(element: _Greatest, compiler: Any, **kw: Any) -> str:
    return f"greatest({compiler.process(element.clauses, **kw)})"


@compiles(_Greatest, "sqlite")
def _greatest_sqlite(element: _Greatest, compiler: Any, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


@compiles(_Least)
def _least_default(element: _Least, compiler: Any, **kw: Any) -> str:
    return f"least({compiler.process(element.clauses, **kw)})"


@compiles(_Least, "sqlite")
def _least_sqlite(element: _Least, compiler: Any, **kw: Any) -> str:
    return f"min({compiler.process(element.clauses, **kw)})"


def _valid_at(table: Any, t: ColumnElement) -> ColumnElement[bool]:
    """``t`` in ``[valid_from_ns, valid_to_ns)`` (NULL ``valid_to_ns`` = still valid)."""
    return and_(table.c.valid_from_ns <= t, or_(table.c.valid_to_ns.is_(None), t < table.c.valid_to_ns))


def _as_allocated(ds: Any, ar: Any, ae: Any, cluster: ColumnElement | None,
                  until: ColumnElement | None = None) -> ColumnElement[bool]:
    """``ds`` (``device_states`` or an alias) is the device record of result ``ar`` of episode ``ae``
    as of its allocation (module docstring, step 5): a record of the result's device valid when the
    episode became valid (``valid_from_ns``), else, when none was (a slice observed a moment after
    the claim), the first record of that device after it within the episode's lifetime; of several
    such records, the highest pool generation (several of those: each counts, as candidates).
    ``cluster``: the cluster of the device; None when the caller joins ``ds`` to ``ar``'s device in
    it already (``trace``: the condition is part of its one statement's text, kept short).
    ``until``: the latest start of a record the fallback may take (``_window_to``: the tolerance
    after the episode's start); None: any within the episode (``trace``'s co-tenants, whose one
    statement stays short: an episode's pods may be listed on a GPU its own attribution left
    without a device record — more co-tenants, never fewer).

    Records later than that one — a slice republished with other attributes, deleted while the
    allocation holds (kubelet restart, driver upgrade) — do not change what was allocated
    (dra-api.md §0.2, §9: join at allocation time and keep the UUIDs). A record's effective start is
    ``max(valid_from_ns, episode start)``; the chosen ones have the earliest, then the highest
    generation: one NOT EXISTS probe of ``ix_device_states_key``."""
    def in_episode(x: Any) -> ColumnElement[bool]:
        return and_(or_(x.c.valid_to_ns.is_(None), x.c.valid_to_ns > ae.c.valid_from_ns),
                    or_(ae.c.valid_to_ns.is_(None), x.c.valid_from_ns < ae.c.valid_to_ns))

    b = DS.alias(f"{ds.name}b")
    start, b_start = (_Greatest(x.c.valid_from_ns, ae.c.valid_from_ns) for x in (ds, b))
    own = in_episode(ds) if cluster is None else and_(
        ds.c.cluster == cluster, ds.c.driver == ar.c.driver, ds.c.pool == ar.c.pool, ds.c.device == ar.c.device,
        in_episode(ds))
    if until is not None:
        own = and_(own, ds.c.valid_from_ns <= until)
    # b precedes ds: an earlier effective start, or the same and a higher generation — as row values,
    # (b_start, ds generation) < (start, b generation). correlate_except: nested in another EXISTS
    # (trace), the outer tables must stay the outer query's.
    return and_(own, ~exists().where(
        b.c.cluster == ds.c.cluster, b.c.driver == ds.c.driver, b.c.pool == ds.c.pool, b.c.device == ds.c.device,
        in_episode(b), tuple_(b_start, ds.c.pool_generation) < tuple_(start, b.c.pool_generation),
    ).correlate_except(b))


def _window_candidate(dw: Any, ar: Any, ae: Any, cluster: ColumnElement, lo: ColumnElement,
                      hi: ColumnElement) -> ColumnElement[bool]:
    """``dw`` (an alias of ``device_states``) is a record of result ``ar``'s device that episode ``ae``
    may have been allocated under (module docstring, step 5): valid at some instant of the window
    ``[lo, hi]`` around the episode's start (``hi`` exclusive of the episode's end), and not hidden
    there by a higher pool generation — no record of a higher generation is valid over all of its
    part of the window (a record partly hidden stays a candidate: more candidates, never a guess).
    One probe of ``ix_device_states_key`` per record of the device near the episode's start."""
    b = DS.alias(f"{dw.name}h")
    part_from = _Greatest(dw.c.valid_from_ns, lo)
    part_to = _Least(func.coalesce(dw.c.valid_to_ns, POS_INF_NS), hi + 1)
    return and_(
        dw.c.cluster == cluster, dw.c.driver == ar.c.driver, dw.c.pool == ar.c.pool, dw.c.device == ar.c.device,
        dw.c.valid_from_ns <= hi, or_(dw.c.valid_to_ns.is_(None), dw.c.valid_to_ns > lo),
        or_(ae.c.valid_to_ns.is_(None), dw.c.valid_from_ns < ae.c.valid_to_ns),
        ~exists().where(b.c.cluster == dw.c.cluster, b.c.driver == dw.c.driver, b.c.pool == dw.c.pool,
                        b.c.device == dw.c.device, b.c.pool_generation > dw.c.pool_generation,
                        b.c.valid_from_ns <= part_from,
                        or_(b.c.valid_to_ns.is_(None), b.c.valid_to_ns >= part_to)).correlate_except(b))


def _window_to(cluster: ColumnElement, start: ColumnElement, skew_ns: int) -> ColumnElement[int]:
    """Where the allocation window of an episode first seen at ``start`` ends (step 5): ``start +
    skew``; when the ResourceSlice watch was not synced at ``start`` (it had not listed the slices
    yet: the watcher starting, or a gap of that kind), its first synced instant after ``start``, plus
    ``skew`` — a record first observed then is the device's record of that time."""
    ci, ws = CI.alias("tci"), WS.alias("tws")
    rs = literal_column("'ResourceSlice'")
    synced = or_(
        exists().where(ci.c.cluster == cluster, ci.c.kind == rs, ci.c.state == "synced", ci.c.started_ns <= start,
                       start < ci.c.ended_ns),
        exists().where(ws.c.cluster == cluster, ws.c.kind == rs, ws.c.state == "synced", ws.c.state_since_ns <= start))
    ci2, ws2 = CI.alias("tcn"), WS.alias("twn")
    resync = _Least(
        func.coalesce(select(func.min(ci2.c.started_ns)).where(
            ci2.c.cluster == cluster, ci2.c.kind == rs, ci2.c.state == "synced", ci2.c.started_ns > start
        ).scalar_subquery(), POS_INF_NS),
        func.coalesce(select(func.min(ws2.c.state_since_ns)).where(
            ws2.c.cluster == cluster, ws2.c.kind == rs, ws2.c.state == "synced", ws2.c.state_since_ns > start
        ).scalar_subquery(), POS_INF_NS))
    return case((or_(synced, resync == POS_INF_NS), start + skew_ns), else_=resync + skew_ns)


def _window_from(cluster: ColumnElement, start: ColumnElement, skew_ns: int) -> ColumnElement[int]:
    """Where the allocation window of an episode first seen at ``start`` begins (step 5):
    ``start - skew``, or, when the ResourceClaim watch (re)synced within ``skew`` before ``start``
    (the episode was in its first listing after a gap or before any watch), the end of that kind's
    previous synced coverage — the allocation happened at an unknown time since then —,
    ``NEG_INF_NS`` when there was none."""
    ci, ws = CI.alias("wci"), WS.alias("wws")
    rc = literal_column("'ResourceClaim'")
    resumed = func.coalesce(
        select(func.max(ci.c.started_ns)).where(ci.c.cluster == cluster, ci.c.kind == rc, ci.c.state == "synced",
                                                ci.c.started_ns <= start, start < ci.c.ended_ns).scalar_subquery(),
        select(func.max(ws.c.state_since_ns)).where(ws.c.cluster == cluster, ws.c.kind == rc, ws.c.state == "synced",
                                                    ws.c.state_since_ns <= start).scalar_subquery())
    ci2 = CI.alias("wcp")
    before = func.coalesce(
        select(func.max(ci2.c.ended_ns)).where(ci2.c.cluster == cluster, ci2.c.kind == rc, ci2.c.state == "synced",
                                               ci2.c.ended_ns <= resumed).scalar_subquery(), NEG_INF_NS)
    return case((resumed >= start - skew_ns, _Least(start - skew_ns, before)), else_=start - skew_ns)


def _bound_below(bounds: Sequence[ColumnElement], t: ColumnElement) -> ColumnElement[int]:
    """The latest non-NULL bound ``<= t`` (``NEG_INF_NS`` if none)."""
    return _Greatest(*[func.coalesce(case((b <= t, b)), NEG_INF_NS) for b in bounds])


def _bound_above(bounds: Sequence[ColumnElement], t: ColumnElement) -> ColumnElement[int]:
    """The earliest non-NULL bound ``> t`` (``POS_INF_NS`` if none)."""
    return _Least(*[func.coalesce(case((b > t, b)), POS_INF_NS) for b in bounds])


def _nearest(rows: Any, name: str) -> Any:
    """CTE ``name`` of ``(pid, near_lo, near_hi)``: per point of ``rows`` (a selectable of those
    three), its latest bound below and earliest above."""
    sub = rows.subquery(f"{name}_rows")
    return select(sub.c.pid, func.max(sub.c.near_lo).label("near_lo"), func.min(sub.c.near_hi).label("near_hi")
                  ).group_by(sub.c.pid).cte(name)


def _only(value: ColumnElement) -> ColumnElement:
    """Aggregate: the value if the group has exactly one distinct non-NULL value, else NULL.

    MIN = MAX instead of COUNT(DISTINCT) = 1: same result, no per-group sort.
    """
    return case((func.min(value) == func.max(value), func.min(value)), else_=null())


def _check_pins(serving_containers: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """``serving_containers`` as sorted (namespace, prefix, container); validates the keys."""
    rows = []
    for key, container in sorted(serving_containers.items()):
        ns, sep, prefix = key.partition("/")
        if not sep or not ns or not prefix or not container:
            raise UserError(
                f"serving container {key!r}={container!r}: use NAMESPACE/WORKLOAD=CONTAINER, "
                "e.g. payments/risk-api=triton-sidecar"
            )
        rows.append((ns, prefix, container))
    return rows


def _pins_cte(serving_containers: Mapping[str, str]):
    """The ``serving_containers`` map as rows (namespace, prefix, container)."""
    rows = [select(literal(ns).label("ns"), literal(prefix).label("prefix"), literal(container).label("container"))
            for ns, prefix, container in _check_pins(serving_containers)]
    return (union_all(*rows) if len(rows) > 1 else rows[0]).cte("pins")


def _seconds_ns(value: float, what: str, maximum_s: float, option: str) -> int:
    """``value`` seconds as integer ns, checked to lie in ``[0, maximum_s]``.

    Raises:
        UserError: NaN, negative, infinite or above ``maximum_s`` (each would otherwise surface as a
            traceback: ``int(inf)`` is an OverflowError, ns beyond BIGINT one from the driver).
    """
    if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= maximum_s):
        raise UserError(f"{what} {value} s: must be a non-negative number of seconds, at most {maximum_s:.0f} "
                        f"({option})")
    return int(round(value * NS_PER_S))


def _skew_ns(clock_skew_s: float) -> int:
    """The clock-skew tolerance in ns; ``UserError`` outside ``[0, MAX_CLOCK_SKEW_S]``."""
    return _seconds_ns(clock_skew_s, "clock skew", MAX_CLOCK_SKEW_S, "--clock-skew-s, DRAUDIT_CLOCK_SKEW_S")


def _settle_ns(settle_s: float) -> int:
    """The settle window in ns; ``UserError`` outside ``[0, MAX_SETTLE_S]``."""
    return _seconds_ns(settle_s, "settle window", MAX_SETTLE_S, "--settle-s")


def _in_gap(cluster: ColumnElement, t: ColumnElement) -> ColumnElement[int]:
    """2 when ``cluster`` has no watch history at all (no ``watch_state`` nor ``coverage_intervals``
    row), 1 when ``t`` is outside the synced coverage of any of ``COVERAGE_KINDS`` in it, else 0."""
    unknown = and_(~exists().where(WS.c.cluster == cluster), ~exists().where(CI.c.cluster == cluster))
    uncovered = []
    for kind in COVERAGE_KINDS:
        closed = exists().where(CI.c.cluster == cluster, CI.c.kind == kind, CI.c.state == "synced",
                                CI.c.started_ns <= t, t < CI.c.ended_ns)
        open_ = exists().where(WS.c.cluster == cluster, WS.c.kind == kind, WS.c.state == "synced",
                               WS.c.state_since_ns <= t)
        uncovered.append(and_(~closed, ~open_))
    return case((unknown, 2), (or_(*uncovered), 1), else_=0)


def _gap_edges() -> Select:
    """``(cluster, b)``: every instant ``b`` at which a cluster's coverage (``_in_gap``) changes —
    a gap ends at ``b`` (covered at ``b``, not at ``b - 1``) or starts there. Candidates are the
    bounds of the coverage rows; one that only joins two abutting synced intervals is no edge."""
    kinds = CI.c.kind.in_(COVERAGE_KINDS)
    bounds = union(
        select(CI.c.cluster, CI.c.started_ns.label("b")).where(kinds),
        select(CI.c.cluster, CI.c.ended_ns.label("b")).where(kinds, CI.c.ended_ns.is_not(None)),
        select(WS.c.cluster, WS.c.state_since_ns.label("b")).where(WS.c.kind.in_(COVERAGE_KINDS),
                                                                  WS.c.state_since_ns.is_not(None)),
    ).subquery("coverage_bounds")
    return select(bounds.c.cluster, bounds.c.b).where(
        _in_gap(bounds.c.cluster, bounds.c.b) != _in_gap(bounds.c.cluster, bounds.c.b - 1))


# --------------------------------------------------------------------------------------------
# The rule, evaluated at a set of points
# --------------------------------------------------------------------------------------------


def _verdicts(points: Any, serving_containers: Mapping[str, str] | None, skew_ns: int) -> Select:
    """The attribution rule (module docstring, steps 1–6 but the skew test) at each point.

    ``points`` has the columns ``pid`` (unique), ``t`` (ns), ``cluster``, ``pod_uid``,
    ``pod_namespace``, ``pod_name``, ``container_name``, ``node_name`` (the record's; NULL when
    unknown) and ``in_gap`` (``_in_gap``: 0 covered, 1 gap, 2 unknown cluster). ``skew_ns``: the
    tolerance, which widens the instant of an allocation into a window (step 5).

    Returns:
        A SELECT of ``pid``, ``VERDICT_COLUMNS`` (``status`` not yet downgraded to
        ``skew-window``), ``near_lo`` (the latest bound ``<= t`` of any row the chain used, or
        ``NEG_INF_NS``) and ``near_hi`` (the earliest bound ``> t``, or ``POS_INF_NS``).
    """
    P = points
    # podcand: candidate pods (by uid, or by namespace/name valid at t), outside coverage gaps.

    def differs(recorded: ColumnElement, observed: ColumnElement) -> ColumnElement[bool]:
        return and_(recorded.is_not(None), observed.is_not(None), recorded != observed)

    # A uid whose pod state at t has another namespace, name or node than the record says: the record
    # contradicts itself (a uid copied from another pod, a shipper's cache gone stale), so the uid is
    # no evidence of which pod logged (step 2: pod-identity-conflict).
    # A uid with no pod state at t — never observed, or a pod observed at other times only — while the
    # record's namespace/name is a pod observed at t (which has another uid): the same
    # contradiction, seen from the name's side (Fluent Bit's metadata cache, keyed by namespace and
    # pod name, stamps the old pod's uid on a StatefulSet pod recreated under the same name). A uid
    # with no state at t whose name is not a pod observed at t resolves to no pod (no candidate
    # row: no-pod); the watcher not having seen a pod is no evidence that the pod had no claim.
    ps_named = PS.alias("ps_named")
    uid_absent_named = exists().where(ps_named.c.cluster == P.c.cluster, ps_named.c.namespace == P.c.pod_namespace,
                                      ps_named.c.name == P.c.pod_name, _valid_at(ps_named, P.c.t))
    conflict = case((or_(differs(P.c.pod_namespace, PS.c.namespace), differs(P.c.pod_name, PS.c.name),
                         differs(P.c.node_name, PS.c.node_name), PS.c.id.is_(None)), 1), else_=0)
    by_uid = select(
        P.c.pid, P.c.pod_uid.label("pod_uid"), PS.c.namespace, PS.c.name, PS.c.node_name,
        PS.c.valid_from_ns, PS.c.valid_to_ns, P.c.t, conflict.label("conflict"),
    ).select_from(
        P.outerjoin(PS, and_(PS.c.cluster == P.c.cluster, PS.c.pod_uid == P.c.pod_uid, _valid_at(PS, P.c.t)))
    ).where(P.c.in_gap == 0, P.c.pod_uid.is_not(None), or_(PS.c.id.is_not(None), uid_absent_named))
    # By namespace/name (no uid): the name matches by the join; the record's node is checked as for a
    # uid — a line naming gpu-node-a is not the same-name pod recreated on gpu-node-b. Of several pods
    # with the name at t, the record contradicts its pod only if it contradicts each (podagg: min).
    by_name = select(
        P.c.pid, PS.c.pod_uid, PS.c.namespace, PS.c.name, PS.c.node_name,
        PS.c.valid_from_ns, PS.c.valid_to_ns, P.c.t,
        case((differs(P.c.node_name, PS.c.node_name), 1), else_=0).label("conflict"),
    ).select_from(
        P.join(PS, and_(PS.c.cluster == P.c.cluster, PS.c.namespace == P.c.pod_namespace,
                        PS.c.name == P.c.pod_name, _valid_at(PS, P.c.t)))
    ).where(P.c.in_gap == 0, P.c.pod_uid.is_(None))
    podcand = union_all(by_uid, by_name).cte("podcand")

    pod_bounds = [podcand.c.valid_from_ns, podcand.c.valid_to_ns]
    podagg = select(
        podcand.c.pid,
        # 1 = one pod; 2 = several (counted only when reported, below)
        case((func.min(podcand.c.pod_uid) == func.max(podcand.c.pod_uid), 1), else_=2).label("n_pods"),
        func.min(podcand.c.pod_uid).label("pod_uid"),
        func.min(podcand.c.namespace).label("namespace"),
        func.min(podcand.c.name).label("name"),
        func.min(podcand.c.node_name).label("node_name"),
        # a uid has one candidate row; by name, a conflict only when every pod of the name contradicts
        func.min(podcand.c.conflict).label("conflict"),
        func.max(_bound_below(pod_bounds, podcand.c.t)).label("near_lo"),
        func.min(_bound_above(pod_bounds, podcand.c.t)).label("near_hi"),
    ).group_by(podcand.c.pid).cte("podagg")

    # podnear: for a point whose key has pod states but none valid at t (no-pod), the nearest bounds of
    # those states: a record logged just before its pod was first observed (or just after its last
    # observation) is within the skew window of the pod, not evidence of no pod.
    ps_near = PS.alias("ps_near")
    near_bounds = [ps_near.c.valid_from_ns, ps_near.c.valid_to_ns]

    def near_of(on: ColumnElement[bool], *where: ColumnElement[bool]) -> Select:
        return select(P.c.pid, _bound_below(near_bounds, P.c.t).label("near_lo"),
                      _bound_above(near_bounds, P.c.t).label("near_hi")).select_from(
            P.join(ps_near, and_(ps_near.c.cluster == P.c.cluster, on))).where(P.c.in_gap == 0, *where)

    # A pod-identity-conflict is decided by the same pod states (the uid's own, and those of the pods
    # its namespace and name resolve to): a record within the tolerance of one of their bounds — a
    # line of the new pod logged 50 ms before the watcher observed the old one's deletion — may
    # mean the other side of it, where no contradiction holds, so those bounds count too.
    named = and_(ps_near.c.namespace == P.c.pod_namespace, ps_near.c.name == P.c.pod_name)
    conflicting = exists().where(podagg.c.pid == P.c.pid, podagg.c.conflict == 1)
    podnear = _nearest(union_all(
        near_of(ps_near.c.pod_uid == P.c.pod_uid, P.c.pod_uid.is_not(None)),
        near_of(named, P.c.pod_uid.is_(None)),
        near_of(named, P.c.pod_uid.is_not(None), conflicting),
    ), "podnear")

    # podone: points whose pod resolved to exactly one uid, with the container whose claims count.
    pod_ns = func.coalesce(podagg.c.namespace, P.c.pod_namespace)
    pod_name = func.coalesce(podagg.c.name, P.c.pod_name)
    own = exists().where(PCC.c.cluster == P.c.cluster, PCC.c.pod_uid == podagg.c.pod_uid,
                         PCC.c.container_name == P.c.container_name)
    if serving_containers:
        pins = _pins_cte(serving_containers)
        matches = and_(pins.c.ns == pod_ns,
                       or_(pod_name == pins.c.prefix,
                           func.substr(pod_name, 1, func.length(pins.c.prefix) + 1) == pins.c.prefix + "-"))
        pin_container = (select(pins.c.container).where(matches)
                         .order_by(func.length(pins.c.prefix).desc(), pins.c.prefix).limit(1)
                         .correlate(P, podagg).scalar_subquery())
        pinned_has_claims = exists().where(PCC.c.cluster == P.c.cluster, PCC.c.pod_uid == podagg.c.pod_uid,
                                           PCC.c.container_name == pin_container)
        sel_container = case((own, P.c.container_name), (pinned_has_claims, pin_container), else_=null())
    else:
        sel_container = case((own, P.c.container_name), else_=null())
    podone = select(
        P.c.pid, P.c.t, P.c.cluster, podagg.c.pod_uid, sel_container.label("sel_container"),
    ).select_from(P.join(podagg, podagg.c.pid == P.c.pid)).where(podagg.c.n_pods == 1, podagg.c.conflict == 0
                                                                 ).cte("podone")

    # claimreq: (point, claim valid at t, request) for the selected containers' claim references.
    claimreq = select(
        podone.c.pid, podone.c.t, podone.c.cluster, podone.c.pod_uid,
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
    DW = DS.alias("dw")
    window_to = _window_to(claimreq.c.cluster, AE.c.valid_from_ns, skew_ns)
    ds_gpu = func.coalesce(DS.c.physical_gpu_uuid, DS.c.parent_uuid, DS.c.uuid)
    w_gpu = func.coalesce(DW.c.physical_gpu_uuid, DW.c.parent_uuid, DW.c.uuid)
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
        # the device as allocated: its record when the episode began, not at t (step 5)
        .outerjoin(DS, _as_allocated(DS, AR, AE, claimreq.c.cluster, window_to))
        # and the records of other GPUs it may have been allocated under: the watcher orders the
        # claim and slice streams within the tolerance only (step 5); none when there is no such
        # record (the usual case: one row per result still)
        .outerjoin(DW, and_(_window_candidate(DW, AR, AE, claimreq.c.cluster,
                                              _window_from(claimreq.c.cluster, AE.c.valid_from_ns, skew_ns),
                                              window_to),
                            or_(DS.c.id.is_(None), w_gpu != ds_gpu)))
    )

    def dev(col: str) -> ColumnElement:
        """A result's device record: as allocated, else (none in the episode) a window candidate."""
        return case((DS.c.id.is_not(None), DS.c[col]), else_=DW.c[col])

    gpu = func.coalesce(dev("physical_gpu_uuid"), dev("parent_uuid"), dev("uuid"))
    is_gpu = gpu.is_not(None)
    no_record = and_(DS.c.id.is_(None), DW.c.id.is_(None))
    # results that may have served the transaction: GPUs and results without a device record
    served = and_(AR.c.id.is_not(None), or_(is_gpu, no_record))
    bounds = [claimreq.c.ref_from, claimreq.c.ref_to, AE.c.valid_from_ns, AE.c.valid_to_ns,
              case((AE.c.id.is_not(None), CC.c.valid_from_ns)), case((AE.c.id.is_not(None), CC.c.valid_to_ns))]

    def gpu_only(col: ColumnElement) -> ColumnElement:
        return case((is_gpu, col))

    def served_only(col: ColumnElement) -> ColumnElement:
        return case((served, col))

    # paths: one row per (point, claim reference, reservation, result, device state).
    paths = select(
        claimreq.c.pid,
        AR.c.id.label("result_id"),
        served_only(gpu).label("gpu"),
        # another GPU the result may have been allocated (beside the one as allocated)
        served_only(case((DS.c.id.is_not(None), w_gpu))).label("other_gpu"),
        served_only(case((no_record, AR.c.id))).label("unresolved_id"),
        _bound_below(bounds, claimreq.c.t).label("near_lo"),
        _bound_above(bounds, claimreq.c.t).label("near_hi"),
        gpu_only(AR.c.driver + "/" + AR.c.pool + "/" + AR.c.device).label("device_key"),
        gpu_only(AR.c.driver).label("driver"),
        gpu_only(AR.c.pool).label("pool"),
        gpu_only(AR.c.device).label("device"),
        gpu_only(dev("uuid")).label("device_uuid"),
        gpu_only(dev("id")).label("device_state_id"),
        gpu_only(dev("product_name")).label("product_name"),
        gpu_only(dev("profile")).label("mig_profile"),
        gpu_only(dev("node_name")).label("device_node"),
        served_only(AR.c.request).label("request"),
        served_only(AE.c.id).label("episode_id"),
        served_only(AE.c.claim_uid).label("claim_uid"),
        served_only(AE.c.claim_namespace).label("claim_namespace"),
        served_only(AE.c.claim_name).label("claim_name"),
    ).select_from(chain).cte("paths")

    # gapnear: the nearest edges of the cluster's coverage gaps (step 1): a record covered at t but
    # within the tolerance of a gap may have happened inside it, where nothing is exact.
    edges = _gap_edges().subquery("gap_edges")
    gapnear = select(
        P.c.pid, func.max(case((edges.c.b <= P.c.t, edges.c.b))).label("near_lo"),
        func.min(case((edges.c.b > P.c.t, edges.c.b))).label("near_hi"),
    ).select_from(P.join(edges, edges.c.cluster == P.c.cluster)).where(P.c.in_gap == 0).group_by(P.c.pid).cte("gapnear")

    # candidates: the distinct GPUs and the served results without a device record, per point.
    cand = union(
        select(paths.c.pid, paths.c.gpu, paths.c.unresolved_id).where(
            or_(paths.c.gpu.is_not(None), paths.c.unresolved_id.is_not(None))),
        select(paths.c.pid, paths.c.other_gpu, cast(null(), BigInteger)).where(paths.c.other_gpu.is_not(None)),
    ).subquery("cand")
    candagg = select(cand.c.pid, func.count().label("n_candidates"), func.count(cand.c.gpu).label("n_gpus")
                     ).group_by(cand.c.pid).cte("candagg")

    one_device = func.min(paths.c.device_key) == func.max(paths.c.device_key)
    pathagg = select(
        paths.c.pid,
        func.count(paths.c.result_id).label("n_results"),
        func.max(paths.c.near_lo).label("near_lo"),
        func.min(paths.c.near_hi).label("near_hi"),
        _only(paths.c.gpu).label("physical_gpu_uuid"),
        _only(paths.c.product_name).label("product_name"),
        _only(paths.c.mig_profile).label("mig_profile"),
        _only(paths.c.device_node).label("device_node"),
        *[case((one_device, _only(paths.c[col]))).label(col)
          for col in ("driver", "pool", "device", "device_uuid", "device_state_id")],
        *[_only(paths.c[col]).label(col) for col in ("request", "episode_id", "claim_uid", "claim_namespace", "claim_name")],
    ).group_by(paths.c.pid).cte("pathagg")

    # Where the chain breaks (no-claim, no-allocation), the rows of the missing level valid at other
    # times than t: their nearest bounds, so that a record within the skew tolerance of the claim
    # reference being observed, or the allocation starting or ending, is ``skew-window``, not a
    # verdict that it had none (step 6). Only for the points whose chain broke there (``stops``:
    # few; joining every point's rows cost a sixth of a run's time), and only rows not valid at t
    # (those valid at t are in ``paths``). A ``no-device-record`` needs none: the device is resolved
    # as allocated, over the whole episode, so only the episode's own bounds (in ``paths``) move it.
    level = case((pathagg.c.pid.is_(None), literal("claim")),
                 (func.coalesce(pathagg.c.n_results, 0) == 0, literal("allocation")), else_=null())
    stops = select(podone.c.pid, podone.c.t, podone.c.cluster, podone.c.pod_uid, podone.c.sel_container,
                   level.label("level")).select_from(
        podone.outerjoin(pathagg, pathagg.c.pid == podone.c.pid)
    ).where(level.is_not(None)).cte("stops")
    pcc_near, pcr_near = PCC.alias("pcc_near"), PCR.alias("pcr_near")
    ref_bounds = [pcr_near.c.valid_from_ns, pcr_near.c.valid_to_ns]
    claim_near = select(
        stops.c.pid, _bound_below(ref_bounds, stops.c.t).label("near_lo"), _bound_above(ref_bounds, stops.c.t).label("near_hi"),
    ).select_from(
        stops.join(pcc_near, and_(pcc_near.c.cluster == stops.c.cluster, pcc_near.c.pod_uid == stops.c.pod_uid,
                                  or_(stops.c.sel_container.is_(None), pcc_near.c.container_name == stops.c.sel_container)))
        .join(pcr_near, and_(pcr_near.c.cluster == stops.c.cluster, pcr_near.c.pod_uid == stops.c.pod_uid,
                             pcr_near.c.pod_claim_name == pcc_near.c.pod_claim_name,
                             pcr_near.c.claim_name.is_not(None), ~_valid_at(pcr_near, stops.c.t)))
    ).where(stops.c.level == "claim")
    cc_near, ae_near, cr_near = CC.alias("cc_near"), AE.alias("ae_near"), claimreq.alias("cr_near")
    episode_bounds = [ae_near.c.valid_from_ns, ae_near.c.valid_to_ns, cc_near.c.valid_from_ns, cc_near.c.valid_to_ns]
    allocation_near = select(
        stops.c.pid, _bound_below(episode_bounds, stops.c.t).label("near_lo"),
        _bound_above(episode_bounds, stops.c.t).label("near_hi"),
    ).select_from(
        stops.join(cr_near, cr_near.c.pid == stops.c.pid)
        .join(cc_near, and_(cc_near.c.cluster == stops.c.cluster, cc_near.c.consumer_uid == stops.c.pod_uid))
        .join(ae_near, and_(ae_near.c.id == cc_near.c.episode_id, ae_near.c.claim_namespace == cr_near.c.claim_namespace,
                            ae_near.c.claim_name == cr_near.c.claim_name,
                            or_(~_valid_at(ae_near, stops.c.t), ~_valid_at(cc_near, stops.c.t))))
    ).where(stops.c.level == "allocation")
    brokenear = _nearest(union_all(claim_near, allocation_near), "brokenear")

    # Decision, in the order of the chain (coverage first: inside a gap nothing is exact).
    n_results = func.coalesce(pathagg.c.n_results, 0)
    n_gpus = func.coalesce(candagg.c.n_gpus, 0)
    n_candidates = func.coalesce(candagg.c.n_candidates, 0)
    no_identity = and_(P.c.pod_uid.is_(None), or_(P.c.pod_namespace.is_(None), P.c.pod_name.is_(None)))
    decisions: list[tuple[ColumnElement[bool], str, str]] = [
        (no_identity, "unattributed", "no-pod"),
        (P.c.in_gap == 2, "unattributed", "unknown-cluster"),
        (P.c.in_gap == 1, "unattributed", "coverage-gap"),
        (podagg.c.pid.is_(None), "unattributed", "no-pod"),
        (podagg.c.conflict == 1, "unattributed", "pod-identity-conflict"),
        (podagg.c.n_pods > 1, "ambiguous", "several-pods"),
        (pathagg.c.pid.is_(None), "unattributed", "no-claim"),
        (n_results == 0, "unattributed", "no-allocation"),
        (n_gpus == 0, "unattributed", "no-device-record"),
        (n_candidates > 1, "ambiguous", "several-devices"),
    ]
    status = case(*[(cond, literal(s)) for cond, s, _ in decisions], else_=literal("exact"))
    reason = case(*[(cond, literal(r)) for cond, _, r in decisions], else_=null())
    one_pod = and_(podagg.c.n_pods == 1, podagg.c.conflict == 0)
    n_pods_exact = (select(func.count(distinct(podcand.c.pod_uid))).where(podcand.c.pid == P.c.pid)
                    .scalar_subquery())
    single_gpu = and_(one_pod, n_gpus == 1)
    one_claim = and_(one_pod, pathagg.c.claim_uid.is_not(None))

    def with_gpu(col: ColumnElement) -> ColumnElement:
        return case((single_gpu, col), else_=null())

    def with_claim(col: ColumnElement) -> ColumnElement:
        return case((one_claim, col), else_=null())

    def near(side: str) -> list[ColumnElement]:
        """The bounds of ``side`` the skew test reads: the chain's own, the coverage gaps', and where
        the chain broke (no pod, no claim, no allocation, no device record), the missing level's."""
        return [podagg.c[side], pathagg.c[side], gapnear.c[side],
                case((or_(podagg.c.pid.is_(None), podagg.c.conflict == 1), podnear.c[side])), brokenear.c[side]]

    return select(
        P.c.pid,
        status.label("status"),
        reason.label("reason"),
        case((podagg.c.n_pods > 1, n_pods_exact), else_=n_candidates).label("candidates"),
        case((one_pod, podagg.c.pod_uid), else_=P.c.pod_uid).label("pod_uid"),
        case((one_pod, func.coalesce(podagg.c.node_name, pathagg.c.device_node)), else_=null()).label("node_name"),
        *[with_claim(pathagg.c[col]).label(col)
          for col in ("claim_uid", "claim_namespace", "claim_name", "request", "episode_id")],
        *[with_gpu(pathagg.c[col]).label(col)
          for col in ("driver", "pool", "device", "device_state_id", "device_uuid", "physical_gpu_uuid",
                      "product_name", "mig_profile")],
        _Greatest(*[func.coalesce(col, NEG_INF_NS) for col in near("near_lo")]).label("near_lo"),
        _Least(*[func.coalesce(col, POS_INF_NS) for col in near("near_hi")]).label("near_hi"),
    ).select_from(
        P.outerjoin(podagg, podagg.c.pid == P.c.pid).outerjoin(pathagg, pathagg.c.pid == P.c.pid)
        .outerjoin(candagg, candagg.c.pid == P.c.pid).outerjoin(podnear, podnear.c.pid == P.c.pid)
        .outerjoin(brokenear, brokenear.c.pid == P.c.pid).outerjoin(gapnear, gapnear.c.pid == P.c.pid)
    )


SKEWABLE_REASONS = ("no-pod", "pod-identity-conflict", "no-claim", "no-allocation", "no-device-record")


def _skewable(v: Any) -> ColumnElement[bool]:
    """Verdicts the skew test may downgrade: ``exact``, and the chain broken at a level whose rows
    may lie just the other side of ``t`` (``SKEWABLE_REASONS``)."""
    return or_(v.c.status == "exact", v.c.reason.in_(SKEWABLE_REASONS))


def _skewed(v: Any, t: ColumnElement, precision: ColumnElement, skew_ns: int) -> ColumnElement[bool]:
    """The skew test (step 6): a ``_skewable`` verdict becomes ``ambiguous`` / ``skew-window`` when
    a bound it read (``_verdicts``: the chain's rows, the coverage gaps' edges, the missing level's
    rows) lies within ``skew`` of an instant the record may mean, ``[t, t + precision)`` in whole
    ns: in ``[t - skew, t + precision - 1 + skew]``. ``v.near_lo <= t < v.near_hi`` are the
    nearest such bounds, so two comparisons decide it."""
    near = or_(v.c.near_lo >= t - skew_ns, v.c.near_hi < t + func.coalesce(precision, 1) + skew_ns)
    return and_(_skewable(v), near)


def _lineage_row(v: Any, skewed: ColumnElement[bool], attributed_at: datetime,
                 settings_id: int | None) -> list[ColumnElement]:
    """The ``LINEAGE_COLUMNS`` after ``record_id`` from verdict ``v`` for a record, ``skewed`` its skew
    test (``_skewed``)."""
    return [
        case((skewed, literal("ambiguous")), else_=v.c.status).label("status"),
        case((skewed, literal("skew-window")), else_=v.c.reason).label("reason"),
        *[v.c[col] for col in VERDICT_COLUMNS[2:]],
        literal(attributed_at, UTCDateTime()).label("attributed_at"),
        literal(settings_id, BigInteger).label("settings_id"),
    ]


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

    Evaluates the rule with each record as its own point (no temporary tables: usable for a few
    records inside any transaction, e.g. ``trace``); ``attribute_run`` gives the same rows faster.

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
    skew_ns = _skew_ns(clock_skew_s)
    attributed_at = attributed_at or datetime.now(timezone.utc)
    rec_cluster = func.coalesce(R.c.cluster, literal(cluster))
    points_q = select(
        R.c.id.label("pid"), R.c.event_time_ns.label("t"), rec_cluster.label("cluster"),
        R.c.pod_uid, R.c.pod_namespace, R.c.pod_name, R.c.container_name, R.c.node_name,
        _in_gap(rec_cluster, R.c.event_time_ns).label("in_gap"),
    )
    if not all:
        points_q = points_q.where(~exists().where(L.c.record_id == R.c.id))
    if record_ids is not None:
        points_q = points_q.where(R.c.id.in_(list(record_ids)))
    points = points_q.cte("points")
    v = _verdicts(points, serving_containers, skew_ns).cte("verdicts")
    return select(
        v.c.pid.label("record_id"),
        *_lineage_row(v, _skewed(v, R.c.event_time_ns, R.c.event_time_precision_ns, skew_ns), attributed_at, None),
    ).select_from(v.join(R, R.c.id == v.c.pid))


# --------------------------------------------------------------------------------------------
# The segment timeline (temporary tables, one set per run and connection)
# --------------------------------------------------------------------------------------------

_TMP = MetaData()
_KEY_COLUMNS = ("cluster", "k_uid", "k_ns", "k_name", "k_container", "k_node")


def _key_cols() -> list[Column]:
    return [Column(name, String(253), nullable=False) for name in _KEY_COLUMNS]


def _verdict_cols() -> list[Column]:
    ints = {"candidates": Integer, "episode_id": BigInteger, "device_state_id": BigInteger}
    return [Column(name, ints.get(name, String(253))) for name in VERDICT_COLUMNS] + [
        Column("skew_until", BigInteger, nullable=False), Column("skew_from", BigInteger, nullable=False)]


# record ids whose non-exact lineage is re-evaluated by this run
T_REVISIT = Table("draudit_lin_revisit", _TMP, Column("record_id", BigInteger, primary_key=True, autoincrement=False),
                  Column("settings_id", BigInteger),  # the settings its stored row was computed with
                  prefixes=["TEMPORARY"])
# one row per pod key of the batch ('' = absent), with the time span of the batch (covers its records)
T_KEYS = Table("draudit_lin_keys", _TMP, Column("kid", BigInteger, primary_key=True, autoincrement=False),
               *_key_cols(), Column("min_t", BigInteger, nullable=False), Column("max_t", BigInteger, nullable=False),
               prefixes=["TEMPORARY"])
# the pods a key may reach (see _key_uids)
T_KEY_UIDS = Table("draudit_lin_key_uids", _TMP, Column("kid", BigInteger, primary_key=True, autoincrement=False),
                   Column("cluster", String(253), nullable=False),
                   Column("uid", String(253), primary_key=True), prefixes=["TEMPORARY"])
# one point per segment [t, e) of a key; pod key columns NULL when absent, as _verdicts expects
T_POINTS = Table("draudit_lin_points", _TMP, Column("pid", BigInteger, primary_key=True, autoincrement=False),
                 Column("kid", BigInteger, nullable=False), Column("t", BigInteger, nullable=False),
                 Column("e", BigInteger, nullable=False), Column("cluster", String(253), nullable=False),
                 Column("pod_uid", String(253)), Column("pod_namespace", String(253)), Column("pod_name", String(253)),
                 Column("container_name", String(253)), Column("node_name", String(253)),
                 Column("in_gap", Integer, nullable=False),
                 prefixes=["TEMPORARY"])
# The verdict of each segment, looked up by (key, time), with its skew test precomputed: a record at t
# is skewed when t <= skew_until or t + precision >= skew_from (``_Run.lineage_rows``). Keyed by
# (key, s), without a rowid on SQLite: a record's lookup reads each candidate segment's end and its
# verdict from the primary key's b-tree, not from the table after an index (with the precomputed skew
# test: the chunk's INSERT into lineage 0.77 -> 0.67 s CPU per 250 k records, best of 7).
T_TIMELINE = Table("draudit_lin_timeline", _TMP, *_key_cols(), Column("s", BigInteger, nullable=False),
                   Column("e", BigInteger, nullable=False), *_verdict_cols(),
                   PrimaryKeyConstraint(*_KEY_COLUMNS, "s", name="draudit_lin_timeline_key"),
                   prefixes=["TEMPORARY"], sqlite_with_rowid=False)
# fresh rows for revisited records, compared with the stored ones before anything is rewritten
T_FRESH = Table("draudit_lin_fresh", _TMP, Column("record_id", BigInteger, primary_key=True, autoincrement=False),
                *[Column(name, String(253)) if name not in ("candidates", "episode_id", "device_state_id")
                  else Column(name, BigInteger) for name in VERDICT_COLUMNS],
                Column("attributed_at", UTCDateTime()), Column("settings_id", BigInteger), prefixes=["TEMPORARY"])
_TEMP_TABLES = (T_REVISIT, T_KEYS, T_KEY_UIDS, T_POINTS, T_TIMELINE, T_FRESH)


def _record_key(cluster: str) -> list[ColumnElement]:
    """A record's pod key, in ``_KEY_COLUMNS`` order ('' for an absent part): what the rule reads of
    the record besides its time (the node only for the identity check of step 2)."""
    exprs = [func.coalesce(R.c.cluster, literal(cluster)), func.coalesce(R.c.pod_uid, ""),
             func.coalesce(R.c.pod_namespace, ""), func.coalesce(R.c.pod_name, ""),
             func.coalesce(R.c.container_name, ""), func.coalesce(R.c.node_name, "")]
    return [e.label(name) for e, name in zip(exprs, _KEY_COLUMNS)]


def _key_uids() -> Select:
    """Rows for ``T_KEY_UIDS``: the pods a key may resolve to (its uid, or every pod that had the
    name) and, for a key with both, the pods that had its name (the identity check of step 2 reads
    their states: the key's segments must end where those do). Usually the uid's own pod."""
    K = T_KEYS
    return union(
        select(K.c.kid, K.c.cluster, K.c.k_uid.label("uid")).where(K.c.k_uid != ""),
        select(K.c.kid, K.c.cluster, PS.c.pod_uid.label("uid")).select_from(
            K.join(PS, and_(PS.c.cluster == K.c.cluster, PS.c.namespace == K.c.k_ns, PS.c.name == K.c.k_name))
        ).where(K.c.k_ns != "", K.c.k_name != ""),
    )


def _segment_points() -> Select:
    """Rows for ``T_POINTS``: each key's span cut at every bound of a row its chain may read.

    Bounds come from the key's pods (``T_KEY_UIDS``): their pod states, claim refs and
    reservations, the episodes those reservations belong to, and the cluster's coverage (device
    states are none: a result's device is resolved as allocated, fixed for its episode). Only
    bounds in ``(min_t, max_t]`` cut; the first segment starts at ``min_t``, the last is open.
    """
    K, KU = T_KEYS, T_KEY_UIDS

    def via_uid(table: Any, uid_col: Any) -> Select:
        return select(KU.c.kid, table.c.valid_from_ns.label("f"), table.c.valid_to_ns.label("u")).select_from(
            KU.join(table, and_(table.c.cluster == KU.c.cluster, uid_col == KU.c.uid)))

    rows = union_all(
        via_uid(PS, PS.c.pod_uid),
        via_uid(PCR, PCR.c.pod_uid),
        via_uid(CC, CC.c.consumer_uid),
        select(KU.c.kid, AE.c.valid_from_ns, AE.c.valid_to_ns).select_from(
            KU.join(CC, and_(CC.c.cluster == KU.c.cluster, CC.c.consumer_uid == KU.c.uid))
            .join(AE, AE.c.id == CC.c.episode_id)),
        select(K.c.kid, CI.c.started_ns, CI.c.ended_ns).select_from(
            K.join(CI, and_(CI.c.cluster == K.c.cluster, CI.c.kind.in_(COVERAGE_KINDS)))),
        select(K.c.kid, WS.c.state_since_ns, cast(null(), BigInteger)).select_from(
            K.join(WS, and_(WS.c.cluster == K.c.cluster, WS.c.kind.in_(COVERAGE_KINDS)))),
    ).subquery("bound_rows")

    def inside(col: Any) -> Select:
        return select(rows.c.kid, col.label("b")).select_from(rows.join(K, K.c.kid == rows.c.kid)).where(
            col > K.c.min_t, col <= K.c.max_t)

    cuts = union(inside(rows.c.f), inside(rows.c.u), select(K.c.kid, K.c.min_t.label("b"))).subquery("cuts")
    segments = select(
        cuts.c.kid, cuts.c.b.label("t"),
        func.lead(cuts.c.b).over(partition_by=cuts.c.kid, order_by=cuts.c.b).label("e"),
    ).subquery("segments")
    return select(
        func.row_number().over(order_by=(segments.c.kid, segments.c.t)).label("pid"),
        segments.c.kid, segments.c.t, func.coalesce(segments.c.e, POS_INF_NS).label("e"), K.c.cluster,
        func.nullif(K.c.k_uid, "").label("pod_uid"), func.nullif(K.c.k_ns, "").label("pod_namespace"),
        func.nullif(K.c.k_name, "").label("pod_name"), func.nullif(K.c.k_container, "").label("container_name"),
        func.nullif(K.c.k_node, "").label("node_name"),
        _in_gap(K.c.cluster, segments.c.t).label("in_gap"),
    ).select_from(segments.join(K, K.c.kid == segments.c.kid))


class _Run:
    """One attribution run's statements on one connection (temporary tables, then the writes)."""

    def __init__(self, session: Session, *, skew_ns: int, serving_containers: Mapping[str, str] | None,
                 cluster: str, attributed_at: datetime, settings_id: int | None):
        self.s = session
        self.settings_id = settings_id
        self.pg = session.get_bind().dialect.name == "postgresql"
        self.skew_ns = skew_ns
        self.serving = serving_containers
        self.cluster = cluster
        self.attributed_at = attributed_at

    def __enter__(self) -> "_Run":
        temp_schema = "pg_temp" if self.pg else "temp"  # never a permanent table of the same name
        for table in _TEMP_TABLES:
            self.s.execute(text(f"DROP TABLE IF EXISTS {temp_schema}.{table.name}"))
            table.create(self.s.connection())
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            for table in _TEMP_TABLES:
                table.drop(self.s.connection())

    def _analyze(self, *tables: Table) -> None:
        if self.pg:  # temporary tables have no statistics until analysed: the planner would guess
            for table in tables:
                self.s.execute(text(f"ANALYZE {table.name}"))

    def _insert_keys(self, src: Any) -> bool:
        """Fill ``T_KEYS`` with the distinct pod keys of the batch ``src`` (``_KEY_COLUMNS``, ``t``), each
        with the batch's time span. Returns False when the batch is empty.

        Every key gets the batch's span: it covers the key's records, costs a few more segments
        (bounds of the key's rows outside its own records' span) and spares a sort of every record
        on SQLite, which groups by sorting (its DISTINCT probes a small index of the keys instead).
        PostgreSQL hashes a GROUP BY, so there one pass takes each key's span and the batch span is
        read from the keys; a separate ``min(t), max(t)`` over the batch would even be planned as
        two walks of ``ix_inference_records_time`` from either end until a row of the chunk turns
        up, i.e. over most of the table for a middle chunk (1 s of server CPU per 1 M records).
        """
        key_cols = [src.c[name] for name in _KEY_COLUMNS]
        if self.pg:
            keys = select(*key_cols, func.min(src.c.t).label("min_t"), func.max(src.c.t).label("max_t")
                          ).group_by(*key_cols).subquery("batch_keys")
            spans = [keys.c.min_t, keys.c.max_t]
        else:
            min_t, max_t = self.s.execute(select(func.min(src.c.t), func.max(src.c.t))).one()
            if min_t is None:
                return False
            keys = select(*key_cols).distinct().subquery("batch_keys")
            spans = [literal(min_t, BigInteger), literal(max_t, BigInteger)]
        kc = [keys.c[name] for name in _KEY_COLUMNS]
        self.s.execute(insert(T_KEYS).from_select(
            ["kid", *_KEY_COLUMNS, "min_t", "max_t"],
            select(func.row_number().over(order_by=kc), *kc, *spans)))
        if self.pg:
            min_t, max_t = self.s.execute(select(func.min(T_KEYS.c.min_t), func.max(T_KEYS.c.max_t))).one()
            if min_t is None:
                return False
            self.s.execute(T_KEYS.update().values(min_t=min_t, max_t=max_t))
        return True

    def build_timeline(self, sources: Sequence[Select]) -> bool:
        """Fill ``T_KEYS``, ``T_POINTS``, ``T_TIMELINE`` for the records ``sources`` select.

        Each source selects ``_record_key(...)`` + ``event_time_ns``. Returns False when empty.
        """
        for table in (T_TIMELINE, T_POINTS, T_KEY_UIDS, T_KEYS):
            self.s.execute(delete(table))
        src = union_all(*sources).subquery("batch") if len(sources) > 1 else sources[0].subquery("batch")
        if not self._insert_keys(src):
            return False
        self.s.execute(insert(T_KEY_UIDS).from_select(["kid", "cluster", "uid"], _key_uids()))
        self._analyze(T_KEYS, T_KEY_UIDS)
        points = _segment_points()
        self.s.execute(insert(T_POINTS).from_select([c.name for c in points.selected_columns], points))
        self._analyze(T_POINTS)
        v = _verdicts(T_POINTS, self.serving, self.skew_ns).subquery("v")
        P = T_POINTS
        # _skewed's two comparisons, solved for t once per segment instead of once per record
        skew_until = case((_skewable(v), v.c.near_lo + self.skew_ns), else_=NEG_INF_NS)
        skew_from = case((_skewable(v), v.c.near_hi - self.skew_ns), else_=POS_INF_NS)
        self.s.execute(insert(T_TIMELINE).from_select(
            [*_KEY_COLUMNS, "s", "e", *VERDICT_COLUMNS, "skew_until", "skew_from"],
            select(P.c.cluster, *[func.coalesce(c, "") for c in (P.c.pod_uid, P.c.pod_namespace, P.c.pod_name,
                                                                 P.c.container_name, P.c.node_name)],
                   P.c.t, P.c.e, *[v.c[c] for c in VERDICT_COLUMNS], skew_until, skew_from)
            .select_from(P.join(v, v.c.pid == P.c.pid)),
        ))
        self._analyze(T_TIMELINE)
        return True

    def lineage_rows(self, *where: ColumnElement[bool]) -> Select:
        """``LINEAGE_COLUMNS`` for the records matching ``where``, from their segments' verdicts."""
        TL = T_TIMELINE
        t, precision = R.c.event_time_ns, func.coalesce(R.c.event_time_precision_ns, 1)
        on = and_(*[TL.c[name] == expr.element for name, expr in zip(_KEY_COLUMNS, _record_key(self.cluster))],
                  TL.c.s <= t, t < TL.c.e)
        return select(
            R.c.id.label("record_id"),
            *_lineage_row(TL, or_(t <= TL.c.skew_until, t + precision > TL.c.skew_from), self.attributed_at,
                          self.settings_id),
        ).select_from(R.join(TL, on)).where(*where)

    def counts(self, table: Any, *where: ColumnElement[bool]) -> dict[tuple[str, str | None], int]:
        rows = self.s.execute(select(table.c.status, table.c.reason, func.count()).where(*where)
                              .group_by(table.c.status, table.c.reason))
        return {(st, r): n for st, r, n in rows}

    def insert_counted(self, rows: Select, *written: ColumnElement[bool]) -> dict[tuple[str, str | None], int]:
        """Insert ``rows`` (``LINEAGE_COLUMNS``) into ``lineage``; counts of the rows inserted.

        PostgreSQL counts what ``INSERT ... RETURNING`` yields in the same statement. SQLite (no DML in
        a CTE) takes the number of rows inserted from the statement and counts the non-exact ones
        among the rows matching ``written`` with this run's ``attributed_at`` afterwards, through the
        partial index ``ix_lineage_not_exact``: reading back every row written cost 0.47 s of 4.8 s
        CPU per million records (bench/lineage_bench.py).
        """
        ins = insert(L).from_select(list(LINEAGE_COLUMNS), rows)
        if self.pg:
            out = ins.returning(L.c.status, L.c.reason).cte("written")
            return self.counts(out)
        inserted = self.s.execute(ins).rowcount
        got = self.counts(L, *written, NOT_EXACT, L.c.attributed_at == literal(self.attributed_at, UTCDateTime()))
        exact = inserted - sum(got.values())
        if exact:
            got[("exact", None)] = exact
        return got

    def attribute_new(self, chunk_records: int) -> dict[tuple[str, str | None], int]:
        """Records without a lineage row, in id chunks of ``chunk_records``; counts written.

        Above the highest attributed id of a chunk no record has a lineage row yet, so that part
        (all of it, in a first run) skips the anti-join with ``lineage``.
        """
        # two scalar subqueries: SQLite answers a lone min() or max() from the primary key, but
        # scans the whole table for both in one SELECT (0.1 s per million records)
        lo, hi = self.s.execute(select(select(func.min(R.c.id)).scalar_subquery(),
                                       select(func.max(R.c.id)).scalar_subquery())).one()
        written: dict[tuple[str, str | None], int] = {}
        if lo is None:
            return written
        unsettled = self.not_yet_observed()
        for start in range(lo, hi + 1, chunk_records):
            end = start + chunk_records
            done = self.s.execute(select(func.max(L.c.record_id)).where(
                L.c.record_id >= start, L.c.record_id < end)).scalar()
            parts = [(start, end, False)] if done is None else [(start, done, True), (done + 1, end, False)]
            for a, b, anti in parts:
                where = [R.c.id >= a, R.c.id < b, *unsettled]
                if anti:
                    where.append(~exists().where(L.c.record_id == R.c.id))
                if not self.build_timeline([select(*_record_key(self.cluster), R.c.event_time_ns.label("t"))
                                            .where(*where)]):
                    continue
                got = self.insert_counted(self.lineage_rows(*where), L.c.record_id >= a, L.c.record_id < b)
                for k, n in got.items():
                    written[k] = written.get(k, 0) + n
        return written

    def not_yet_observed(self) -> list[ColumnElement[bool]]:
        """Conditions leaving out the records whose verdict the live watcher cannot know yet.

        A record at ``t`` depends on every transition up to ``t + skew`` (the skew window): while a
        cluster's watch is live (every kind synced), a record later than its horizon − skew stays
        pending (no lineage row) until the horizon passes, instead of being called ``exact`` and
        never revisited (exact rows are final). A cluster not being watched (gap, stopped) gets its
        verdicts now: its history will not move until the watcher returns (settle window). A record
        later than now + skew waits whatever its cluster (``_awaiting_history``).
        """
        return [~w for w in _awaiting_history(self.s, self.skew_ns, self.cluster, dt_to_ns(self.attributed_at))]

    def collect_unsettled(self, settle_ns: int) -> int:
        """Fill ``T_REVISIT`` with the non-exact rows whose history may have changed since they were
        computed (module docstring, "Late history"):

        * rows later than their cluster's horizon − settle (history of their time may still arrive);
        * ``unknown-cluster`` rows of a cluster that now has watch history: the verdict rested on the
          absence of any history, which the watcher has since ended (whatever the record's time: a
          first watch makes a gap, or coverage, of every earlier instant).

        Records whose verdict the live watcher cannot know yet (``not_yet_observed``) are left as they
        are: re-evaluated now they might become ``exact`` (final) before a transition inside their
        skew window is committed; they stay inside the settle window, so a later run takes them.
        """
        rec_cluster = func.coalesce(R.c.cluster, literal(self.cluster))
        observable = self.not_yet_observed()
        cols = ["record_id", "settings_id"]
        for cluster, horizon_ns in sorted(history_horizons(self.s).items()):
            self.s.execute(insert(T_REVISIT).from_select(cols, select(R.c.id, L.c.settings_id).select_from(
                R.join(L, L.c.record_id == R.c.id)).where(
                R.c.event_time_ns > horizon_ns - settle_ns, L.c.status != "exact", rec_cluster == cluster,
                *observable)))
        known = known_clusters(self.s)
        if known:
            self.s.execute(insert(T_REVISIT).from_select(cols, select(R.c.id, L.c.settings_id).select_from(
                R.join(L, L.c.record_id == R.c.id)).where(
                NOT_EXACT, L.c.reason == "unknown-cluster", rec_cluster.in_(known), *observable,
                ~exists().where(T_REVISIT.c.record_id == R.c.id))))
        return self.s.execute(select(func.count()).select_from(T_REVISIT)).scalar_one()

    def revisit(self) -> dict[tuple[str, str | None], int]:
        """Re-evaluate ``T_REVISIT``; rewrite only the rows whose verdict changed; counts rewritten.

        Each row is re-evaluated with the settings it was computed with (its ``settings_id``: clock-skew
        tolerance, default cluster, serving containers), one group per settings, and keeps them: the
        settle window is for late history, not for another tolerance (a run with a smaller one
        turned the ambiguous rows of an ``--all`` run with a wider one exact, and repeated runs
        ratcheted toward the smallest tolerance any used). ``all=True`` changes the settings of rows.
        Rows without recorded settings (written outside ``attribute_run``) take this run's.
        """
        groups = self.s.execute(select(T_REVISIT.c.settings_id).distinct()).scalars().all()
        stored = {sid: (skew_ns, cluster, json.loads(pins) or None) for sid, skew_ns, cluster, pins in self.s.execute(
            select(AS.c.id, AS.c.clock_skew_ns, AS.c.cluster, AS.c.serving_containers)
            .where(AS.c.id.in_([g for g in groups if g is not None])))}
        own = (self.skew_ns, self.cluster, self.serving, self.settings_id)
        written: dict[tuple[str, str | None], int] = {}
        try:
            for sid in sorted(groups, key=lambda g: (g is None, g or 0)):
                if sid in stored:
                    self.skew_ns, self.cluster, self.serving = stored[sid]
                    self.settings_id = sid
                else:
                    self.skew_ns, self.cluster, self.serving, self.settings_id = own
                in_group = T_REVISIT.c.settings_id == sid if sid is not None else T_REVISIT.c.settings_id.is_(None)
                for k, n in self._revisit_group(in_group).items():
                    written[k] = written.get(k, 0) + n
        finally:
            self.skew_ns, self.cluster, self.serving, self.settings_id = own
        return written

    def _revisit_group(self, in_group: ColumnElement[bool]) -> dict[tuple[str, str | None], int]:
        """``revisit`` of the ``T_REVISIT`` rows matching ``in_group``, with the settings now on ``self``
        (records its live watcher has not passed within that tolerance wait, as in ``collect_unsettled``)."""
        where = [R.c.id.in_(select(T_REVISIT.c.record_id).where(in_group)), *self.not_yet_observed()]
        if not self.build_timeline([select(*_record_key(self.cluster), R.c.event_time_ns.label("t")).where(*where)]):
            return {}
        F = T_FRESH
        self.s.execute(delete(F))
        self.s.execute(insert(F).from_select(list(LINEAGE_COLUMNS), self.lineage_rows(*where)))
        unchanged = exists().where(L.c.record_id == F.c.record_id,
                                   *[L.c[c].is_not_distinct_from(F.c[c]) for c in VERDICT_COLUMNS])
        self.s.execute(delete(F).where(unchanged))
        self.s.execute(delete(L).where(L.c.record_id.in_(select(F.c.record_id))))
        self.s.execute(insert(L).from_select(list(LINEAGE_COLUMNS), select(*[F.c[c] for c in LINEAGE_COLUMNS])))
        return self.counts(F)


def settings_row(session: Session, *, skew_ns: int, cluster: str, serving_containers: Mapping[str, str]) -> int:
    """The ``attribution_settings`` id of these settings, inserted if new (the caller's transaction)."""
    pins = json.dumps(dict(sorted(serving_containers.items())), separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(json.dumps([skew_ns, cluster, pins], ensure_ascii=False).encode()).hexdigest()
    found = session.execute(select(AS.c.id).where(AS.c.digest == digest)).scalar()
    if found is not None:
        return found
    row = {"digest": digest, "clock_skew_ns": skew_ns, "cluster": cluster, "serving_containers": pins}
    new_id = session.execute(insert(AS).values(**row).returning(AS.c.id)).scalar_one()
    # Ledgered: ``ledger verify`` recomputes lineage with these settings, so an edit here (a wider
    # tolerance to match edited lineage rows) must itself show as a broken ledger row.
    ledger.append(session, "attribution_settings", [{**row, "id": new_id}])
    return new_id


def tolerances_in_use(session: Session, *where: ColumnElement[bool]) -> dict[float | None, int]:
    """The clock-skew tolerances the stored lineage of a set of records was computed with.

    ``where``: conditions over ``inference_records`` (and ``lineage``), e.g. a pack's scope filter;
    none = every lineage row. One GROUP BY over the rows' ``attribution_settings``.

    Returns:
        ``{tolerance in seconds: lineage rows}`` in ascending order; the key ``None`` counts rows
        written without recorded settings (outside ``attribute_run``). Records without a lineage
        row are not counted. A pack states the tolerance from this, not from its own setting.
    """
    rows = session.execute(
        select(AS.c.clock_skew_ns, func.count()).select_from(
            R.join(L, L.c.record_id == R.c.id).outerjoin(AS, AS.c.id == L.c.settings_id))
        .where(*where).group_by(AS.c.clock_skew_ns)).all()
    found = {None if ns is None else ns / NS_PER_S: n for ns, n in rows}
    return {k: found[k] for k in sorted(found, key=lambda k: (k is None, k or 0.0))}


def known_clusters(session: Session) -> list[str]:
    """The clusters the store has watch history for (``watch_state`` or ``coverage_intervals``), sorted."""
    return list(session.execute(union(select(WS.c.cluster), select(CI.c.cluster)).order_by("cluster")).scalars())


def live_history_horizons(session: Session) -> dict[str, int]:
    """``history_horizons`` of the clusters whose Pod, ResourceClaim and ResourceSlice watches are
    all synced now (the horizon still moves: the watcher is live)."""
    states: dict[str, set[str]] = {}
    for cluster, state in session.execute(select(WS.c.cluster, WS.c.state).where(WS.c.kind.in_(COVERAGE_KINDS))):
        states.setdefault(cluster, set()).add(state)
    horizons = history_horizons(session)
    return {c: h for c, h in horizons.items() if states.get(c) == {"synced"}}


def pending_counts(session: Session, clock_skew_s: float, cluster: str = DEFAULT_CLUSTER,
                   now: datetime | None = None) -> dict[str, int]:
    """Records without a lineage row that ``attribute_run`` (at ``now``, default now) leaves pending,
    by pending reason: ``{PENDING_HISTORY: n, PENDING_FUTURE: n}`` (disjoint; ``_awaiting_history``).

    Index ranges on the recent end of ``ix_inference_records_time``.
    """
    skew_ns = _skew_ns(clock_skew_s)
    now_ns = dt_to_ns(now or datetime.now(timezone.utc))
    unattributed = ~exists().where(L.c.record_id == R.c.id)
    future = _future(skew_ns, now_ns)

    def count(*where: ColumnElement[bool]) -> int:
        return session.execute(select(func.count()).select_from(R).where(*where, unattributed)).scalar_one()

    live = _live_edges(session, skew_ns, cluster)
    return {PENDING_HISTORY: sum(count(w, ~future) for w in live), PENDING_FUTURE: count(future)}


# Why a record has no lineage row after a run (``trace`` shows it as the reason of status
# ``not-attributed-yet``, ``draudit attribute`` counts each).
PENDING_HISTORY = "awaiting-history"
PENDING_FUTURE = "future-event-time"


def _future(skew_ns: int, now_ns: int) -> ColumnElement[bool]:
    """Records later than ``now + skew``: in the future of any history a watcher can have recorded."""
    return R.c.event_time_ns > now_ns + skew_ns


def _live_edges(session: Session, skew_ns: int, cluster: str) -> list[ColumnElement[bool]]:
    """Per live cluster: its records later than its history horizon − skew (records without a
    cluster count as ``cluster``)."""
    return [and_(func.coalesce(R.c.cluster, literal(cluster)) == c, R.c.event_time_ns > horizon_ns - skew_ns)
            for c, horizon_ns in sorted(live_history_horizons(session).items())]


def _awaiting_history(session: Session, skew_ns: int, cluster: str, now_ns: int) -> list[ColumnElement[bool]]:
    """The pending predicate: conditions, one per way a record's verdict cannot be known yet at
    ``now_ns``; a record matching any is left without a lineage row (``attribute_run``), not
    re-evaluated (its revisits) and not attributed on the fly (``trace``).

    * ``_future``: later than ``now + skew``, whatever the cluster: no watcher can have recorded
      that time, and a verdict made now would project today's state onto it (a live watcher's
      open interval and open pod states reach into the future) or call it a gap the watcher may
      still cover, and exact rows are final;
    * ``_live_edges``: later than a live cluster's horizon − skew: the watcher records it soon.
    """
    return [_future(skew_ns, now_ns), *_live_edges(session, skew_ns, cluster)]


def _pending_reason(session: Session, skew_ns: int, cluster: str, now_ns: int) -> ColumnElement:
    """Per record: ``PENDING_FUTURE``, ``PENDING_HISTORY`` or NULL (``_awaiting_history``)."""
    future, *live = _awaiting_history(session, skew_ns, cluster, now_ns)
    return case((future, literal(PENDING_FUTURE)), (or_(false(), *live), literal(PENDING_HISTORY)), else_=null())


def history_horizons(session: Session) -> dict[str, int]:
    """Per cluster, the newest instant (ns) up to which the watcher knew Pod, ResourceClaim and
    ResourceSlice history complete.

    Per kind: the latest of the open ``watch_state`` interval's start, its ``updated_at`` (last
    commit or bookmark) and the end of its closed ``coverage_intervals``; per cluster the minimum
    over the kinds recorded. Clusters without ``watch_state`` rows are absent.
    """
    per_kind: dict[tuple[str, str], int] = {}
    for cluster, kind, since_ns, updated_at in session.execute(
            select(WS.c.cluster, WS.c.kind, WS.c.state_since_ns, WS.c.updated_at).where(WS.c.kind.in_(COVERAGE_KINDS))):
        per_kind[(cluster, kind)] = max(since_ns, dt_to_ns(updated_at))
    for cluster, kind, ended_ns in session.execute(
            select(CI.c.cluster, CI.c.kind, func.max(CI.c.ended_ns)).where(CI.c.kind.in_(COVERAGE_KINDS))
            .group_by(CI.c.cluster, CI.c.kind)):
        if (cluster, kind) in per_kind:
            per_kind[(cluster, kind)] = max(per_kind[(cluster, kind)], ended_ns)
    horizons: dict[str, int] = {}
    for (cluster, _kind), alive_ns in per_kind.items():
        horizons[cluster] = min(horizons.get(cluster, alive_ns), alive_ns)
    return horizons


def _tune(session: Session) -> None:
    """PostgreSQL: JIT-compiling these wide queries costs about a second and gains nothing at these
    row counts; the per-chunk key aggregation and segment sort fit in memory with a little more work_mem."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL jit = off"))
        session.execute(text("SET LOCAL work_mem = '64MB'"))


def _serialise(session: Session) -> None:
    """Queue behind any other attribution run until this transaction ends.

    PostgreSQL: a transaction-scoped advisory lock. SQLite: a write as the first statement takes
    the database write lock now (waiting up to the busy timeout), before this transaction reads
    anything, so it never works from a snapshot another run is about to invalidate.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(LOCK_KEY)))
    else:
        session.execute(delete(L).where(L.c.record_id.is_(None)))


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttributionSummary:
    """Rows written by one attribution run: counts by status (all three keys) and by reason.

    ``revisited``: non-exact rows re-evaluated inside the settle window; ``revised``: those whose
    verdict changed (rewritten, and included in the counts by status and reason; by status apart in
    ``revised_by_status``). ``new``: transactions attributed for the first time (the rest of the
    counts). ``run_at``: the run's clock (``attributed_at`` of its rows; ``pending_counts(now=...)``
    of what it left pending).
    """

    by_status: dict[str, int]
    by_reason: dict[str, int] = field(default_factory=dict)
    revisited: int = 0
    revised: int = 0
    run_at: datetime | None = field(default=None, compare=False)
    new: int = 0
    revised_by_status: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """``{"exact": n, "ambiguous": n, "unattributed": n, "by_reason": {...}, "revisited": n, "revised": n,
        "new": n}`` (the counts by status and reason cover the new and the revised rows)."""
        return {**self.by_status, "by_reason": dict(self.by_reason), "revisited": self.revisited,
                "revised": self.revised, "new": self.new}


def attribute_run(
    session: Session,
    *,
    all: bool = False,
    clock_skew_s: float = 2.0,
    serving_containers: Mapping[str, str] | None = None,
    cluster: str = DEFAULT_CLUSTER,
    settle_s: float = DEFAULT_SETTLE_S,
    chunk_records: int = DEFAULT_CHUNK_RECORDS,
) -> AttributionSummary:
    """Attribute inference records and write one ``lineage`` row each, in the caller's transaction.

    Incremental by default: records without a lineage row, plus the non-exact rows inside the
    settle window (module docstring, "Late history"), rewritten only if their verdict changed.
    ``all=True`` deletes every lineage row and recomputes (after a history correction).
    Idempotent: a second run without new records or new history writes nothing. Serialised
    against concurrent runs (module docstring, "Concurrency"). Other arguments as in
    ``lineage_select``.

    Args:
        settle_s: seconds before a cluster's history horizon after which non-exact rows are
            re-evaluated (default 600).
        chunk_records: records per id chunk (default 250 000).

    Returns:
        Counts of the rows written by this run, by status and by reason (exact rows have no reason).

    Raises:
        UserError: bad ``clock_skew_s``, ``settle_s``, ``chunk_records`` or ``serving_containers``.
    """
    skew_ns = _skew_ns(clock_skew_s)
    settle_ns = _settle_ns(settle_s)
    if chunk_records < 1:
        raise UserError(f"chunk of {chunk_records} records: must be at least 1")
    if serving_containers:
        _check_pins(serving_containers)
    _serialise(session)
    _tune(session)
    run_at = datetime.now(timezone.utc)
    run = _Run(session, skew_ns=skew_ns, serving_containers=serving_containers, cluster=cluster,
               attributed_at=run_at,
               settings_id=settings_row(session, skew_ns=skew_ns, cluster=cluster,
                                        serving_containers=serving_containers or {}))
    with run:
        if all:
            session.execute(delete(L))
            revisited = 0
        else:
            revisited = run.collect_unsettled(settle_ns)
        written = run.attribute_new(chunk_records)
        revised = run.revisit() if revisited else {}
    by_status = {s: 0 for s in STATUSES}
    by_reason: dict[str, int] = {}
    for counts in (written, revised):
        for (status, reason), n in counts.items():
            by_status[status] += n
            if reason:
                by_reason[reason] = by_reason.get(reason, 0) + n
    revised_by_status = {s: sum(n for (st, _), n in revised.items() if st == s) for s in STATUSES}
    return AttributionSummary(by_status, dict(sorted(by_reason.items())), revisited, sum(revised.values()), run_at,
                              new=sum(written.values()), revised_by_status=revised_by_status)


def attribute(
    session: Session,
    *,
    all: bool = False,
    clock_skew_s: float = 2.0,
    serving_containers: dict[str, str] | None = None,
    cluster: str = DEFAULT_CLUSTER,
    settle_s: float = DEFAULT_SETTLE_S,
) -> dict[str, int]:
    """Attribute inference records to physical GPUs; returns ``{"exact": n, "ambiguous": n, "unattributed": n}``.

    See ``attribute_run`` (same arguments; it also returns counts by reason) and the module
    docstring for the rule (design.md "Attribution", dra-api.md §5.2, §6.3; log-formats.md §5.4).
    The caller commits.
    """
    return attribute_run(session, all=all, clock_skew_s=clock_skew_s, serving_containers=serving_containers,
                         cluster=cluster, settle_s=settle_s).by_status


# --------------------------------------------------------------------------------------------
# verify: the stored lineage is exactly what the rule yields from the ledgered store
# --------------------------------------------------------------------------------------------

# recomputed rows of ``verify_lineage`` (every settings group's), compared with ``lineage`` at the end
T_RECOMPUTED = Table("draudit_lin_recomputed", _TMP,
                     *[Column(c.name, c.type, primary_key=c.primary_key, autoincrement=False) for c in T_FRESH.c],
                     prefixes=["TEMPORARY"])
COMPARED_COLUMNS = ("record_id", *VERDICT_COLUMNS, "settings_id")


@dataclass(frozen=True)
class LineageDifference:
    """The first lineage row that differs from its recomputation: record, transaction id, column, values.

    ``column`` is ``"(row)"`` when one side has no row at all (``stored`` / ``recomputed`` then say
    ``"present"`` or ``"absent"``: a lineage row without its record or without known settings).
    """

    record_id: int
    transaction_id: str | None
    column: str
    stored: Any
    recomputed: Any

    def describe(self) -> str:
        return (f"record {self.record_id} (transaction {self.transaction_id}): {self.column} "
                f"stored {self.stored!r}, recomputed {self.recomputed!r}")


@dataclass(frozen=True)
class LineageAudit:
    """``checked`` lineage rows recomputed; ``differing`` records differ; the first (lowest record id)."""

    checked: int
    differing: int
    first: LineageDifference | None

    @property
    def ok(self) -> bool:
        return self.differing == 0


def verify_lineage(session: Session, *, chunk_records: int = DEFAULT_CHUNK_RECORDS) -> LineageAudit:
    """Recompute every stored lineage row with its own settings and compare; the store is not changed.

    Lineage is derived data, not ledgered: an edited row (another GPU, another status) would pass the
    hash chain. This re-runs the rule (``attribute_run``'s timeline, per ``attribution_settings``
    group: same clock-skew tolerance, default cluster and serving containers the row was computed
    with) for the records that have a lineage row, inside a savepoint that is rolled back, and
    compares both sides with one set query (a primary-key join in each direction, equal to
    ``EXCEPT`` both ways) over ``record_id``, ``VERDICT_COLUMNS`` and ``settings_id``
    (``attributed_at`` is not derived).

    Returns:
        The number of rows checked, of differing records, and the first difference.
    """
    _tune(session)
    savepoint = session.begin_nested()
    try:
        T_RECOMPUTED.create(session.connection())
        for sid, skew_ns, cluster, pins in session.execute(
                select(AS.c.id, AS.c.clock_skew_ns, AS.c.cluster, AS.c.serving_containers)
                .where(AS.c.id.in_(select(L.c.settings_id).distinct())).order_by(AS.c.id)).all():
            _recompute_group(session, sid, skew_ns, cluster, json.loads(pins), chunk_records)
        return _compare(session)
    finally:
        savepoint.rollback()


def _recompute_group(session: Session, settings_id: int, skew_ns: int, cluster: str,
                     pins: Mapping[str, str], chunk_records: int) -> None:
    """Insert into ``T_RECOMPUTED`` the rows of the records whose lineage has ``settings_id``."""
    run = _Run(session, skew_ns=skew_ns, serving_containers=pins, cluster=cluster, attributed_at=datetime.now(
        timezone.utc), settings_id=settings_id)
    lo, hi = session.execute(select(func.min(L.c.record_id), func.max(L.c.record_id))
                             .where(L.c.settings_id == settings_id)).one()
    with run:
        for start in range(lo, hi + 1, chunk_records):
            where = [R.c.id >= start, R.c.id < start + chunk_records,
                     exists().where(L.c.record_id == R.c.id, L.c.settings_id == settings_id)]
            if run.build_timeline([select(*_record_key(cluster), R.c.event_time_ns.label("t")).where(*where)]):
                session.execute(insert(T_RECOMPUTED).from_select(list(LINEAGE_COLUMNS), run.lineage_rows(*where)))


def _compare(session: Session) -> LineageAudit:
    """``lineage`` vs ``T_RECOMPUTED`` on ``COMPARED_COLUMNS``; the first difference spelled out."""
    F = T_RECOMPUTED
    stored = select(*[L.c[c] for c in COMPARED_COLUMNS])
    fresh = select(*[F.c[c] for c in COMPARED_COLUMNS])
    # Both sides are keyed by record_id: a primary-key join per direction (a row differs, or has no
    # counterpart) does what EXCEPT both ways does, without sorting every row on all its columns.
    same = and_(*[L.c[c].is_not_distinct_from(F.c[c]) for c in COMPARED_COLUMNS[1:]])
    diff = union_all(
        select(L.c.record_id).select_from(L.outerjoin(F, F.c.record_id == L.c.record_id))
        .where(or_(F.c.record_id.is_(None), ~same)),
        select(F.c.record_id).where(~exists().where(L.c.record_id == F.c.record_id)),
    ).subquery("diff")
    checked = session.execute(select(func.count()).select_from(L)).scalar_one()
    differing, first_id = session.execute(select(func.count(), func.min(diff.c.record_id))).one()  # disjoint parts
    if not differing:
        return LineageAudit(checked, 0, None)
    txn = session.execute(select(R.c.transaction_id).where(R.c.id == first_id)).scalar()
    a = session.execute(stored.where(L.c.record_id == first_id)).first()
    b = session.execute(fresh.where(T_RECOMPUTED.c.record_id == first_id)).first()
    if a is None or b is None:
        first = LineageDifference(first_id, txn, "(row)", "absent" if a is None else "present",
                                  "absent" if b is None else "present")
    else:
        col = next(c for c in COMPARED_COLUMNS if a._mapping[c] != b._mapping[c])
        first = LineageDifference(first_id, txn, col, a._mapping[col], b._mapping[col])
    return LineageAudit(checked, differing, first)


# --------------------------------------------------------------------------------------------
# trace: one transaction's lineage, with the other tenants of its GPU at that instant
# --------------------------------------------------------------------------------------------


def _overlaps(x: Any, lo: ColumnElement, hi: ColumnElement) -> ColumnElement[bool]:
    """Interval row ``x`` (``valid_from_ns``/``valid_to_ns``) may hold at an instant of the co-tenant
    window ``[lo, hi)``: it starts before ``hi`` and ends at ``lo`` or later (a bound at ``lo``
    counts, as in the skew test, ``_skewed``)."""
    return and_(x.c.valid_from_ns < hi, or_(x.c.valid_to_ns.is_(None), x.c.valid_to_ns >= lo))


def _owner_states(ps: Any, ae: Any, cc: Any, cluster: ColumnElement, lo: ColumnElement,
                  hi: ColumnElement) -> ColumnElement[bool]:
    """ON clause of ``ps`` (an alias of ``pod_states``): the states within the window of the consumer
    ``cc`` when it owns ``ae``'s claim (template claim). Attribution counts such a pod's episode
    whatever the time its reservation was observed (step 4, for a record of that pod, which runs
    then), so ``co_tenants`` counts it while the pod has a state — not after it is gone while its
    claim is still allocated (deallocation lags)."""
    return and_(ae.c.owner_pod_uid == cc.c.consumer_uid, ps.c.cluster == cluster, ps.c.pod_uid == cc.c.consumer_uid,
                _overlaps(ps, lo, hi))


def _co_tenants_stmt() -> Select:
    """Bound parameters ``cluster``, ``gpu``, ``t``, ``skew`` (ns, default 0), ``prec`` (the record's time
    precision, ns, default 1); see ``co_tenants``. Built once: a trace runs it per id. Rows as
    ``_tenant_documents`` reads them."""
    t, skew = bindparam("t", type_=BigInteger), bindparam("skew", 0, type_=BigInteger)
    lo, hi = t - skew, t + bindparam("prec", 1, type_=BigInteger) + skew
    ps = PS.alias("pso")
    return (
        select(AE.c.claim_namespace, CC.c.consumer_name, CC.c.consumer_uid, AE.c.claim_name, CC.c.consumer_api_group,
               CC.c.consumer_resource, AE.c.id, AE.c.valid_from_ns, AE.c.valid_to_ns, CC.c.valid_from_ns,
               CC.c.valid_to_ns, ps.c.valid_from_ns, ps.c.valid_to_ns)
        .select_from(
            DS.join(AR, and_(AR.c.driver == DS.c.driver, AR.c.pool == DS.c.pool, AR.c.device == DS.c.device,
                             AR.c.admin_access == False))  # noqa: E712
            # the episode's device as allocated (step 5): the record of the GPU in force when it began
            .join(AE, and_(AE.c.id == AR.c.episode_id, AE.c.cluster == DS.c.cluster, _overlaps(AE, lo, hi),
                           _as_allocated(DS, AR, AE, None)))
            # as attribution counts them (step 4): reserved, or the claim's owner pod while it runs
            .join(CC, and_(CC.c.episode_id == AE.c.id, or_(_overlaps(CC, lo, hi), AE.c.owner_pod_uid == CC.c.consumer_uid)))
            .outerjoin(ps, _owner_states(ps, AE, CC, DS.c.cluster, lo, hi))
        )
        .where(DS.c.cluster == bindparam("cluster"), DS.c.gpu_uuid == bindparam("gpu"))
        .distinct()
    )


_CO_TENANTS = _co_tenants_stmt()


def _tenant_window(t_ns: int, skew_ns: int, precision_ns: int | None) -> tuple[int, int]:
    """The co-tenant window ``[lo, hi)`` of a record at ``t_ns``: the instants it may mean,
    ``[t, t + precision)``, widened by the tolerance on both sides — a transition at ``b`` counts when
    ``t - skew <= b < t + precision + skew``, as in the skew test (``_skewed``)."""
    return t_ns - skew_ns, t_ns + (precision_ns or 1) + skew_ns


def co_tenants(session: Session, *, cluster: str, physical_gpu_uuid: str, t_ns: int,
               exclude_pod_uid: str | None, clock_skew_s: float = 2.0,
               precision_ns: int | None = 1) -> list[dict[str, Any]]:
    """Consumers of any device of ``physical_gpu_uuid`` at some instant of the window around
    ``t_ns`` (``_tenant_window``: ``clock_skew_s`` on both sides of ``[t_ns, t_ns + precision_ns)``),
    other than ``exclude_pod_uid``.

    A consumer is a ``reservedFor`` entry (``claim_consumers``) of an allocation episode with a
    non-adminAccess result on a device whose record as allocated (``_as_allocated``: the one in
    force when the episode began, as attribution reads it) belongs to the GPU (its own UUID or its
    MIG parent's), while both the episode and the reservation hold; so is the pod that owns the
    claim (template claim) while the episode holds and the pod has a state, whatever the time its
    reservation was observed, as attribution counts it (module docstring, step 4). A consumer is
    listed when it holds at ``t_ns`` or its holding starts or ends within the window (the
    collector's observation times are accurate to the tolerance only, so it may have held at
    ``t_ns``); ``certain`` is true when it holds over the whole window (no such transition):
    two pods' traces at one instant (and tolerance) name each other or neither, each naming the
    other ``certain`` when both transactions are ``exact``.

    A consumer that is not a pod (``reservedFor`` naming another resource, e.g. a
    ``scheduling.k8s.io`` PodGroup, dra-api.md §9) is listed with its kind: ``pod`` and ``pod_uid``
    are null, ``consumer`` names the resource, ``name`` and ``uid`` the consumer.

    Returns:
        ``[{"namespace", "pod", "pod_uid", "claim", "consumer", "name", "uid", "certain"}]``
        (``_tenant_documents``) sorted by namespace, name, claim.
    """
    return _co_tenants_in(session, cluster, physical_gpu_uuid, t_ns,
                          *_tenant_window(t_ns, _skew_ns(clock_skew_s), precision_ns), exclude_pod_uid)


def _co_tenants_in(session: Session, cluster: str, gpu: str, t_ns: int, lo: int, hi: int,
                   exclude_pod_uid: str | None) -> list[dict[str, Any]]:
    """``co_tenants`` of a record at ``t_ns`` whose window (``_tenant_window``) is ``[lo, hi)``."""
    skew_ns = t_ns - lo
    rows = session.execute(_CO_TENANTS, {"cluster": cluster, "gpu": gpu, "t": t_ns, "skew": skew_ns,
                                         "prec": hi - t_ns - skew_ns}).all()
    return _tenant_documents({tuple(r) for r in rows}, exclude_pod_uid, lo, hi)


POD_CONSUMER = "pod"  # ``co_tenants``' ``consumer`` of a pod (``reservedFor`` apiGroup "", resource "pods")


def _consumer_kind(api_group: str | None, resource: str | None) -> str:
    """``pod`` for a pod consumer; else ``resource.apiGroup`` as kubectl names a resource
    (``podgroups.scheduling.k8s.io``), ``resource`` alone in the core group, ``unknown`` without one."""
    if not api_group and resource == "pods":
        return POD_CONSUMER
    return ".".join(x for x in (resource, api_group) if x) or "unknown"


_Span = tuple[int, "int | None"]


def _merged(spans: Iterable[_Span]) -> list[_Span]:
    """Half-open spans ``[from, to)`` (``to`` None: open) as disjoint ones; touching spans are one."""
    out: list[_Span] = []
    for f, e in sorted(spans, key=lambda s: s[0]):
        if out and (out[-1][1] is None or f <= out[-1][1]):
            last_f, last_e = out[-1]
            out[-1] = (last_f, None if last_e is None or e is None else max(last_e, e))
        else:
            out.append((f, e))
    return out


def _tenant_documents(rows: set[tuple], exclude_pod_uid: str | None, lo: int, hi: int) -> list[dict[str, Any]]:
    """``co_tenants`` documents of the rows of ``_CO_TENANTS`` (or ``_TRACE``'s ``ct_*``): (namespace,
    consumer name, consumer uid, claim, consumer apiGroup, resource, episode id, episode from, to,
    reservation from, to, owner pod state from, to — NULL when none), for the window ``[lo, hi)``.

    A consumer holds the GPU while an episode holds and, within it, its reservation or (owner pod)
    a state of the pod does; it is listed when it holds at some instant of ``[lo, hi)`` or its
    holding ends at ``lo`` (a bound at ``lo`` counts, as in the skew test), and ``certain`` when one
    holding span covers the window with no bound in it. Sorted by namespace, name, claim, uid;
    without ``exclude_pod_uid``'s."""
    held: dict[tuple, dict[int, tuple[_Span, set[_Span]]]] = {}
    for ns, name, uid, claim, group, resource, episode, ae_from, ae_to, cc_from, cc_to, ps_from, ps_to in rows:
        if exclude_pod_uid is not None and uid == exclude_pod_uid:
            continue
        _, holds = held.setdefault((ns, name, claim, uid, _consumer_kind(group, resource)), {}).setdefault(
            episode, ((ae_from, ae_to), set()))
        holds.add((cc_from, cc_to))
        if ps_from is not None:
            holds.add((ps_from, ps_to))
    docs = []
    for (ns, name, claim, uid, kind), episodes in sorted(held.items(), key=lambda kv: kv[0]):
        spans = []
        for (ae_from, ae_to), holds in episodes.values():
            for f, e in _merged(holds):
                f, e = max(f, ae_from), (e if ae_to is None else ae_to if e is None else min(e, ae_to))
                if e is None or f < e:
                    spans.append((f, e))
        spans = _merged(spans)
        if not any(f < hi and (e is None or e >= lo) for f, e in spans):
            continue
        pod = kind == POD_CONSUMER
        docs.append({"namespace": ns, "pod": name if pod else None, "pod_uid": uid if pod else None, "claim": claim,
                     "consumer": kind, "name": name, "uid": uid,
                     "certain": any(f < lo and (e is None or e >= hi) for f, e in spans)})
    return docs


def _empty_trace(transaction_id: str) -> dict[str, Any]:
    return {
        "transaction_id": transaction_id, "time": None, "status": "not-found", "reason": None,
        "pod": {"namespace": None, "name": None, "uid": None, "node": None},
        "claim": {"namespace": None, "name": None, "uid": None, "request": None},
        "device": {"driver": None, "pool": None, "device": None},
        "device_uuid": None, "physical_gpu_uuid": None, "product": None, "mig_profile": None, "co_tenants": [],
        "conflict": False, "record_id": None, "cluster": None, "container": None, "decision": None,
        "candidates": None, "attribution": None, "identity_conflict": [],
    }


def trace(session: Session, transaction_ids: Iterable[str], *, cluster: str = DEFAULT_CLUSTER,
          clock_skew_s: float = 2.0, serving_containers: Mapping[str, str] | None = None,
          pan_token_key: bytes | None = None) -> list[dict[str, Any]]:
    """The lineage of each transaction id, in the order given, as JSON-ready documents.

    Each stored record of the id yields one document (an id stored twice with different content —
    ``conflict`` — yields two). A record not yet attributed is attributed on the fly with the given
    settings (nothing is written), unless an attribution run would leave it pending
    (``_awaiting_history``): then its status is ``not-attributed-yet`` with reason
    ``awaiting-history`` (within the skew tolerance of what the live watcher has recorded) or
    ``future-event-time`` (later than now + skew), never a verdict on history not observed yet.
    An unknown id yields one document with status ``not-found``. An id holding a card number
    (``collector.ingest.pan.mask_identifier``, with ``pan_token_key`` as ingestion had it) is found by
    its masked form, as ingestion stored it, and its documents name that form, never the card number.
    When that form is not stored but tokened forms of it are (the query gave the masked form, or
    the key is missing or another), each of those ids is traced: candidates, told apart by their ids.

    One statement per id (``_TRACE``: records, lineage, pod name and co-tenants) for attributed
    records; a record attributed on the fly costs three more (``lineage_select``, ``_POD_NAME``,
    ``_CO_TENANTS``).

    Returns:
        ``[{"transaction_id", "time" (RFC 3339 UTC), "status", "reason",
        "pod": {namespace, name, uid, node}, "claim": {namespace, name, uid, request},
        "device": {driver, pool, device}, "device_uuid", "physical_gpu_uuid", "product",
        "mig_profile", "co_tenants": [{namespace, pod, pod_uid, claim, consumer, name, uid, certain}]
        (``co_tenants``: every consumer of the GPU within the tolerance the record's lineage row was
        computed with, else ``clock_skew_s``), "conflict", "record_id",
        "cluster", "container", "decision", "candidates"}]``; ``conflict`` is true for a record
        stored after another with the same id and different content (the ingest flag: the shipper
        or the application logged two different things under one id), and ``record_id``
        (``inference_records.id``), ``container`` (the logging container) and ``decision`` (the
        model's, as logged) tell such records apart; ``cluster`` is the record's, else ``cluster``;
        ``candidates`` as in ``lineage`` (distinct GPUs plus results without a device record; the
        pods for ``several-pods``). New keys are added at the end: existing ones keep name and order.
    """
    out: list[dict[str, Any]] = []
    skew_ns = _skew_ns(clock_skew_s)
    _generic_plans(session)
    for given in transaction_ids:
        # an id holding a card number is stored masked, and is echoed masked: a saved trace must
        # not hold the card number either
        for stored, (records, tenants) in _trace_ids(session, given, pan_token_key, cluster, skew_ns):
            if not records:
                out.append(_empty_trace(stored))
                continue
            out.extend(_trace_records(session, stored, records, tenants, cluster, clock_skew_s, serving_containers))
    return out


def _trace_ids(session: Session, given: str, pan_token_key: bytes | None,
               cluster: str, skew_ns: int) -> list[tuple[str, tuple[list, dict]]]:
    """The stored ids to trace for the query ``given``: its stored form (``mask_identifier`` with the
    key) when stored; else, for a masked id, every stored ``<masked form>~<token>`` id — the query
    gave the masked form, or the token key is missing or another — each its own transaction; else
    the stored form with no records (not found)."""
    txn = mask_identifier(given, pan_token_key)[0]
    found = _trace_rows(session, txn, cluster, skew_ns)
    masked = mask_identifier(given)[0] if not found[0] else ""
    if found[0] or "*" not in masked:
        return [(txn, found)]
    pattern = masked.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "~%"
    ids = session.execute(select(R.c.transaction_id).where(R.c.transaction_id.like(pattern, escape="\\"))
                          .distinct().order_by(R.c.transaction_id)).scalars().all()
    return [(i, _trace_rows(session, i, cluster, skew_ns)) for i in ids] or [(txn, found)]


def _trace_records(session: Session, txn: str, records: list, tenants: dict, cluster: str, clock_skew_s: float,
                   serving_containers: Mapping[str, str] | None) -> list[dict[str, Any]]:
    """The documents of one stored id's records (``trace``)."""
    out: list[dict[str, Any]] = []
    missing = [r.id for r in records if r.lineage_id is None]
    live = {}
    pending = _pending_of(session, missing, clock_skew_s, cluster) if missing else {}
    if len(pending) < len(missing):
        live_q = lineage_select(all=True, clock_skew_s=clock_skew_s, serving_containers=serving_containers,
                                cluster=cluster, record_ids=[i for i in missing if i not in pending])
        live = {row.record_id: row for row in session.execute(live_q)}
    for rec in records:
        if rec.id in pending:
            out.append(_pending_document(txn, rec, cluster, pending[rec.id]))
        else:
            out.append(_trace_document(session, txn, rec, live.get(rec.id, rec), cluster, tenants[rec.id]))
    return out


def _pending_of(session: Session, record_ids: Sequence[int], clock_skew_s: float, cluster: str) -> dict[int, str]:
    """Of these records (without a lineage row), those an attribution run now would leave pending,
    with the pending reason (``_awaiting_history``, the run's own predicate): ``trace`` must not
    call exact what the run would not."""
    reason = _pending_reason(session, _skew_ns(clock_skew_s), cluster, dt_to_ns(datetime.now(timezone.utc)))
    return dict(session.execute(select(R.c.id, reason).where(R.c.id.in_(list(record_ids)), reason.is_not(None))).all())


def _pending_document(txn: str, rec: Any, default_cluster: str, reason: str) -> dict[str, Any]:
    """A record an attribution run leaves pending: status ``not-attributed-yet`` (the packs' word for a
    record without lineage) with ``reason`` ``PENDING_HISTORY`` or ``PENDING_FUTURE``; only what the
    record itself says (its pod reference), nothing from the history."""
    doc = _empty_trace(txn)
    doc.update({
        "time": ns_to_rfc3339(rec.event_time_ns), "status": "not-attributed-yet", "reason": reason,
        "pod": {"namespace": rec.rec_pod_namespace, "name": rec.rec_pod_name, "uid": rec.rec_pod_uid, "node": None},
        "conflict": bool(rec.conflict), "record_id": rec.id, "cluster": rec.cluster or default_cluster,
        "container": rec.rec_container, "decision": rec.rec_decision,
    })
    return doc


def _generic_plans(session: Session) -> None:
    """PostgreSQL: ``SET LOCAL plan_cache_mode = auto`` once per transaction of the caller.

    Every connection plans each statement for its own parameters (``force_custom_plan``,
    ``collector.store.db``), which made planning ``_TRACE`` (a dozen joined tables, five
    subqueries) most of a trace's server CPU: 1.2 ms of it, against 0.2 ms when psycopg's prepared
    statement (from its 6th execution on a connection) runs a generic plan. A generic plan is
    safe here: every table is reached by an index equality on a parameter (the transaction id) or
    on a joined column, so the plan does not depend on the values. The setting lasts until the
    caller's transaction ends (``SET LOCAL``); trace does not restore it after each call, which
    would cost a round trip per id where the bench (and a service) traces one id per call.
    """
    if session.get_bind().dialect.name != "postgresql":
        return
    conn = session.connection()
    transaction = conn.get_transaction()
    if conn.info.get(_GENERIC_PLANS_IN) is not transaction:
        conn.exec_driver_sql("SET LOCAL plan_cache_mode = auto")
        conn.info[_GENERIC_PLANS_IN] = transaction


_GENERIC_PLANS_IN = "draudit.trace_generic_plans_in"  # Connection.info key: the transaction it was set in


def _trace_rows(session: Session, txn: str, cluster: str, skew_ns: int) -> tuple[list[Any], dict[int, set[tuple]]]:
    """``_TRACE`` for one id: its records (first row of each, in time order) and, per record id, the
    distinct co-tenant rows (``_tenant_documents``) of its stored lineage's GPU; ``skew_ns``: the
    tolerance of records whose lineage names no settings (or that have none)."""
    records: list[Any] = []
    tenants: dict[int, set[tuple]] = {}
    for row in session.execute(_TRACE, {"txn": txn, "cluster": cluster, "skew": skew_ns}):
        if row.id not in tenants:
            records.append(row)
            tenants[row.id] = set()
        if row.consumer_uid is not None:  # NOT NULL in claim_consumers: NULL = no reservation on this row
            tenants[row.id].add(tuple(row[-13:]))
    return records, tenants


def _pod_state(cluster: ColumnElement, uid: ColumnElement, t: ColumnElement, column: str,
               ps: Any = PS) -> ColumnElement:
    """``column`` (never NULL in a state) of pod ``uid``'s state valid at ``t``, else of its latest state.

    Two scalar subqueries: SQLite does not see an outer column in a subquery's ORDER BY. ``ps``: the
    ``pod_states`` table or an alias of it.
    """
    def latest(*where: ColumnElement[bool]) -> ColumnElement:
        return (select(ps.c[column]).where(ps.c.cluster == cluster, ps.c.pod_uid == uid, *where)
                .order_by(ps.c.valid_from_ns.desc()).limit(literal_column("1")).scalar_subquery())

    return func.coalesce(latest(_valid_at(ps, t)), latest())


def _trace_stmt() -> Select:
    """Bound parameters ``txn``, ``cluster`` (of records without one), ``skew`` (ns: the tolerance of
    records whose lineage row names no settings; default 0): the id's stored records, each with its
    lineage (NULL ``lineage_id``: not attributed yet), its pod's state namespace/name, its co-tenant
    window ``[lo, hi)`` (``_tenant_window`` with the tolerance its lineage row was computed with) and
    the co-tenant rows of its lineage's GPU (the last 13 columns, ``ct_*``, as ``_co_tenants_stmt``'s:
    not distinct, the record's own pod included), ordered by time and record id.

    A record yields one row per allocation result of its GPU's devices whose episode holds in its
    window, per consumer counted then (``co_tenants``' rule: reserved then, or the claim's owner)
    and per state of an owner pod then; ``ct_*`` NULL where none is, one row if there is none or it
    has no GPU.

    One round trip per id: on a shared machine each round trip waits for the server process to be
    scheduled, which made most of a trace's p99 when this was two statements. Planned in a fixed
    order (record, lineage, device states of the GPU by ``ix_device_states_gpu``, results, episode,
    reservation) by a chain of LEFT JOINs, which neither planner may reorder: PostgreSQL joined the
    inner-join form from every allocation episode, SQLite materialised a LEFT JOIN to the inner join
    of the four tables (every allocation result). The records are a subquery with ``OFFSET 0``, which
    neither database flattens, so the pod state lookups run once per record, not once per row.

    Tables under short aliases, LIMIT/OFFSET as literals, the pod's state reached by its primary key
    (two lookups, not four) and the two lineage columns a trace does not read left out keep the SQL
    text at most 4096 characters (4074 with the co-tenant window; mind it when adding to this
    statement), the longest psycopg caches the conversion of to PostgreSQL's ``$n`` placeholders
    for: longer, it parsed the text again on each call (0.1 ms of client CPU per trace). Count the
    text as the psycopg dialect renders it, parameters cast (``%(txn)s::VARCHAR``): the plain
    PostgreSQL dialect's is shorter (before the window, 4091 there was 4145 as sent, uncached).
    The columns are listed, not ``rec.*``: SQLAlchemy caches the result metadata of a statement
    whose columns it knows, and matched a textual ``*`` to the cursor's columns by name on every
    call (0.3 ms of client CPU per trace).
    """
    r, lin, st, ps, pn, ds, ar, ae, cc, pso = (t.alias(a) for t, a in (
        (R, "r"), (L, "l"), (AS, "s"), (PS, "ps"), (PS, "pn"), (DS, "ds"), (AR, "ar"), (AE, "ae"), (CC, "cc"),
        (PS, "pso")))
    cluster = func.coalesce(r.c.cluster, bindparam("cluster", type_=String()))
    skew = func.coalesce(st.c.clock_skew_ns, bindparam("skew", 0, type_=BigInteger))
    rec = (
        select(r.c.id, r.c.event_time_ns, r.c.cluster, r.c.conflict, cluster.label("eff_cluster"),
               r.c.container_name.label("rec_container"), r.c.decision.label("rec_decision"),
               r.c.pod_uid.label("rec_pod_uid"),
               r.c.pod_namespace.label("rec_pod_namespace"),
               r.c.pod_name.label("rec_pod_name"), lin.c.record_id.label("lineage_id"),
               *[lin.c[c] for c in VERDICT_COLUMNS if c not in ("episode_id", "device_state_id")],
               pn.c.namespace.label("state_namespace"), pn.c.name.label("state_name"),
               (r.c.event_time_ns - skew).label("lo"),
               (r.c.event_time_ns + func.coalesce(r.c.event_time_precision_ns, literal_column("1")) + skew).label("hi"))
        .select_from(r.outerjoin(lin, lin.c.record_id == r.c.id).outerjoin(st, st.c.id == lin.c.settings_id)
                     # the pod's state at t, else its latest (``_pod_state``): one primary-key probe
                     .outerjoin(pn, pn.c.id == _pod_state(cluster, lin.c.pod_uid, r.c.event_time_ns, "id", ps)))
        .where(r.c.transaction_id == bindparam("txn"))
        .offset(literal_column("0"))
        .subquery("rec")
    )
    lo, hi = rec.c.lo, rec.c.hi
    ae_valid = AE.alias("aev")
    chain = (
        # every record of the GPU: an episode holding in the window may have been allocated under any of them
        rec.outerjoin(ds, and_(ds.c.cluster == rec.c.eff_cluster, ds.c.gpu_uuid == rec.c.physical_gpu_uuid))
        # only the results of episodes holding in the window whose device as allocated is this record
        # (a primary-key probe per result the device ever had): else every one would come back as a row
        .outerjoin(ar, and_(ar.c.driver == ds.c.driver, ar.c.pool == ds.c.pool, ar.c.device == ds.c.device,
                            ar.c.admin_access == False,  # noqa: E712
                            exists().where(ae_valid.c.id == ar.c.episode_id, _overlaps(ae_valid, lo, hi),
                                           _as_allocated(ds, ar, ae_valid, None))))
        # holding in the window: the results joined are those of such episodes (above)
        .outerjoin(ae, and_(ae.c.id == ar.c.episode_id, ae.c.cluster == ds.c.cluster))
        .outerjoin(cc, and_(cc.c.episode_id == ae.c.id, or_(_overlaps(cc, lo, hi), ae.c.owner_pod_uid == cc.c.consumer_uid)))
        .outerjoin(pso, _owner_states(pso, ae, cc, ds.c.cluster, lo, hi))
    )
    return (
        select(*[c for c in rec.c if c.name != "eff_cluster"], ae.c.claim_namespace, cc.c.consumer_name,
               cc.c.consumer_uid, ae.c.claim_name, cc.c.consumer_api_group, cc.c.consumer_resource, ae.c.id,
               ae.c.valid_from_ns, ae.c.valid_to_ns, cc.c.valid_from_ns, cc.c.valid_to_ns, pso.c.valid_from_ns,
               pso.c.valid_to_ns)
        .select_from(chain)
        .order_by(rec.c.event_time_ns, rec.c.id)
    )


_TRACE = _trace_stmt()
# The same pod state lookup for a record attributed on the fly.
_POD_NAME = select(*[_pod_state(bindparam("cluster"), bindparam("uid"), bindparam("t", type_=BigInteger), c)
                     .label(f"state_{c}") for c in ("namespace", "name")])


def _trace_document(session: Session, txn: str, rec: Any, lin: Any, default_cluster: str,
                    tenants: set[tuple]) -> dict[str, Any]:
    """One record's document; ``tenants``: the co-tenant rows ``_TRACE`` joined to its stored lineage
    (a record attributed on the fly, ``lin`` not ``rec``, queries its own)."""
    cluster = rec.cluster or default_cluster
    t = rec.event_time_ns
    state = rec
    if lin is not rec and lin.pod_uid is not None:
        state = session.execute(_POD_NAME, {"cluster": cluster, "uid": lin.pod_uid, "t": t}).one()
    pod_ns, pod_name = rec.rec_pod_namespace, rec.rec_pod_name
    if lin.pod_uid is not None and state.state_name is not None and lin.reason != "pod-identity-conflict":
        pod_ns, pod_name = state.state_namespace, state.state_name
    doc = _empty_trace(txn)
    doc.update({
        "time": ns_to_rfc3339(t), "status": lin.status, "reason": lin.reason,
        "pod": {"namespace": pod_ns, "name": pod_name, "uid": lin.pod_uid, "node": lin.node_name},
        "claim": {"namespace": lin.claim_namespace, "name": lin.claim_name, "uid": lin.claim_uid,
                  "request": lin.request},
        "device": {"driver": lin.driver, "pool": lin.pool, "device": lin.device},
        "device_uuid": lin.device_uuid, "physical_gpu_uuid": lin.physical_gpu_uuid,
        "product": lin.product_name, "mig_profile": lin.mig_profile, "conflict": bool(rec.conflict),
        "record_id": rec.id, "cluster": cluster, "container": rec.rec_container, "decision": rec.rec_decision,
        "candidates": lin.candidates,
        # the verdict stored by an attribution run, or computed now by this trace (nothing written)
        "attribution": "stored" if lin is rec else "computed",
    })
    if lin is not rec and lin.physical_gpu_uuid is not None:
        # not attributed yet: ``rec``'s window has the tolerance of this trace (no settings)
        doc["co_tenants"] = _co_tenants_in(session, cluster, lin.physical_gpu_uuid, t, rec.lo, rec.hi, lin.pod_uid)
    elif lin is rec:
        doc["co_tenants"] = _tenant_documents(tenants, lin.pod_uid, rec.lo, rec.hi)
    if lin.reason == "pod-identity-conflict":
        doc["identity_conflict"] = identity_conflict(session, cluster, rec.id, t)
    return doc


def identity_conflict(session: Session, cluster: str, record_id: int, t_ns: int) -> list[dict[str, Any]]:
    """Why record ``record_id`` is ``pod-identity-conflict`` (module docstring, step 2): each field
    in which it contradicts the history at ``t_ns``, as ``{"field", "record", "observed"}`` —
    ``namespace``/``name``/``node`` against the state of the pod its uid names, or, for a uid with
    no pod state then, ``uid`` against the pod(s) its namespace and name were then; for a
    record without a uid, ``node`` against the pod(s) its namespace and name were then.

    Returns:
        The contradictions, in that field order (empty if the history no longer shows one).
    """
    rec = session.execute(select(R.c.pod_uid, R.c.pod_namespace, R.c.pod_name, R.c.node_name)
                          .where(R.c.id == record_id)).one()
    if rec.pod_uid is None:  # by namespace/name: the node of each pod of that name then
        nodes = session.execute(select(PS.c.node_name).where(
            PS.c.cluster == cluster, PS.c.namespace == rec.pod_namespace, PS.c.name == rec.pod_name,
            _valid_at(PS, t_ns), PS.c.node_name.is_not(None), PS.c.node_name != rec.node_name)
            .distinct().order_by(PS.c.node_name)).scalars().all() if rec.node_name is not None else []
        return [{"field": "node", "record": rec.node_name, "observed": node} for node in nodes]
    state = session.execute(select(PS.c.namespace, PS.c.name, PS.c.node_name).where(
        PS.c.cluster == cluster, PS.c.pod_uid == rec.pod_uid, _valid_at(PS, t_ns))).first()
    if state is not None:
        pairs = (("namespace", rec.pod_namespace, state.namespace), ("name", rec.pod_name, state.name),
                 ("node", rec.node_name, state.node_name))
        return [{"field": f, "record": mine, "observed": seen} for f, mine, seen in pairs
                if mine is not None and seen is not None and mine != seen]
    named = session.execute(select(PS.c.pod_uid).where(
        PS.c.cluster == cluster, PS.c.namespace == rec.pod_namespace, PS.c.name == rec.pod_name,
        _valid_at(PS, t_ns)).order_by(PS.c.pod_uid)).scalars().all()
    return [{"field": "uid", "record": rec.pod_uid, "observed": uid} for uid in named]
