"""Fake API server: discovery and serving resource.k8s.io in v1, v1beta2 and v1beta1
(dra-api.md §1.1–1.4); converted objects are checked against the Kubernetes 1.34 JSON schemas."""

from __future__ import annotations

import json

import kubernetes
import kubernetes_validate
import pytest
from kubernetes.client.rest import ApiException

from collector.sim import FakeApiServer
from collector.sim.scenario import (allocate, make_claim_from_template, make_claim_template, make_device_class,
                                    make_gpu_device, make_mig_device, make_pod, make_slice)


def _api(srv) -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    cfg.host = srv.url
    return kubernetes.client.ApiClient(cfg)


def _populate(srv) -> tuple[dict, dict]:
    pod = make_pod("trainer-0", "ml", claim_templates={"gpu": "single-gpu"})
    srv.apply(make_device_class())
    srv.apply(make_claim_template("single-gpu", "ml"))
    claim = srv.apply(allocate(make_claim_from_template(pod, "gpu", suffix="x8k2p"), [("gpu", "gpu-0")], pod, node="node-a"))
    sl = srv.apply(make_slice("node-a", [make_gpu_device(0, uuid="GPU-1"), make_mig_device(1, parent_uuid="GPU-2", uuid="MIG-3")],
                              name="node-a-gpu"))
    return claim, sl


@pytest.mark.parametrize(
    "served, preferred",
    [(("v1",), "v1"), (("v1beta1",), "v1beta1"), (("v1beta2", "v1beta1"), "v1beta2"), (("v1beta1", "v1", "v1beta2"), "v1")],
)
def test_discovery_lists_only_served_versions_with_the_best_preferred(served, preferred):
    with FakeApiServer(served_resource_versions=served) as srv:
        apis = kubernetes.client.ApisApi(_api(srv)).get_api_versions()
        group = next(g for g in apis.groups if g.name == "resource.k8s.io")
        order = [v for v in ("v1", "v1beta2", "v1beta1") if v in served]
        assert [v.version for v in group.versions] == order
        assert group.preferred_version.version == preferred
        assert "coordination.k8s.io" in [g.name for g in apis.groups]
        own = kubernetes.client.ResourceApi(_api(srv)).get_api_group()
        assert own.preferred_version.group_version == f"resource.k8s.io/{preferred}"
        resources = json.loads(_api(srv).call_api("GET", f"{srv.url}/apis/resource.k8s.io/{preferred}").read())
        assert {r["name"]: (r["kind"], r["namespaced"]) for r in resources["resources"] if "/" not in r["name"]} == {
            "resourceclaims": ("ResourceClaim", True), "resourceclaimtemplates": ("ResourceClaimTemplate", True),
            "resourceslices": ("ResourceSlice", False), "deviceclasses": ("DeviceClass", False)}
        for other in {"v1", "v1beta2", "v1beta1"} - set(served):
            resp = _api(srv).call_api("GET", f"{srv.url}/apis/resource.k8s.io/{other}/resourceslices")
            resp.read()
            assert resp.status == 404
        version = kubernetes.client.VersionApi(_api(srv)).get_code()
        assert (version.major, version.minor, version.git_version) == ("1", "34", "v1.34.2")


def test_v1beta1_serving_converts_shapes_on_the_way_out():
    with FakeApiServer(served_resource_versions=("v1beta1",)) as srv:
        claim, sl = _populate(srv)
        api = kubernetes.client.ResourceV1beta1Api(_api(srv))
        slices = api.list_resource_slice()
        [dev0, dev1] = slices.items[0].spec.devices
        assert dev0.name == "gpu-0" and dev0.basic.attributes["uuid"].string == "GPU-1"
        assert dev1.basic.attributes["parentUUID"].string == "GPU-2"
        assert str(dev0.basic.capacity["memory"].value) == "80Gi"
        [c] = api.list_resource_claim_for_all_namespaces().items
        [req] = c.spec.devices.requests
        assert (req.name, req.device_class_name, req.count, req.allocation_mode) == ("gpu", "gpu.nvidia.com", 1, "ExactCount")
        assert c.status.allocation.devices.results[0].device == "gpu-0"
        assert c.metadata.resource_version == claim["metadata"]["resourceVersion"]
        # raw: exactly the v1beta1 wire shape, valid against the 1.34 schema of that version
        raw = json.loads(api.list_resource_slice(_preload_content=False).data)["items"][0]
        assert set(raw["spec"]["devices"][0]) == {"name", "basic"}
        watched = json.loads(api.list_resource_slice(watch=True, timeout_seconds=1, _preload_content=False).data.splitlines()[0])
        assert watched["object"]["apiVersion"] == "resource.k8s.io/v1beta1"
        kubernetes_validate.validate(watched["object"], "1.34.0", strict=True)
        raw_claim = json.loads(api.list_resource_claim_for_all_namespaces(watch=True, timeout_seconds=1, _preload_content=False)
                               .data.splitlines()[0])["object"]
        assert "exactly" not in raw_claim["spec"]["devices"]["requests"][0]
        kubernetes_validate.validate(raw_claim, "1.34.0", strict=True)
        # the stored object stays in the v1 shape
        assert "basic" not in srv.get("ResourceSlice", "node-a-gpu")["spec"]["devices"][0]
        with pytest.raises(ApiException) as info:
            kubernetes.client.ResourceV1Api(_api(srv)).list_resource_slice()
        assert info.value.status == 404


def test_v1beta2_serves_the_v1_shape_under_its_own_api_version():
    with FakeApiServer(served_resource_versions=("v1beta2", "v1beta1")) as srv:
        _claim, sl = _populate(srv)
        api = kubernetes.client.ResourceV1beta2Api(_api(srv))
        raw = json.loads(api.list_resource_slice(watch=True, timeout_seconds=1, _preload_content=False).data.splitlines()[0])
        assert raw["object"]["apiVersion"] == "resource.k8s.io/v1beta2"
        assert raw["object"]["spec"] == sl["spec"]
        kubernetes_validate.validate(raw["object"], "1.34.0", strict=True)


def test_objects_given_in_v1beta1_shape_are_stored_as_v1():
    with FakeApiServer() as srv:
        srv.apply({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice", "metadata": {"name": "old"},
                   "spec": {"driver": "gpu.nvidia.com", "nodeName": "n", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                            "devices": [{"name": "gpu-0", "basic": {"attributes": {"uuid": {"string": "GPU-9"}}}}]}})
        srv.apply({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "ml"},
                   "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2}]}}})
        stored_slice = srv.get("ResourceSlice", "old")
        assert stored_slice["apiVersion"] == "resource.k8s.io/v1"
        assert stored_slice["spec"]["devices"] == [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-9"}}}]
        assert srv.get("ResourceClaim", "c", "ml")["spec"]["devices"]["requests"] == [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]
        kubernetes_validate.validate(stored_slice, "1.34.0", strict=True)
