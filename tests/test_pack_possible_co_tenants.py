"""The transaction lineage's co-tenant columns follow ``draudit trace``'s ``certain`` rule.

``co_tenant_namespaces``: the other namespaces sharing the transaction's GPU with its claim's
namespace throughout the clock-skew window around it (trace: ``certain``);
``co_tenant_namespaces_possible``: those sharing it at some instant of the window only (trace:
``certain: false``, their sharing started or ended within the tolerance). Checked against trace's own
rule (``collector.lineage._tenant_documents``) on SQLite and PostgreSQL, byte for byte, on one
connection and on the segmented paths (worker processes, snapshot twin), and against ``draudit
trace`` for every transaction of the demo.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from sqlalchemy import insert

from collector.lineage import _tenant_documents, trace
from collector.store.db import make_engine, make_session_factory
from collector.store.models import AttributionSettings, InferenceRecord, Lineage
from collector.timeutil import dt_to_ns
from reports import populations as pop
from reports import render
from tests.pack_data import records

S = 1_000_000_000
DAY_NS = dt_to_ns(datetime(2026, 11, 28, tzinfo=timezone.utc))
T0 = DAY_NS + 100 * S
GPU, OTHER_GPU = "GPU-aaaa", "GPU-bbbb"
DEFAULT_SKEW = 3 * S  # the pack's setting, for rows whose lineage names no settings

# Sharing intervals per namespace, as render.co_tenancy writes them (None: cut at the period).
# risk-inference shares GPU-aaaa with kyc-docs over [T0, T0+20) and [T0+21.5, T0+30) — the others
# change at T0+5 (zz-brief holds it for half a second: windows across three pieces) and at T0+10
# (marketing-ml joins), which must not make kyc-docs uncertain there — with marketing-ml over
# [T0+10, T0+21), with "a-b" and "ab" from T0+40 on (open: names sorted as Python sorts them,
# whatever the database's collation), and with zeta from before the period to DAY+5.
INTERVALS = [
    pop.CoTenancy(GPU, "risk-inference", T0, T0 + 5 * S, "kyc-docs"),
    pop.CoTenancy(GPU, "kyc-docs", T0, T0 + 5 * S, "risk-inference"),
    pop.CoTenancy(GPU, "risk-inference", T0 + 5 * S, T0 + 5 * S + S // 2, "kyc-docs;zz-brief"),
    pop.CoTenancy(GPU, "kyc-docs", T0 + 5 * S, T0 + 5 * S + S // 2, "risk-inference;zz-brief"),
    pop.CoTenancy(GPU, "zz-brief", T0 + 5 * S, T0 + 5 * S + S // 2, "kyc-docs;risk-inference"),
    pop.CoTenancy(GPU, "risk-inference", T0 + 5 * S + S // 2, T0 + 10 * S, "kyc-docs"),
    pop.CoTenancy(GPU, "kyc-docs", T0 + 5 * S + S // 2, T0 + 10 * S, "risk-inference"),
    pop.CoTenancy(GPU, "risk-inference", T0 + 10 * S, T0 + 20 * S, "kyc-docs;marketing-ml"),
    pop.CoTenancy(GPU, "kyc-docs", T0 + 10 * S, T0 + 20 * S, "marketing-ml;risk-inference"),
    pop.CoTenancy(GPU, "marketing-ml", T0 + 10 * S, T0 + 20 * S, "kyc-docs;risk-inference"),
    pop.CoTenancy(GPU, "risk-inference", T0 + 20 * S, T0 + 21 * S, "marketing-ml"),
    pop.CoTenancy(GPU, "marketing-ml", T0 + 20 * S, T0 + 21 * S, "risk-inference"),
    pop.CoTenancy(GPU, "risk-inference", T0 + 21 * S + S // 2, T0 + 30 * S, "kyc-docs"),
    pop.CoTenancy(GPU, "kyc-docs", T0 + 21 * S + S // 2, T0 + 30 * S, "risk-inference"),
    pop.CoTenancy(GPU, "risk-inference", T0 + 40 * S, None, "a-b;ab"),
    pop.CoTenancy(GPU, "a-b", T0 + 40 * S, None, "ab;risk-inference"),
    pop.CoTenancy(GPU, "ab", T0 + 40 * S, None, "a-b;risk-inference"),
    pop.CoTenancy(GPU, "risk-inference", None, DAY_NS + 5 * S, "zeta"),
    pop.CoTenancy(GPU, "zeta", None, DAY_NS + 5 * S, "risk-inference"),
]
SETTINGS = {1: 2 * S, 2: S // 2}
TABLE_INTERVALS = [pop.CoTenancy(GPU, "risk-inference", T0, T0 + 10 * S, "kyc-docs"),
                   pop.CoTenancy(GPU, "kyc-docs", T0, T0 + 10 * S, "risk-inference"),
                   pop.CoTenancy(GPU, "risk-inference", T0 + 10 * S, T0 + 20 * S, "kyc-docs;marketing-ml"),
                   pop.CoTenancy(GPU, "risk-inference", T0 + 20 * S, T0 + 21 * S, "marketing-ml")]  # attribution settings id → clock_skew_ns


def _transactions() -> list[dict]:
    """Transactions every 0.25 s around every bound (and far from them), cycling through
    namespaces, time precisions and tolerances (settings 1, 2 or none), plus one on a GPU nobody
    shared and one not attributed."""
    out = []
    times = [DAY_NS + k * S // 4 for k in range(0, 40)] + [T0 + k * S // 4 for k in range(-16, 190)]
    namespaces = ["risk-inference", "risk-inference", "kyc-docs", "marketing-ml", "ab"]
    precisions = [1, 1_000, 1_000_000, S]
    settings = [1, 2, None]
    for k, t in enumerate(times):
        out.append({"id": k + 1, "t": t + 7 * k, "ns": namespaces[k % len(namespaces)], "gpu": GPU,
                    "prec": precisions[k % len(precisions)], "settings": settings[k % len(settings)],
                    "status": "exact" if k % 7 else "ambiguous"})
    out.append({"id": 900, "t": T0 + 5 * S, "ns": "risk-inference", "gpu": OTHER_GPU, "prec": 1, "settings": 1,
                "status": "exact"})
    out.append({"id": 901, "t": T0 + 5 * S + 1, "ns": "risk-inference", "gpu": None, "prec": 1, "settings": None,
                "status": None})
    return out


def _fill(sessions, txns: list[dict]) -> None:
    with sessions.begin() as s:
        for sid, skew in SETTINGS.items():
            s.execute(insert(AttributionSettings).values(id=sid, digest=f"{sid:064d}", clock_skew_ns=skew,
                                                         cluster="prod-eu-1", serving_containers="{}"))
        for x in txns:
            rid = x["id"]
            s.execute(insert(InferenceRecord).values(
                id=rid, transaction_id=f"txn-{rid:04d}", event_time_ns=x["t"], event_time_precision_ns=x["prec"],
                received_ns=x["t"] + 1, cluster="prod-eu-1", pod_uid=None, pod_namespace=x["ns"], pod_name="p",
                container_name="scorer", node_name="node-a", model_name="m", model_version="1", decision="APPROVE",
                source_format="jsonl", envelope="plain", source="s.jsonl", position=str(rid), raw_sha256="ab" * 32,
                dedup_key=f"k{rid}", conflict=False))
            if x["status"] is not None:
                s.execute(insert(Lineage).values(
                    record_id=rid, status=x["status"], reason=None, candidates=1, pod_uid=f"pod-{rid}",
                    claim_namespace=x["ns"], claim_name="c", request="gpu", driver="gpu.nvidia.com", pool="node-a",
                    device="gpu-0", physical_gpu_uuid=x["gpu"], device_uuid=x["gpu"], mig_profile=None,
                    node_name="node-a", attributed_at=datetime(2026, 11, 29, tzinfo=timezone.utc),
                    settings_id=x["settings"]))


def _trace_rule(x: dict) -> tuple[str | None, str | None]:
    """(certain, possible) other namespaces of transaction ``x`` by trace's own rule
    (``_tenant_documents``): each other namespace a consumer holding the GPU over its sharing
    intervals with ``x``'s namespace."""
    if x["status"] is None or x["gpu"] is None:
        return None, None
    skew = SETTINGS.get(x["settings"], DEFAULT_SKEW)
    lo, hi = x["t"] - skew, x["t"] + x["prec"] + skew
    rows = set()
    for k, c in enumerate(INTERVALS):
        if c.gpu != x["gpu"] or c.namespace != x["ns"]:
            continue
        f = -(2 ** 62) if c.from_ns is None else c.from_ns
        for other in c.others.split(";"):
            rows.add((other, f"pod-{other}", f"uid-{other}", "claim", "", "pods", k, f, c.to_ns, f, c.to_ns,
                      None, None))
    docs = _tenant_documents(rows, None, lo, hi)
    certain = sorted({d["namespace"] for d in docs if d["certain"]})
    possible = sorted({d["namespace"] for d in docs if not d["certain"]} - set(certain))
    return ";".join(certain) or None, ";".join(possible) or None


def _expected_bytes(sessions, scope: pop.Scope, txns: list[dict]) -> tuple[bytes, bytes, int]:
    """The Python writers' bytes (``pop.stream``, no co-tenancy) with the two columns by trace's rule."""
    population = next(p for p in pop.STREAMED if p.name == "transaction_lineage")
    with sessions() as s:
        rows = list(pop.stream(s, population, scope))
    by_id = {x["id"]: x for x in txns}
    at = pop.LINEAGE_COLUMNS.index("co_tenant_namespaces")
    rid = pop.LINEAGE_COLUMNS.index("record_id")
    for r in rows:
        r[at], r[at + 1] = _trace_rule(by_id[r[rid]])
    csv_text = "".join(pop.csv_line(r) + "\n" for r in [pop.LINEAGE_COLUMNS] + rows)
    head = '{"columns":' + pop.JSON_ENCODER.encode(list(pop.LINEAGE_COLUMNS)) + ',"data":['
    arrays = [pop.JSON_ENCODER.encode(r) for r in rows]
    json_text = head + (("\n" + ",\n".join(arrays) + "\n]}\n") if arrays else "]}\n")
    return csv_text.encode(), json_text.encode(), len(rows)


def test_possible_column_follows_the_certain_one():
    columns = pop.LINEAGE_COLUMNS
    assert columns.index("co_tenant_namespaces_possible") == columns.index("co_tenant_namespaces") + 1


@pytest.mark.parametrize("path", ["one-connection", "segmented"])
def test_columns_follow_traces_certain_rule_byte_for_byte(sessions, tmp_path, monkeypatch, path):
    txns = _transactions()
    _fill(sessions, txns)
    scope = pop.Scope(DAY_NS, DAY_NS + 3_600 * S, ("prod-eu-1",), ())
    want_csv, want_json, n = _expected_bytes(sessions, scope, txns)
    assert n == len(txns)
    expected = [_trace_rule(x) for x in txns]
    # the scenario reaches every case: certain only, possible only, both, the piece bound at T0+10
    assert ("kyc-docs", None) in expected and (None, "kyc-docs") in expected
    assert ("marketing-ml", "kyc-docs") in expected and ("kyc-docs", "marketing-ml") in expected
    assert ("kyc-docs;marketing-ml", None) in expected and ("a-b;ab", None) in expected
    assert ("zeta", None) in expected and (None, "zeta") in expected
    assert ("kyc-docs", "zz-brief") in expected  # a window across three pieces: read from the spans
    if path == "segmented":  # PostgreSQL: time segments on a snapshot twin; SQLite: worker processes
        monkeypatch.setattr(pop, "SEGMENT_ROWS", 40)
        monkeypatch.setattr(pop, "SQLITE_PROCESS_MIN_ROWS", 1)
        # and the pieces and spans cut every 3 s (looked up by their parts): windows across the cuts
        monkeypatch.setattr(pop, "LOOKUP_MIN_NS", 3 * S)
        monkeypatch.setattr(pop, "LOOKUP_MAX_PARTS", 10 ** 9)
    with sessions() as s:
        if s.get_bind().dialect.name == "postgresql":
            s.connection(execution_options={"isolation_level": "REPEATABLE READ"})  # as render_pack does
        else:
            s.connection().exec_driver_sql("SELECT 1")  # in a transaction, as render_pack
        written = pop.write_lineage(s, scope, tmp_path, batch_rows=16,
                                    co_tenancy=pop.CoTenancyInput(INTERVALS, DEFAULT_SKEW),
                                    expected_rows=n if path == "segmented" else 0)
    assert written.count == n
    got = {o["record_id"]: (o["co_tenant_namespaces"], o["co_tenant_namespaces_possible"])
           for o in records(tmp_path / "transaction_lineage.json")}
    wrong = {x["id"]: (got[x["id"]], _trace_rule(x)) for x in txns if got[x["id"]] != _trace_rule(x)}
    assert not wrong
    assert (tmp_path / "transaction_lineage.csv").read_bytes() == want_csv
    assert (tmp_path / "transaction_lineage.json").read_bytes() == want_json


def test_tables_cut_the_time_into_pieces_and_spans(monkeypatch):
    tables = pop.co_tenancy_tables(pop.CoTenancyInput(TABLE_INTERVALS, 5))
    assert tables.skew_ns == 5 and tables.lookup_ns is None
    lo, hi = -(2 ** 63), 2 ** 63 - 1
    # risk-inference: one piece per change of the other namespaces
    pieces = [(lo, T0, None), (T0, T0 + 10 * S, "kyc-docs"),
              (T0 + 10 * S, T0 + 20 * S, "kyc-docs;marketing-ml"), (T0 + 20 * S, T0 + 21 * S, "marketing-ml"),
              (T0 + 21 * S, hi, None)]
    assert [p[:7] for p in tables.pieces if p[1] == "risk-inference"] == [
        (GPU, "risk-inference", f, e, f, e, o) for f, e, o in pieces]
    # and a window reaching into the piece before or after only: certain in both, possible in one
    middle = [p for p in tables.pieces if p[1] == "risk-inference"][2]
    assert middle[6:] == ("kyc-docs;marketing-ml", T0, "kyc-docs", "marketing-ml", T0 + 21 * S, "marketing-ml",
                          "kyc-docs")
    # touching intervals merged: kyc-docs is one span beside risk-inference
    spans = [("kyc-docs", 0, T0, T0 + 20 * S, lo), ("marketing-ml", 1, T0 + 10 * S, T0 + 21 * S, lo)]
    assert [sp for sp in tables.spans if sp[1] == "risk-inference"] == [
        (GPU, "risk-inference", o, r, f, e, f, e, p) for o, r, f, e, p in spans]
    assert not pop.co_tenancy_tables([])
    # with the period: each piece looked up by its parts, cut every lookup_ns from the period's start
    monkeypatch.setattr(pop, "LOOKUP_MIN_NS", 3_600 * S)
    scope = pop.Scope(DAY_NS, DAY_NS + 3 * 3_600 * S, (), ())
    cut = pop.co_tenancy_tables(pop.CoTenancyInput(TABLE_INTERVALS, 5), scope, 2 * S)
    assert cut.lookup_ns == 3_600 * S
    assert [sp[2:4] + sp[6:] for sp in cut.spans] == [sp[2:4] + sp[6:] for sp in tables.spans]  # not cut here
    hour = [DAY_NS + k * 3_600 * S for k in range(3)]
    assert [p[2:4] for p in cut.pieces if p[1] == "risk-inference"] == [
        (lo, hour[0]), (hour[0], T0), (T0, T0 + 10 * S), (T0 + 10 * S, T0 + 20 * S), (T0 + 20 * S, T0 + 21 * S),
        (T0 + 21 * S, hour[1]), (hour[1], hour[2]), (hour[2], hi)]
    assert {p[4:7] for p in cut.pieces if p[1] == "risk-inference"} == {
        (f, e, o) for f, e, o in pieces}


def test_render_opens_intervals_cut_at_the_period():
    scope = pop.Scope(DAY_NS, DAY_NS + 86_400 * S, (), ())
    segments = [SimpleNamespace(physical_gpu_uuid=GPU, from_ns=DAY_NS, to_ns=DAY_NS + S, claims=("a/x", "b/y")),
                SimpleNamespace(physical_gpu_uuid=GPU, from_ns=DAY_NS + 2 * S, to_ns=scope.to_ns,
                                claims=("a/x", "c/z")),
                SimpleNamespace(physical_gpu_uuid=GPU, from_ns=DAY_NS + 3 * S, to_ns=DAY_NS + 4 * S,
                                claims=("a/x", "a/w"))]
    got = render.co_tenancy(segments, scope, 1.5)
    assert got.clock_skew_ns == 1_500_000_000
    assert list(got.intervals) == [
        pop.CoTenancy(GPU, "a", None, DAY_NS + S, "b"), pop.CoTenancy(GPU, "b", None, DAY_NS + S, "a"),
        pop.CoTenancy(GPU, "a", DAY_NS + 2 * S, None, "c"), pop.CoTenancy(GPU, "c", DAY_NS + 2 * S, None, "a"),
    ]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    proc = subprocess.run([sys.executable, "-m", "collector.cli", "demo", "--out", str(out), "--output", "json",
                           "--duration-s", "20", "--transactions", "3000"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout)


def test_every_demo_transaction_names_traces_certain_and_possible_co_tenants(demo):
    """The pack's two columns are, for each transaction of the demo, the other namespaces ``draudit
    trace`` lists as certain and as not certain co-tenants (the planted cross-tenant sharing starts
    and ends amid the scoring: transactions within the tolerance of its bounds)."""
    out, result = demo
    rows = records(out / "pack" / "data" / "transaction_lineage.json")
    assert len(rows) == result["transactions"]["exact"] + result["transactions"]["ambiguous"] \
        + result["transactions"]["unattributed"]
    sessions = make_session_factory(make_engine(result["database"]))
    with sessions() as s:
        docs = {d["record_id"]: d for d in trace(s, [r["transaction_id"] for r in rows], cluster=rows[0]["cluster"])}
    seen = {"certain": 0, "possible": 0}
    for r in rows:
        doc = docs[r["record_id"]]
        own = r["claim_namespace"]
        certain = {t["namespace"] for t in doc["co_tenants"] if t["certain"]} - {own}
        possible = {t["namespace"] for t in doc["co_tenants"] if not t["certain"]} - certain - {own}
        assert (r["co_tenant_namespaces"], r["co_tenant_namespaces_possible"]) == \
            (";".join(sorted(certain)) or None, ";".join(sorted(possible)) or None), r["transaction_id"]
        seen["certain"] += bool(certain)
        seen["possible"] += bool(possible)
    assert seen["certain"] > 0 and seen["possible"] > 0, seen
