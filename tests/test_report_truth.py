"""What a pack states must be true of the store: sharing and co-tenancy in a namespace scope, conflicting
re-sends, intervals open at the last observation, quarantined lines, scope names the store never saw,
changes outside the period. Store tests (SQLite and PostgreSQL) on the store of ``tests.test_report``."""

from __future__ import annotations

import re

from sqlalchemy import update

from collector.store.models import AllocationEpisode
from reports.render import PackRequest, render_pack
from tests.pack_data import records
from tests.test_report import CLUSTER, GPU_A, PERIOD_FROM, PERIOD_TO, bundle, fill_store, ns  # noqa: F401

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
