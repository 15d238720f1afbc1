"""Attribution end to end from raw v1 objects: object_versions → apply_versions → lineage.

The history is the sidecar pattern as a watcher sees it (dra-api.md §2.8, §4.3, §5): a node-local
ResourceSlice, then a pod whose ``risk-api`` container logs and whose ``triton-sidecar`` container
holds a template claim, the claim being created, allocated and reserved for the pod.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import insert

from collector.kube import projections
from collector.lineage import attribute, trace
from collector.store.canonical import content_hash
from collector.store.models import InferenceRecord, ObjectVersion, WatchState
from collector.timeutil import dt_to_ns

T0 = datetime(2026, 11, 29, 9, 0, 0, tzinfo=timezone.utc)
CLUSTER = "prod-eu-1"
NS = "payments"
POD_UID = "3f6c2a1e-8b7d-4e5f-9a0b-1c2d3e4f5a6b"
CLAIM_UID = "7d8e9f0a-1b2c-4d3e-8f4a-5b6c7d8e9f0a"
CLAIM = "risk-api-7d9f8c-x2x9z-gpu-m4x7q"
GPU = "GPU-4a1b6c2d-0e9f-4a1b-8c7d-6e5f4a3b2c1d"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def resource_slice(rv: int) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "gpu-node-a-gpu.nvidia.com-k7x2p", "uid": "0b1c2d3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e",
                         "resourceVersion": str(rv)},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-node-a",
                     "pool": {"name": "gpu-node-a", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": {
                         "type": {"string": "gpu"}, "uuid": {"string": GPU},
                         "productName": {"string": "NVIDIA H100 80GB HBM3"},
                         "driverVersion": {"version": "570.124.6"}}, "capacity": {"memory": {"value": "80Gi"}}}]}}


def pod(rv: int, *, claim_status: bool, node: str | None, phase: str) -> dict:
    status: dict = {"phase": phase}
    if claim_status:
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": CLAIM}]
    spec: dict = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "h100-single"}],
                  "containers": [{"name": "risk-api", "image": "registry.example/risk-api:3.2"},
                                 {"name": "triton-sidecar", "image": "nvcr.io/nvidia/tritonserver:25.01-py3",
                                  "resources": {"claims": [{"name": "gpu"}]}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "risk-api-7d9f8c-x2x9z", "namespace": NS, "uid": POD_UID, "resourceVersion": str(rv)},
            "spec": spec, "status": status}


def claim(rv: int, *, allocated: bool) -> dict:
    status: dict = {}
    if allocated:
        status = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-node-a", "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["gpu-node-a"]}]}]}},
            "reservedFor": [{"resource": "pods", "name": "risk-api-7d9f8c-x2x9z", "uid": POD_UID}]}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": CLAIM, "namespace": NS, "uid": CLAIM_UID, "resourceVersion": str(rv),
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "risk-api-7d9f8c-x2x9z",
                                              "uid": POD_UID, "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
            "status": status}


def observe(session, raw: dict, event: str, observed_at: datetime) -> None:
    """Store one watch event as the watcher does and project it in the same transaction."""
    group, _, version = raw["apiVersion"].rpartition("/")
    meta = raw["metadata"]
    row = {"cluster": CLUSTER, "api_group": group, "api_version": version, "kind": raw["kind"],
           "namespace": meta.get("namespace"), "name": meta["name"], "uid": meta["uid"],
           "resource_version": meta["resourceVersion"], "event_type": event, "observed_at": observed_at,
           "raw": raw, "content_hash": content_hash(raw)}
    row["id"] = session.execute(insert(ObjectVersion).values(**row).returning(ObjectVersion.id)).scalar_one()
    projections.apply_versions(session, [row])


def record(session, txn: str, seconds: float) -> None:
    t = dt_to_ns(at(seconds))
    session.execute(insert(InferenceRecord).values(
        transaction_id=txn, event_time_ns=t, event_time_precision_ns=1_000_000, received_ns=t + 30_000_000,
        cluster=CLUSTER, pod_namespace=NS, pod_name="risk-api-7d9f8c-x2x9z", container_name="risk-api",
        decision="APPROVE", source_format="spring_ecs_nested", envelope="cri", source="/var/log/pods/x.log",
        raw_sha256=txn.rjust(64, "0"), dedup_key=txn.rjust(64, "0")))


def test_sidecar_pattern_from_watched_objects(sessions):
    with sessions.begin() as s:
        for kind in ("Pod", "ResourceClaim", "ResourceSlice"):
            s.execute(insert(WatchState).values(cluster=CLUSTER, kind=kind, api_version="v1", synced=True,
                                                state="synced", state_since_ns=dt_to_ns(at(-60)),
                                                updated_at=at(100)))  # its last commit: after the records
        observe(s, resource_slice(100), "ADDED", at(-30))
        observe(s, pod(201, claim_status=False, node=None, phase="Pending"), "ADDED", at(0))
        observe(s, claim(202, allocated=False), "ADDED", at(0.4))
        observe(s, pod(203, claim_status=True, node=None, phase="Pending"), "MODIFIED", at(0.5))
        observe(s, claim(204, allocated=True), "MODIFIED", at(1.2))
        observe(s, pod(205, claim_status=True, node="gpu-node-a", phase="Running"), "MODIFIED", at(3.0))
        record(s, "txn-early", 2.0)   # within 2 s of the allocation and of the pod being scheduled
        record(s, "txn-steady", 95.0)
        record(s, "txn-before", -5.0)  # the pod did not exist yet

    with sessions.begin() as s:
        assert attribute(s, cluster=CLUSTER) == {"exact": 1, "ambiguous": 1, "unattributed": 1}
        early, steady, before = trace(s, ["txn-early", "txn-steady", "txn-before"])
    assert (early["status"], early["reason"], early["physical_gpu_uuid"]) == ("ambiguous", "skew-window", GPU)
    assert (before["status"], before["reason"]) == ("unattributed", "no-pod")
    assert steady["status"] == "exact"
    assert steady["pod"] == {"namespace": NS, "name": "risk-api-7d9f8c-x2x9z", "uid": POD_UID, "node": "gpu-node-a"}
    assert steady["claim"] == {"namespace": NS, "name": CLAIM, "uid": CLAIM_UID, "request": "gpu"}
    assert steady["device"] == {"driver": "gpu.nvidia.com", "pool": "gpu-node-a", "device": "gpu-0"}
    assert (steady["device_uuid"], steady["physical_gpu_uuid"], steady["product"]) == (GPU, GPU, "NVIDIA H100 80GB HBM3")
