"""Policy evaluation over stored histories: SQL facts → regorus → findings, on SQLite and PostgreSQL.

The history (tests/test_policy_support.py) plants one instance of each problem the bundle looks
for on a background that must produce nothing, plus MIG-isolated sharing, which is an
observation and never a violation.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from collector.cli import cli
from collector.policy.bundle import load_bundle
from collector.policy.engines import RegorusEngine
from collector.policy.facts import build_facts, iter_allocations
from collector.policy.findings import evaluate_period
from collector.store import ledger
from collector.store.models import Finding, PolicyEvaluation
from collector.timeutil import NS_PER_S, dt_to_ns, ns_to_rfc3339
from test_policy_support import DAY, EXPECTED_RULES, H, History, at, gpu_uuid, plant_history

BUNDLE_DIR = Path(__file__).resolve().parent.parent / "policies"


@pytest.fixture(scope="module")
def bundle():
    return load_bundle(BUNDLE_DIR)


@pytest.fixture
def regorus_engine(bundle):
    engine = RegorusEngine()
    engine.load_bundle(bundle)
    return engine


@pytest.fixture
def planted(sessions):
    with sessions.begin() as s:
        return plant_history(s)


def _facts(sessions, period=DAY, **kwargs):
    with sessions.begin() as s:
        return build_facts(s, *period, **kwargs)


def test_facts_pair_only_allocations_that_meet_on_one_physical_gpu(sessions, planted):
    facts = _facts(sessions)
    pairs = {(o["a"]["claim"], o["b"]["claim"]): o for o in facts["overlaps"]}
    assert set(pairs) == {("fraud-mig", "recs-mig"), ("fraud-share", "recs-share"), ("fraud-2-gpu", "fraud-3-gpu")}
    mig = pairs[("fraud-mig", "recs-mig")]
    assert (mig["same_device"], mig["a"]["mig"], mig["b"]["mig"]) == (False, True, True)
    assert mig["physical_gpu_uuid"] == gpu_uuid("B0")
    assert (mig["from_ns"], mig["to_ns"]) == (at(3 * H), at(6 * H))
    share = pairs[("fraud-share", "recs-share")]
    assert share["same_device"] and share["a"]["share_id"] == "3f1c9a2e" and share["a"]["allow_multiple_allocations"]
    assert {share["a"]["id"], share["b"]["id"]} == {planted["share_a"], planted["share_b"]}


def test_facts_hand_over_gpus_between_namespaces_with_the_gap(sessions, planted):
    facts = _facts(sessions)
    handovers = {(h["from"]["claim"], h["to"]["claim"]): h for h in facts["handovers"]}
    assert set(handovers) == {("fraud-0-gpu", "recs-0-gpu"), ("recs-1-gpu", "fraud-4-gpu")}
    assert handovers[("fraud-0-gpu", "recs-0-gpu")]["gap_ns"] == 600 * NS_PER_S
    fast = handovers[("recs-1-gpu", "fraud-4-gpu")]
    assert (fast["released_ns"], fast["acquired_ns"], fast["gap_ns"]) == (at(2 * H), at(2 * H + 30), 30 * NS_PER_S)
    assert fast["physical_gpu_uuid"] == gpu_uuid("E0")


def test_facts_know_devices_idle_stretches_gaps_and_attribution(sessions, planted):
    facts = _facts(sessions)
    by_claim = {a["claim"]: a for a in iter_allocations(facts)}
    assert len(by_claim) == 16
    assert not by_claim["ghost-gpu"]["known_device"] and by_claim["ghost-gpu"]["physical_gpu_uuid"] is None
    assert by_claim["debug-admin-gpu"]["admin_access"] and by_claim["fraud-0-gpu"]["known_device"]
    # grouped by what the per-allocation rules decide on: namespace, class, adminAccess, known device
    keys = [(g["namespace"], g["device_class"], g["admin_access"], g["known_device"]) for g in facts["allocation_groups"]]
    assert len(keys) == len(set(keys)) == 8
    assert by_claim["fraud-mig"]["physical_gpu_uuid"] == gpu_uuid("B0")
    assert by_claim["passthrough-gpu"]["device_class"] == "vfio.gpu.nvidia.com"
    assert [(i["claim"], i["duration_ns"]) for i in facts["idle_allocations"]] == [("idle-gpu", (3 * H - 600) * NS_PER_S)]
    assert sorted((g["kind"], g["duration_ns"] // NS_PER_S, g["open"]) for g in facts["coverage_gaps"]) == [
        ("ResourceClaim", 300, False), ("ResourceSlice", 20, False)]
    attribution = facts["attribution"]
    assert (attribution["records"], attribution["exact"], attribution["unattributed"], attribution["pending"]) == (200, 197, 3, 0)
    assert attribution["unattributed_records"][0]["record_id"] == planted["unattributed"]


def test_evaluation_finds_each_planted_problem_and_nothing_else(sessions, planted, bundle, regorus_engine):
    result = evaluate_period(sessions, bundle, regorus_engine, *DAY)
    assert Counter(f["rule"] for f in result.findings) == EXPECTED_RULES
    by_rule = {f["rule"]: f for f in result.findings}

    mig = by_rule["isolation/shared-with-isolation"]
    assert (mig["severity"], mig["kind"], mig["physical_gpu_uuid"]) == ("info", "observation", gpu_uuid("B0"))
    assert not [f for f in result.findings if f["kind"] == "violation" and f["physical_gpu_uuid"] == gpu_uuid("B0")]

    sharing = by_rule["isolation/cross-tenant-sharing"]
    assert (sharing["severity"], sharing["kind"], sharing["physical_gpu_uuid"]) == ("high", "violation", gpu_uuid("C0"))
    assert sharing["subjects"]["tenants"] == ["marketing", "risk-inference"]
    assert sharing["evidence"] == {"allocation_results": sorted([planted["share_a"], planted["share_b"]])}
    assert (sharing["from_ns"], sharing["to_ns"]) == (at(2 * H), at(3 * H))

    double = by_rule["isolation/double-allocation"]
    assert double["subjects"]["claims"] == ["risk-inference/fraud-2-gpu", "risk-inference/fraud-3-gpu"]
    handover = by_rule["isolation/tenant-handover-gap"]
    assert (handover["severity"], handover["kind"]) == ("medium", "warning")
    assert handover["subjects"]["tenants"] == ["marketing", "risk-inference"]
    assert by_rule["isolation/admin-access"]["evidence"] == {"allocation_results": [planted["admin"]]}
    assert by_rule["inventory/unapproved-device-class"]["evidence"] == {"allocation_results": [planted["vfio"]]}
    assert by_rule["inventory/unknown-device"]["subjects"]["devices"] == ["gpu.nvidia.com/node-g/gpu-7"]
    assert (by_rule["inventory/idle-allocation"]["severity"], by_rule["inventory/idle-allocation"]["kind"]) == ("low", "warning")
    assert by_rule["coverage/observation-gap"]["evidence"] == {"coverage_intervals": [planted["gap"]]}
    assert by_rule["attribution/exact-ratio"]["message"].startswith("197 of 200 transactions")
    for f in result.findings:
        assert f["bundle_revision"] == bundle.revision and f["bundle_digest"] == bundle.digest
        assert f["engine"] == "regorus" and (f["period_from_ns"], f["period_to_ns"]) == DAY


def test_reevaluating_the_same_period_and_bundle_is_idempotent_and_ledgered(sessions, planted, bundle, regorus_engine):
    first = evaluate_period(sessions, bundle, regorus_engine, *DAY)
    second = evaluate_period(sessions, bundle, regorus_engine, *DAY)
    assert first.inserted == sum(EXPECTED_RULES.values())
    assert second.inserted == 0
    assert [f["id"] for f in second.findings] == [f["id"] for f in first.findings]
    with sessions() as s:
        assert s.execute(select(func.count()).select_from(Finding)).scalar_one() == first.inserted
        assert ledger.verify(s).ok


def test_strict_mig_mode_turns_mig_sharing_into_a_violation(sessions, planted, tmp_path):
    strict_dir = tmp_path / "strict"
    shutil.copytree(BUNDLE_DIR, strict_dir)
    data = json.loads((strict_dir / "data.json").read_text())
    data["draudit"]["params"]["strict_mig"] = True
    (strict_dir / "data.json").write_text(json.dumps(data))
    strict = load_bundle(strict_dir)
    engine = RegorusEngine()
    engine.load_bundle(strict)
    result = evaluate_period(sessions, strict, engine, *DAY)
    mig = [f for f in result.findings if f["rule"] == "isolation/shared-with-isolation"]
    assert [(f["severity"], f["kind"]) for f in mig] == [("high", "violation")]
    assert strict.digest != load_bundle(BUNDLE_DIR).digest  # a new bundle: new findings, not a rewrite
    assert result.inserted == sum(EXPECTED_RULES.values())


def test_a_gap_still_open_counts_until_now_and_only_inside_the_period(sessions, bundle, regorus_engine):
    with sessions.begin() as s:
        History(s).watch("Pod", "gap", 20 * H, reason="connection refused")
    early = evaluate_period(sessions, bundle, regorus_engine, at(0), at(20 * H), now_ns=at(21 * H))
    assert early.findings == []
    result = evaluate_period(sessions, bundle, regorus_engine, *DAY, now_ns=at(20 * H + 120))
    [gap] = result.findings
    assert (gap["rule"], gap["from_ns"], gap["to_ns"]) == ("coverage/observation-gap", at(20 * H), at(20 * H + 120))
    assert gap["evidence"] == {"watch_state": ["prod-eu-1/Pod"]}
    # stamped with the instant its facts were cut at: a reader tells "lasted to when it ran" from
    # "ended before" (draudit findings: open, seen until then); stamped later, it read as ended
    with sessions() as s:
        stamped = s.execute(select(PolicyEvaluation.evaluated_at).order_by(PolicyEvaluation.id.desc())).scalars().first()
    assert dt_to_ns(stamped) == at(20 * H + 120)


def test_reevaluating_a_still_open_gap_updates_one_finding_instead_of_adding_new_ones(sessions, bundle, regorus_engine):
    # The scheduler evaluates the current day every 5 minutes: an interval still open ends at "now"
    # each time. Each evaluation keeps its row (ledgered), but it is the same finding: counted as
    # updated, and readers show its latest evaluation only.
    from collector.policy.findings import latest_per_identity
    with sessions.begin() as s:
        History(s).watch("Pod", "gap", 20 * H, reason="connection refused")
    evaluations = [evaluate_period(sessions, bundle, regorus_engine, *DAY, now_ns=at(20 * H + 120 + 300 * i)) for i in range(3)]
    assert [(e.inserted, e.updated) for e in evaluations] == [(1, 0), (1, 1), (1, 1)]
    again = evaluate_period(sessions, bundle, regorus_engine, *DAY, now_ns=at(20 * H + 720))  # same "now": nothing new
    assert (again.inserted, again.updated) == (0, 0)
    with sessions() as s:
        rows = [dict(r) for r in s.execute(select(Finding.__table__).order_by(Finding.id)).mappings()]
    assert [r["to_ns"] for r in rows] == [at(20 * H + 120), at(20 * H + 420), at(20 * H + 720)]
    [latest] = latest_per_identity(rows)
    assert (latest["from_ns"], latest["to_ns"]) == (at(20 * H), at(20 * H + 720))


def test_a_collector_stopped_and_not_back_is_an_observation_gap(sessions, bundle, regorus_engine):
    with sessions.begin() as s:
        History(s).watch("ResourceClaim", "stopped", 9 * H)
        History(s).watch("Pod", "synced", 1 * H)
    result = evaluate_period(sessions, bundle, regorus_engine, *DAY, now_ns=at(9 * H + 600))
    [gap] = result.findings
    assert (gap["rule"], gap["severity"], gap["from_ns"], gap["to_ns"]) == (
        "coverage/observation-gap", "medium", at(9 * H), at(9 * H + 600))
    assert gap["evidence"] == {"watch_state": ["prod-eu-1/ResourceClaim"]}
    # worded as the pack's coverage section words it: not a gap but the collector not running
    assert gap["message"] == ("collector not running: the collector stopped and did not observe ResourceClaim objects "
                              "of cluster prod-eu-1 for 600000 ms, still open (collector stopped: not watching)")


def test_a_device_published_by_two_generations_is_the_newest_generation_s_as_attribution_resolves_it(sessions):
    # The pool moved to generation 2 (GPU "N2") while a stale generation-1 slice, re-sent later,
    # still lists the device with another UUID: the facts took the record published last ("O1"),
    # attribution the highest generation — a sharing on "N2" could be missed by the policies.
    with sessions.begin() as s:
        h = History(s)
        h.device("node-g", "gpu-0", gpu_uuid("N2"), start_s=-H, generation=2)
        h.device("node-g", "gpu-0", gpu_uuid("O1"), start_s=-H / 2, generation=1)
        h.allocation("risk-inference", "fraud-g", "node-g", "gpu-0", 1 * H, 2 * H)
    [alloc] = [a for a in iter_allocations(_facts(sessions)) if a["claim"] == "fraud-g"]
    assert alloc["physical_gpu_uuid"] == gpu_uuid("N2")


def test_allocations_outside_the_period_or_cluster_are_not_evaluated(sessions, planted, bundle, regorus_engine):
    night = (at(12 * H), at(24 * H))
    assert _facts(sessions, night)["allocation_groups"] == []
    assert _facts(sessions, DAY, cluster="prod-us-2")["allocation_groups"] == []
    # the 3 h idle claim seen through a window that starts at 2 h: clipped to the period
    window = _facts(sessions, (at(2 * H), at(24 * H)))
    idle = window["idle_allocations"][0]
    assert (idle["idle_from_ns"], idle["from_ns"], idle["to_ns"]) == (at(H + 600), at(2 * H), at(4 * H))


def test_cli_eval_prints_findings_as_one_json_array(database_url, sessions, planted):
    args = ["policy", "eval", "--from", ns_to_rfc3339(DAY[0]), "--to", ns_to_rfc3339(DAY[1]),
            "--database-url", database_url, "--output", "json"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    findings = json.loads(out.output)
    assert Counter(f["rule"] for f in findings) == EXPECTED_RULES
    sharing = next(f for f in findings if f["rule"] == "isolation/cross-tenant-sharing")
    assert (sharing["from"], sharing["to"]) == ("2026-11-29T02:00:00Z", "2026-11-29T03:00:00Z")
    assert sharing["physical_gpu_uuid"] == gpu_uuid("C0") and sharing["severity"] == "high"
    assert set(sharing) >= {"rule", "severity", "kind", "subjects", "physical_gpu_uuid", "from", "to"}
    again = CliRunner().invoke(cli, args[:-2])
    assert again.exit_code == 0 and f"{len(findings)} findings (0 new)" in again.output
    assert all(f["seen_until"] is None for f in findings)  # every planted interval ended in the day
    # an interval still going on at the period's end is open there, "seen until" it, not ended then
    with sessions.begin() as s:
        History(s).allocation("risk-inference", "ghost-open", "node-z", "gpu-9", 20 * H, None)  # unknown device
    table = CliRunner().invoke(cli, args[:-2])
    assert table.exit_code == 0, table.output
    assert (f"inventory/unknown-device [{ns_to_rfc3339(at(20 * H))} .. open (seen until {ns_to_rfc3339(DAY[1])})]"
            in table.output)
    [ghost] = [f for f in json.loads(CliRunner().invoke(cli, args).output) if f["from"] == ns_to_rfc3339(at(20 * H))]
    assert (ghost["rule"], ghost["to"], ghost["seen_until"]) == ("inventory/unknown-device", None, ns_to_rfc3339(DAY[1]))


def test_a_handover_names_the_allocation_that_released_the_gpu_last(sessions):
    with sessions.begin() as s:
        h = History(s)
        # GPU P0: a long job outlives a short one that started after it; the next tenant follows the long job.
        h.device("node-p", "gpu-0", gpu_uuid("P0"))
        h.allocation("team-a", "long-job", "node-p", "gpu-0", 0, 10 * 60)
        h.allocation("team-b", "short-job", "node-p", "gpu-0", 2 * 60, 5 * 60)
        h.allocation("team-c", "next-job", "node-p", "gpu-0", 10 * 60 + 5, 20 * 60)
        # GPU Q0: a full-GPU allocation, then MIG partitions of it for two other tenants, one after the other.
        q0 = gpu_uuid("Q0")
        h.device("node-q", "gpu-0", q0)
        h.device("node-q", "gpu-0-mig-3g40gb-9-0", gpu_uuid("Q0-mig-0"), parent=q0, profile="3g.40gb")
        h.device("node-q", "gpu-0-mig-3g40gb-9-4", gpu_uuid("Q0-mig-4"), parent=q0, profile="3g.40gb")
        h.allocation("team-a", "full-job", "node-q", "gpu-0", 0, 60, device_class="gpu.nvidia.com")
        h.allocation("team-b", "slice-0-job", "node-q", "gpu-0-mig-3g40gb-9-0", 70, 600, device_class="mig.nvidia.com")
        h.allocation("team-c", "slice-4-job", "node-q", "gpu-0-mig-3g40gb-9-4", 605, 900, device_class="mig.nvidia.com")
    facts = _facts(sessions, (at(0), at(H)))
    gaps = {(x["from"]["claim"], x["to"]["claim"]): x["gap_ns"] // NS_PER_S for x in facts["handovers"]}
    # slice-4 follows full-job (its parent GPU), not slice-0 (another partition's memory)
    assert gaps == {("long-job", "next-job"): 5, ("full-job", "slice-0-job"): 10, ("full-job", "slice-4-job"): 545}
    pairs = {(o["a"]["claim"], o["b"]["claim"]) for o in facts["overlaps"]}
    assert pairs == {("long-job", "short-job")}


def _open_cross_tenant_sharing(s) -> None:
    # GPU S0: team-a from 08:00, team-b joins at 09:00; neither released when evaluated.
    h = History(s)
    h.device("node-s", "gpu-0", gpu_uuid("S0"))
    h.allocation("team-a", "scoring", "node-s", "gpu-0", 8 * H, None)
    h.allocation("team-b", "kyc", "node-s", "gpu-0", 9 * H, None)


def test_allocations_still_held_end_at_now_not_at_a_period_end_in_the_future(sessions, bundle, regorus_engine):
    # The scheduler evaluates the current UTC day every 5 minutes: the day's end is hours ahead.
    with sessions.begin() as s:
        _open_cross_tenant_sharing(s)
        History(s).watch("ResourceClaim", "synced", 1 * H)
    now = at(10 * H)
    facts = _facts(sessions, now_ns=now)
    assert {a["claim"]: a["to_ns"] for a in iter_allocations(facts)} == {"scoring": now, "kyc": now}
    [overlap] = facts["overlaps"]
    assert (overlap["from_ns"], overlap["to_ns"]) == (at(9 * H), now)
    result = evaluate_period(sessions, bundle, regorus_engine, *DAY, now_ns=now)
    [sharing] = [f for f in result.findings if f["rule"] == "isolation/cross-tenant-sharing"]
    assert (sharing["from_ns"], sharing["to_ns"]) == (at(9 * H), now)


def test_allocations_still_held_end_where_the_resourceclaim_watch_stopped(sessions, bundle, regorus_engine):
    # Nothing is known of the claims after the collector stopped (or lost the stream): a finding
    # must not state that the GPUs were still shared until "now".
    with sessions.begin() as s:
        _open_cross_tenant_sharing(s)
        History(s).watch("ResourceClaim", "stopped", 9 * H + 600)
        History(s).watch("Pod", "synced", 1 * H)
    facts = _facts(sessions, now_ns=at(12 * H))
    [overlap] = facts["overlaps"]
    assert (overlap["from_ns"], overlap["to_ns"]) == (at(9 * H), at(9 * H + 600))
    assert {a["claim"]: a["to_ns"] for a in iter_allocations(facts)} == {"scoring": at(9 * H + 600),
                                                                         "kyc": at(9 * H + 600)}
    result = evaluate_period(sessions, bundle, regorus_engine, *DAY, now_ns=at(12 * H))
    [sharing] = [f for f in result.findings if f["rule"] == "isolation/cross-tenant-sharing"]
    assert sharing["to_ns"] == at(9 * H + 600)


def test_a_manual_evaluation_of_a_one_cluster_store_restates_the_schedulers_findings(database_url, sessions, planted,
                                                                                      bundle, regorus_engine,
                                                                                      monkeypatch):
    # `draudit run` evaluates its own cluster; `draudit policy eval` without --cluster used to store
    # the same decisions under no cluster, so every pack listed each of them twice.
    from test_policy_support import CLUSTER
    monkeypatch.delenv("DRAUDIT_CLUSTER", raising=False)
    scheduled = evaluate_period(sessions, bundle, regorus_engine, *DAY, CLUSTER)
    args = ["policy", "eval", "--from", ns_to_rfc3339(DAY[0]), "--to", ns_to_rfc3339(DAY[1]), "--database-url", database_url]
    manual = CliRunner().invoke(cli, args)
    assert manual.exit_code == 0, manual.output
    assert f"{len(scheduled.findings)} findings (0 new)" in manual.output
    with sessions() as s:
        assert set(s.execute(select(Finding.cluster)).scalars()) == {CLUSTER}
    monkeypatch.setenv("DRAUDIT_CLUSTER", "prod-eu-2")  # as `draudit run` and `ingest` read it
    other = CliRunner().invoke(cli, args)
    # prod-eu-2 holds nothing: refused, naming it (an evaluation of nothing would count as coverage)
    assert other.exit_code == 2 and "no object of cluster prod-eu-2 was ever recorded" in other.output


def _stopped_with_unapproved_allocations_open(s) -> None:
    # The demo's story: claims from a DeviceClass the shipped bundle does not approve, still held
    # when the collector stopped at 09:10 and never came back.
    h = History(s)
    h.device("node-u", "gpu-0", gpu_uuid("U0"))
    h.device("node-u", "gpu-1", gpu_uuid("U1"))
    h.allocation("team-a", "scoring", "node-u", "gpu-0", 8 * H, None, device_class="a10g-shared-memory")
    h.allocation("team-a", "scoring-2", "node-u", "gpu-1", 9 * H, None, device_class="a10g-shared-memory",
                 consumers=[("scoring-2-pod", 9 * H + 60, None)])
    for kind in ("ResourceClaim", "ResourceSlice", "Pod", "DeviceClass"):
        h.watch(kind, "stopped", 9 * H + 600)


def test_a_period_after_the_collector_stopped_holds_no_allocation_and_no_empty_interval(sessions, bundle,
                                                                                        regorus_engine):
    # Newcomer finding: a window after the stop stored two HIGH unapproved-device-class findings over
    # [start, start] ("held physical GPU … from 08:48:00Z to 08:48:00Z (0 s)"): nobody observed the
    # allocations then. Only the stop itself is a fact of such a period.
    with sessions.begin() as s:
        _stopped_with_unapproved_allocations_open(s)
    after = (at(9 * H + 680), at(9 * H + 740))
    facts = _facts(sessions, after, now_ns=at(12 * H))
    assert (facts["allocation_groups"], facts["overlaps"], facts["idle_allocations"]) == ([], [], [])
    result = evaluate_period(sessions, bundle, regorus_engine, *after, now_ns=at(12 * H))
    assert {f["rule"] for f in result.findings} == {"coverage/observation-gap"}
    assert all(f["to_ns"] > f["from_ns"] for f in result.findings)
    # the same allocations in a period that saw them: real intervals, ending at the stop
    during = evaluate_period(sessions, bundle, regorus_engine, at(9 * H), at(10 * H), now_ns=at(12 * H))
    unapproved = [f for f in during.findings if f["rule"] == "inventory/unapproved-device-class"]
    assert sorted((f["from_ns"], f["to_ns"]) for f in unapproved) == [(at(9 * H), at(9 * H + 600))] * 2
    every = [f for f in during.findings + result.findings]
    assert all(f["to_ns"] > f["from_ns"] for f in every)


def test_facts_never_carry_an_empty_interval_whatever_the_period(sessions):
    with sessions.begin() as s:
        _stopped_with_unapproved_allocations_open(s)
    for start_s in (8 * H + 60, 9 * H + 599, 9 * H + 600, 9 * H + 601, 20 * H):
        facts = _facts(sessions, (at(start_s), at(start_s + H)), now_ns=at(23 * H))
        intervals = [(a["from_ns"], a["to_ns"]) for a in iter_allocations(facts)]
        intervals += [(o["from_ns"], o["to_ns"]) for o in facts["overlaps"]]
        intervals += [(i["from_ns"], i["to_ns"]) for i in facts["idle_allocations"]]
        intervals += [(g["from_ns"], g["to_ns"]) for g in facts["coverage_gaps"]]
        assert all(hi > lo for lo, hi in intervals), (start_s, intervals)
        assert bool(list(iter_allocations(facts))) == (start_s < 9 * H + 600)


def test_cli_eval_says_when_nothing_of_the_period_was_observed(database_url, sessions):
    with sessions.begin() as s:
        _stopped_with_unapproved_allocations_open(s)
    args = ["policy", "eval", "--from", ns_to_rfc3339(at(9 * H + 680)), "--to", ns_to_rfc3339(at(9 * H + 740)),
            "--database-url", database_url, "--cluster", "prod-eu-1"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert ("note: cluster prod-eu-1 was not observed in this period: its ResourceClaims were last observed at "
            "2026-11-29T09:10:00Z (the collector stopped or lost the watch stream); no allocation of it is evaluated"
            in res.stderr)
    assert "inventory/unapproved-device-class" not in res.stdout
    observed = CliRunner().invoke(cli, args[:2] + ["--from", ns_to_rfc3339(at(9 * H)), "--to",
                                                   ns_to_rfc3339(at(10 * H))] + args[6:])
    assert observed.exit_code == 0 and "not observed" not in observed.stderr
    assert observed.stdout.count("inventory/unapproved-device-class") == 2


def test_cli_eval_refuses_a_period_that_has_not_ended(database_url, sessions, planted):
    # as `draudit report` does: an evaluation of hours still to come would state them as observed
    args = ["policy", "eval", "--from", "2099-01-01", "--to", "2099-01-02", "--database-url", database_url]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2
    assert "--to 2099-01-02T00:00:00Z is in the future (now " in res.output
    assert "an evaluation covers a period that has ended; give --to " in res.output
    with sessions() as s:
        assert s.execute(select(func.count()).select_from(Finding)).scalar_one() == 0


def test_cli_eval_refuses_a_cluster_never_recorded(database_url, sessions, planted):
    args = ["policy", "eval", "--from", ns_to_rfc3339(DAY[0]), "--to", ns_to_rfc3339(DAY[1]), "--cluster", "nope",
            "--database-url", database_url]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2
    assert ("draudit: error: no object of cluster nope was ever recorded in this store (known clusters: prod-eu-1)"
            in res.stderr)
    assert "findings" not in res.stdout
    known = CliRunner().invoke(cli, args[:-4] + ["--cluster", "prod-eu-1", "--database-url", database_url])
    assert known.exit_code == 0 and "warning" not in known.stderr


def test_overlapping_windows_state_one_gap_per_kind_whose_message_matches_its_interval(sessions, bundle,
                                                                                        regorus_engine):
    # Newcomer finding: two overlapping evaluations stored 8 observation-gap findings for 4 kinds, each
    # clipped to its window while its message gave the whole duration ("for 138970 ms" on a 60 s interval).
    from collector.policy.findings import latest_per_identity
    from reports.finding_scope import scoped_findings
    from reports.populations import Scope

    with sessions.begin() as s:
        _stopped_with_unapproved_allocations_open(s)
        History(s).gap("Pod", 2 * H, 2 * H + 600)
    now = at(12 * H)
    first = evaluate_period(sessions, bundle, regorus_engine, at(H), at(9 * H + 700), now_ns=now)
    second = evaluate_period(sessions, bundle, regorus_engine, at(2 * H + 300), at(9 * H + 900), now_ns=now)
    gaps = [f for f in first.findings + second.findings if f["rule"] == "coverage/observation-gap"]
    assert len(gaps) == 10  # the 4 stopped kinds and the Pod gap, stated by each evaluation
    for f in gaps:
        [ms] = re.findall(r"for (\d+) ms", f["message"])
        assert int(ms) == (f["to_ns"] - f["from_ns"]) // 1_000_000, f
    with sessions() as s:
        rows = [dict(r) for r in s.execute(select(Finding.__table__).where(Finding.rule == "coverage/observation-gap"))
                .mappings()]
        pack = scoped_findings(s, Scope(at(0), at(24 * H)))
    kept = latest_per_identity(rows)
    assert sorted((f["subjects"]["kinds"][0], f["from_ns"]) for f in kept) == [
        ("DeviceClass", at(9 * H + 600)), ("Pod", at(2 * H)), ("Pod", at(9 * H + 600)),
        ("ResourceClaim", at(9 * H + 600)), ("ResourceSlice", at(9 * H + 600))]
    # the stop seen through the later window: its longer observed extent is the one kept
    assert {f["to_ns"] for f in kept if f["from_ns"] == at(9 * H + 600)} == {at(9 * H + 900)}
    assert len([f for f in pack.findings if f["rule"] == "coverage/observation-gap"]) == 5
