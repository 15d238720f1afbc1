"""A result's device is resolved as allocated, not at the transaction's time (collector/lineage.py, step 5).

dra-api.md §0.2 and §9: the claim records driver/pool/device names; the UUID lives in the
ResourceSlice, which can change or vanish later: join at allocation time and keep the UUIDs.
Breaker repros (s2_slice.py, s7_overlap.py): the kubelet deletes a node's ResourceSlices when it
restarts (and a driver plugin unregistering during an upgrade removes them) while claims stay
allocated and pods keep running — every transaction then was ``no-device-record``; a slice
republished with a device's UUID changed re-attributed a running allocation to the new UUID and hid
a sharing. The segment timeline (``attribute_run``), the per-record rule (``lineage_select``),
``trace`` (stored and computed) and ``ledger verify``'s re-run must agree. SQLite and PostgreSQL.
"""

from __future__ import annotations

from sqlalchemy import select

from collector.lineage import attribute_run, lineage_select, trace, verify_lineage
from collector.store.models import Lineage
from tests.test_lineage import (  # noqa: F401 - hist is a fixture
    A100, CLUSTER, GPU_A, GPU_B, S, T0, hist, lineage_of, single_gpu_pod,
)

NEW = "GPU-00000000-1111-4222-8333-444444444444"


def _rule_agrees(h) -> dict[int, tuple]:
    """Attribute with a run; assert the per-record rule gives the same rows; the rows by record."""
    cols = ("record_id", "status", "reason", "candidates", "pod_uid", "node_name", "physical_gpu_uuid",
            "device_uuid", "device_state_id", "product_name")
    per_record = h.s.execute(lineage_select(cluster=CLUSTER)).all()
    want = {r.record_id: tuple(getattr(r, c) for c in cols) for r in per_record}
    attribute_run(h.s, cluster=CLUSTER, settle_s=0)
    got = {r.record_id: tuple(getattr(r, c) for c in cols) for r in h.s.execute(select(Lineage)).scalars()}
    assert got == want
    assert verify_lineage(h.s).ok
    return got


def _computed_trace(h, txn: str) -> dict:
    """``trace`` of ``txn`` before any run: attributed on the fly (nothing stored)."""
    [computed] = trace(h.s, [txn], cluster=CLUSTER)
    return computed


def test_slices_deleted_while_the_allocation_holds_keep_its_gpu(hist):
    """Kubelet restart: every ResourceSlice of gpu-node-a deleted at T0+300 s, republished at T0+900 s;
    the claim stays allocated and the pod runs throughout."""
    h = hist
    before_id = h.gpu("gpu-node-a", "gpu-0", GPU_A, T0 - 3600 * S, T0 + 300 * S)
    h.gpu("gpu-node-a", "gpu-0", GPU_A, T0 + 900 * S, generation=2)
    uid, claim = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0)
    t_gone = T0 + 600 * S
    rec = h.record("txn-slices-gone", t_gone, pod_uid=uid)
    h.record("txn-slices-back", T0 + 1200 * S, pod_uid=uid)
    computed = _computed_trace(h, "txn-slices-gone")

    rows = _rule_agrees(h)
    row = lineage_of(h.s, rec)
    assert (row["status"], row["reason"], row["physical_gpu_uuid"], row["device_uuid"], row["product_name"],
            row["node_name"]) == ("exact", None, GPU_A, GPU_A, A100, "gpu-node-a")
    assert rows[rec][8] == before_id  # the record in force when the claim was allocated
    assert {r[1:3] for r in rows.values()} == {("exact", None)}
    [stored] = trace(h.s, ["txn-slices-gone"], cluster=CLUSTER)
    for doc in (computed, stored):
        assert (doc["status"], doc["physical_gpu_uuid"], doc["claim"]["uid"]) == ("exact", GPU_A, claim["uid"])
    assert computed["attribution"] == "computed" and stored["attribution"] == "stored"


def test_a_uuid_republished_under_a_running_allocation_does_not_move_it_nor_hide_a_sharing(hist):
    """gen 1: gpu-0 = GPU_A. At T0+300 s the pool is republished at gen 2 with gpu-0 = NEW and
    gpu-1 = GPU_A (driver restart renumbering). Pod Y was allocated gpu-0 before (GPU_A); pod X is
    allocated gpu-1 after (GPU_A): both are on GPU_A, each the other's co-tenant."""
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A, T0 - 3600 * S, T0 + 300 * S, generation=1)
    h.gpu("gpu-node-a", "gpu-0", NEW, T0 + 300 * S, generation=2)
    h.gpu("gpu-node-a", "gpu-1", GPU_A, T0 + 300 * S, generation=2)
    y, _ = single_gpu_pod(h, "pod-y", "gpu-node-a", "gpu-0", T0)
    x = h.pod("pod-x", "gpu-node-a", T0 + 400 * S, namespace="kyc-docs", claims={"gpu": "x-gpu"},
              containers={"triton": [("gpu", "")]})
    h.claim("x-gpu", T0 + 400 * S, namespace="kyc-docs", results=[("gpu", "gpu-node-a", "gpu-1")],
            consumers=[(x, "pod-x", T0 + 400 * S, None)], owner=x)
    t = T0 + 600 * S
    ry = h.record("S7-Y", t, pod_uid=y)
    rx = h.record("S7-X", t, pod_uid=x, namespace="kyc-docs", pod="pod-x")
    computed = {txn: _computed_trace(h, txn) for txn in ("S7-Y", "S7-X")}

    _rule_agrees(h)
    assert (lineage_of(h.s, ry)["status"], lineage_of(h.s, ry)["physical_gpu_uuid"]) == ("exact", GPU_A)
    assert (lineage_of(h.s, rx)["status"], lineage_of(h.s, rx)["physical_gpu_uuid"]) == ("exact", GPU_A)
    stored = {d["transaction_id"]: d for d in trace(h.s, ["S7-Y", "S7-X"], cluster=CLUSTER)}
    for docs in (computed, stored):
        assert [c["pod_uid"] for c in docs["S7-Y"]["co_tenants"]] == [x]
        assert [c["pod_uid"] for c in docs["S7-X"]["co_tenants"]] == [y]
        assert docs["S7-Y"]["physical_gpu_uuid"] == docs["S7-X"]["physical_gpu_uuid"] == GPU_A


def test_a_slice_observed_after_the_claim_names_its_device_and_one_outside_the_episode_does_not(hist):
    """The slice of gpu-node-b is first observed 0.5 s after the claim (watcher just started): its
    first record within the episode resolves the device. gpu-node-c's slice vanished before its claim
    was allocated and came back after the episode: no record in the episode's lifetime."""
    h = hist
    late_id = h.gpu("gpu-node-b", "gpu-1", GPU_B, T0 + 500_000_000)
    h.gpu("gpu-node-c", "gpu-2", GPU_A, T0 - 3600 * S, T0 - 100 * S)
    h.gpu("gpu-node-c", "gpu-2", GPU_A, T0 + 1000 * S, generation=2)
    late, _ = single_gpu_pod(h, "fraud-scorer-1", "gpu-node-b", "gpu-1", T0)
    none, _ = single_gpu_pod(h, "fraud-scorer-2", "gpu-node-c", "gpu-2", T0, T0 + 900 * S)
    r_late = h.record("txn-late-slice", T0 + 60 * S, pod_uid=late)
    r_none = h.record("txn-no-slice", T0 + 60 * S, pod_uid=none)

    rows = _rule_agrees(h)
    assert rows[r_late][1:3] == ("exact", None) and rows[r_late][6] == GPU_B and rows[r_late][8] == late_id
    assert (lineage_of(h.s, r_none)["status"], lineage_of(h.s, r_none)["reason"],
            lineage_of(h.s, r_none)["physical_gpu_uuid"]) == ("unattributed", "no-device-record", None)


def test_the_newest_generation_as_allocated_wins_and_two_equal_records_are_not_a_guess(hist):
    """At allocation time two slices publish gpu-0 (gen 3 GPU_B, gen 4 GPU_A): gen 4. Two records of
    one generation naming different GPUs at allocation time: several-devices, never one of them."""
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_B, T0 - 3600 * S, generation=3)
    h.gpu("gpu-node-a", "gpu-0", GPU_A, T0 - 600 * S, generation=4)
    h.gpu("gpu-node-b", "gpu-1", GPU_A, T0 - 3600 * S, generation=1)
    h.gpu("gpu-node-b", "gpu-1", GPU_B, T0 - 3600 * S, generation=1)
    a, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0)
    b, _ = single_gpu_pod(h, "fraud-scorer-1", "gpu-node-b", "gpu-1", T0)
    ra = h.record("txn-gen", T0 + 60 * S, pod_uid=a)
    rb = h.record("txn-tie", T0 + 60 * S, pod_uid=b)

    rows = _rule_agrees(h)
    assert rows[ra][1:3] == ("exact", None) and rows[ra][6] == GPU_A
    assert rows[rb][1:4] == ("ambiguous", "several-devices", 2) and rows[rb][6] is None


def test_trace_statement_stays_short_enough_for_psycopg_to_cache():
    """``_TRACE`` (one statement per traced id) with the as-allocated device test: psycopg caches the
    conversion to ``$n`` placeholders only for query texts up to 4096 characters."""
    from sqlalchemy.dialects import postgresql

    from collector.lineage import _TRACE

    assert len(str(_TRACE.compile(dialect=postgresql.dialect(paramstyle="pyformat")))) < 4096


def test_a_device_record_change_within_the_tolerance_of_the_allocation_is_not_ordered_by_the_watcher(hist):
    """breaker-attr2 n3_flip.py, n1_near.py, n4_del.py (F1): the watcher orders the ResourceClaim and
    ResourceSlice streams as it happened to receive them (watch-semantics.md §9), so a change of the
    device's record 40 ms before or after the allocation's first sighting cannot be ordered against
    it. gpu-0 republished GPU_A -> NEW (gen 2) 40 ms before (slice first) or after (claim first) the
    claim: both records are candidates, ``ambiguous``/``several-devices`` with 2 candidates, in
    either order — it was ``exact`` on whichever the watcher ordered first. A record deleted 40 ms
    before or after, none after: the only record the allocation can have been made from (a deleted
    slice allocates nothing), ``exact`` on it in either order — it was ``no-device-record`` slice
    first. Republished with the same UUID: the GPU as now, on the record as allocated."""
    h = hist
    s = T0 + 100 * S
    flips, dels = {}, {}
    for i, (order, change) in enumerate((("slice-first", s - 40_000_000), ("claim-first", s + 40_000_000))):
        node = f"gpu-node-{i}"
        h.gpu(node, "gpu-0", GPU_A, T0 - 3600 * S, change, generation=1)
        h.gpu(node, "gpu-0", NEW, change, generation=2)
        uid, _ = single_gpu_pod(h, f"flip-{order}", node, "gpu-0", s)
        flips[order] = h.record(f"N3-{order}", s + 60 * S, pod_uid=uid)
        dnode = f"gpu-node-d{i}"
        h.gpu(dnode, "gpu-0", GPU_B, T0 - 3600 * S, change)
        uid, _ = single_gpu_pod(h, f"del-{order}", dnode, "gpu-0", s)
        dels[order] = h.record(f"N4-{order}", s + 60 * S, pod_uid=uid)
    kept = h.gpu("gpu-node-s", "gpu-0", GPU_A, T0 - 3600 * S, s + 40_000_000, generation=1)
    h.gpu("gpu-node-s", "gpu-0", GPU_A, s + 40_000_000, generation=2)
    uid, _ = single_gpu_pod(h, "same-uuid", "gpu-node-s", "gpu-0", s)
    same = h.record("N-SAME", s + 60 * S, pod_uid=uid)
    computed = {o: _computed_trace(h, f"N3-{o}") for o in flips}

    rows = _rule_agrees(h)
    for order, rec in flips.items():
        assert rows[rec][1:4] == ("ambiguous", "several-devices", 2) and rows[rec][6] is None, order
        [stored] = trace(h.s, [f"N3-{order}"], cluster=CLUSTER)
        for doc in (computed[order], stored):
            assert (doc["status"], doc["reason"], doc["candidates"], doc["physical_gpu_uuid"]) == (
                "ambiguous", "several-devices", 2, None)
    for order, rec in dels.items():
        assert rows[rec][1:4] == ("exact", None, 1) and rows[rec][6] == GPU_B, order
    assert rows[same][1:3] == ("exact", None) and rows[same][6] == GPU_A and rows[same][8] == kept
    # a tolerance below 40 ms orders them
    attribute_run(h.s, all=True, cluster=CLUSTER, clock_skew_s=0.01, settle_s=0)
    got = {o: h.s.execute(select(Lineage.status, Lineage.physical_gpu_uuid).where(Lineage.record_id == r)).one()
           for o, r in flips.items()}
    assert got == {"slice-first": ("exact", NEW), "claim-first": ("exact", GPU_A)}
    assert verify_lineage(h.s).ok


def test_an_allocation_first_seen_after_a_coverage_gap_has_every_record_since_the_gap_as_candidate(hist):
    """breaker-attr2 g1_gap.py (F2): the collector was down over [+100 s, +110 s) (the ResourceSlice
    watch back at +103 s); meanwhile the claim was allocated gpu-0 (then GPU_A) and a driver upgrade
    republished the pool (gpu-0 = NEW, from +103 s as the watcher saw it). The episode is first seen
    in the ResourceClaim watch's first listing after the gap, +110.001 s: the allocation happened at
    an unknown time in the gap, so every record of gpu-0 valid since the gap began is a candidate —
    ``several-devices``, not ``exact`` on NEW (which hid a sharing of GPU_A). An allocation first
    seen 40 s after the gap is dated by the watcher: exact on NEW."""
    h = hist
    h.gap("ResourceClaim", T0 + 100 * S, T0 + 110 * S)
    h.gap("ResourceSlice", T0 + 100 * S, T0 + 103 * S)
    h.gap("Pod", T0 + 100 * S, T0 + 110 * S)
    h.gpu("gpu-node-a", "gpu-0", GPU_A, T0 - 3600 * S, T0 + 103 * S, generation=1)
    h.gpu("gpu-node-a", "gpu-0", NEW, T0 + 103 * S, generation=2)
    in_gap, _ = single_gpu_pod(h, "p1", "gpu-node-a", "gpu-0", T0 + 110 * S + 1_000_000)
    later, _ = single_gpu_pod(h, "p2", "gpu-node-a", "gpu-0", T0 + 150 * S)
    rec = h.record("G1-P1", T0 + 200 * S, pod_uid=in_gap, pod="p1")
    ctl = h.record("G1-LATER", T0 + 200 * S, pod_uid=later, pod="p2")
    computed = _computed_trace(h, "G1-P1")

    rows = _rule_agrees(h)
    assert rows[rec][1:4] == ("ambiguous", "several-devices", 2) and rows[rec][6] is None
    assert rows[ctl][1:3] == ("exact", None) and rows[ctl][6] == NEW
    [stored] = trace(h.s, ["G1-P1"], cluster=CLUSTER)
    for doc in (computed, stored):
        assert (doc["status"], doc["reason"], doc["candidates"]) == ("ambiguous", "several-devices", 2)


def test_a_record_appearing_later_than_the_tolerance_after_the_allocation_names_no_device(hist):
    """breaker-attr2 n5_late.py (F3): gpu-0's slice gone before the claim (+300 s), republished with
    NEW 4 s after it: the fallback "first record within the episode" made every transaction exact
    on NEW, also those before NEW existed. A record is the device as allocated only if it appeared
    within the tolerance (2 s) of the allocation — beyond, the allocation's transactions are
    ``no-device-record`` (which UUID the device had when allocated is unknown). One appearing 1.5 s
    after is still the device's. A slice first listed when its watch resynced after a gap of the
    ResourceSlice watch (+100..+105 s) around the allocation (+100 s) is the record of that time."""
    h = hist
    h.gap("ResourceSlice", T0 + 90 * S, T0 + 105 * S)
    s = T0 + 300 * S
    h.gpu("gpu-node-a", "gpu-0", GPU_A, T0 - 3600 * S, T0 + 250 * S)
    h.gpu("gpu-node-a", "gpu-0", NEW, s + 4 * S, generation=2)
    late, _ = single_gpu_pod(h, "late-4s", "gpu-node-a", "gpu-0", s)
    h.gpu("gpu-node-b", "gpu-1", GPU_B, s + 1_500_000_000)
    near, _ = single_gpu_pod(h, "late-1-5s", "gpu-node-b", "gpu-1", s)
    h.gpu("gpu-node-c", "gpu-2", GPU_A, T0 + 105 * S)
    resync, _ = single_gpu_pod(h, "slice-gap", "gpu-node-c", "gpu-2", T0 + 100 * S)
    recs = {"before NEW": h.record("N5-BEFORE", s + 3 * S, pod_uid=late),
            "after NEW": h.record("N5-AFTER", s + 60 * S, pod_uid=late),
            "1.5 s": h.record("N5-NEAR", s + 60 * S, pod_uid=near),
            "slice watch resync": h.record("N5-RESYNC", s + 60 * S, pod_uid=resync)}
    computed = _computed_trace(h, "N5-BEFORE")

    rows = _rule_agrees(h)
    got = {k: (rows[r][1], rows[r][2], rows[r][6]) for k, r in recs.items()}
    assert got == {"before NEW": ("unattributed", "no-device-record", None),
                   "after NEW": ("unattributed", "no-device-record", None),
                   "1.5 s": ("exact", None, GPU_B), "slice watch resync": ("exact", None, GPU_A)}
    [stored] = trace(h.s, ["N5-BEFORE"], cluster=CLUSTER)
    for doc in (computed, stored):
        assert (doc["status"], doc["reason"], doc["physical_gpu_uuid"]) == ("unattributed", "no-device-record", None)
