"""``draudit trace``'s ``co_tenants`` (collector/lineage.py, ``co_tenants`` and ``_TRACE``): who else was
on the transaction's physical GPU around its instant.

Two defects a breaker found: a ``reservedFor`` entry that is not a pod (a ``scheduling.k8s.io``
PodGroup, dra-api.md §9: "treat unknown ``reservedFor.resource`` values as non-pod consumers") was
listed as a pod named after the group; and co-tenants were read at the transaction's instant only,
while the collector's observation times are accurate to the clock-skew tolerance: a tenant whose
allocation or reservation started or ended within it was silently listed or left out. Every
co-tenant is now listed with its kind (``consumer``) and whether it held the GPU over the whole
window (``certain``).

Histories as in tests/test_lineage.py (projection rows), and one through the fake API server and the
watcher, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json

from click.testing import CliRunner
from sqlalchemy import event, insert

from collector.cli import cli
from collector.lineage import _TRACE, attribute_run, co_tenants, trace
from collector.sim.dra_objects import allocate, claim_spec, make_claim, make_claim_template
from collector.store.models import ClaimConsumer
from tests.test_lineage import (  # noqa: F401 - hist is a fixture
    CLUSTER,
    GPU_A,
    NS,
    S,
    T0,
    History,
    hist,
    single_gpu_pod,
)

MS = 1_000_000
PRECISION = MS  # History.record: event times with ms precision
PODGROUP_UID = "7d1c2b3a-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


def mig(h: History, n: int) -> str:
    """MIG slice ``n`` of GPU A on gpu-node-a; returns the device name."""
    device = f"gpu-0-mig-1g10gb-19-{n}"
    h.gpu("gpu-node-a", device, f"MIG-{n:08x}-1111-5222-8333-444455556666", parent=GPU_A, profile="1g.10gb")
    return device


def podgroup_claim(h: History, device: str, start: int, *, pod: tuple[str, str] | None = None) -> dict:
    """Claim ``trainer-gpu`` in ``ml-train`` on ``device`` since ``start``, reserved for the PodGroup
    ``trainer-group`` (``reservedFor`` as a 1.36 gang-scheduled workload has it) and, when ``pod``
    (uid, name) is given, for that pod too."""
    claim = h.claim("trainer-gpu", start, results=[("gpu", "gpu-node-a", device)],
                    consumers=[pod + (start, None)] if pod else [], namespace="ml-train")
    h.s.execute(insert(ClaimConsumer).values(
        cluster=CLUSTER, claim_uid=claim["uid"], episode_id=claim["episode"], consumer_api_group="scheduling.k8s.io",
        consumer_resource="podgroups", consumer_name="trainer-group", consumer_uid=PODGROUP_UID, valid_from_ns=start,
        valid_to_ns=None))
    return claim


def by_name(docs: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for c in docs}


# --------------------------------------------------------------------------------------------
# 1. a consumer that is not a pod
# --------------------------------------------------------------------------------------------


def test_a_podgroup_consumer_is_listed_with_its_kind_never_as_a_pod(hist, database_url, monkeypatch):
    """The PodGroup reserving a claim on another slice of the GPU is a co-tenant (the GPU was shared),
    shown as ``podgroups.scheduling.k8s.io`` with ``pod``/``pod_uid`` null; a pod reserving the same
    claim keeps the pod keys. Same in the stored trace, on the fly, in ``co_tenants`` and in the table."""
    h = hist
    scorer, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", mig(h, 0), T0)
    worker = h.pod("trainer-worker-0", "gpu-node-a", T0, claims={"gpu": "trainer-gpu"},
                   containers={"train": [("gpu", "")]}, namespace="ml-train")
    podgroup_claim(h, mig(h, 1), T0, pod=(worker, "trainer-worker-0"))
    t = T0 + 600 * S
    h.record("TXN-PG-1", t, pod_uid=scorer)
    expected = [
        {"namespace": "ml-train", "pod": None, "pod_uid": None, "claim": "trainer-gpu",
         "consumer": "podgroups.scheduling.k8s.io", "name": "trainer-group", "uid": PODGROUP_UID, "certain": True},
        {"namespace": "ml-train", "pod": "trainer-worker-0", "pod_uid": worker, "claim": "trainer-gpu",
         "consumer": "pod", "name": "trainer-worker-0", "uid": worker, "certain": True},
    ]
    for attributed in (False, True):
        if attributed:
            attribute_run(h.s, cluster=CLUSTER)
        (doc,) = trace(h.s, ["TXN-PG-1"], cluster=CLUSTER)
        assert (doc["status"], doc["physical_gpu_uuid"], doc["attribution"]) == (
            "exact", GPU_A, "stored" if attributed else "computed")
        assert doc["co_tenants"] == expected
    assert co_tenants(h.s, cluster=CLUSTER, physical_gpu_uuid=GPU_A, t_ns=t, exclude_pod_uid=scorer,
                      precision_ns=PRECISION) == expected

    h.s.commit()
    monkeypatch.setenv("DRAUDIT_CLUSTER", CLUSTER)
    res = CliRunner().invoke(cli, ["trace", "TXN-PG-1", "--database-url", database_url])
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if "trainer" in line]
    assert lines == [
        f"co-tenants    ml-train/trainer-group (podgroups.scheduling.k8s.io, not a pod) uid={PODGROUP_UID} "
        "claim=trainer-gpu",
        f"              ml-train/trainer-worker-0 uid={worker} claim=trainer-gpu",
    ]
    res = CliRunner().invoke(cli, ["trace", "TXN-PG-1", "--database-url", database_url, "--output", "json"])
    assert json.loads(res.output)[0]["co_tenants"] == expected


def test_a_podgroup_consumer_recorded_by_the_watcher(srv, sessions, database_url, tmp_path, monkeypatch):
    """End to end: the fake API server, the watcher's projections (``reserved_for`` keeps the PodGroup
    with its resource), ingestion, attribution and ``draudit trace --output json``."""
    from tests.test_lineage_through_watch import (DRIVER, GPU_H100, SKEW_S, _fluent_bit_line, _ingest, _inventory,
                                                  _recorded_and_settled, _template_pod_up)
    from collector.lineage import attribute

    _inventory(srv)
    mig_template = make_claim_template("fraud-scorer-mig", NS, spec=claim_spec(device_class="mig.nvidia.com"))
    srv.apply(mig_template)
    scorer, _ = _template_pod_up(srv, "fraud-scorer-small-7c9d4-s2rld", "gpu-node-c", "gpu-0-mig-3g40gb-9-0",
                                 template=mig_template, suffix="x7k2p")
    trainer = srv.apply(make_claim("trainer-gpu", "ml-train", spec=claim_spec(device_class="mig.nvidia.com")))
    trainer = allocate(trainer, [("gpu", DRIVER, "gpu-node-c", "gpu-0-mig-3g40gb-9-4")], node="gpu-node-c")
    trainer["status"]["reservedFor"] = [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups",
                                         "name": "trainer-group", "uid": PODGROUP_UID}]
    srv.apply(trainer)
    t = _recorded_and_settled(srv, sessions)

    _ingest(sessions, database_url, tmp_path, [_fluent_bit_line("TXN-PG-2", t, scorer, "gpu-node-c")])
    with sessions.begin() as s:
        assert attribute(s, cluster=CLUSTER, clock_skew_s=SKEW_S) == {"exact": 1, "ambiguous": 0, "unattributed": 0}
    monkeypatch.setenv("DRAUDIT_CLUSTER", CLUSTER)
    res = CliRunner().invoke(cli, ["trace", "TXN-PG-2", "--database-url", database_url, "--output", "json"])
    assert res.exit_code == 0, res.output
    [doc] = json.loads(res.output)
    assert doc["physical_gpu_uuid"] == GPU_H100
    assert doc["co_tenants"] == [
        {"namespace": "ml-train", "pod": None, "pod_uid": None, "claim": "trainer-gpu",
         "consumer": "podgroups.scheduling.k8s.io", "name": "trainer-group", "uid": PODGROUP_UID, "certain": True}]


# --------------------------------------------------------------------------------------------
# 2. co-tenants within the clock-skew tolerance
# --------------------------------------------------------------------------------------------

T = T0 + 600 * S
SKEW = 2 * S
# tenant pod -> (start, end) of its pod, claim, allocation and reservation, each on its own slice of GPU A
TENANTS = {
    "steady": (T0, None),
    "left-3s-before": (T0, T - 3 * S),
    "left-1s-before": (T0, T - S),
    "came-1s-before": (T - S, None),
    "comes-1s-after": (T + S, None),
    "comes-3s-after": (T + 3 * S, None),
    "brief": (T - S // 2, T + S // 2),
    # the nanosecond edges of the skew test (a transition at b counts when t - skew <= b < t + precision + skew)
    "came-at-t-skew": (T - SKEW, None),
    "came-before-t-skew": (T - SKEW - 1, None),
    "leaves-at-hi": (T0, T + PRECISION + SKEW),
    "leaves-before-hi": (T0, T + PRECISION + SKEW - 1),
}
# at the default tolerance (2 s): listed with ``certain``, or absent (None)
AT_2S = {
    "steady": True, "left-3s-before": None, "left-1s-before": False, "came-1s-before": False,
    "comes-1s-after": False, "comes-3s-after": None, "brief": False,
    "came-at-t-skew": False, "came-before-t-skew": True, "leaves-at-hi": True, "leaves-before-hi": False,
}


def skewed_history(h: History) -> dict[str, str]:
    """The fraud scorer on slice 0 of GPU A all along, each tenant on its own slice; every pod logs a
    transaction at ``T``. Returns tenant name -> pod uid."""
    scorer, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", mig(h, 0), T0)
    uids = {"fraud-scorer-0": scorer}
    for n, (name, (start, end)) in enumerate(TENANTS.items(), start=1):
        uids[name], _ = single_gpu_pod(h, name, "gpu-node-a", mig(h, n), start, end)
    for name, uid in uids.items():
        h.record(f"T-{name}", T, pod_uid=uid)
    return uids


def listed(doc: dict) -> dict[str, bool | None]:
    """pod name -> ``certain`` of each co-tenant."""
    return {c["pod"]: c.get("certain") for c in doc["co_tenants"]}


def test_co_tenants_within_the_tolerance_are_listed_as_possible(hist):
    """The scorer's transaction is exact at ``T``; a tenant whose allocation started or ended within the
    tolerance of ``T`` may or may not have been on the GPU then: listed with ``certain`` false (it
    was left out, or listed as if certain). Those beyond it are listed certain, or absent."""
    h = hist
    skewed_history(h)
    for attributed in (False, True):
        if attributed:
            attribute_run(h.s, cluster=CLUSTER)
        (doc,) = trace(h.s, ["T-fraud-scorer-0"], cluster=CLUSTER)
        assert (doc["status"], doc["physical_gpu_uuid"]) == ("exact", GPU_A)
        assert sorted(listed(doc)) == sorted(name for name, c in AT_2S.items() if c is not None)
        assert listed(doc) == {name: c for name, c in AT_2S.items() if c is not None}


def test_certain_co_tenants_are_those_whose_own_transaction_is_exact_and_traces_name_each_other(hist):
    """Every pod logged at ``T``: a tenant is a certain co-tenant of the scorer exactly when its own
    transaction then is exact (same transitions, same skew test), and two traces at one instant name
    each other or neither."""
    h = hist
    uids = skewed_history(h)
    attribute_run(h.s, cluster=CLUSTER)
    docs = {d["transaction_id"][2:]: d for d in trace(h.s, [f"T-{name}" for name in uids], cluster=CLUSTER)}
    scorer_view = listed(docs["fraud-scorer-0"])
    assert docs["fraud-scorer-0"]["status"] == "exact"
    for name in TENANTS:
        assert (scorer_view.get(name) is True) == (docs[name]["status"] == "exact"), name
    on_gpu = {name: d for name, d in docs.items() if d["physical_gpu_uuid"] == GPU_A}
    assert set(on_gpu) > {"fraud-scorer-0", "steady", "came-1s-before", "came-at-t-skew"}
    for a, doc_a in on_gpu.items():
        for b, doc_b in on_gpu.items():
            if a != b:
                assert (b in listed(doc_a)) == (a in listed(doc_b)), (a, b)
                if doc_a["status"] == doc_b["status"] == "exact":
                    assert listed(doc_a)[b] is listed(doc_b)[a] is True, (a, b)


def test_the_window_is_the_tolerance_the_lineage_row_was_computed_with(hist):
    """A row attributed with a 5 s tolerance lists the tenants within 5 s (as possible), one attributed
    with 0.5 s only those within 0.5 s, whatever the tolerance ``trace`` is called with (it applies to
    records attributed on the fly only)."""
    h = hist
    skewed_history(h)
    attribute_run(h.s, cluster=CLUSTER, clock_skew_s=5.0, all=True)
    (doc,) = trace(h.s, ["T-fraud-scorer-0"], cluster=CLUSTER, clock_skew_s=2.0)
    assert listed(doc) == {name: name == "steady" for name in TENANTS}
    attribute_run(h.s, cluster=CLUSTER, clock_skew_s=0.5, all=True)
    (doc,) = trace(h.s, ["T-fraud-scorer-0"], cluster=CLUSTER, clock_skew_s=2.0)
    assert listed(doc) == {
        "steady": True, "came-1s-before": True, "brief": False, "came-at-t-skew": True,
        "came-before-t-skew": True, "leaves-at-hi": True, "leaves-before-hi": True,
    }


def test_stored_trace_on_the_fly_trace_and_co_tenants_agree(hist):
    """The stored trace (one statement per id), a trace attributing on the fly and ``co_tenants`` (the
    query the latter uses) give the same co-tenants at the same tolerance and precision."""
    h = hist
    uids = skewed_history(h)
    ids = [f"T-{name}" for name in uids]
    live = trace(h.s, ids, cluster=CLUSTER)
    attribute_run(h.s, cluster=CLUSTER)

    statements: list[str] = []
    engine = h.s.get_bind()
    listener = lambda *args: statements.append(args[2])  # noqa: E731 - (conn, cursor, statement, ...)
    event.listen(engine, "before_cursor_execute", listener)
    try:
        stored = trace(h.s, ids, cluster=CLUSTER)
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert len([q for q in statements if not q.startswith("SET LOCAL plan_cache_mode")]) == len(ids)
    assert [d["co_tenants"] for d in stored] == [d["co_tenants"] for d in live]
    for doc in stored:
        if doc["physical_gpu_uuid"] is not None:
            assert doc["co_tenants"] == co_tenants(h.s, cluster=CLUSTER, physical_gpu_uuid=GPU_A, t_ns=T,
                                                   exclude_pod_uid=doc["pod"]["uid"], precision_ns=PRECISION)


def test_an_owner_pod_holds_the_gpu_while_it_runs_whatever_its_reservation_time(hist):
    """A template claim's owner pod counts while it has a state (attribution's step 4): running over
    the whole window, it is certain although its ``reservedFor`` entry was observed 1 s after ``T``;
    gone 1 s before ``T`` (its claim still allocated: deallocation lags) it is only possible — it
    was left out."""
    h = hist
    scorer, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", mig(h, 0), T0)
    late = h.pod("kyc-late-reserved-0", "gpu-node-a", T0, claims={"gpu": "kyc-a"},
                 containers={"classifier": [("gpu", "")]}, namespace="kyc-docs")
    h.claim("kyc-a", T0, results=[("gpu", "gpu-node-a", mig(h, 1))], consumers=[(late, "kyc-late-reserved-0", T + S, None)],
            owner=late, namespace="kyc-docs")
    gone = h.pod("kyc-gone-0", "gpu-node-a", T0, T - S, claims={"gpu": "kyc-b"},
                 containers={"classifier": [("gpu", "")]}, namespace="kyc-docs")
    h.claim("kyc-b", T0, T + 300 * S, results=[("gpu", "gpu-node-a", mig(h, 2))],
            consumers=[(gone, "kyc-gone-0", T0, T - S)], owner=gone, namespace="kyc-docs")
    h.record("T-scorer", T, pod_uid=scorer)
    for attributed in (False, True):
        if attributed:
            attribute_run(h.s, cluster=CLUSTER)
        (doc,) = trace(h.s, ["T-scorer"], cluster=CLUSTER)
        assert sorted(listed(doc)) == ["kyc-gone-0", "kyc-late-reserved-0"]
        assert listed(doc) == {"kyc-late-reserved-0": True, "kyc-gone-0": False}


def test_the_trace_statement_stays_under_the_psycopg_cache_limit():
    """psycopg caches the conversion to ``$n`` placeholders only for query texts up to 4096 characters:
    the text as the psycopg dialect renders it (its parameters cast, ``%(txn)s::VARCHAR``), which is
    what psycopg receives."""
    from sqlalchemy.dialects.postgresql import psycopg

    text = str(_TRACE.compile(dialect=psycopg.dialect()))
    assert "::VARCHAR" in text and len(text) <= 4096

