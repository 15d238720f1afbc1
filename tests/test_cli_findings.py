"""``draudit findings``: the findings ``draudit policy eval`` stored over a planted history
(tests/test_policy_support.py), listed one per incident, filtered, as a table or JSON; on SQLite and
PostgreSQL (the ``database_url`` fixture)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from collector.cli import cli
from collector.policy.bundle import load_bundle
from collector.store.db import make_engine
from collector.store.models import Finding
from test_policy_support import DAY, EXPECTED_RULES, H, History, at, gpu_uuid, plant_history
from collector.timeutil import ns_to_rfc3339

BUNDLE = load_bundle(Path(__file__).resolve().parent.parent / "policies")
US = "prod-us-2"  # a second cluster: one allocation of a device no ResourceSlice publishes
KEYS = ["rule", "severity", "kind", "cluster", "subjects", "physical_gpu_uuid", "from", "to", "seen_until",
        "whole_period", "message", "bundle_revision", "bundle_digest", "last_evaluated_at", "finding_key"]
EVALUATED_AT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


def _run(*args: str):
    return CliRunner().invoke(cli, list(args))


def _eval(url: str, cluster: str, frm: int = DAY[0], to: int = DAY[1]) -> None:
    res = _run("policy", "eval", "--from", ns_to_rfc3339(frm), "--to", ns_to_rfc3339(to), "--cluster", cluster,
               "--database-url", url)
    assert res.exit_code == 0, res.output


def _list(url: str, *args: str) -> list[dict]:
    res = _run("findings", "--database-url", url, "--output", "json", *args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.fixture
def store(database_url, sessions, monkeypatch):
    """prod-eu-1's planted day and prod-us-2's unknown device, each evaluated over the day by `policy eval`."""
    monkeypatch.delenv("DRAUDIT_CLUSTER", raising=False)
    with sessions.begin() as s:
        plant_history(s)
        us = History(s, cluster=US)
        us.watch("ResourceClaim", "synced", -H)
        us.watch("ResourceSlice", "synced", -H)
        us.device("node-y", "gpu-0", gpu_uuid("Y0"))
        us.allocation("risk-inference", "ghost-us", "node-y", "gpu-9", 4 * H, 5 * H)
    _eval(database_url, "prod-eu-1")
    _eval(database_url, US)
    return database_url


def test_findings_of_a_real_evaluation_are_listed_newest_first_with_exact_json_keys(store):
    rows = _list(store)
    assert all(list(r) == KEYS for r in rows)
    eu = [r for r in rows if r["cluster"] == "prod-eu-1"]
    assert len(eu) == sum(EXPECTED_RULES.values()) == 13
    assert [r["rule"] for r in rows if r["cluster"] == US] == ["inventory/unknown-device"]
    starts = [r["from"] for r in rows]
    assert starts == sorted(starts, reverse=True) and starts[0] == "2026-11-29T10:00:00Z"  # the watch gap
    [sharing] = [r for r in rows if r["rule"] == "isolation/cross-tenant-sharing"]
    assert {k: v for k, v in sharing.items() if k not in ("message", "last_evaluated_at", "finding_key", "subjects")} == {
        "rule": "isolation/cross-tenant-sharing", "severity": "high", "kind": "violation", "cluster": "prod-eu-1",
        "physical_gpu_uuid": gpu_uuid("C0"), "from": "2026-11-29T02:00:00Z", "to": "2026-11-29T03:00:00Z",
        "seen_until": None, "whole_period": False, "bundle_revision": BUNDLE.revision, "bundle_digest": BUNDLE.digest}
    assert sharing["subjects"]["tenants"] == ["marketing", "risk-inference"]
    assert sharing["message"].startswith("tenants risk-inference and marketing shared physical GPU " + gpu_uuid("C0"))
    assert EVALUATED_AT.match(sharing["last_evaluated_at"]) and re.fullmatch(r"[0-9a-f]{64}", sharing["finding_key"])
    [ghost] = [r for r in rows if r["cluster"] == US]
    assert (ghost["subjects"]["devices"], ghost["from"], ghost["to"]) == (
        ["gpu.nvidia.com/node-y/gpu-9"], "2026-11-29T04:00:00Z", "2026-11-29T05:00:00Z")


def test_the_table_shows_each_finding_and_exits_0(store):
    res = _run("findings", "--database-url", store, "--rule", "isolation/cross-tenant-sharing")
    assert res.exit_code == 0 and res.stderr == ""
    lines = res.stdout.splitlines()
    assert lines[0] == ("2026-11-29T02:00:00Z .. 2026-11-29T03:00:00Z  HIGH violation  isolation/cross-tenant-sharing"
                        "  cluster prod-eu-1")
    assert lines[1] == ("  subjects: claims=marketing/recs-share,risk-inference/fraud-share; "
                        "devices=gpu.nvidia.com/node-c/gpu-0; tenants=marketing,risk-inference")
    assert lines[2] == f"  gpu:      {gpu_uuid('C0')}"
    assert lines[4].startswith(f"  bundle:   {BUNDLE.revision} sha256:{BUNDLE.digest[:12]}, last evaluated 20")
    assert lines[-1] == "1 finding"
    limited = _run("findings", "--database-url", store, "--limit", "2")
    assert limited.exit_code == 0 and limited.stdout.splitlines()[-1] == (
        "(2 of 14 shown, the newest; --limit shows more)")
    assert limited.stdout.count(" .. ") == 2 and "coverage/observation-gap" in limited.stdout  # 10:00, the newest


def test_time_filters_select_findings_whose_interval_overlaps_the_half_open_period(store):
    # the ResourceClaim watch gap is [10:00, 10:05); the attribution ratio covers the evaluated day
    before = _list(store, "--from", "2026-11-29T09:00:00Z", "--to", "2026-11-29T10:00:00Z")
    assert [(r["rule"], r["from"], r["to"]) for r in before] == [
        ("attribution/exact-ratio", "2026-11-29T00:00:00Z", "2026-11-30T00:00:00Z")]
    during = _list(store, "--from", "2026-11-29T10:04:59Z", "--to", "2026-11-29T12:00:00Z")
    assert [r["rule"] for r in during] == ["coverage/observation-gap", "attribution/exact-ratio"]
    after = _list(store, "--from", "2026-11-29T10:05:00Z", "--to", "2026-11-29T12:00:00Z")
    assert [r["rule"] for r in after] == ["attribution/exact-ratio"]
    assert _list(store, "--from", "2026-11-30") == []  # a date is 00:00 UTC; nothing of the next day
    morning = _list(store, "--to", "2026-11-29T01:00:00.000001Z")  # the allocations of 01:00-02:00, the ratio
    assert [r["rule"] for r in morning] == ["inventory/unapproved-device-class", "inventory/unknown-device",
                                            "attribution/exact-ratio"]


def test_cluster_rule_and_severity_filters(store):
    us = _list(store, "--cluster", US)
    assert [(r["rule"], r["cluster"]) for r in us] == [("inventory/unknown-device", US)]
    eu = _list(store, "--cluster", "prod-eu-1")
    assert len(eu) == 13 and {r["cluster"] for r in eu} == {"prod-eu-1"}
    highs = _list(store, "--severity", "HIGH")
    assert sorted((r["rule"], r["cluster"]) for r in highs) == [
        ("inventory/unapproved-device-class", "prod-eu-1"), ("inventory/unknown-device", "prod-eu-1"),
        ("inventory/unknown-device", US), ("isolation/admin-access", "prod-eu-1"),
        ("isolation/cross-tenant-sharing", "prod-eu-1"), ("isolation/double-allocation", "prod-eu-1")]
    unknown = _list(store, "--rule", "inventory/unknown-device", "--cluster", US, "--severity", "high")
    assert [r["subjects"]["claims"] for r in unknown] == [["risk-inference/ghost-us"]]
    lost = _list(store, "--rule", "attribution/unattributed-transaction")
    assert [r["subjects"]["transactions"] for r in lost] == [["txn-lost-00002"], ["txn-lost-00001"], ["txn-lost-00000"]]
    assert _list(store, "--severity", "critical") == []
    # the command's severities are the policy contract's (a copy, kept out of the CLI's start-up)
    from collector.cli import findings as findings_cli
    from collector.policy import findings as policy_findings

    assert findings_cli.SEVERITIES == policy_findings.SEVERITIES


def test_one_incident_stated_by_two_overlapping_windows_is_listed_once(store, sessions):
    first = {r["rule"]: r for r in _list(store, "--cluster", "prod-eu-1")}
    _eval(store, "prod-eu-1", frm=at(2 * H + 1800))  # starts inside the 02:00-03:00 sharing: stored from 02:30
    with sessions() as s:
        stored = s.execute(select(Finding.from_ns).where(Finding.rule == "isolation/cross-tenant-sharing")
                           .order_by(Finding.from_ns)).scalars().all()
    assert stored == [at(2 * H), at(2 * H + 1800)]  # two decisions in the store
    rows = _list(store, "--cluster", "prod-eu-1")
    assert len(rows) == 13
    [sharing] = [r for r in rows if r["rule"] == "isolation/cross-tenant-sharing"]
    assert (sharing["from"], sharing["to"]) == ("2026-11-29T02:00:00Z", "2026-11-29T03:00:00Z")
    assert sharing["bundle_revision"] == BUNDLE.revision  # one bundle, named once
    assert sharing["last_evaluated_at"] > first["isolation/cross-tenant-sharing"]["last_evaluated_at"]
    # the handover at 02:00-02:00:30 is before the second window: its last evaluation is the first one
    handover = [r for r in rows if r["rule"] == "isolation/tenant-handover-gap"]
    assert [r["last_evaluated_at"] for r in handover] == [first["isolation/tenant-handover-gap"]["last_evaluated_at"]]


def test_a_statement_about_the_whole_period_shows_the_evaluation_that_covered_the_most_of_it(store):
    """``attribution/exact-ratio`` counts the transactions of its evaluated period. A later window
    of the last hours (from 02:30) counted 3 of them; merged as one incident with the whole day's,
    its "0 of 3" was shown for the day of "197 of 200" (a tester's finding)."""
    [day] = [r for r in _list(store, "--cluster", "prod-eu-1") if r["rule"] == "attribution/exact-ratio"]
    _eval(store, "prod-eu-1", frm=at(2 * H + 1800))
    [shown] = [r for r in _list(store, "--cluster", "prod-eu-1") if r["rule"] == "attribution/exact-ratio"]
    assert shown["whole_period"] is True and (shown["from"], shown["to"]) == (day["from"], day["to"])
    assert shown["message"] == day["message"] and shown["message"].startswith("197 of 200 transactions")
    # over the hours from 02:30 only, both cover all of them: the later, which counted exactly those, is shown
    [late] = [r for r in _list(store, "--cluster", "prod-eu-1", "--from", ns_to_rfc3339(at(2 * H + 1800)))
              if r["rule"] == "attribution/exact-ratio"]
    assert late["message"].startswith("0 of 3 transactions")


def test_a_cluster_never_recorded_or_never_evaluated_is_warned_about_and_exits_0(store, sessions):
    res = _run("findings", "--database-url", store, "--cluster", "nope")
    assert res.exit_code == 0
    assert res.stderr == ("warning: no object of cluster nope was ever recorded in this store (known clusters: "
                          f"prod-eu-1, {US}) (no evaluation can have covered it: 0 findings says nothing about it)\n")
    assert res.stdout == "no finding matches\n"
    with sessions.begin() as s:
        History(s, cluster="prod-ap-3").watch("ResourceClaim", "synced", -H)
    res = _run("findings", "--database-url", store, "--cluster", "prod-ap-3", "--output", "json")
    assert res.exit_code == 0 and json.loads(res.stdout) == []
    assert res.stderr == ("warning: no policy evaluation ever covered cluster prod-ap-3 (`draudit policy eval --cluster "
                          "prod-ap-3` evaluates it): 0 findings says nothing about it\n")
    typo = _run("findings", "--database-url", store, "--rule", "isolation/cross-tenant")
    assert typo.exit_code == 0 and typo.stdout == "no finding matches\n"  # evaluations cover the period: no note
    assert typo.stderr.startswith("warning: no stored finding has rule isolation/cross-tenant (rules stored: "
                                  "attribution/exact-ratio, attribution/unattributed-transaction, ")


def test_policy_eval_of_a_cluster_never_recorded_is_refused_and_stores_nothing(store, sessions):
    """An auditor-breaker's finding: `policy eval --cluster no-such` warned, exited 0 and stored an
    evaluation; a later pack of that cluster then showed the policies as covering 100 % of the
    period and rated a NIS2 control higher, with no data at all."""
    from sqlalchemy import func, select

    from collector.store.models import PolicyEvaluation

    with sessions() as s:
        before = s.scalar(select(func.count()).select_from(PolicyEvaluation))
    res = _run("policy", "eval", "--from", ns_to_rfc3339(DAY[0]), "--to", ns_to_rfc3339(DAY[1]), "--cluster", "no-such",
               "--database-url", store)
    assert res.exit_code == 2
    assert res.output == ("draudit: error: no object of cluster no-such was ever recorded in this store (known clusters: "
                          f"prod-eu-1, {US}) (nothing of it can be evaluated; no evaluation is stored — an evaluation "
                          "of nothing would count in packs as the policies covering the period)\n")
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(PolicyEvaluation)) == before


def test_policy_eval_of_a_cluster_known_only_from_ingested_records_is_refused(store, sessions, tmp_path):
    """A final breaker's finding: records ingested with --allow-unwatched-cluster made a cluster
    "recorded", so `policy eval` stored an evaluation of nothing for it, and its pack showed the
    policies covering the whole period."""
    from sqlalchemy import func, select

    from collector.store.models import PolicyEvaluation

    line = tmp_path / "one.jsonl"
    line.write_text('{"@timestamp":"2026-11-29T10:00:00Z","txn_id":"T-FUTURE-1","decision":"APPROVE"}\n')
    ingested = _run("ingest", str(line), "--cluster", "future-x", "--allow-unwatched-cluster", "--database-url", store)
    assert ingested.exit_code == 0, ingested.output
    with sessions() as s:
        before = s.scalar(select(func.count()).select_from(PolicyEvaluation))
    res = _run("policy", "eval", "--from", ns_to_rfc3339(DAY[0]), "--to", ns_to_rfc3339(DAY[1]), "--cluster", "future-x",
               "--database-url", store)
    assert res.exit_code == 2
    assert res.output == (f"draudit: error: cluster future-x has no watch history in this store (watched: prod-eu-1, {US}), "
                          "only ingested records: its allocations cannot be evaluated; no evaluation is stored — an "
                          "evaluation of nothing would count in packs as the policies covering the period\n")
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(PolicyEvaluation)) == before


def test_an_empty_store_lists_nothing_and_exits_0(database_url, sessions):
    res = _run("findings", "--database-url", database_url)
    assert res.exit_code == 0
    assert res.stdout == "no finding is stored\n(no policy evaluation covers this period: run `draudit policy eval`)\n"
    assert _list(database_url) == []


@pytest.mark.parametrize("args, message", [
    (["--from", "yesterday"],
     "--from 'yesterday': use RFC 3339 with a zone (2026-11-29T10:00:00Z) or a date (2026-11-29)"),
    (["--to", "2026-11-29T10:00:00"],
     "--to '2026-11-29T10:00:00': use RFC 3339 with a zone (2026-11-29T10:00:00Z) or a date (2026-11-29)"),
    (["--from", "2026-11-30", "--to", "2026-11-29T12:00:00+02:00"],
     "--from 2026-11-30T00:00:00Z is not before --to 2026-11-29T10:00:00Z"),
    (["--severity", "urgent"], "--severity 'urgent' is not one of critical, high, medium, low, info"),
    # an auditor-breaker's finding: a traceback (OverflowError, NumericValueOutOfRange) and a day's shift
    (["--from", "0001-01-01T00:00:00Z"], "--from '0001-01-01T00:00:00Z': out of range; times are stored as 64-bit "
     "nanoseconds since 1970, from 1677-09-21T00:12:44Z to 2262-04-11T23:47:16Z"),
    (["--to", "9999-12-31"], "--to '9999-12-31': out of range; times are stored as 64-bit nanoseconds since 1970, "
     "from 1677-09-21T00:12:44Z to 2262-04-11T23:47:16Z"),
    (["--from", "2026-12-01T05:08:00+24:00"], "--from '2026-12-01T05:08:00+24:00': use RFC 3339 with a zone "
     "(2026-11-29T10:00:00Z) or a date (2026-11-29) (timestamp '2026-12-01T05:08:00+24:00': zone offset +24:00 is not "
     "a valid offset (at most ±23:59))"),
])
def test_bad_inputs_are_one_line_naming_the_input(store, args, message):
    res = _run("findings", "--database-url", store, *args)
    assert res.exit_code == 2
    assert res.output == f"draudit: error: {message}\n"


def test_a_store_without_schema_is_one_line_naming_its_url(database_url):
    engine = make_engine(database_url)  # creates the SQLite file; the PostgreSQL database exists empty
    with engine.connect():
        pass
    engine.dispose()
    res = _run("findings", "--database-url", database_url)
    assert res.exit_code == 2
    assert res.output == (f"draudit: error: database {database_url} has no draudit schema; run `draudit db upgrade "
                          f"--database-url {database_url}` first (the same URL, also when it came from "
                          "DRAUDIT_DATABASE_URL)\n")


CUSTOM_REGO = """package draudit.custom

# no interval of its own: about the whole evaluated period
findings contains f if {
	input.period.from_ns > 0
	f := {"rule": "custom/whole-period", "severity": "low", "kind": "observation", "message": "period-wide",
	      "subjects": {"cluster": input.period.cluster}}
}

# an interval that had not ended when evaluated
findings contains f if {
	input.period.from_ns > 0
	f := {"rule": "custom/still-open", "severity": "info", "kind": "observation", "message": "still open",
	      "subjects": {"cluster": input.period.cluster}, "from_ns": input.period.from_ns + 3600000000000, "to_ns": null}
}
"""


def test_a_finding_without_interval_shows_its_evaluation_period_and_an_open_end_shows_open(store, tmp_path):
    bundle = tmp_path / "custom"
    bundle.mkdir()
    (bundle / ".manifest").write_text(json.dumps({"revision": "custom-1", "roots": ["draudit"]}))
    (bundle / "custom.rego").write_text(CUSTOM_REGO)
    res = _run("policy", "eval", "--from", "2026-11-29T06:00:00Z", "--to", "2026-11-29T18:00:00Z", "--cluster",
               "prod-eu-1", "--bundle", str(bundle), "--database-url", store)
    assert res.exit_code == 0, res.output
    rows = {r["rule"]: r for r in _list(store, "--cluster", "prod-eu-1") if r["rule"].startswith("custom/")}
    whole, still = rows["custom/whole-period"], rows["custom/still-open"]
    assert (whole["from"], whole["to"], whole["whole_period"], whole["bundle_revision"]) == (
        "2026-11-29T06:00:00Z", "2026-11-29T18:00:00Z", True, "custom-1")
    assert (still["from"], still["to"], still["seen_until"], still["whole_period"]) == (
        "2026-11-29T07:00:00Z", None, "2026-11-29T18:00:00Z", False)
    assert whole["seen_until"] is None
    # a finding without interval overlaps by its evaluation period; an open end is known until the period's end
    for rule in ("custom/whole-period", "custom/still-open"):
        assert [r["rule"] for r in _list(store, "--from", "2026-11-29T17:59:59Z", "--rule", rule)] == [rule]
        assert _list(store, "--from", "2026-11-29T18:00:00Z", "--rule", rule) == []
    assert _list(store, "--to", "2026-11-29T06:00:00Z", "--rule", "custom/whole-period") == []
    table = _run("findings", "--database-url", store, "--rule", "custom/whole-period").stdout.splitlines()
    assert table[0] == ("2026-11-29T06:00:00Z .. 2026-11-29T18:00:00Z (evaluation period)  LOW observation  "
                        "custom/whole-period  cluster prod-eu-1")
    table = _run("findings", "--database-url", store, "--rule", "custom/still-open").stdout.splitlines()
    assert table[0] == ("2026-11-29T07:00:00Z .. open (seen until 2026-11-29T18:00:00Z)  INFO observation  "
                        "custom/still-open  cluster prod-eu-1")


def _ghosts(url: str, *args: str) -> list[tuple]:
    return [(r["subjects"]["claims"], r["from"], r["to"], r["seen_until"])
            for r in _list(url, "--cluster", US, "--rule", "inventory/unknown-device", *args)]


def test_an_allocation_still_going_on_when_evaluated_is_open_with_the_instant_it_was_seen_until(store, sessions):
    """The policies cut an allocation not released (valid_to NULL) at the end of the evaluation
    period; it was listed with that end as ``to``, as if the violation ended then, and moved with
    each later evaluation (breaker: repro3_findings_open_to.sh)."""
    with sessions.begin() as s:
        History(s, cluster=US).allocation("risk-inference", "ghost-open", "node-y", "gpu-8", 20 * H, None)
    _eval(store, US)
    assert _ghosts(store) == [
        (["risk-inference/ghost-open"], "2026-11-29T20:00:00Z", None, "2026-11-30T00:00:00Z"),
        (["risk-inference/ghost-us"], "2026-11-29T04:00:00Z", "2026-11-29T05:00:00Z", None)]  # ended inside: kept
    table = _run("findings", "--database-url", store, "--cluster", US, "--limit", "1").stdout.splitlines()
    assert table[0] == ("2026-11-29T20:00:00Z .. open (seen until 2026-11-30T00:00:00Z)  HIGH violation  "
                        "inventory/unknown-device  cluster prod-us-2")
    # a later evaluation over a longer period saw it longer: still open, seen until that period's end
    _eval(store, US, to=DAY[1] + 12 * H * 10 ** 9)
    assert _ghosts(store)[0] == (["risk-inference/ghost-open"], "2026-11-29T20:00:00Z", None, "2026-11-30T12:00:00Z")


NOTE_TAIL = " — findings, or their absence, say nothing about those stretches\n"


def test_a_window_evaluated_in_part_gets_a_note_naming_the_share_and_the_stretches_not_evaluated(store, sessions):
    """Both clusters were evaluated over the planted day only: a window from its last 12 hours into
    the next day is half evaluated, which the listing did not say (breaker: repro4_findings_partial_window.sh)."""
    window = ("--from", "2026-11-29T12:00:00Z", "--to", "2026-11-30T12:00:00Z")
    res = _run("findings", "--database-url", store, "--cluster", "prod-eu-1", *window)
    assert res.exit_code == 0
    assert res.stderr == ("note: policy evaluations cover 50.0 % of the window for cluster prod-eu-1; not evaluated: "
                          "[2026-11-30T00:00:00Z, 2026-11-30T12:00:00Z)" + NOTE_TAIL)
    assert res.stdout.splitlines()[-1] == "1 finding"  # the attribution ratio of the day
    res = _run("findings", "--database-url", store, "--output", "json", *window)  # every cluster: the least evaluated
    assert res.exit_code == 0 and [r["rule"] for r in json.loads(res.stdout)] == ["attribution/exact-ratio"]
    assert res.stderr == ("note: policy evaluations cover 50.0 % of the window for cluster prod-eu-1 (the least "
                          "evaluated of 2 clusters not wholly evaluated); not evaluated: "
                          "[2026-11-30T00:00:00Z, 2026-11-30T12:00:00Z)" + NOTE_TAIL)
    res = _run("findings", "--database-url", store, "--from", "2026-11-30T00:00:00Z", "--to", "2026-11-30T06:00:00Z")
    assert res.exit_code == 0 and res.stdout == (
        "no finding matches\n(no policy evaluation covers this period: run `draudit policy eval`)\n")
    assert res.stderr == ("note: policy evaluations cover 0.0 % of the window for cluster prod-eu-1 (the least "
                          "evaluated of 2 clusters not wholly evaluated); not evaluated: "
                          "[2026-11-30T00:00:00Z, 2026-11-30T06:00:00Z)" + NOTE_TAIL)
    # a cluster observed in the window and never evaluated is named, without --cluster too
    with sessions.begin() as s:
        History(s, cluster="prod-ap-3").watch("ResourceClaim", "synced", -H)
    res = _run("findings", "--database-url", store, "--from", "2026-11-29", "--to", "2026-11-30", "--limit", "1")
    assert res.exit_code == 0
    assert res.stderr == ("note: policy evaluations cover 0.0 % of the window for cluster prod-ap-3; not evaluated: "
                          "[2026-11-29T00:00:00Z, 2026-11-30T00:00:00Z)" + NOTE_TAIL)


def test_a_window_evaluated_whole_or_a_listing_without_window_gets_no_note(store):
    for args in (("--from", "2026-11-29", "--to", "2026-11-30"), ("--cluster", US, "--from", "2026-11-29T03:00:00Z",
                                                                  "--to", "2026-11-29T23:59:59.999999Z")):
        res = _run("findings", "--database-url", store, *args)
        assert res.exit_code == 0 and res.stderr == "" and res.stdout.splitlines()[-1] in ("14 findings", "1 finding")
    # unbounded on one side: no window to cover, though nothing evaluated the next day
    res = _run("findings", "--database-url", store, "--from", "2026-11-29T12:00:00Z")
    assert res.exit_code == 0 and res.stderr == ""


def test_an_incident_stated_by_an_evaluation_of_its_cluster_and_by_one_of_all_clusters_is_listed_once(store):
    before = _list(store)
    res = _run("policy", "eval", "--from", ns_to_rfc3339(DAY[0]), "--to", ns_to_rfc3339(DAY[1]), "--database-url", store)
    assert res.exit_code == 0, res.output
    after = _list(store)
    # the incidents of each cluster, stated again without a cluster, are the same rows under their cluster
    incidents = [(r["rule"], r["cluster"], json.dumps(r["subjects"], sort_keys=True), r["from"]) for r in after]
    assert len(incidents) == len(set(incidents))
    assert {i for i in incidents if i[1] is not None} == {
        (r["rule"], r["cluster"], json.dumps(r["subjects"], sort_keys=True), r["from"]) for r in before}
    # what is about all clusters at once stays apart: the share of all transactions attributed exactly
    assert [(r["rule"], r["subjects"]) for r in after if r["cluster"] is None] == [
        ("attribution/exact-ratio", {"cluster": None})]
