"""Pure parts of the evidence pack: manifest and signature checks, coverage summary, sharing analysis."""

from __future__ import annotations

import base64
import json
import re

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from reports.manifest import (
    FileDigest,
    build_manifest,
    check_pack,
    digest_bytes,
    manifest_bytes,
    public_key_id,
    sign_manifest,
    verdict,
)
from reports.finding_text import Allocation, FindingFacts, describe
from reports.populations import Scope, coverage_summary
from reports.timeline import CHART_WIDTH, LABEL_WIDTH, RIGHT_MARGIN, Bar, axis_ticks, sharing_segments, step_text, sub_rows, timeline_svgs

S = 1_000_000_000
FILES = {"index.html": b"<html>pack</html>", "data/findings.csv": b"rule\nisolation\n"}


def _pack(key=None):
    digests = [digest_bytes(p, d) for p, d in FILES.items()]
    manifest = build_manifest({"pack_id": "p1", "period": {"from": "a", "to": "b"}}, digests,
                              public_key_id(key.public_key()) if key else None)
    data = manifest_bytes(manifest)
    return manifest, data, (sign_manifest(data, key) if key else None), {d.path: d for d in digests}


def test_manifest_lists_files_sorted_with_media_types_and_rejects_unsafe_paths():
    manifest, data, _sig, _present = _pack()
    assert [f["path"] for f in manifest["files"]] == ["data/findings.csv", "index.html"]
    assert manifest["files"][0]["media_type"] == "text/csv; charset=utf-8"
    assert data.startswith(b'{"files":[{"media_type"') and b'", "' not in data and json.loads(data) == manifest
    for bad in ("../etc/passwd", "/abs", "data//x", "a\\b", "manifest.json"):
        with pytest.raises(ValueError):
            build_manifest({}, [FileDigest(bad, 1, "0" * 64)])
    with pytest.raises(ValueError, match="reserved"):
        build_manifest({"files": []}, [])


def test_checks_pass_untouched_and_name_each_problem():
    key = Ed25519PrivateKey.generate()
    _m, data, sig, present = _pack(key)
    checks = check_pack(data, sig, present, key.public_key())
    assert verdict(checks) and [c.ok for c in checks] == [True, True, True, True]
    # no key: signature skipped, still a pass
    assert [c.ok for c in check_pack(data, sig, present, None)][1] is None
    # a changed byte in the signature
    raw = bytearray(base64.b64decode(sig))
    raw[0] ^= 1
    bad = check_pack(data, base64.b64encode(bytes(raw)), present, key.public_key())
    assert not verdict(bad) and bad[1].name == "signature" and "does not verify" in bad[1].detail
    # a non-canonical manifest (pretty-printed) is refused
    reformatted = data.replace(b",", b", ")
    assert check_pack(reformatted, sig, present, key.public_key())[0].detail.endswith("(edited after it was written)")
    # size and digest differences are told apart
    short = dict(present, **{"index.html": FileDigest("index.html", 3, "0" * 64)})
    same_size = dict(present, **{"index.html": FileDigest("index.html", present["index.html"].size, "0" * 64)})
    assert "size differs" in [c for c in check_pack(data, sig, short, None) if c.name == "file index.html"][0].detail
    assert "SHA-256 differs" in [c for c in check_pack(data, sig, same_size, None) if c.name == "file index.html"][0].detail
    # signature file without a declared signature: the manifest was replaced by an unsigned one
    _m2, unsigned, _s, _p = _pack()
    assert "declares no signature" in check_pack(unsigned, sig, present, None)[1].detail


def test_coverage_summary_clips_and_counts_unobserved_time():
    scope = Scope(100 * S, 200 * S)
    intervals = [
        {"cluster": "c", "kind": "Pod", "state": "synced", "started_ns": 50 * S, "ended_ns": 150 * S},
        {"cluster": "c", "kind": "Pod", "state": "gap", "started_ns": 150 * S, "ended_ns": 160 * S},
        {"cluster": "c", "kind": "Pod", "state": "synced", "started_ns": 160 * S, "ended_ns": None},  # open
        {"cluster": "c", "kind": "ResourceSlice", "state": "synced", "started_ns": 120 * S, "ended_ns": 180 * S},
    ]
    pod, rs = coverage_summary(intervals, scope)
    assert (pod["synced_s"], pod["gap_s"], pod["unobserved_s"], pod["gaps"]) == (90.0, 10.0, 0.0, 1)
    assert (rs["synced_s"], rs["gap_s"], rs["unobserved_s"], rs["gaps"]) == (60.0, 0.0, 40.0, 0)


def _bar(gpu, device, tenant, claim, start, end, mig=False):
    return Bar(gpu, "node-a", device, "mig" if mig else "gpu", f"{device}-uuid", "3g.40gb" if mig else None, tenant,
               f"{tenant}-ns", claim, claim, start * S, None if end is None else end * S)


def test_sharing_segments_tell_mig_partitioning_from_shared_devices():
    bars = [
        _bar("GPU-A", "gpu-0", "risk", "c1", 0, 50),
        _bar("GPU-A", "gpu-0", "marketing", "c2", 20, 30),
        _bar("GPU-A", "gpu-0", "risk", "c3", 40, 60),  # same tenant overlap 40..50
        _bar("GPU-B", "mig-0", "risk", "c4", 0, None, mig=True),
        _bar("GPU-B", "mig-1", "marketing", "c5", 10, 20, mig=True),
        _bar("GPU-C", "gpu-0", "risk", "c6", 0, 10),
        _bar("GPU-C", "gpu-0", "marketing", "c7", 10, 20),  # back to back: no sharing
    ]
    segs = [(s.physical_gpu_uuid, s.from_ns // S, s.to_ns // S, s.tenants, s.partitioned) for s in
            sharing_segments(bars, 0, 100 * S)]
    assert segs == [
        ("GPU-A", 20, 30, ("marketing", "risk"), False),
        ("GPU-A", 40, 50, ("risk",), False),
        ("GPU-B", 10, 20, ("marketing", "risk"), True),
    ]
    # a MIG partition beside the whole GPU is no shared device: the mode says which it is
    whole_and_part = [_bar("GPU-D", "gpu-0", "risk", "c8", 0, 10), _bar("GPU-D", "mig-2", "marketing", "c9", 0, 10, mig=True)]
    assert [s.mode for s in sharing_segments(bars + whole_and_part, 0, 100 * S)] == [
        "shared device (no hardware partitioning)", "shared device (no hardware partitioning)", "MIG-partitioned",
        "different devices of one GPU (no hardware partitioning)"]
    svg = timeline_svgs(bars + [_bar("GPU-<x>", "d", "t&t", "c9", 0, 1)], 0, 100 * S, lanes_per_chart=2)
    assert len(svg) == 2 and "GPU-&lt;x&gt;" in "".join(svg) and "t&amp;t" in "".join(svg)
    assert 'stroke-dasharray="2,1"' in svg[1] and 'stroke-dasharray' not in svg[0]  # MIG drawn distinctly
    # GPU-A (2nd lane of the 1st chart): c1 overlaps c2 then c3, 2 rows; GPU-B: a row per MIG device; GPU-C: back to back
    assert "node-a · 2 rows: concurrent claims stacked</text>" in svg[0]
    assert "".join(svg).count("concurrent claims stacked") == 1 and "node-a · MIG ×2</text>" in svg[1]


def test_axis_ticks_are_distinct_round_and_as_precise_as_the_period_needs():
    day = 1_795_824_000 * S  # 2026-11-28T00:00:00Z
    step, ticks = axis_ticks(day + S // 2, day + 36 * S)  # 35.5 s: seconds, date on the first label only
    labels = [label for _t, label in ticks]
    assert step == 5 * S and step_text(step) == "5 s"
    assert labels == ["2026-11-28 00:00:05", "00:00:10", "00:00:15", "00:00:20", "00:00:25", "00:00:30", "00:00:35"]
    step, ticks = axis_ticks(day - 6 * 3600 * S, day + 18 * 3600 * S)  # crosses midnight: the new date is named
    assert step_text(step) == "3 h" and [label for _t, label in ticks][:4] == [
        "2026-11-27 18:00", "21:00", "2026-11-28 00:00", "03:00"]
    step, ticks = axis_ticks(day, day + 30 * 86_400 * S)  # a month: dates only
    assert step_text(step) == "7 days" and all(len(label) == 10 for _t, label in ticks)
    step, ticks = axis_ticks(day, day + 3 * S // 10)  # 300 ms: milliseconds
    assert step_text(step) == "50 ms" and ticks[1][1] == "00:00:00.050"
    for t0, t1 in ((day, day + 7 * S), (day, day + 86_400 * S), (day + 1, day + 400 * 86_400 * S)):
        labels = [label for _t, label in axis_ticks(t0, t1)[1]]
        assert len(labels) == len(set(labels)) and 2 <= len(labels) <= 9


def test_findings_in_words_name_the_pods_of_each_tenant_and_spell_out_the_evidence():
    facts = FindingFacts()
    facts.add_consumer("risk-ns", "fraud-gpu", "fraud-0", 0, 50 * S)
    facts.add_consumer("risk-ns", "fraud-gpu", "fraud-1", 60 * S, None)  # after the finding: not named
    facts.add_allocation(Allocation(7, 3, "risk-ns", "fraud-gpu", "gpu.nvidia.com/node-a/gpu-0", "GPU-A", "node-a", None,
                                    0, None))
    facts.sharing = [("GPU-A", 10 * S, 20 * S, ("mkt-ns/embed-gpu", "risk-ns/fraud-gpu"), False)]
    finding = {"physical_gpu_uuid": "GPU-A", "from": "2026-11-28T00:00:10Z", "to": "2026-11-28T00:00:20Z",
               "from_ns": 10 * S, "to_ns": 20 * S, "subjects": {"claims": ["risk-ns/fraud-gpu", "mkt-ns/embed-gpu"],
                                                                  "tenants": ["marketing", "risk"]},
               "evidence": {"allocation_results": [7, 8]}}
    [f] = describe([finding], facts, {"risk-ns": "risk", "mkt-ns": "marketing"}.get)
    assert f["headline"] == ("Tenant marketing claim mkt-ns/embed-gpu (no consuming pod recorded) and tenant risk pod "
                             "risk-ns/fraud-0 shared physical GPU GPU-A on node node-a without hardware partitioning "
                             "(no MIG: the same device or the whole GPU) from 2026-11-28T00:00:10Z to "
                             "2026-11-28T00:00:20Z (10 s).")
    assert f["subject_rows"] == [("Claims (namespace/name)", ["risk-ns/fraud-gpu", "mkt-ns/embed-gpu"]),
                                 ("Tenants", ["marketing", "risk"])]
    [ev] = f["evidence_rows"]
    assert ev["source"] == "data/allocation_episodes.csv, column allocation_result_id"
    assert ev["lines"] == ["allocation result 7: claim risk-ns/fraud-gpu on gpu.nvidia.com/node-a/gpu-0 (GPU-A, node "
                           "node-a) from 1970-01-01T00:00:00Z, still allocated at the period end", "allocation result 8"]
    # a cluster-wide finding: no sentence, its subjects and counts as rows
    [g] = describe([{"subjects": {"cluster": "c1"}, "evidence": {"counts": {"exact": 3, "records": 4}}}], facts, str)
    assert g["headline"] is None and g["subject_rows"] == [("Cluster", ["c1"])]
    assert g["evidence_rows"][0]["lines"] == ["exact 3, records 4"]


def _rects(svg: str) -> list[tuple[float, float, float, str]]:
    """(x, y, width, title) of every bar in a timeline SVG."""
    return [(float(x), float(y), float(w), t) for x, y, w, t in
            re.findall(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="[\d.]+" fill="#[0-9A-F]{6}"'
                       r'[^>]*><title>([^<]*)</title>', svg)]


def test_timeline_stacks_concurrent_claims_so_a_later_tenant_never_hides_an_earlier_one():
    gpu, mig_gpu = "GPU-7f3c2a1e-4b5d-6e7f-8091-a2b3c4d5e6f7", "GPU-19d8e7f6-0a1b-2c3d-4e5f-60718293a4b5"
    bars = [
        _bar(gpu, "gpu.nvidia.com/node-a/gpu-0", "risk", "fraud-0-gpu", 0, None),  # runs on under the KYC claim
        _bar(gpu, "gpu.nvidia.com/node-a/gpu-0", "kyc", "kyc-ocr-gpu", 30, 60),
        _bar(gpu, "gpu.nvidia.com/node-a/gpu-0", "risk", "fraud-1-gpu", 70, 90),  # after KYC: reuses its row
        _bar(mig_gpu, "gpu.nvidia.com/node-b/mig-1", "risk", "fraud-mig", 0, 100, mig=True),
        _bar(mig_gpu, "gpu.nvidia.com/node-b/mig-2", "marketing", "recsys-mig", 10, 50, mig=True),
    ]
    [svg] = timeline_svgs(bars, 0, 100 * S)
    rows = {t.split(" on ")[0]: y for _x, y, _w, t in _rects(svg)}
    risk, kyc, later = rows["risk: risk-ns/fraud-0-gpu"], rows["kyc: kyc-ns/kyc-ocr-gpu"], rows["risk: risk-ns/fraud-1-gpu"]
    assert kyc > risk and later == kyc  # the overlapping claim is on its own sub-row; the later one reuses it
    fraud = next(r for r in _rects(svg) if "fraud-0-gpu" in r[3])
    assert fraud[2] == pytest.approx(CHART_WIDTH - LABEL_WIDTH - RIGHT_MARGIN)  # drawn over the whole period, not overpainted
    mig_rows = {rows["risk: risk-ns/fraud-mig"], rows["marketing: marketing-ns/recsys-mig"]}
    assert len(mig_rows) == 2 and not mig_rows & {risk, kyc}  # each MIG device its own row, in its own lane
    assert svg.count('stroke-dasharray="2,1"') == 2
    # legible in print: the chart is 180 mm (510 pt) wide, every font size prints at 6.5 pt or more
    sizes = [float(s) for s in re.findall(r'font-size="([\d.]+)"', svg)]
    assert min(sizes) * 510 / CHART_WIDTH >= 6.5
    assert sub_rows([(0, 10), (5, 15), (10, 20), (12, 30), (20, 25)]) == [0, 1, 0, 2, 0]


def test_timeline_charts_stay_page_sized_when_many_claims_overlap():
    bars = [_bar(f"GPU-{g:08d}-0000-0000-0000-000000000000", "gpu.nvidia.com/n/gpu-0", f"t{c % 3}", f"c{g}-{c}", c, 100)
            for g in range(12) for c in range(g)]  # GPU g holds g concurrent claims
    svgs = timeline_svgs(bars, 0, 100 * S)
    for svg in svgs:
        height = float(re.search(r'viewBox="0 0 \d+ (\d+)"', svg).group(1))
        assert height * 510 / CHART_WIDTH < 700  # fits the A4 text height (about 720 pt)
    assert sum(len(_rects(s)) for s in svgs) == len(bars)
    assert "whole GPU (+3 more concurrent) on its last row" in "".join(svgs)  # 11 concurrent claims, 8 rows drawn


def test_controls_resting_on_findings_or_observation_are_lowered_for_the_same_reasons():
    from reports.controls import (CONTROLS, COVERAGE_COMPLETE, NOT, OBSERVED_SECTIONS, POLICY_EVALUATED, PackFacts,
                                  controls_document)

    counts = {"inventory": 4, "allocation_episodes": 6, "consumer_intervals": 6, "transaction_lineage": 3000,
              "findings": 0, "coverage": 8, "sharing": 1, "changes": 2}
    # the newcomer's pack: 3.1 % of the period observed, no policy bundle evaluated over it
    doc = controls_document(PackFacts(True, counts, (0.031, "bank-eu-inference-1", "Pod"), bundles=0))
    by_id = {c["id"]: c for c in doc["controls"]}
    coverage = "observation coverage is partial: Pod in bank-eu-inference-1 synced for 3.1 % of the period (section 2)"
    no_policy = ("no policy bundle was evaluated over the period (no evaluation recorded): nothing was checked "
                 "against the policies")
    for control in ("RTS (EU) 2024/1774 Art. 23", "DORA (EU) 2022/2554 Art. 10(1)", "DORA (EU) 2022/2554 Art. 9(4)(b)"):
        assert (by_id[control]["status"], by_id[control]["status_reasons"]) == ("partially evidenced",
                                                                              [coverage, no_policy]), control
    assert (by_id["NIS2 (EU) 2022/2555 Art. 21(2)(f)"]["status"],
            by_id["NIS2 (EU) 2022/2555 Art. 21(2)(f)"]["status_reasons"]) == (NOT, [no_policy, coverage])
    # a bundle evaluated over a fully observed period that found nothing: the compliant case evidences them
    clean = {c["id"]: c for c in controls_document(PackFacts(True, counts, (1.0, "bank-eu-inference-1", "Pod"),
                                                             bundles=1))["controls"]}
    for control in ("NIS2 (EU) 2022/2555 Art. 21(2)(a)", "NIS2 (EU) 2022/2555 Art. 21(2)(f)",
                    "NIS2 (EU) 2022/2555 Art. 21(2)(b)"):
        assert (clean[control]["status"], clean[control]["status_reasons"]) == (clean[control]["ceiling"], []), control
    # with a bundle evaluated and complete coverage, the same controls are evidenced without reasons
    doc = controls_document(PackFacts(True, {**counts, "findings": 3}, (1.0, "bank-eu-inference-1", "Pod"), bundles=1))
    assert all((c["status"], c["status_reasons"]) == ("evidenced", []) for c in doc["controls"]
               if c["ceiling"] == "evidenced")
    # no control can rest on the findings or on observation without the matching need
    for c in CONTROLS:
        if c["status"] != NOT and "findings" in c["sections"]:
            assert POLICY_EVALUATED in c["needs"] or "findings" in c["needs"], c["article"]
        if c["status"] != NOT and OBSERVED_SECTIONS & set(c["sections"]):
            assert COVERAGE_COMPLETE in c["needs"], c["article"]


def test_every_attribution_reason_has_a_meaning_in_the_pack():
    """The methodology explains every reason collector/lineage.py can store (read from its decision table)."""
    import re
    from pathlib import Path

    import collector.lineage
    from reports.render import STATUS_MEANINGS

    source = Path(collector.lineage.__file__).read_text()
    reasons = set(re.findall(r'"(?:unattributed|ambiguous)", "([a-z-]+)"\)', source)) - {"unattributed", "ambiguous"}
    reasons.add("skew-window")
    assert {"no-pod", "unknown-cluster", "pod-identity-conflict", "several-devices"} <= reasons
    assert reasons - set(STATUS_MEANINGS) == set()


def test_an_allocation_interval_starting_or_ending_while_unobserved_says_so():
    """finding_text.unobserved_start: a sharing first seen when the watch resumed may have begun
    earlier; one whose end was first seen then may have ended earlier (third newcomer pass)."""
    from reports.finding_text import FindingFacts, unobserved_start

    s = 10**9
    facts = FindingFacts(blind={"prod": [(100 * s, 130 * s, "stopped")]})
    finding = {"cluster": "prod", "physical_gpu_uuid": "GPU-1", "subjects": {"claims": ["a/x", "b/y"]}}
    start = unobserved_start({**finding, "from_ns": 131 * s, "to_ns": 200 * s}, facts)
    assert start.startswith("start not observed: the collector was not running from 1970-01-01T00:01:40Z to "
                            "1970-01-01T00:02:10Z; the first observation is 1970-01-01T00:02:11Z")
    end = unobserved_start({**finding, "from_ns": 50 * s, "to_ns": 130 * s + 1}, facts)
    assert end.startswith("end not observed:") and "may have ended as early as 1970-01-01T00:01:40Z" in end
    assert unobserved_start({**finding, "from_ns": 50 * s, "to_ns": 90 * s}, facts) is None
    assert unobserved_start({**finding, "from_ns": 136 * s, "to_ns": 200 * s}, facts) is None  # past the tolerance
    coverage = {"cluster": "prod", "physical_gpu_uuid": None, "subjects": {"kinds": ["Pod"]}, "from_ns": 100 * s}
    assert unobserved_start(coverage, facts) is None
