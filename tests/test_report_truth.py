"""What a pack states must be true of the store: sharing and co-tenancy in a namespace scope, conflicting
re-sends, intervals open at the last observation, quarantined lines, scope names the store never saw,
changes outside the period. Store tests (SQLite and PostgreSQL) on the store of ``tests.test_report``."""

from __future__ import annotations

import json
import re
from datetime import timedelta

from click.testing import CliRunner
from sqlalchemy import insert, select, update

from collector.cli import cli
from collector.store.canonical import content_hash
from collector.store.models import AllocationEpisode, InferenceRecord, Quarantine
from reports.render import PackRequest, render_pack
from tests.pack_data import records
from tests.test_report_scope import add_finding
from tests.test_report import (CLUSTER, GPU_A, PERIOD_FROM, PERIOD_TO, at, bundle, fill_store, ns,  # noqa: F401
                               stop_collector)

NO_TWO_TENANTS = "No two tenants held the same physical GPU at the same time."


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#39;", "'").replace("&#34;", '"')


def section(html: str, name: str) -> str:
    start = html.index(f'<section id="{name}">')
    return text_of(html[start:html.index("</section>", start)])


def pack_for(sessions, tmp_path, bundle, label: str, namespaces=(), clusters=(CLUSTER,), frm=PERIOD_FROM,
             to=PERIOD_TO):
    return render_pack(sessions, PackRequest(frm, to, clusters, namespaces), tmp_path / label, policy_bundle=bundle,
                       pdf=False, record=False).path


def test_a_namespace_pack_keeps_the_sharing_its_tenant_took_part_in_and_names_the_other_tenant(
        sessions, tmp_path, bundle):
    fill_store(sessions)  # 03:00–04:00: marketing-ml's recsys-gpu beside risk-inference's fraud-0-gpu on the H100
    for namespace, other in (("risk-inference", "marketing-ml"), ("marketing-ml", "risk-inference")):
        pack = pack_for(sessions, tmp_path, bundle, namespace, (namespace,))
        shared = [(s["physical_gpu_uuid"], s["from"], s["to"], s["tenants"], s["cross_tenant"])
                  for s in records(pack / "data/sharing.json") if s["physical_gpu_uuid"] == GPU_A]
        assert shared == [(GPU_A, "2026-11-28T03:00:00Z", "2026-11-28T04:00:00Z", "marketing;risk", True)], namespace
        # only intervals a scoped namespace took part in
        assert all(any(c.split("/")[0] == namespace for c in s["claims"].split(";"))
                   for s in records(pack / "data/sharing.json"))
        html = (pack / "index.html").read_text()
        assert NO_TWO_TENANTS not in html
        assert "tenants outside the scope are named when they shared a GPU with a tenant in scope" in \
            section(html, "methodology")
        # the population stays scoped: the other tenant's allocations are not listed
        assert {e["claim_namespace"] for e in records(pack / "data/allocation_episodes.json")} == {namespace}
        assert other not in {e["claim_namespace"] for e in records(pack / "data/consumer_intervals.json")}
    lineage = {r["transaction_id"]: r for r in
               records(tmp_path / "risk-inference" / "data/transaction_lineage.json")}
    assert lineage["txn-0002"]["co_tenant_namespaces"] == "marketing-ml"  # 03:30, as in the unscoped pack
    assert lineage["txn-0000"]["co_tenant_namespaces"] is None  # 02:00: fraud-0-gpu alone


def test_no_two_tenants_is_never_said_beside_a_cross_tenant_finding(sessions, tmp_path, bundle):
    fill_store(sessions)
    with sessions.begin() as s:  # marketing's allocations moved out of the period; the stored finding stays
        s.execute(update(AllocationEpisode).where(AllocationEpisode.claim_uid.in_(("claim-2", "claim-4")))
                  .values(valid_from_ns=ns(-20), valid_to_ns=ns(-19)))
    pack = pack_for(sessions, tmp_path, bundle, "risk", ("risk-inference",))
    html = (pack / "index.html").read_text()
    assert records(pack / "data/sharing.json") == []
    assert NO_TWO_TENANTS not in html
    assert "1 policy finding(s) in section 6 name two or more tenants" in section(html, "sharing")
    # a scope with no finding naming two tenants and no sharing: the sentence is true and said
    quiet = pack_for(sessions, tmp_path, bundle, "quiet", ("nobody-here",))
    assert NO_TWO_TENANTS in (quiet / "index.html").read_text()


def _resend(sessions, txn: str, hours: float, pod: str) -> None:
    """``txn`` stored again with different content (another pod), flagged as the ingest writer does."""
    with sessions.begin() as s:
        first = s.execute(select(InferenceRecord).where(InferenceRecord.transaction_id == txn)).scalar_one()
        row = {c.name: getattr(first, c.key) for c in InferenceRecord.__table__.columns if c.name != "id"}
        row.update(event_time_ns=ns(hours), pod_name=pod, dedup_key=content_hash({"t": txn, "pod": pod}),
                   conflict=True)
        s.execute(insert(InferenceRecord).values(**row))


def test_conflicting_resends_are_flagged_in_the_lineage_and_counted_apart(sessions, tmp_path, bundle):
    fill_store(sessions)
    _resend(sessions, "txn-0001", 2.5, "fraud-1")  # same time, other pod: not attributed yet
    _resend(sessions, "txn-0002", 6.0, "fraud-2")
    _resend(sessions, "txn-9999", 6.5, "fraud-3")  # the first copy lies after the period
    pack = pack_for(sessions, tmp_path, bundle, "pack")
    rows = records(pack / "data/transaction_lineage.json")
    header = (pack / "data/transaction_lineage.csv").read_text().splitlines()[0].split(",")
    assert header[-1] == "conflict" and header.index("raw_sha256") == len(header) - 2  # appended, positions kept
    flagged = sorted((r["transaction_id"], r["pod_name"]) for r in rows if r["conflict"] is True)
    assert flagged == [("txn-0001", "fraud-1"), ("txn-0002", "fraud-2"), ("txn-9999", "fraud-3")]
    assert all(r["conflict"] is False for r in rows if r["pod_name"] == "fraud-0")
    assert len(rows) == 8 and len({r["transaction_id"] for r in rows}) == 6
    html = (pack / "index.html").read_text()
    assert "8 record(s) of 6 distinct transaction id(s); 3 transaction id(s) stored more than once with different " \
           "content (conflicting re-sends, 5 records)" in section(html, "scope")
    lineage = section(html, "lineage")
    assert "8 transaction record(s) logged in the period (6 distinct transaction id(s))" in lineage
    assert "Conflicting re-sends: 3 transaction id(s) were stored more than once with different content" in lineage
    plain = pack_for(sessions, tmp_path, bundle, "before", to=PERIOD_FROM + timedelta(hours=2, minutes=15))
    assert "No transaction id in the period was stored twice with different content" in \
        section((plain / "index.html").read_text(), "lineage")


def test_a_transactions_other_log_lines_are_counted_apart_not_as_distinct_transactions(sessions, tmp_path, bundle):
    """Spring's MDC puts the id on every line of a request: those records have no decision; the pack
    says how many records are scored and how many are such lines, instead of a distinct-id figure
    that assumed one record per transaction."""
    fill_store(sessions)
    with sessions.begin() as s:
        first = s.execute(select(InferenceRecord).where(InferenceRecord.transaction_id == "txn-0001")).scalar_one()
        row = {c.name: getattr(first, c.key) for c in InferenceRecord.__table__.columns if c.name != "id"}
        row.update(decision=None, dedup_key=content_hash({"t": "txn-0001", "line": "request received"}))
        s.execute(insert(InferenceRecord).values(**row))
    pack = pack_for(sessions, tmp_path, bundle, "mdc")
    html = (pack / "index.html").read_text()
    total = len(records(pack / "data/transaction_lineage.json"))
    assert f"{total} record(s) of transactions: {total - 1} with a decision (scored), 1 without" in section(html, "scope")
    assert f"({total - 1} with a decision, 1 other log line(s) of transactions without one)" in section(html, "lineage")
    assert "distinct transaction id(s)" not in html


def test_interval_populations_flag_intervals_open_at_a_stopped_collectors_last_observation(sessions, tmp_path,
                                                                                             bundle):
    fill_store(sessions)  # scoring-mig (claim-3) from 08:00 and the slices are never seen ending
    running = pack_for(sessions, tmp_path, bundle, "running")
    stop_collector(sessions, 20)
    stopped = pack_for(sessions, tmp_path, bundle, "stopped")
    for name, key in (("allocation_episodes", "claim_name"), ("consumer_intervals", "claim_name"),
                      ("inventory", "device")):
        for pack, flagged in ((running, False), (stopped, True)):
            rows = records(pack / f"data/{name}.json")
            assert [r["open_at_last_observation"] for r in rows if r["valid_to"] is None] == \
                [flagged] * sum(1 for r in rows if r["valid_to"] is None), (name, pack.name)
            assert any(r["valid_to"] is None for r in rows), name
            assert all(r["open_at_last_observation"] is False for r in rows if r["valid_to"] is not None), name
    episodes = {r["claim_name"]: r for r in records(stopped / "data/allocation_episodes.json")}
    assert episodes["scoring-mig"]["open_at_last_observation"] is True
    assert episodes["fraud-0-gpu"]["open_at_last_observation"] is False  # released at 05:00
    methodology = section((stopped / "index.html").read_text(), "methodology")
    assert "open_at_last_observation = true: the cluster's collector stopped before the period end (here: " \
           f"{CLUSTER} at 2026-11-28T20:00:00Z)" in methodology


def _quarantine(sessions, rows) -> None:
    with sessions.begin() as s:
        for k, (stage, source, reason, hours) in enumerate(rows):
            s.execute(insert(Quarantine).values(stage=stage, source=source, position=str(k), reason=reason,
                                                raw_text=f"secret line {k}", raw_sha256=f"{k:064x}",
                                                received_at=at(hours), content_key=f"{k:064x}"))


def test_quarantined_input_received_in_the_period_is_counted_by_reason_and_source(sessions, tmp_path, bundle):
    fill_store(sessions)
    _quarantine(sessions, [
        ("ingest", "/var/log/scoring/scoring.jsonl", "missing-transaction-id: no transaction id field", 2),
        ("ingest", "/var/log/scoring/scoring.jsonl", "missing-transaction-id: no transaction id field", 3),
        ("ingest", "/var/log/scoring/scoring.jsonl", "naive-timestamp: field 'ts': '2026-11-28 02:00'", 4),
        ("ingest", "http:req-1", "unparseable: JSON value is not an object", 5),
        ("ingest", "http:req-2", "unparseable: invalid JSON at character 3 (Expecting value)", 6),
        ("watch", "watch:ResourceClaim", "undecodable: bad object", 7),
        ("ingest", "/var/log/scoring/scoring.jsonl", "missing-transaction-id: no transaction id field", 25),  # after
    ])
    pack = pack_for(sessions, tmp_path, bundle, "pack", ("risk-inference",))
    stated = json.loads((pack / "manifest.json").read_text())["quarantined"]
    assert stated == {"lines": 6, "by_reason": [
        {"stage": "ingest", "reason": "missing-transaction-id", "source": "scoring.jsonl", "lines": 2},
        {"stage": "ingest", "reason": "naive-timestamp", "source": "scoring.jsonl", "lines": 1},
        {"stage": "ingest", "reason": "unparseable", "source": "http", "lines": 2},
        {"stage": "watch", "reason": "undecodable", "source": "watch:ResourceClaim", "lines": 1}]}
    html = (pack / "index.html").read_text()
    lineage = section(html, "lineage")
    assert "6 input line(s) or object(s) received in the period were rejected and quarantined" in lineage
    assert "ingest missing-transaction-id scoring.jsonl 2" in lineage
    assert "secret line" not in html and "2026-11-28 02:00" not in html  # neither the text nor quoted input
    quiet = pack_for(sessions, tmp_path, bundle, "quiet", to=PERIOD_FROM + timedelta(hours=1))
    assert "No input received in the period was quarantined" in section((quiet / "index.html").read_text(), "lineage")


def test_scope_names_the_store_never_saw_are_stated_on_the_cover_and_warned_by_the_cli(sessions, tmp_path, bundle,
                                                                                       database_url):
    fill_store(sessions)
    pack = pack_for(sessions, tmp_path, bundle, "typo", ("risk-inferense",), ("prod-eu-l",))
    cover = text_of((pack / "index.html").read_text().split('<nav class="toc">')[0])
    assert ("no object of cluster prod-eu-l was ever recorded in this store (it knows prod-eu-1); no object of "
            "namespace risk-inferense was ever recorded in this store") in cover
    assert json.loads((pack / "manifest.json").read_text())["scope_never_recorded"] == {
        "clusters": ["prod-eu-l"], "namespaces": ["risk-inferense"], "known_clusters": ["prod-eu-1"]}
    # the cluster never watched: nothing before the period either, so no "last state observed before"
    assert "last state observed before the period" not in (pack / "index.html").read_text()
    assert "nothing was observed before the period either" in cover
    known = pack_for(sessions, tmp_path, bundle, "known", ("marketing-ml",))
    assert "never recorded" not in (known / "index.html").read_text()
    runner = CliRunner()
    res = runner.invoke(cli, ["report", "--from", "2026-11-28", "--to", "2026-11-29", "--cluster", "prod-eu-l",
                              "--out", str(tmp_path / "cli"), "--database-url", database_url],
                        env={"DRAUDIT_POLICY_BUNDLE": str(bundle)})
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == ["warning: no object of cluster prod-eu-l was ever recorded in this store "
                                       "(known clusters: prod-eu-1) (the pack says so on its cover)",
                                       "draudit: warning: the pack is not signed (no --sign-key or DRAUDIT_SIGN_KEY): "
                                       "`draudit verify --public-key` fails on it and its manifest proves integrity only "
                                       "(whoever rewrote a file could rewrite the manifest too); create a key with "
                                       "`draudit keys generate` and render the pack again with it"]  # no policy advice:
    # nothing of that scope was observed, an evaluation would find nothing to decide on (the pack says so)
    assert "warning" not in res.stdout


def test_a_period_before_the_first_observation_claims_no_earlier_state(sessions, tmp_path, bundle):
    fill_store(sessions)  # the collector first synced at 00:00 on 2026-11-28
    early = pack_for(sessions, tmp_path, bundle, "early", frm=PERIOD_FROM - timedelta(days=300),
                     to=PERIOD_FROM - timedelta(days=299))
    html = (early / "index.html").read_text()
    assert "last state observed before the period" not in html
    assert "nothing was observed before the period either" in text_of(html.split('<nav class="toc">')[0])
    later = pack_for(sessions, tmp_path, bundle, "later", frm=PERIOD_FROM + timedelta(days=1),
                     to=PERIOD_FROM + timedelta(days=2))
    assert json.loads((later / "manifest.json").read_text())["observed_before_period"] is True


def test_changes_in_the_period_lie_in_the_period(sessions, tmp_path, bundle):
    fill_store(sessions)  # bundle 2026.11.2 evaluated at 26:00 and 27:00, after the period
    with sessions.begin() as s:  # another bundle evaluated at 12:00, inside it
        add_finding(s, "coverage/observation-gap", {"cluster": CLUSTER, "kinds": ["ResourceClaim"]}, None, CLUSTER,
                    10, 10 + 5 / 60, severity="medium", kind="warning", evaluated=12)
    pack = pack_for(sessions, tmp_path, bundle, "pack")
    changes = records(pack / "data/changes.json")
    assert changes and all(ns(0) <= c["at_ns"] < ns(24) for c in changes)
    assert [(c["at"], c["to_value"]) for c in changes if c["change_type"] == "policy_bundle"] == [
        ("2026-11-28T12:00:00.000000Z", "2026.11.3")]
    assert {c["change_type"] for c in changes} == {"DeviceClass", "driver_version", "policy_bundle"}
    text = section((pack / "index.html").read_text(), "changes")
    assert "Policy bundles evaluated over the period" in text
    assert "2026.11.2" in text.split("Policy bundles evaluated over the period")[1]  # still named with its times


def test_a_sharing_finding_states_the_transactions_served_on_its_gpu_in_its_interval(sessions, tmp_path, bundle):
    fill_store(sessions)  # the cross-tenant finding: H100, 03:00–04:00; txn-0002 at 03:30 on it, txn-0001 at 02:30
    for label, namespaces, served in (("all", (), 1), ("marketing", ("marketing-ml",), 0)):
        pack = pack_for(sessions, tmp_path, bundle, label, namespaces)
        text = section((pack / "index.html").read_text(), "findings")
        assert f"Transactions served on this GPU in the interval {served} (in this pack's scope and period" in text
        assert text.count("Transactions served on this GPU") == 1  # the watch-gap finding names no GPU
