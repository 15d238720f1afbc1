"""The pack's populations: SQL over the store, streamed row by row into ``data/<name>.csv`` and ``.json``.

Each population has stable column names (documented in the methodology section and used by
auditors' sampling scripts); times are given twice, as RFC 3339 UTC text (``*_at``/``valid_from``)
and as integer nanoseconds (``*_ns``). The JSON file is a "split" table, the same rows as the CSV::

    {"columns":["transaction_id","event_time",...],"data":[
    ["txn-1","2026-11-28T00:00:00.5Z",...],
    ...
    ]}

``columns`` is the CSV header, ``data`` one array per CSV record, values in column order as strings,
integers, booleans, nested JSON (findings' subjects and evidence) or null. It is the layout
``pandas.read_json(path, orient="split")`` reads; any JSON reader pairs ``columns`` with each row.
Why not one object per row: the keys repeated on every row were 384 of the ≈ 970 bytes a
transaction took in the two files, and a pack for millions of transactions is bound by the bytes
it writes.

Rows are ordered by a total order (ending with a primary key) so the same store gives
byte-identical files. Populations bounded by claims and devices
(inventory, allocation episodes, consumers) are read with ``yield_per`` and formatted in Python.
The transaction lineage, which grows with traffic, is rendered to CSV and JSON text by the database
(``reports.sqltext``; ``COPY ... TO STDOUT`` on PostgreSQL) and written in batches, the CSV and the
JSON file in parallel on two connections that read one snapshot; the same rows give the same bytes
on SQLite and PostgreSQL. Files are hashed while written (on the writer threads). Memory stays
bounded whatever the period holds.

Scope: a half-open period ``[from_ns, to_ns)``; interval rows are selected when they overlap it,
point rows (transactions) when their time falls in it. ``clusters`` empty means every cluster;
``namespaces`` empty means every namespace (namespace filters apply to claims, consumers and
transactions; inventory and coverage are cluster-wide facts).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import queue
import re
import sqlite3
import threading
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import lru_cache
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from sqlalchemy import (BigInteger, Column, Index, MetaData, String, Table, Text, and_, case, delete, func, insert,
                        literal, literal_column, or_, select, text)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session, aliased
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.sql.functions import FunctionElement

from collector.kube.normalize import device_capacity_bytes
from collector.store.models import (
    AllocationEpisode,
    AllocationResult,
    AttributionSettings,
    ClaimConsumer,
    CoverageInterval,
    DeviceState,
    InferenceRecord,
    Lineage,
    Quarantine,
    WatchState,
)
from collector.timeutil import ns_to_dt, ns_to_rfc3339
from reports import sqltext
from reports.manifest import FileDigest, Sha256

YIELD_PER = 10_000
EXPORT_BATCH = 20_000  # rows per fetch and per write of the transaction lineage


@lru_cache(maxsize=65_536)
def _second_text(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def _rfc3339(value_ns: int | None) -> str | None:
    """``collector.timeutil.ns_to_rfc3339`` with the per-second text cached (rows arrive in time order)."""
    if value_ns is None:
        return None
    seconds, rem = divmod(value_ns, 1_000_000_000)
    base = _second_text(seconds)
    return f"{base}.{f'{rem:09d}'.rstrip('0')}Z" if rem else base + "Z"
OPEN_END_NS = 2**62  # stands for "still valid" when clipping open intervals


@dataclass(frozen=True)
class Scope:
    """What a pack covers: period ``[from_ns, to_ns)`` (UTC ns), clusters and namespaces (sorted, empty = all).

    ``stops``: cluster → its last observation when the collector stopped before the period end
    (``collector_stops``); known once coverage is read, it marks intervals open at that instant.
    """

    from_ns: int
    to_ns: int
    clusters: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    tenants: dict[str, str] = field(default_factory=dict, compare=False)
    stops: dict[str, int] = field(default_factory=dict, compare=False)

    def tenant_of(self, namespace: str | None) -> str | None:
        """Tenant of a namespace: the policy bundle's mapping, else the namespace itself."""
        if namespace is None:
            return None
        return self.tenants.get(namespace, namespace)

    def open_at_last_observation(self, cluster: str, valid_to_ns: int | None) -> bool:
        """Whether an interval of ``cluster`` had not ended when its collector stopped before the
        period end (what the HTML shows as "open at last observation"): nothing later is known."""
        return valid_to_ns is None and cluster in self.stops


def _overlaps(valid_from, valid_to, scope: Scope):
    return and_(valid_from < scope.to_ns, or_(valid_to.is_(None), valid_to > scope.from_ns))


def in_clusters(column, scope: Scope):
    """WHERE clause: ``column`` is one of the scope's clusters (always true when the scope names none)."""
    return column.in_(scope.clusters) if scope.clusters else literal(True)


_in_clusters = in_clusters


def _in_namespaces(column, scope: Scope):
    return column.in_(scope.namespaces) if scope.namespaces else literal(True)


def _physical(ds):
    return func.coalesce(ds.physical_gpu_uuid, ds.parent_uuid, ds.uuid)


@dataclass(frozen=True)
class Population:
    """A named population: columns, a statement builder and a row formatter (row → list of values)."""

    name: str
    columns: tuple[str, ...]
    statement: Callable[[Scope], Any]
    format_row: Callable[[Any, Scope], list[Any]]


# -------------------------------------------------------------------------------- inventory

INVENTORY_COLUMNS = (
    "cluster", "node_name", "physical_gpu_uuid", "device_type", "device_uuid", "parent_uuid", "mig_profile",
    "product_name", "memory_bytes", "driver_version", "driver", "pool", "device", "slice_name", "pool_generation",
    "allow_multiple_allocations", "valid_from", "valid_to", "valid_from_ns", "valid_to_ns", "device_state_id",
    "open_at_last_observation",
)


def _inventory_stmt(scope: Scope):
    ds = DeviceState
    return (select(ds.cluster, ds.node_name, _physical(ds).label("physical"), ds.device_type, ds.uuid, ds.parent_uuid,
                   ds.profile, ds.product_name, ds.memory_bytes, ds.driver_version, ds.driver, ds.pool, ds.device,
                   ds.slice_name, ds.pool_generation, ds.allow_multiple_allocations, ds.valid_from_ns, ds.valid_to_ns,
                   ds.id, ds.capacity)
            .where(_overlaps(ds.valid_from_ns, ds.valid_to_ns, scope), _in_clusters(ds.cluster, scope))
            .order_by(ds.cluster, _physical(ds), ds.driver, ds.pool, ds.device, ds.valid_from_ns, ds.id))


def device_memory(memory_bytes: int | None, capacity: Any, driver: str) -> int | None:
    """A device's memory in bytes: the stored ``memory_bytes``, else the ResourceSlice's ``memory``
    capacity (a Kubernetes quantity, short or driver-qualified name); None when neither is usable."""
    if memory_bytes is not None or not isinstance(capacity, dict):
        return memory_bytes
    try:
        return device_capacity_bytes({"capacity": capacity}, "memory", driver)
    except ValueError:
        return None


def _inventory_row(r, scope: Scope) -> list[Any]:
    return [r.cluster, r.node_name, r.physical, r.device_type, r.uuid, r.parent_uuid, r.profile, r.product_name,
            device_memory(r.memory_bytes, r.capacity, r.driver), r.driver_version, r.driver, r.pool, r.device, r.slice_name, r.pool_generation,
            bool(r.allow_multiple_allocations), _rfc3339(r.valid_from_ns), _rfc3339(r.valid_to_ns),
            r.valid_from_ns, r.valid_to_ns, r.id, scope.open_at_last_observation(r.cluster, r.valid_to_ns)]


# -------------------------------------------------------------------------------- allocation episodes

EPISODE_COLUMNS = (
    "cluster", "claim_namespace", "tenant", "claim_name", "claim_uid", "episode_id", "first_rv", "request",
    "driver", "pool", "device", "device_class_name", "admin_access", "share_id", "node_name", "physical_gpu_uuid",
    "device_type", "device_uuid", "mig_profile", "valid_from", "valid_to", "valid_from_ns", "valid_to_ns",
    "allocation_result_id", "open_at_last_observation",
)


def _device_state_at_episode(e, r):
    """Correlated subquery: the device record of result ``r`` in force when episode ``e`` began.

    Prefers the record valid at the episode start, of the highest pool generation when several
    slices publish the device (then the latest), as attribution and the policy facts resolve it
    (``collector.lineage``, ``collector.policy.facts``); if the ResourceSlice was observed only
    after the claim, the earliest record overlapping the episode. A stale generation's record
    published later put a pack's allocation on another GPU than its findings (a tester's finding).
    """
    d = aliased(DeviceState)
    same = and_(d.cluster == e.cluster, d.driver == r.driver, d.pool == r.pool, d.device == r.device)
    before = (select(d.id).where(same, d.valid_from_ns <= e.valid_from_ns,
                                 or_(d.valid_to_ns.is_(None), d.valid_to_ns > e.valid_from_ns))
              .order_by(d.pool_generation.desc(), d.valid_from_ns.desc(), d.id.desc()).limit(1)
              .correlate(e, r).scalar_subquery())
    after = (select(d.id).where(same, d.valid_from_ns > e.valid_from_ns,
                                d.valid_from_ns < func.coalesce(e.valid_to_ns, OPEN_END_NS))
             .order_by(d.valid_from_ns, d.pool_generation.desc(), d.id).limit(1).correlate(e, r).scalar_subquery())
    return func.coalesce(before, after)


def _episodes_stmt(scope: Scope):
    e, r, ds = AllocationEpisode, AllocationResult, aliased(DeviceState)
    return (select(e.cluster, e.claim_namespace, e.claim_name, e.claim_uid, e.id.label("episode_id"), e.first_rv,
                   r.request, r.driver, r.pool, r.device, r.device_class_name, r.admin_access, r.share_id,
                   func.coalesce(ds.node_name, e.node_name).label("node_name"), _physical(ds).label("physical"),
                   ds.device_type, ds.uuid, ds.profile, e.valid_from_ns, e.valid_to_ns, r.id.label("result_id"))
            .select_from(e)
            .join(r, r.episode_id == e.id)
            .outerjoin(ds, ds.id == _device_state_at_episode(e, r))
            .where(_overlaps(e.valid_from_ns, e.valid_to_ns, scope), _in_clusters(e.cluster, scope),
                   _in_namespaces(e.claim_namespace, scope))
            .order_by(e.cluster, e.valid_from_ns, e.id, r.id))


def episodes_beside_scope(session: Session, scope: Scope) -> Iterator[list[Any]]:
    """Rows (``EPISODE_COLUMNS``, as the allocation-episodes population formats them) of the
    episodes of the scope's clusters and period whose namespace is NOT in the namespace scope;
    nothing when the scope names no namespace. Not written to the pack's populations.

    Sharing and co-tenancy are facts about a GPU: a scoped tenant shared it with whoever else held
    it, in scope or not, so the pack computes them over every namespace and keeps the intervals a
    scoped namespace took part in (``reports.render``)."""
    if not scope.namespaces:
        return
    every_namespace = Scope(scope.from_ns, scope.to_ns, scope.clusters, (), scope.tenants)
    stmt = _episodes_stmt(every_namespace).where(AllocationEpisode.claim_namespace.not_in(scope.namespaces))
    for row in session.connection().execute(stmt.execution_options(yield_per=YIELD_PER)):
        yield _episode_row(row, scope)


def _episode_row(r, scope: Scope) -> list[Any]:
    return [r.cluster, r.claim_namespace, scope.tenant_of(r.claim_namespace), r.claim_name, r.claim_uid, r.episode_id,
            r.first_rv, r.request, r.driver, r.pool, r.device, r.device_class_name, bool(r.admin_access), r.share_id,
            r.node_name, r.physical, r.device_type, r.uuid, r.profile, _rfc3339(r.valid_from_ns),
            _rfc3339(r.valid_to_ns), r.valid_from_ns, r.valid_to_ns, r.result_id,
            scope.open_at_last_observation(r.cluster, r.valid_to_ns)]


# -------------------------------------------------------------------------------- consumers

CONSUMER_COLUMNS = (
    "cluster", "claim_namespace", "tenant", "claim_name", "claim_uid", "episode_id", "consumer_api_group",
    "consumer_resource", "consumer_name", "consumer_uid", "valid_from", "valid_to", "valid_from_ns", "valid_to_ns",
    "consumer_interval_id", "open_at_last_observation",
)


def _consumers_stmt(scope: Scope):
    c, e = ClaimConsumer, AllocationEpisode
    return (select(c.cluster, e.claim_namespace, e.claim_name, c.claim_uid, c.episode_id, c.consumer_api_group,
                   c.consumer_resource, c.consumer_name, c.consumer_uid, c.valid_from_ns, c.valid_to_ns, c.id)
            .join(e, e.id == c.episode_id)
            .where(_overlaps(c.valid_from_ns, c.valid_to_ns, scope), _in_clusters(c.cluster, scope),
                   _in_namespaces(e.claim_namespace, scope))
            .order_by(c.cluster, c.valid_from_ns, c.id))


def _consumer_row(r, scope: Scope) -> list[Any]:
    return [r.cluster, r.claim_namespace, scope.tenant_of(r.claim_namespace), r.claim_name, r.claim_uid, r.episode_id,
            r.consumer_api_group, r.consumer_resource, r.consumer_name, r.consumer_uid, _rfc3339(r.valid_from_ns),
            _rfc3339(r.valid_to_ns), r.valid_from_ns, r.valid_to_ns, r.id,
            scope.open_at_last_observation(r.cluster, r.valid_to_ns)]


# -------------------------------------------------------------------------------- transaction lineage

LINEAGE_COLUMNS = (
    "transaction_id", "event_time", "event_time_ns", "cluster", "pod_namespace", "pod_name", "pod_uid",
    "container_name", "model_name", "model_version", "decision", "status", "reason", "candidates", "claim_namespace",
    "claim_name", "request", "driver", "pool", "device", "device_uuid", "physical_gpu_uuid", "mig_profile",
    "node_name", "co_tenant_namespaces", "co_tenant_namespaces_possible", "record_id", "raw_sha256", "conflict",
)


@dataclass(frozen=True)
class CoTenancy:
    """While ``[from_ns, to_ns)``, claims of ``namespace`` on physical GPU ``gpu`` had claims of the
    namespaces ``others`` (``;``-separated, sorted) beside them on the same GPU (a sharing interval).
    ``from_ns`` / ``to_ns`` None: the interval runs on before / after (a sharing interval cut at the
    pack's period is not a start or an end)."""

    gpu: str
    namespace: str
    from_ns: int | None
    to_ns: int | None
    others: str


DEFAULT_CLOCK_SKEW_NS = 2_000_000_000  # the collector's default tolerance (settings.clock_skew_s)


@dataclass(frozen=True)
class CoTenancyInput:
    """What ``write_lineage`` joins for the co-tenant columns: the pack's sharing intervals per
    namespace (``intervals``) and ``clock_skew_ns``, the tolerance of the transactions whose lineage
    row names no attribution settings (the collector's setting at rendering, as ``draudit trace``
    uses for them)."""

    intervals: Sequence[CoTenancy]
    clock_skew_ns: int = DEFAULT_CLOCK_SKEW_NS


# Bounds standing for "before" / "after" everything (BIGINT's range): an open end of an interval.
_OPEN_FROM, _OPEN_TO = -(2 ** 63), 2 ** 63 - 1

# Loaded per pack rendering (``write_lineage``) on the rendering connection, dropped after it.
# ``CO_TENANCY``: per (GPU, namespace), the time cut into disjoint pieces ``[piece_from_ns,
# piece_to_ns)`` (the first from ``_OPEN_FROM``, the last to ``_OPEN_TO``) over which the other
# namespaces sharing the GPU with it (``others``, ``;``-separated, sorted; NULL when none) stay the
# same, each looked up by its parts ``[from_ns, to_ns)``: the piece cut at every ``lookup_ns`` step
# of the period, so the part holding a transaction's instant ``t`` starts after ``t - lookup_ns``
# (an index range of a few rows, not every piece before ``t``). At most one part holds an instant.
# Each piece also names the start of the one before it (``prev_from_ns``) and the end of the one
# after it (``next_to_ns``), with the certain and possible namespaces of a window reaching into that
# neighbour only (``start_*`` / ``end_*``: those in both pieces / in one of them).
CO_TENANCY = Table("draudit_pack_co_tenancy", MetaData(), Column("gpu", String(128)), Column("namespace", String(253)),
                   Column("from_ns", BigInteger), Column("to_ns", BigInteger), Column("piece_from_ns", BigInteger),
                   Column("piece_to_ns", BigInteger), Column("others", Text), Column("prev_from_ns", BigInteger),
                   Column("start_certain", Text), Column("start_possible", Text), Column("next_to_ns", BigInteger),
                   Column("end_certain", Text), Column("end_possible", Text),
                   Index("ix_draudit_pack_co_tenancy", "gpu", "namespace", "from_ns"), prefixes=["TEMPORARY"])
# ``CO_TENANT_SPANS``: per (GPU, namespace, other namespace), the disjoint, non-touching spans
# ``[from_ns, to_ns)`` the two shared the GPU (touching sharing intervals merged), each with the end
# of the other namespace's span before it (``prev_to_ns``; ``_OPEN_FROM`` for its first) and
# ``other_rank``, the other namespace's place in the sorted names (the columns list them in that
# order); each span in parts ``[chunk_from_ns, chunk_to_ns)`` cut as the pieces are (from a tolerance
# before the period on), so the parts a window reaches start in a short index range.
CO_TENANT_SPANS = Table("draudit_pack_co_tenant_spans", MetaData(), Column("gpu", String(128)),
                        Column("namespace", String(253)), Column("other_namespace", String(253)),
                        Column("other_rank", BigInteger), Column("chunk_from_ns", BigInteger),
                        Column("chunk_to_ns", BigInteger), Column("from_ns", BigInteger), Column("to_ns", BigInteger),
                        Column("prev_to_ns", BigInteger),
                        Index("ix_draudit_pack_co_tenant_spans", "gpu", "namespace", "chunk_from_ns"),
                        prefixes=["TEMPORARY"])
_CO_TABLES = (CO_TENANCY, CO_TENANT_SPANS)


@dataclass(frozen=True)
class _CoTables:
    """The rows of ``CO_TENANCY`` and ``CO_TENANT_SPANS`` (tuples in column order), the tolerance of
    transactions without attribution settings and the step the pieces are cut at (None: not cut, the
    lookup reads every piece before the instant); false when there is no sharing to join."""

    pieces: list[tuple]
    spans: list[tuple]
    skew_ns: int
    lookup_ns: int | None = None

    def __bool__(self) -> bool:
        return bool(self.pieces)

    def rows(self) -> tuple[list[tuple], list[tuple]]:
        return self.pieces, self.spans


def _merged_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Half-open spans as disjoint, non-touching ones."""
    out: list[tuple[int, int]] = []
    for f, e in sorted(spans):
        if out and f <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((f, e))
    return out


LOOKUP_MIN_NS = 60 * 1_000_000_000  # the shortest step the pieces are cut at
MAX_CLOCK_SKEW_NS = 86_400 * 1_000_000_000  # the largest tolerance (collector.lineage.MAX_CLOCK_SKEW_S)
LOOKUP_MAX_PARTS = 20_000  # about as many cuts in all (loaded on each connection), the step growing to keep them


def co_tenancy_tables(co_tenancy: "Sequence[CoTenancy] | CoTenancyInput", scope: Scope | None = None,
                      max_skew_ns: int = MAX_CLOCK_SKEW_NS) -> _CoTables:
    """The temporary tables' rows for ``co_tenancy`` (sharing intervals per namespace; a bare sequence
    with ``DEFAULT_CLOCK_SKEW_NS``). With ``scope``, the pieces and spans are cut at every
    ``lookup_ns`` of the period (``CO_TENANCY``, ``CO_TENANT_SPANS``; the spans from ``max_skew_ns``,
    the largest tolerance of a transaction, before it): at least ``LOOKUP_MIN_NS``, longer when the
    spans would make more than about ``LOOKUP_MAX_PARTS`` cuts. Linear in the sharing intervals and
    the cuts (plus sorting), never in the transactions."""
    given = co_tenancy if isinstance(co_tenancy, CoTenancyInput) else CoTenancyInput(tuple(co_tenancy))
    by_pair: dict[tuple[str, str], dict[str, list[tuple[int, int]]]] = {}
    for c in given.intervals:
        f = _OPEN_FROM if c.from_ns is None else c.from_ns
        e = _OPEN_TO if c.to_ns is None else c.to_ns
        if f >= e:
            continue
        for other in c.others.split(";"):
            if other and other != c.namespace:
                by_pair.setdefault((c.gpu, c.namespace), {}).setdefault(other, []).append((f, e))
    rank = {name: k for k, name in enumerate(sorted({o for others in by_pair.values() for o in others}))}
    pieces: list[tuple] = []
    spans: list[tuple] = []
    for (gpu, namespace), by_other in sorted(by_pair.items()):
        changes: dict[int, list[tuple[str, int]]] = {}
        for other in sorted(by_other, key=rank.__getitem__):
            prev = _OPEN_FROM
            for f, e in _merged_spans(by_other[other]):
                spans.append((gpu, namespace, other, rank[other], f, e, prev))
                prev = e
                changes.setdefault(f, []).append((other, 1))
                changes.setdefault(e, []).append((other, -1))
        # sweep the span bounds: between two consecutive ones the other namespaces stay the same
        present: set[str] = set()
        start, last = _OPEN_FROM, None
        mine: list[tuple[int, int, str | None]] = []
        for point in sorted(changes):
            for other, step in changes[point]:
                (present.add if step > 0 else present.discard)(other)
            now = ";".join(sorted(present, key=rank.__getitem__)) or None
            if point == start:  # an open start: the first piece begins with it
                last = now
                continue
            if now != last:
                mine.append((start, point, last))
                start, last = point, now
        if start < _OPEN_TO:
            mine.append((start, _OPEN_TO, last))
        pieces.extend((gpu, namespace, *_with_neighbours(mine, k, rank)) for k in range(len(mine)))
    if scope is None or not by_pair:
        return _CoTables([(g, n, f, e, f, e, *rest) for g, n, f, e, *rest in pieces],
                         [(g, n, o, r, f, e, f, e, p) for g, n, o, r, f, e, p in spans], given.clock_skew_ns)
    # a window [t - skew, ...) of a transaction in the period starts after ``first``: the spans are
    # cut from there (the pieces, looked up by ``t`` alone, from the period's start)
    first = scope.from_ns - max(max_skew_ns, given.clock_skew_ns) - 1
    step = max(LOOKUP_MIN_NS, -(-(scope.to_ns - scope.from_ns) * len(spans) // LOOKUP_MAX_PARTS), 1)
    first -= (first - scope.from_ns) % step  # on the period's grid, at or before the bound
    parts = [(g, n, a, b, f, e, *rest) for g, n, f, e, *rest in pieces
             for a, b in _cut(f, e, scope.from_ns, scope.to_ns, step)]
    chunks = [(g, n, o, r, a, b, f, e, p) for g, n, o, r, f, e, p in spans
              for a, b in _cut(f, e, first, scope.to_ns, step)]
    return _CoTables(parts, chunks, given.clock_skew_ns, step)


def _with_neighbours(pieces: list[tuple[int, int, str | None]], k: int, rank: dict[str, int]) -> tuple:
    """Piece ``k`` of one GPU and namespace (``pieces``: consecutive ``(from, to, others)``) as
    ``CO_TENANCY`` holds it after gpu and namespace: from, to, others, then the start of the piece
    before it and the (certain, possible) namespaces of a window reaching into that one only, the
    end of the piece after it and the same for a window reaching into that one only."""
    f, e, others = pieces[k]

    def across(a: str | None, b: str | None) -> tuple[str | None, str | None]:
        one, two = set(a.split(";")) if a else set(), set(b.split(";")) if b else set()
        return (";".join(sorted(one & two, key=rank.__getitem__)) or None,
                ";".join(sorted(one ^ two, key=rank.__getitem__)) or None)

    prev_from, *start = (pieces[k - 1][0], *across(pieces[k - 1][2], others)) if k else (_OPEN_FROM, None, None)
    next_to, *end = ((pieces[k + 1][1], *across(others, pieces[k + 1][2])) if k + 1 < len(pieces)
                     else (_OPEN_TO, None, None))
    return (f, e, others, prev_from, *start, next_to, *end)


def _cut(f: int, e: int, grid_from: int, grid_to: int, step: int) -> list[tuple[int, int]]:
    """``[f, e)`` cut at every ``grid_from + k * step`` (k >= 0) before ``grid_to`` inside it."""
    out, a = [], f
    cut = grid_from + max(0, -(-(f - grid_from) // step)) * step
    while cut < e and cut < grid_to:
        if cut > a:
            out.append((a, cut))
            a = cut
        cut += step
    out.append((a, e))
    return out


class _namespace_list(FunctionElement):
    """Aggregate: the ``other`` values of the rows joined by ``;`` (``group_concat`` / ``string_agg``),
    used as a window function ordered by rank (``.over``): SQLite before 3.44 has no ORDER BY inside
    an aggregate, both follow the window's order."""

    type = Text()
    inherit_cache = True
    name = "namespace_list"


@compiles(_namespace_list)
def _namespace_list_sqlite(element, compiler, **kw):
    return f"group_concat({compiler.process(element.clauses, **kw)}, ';')"


@compiles(_namespace_list, "postgresql")
def _namespace_list_postgresql(element, compiler, **kw):
    return f"string_agg({compiler.process(element.clauses, **kw)}, ';')"


def lineage_filter(scope: Scope):
    """WHERE clause of the transactions in scope (shared by the population and its summaries)."""
    i, l = InferenceRecord, Lineage
    return and_(i.event_time_ns >= scope.from_ns, i.event_time_ns < scope.to_ns, _in_clusters(i.cluster, scope),
                _in_namespaces(func.coalesce(l.claim_namespace, i.pod_namespace), scope))


def _lineage_stmt(scope: Scope, co_tenancy: bool = False, clock_skew_ns: int = DEFAULT_CLOCK_SKEW_NS,
                  lookup_ns: int | None = None):
    """Transactions in scope joined to their lineage; columns labelled as in ``LINEAGE_COLUMNS`` (``event_time``
    excepted: it is rendered from ``event_time_ns``); ordered by event time then record id.

    ``co_tenancy``: the co-tenant columns from the loaded ``CO_TENANCY`` and ``CO_TENANT_SPANS``
    tables (``_co_tenant_columns``; ``clock_skew_ns``: the tolerance of rows without attribution
    settings; ``lookup_ns``: the step the pieces are cut at, ``co_tenancy_tables``); else both columns
    are null.
    """
    i, l = InferenceRecord, Lineage
    certain, possible = _co_tenant_columns(clock_skew_ns, lookup_ns) if co_tenancy else (literal(None, Text),) * 2
    stmt = (select(i.transaction_id, i.event_time_ns, i.cluster, i.pod_namespace, i.pod_name,
                   func.coalesce(l.pod_uid, i.pod_uid).label("pod_uid"), i.container_name, i.model_name,
                   i.model_version, i.decision, func.coalesce(l.status, NOT_ATTRIBUTED).label("status"), l.reason,
                   l.candidates, l.claim_namespace, l.claim_name, l.request, l.driver, l.pool, l.device,
                   l.device_uuid, l.physical_gpu_uuid, l.mig_profile,
                   func.coalesce(l.node_name, i.node_name).label("node_name"), certain.label("co_tenant_namespaces"),
                   possible.label("co_tenant_namespaces_possible"), i.id.label("record_id"), i.raw_sha256, i.conflict)
            .select_from(i).outerjoin(l, l.record_id == i.id))
    if co_tenancy:
        c = CO_TENANCY.c
        bounded = [] if lookup_ns is None else [c.from_ns > i.event_time_ns - literal(lookup_ns, BigInteger)]
        stmt = (stmt.outerjoin(AttributionSettings, AttributionSettings.id == l.settings_id)
                .outerjoin(CO_TENANCY, and_(c.gpu == l.physical_gpu_uuid, c.namespace == l.claim_namespace,
                                            c.from_ns <= i.event_time_ns, c.to_ns > i.event_time_ns, *bounded)))
    return stmt.where(lineage_filter(scope)).order_by(i.event_time_ns, i.id)


def _co_tenant_columns(clock_skew_ns: int, lookup_ns: int | None = None) -> tuple[Any, Any]:
    """``co_tenant_namespaces`` and ``co_tenant_namespaces_possible`` of a transaction, as ``draudit
    trace`` tells its co-tenants ``certain`` or not (``collector.lineage.co_tenants``), from the
    pack's sharing intervals.

    The window of a record at ``t`` is ``[lo, hi)`` = ``[t - skew, t + precision + skew)``, ``skew``
    the tolerance its lineage row was computed with (``attribution_settings``), else
    ``clock_skew_ns``. Another namespace is certain when one of its spans beside the transaction's
    claim namespace on the GPU covers the window with no bound in it (``from < lo`` and ``to >= hi``),
    possible when not certain but a span reaches into the window (``from < hi`` and ``to >= lo``:
    it started or ended within the tolerance); each column lists them sorted, ``;``-separated, NULL
    when none.

    Set-based, at most one joined row per transaction: the ``CO_TENANCY`` piece holding ``t`` (the
    FROM clause, by the part of it holding ``t``). When the window lies inside that piece — nearly
    every transaction, the pieces being as long as the sharing stays the same — the piece's
    namespaces are the certain ones and none is possible; when it reaches into the piece before or
    after only, the piece's ``start_*`` / ``end_*`` columns answer. Only a window across three pieces
    or more reads ``CO_TENANT_SPANS`` (two indexed scalar subqueries over a short index range of
    parts, one part per span; a possible namespace is counted at its first span in the window, by
    ``prev_to_ns``). A transaction on a GPU and namespace without sharing joins no piece: both null.
    """
    i, c, sp = InferenceRecord, CO_TENANCY.c, CO_TENANT_SPANS.c
    skew = func.coalesce(AttributionSettings.clock_skew_ns, literal(clock_skew_ns, BigInteger))
    lo = i.event_time_ns - skew
    hi = i.event_time_ns + func.coalesce(i.event_time_precision_ns, literal(1, BigInteger)) + skew
    covers = and_(sp.from_ns < lo, sp.to_ns >= hi)
    # one part per span: the one holding max(lo, from_ns), or the last when the span ends at lo; it
    # starts within lookup_ns before lo (or after lo, before hi)
    part = [or_(sp.chunk_from_ns <= lo, sp.chunk_from_ns == sp.from_ns),
            or_(sp.chunk_to_ns > lo, sp.chunk_to_ns == sp.to_ns), sp.chunk_from_ns < hi]
    if lookup_ns is not None:
        part.append(sp.chunk_from_ns >= lo - literal(lookup_ns, BigInteger))

    def names(*where) -> Any:
        listed = _namespace_list(sp.other_namespace).over(order_by=sp.other_rank, rows=(None, None))
        return (select(listed).where(sp.gpu == c.gpu, sp.namespace == c.namespace, *part, *where)
                .limit(literal_column("1")).scalar_subquery())

    no_piece = c.gpu.is_(None)
    inside = and_(c.piece_from_ns < lo, c.piece_to_ns >= hi)
    into_next = and_(c.piece_from_ns < lo, c.next_to_ns >= hi)  # (not inside: across the piece's end)
    into_prev = and_(c.prev_from_ns < lo, c.piece_to_ns >= hi)  # (across the piece's start)
    certain = case((no_piece, literal(None, Text)), (inside, c.others), (into_next, c.end_certain),
                   (into_prev, c.start_certain), else_=names(covers))
    possible = case((or_(no_piece, inside), literal(None, Text)), (into_next, c.end_possible),
                    (into_prev, c.start_possible),
                    else_=names(sp.to_ns >= lo, sp.from_ns < hi, sp.prev_to_ns < lo, ~covers))
    return certain, possible


NOT_ATTRIBUTED = "not-attributed-yet"
_LINEAGE_INT = frozenset({"event_time_ns", "candidates", "record_id"})


def _lineage_row(r, scope: Scope) -> list[Any]:
    # Positional unpacking: this runs once per transaction (millions), attribute access costs 3x.
    (txn, t_ns, cluster, pod_ns, pod, pod_uid, container, model, model_version, decision, status, reason, candidates,
     claim_ns, claim, request, driver, pool, device, device_uuid, gpu, mig, node, co_tenants, possible, record_id,
     raw_sha, conflict) = r
    return [txn, _rfc3339(t_ns), t_ns, cluster, pod_ns, pod, pod_uid, container, model, model_version, decision,
            status, reason, candidates, claim_ns, claim, request, driver, pool, device,
            device_uuid, gpu, mig, node, co_tenants, possible, record_id, raw_sha, bool(conflict)]


def _lineage_text_spec() -> list[tuple[str, str, str]]:
    """(name, column of subquery ``t``, kind) of every lineage column, for ``reports.sqltext``."""
    spec = []
    for name in LINEAGE_COLUMNS:
        source = "event_time_ns" if name == "event_time" else name
        kind = (sqltext.TIME if name == "event_time" else sqltext.INT if name in _LINEAGE_INT
                else sqltext.BOOL if name == "conflict" else sqltext.TEXT)
        spec.append((name, sqltext.column_ref("t", source), kind))
    return spec


def _lineage_text_inner(scope: Scope, co_tenancy: bool, record_ids: Sequence[int] | None = None,
                        clock_skew_ns: int = DEFAULT_CLOCK_SKEW_NS, lookup_ns: int | None = None):
    inner = _lineage_stmt(scope, co_tenancy, clock_skew_ns, lookup_ns).order_by(None)
    if record_ids is not None:
        inner = inner.where(InferenceRecord.id.in_(record_ids))
    return inner.subquery("t")


def lineage_text_stmt(scope: Scope, dialect: str, co_tenancy: bool = False,
                      clock_skew_ns: int = DEFAULT_CLOCK_SKEW_NS, lookup_ns: int | None = None):
    """The transaction-lineage population rendered as text by PostgreSQL, in the population's order:
    the statement for ``COPY ... TO STDOUT WITH (JSON_COPY_OPTIONS)``, whose output rows are, once
    bracketed, the rows' JSON arrays (``reports.sqltext.copy_json_value``, ``json_rows_from_copy``) and
    give their CSV lines too (``csv_rows_from_copy``). SQLite renders each row's JSON array
    (``_sqlite_json_stmt``).

    Raises:
        ValueError: ``dialect`` is not ``postgresql``.
    """
    if dialect != "postgresql":
        raise ValueError(f"COPY statements are PostgreSQL's, not {dialect!r}'s")
    inner = _lineage_text_inner(scope, co_tenancy, clock_skew_ns=clock_skew_ns, lookup_ns=lookup_ns)
    fields = [literal_column(sqltext.copy_json_value(expr, kind, dialect)).label(name)
              for name, expr, kind in _lineage_text_spec()]
    return select(*fields).select_from(inner).order_by(inner.c.event_time_ns, inner.c.record_id)


def _sqlite_json_stmt(scope: Scope, co_tenancy: bool, clock_skew_ns: int = DEFAULT_CLOCK_SKEW_NS,
                      lookup_ns: int | None = None):
    """SQLite, one pass: the JSON array of each row (``reports.sqltext.json_array_sql``), in the
    population's order; the CSV lines are derived from them (``csv_rows_from_json``)."""
    inner = _lineage_text_inner(scope, co_tenancy, clock_skew_ns=clock_skew_ns, lookup_ns=lookup_ns)
    return (select(literal_column(sqltext.json_array_sql(_lineage_text_spec(), "sqlite")))
            .select_from(inner).order_by(inner.c.event_time_ns, inner.c.record_id))


_SEPARATORS = len(LINEAGE_COLUMNS) - 1


def csv_rows_from_copy(chunk: bytes, rows: int, json_rows: bytes, separators: int = _SEPARATORS) -> bytes:
    """The CSV lines (each ended by LF; fields as ``csv_line``) of ``rows`` whole rows of ``COPY``
    output under ``JSON_COPY_OPTIONS`` (``chunk``), whose JSON arrays ``json_rows`` are
    (``reports.sqltext.json_rows_from_copy``): one COPY renders both files.

    Why it is exact: in that output every text and time value is quoted, a quote or backslash
    inside a value is escaped by a backslash, NULL is the unquoted field ``null``, and integers and
    booleans are written as in CSV. In a chunk with no backslash, no CR, exactly one LF per row and
    ``separators`` commas per row, no value holds ``"``, ``\\``, CR, LF or ``,``: its CSV is the
    chunk with the ``null`` fields emptied and the quotes removed (``""``, the empty string, becomes
    the empty field, as ``csv_field`` writes it). Any other chunk — values that need quoting are rare
    in transaction data — is re-read from its JSON arrays and written by ``csv_line``.
    """
    if (b"\\" not in chunk and b"\r" not in chunk and chunk.count(b"\n") == rows
            and chunk.count(b",") == rows * separators):
        # An unquoted field is an integer, true, false or null: ``,null`` is always a null field
        # (not the first of its row), ``\nnull`` the first field of the next row.
        text = chunk.replace(b",null", b",").replace(b"\nnull", b"\n").translate(None, b'"')
        return text[4:] if chunk.startswith(b"null") else text
    return b"".join([csv_line(json.loads(line.rstrip(b","))).encode() + b"\n" for line in json_rows.split(b"\n")])


def csv_rows_from_json(arrays: Sequence[bytes], separators: int = _SEPARATORS) -> tuple[bytes, bytes]:
    """``(csv, json)`` of rows given as their JSON arrays (compact, ``json_array_sql``): the CSV lines
    (``csv_rows_from_copy``) and the arrays as the next ``data`` lines of a split table (``,`` + LF
    between them).

    Why it is exact: a JSON array ``[...]`` without its brackets is the row as COPY writes it under
    ``JSON_COPY_OPTIONS`` whenever it holds no backslash (no value holds ``"``, ``\\`` or a control
    character, which JSON escapes), the only chunks ``csv_rows_from_copy`` converts as text; the
    others it re-reads from the arrays.
    """
    if not arrays:
        return b"", b""
    lines = b"\n".join(arrays)
    # "]\n[" is only ever between two arrays: a line feed inside a JSON string is escaped.
    chunk = lines[1:-1].replace(b"]\n[", b"\n") + b"\n"
    json_rows = lines.replace(b"]\n[", b"],\n[")
    return csv_rows_from_copy(chunk, len(arrays), json_rows, separators), json_rows


def _compiled(conn, stmt) -> tuple[str, Any]:
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    if compiled.positiontup is not None:
        params = tuple(params[k] for k in compiled.positiontup)
    return compiled.string, params


JSON_COPY_OPTIONS = sqltext.copy_json_options(_lineage_text_spec())


def write_lineage(session: Session, scope: Scope, directory: Path, batch_rows: int = EXPORT_BATCH,
                  co_tenancy: "Sequence[CoTenancy] | CoTenancyInput" = (),
                  expected_rows: int = 0) -> "WrittenPopulation":
    """Stream the transaction-lineage population into ``data/transaction_lineage.csv|json`` (the JSON a
    split table, as every population), hashing as it writes.

    The rows are rendered to text by the database, once for both files. PostgreSQL: ``COPY (SELECT
    ...) TO STDOUT`` (``lineage_text_stmt``), read a few chunks ahead on a thread (``_ReadAhead``) so
    the server renders while the chunks become the JSON (``reports.sqltext.json_rows_from_copy``) and
    CSV (``csv_rows_from_copy``) text. With ``expected_rows`` (the population's count in this
    snapshot) of at least two ``SEGMENT_ROWS``, the period is cut into time segments read by two
    connections in turn — the session's and a twin reading its exported snapshot
    (``_snapshot_twin``; the session must be REPEATABLE READ, as ``render_pack`` reads) — so two
    server processes render them; the segments are written in order. SQLite: one query giving each
    row's JSON array (``_sqlite_json_stmt``), the CSV derived from them (``csv_rows_from_json``);
    from ``SQLITE_PROCESS_MIN_ROWS`` on, its time segments in worker processes
    (``_sqlite_in_processes``). Fetched ``batch_rows`` at a time: memory is bounded by a few
    batches per file. The files are byte-identical across the two backends for the same rows.

    ``co_tenancy`` (the pack's sharing intervals per namespace, and the tolerance of rows without
    attribution settings: ``CoTenancyInput``; a bare sequence: ``DEFAULT_CLOCK_SKEW_NS``) is loaded
    into two temporary tables (``co_tenancy_tables``) on each connection for the
    ``co_tenant_namespaces`` and ``co_tenant_namespaces_possible`` columns (``_co_tenant_columns``)
    and dropped afterwards; without it both columns are empty.

    Returns:
        ``WrittenPopulation`` (row count, and the two files' sizes and SHA-256).

    Raises:
        sqlalchemy.exc.DBAPIError / psycopg.Error: the database failed the query or COPY.
        OSError: writing a file failed.
    """
    conn = session.connection()
    if not (co_tenancy.intervals if isinstance(co_tenancy, CoTenancyInput) else co_tenancy):
        return _write_lineage(conn, scope, directory, batch_rows, co_tenancy_tables(()), expected_rows)
    # the largest tolerance a row's window may have (its settings', else the default): the spans' cuts
    # begin that long before the period
    max_skew = conn.execute(select(func.max(AttributionSettings.clock_skew_ns))).scalar()
    co = co_tenancy_tables(co_tenancy, scope, max(max_skew or 0, 0))
    # SQLite runs the CREATE outside the session's transaction and rolls the DROP back with it: a
    # pooled connection may still hold the (then empty) table, hence checkfirst and the DELETE.
    try:
        for table, rows in zip(_CO_TABLES, co.rows()):
            table.create(conn, checkfirst=True)
            conn.execute(delete(table))
            if rows:
                conn.execute(insert(table), [dict(zip(table.c.keys(), row)) for row in rows])
            if conn.dialect.name == "postgresql":
                conn.execute(text(f"ANALYZE {table.name}"))  # row estimates for the join plan
        return _write_lineage(conn, scope, directory, batch_rows, co, expected_rows)
    finally:
        for table in _CO_TABLES:
            table.drop(conn, checkfirst=True)


def _write_lineage(conn, scope: Scope, directory: Path, batch_rows: int, co_rows: _CoTables,
                   expected_rows: int) -> "WrittenPopulation":
    dialect, co_tenancy, skew_ns, lookup_ns = conn.dialect.name, bool(co_rows), co_rows.skew_ns, co_rows.lookup_ns
    raw = conn.connection.driver_connection
    name = "transaction_lineage"

    with TextSink(directory / f"{name}.csv", csv_line(LINEAGE_COLUMNS) + "\n", background=True) as csv_out, \
            TextSink(directory / f"{name}.json", json_split_head(LINEAGE_COLUMNS), background=True) as json_out:
        if dialect == "sqlite":
            count = _sqlite_in_processes(conn, scope, co_rows, expected_rows, csv_out, json_out, batch_rows)
            if count is None:
                # One query on this thread: a second thread reading on its own connection cost 1.8x the CPU
                # (the fetch loops fight for the GIL, which sqlite3 releases and takes back for every row).
                with _utf8_bytes(raw):
                    statement = _sqlite_json_stmt(scope, co_tenancy, skew_ns, lookup_ns)
                    count = _fetch_both(raw, *_compiled(conn, statement), csv_out, json_out, batch_rows)
        else:
            segments = _segments(scope, expected_rows)
            with _snapshot_twin(conn, co_rows) if len(segments) > 1 else nullcontext() as twin:
                readers = [raw] if twin is None else [raw, twin]
                if twin is None:
                    segments = [scope]
                statements = [_compiled(conn, lineage_text_stmt(segment, dialect, co_tenancy, skew_ns, lookup_ns))
                              for segment in segments]
                count = _copy_both(readers, statements, csv_out, json_out, batch_rows)
        json_out.write(json_split_tail(count))
    return WrittenPopulation(name, count, (csv_out.digest(f"data/{name}.csv"), json_out.digest(f"data/{name}.json")))


SQLITE_PROCESS_MIN_ROWS = 2_000_000  # below, the processes cost more CPU than they save time (1 M: same wall, +40 % CPU)
# Segments rendered or waiting while one is written: bounds memory to about this many segments' text
# (≈ 70 MB per 100 k transactions; segments are equal in time, so a burst makes one larger).
SQLITE_SEGMENTS_IN_FLIGHT = 3


def _sqlite_in_processes(conn, scope: Scope, co_rows: _CoTables, expected_rows: int, csv_out: "TextSink",
                         json_out: "TextSink", batch_rows: int) -> int | None:
    """SQLite: the population in time segments (``_segments``) rendered by worker processes, each on
    its own read-only connection (``_render_sqlite_segment``), written here in order; the row count.
    None (the caller renders on its own connection) for fewer than ``SQLITE_PROCESS_MIN_ROWS``
    expected rows, a database that is not a file, or a connection outside a transaction.

    Why processes: SQLite renders the JSON in C, but ``sqlite3`` takes the GIL back for every row,
    so a second thread only fought the first; a process renders on the other core. Why it is the
    same snapshot: the pack's session holds SQLite's write lock (``BEGIN IMMEDIATE``,
    ``collector.store.db``) from its first statement to its end, so no commit can happen meanwhile
    and every reader sees what the session sees. The files are byte-identical to the one-connection
    path (the same statement per segment, the same text conversion).
    """
    path = conn.engine.url.database
    if expected_rows < SQLITE_PROCESS_MIN_ROWS or not path or path == ":memory:" or not conn.in_transaction():
        return None
    segments = _segments(scope, expected_rows)
    if len(segments) < 2:
        return None
    database = str(Path(path).resolve())
    co = co_rows.rows() if co_rows else None
    jobs = iter([_compiled(conn, _sqlite_json_stmt(segment, bool(co_rows), co_rows.skew_ns, co_rows.lookup_ns))
                 for segment in segments])
    count = 0
    with ProcessPoolExecutor(max_workers=SQLITE_SEGMENTS_IN_FLIGHT - 1,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        def submit(sql: str, params: Any) -> Any:
            return pool.submit(_render_sqlite_segment, database, sql, params, co, batch_rows)

        pending = deque(submit(*job) for job in islice(jobs, SQLITE_SEGMENTS_IN_FLIGHT))
        try:
            while pending:
                csv_text, json_text, rows = pending.popleft().result()
                pending.extend(submit(*job) for job in islice(jobs, 1))
                if rows:
                    _write_rows(csv_out, json_out, csv_text, json_text, count)
                    count += rows
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    return count


def _render_sqlite_segment(path: str, sql: str, params: Sequence[Any], co_rows: tuple[list, list] | None,
                           batch_rows: int) -> tuple[bytes, bytes, int]:
    """In a worker process: the rows of ``sql`` (a ``_sqlite_json_stmt``) on a read-only connection to
    ``path``, as ``(csv lines, JSON data lines joined by ',' + LF, row count)``; ``co_rows`` (the
    rows of the two co-tenancy tables, ``_CoTables.rows``) loaded into this connection's first."""
    from sqlalchemy.dialects import sqlite as sqlite_dialect

    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        if co_rows:
            _load_co_tenancy(raw.cursor(), sqlite_dialect.dialect(), co_rows)
        raw.text_factory = bytes
        csv_parts, json_parts, count = [], [], 0
        for csv_text, json_text, rows in _json_batches(raw, sql, params, batch_rows):
            csv_parts.append(csv_text)
            json_parts.append(json_text)
            count += rows
        return b"".join(csv_parts), b",\n".join(json_parts), count
    finally:
        raw.close()


def _load_co_tenancy(cursor, dialect, co_rows: tuple[list, list]) -> None:
    """``CO_TENANCY`` and ``CO_TENANT_SPANS`` (each dropped first if there) as temporary tables of
    ``cursor``'s connection, holding ``co_rows`` (``_CoTables.rows``: tuples in column order)."""
    mark = "?" if dialect.name == "sqlite" else "%s"
    for table, rows in zip(_CO_TABLES, co_rows):
        cursor.execute(f"DROP TABLE IF EXISTS {table.name}")
        cursor.execute(str(CreateTable(table).compile(dialect=dialect)))
        for index in table.indexes:
            cursor.execute(str(CreateIndex(index).compile(dialect=dialect)))
        if rows:
            cursor.executemany(f"INSERT INTO {table.name} ({', '.join(table.c.keys())}) "
                               f"VALUES ({', '.join([mark] * len(table.c))})", rows)


@contextmanager
def _utf8_bytes(raw: sqlite3.Connection) -> Iterator[None]:
    """The SQLite connection returns text as UTF-8 bytes meanwhile (``text_factory``): the lines go to
    the files as they are, without decoding to ``str`` and encoding back (≈ 0.5 µs per row each)."""
    before = raw.text_factory
    raw.text_factory = bytes
    try:
        yield
    finally:
        raw.text_factory = before


def _cancel(raw) -> None:
    """Ask the database to stop ``raw``'s running statement (sqlite3 ``interrupt``, psycopg ``cancel``)."""
    stop = getattr(raw, "interrupt", None) or getattr(raw, "cancel_safe", None) or getattr(raw, "cancel", None)
    if stop is not None:
        try:
            stop()
        except Exception:  # noqa: BLE001 - best effort: the original error matters
            pass


@contextmanager
def _snapshot_twin(conn, co_rows: _CoTables) -> Iterator[Any]:
    """A second DBAPI connection in a transaction that reads exactly ``conn``'s snapshot, with the
    co-tenancy table loaded when ``co_rows``; None when that cannot be guaranteed.

    PostgreSQL: ``conn`` must be in a REPEATABLE READ (or SERIALIZABLE) transaction, as a pack
    rendering is; its snapshot is exported (``pg_export_snapshot``) and the twin's REPEATABLE READ
    transaction adopts it (``SET TRANSACTION SNAPSHOT``). None otherwise, and on SQLite. The twin does
    not see changes ``conn`` has not committed (a pack rendering makes none). The connection goes
    back to the pool afterwards, its temporary table dropped.
    """
    if conn.dialect.name != "postgresql" or not conn.in_transaction() \
            or conn.get_isolation_level() not in ("REPEATABLE READ", "SERIALIZABLE"):
        yield None
        return
    snapshot = conn.exec_driver_sql("SELECT pg_export_snapshot()").scalar_one()
    fairy = conn.engine.raw_connection()
    raw = fairy.driver_connection
    try:
        yield _pg_twin(raw, conn.dialect, snapshot, co_rows)
    finally:
        try:
            _twin_cleanup(raw)
        except Exception:  # noqa: BLE001 - e.g. a cancelled COPY left it unusable: discard it, keep the first error
            fairy.invalidate()
        fairy.close()


def _pg_twin(raw, dialect, snapshot: str, co_rows: _CoTables):
    if not re.fullmatch(r"[0-9A-Fa-f-]+", snapshot):
        raise RuntimeError(f"unexpected snapshot id {snapshot!r}")
    raw.rollback()
    raw.autocommit = True  # explicit BEGIN below: the snapshot must be set by its first statement
    with raw.cursor() as cursor:
        cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        cursor.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
        if co_rows:  # inside the transaction: rows committed after the adopted snapshot would be invisible
            _load_co_tenancy(cursor, dialect, co_rows.rows())
            for table in _CO_TABLES:
                cursor.execute(f"ANALYZE {table.name}")
    return raw


def _twin_cleanup(raw) -> None:
    if raw.info.transaction_status != 0:  # not idle: end the transaction (the temporary table goes with it)
        raw.execute("ROLLBACK")
    for table in _CO_TABLES:
        raw.execute(f"DROP TABLE IF EXISTS {table.name}")
    raw.autocommit = False


def _fetched(raw, sql: str, params, batch_rows: int) -> Iterator[list]:
    """The rows of ``sql`` through a raw DBAPI cursor, in batches of ``batch_rows``."""
    cursor = raw.cursor()
    try:
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(batch_rows):
            yield rows
    finally:
        cursor.close()


def _json_batches(raw, sql: str, params, batch_rows: int) -> Iterator[tuple[bytes, bytes, int]]:
    """``(csv lines, JSON data lines, rows)`` of each batch of ``sql`` (a ``_sqlite_json_stmt``)."""
    for rows in _fetched(raw, sql, params, batch_rows):
        yield *csv_rows_from_json([r[0] for r in rows]), len(rows)


def _write_rows(csv_out: "TextSink", json_out: "TextSink", csv_text: bytes, json_text: bytes, written: int) -> None:
    """Append rows to both files: their CSV lines, and their JSON arrays as the next ``data`` lines
    of the split table (``written``: the rows already in it, for the separator)."""
    json_out.write_bytes(b"\n" if written == 0 else b",\n")
    json_out.write_bytes(json_text)
    csv_out.write_bytes(csv_text)


def _fetch_both(raw, sql: str, params, csv_out: "TextSink", json_out: "TextSink", batch_rows: int) -> int:
    count = 0
    for csv_text, json_text, rows in _json_batches(raw, sql, params, batch_rows):
        _write_rows(csv_out, json_out, csv_text, json_text, count)
        count += rows
    return count


_PG_IN_TRANSACTION = 2  # libpq PQTRANS_INTRANS: idle inside a transaction block
# Planner settings for the two COPY statements only (SET LOCAL, reset after each):
# - enable_sort: the JSON statement's output looks narrow to the planner (a text expression,
#   estimated at 32 bytes), so it sorted the whole population (10 M rows: ≈ 7 GB of temporary
#   files, no row out before the sort ends) rather than read the time index in order as the CSV
#   statement does.
# - jit: the plans cost more than jit_optimize_above_cost, and compiling their wide expressions
#   (inlining, optimisation) took 4.0-4.4 s per statement (EXPLAIN ANALYZE, 1 M rows, loaded
#   host), the time the JSON text of ≈ 400 k rows takes; collector.lineage switches it off too.
_COPY_SETTINGS = {"enable_sort": "off", "jit": "off", "max_parallel_workers_per_gather": "0"}


def _copy_chunks(raw, sql: str, params, options: str, batch_rows: int) -> Iterator[tuple[bytearray, int]]:
    """``COPY (sql) TO STDOUT WITH (options)``: the output in ``(chunk, rows)`` of ``batch_rows`` rows
    (the last may be shorter); each chunk is a new buffer, never changed after it is yielded."""
    with raw.cursor() as cursor:
        for setting in _COPY_SETTINGS:
            cursor.execute(f"SET LOCAL {setting} = {_COPY_SETTINGS[setting]}")
        try:
            with cursor.copy(f"COPY ({sql}) TO STDOUT WITH ({options})", params) as copy:
                buf, rows = bytearray(), 0
                for data in copy:  # one CopyData message per row, a view of libpq's buffer
                    # Copied out at once: holding thousands of views alive (to join them later) cost
                    # ≈ 3x the CPU of the copy (measured 7-9 vs 2.6-4 µs per JSON row).
                    buf += data
                    rows += 1
                    if rows >= batch_rows:
                        yield buf, rows
                        buf, rows = bytearray(), 0
                if rows:
                    yield buf, rows
        finally:
            if raw.info.transaction_status == _PG_IN_TRANSACTION:  # not after an error: keep that one
                for setting in _COPY_SETTINGS:
                    cursor.execute(f"RESET {setting}")


READ_AHEAD_CHUNKS = 8
_END = object()


class _ReadAhead:
    """The items of ``chunks`` (a COPY's chunks on connection ``raw``), read on a thread that starts at
    once and stays at most ``depth`` items ahead of the caller; an iterator, closed by ``close()``.

    Why: read only as the caller asks, the server stops at each chunk (the socket's buffers fill)
    while the caller turns the previous one into text; read ahead, the server renders the next
    chunks meanwhile, on another core. A reading error is raised by ``next``. ``close()`` before the
    end (the caller failed) cancels the statement and returns once the thread has ended; after the
    end it only joins the thread (a late cancel request would hit the connection's next statement).
    """

    def __init__(self, chunks: Iterator[Any], raw, depth: int = READ_AHEAD_CHUNKS) -> None:
        self._chunks, self._raw = chunks, raw
        self._ready: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._produce, name="pack-lineage-copy", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        try:
            for item in self._chunks:
                while not self._stop.is_set():
                    try:
                        self._ready.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._ready.put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the reading caller
            self._ready.put(exc)
        finally:
            self._chunks.close()

    def __iter__(self) -> "_ReadAhead":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        item = self._ready.get()
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    def close(self) -> None:
        """Stop reading (cancel the COPY) unless the end was reached; wait for the thread."""
        if not self._done:
            self._done = True
            self._stop.set()
            _cancel(self._raw)
            while self._thread.is_alive():  # unblock a waiting put, then wait for the cancelled COPY to end
                try:
                    self._ready.get(timeout=0.1)
                except queue.Empty:
                    pass
        self._thread.join()


SEGMENT_ROWS = 100_000  # transactions per time segment (on average) when two connections read the population
MAX_SEGMENTS = 512


def _segments(scope: Scope, expected_rows: int) -> list[Scope]:
    """``scope`` cut into consecutive periods of equal length holding ``SEGMENT_ROWS`` transactions
    on average (at most ``MAX_SEGMENTS``, never shorter than 1 ns); ``[scope]`` for fewer than two."""
    n = min(expected_rows // SEGMENT_ROWS, MAX_SEGMENTS, scope.to_ns - scope.from_ns)
    if n < 2:
        return [scope]
    bounds = [scope.from_ns + (scope.to_ns - scope.from_ns) * k // n for k in range(n)] + [scope.to_ns]
    return [replace(scope, from_ns=a, to_ns=b) for a, b in zip(bounds, bounds[1:])]


_SEGMENT_END = object()


def _segment_chunks(raw, statements: Sequence[tuple[str, Any]], batch_rows: int) -> Iterator[Any]:
    """The COPY chunks of each statement in turn, each statement's followed by ``_SEGMENT_END``."""
    for sql, params in statements:
        yield from _copy_chunks(raw, sql, params, JSON_COPY_OPTIONS, batch_rows)
        yield _SEGMENT_END


def _copy_both(readers: Sequence[Any], statements: Sequence[tuple[str, Any]], csv_out: "TextSink",
               json_out: "TextSink", batch_rows: int) -> int:
    """Write the rows of ``statements`` (consecutive segments of the population), in order, to both
    files; segment ``k`` is read by ``readers[k % len(readers)]`` (connections on one snapshot),
    each reading its next segments ahead on its own thread. Returns the row count."""
    count = 0
    streams = [_ReadAhead(_segment_chunks(raw, statements[i::len(readers)], batch_rows), raw) for i, raw in
               enumerate(readers)]
    try:
        for k in range(len(statements)):
            for item in streams[k % len(streams)]:
                if item is _SEGMENT_END:
                    break
                chunk, rows = item
                json_rows = sqltext.json_rows_from_copy(chunk, rows)
                _write_rows(csv_out, json_out, csv_rows_from_copy(chunk, rows, json_rows), json_rows, count)
                count += rows
    finally:
        for stream in streams:  # stops a reader still running (an error here): cancels its COPY
            stream.close()
    return count


STREAMED: list[Population] = [
    Population("inventory", INVENTORY_COLUMNS, _inventory_stmt, _inventory_row),
    Population("allocation_episodes", EPISODE_COLUMNS, _episodes_stmt, _episode_row),
    Population("consumer_intervals", CONSUMER_COLUMNS, _consumers_stmt, _consumer_row),
    Population("transaction_lineage", LINEAGE_COLUMNS, _lineage_stmt, _lineage_row),
]


def stream(session: Session, population: Population, scope: Scope) -> Iterator[list[Any]]:
    """Rows of ``population`` in scope, formatted, fetched ``YIELD_PER`` at a time."""
    # Core execution on the session's connection (same transaction and snapshot), without the ORM
    # layer; ``yield_per`` streams (a server-side cursor on PostgreSQL).
    result = session.connection().execute(population.statement(scope).execution_options(yield_per=YIELD_PER))
    fmt = population.format_row
    for row in result:
        yield fmt(row, scope)


# -------------------------------------------------------------------------------- small populations


FINDING_COLUMNS = (
    "rule", "severity", "kind", "message", "cluster", "physical_gpu_uuid", "from", "to", "from_ns", "to_ns",
    "seen_until", "seen_until_ns", "subjects", "evidence", "bundle_revision", "bundle_digest", "engine", "evaluated_at", "finding_key",
)
SEVERITY_ORDER = {"critical": 0, "high": 1, "medium": 2, "low": 3, "info": 4}


COVERAGE_COLUMNS = ("cluster", "kind", "state", "started", "ended", "started_ns", "ended_ns", "open", "from_rv",
                    "to_rv", "reason")


STOPPED = "stopped"  # coverage state of a collector that shut down cleanly (collector.kube.recorder)


def coverage(session: Session, scope: Scope) -> list[dict[str, Any]]:
    """Observation intervals (synced / gap / stopped) per cluster and kind overlapping the period.

    Closed intervals come from ``coverage_intervals``; the open one from ``watch_state`` (``open``
    true, ``ended`` = null). Ordered by cluster, kind, start.
    """
    c, w = CoverageInterval, WatchState
    out: list[dict[str, Any]] = []
    for r in session.execute(select(c).where(c.started_ns < scope.to_ns, c.ended_ns > scope.from_ns,
                                             _in_clusters(c.cluster, scope))).scalars():
        out.append({"cluster": r.cluster, "kind": r.kind, "state": r.state, "started": ns_to_rfc3339(r.started_ns),
                    "ended": ns_to_rfc3339(r.ended_ns), "started_ns": r.started_ns, "ended_ns": r.ended_ns,
                    "open": False, "from_rv": r.from_rv, "to_rv": r.to_rv, "reason": r.reason})
    for r in session.execute(select(w).where(w.state_since_ns < scope.to_ns, _in_clusters(w.cluster, scope))).scalars():
        out.append({"cluster": r.cluster, "kind": r.kind, "state": r.state, "started": ns_to_rfc3339(r.state_since_ns),
                    "ended": None, "started_ns": r.state_since_ns, "ended_ns": None, "open": True,
                    "from_rv": r.state_from_rv, "to_rv": None, "reason": r.state_reason})
    out.sort(key=lambda d: (d["cluster"], d["kind"], d["started_ns"], d["open"], d["ended_ns"] or 0))
    return out


def quarantined(session: Session, scope: Scope) -> dict[str, Any]:
    """Input rejected (``quarantine``) with ``received_at`` in the period, counted by stage, reason
    code and source.

    The rows carry no cluster, namespace or event time (they could not be parsed), so they are
    counted by when they were received, whatever the pack's cluster and namespace scope. The
    reason code is the text before the first ``:`` (the rest may quote input); the source is the
    file name (last path component), ``http`` for every ``POST /v1/ingest`` request, or the watch
    stream (``watch:<kind>``). No row text is read: quarantined lines may hold sensitive data.

    Returns ``{"lines": total, "by_reason": [{"stage", "reason", "source", "lines"}, ...]}`` ordered
    by stage, reason, source.
    """
    q = Quarantine
    if session.get_bind().dialect.name == "postgresql":
        code = func.split_part(q.reason, ":", 1)
    else:
        colon = func.instr(q.reason, ":")
        code = case((colon > 0, func.substr(q.reason, 1, colon - 1)), else_=q.reason)
    source = case((q.source.like("http:%"), literal("http")), else_=q.source)
    rows = session.execute(select(q.stage, code, source, func.count())
                           .where(q.received_at >= ns_to_dt(scope.from_ns), q.received_at < ns_to_dt(scope.to_ns))
                           .group_by(q.stage, code, source)).all()
    counts: dict[tuple[str, str, str], int] = {}
    for stage, reason, src, n in rows:
        key = (stage, reason, src if src == "http" or src.startswith("watch:") else
               src.replace("\\", "/").rsplit("/", 1)[-1])
        counts[key] = counts.get(key, 0) + n
    return {"lines": sum(counts.values()),
            "by_reason": [{"stage": k[0], "reason": k[1], "source": k[2], "lines": n} for k, n in sorted(counts.items())]}


# The kinds the watcher records (collector.kube.discovery.watched_kinds).
WATCHED_KINDS = ("DeviceClass", "Pod", "ResourceClaim", "ResourceSlice")


def coverage_summary(intervals: Sequence[dict[str, Any]], scope: Scope) -> list[dict[str, Any]]:
    """Per (cluster, kind): seconds synced, in gaps, with the collector not running, and unobserved.
    A cluster named in the scope with no interval at all gets a row per watched kind, all unobserved.

    Intervals are clipped to the period; an open interval runs to the period end. ``gap`` intervals
    (the watch stream lost while the collector ran) count as ``gap_s`` and ``gaps``; ``stopped``
    (the collector shut down cleanly and had not come back) as ``stopped_s``, with ``stopped_at_ns``
    the start of the open stopped interval (the last observation), else None. Time covered by no
    interval at all (before the watcher first started, or lost records) counts as ``unobserved_s``.
    Pure function.
    """
    period_s = (scope.to_ns - scope.from_ns) / 1e9
    by_kind: dict[tuple[str, str], dict[str, Any]] = {}
    for iv in intervals:
        key = (iv["cluster"], iv["kind"])
        s = by_kind.setdefault(key, {"cluster": key[0], "kind": key[1], "synced": [], "gap": [], "stopped": [],
                                     "gaps": 0, "stopped_at_ns": None})
        start = max(iv["started_ns"], scope.from_ns)
        end = min(iv["ended_ns"] if iv["ended_ns"] is not None else scope.to_ns, scope.to_ns)
        if end <= start:
            continue
        state = iv["state"] if iv["state"] in ("synced", STOPPED) else "gap"
        s[state].append((start, end))
        if state == "gap":
            s["gaps"] += 1
        elif state == STOPPED and iv["ended_ns"] is None:
            s["stopped_at_ns"] = iv["started_ns"]
    # A cluster in scope with no coverage row at all was never watched: each kind unobserved for the
    # whole period (it must lower the controls like any unobserved kind, not vanish from the table).
    for cluster in scope.clusters:
        if not any(c == cluster for c, _kind in by_kind):
            for kind in WATCHED_KINDS:
                by_kind[(cluster, kind)] = {"cluster": cluster, "kind": kind, "synced": [], "gap": [], "stopped": [],
                                            "gaps": 0, "stopped_at_ns": None}
    out = []
    for key in sorted(by_kind):
        s = by_kind[key]
        synced, gap, stopped = _union_ns(s["synced"]), _union_ns(s["gap"]), _union_ns(s["stopped"])
        covered = _union_ns(s["synced"] + s["gap"] + s["stopped"])
        out.append({"cluster": s["cluster"], "kind": s["kind"], "synced_s": round(synced / 1e9, 3),
                    "gap_s": round(gap / 1e9, 3), "stopped_s": round(stopped / 1e9, 3),
                    "unobserved_s": round(period_s - covered / 1e9, 3), "gaps": s["gaps"],
                    "stopped_at_ns": s["stopped_at_ns"],
                    "synced_fraction": round(synced / 1e9 / period_s, 6) if period_s else 0.0})
    return out


def collector_stops(intervals: Sequence[dict[str, Any]], scope: Scope) -> dict[str, int]:
    """Cluster → the last observation: the earliest start of an open ``stopped`` interval (the
    collector shut down and had not come back) before the period end. Clusters observed to the end
    are absent. Nothing after that instant was observed: open allocations end there as far as the
    pack can tell (clipped and flagged, never stated to the period end). Pure function.
    """
    stops: dict[str, int] = {}
    for iv in intervals:
        if iv["state"] == STOPPED and iv["ended_ns"] is None and iv["started_ns"] < scope.to_ns:
            stops[iv["cluster"]] = min(stops.get(iv["cluster"], iv["started_ns"]), iv["started_ns"])
    return stops


def _union_ns(spans: Iterable[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


# -------------------------------------------------------------------------------- writers


# One C-accelerated encoder for whole rows. ``reports.sqltext`` renders the same bytes in SQL for
# the transaction lineage.
JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_CSV_SPECIAL = re.compile(r'[,"\n\r]')


def csv_field(v: Any) -> str:
    """One CSV field (RFC 4180 §2): null → empty, booleans ``true``/``false``, nested values as
    compact sorted JSON; quoted (``"`` doubled) when it contains ``,``, ``"``, LF or CR (as PostgreSQL's
    COPY does for rows of several fields, so both backends write the same bytes)."""
    if v is None:
        return ""
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        v = json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    elif not isinstance(v, str):
        return str(v)
    return '"' + v.replace('"', '""') + '"' if _CSV_SPECIAL.search(v) else v


def csv_line(values: Sequence[Any]) -> str:
    """One CSV record without its line end (fields by ``csv_field``, joined by ``,``)."""
    return ",".join([csv_field(v) for v in values])


@dataclass(frozen=True)
class WrittenPopulation:
    """A population written to ``data/``: its name, row count and the digests of its CSV and JSON files."""

    name: str
    count: int
    files: tuple[FileDigest, ...]


class TextSink:
    """A UTF-8 text file written in large chunks and hashed (SHA-256) as it is written.

    The digest is of the bytes handed to the file, so the pack's files are not read back to build
    the manifest (``draudit verify`` reads them from disk). With ``background=True`` the hashing and
    the writes happen on a thread, at most ``QUEUE_CHUNKS`` chunks behind: ``hashlib`` and ``write``
    release the GIL (hashing 1 GB costs ≈ 0.6 s of CPU; the kernel copies or throttles dirty pages),
    so the producing thread goes on rendering meanwhile. Use as a context manager.

    Raises:
        OSError: from opening or writing the file (a background write error surfaces at the next
            ``write`` or at exit).
    """

    QUEUE_CHUNKS = 4

    def __init__(self, path: Path, header: str = "", *, background: bool = False) -> None:
        self._file = open(path, "wb")
        # hashlib releases the GIL on large updates (the writer thread's hashing overlaps the
        # producer); ``Sha256`` (cryptography) holds it, and hashes at the same rate here.
        self._hash = hashlib.sha256() if background else Sha256()
        self.size = 0
        self._digest: str | None = None
        self._queue: queue.Queue[bytes | None] | None = None
        self._error: BaseException | None = None
        if background:
            self._queue = queue.Queue(self.QUEUE_CHUNKS)
            self._thread = threading.Thread(target=self._drain, name=f"pack-writer {path.name}", daemon=True)
            self._thread.start()
        if header:
            self.write(header)

    def _drain(self) -> None:
        while (data := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._hash.update(data)
                    self._file.write(data)
                except BaseException as exc:  # noqa: BLE001 - handed to the writing thread
                    self._error = exc

    def write(self, text: str) -> None:
        """Append ``text`` (encoded as UTF-8)."""
        self.write_bytes(text.encode("utf-8"))

    def write_bytes(self, data: bytes) -> None:
        """Append UTF-8 ``data`` (not copied: the caller must not change it afterwards)."""
        self.size += len(data)
        if self._queue is None:
            self._hash.update(data)
            self._file.write(data)
            return
        if self._error is not None:
            raise self._error
        self._queue.put(data)

    def digest(self, rel: str) -> FileDigest:
        """``FileDigest`` of what was written, named ``rel`` (path relative to the pack); after exit."""
        if self._digest is None:
            self._digest = self._hash.hexdigest()
        return FileDigest(rel, self.size, self._digest)

    def __enter__(self) -> "TextSink":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._queue is not None:
                self._queue.put(None)
                self._thread.join()
        finally:
            self._file.close()
        if self._error is not None and exc[0] is None:
            raise self._error


def json_split_head(columns: Sequence[str]) -> str:
    """The start of a population's JSON file, up to its first row: ``{"columns":[...],"data":[``."""
    return '{"columns":' + JSON_ENCODER.encode(list(columns)) + ',"data":['


def json_split_tail(count: int) -> str:
    """The end of a population's JSON file after ``count`` rows (each row on its own line)."""
    return "\n]}\n" if count else "]}\n"


class PopulationWriter:
    """Writes one population to ``<dir>/<name>.csv`` and ``<name>.json`` as rows arrive, hashing both.

    CSV: header row, records by ``csv_line``, ``\\n`` line ends. JSON: the split table (module
    docstring), ``columns`` then one ``data`` array per line. Use as a context manager; ``count`` is
    the number of rows written and ``result`` (after exit) the ``WrittenPopulation``.
    """

    FLUSH_ROWS = 2_000

    def __init__(self, directory: Path, name: str, columns: Sequence[str]) -> None:
        self.name = name
        self.columns = tuple(columns)
        self.count = 0
        self.result: WrittenPopulation | None = None
        self._csv = TextSink(directory / f"{name}.csv", csv_line(self.columns) + "\n")
        self._json = TextSink(directory / f"{name}.json", json_split_head(self.columns))
        self._csv_buf: list[str] = []
        self._json_buf: list[str] = []

    def write(self, values: Sequence[Any]) -> None:
        """Write one row (values in column order)."""
        self._csv_buf.append(csv_line(values))
        self._json_buf.append(JSON_ENCODER.encode(list(values)))
        if len(self._csv_buf) >= self.FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._csv_buf:
            self._csv.write("\n".join(self._csv_buf) + "\n")
            self._json.write(("\n" if self.count == 0 else ",\n") + ",\n".join(self._json_buf))
            self.count += len(self._csv_buf)
            self._csv_buf, self._json_buf = [], []

    def __enter__(self) -> "PopulationWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is None:
                self._flush()
                self._json.write(json_split_tail(self.count))
        finally:
            self._csv.__exit__(*exc)
            self._json.__exit__(*exc)
        self.result = WrittenPopulation(self.name, self.count, (self._csv.digest(f"data/{self.name}.csv"),
                                                                self._json.digest(f"data/{self.name}.json")))


def write_rows(directory: Path, name: str, columns: Sequence[str], rows: Iterable[Sequence[Any]],
               on_row: Callable[[Sequence[Any]], None] | None = None) -> WrittenPopulation:
    """Stream ``rows`` into ``data/<name>.csv|json``; ``on_row`` sees each row (for summaries)."""
    with PopulationWriter(directory, name, columns) as w:
        for row in rows:
            w.write(row)
            if on_row is not None:
                on_row(row)
    return w.result


def write_dicts(directory: Path, name: str, columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> WrittenPopulation:
    """``write_rows`` for rows held as dicts keyed by column."""
    return write_rows(directory, name, columns, ([d.get(c) for c in columns] for d in rows))
