"""Where the collector observed nothing of the pack's scope, no section states that nothing happened
(newcomer finding: with `--cluster nope`, or a period after the collector stopped, section 5 said "No
two tenants held the same physical GPU at the same time" and section 2 "No gap recorded in the period"
while the cover said nothing was observed). Store tests on the store of ``tests.test_report``."""

from __future__ import annotations

import re
from datetime import timedelta

from reports.render import PackRequest, render_pack
from tests.test_report import CLUSTER, PERIOD_FROM, PERIOD_TO, bundle, fill_store, stop_collector  # noqa: F401

NOT_OBSERVED = "Not observed — no statement possible: the collector observed nothing of"
NEGATIVES = ("No two tenants held the same physical GPU at the same time", "No gap recorded in the period",
             "No physical GPU was held by more than one claim at a time", "No findings for the period",
             "No changes recorded in the period", "No devices published in the period",
             "No MIG instances in the period", "No DeviceClass observed")


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#39;", "'")


def _section(html: str, name: str) -> str:
    start = html.index(f'<section id="{name}">')
    return _text(html[start:html.index("</section>", start)])


def _pack(sessions, tmp_path, bundle, label, frm, to, clusters):
    return (render_pack(sessions, PackRequest(frm, to, clusters), tmp_path / label, policy_bundle=bundle, pdf=False,
                        record=False).path / "index.html").read_text()


def test_no_section_states_an_absence_for_a_scope_nobody_observed(sessions, tmp_path, bundle):
    fill_store(sessions)
    stop_collector(sessions, 20)
    after_stop = _pack(sessions, tmp_path, bundle, "after", PERIOD_TO, PERIOD_TO + timedelta(hours=6), (CLUSTER,))
    unknown = _pack(sessions, tmp_path, bundle, "nope", PERIOD_FROM, PERIOD_TO, ("nope",))
    for html in (after_stop, unknown):
        text = _text(html)
        for negative in NEGATIVES:
            assert negative not in text, negative
        assert NOT_OBSERVED + " the allocations" in _section(html, "sharing")
        assert NOT_OBSERVED + " the watch streams" in _section(html, "coverage")
        assert "not observed — no statement possible" in _section(html, "findings")
        cover = _text(html.split('<nav class="toc">')[0])
        assert "none stated: nothing was observed in the period" in cover
    # the unknown cluster has no inventory either: said so, not "no devices"
    assert NOT_OBSERVED + " the ResourceSlices" in _section(unknown, "inventory")


def test_a_partly_observed_period_qualifies_its_negative_statements(sessions, tmp_path, bundle):
    fill_store(sessions)
    stop_collector(sessions, 20)
    # 19:00–24:00: observed until the stop at 20:00, a fifth of the period; no two claims shared a GPU then
    html = _pack(sessions, tmp_path, bundle, "evening", PERIOD_FROM + timedelta(hours=19), PERIOD_TO, (CLUSTER,))
    sharing = _section(html, "sharing")
    assert NOT_OBSERVED not in sharing
    assert ("No two tenants held the same physical GPU at the same time. This holds only while the collector "
            "observed: ") in sharing
    assert "was synced for 20.0 % of the period; for the rest no statement is possible (section 2)" in sharing


def test_the_cover_states_no_absence_of_violations_for_an_unobserved_period_with_warnings(sessions, tmp_path, bundle):
    # newcomer re-check: a period after the stop, with only the collector-not-running findings, read
    # "Policy findings: no violation; 4 warning(s)" on the cover
    from sqlalchemy import insert

    from collector.store.models import Finding
    from tests.test_report import at, ns

    fill_store(sessions)
    stop_collector(sessions, 20)
    with sessions.begin() as s:
        s.execute(insert(Finding).values(
            finding_key="f" * 64, cluster=CLUSTER, rule="coverage/observation-gap", severity="medium", kind="warning",
            message="collector not running", subjects={"kind": "ResourceClaim"}, evidence=None, physical_gpu_uuid=None,
            from_ns=ns(24), to_ns=ns(30), period_from_ns=ns(24), period_to_ns=ns(30), bundle_revision="r",
            bundle_digest="d" * 64, engine="regorus", evaluated_at=at(31)))
    html = _pack(sessions, tmp_path, bundle, "after", PERIOD_TO, PERIOD_TO + timedelta(hours=6), (CLUSTER,))
    cover = _text(html.split('<nav class="toc">')[0])
    assert "no violation;" not in cover
    assert "no violation stated: nothing of the allocations was observed in the period" in cover
    assert "1 warning(s)/observation(s)" in cover
