"""Projections from object_versions: pods, allocation episodes, consumers, devices — on both databases.

Objects are built in the real v1 shapes of dra-api.md §2.8 (claim), §4.3 (slice) and §5 (pod),
stored as ``object_versions`` rows the way the watcher stores them, then projected with
``apply_versions`` in the same transaction.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, insert, select

from collector.kube import projections
from collector.store.canonical import content_hash
from collector.store.models import (
    AllocationEpisode,
    AllocationResult,
    ClaimConsumer,
    DeviceState,
    ObjectVersion,
    PodClaimRef,
    PodContainerClaim,
    PodState,
)
from collector.timeutil import dt_to_ns

T0 = datetime(2026, 11, 29, 10, 0, 0, 250_000, tzinfo=timezone.utc)
NS = "ml"
POD_UID = "9a1d7e44-0c1b-4f7e-9a55-5d2c3b1a0f01"
CLAIM_UID = "5f0c1d2e-7b3a-4c8e-a1f2-3d4e5f60a7b8"
GPU_UUID = "GPU-3b4f0c6e-1d2a-4b5c-8d9e-0f1a2b3c4d5e"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ns(seconds: float) -> int:
    return dt_to_ns(at(seconds))


# ---------------------------------------------------------------------------------------------
# Object builders (v1 shapes)
# ---------------------------------------------------------------------------------------------


def make_pod(rv, *, uid=POD_UID, name="trainer-0", claims=None, containers=None, init_containers=None,
             node=None, phase="Pending", claim_statuses=None):
    spec = {"containers": containers or [{"name": "trainer", "image": "registry.example/trainer:1.4",
                                           "resources": {"claims": [{"name": "gpu"}]}}],
            "restartPolicy": "Never", "schedulerName": "default-scheduler"}
    if claims is not None:
        spec["resourceClaims"] = claims
    if init_containers:
        spec["initContainers"] = init_containers
    if node:
        spec["nodeName"] = node
    status = {"phase": phase, "qosClass": "BestEffort"}
    if claim_statuses is not None:
        status["resourceClaimStatuses"] = claim_statuses
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "uid": uid, "resourceVersion": str(rv),
                         "labels": {"app": "trainer"}},
            "spec": spec, "status": status}


GPU_REQUEST = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}
FLEX_REQUEST = {"name": "flexible", "firstAvailable": [
    {"name": "big", "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1},
    {"name": "small", "deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1}]}
TS_CONFIG = [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
    "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}}}]


def make_claim(rv, *, uid=CLAIM_UID, name="trainer-0-gpu-x8k2p", owner_uid=POD_UID, owner_name="trainer-0",
               requests=(GPU_REQUEST,), finalizer=False, results=None, node="node-a", config=None, reserved=(),
               scheduler_time=None, deletion=False):
    meta = {"name": name, "namespace": NS, "uid": uid, "resourceVersion": str(rv),
            "creationTimestamp": "2026-11-29T10:00:01Z",
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "resource.k8s.io/v1",
                               "time": "2026-11-29T10:00:01Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]}
    if owner_uid:
        meta["generateName"] = f"{owner_name}-gpu-"
        meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner_name, "uid": owner_uid,
                                    "controller": True, "blockOwnerDeletion": True}]
    if finalizer:
        meta["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    if deletion:
        meta["deletionTimestamp"] = "2026-11-29T10:05:00Z"
    status = {}
    if results is not None:
        devices = {"results": [{"request": req, "driver": "gpu.nvidia.com", "pool": node, "device": dev}
                               for req, dev in results]}
        if config:
            devices["config"] = config
        status["allocation"] = {"devices": devices, "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
        if scheduler_time:
            meta["managedFields"].append({"manager": "kube-scheduler", "operation": "Update", "subresource": "status",
                                          "apiVersion": "resource.k8s.io/v1", "time": scheduler_time,
                                          "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}})
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": pod_name, "uid": pod_uid} for pod_name, pod_uid in reserved]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": [copy.deepcopy(r) for r in requests]}}, "status": status}


def gpu_device(name, uuid, product="NVIDIA H100 80GB HBM3", memory="80Gi"):
    return {"name": name,
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}, "productName": {"string": product},
                           "brand": {"string": "Nvidia"}, "architecture": {"string": "Hopper"},
                           "cudaComputeCapability": {"version": "9.0.0"}, "driverVersion": {"version": "570.124.6"},
                           "cudaDriverVersion": {"version": "12.8.0"},
                           "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"}},
            "capacity": {"memory": {"value": memory}}}


def mig_device(name, parent_uuid, profile="1g.10gb", uuid=None, memory="9856Mi"):
    attributes = {"type": {"string": "mig"}, "gpu.nvidia.com/parentUUID": {"string": parent_uuid},
                  "profile": {"string": profile}, "productName": {"string": "NVIDIA H100 80GB HBM3"},
                  "driverVersion": {"version": "570.124.6"}}
    if uuid:
        attributes["uuid"] = {"string": uuid}
    return {"name": name, "attributes": attributes,
            "capacity": {"multiprocessors": {"value": "16"}, "memory": {"value": memory}, "memorySlice0": {"value": "1"}}}


def make_slice(rv, devices, *, name="node-a-gpu.nvidia.com-r8w2k", uid="0d6c6a10-1111-4a2b-9c3d-000000000001",
               node="node-a", generation=1, count=1):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "uid": uid, "resourceVersion": str(rv),
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                              "uid": "77aa0000-0000-4000-8000-000000000001", "controller": True}]},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
                     "devices": copy.deepcopy(devices)}}


# ---------------------------------------------------------------------------------------------
# Down-conversion by hand (the wire shapes of dra-api.md §1.2/§1.3/§4.2)
# ---------------------------------------------------------------------------------------------


def claim_as(version, claim):
    out = copy.deepcopy(claim)
    out["apiVersion"] = f"resource.k8s.io/{version}"
    if version == "v1beta1":
        flat = []
        for req in out["spec"]["devices"]["requests"]:
            if "exactly" in req:
                flat.append({"name": req["name"], **req["exactly"]})
            else:  # no omitempty on deviceClassName in v1beta1
                flat.append({"name": req["name"], "deviceClassName": "", "firstAvailable": req["firstAvailable"]})
        out["spec"]["devices"]["requests"] = flat
    for result in out["status"].get("allocation", {}).get("devices", {}).get("results", []):
        result["adminAccess"] = None  # the 1.32/1.33 serialisation quirk
    return out


def slice_as(version, resource_slice):
    out = copy.deepcopy(resource_slice)
    out["apiVersion"] = f"resource.k8s.io/{version}"
    if version == "v1beta1":
        out["spec"]["devices"] = [{"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
                                  for d in out["spec"]["devices"]]
    return out


# ---------------------------------------------------------------------------------------------
# Storing versions as the watcher does
# ---------------------------------------------------------------------------------------------


def version_row(raw, event, observed_at, cluster="prod-eu-1", api_version=None):
    meta = raw["metadata"]
    group, _, version = raw["apiVersion"].rpartition("/")
    return {"cluster": cluster, "api_group": group, "api_version": api_version or version, "kind": raw["kind"],
            "namespace": meta.get("namespace"), "name": meta["name"], "uid": meta["uid"],
            "resource_version": meta["resourceVersion"], "event_type": event, "observed_at": observed_at,
            "raw": raw, "content_hash": content_hash(raw)}


def store(session, steps, cluster="prod-eu-1"):
    """Insert (raw, event, observed_at) steps as object_versions rows; return the rows with ids."""
    rows = []
    for raw, event, observed_at in steps:
        row = version_row(raw, event, observed_at, cluster)
        row["id"] = session.execute(insert(ObjectVersion).values(**row).returning(ObjectVersion.id)).scalar_one()
        rows.append(row)
    return rows


def replay(sessions, steps, cluster="prod-eu-1", batched=False):
    """Store and project ``steps``: one transaction per version (watcher default) or one batch."""
    if batched:
        with sessions.begin() as s:
            rows = store(s, steps, cluster)
            projections.apply_versions(s, rows)
        return rows
    rows = []
    for step in steps:
        with sessions.begin() as s:
            new = store(s, [step], cluster)
            projections.apply_versions(s, new)
            rows += new
    return rows


def snapshot(session, cluster="prod-eu-1"):
    """Every projection row of ``cluster`` without surrogate keys (episodes named by claim uid + first RV)."""
    episodes = {e.id: (e.claim_uid, e.first_rv) for e in
                session.execute(select(AllocationEpisode).where(AllocationEpisode.cluster == cluster)).scalars()}

    def rows(model, drop=("id", "cluster", "source_version_id")):
        stmt = select(model)
        if hasattr(model, "cluster"):
            stmt = stmt.where(model.cluster == cluster)
        else:
            stmt = stmt.where(model.episode_id.in_(list(episodes)))
        out = []
        for obj in session.execute(stmt).scalars():
            values = {c.name: getattr(obj, c.name) for c in model.__table__.columns if c.name not in drop}
            if "episode_id" in values:
                values["episode_id"] = episodes[values["episode_id"]]
            out.append(values)
        return sorted(out, key=repr)

    return {model.__tablename__: rows(model) for model in (
        PodState, PodClaimRef, PodContainerClaim, AllocationEpisode, AllocationResult, ClaimConsumer, DeviceState)}


def count(session, model):
    return session.execute(select(func.count()).select_from(model)).scalar_one()


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------

TEMPLATE_CLAIMS = [{"name": "gpu", "resourceClaimTemplateName": "gpu-template"}]
CLAIM_NAME = "trainer-0-gpu-x8k2p"


def lifecycle_steps(claim_version=lambda c: c):
    """dra-api.md §2.6: template-generated claim, 1.34 defaults; step numbers as in the table."""
    resolved = [{"name": "gpu", "resourceClaimName": CLAIM_NAME}]
    allocated = dict(results=[("gpu", "gpu-3")], config=TS_CONFIG, reserved=[("trainer-0", POD_UID)],
                     scheduler_time="2026-11-29T10:00:05Z")
    return [
        (make_pod(100, claims=TEMPLATE_CLAIMS), "ADDED", at(1)),                                            # 1
        (claim_version(make_claim(101)), "ADDED", at(2)),                                                   # 2
        (make_pod(102, claims=TEMPLATE_CLAIMS, claim_statuses=resolved), "MODIFIED", at(3)),                # 3
        (claim_version(make_claim(103, finalizer=True)), "MODIFIED", at(4)),                                # 4
        (claim_version(make_claim(104, finalizer=True, **allocated)), "MODIFIED", at(5)),                   # 5
        (make_pod(105, claims=TEMPLATE_CLAIMS, claim_statuses=resolved, node="node-a"), "MODIFIED", at(6)),  # 6
        (make_pod(106, claims=TEMPLATE_CLAIMS, claim_statuses=resolved, node="node-a", phase="Running"), "MODIFIED", at(7)),
        (make_pod(107, claims=TEMPLATE_CLAIMS, claim_statuses=resolved, node="node-a", phase="Succeeded"), "MODIFIED", at(8)),
        (claim_version(make_claim(108, finalizer=True)), "MODIFIED", at(9)),                                # 9
        (claim_version(make_claim(109)), "MODIFIED", at(10)),                                               # 10
        (claim_version(make_claim(109)), "DELETED", at(11)),                                                # 11
        (make_pod(110, claims=TEMPLATE_CLAIMS, claim_statuses=resolved, node="node-a", phase="Succeeded"), "DELETED", at(12)),
    ]


@pytest.mark.parametrize("batched", [False, True], ids=["per-event", "one-batch"])
def test_lifecycle_yields_one_episode_one_result_one_consumer(sessions, batched):
    replay(sessions, lifecycle_steps(), batched=batched)
    with sessions() as s:
        (episode,) = s.execute(select(AllocationEpisode)).scalars().all()
        assert (episode.claim_uid, episode.claim_namespace, episode.claim_name) == (CLAIM_UID, NS, CLAIM_NAME)
        assert episode.first_rv == "104"
        assert (episode.valid_from_ns, episode.valid_to_ns) == (ns(5), ns(9))
        assert episode.node_name == "node-a"
        assert episode.owner_pod_uid == POD_UID
        assert episode.config == TS_CONFIG
        assert episode.allocation_timestamp is None  # 1.34 defaults: no such field (rule 5)
        assert episode.scheduler_write_time == datetime(2026, 11, 29, 10, 0, 5, tzinfo=timezone.utc)
        (result,) = s.execute(select(AllocationResult)).scalars().all()
        assert (result.episode_id, result.request, result.driver, result.pool, result.device) == (
            episode.id, "gpu", "gpu.nvidia.com", "node-a", "gpu-3")
        assert result.device_class_name == "gpu.nvidia.com"
        assert (result.admin_access, result.share_id, result.consumed_capacity) == (False, None, None)
        # absent JSON is SQL NULL (not the JSON text 'null'), so "IS NULL" queries downstream work
        assert s.execute(select(func.count()).select_from(AllocationResult)
                         .where(AllocationResult.consumed_capacity.is_(None))).scalar_one() == 1
        (consumer,) = s.execute(select(ClaimConsumer)).scalars().all()
        assert (consumer.episode_id, consumer.claim_uid, consumer.consumer_uid, consumer.consumer_name,
                consumer.consumer_resource, consumer.consumer_api_group) == (episode.id, CLAIM_UID, POD_UID, "trainer-0", "pods", "")
        assert (consumer.valid_from_ns, consumer.valid_to_ns) == (ns(5), ns(9))

        states = s.execute(select(PodState).order_by(PodState.valid_from_ns)).scalars().all()
        assert [(p.node_name, p.phase, p.valid_from_ns, p.valid_to_ns) for p in states] == [
            (None, "Pending", ns(1), ns(6)),
            ("node-a", "Pending", ns(6), ns(7)),
            ("node-a", "Running", ns(7), ns(8)),
            ("node-a", "Succeeded", ns(8), ns(12)),  # terminal phase stays open until DELETED
        ]
        assert {(p.pod_uid, p.namespace, p.name) for p in states} == {(POD_UID, NS, "trainer-0")}
        refs = s.execute(select(PodClaimRef).order_by(PodClaimRef.valid_from_ns)).scalars().all()
        assert [(r.pod_claim_name, r.claim_name, r.template_name, r.valid_from_ns, r.valid_to_ns) for r in refs] == [
            ("gpu", None, "gpu-template", ns(1), ns(3)),         # unresolved until resourceClaimStatuses
            ("gpu", CLAIM_NAME, "gpu-template", ns(3), ns(12)),
        ]
        (cc,) = s.execute(select(PodContainerClaim)).scalars().all()
        assert (cc.pod_uid, cc.container_name, cc.init_container, cc.pod_claim_name, cc.request) == (
            POD_UID, "trainer", False, "gpu", "")


def test_terminal_pod_interval_stays_open_until_deleted(sessions):
    steps = lifecycle_steps()[:8]  # up to phase Succeeded, no DELETED yet
    replay(sessions, steps)
    with sessions() as s:
        last = s.execute(select(PodState).order_by(PodState.valid_from_ns.desc()).limit(1)).scalar_one()
        assert (last.phase, last.valid_from_ns, last.valid_to_ns) == ("Succeeded", ns(8), None)
        (episode,) = s.execute(select(AllocationEpisode)).scalars().all()
        assert episode.valid_to_ns is None  # step 9 not seen yet: still allocated


SHARED_UID = "c4a1e2f3-0000-4000-8000-00000000aaaa"
POD_A, POD_B, POD_C = ("aaaa0000-0000-4000-8000-000000000001", "bbbb0000-0000-4000-8000-000000000002",
                       "cccc0000-0000-4000-8000-000000000003")


def shared(rv, **kw):
    return make_claim(rv, uid=SHARED_UID, name="shared-gpu", owner_uid=None, **kw)


def by_name_pod(rv, uid, name, **kw):
    return make_pod(rv, uid=uid, name=name, claims=[{"name": "gpu", "resourceClaimName": "shared-gpu"}], **kw)


def test_shared_claim_yields_two_consumer_intervals_on_one_episode(sessions):
    alloc = dict(results=[("gpu", "gpu-0")])
    replay(sessions, [
        (shared(200), "ADDED", at(0)),
        (by_name_pod(201, POD_A, "infer-a"), "ADDED", at(1)),
        (by_name_pod(202, POD_B, "infer-b"), "ADDED", at(1.5)),
        (shared(203, finalizer=True), "MODIFIED", at(2)),
        (shared(204, finalizer=True, reserved=[("infer-a", POD_A)], **alloc), "MODIFIED", at(3)),
        (shared(205, finalizer=True, reserved=[("infer-a", POD_A), ("infer-b", POD_B)], **alloc), "MODIFIED", at(4)),
        (shared(206, finalizer=True, reserved=[("infer-b", POD_B)], **alloc), "MODIFIED", at(5)),
        (shared(207, finalizer=True), "MODIFIED", at(6)),
    ])
    with sessions() as s:
        (episode,) = s.execute(select(AllocationEpisode)).scalars().all()
        assert (episode.first_rv, episode.owner_pod_uid, episode.valid_from_ns, episode.valid_to_ns) == ("204", None, ns(3), ns(6))
        consumers = s.execute(select(ClaimConsumer).order_by(ClaimConsumer.valid_from_ns)).scalars().all()
        assert [(c.episode_id, c.consumer_uid, c.consumer_name, c.valid_from_ns, c.valid_to_ns) for c in consumers] == [
            (episode.id, POD_A, "infer-a", ns(3), ns(5)),
            (episode.id, POD_B, "infer-b", ns(4), ns(6)),
        ]
        refs = s.execute(select(PodClaimRef.pod_uid, PodClaimRef.claim_name, PodClaimRef.template_name,
                                PodClaimRef.valid_from_ns)).all()
        assert sorted(refs) == [(POD_A, "shared-gpu", None, ns(1)), (POD_B, "shared-gpu", None, ns(1.5))]


def test_deallocated_then_reallocated_claim_yields_two_episodes(sessions):
    replay(sessions, [
        (shared(300), "ADDED", at(0)),
        (shared(301, finalizer=True, results=[("gpu", "gpu-0")], reserved=[("infer-a", POD_A)]), "MODIFIED", at(1)),
        (shared(302, finalizer=True), "MODIFIED", at(2)),
        (shared(303), "MODIFIED", at(3)),
        (shared(304, finalizer=True, results=[("gpu", "gpu-1")], node="node-b", reserved=[("infer-c", POD_C)]), "MODIFIED", at(4)),
    ])
    with sessions() as s:
        rows = s.execute(select(AllocationEpisode.id, AllocationEpisode.first_rv, AllocationEpisode.node_name,
                                AllocationEpisode.valid_from_ns, AllocationEpisode.valid_to_ns)
                         .order_by(AllocationEpisode.valid_from_ns)).all()
        assert [tuple(r)[1:] for r in rows] == [("301", "node-a", ns(1), ns(2)), ("304", "node-b", ns(4), None)]
        results = s.execute(select(AllocationResult.episode_id, AllocationResult.pool, AllocationResult.device)).all()
        assert sorted(results) == sorted([(rows[0].id, "node-a", "gpu-0"), (rows[1].id, "node-b", "gpu-1")])
        consumers = s.execute(select(ClaimConsumer.episode_id, ClaimConsumer.consumer_uid, ClaimConsumer.valid_to_ns)).all()
        assert sorted(consumers) == sorted([(rows[0].id, POD_A, ns(2)), (rows[1].id, POD_C, None)])


def test_changed_allocation_without_deallocation_in_between_opens_a_new_episode(sessions):
    # Missed events after a gap: the watcher never saw the allocation cleared (allocation is immutable
    # while set, §2.4, so a different one means a new allocation).
    replay(sessions, [
        (shared(400, finalizer=True, results=[("gpu", "gpu-0")], reserved=[("infer-a", POD_A)]), "ADDED", at(1)),
        (shared(450, finalizer=True, results=[("gpu", "gpu-2")], reserved=[("infer-a", POD_A)]), "RELIST_MODIFIED", at(9)),
        (shared(450, finalizer=True, results=[("gpu", "gpu-2")], reserved=[("infer-a", POD_A)]), "RELIST_DELETED", at(20)),
    ])
    with sessions() as s:
        episodes = s.execute(select(AllocationEpisode.first_rv, AllocationEpisode.valid_from_ns, AllocationEpisode.valid_to_ns)
                             .order_by(AllocationEpisode.valid_from_ns)).all()
        assert [tuple(e) for e in episodes] == [("400", ns(1), ns(9)), ("450", ns(9), ns(20))]
        consumers = s.execute(select(ClaimConsumer.valid_from_ns, ClaimConsumer.valid_to_ns)
                              .order_by(ClaimConsumer.valid_from_ns)).all()
        assert [tuple(c) for c in consumers] == [(ns(1), ns(9)), (ns(9), ns(20))]


def test_first_available_result_resolves_the_chosen_subrequest_class(sessions):
    claim = make_claim(500, requests=(GPU_REQUEST, FLEX_REQUEST), results=[("gpu", "gpu-3"), ("flexible/small", "gpu-1-mig-19-4-1")])
    replay(sessions, [(claim, "ADDED", at(1))])
    with sessions() as s:
        got = s.execute(select(AllocationResult.request, AllocationResult.device_class_name)).all()
        assert sorted(got) == [("flexible/small", "mig.nvidia.com"), ("gpu", "gpu.nvidia.com")]


def test_mig_device_resolves_physical_gpu_to_its_parent(sessions):
    parent = GPU_UUID
    devices = [gpu_device("gpu-0", parent),
               mig_device("gpu-1-mig-19-4-1", parent, uuid="MIG-8f2e6a1c-5b3d-5e7f-9a0b-1c2d3e4f5a6b"),
               mig_device("gpu-2-mig-1g24gb-19-0", "GPU-aa11bb22-0000-4000-8000-000000000002", profile="1g.24gb",
                          memory="23552Mi")]  # dynamic MIG: no uuid at all (§6.3)
    replay(sessions, [(make_slice(600, devices), "ADDED", at(1))])
    with sessions() as s:
        got = {d.device: d for d in s.execute(select(DeviceState)).scalars()}
    full, mig, dyn = got["gpu-0"], got["gpu-1-mig-19-4-1"], got["gpu-2-mig-1g24gb-19-0"]
    assert (full.device_type, full.uuid, full.physical_gpu_uuid, full.memory_bytes) == ("gpu", parent, parent, 80 * 2**30)
    assert (full.product_name, full.driver_version, full.node_name, full.pool_generation) == (
        "NVIDIA H100 80GB HBM3", "570.124.6", "node-a", 1)
    assert full.attributes == devices[0]["attributes"] and full.capacity == devices[0]["capacity"]
    assert (mig.device_type, mig.uuid, mig.parent_uuid, mig.physical_gpu_uuid, mig.profile) == (
        "mig", "MIG-8f2e6a1c-5b3d-5e7f-9a0b-1c2d3e4f5a6b", parent, parent, "1g.10gb")
    assert mig.memory_bytes == 9856 * 2**20
    assert (dyn.uuid, dyn.physical_gpu_uuid, dyn.profile, dyn.memory_bytes) == (
        None, "GPU-aa11bb22-0000-4000-8000-000000000002", "1g.24gb", 23552 * 2**20)
    assert {d.valid_to_ns for d in got.values()} == {None}
    assert {(d.driver, d.pool, d.slice_name) for d in got.values()} == {("gpu.nvidia.com", "node-a", "node-a-gpu.nvidia.com-r8w2k")}


def test_slice_generation_bump_closes_the_old_devices(sessions):
    old = make_slice(700, [gpu_device("gpu-0", GPU_UUID), gpu_device("gpu-1", "GPU-1111")], name="node-a-gpu.nvidia.com-aaaaa",
                     uid="51100000-0000-4000-8000-000000000001", generation=1)
    new = make_slice(710, [gpu_device("gpu-0", GPU_UUID), mig_device("gpu-1-mig-19-4-1", "GPU-1111", uuid="MIG-1")],
                     name="node-a-gpu.nvidia.com-bbbbb", uid="51100000-0000-4000-8000-000000000002", generation=2)
    old_again = copy.deepcopy(old)
    old_again["metadata"]["resourceVersion"] = "720"
    old_again["metadata"]["labels"] = {"touched": "yes"}
    replay(sessions, [
        (old, "ADDED", at(1)),
        (new, "ADDED", at(5)),
        (old_again, "MODIFIED", at(6)),  # an old-generation slice still listed: ignored (§4.3)
        (old_again, "DELETED", at(7)),
    ])
    with sessions() as s:
        rows = s.execute(select(DeviceState.device, DeviceState.pool_generation, DeviceState.slice_name,
                                DeviceState.valid_from_ns, DeviceState.valid_to_ns)
                         .order_by(DeviceState.valid_from_ns, DeviceState.device)).all()
    assert [tuple(r) for r in rows] == [
        ("gpu-0", 1, "node-a-gpu.nvidia.com-aaaaa", ns(1), ns(5)),
        ("gpu-1", 1, "node-a-gpu.nvidia.com-aaaaa", ns(1), ns(5)),
        ("gpu-0", 2, "node-a-gpu.nvidia.com-bbbbb", ns(5), None),
        ("gpu-1-mig-19-4-1", 2, "node-a-gpu.nvidia.com-bbbbb", ns(5), None),
    ]


def test_device_moving_between_slices_of_a_pool_keeps_one_identity(sessions):
    a = make_slice(800, [gpu_device("gpu-0", GPU_UUID), gpu_device("gpu-1", "GPU-1111")], name="s-a",
                   uid="5a000000-0000-4000-8000-000000000001", generation=3, count=2)
    b = make_slice(801, [gpu_device("gpu-2", "GPU-2222")], name="s-b", uid="5b000000-0000-4000-8000-000000000002",
                   generation=3, count=2)
    b_with_gpu1 = make_slice(810, [gpu_device("gpu-1", "GPU-1111"), gpu_device("gpu-2", "GPU-2222")], name="s-b",
                             uid="5b000000-0000-4000-8000-000000000002", generation=3, count=2)
    a_without_gpu1 = make_slice(811, [gpu_device("gpu-0", GPU_UUID)], name="s-a", uid="5a000000-0000-4000-8000-000000000001",
                                generation=3, count=2)
    replay(sessions, [(a, "ADDED", at(1)), (b, "ADDED", at(1.5)), (b_with_gpu1, "MODIFIED", at(4)),
                      (a_without_gpu1, "MODIFIED", at(4.5))])
    with sessions() as s:
        rows = s.execute(select(DeviceState.slice_name, DeviceState.valid_from_ns, DeviceState.valid_to_ns)
                         .where(DeviceState.device == "gpu-1").order_by(DeviceState.valid_from_ns)).all()
        assert [tuple(r) for r in rows] == [("s-a", ns(1), ns(4)), ("s-b", ns(4), None)]  # continuous, one key
        others = s.execute(select(DeviceState.device, DeviceState.valid_to_ns).where(DeviceState.device != "gpu-1")).all()
        assert sorted(others) == [("gpu-0", None), ("gpu-2", None)]


def test_device_attribute_change_opens_a_new_interval(sessions):
    v1 = make_slice(900, [gpu_device("gpu-0", GPU_UUID)])
    v2 = make_slice(901, [gpu_device("gpu-0", GPU_UUID)])
    v2["spec"]["devices"][0]["attributes"]["driverVersion"] = {"version": "575.51.3"}
    v3 = make_slice(902, [gpu_device("gpu-0", GPU_UUID)])
    v3["spec"]["devices"][0]["attributes"]["driverVersion"] = {"version": "575.51.3"}
    replay(sessions, [(v1, "ADDED", at(1)), (v2, "MODIFIED", at(2)), (v3, "MODIFIED", at(3)), (v3, "DELETED", at(4))])
    with sessions() as s:
        rows = s.execute(select(DeviceState.driver_version, DeviceState.valid_from_ns, DeviceState.valid_to_ns)
                         .order_by(DeviceState.valid_from_ns)).all()
    assert [tuple(r) for r in rows] == [("570.124.6", ns(1), ns(2)), ("575.51.3", ns(2), ns(4))]


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_older_wire_versions_project_exactly_like_v1(sessions, version):
    claim_steps = lifecycle_steps()
    flex = make_claim(950, uid="f1e00000-0000-4000-8000-000000000001", name="flex", owner_uid=None,
                      requests=(GPU_REQUEST, FLEX_REQUEST), results=[("gpu", "gpu-3"), ("flexible/small", "gpu-1-mig-19-4-1")],
                      reserved=[("trainer-0", POD_UID)])
    slice_steps = [(make_slice(960, [gpu_device("gpu-0", GPU_UUID), mig_device("gpu-1-mig-19-4-1", GPU_UUID, uuid="MIG-1")]),
                    "ADDED", at(1))]
    v1_steps = claim_steps + [(flex, "ADDED", at(2))] + slice_steps

    def down(raw):
        if raw["kind"] == "ResourceClaim":
            return claim_as(version, raw)
        if raw["kind"] == "ResourceSlice":
            return slice_as(version, raw)
        return raw

    old_steps = [(down(raw), event, when) for raw, event, when in v1_steps]
    assert any(r["kind"] == "ResourceClaim" and r["apiVersion"].endswith(version) for r, _, _ in old_steps)
    replay(sessions, v1_steps, cluster="cluster-v1", batched=True)
    replay(sessions, old_steps, cluster=f"cluster-{version}", batched=True)
    with sessions() as s:
        expected, got = snapshot(s, "cluster-v1"), snapshot(s, f"cluster-{version}")
    assert expected["allocation_results"] and expected["device_states"]
    assert got == expected


def test_rebuild_reproduces_the_same_projections(sessions):
    replay(sessions, lifecycle_steps())
    replay(sessions, [(shared(204, finalizer=True, results=[("gpu", "gpu-0")], reserved=[("infer-a", POD_A)]), "ADDED", at(3)),
                      (make_slice(600, [gpu_device("gpu-0", GPU_UUID)]), "ADDED", at(4)),
                      (make_slice(601, [gpu_device("gpu-0", GPU_UUID), gpu_device("gpu-1", "GPU-1111")]), "MODIFIED", at(8))])
    replay(sessions, [(shared(204, results=[("gpu", "gpu-0")]), "ADDED", at(3))], cluster="other")
    with sessions() as s:
        before, other_before = snapshot(s), snapshot(s, "other")
        rows_before = {m: count(s, m) for m in projections.PROJECTION_MODELS}
    with sessions.begin() as s:
        replayed = projections.rebuild(s, "prod-eu-1", chunk_size=5)  # several chunks
    assert replayed == len(lifecycle_steps()) + 3
    with sessions() as s:
        assert snapshot(s) == before
        assert snapshot(s, "other") == other_before  # another cluster is left alone
        assert {m: count(s, m) for m in projections.PROJECTION_MODELS} == rows_before
    with sessions.begin() as s:
        projections.rebuild(s)
    with sessions() as s:
        assert snapshot(s) == before and snapshot(s, "other") == other_before


def test_applying_versions_again_is_a_no_op(sessions):
    rows = replay(sessions, lifecycle_steps())
    slice_rows = replay(sessions, [(make_slice(600, [gpu_device("gpu-0", GPU_UUID)]), "ADDED", at(4)),
                                   (make_slice(601, [gpu_device("gpu-1", "GPU-1111")]), "MODIFIED", at(8))])
    with sessions() as s:
        before = snapshot(s)
        ids_before = {m: sorted(s.execute(select(m.id)).scalars()) for m in projections.PROJECTION_MODELS}
    with sessions.begin() as s:
        projections.apply_versions(s, rows + slice_rows)  # the whole history again, one batch
    with sessions.begin() as s:
        for row in rows[4:6] + rows[:1] + slice_rows[:1]:  # single older versions, one by one
            projections.apply_versions(s, [row])
    with sessions.begin() as s:
        projections.apply_versions(s, [rows[4], rows[4]])  # a duplicate inside one batch
    with sessions.begin() as s:  # the same history as ORM objects and as SQLAlchemy rows
        projections.apply_versions(s, s.execute(select(ObjectVersion)).scalars().all())
        projections.apply_versions(s, s.execute(select(ObjectVersion.__table__)).all())
    with sessions() as s:
        assert snapshot(s) == before
        assert {m: sorted(s.execute(select(m.id)).scalars()) for m in projections.PROJECTION_MODELS} == ids_before


def test_pods_without_claims_are_projected_without_claims_and_device_classes_are_ignored(sessions):
    """A pod that references no claim has a ``pod_states`` row (placement, phase) and no claim
    reference: a transaction it logged is ``no-claim`` (it is known to have held no GPU)."""
    plain = make_pod(1000, uid="dddd0000-0000-4000-8000-000000000004", name="web-0",
                     containers=[{"name": "web", "image": "nginx:1.27"}])
    plain_running = make_pod(1001, uid="dddd0000-0000-4000-8000-000000000004", name="web-0", node="node-a",
                             phase="Running", containers=[{"name": "web", "image": "nginx:1.27"}])
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": "gpu.nvidia.com", "uid": "dc000000-0000-4000-8000-000000000001", "resourceVersion": "1002"},
                    "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}
    with_claim = make_pod(1003, claims=TEMPLATE_CLAIMS)
    replay(sessions, [(plain, "ADDED", at(1)), (plain_running, "MODIFIED", at(2)), (device_class, "ADDED", at(3)),
                      (with_claim, "ADDED", at(4)), (plain_running, "DELETED", at(5))])
    web = "dddd0000-0000-4000-8000-000000000004"
    with sessions() as s:
        states = s.execute(select(PodState.pod_uid, PodState.name, PodState.node_name, PodState.phase,
                                  PodState.valid_from_ns, PodState.valid_to_ns).order_by(PodState.id)).all()
        assert [tuple(r) for r in states] == [
            (web, "web-0", None, "Pending", ns(1), ns(2)), (web, "web-0", "node-a", "Running", ns(2), ns(5)),
            (POD_UID, "trainer-0", None, "Pending", ns(4), None)]
        assert s.execute(select(PodClaimRef.pod_uid).distinct()).scalars().all() == [POD_UID]
        assert s.execute(select(PodContainerClaim.pod_uid)).scalars().all() == [POD_UID]
        assert count(s, AllocationEpisode) == 0 and count(s, DeviceState) == 0


def test_init_containers_requests_and_extended_resource_claims(sessions):
    claims = [{"name": "gpu", "resourceClaimName": "shared-gpu"}, {"name": "scratch", "resourceClaimTemplateName": "mig-template"}]
    containers = [{"name": "server", "resources": {"claims": [{"name": "gpu", "request": "gpu"}, {"name": "scratch"}]}},
                  {"name": "sidecar", "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}]
    init = [{"name": "warmup", "resources": {"claims": [{"name": "gpu"}]}}]
    pod = make_pod(1100, claims=claims, containers=containers, init_containers=init)
    extended = make_pod(1101, claims=claims, containers=containers, init_containers=init,
                        claim_statuses=[{"name": "gpu"}, {"name": "scratch", "resourceClaimName": "trainer-0-scratch-q9z7t"}])
    extended["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "trainer-0-extended-resources-k2x9p",
        "requestMappings": [{"containerName": "server", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]}
    replay(sessions, [(pod, "ADDED", at(1)), (extended, "MODIFIED", at(2))])
    with sessions() as s:
        cc = s.execute(select(PodContainerClaim.container_name, PodContainerClaim.init_container,
                              PodContainerClaim.pod_claim_name, PodContainerClaim.request)).all()
        assert sorted(cc) == sorted([
            ("server", False, "gpu", "gpu"), ("server", False, "scratch", ""), ("sidecar", False, "gpu", "gpu"),
            ("warmup", True, "gpu", ""), ("server", False, projections.EXTENDED_POD_CLAIM, "container-0-request-0")])
        refs = s.execute(select(PodClaimRef.pod_claim_name, PodClaimRef.claim_name, PodClaimRef.valid_from_ns,
                                PodClaimRef.valid_to_ns)).all()
        assert sorted(refs, key=repr) == sorted([
            ("gpu", "shared-gpu", ns(1), None),
            ("scratch", None, ns(1), ns(2)), ("scratch", "trainer-0-scratch-q9z7t", ns(2), None),
            (projections.EXTENDED_POD_CLAIM, "trainer-0-extended-resources-k2x9p", ns(2), None)], key=repr)


def test_newest_version_applies_even_if_the_clock_stepped_back(sessions):
    # A leader with a lagging clock (or an NTP step) observes the deallocation "before" the
    # allocation: the newest version of the claim must still be applied, and no interval may end
    # before it began.
    replay(sessions, [
        (shared(1200, finalizer=True, results=[("gpu", "gpu-0")], reserved=[("infer-a", POD_A)]), "MODIFIED", at(5)),
        (shared(1201, finalizer=True), "MODIFIED", at(4)),
    ])
    with sessions() as s:
        (episode,) = s.execute(select(AllocationEpisode)).scalars().all()
        assert (episode.valid_from_ns, episode.valid_to_ns) == (ns(5), ns(5))
        (consumer,) = s.execute(select(ClaimConsumer)).scalars().all()
        assert (consumer.valid_from_ns, consumer.valid_to_ns) == (ns(5), ns(5))
