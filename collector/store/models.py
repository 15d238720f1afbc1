"""SQLAlchemy 2 typed models: the single source of the schema (Alembic autogenerates from these).

Time columns are either aware UTC datetimes (``UTCDateTime``, µs, named ``*_at``) or integer
nanoseconds since the epoch (``*_ns``) for the interval tables that set-based SQL joins on.
An open interval has ``valid_to_ns`` NULL.

Tables, by the stage that writes them:
- watcher: ``object_versions`` (every observed version, raw), ``watch_state`` (resume point),
  ``coverage_intervals`` (synced / gap), ``quarantine`` (shared with ingestion);
- projections (derived from ``object_versions``, rebuildable): ``pod_states``,
  ``pod_claim_refs``, ``pod_container_claims``, ``allocation_episodes``, ``allocation_results``,
  ``claim_consumers``, ``device_states``;
- ingestion and lineage: ``inference_records``, ``lineage``;
- policy: ``findings``; reports: ``evidence_packs``;
- scheduler: ``apscheduler_jobs`` (APScheduler's job store), ``job_runs`` (outcome of each run);
- integrity: ``ledger`` and ``ledger_head``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Computed,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    Unicode,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# BIGINT primary keys on PostgreSQL; SQLite needs INTEGER PRIMARY KEY for rowid autoincrement.
BigId = BigInteger().with_variant(Integer(), "sqlite")
JsonDoc = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on every backend.

    PostgreSQL stores ``timestamptz``; SQLite stores ISO text, which sorts correctly because every
    value is normalised to UTC first. Naive values are rejected: we never guess a zone.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given for a UTC column")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    """Declarative base of every draudit table."""


# --------------------------------------------------------------------------------------------
# Watcher
# --------------------------------------------------------------------------------------------

EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED", "RELIST_ADDED", "RELIST_MODIFIED", "RELIST_DELETED")


class ObjectVersion(Base):
    """One observed version of one watched object, kept raw as the server sent it.

    ``event_type`` is the watch event (ADDED/MODIFIED/DELETED) or, for changes inferred from a
    relist diff after 410 Gone, ``RELIST_ADDED``/``RELIST_MODIFIED``/``RELIST_DELETED`` (an inferred
    DELETED carries the last known state). Unique on (cluster, kind, uid, resource_version,
    event_type): replays and duplicate deliveries are harmless.
    """

    __tablename__ = "object_versions"
    __table_args__ = (
        UniqueConstraint("cluster", "kind", "uid", "resource_version", "event_type", name="uq_object_versions_event"),
        Index("ix_object_versions_kind_uid", "cluster", "kind", "uid", "id"),
        Index("ix_object_versions_observed", "cluster", "kind", "observed_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(253))
    api_group: Mapped[str] = mapped_column(String(253))  # "" for the core group
    api_version: Mapped[str] = mapped_column(String(32))  # version served, e.g. "v1", "v1beta1"
    kind: Mapped[str] = mapped_column(String(63))
    namespace: Mapped[str | None] = mapped_column(String(253), nullable=True)
    name: Mapped[str] = mapped_column(String(253))
    uid: Mapped[str] = mapped_column(String(64))
    resource_version: Mapped[str] = mapped_column(String(32))
    event_type: Mapped[str] = mapped_column(String(20))
    observed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    raw: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    content_hash: Mapped[str] = mapped_column(String(64))


class WatchState(Base):
    """Resume point of one reflector and its current coverage state.

    ``resource_version`` is the last resourceVersion whose rows are committed (a list RV, a live
    event or a BOOKMARK). ``state`` is the open coverage interval (``synced`` or ``gap``) since
    ``state_since_ns``; closed intervals move to ``coverage_intervals``, which is append-only.

    ``observed_until_ns`` (ns UTC, NULL by default) bounds an open ``synced`` interval that a
    crash may leave open: set while the kind is out of contact with the API server (its requests
    fail or its stream went silent), to its last contact — written once on the way into the
    outage and cleared on the way out, not per retry; and, at a run's start, for every kind the
    previous run left ``synced`` (it crashed), to the instant that run last observed it. After a
    crash, the kind's ``synced`` coverage ends there at the latest (``collector.kube.recorder``),
    not at the run's last sign of life, which the other kinds' bookmarks keep moving.
    """

    __tablename__ = "watch_state"

    cluster: Mapped[str] = mapped_column(String(253), primary_key=True)
    kind: Mapped[str] = mapped_column(String(63), primary_key=True)
    api_version: Mapped[str] = mapped_column(String(32))
    resource_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    synced: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16), default="gap")  # synced | gap
    state_since_ns: Mapped[int] = mapped_column(BigInteger)
    state_from_rv: Mapped[str | None] = mapped_column(String(32), nullable=True)
    state_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    observed_until_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class CoverageInterval(Base):
    """A closed interval in which the watcher saw a kind completely (``'synced'``) or not (``'gap'``).

    A gap runs from the moment the watcher lost the stream (last committed resourceVersion
    ``from_rv``) until the relist that restored it (``to_rv``). Rows are written when the interval
    closes and never change (the ledger covers them); the open interval lives in ``watch_state``.
    """

    __tablename__ = "coverage_intervals"
    __table_args__ = (Index("ix_coverage_kind_time", "cluster", "kind", "started_ns"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(253))
    kind: Mapped[str] = mapped_column(String(63))
    state: Mapped[str] = mapped_column(String(16))  # 'synced' | 'gap'
    started_ns: Mapped[int] = mapped_column(BigInteger)
    ended_ns: Mapped[int] = mapped_column(BigInteger)
    from_rv: Mapped[str | None] = mapped_column(String(32), nullable=True)
    to_rv: Mapped[str | None] = mapped_column(String(32), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class Quarantine(Base):
    """Input we could not accept, kept with the reason and its place so nothing is lost.

    ``stage`` is ``watch`` (a watch-stream line or object) or ``ingest`` (a log line). ``source``
    names the input (``watch:ResourceClaim``, a file path, ``http:body-<digest>``: an HTTP body, the same for its retries); ``position`` the
    place in it (line number, byte offset). ``raw_text`` is PAN-masked before it is stored.
    ``content_key`` (ingest rows) is the SHA-256 of stage, source, position and ``raw_sha256``:
    re-reading the same input quarantines each line once (NULL: not deduplicated).
    """

    __tablename__ = "quarantine"
    __table_args__ = (Index("ix_quarantine_stage", "stage", "received_at"),
                      UniqueConstraint("content_key", name="uq_quarantine_content"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    stage: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(Text)
    position: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reason: Mapped[str] = mapped_column(Text)
    raw_text: Mapped[str] = mapped_column(Text)
    raw_sha256: Mapped[str] = mapped_column(String(64))
    received_at: Mapped[datetime] = mapped_column(UTCDateTime)
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    content_key: Mapped[str | None] = mapped_column(String(64), nullable=True)


# --------------------------------------------------------------------------------------------
# Projections (validity intervals [valid_from_ns, valid_to_ns), observation time of the collector)
# --------------------------------------------------------------------------------------------


class PodState(Base):
    """A pod's placement and phase over an interval (every pod; its claims are in ``pod_claim_refs``)."""

    __tablename__ = "pod_states"
    __table_args__ = (
        Index("ix_pod_states_uid", "cluster", "pod_uid", "valid_from_ns"),
        Index("ix_pod_states_name", "cluster", "namespace", "name", "valid_from_ns"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(253))
    pod_uid: Mapped[str] = mapped_column(String(64))
    namespace: Mapped[str] = mapped_column(String(253))
    name: Mapped[str] = mapped_column(String(253))
    node_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    phase: Mapped[str | None] = mapped_column(String(32), nullable=True)
    valid_from_ns: Mapped[int] = mapped_column(BigInteger)
    valid_to_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    source_version_id: Mapped[int] = mapped_column(BigId, ForeignKey("object_versions.id"))


class PodClaimRef(Base):
    """Pod claim name → the ResourceClaim it resolves to (by name or via resourceClaimStatuses)."""

    __tablename__ = "pod_claim_refs"
    __table_args__ = (Index("ix_pod_claim_refs_pod", "cluster", "pod_uid", "valid_from_ns"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(253))
    pod_uid: Mapped[str] = mapped_column(String(64))
    namespace: Mapped[str] = mapped_column(String(253))
    pod_claim_name: Mapped[str] = mapped_column(String(253))
    claim_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    template_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    valid_from_ns: Mapped[int] = mapped_column(BigInteger)
    valid_to_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class PodContainerClaim(Base):
    """Container → pod claim name → request (from the immutable pod spec; '' request = all)."""

    __tablename__ = "pod_container_claims"
    __table_args__ = (
        UniqueConstraint("cluster", "pod_uid", "container_name", "pod_claim_name", "request",
                         name="uq_pod_container_claims"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(253))
    pod_uid: Mapped[str] = mapped_column(String(64))
    container_name: Mapped[str] = mapped_column(String(253))
    init_container: Mapped[bool] = mapped_column(Boolean, default=False)
    pod_claim_name: Mapped[str] = mapped_column(String(253))
    request: Mapped[str] = mapped_column(String(253), default="")


class AllocationEpisode(Base):
    """One allocation of one ResourceClaim, keyed by (claim uid, first resourceVersion seen).

    A claim that is deallocated and allocated again yields a second episode (dra-api.md §0.10).
    """

    __tablename__ = "allocation_episodes"
    __table_args__ = (
        UniqueConstraint("cluster", "claim_uid", "first_rv", name="uq_allocation_episodes"),
        Index("ix_allocation_episodes_time", "cluster", "valid_from_ns", "valid_to_ns"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(253))
    claim_uid: Mapped[str] = mapped_column(String(64))
    claim_namespace: Mapped[str] = mapped_column(String(253))
    claim_name: Mapped[str] = mapped_column(String(253))
    owner_pod_uid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    first_rv: Mapped[str] = mapped_column(String(32))
    node_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    allocation_timestamp: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    scheduler_write_time: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    config: Mapped[Any] = mapped_column(JsonDoc, nullable=True)
    valid_from_ns: Mapped[int] = mapped_column(BigInteger)
    valid_to_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    source_version_id: Mapped[int] = mapped_column(BigId, ForeignKey("object_versions.id"))


class AllocationResult(Base):
    """One device result of an allocation episode (``status.allocation.devices.results[]``)."""

    __tablename__ = "allocation_results"
    __table_args__ = (
        Index("ix_allocation_results_device", "driver", "pool", "device"),
        Index("ix_allocation_results_episode", "episode_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    episode_id: Mapped[int] = mapped_column(BigId, ForeignKey("allocation_episodes.id", ondelete="CASCADE"))
    request: Mapped[str] = mapped_column(String(253))  # "req" or "req/subrequest"
    driver: Mapped[str] = mapped_column(String(253))
    pool: Mapped[str] = mapped_column(String(253))
    device: Mapped[str] = mapped_column(String(253))
    device_class_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    admin_access: Mapped[bool] = mapped_column(Boolean, default=False)
    share_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    consumed_capacity: Mapped[Any] = mapped_column(JsonDoc, nullable=True)


class ClaimConsumer(Base):
    """A consumer in ``status.reservedFor`` of a claim during an allocation episode, over an interval."""

    __tablename__ = "claim_consumers"
    __table_args__ = (
        Index("ix_claim_consumers_uid", "cluster", "consumer_uid", "valid_from_ns"),
        Index("ix_claim_consumers_episode", "episode_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(253))
    claim_uid: Mapped[str] = mapped_column(String(64))
    episode_id: Mapped[int] = mapped_column(BigId, ForeignKey("allocation_episodes.id", ondelete="CASCADE"))
    consumer_api_group: Mapped[str] = mapped_column(String(253), default="")
    consumer_resource: Mapped[str] = mapped_column(String(63))
    consumer_name: Mapped[str] = mapped_column(String(253))
    consumer_uid: Mapped[str] = mapped_column(String(64))
    valid_from_ns: Mapped[int] = mapped_column(BigInteger)
    valid_to_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class DeviceState(Base):
    """A device published in a ResourceSlice, with its attributes, over an interval.

    Identity in the cluster is (driver, pool, device); the physical GPU is ``uuid`` for a full GPU
    and ``parent_uuid`` for a MIG device (dra-api.md §6.3). A device that is not a GPU (a NIC
    driver's, ``collector.kube.projections.is_gpu_device``) has neither (its ``uuid`` attribute
    stays in ``attributes``), so its ``gpu_uuid`` is NULL.
    """

    __tablename__ = "device_states"
    __table_args__ = (
        Index("ix_device_states_key", "cluster", "driver", "pool", "device", "valid_from_ns"),
        Index("ix_device_states_uuid", "uuid"),
        Index("ix_device_states_gpu", "cluster", "gpu_uuid", "valid_from_ns"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(253))
    driver: Mapped[str] = mapped_column(String(253))
    pool: Mapped[str] = mapped_column(String(253))
    device: Mapped[str] = mapped_column(String(253))
    slice_name: Mapped[str] = mapped_column(String(253))
    pool_generation: Mapped[int] = mapped_column(BigInteger)
    node_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    device_type: Mapped[str | None] = mapped_column(String(32), nullable=True)  # gpu | mig | vfio
    uuid: Mapped[str | None] = mapped_column(String(128), nullable=True)
    parent_uuid: Mapped[str | None] = mapped_column(String(128), nullable=True)
    physical_gpu_uuid: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # The GPU identity attribution and ``trace``'s co-tenants query filter on (the device's physical
    # GPU, else its MIG parent, else its own UUID), stored by the database so it can be indexed
    # (``ix_device_states_gpu``: without it, co-tenants walk every episode started before t).
    gpu_uuid: Mapped[str | None] = mapped_column(
        String(128), Computed("coalesce(physical_gpu_uuid, parent_uuid, uuid)", persisted=True), nullable=True)
    profile: Mapped[str | None] = mapped_column(String(64), nullable=True)
    product_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    driver_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    allow_multiple_allocations: Mapped[bool] = mapped_column(Boolean, default=False)
    attributes: Mapped[Any] = mapped_column(JsonDoc, nullable=True)
    capacity: Mapped[Any] = mapped_column(JsonDoc, nullable=True)
    valid_from_ns: Mapped[int] = mapped_column(BigInteger)
    valid_to_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    source_version_id: Mapped[int] = mapped_column(BigId, ForeignKey("object_versions.id"))



# --------------------------------------------------------------------------------------------
# Integrity
# --------------------------------------------------------------------------------------------


class LedgerEntry(Base):
    """One entry of the append-only hash chain.

    ``entry_hash = SHA-256(prev_hash || canonical_json(content))`` where content is the covered
    row's canonical content (``collector.store.ledger.row_content``) or, for ``op='tombstone'``,
    the deletion record. Sequence numbers are dense from 1; a missing number is a deleted entry.
    """

    __tablename__ = "ledger"
    __table_args__ = (Index("ix_ledger_row", "table_name", "row_key"),)

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    table_name: Mapped[str] = mapped_column(String(63))
    row_key: Mapped[str] = mapped_column(String(128))
    op: Mapped[str] = mapped_column(String(16), default="insert")  # insert | tombstone
    content_hash: Mapped[str] = mapped_column(String(64))
    prev_hash: Mapped[str] = mapped_column(String(64))
    entry_hash: Mapped[str] = mapped_column(String(64))
    tombstone: Mapped[Any] = mapped_column(JsonDoc, nullable=True)
    appended_at: Mapped[datetime] = mapped_column(UTCDateTime)


class LedgerHead(Base):
    """The chain's head (last sequence number and hash), updated with every append.

    Serves as the append lock (one writer at a time) and lets ``verify`` notice a truncated tail.
    """

    __tablename__ = "ledger_head"

    chain: Mapped[str] = mapped_column(String(32), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, default=0)
    entry_hash: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


# --------------------------------------------------------------------------------------------
# Ingestion and lineage
# --------------------------------------------------------------------------------------------


class InferenceRecord(Base):
    """One scored transaction as logged by the inference service, normalised (log-formats.md §7).

    ``dedup_key`` is the SHA-256 of the canonical business content (transaction id, event time,
    pod, container, model, decision...), independent of the envelope: the same transaction shipped
    twice (retries, at-least-once delivery) is stored once. The same ``transaction_id`` arriving
    with different content is stored again with ``conflict`` set, never overwritten.
    """

    __tablename__ = "inference_records"
    __table_args__ = (
        UniqueConstraint("dedup_key", name="uq_inference_records_dedup"),
        Index("ix_inference_records_txn", "transaction_id"),
        Index("ix_inference_records_time", "event_time_ns"),
        Index("ix_inference_records_pod", "pod_uid", "event_time_ns"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    transaction_id: Mapped[str] = mapped_column(String(256))
    event_time_ns: Mapped[int] = mapped_column(BigInteger)
    event_time_precision_ns: Mapped[int] = mapped_column(BigInteger)
    received_ns: Mapped[int] = mapped_column(BigInteger)
    cluster: Mapped[str | None] = mapped_column(String(253), nullable=True)
    pod_uid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    pod_uid_source: Mapped[str | None] = mapped_column(String(16), nullable=True)  # envelope | resolved
    pod_namespace: Mapped[str | None] = mapped_column(String(253), nullable=True)
    pod_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    container_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    node_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    model_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    model_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    decision: Mapped[str | None] = mapped_column(String(64), nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    trace_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    span_id: Mapped[str | None] = mapped_column(String(16), nullable=True)
    source_format: Mapped[str] = mapped_column(String(32))
    envelope: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(Text)
    position: Mapped[str | None] = mapped_column(String(64), nullable=True)
    raw_sha256: Mapped[str] = mapped_column(String(64))
    dedup_key: Mapped[str] = mapped_column(String(64))
    conflict: Mapped[bool] = mapped_column(Boolean, default=False)
    attributes: Mapped[Any] = mapped_column(JsonDoc, nullable=True)
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)


class Lineage(Base):
    """Attribution of one inference record: transaction → pod → claim → device → physical GPU.

    ``status`` is ``exact``, ``ambiguous`` or ``unattributed``; ``reason`` explains the last two
    (``skew-window``, ``several-devices``, ``several-pods``, ``no-pod``, ``pod-identity-conflict``
    — the record's pod uid names a pod whose namespace, name or node then differ from the
    record's —, ``no-claim``, ``no-allocation``, ``no-device-record``, ``coverage-gap``,
    ``unknown-cluster`` — the record's cluster has no watch history at all, e.g. ingested under
    another cluster name than the watcher's). ``no-pod`` also covers a record without any pod identity. Derived data: recomputable from the
    store; written by ``collector.lineage.attribute`` (see its module docstring for the rule) with the
    settings ``settings_id`` names (``attribution_settings``); ``draudit ledger verify`` recomputes
    every row with them and reports the first difference.

    ``record_id`` is ``inference_records.id`` without a foreign key, and the only secondary index is
    the small partial ``ix_lineage_not_exact``: every reader reaches a row through its record
    (primary key), and a foreign-key check per row was half the cost of writing a million rows on
    PostgreSQL (bench/lineage_bench.py). The one
    deleter of inference records, retention (``collector.scheduler.apply_retention``), deletes
    their lineage rows in the same transaction.
    """

    __tablename__ = "lineage"

    __table_args__ = (
        # The non-exact rows only (a few in a thousand): attribution counts what it wrote per status on
        # SQLite through it instead of reading back every row (collector.lineage, _Run.insert_counted).
        Index("ix_lineage_not_exact", "record_id", sqlite_where=text("status <> 'exact'"),
              postgresql_where=text("status <> 'exact'")),
    )

    record_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    candidates: Mapped[int] = mapped_column(Integer, default=0)
    pod_uid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    node_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    claim_uid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    claim_namespace: Mapped[str | None] = mapped_column(String(253), nullable=True)
    claim_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    request: Mapped[str | None] = mapped_column(String(253), nullable=True)
    episode_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    driver: Mapped[str | None] = mapped_column(String(253), nullable=True)
    pool: Mapped[str | None] = mapped_column(String(253), nullable=True)
    device: Mapped[str | None] = mapped_column(String(253), nullable=True)
    device_state_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    device_uuid: Mapped[str | None] = mapped_column(String(128), nullable=True)
    physical_gpu_uuid: Mapped[str | None] = mapped_column(String(128), nullable=True)
    product_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    mig_profile: Mapped[str | None] = mapped_column(String(64), nullable=True)
    attributed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # AttributionSettings.id of the run that wrote the row (NULL: written outside ``attribute_run``)
    settings_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class AttributionSettings(Base):
    """The settings an attribution run computed lineage rows with (one row per distinct set).

    ``clock_skew_ns``: the skew tolerance (ns) of the ``skew-window`` test; ``cluster``: the cluster
    of records without one; ``serving_containers``: canonical JSON of the ``namespace/prefix →
    container`` map (``{}`` when none). ``digest`` = SHA-256 of the three, unique. ``ledger verify``
    recomputes each lineage row with its own settings; packs state the tolerance in force
    (``collector.lineage.tolerances_in_use``).
    """

    __tablename__ = "attribution_settings"
    __table_args__ = (UniqueConstraint("digest", name="uq_attribution_settings_digest"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    digest: Mapped[str] = mapped_column(String(64))
    clock_skew_ns: Mapped[int] = mapped_column(BigInteger)
    cluster: Mapped[str] = mapped_column(String(253))
    serving_containers: Mapped[str] = mapped_column(Text)


# --------------------------------------------------------------------------------------------
# Policy findings and evidence packs
# --------------------------------------------------------------------------------------------


class Finding(Base):
    """A policy decision about the allocation history, stored with the bundle that produced it.

    ``finding_key`` = SHA-256 of (rule, subjects, interval, period, bundle digest): re-evaluating
    the same period with the same bundle is idempotent. Severities: critical, high, medium, low,
    info; ``kind``: violation, warning, observation.
    """

    __tablename__ = "findings"
    __table_args__ = (
        UniqueConstraint("finding_key", name="uq_findings_key"),
        Index("ix_findings_period", "period_from_ns", "period_to_ns"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    finding_key: Mapped[str] = mapped_column(String(64))
    cluster: Mapped[str | None] = mapped_column(String(253), nullable=True)
    rule: Mapped[str] = mapped_column(String(128))
    severity: Mapped[str] = mapped_column(String(16))
    kind: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    subjects: Mapped[Any] = mapped_column(JsonDoc)
    evidence: Mapped[Any] = mapped_column(JsonDoc, nullable=True)
    physical_gpu_uuid: Mapped[str | None] = mapped_column(String(128), nullable=True)
    from_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    to_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    period_from_ns: Mapped[int] = mapped_column(BigInteger)
    period_to_ns: Mapped[int] = mapped_column(BigInteger)
    bundle_revision: Mapped[str] = mapped_column(String(128))
    bundle_digest: Mapped[str] = mapped_column(String(64))
    engine: Mapped[str] = mapped_column(String(32))
    evaluated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class PolicyEvaluation(Base):
    """One evaluation of a policy bundle over a period, whatever it found (possibly nothing).

    A period evaluated with no finding is the compliant case: without this record a pack could not
    tell it from a period never checked (DORA Art. 9(1), NIS2 Art. 21(2)(f): effectiveness of
    measures assessed). Ledgered like findings; ``findings`` is the number of decisions returned.
    """

    __tablename__ = "policy_evaluations"
    __table_args__ = (Index("ix_policy_evaluations_period", "period_from_ns", "period_to_ns"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str | None] = mapped_column(String(253), nullable=True)
    period_from_ns: Mapped[int] = mapped_column(BigInteger)
    period_to_ns: Mapped[int] = mapped_column(BigInteger)
    bundle_revision: Mapped[str] = mapped_column(String(128))
    bundle_digest: Mapped[str] = mapped_column(String(64))
    engine: Mapped[str] = mapped_column(String(32))
    evaluated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    findings: Mapped[int] = mapped_column(Integer)


class EvidencePack(Base):
    """An evidence pack that was rendered: its id, period, where it was written, its manifest digest."""

    __tablename__ = "evidence_packs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    pack_id: Mapped[str] = mapped_column(String(64), unique=True)
    period_from_ns: Mapped[int] = mapped_column(BigInteger)
    period_to_ns: Mapped[int] = mapped_column(BigInteger)
    scope: Mapped[Any] = mapped_column(JsonDoc)
    path: Mapped[str] = mapped_column(Text)
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    ledger_head_seq: Mapped[int] = mapped_column(BigInteger)
    ledger_head_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


# --------------------------------------------------------------------------------------------
# Scheduler
# --------------------------------------------------------------------------------------------


class SchedulerJob(Base):
    """APScheduler 3's ``SQLAlchemyJobStore`` table, declared here so Alembic owns it.

    Same name, columns and index as the table the job store would create
    (``apscheduler.jobstores.sqlalchemy``): the store's own ``create(checkfirst=True)`` then finds
    it and does nothing, the schema comparison stays clean and ``db downgrade base`` drops it.
    ``next_run_time`` is POSIX seconds (UTC); ``job_state`` is the pickled job.
    """

    __tablename__ = "apscheduler_jobs"

    id: Mapped[str] = mapped_column(Unicode(191), primary_key=True)
    next_run_time: Mapped[float | None] = mapped_column(Float(25), index=True, nullable=True)
    job_state: Mapped[bytes] = mapped_column(LargeBinary)


class JobRun(Base):
    """One run of a scheduled job (``collector.scheduler``): when, how it ended, and why it failed.

    ``outcome`` is ``success``, ``error`` or ``skipped`` (a stage that is not installed);
    ``summary`` is a short human line (rows attributed, pack written...). Operational record, not
    evidence: not ledgered, and subject to retention like any other class.
    """

    __tablename__ = "job_runs"
    __table_args__ = (Index("ix_job_runs_job", "job_id", "started_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    outcome: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    summary: Mapped[str | None] = mapped_column(Text, nullable=True)
