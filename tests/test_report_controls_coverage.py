"""Control statuses when the period was not observed at all (0 % synced: the collector did not run in
it): the controls resting on observation are "not evidenced" for that period, not "partially
evidenced"; a partly observed period still lowers them to "partially evidenced"."""

from __future__ import annotations

import json
from datetime import timedelta

from reports.controls import CONTROLS, COVERAGE_COMPLETE, EVIDENCED, NOT, PARTIAL, PackFacts, controls_document
from reports.render import PackRequest, render_pack
from tests.test_report import CLUSTER, PERIOD_TO, bundle, fill_store, stop_collector  # noqa: F401 (fixture)

COUNTS = {"inventory": 4, "allocation_episodes": 6, "consumer_intervals": 6, "transaction_lineage": 3000,
          "findings": 3, "coverage": 8, "sharing": 1, "changes": 2}
MONITORING = "DORA (EU) 2022/2554 Art. 9(1)"
ASSETS = "DORA (EU) 2022/2554 Art. 8(4)"  # inventory and lineage: no observation need
OBSERVED = {f"{c['regulation']} {c['article']}" for c in CONTROLS if c["status"] != NOT and COVERAGE_COMPLETE in c["needs"]}


def _by_id(facts: PackFacts) -> dict[str, dict]:
    return {c["id"]: c for c in controls_document(facts)["controls"]}


def test_a_period_with_nothing_synced_leaves_observation_controls_not_evidenced():
    by_id = _by_id(PackFacts(True, COUNTS, (0.0, "bank-eu-inference-1", "DeviceClass"), bundles=1))
    missing = ("observation coverage is missing: DeviceClass in bank-eu-inference-1 was not synced at any time in "
               "the period (section 2)")
    assert OBSERVED and all(by_id[i]["status"] == NOT and missing in by_id[i]["status_reasons"] for i in OBSERVED)
    assert (by_id[ASSETS]["status"], by_id[ASSETS]["status_reasons"]) == (EVIDENCED, [])
    # The caller says so explicitly: same statuses.
    assert _by_id(PackFacts(True, COUNTS, (0.0, "bank-eu-inference-1", "DeviceClass"), 1, observed=False)) == by_id


def test_one_unobserved_cluster_of_an_observed_pack_is_partial_and_a_partial_share_too():
    # Two clusters, one never watched in the period, the other synced: the caller says something was observed.
    facts = PackFacts(True, COUNTS, (0.0, "bank-eu-inference-2", "ResourceClaim"), bundles=1, observed=True)
    monitoring = _by_id(facts)[MONITORING]
    assert (monitoring["status"], monitoring["status_reasons"]) == (PARTIAL, [
        "observation coverage is missing: ResourceClaim in bank-eu-inference-2 was not synced at any time in the "
        "period (section 2)"])
    monitoring = _by_id(PackFacts(True, COUNTS, (0.5, "bank-eu-inference-1", "Pod"), bundles=1))[MONITORING]
    assert (monitoring["status"], monitoring["status_reasons"]) == (PARTIAL, [
        "observation coverage is partial: Pod in bank-eu-inference-1 synced for 50.0 % of the period (section 2)"])
    # the other partly synced kinds are counted (newcomer: the note named only one of four)
    monitoring = _by_id(PackFacts(True, COUNTS, (0.5, "bank-eu-inference-1", "Pod"), bundles=1, partial_kinds=4))[MONITORING]
    assert monitoring["status_reasons"] == [
        "observation coverage is partial: Pod in bank-eu-inference-1 synced for 50.0 % of the period; the lowest of "
        "4 partly synced cluster/kinds (section 2)"]
    # a gap of 30 s in a day, and 30 s synced in a day: never "100.0 %" nor "0.0 %"
    for share, text in ((1 - 30 / 86_400, "> 99.9 %"), (30 / 86_400, "< 0.1 %")):
        monitoring = _by_id(PackFacts(True, COUNTS, (share, "bank-eu-inference-1", "Pod"), bundles=1))[MONITORING]
        assert (monitoring["status"], monitoring["status_reasons"]) == (PARTIAL, [
            f"observation coverage is partial: Pod in bank-eu-inference-1 synced for {text} of the period (section 2)"])


def test_a_pack_for_a_period_after_the_collector_stopped_does_not_call_controls_partially_evidenced(
        sessions, tmp_path, bundle):
    fill_store(sessions)
    stop_collector(sessions, 20)  # it stopped at 20:00 and never came back: the next 6 hours were not watched
    pack = render_pack(sessions, PackRequest(PERIOD_TO, PERIOD_TO + timedelta(hours=6), (CLUSTER,)), tmp_path / "later",
                       policy_bundle=bundle, pdf=False, record=False)
    by_id = {c["id"]: c for c in json.loads((pack.path / "controls.json").read_text())["controls"]}
    monitoring = by_id[MONITORING]
    assert (monitoring["status"], monitoring["ceiling"]) == (NOT, EVIDENCED)
    assert any("was not synced at any time in the period" in r for r in monitoring["status_reasons"])
    assert not [i for i in OBSERVED if by_id[i]["status"] != NOT]


def test_a_pack_over_a_watched_cluster_and_one_never_watched_is_partial_not_unevidenced(sessions, tmp_path, bundle):
    # The renderer says what was observed: one cluster synced the whole period, the other never.
    from tests.test_report import PERIOD_FROM
    fill_store(sessions)
    pack = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER, "bank-eu-inference-2")), tmp_path / "two",
                       policy_bundle=bundle, pdf=False, record=False)
    monitoring = {c["id"]: c for c in json.loads((pack.path / "controls.json").read_text())["controls"]}[MONITORING]
    assert monitoring["status"] == PARTIAL
    assert any("bank-eu-inference-2 was not synced at any time in the period" in r for r in monitoring["status_reasons"])


def test_the_pack_knows_the_kinds_the_watcher_records():
    from collector.kube.discovery import watched_kinds
    from reports.populations import WATCHED_KINDS
    assert set(WATCHED_KINDS) == {k.kind for k in watched_kinds("v1")}


def test_a_period_evaluated_without_findings_is_stated_as_checked(sessions, tmp_path, bundle):
    # The compliant case: a bundle ran over the period and found nothing. The pack names the bundle
    # and the policy controls rest on that evaluation instead of saying nothing was checked.
    from collector.policy.bundle import load_bundle
    from collector.policy.findings import record_evaluation
    from collector.timeutil import dt_to_ns, utcnow
    fill_store(sessions)
    from pathlib import Path
    loaded = load_bundle(Path(__file__).resolve().parent.parent / "policies")
    with sessions.begin() as s:
        record_evaluation(s, loaded, "regorus", CLUSTER, dt_to_ns(PERIOD_TO), dt_to_ns(PERIOD_TO + timedelta(hours=1)),
                          utcnow(), 0)
    later = (PERIOD_TO, PERIOD_TO + timedelta(hours=1))
    pack = render_pack(sessions, PackRequest(*later, (CLUSTER,)), tmp_path / "clean", policy_bundle=bundle, pdf=False,
                       record=False)
    html = (pack.path / "index.html").read_text()
    assert loaded.revision in html.split("Policy bundles evaluated over the period")[1]
    by_id = {c["id"]: c for c in json.loads((pack.path / "controls.json").read_text())["controls"]}
    policies = by_id["NIS2 (EU) 2022/2555 Art. 21(2)(a)"]
    assert not any("no policy bundle was evaluated" in r for r in policies["status_reasons"])
    assert json.loads((pack.path / "data" / "findings.json").read_text())["data"] == []
    # and a period nobody evaluated still says so
    unchecked = render_pack(sessions, PackRequest(PERIOD_TO + timedelta(hours=2), PERIOD_TO + timedelta(hours=3),
                                                  (CLUSTER,)), tmp_path / "unchecked", policy_bundle=bundle,
                            pdf=False, record=False)
    by_id = {c["id"]: c for c in json.loads((unchecked.path / "controls.json").read_text())["controls"]}
    assert by_id["NIS2 (EU) 2022/2555 Art. 21(2)(a)"]["status"] == NOT
