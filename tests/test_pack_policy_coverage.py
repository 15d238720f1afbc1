"""Policy evaluation coverage in evidence packs: a period only partly evaluated by the policies is
stated as "partially evaluated" with the stretches no evaluation covered, in data/policy_coverage.*,
the manifest, the HTML and the control statuses; a cluster no evaluation covered is "not
evaluated". Store tests (SQLite and PostgreSQL) on ``tests.test_report``'s store: watched from
2026-11-28 00:00 on without a stop, its own findings evaluated over 2026-11-28 only."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from types import SimpleNamespace

from collector.policy.findings import record_evaluation
from collector.store.models import PolicyEvaluation
from reports.controls import EVIDENCED, NOT, PARTIAL, PolicyCoverage, PackFacts, controls_document
from reports.manifest import verdict
from reports.policy_coverage import complement, spans, union_clipped
from reports.render import PackRequest, render_pack
from reports.verify import verify_pack
from tests.pack_data import records
from tests.test_report import CLUSTER, PERIOD_FROM, PERIOD_TO, at, bundle, fill_store, key, ns  # noqa: F401 (fixtures)

POLICIES = "NIS2 (EU) 2022/2555 Art. 21(2)(a)"  # evidenced by a policy evaluation alone
ISOLATION = "DORA (EU) 2022/2554 Art. 9(4)(b)"  # sharing and findings
OLD = SimpleNamespace(revision="2026.11.2", digest="a1" * 32)
NEW = SimpleNamespace(revision="2026.11.3", digest="b2" * 32)
DAY2 = (PERIOD_TO, PERIOD_TO + timedelta(days=1))  # 2026-11-29: observed, not evaluated by fill_store's findings


def evaluate(sessions, cluster, hours_from, hours_to, evaluated_hours=50.0, bundle_=OLD) -> None:
    """Store an evaluation over [hours_from, hours_to) (hours from 2026-11-28 00:00 UTC), as
    ``draudit policy eval`` or the scheduler records one, run at ``evaluated_hours``."""
    with sessions.begin() as s:
        record_evaluation(s, bundle_, "regorus", cluster, ns(hours_from), ns(hours_to), at(evaluated_hours), 0)


def render(sessions, tmp_path, name, period=DAY2, clusters=(CLUSTER,), bundle_dir=None, sign_key=None):
    return render_pack(sessions, PackRequest(*period, clusters), tmp_path / name, policy_bundle=bundle_dir,
                       sign_key=sign_key, pdf=False, record=False)


def coverage(pack) -> list[dict]:
    return records(pack.path / "data" / "policy_coverage.json")


def controls(pack) -> dict[str, dict]:
    return {c["id"]: c for c in json.loads((pack.path / "controls.json").read_text())["controls"]}


def text(pack) -> str:
    """index.html as text: tags removed, whitespace collapsed."""
    html = (pack.path / "index.html").read_text()
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def section(pack, name: str) -> str:
    """One ``<section id=name>`` of index.html as text (``text``)."""
    html = (pack.path / "index.html").read_text()
    html = html[html.index(f'<section id="{name}">'):]
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html[:html.index("</section>")]))


def overall(rows: list[dict], cluster=CLUSTER) -> dict:
    [row] = [r for r in rows if r["overall"] and r["cluster"] == cluster]
    return row


def test_union_and_complement_of_half_open_stretches():
    assert union_clipped([(5, 8), (0, 3), (3, 4), (7, 12), (20, 30)], 1, 25) == [(1, 4), (5, 12), (20, 25)]
    assert complement([(1, 4), (5, 12), (20, 25)], 0, 25) == [(0, 1), (4, 5), (12, 20)]
    assert union_clipped([(0, 5)], 5, 10) == [] and complement([], 5, 10) == [(5, 10)]


def test_an_evaluation_stamped_in_nanoseconds_is_compared_in_whole_microseconds():
    # the demo evaluates from the watcher's first sync (ns); a pack period is a datetime (µs)
    [span] = spans([{"cluster": CLUSTER, "bundle_revision": "r", "bundle_digest": "d", "period_from_ns": 1_000_639,
                     "period_to_ns": 9_000_001, "evaluated_at_ns": 20_000_000}])
    assert (span.from_ns, span.to_ns) == (1_000_000, 9_001_000)
    [cut] = spans([{"cluster": None, "bundle_revision": "r", "bundle_digest": "d", "period_from_ns": 0,
                    "period_to_ns": 9_000_000, "evaluated_at_ns": 4_000_000}])  # ran before its period ended
    assert (cut.from_ns, cut.to_ns) == (0, 4_000_000)


def test_a_fully_evaluated_period_is_not_called_partial(sessions, tmp_path, bundle, key):
    fill_store(sessions)  # its findings were evaluated over [2026-11-28, 2026-11-29) at 02:00 and 03:00 the next day
    pack = render(sessions, tmp_path, "full", (PERIOD_FROM, PERIOD_TO), bundle_dir=bundle, sign_key=key)
    rows = coverage(pack)
    assert [(r["cluster"], r["overall"], r["bundle_revision"], r["status"], r["evaluated_share"], r["evaluations"],
             r["evaluated"], r["not_evaluated"]) for r in rows] == [
        (CLUSTER, True, None, "evaluated", 1.0, 2, [["2026-11-28T00:00:00Z", "2026-11-29T00:00:00Z"]], []),
        (CLUSTER, False, "2026.11.2", "evaluated", 1.0, 2, [["2026-11-28T00:00:00Z", "2026-11-29T00:00:00Z"]], [])]
    html = text(pack)
    # no statement of partial evaluation (the rule and the table's header name the term, as a definition)
    for partial in ("partially evaluated:", "Partially evaluated:", "the period was partially evaluated",
                    "in the stretches evaluated", "not evaluated at any time", "not evaluated ["):
        assert partial not in html, partial
    assert "prod-eu-1 any bundle : evaluated 2 100.0 % —" in html
    assert "Policy evaluation coverage: the whole period was evaluated (section 8)." in html
    # that day had a watch gap: the policy controls are lowered for it, never for the evaluation
    assert controls(pack)[POLICIES]["status_reasons"] == [
        "observation coverage is partial: ResourceClaim in prod-eu-1 synced for 99.7 % of the period (section 2)"]
    manifest = json.loads((pack.path / "manifest.json").read_text())
    assert manifest["policy_coverage"]["clusters"] == [
        {"cluster": CLUSTER, "status": "evaluated", "evaluated_share": 1.0, "evaluations": 2, "not_evaluated": []}]
    assert "data/policy_coverage.csv" in {f["path"] for f in manifest["files"]}
    assert "data/policy_coverage.json" in {f["path"] for f in manifest["files"]}
    assert verdict(verify_pack(pack.path, key.public_key()))


def test_a_gap_between_two_evaluations_is_stated_with_its_stretch_and_share(sessions, tmp_path, bundle, key):
    fill_store(sessions)
    evaluate(sessions, CLUSTER, 24, 30, bundle_=OLD)  # 2026-11-29 00:00-06:00 by the old revision
    evaluate(sessions, CLUSTER, 36, 48, bundle_=NEW)  # 12:00-24:00 by the new one: nothing evaluated 06:00-12:00
    pack = render(sessions, tmp_path, "gap", bundle_dir=bundle, sign_key=key)
    rows = coverage(pack)
    gap = [["2026-11-29T06:00:00Z", "2026-11-29T12:00:00Z"]]
    assert [(r["overall"], r["bundle_revision"], r["status"], r["evaluated_share"], r["evaluated_s"],
             r["not_evaluated_s"], r["evaluations"], r["not_evaluated"]) for r in rows] == [
        (True, None, "partially evaluated", 0.75, 64800.0, 21600.0, 2, gap),
        (False, "2026.11.2", "partially evaluated", 0.25, 21600.0, 64800.0, 1,
         [["2026-11-29T06:00:00Z", "2026-11-30T00:00:00Z"]]),
        (False, "2026.11.3", "partially evaluated", 0.5, 43200.0, 43200.0, 1,
         [["2026-11-29T00:00:00Z", "2026-11-29T12:00:00Z"]])]
    assert overall(rows)["evaluated"] == [["2026-11-29T00:00:00Z", "2026-11-29T06:00:00Z"],
                                          ["2026-11-29T12:00:00Z", "2026-11-30T00:00:00Z"]]
    assert overall(rows)["not_evaluated_ns"] == [[ns(30), ns(36)]]
    assert {r["bundle_digest"] for r in rows} == {None, OLD.digest, NEW.digest}
    # the CSV holds the same row
    csv_lines = (pack.path / "data" / "policy_coverage.csv").read_text().splitlines()
    assert csv_lines[1].startswith(f"{CLUSTER},true,,,partially evaluated,0.75,64800.0,21600.0,2,")
    # the HTML: cover, findings section and the coverage table in section 8
    html = text(pack)
    stated = ("partially evaluated: cluster prod-eu-1 was evaluated for 75.0 % of the period, not evaluated "
              "[2026-11-29T06:00:00Z, 2026-11-29T12:00:00Z) — see section 8")
    assert stated in html
    findings = section(pack, "findings")
    assert ("Partially evaluated: cluster prod-eu-1 was evaluated for 75.0 % of the period, not evaluated "
            "[2026-11-29T06:00:00Z, 2026-11-29T12:00:00Z).") in findings
    assert "No findings in the stretches evaluated." in findings and "No findings for the period." not in findings
    table = section(pack, "changes")
    assert ("prod-eu-1 any bundle : partially evaluated 2 75.0 % [2026-11-29T06:00:00Z, 2026-11-29T12:00:00Z)"
            in table)
    # the controls resting on policy findings are not evidenced in full, and say why
    reason = ("policy evaluation is partial: the period was partially evaluated, cluster prod-eu-1 for 75.0 % of the "
              "period; not evaluated: [2026-11-29T06:00:00Z, 2026-11-29T12:00:00Z) — findings, or their absence, say "
              "nothing about those stretches (section 8, data/policy_coverage.csv)")
    by_id = controls(pack)
    assert (by_id[POLICIES]["status"], by_id[POLICIES]["status_reasons"]) == (PARTIAL, [reason])
    assert by_id[ISOLATION]["status"] == PARTIAL and reason in by_id[ISOLATION]["status_reasons"]
    assert not [c for c in by_id.values() if c["status"] == EVIDENCED and reason in c["status_reasons"]]
    manifest = json.loads((pack.path / "manifest.json").read_text())
    assert manifest["policy_coverage"]["clusters"] == [
        {"cluster": CLUSTER, "status": "partially evaluated", "evaluated_share": 0.75, "evaluations": 2,
         "not_evaluated": gap}]
    assert verdict(verify_pack(pack.path, key.public_key()))


def test_an_evaluation_of_another_cluster_leaves_the_scoped_cluster_not_evaluated(sessions, tmp_path, bundle):
    fill_store(sessions)
    evaluate(sessions, "prod-us-2", 24, 48)
    pack = render(sessions, tmp_path, "other", bundle_dir=bundle)
    assert [(r["cluster"], r["overall"], r["status"], r["evaluated_share"], r["evaluations"], r["evaluated"],
             r["not_evaluated"]) for r in coverage(pack)] == [
        (CLUSTER, True, "not evaluated", 0.0, 0, [], [["2026-11-29T00:00:00Z", "2026-11-30T00:00:00Z"]])]
    html = text(pack)
    assert "No findings because no policy bundle was evaluated over the period" in html
    assert "none stated: no policy bundle was evaluated over the period — not evaluated" in html
    assert "partially evaluated:" not in html and "the period was partially evaluated" not in html
    assert "prod-eu-1 any bundle : not evaluated 0 0.0 % [2026-11-29T00:00:00Z, 2026-11-30T00:00:00Z)" in html
    by_id = controls(pack)
    assert by_id[POLICIES]["status"] == NOT
    assert by_id[POLICIES]["status_reasons"] == [
        "no policy bundle was evaluated over the period (no evaluation recorded): nothing was checked against the "
        "policies"]
    # a pack over both clusters: one evaluated, the other not at all: partially evidenced, naming the cluster
    both = render(sessions, tmp_path, "both", clusters=(CLUSTER, "prod-us-2"), bundle_dir=bundle)
    assert [(r["cluster"], r["status"], r["evaluated_share"]) for r in coverage(both) if r["overall"]] == [
        (CLUSTER, "not evaluated", 0.0), ("prod-us-2", "evaluated", 1.0)]
    # (prod-us-2 was never watched: its observation is missing too)
    assert (controls(both)[POLICIES]["status"], controls(both)[POLICIES]["status_reasons"]) == (PARTIAL, [
        "policy evaluation is missing: no policy bundle evaluated cluster prod-eu-1 at any time in the period, so "
        "nothing there was checked against the policies (section 8, data/policy_coverage.csv)",
        "observation coverage is missing: DeviceClass in prod-us-2 was not synced at any time in the period "
        "(section 2)"])
    assert "cluster prod-eu-1 was not evaluated at any time in the period" in text(both)
    from collector.cli.report import _pack_warnings

    assert _pack_warnings(both) == [
        "policy evaluations covered only part of the period: cluster prod-eu-1 not at all, not evaluated "
        "[2026-11-29T00:00:00Z, 2026-11-30T00:00:00Z) (section 8, data/policy_coverage.csv); run `draudit policy eval "
        "--from … --to …` over those stretches — with the bundle that evaluated the rest (`--bundle DIR`; its "
        "revision is in section 8) — and render the pack again"]


def test_an_evaluation_beyond_the_period_is_clipped_and_one_cannot_cover_time_after_it_ran(sessions, tmp_path,
                                                                                          bundle):
    fill_store(sessions)
    evaluate(sessions, CLUSTER, 12, 60, evaluated_hours=70)  # 2026-11-28 12:00 to 2026-11-30 12:00
    rows = coverage(render(sessions, tmp_path, "beyond", bundle_dir=bundle))
    assert [(r["overall"], r["status"], r["evaluated_share"], r["evaluations"], r["evaluated"], r["evaluated_ns"],
             r["not_evaluated"]) for r in rows] == [
        (True, "evaluated", 1.0, 1, [["2026-11-29T00:00:00Z", "2026-11-30T00:00:00Z"]], [[ns(24), ns(48)]], []),
        (False, "evaluated", 1.0, 1, [["2026-11-29T00:00:00Z", "2026-11-30T00:00:00Z"]], [[ns(24), ns(48)]], [])]
    # the scheduler's evaluation of a running day: its period is the whole day, it ran at 06:00 and
    # decided nothing later; a stored row cannot claim the rest (a later run never came)
    with sessions.begin() as s:
        s.query(PolicyEvaluation).delete()
    evaluate(sessions, CLUSTER, 24, 48, evaluated_hours=30)
    rows = coverage(render(sessions, tmp_path, "running-day", bundle_dir=bundle))
    assert [(r["status"], r["evaluated_share"], r["evaluated"], r["not_evaluated"]) for r in rows if r["overall"]] == [
        ("partially evaluated", 0.25, [["2026-11-29T00:00:00Z", "2026-11-29T06:00:00Z"]],
         [["2026-11-29T06:00:00Z", "2026-11-30T00:00:00Z"]])]


def test_control_wording_without_a_store():
    counts = {"inventory": 4, "allocation_episodes": 6, "consumer_intervals": 6, "transaction_lineage": 30,
              "findings": 0, "coverage": 8, "sharing": 1, "changes": 2}
    synced = (1.0, CLUSTER, "Pod")
    many = tuple((f"2026-11-29T0{i}:00:00Z", f"2026-11-29T0{i}:30:00Z") for i in range(5))
    facts = PackFacts(True, counts, synced, bundles=1,
                      policy=PolicyCoverage(1 - 30 / 86_400, CLUSTER, many, more=3, partial=2))
    policies = {c["id"]: c for c in controls_document(facts)["controls"]}[POLICIES]
    assert (policies["status"], policies["status_reasons"]) == (PARTIAL, [
        "policy evaluation is partial: the period was partially evaluated, cluster prod-eu-1 for > 99.9 % of the "
        "period; not evaluated: [2026-11-29T00:00:00Z, 2026-11-29T00:30:00Z), [2026-11-29T01:00:00Z, "
        "2026-11-29T01:30:00Z), [2026-11-29T02:00:00Z, 2026-11-29T02:30:00Z), [2026-11-29T03:00:00Z, "
        "2026-11-29T03:30:00Z), [2026-11-29T04:00:00Z, 2026-11-29T04:30:00Z) and 3 more — findings, or their "
        "absence, say nothing about those stretches; the lowest of 2 partly evaluated clusters (section 8, "
        "data/policy_coverage.csv)"])
    # nothing computed (an older caller): the bundle count alone decides, as before
    assert {c["id"]: c for c in controls_document(PackFacts(True, counts, synced, bundles=1))["controls"]}[
        POLICIES]["status"] == EVIDENCED


def test_the_report_command_warns_when_the_policies_covered_part_of_the_period(sessions, tmp_path, bundle):
    from collector.cli.report import _pack_warnings

    fill_store(sessions)
    evaluate(sessions, CLUSTER, 24, 30)
    evaluate(sessions, CLUSTER, 36, 48)
    pack = render(sessions, tmp_path, "gap", bundle_dir=bundle)
    assert _pack_warnings(pack) == [
        "policy evaluations covered only part of the period: cluster prod-eu-1 75.0 % of it, not evaluated "
        "[2026-11-29T06:00:00Z, 2026-11-29T12:00:00Z) (section 8, data/policy_coverage.csv); run `draudit policy eval "
        "--from … --to …` over those stretches — with the bundle that evaluated the rest (`--bundle DIR`; its "
        "revision is in section 8) — and render the pack again"]
    evaluate(sessions, CLUSTER, 30, 36)  # the stretch evaluated: nothing to warn about
    assert _pack_warnings(render(sessions, tmp_path, "whole", bundle_dir=bundle)) == []


def test_the_report_command_warns_when_nothing_of_the_period_was_observed(sessions, tmp_path, bundle):
    """An auditor-breaker's finding: a pack of a period the collector never observed (a typo'd year)
    exited 0 with nothing on stderr; only its cover said so."""
    from collector.cli.report import _pack_warnings

    fill_store(sessions)
    year_before = (PERIOD_FROM - timedelta(days=365), PERIOD_TO - timedelta(days=365))
    pack = render(sessions, tmp_path, "year-before", period=year_before, bundle_dir=bundle)
    assert pack.observed is False
    assert _pack_warnings(pack) == [
        "the collector observed no part of the period (no watch coverage recorded in it): the pack evidences nothing "
        "for it (its cover says so) — check --from/--to and --cluster against when `draudit run` or `draudit watch` "
        "recorded the cluster"]
    assert not any("observed no part" in w for w in _pack_warnings(render(sessions, tmp_path, "day2", bundle_dir=bundle)))
