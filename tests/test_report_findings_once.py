"""One incident, one finding in the pack: the same decision stated by two bundle revisions, or by
evaluations over overlapping periods, is listed and counted once, with the revisions that found it
(newcomer finding: the demo's pack showed its cross-tenant incident twice, "6 high", and 8
observation-gap findings for 4 kinds whose messages disagreed with their intervals). Store tests."""

from __future__ import annotations

import json
import re

from sqlalchemy import insert

from collector.store import ledger
from collector.store.canonical import content_hash
from collector.store.models import Finding
from reports.render import PackRequest, render_pack
from tests.pack_data import records
from tests.test_report import CLUSTER, GPU_A, PERIOD_FROM, PERIOD_TO, at, bundle, fill_store, ns  # noqa: F401

BANK, SHIPPED = ("draudit-policies-2026.11.2+demo-bank", "b1" * 32), ("draudit-policies-2026.11.2", "5b" * 32)
SUBJECTS = {"tenants": ["marketing", "risk"], "claims": ["marketing-ml/recsys-gpu", "risk-inference/fraud-0-gpu"]}


def _store(s, revision_digest: tuple[str, str], evaluated_h: float, rule: str = "isolation/cross-tenant-sharing",
           subjects: dict = SUBJECTS, frm: float = 3, to: float = 4, severity: str = "high") -> None:
    revision, digest = revision_digest
    row = {"finding_key": content_hash([rule, digest, evaluated_h]), "cluster": CLUSTER, "rule": rule,
           "severity": severity, "kind": "violation", "message": f"{rule} by {revision}", "subjects": subjects,
           "evidence": None, "physical_gpu_uuid": GPU_A, "from_ns": ns(frm), "to_ns": ns(to), "period_from_ns": ns(0),
           "period_to_ns": ns(24), "bundle_revision": revision, "bundle_digest": digest, "engine": "regorus",
           "evaluated_at": at(evaluated_h)}
    fid = s.execute(insert(Finding).values(**row).returning(Finding.id)).scalar_one()
    ledger.append(s, "findings", [{**row, "id": fid}])


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_one_incident_found_by_two_bundle_revisions_is_one_finding_naming_both(sessions, tmp_path, bundle):
    fill_store(sessions)
    with sessions.begin() as s:
        _store(s, BANK, 25)
        _store(s, SHIPPED, 26)
        _store(s, SHIPPED, 26, rule="inventory/unapproved-device-class", subjects={"claims": ["risk-inference/fraud-0-gpu"]})
    pack = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,)), tmp_path / "p", policy_bundle=bundle,
                       pdf=False, record=False)
    ours = [f for f in records(pack.path / "data/findings.json") if f["rule"] != "isolation.cross_tenant_without_partitioning"
            and f["rule"] != "coverage.watch_gap"]  # fill_store plants two findings of its own
    sharing = [f for f in ours if f["rule"] == "isolation/cross-tenant-sharing"]
    assert len(sharing) == 1 and len(ours) == 2
    [one] = sharing
    assert one["bundle_revision"] == f"{BANK[0]}; {SHIPPED[0]}"
    assert one["bundle_digest"] == f"{BANK[1]}; {SHIPPED[1]}"
    assert one["message"] == f"isolation/cross-tenant-sharing by {SHIPPED[0]}"  # the latest evaluation's text
    html = _text((pack.path / "index.html").read_text())
    assert html.count("isolation/cross-tenant-sharing by") == 1
    assert f"policy bundle revision {BANK[0]}" in html and f"policy bundle revision {SHIPPED[0]}" in html
    assert "(one decision, counted once; its text is from revision " + SHIPPED[0] in html
    # the unapproved class was raised by one revision only: the pack says revisions may differ (newcomer)
    assert "revisions evaluated this period: each finding names the revisions that raised it (section 6)" in html
    assert "may come from their rules or parameters differing" in html
    # the bundles table counts the finding for each revision that found it, the severity count once
    bundles = re.findall(r"<tr><td>(draudit-policies[^<]*)</td>.*?<td class=\"num\">(\d+)</td></tr>",
                         (pack.path / "index.html").read_text())
    assert dict(bundles) == {BANK[0]: "1", SHIPPED[0]: "2"}
    manifest = json.loads((pack.path / "manifest.json").read_text())
    assert {b["revision"] for b in manifest["policy_bundles"]} >= {BANK[0], SHIPPED[0]}
    highs = sum(1 for f in records(pack.path / "data/findings.json") if f["severity"] == "high")
    assert f"high {highs}" in html and highs == 3  # fill_store's own sharing finding, this one, the unapproved class


def test_one_incident_stored_from_two_window_starts_is_one_finding_over_its_whole_interval(sessions, tmp_path, bundle):
    # windows starting inside the incident clip its start: stored from 3 h (first window), from 3.5 h and
    # from 5 h (later windows, the last one still open); a separate incident of the same subjects at 10 h
    fill_store(sessions)
    with sessions.begin() as s:
        _store(s, SHIPPED, 25, frm=3, to=4)
        _store(s, SHIPPED, 25.5, frm=3.5, to=5)
        _store(s, SHIPPED, 26, frm=5, to=6)
        _store(s, SHIPPED, 26.5, frm=10, to=11)
    pack = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,)), tmp_path / "p", policy_bundle=bundle,
                       pdf=False, record=False)
    sharing = [f for f in records(pack.path / "data/findings.json") if f["rule"] == "isolation/cross-tenant-sharing"]
    assert [(f["from_ns"], f["to_ns"]) for f in sharing] == [(ns(3), ns(6)), (ns(10), ns(11))]


def test_a_gap_evaluated_by_windows_ending_at_different_times_keeps_the_latest_end_stated(sessions, tmp_path, bundle):
    # newcomer re-check: three evaluations of one gap from the same start, the last evaluated stating
    # the shortest end (its window ended first); the pack showed that shortest one
    fill_store(sessions)
    gap = {"kind": "ResourceClaim"}
    with sessions.begin() as s:
        _store(s, SHIPPED, 25, rule="coverage/observation-gap", subjects=gap, frm=12, to=16, severity="medium")
        _store(s, SHIPPED, 25.5, rule="coverage/observation-gap", subjects=gap, frm=12, to=18, severity="medium")
        _store(s, SHIPPED, 26, rule="coverage/observation-gap", subjects=gap, frm=12, to=14, severity="medium")
    pack = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,)), tmp_path / "p", policy_bundle=bundle,
                       pdf=False, record=False)
    gaps = [f for f in records(pack.path / "data/findings.json") if f["rule"] == "coverage/observation-gap"]
    assert [(f["from_ns"], f["to_ns"]) for f in gaps] == [(ns(12), ns(18))]


def test_per_transaction_warnings_do_not_push_an_incident_out_of_the_detailed_findings(sessions, tmp_path, bundle):
    """Second newcomer: 1 269 `attribution/unattributed-transaction` warnings sorted before the
    coverage warnings of the same severity (by rule), so only per-transaction findings were spelt out.
    Within a severity, findings about one transaction now come after the others."""
    fill_store(sessions)
    with sessions.begin() as s:
        for k in range(30):
            _store(s, SHIPPED, 25 + k / 100, rule="attribution/unattributed-transaction",
                   subjects={"transactions": [f"txn-{k:04d}"]}, frm=5 + k / 100, to=5 + k / 100, severity="medium")
        _store(s, SHIPPED, 26, rule="coverage/observation-gap", subjects={"cluster": CLUSTER, "kinds": ["Pod"]},
               frm=10, to=10.5, severity="medium")
    pack = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,)), tmp_path / "p", policy_bundle=bundle,
                       pdf=False, record=False)
    findings = records(pack.path / "data/findings.json")
    mediums = [f["rule"] for f in findings if f["severity"] == "medium"]
    assert mediums.index("coverage/observation-gap") < mediums.index("attribution/unattributed-transaction")
    assert mediums.count("attribution/unattributed-transaction") == 30
    html = (pack.path / "index.html").read_text()
    detailed = html[html.index('<section id="findings">'):]
    assert "coverage/observation-gap by draudit-policies-2026.11.2" in _text(detailed)
