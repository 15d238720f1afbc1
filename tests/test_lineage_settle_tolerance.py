"""The settle window re-checks rows for late history with the settings they were computed with
(collector/lineage.py, "Late history"; ``_Run.revisit``).

Breaker repro (F4, tolerance ratchet): after ``attribute --all --clock-skew-s 5`` a plain
``attribute`` (2 s) inside the settle window re-checked the stored ``ambiguous`` rows with its own,
smaller tolerance and turned them ``exact`` ("4 changed"); repeated runs ratcheted toward the
smallest tolerance any run used. ``--all`` is the way to change the tolerance. SQLite and PostgreSQL.
"""

from __future__ import annotations

from click.testing import CliRunner
from sqlalchemy import select

from collector.cli import cli
from collector.lineage import attribute_run, tolerances_in_use, verify_lineage
from collector.store.models import Lineage
from tests.test_lineage import (  # noqa: F401 - hist is a fixture
    CLUSTER, GPU_A, S, T0, History, hist, lineage_of, single_gpu_pod,
)
from tests.test_lineage_runs import live_scorer, watcher_alive_until


def _rows(h) -> dict[int, tuple]:
    return {r.record_id: (r.status, r.reason, r.settings_id) for r in h.s.execute(select(Lineage)).scalars()}


def test_a_revisit_keeps_the_tolerance_each_row_was_computed_with(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0)
    watcher_alive_until(h, T0 + 100 * S)  # inside the settle window of every record below
    near = [h.record(f"txn-near-{i}", T0 + (3 + i) * S, pod="fraud-scorer-0") for i in range(4)]  # 3-6 s after
    late = h.record("txn-late-pod", T0 + 60 * S, pod="fraud-scorer-1")  # its pod's history arrives later

    wide = attribute_run(h.s, all=True, clock_skew_s=5.0, cluster=CLUSTER)
    assert wide.by_status == {"exact": 1, "ambiguous": 3, "unattributed": 1}  # 3, 4, 5 s: within 5 s
    before = _rows(h)
    wide_id = before[near[0]][2]

    for skew in (2.0, 0.0, 2.0):  # plain runs with smaller tolerances: nothing changes, nothing ratchets
        summary = attribute_run(h.s, clock_skew_s=skew, cluster=CLUSTER)
        assert (summary.revisited, summary.revised, summary.new) == (4, 0, 0)
        assert _rows(h) == before
    assert tolerances_in_use(h.s) == {5.0: 5}
    assert verify_lineage(h.s).ok

    # late history still reaches a row of the wide run, which keeps its settings
    pod1, _ = single_gpu_pod(h, "fraud-scorer-1", "gpu-node-a", "gpu-0", T0 + 57 * S)
    summary = attribute_run(h.s, clock_skew_s=2.0, cluster=CLUSTER)
    assert (summary.revisited, summary.revised, summary.new) == (4, 1, 0)
    row = lineage_of(h.s, late)
    # 3 s after its pod appeared: a skew-window under the row's 5 s (this run's 2 s would say exact)
    assert (row["status"], row["reason"], row["pod_uid"]) == ("ambiguous", "skew-window", pod1)
    assert _rows(h)[late][2] == wide_id
    assert verify_lineage(h.s).ok
    # --all is the way to change the tolerance
    attribute_run(h.s, all=True, clock_skew_s=2.0, cluster=CLUSTER)
    assert tolerances_in_use(h.s) == {2.0: 5}
    assert {lineage_of(h.s, r)["status"] for r in near} == {"exact"}


def test_cli_counts_new_transactions_apart_from_re_evaluated_ones(sessions, database_url, monkeypatch):
    monkeypatch.setenv("DRAUDIT_CLUSTER", CLUSTER)
    with sessions.begin() as session:
        h = History(session)
        live_scorer(h)
        for i in range(4):
            h.record(f"txn-near-{i}", T0 + (3 + i) * S, pod="fraud-scorer-0")
    runner = CliRunner()
    res = runner.invoke(cli, ["attribute", "--all", "--clock-skew-s", "5", "--database-url", database_url])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["attribute", "--database-url", database_url])
    assert res.exit_code == 0, res.output
    assert "attributed 0 transaction(s)\n" in res.output and "changed verdict" not in res.output
    assert "re-evaluated 3 unattributed/ambiguous transaction(s)" in res.output and ": 0 changed" in res.output
    with sessions() as session:
        assert {r.status for r in session.execute(select(Lineage)).scalars()} == {"exact", "ambiguous"}
