"""Helpers for watcher tests: a fake API server, a watcher with short time bounds, waiting, and
realistic DRA objects (resource.k8s.io/v1 shapes, dra-api.md §2.8, §4.3, §5)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable

from sqlalchemy import select

from collector.kube.client import make_api_client
from collector.kube.reflector import ReflectorSettings
from collector.settings import Settings
from collector.store.models import CoverageInterval, ObjectVersion, Quarantine, WatchState
from collector.watcher import Watcher

FAST = ReflectorSettings(list_page_size=2, watch_timeout_s=30, read_timeout_s=1.0, connect_timeout_s=2.0,
                         backoff_initial_s=0.05, backoff_max_s=0.4, backoff_reset_s=5.0)


def wait_until(predicate: Callable[[], Any], timeout_s: float = 30.0, interval_s: float = 0.02, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def start_watcher(srv, sessions, *, cluster: str = "test-cluster", settings: ReflectorSettings = FAST, **overrides) -> Watcher:
    """A started watcher on ``srv`` (no leader election unless asked)."""
    cfg = Settings(database_url="sqlite://", cluster=cluster, **overrides)
    watcher = Watcher(cfg, sessions, make_api_client(host=srv.url), reflector_settings=settings)
    watcher.start()
    return watcher


def versions(sessions, kind: str | None = None, name: str | None = None) -> list[tuple[str, str, str]]:
    """(name, resourceVersion, event_type) of stored versions in commit order."""
    with sessions() as s:
        q = select(ObjectVersion.name, ObjectVersion.resource_version, ObjectVersion.event_type).order_by(ObjectVersion.id)
        if kind:
            q = q.where(ObjectVersion.kind == kind)
        if name:
            q = q.where(ObjectVersion.name == name)
        return [tuple(r) for r in s.execute(q).all()]


def stored_raw(sessions, kind: str, name: str) -> list[dict]:
    with sessions() as s:
        return [r for (r,) in s.execute(select(ObjectVersion.raw).where(ObjectVersion.kind == kind, ObjectVersion.name == name)
                                        .order_by(ObjectVersion.id)).all()]


def resume_rv(sessions, kind: str, cluster: str = "test-cluster") -> str | None:
    with sessions() as s:
        st = s.get(WatchState, (cluster, kind))
        return st.resource_version if st else None


def gaps(sessions, kind: str | None = None) -> list[CoverageInterval]:
    with sessions() as s:
        q = select(CoverageInterval).where(CoverageInterval.state == "gap").order_by(CoverageInterval.id)
        if kind:
            q = q.where(CoverageInterval.kind == kind)
        return list(s.execute(q).scalars())


def quarantined(sessions) -> list[Quarantine]:
    with sessions() as s:
        return list(s.execute(select(Quarantine).order_by(Quarantine.id)).scalars())


def watch_requests(srv, plural: str) -> list[dict[str, str]]:
    """Queries of the requests the server saw for ``plural`` (LIST and WATCH), in order."""
    return [r.query for r in srv.requests if r.path.endswith("/" + plural)]


def device_class(name: str = "gpu.nvidia.com", kind: str = "gpu") -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression":
                     f"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{kind}'"}}]}}


def claim(name: str, namespace: str = "risk-inference", annotations: dict | None = None) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]}}}


def gpu_slice(node: str, gpus: list[tuple[str, str]], generation: int = 1) -> dict:
    """A node-local ResourceSlice with full GPUs ``[(device name, uuid)]`` (NVIDIA attributes)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpu.nvidia.com-{uuid.uuid4().hex[:5]}"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": dev, "attributes": {
                         "type": {"string": "gpu"}, "uuid": {"string": gpu_uuid},
                         "productName": {"string": "NVIDIA A10G"}, "driverVersion": {"version": "570.124.6"}},
                         "capacity": {"memory": {"value": "24Gi"}}} for dev, gpu_uuid in gpus]}}


def pod(name: str, namespace: str = "risk-inference", claim_name: str | None = "fraud-gpu") -> dict:
    spec: dict[str, Any] = {"containers": [{"name": "risk-api", "image": "bank/risk-api:3.5"},
                                           {"name": "triton-sidecar", "image": "nvcr.io/nvidia/tritonserver:25.01-py3"}]}
    if claim_name:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
        spec["containers"][1]["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec,
            "status": {"phase": "Pending"}}


def caught_up(srv, watcher, timeout_s: float = 30.0) -> None:
    """Every kind has committed everything up to now (``collector.sim.scenario.wait_caught_up``)."""
    from collector.sim.scenario import wait_caught_up

    wait_caught_up(srv, watcher, timeout_s)
