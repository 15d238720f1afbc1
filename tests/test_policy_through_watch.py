"""Every planted problem, played through the fake API server and recorded by the real watcher,
is found by the policies — and nothing else is a violation (MIG-isolated sharing stays an
observation)."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path

from collector.ingest.pipeline import IngestRun
from collector.lineage import attribute
from collector.policy.bundle import load_bundle
from collector.policy.engines import RegorusEngine
from collector.policy.findings import evaluate_period
from collector.settings import Settings
from collector.sim.dra_objects import (allocate, claim_spec, deallocate, make_claim, make_device_class, make_gpu_device,
                                       make_mig_device, make_pod, make_slice)
from collector.timeutil import NS_PER_S, now_ns, ns_to_rfc3339
from tests.watch_support import caught_up, start_watcher, wait_until

BUNDLE = Path(__file__).resolve().parent.parent / "policies"
A10G = {m: f"GPU-5e1c0a{m:02d}-1d2e-4f50-8a9b-0c1d2e3f4a5b" for m in range(6)}
H100 = "GPU-77aa0b1c-2d3e-4f50-8a9b-0c1d2e3f4a5b"


def _bundle(tmp_path: Path):
    """The shipped bundle with the thresholds a short test needs (as a user sets data.json)."""
    target = tmp_path / "policies"
    shutil.copytree(BUNDLE, target)
    data = json.loads((target / "data.json").read_text())
    params = data["draudit"]["params"]
    params.update({"coverage_gap_max_s": 0, "idle_allocation_max_s": 1})
    (target / "data.json").write_text(json.dumps(data))
    return load_bundle(target)


def _use(srv, name, ns, device, *, device_class="gpu.nvidia.com", extra=None, consumer=True, node="node-a"):
    claim = srv.apply(make_claim(name, ns, spec=claim_spec(device_class=device_class)))
    pod = srv.apply(make_pod(f"{name}-pod", ns, claim_names={"gpu": name})) if consumer else None
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": device, **(extra or {})}
    return srv.apply(allocate(claim, [result], pod, node=node))


def test_planted_problems_through_the_watcher_are_found_and_nothing_else(srv, sessions, database_url, tmp_path):
    srv.apply(make_device_class("gpu.nvidia.com"))
    srv.apply(make_device_class("mig.nvidia.com", device_type="mig"))
    devices = [make_gpu_device(m, uuid=A10G[m], product_name="NVIDIA A10G", memory="24Gi") for m in range(6)]
    devices[0]["allowMultipleAllocations"] = True  # consumable capacity: shares carry a shareID
    srv.apply(make_slice("node-a", devices))
    srv.apply(make_slice("node-c", [make_gpu_device(0, uuid=H100),
                                    make_mig_device(0, profile="1g.12gb", parent_uuid=H100, placement_start=0),
                                    make_mig_device(0, profile="1g.12gb", parent_uuid=H100, placement_start=1)]))
    mig_names = sorted(d["name"] for d in srv.objects("ResourceSlice")[1]["spec"]["devices"] if "mig" in d["name"])
    start = now_ns() - NS_PER_S
    w = start_watcher(srv, sessions, cluster="bank")
    try:
        assert w.wait_synced(20)
        # 1. two tenants on one A10G through consumable-capacity shares
        _use(srv, "fraud-share", "risk-inference", "gpu-0", extra={"shareID": "7c1f0e1a-share-a", "consumedCapacity": {"memory": "12Gi"}})
        _use(srv, "kyc-share", "kyc-docs", "gpu-0", extra={"shareID": "7c1f0e1a-share-b", "consumedCapacity": {"memory": "12Gi"}})
        # 2. the scheduler hands one exclusive device to two claims at once (same tenant)
        _use(srv, "fraud-dup-1", "risk-inference", "gpu-1")
        _use(srv, "fraud-dup-2", "risk-inference", "gpu-1")
        # 3. a device handed from one tenant to another within seconds
        first = _use(srv, "fraud-before", "risk-inference", "gpu-2")
        srv.apply(deallocate(first))
        _use(srv, "kyc-after", "kyc-docs", "gpu-2")
        # 4. adminAccess outside the allowed namespaces
        _use(srv, "fraud-admin", "risk-inference", "gpu-3", extra={"adminAccess": True})
        # 5. an unapproved DeviceClass, and a device no ResourceSlice publishes
        srv.apply(make_device_class("experimental.example.com"))
        _use(srv, "fraud-experimental", "risk-inference", "gpu-4", device_class="experimental.example.com")
        _use(srv, "fraud-ghost-device", "risk-inference", "gpu-9")
        # 8. an allocation nobody consumes
        _use(srv, "fraud-idle", "risk-inference", "gpu-5", consumer=False)
        # MIG slices of one H100 used by two tenants: hardware-isolated, an observation only
        _use(srv, "kyc-mig", "kyc-docs", mig_names[0], device_class="mig.nvidia.com", node="node-c")
        _use(srv, "fraud-mig", "risk-inference", mig_names[1], device_class="mig.nvidia.com", node="node-c")
        caught_up(srv, w)
        # 7. writes the watches never see (RV moves on), history compacted, API server restarted:
        # resuming from the old RV is refused with 410 → relist → a coverage gap
        srv.bump_rv(3)
        srv.compact()
        srv.restart()
        wait_until(lambda: all(r.synced.is_set() and not r.in_gap for r in w.reflectors) and len(_gaps(sessions)) >= 1,
                   what="gap recorded and relisted")
        time.sleep(1.5)  # the idle allocation outlasts its 1 s threshold
        caught_up(srv, w)
    finally:
        w.stop()
    # 6. transactions from a pod the cluster never had: unattributed
    seen_at = now_ns() - 2 * NS_PER_S  # while the watcher was recording: no pod of that name then
    lines = "".join(json.dumps({"@timestamp": ns_to_rfc3339(seen_at + i * NS_PER_S // 10), "transaction.id": f"TXN-GHOST-{i}",
                                "kubernetes": {"namespace_name": "risk-inference", "pod_name": "ghost-0",
                                               "container_name": "risk-api"}}) + "\n" for i in range(2))
    src = tmp_path / "ghost.jsonl"
    src.write_text(lines)
    run = IngestRun(sessions, Settings(database_url=database_url, cluster="bank"), cluster="bank", workers=1)
    with open(src, "rb") as fh:
        run.ingest_stream(fh, str(src))
    assert run.finish().stored == 2
    with sessions.begin() as s:
        attribute(s, cluster="bank")

    bundle = _bundle(tmp_path)
    engine = RegorusEngine()
    engine.load_bundle(bundle)
    end = now_ns() + NS_PER_S
    result = evaluate_period(sessions, bundle, engine, start - 3600 * NS_PER_S, end, "bank", now_ns=end)
    rules = Counter(f["rule"] for f in result.findings)
    by_rule: dict[str, list[dict]] = {}
    for f in result.findings:
        by_rule.setdefault(f["rule"], []).append(f)

    assert [f["physical_gpu_uuid"] for f in by_rule["isolation/cross-tenant-sharing"]] == [A10G[0]]
    assert sorted(by_rule["isolation/cross-tenant-sharing"][0]["subjects"]["tenants"]) == ["kyc-docs", "risk-inference"]
    assert [f["physical_gpu_uuid"] for f in by_rule["isolation/double-allocation"]] == [A10G[1]]
    assert [f["physical_gpu_uuid"] for f in by_rule["isolation/tenant-handover-gap"]] == [A10G[2]]
    assert len(by_rule["isolation/admin-access"]) == 1
    assert len(by_rule["inventory/unapproved-device-class"]) == 1
    assert len(by_rule["inventory/unknown-device"]) == 1
    assert len(by_rule["inventory/idle-allocation"]) == 1
    assert rules["attribution/unattributed-transaction"] == 2 and rules["attribution/exact-ratio"] == 1
    assert rules["coverage/observation-gap"] >= 1
    mig = by_rule["isolation/shared-with-isolation"]
    assert [(f["physical_gpu_uuid"], f["severity"], f["kind"]) for f in mig] == [(H100, "info", "observation")]
    violations = Counter(f["rule"] for f in result.findings if f["kind"] == "violation")
    assert set(violations) == {"isolation/cross-tenant-sharing", "isolation/double-allocation", "isolation/admin-access",
                               "inventory/unapproved-device-class", "inventory/unknown-device"}
    assert set(rules) - set(violations) == {"isolation/tenant-handover-gap", "inventory/idle-allocation",
                                            "attribution/unattributed-transaction", "attribution/exact-ratio",
                                            "coverage/observation-gap", "isolation/shared-with-isolation"}


def _gaps(sessions):
    from tests.watch_support import gaps

    return gaps(sessions)
