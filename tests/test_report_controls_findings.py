"""The control mapping never reads as compliance: it says what "evidenced" means, and a control with
high or critical findings in its sections shows them next to its status, in the HTML (and so the PDF)
and in controls.json (newcomer finding: DORA Art. 9(4)(b) "evidenced" beside an open HIGH cross-tenant
violation). Pure tests of ``reports.controls`` and a store test of a rendered pack."""

from __future__ import annotations

import json
import re

from reports.controls import STATUS_MEANING, PackFacts, controls_document
from reports.render import PackRequest, render_pack
from tests.test_report import CLUSTER, PERIOD_FROM, PERIOD_TO, bundle, fill_store  # noqa: F401
from tests.test_report_scope import add_finding

COUNTS = {"inventory": 4, "allocation_episodes": 6, "consumer_intervals": 6, "transaction_lineage": 10, "findings": 3,
          "coverage": 4, "sharing": 1, "changes": 1}


def _controls(findings) -> dict[str, dict]:
    doc = controls_document(PackFacts(True, COUNTS, (1.0, "prod-eu-1", "Pod"), 1, observed=True, findings=findings))
    assert doc["status_meaning"] == STATUS_MEANING
    return {c["id"]: c for c in doc["controls"]}


def test_open_severe_findings_are_shown_next_to_the_status_of_the_controls_whose_sections_hold_them():
    controls = _controls((("isolation/cross-tenant-sharing", "high"), ("isolation/cross-tenant-sharing", "high"),
                          ("inventory/unknown-device", "critical"), ("coverage/observation-gap", "medium")))
    isolation = controls["DORA (EU) 2022/2554 Art. 9(4)(b)"]  # sharing + findings: every severe finding
    assert (isolation["status"], isolation["open_findings"]) == ("evidenced", {"critical": 1, "high": 2})
    assert isolation["status_text"] == "evidenced — 1 critical finding open, 2 high findings open"
    access = controls["DORA (EU) 2022/2554 Art. 9(4)(c)"]  # timeline + sharing: the isolation findings only
    assert access["open_findings"] == {"high": 2}
    inventory = controls["DORA (EU) 2022/2554 Art. 8(1)"]  # scope + inventory: the unknown device only
    assert inventory["open_findings"] == {"critical": 1}
    integrity = controls["RTS (EU) 2024/1774 Art. 12(2)(d)–(e)"]  # integrity: none of them
    assert (integrity["open_findings"], integrity["status_text"]) == ({}, "evidenced")
    assert "not an assessment that the control is effective" in STATUS_MEANING


def test_a_pack_with_a_high_cross_tenant_finding_says_so_beside_the_isolation_control(sessions, tmp_path, bundle):
    fill_store(sessions)
    with sessions.begin() as s:
        add_finding(s, "isolation/cross-tenant-sharing", {"tenants": ["marketing", "risk"]}, None, CLUSTER, 3, 4)
    pack = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,)), tmp_path / "p", policy_bundle=bundle,
                       pdf=False, record=False).path
    controls = {c["id"]: c for c in json.loads((pack / "controls.json").read_text())["controls"]}
    isolation = controls["DORA (EU) 2022/2554 Art. 9(4)(b)"]
    # fill_store's own high finding (a rule of another bundle: section 6 only) and the shipped rule's
    assert isolation["open_findings"] == {"high": 2}
    assert controls["DORA (EU) 2022/2554 Art. 9(4)(c)"]["open_findings"] == {"high": 1}
    html = (pack / "index.html").read_text()
    controls_section = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html[html.index('<section id="controls">'):]))
    assert "Art. 9(4)(b) Sound infrastructure management incl. isolation of assets " in controls_section
    row = controls_section[controls_section.index("Art. 9(4)(b)"):controls_section.index("Art. 9(4)(c)")]
    assert re.search(r"(evidenced|partially evidenced) — 2 high findings open \(section 6\)", row), row
    assert '"Evidenced" means the evidence exists in this pack, not that the control is effective.' in controls_section
