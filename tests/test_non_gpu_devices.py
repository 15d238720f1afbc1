"""Devices that are not GPUs (a DRA NIC driver's ``nic-0``, with a ``uuid`` attribute of its own) are
not physical GPUs: not in attribution's candidates, co-tenants, policy overlaps, nor the pack's GPU
inventory or sharing (a DRA breaker's finding: the NIC's uuid counted as a GPU, a GPU+NIC claim was
``ambiguous``/``several-devices``, a NIC-only transaction ``exact`` on ``NIC-0001`` and the NIC
shared by two tenants a cross-tenant GPU sharing).

Which devices are GPUs: ``collector.kube.projections.is_gpu_device`` (type gpu/mig, or a driver
whose first DNS label is ``gpu``; ``vfio`` only from such a driver: tests/test_gpu_device_rule.py). End to end through the fake API server, the watcher,
ingest, attribute, trace, the policy evaluation and a pack, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select, text, update

from collector.kube.projections import device_columns, is_gpu_device
from collector.lineage import attribute
from collector.policy.bundle import load_bundle
from collector.policy.engines import RegorusEngine
from collector.policy.facts import build_facts
from collector.policy.findings import evaluate_period
from collector.sim.dra_objects import (add_finalizer, allocate, bind_pod, make_claim, make_device_class,
                                       make_gpu_device, make_pod, make_slice, pod_running)
from collector.store import migrate
from collector.store.models import DeviceState
from collector.timeutil import NS_PER_S, now_ns, ns_to_dt
from reports.render import PackRequest, render_pack
from tests.pack_data import records
from tests.test_lineage_through_watch import (CLUSTER, SKEW_S, _cli_trace, _fluent_bit_line, _ingest, _settle,
                                              _watch)
from tests.watch_support import caught_up

BUNDLE = load_bundle(Path(__file__).resolve().parent.parent / "policies")
GPU = "GPU-5c0ffee0-1111-4222-8333-944455556666"
NIC_DRIVER = "nic.example.com"
NIC_UUID = "NIC-0001"


def _nic_device() -> dict:
    return {"name": "nic-0", "allowMultipleAllocations": True,
            "attributes": {"ifName": {"string": "eth1"}, "uuid": {"string": NIC_UUID}}}


def _containers() -> list[dict]:
    return [{"name": "risk-api", "image": "registry.bank.example/risk-api:3.5.2"},
            {"name": "triton-sidecar", "image": "nvcr.io/nvidia/tritonserver:25.01-py3",
             "resources": {"claims": [{"name": "dev"}]}}]


def _request(name: str, device_class: str) -> dict:
    return {"name": name, "exactly": {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}}


def _up(srv, name: str, namespace: str, requests: list[dict], results: list) -> dict:
    claim = srv.apply(make_claim(name, namespace, spec={"devices": {"requests": requests}}))
    pod = srv.apply(make_pod(name, namespace, claim_names={"dev": name}, containers=_containers()))
    srv.apply(allocate(add_finalizer(claim), results, pod, node="node-g"))
    return srv.apply(pod_running(bind_pod(pod, "node-g")))


def _nic_result(request: str, share: str) -> dict:
    return {"request": request, "driver": NIC_DRIVER, "pool": "node-g", "device": "nic-0", "shareID": share}


def test_a_nic_is_no_gpu_end_to_end(srv, sessions, database_url, tmp_path, monkeypatch):
    """risk-inference's claim holds gpu-0 and the NIC; kyc-docs' claim the NIC only (shared:
    ``allowMultipleAllocations``). The GPU+NIC transaction is exact on the GPU (one GPU served it),
    the NIC-only one unattributed (``no-device-record``: no record of a GPU among its claim's
    devices), no policy finds a GPU shared or handed over, and the pack's inventory and lineage
    name one GPU (the pack's sharing: ``test_a_shared_nic_is_no_gpu_sharing_in_the_pack``)."""
    start = now_ns()
    srv.apply(make_device_class("gpu.nvidia.com"))
    srv.apply(make_device_class(NIC_DRIVER, driver=NIC_DRIVER, device_type=None))
    srv.apply(make_slice("node-g", [make_gpu_device(0, uuid=GPU)]))
    srv.apply(make_slice("node-g", [_nic_device()], driver=NIC_DRIVER, name="node-g-nic.example.com-x1"))
    risk = _up(srv, "gpu-nic", "risk-inference", [_request("gpu", "gpu.nvidia.com"), _request("nic", NIC_DRIVER)],
               [("gpu", "gpu.nvidia.com", "node-g", "gpu-0"), _nic_result("nic", "1f1f1f1f-0000-4000-8000-000000000001")])
    kyc = _up(srv, "nic-kyc", "kyc-docs", [_request("nic", NIC_DRIVER)],
              [_nic_result("nic", "1f1f1f1f-0000-4000-8000-000000000002")])
    w, synced = _watch(srv, sessions)
    try:
        caught_up(srv, w)
        t = _settle(now_ns())
        _settle(t)
    finally:
        w.stop()

    with sessions() as s:
        nic = s.execute(select(DeviceState).where(DeviceState.driver == NIC_DRIVER)).scalar_one()
        assert (nic.uuid, nic.parent_uuid, nic.physical_gpu_uuid, nic.gpu_uuid) == (None, None, None, None)
        assert nic.attributes["uuid"] == {"string": NIC_UUID}  # kept as published
        gpu = s.execute(select(DeviceState).where(DeviceState.driver == "gpu.nvidia.com")).scalar_one()
        assert (gpu.uuid, gpu.gpu_uuid) == (GPU, GPU)

    _ingest(sessions, database_url, tmp_path, [_fluent_bit_line("TXN-GPU-NIC", t, risk, "node-g"),
                                               _fluent_bit_line("TXN-NIC-ONLY", t, kyc, "node-g")])
    with sessions.begin() as s:
        assert attribute(s, cluster=CLUSTER, clock_skew_s=SKEW_S) == {"exact": 1, "ambiguous": 0, "unattributed": 1}
    docs = {d["transaction_id"]: d for d in _cli_trace(database_url, monkeypatch, "TXN-GPU-NIC", "TXN-NIC-ONLY")}
    both = docs["TXN-GPU-NIC"]
    assert (both["status"], both["reason"], both["candidates"]) == ("exact", None, 1)
    assert (both["physical_gpu_uuid"], both["device_uuid"], both["device"]["device"]) == (GPU, GPU, "gpu-0")
    assert both["claim"]["request"] == "gpu" and both["co_tenants"] == []
    only = docs["TXN-NIC-ONLY"]
    assert (only["status"], only["reason"], only["candidates"]) == ("unattributed", "no-device-record", 0)
    assert (only["physical_gpu_uuid"], only["device_uuid"], only["co_tenants"]) == (None, None, [])

    period_from, period_to = start - 60 * NS_PER_S, now_ns()
    with sessions() as s:
        facts = build_facts(s, period_from, period_to, CLUSTER)
    assert facts["overlaps"] == [] and facts["handovers"] == []
    engine = RegorusEngine()
    engine.load_bundle(BUNDLE)
    evaluation = evaluate_period(sessions, BUNDLE, engine, period_from, period_to, CLUSTER)
    assert [f for f in evaluation.findings if f["rule"].startswith("isolation/")] == []
    assert NIC_UUID not in json.dumps(evaluation.findings, default=str)

    pack = render_pack(sessions, PackRequest(ns_to_dt(period_from), ns_to_dt(period_to), (CLUSTER,)),
                       tmp_path / "pack", pdf=False, record=False)
    inventory = records(pack.path / "data" / "inventory.json")
    assert sorted((r["device"], r["physical_gpu_uuid"], r["device_uuid"]) for r in inventory) == [
        ("gpu-0", GPU, GPU), ("nic-0", None, None)]
    lineage = {r["transaction_id"]: r for r in records(pack.path / "data" / "transaction_lineage.json")}
    assert lineage["TXN-GPU-NIC"]["physical_gpu_uuid"] == GPU
    assert lineage["TXN-NIC-ONLY"]["physical_gpu_uuid"] is None
    assert NIC_UUID not in (pack.path / "index.html").read_text()


def test_which_devices_are_gpus():
    """``type`` gpu/mig (NVIDIA, dra-api.md §6.1), or (any type or none) a driver whose first DNS
    label is ``gpu`` (gpu.example.com, gpu.amd.com, gpu.intel.com publish no NVIDIA types); a NIC
    driver's or compute-domain.nvidia.com's devices are not GPUs."""
    assert is_gpu_device("gpu", "gpu.nvidia.com") and is_gpu_device("mig", "gpu.nvidia.com")
    assert is_gpu_device("vfio", "gpu.nvidia.com") and is_gpu_device(None, "gpu.example.com")
    assert is_gpu_device(None, "gpu.amd.com") and is_gpu_device("amdgpu-partition", "gpu.amd.com")
    assert not is_gpu_device(None, NIC_DRIVER) and not is_gpu_device("nic", NIC_DRIVER)
    assert not is_gpu_device("daemon", "compute-domain.nvidia.com") and not is_gpu_device(None, "gpus.example.com")
    assert not is_gpu_device("vfio", "sriov.network.example.com")  # SR-IOV virtual functions: no GPU driver

    def columns(driver: str, attributes: dict) -> dict:
        return device_columns({"name": "d-0", "attributes": attributes}, driver, "s", 1, "node-g")

    untyped = columns("gpu.example.com", {"uuid": {"string": "gpu-18db0e85"}})
    assert (untyped["uuid"], untyped["physical_gpu_uuid"]) == ("gpu-18db0e85", None)  # gpu_uuid falls back to uuid
    nic = columns(NIC_DRIVER, {"uuid": {"string": NIC_UUID}, "parentUUID": {"string": "X"}})
    assert (nic["uuid"], nic["parent_uuid"], nic["physical_gpu_uuid"]) == (None, None, None)
    assert nic["attributes"]["uuid"] == {"string": NIC_UUID}
    channel = columns("compute-domain.nvidia.com", {"type": {"string": "channel"}, "uuid": {"string": "CD-1"}})
    assert channel["uuid"] is None
    qualified = columns(NIC_DRIVER, {"type": {"string": "gpu"}, "uuid": {"string": "GPU-X"}})
    assert qualified["physical_gpu_uuid"] == "GPU-X"  # a GPU type counts whoever publishes it


def test_the_migration_clears_the_gpu_identity_of_non_gpu_devices_projected_before(engine, sessions):
    """Rows projected by an earlier release kept a NIC's uuid (its computed ``gpu_uuid`` too);
    revision 0004 clears them, GPU rows (typed, or of an untyped GPU driver) stay as they were."""
    from tests.test_policy_support import History

    with sessions.begin() as s:
        h = History(s)
        nic = h.device("node-g", "nic-0", None)
        untyped = h.device("node-g", "gpu-1", None)
        typed = h.device("node-g", "gpu-0", GPU)
        s.execute(update(DeviceState).where(DeviceState.id == nic).values(
            driver=NIC_DRIVER, device_type=None, uuid=NIC_UUID, physical_gpu_uuid=None))
        s.execute(update(DeviceState).where(DeviceState.id == untyped).values(
            driver="gpu.example.com", device_type=None, uuid="gpu-18db0e85", physical_gpu_uuid=None))
    migrate.downgrade(engine, "0003_policy_evaluations")
    with engine.connect() as c:
        assert c.execute(text("SELECT gpu_uuid FROM device_states WHERE id = :i"), {"i": nic}).scalar() == NIC_UUID
    migrate.upgrade(engine)
    with sessions() as s:
        got = {r.id: (r.uuid, r.physical_gpu_uuid, r.gpu_uuid) for r in s.execute(select(DeviceState)).scalars()}
    assert got == {nic: (None, None, None), untyped: ("gpu-18db0e85", None, "gpu-18db0e85"), typed: (GPU, GPU, GPU)}


def test_a_shared_nic_is_no_gpu_sharing_in_the_pack(sessions, tmp_path):
    from tests.test_policy_support import H, History, at

    with sessions.begin() as s:
        h = History(s)
        for kind in ("Pod", "ResourceClaim", "ResourceSlice", "DeviceClass"):
            h.watch(kind, "synced", -2 * H)
        nic = h.device("node-g", "nic-0", None, allow_multiple=True)
        s.execute(update(DeviceState).where(DeviceState.id == nic).values(
            driver=NIC_DRIVER, device_type=None, physical_gpu_uuid=None, attributes={"uuid": {"string": NIC_UUID}}))
        for namespace, claim in (("risk-inference", "fraud-n"), ("kyc-docs", "kyc-n")):
            _episode, result = h.allocation(namespace, claim, "node-g", "nic-0", 1 * H, 2 * H, device_class=NIC_DRIVER)
            s.execute(text("UPDATE allocation_results SET driver = :d WHERE id = :i"), {"d": NIC_DRIVER, "i": result})
    engine = RegorusEngine()
    engine.load_bundle(BUNDLE)
    evaluation = evaluate_period(sessions, BUNDLE, engine, at(0), at(3 * H), "prod-eu-1")
    assert [f for f in evaluation.findings if f["rule"].startswith("isolation/")] == []
    pack = render_pack(sessions, PackRequest(ns_to_dt(at(0)), ns_to_dt(at(3 * H)), ("prod-eu-1",)), tmp_path / "pack",
                       pdf=False, record=False)
    assert records(pack.path / "data" / "sharing.json") == []
