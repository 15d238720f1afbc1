"""Attribution of a record whose pod the watcher never observed (collector/lineage.py, step 2).

Newcomer repro: a record with ``pod_id 00000000-0000-0000-0000-000000000001`` and pod name
``ghost-pod-1``, neither known to the watcher at that time, was ``unattributed`` / ``no-claim`` —
"the pod had no claim", stated without evidence. No pod matched its pod reference: ``no-pod``.
The neighbouring cases keep their reasons. Histories are built with ``tests.test_lineage.History``
on SQLite and PostgreSQL; the segment timeline (``attribute_run``), the per-record rule
(``lineage_select``) and ``trace`` must agree.
"""

from __future__ import annotations

from collector.lineage import attribute_run, lineage_select, trace, verify_lineage
from tests.test_lineage import (  # noqa: F401 - hist is a fixture
    CLUSTER, GPU_A, S, T0, hist, lineage_of, single_gpu_pod,
)

GHOST_UID = "00000000-0000-0000-0000-000000000001"


def test_a_pod_never_observed_is_no_pod_not_no_claim(hist):
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    risk, _ = single_gpu_pod(h, "fraud-scorer-7c9d4-s2rld", "gpu-node-a", "gpu-0", T0, T0 + 600 * S)
    # a pod observed without any claim (its template claim was not needed): the watcher knows it
    no_claim_pod = h.pod("batch-report-x1", "gpu-node-a", T0, claims={"gpu": None}, containers={"main": [("gpu", "")]})
    # a pod observed only from T0 + 900 s on (another uid than the ghost's)
    later = h.pod("late-scorer-0", "gpu-node-a", T0 + 900 * S, claims={}, containers={})
    t = T0 + 60 * S
    recs = {
        # the tester's record: uid and name both unknown at t
        "ghost uid and name": h.record("ATT-GHOST", t, pod_uid=GHOST_UID, pod="ghost-pod-1", node="gpu-node-a"),
        "ghost uid only": h.record("ATT-GHOST-UID", t, pod_uid=GHOST_UID, pod=None, namespace=None),
        "ghost name only": h.record("ATT-GHOST-NAME", t, pod="ghost-pod-1"),
        # known pod without a claim: that is evidence, and stays no-claim
        "known pod, no claim": h.record("ATT-NOCLAIM", t, pod_uid=no_claim_pod, pod="batch-report-x1",
                                        container="main"),
        # unknown uid with the namespace/name of a pod observed at t (another uid): a contradiction
        "unknown uid, known name": h.record("ATT-CONFLICT", t, pod_uid=GHOST_UID, pod="fraud-scorer-7c9d4-s2rld"),
        # unknown uid whose name is a pod observed only after t, and one observed only before t
        "unknown uid, name known later": h.record("ATT-LATER", t, pod_uid=GHOST_UID, pod="late-scorer-0"),
        "unknown uid, name known earlier": h.record("ATT-EARLIER", T0 + 1200 * S, pod_uid=GHOST_UID,
                                                    pod="fraud-scorer-7c9d4-s2rld"),
        # a known uid whose pod is observed only before / only after t (far from the skew window)
        "known uid, gone before t": h.record("ATT-GONE", T0 + 1200 * S, pod_uid=risk),
        "known uid, not yet at t": h.record("ATT-NOT-YET", t, pod_uid=later),
        # the positive control: the known pod at t
        "known pod with claim": h.record("ATT-OK", t, pod_uid=risk, pod="fraud-scorer-7c9d4-s2rld", node="gpu-node-a"),
    }
    per_record = {row.record_id: (row.status, row.reason) for row in h.s.execute(lineage_select(cluster=CLUSTER))}
    summary = attribute_run(h.s, cluster=CLUSTER)
    got = {label: (lineage_of(h.s, r)["status"], lineage_of(h.s, r)["reason"]) for label, r in recs.items()}
    no_pod = ("unattributed", "no-pod")
    assert got == {
        "ghost uid and name": no_pod,
        "ghost uid only": no_pod,
        "ghost name only": no_pod,
        "known pod, no claim": ("unattributed", "no-claim"),
        "unknown uid, known name": ("unattributed", "pod-identity-conflict"),
        "unknown uid, name known later": no_pod,
        "unknown uid, name known earlier": no_pod,
        "known uid, gone before t": no_pod,
        "known uid, not yet at t": no_pod,
        "known pod with claim": ("exact", None),
    }
    assert {recs[label]: v for label, v in got.items()} == per_record  # segment timeline = per-record rule
    assert summary.as_json()["by_reason"] == {"no-pod": 7, "no-claim": 1, "pod-identity-conflict": 1}

    ghost = lineage_of(h.s, recs["ghost uid and name"])
    # the record's own uid is kept; nothing is resolved from it
    assert (ghost["candidates"], ghost["pod_uid"], ghost["node_name"], ghost["claim_name"],
            ghost["physical_gpu_uuid"]) == (0, GHOST_UID, None, None, None)
    [doc] = trace(h.s, ["ATT-GHOST"], cluster=CLUSTER)
    assert (doc["status"], doc["reason"]) == no_pod
    assert verify_lineage(h.s).ok


def test_a_ghost_uid_is_no_pod_in_a_coverage_gap_neither_way(hist):
    """Coverage comes first: an unknown uid inside a gap is a coverage-gap, as any other record."""
    h = hist
    h.gap("Pod", T0 + 100 * S, T0 + 200 * S)
    inside = h.record("ATT-GHOST-GAP", T0 + 150 * S, pod_uid=GHOST_UID, pod="ghost-pod-1")
    outside = h.record("ATT-GHOST-OUT", T0 + 300 * S, pod_uid=GHOST_UID, pod="ghost-pod-1")
    attribute_run(h.s, cluster=CLUSTER)
    assert (lineage_of(h.s, inside)["reason"], lineage_of(h.s, outside)["reason"]) == ("coverage-gap", "no-pod")
