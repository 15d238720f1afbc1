"""Which published devices are GPUs (``collector.kube.projections.is_gpu_device``), from realistic
``resource.k8s.io/v1`` ResourceSlices through the projection, policy facts and a pack.

A breaker's findings: an SR-IOV NIC driver publishes its virtual functions with ``type: vfio``, the
NVIDIA driver's type for a GPU passed through (dra-api.md §6.1, §6.3), and every ``vfio`` device
counted as a GPU: a VF got a GPU identity, two tenants using one VF one after the other were a GPU
handover (shared at once: a cross-tenant GPU sharing). Now ``vfio`` is a GPU only from a GPU driver
(first DNS label ``gpu``). And the devices of an accelerator driver not named ``gpu.*`` that
publishes no ``type`` (a TPU driver's) were silently no GPUs: they still are not (draudit audits
GPUs), but the projection now logs a warning naming the driver.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, select, text, update

from collector.kube import projections
from collector.kube.normalize import normalize
from collector.kube.projections import is_gpu_device, slice_facts
from collector.policy.facts import build_facts
from collector.store import migrate
from collector.store.canonical import content_hash
from collector.store.models import DeviceState, ObjectVersion
from reports.render import PackRequest, render_pack
from tests.pack_data import records
from tests.test_policy_support import H, History, at

CLUSTER = "prod-eu-1"
SRIOV = "sriov.network.example.com"
TPU = "tpu.google.com"  # illustrative: an accelerator driver that publishes no ``type``
PASSTHROUGH_GPU = "GPU-2b7e51d0-9c4a-4f1e-8d3b-6a0c5e7f1a92"
PARENT_GPU = "GPU-8f3c9a41-2d6b-4e0a-9b17-c54e2f6a8d03"
MIG = "MIG-1d9e4c7a-5b2f-5a8e-b3c1-7f0a2d6e9b45"
T0 = datetime(2026, 11, 29, 0, 0, 0, tzinfo=timezone.utc)


def nvidia_slice(node: str) -> dict:
    """A ``gpu.nvidia.com`` node slice (v25.12+ names and attributes, dra-api.md §6.2, §6.3): a VFIO
    passthrough GPU, a full GPU and one static MIG device of it."""
    pci = "resource.kubernetes.io/pciBusID"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpu.nvidia.com-q7v2c", "uid": "5d0a8e2c-7b1f-4c3a-9e6d-0f2b4a6c8e10",
                         "resourceVersion": "61001"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [
                         {"name": "gpu-vfio-0", "attributes": {
                             "type": {"string": "vfio"}, "uuid": {"string": PASSTHROUGH_GPU},
                             "deviceID": {"string": "0x2330"}, "vendorID": {"string": "0x10de"},
                             "numa": {"int": 0}, "productName": {"string": "NVIDIA H100 80GB HBM3"},
                             "iommuFDEnabled": {"bool": False}, pci: {"string": "0000:1b:00.0"}},
                          "capacity": {"addressableMemory": {"value": "80Gi"}}},
                         {"name": "gpu-1", "attributes": {
                             "type": {"string": "gpu"}, "uuid": {"string": PARENT_GPU},
                             "productName": {"string": "NVIDIA H100 80GB HBM3"}, "brand": {"string": "Nvidia"},
                             "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
                             "driverVersion": {"version": "570.124.6"}, "cudaDriverVersion": {"version": "12.8.0"},
                             pci: {"string": "0000:2a:00.0"}},
                          "capacity": {"memory": {"value": "80Gi"}}},
                         {"name": "gpu-1-mig-1g10gb-19-0", "attributes": {
                             "type": {"string": "mig"}, "uuid": {"string": MIG}, "parentUUID": {"string": PARENT_GPU},
                             "profile": {"string": "1g.10gb"}, "productName": {"string": "NVIDIA H100 80GB HBM3"},
                             "driverVersion": {"version": "570.124.6"}, pci: {"string": "0000:2a:00.0"}},
                          "capacity": {"multiprocessors": {"value": "16"}, "memory": {"value": "9984Mi"}}},
                     ]}}


def sriov_slice(node: str) -> dict:
    """An SR-IOV NIC driver's slice: two virtual functions of one PF, published as ``type: vfio``."""
    def vf(i: int) -> dict:
        return {"name": f"vf-{i}", "attributes": {
            "type": {"string": "vfio"}, "vendorID": {"string": "0x15b3"}, "deviceID": {"string": "0x101e"},
            "pfName": {"string": "ens1f0"}, "numa": {"int": 0},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:3b:00.{i + 2}"}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{SRIOV}-h4m8x", "uid": "9a7c5e3b-1d2f-4a6b-8c0e-2f4d6b8a0c1e",
                         "resourceVersion": "61002"},
            "spec": {"driver": SRIOV, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [vf(0), vf(1)]}}


def tpu_slice(node: str, n: int = 4, rv: str = "61003") -> dict:
    """An accelerator driver not named ``gpu.*`` whose devices carry no ``type``."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{TPU}-w2n6d", "uid": "3e5a7c9b-0d2f-4b6a-8e1c-4a6c8e0b2d3f",
                         "resourceVersion": rv},
            "spec": {"driver": TPU, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"tpu-{i}", "attributes": {"index": {"int": i}}} for i in range(n)]}}


def observe(session, raw: dict, observed_at: datetime) -> None:
    """Store one ADDED watch event as the watcher does and project it in the same transaction."""
    group, _, version = raw["apiVersion"].rpartition("/")
    meta = raw["metadata"]
    row = {"cluster": CLUSTER, "api_group": group, "api_version": version, "kind": raw["kind"],
           "namespace": None, "name": meta["name"], "uid": meta["uid"], "resource_version": meta["resourceVersion"],
           "event_type": "ADDED", "observed_at": observed_at, "raw": raw, "content_hash": content_hash(raw)}
    row["id"] = session.execute(insert(ObjectVersion).values(**row).returning(ObjectVersion.id)).scalar_one()
    projections.apply_versions(session, [row])


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    """Each test sees the once-per-driver warnings afresh."""
    monkeypatch.setattr(projections, "_warned_drivers", set(), raising=False)


def test_a_nic_vf_of_type_vfio_is_no_gpu_an_nvidia_passthrough_gpu_and_a_mig_device_are(sessions):
    """Projected from the watched slices: the VFs of the SR-IOV driver are no GPUs (no identity, and
    ``is_gpu_device`` false as the pack reads it); ``gpu.nvidia.com``'s ``gpu-vfio-0`` is the GPU
    of its ``uuid``, the MIG device resolves to its parent."""
    with sessions.begin() as s:
        observe(s, nvidia_slice("node-v"), T0)
        observe(s, sriov_slice("node-v"), T0)
    with sessions() as s:
        rows = {(r.driver, r.device): r for r in s.execute(select(DeviceState)).scalars()}
    got = {key: (r.device_type, r.physical_gpu_uuid, r.gpu_uuid, is_gpu_device(r.device_type, r.driver))
           for key, r in rows.items()}
    assert got == {
        ("gpu.nvidia.com", "gpu-vfio-0"): ("vfio", PASSTHROUGH_GPU, PASSTHROUGH_GPU, True),
        ("gpu.nvidia.com", "gpu-1"): ("gpu", PARENT_GPU, PARENT_GPU, True),
        ("gpu.nvidia.com", "gpu-1-mig-1g10gb-19-0"): ("mig", PARENT_GPU, PARENT_GPU, True),
        (SRIOV, "vf-0"): ("vfio", None, None, False),
        (SRIOV, "vf-1"): ("vfio", None, None, False),
    }
    assert rows[("gpu.nvidia.com", "gpu-1-mig-1g10gb-19-0")].uuid == MIG
    assert rows[(SRIOV, "vf-0")].attributes["pfName"] == {"string": "ens1f0"}  # kept as published


def test_two_tenants_on_one_nic_vf_share_and_hand_over_no_gpu(sessions, tmp_path):
    """Two tenants on VF ``vf-0`` one after the other and, on ``vf-1`` (shareable), at once: no GPU
    handover, overlap or sharing in the policy facts nor the pack. The same pattern on the NVIDIA
    passthrough GPU is still a handover (guard)."""
    with sessions.begin() as s:
        h = History(s)
        for kind in ("Pod", "ResourceClaim", "ResourceSlice", "DeviceClass"):
            h.watch(kind, "synced", -2 * H)
        observe(s, nvidia_slice("node-v"), T0 - timedelta(hours=1))
        raw = sriov_slice("node-v")
        raw["spec"]["devices"][1]["allowMultipleAllocations"] = True
        observe(s, raw, T0 - timedelta(hours=1))
        allocations = [("risk-inference", "fraud-vf", SRIOV, "vf-0", 1 * H, 2 * H),
                       ("kyc-docs", "kyc-vf", SRIOV, "vf-0", 2 * H + 30, 3 * H),
                       ("risk-inference", "fraud-vf-shared", SRIOV, "vf-1", 1 * H, 3 * H),
                       ("kyc-docs", "kyc-vf-shared", SRIOV, "vf-1", 1 * H, 3 * H),
                       ("marketing", "recs-passthrough", "gpu.nvidia.com", "gpu-vfio-0", 1 * H, 2 * H),
                       ("risk-inference", "fraud-passthrough", "gpu.nvidia.com", "gpu-vfio-0", 2 * H + 30, 3 * H)]
        for namespace, claim, driver, device, start, end in allocations:
            device_class = "vfio.gpu.nvidia.com" if driver == "gpu.nvidia.com" else SRIOV
            _episode, result = h.allocation(namespace, claim, "node-v", device, start, end, device_class=device_class)
            s.execute(text("UPDATE allocation_results SET driver = :d WHERE id = :i"), {"d": driver, "i": result})
    with sessions() as s:
        facts = build_facts(s, at(0), at(4 * H), CLUSTER)
    assert facts["overlaps"] == []
    assert [(h["from"]["claim"], h["to"]["claim"]) for h in facts["handovers"]] == [
        ("recs-passthrough", "fraud-passthrough")]

    pack = render_pack(sessions, PackRequest(T0, T0 + timedelta(hours=4), (CLUSTER,)), tmp_path / "pack",
                       pdf=False, record=False)
    assert records(pack.path / "data" / "sharing.json") == []


def test_an_untyped_accelerator_is_no_gpu_and_the_operator_is_warned(caplog):
    """A TPU driver's untyped devices are no GPUs, and a warning names the driver (once per driver:
    a slice is republished often); so does one for the SR-IOV driver's ``vfio`` VFs. A GPU driver's
    untyped devices (``gpu.example.com``) and a declared other type (a NIC's ``nic``) are not
    warned about."""
    caplog.set_level(logging.WARNING, logger="collector.kube.projections")
    tpu = slice_facts(normalize("ResourceSlice", "resource.k8s.io/v1", tpu_slice("tpu-node-a")))
    assert {name: (d["device_type"], d["uuid"], is_gpu_device(d["device_type"], TPU))
            for name, d in tpu.devices.items()} == {f"tpu-{i}": (None, None, False) for i in range(4)}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert TPU in warnings[0] and "tpu-0, tpu-1, tpu-2, tpu-3" in warnings[0]
    assert "not counted as GPUs" in warnings[0] and "no-device-record" in warnings[0]

    caplog.clear()
    slice_facts(normalize("ResourceSlice", "resource.k8s.io/v1", tpu_slice("tpu-node-a", 8, rv="61010")))
    example = tpu_slice("gpu-node-x")
    example["spec"]["driver"] = "gpu.example.com"
    slice_facts(example)
    nic = sriov_slice("node-n")
    nic["spec"]["driver"] = "nic.example.com"
    nic["spec"]["devices"] = [{"name": "nic-0", "attributes": {"type": {"string": "nic"}}}]
    slice_facts(nic)
    assert [r.getMessage() for r in caplog.records] == []

    slice_facts(sriov_slice("node-v"))
    (vfio,) = [r.getMessage() for r in caplog.records]
    assert SRIOV in vfio and "of type vfio (vf-0, vf-1)" in vfio and "not counted as GPUs" in vfio


def test_the_migration_clears_the_gpu_identity_of_nic_vfs_projected_before(engine, sessions):
    """Rows projected by an earlier release gave an SR-IOV VF with a ``uuid`` attribute a GPU
    identity; revision 0006 clears it, ``gpu.nvidia.com``'s passthrough GPU keeps its own."""
    with sessions.begin() as s:
        h = History(s)
        vf = h.device("node-v", "vf-0", "VF-0003b0002")
        passthrough = h.device("node-v", "gpu-vfio-0", PASSTHROUGH_GPU)
        s.execute(update(DeviceState).where(DeviceState.id == vf).values(driver=SRIOV, device_type="vfio"))
        s.execute(update(DeviceState).where(DeviceState.id == passthrough).values(device_type="vfio"))
    migrate.downgrade(engine, "0005_watch_state_observed_until")
    with engine.connect() as c:
        assert c.execute(text("SELECT gpu_uuid FROM device_states WHERE id = :i"), {"i": vf}).scalar() == "VF-0003b0002"
    migrate.upgrade(engine)
    with sessions() as s:
        got = {r.id: (r.uuid, r.physical_gpu_uuid, r.gpu_uuid) for r in s.execute(select(DeviceState)).scalars()}
    assert got == {vf: (None, None, None), passthrough: (PASSTHROUGH_GPU, PASSTHROUGH_GPU, PASSTHROUGH_GPU)}
