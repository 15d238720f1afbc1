"""Normalisation of resource.k8s.io v1beta1/v1beta2 objects to v1, attribute and quantity helpers.

Shapes follow dra-api.md §1.2–1.4, §2.8, §4.1–4.3 (the Go types of kubernetes/api).
"""

from __future__ import annotations

import copy

import pytest

from collector.kube.normalize import (
    attribute_value,
    device_attribute,
    device_capacity_bytes,
    lookup_qualified,
    normalize,
    qualified_name,
    quantity_to_int,
)

CLAIM_V1BETA1 = {
    "apiVersion": "resource.k8s.io/v1beta1",
    "kind": "ResourceClaim",
    "metadata": {"name": "trainer-0-gpu-x8k2p", "namespace": "ml", "uid": "5f0c1d2e-0000-4000-8000-000000000001",
                 "resourceVersion": "48211", "labels": {"team": "risk"}},
    "spec": {"devices": {
        "requests": [
            {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
             "selectors": [{"cel": {"expression": "device.attributes[\"gpu.nvidia.com\"].type == \"gpu\""}}],
             "adminAccess": None},
            # v1beta1 serialises deviceClassName without omitempty: "" next to firstAvailable (§1.2)
            {"name": "flexible", "deviceClassName": "",
             "firstAvailable": [{"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 1},
                                {"name": "small", "deviceClassName": "mig.nvidia.com", "count": 2}]},
        ],
        "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}}}],
    }},
    "status": {"allocation": {
        "devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-3", "adminAccess": None},
            {"request": "flexible/small", "driver": "gpu.nvidia.com", "pool": "node-a",
             "device": "gpu-1-mig-19-4-1", "adminAccess": None},
            {"request": "flexible/small", "driver": "gpu.nvidia.com", "pool": "node-a",
             "device": "gpu-1-mig-19-5-1", "adminAccess": None}]},
        "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}},
        "reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "9a1d0000-0000-4000-8000-00000000000a"}]},
}


def test_v1beta1_claim_request_moves_under_exactly_and_first_available_drops_empty_class():
    before = copy.deepcopy(CLAIM_V1BETA1)
    out = normalize("ResourceClaim", "v1beta1", CLAIM_V1BETA1)
    assert CLAIM_V1BETA1 == before  # input untouched
    assert out["apiVersion"] == "resource.k8s.io/v1"
    gpu, flexible = out["spec"]["devices"]["requests"]
    assert gpu == {"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
        "selectors": CLAIM_V1BETA1["spec"]["devices"]["requests"][0]["selectors"]}}
    assert flexible == {"name": "flexible", "firstAvailable": CLAIM_V1BETA1["spec"]["devices"]["requests"][1]["firstAvailable"]}
    assert "deviceClassName" not in flexible and "exactly" not in flexible
    results = out["status"]["allocation"]["devices"]["results"]
    assert [sorted(r) for r in results] == [["device", "driver", "pool", "request"]] * 3  # adminAccess: null dropped
    # everything else is carried unchanged (unknown fields kept)
    assert out["metadata"] == CLAIM_V1BETA1["metadata"]
    assert out["spec"]["devices"]["config"] == CLAIM_V1BETA1["spec"]["devices"]["config"]
    assert out["status"]["reservedFor"] == CLAIM_V1BETA1["status"]["reservedFor"]


def test_v1beta1_request_keeps_unknown_fields_and_set_admin_access():
    claim = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim", "metadata": {"name": "x"},
             "spec": {"devices": {"requests": [{"name": "probe", "deviceClassName": "gpu.nvidia.com",
                                                "adminAccess": True, "futureField": {"a": 1}}]}}}
    (req,) = normalize("ResourceClaim", "resource.k8s.io/v1beta1", claim)["spec"]["devices"]["requests"]
    assert req == {"name": "probe", "futureField": {"a": 1},
                   "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": True}}


def test_v1beta2_and_v1_claims_are_already_v1_shaped_except_null_admin_access():
    v1 = normalize("ResourceClaim", "v1beta1", CLAIM_V1BETA1)
    v1beta2 = copy.deepcopy(v1)
    v1beta2["apiVersion"] = "resource.k8s.io/v1beta2"
    for r in v1beta2["status"]["allocation"]["devices"]["results"]:
        r["adminAccess"] = None  # the 1.33 quirk (§1.3)
    assert normalize("ResourceClaim", "v1beta2", v1beta2) == v1
    assert normalize("ResourceClaim", "v1", v1) == v1


def test_template_spec_is_normalised_like_a_claim_spec():
    template = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "inference-gpu-template", "namespace": "ml"},
                "spec": {"metadata": {"labels": {"a": "b"}},
                         "spec": {"devices": {"requests": [{"name": "inference-slice", "deviceClassName": "gpu.nvidia.com",
                                                            "count": 1, "allocationMode": "ExactCount"}]}}}}
    out = normalize("ResourceClaimTemplate", "v1beta1", template)
    assert out["spec"]["spec"]["devices"]["requests"] == [
        {"name": "inference-slice", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1, "allocationMode": "ExactCount"}}]
    assert out["spec"]["metadata"] == {"labels": {"a": "b"}}


def test_v1beta1_slice_devices_are_hoisted_out_of_basic():
    slice_v1beta1 = {
        "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.nvidia.com-r8w2k"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-a", "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "basic": {
                     "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-3b4f0c6e-1d2a-4b5c-8d9e-0f1a2b3c4d5e"}},
                     "capacity": {"memory": {"value": "80Gi"}}, "allowMultipleAllocations": True}}]},
    }
    out = normalize("ResourceSlice", "v1beta1", slice_v1beta1)
    assert out["spec"]["devices"] == [{"name": "gpu-0", **slice_v1beta1["spec"]["devices"][0]["basic"]}]
    assert out["spec"]["pool"] == slice_v1beta1["spec"]["pool"]
    assert "basic" in slice_v1beta1["spec"]["devices"][0]  # input untouched
    # a v1 slice passes unchanged
    assert normalize("ResourceSlice", "v1", out) == out


def test_device_class_and_pod_are_unchanged_copies():
    device_class = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
                    "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}
    out = normalize("DeviceClass", "v1beta1", device_class)
    assert out == device_class and out is not device_class
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"resourceClaims": [{"name": "gpu"}]}}
    assert normalize("Pod", "v1", pod) == pod


def test_normalize_rejects_non_objects():
    with pytest.raises(TypeError, match="ResourceClaim object must be a JSON object"):
        normalize("ResourceClaim", "v1", ["not", "an", "object"])


def test_attribute_value_reads_every_typed_member():
    assert attribute_value({"string": "gpu"}) == "gpu"
    assert attribute_value({"int": 7}) == 7
    assert attribute_value({"bool": False}) is False
    assert attribute_value({"version": "570.124.6"}) == "570.124.6"
    assert attribute_value({"strings": ["a", "b"]}) == ["a", "b"]
    assert attribute_value({}) is None
    assert attribute_value(None) is None


def test_short_attribute_keys_belong_to_the_driver_domain():
    device = {"name": "gpu-0", "attributes": {
        "uuid": {"string": "GPU-1"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"},
        "gpu.nvidia.com/productName": {"string": "NVIDIA H100 80GB HBM3"},
    }, "capacity": {"memory": {"value": "80Gi"}}}
    assert qualified_name("uuid", "gpu.nvidia.com") == "gpu.nvidia.com/uuid"
    assert qualified_name("resource.kubernetes.io/pciBusID", "gpu.nvidia.com") == "resource.kubernetes.io/pciBusID"
    assert device_attribute(device, "uuid", "gpu.nvidia.com") == "GPU-1"
    assert device_attribute(device, "gpu.nvidia.com/uuid", "gpu.nvidia.com") == "GPU-1"
    assert device_attribute(device, "productName", "gpu.nvidia.com") == "NVIDIA H100 80GB HBM3"
    assert device_attribute(device, "resource.kubernetes.io/pciBusID", "gpu.nvidia.com") == "0000:1b:00.0"
    # in a slice of another driver the short key belongs to that driver's domain, not to gpu.nvidia.com
    assert device_attribute(device, "gpu.nvidia.com/uuid", "compute-domain.nvidia.com") is None
    assert device_attribute(device, "compute-domain.nvidia.com/uuid", "compute-domain.nvidia.com") == "GPU-1"
    assert device_attribute(device, "other.example.com/uuid", "gpu.nvidia.com") is None
    assert lookup_qualified(device["capacity"], "memory", "gpu.nvidia.com") == {"value": "80Gi"}
    assert device_capacity_bytes(device, "memory", "gpu.nvidia.com") == 80 * 1024**3
    assert device_capacity_bytes(device, "multiprocessors", "gpu.nvidia.com") is None


@pytest.mark.parametrize("text, expected", [
    ("24Gi", 24 * 2**30),
    ("80Gi", 85_899_345_920),
    ("9856Mi", 9856 * 2**20),
    ("1.5Ki", 1536),
    ("80G", 80_000_000_000),
    ("500M", 500_000_000),
    ("12e3", 12_000),
    ("12E3", 12_000),
    ("1E", 10**18),
    ("1Ei", 2**60),
    ("0", 0),
    ("-1Ki", -1024),
    ("500m", 1),  # fractional values round up, like resource.Quantity.Value()
    ("1.0000001", 2),
    (".5Ki", 512),
    (17179869184, 17179869184),
])
def test_quantity_to_int_is_exact(text, expected):
    assert quantity_to_int(text) == expected


def test_quantity_to_int_is_exact_beyond_float_precision():
    # 2**63-ish values would lose digits through float; Fraction keeps them
    assert quantity_to_int("8191.9999999999999999Pi") == -(-(81919999999999999999 * 2**50) // 10**16)


@pytest.mark.parametrize("text", ["", "Gi", "1.2.3", "1 Gi", "1KI", "1gi", "ten", "1e", True, None, 1.5])
def test_quantity_to_int_rejects_non_quantities(text):
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        quantity_to_int(text)
