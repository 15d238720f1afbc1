"""What a pack says about an allocation agrees with the policies and attribution: it puts an
allocation on the GPU of its device as allocated — the record of the highest pool generation when
several slices publish the device — so its sharing intervals agree with its findings; and a sharing
still going on when the policies evaluated it is open, not ended then. SQLite and PostgreSQL."""

from __future__ import annotations

import re
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


def test_a_sharing_still_going_on_when_evaluated_is_open_in_the_pack_not_ended_when_the_evaluation_ran(sessions,
                                                                                                        tmp_path):
    """The scheduler evaluates the day so far: a sharing still going on is cut at its run. The pack
    for the hours before showed it ended then — after the pack's own period (a newcomer's finding)."""
    with sessions.begin() as s:
        h = History(s)
        for kind in ("Pod", "ResourceClaim", "ResourceSlice", "DeviceClass"):
            h.watch(kind, "synced", -2 * H)
        h.device("node-s", "gpu-0", gpu_uuid("S0"), allow_multiple=True)
        h.allocation("risk-inference", "fraud-s", "node-s", "gpu-0", 1 * H, None)
        h.allocation("kyc-docs", "kyc-s", "node-s", "gpu-0", 2 * H, None)
    engine = RegorusEngine()
    engine.load_bundle(BUNDLE)
    evaluate_period(sessions, BUNDLE, engine, at(0), at(24 * H), "prod-eu-1", now_ns=at(10 * H))
    pack = render_pack(sessions, PackRequest(ns_to_dt(at(0)), ns_to_dt(at(5 * H)), ("prod-eu-1",)), tmp_path / "pack",
                       pdf=False, record=False)
    [sharing] = [f for f in records(pack.path / "data" / "findings.json") if f["rule"] == "isolation/cross-tenant-sharing"]
    assert (sharing["from"], sharing["to"], sharing["seen_until"]) == ("2026-11-29T02:00:00Z", None, "2026-11-29T10:00:00Z")
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", (pack.path / "index.html").read_text()))
    assert ("from 2026-11-29T02:00:00Z (8 h 00 min observed), still going on when last evaluated, at "
            "2026-11-29T10:00:00Z.") in text
    assert "to 2026-11-29T10:00:00Z" not in text
    # the interval row: open, with what was observed of it (from 02:00 to the evaluation at 10:00)
    assert ("Interval (UTC) 2026-11-29T02:00:00Z, still going on when last evaluated, at 2026-11-29T10:00:00Z "
            "(8 h 00 min observed)") in text
