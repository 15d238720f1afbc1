"""Builders for policy tests (no tests here): allocation histories as projection rows.

Rows are what collector/kube/projections.py derives from watched objects: ``device_states`` from
ResourceSlices, ``allocation_episodes`` + ``allocation_results`` + ``claim_consumers`` from
ResourceClaims, ``coverage_intervals`` / ``watch_state`` from the watcher, ``inference_records``
+ ``lineage`` from ingestion and attribution. Each projection row is backed by an
``object_versions`` row. Times are seconds from ``T0`` (2026-11-29T00:00:00Z) turned into ns.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from datetime import datetime, timezone

from sqlalchemy import insert

from collector.store import ledger
from collector.store.models import (
    AllocationEpisode,
    AllocationResult,
    ClaimConsumer,
    CoverageInterval,
    DeviceState,
    InferenceRecord,
    Lineage,
    ObjectVersion,
    WatchState,
)
from collector.timeutil import NS_PER_S, dt_to_ns

T0 = dt_to_ns(datetime(2026, 11, 29, 0, 0, 0, tzinfo=timezone.utc))
DAY = (T0, T0 + 86_400 * NS_PER_S)
CLUSTER = "prod-eu-1"
DRIVER = "gpu.nvidia.com"
H = 3600


def at(seconds: float) -> int:
    """``T0 + seconds`` in integer nanoseconds."""
    return T0 + int(seconds * NS_PER_S)


def gpu_uuid(label: str) -> str:
    """A stable, realistic GPU UUID for a label such as ``"C0"``."""
    digest = hashlib.sha256(label.encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-4{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"


class History:
    """Writes an allocation history as projection rows inside one session."""

    def __init__(self, session, cluster: str = CLUSTER):
        self.s = session
        self.cluster = cluster
        self._uid = (f"7c3e{n:04d}-1b2a-4c5d-8e6f-{n:012d}" for n in itertools.count(1))
        self._rv = itertools.count(52_000)

    def _version(self, kind: str, namespace: str | None, name: str, uid: str, raw: dict | None = None) -> int:
        raw = raw or {"kind": kind, "metadata": {"name": name, "namespace": namespace, "uid": uid}}
        row = dict(cluster=self.cluster, api_group="resource.k8s.io", api_version="v1", kind=kind, namespace=namespace,
                   name=name, uid=uid, resource_version=str(next(self._rv)), event_type="MODIFIED",
                   observed_at=datetime.now(timezone.utc), raw=raw,
                   content_hash=hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest())
        vid = self.s.execute(insert(ObjectVersion).values(**row).returning(ObjectVersion.id)).scalar_one()
        ledger.append(self.s, "object_versions", [{**row, "id": vid}])
        return vid

    def device(self, node: str, device: str, uuid: str | None, *, parent: str | None = None, profile: str | None = None,
               allow_multiple: bool = False, start_s: float = -H, end_s: float | None = None, generation: int = 1) -> int:
        """A device published in ``node``'s ResourceSlice (a MIG device when ``parent`` is given)."""
        slice_name = f"{node}-gpu.nvidia.com-r8w2k"
        vid = self._version("ResourceSlice", None, slice_name, next(self._uid))
        mig = parent is not None
        return self.s.execute(insert(DeviceState).values(
            cluster=self.cluster, driver=DRIVER, pool=node, device=device, slice_name=slice_name, pool_generation=generation,
            node_name=node, device_type="mig" if mig else "gpu", uuid=uuid, parent_uuid=parent,
            physical_gpu_uuid=parent if mig else uuid, profile=profile, product_name="NVIDIA H100 80GB HBM3",
            driver_version="570.124.6", memory_bytes=(10 if mig else 80) * 2**30, allow_multiple_allocations=allow_multiple,
            attributes={"type": {"string": "mig" if mig else "gpu"}}, capacity={"memory": {"value": "80Gi"}},
            valid_from_ns=at(start_s), valid_to_ns=None if end_s is None else at(end_s), source_version_id=vid,
        ).returning(DeviceState.id)).scalar_one()

    def allocation(self, namespace: str, claim: str, node: str, device: str, start_s: float, end_s: float | None, *,
                   device_class: str = "gpu.nvidia.com", share_id: str | None = None, admin_access: bool = False,
                   consumers: list[tuple[str, float, float | None]] | None = None) -> tuple[int, int]:
        """One allocation episode of claim ``namespace/claim`` with one device result.

        ``consumers``: (pod name, start s, end s) reservations; default one pod for the whole episode.
        Returns ``(episode id, allocation result id)``.
        """
        claim_uid = next(self._uid)
        vid = self._version("ResourceClaim", namespace, claim, claim_uid)
        episode = self.s.execute(insert(AllocationEpisode).values(
            cluster=self.cluster, claim_uid=claim_uid, claim_namespace=namespace, claim_name=claim, owner_pod_uid=None,
            first_rv=str(next(self._rv)), node_name=node, valid_from_ns=at(start_s),
            valid_to_ns=None if end_s is None else at(end_s), source_version_id=vid,
        ).returning(AllocationEpisode.id)).scalar_one()
        result = self.s.execute(insert(AllocationResult).values(
            episode_id=episode, request="gpu", driver=DRIVER, pool=node, device=device, device_class_name=device_class,
            admin_access=admin_access, share_id=share_id,
            consumed_capacity={"memory": "20Gi"} if share_id else None,
        ).returning(AllocationResult.id)).scalar_one()
        for pod, c_start, c_end in consumers if consumers is not None else [(f"{claim}-pod", start_s, end_s)]:
            self.s.execute(insert(ClaimConsumer).values(
                cluster=self.cluster, claim_uid=claim_uid, episode_id=episode, consumer_api_group="",
                consumer_resource="pods", consumer_name=pod, consumer_uid=next(self._uid),
                valid_from_ns=at(c_start), valid_to_ns=None if c_end is None else at(c_end)))
        return episode, result

    def gap(self, kind: str, start_s: float, end_s: float) -> int:
        """A closed watch gap of ``kind`` (the watcher lost the stream, then relisted)."""
        row = dict(cluster=self.cluster, kind=kind, state="gap", started_ns=at(start_s), ended_ns=at(end_s),
                   from_rv="48211", to_rv="48377", reason="watch expired (410 Gone), relisted")
        gid = self.s.execute(insert(CoverageInterval).values(**row).returning(CoverageInterval.id)).scalar_one()
        ledger.append(self.s, "coverage_intervals", [{**row, "id": gid}])
        return gid

    def watch(self, kind: str, state: str, since_s: float, reason: str | None = None) -> None:
        """The watcher's current (open) coverage state for ``kind``."""
        self.s.execute(insert(WatchState).values(
            cluster=self.cluster, kind=kind, api_version="v1", resource_version="52000", synced=state == "synced",
            state=state, state_since_ns=at(since_s), state_reason=reason, updated_at=datetime.now(timezone.utc)))

    def transactions(self, prefix: str, count: int, start_s: float, status: str, reason: str | None = None) -> list[int]:
        """``count`` scored transactions one second apart, attributed with ``status``."""
        rows = []
        for i in range(count):
            txn = f"{prefix}-{i:05d}"
            rows.append(dict(
                transaction_id=txn, event_time_ns=at(start_s + i), event_time_precision_ns=1_000_000,
                received_ns=at(start_s + i + 1), cluster=self.cluster, pod_uid=None, pod_uid_source=None,
                pod_namespace="risk-inference", pod_name="fraud-0", container_name="scorer", node_name="node-a",
                model_name="fraud-xgb", model_version="7", decision="approve", latency_ms=12.5, source_format="jsonl",
                envelope="plain", source="/var/log/scorer.jsonl", position=str(i + 1),
                raw_sha256=hashlib.sha256(txn.encode()).hexdigest(),
                dedup_key=hashlib.sha256(f"dedup-{txn}".encode()).hexdigest(), conflict=False))
        ids = list(self.s.execute(insert(InferenceRecord).returning(InferenceRecord.id, sort_by_parameter_order=True),
                                  rows).scalars())
        ledger.append(self.s, "inference_records", [{**row, "id": rid} for row, rid in zip(rows, ids)])
        self.s.execute(insert(Lineage), [
            dict(record_id=rid, status=status, reason=reason, candidates=1 if status == "exact" else 0,
                 attributed_at=datetime.now(timezone.utc)) for rid in ids])
        return ids


def plant_history(session) -> dict[str, int]:
    """A day on prod-eu-1 with a clean background and one planted instance of each problem.

    Tenants are the namespaces (the shipped data.json maps none). Returns the ids tests assert on.
    Background that must yield nothing: a handover after a 10-minute gap (GPU A0), a claim shared
    by two pods of one namespace (A1), allowed adminAccess from gpu-monitoring, 197 exact
    transactions, a 20-second watch gap. Expected and not a violation: MIG partitions of GPU B0
    used by two tenants (an info observation).
    """
    h = History(session)
    ids: dict[str, int] = {}
    h.watch("ResourceClaim", "synced", -H)
    h.watch("ResourceSlice", "synced", -H)
    # GPU A0: risk-inference, then marketing after a 600 s gap; gpu-monitoring with adminAccess.
    h.device("node-a", "gpu-0", gpu_uuid("A0"))
    h.allocation("risk-inference", "fraud-0-gpu", "node-a", "gpu-0", 1 * H, 5 * H)
    h.allocation("marketing", "recs-0-gpu", "node-a", "gpu-0", 5 * H + 600, 8 * H)
    h.allocation("gpu-monitoring", "dcgm-exporter-gpu", "node-a", "gpu-0", 1 * H, 2 * H, admin_access=True)
    # GPU A1: one claim shared by two pods of one namespace (time-slicing) — same tenant.
    h.device("node-a", "gpu-1", gpu_uuid("A1"))
    h.allocation("risk-inference", "shared-ts-gpu", "node-a", "gpu-1", 1 * H, 6 * H,
                 consumers=[("fraud-1", 1 * H, 6 * H), ("fraud-2", 2 * H, 4 * H)])
    # GPU B0: two MIG partitions, two tenants at once — shared with isolation.
    b0 = gpu_uuid("B0")
    h.device("node-b", "gpu-0-mig-1g10gb-19-0", gpu_uuid("B0-mig-0"), parent=b0, profile="1g.10gb")
    h.device("node-b", "gpu-0-mig-1g10gb-19-1", gpu_uuid("B0-mig-1"), parent=b0, profile="1g.10gb")
    h.allocation("risk-inference", "fraud-mig", "node-b", "gpu-0-mig-1g10gb-19-0", 2 * H, 6 * H, device_class="mig.nvidia.com")
    h.allocation("marketing", "recs-mig", "node-b", "gpu-0-mig-1g10gb-19-1", 3 * H, 7 * H, device_class="mig.nvidia.com")
    # 1. GPU C0: consumable-capacity shares of one device to two tenants.
    h.device("node-c", "gpu-0", gpu_uuid("C0"), allow_multiple=True)
    ids["share_a"] = h.allocation("risk-inference", "fraud-share", "node-c", "gpu-0", 1 * H, 3 * H, share_id="3f1c9a2e")[1]
    ids["share_b"] = h.allocation("marketing", "recs-share", "node-c", "gpu-0", 2 * H, 4 * H, share_id="9a2e3f1c")[1]
    # 2. GPU D0: a scheduler double allocation inside one tenant.
    h.device("node-d", "gpu-0", gpu_uuid("D0"))
    ids["double_a"] = h.allocation("risk-inference", "fraud-2-gpu", "node-d", "gpu-0", 1 * H, 3 * H)[1]
    ids["double_b"] = h.allocation("risk-inference", "fraud-3-gpu", "node-d", "gpu-0", 2 * H, 4 * H)[1]
    # 3. GPU E0: marketing hands the GPU to risk-inference after 30 s.
    h.device("node-e", "gpu-0", gpu_uuid("E0"))
    ids["handover_from"] = h.allocation("marketing", "recs-1-gpu", "node-e", "gpu-0", 1 * H, 2 * H)[1]
    ids["handover_to"] = h.allocation("risk-inference", "fraud-4-gpu", "node-e", "gpu-0", 2 * H + 30, 3 * H)[1]
    # 4. adminAccess from a namespace that is not allowed it.
    ids["admin"] = h.allocation("risk-inference", "debug-admin-gpu", "node-e", "gpu-0", 5 * H, 6 * H, admin_access=True)[1]
    # 5a. a DeviceClass that is not approved; 5b. a device no ResourceSlice published.
    h.device("node-f", "gpu-vfio-0", gpu_uuid("F0"))
    ids["vfio"] = h.allocation("marketing", "passthrough-gpu", "node-f", "gpu-vfio-0", 1 * H, 2 * H,
                               device_class="vfio.gpu.nvidia.com")[1]
    ids["ghost"] = h.allocation("risk-inference", "ghost-gpu", "node-g", "gpu-7", 1 * H, 2 * H)[1]
    # 6. 197 exact and 3 unattributed transactions: 98.5 % < 99 %.
    h.transactions("txn-ok", 197, 2 * H, "exact")
    ids["unattributed"] = h.transactions("txn-lost", 3, 3 * H, "unattributed", "no-pod")[0]
    # 7. a 5-minute ResourceClaim watch gap (and a tolerated 20-second ResourceSlice gap).
    ids["gap"] = h.gap("ResourceClaim", 10 * H, 10 * H + 300)
    h.gap("ResourceSlice", 11 * H, 11 * H + 20)
    # 8. GPU H0: marketing holds a claim for 3 h with a consumer for only 10 minutes.
    h.device("node-h", "gpu-0", gpu_uuid("H0"))
    ids["idle_episode"] = h.allocation("marketing", "idle-gpu", "node-h", "gpu-0", 1 * H, 4 * H,
                                       consumers=[("recs-batch", 1 * H, 1 * H + 600)])[0]
    return ids


EXPECTED_RULES = {
    "isolation/cross-tenant-sharing": 1,
    "isolation/shared-with-isolation": 1,
    "isolation/double-allocation": 1,
    "isolation/tenant-handover-gap": 1,
    "isolation/admin-access": 1,
    "inventory/unapproved-device-class": 1,
    "inventory/unknown-device": 1,
    "inventory/idle-allocation": 1,
    "attribution/exact-ratio": 1,
    "attribution/unattributed-transaction": 3,
    "coverage/observation-gap": 1,
}


def planted_sqlite_store(directory):
    """``(url, sessions, engine)`` of a migrated SQLite store in ``directory`` holding ``plant_history``
    (for module-scoped fixtures: engine behaviour does not depend on the backend); dispose the engine."""
    from collector.store import migrate
    from collector.store.db import make_engine, make_session_factory

    url = f"sqlite:///{directory / 'draudit.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    sessions = make_session_factory(engine)
    with sessions.begin() as s:
        plant_history(s)
    return url, sessions, engine
