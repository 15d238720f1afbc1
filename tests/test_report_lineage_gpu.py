"""Section 7's table by physical GPU adds up to the transactions of the period: a "no GPU" row holds
those whose lineage names no GPU (newcomer finding: 850 + 3,198 = 4,048 of 4,051 records, and an
"Unattributed or not yet attributed" column that was always 0). Store test."""

from __future__ import annotations

import re

from reports.render import PackRequest, render_pack
from tests.pack_data import records
from tests.test_report import CLUSTER, PERIOD_FROM, PERIOD_TO, bundle, fill_store  # noqa: F401


def test_the_table_by_gpu_has_a_no_gpu_row_and_reconciles_with_the_total(sessions, tmp_path, bundle):
    fill_store(sessions)
    pack = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,)), tmp_path / "p", policy_bundle=bundle,
                       pdf=False, record=False).path
    lineage = records(pack / "data/transaction_lineage.json")
    without_gpu = [r for r in lineage if r["physical_gpu_uuid"] is None]
    assert without_gpu and {r["status"] for r in without_gpu} == {"unattributed"}
    html = (pack / "index.html").read_text()
    start = html.index("<h3>By physical GPU</h3>")
    table = html[start:html.index("</table>", start)]
    cells = [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)]
             for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)]
    body = [c for c in cells[1:] if c[0] != "All transactions"]
    assert body[-1] == ["no GPU (not attributed to one)", "0", "0", str(len(without_gpu)), str(len(without_gpu))]
    assert sum(int(c[4].replace(",", "")) for c in body) == len(lineage)
    assert cells[-1][0] == "All transactions" and cells[-1][4] == f"{len(lineage):,}"
    # the unattributed column is no longer always 0: the no-GPU row carries them
    assert sum(int(c[3]) for c in body) == sum(1 for r in lineage if r["status"] == "unattributed")
