"""Fake API server: coordination.k8s.io/v1 Leases for leader election (watch-semantics.md §13):
optimistic concurrency (409 Conflict on a stale resourceVersion, 409 AlreadyExists on a create
race), MicroTime round-trip, and Lease writes bumping the global resourceVersion."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import kubernetes
import pytest
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from collector.sim.scenario import make_pod


@pytest.fixture
def coord(srv):
    cfg = kubernetes.client.Configuration()
    cfg.host = srv.url
    return kubernetes.client.CoordinationV1Api(kubernetes.client.ApiClient(cfg))


def _lease(name: str, holder: str, renew: datetime) -> kubernetes.client.V1Lease:
    return kubernetes.client.V1Lease(
        metadata=kubernetes.client.V1ObjectMeta(name=name),
        spec=kubernetes.client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=15, acquire_time=renew, renew_time=renew),
    )


def test_create_race_gives_409_already_exists(srv, coord):
    now = datetime(2026, 11, 29, 20, 1, 2, 123456, tzinfo=timezone.utc)
    created = coord.create_namespaced_lease("draudit", _lease("collector", "pod-a", now))
    assert created.spec.holder_identity == "pod-a" and created.metadata.uid
    with pytest.raises(ApiException) as info:
        coord.create_namespaced_lease("draudit", _lease("collector", "pod-b", now))
    status = json.loads(info.value.body)
    assert info.value.status == 409 and status["reason"] == "AlreadyExists"
    assert status["message"] == 'leases.coordination.k8s.io "collector" already exists'
    assert coord.read_namespaced_lease("collector", "draudit").spec.holder_identity == "pod-a"


def test_replace_with_a_stale_resource_version_is_a_409_conflict(srv, coord):
    now = datetime(2026, 11, 29, 20, 1, 2, tzinfo=timezone.utc)
    coord.create_namespaced_lease("draudit", _lease("collector", "pod-a", now))
    seen_by_a = coord.read_namespaced_lease("collector", "draudit")
    seen_by_b = coord.read_namespaced_lease("collector", "draudit")
    seen_by_a.spec.renew_time = now + timedelta(seconds=2)
    renewed = coord.replace_namespaced_lease("collector", "draudit", seen_by_a)
    assert int(renewed.metadata.resource_version) > int(seen_by_b.metadata.resource_version)
    seen_by_b.spec.holder_identity = "pod-b"
    with pytest.raises(ApiException) as info:
        coord.replace_namespaced_lease("collector", "draudit", seen_by_b)
    status = json.loads(info.value.body)
    assert info.value.status == 409 and status["reason"] == "Conflict"
    assert "the object has been modified" in status["message"]
    assert coord.read_namespaced_lease("collector", "draudit").spec.holder_identity == "pod-a"
    with pytest.raises(ApiException) as info:
        coord.replace_namespaced_lease("missing", "draudit", _lease("missing", "x", now))
    assert info.value.status == 404


def test_microtime_round_trips_with_microseconds_in_utc(srv, coord):
    renew = datetime(2026, 11, 29, 21, 1, 2, 123456, tzinfo=timezone(timedelta(hours=1)))
    coord.create_namespaced_lease("draudit", _lease("collector", "pod-a", renew))
    raw = json.loads(coord.read_namespaced_lease("collector", "draudit", _preload_content=False).data)
    assert raw["spec"]["renewTime"] == "2026-11-29T20:01:02.123456Z"
    assert raw["kind"] == "Lease" and raw["apiVersion"] == "coordination.k8s.io/v1"
    assert coord.read_namespaced_lease("collector", "draudit").spec.renew_time == renew


def test_lease_writes_bump_the_global_resource_version(srv, coord):
    first = int(srv.apply(make_pod("a", "ml"))["metadata"]["resourceVersion"])
    lease = coord.create_namespaced_lease("draudit", _lease("collector", "pod-a", datetime.now(timezone.utc)))
    unchanged = coord.replace_namespaced_lease("collector", "draudit", lease)
    assert unchanged.metadata.resource_version == lease.metadata.resource_version  # a no-op write is not a write
    lease.spec.renew_time += timedelta(seconds=2)
    coord.replace_namespaced_lease("collector", "draudit", lease)
    second = int(srv.apply(make_pod("b", "ml"))["metadata"]["resourceVersion"])
    assert second == first + 3 == srv.current_rv
    assert srv.get("Lease", "collector", "draudit")["spec"]["holderIdentity"] == "pod-a"


def test_python_lease_lock_sees_the_conflict(srv, coord):
    def lock(identity):
        lk = LeaseLock("collector", "draudit", identity)
        lk.api_instance = coord
        return lk

    def record(identity, at):
        return LeaderElectionRecord(identity, "15", str(at), str(at))

    a, b = lock("pod-a"), lock("pod-b")
    t0 = datetime.now().replace(microsecond=250000)  # the election loop uses naive local times
    assert a.create("collector", "draudit", record("pod-a", t0)) is True
    assert b.create("collector", "draudit", record("pod-b", t0)) is False  # 409 AlreadyExists
    ok, seen = b.get("collector", "draudit")
    assert ok and seen.holder_identity == "pod-a" and seen.renew_time == str(t0)
    assert a.update("collector", "draudit", record("pod-a", t0 + timedelta(seconds=2))) is True
    # b's copy is now stale: its takeover is refused
    assert b.update("collector", "draudit", record("pod-b", t0 + timedelta(seconds=3))) is False
    assert srv.get("Lease", "collector", "draudit")["spec"]["holderIdentity"] == "pod-a"
