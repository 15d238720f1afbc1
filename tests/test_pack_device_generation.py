"""A pack puts an allocation on the GPU of its device as allocated — the record of the highest
pool generation when several slices publish the device — as attribution and the policy facts do,
so its sharing intervals agree with its findings. SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from collector.policy.bundle import load_bundle
from collector.policy.engines import RegorusEngine
from collector.policy.findings import evaluate_period
from collector.timeutil import ns_to_dt
from reports.render import PackRequest, render_pack
from tests.pack_data import records
from test_policy_support import H, History, at, gpu_uuid

BUNDLE = load_bundle(Path(__file__).resolve().parent.parent / "policies")


def test_a_stale_generation_s_record_published_later_does_not_move_an_allocation_to_another_gpu(sessions, tmp_path):
    with sessions.begin() as s:
        h = History(s)
        for kind in ("Pod", "ResourceClaim", "ResourceSlice", "DeviceClass"):
            h.watch(kind, "synced", -2 * H)
        h.device("node-g", "gpu-0", gpu_uuid("N2"), start_s=-H, generation=2)
        h.device("node-g", "gpu-0", gpu_uuid("O1"), start_s=-H / 2, generation=1)  # a stale slice re-sent
        h.device("node-g", "gpu-1", gpu_uuid("N2"), start_s=-H, generation=2)
        h.allocation("risk-inference", "fraud-g", "node-g", "gpu-0", 1 * H, 2 * H)
        h.allocation("kyc-docs", "kyc-g", "node-g", "gpu-1", 1 * H, 2 * H)
    engine = RegorusEngine()
    engine.load_bundle(BUNDLE)
    evaluation = evaluate_period(sessions, BUNDLE, engine, at(0), at(3 * H), "prod-eu-1")
    assert [(f["rule"], f["physical_gpu_uuid"]) for f in evaluation.findings
            if f["rule"] == "isolation/cross-tenant-sharing"] == [("isolation/cross-tenant-sharing", gpu_uuid("N2"))]
    pack = render_pack(sessions, PackRequest(ns_to_dt(at(0)), ns_to_dt(at(3 * H)), ("prod-eu-1",)), tmp_path / "pack",
                       pdf=False, record=False)
    episodes = {e["claim_name"]: e["physical_gpu_uuid"] for e in records(pack.path / "data" / "allocation_episodes.json")}
    assert episodes == {"fraud-g": gpu_uuid("N2"), "kyc-g": gpu_uuid("N2")}
    sharing = records(pack.path / "data" / "sharing.json")
    assert [row["physical_gpu_uuid"] for row in sharing] == [gpu_uuid("N2")]
