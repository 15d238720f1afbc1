"""Attribution (collector/lineage.py): transaction → pod → claim → device → physical GPU.

Histories are built as projection rows (what collector/kube/projections.py derives from watched
objects), each backed by an ``object_versions`` row, on SQLite and PostgreSQL. Times are integer
nanoseconds from ``T0`` (2026-11-29T09:00:00Z).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select, update

from collector.cli import cli
from collector.errors import UserError
from collector.lineage import attribute, attribute_run, lineage_select, trace, verify_lineage
from collector.store.models import (
    AllocationEpisode,
    AllocationResult,
    ClaimConsumer,
    CoverageInterval,
    DeviceState,
    InferenceRecord,
    Lineage,
    ObjectVersion,
    PodClaimRef,
    PodContainerClaim,
    PodState,
    WatchState,
)
from collector.timeutil import NS_PER_S, dt_to_ns

S = NS_PER_S
T0 = dt_to_ns(datetime(2026, 11, 29, 9, 0, 0, tzinfo=timezone.utc))
CLUSTER = "prod-eu-1"
NS = "risk-inference"
DRIVER = "gpu.nvidia.com"
GPU_A = "GPU-4a1b6c2d-0e9f-4a1b-8c7d-6e5f4a3b2c1d"
GPU_B = "GPU-9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"
A100 = "NVIDIA A100-SXM4-80GB"


class History:
    """Writes a small, realistic allocation history as projection rows (one object version each)."""

    def __init__(self, session):
        self.s = session
        self._uid = (f"00000000-0000-4000-8000-{n:012d}" for n in itertools.count(1))
        self._rv = itertools.count(1000)

    def _version(self, kind: str, namespace: str | None, name: str, uid: str) -> int:
        raw = {"kind": kind, "metadata": {"name": name, "namespace": namespace, "uid": uid}}
        return self.s.execute(insert(ObjectVersion).values(
            cluster=CLUSTER, api_group="" if kind == "Pod" else "resource.k8s.io", api_version="v1", kind=kind,
            namespace=namespace, name=name, uid=uid, resource_version=str(next(self._rv)), event_type="ADDED",
            observed_at=datetime.now(timezone.utc), raw=raw, content_hash=hashlib.sha256(json.dumps(raw).encode()).hexdigest(),
        ).returning(ObjectVersion.id)).scalar_one()

    def covered(self, since_ns: int = T0 - 3600 * S) -> None:
        """The watcher has been synced for Pod, ResourceClaim and ResourceSlice since ``since_ns``."""
        for kind in ("Pod", "ResourceClaim", "ResourceSlice"):
            self.s.execute(insert(WatchState).values(
                cluster=CLUSTER, kind=kind, api_version="v1", resource_version="1", synced=True, state="synced",
                state_since_ns=since_ns, updated_at=datetime.now(timezone.utc)))

    def gap(self, kind: str, start_ns: int, end_ns: int, synced_since_ns: int = T0 - 3600 * S) -> None:
        """``kind`` was synced, then lost its watch during [start, end), then synced again."""
        self.s.execute(insert(CoverageInterval), [
            dict(cluster=CLUSTER, kind=kind, state="synced", started_ns=synced_since_ns, ended_ns=start_ns),
            dict(cluster=CLUSTER, kind=kind, state="gap", started_ns=start_ns, ended_ns=end_ns, reason="410 Gone"),
        ])
        self.s.execute(update(WatchState).where(WatchState.cluster == CLUSTER, WatchState.kind == kind)
                       .values(state_since_ns=end_ns))

    def gpu(self, node: str, device: str, uuid: str | None, start: int = T0 - 3600 * S, end: int | None = None, *,
            parent: str | None = None, profile: str | None = None, generation: int = 1) -> int:
        """A device in the node-local ResourceSlice of ``node`` (pool = node name)."""
        vid = self._version("ResourceSlice", None, f"{node}-{DRIVER}-x7k2p", next(self._uid))
        return self.s.execute(insert(DeviceState).values(
            cluster=CLUSTER, driver=DRIVER, pool=node, device=device, slice_name=f"{node}-{DRIVER}-x7k2p",
            pool_generation=generation, node_name=node, device_type="mig" if parent else "gpu", uuid=uuid,
            parent_uuid=parent, physical_gpu_uuid=parent or uuid, profile=profile, product_name=A100,
            driver_version="580.95.5", memory_bytes=85899345920, valid_from_ns=start, valid_to_ns=end,
            source_version_id=vid,
        ).returning(DeviceState.id)).scalar_one()

    def pod(self, name: str, node: str, start: int, end: int | None = None, *, claims: dict[str, str | None],
            containers: dict[str, list[tuple[str, str]]], uid: str | None = None, namespace: str = NS) -> str:
        """A pod: ``claims`` pod claim name → ResourceClaim name (None: no claim needed);
        ``containers`` container → [(pod claim name, request)]; every container listed runs."""
        uid = uid or next(self._uid)
        vid = self._version("Pod", namespace, name, uid)
        self.s.execute(insert(PodState).values(cluster=CLUSTER, pod_uid=uid, namespace=namespace, name=name,
                                               node_name=node, phase="Running", valid_from_ns=start,
                                               valid_to_ns=end, source_version_id=vid))
        for pod_claim, claim in claims.items():
            self.s.execute(insert(PodClaimRef).values(cluster=CLUSTER, pod_uid=uid, namespace=namespace,
                                                      pod_claim_name=pod_claim, claim_name=claim,
                                                      valid_from_ns=start, valid_to_ns=end))
        for container, refs in containers.items():
            for pod_claim, request in refs:
                self.s.execute(insert(PodContainerClaim).values(cluster=CLUSTER, pod_uid=uid, container_name=container,
                                                                pod_claim_name=pod_claim, request=request))
        return uid

    def claim(self, name: str, start: int, end: int | None = None, *, results: list[tuple], consumers: list[tuple],
              owner: str | None = None, namespace: str = NS) -> dict:
        """A ResourceClaim allocated over [start, end): ``results`` [(request, pool, device[, adminAccess])],
        ``consumers`` [(pod uid, pod name, from, to)] from ``status.reservedFor``."""
        uid = next(self._uid)
        vid = self._version("ResourceClaim", namespace, name, uid)
        episode = self.s.execute(insert(AllocationEpisode).values(
            cluster=CLUSTER, claim_uid=uid, claim_namespace=namespace, claim_name=name, owner_pod_uid=owner,
            first_rv=str(next(self._rv)), node_name=results[0][1] if results else None, valid_from_ns=start,
            valid_to_ns=end, source_version_id=vid,
        ).returning(AllocationEpisode.id)).scalar_one()
        for request, pool, device, *admin in results:
            self.s.execute(insert(AllocationResult).values(episode_id=episode, request=request, driver=DRIVER, pool=pool,
                                                           device=device, device_class_name="gpu.nvidia.com",
                                                           admin_access=bool(admin and admin[0])))
        for pod_uid, pod_name, c_from, c_to in consumers:
            self.s.execute(insert(ClaimConsumer).values(cluster=CLUSTER, claim_uid=uid, episode_id=episode,
                                                        consumer_resource="pods", consumer_name=pod_name,
                                                        consumer_uid=pod_uid, valid_from_ns=c_from, valid_to_ns=c_to))
        return {"uid": uid, "episode": episode}

    def record(self, txn: str, t: int, *, pod_uid: str | None = None, pod: str | None = None,
               container: str = "triton", namespace: str | None = NS, decision: str = "APPROVE", conflict: bool = False,
               node: str | None = None) -> int:
        """A scored transaction as the ingester stores it (event time with ms precision); ``conflict``:
        flagged as the ingester flags an id stored again with different content."""
        key = hashlib.sha256(f"{txn}|{t}|{pod_uid}|{pod}|{container}|{decision}".encode()).hexdigest()
        return self.s.execute(insert(InferenceRecord).values(
            transaction_id=txn, event_time_ns=t, event_time_precision_ns=1_000_000, received_ns=t + 40_000_000,
            cluster=CLUSTER, pod_uid=pod_uid, pod_uid_source="envelope" if pod_uid else None,
            pod_namespace=namespace, pod_name=pod, container_name=container, node_name=node, model_name="fraud-xgb",
            model_version="7", decision=decision, source_format="spring_ecs_nested", envelope="cri",
            source="/var/log/pods/risk.log", raw_sha256=key, dedup_key=key, conflict=conflict,
        ).returning(InferenceRecord.id)).scalar_one()


def lineage_of(session, record_id: int) -> dict:
    row = session.execute(select(Lineage).where(Lineage.record_id == record_id)).scalar_one()
    return {c: getattr(row, c) for c in ("status", "reason", "candidates", "pod_uid", "node_name", "claim_name",
                                         "request", "driver", "pool", "device", "device_uuid", "physical_gpu_uuid",
                                         "product_name", "mig_profile")}


@pytest.fixture
def hist(sessions):
    with sessions() as session:
        h = History(session)
        h.covered()
        yield h


def single_gpu_pod(h: History, name: str, node: str, device: str, start: int, end: int | None = None,
                   uid: str | None = None) -> tuple[str, dict]:
    """The common case: a pod whose ``triton`` container uses its own template claim for one GPU."""
    claim_name = f"{name}-gpu-{device}"
    pod_uid = h.pod(name, node, start, end, uid=uid, claims={"gpu": claim_name}, containers={"triton": [("gpu", "")]})
    claim = h.claim(claim_name, start, end, results=[("gpu", node, device)], consumers=[(pod_uid, name, start, end)],
                    owner=pod_uid)
    return pod_uid, claim


# --------------------------------------------------------------------------------------------


def test_pod_restarted_onto_another_gpu(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    h.gpu("gpu-node-b", "gpu-1", GPU_B)
    first, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0, T0 + 600 * S)
    second, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-b", "gpu-1", T0 + 610 * S)
    before = h.record("txn-0001", T0 + 300 * S, pod="fraud-scorer-0")
    after = h.record("txn-0002", T0 + 900 * S, pod="fraud-scorer-0")

    assert attribute(h.s) == {"exact": 2, "ambiguous": 0, "unattributed": 0}
    assert lineage_of(h.s, before) == {
        "status": "exact", "reason": None, "candidates": 1, "pod_uid": first, "node_name": "gpu-node-a",
        "claim_name": "fraud-scorer-0-gpu-gpu-0", "request": "gpu", "driver": DRIVER, "pool": "gpu-node-a",
        "device": "gpu-0", "device_uuid": GPU_A, "physical_gpu_uuid": GPU_A, "product_name": A100, "mig_profile": None}
    row = lineage_of(h.s, after)
    assert (row["status"], row["pod_uid"], row["node_name"], row["device"], row["physical_gpu_uuid"]) == \
        ("exact", second, "gpu-node-b", "gpu-1", GPU_B)


def test_mig_slice_resolves_to_parent_gpu(hist):
    h = hist
    mig_uuid = "MIG-1c2d3e4f-5a6b-5c7d-8e9f-0a1b2c3d4e5f"
    h.gpu("gpu-node-a", "gpu-0-mig-1g10gb-19-0", mig_uuid, parent=GPU_A, profile="1g.10gb")
    pod_uid, _ = single_gpu_pod(h, "fraud-scorer-small-0", "gpu-node-a", "gpu-0-mig-1g10gb-19-0", T0)
    rec = h.record("txn-mig", T0 + 60 * S, pod_uid=pod_uid)

    attribute(h.s)
    row = lineage_of(h.s, rec)
    assert (row["status"], row["device_uuid"], row["physical_gpu_uuid"], row["mig_profile"]) == \
        ("exact", mig_uuid, GPU_A, "1g.10gb")


def test_dynamic_mig_without_own_uuid_still_names_the_parent(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0-mig-3g40gb-9-4", None, parent=GPU_A, profile="3g.40gb")
    pod_uid, _ = single_gpu_pod(h, "fraud-scorer-mid-0", "gpu-node-a", "gpu-0-mig-3g40gb-9-4", T0)
    rec = h.record("txn-dynmig", T0 + 60 * S, pod_uid=pod_uid)

    attribute(h.s)
    row = lineage_of(h.s, rec)
    assert (row["status"], row["device"], row["device_uuid"], row["physical_gpu_uuid"]) == \
        ("exact", "gpu-0-mig-3g40gb-9-4", None, GPU_A)


def test_shared_claim_two_pods_one_device(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    spec = dict(claims={"shared": "shared-a100"}, containers={"triton": [("shared", "")]})
    p1 = h.pod("scorer-a-5f7d9-abcde", "gpu-node-a", T0, **spec)
    p2 = h.pod("scorer-b-6c8e1-fghij", "gpu-node-a", T0 + 5 * S, **spec)
    h.claim("shared-a100", T0 - 10 * S, results=[("gpu", "gpu-node-a", "gpu-0")],
            consumers=[(p1, "scorer-a-5f7d9-abcde", T0, None), (p2, "scorer-b-6c8e1-fghij", T0 + 5 * S, None)])
    r1 = h.record("txn-a", T0 + 60 * S, pod_uid=p1)
    r2 = h.record("txn-b", T0 + 60 * S, pod="scorer-b-6c8e1-fghij")

    assert attribute(h.s)["exact"] == 2
    assert [(lineage_of(h.s, r)["pod_uid"], lineage_of(h.s, r)["physical_gpu_uuid"], lineage_of(h.s, r)["claim_name"])
            for r in (r1, r2)] == [(p1, GPU_A, "shared-a100"), (p2, GPU_A, "shared-a100")]


def test_consumer_not_in_reserved_for_is_not_served(hist):
    """A pod naming a claim it is not (yet) reserved for, and does not own, has no allocation at t."""
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    p1 = h.pod("scorer-a-5f7d9-abcde", "gpu-node-a", T0, claims={"gpu": "shared-a100"},
               containers={"triton": [("gpu", "")]})
    h.claim("shared-a100", T0, results=[("gpu", "gpu-node-a", "gpu-0")], consumers=[(p1, "scorer-a", T0 + 90 * S, None)])
    rec = h.record("txn-early", T0 + 30 * S, pod_uid=p1)

    # a pod-owned template claim counts while its reservation is not (yet) observed
    owner = h.pod("fraud-scorer-0", "gpu-node-a", T0, claims={"gpu": "fraud-scorer-0-gpu-q8w2e"},
                  containers={"triton": [("gpu", "")]})
    h.claim("fraud-scorer-0-gpu-q8w2e", T0, results=[("gpu", "gpu-node-a", "gpu-0")],
            consumers=[(owner, "fraud-scorer-0", T0 + 90 * S, None)], owner=owner)
    owned = h.record("txn-owned", T0 + 30 * S, pod_uid=owner)

    attribute(h.s)
    assert (lineage_of(h.s, rec)["status"], lineage_of(h.s, rec)["reason"]) == ("unattributed", "no-allocation")
    assert (lineage_of(h.s, owned)["status"], lineage_of(h.s, owned)["physical_gpu_uuid"]) == ("exact", GPU_A)


def sidecar_pod(h: History, name: str = "risk-api-7d9f8c-x2x9z") -> str:
    """Spring ``risk-api`` logs transactions; ``triton-a`` and ``triton-b`` each hold one GPU."""
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    h.gpu("gpu-node-a", "gpu-1", GPU_B)
    uid = h.pod(name, "gpu-node-a", T0, claims={"gpu-a": f"{name}-gpu-a", "gpu-b": f"{name}-gpu-b"},
                containers={"triton-a": [("gpu-a", "")], "triton-b": [("gpu-b", "")]})
    h.claim(f"{name}-gpu-a", T0, results=[("gpu", "gpu-node-a", "gpu-0")], consumers=[(uid, name, T0, None)], owner=uid)
    h.claim(f"{name}-gpu-b", T0, results=[("gpu", "gpu-node-a", "gpu-1")], consumers=[(uid, name, T0, None)], owner=uid)
    return uid


def test_sidecar_holds_the_claim_logger_has_none(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    uid = h.pod("risk-api-7d9f8c-x2x9z", "gpu-node-a", T0, claims={"gpu": "risk-api-7d9f8c-x2x9z-gpu-m4x7q"},
                containers={"triton-sidecar": [("gpu", "")]})
    h.claim("risk-api-7d9f8c-x2x9z-gpu-m4x7q", T0, results=[("gpu", "gpu-node-a", "gpu-0")],
            consumers=[(uid, "risk-api-7d9f8c-x2x9z", T0, None)], owner=uid)
    rec = h.record("txn-sidecar", T0 + 120 * S, pod="risk-api-7d9f8c-x2x9z", container="risk-api")

    attribute(h.s)
    row = lineage_of(h.s, rec)
    assert (row["status"], row["pod_uid"], row["device"], row["physical_gpu_uuid"]) == ("exact", uid, "gpu-0", GPU_A)


def test_two_sidecars_on_two_gpus_are_ambiguous_unless_pinned(hist):
    h = hist
    uid = sidecar_pod(h)
    rec = h.record("txn-two", T0 + 120 * S, pod="risk-api-7d9f8c-x2x9z", container="risk-api")
    own = h.record("txn-own", T0 + 121 * S, pod="risk-api-7d9f8c-x2x9z", container="triton-b")

    assert attribute(h.s) == {"exact": 1, "ambiguous": 1, "unattributed": 0}
    row = lineage_of(h.s, rec)
    assert (row["status"], row["reason"], row["candidates"], row["pod_uid"], row["physical_gpu_uuid"], row["device"]) == \
        ("ambiguous", "several-devices", 2, uid, None, None)
    # the logging container's own claim wins over any other container's
    assert (lineage_of(h.s, own)["status"], lineage_of(h.s, own)["physical_gpu_uuid"]) == ("exact", GPU_B)

    counts = attribute(h.s, all=True, serving_containers={f"{NS}/risk-api": "triton-a", f"{NS}/risk": "triton-b"})
    assert counts == {"exact": 2, "ambiguous": 0, "unattributed": 0}
    assert (lineage_of(h.s, rec)["device"], lineage_of(h.s, rec)["physical_gpu_uuid"]) == ("gpu-0", GPU_A)
    assert lineage_of(h.s, own)["physical_gpu_uuid"] == GPU_B


def test_request_filter_subrequests_and_admin_access(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    h.gpu("gpu-node-a", "gpu-1", GPU_B)
    uid = h.pod("scorer-7d9f8c-x2x9z", "gpu-node-a", T0, claims={"gpus": "scorer-gpus"},
                containers={"triton": [("gpus", "large")], "warmup": [("gpus", "spare")]})
    # "large/a100" is a subrequest of "large" (prioritized list): kubelet hands it to "large" refs
    h.claim("scorer-gpus", T0, results=[("large/a100", "gpu-node-a", "gpu-0"), ("spare", "gpu-node-a", "gpu-1")],
            consumers=[(uid, "scorer", T0, None)], owner=uid)
    mon = h.pod("dcgm-probe-qz7k1", "gpu-node-a", T0, claims={"probe": "dcgm-probe-admin"},
                containers={"probe": [("probe", "")]})
    h.claim("dcgm-probe-admin", T0, results=[("probe", "gpu-node-a", "gpu-0", True)], consumers=[(mon, "dcgm", T0, None)])
    rec = h.record("txn-large", T0 + 60 * S, pod_uid=uid)
    probe = h.record("txn-probe", T0 + 60 * S, pod_uid=mon, container="probe")

    attribute(h.s)
    row = lineage_of(h.s, rec)
    assert (row["status"], row["request"], row["device"], row["physical_gpu_uuid"]) == ("exact", "large/a100", "gpu-0", GPU_A)
    assert (lineage_of(h.s, probe)["status"], lineage_of(h.s, probe)["reason"]) == ("unattributed", "no-allocation")
    # the adminAccess probe is not a tenant of GPU A
    (doc,) = trace(h.s, ["txn-large"], cluster=CLUSTER)
    assert doc["co_tenants"] == []


def test_transaction_near_a_transition_is_a_skew_window(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    uid, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0)
    rec = h.record("txn-edge", T0 + 1_500_000_000, pod_uid=uid)  # 1.5 s after the pod and claim appeared

    assert attribute(h.s) == {"exact": 0, "ambiguous": 1, "unattributed": 0}
    row = lineage_of(h.s, rec)
    assert (row["status"], row["reason"], row["physical_gpu_uuid"]) == ("ambiguous", "skew-window", GPU_A)
    assert attribute(h.s, all=True, clock_skew_s=1.0) == {"exact": 1, "ambiguous": 0, "unattributed": 0}


def test_device_republished_near_t_changes_nothing_allocated_before(hist):
    """The device is read as allocated (step 5): a slice republished 1 s before t is no transition of
    the transaction's chain (it was a skew-window while the device was read at t)."""
    h = hist
    first = h.gpu("gpu-node-a", "gpu-0", GPU_A, T0 - 3600 * S, T0 + 300 * S, generation=1)
    h.gpu("gpu-node-a", "gpu-0", GPU_A, T0 + 300 * S, generation=2)
    uid, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0)
    rec = h.record("txn-slice", T0 + 301 * S, pod_uid=uid)
    later = h.record("txn-later", T0 + 400 * S, pod_uid=uid)

    attribute(h.s)
    assert (lineage_of(h.s, rec)["status"], lineage_of(h.s, rec)["physical_gpu_uuid"]) == ("exact", GPU_A)
    assert (lineage_of(h.s, later)["status"], lineage_of(h.s, later)["physical_gpu_uuid"]) == ("exact", GPU_A)
    assert h.s.execute(select(Lineage.device_state_id).where(Lineage.record_id == later)).scalar_one() == first


def test_highest_pool_generation_wins(hist):
    """Two slices still publish gpu-0 (the old generation not yet deleted): the newest describes it."""
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_B, T0 - 3600 * S, generation=3)
    h.gpu("gpu-node-a", "gpu-0", GPU_A, T0 - 600 * S, generation=4)
    uid, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0)
    rec = h.record("txn-gen", T0 + 60 * S, pod_uid=uid)

    attribute(h.s)
    assert (lineage_of(h.s, rec)["status"], lineage_of(h.s, rec)["physical_gpu_uuid"]) == ("exact", GPU_A)


def test_coverage_gap_is_never_exact(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    uid, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0)
    h.gap("ResourceSlice", T0 + 1000 * S, T0 + 1100 * S)
    inside = h.record("txn-gap", T0 + 1050 * S, pod_uid=uid)
    after = h.record("txn-after", T0 + 1200 * S, pod_uid=uid)
    before_watch = h.record("txn-before-watch", T0 - 7200 * S, pod_uid=uid)

    assert attribute(h.s) == {"exact": 1, "ambiguous": 0, "unattributed": 2}
    assert lineage_of(h.s, inside) == {
        "status": "unattributed", "reason": "coverage-gap", "candidates": 0, "pod_uid": uid, "node_name": None,
        "claim_name": None, "request": None, "driver": None, "pool": None, "device": None, "device_uuid": None,
        "physical_gpu_uuid": None, "product_name": None, "mig_profile": None}
    assert lineage_of(h.s, before_watch)["reason"] == "coverage-gap"
    assert lineage_of(h.s, after)["status"] == "exact"


def test_unattributed_reasons(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    # a template claim the resourceclaim controller decided is not needed (claim_name NULL)
    unneeded = h.pod("batch-report-x1", "gpu-node-a", T0, claims={"gpu": None}, containers={"main": [("gpu", "")]})
    # a claim reference whose claim was never allocated
    pending = h.pod("fraud-scorer-2", "gpu-node-a", T0, claims={"gpu": "fraud-scorer-2-gpu"},
                    containers={"triton": [("gpu", "")]})
    # an allocated device that no ResourceSlice published
    ghost = h.pod("fraud-scorer-3", "gpu-node-a", T0, claims={"gpu": "fraud-scorer-3-gpu"},
                  containers={"triton": [("gpu", "")]})
    h.claim("fraud-scorer-3-gpu", T0, results=[("gpu", "gpu-node-a", "gpu-7")], consumers=[(ghost, "fraud-scorer-3", T0, None)])
    # the same pod name twice at t (two uids)
    h.pod("fraud-scorer-4", "gpu-node-a", T0, claims={}, containers={})
    h.pod("fraud-scorer-4", "gpu-node-a", T0 + 10 * S, claims={}, containers={})
    recs = {
        "no-pod (uid never projected)": h.record("t1", T0 + 60 * S, pod_uid="7a4b1c2d-0000-4000-8000-00000000dead"),
        "no-claim (claim not needed)": h.record("t2", T0 + 60 * S, pod_uid=unneeded, container="main"),
        "no-pod (unknown name)": h.record("t3", T0 + 60 * S, pod="fraud-scorer-9"),
        "no-pod (uid not alive at t)": h.record("t4", T0 - 60 * S, pod_uid=pending),
        "no-allocation": h.record("t5", T0 + 60 * S, pod_uid=pending),
        "no-device-record": h.record("t6", T0 + 60 * S, pod_uid=ghost),
        "several-pods": h.record("t7", T0 + 60 * S, pod="fraud-scorer-4"),
    }

    summary = attribute_run(h.s)
    got = {label: (lineage_of(h.s, r)["status"], lineage_of(h.s, r)["reason"]) for label, r in recs.items()}
    assert got == {
        "no-pod (uid never projected)": ("unattributed", "no-pod"),
        "no-claim (claim not needed)": ("unattributed", "no-claim"),
        "no-pod (unknown name)": ("unattributed", "no-pod"),
        "no-pod (uid not alive at t)": ("unattributed", "no-pod"),
        "no-allocation": ("unattributed", "no-allocation"),
        "no-device-record": ("unattributed", "no-device-record"),
        "several-pods": ("ambiguous", "several-pods"),
    }
    assert summary.as_json() == {"exact": 0, "ambiguous": 1, "unattributed": 6, "by_reason": {
        "several-pods": 1, "no-allocation": 1, "no-claim": 1, "no-device-record": 1, "no-pod": 3},
        "revisited": 0, "revised": 0, "new": 7}
    assert lineage_of(h.s, recs["several-pods"])["candidates"] == 2
    assert lineage_of(h.s, recs["no-device-record"])["claim_name"] == "fraud-scorer-3-gpu"


def test_incremental_run_touches_only_new_records(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    h.gpu("gpu-node-b", "gpu-1", GPU_B)
    uid, claim = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0)
    old = h.record("txn-1", T0 + 60 * S, pod_uid=uid)
    assert attribute(h.s) == {"exact": 1, "ambiguous": 0, "unattributed": 0}
    first_at = h.s.execute(select(Lineage.attributed_at).where(Lineage.record_id == old)).scalar_one()

    assert attribute(h.s) == {"exact": 0, "ambiguous": 0, "unattributed": 0}  # idempotent
    # a history correction: the claim was really on gpu-1 of node b
    h.s.execute(update(AllocationResult).where(AllocationResult.episode_id == claim["episode"])
                .values(pool="gpu-node-b", device="gpu-1"))
    new = h.record("txn-2", T0 + 120 * S, pod_uid=uid)
    assert attribute(h.s) == {"exact": 1, "ambiguous": 0, "unattributed": 0}
    assert lineage_of(h.s, old)["physical_gpu_uuid"] == GPU_A  # untouched
    assert h.s.execute(select(Lineage.attributed_at).where(Lineage.record_id == old)).scalar_one() == first_at
    assert lineage_of(h.s, new)["physical_gpu_uuid"] == GPU_B

    assert attribute(h.s, all=True) == {"exact": 2, "ambiguous": 0, "unattributed": 0}
    assert lineage_of(h.s, old)["physical_gpu_uuid"] == GPU_B
    assert h.s.execute(select(Lineage.record_id)).scalars().all().__len__() == 2


def test_trace_document_and_co_tenants(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0-mig-3g40gb-9-0", "MIG-aaaa0000-1111-5222-8333-444455556666", parent=GPU_A, profile="3g.40gb")
    h.gpu("gpu-node-a", "gpu-0-mig-3g40gb-9-4", "MIG-bbbb0000-1111-5222-8333-444455556666", parent=GPU_A, profile="3g.40gb")
    h.gpu("gpu-node-a", "gpu-1", GPU_B)
    scorer, claim = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0-mig-3g40gb-9-0", T0)
    # another tenant on the other MIG slice of the same GPU, one that left before t, one on another GPU
    other = h.pod("chatbot-5b6c7d-k2l3m", "gpu-node-a", T0, claims={"gpu": "chatbot-mig"},
                  containers={"vllm": [("gpu", "")]}, namespace="genai")
    h.claim("chatbot-mig", T0, results=[("gpu", "gpu-node-a", "gpu-0-mig-3g40gb-9-4")],
            consumers=[(other, "chatbot-5b6c7d-k2l3m", T0, None)], namespace="genai")
    gone = h.pod("etl-job-abc12", "gpu-node-a", T0, T0 + 30 * S, claims={"gpu": "etl-mig"}, containers={"etl": [("gpu", "")]})
    h.claim("etl-mig", T0, T0 + 30 * S, results=[("gpu", "gpu-node-a", "gpu-0-mig-3g40gb-9-4")],
            consumers=[(gone, "etl-job-abc12", T0, T0 + 30 * S)])
    elsewhere, _ = single_gpu_pod(h, "fraud-scorer-1", "gpu-node-a", "gpu-1", T0)
    kept = h.record("txn-7781", T0 + 90 * S + 250_000_000, pod="fraud-scorer-0")
    # the same transaction id shipped twice with different content (a conflict)
    again = h.record("txn-7781", T0 + 91 * S, pod="fraud-scorer-0", decision="DECLINE", conflict=True)
    attribute(h.s, cluster=CLUSTER)

    docs = trace(h.s, ["txn-7781", "txn-missing"], cluster=CLUSTER)
    assert [d["transaction_id"] for d in docs] == ["txn-7781", "txn-7781", "txn-missing"]
    first = docs[0]
    assert list(first) == ["transaction_id", "time", "status", "reason", "pod", "claim", "device", "device_uuid",
                           "physical_gpu_uuid", "product", "mig_profile", "co_tenants", "conflict",
                           "record_id", "cluster", "container", "decision", "candidates", "attribution",
                           "identity_conflict"]
    assert first == {
        "transaction_id": "txn-7781", "time": "2026-11-29T09:01:30.25Z", "status": "exact", "reason": None,
        "pod": {"namespace": NS, "name": "fraud-scorer-0", "uid": scorer, "node": "gpu-node-a"},
        "claim": {"namespace": NS, "name": "fraud-scorer-0-gpu-gpu-0-mig-3g40gb-9-0", "uid": claim["uid"], "request": "gpu"},
        "device": {"driver": DRIVER, "pool": "gpu-node-a", "device": "gpu-0-mig-3g40gb-9-0"},
        "device_uuid": "MIG-aaaa0000-1111-5222-8333-444455556666", "physical_gpu_uuid": GPU_A, "product": A100,
        "mig_profile": "3g.40gb",
        "co_tenants": [{"namespace": "genai", "pod": "chatbot-5b6c7d-k2l3m", "pod_uid": other, "claim": "chatbot-mig",
                            "consumer": "pod", "name": "chatbot-5b6c7d-k2l3m", "uid": other, "certain": True}],
        "conflict": False, "record_id": kept, "cluster": CLUSTER, "container": "triton", "decision": "APPROVE",
        "candidates": 1, "attribution": "stored", "identity_conflict": [],
    }
    assert docs[1]["time"] == "2026-11-29T09:01:31Z" and docs[1]["status"] == "exact" and docs[1]["conflict"] is True
    # the two records of one id differ in more than the flag: which record, what it decided
    assert (docs[1]["record_id"], docs[1]["decision"]) == (again, "DECLINE")
    assert docs[2]["status"] == "not-found" and docs[2]["physical_gpu_uuid"] is None
    assert elsewhere not in json.dumps(docs)


def test_trace_attributes_on_the_fly_without_writing(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    uid, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0)
    h.record("txn-fresh", T0 + 60 * S, pod_uid=uid)
    (doc,) = trace(h.s, ["txn-fresh"], cluster=CLUSTER)
    assert (doc["status"], doc["physical_gpu_uuid"]) == ("exact", GPU_A)
    assert (doc["cluster"], doc["container"], doc["decision"], doc["candidates"]) == (CLUSTER, "triton", "APPROVE", 1)
    assert doc["attribution"] == "computed"
    assert h.s.execute(select(Lineage.record_id)).first() is None


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def test_cli_attribute_and_trace(sessions, database_url, monkeypatch):
    monkeypatch.setenv("DRAUDIT_CLUSTER", CLUSTER)
    with sessions.begin() as session:
        h = History(session)
        h.covered()
        h.gpu("gpu-node-a", "gpu-0", GPU_A)
        uid, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0)
        h.record("txn-cli-1", T0 + 60 * S, pod_uid=uid)
        h.record("txn-cli-2", T0 + 1 * S, pod_uid=uid)
        h.record("txn-cli-3", T0 + 60 * S, pod="nobody-0")
    runner = CliRunner()

    res = runner.invoke(cli, ["attribute", "--database-url", database_url, "--output", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"exact": 1, "ambiguous": 1, "unattributed": 1,
                                      "by_reason": {"no-pod": 1, "skew-window": 1}, "revisited": 0, "revised": 0,
                                      "new": 3, "pending": {"awaiting-history": 0, "future-event-time": 0}}
    res = runner.invoke(cli, ["attribute", "--database-url", database_url])
    assert res.exit_code == 0 and "exact" in res.output and "0" in res.output

    res = runner.invoke(cli, ["trace", "txn-cli-1", "--database-url", database_url, "--output", "json"])
    assert res.exit_code == 0, res.output
    (doc,) = json.loads(res.output)
    assert (doc["status"], doc["pod"]["uid"], doc["physical_gpu_uuid"]) == ("exact", uid, GPU_A)

    res = runner.invoke(cli, ["trace", "txn-cli-1", "txn-nope", "--database-url", database_url])
    assert res.exit_code == 1
    assert GPU_A in res.output and "not-found" in res.output
    assert f"cluster       {CLUSTER}" in res.output and "decision      APPROVE" in res.output

    res = runner.invoke(cli, ["attribute", "--database-url", database_url, "--clock-skew-s", "-1"])
    assert res.exit_code == 2 and "--clock-skew-s must be a non-negative" in res.output  # the flag, as typed


@pytest.mark.parametrize("value", ["inf", "1e10", "-inf", "nan", "86400.5"])
def test_out_of_range_tolerances_are_one_line_errors(sessions, database_url, value):
    """`--clock-skew-s inf` / `1e10` were an OverflowError traceback; every command names the range."""
    runner = CliRunner()
    for args in (["attribute", "--clock-skew-s", value], ["trace", "txn-x", "--clock-skew-s", value],
                 ["attribute", "--settle-s", value if value != "86400.5" else "4e7"]):
        res = runner.invoke(cli, [*args, "--database-url", database_url])
        assert res.exit_code == 2, (args, res.output)
        assert f"{args[-2]} must be a non-negative number of seconds, at most" in res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)
    with sessions() as session:  # the library says the same, for DRAUDIT_CLOCK_SKEW_S or a caller
        with pytest.raises(UserError, match="clock skew .* at most 86400"):
            attribute_run(session, clock_skew_s=float(value))
        with pytest.raises(UserError, match="settle window"):
            attribute_run(session, settle_s=float("inf"))


def test_a_record_whose_pod_identity_contradicts_its_uid_is_not_exact(hist, capsys):
    """Newcomer repro: a Fluent Bit line of kyc-docs/document-classifier-…-56b5z on gpu-node-c carrying the
    uid of risk-inference/…-s2rld was `exact` to the risk-inference claim. Namespace, name and node (each
    when the record has it) must agree with the uid's pod state at t, else pod-identity-conflict."""
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    h.gpu("gpu-node-c", "gpu-2", GPU_B)
    risk, _ = single_gpu_pod(h, "fraud-scorer-7c9d4-s2rld", "gpu-node-a", "gpu-0", T0)
    kyc = h.pod("document-classifier-5d8f7-56b5z", "gpu-node-c", T0, namespace="kyc-docs", claims={},
                containers={"classifier": []})
    t = T0 + 60 * S
    consistent = h.record("txn-ok", t, pod_uid=risk, pod="fraud-scorer-7c9d4-s2rld", node="gpu-node-a")
    uid_only = h.record("txn-uid-only", t, pod_uid=risk, pod=None, namespace=None)
    foreign = h.record("txn-foreign", t, pod_uid=risk, pod="document-classifier-5d8f7-56b5z",
                       namespace="kyc-docs", node="gpu-node-c", container="classifier")
    wrong_ns = h.record("txn-wrong-ns", t, pod_uid=risk, pod="fraud-scorer-7c9d4-s2rld", namespace="kyc-docs")
    wrong_node = h.record("txn-wrong-node", t, pod_uid=risk, pod="fraud-scorer-7c9d4-s2rld", node="gpu-node-c")
    by_name = h.record("txn-by-name", t, pod="document-classifier-5d8f7-56b5z", namespace="kyc-docs",
                       node="gpu-node-c", container="classifier")
    # Newcomer repro: a uid never observed, with the namespace/name of the risk pod observed then, was
    # `no-claim` ("the pod had no claim"), though the pod of that name held one. Before the pod was
    # observed, and for a name never observed, an unknown uid names no pod (no-pod).
    unknown = "00000000-0000-0000-0000-000000000000"
    unknown_uid = h.record("txn-unknown-uid", t, pod_uid=unknown, pod="fraud-scorer-7c9d4-s2rld")
    unknown_before = h.record("txn-unknown-before", T0 - 60 * S, pod_uid=unknown, pod="fraud-scorer-7c9d4-s2rld")
    unknown_name = h.record("txn-unknown-name", t, pod_uid=unknown, pod="batch-report-0")
    per_record = {row.record_id: (row.status, row.reason) for row in h.s.execute(lineage_select(cluster=CLUSTER))}
    attribute_run(h.s, cluster=CLUSTER)
    records = (consistent, uid_only, foreign, wrong_ns, wrong_node, by_name, unknown_uid, unknown_before, unknown_name)
    got = {r: (lineage_of(h.s, r)["status"], lineage_of(h.s, r)["reason"]) for r in records}
    assert got == per_record  # the segment timeline and the per-record rule agree
    conflict = ("unattributed", "pod-identity-conflict")
    assert got == {consistent: ("exact", None), uid_only: ("exact", None), foreign: conflict,
                   wrong_ns: conflict, wrong_node: conflict, by_name: ("unattributed", "no-claim"),
                   unknown_uid: conflict, unknown_before: ("unattributed", "no-pod"),
                   unknown_name: ("unattributed", "no-pod")}
    row = lineage_of(h.s, foreign)
    assert (row["pod_uid"], row["node_name"], row["claim_name"], row["physical_gpu_uuid"]) == (risk, None, None, None)
    assert kyc != risk
    assert verify_lineage(h.s).ok
    [doc] = trace(h.s, ["txn-foreign"], cluster=CLUSTER)  # the record's own identity, not the uid's pod
    assert (doc["status"], doc["reason"], doc["pod"]["namespace"], doc["pod"]["name"]) == \
        ("unattributed", "pod-identity-conflict", "kyc-docs", "document-classifier-5d8f7-56b5z")
    # and which of its fields contradict the uid's pod at that time (or, for an unknown uid, whose pod the name was)
    assert doc["identity_conflict"] == [
        {"field": "namespace", "record": "kyc-docs", "observed": NS},
        {"field": "name", "record": "document-classifier-5d8f7-56b5z", "observed": "fraud-scorer-7c9d4-s2rld"},
        {"field": "node", "record": "gpu-node-c", "observed": "gpu-node-a"}]
    [doc] = trace(h.s, ["txn-wrong-node"], cluster=CLUSTER)
    assert doc["identity_conflict"] == [{"field": "node", "record": "gpu-node-c", "observed": "gpu-node-a"}]
    [doc] = trace(h.s, ["txn-unknown-uid"], cluster=CLUSTER)
    assert doc["identity_conflict"] == [{"field": "uid", "record": unknown, "observed": risk}]
    from collector.cli.lineage import _print_trace

    [doc] = trace(h.s, ["txn-wrong-node"], cluster=CLUSTER)
    _print_trace(doc)  # draudit trace's table
    assert "conflict      the record's node 'gpu-node-c', observed 'gpu-node-a' at that time" in capsys.readouterr().out
