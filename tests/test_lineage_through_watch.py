"""Attribution over histories recorded end to end: the fake Kubernetes API server (collector/sim)
→ the real watcher over HTTP → the store's projections → Fluent Bit (``kubernetes`` filter,
``Merge_Log_Key app``, docs/shippers.md) envelopes around Spring Boot ECS lines, ingested by
``IngestRun`` → ``attribute`` → ``trace`` as ``draudit trace --output json`` prints it.

tests/test_lineage.py covers the same cases over projection rows written directly; here every
interval bound is one the watcher stamped with its own clock when it observed a change. So the
transaction times are taken from the wall clock around the actions: ``_act`` notes the time
before an action and after the watcher committed it (the observation lies in between), and
``_settle`` waits until a bound is more than the clock-skew tolerance behind, so a transaction
is exact (or inside the skew window) by construction, also on a loaded machine. Most tests run
``attribute`` with a 0.3 s tolerance to stay fast; the skew-window test uses 1 s and the
default 2 s. Every test runs on SQLite and PostgreSQL (``sessions`` / ``database_url``).
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime, timezone
from typing import Callable

from click.testing import CliRunner
from sqlalchemy import select

from collector.cli import cli
from collector.ingest.pipeline import IngestRun
from collector.lineage import COVERAGE_KINDS, attribute, attribute_run, trace
from collector.settings import Settings
from collector.sim.dra_objects import (add_finalizer, allocate, bind_pod, claim_spec, deallocate, make_claim,
                                       make_claim_from_template, make_claim_template, make_device_class,
                                       make_gpu_device, make_mig_device, make_pod, make_slice, pod_running,
                                       remove_finalizer, reserve, set_claim_statuses)
from collector.store.models import InferenceRecord, ObjectVersion, WatchState
from collector.timeutil import NS_PER_S, dt_to_ns, now_ns, ns_to_rfc3339
from tests.watch_support import caught_up, gaps, start_watcher, wait_until

CLUSTER = "prod-eu-1"
NS = "risk-inference"
DRIVER = "gpu.nvidia.com"
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
GPU_A = "GPU-4a1b6c2d-0e9f-4a1b-8c7d-6e5f4a3b2c1d"
GPU_B = "GPU-9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"
GPU_H100 = "GPU-77aa0b1c-2d3e-4f50-8a9b-0c1d2e3f4a5b"
MIG_0 = "MIG-1c2d3e4f-5a6b-5c7d-8e9f-0a1b2c3d4e5f"
MIG_4 = "MIG-2d3e4f5a-6b7c-5d8e-9f0a-1b2c3d4e5f6a"
SKEW_S = 0.3  # the tolerance most tests attribute with (the default, 2 s, would need 2.2 s waits)
MARGIN_S = 0.15


# --------------------------------------------------------------------------------------------
# time
# --------------------------------------------------------------------------------------------


def _settle(bound_ns: int, skew_s: float = SKEW_S) -> int:
    """Sleep until ``bound_ns`` lies more than ``skew_s`` (+ a margin) in the past; returns now."""
    target = bound_ns + int((skew_s + MARGIN_S) * NS_PER_S)
    while (left := target - now_ns()) > 0:
        time.sleep(left / NS_PER_S)
    return _us(now_ns())


def _us(t_ns: int) -> int:
    """``t_ns`` cut to whole microseconds, the precision of the ECS ``@timestamp`` we write."""
    return t_ns // 1000 * 1000


def _act(srv, w, action: Callable[[], object]) -> tuple[int, int]:
    """Run ``action`` (writes to the API server) and wait until the watcher committed it.
    Returns (before, after): every change it made was observed (stamped) in between."""
    before = now_ns()
    action()
    caught_up(srv, w)
    return before, now_ns()


# --------------------------------------------------------------------------------------------
# cluster objects
# --------------------------------------------------------------------------------------------


def _containers(pod_claim: str | None = "gpu") -> list[dict]:
    """The sidecar pattern: Spring ``risk-api`` logs the transactions, ``triton-sidecar`` holds the GPU."""
    triton = {"name": "triton-sidecar", "image": "nvcr.io/nvidia/tritonserver:25.01-py3",
              "args": ["tritonserver", "--model-repository=/models"]}
    if pod_claim:
        triton["resources"] = {"claims": [{"name": pod_claim}]}
    return [{"name": "risk-api", "image": "registry.bank.example/risk-api:3.5.2",
             "ports": [{"containerPort": 8080, "protocol": "TCP"}]}, triton]


def _inventory(srv) -> None:
    srv.apply(make_device_class("gpu.nvidia.com"))
    srv.apply(make_device_class("mig.nvidia.com", device_type="mig"))
    srv.apply(make_slice("gpu-node-a", [make_gpu_device(0, uuid=GPU_A, product_name=A100, architecture="Ampere",
                                                        cuda_compute_capability="8.0.0")]))
    srv.apply(make_slice("gpu-node-b", [make_gpu_device(1, uuid=GPU_B, product_name=A100, architecture="Ampere",
                                                        cuda_compute_capability="8.0.0")]))
    srv.apply(make_slice("gpu-node-c", [
        make_gpu_device(0, uuid=GPU_H100),
        make_mig_device(0, profile="3g.40gb", parent_uuid=GPU_H100, uuid=MIG_0, gi_profile_id=9, placement_start=0,
                        memory="40448Mi", multiprocessors=60),
        make_mig_device(0, profile="3g.40gb", parent_uuid=GPU_H100, uuid=MIG_4, gi_profile_id=9, placement_start=4,
                        memory="40448Mi", multiprocessors=60)]))


def _template() -> dict:
    """The workload's ResourceClaimTemplate: one GPU of class ``gpu.nvidia.com``."""
    return make_claim_template("fraud-scorer-gpu", NS)


def _template_pod_up(srv, name: str, node: str, device: str, *, template: dict | None = None, suffix: str,
                     uid: str | None = None) -> tuple[dict, dict]:
    """A pod with a template claim through dra-api.md §2.6 up to Running: pod ADDED, claim generated,
    ``resourceClaimStatuses``, finalizer, allocation + reservedFor, binding, Running."""
    template = template or _template()
    pod = srv.apply(make_pod(name, NS, claim_templates={"gpu": template["metadata"]["name"]},
                             containers=_containers(), uid=uid, labels={"app.kubernetes.io/name": "fraud-scorer"}))
    claim = srv.apply(make_claim_from_template(pod, "gpu", template, suffix=suffix))
    pod = srv.apply(set_claim_statuses(pod, {"gpu": claim["metadata"]["name"]}))
    claim = srv.apply(add_finalizer(claim))
    claim = srv.apply(allocate(claim, [("gpu", DRIVER, node, device)], pod, node=node))
    pod = srv.apply(bind_pod(pod, node))
    pod = srv.apply(pod_running(pod))
    return pod, claim


def _named_claim_pod(srv, name: str, claim: dict, namespace: str = NS) -> dict:
    """A Pending pod referencing ``claim`` by name (allocation, reservation and binding are done apart)."""
    return srv.apply(make_pod(name, namespace, claim_names={"gpu": claim["metadata"]["name"]},
                              containers=_containers()))


def _run_on(srv, pod: dict, node: str) -> dict:
    """The scheduler binds ``pod`` to ``node`` and the kubelet runs it (one write here)."""
    return srv.apply(pod_running(bind_pod(srv.get("Pod", pod["metadata"]["name"], pod["metadata"]["namespace"]), node)))


# --------------------------------------------------------------------------------------------
# log lines
# --------------------------------------------------------------------------------------------


def _iso(t_ns: int, digits: int) -> str:
    seconds, rem = divmod(t_ns, NS_PER_S)
    base = datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{rem:09d}"[: len(base) + 1 + digits] + "Z"


def _fluent_bit_line(txn: str, t_ns: int, pod: dict, node: str, *, with_pod_id: bool = True,
                     decision: str = "APPROVE", thread: int = 3) -> str:
    """One scored transaction as Fluent Bit ships it (tail + cri + kubernetes filter, ``Merge_Log_Key
    app``, ``Keep_Log On``, ``json_date_format iso8601``) around a Spring Boot 3.5 ECS line logged
    by ``risk-api`` at ``t_ns`` (µs). ``with_pod_id=False``: the filter's API lookup failed."""
    meta = pod["metadata"]
    app = {"@timestamp": _iso(t_ns, 6), "log": {"level": "INFO", "logger": "com.bank.risk.scoring.ScoringService"},
           "process": {"pid": 1, "thread": {"name": f"http-nio-8080-exec-{thread}"}},
           "service": {"name": "risk-api", "version": "3.5.2"}, "message": "scored",
           "traceId": hashlib.md5(txn.encode()).hexdigest(), "spanId": hashlib.md5(txn.encode()).hexdigest()[8:24],
           "txn_id": txn, "model_name": "fraud_xgb", "model_version": "7", "decision": decision,
           "latency_ms": 12.4, "ecs": {"version": "8.11"}}
    kubernetes = {"pod_name": meta["name"], "namespace_name": meta["namespace"], "pod_id": meta["uid"],
                  "labels": meta.get("labels") or {}, "host": node, "pod_ip": "10.4.7.21",
                  "container_name": "risk-api",
                  "docker_id": "a3f1c9e27b5d4c8e9f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6",
                  "container_image": "registry.bank.example/risk-api:3.5.2"}
    if not with_pod_id:
        del kubernetes["pod_id"]
    written = t_ns + 312_417  # containerd writes the line a moment after Spring stamped it
    envelope = {"date": _iso(written + 190_000, 6), "time": _iso(written, 9), "stream": "stdout", "_p": "F",
                "log": json.dumps(app, separators=(",", ":")), "app": app, "kubernetes": kubernetes}
    return json.dumps(envelope, separators=(",", ":")) + "\n"


def _ingest(sessions, database_url: str, tmp_path, lines: list[str]) -> None:
    src = tmp_path / "fluent-bit.jsonl"
    src.write_text("".join(lines))
    run = IngestRun(sessions, Settings(database_url=database_url, cluster=CLUSTER), cluster=CLUSTER, workers=1)
    with open(src, "rb") as fh:
        run.ingest_stream(fh, str(src))
    counts = run.finish()
    assert (counts.stored, counts.quarantined) == (len(lines), 0)


def _record_id(sessions, txn: str) -> int:
    with sessions() as s:
        return s.execute(select(InferenceRecord.id).where(InferenceRecord.transaction_id == txn)).scalar_one()


def _cli_trace(database_url: str, monkeypatch, *txns: str) -> list[dict]:
    """``draudit trace TXN... --output json`` (the stored attribution)."""
    monkeypatch.setenv("DRAUDIT_CLUSTER", CLUSTER)
    res = CliRunner().invoke(cli, ["trace", *txns, "--database-url", database_url, "--output", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _expected(sessions, txn: str, t_ns: int, pod: dict, *, status: str = "exact", reason: str | None = None,
              node: str | None, claim: dict | None = None, pool: str | None = None, device: str | None = None,
              device_uuid: str | None = None, gpu: str | None = None, product: str | None = None,
              mig_profile: str | None = None, co_tenants: list[dict] | None = None, candidates: int = 1) -> dict:
    """The ``draudit trace --output json`` document of a stored attribution."""
    return {
        "transaction_id": txn, "time": ns_to_rfc3339(t_ns), "status": status, "reason": reason,
        "pod": {"namespace": pod["metadata"]["namespace"], "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"], "node": node},
        "claim": ({"namespace": claim["metadata"]["namespace"], "name": claim["metadata"]["name"],
                   "uid": claim["metadata"]["uid"], "request": "gpu"} if claim else
                  {"namespace": None, "name": None, "uid": None, "request": None}),
        "device": {"driver": DRIVER if device else None, "pool": pool, "device": device},
        "device_uuid": device_uuid, "physical_gpu_uuid": gpu, "product": product, "mig_profile": mig_profile,
        "co_tenants": co_tenants or [], "conflict": False, "record_id": _record_id(sessions, txn), "cluster": CLUSTER,
        "container": "risk-api", "decision": "APPROVE", "candidates": candidates, "attribution": "stored",
        "identity_conflict": [],
    }


def _tenant(pod: dict, claim: dict) -> dict:
    """A ``co_tenants`` entry."""
    meta = pod["metadata"]
    return {"namespace": meta["namespace"], "pod": meta["name"], "pod_uid": meta["uid"],
            "claim": claim["metadata"]["name"], "consumer": "pod", "name": meta["name"], "uid": meta["uid"],
            "certain": True}


def _watch(srv, sessions):
    w = start_watcher(srv, sessions, cluster=CLUSTER)
    assert w.wait_synced(20)
    return w, now_ns()


def _on_gpu_a(claim: dict) -> dict:
    """The trace fields of a transaction served by gpu-node-a/gpu-0 (GPU A, an A100) through ``claim``."""
    return dict(node="gpu-node-a", claim=claim, pool="gpu-node-a", device="gpu-0", device_uuid=GPU_A, gpu=GPU_A,
                product=A100)


def _recorded_and_settled(srv, sessions) -> int:
    """Record the history as it stands, then wait until the sync lies beyond the tolerance: an
    instant ``t`` (µs) in the middle of that quiet stretch, which a transaction can be placed at."""
    w, synced = _watch(srv, sessions)
    try:
        t = _settle(synced)
        _settle(t)
    finally:
        w.stop()
    return t


# --------------------------------------------------------------------------------------------
# 1. a pod restarted onto another GPU
# --------------------------------------------------------------------------------------------


def test_pod_restarted_onto_another_gpu(srv, sessions, database_url, tmp_path, monkeypatch):
    """StatefulSet pod ``fraud-scorer-0`` on gpu-node-a (GPU A) is drained and comes back with a new
    uid and a new generated claim on gpu-node-b (GPU B): each transaction goes to the GPU of the
    incarnation that logged it — by pod uid, and by namespace + name at its time when the line
    carries no ``pod_id``."""
    _inventory(srv)
    srv.apply(_template())
    first, first_claim = _template_pod_up(srv, "fraud-scorer-0", "gpu-node-a", "gpu-0", suffix="q8w2e",
                                          uid="5d0f4c8e-1a2b-4c3d-9e8f-7a6b5c4d3e2f")
    w, synced = _watch(srv, sessions)
    try:
        t_first = _settle(synced)
        t_first_by_name = t_first + 40_000_000

        def restart():
            srv.delete("Pod", "fraud-scorer-0", NS, grace_period_s=30)  # node drain: terminating
            srv.delete("Pod", "fraud-scorer-0", NS)                     # containers gone
            claim = srv.apply(deallocate(srv.get("ResourceClaim", first_claim["metadata"]["name"], NS)))
            srv.delete("ResourceClaim", claim["metadata"]["name"], NS)  # marked: finalizer
            srv.apply(remove_finalizer(srv.get("ResourceClaim", claim["metadata"]["name"], NS)))
            return _template_pod_up(srv, "fraud-scorer-0", "gpu-node-b", "gpu-1", suffix="m4x7q",
                                    uid="8c7b6a5f-4e3d-4c2b-8a1f-0e9d8c7b6a5f")

        _settle(t_first_by_name)
        box: list = []
        _, after = _act(srv, w, lambda: box.append(restart()))
        second, second_claim = box[0]
        t_second = _settle(after)
        t_second_by_name = t_second + 40_000_000
        _settle(t_second_by_name)
    finally:
        w.stop()
    assert srv.get("ResourceClaim", first_claim["metadata"]["name"], NS) is None  # the first claim is gone
    assert first["metadata"]["uid"] != second["metadata"]["uid"]

    _ingest(sessions, database_url, tmp_path, [
        _fluent_bit_line("TXN-20261129-000101", t_first, first, "gpu-node-a"),
        _fluent_bit_line("TXN-20261129-000102", t_first_by_name, first, "gpu-node-a", with_pod_id=False),
        _fluent_bit_line("TXN-20261129-000201", t_second, second, "gpu-node-b"),
        _fluent_bit_line("TXN-20261129-000202", t_second_by_name, second, "gpu-node-b", with_pod_id=False),
    ])
    with sessions.begin() as s:
        assert attribute(s, cluster=CLUSTER, clock_skew_s=SKEW_S) == {"exact": 4, "ambiguous": 0, "unattributed": 0}

    docs = _cli_trace(database_url, monkeypatch, "TXN-20261129-000101", "TXN-20261129-000102",
                      "TXN-20261129-000201", "TXN-20261129-000202")
    on_a = dict(node="gpu-node-a", claim=first_claim, pool="gpu-node-a", device="gpu-0", device_uuid=GPU_A, gpu=GPU_A,
                product=A100)
    on_b = dict(node="gpu-node-b", claim=second_claim, pool="gpu-node-b", device="gpu-1", device_uuid=GPU_B, gpu=GPU_B,
                product=A100)
    assert docs == [
        _expected(sessions, "TXN-20261129-000101", t_first, first, **on_a),
        _expected(sessions, "TXN-20261129-000102", t_first_by_name, first, **on_a),
        _expected(sessions, "TXN-20261129-000201", t_second, second, **on_b),
        _expected(sessions, "TXN-20261129-000202", t_second_by_name, second, **on_b),
    ]
    assert first_claim["metadata"]["name"] == "fraud-scorer-0-gpu-q8w2e"
    assert second_claim["metadata"]["name"] == "fraud-scorer-0-gpu-m4x7q"
    with sessions() as s:  # the library's trace is what the CLI printed
        assert trace(s, [d["transaction_id"] for d in docs], cluster=CLUSTER) == docs


# --------------------------------------------------------------------------------------------
# 2. a MIG slice resolves to its parent GPU
# --------------------------------------------------------------------------------------------


def test_mig_slice_resolves_to_the_parent_gpu(srv, sessions, database_url, tmp_path, monkeypatch):
    """A claim of the ``mig.nvidia.com`` class is allocated MIG device ``gpu-0-mig-3g40gb-9-0`` of the
    H100 on gpu-node-c: the physical GPU is the parent's UUID, the device UUID the MIG UUID, the
    profile is reported; the kyc-docs pod on the other 3g.40gb slice of the same H100 is its co-tenant."""
    _inventory(srv)
    mig_template = make_claim_template("fraud-scorer-mig", NS, spec=claim_spec(device_class="mig.nvidia.com"))
    srv.apply(mig_template)
    scorer, scorer_claim = _template_pod_up(srv, "fraud-scorer-small-7c9d4-s2rld", "gpu-node-c",
                                            "gpu-0-mig-3g40gb-9-0", template=mig_template, suffix="x7k2p")
    kyc_claim = srv.apply(make_claim("document-classifier-mig", "kyc-docs",
                                     spec=claim_spec(device_class="mig.nvidia.com")))
    kyc = _named_claim_pod(srv, "document-classifier-6b8f9-56b5z", kyc_claim, namespace="kyc-docs")
    kyc_claim = srv.apply(allocate(kyc_claim, [("gpu", DRIVER, "gpu-node-c", "gpu-0-mig-3g40gb-9-4")], kyc,
                                   node="gpu-node-c"))
    kyc = _run_on(srv, kyc, "gpu-node-c")
    t = _recorded_and_settled(srv, sessions)

    _ingest(sessions, database_url, tmp_path, [_fluent_bit_line("TXN-20261129-000301", t, scorer, "gpu-node-c")])
    with sessions.begin() as s:
        assert attribute(s, cluster=CLUSTER, clock_skew_s=SKEW_S) == {"exact": 1, "ambiguous": 0, "unattributed": 0}
    [doc] = _cli_trace(database_url, monkeypatch, "TXN-20261129-000301")
    assert doc == _expected(sessions, "TXN-20261129-000301", t, scorer, node="gpu-node-c", claim=scorer_claim,
                            pool="gpu-node-c", device="gpu-0-mig-3g40gb-9-0", device_uuid=MIG_0, gpu=GPU_H100,
                            product=H100, mig_profile="3g.40gb", co_tenants=[_tenant(kyc, kyc_claim)])


# --------------------------------------------------------------------------------------------
# 3. a shared claim
# --------------------------------------------------------------------------------------------


def test_shared_claim_both_pods_exact_each_names_the_other(srv, sessions, database_url, tmp_path, monkeypatch):
    """One user claim ``fraud-shared-a100`` reserved for two pods (gpu-test3 pattern, dra-api.md §5.2):
    both pods' transactions are exact on GPU A through the same claim, and each trace names the
    other pod as the GPU's co-tenant."""
    _inventory(srv)
    shared = srv.apply(make_claim("fraud-shared-a100", NS))
    pod_a = _named_claim_pod(srv, "fraud-scorer-a-5f7d9-abcde", shared)
    pod_b = _named_claim_pod(srv, "fraud-scorer-b-6c8e1-fghij", shared)
    shared = srv.apply(allocate(shared, [("gpu", DRIVER, "gpu-node-a", "gpu-0")], pod_a, node="gpu-node-a"))
    pod_a = _run_on(srv, pod_a, "gpu-node-a")
    shared = srv.apply(reserve(shared, pod_b))
    pod_b = _run_on(srv, pod_b, "gpu-node-a")
    assert [r["uid"] for r in shared["status"]["reservedFor"]] == [pod_a["metadata"]["uid"], pod_b["metadata"]["uid"]]
    t = _recorded_and_settled(srv, sessions)

    _ingest(sessions, database_url, tmp_path, [
        _fluent_bit_line("TXN-20261129-000401", t, pod_a, "gpu-node-a"),
        _fluent_bit_line("TXN-20261129-000402", t + 3_000_000, pod_b, "gpu-node-a", with_pod_id=False, thread=7),
    ])
    with sessions.begin() as s:
        assert attribute(s, cluster=CLUSTER, clock_skew_s=SKEW_S) == {"exact": 2, "ambiguous": 0, "unattributed": 0}
    docs = _cli_trace(database_url, monkeypatch, "TXN-20261129-000401", "TXN-20261129-000402")
    on_a = _on_gpu_a(shared)
    assert docs == [
        _expected(sessions, "TXN-20261129-000401", t, pod_a, co_tenants=[_tenant(pod_b, shared)], **on_a),
        _expected(sessions, "TXN-20261129-000402", t + 3_000_000, pod_b, co_tenants=[_tenant(pod_a, shared)], **on_a),
    ]


# --------------------------------------------------------------------------------------------
# 4. inside the skew window
# --------------------------------------------------------------------------------------------


def test_transactions_within_the_tolerance_of_allocation_or_deallocation_are_ambiguous(
        srv, sessions, database_url, tmp_path, monkeypatch):
    """A transaction logged right when the watcher observed the allocation, and one logged just
    before the deallocation, are ``ambiguous`` / ``skew-window`` (with GPU A as the candidate), at
    a 1 s tolerance and at the default 2 s; one a little over 1 s from both is exact at 1 s."""
    skew = 1.0
    _inventory(srv)
    claim = srv.apply(make_claim("fraud-scorer-1-gpu", NS))
    pod = _named_claim_pod(srv, "fraud-scorer-1", claim)
    w, synced = _watch(srv, sessions)
    try:
        box: dict = {}

        def up():
            box["claim"] = srv.apply(allocate(claim, [("gpu", DRIVER, "gpu-node-a", "gpu-0")], pod, node="gpu-node-a"))
            box["pod"] = _run_on(srv, pod, "gpu-node-a")

        _settle(synced, skew)  # the allocation is no coverage-start edge's neighbour
        b_up, a_up = _act(srv, w, up)
        t_alloc_edge = _us(a_up)  # observed in [b_up, a_up]: at most a_up - b_up before
        t_mid = _settle(a_up, skew)
        t_dealloc_edge = _settle(t_mid, skew)
        _, a_down = _act(srv, w, lambda: srv.apply(deallocate(srv.get("ResourceClaim", "fraud-scorer-1-gpu", NS))))
    finally:
        w.stop()
    # the windows are what make the edges "within the tolerance"; on a machine so loaded that an
    # action took longer than the tolerance to be observed, this test could not tell
    windows_s = ((a_up - b_up) / NS_PER_S, (a_down - t_dealloc_edge) / NS_PER_S)
    assert max(windows_s) < skew, windows_s
    pod, claim = box["pod"], box["claim"]

    txns = {"TXN-20261129-000501": t_alloc_edge, "TXN-20261129-000502": t_mid, "TXN-20261129-000503": t_dealloc_edge}
    _ingest(sessions, database_url, tmp_path, [_fluent_bit_line(x, t, pod, "gpu-node-a") for x, t in txns.items()])
    with sessions.begin() as s:
        run = attribute_run(s, cluster=CLUSTER, clock_skew_s=skew)
    assert run.as_json()["by_reason"] == {"skew-window": 2}
    assert (run.as_json()["exact"], run.as_json()["ambiguous"]) == (1, 2)
    on_a = _on_gpu_a(claim)
    docs = _cli_trace(database_url, monkeypatch, *txns)
    assert docs == [
        _expected(sessions, "TXN-20261129-000501", t_alloc_edge, pod, status="ambiguous", reason="skew-window", **on_a),
        _expected(sessions, "TXN-20261129-000502", t_mid, pod, **on_a),
        _expected(sessions, "TXN-20261129-000503", t_dealloc_edge, pod, status="ambiguous", reason="skew-window",
                  **on_a),
    ]
    # the default tolerance (2 s): the edges stay in the window
    with sessions.begin() as s:
        attribute(s, all=True, cluster=CLUSTER)
    docs = _cli_trace(database_url, monkeypatch, "TXN-20261129-000501", "TXN-20261129-000503")
    assert [(d["status"], d["reason"], d["physical_gpu_uuid"]) for d in docs] == \
        [("ambiguous", "skew-window", GPU_A)] * 2


# --------------------------------------------------------------------------------------------
# 5. during a coverage gap
# --------------------------------------------------------------------------------------------


def test_transaction_during_a_coverage_gap_is_unattributed(srv, sessions, database_url, tmp_path, monkeypatch):
    """Writes the watches never see, history compacted, API server restarted: resuming is refused
    (410), the watcher relists and records a gap. A transaction inside the gap is ``unattributed``
    / ``coverage-gap`` although the same pod was exact on GPU A just before and just after it."""
    srv.bookmark_interval_s = None  # the watches hear nothing but the bookmarks sent below
    _inventory(srv)
    srv.apply(_template())
    pod, claim = _template_pod_up(srv, "fraud-scorer-2", "gpu-node-a", "gpu-0", suffix="z9v3n")
    w, synced = _watch(srv, sessions)
    try:
        t_before = _settle(synced)
        bookmarked = _settle(t_before)
        # a bookmark commits each kind's resume point (its last contact): the gap cannot start before
        # it. Bookmarks reach only the watches open at that moment, so one is sent at every poll.
        def bookmarked_all() -> bool:
            srv.send_bookmark()
            return all(_contact_ns(sessions, k) >= bookmarked for k in COVERAGE_KINDS)

        wait_until(bookmarked_all, interval_s=0.05, what="bookmarks committed")
        time.sleep(0.3)  # the collector hears nothing for a while
        srv.bump_rv(3)
        srv.compact()
        srv.restart()
        wait_until(lambda: all(r.synced.is_set() and not r.in_gap for r in w.reflectors)
                   and {g.kind for g in gaps(sessions)} >= set(COVERAGE_KINDS),
                   what="gap recorded and relisted")
        caught_up(srv, w)
        recorded = {g.kind: (g.started_ns, g.ended_ns) for g in gaps(sessions) if g.kind in COVERAGE_KINDS}
        start = max(recorded[k][0] for k in COVERAGE_KINDS)
        end = min(recorded[k][1] for k in COVERAGE_KINDS)
        t_inside = _us((start + end) // 2)
        t_after = _settle(max(g[1] for g in recorded.values()))
        _settle(t_after)
    finally:
        w.stop()
    assert t_before + SKEW_S * NS_PER_S < min(g[0] for g in recorded.values())
    assert start <= t_inside < end and end - start >= 300_000_000, recorded

    _ingest(sessions, database_url, tmp_path, [
        _fluent_bit_line("TXN-20261129-000601", t_before, pod, "gpu-node-a"),
        _fluent_bit_line("TXN-20261129-000602", t_inside, pod, "gpu-node-a"),
        _fluent_bit_line("TXN-20261129-000603", t_after, pod, "gpu-node-a"),
    ])
    with sessions.begin() as s:
        run = attribute_run(s, cluster=CLUSTER, clock_skew_s=SKEW_S)
    assert run.as_json()["by_reason"] == {"coverage-gap": 1}
    assert (run.as_json()["exact"], run.as_json()["unattributed"]) == (2, 1)
    on_a = _on_gpu_a(claim)
    docs = _cli_trace(database_url, monkeypatch, "TXN-20261129-000601", "TXN-20261129-000602", "TXN-20261129-000603")
    assert docs == [
        _expected(sessions, "TXN-20261129-000601", t_before, pod, **on_a),
        # inside a gap the row carries only the record's own pod uid: no node, claim or device
        _expected(sessions, "TXN-20261129-000602", t_inside, pod, status="unattributed", reason="coverage-gap",
                  node=None, candidates=0),
        _expected(sessions, "TXN-20261129-000603", t_after, pod, **on_a),
    ]


def _contact_ns(sessions, kind: str) -> int:
    """When ``kind``'s watch last committed or took a bookmark (``watch_state.updated_at``)."""
    with sessions() as s:
        return dt_to_ns(s.get(WatchState, (CLUSTER, kind)).updated_at)


# --------------------------------------------------------------------------------------------
# 6. a pod with no claim
# --------------------------------------------------------------------------------------------


def test_transaction_from_a_pod_without_a_claim(srv, sessions, database_url, tmp_path, monkeypatch):
    """Two running pods that hold no GPU claim:

    * ``fraud-explainer-…``: its template claim was not needed (``resourceClaimStatuses`` entry
      without ``resourceClaimName``, dra-api.md §5.1): the watcher records the pod, so the
      transaction is ``unattributed`` / ``no-claim`` with the pod's uid and node;
    * ``fraud-gateway-…``: no ``resourceClaims`` at all. The watcher records every pod, so the
      pod is known to have held no claim: ``unattributed`` / ``no-claim`` too (an earlier release
      recorded only pods with claims and said ``no-pod``: nothing known of it).
    """
    _inventory(srv)
    srv.apply(_template())
    explainer = srv.apply(make_pod("fraud-explainer-6d5f4-k8j2n", NS, claim_templates={"gpu": "fraud-scorer-gpu"},
                                   containers=_containers()))
    explainer = srv.apply(set_claim_statuses(explainer, {"gpu": None}))
    explainer = _run_on(srv, explainer, "gpu-node-b")
    gateway = srv.apply(make_pod("fraud-gateway-7f8c9-q2w3e", NS, containers=_containers(pod_claim=None)))
    gateway = _run_on(srv, gateway, "gpu-node-b")
    assert "resourceClaims" not in gateway["spec"]
    t = _recorded_and_settled(srv, sessions)
    with sessions() as s:
        pods = set(s.execute(select(ObjectVersion.name).where(ObjectVersion.kind == "Pod")).scalars())
    assert pods == {"fraud-explainer-6d5f4-k8j2n", "fraud-gateway-7f8c9-q2w3e"}

    _ingest(sessions, database_url, tmp_path, [
        _fluent_bit_line("TXN-20261129-000701", t, explainer, "gpu-node-b"),
        _fluent_bit_line("TXN-20261129-000702", t, gateway, "gpu-node-b", thread=5),
    ])
    with sessions.begin() as s:
        run = attribute_run(s, cluster=CLUSTER, clock_skew_s=SKEW_S)
    assert run.as_json()["by_reason"] == {"no-claim": 2}
    assert run.as_json()["unattributed"] == 2
    docs = _cli_trace(database_url, monkeypatch, "TXN-20261129-000701", "TXN-20261129-000702")
    assert docs == [
        _expected(sessions, "TXN-20261129-000701", t, explainer, status="unattributed", reason="no-claim",
                  node="gpu-node-b", candidates=0),
        _expected(sessions, "TXN-20261129-000702", t, gateway, status="unattributed", reason="no-claim",
                  node="gpu-node-b", candidates=0),
    ]
