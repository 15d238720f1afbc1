"""A record's pod identity is checked against the history whichever way it names its pod
(collector/lineage.py, step 2): by uid, and by namespace/name.

Breaker repros: s8_apptime.py + s8b_node.py — a line without a pod uid naming node gpu-node-a was
``exact`` to the same-name pod recreated on gpu-node-b (the uid path called the same line
``pod-identity-conflict``); s5_stale_uid.py — Fluent Bit's metadata cache, keyed by namespace and
pod name, stamps the old pod's uid on a StatefulSet pod recreated under the same name: the record
was ``no-pod`` with no contradiction listed, though its namespace/name were a pod recorded then.
The segment timeline (``attribute_run``), the per-record rule (``lineage_select``), ``trace``
(stored and computed) and ``ledger verify`` agree. SQLite and PostgreSQL.
"""

from __future__ import annotations

from collector.lineage import attribute_run, lineage_select, trace, verify_lineage
from tests.test_lineage import (  # noqa: F401 - hist is a fixture
    CLUSTER, GPU_A, GPU_B, S, T0, hist, lineage_of, single_gpu_pod,
)

CONFLICT = ("unattributed", "pod-identity-conflict")


def _verdicts(h, records: dict[str, int]) -> dict[str, tuple]:
    """Attribute (run and per-record rule must agree); (status, reason, GPU) per name."""
    per_record = {r.record_id: (r.status, r.reason, r.physical_gpu_uuid)
                  for r in h.s.execute(lineage_select(cluster=CLUSTER))}
    attribute_run(h.s, cluster=CLUSTER, settle_s=0)
    got = {}
    for name, rec in records.items():
        row = lineage_of(h.s, rec)
        got[name] = (row["status"], row["reason"], row["physical_gpu_uuid"])
        assert got[name] == per_record[rec], name
    assert verify_lineage(h.s).ok
    return got


def _recreated(h) -> tuple[str, str]:
    """fraud-scorer-0 on gpu-node-a (GPU_A) until +600 s, recreated under that name on gpu-node-b
    (GPU_B) from +610 s."""
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    h.gpu("gpu-node-b", "gpu-1", GPU_B)
    first, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0, T0 + 600 * S)
    second, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-b", "gpu-1", T0 + 610 * S)
    return first, second


def test_a_line_by_name_whose_node_is_not_its_pods_is_a_conflict_not_exact(hist):
    h = hist
    first, second = _recreated(h)
    t = T0 + 900 * S
    records = {
        "name, wrong node": h.record("S8B-NAME-WRONG-NODE", t, pod="fraud-scorer-0", node="gpu-node-a"),
        "uid, wrong node": h.record("S8B-UID-WRONG-NODE", t, pod_uid=second, pod="fraud-scorer-0", node="gpu-node-a"),
        "name, right node": h.record("name-right-node", t, pod="fraud-scorer-0", node="gpu-node-b"),
        "name, no node": h.record("name-no-node", t, pod="fraud-scorer-0"),
        "name, first pod's node then": h.record("name-first", T0 + 300 * S, pod="fraud-scorer-0", node="gpu-node-a"),
    }
    [computed] = trace(h.s, ["S8B-NAME-WRONG-NODE"], cluster=CLUSTER)
    got = _verdicts(h, records)
    assert got == {
        "name, wrong node": (*CONFLICT, None), "uid, wrong node": (*CONFLICT, None),
        "name, right node": ("exact", None, GPU_B), "name, no node": ("exact", None, GPU_B),
        "name, first pod's node then": ("exact", None, GPU_A)}
    [stored] = trace(h.s, ["S8B-NAME-WRONG-NODE"], cluster=CLUSTER)
    for doc in (computed, stored):
        assert (doc["status"], doc["reason"], doc["physical_gpu_uuid"], doc["pod"]["uid"]) == (*CONFLICT, None, None)
        assert doc["identity_conflict"] == [{"field": "node", "record": "gpu-node-a", "observed": "gpu-node-b"}]


def test_by_name_two_pods_of_the_name_one_on_the_records_node_stay_several_pods(hist):
    """Observed overlap of two pods of one name (old one not yet gone): the record's node matches one
    of them — that is no contradiction, and no resolution either: several-pods, as without a node."""
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    h.gpu("gpu-node-b", "gpu-1", GPU_B)
    single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0, T0 + 620 * S)
    single_gpu_pod(h, "fraud-scorer-0", "gpu-node-b", "gpu-1", T0 + 600 * S)
    t = T0 + 610 * S
    records = {"a": h.record("overlap-a", t, pod="fraud-scorer-0", node="gpu-node-a"),
               "c": h.record("overlap-c", t, pod="fraud-scorer-0", node="gpu-node-c")}
    got = _verdicts(h, records)
    assert got == {"a": ("ambiguous", "several-pods", None), "c": (*CONFLICT, None)}



def test_a_stale_uid_of_a_same_name_pod_is_a_conflict_naming_both_uids(hist):
    """s5_stale_uid.py: the new fraud-scorer-0 (gpu-node-b) logs with the old pod's uid (and, once,
    the old pod's host) from Fluent Bit's cache. The old uid has pod states, none at t; the name at
    t is the new pod: a conflict, unattributed, with the uid contradiction listed — not no-pod, and
    never the new pod's GPU."""
    h = hist
    first, second = _recreated(h)
    t = T0 + 900 * S
    records = {
        "stale uid": h.record("S5-STALE-UID", t, pod_uid=first, pod="fraud-scorer-0", node="gpu-node-b"),
        "stale uid and host": h.record("S5-STALE-UID-HOST", t, pod_uid=first, pod="fraud-scorer-0",
                                       node="gpu-node-a"),
        # the old pod's own line while it ran, and a stale uid with a name no pod had at t
        "old pod then": h.record("S5-OLD", T0 + 300 * S, pod_uid=first, pod="fraud-scorer-0", node="gpu-node-a"),
        "stale uid, other name": h.record("S5-OTHER", t, pod_uid=first, pod="batch-report-0"),
    }
    [computed] = trace(h.s, ["S5-STALE-UID"], cluster=CLUSTER)
    got = _verdicts(h, records)
    assert got == {"stale uid": (*CONFLICT, None), "stale uid and host": (*CONFLICT, None),
                   "old pod then": ("exact", None, GPU_A), "stale uid, other name": ("unattributed", "no-pod", None)}
    stored = {d["transaction_id"]: d for d in trace(h.s, ["S5-STALE-UID", "S5-STALE-UID-HOST"], cluster=CLUSTER)}
    for doc in (computed, stored["S5-STALE-UID"], stored["S5-STALE-UID-HOST"]):
        assert (doc["status"], doc["reason"], doc["physical_gpu_uuid"], doc["pod"]["uid"]) == (*CONFLICT, None, first)
        assert doc["identity_conflict"] == [{"field": "uid", "record": first, "observed": second}]


def test_a_conflict_within_the_tolerance_of_a_pod_recreation_is_a_skew_window(hist):
    """p2_lag.py, p3_lag_node.py (F4): fraud-scorer-0 (U1, gpu-node-a) observed gone at +600 s, its
    replacement U2 of the same name observed from +600.02 s (same node, or gpu-node-b). A line of U2
    50 ms before U1's end as the watcher observed it — with U2's own uid, or without a uid naming
    gpu-node-b — and a line of U1 50 ms after: the watcher's observation lags, and which pod held the
    name then is within the tolerance (2 s) of the states compared: ``skew-window``, as before the
    identity checks, never the verdict of one instant (``pod-identity-conflict``). Far from the
    swap, the same contradictions stay conflicts."""
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    h.gpu("gpu-node-b", "gpu-1", GPU_B)
    gone, back = T0 + 600 * S, T0 + 600 * S + 20_000_000
    u1, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0, gone)
    same, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", back, T0 + 1200 * S)
    moved, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-b", "gpu-1", T0 + 1200 * S + 20_000_000)
    swap2 = T0 + 1200 * S
    skew = ("ambiguous", "skew-window", None)
    records = {
        "U2 own uid early": h.record("P2-U2-EARLY", gone - 50_000_000, pod_uid=same, pod="fraud-scorer-0",
                                     node="gpu-node-a"),
        "U1 own uid late": h.record("P2-U1-LATE", back + 30_000_000, pod_uid=u1, pod="fraud-scorer-0",
                                    node="gpu-node-a"),
        "by name, new node, early": h.record("P3-U2-EARLY", swap2 - 50_000_000, pod="fraud-scorer-0",
                                             node="gpu-node-b"),
        "by name, old node, late": h.record("P3-U1-LATE", swap2 + 70_000_000, pod="fraud-scorer-0",
                                            node="gpu-node-a"),
        "stale uid far from the swap": h.record("STALE-FAR", T0 + 900 * S, pod_uid=u1, pod="fraud-scorer-0"),
        "by name, wrong node far": h.record("NODE-FAR", T0 + 1500 * S, pod="fraud-scorer-0", node="gpu-node-a"),
    }
    computed = {d["transaction_id"]: d for d in trace(h.s, ["P2-U2-EARLY", "P3-U2-EARLY"], cluster=CLUSTER)}
    got = _verdicts(h, records)
    assert got == {"U2 own uid early": skew, "U1 own uid late": skew, "by name, new node, early": skew,
                   "by name, old node, late": skew, "stale uid far from the swap": (*CONFLICT, None),
                   "by name, wrong node far": (*CONFLICT, None)}
    stored = {d["transaction_id"]: d for d in trace(h.s, ["P2-U2-EARLY", "P3-U2-EARLY"], cluster=CLUSTER)}
    for docs in (computed, stored):
        for txn in ("P2-U2-EARLY", "P3-U2-EARLY"):
            assert (docs[txn]["status"], docs[txn]["reason"], docs[txn]["physical_gpu_uuid"]) == skew
    # a tolerance below 50 ms: the instant's contradiction decides
    attribute_run(h.s, all=True, cluster=CLUSTER, clock_skew_s=0.01, settle_s=0)
    assert lineage_of(h.s, records["U2 own uid early"])["reason"] == "pod-identity-conflict"
    assert verify_lineage(h.s).ok
