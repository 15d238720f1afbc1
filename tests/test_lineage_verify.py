"""`draudit ledger verify` recomputes the lineage (collector.lineage.verify_lineage) and names the
first edited row; attribution's reasons near a pod's first/last observation and for unknown clusters."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from click.testing import CliRunner
from sqlalchemy import event, insert, select, text, update

from collector.cli import cli
from collector.lineage import (
    _TRACE, _co_tenants_stmt, attribute_run, co_tenants, lineage_select, tolerances_in_use, trace, verify_lineage,
)
from collector.store.models import InferenceRecord, Lineage
from tests.test_lineage import CLUSTER, GPU_A, GPU_B, S, T0, History, hist, single_gpu_pod  # noqa: F401 - hist is a fixture

FAKE = "GPU-FAKE-0000"


def _two_pods(h: History) -> dict[str, int]:
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    h.gpu("gpu-node-b", "gpu-1", GPU_B)
    first, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0)
    second, _ = single_gpu_pod(h, "fraud-scorer-1", "gpu-node-b", "gpu-1", T0)
    return {f"txn-{i:04d}": h.record(f"txn-{i:04d}", T0 + (60 + i) * S, pod_uid=first if i % 2 else second)
            for i in range(10)}


def test_verify_lineage_names_the_first_edited_row(hist):
    h = hist
    recs = _two_pods(h)
    attribute_run(h.s, cluster=CLUSTER)
    audit = verify_lineage(h.s)
    assert (audit.ok, audit.checked, audit.first) == (True, 10, None)

    victim = recs["txn-0004"]
    h.s.execute(update(Lineage).where(Lineage.record_id == victim).values(physical_gpu_uuid=FAKE, device_uuid=FAKE))
    audit = verify_lineage(h.s)
    assert (audit.ok, audit.checked, audit.differing) == (False, 10, 1)
    first = audit.first
    assert (first.record_id, first.transaction_id, first.column, first.stored, first.recomputed) == \
        (victim, "txn-0004", "device_uuid", FAKE, GPU_B)
    # read-only: the edit is still there, nothing else was written
    assert h.s.execute(select(Lineage.physical_gpu_uuid).where(Lineage.record_id == victim)).scalar_one() == FAKE
    assert h.s.execute(select(Lineage.record_id).order_by(Lineage.record_id)).scalars().all() == sorted(recs.values())


def test_verify_lineage_uses_each_rows_own_tolerance(hist):
    """Rows computed with 30 s and with the default 2 s both recompute; a status edit shows."""
    h = hist
    recs = _two_pods(h)
    attribute_run(h.s, cluster=CLUSTER, clock_skew_s=90)  # every record within 90 s of the pods' start
    late = h.record("txn-late", T0 + 600 * S, pod="fraud-scorer-0")
    attribute_run(h.s, cluster=CLUSTER)
    statuses = dict(h.s.execute(select(Lineage.record_id, Lineage.status)).all())
    assert {statuses[r] for r in recs.values()} == {"ambiguous"} and statuses[late] == "exact"
    assert verify_lineage(h.s).ok

    h.s.execute(update(Lineage).where(Lineage.record_id == recs["txn-0007"]).values(status="exact", reason=None))
    first = verify_lineage(h.s).first
    assert (first.transaction_id, first.column, first.stored, first.recomputed) == \
        ("txn-0007", "status", "exact", "ambiguous")


def test_an_edited_tolerance_breaks_the_ledger(hist):
    """Widening the stored tolerance (to make edited skew-window rows recompute) is itself caught."""
    from collector.store import ledger
    from collector.store.models import AttributionSettings

    h = hist
    _two_pods(h)
    attribute_run(h.s, cluster=CLUSTER)
    # (History writes its records behind the ledger: the untouched store already has that break.)
    assert ledger.verify(h.s).first_break.table_name == "inference_records"
    h.s.execute(update(AttributionSettings).values(clock_skew_ns=60_000_000_000))
    verdict = ledger.verify(h.s)
    assert verdict.first_break.table_name == "attribution_settings", verdict.first_break


def test_verify_lineage_reports_a_row_without_its_record(hist):
    h = hist
    recs = _two_pods(h)
    attribute_run(h.s, cluster=CLUSTER)
    h.s.execute(update(Lineage).where(Lineage.record_id == recs["txn-0009"]).values(record_id=10_000_000))
    audit = verify_lineage(h.s)
    # the record left without a row is merely not attributed yet (the next run attributes it)
    assert (audit.checked, audit.differing) == (10, 1)
    assert (audit.first.record_id, audit.first.transaction_id, audit.first.column, audit.first.stored,
            audit.first.recomputed) == (10_000_000, None, "(row)", "present", "absent")


def test_cli_ledger_verify_reports_lineage(sessions, database_url, monkeypatch):
    monkeypatch.setenv("DRAUDIT_CLUSTER", CLUSTER)
    with sessions.begin() as session:
        h = History(session)
        h.covered()
        recs = _two_pods(h)
    runner = CliRunner()
    assert runner.invoke(cli, ["attribute", "--database-url", database_url]).exit_code == 0
    with sessions.begin() as session:
        session.execute(update(Lineage).where(Lineage.record_id == recs["txn-0003"])
                        .values(physical_gpu_uuid=FAKE, device_uuid=FAKE))

    res = runner.invoke(cli, ["ledger", "verify", "--no-projections", "--database-url", database_url,
                              "--output", "json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.output)
    assert (doc["lineage_checked"], doc["lineage_differing"]) == (10, 1)
    assert doc["lineage_first_difference"] == {"record_id": recs["txn-0003"], "transaction_id": "txn-0003",
                                               "column": "device_uuid", "stored": FAKE, "recomputed": GPU_A}
    res = runner.invoke(cli, ["ledger", "verify", "--no-projections", "--database-url", database_url])
    assert "lineage DIFFERS" in res.output and "10 rows" in res.output and "txn-0003" in res.output


def test_record_logged_just_before_its_pod_was_observed_is_a_skew_window(hist):
    """Observation lags creation: 0.4 s before the pod's first observation (uid in the envelope) or
    just after its deletion is within the tolerance of the pod — ambiguous, never no-pod, never a guess."""
    h = hist
    h.gpu("gpu-node-a", "gpu-0", GPU_A)
    uid, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0, T0 + 600 * S)
    recs = {
        "0.4 s before, by uid": h.record("t-before-uid", T0 - 400_000_000, pod_uid=uid),
        "0.4 s before, by name": h.record("t-before-name", T0 - 400_000_000, pod="fraud-scorer-0"),
        "0.4 s after deletion": h.record("t-after-uid", T0 + 600 * S + 400_000_000, pod_uid=uid),
        "5 s before": h.record("t-early", T0 - 5 * S, pod_uid=uid),
        "5 s after deletion": h.record("t-late", T0 + 605 * S, pod="fraud-scorer-0"),
    }
    attribute_run(h.s, cluster=CLUSTER)
    rows = {label: h.s.execute(select(Lineage.status, Lineage.reason, Lineage.physical_gpu_uuid)
                               .where(Lineage.record_id == rid)).one()._tuple() for label, rid in recs.items()}
    assert rows == {
        "0.4 s before, by uid": ("ambiguous", "skew-window", None),
        "0.4 s before, by name": ("ambiguous", "skew-window", None),
        "0.4 s after deletion": ("ambiguous", "skew-window", None),
        "5 s before": ("unattributed", "no-pod", None),
        "5 s after deletion": ("unattributed", "no-pod", None),
    }
    per_record = lineage_select(all=True, cluster=CLUSTER).subquery()  # each record its own point
    assert {label: h.s.execute(select(per_record.c.status, per_record.c.reason)
                               .where(per_record.c.record_id == rid)).one()._tuple()
            for label, rid in recs.items()} == {label: row[:2] for label, row in rows.items()}


def test_tolerances_in_use_are_those_the_rows_were_computed_with(hist):
    """`attribute --all --clock-skew-s 30` then a pack: the pack must state 30 s, not its own 2 s."""
    h = hist
    recs = _two_pods(h)
    assert tolerances_in_use(h.s) == {}
    attribute_run(h.s, all=True, cluster=CLUSTER, clock_skew_s=30)
    assert tolerances_in_use(h.s) == {30.0: 10}
    later = h.record("txn-later", T0 + 900 * S, pod="fraud-scorer-0")
    attribute_run(h.s, cluster=CLUSTER, clock_skew_s=2.5)
    assert tolerances_in_use(h.s) == {2.5: 1, 30.0: 10}
    assert tolerances_in_use(h.s, InferenceRecord.id == later) == {2.5: 1}
    assert tolerances_in_use(h.s, InferenceRecord.id.in_(list(recs.values()))) == {30.0: 10}
    h.s.execute(insert(Lineage).values(record_id=h.record("txn-hand", T0 + 950 * S), status="unattributed",
                                       reason="no-pod", attributed_at=datetime.now(timezone.utc)))
    assert tolerances_in_use(h.s) == {2.5: 1, 30.0: 10, None: 1}


def test_unknown_cluster_and_missing_pod_identity_have_honest_reasons(sessions, database_url, monkeypatch):
    """Ingested without --cluster ('default') into a store whose watcher recorded another cluster:
    unknown-cluster with a hint naming the known clusters, not coverage-gap; no pod identity: no-pod."""
    with sessions.begin() as session:
        h = History(session)
        h.covered()
        h.gpu("gpu-node-a", "gpu-0", GPU_A)
        uid, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0", T0)
        known = h.record("txn-known", T0 + 60 * S, pod_uid=uid)
        anonymous = h.record("txn-anon", T0 + 60 * S, namespace=None)
        elsewhere = h.record("txn-default", T0 + 60 * S, pod_uid=uid)
        anonymous_elsewhere = h.record("txn-default-anon", T0 + 60 * S, namespace=None)
        gap = h.record("txn-gap", T0 - 7200 * S, pod_uid=uid)
        session.execute(update(InferenceRecord).where(InferenceRecord.id.in_([elsewhere, anonymous_elsewhere]))
                        .values(cluster="default"))
    monkeypatch.delenv("DRAUDIT_CLUSTER", raising=False)
    res = CliRunner().invoke(cli, ["attribute", "--database-url", database_url])
    assert res.exit_code == 0, res.output
    assert "hint: 1 transaction(s) name a cluster the watcher never recorded" in res.output
    assert f"the store knows: {CLUSTER}." in res.output
    with sessions() as session:
        got = dict(session.execute(select(Lineage.record_id, Lineage.reason)).all())
    assert got == {known: None, anonymous: "no-pod", elsewhere: "unknown-cluster", anonymous_elsewhere: "no-pod",
                   gap: "coverage-gap"}


def test_co_tenants_query_reaches_the_gpu_through_an_index(hist):
    """A long history (400 pods, one after another on 8 GPUs): `trace`'s co-tenants lookup starts from
    the GPU's devices (ix_device_states_gpu), not from every allocation episode started before t; in the
    statement `trace` runs for an attributed record too."""
    h = hist
    gpus = [f"GPU-{n:08x}-0000-4000-8000-000000000000" for n in range(8)]
    for n, uuid in enumerate(gpus):
        h.gpu("gpu-node-a", f"gpu-{n}", uuid)
    for n in range(400):
        single_gpu_pod(h, f"fraud-scorer-{n}", "gpu-node-a", f"gpu-{n % 8}", T0 + n * 60 * S, T0 + (n + 8) * 60 * S)
    t = T0 + 399 * 60 * S + 30 * S
    assert [c["pod"] for c in co_tenants(h.s, cluster=CLUSTER, physical_gpu_uuid=gpus[3], t_ns=t,
                                         exclude_pod_uid=None)] == ["fraud-scorer-395"]
    stmt = _co_tenants_stmt().compile(h.s.get_bind())
    params = stmt.construct_params({"cluster": CLUSTER, "gpu": gpus[3], "t": t})
    if h.s.get_bind().dialect.name == "sqlite":
        h.s.execute(text("ANALYZE"))
        plan = h.s.connection().exec_driver_sql(f"EXPLAIN QUERY PLAN {stmt}",
                                                 tuple(params[k] for k in stmt.positiontup)).all()
        assert "USING INDEX ix_device_states_gpu" in plan[0][3]
    else:
        h.s.execute(text("ANALYZE"))
        # 8 device rows here: a sequential scan is cheaper, so ask whether an index can serve the filter
        h.s.execute(text("SET LOCAL enable_seqscan = off"))
        plan = [r for (r,) in h.s.connection().exec_driver_sql(f"EXPLAIN {stmt}", params)]
        scans = [line for line in plan if " on " in line and "Scan" in line]
        assert "ix_device_states_gpu on device_states" in scans[0], plan

    h.record("txn-late", t, pod="fraud-scorer-395")
    attribute_run(h.s, cluster=CLUSTER)
    (doc,) = trace(h.s, ["txn-late"], cluster=CLUSTER)
    assert (doc["physical_gpu_uuid"], doc["co_tenants"]) == (gpus[3], [])
    plan = _trace_plan(h, {"txn": "txn-late", "cluster": CLUSTER})
    device_scans = [line for line in plan if ("Scan" in line or "SEARCH" in line or "SCAN" in line)
                    and "device_states" in line]
    assert device_scans and "ix_device_states_gpu" in device_scans[0], plan


def _trace_plan(h: History, params: dict) -> list[str]:
    """The plan of trace's one statement (PostgreSQL: with sequential scans off, as above)."""
    stmt = _TRACE.compile(h.s.get_bind())
    bound = stmt.construct_params(params)
    h.s.execute(text("ANALYZE"))
    if h.s.get_bind().dialect.name == "sqlite":
        return [row[3] for row in h.s.connection().exec_driver_sql(
            f"EXPLAIN QUERY PLAN {stmt}", tuple(bound[k] for k in stmt.positiontup))]
    h.s.execute(text("SET LOCAL enable_seqscan = off"))
    return [r for (r,) in h.s.connection().exec_driver_sql(f"EXPLAIN {stmt}", bound)]


def test_trace_is_one_statement_with_the_co_tenants_of_the_co_tenants_query(hist):
    """`trace` of attributed records joins the co-tenants in its one statement; they equal
    `co_tenants` (the query a record attributed on the fly uses) on a GPU with two MIG slices, a device
    published by two pool generations at once, an adminAccess monitor, a departed tenant and a tenant
    holding both slices."""
    h = hist
    mig0, mig1 = "MIG-aaaa0000-1111-5222-8333-444455556666", "MIG-bbbb0000-1111-5222-8333-444455556666"
    h.gpu("gpu-node-a", "gpu-0-mig-0", mig0, parent=GPU_A, profile="3g.40gb")
    h.gpu("gpu-node-a", "gpu-0-mig-1", mig1, parent=GPU_A, profile="3g.40gb")
    h.gpu("gpu-node-a", "gpu-0-mig-1", mig1, parent=GPU_A, profile="3g.40gb", generation=2)
    h.gpu("gpu-node-a", "gpu-1", GPU_B)
    scorer, _ = single_gpu_pod(h, "fraud-scorer-0", "gpu-node-a", "gpu-0-mig-0", T0)
    other, _ = single_gpu_pod(h, "fraud-scorer-1", "gpu-node-a", "gpu-1", T0)

    def tenant(name: str, namespace: str, start: int, end: int | None, results: list[tuple]) -> str:
        uid = h.pod(name, "gpu-node-a", start, end, claims={"gpu": f"{name}-gpu"},
                    containers={"main": [("gpu", "")]}, namespace=namespace)
        h.claim(f"{name}-gpu", start, end, results=results, consumers=[(uid, name, start, end)], namespace=namespace)
        return uid

    chatbot = tenant("chatbot-5b6c7d-k2l3m", "genai", T0, None, [("gpu", "gpu-node-a", "gpu-0-mig-1")])
    tenant("dcgm-exporter-x8d2k", "monitoring", T0, None, [("gpu", "gpu-node-a", "gpu-0-mig-1", True)])
    tenant("etl-job-abc12", "batch", T0, T0 + 30 * S, [("gpu", "gpu-node-a", "gpu-0-mig-1")])
    both = tenant("trainer-7f9c-q1w2e", "ml", T0 + 100 * S, None,
                  [("gpu", "gpu-node-a", "gpu-0-mig-0"), ("gpu2", "gpu-node-a", "gpu-0-mig-1")])
    times = {"txn-early": T0 + 20 * S, "txn-mid": T0 + 60 * S, "txn-late": T0 + 200 * S}
    for txn, t in times.items():
        h.record(txn, t, pod_uid=scorer)
    h.record("txn-other", T0 + 60 * S, pod_uid=other)
    attribute_run(h.s, cluster=CLUSTER)

    statements = []
    engine = h.s.get_bind()
    listener = lambda *args: statements.append(args[2])  # noqa: E731 - (conn, cursor, statement, ...)
    event.listen(engine, "before_cursor_execute", listener)
    try:
        docs = {d["transaction_id"]: d for d in trace(h.s, [*times, "txn-other"], cluster=CLUSTER)}
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    # one per id; on PostgreSQL also the SET LOCAL plan_cache_mode, once per transaction
    assert len([q for q in statements if not q.startswith("SET LOCAL plan_cache_mode")]) == 4
    assert len(statements) == (5 if engine.dialect.name == "postgresql" else 4)

    assert [c["pod_uid"] for c in docs["txn-mid"]["co_tenants"]] == [chatbot]
    assert [(c["namespace"], c["pod"], c["claim"]) for c in docs["txn-late"]["co_tenants"]] == [
        ("genai", "chatbot-5b6c7d-k2l3m", "chatbot-5b6c7d-k2l3m-gpu"), ("ml", "trainer-7f9c-q1w2e", "trainer-7f9c-q1w2e-gpu")]
    assert docs["txn-late"]["co_tenants"][1]["pod_uid"] == both
    assert [c["pod"] for c in docs["txn-early"]["co_tenants"]] == ["etl-job-abc12", "chatbot-5b6c7d-k2l3m"]  # batch < genai
    assert docs["txn-other"]["co_tenants"] == []
    for txn, t in times.items():
        assert docs[txn]["physical_gpu_uuid"] == GPU_A
        assert docs[txn]["co_tenants"] == co_tenants(h.s, cluster=CLUSTER, physical_gpu_uuid=GPU_A, t_ns=t,
                                                     exclude_pod_uid=scorer)


def test_trace_allows_generic_plans_for_its_transaction_only(sessions, backend):
    """PostgreSQL: trace runs with plan_cache_mode = auto until the caller's transaction ends (once per
    transaction); the connection's next transaction plans per parameters again, as ingest's duplicate
    lookups need (collector.store.db). SQLite has no such setting: nothing is sent."""
    def mode(s) -> str | None:
        return s.execute(text("SHOW plan_cache_mode")).scalar() if backend == "postgresql" else None

    statements = []
    with sessions() as s:
        engine = s.get_bind()
        listener = lambda *args: statements.append(args[2])  # noqa: E731 - (conn, cursor, statement, ...)
        event.listen(engine, "before_cursor_execute", listener)
        try:
            before = mode(s)
            trace(s, ["txn-none"])
            trace(s, ["txn-none-either"])
            during = mode(s)
        finally:
            event.remove(engine, "before_cursor_execute", listener)
        s.rollback()
        after = mode(s)
        trace(s, ["txn-none"])
        again = mode(s)
    sets = [q for q in statements if q.startswith("SET LOCAL plan_cache_mode")]
    if backend == "postgresql":
        assert (before, during, after, again) == ("force_custom_plan", "auto", "force_custom_plan", "auto")
        assert len(sets) == 1
    else:
        assert sets == []
