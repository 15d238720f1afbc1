"""What a pack says about its scope and period: findings in a namespace or cluster scope (including
findings stored without a cluster), periods that end in the future or that the collector did not
observe, and the cover's wording of gaps and stops. Store tests (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select

from collector.cli import cli
from collector.errors import UserError
from collector.store import ledger
from collector.store.canonical import content_hash
from collector.store.models import (AllocationEpisode, AllocationResult, CoverageInterval, Finding,
                                    InferenceRecord)
from reports.render import PackRequest, render_pack
from tests.pack_data import records
from tests.test_report import (CLUSTER, FINDING_RULE, PERIOD_FROM, PERIOD_TO, at, bundle, fill_store, ns,  # noqa: F401
                               stop_collector)

DIGEST = "e5" * 32


def add_finding(s, rule: str, subjects: dict, evidence: dict | None, cluster: str | None, frm: float, to: float,
                severity: str = "high", kind: str = "violation", gpu: str | None = None, evaluated: float = 26) -> None:
    """A finding as ``collector.policy.findings`` stores it (claims as ``namespace/name`` strings)."""
    row = {"finding_key": content_hash([rule, subjects, cluster, frm, evaluated]), "cluster": cluster, "rule": rule,
           "severity": severity, "kind": kind, "message": f"{rule} planted", "subjects": subjects,
           "evidence": evidence, "physical_gpu_uuid": gpu, "from_ns": ns(frm), "to_ns": ns(to),
           "period_from_ns": ns(0), "period_to_ns": ns(24), "bundle_revision": "2026.11.3", "bundle_digest": DIGEST,
           "engine": "regorus", "evaluated_at": at(evaluated)}
    fid = s.execute(insert(Finding).values(**row).returning(Finding.id)).scalar_one()
    ledger.append(s, "findings", [{**row, "id": fid}])


def result_ids(s, *claim_uids: str) -> list[int]:
    e, r = AllocationEpisode, AllocationResult
    return sorted(s.execute(select(r.id).join(e, e.id == r.episode_id).where(e.claim_uid.in_(claim_uids))).scalars())


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#39;", "'")


def plant_policy_findings(sessions, cluster: str | None) -> None:
    """Findings shaped like the shipped bundle's: a cross-tenant sharing (risk + marketing), an
    unapproved class on a risk claim only, an unattributed risk transaction, a coverage gap."""
    with sessions.begin() as s:
        both = result_ids(s, "claim-1", "claim-2")
        risk_only = result_ids(s, "claim-3")
        txn = s.execute(select(InferenceRecord.id).where(InferenceRecord.transaction_id == "txn-0200")).scalar_one()
        gap = s.execute(select(CoverageInterval.id).where(CoverageInterval.state == "gap")).scalar_one()
        add_finding(s, "isolation/cross-tenant-sharing",
                    {"tenants": ["marketing", "risk"], "claims": ["marketing-ml/recsys-gpu", "risk-inference/fraud-0-gpu"],
                     "devices": ["gpu.nvidia.com/gpu-node-a/gpu-0"]}, {"allocation_results": both}, cluster, 3, 4)
        add_finding(s, "inventory/unapproved-device-class", {"claims": ["risk-inference/scoring-mig"]},
                    {"allocation_results": risk_only}, cluster, 8, 24)
        add_finding(s, "attribution/unattributed-transaction", {"transactions": ["txn-0200"]},
                    {"inference_records": [txn]}, cluster, 7, 7, severity="medium", kind="warning")
        add_finding(s, "coverage/observation-gap", {"cluster": CLUSTER, "kinds": ["ResourceClaim"]},
                    {"coverage_intervals": [gap]}, cluster, 10, 10 + 5 / 60, severity="medium", kind="warning")


def rules_in(pack) -> list[str]:
    return sorted(f["rule"] for f in records(pack / "data/findings.json")
                  if f["bundle_digest"] == DIGEST)


def test_a_namespace_pack_lists_only_findings_naming_its_namespaces_and_never_calls_filtered_pods_absent(
        sessions, tmp_path, bundle):
    fill_store(sessions)
    plant_policy_findings(sessions, CLUSTER)
    marketing = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,), ("marketing-ml",)),
                            tmp_path / "marketing", policy_bundle=bundle, pdf=False, record=False)
    # the sharing names marketing's claim; the gap names no namespace (cluster-wide); the risk-only ones are out
    assert rules_in(marketing.path) == ["coverage/observation-gap", "isolation/cross-tenant-sharing"]
    statement = json.loads((marketing.path / "manifest.json").read_text())["findings_scope"]
    assert (statement["cluster_wide_kept"], statement["outside_namespaces_left_out"]) == (2, 2)
    text = text_of((marketing.path / "index.html").read_text())
    # risk's pod fraud-0 exists; it is only outside the scope
    assert "no consuming pod recorded" not in text
    assert ("tenant risk claim risk-inference/fraud-0-gpu (namespace outside this pack's scope: its pods are not "
            "listed)") in text
    assert "Tenant marketing pod marketing-ml/recsys-0 and tenant risk claim" in text
    assert "2 cluster-wide finding(s) kept; 2 finding(s) naming only other namespaces left out" in text
    risk = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,), ("risk-inference",)),
                       tmp_path / "risk", policy_bundle=bundle, pdf=False, record=False)
    assert rules_in(risk.path) == ["attribution/unattributed-transaction", "coverage/observation-gap",
                                   "inventory/unapproved-device-class", "isolation/cross-tenant-sharing"]
    nobody = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,), ("does-not-exist",)),
                         tmp_path / "nobody", policy_bundle=bundle, pdf=False, record=False)
    assert rules_in(nobody.path) == ["coverage/observation-gap"]
    assert FINDING_RULE not in {f["rule"] for f in records(nobody.path / "data/findings.json")}


def test_a_cluster_pack_places_findings_stored_without_a_cluster_by_what_they_name(sessions, tmp_path, bundle):
    fill_store(sessions)
    plant_policy_findings(sessions, None)  # `draudit policy eval` without --cluster
    with sessions.begin() as s:
        for evaluated in (26, 27):  # evaluated twice: one decision
            add_finding(s, "attribution/exact-ratio", {"cluster": None}, {"counts": {"records": 6, "exact": 4}}, None,
                        0, 24, severity="medium", kind="warning", evaluated=evaluated)
        add_finding(s, "coverage/observation-gap", {"cluster": "prod-us-2", "kinds": ["Pod"]},
                    {"watch_state": ["prod-us-2/Pod"]}, None, 11, 12, severity="medium", kind="warning")
    pack = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,), ()), tmp_path / "pack",
                       policy_bundle=bundle, pdf=False, record=False)
    # placed through their evidence rows (allocations, transaction, coverage interval) in prod-eu-1
    assert rules_in(pack.path) == ["attribution/unattributed-transaction", "coverage/observation-gap",
                                   "inventory/unapproved-device-class", "isolation/cross-tenant-sharing"]
    # the ratio over every cluster names none: left out and said so; prod-us-2's gap is simply another cluster's
    statement = json.loads((pack.path / "manifest.json").read_text())["findings_scope"]
    assert statement["without_cluster_left_out"] == {"attribution/exact-ratio": 1}
    cover = text_of((pack.path / "index.html").read_text().split('<nav class="toc">')[0])
    assert "1 finding(s) stored without a cluster name none in their subjects or evidence" in cover


def test_a_period_ending_in_the_future_is_refused(sessions, tmp_path, bundle, database_url):
    fill_store(sessions)
    with pytest.raises(UserError, match=r"--to 2026-11-29T00:00:00Z is in the future \(now 2026-11-28T12:00:00Z\).*"
                                        r"give --to 2026-11-28T12:00:00Z or earlier"):
        render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,)), tmp_path / "today",
                    policy_bundle=bundle, now=at(12))
    assert not (tmp_path / "today").exists()
    res = CliRunner().invoke(cli, ["report", "--from", "2099-01-01", "--to", "2099-01-02", "--out",
                                   str(tmp_path / "p"), "--database-url", database_url])
    assert res.exit_code == 2 and "--to 2099-01-02T00:00:00Z is in the future" in res.output
    assert not (tmp_path / "p").exists()


def test_a_period_after_the_collector_stopped_says_nothing_was_observed(sessions, tmp_path, bundle):
    fill_store(sessions)
    stop_collector(sessions, 20)
    later = render_pack(sessions, PackRequest(PERIOD_TO, PERIOD_TO + timedelta(hours=6), (CLUSTER,)),
                        tmp_path / "later", policy_bundle=bundle, pdf=False, record=False)
    html = (later.path / "index.html").read_text()
    text = text_of(html)
    # scoring-mig was open when the collector stopped: not stated as allocated in a period nobody watched
    assert "Claims allocated in the period 0 (nothing was observed in the period" in text
    assert ("nothing observed in the period: the collector had stopped before it (last observation prod-eu-1 "
            "2026-11-28T20:00:00Z)") in text
    assert "(last state observed before the period; not observed in it)" in text
    assert json.loads((later.path / "manifest.json").read_text())["coverage"]["observed_in_period"] is False
    day = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,)), tmp_path / "day",
                      policy_bundle=bundle, pdf=False, record=False)
    assert "nothing observed in the period" not in text_of((day.path / "index.html").read_text())
    assert json.loads((day.path / "manifest.json").read_text())["coverage"]["observed_in_period"] is True


def test_the_cover_counts_gaps_and_collector_not_running_like_the_coverage_section(sessions, tmp_path, bundle):
    fill_store(sessions)
    with sessions.begin() as s:  # the collector was down from 12:00 to 13:00, then ran again
        row = {"cluster": CLUSTER, "kind": "ResourceClaim", "state": "stopped", "started_ns": ns(12), "ended_ns": ns(13),
               "from_rv": None, "to_rv": None, "reason": None}
        cid = s.execute(insert(CoverageInterval).values(**row).returning(CoverageInterval.id)).scalar_one()
        ledger.append(s, "coverage_intervals", [{**row, "id": cid}])
    pack = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,)), tmp_path / "pack",
                       policy_bundle=bundle, pdf=False, record=False)
    html = (pack.path / "index.html").read_text()
    cover = text_of(html.split('<nav class="toc">')[0])
    assert "Observation gaps 1 gap interval(s) and 1 collector-not-running interval(s) in the period" in cover
    assert "none recorded" not in cover
    coverage = text_of(html[html.index('<section id="coverage">'):html.index('<section id="inventory">')])
    assert "Collector not running" in coverage


def test_a_pack_of_a_period_no_policy_bundle_evaluated_says_so_and_the_cli_warns(sessions, tmp_path, bundle,
                                                                                 database_url):
    """A newcomer rendered a pack before any policy evaluation: section 6 said "No findings for the
    period" and the command warned of nothing. Section 6 now says there are none because nothing was
    evaluated (an observed period), and `draudit report` warns (stderr), naming the command to run first."""
    with sessions.begin() as s:  # an observed day (every kind synced), no policy evaluation stored
        cov = []
        for kind in ("Pod", "ResourceClaim", "ResourceSlice", "DeviceClass"):
            row = {"cluster": CLUSTER, "kind": kind, "state": "synced", "started_ns": ns(-1), "ended_ns": ns(25)}
            cov.append({**row, "id": s.execute(insert(CoverageInterval).values(**row).returning(CoverageInterval.id)).scalar_one()})
        ledger.append(s, "coverage_intervals", cov)
    pack = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,), ()), tmp_path / "pack",
                       policy_bundle=bundle, pdf=False, record=False)
    text = text_of((pack.path / "index.html").read_text())
    assert "No findings because no policy bundle was evaluated over the period (section 8)" in text
    assert "No findings for the period." not in text
    res = CliRunner().invoke(cli, ["report", "--from", "2026-11-28", "--to", "2026-11-29", "--out", str(tmp_path / "p"),
                                   "--database-url", database_url])
    assert res.exit_code == 0, res.output
    assert "draudit: warning: no policy bundle was evaluated over the period" in res.output
    assert "draudit policy eval --from" in res.output
    # a period nobody observed: the pack says an evaluation finds nothing to decide on; no advice to run one
    res = CliRunner().invoke(cli, ["report", "--from", "2025-01-01", "--to", "2025-01-02", "--out", str(tmp_path / "q"),
                                   "--database-url", database_url])
    assert res.exit_code == 0 and "policy eval" not in res.output, res.output
