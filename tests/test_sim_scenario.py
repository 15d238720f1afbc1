"""Scenario driver and DRA object builders: the §2.6 claim lifecycle as a watcher sees it,
YAML/JSON timelines played in (scaled) real time, and the server's deletion semantics."""

from __future__ import annotations

import json
import threading
import time

import kubernetes
import kubernetes_validate
import pytest
import yaml

from collector.sim import FakeApiServer, Fault
from collector.sim.scenario import (Step, add_finalizer, claim_lifecycle_steps, dump_steps, load_steps, make_claim,
                                    make_device_class, make_gpu_device, make_pod, make_slice, play, remove_finalizer,
                                    replay_claim_lifecycle)


@pytest.fixture
def srv():
    server = FakeApiServer()
    server.start()
    yield server
    server.stop()


def _raw_events(srv, path: str, rv: str) -> list[dict]:
    cfg = kubernetes.client.Configuration()
    cfg.host = srv.url
    resp = kubernetes.client.ApiClient(cfg).call_api("GET", f"{srv.url}{path}?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    resp.read()
    return [json.loads(line) for line in resp.data.decode().splitlines()]


def test_claim_lifecycle_matches_the_documented_event_sequence(srv):
    start = str(srv.current_rv)
    written = replay_claim_lifecycle(srv, pod_name="trainer-0", namespace="ml", node="node-a",
                                     devices=[("gpu", "gpu-3")], include_template=True, delete_pod=True)
    assert len(written) == 13  # template + 10 writes + 2 deletes
    pods = _raw_events(srv, "/api/v1/pods", start)
    claims = _raw_events(srv, "/apis/resource.k8s.io/v1/resourceclaims", start)
    timeline = sorted(pods + claims, key=lambda e: int(e["object"]["metadata"]["resourceVersion"]))

    def describe(e):
        o, kind = e["object"], e["object"]["kind"]
        if kind == "Pod":
            st = o.get("status", {})
            return ("Pod", e["type"], o["spec"].get("nodeName"), st.get("phase"), bool(st.get("resourceClaimStatuses")))
        st = o.get("status") or {}
        return ("Claim", e["type"], tuple(o["metadata"].get("finalizers", [])), bool(st.get("allocation")), len(st.get("reservedFor", [])))

    fin = ("resource.kubernetes.io/delete-protection",)
    assert [describe(e) for e in timeline] == [
        ("Pod", "ADDED", None, "Pending", False),
        ("Claim", "ADDED", (), False, 0),
        ("Pod", "MODIFIED", None, "Pending", True),
        ("Claim", "MODIFIED", fin, False, 0),
        ("Claim", "MODIFIED", fin, True, 1),  # allocation and reservedFor in one write
        ("Pod", "MODIFIED", "node-a", "Pending", True),
        ("Pod", "MODIFIED", "node-a", "Running", True),
        ("Pod", "MODIFIED", "node-a", "Succeeded", True),
        ("Claim", "MODIFIED", fin, False, 0),  # status cleared in one write
        ("Claim", "MODIFIED", (), False, 0),
        ("Claim", "DELETED", (), False, 0),
        ("Pod", "DELETED", "node-a", "Succeeded", True),
    ]
    pod = pods[0]["object"]
    allocated = claims[2]["object"]
    assert allocated["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    assert allocated["status"]["reservedFor"] == [{"resource": "pods", "name": "trainer-0", "uid": pod["metadata"]["uid"]}]
    assert allocated["status"]["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-3"}]
    assert allocated["metadata"]["generateName"] == "trainer-0-gpu-"
    assert pods[1]["object"]["status"]["resourceClaimStatuses"] == [{"name": "gpu", "resourceClaimName": allocated["metadata"]["name"]}]
    for e in timeline:
        kubernetes_validate.validate(e["object"], "1.34.0", strict=True)


def test_play_follows_the_timeline_scaled_by_speed(srv):
    text = yaml.safe_dump([
        {"at": 0.0, "op": "apply", "object": make_device_class()},
        {"at": 0.4, "op": "apply", "object": make_slice("node-a", [make_gpu_device(0, uuid="GPU-a")], name="s-a")},
        {"at": 0.4, "op": "fault", "fault": {"kind": "Pod", "verb": "list", "action": "status", "code": 503}},
        {"at": 0.8, "op": "bump", "n": 10},
        {"at": 1.2, "op": "delete", "kind": "ResourceSlice", "name": "s-a"},
        {"at": 1.2, "op": "compact"},
    ])
    steps = load_steps(text)
    assert [s.op for s in steps] == ["apply", "apply", "fault", "bump", "delete", "compact"]
    seen = []
    t0 = time.monotonic()
    results = play(srv, steps, speed=2.0, on_step=lambda step, result: seen.append((step.op, time.monotonic() - t0)))
    elapsed = time.monotonic() - t0
    assert 0.58 <= elapsed < 1.0  # 1.2 s of timeline at double speed
    assert [op for op, _ in seen] == [s.op for s in steps]
    assert all(abs(at - s.at_s / 2) < 0.15 for (_, at), s in zip(seen, steps))
    assert isinstance(results[2], Fault) and srv.pending_faults() == [results[2]]
    assert results[4]["metadata"]["name"] == "s-a" and srv.objects("ResourceSlice") == []
    assert results[5] == srv.current_rv  # compaction point
    fast = time.monotonic()
    play(srv, [Step(5.0, "bump", 1), Step(60.0, "bump", 1)], speed=0)
    assert time.monotonic() - fast < 0.2


def test_play_can_be_stopped_between_steps(srv):
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    done = play(srv, [Step(0.0, "bump", 1), Step(5.0, "bump", 1)], stop=stop)
    assert len(done) == 1


def test_load_steps_rejects_bad_scenarios_naming_the_step(tmp_path):
    with pytest.raises(ValueError, match="step 1: missing 'at'"):
        load_steps([{"at": 0, "op": "compact"}, {"op": "compact"}])
    with pytest.raises(ValueError, match="step 0: op 'explode'"):
        load_steps([{"at": 0, "op": "explode"}])
    with pytest.raises(ValueError, match="step 1: at=1.0 is before step 0"):
        load_steps([{"at": 2, "op": "compact"}, {"at": 1, "op": "restart"}])
    with pytest.raises(ValueError, match="step 0: Fault action 'nope'"):
        load_steps([{"at": 0, "op": "fault", "fault": {"action": "nope"}}])
    path = tmp_path / "scenario.json"
    steps = claim_lifecycle_steps(namespace="ml", include_template=True)
    steps.append(Step(steps[-1].at_s, "fault", Fault(kind="ResourceSlice", verb="watch", action="inject_line", raw=b'{"x":')))
    path.write_text(json.dumps({"steps": dump_steps(steps)}))
    assert load_steps(path) == steps
    assert load_steps(str(path)) == steps


def test_delete_honours_finalizers_and_graceful_pod_deletion(srv):
    claim = srv.apply(add_finalizer(make_claim("shared", "ml")))
    marked = srv.delete("ResourceClaim", "shared", "ml")
    assert marked["metadata"]["deletionTimestamp"] and srv.get("ResourceClaim", "shared", "ml") is not None
    assert int(marked["metadata"]["resourceVersion"]) > int(claim["metadata"]["resourceVersion"])
    gone = srv.apply(remove_finalizer(marked))  # the last finalizer removed: the server deletes it
    assert srv.get("ResourceClaim", "shared", "ml") is None
    assert gone["metadata"]["resourceVersion"] == str(srv.current_rv)
    events = _raw_events(srv, "/apis/resource.k8s.io/v1/resourceclaims", claim["metadata"]["resourceVersion"])
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    assert events[1]["object"]["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]  # last stored state

    pod = srv.apply(make_pod("p", "ml", node_name="node-a"))
    terminating = srv.delete("Pod", "p", "ml", grace_period_s=30)
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30 and srv.get("Pod", "p", "ml") is not None
    srv.delete("Pod", "p", "ml")
    assert srv.get("Pod", "p", "ml") is None
    assert [e["type"] for e in _raw_events(srv, "/api/v1/pods", pod["metadata"]["resourceVersion"])] == ["MODIFIED", "DELETED"]
    with pytest.raises(KeyError):
        srv.delete("Pod", "p", "ml")


def test_apply_assigns_server_fields_and_skips_no_op_updates(srv):
    pod = make_pod("p", "ml", uid="0b7c3f0e-0000-4000-8000-000000000001")
    stored = srv.apply(pod)
    meta = stored["metadata"]
    assert meta["uid"] == "0b7c3f0e-0000-4000-8000-000000000001"  # a pinned uid is kept
    assert meta["generation"] == 1 and meta["creationTimestamp"].endswith("Z")
    rv = srv.current_rv
    assert srv.apply(pod)["metadata"]["resourceVersion"] == str(rv) and srv.current_rv == rv
    relabelled = srv.apply({**stored, "metadata": {**meta, "labels": {"a": "b"}}})
    assert relabelled["metadata"]["generation"] == 1  # metadata change
    respec = srv.apply({**relabelled, "spec": {**relabelled["spec"], "nodeName": "node-a"}})
    assert respec["metadata"]["generation"] == 2 and respec["metadata"]["creationTimestamp"] == meta["creationTimestamp"]
    generated = srv.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "job-", "namespace": "ml"},
                           "spec": {"containers": [{"name": "c", "image": "x"}]}})
    assert generated["metadata"]["name"].startswith("job-") and len(generated["metadata"]["name"]) == 9
    with pytest.raises(ValueError, match="namespace"):
        srv.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}})
    with pytest.raises(ValueError, match="not served"):
        srv.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"}})
