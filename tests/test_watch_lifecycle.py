"""DRA lifecycles replayed through the fake API server into the store and its projections
(dra-api.md §2.6), and the same projections from v1beta1 / v1beta2 servers."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from collector.sim import FakeApiServer
from collector.sim.dra_objects import (allocate, bind_pod, deallocate, make_claim, make_device_class, make_gpu_device,
                                       make_mig_device, make_pod, make_slice, pod_running, reserve, unreserve)
from collector.sim.scenario import claim_lifecycle_steps, play
from collector.store.models import AllocationEpisode, AllocationResult, ClaimConsumer, DeviceState, ObjectVersion
from collector.timeutil import dt_to_ns
from tests.watch_support import caught_up, start_watcher, versions

GPU_A = "GPU-3b4f6a1c-1d2e-4f50-8a9b-0c1d2e3f4a5b"
GPU_B = "GPU-9c8d7e6f-5a4b-4c3d-9e2f-1a0b9c8d7e6f"


def _inventory(srv):
    srv.apply(make_device_class("gpu.nvidia.com"))
    srv.apply(make_slice("node-a", [make_gpu_device(0, uuid=GPU_A), make_gpu_device(1, uuid=GPU_B)]))


def _observed_ns(sessions, name, rv):
    with sessions() as s:
        at = s.execute(select(ObjectVersion.observed_at).where(ObjectVersion.name == name, ObjectVersion.resource_version == rv)).scalar_one()
    return dt_to_ns(at)


def test_template_claim_lifecycle_gives_exact_rows_and_one_episode(srv, sessions):
    _inventory(srv)
    w = start_watcher(srv, sessions)
    try:
        assert w.wait_synced(10)
        steps = claim_lifecycle_steps("fraud-scoring-0", "risk-inference", "node-a", [("gpu", "gpu-0")], delete_pod=True)
        written = play(srv, steps, speed=0)
        caught_up(srv, w)
    finally:
        w.stop()
    claim_name = written[1]["metadata"]["name"]
    claim_rows = versions(sessions, "ResourceClaim")
    assert [r[2] for r in claim_rows] == ["ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]
    assert all(r[0] == claim_name for r in claim_rows)
    assert [r[2] for r in versions(sessions, "Pod")] == ["ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]
    alloc_rv = written[4]["metadata"]["resourceVersion"]   # step 5: allocation + reservedFor
    cleared_rv = written[8]["metadata"]["resourceVersion"]  # step 9: status cleared
    with sessions() as s:
        episodes = s.execute(select(AllocationEpisode)).scalars().all()
        results = s.execute(select(AllocationResult)).scalars().all()
        consumers = s.execute(select(ClaimConsumer)).scalars().all()
    assert len(episodes) == 1 and episodes[0].claim_name == claim_name and episodes[0].first_rv == alloc_rv
    assert [(r.request, r.driver, r.pool, r.device) for r in results] == [("gpu", "gpu.nvidia.com", "node-a", "gpu-0")]
    assert len(consumers) == 1 and consumers[0].consumer_name == "fraud-scoring-0"
    assert consumers[0].valid_from_ns == _observed_ns(sessions, claim_name, alloc_rv)
    assert consumers[0].valid_to_ns == _observed_ns(sessions, claim_name, cleared_rv)
    assert episodes[0].valid_to_ns == consumers[0].valid_to_ns
    # The derived tables are exactly what the ledgered versions produce; an edit there shows.
    from sqlalchemy import update

    from collector.kube.projection_audit import audit_projections

    with sessions() as s:
        assert audit_projections(s) == []
    with sessions.begin() as s:
        s.execute(update(AllocationResult).values(device="gpu-1"))
    with sessions() as s:
        diffs = audit_projections(s)
    # one row, edited: named by its key columns, with the column that differs (no Python reprs)
    [changed] = diffs
    assert (changed.table, changed.problem) == ("allocation_results", "changed")
    line = changed.describe()
    assert line.startswith("allocation_results (driver=") and line.endswith("changed: device stored gpu-1, derived gpu-0")
    assert "datetime" not in line and "(" not in line.split("):", 1)[1]


def test_shared_claim_two_consumers_and_reallocation_two_episodes(srv, sessions):
    _inventory(srv)
    w = start_watcher(srv, sessions)
    try:
        assert w.wait_synced(10)
        shared = srv.apply(make_claim("shared-gpu", "risk-inference"))
        p1 = srv.apply(make_pod("scorer-1", "risk-inference", claim_names={"gpu": "shared-gpu"}))
        p2 = srv.apply(make_pod("scorer-2", "risk-inference", claim_names={"gpu": "shared-gpu"}))
        shared = srv.apply(allocate(shared, [("gpu", "gpu-0")], p1, node="node-a"))
        shared = srv.apply(reserve(shared, p2))
        shared = srv.apply(unreserve(shared, p1))
        shared = srv.apply(deallocate(shared))  # last consumer left: allocation erased
        p3 = srv.apply(make_pod("scorer-3", "risk-inference", claim_names={"gpu": "shared-gpu"}))
        shared = srv.apply(allocate(shared, [("gpu", "gpu-1")], p3, node="node-a"))  # re-allocated elsewhere
        caught_up(srv, w)
    finally:
        w.stop()
    with sessions() as s:
        episodes = s.execute(select(AllocationEpisode).order_by(AllocationEpisode.id)).scalars().all()
        devices = [s.execute(select(AllocationResult.device).where(AllocationResult.episode_id == e.id)).scalar_one() for e in episodes]
        consumers = s.execute(select(ClaimConsumer).order_by(ClaimConsumer.id)).scalars().all()
    assert devices == ["gpu-0", "gpu-1"]
    assert episodes[0].valid_to_ns is not None and episodes[1].valid_to_ns is None
    by_episode = {}
    for c in consumers:
        by_episode.setdefault(c.episode_id, []).append(c.consumer_name)
    assert sorted(by_episode[episodes[0].id]) == ["scorer-1", "scorer-2"]
    assert by_episode[episodes[1].id] == ["scorer-3"]
    first = {c.consumer_name: c for c in consumers if c.episode_id == episodes[0].id}
    assert first["scorer-1"].valid_to_ns < first["scorer-2"].valid_to_ns  # scorer-1 left first


def _projection_signature(sessions):
    with sessions() as s:
        eps = s.execute(select(AllocationEpisode.claim_name, AllocationEpisode.node_name, AllocationResult.request,
                               AllocationResult.driver, AllocationResult.pool, AllocationResult.device,
                               AllocationResult.device_class_name)
                        .join(AllocationResult, AllocationResult.episode_id == AllocationEpisode.id)).all()
        cons = s.execute(select(ClaimConsumer.claim_uid, ClaimConsumer.consumer_name, ClaimConsumer.valid_to_ns.is_(None))).all()
        devs = s.execute(select(DeviceState.driver, DeviceState.pool, DeviceState.device, DeviceState.uuid,
                                DeviceState.physical_gpu_uuid, DeviceState.profile, DeviceState.memory_bytes)).all()
    return sorted(map(tuple, eps)), sorted((n, open_) for _u, n, open_ in cons), sorted(map(tuple, devs))


@pytest.mark.parametrize("served", [("v1beta1",), ("v1beta2",)])
def test_older_api_versions_give_the_same_projections(served, sessions, database_url, tmp_path):
    from collector.store import migrate
    from collector.store.db import make_engine, make_session_factory

    def run(versions_served, session_factory):
        server = FakeApiServer(served_resource_versions=versions_served)
        server.start()
        try:
            server.apply(make_device_class("mig.nvidia.com", device_type="mig"))
            server.apply(make_slice("node-c", [
                make_gpu_device(0, uuid=GPU_A, product_name="NVIDIA H100 NVL", memory="94Gi"),
                make_mig_device(0, profile="1g.12gb", parent_uuid=GPU_A, uuid="MIG-1f2e3d4c-5b6a-4978-8a9b-0c1d2e3f4a5b",
                                memory="11008Mi", product_name="NVIDIA H100 NVL")]))
            w = start_watcher(server, session_factory)
            try:
                assert w.wait_synced(10)
                claim = server.apply(make_claim("kyc-mig", "kyc-docs", spec={"devices": {"requests": [
                    {"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]}}))
                pod = server.apply(make_pod("classifier-0", "kyc-docs", claim_names={"mig": "kyc-mig"}))
                server.apply(allocate(claim, [("mig", "gpu.nvidia.com", "node-c", "gpu-0-mig-1g12gb-19-0")], pod, node="node-c"))
                server.apply(pod_running(bind_pod(pod, "node-c")))
                caught_up(server, w)
                assert {r.spec.version for r in w.reflectors if r.spec.group} == {versions_served[0]}
            finally:
                w.stop()
        finally:
            server.stop()
        return _projection_signature(session_factory)

    v1 = run(("v1",), sessions)
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    other_engine = make_engine(other_url)
    migrate.upgrade(other_engine)
    older = run(served, make_session_factory(other_engine))
    assert older == v1
    eps, cons, devs = v1
    assert eps == [("kyc-mig", "node-c", "mig", "gpu.nvidia.com", "node-c", "gpu-0-mig-1g12gb-19-0", "mig.nvidia.com")]
    assert devs == [("gpu.nvidia.com", "node-c", "gpu-0", GPU_A, GPU_A, None, 94 * 1024 ** 3),
                    ("gpu.nvidia.com", "node-c", "gpu-0-mig-1g12gb-19-0", "MIG-1f2e3d4c-5b6a-4978-8a9b-0c1d2e3f4a5b", GPU_A,
                     "1g.12gb", 11008 * 1024 ** 2)]
