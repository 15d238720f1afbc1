"""Fake API server: LIST and WATCH semantics (watch-semantics.md §2–§6), checked through the
official kubernetes client (37.x) over real HTTP, and at the byte level where the client hides it."""

from __future__ import annotations

import json
import threading
import time

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from collector.sim import FakeApiServer
from collector.sim.scenario import make_device_class, make_gpu_device, make_pod, make_slice


@pytest.fixture
def srv():
    server = FakeApiServer()
    server.start()
    yield server
    server.stop()


def _client(srv) -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    cfg.host = srv.url
    return kubernetes.client.ApiClient(cfg)


@pytest.fixture
def core(srv):
    return kubernetes.client.CoreV1Api(_client(srv))


@pytest.fixture
def resource(srv):
    return kubernetes.client.ResourceV1Api(_client(srv))


def _raw(resp) -> dict:
    return json.loads(resp.data)


def _events(core, **kw) -> list[dict]:
    """All raw events of one pod watch that ends by its server-side timeout."""
    w = kubernetes.watch.Watch()
    return [
        {"type": e["type"], "object": e["raw_object"]}
        for e in w.stream(core.list_pod_for_all_namespaces, timeout_seconds=kw.pop("timeout_seconds", 1), **kw)
    ]


def test_paged_list_is_one_consistent_snapshot_across_pages(srv, core):
    pods = [srv.apply(make_pod(f"p{i}", "ml")) for i in range(7)]
    first = core.list_pod_for_all_namespaces(limit=3)
    snapshot_rv = first.metadata.resource_version
    assert snapshot_rv == str(srv.current_rv)
    assert first.metadata.remaining_item_count == 4
    # writes between pages must not show up in later pages
    changed = srv.apply({**pods[4], "metadata": {**pods[4]["metadata"], "labels": {"tier": "gold"}}})
    srv.delete("Pod", "p5", "ml")
    srv.apply(make_pod("p3a", "ml"))  # sorts inside the remaining range
    second = core.list_pod_for_all_namespaces(limit=3, _continue=first.metadata._continue)
    third = core.list_pod_for_all_namespaces(limit=3, _continue=second.metadata._continue)
    assert second.metadata.resource_version == third.metadata.resource_version == snapshot_rv
    assert second.metadata.remaining_item_count == 1
    assert third.metadata._continue is None and third.metadata.remaining_item_count is None
    listed = [(p.metadata.name, p.metadata.resource_version) for p in first.items + second.items + third.items]
    assert listed == [(p["metadata"]["name"], p["metadata"]["resourceVersion"]) for p in pods]
    assert changed["metadata"]["resourceVersion"] not in {rv for _n, rv in listed}
    fresh = core.list_pod_for_all_namespaces()
    assert sorted(p.metadata.name for p in fresh.items) == ["p0", "p1", "p2", "p3", "p3a", "p4", "p6"]
    assert int(fresh.metadata.resource_version) == srv.current_rv > int(snapshot_rv)


def test_list_items_have_no_kind_but_watch_objects_do(srv, core, resource):
    srv.apply(make_pod("p0", "ml"))
    srv.apply(make_device_class())
    pods = _raw(core.list_pod_for_all_namespaces(_preload_content=False))
    classes = _raw(resource.list_device_class(_preload_content=False))
    assert (pods["kind"], pods["apiVersion"]) == ("PodList", "v1")
    assert (classes["kind"], classes["apiVersion"]) == ("DeviceClassList", "resource.k8s.io/v1")
    for item in pods["items"] + classes["items"]:
        assert "kind" not in item and "apiVersion" not in item
        assert item["metadata"]["uid"] and item["metadata"]["resourceVersion"]
    [event] = _events(core)
    assert (event["object"]["kind"], event["object"]["apiVersion"]) == ("Pod", "v1")


def test_list_resource_version_is_the_global_counter_shared_by_kinds(srv, core, resource):
    srv.apply(make_pod("p0", "ml"))
    srv.apply(make_device_class())
    srv.bump_rv(5)
    pod_rv = int(core.list_pod_for_all_namespaces().items[0].metadata.resource_version)
    class_list = resource.list_device_class()
    assert int(class_list.metadata.resource_version) == srv.current_rv == pod_rv + 6
    assert int(class_list.items[0].metadata.resource_version) == pod_rv + 1


def test_watch_from_rv_replays_exactly_the_later_events(srv, core):
    a = srv.apply(make_pod("a", "ml"))
    resume = a["metadata"]["resourceVersion"]
    srv.bump_rv(3)
    b = srv.apply(make_pod("b", "ml"))
    srv.apply(make_device_class())  # another kind: not in the pod stream
    a2 = srv.apply({**a, "status": {"phase": "Running"}})
    gone = srv.delete("Pod", "b", "ml")
    events = _events(core, resource_version=resume)
    assert [(e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"]["resourceVersion"]) for e in events] == [
        ("ADDED", "b", b["metadata"]["resourceVersion"]),
        ("MODIFIED", "a", a2["metadata"]["resourceVersion"]),
        ("DELETED", "b", gone["metadata"]["resourceVersion"]),
    ]
    # DELETED carries the last stored state with the delete's own RV
    assert int(gone["metadata"]["resourceVersion"]) == srv.current_rv > int(b["metadata"]["resourceVersion"])
    assert events[2]["object"]["metadata"]["uid"] == b["metadata"]["uid"]


def test_rv_less_watch_sends_synthetic_added_in_name_order_not_rv_order(srv, core):
    for name in ("zeta", "alpha", "mid"):
        srv.apply(make_pod(name, "ml"))
    got = []
    w = kubernetes.watch.Watch()
    for e in w.stream(core.list_pod_for_all_namespaces, timeout_seconds=2):
        got.append((e["type"], e["raw_object"]["metadata"]["name"], int(e["raw_object"]["metadata"]["resourceVersion"])))
        if len(got) == 3:
            srv.apply(make_pod("late", "ml"))
        if len(got) == 4:
            w.stop()
    assert [g[:2] for g in got[:3]] == [("ADDED", "alpha"), ("ADDED", "mid"), ("ADDED", "zeta")]
    rvs = [g[2] for g in got[:3]]
    assert rvs != sorted(rvs)  # a client must not resume from these
    assert got[3][:2] == ("ADDED", "late") and got[3][2] == srv.current_rv


def test_bookmarks_only_when_allowed_and_carry_the_current_rv(srv, core):
    srv.apply(make_pod("a", "ml"))
    start = str(srv.current_rv)
    results: dict[str, list] = {"with": [], "without": []}

    def run(key, allow):
        w = kubernetes.watch.Watch()
        for e in w.stream(core.list_pod_for_all_namespaces, resource_version=start, allow_watch_bookmarks=allow, timeout_seconds=1):
            results[key].append(e)

    threads = [threading.Thread(target=run, args=("with", True)), threading.Thread(target=run, args=("without", False))]
    for t in threads:
        t.start()
    assert srv.wait_for_watches(2, "Pod")
    srv.bump_rv(7)  # progress elsewhere in etcd
    assert srv.send_bookmark("Pod") == 1
    assert srv.send_bookmark("ResourceClaim") == 0
    for t in threads:
        t.join(5)
    assert results["without"] == []
    [bm] = results["with"]
    assert bm["type"] == "BOOKMARK"
    assert bm["object"] == {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(srv.current_rv)}}


def test_timeout_seconds_ends_cleanly_with_a_bookmark_two_seconds_before(srv, core):
    srv.apply(make_pod("a", "ml"))
    t0 = time.monotonic()
    w = kubernetes.watch.Watch()
    got = [(e["type"], time.monotonic() - t0) for e in
           w.stream(core.list_pod_for_all_namespaces, resource_version=str(srv.current_rv), allow_watch_bookmarks=True, timeout_seconds=3)]
    elapsed = time.monotonic() - t0
    assert [g[0] for g in got] == ["BOOKMARK"]
    assert 0.7 <= got[0][1] <= 1.6
    assert 2.9 <= elapsed <= 3.8


def test_compaction_gives_error_410_event_and_python_watch_raises(srv, core):
    old = srv.apply(make_pod("a", "ml"))["metadata"]["resourceVersion"]
    srv.apply(make_pod("b", "ml"))
    oldest = srv.compact()
    resp = core.list_pod_for_all_namespaces(watch=True, resource_version=old, _preload_content=False)
    body = resp.data.decode()
    assert json.loads(body.splitlines()[0]) == {
        "type": "ERROR",
        "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": f"too old resource version: {old} ({oldest})", "reason": "Expired", "code": 410},
    }
    assert body.count("\n") == 1  # then a clean end
    srv.clear_requests()
    with pytest.raises(ApiException) as info:
        list(kubernetes.watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=old))
    assert info.value.status == 410
    # the client retried once with the same RV before giving up
    assert [r.query.get("resourceVersion") for r in srv.requests] == [old, old]


def test_history_limit_expires_old_resume_points_per_kind(core):
    with FakeApiServer(history_limit=3) as small:
        api = kubernetes.client.CoreV1Api(_client(small))
        first = small.apply(make_pod("p0", "ml"))["metadata"]["resourceVersion"]
        written = [small.apply(make_pod(f"p{i}", "ml")) for i in range(1, 5)]
        small.apply(make_device_class())  # other kinds do not push pods out
        resp = api.list_pod_for_all_namespaces(watch=True, resource_version=first, timeout_seconds=1, _preload_content=False)
        err = json.loads(resp.data.decode().splitlines()[0])
        assert err["type"] == "ERROR" and err["object"]["code"] == 410
        assert err["object"]["message"] == f"too old resource version: {first} ({written[0]['metadata']['resourceVersion']})"
        ok_from = written[0]["metadata"]["resourceVersion"]
        names = [e["raw_object"]["metadata"]["name"] for e in
                 kubernetes.watch.Watch().stream(api.list_pod_for_all_namespaces, resource_version=ok_from, timeout_seconds=1)]
        assert names == ["p2", "p3", "p4"]


def test_continue_token_expires_after_compaction_with_410(srv, core):
    for i in range(4):
        srv.apply(make_pod(f"p{i}", "ml"))
    page = core.list_pod_for_all_namespaces(limit=2)
    srv.apply(make_pod("p9", "ml"))
    srv.compact()
    with pytest.raises(ApiException) as info:
        core.list_pod_for_all_namespaces(limit=2, _continue=page.metadata._continue)
    assert info.value.status == 410
    status = json.loads(info.value.body)
    assert status["reason"] == "Expired" and status["message"].startswith("The provided continue parameter is too old")
    # the inconsistent-continue token of the 410 continues at the latest state
    rest = core.list_pod_for_all_namespaces(limit=10, _continue=status["metadata"]["continue"])
    assert [p.metadata.name for p in rest.items] == ["p2", "p3", "p9"]


def test_exact_list_at_an_older_rv_and_its_validation(srv, core):
    a = srv.apply(make_pod("a", "ml"))
    rv_then = str(srv.current_rv)
    srv.apply(make_pod("b", "ml"))
    srv.delete("Pod", "a", "ml")
    then = core.list_pod_for_all_namespaces(resource_version=rv_then, resource_version_match="Exact")
    assert [p.metadata.name for p in then.items] == ["a"] and then.metadata.resource_version == rv_then
    assert then.items[0].metadata.resource_version == a["metadata"]["resourceVersion"]
    cases = [
        (dict(resource_version_match="Exact"), 422),
        (dict(resource_version="0", resource_version_match="Exact"), 422),
        (dict(resource_version=rv_then, resource_version_match="Sometime"), 422),
        (dict(resource_version=rv_then, _continue="abc", limit=1), 400),
        (dict(resource_version="abc"), 400),
        (dict(resource_version=str(srv.current_rv + 100)), 504),
        (dict(field_selector="spec.driver=gpu.nvidia.com"), 400),  # not a Pod field
        (dict(label_selector="a in (x"), 400),
    ]
    for kwargs, code in cases:
        with pytest.raises(ApiException) as info:
            core.list_pod_for_all_namespaces(**kwargs)
        assert info.value.status == code, kwargs
    srv.compact()
    with pytest.raises(ApiException) as info:
        core.list_pod_for_all_namespaces(resource_version=rv_then, resource_version_match="Exact")
    assert info.value.status == 410


def test_field_and_label_selectors_on_list(srv, core, resource):
    srv.apply(make_slice("node-a", [make_gpu_device(0)], name="s-a"))
    srv.apply(make_slice("node-b", [make_gpu_device(0)], name="s-b"))
    srv.apply(make_slice("node-b", [], driver="compute-domain.nvidia.com", name="s-b-cd"))
    srv.apply(make_pod("a", "ml", node_name="node-a", labels={"app": "fraud", "tier": "gold"}))
    srv.apply(make_pod("b", "ml", node_name="node-b", labels={"app": "fraud"}))
    srv.apply(make_pod("c", "web", labels={"app": "shop"}))

    def slices(fs):
        return [s.metadata.name for s in resource.list_resource_slice(field_selector=fs).items]

    assert slices("spec.nodeName=node-b") == ["s-b", "s-b-cd"]
    assert slices("spec.nodeName=node-b,spec.driver=gpu.nvidia.com") == ["s-b"]
    assert slices("spec.driver!=gpu.nvidia.com") == ["s-b-cd"]
    assert slices("metadata.name=s-a") == ["s-a"]

    def pods(**kw):
        return [p.metadata.name for p in core.list_pod_for_all_namespaces(**kw).items]

    assert pods(field_selector="spec.nodeName=node-a") == ["a"]
    assert pods(field_selector="spec.nodeName=") == ["c"]
    assert pods(field_selector="metadata.namespace=web") == ["c"]
    assert pods(label_selector="app=fraud,tier") == ["a"]
    assert pods(label_selector="app in (fraud, shop),!tier") == ["b", "c"]
    assert pods(label_selector="app notin (fraud)") == ["c"]
    assert [p.metadata.name for p in core.list_namespaced_pod("ml").items] == ["a", "b"]
    with pytest.raises(ApiException) as info:
        resource.list_resource_slice(field_selector="metadata.namespace=x")  # cluster-scoped
    assert info.value.status == 400 and "field label not supported: metadata.namespace" in info.value.body


def test_selector_entry_and_exit_are_added_and_deleted(srv, core):
    p = srv.apply(make_pod("a", "ml", labels={"app": "fraud"}))
    start = str(srv.current_rv)
    left = srv.apply({**p, "metadata": {**p["metadata"], "labels": {"app": "other"}}})
    back = srv.apply({**left, "metadata": {**left["metadata"], "labels": {"app": "fraud"}}})
    moved = srv.apply({**back, "status": {"phase": "Running"}})
    events = _events(core, resource_version=start, label_selector="app=fraud")
    assert [(e["type"], e["object"]["metadata"]["resourceVersion"], e["object"]["metadata"]["labels"]["app"]) for e in events] == [
        ("DELETED", left["metadata"]["resourceVersion"], "fraud"),  # previous content, new RV
        ("ADDED", back["metadata"]["resourceVersion"], "fraud"),
        ("MODIFIED", moved["metadata"]["resourceVersion"], "fraud"),
    ]
    assert srv.get("Pod", "a", "ml")["metadata"]["uid"] == p["metadata"]["uid"]  # it never went away


def test_single_object_watch_pins_the_name(srv, core):
    srv.apply(make_pod("a", "ml"))
    srv.apply(make_pod("b", "ml"))
    resp = core.api_client.call_api("GET", srv.url + "/api/v1/namespaces/ml/pods/b?watch=true&timeoutSeconds=1")
    resp.read()
    lines = [json.loads(x) for x in resp.data.decode().splitlines()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "b")]
    bad = core.api_client.call_api("GET", srv.url + "/api/v1/namespaces/ml/pods/b?watch=true&fieldSelector=metadata.name%3Da")
    bad.read()
    assert bad.status == 400 and b"doesn't match requested name" in bad.data


def test_restart_closes_watches_cleanly_and_old_resume_points_expire(srv, core):
    rv = srv.apply(make_pod("a", "ml"))["metadata"]["resourceVersion"]
    srv.apply(make_pod("b", "ml"))
    done = threading.Event()
    got = []

    def run():
        for e in kubernetes.watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=str(srv.current_rv), timeout_seconds=30):
            got.append(e)
        done.set()

    t = threading.Thread(target=run)
    t.start()
    assert srv.wait_for_watches(1, "Pod")
    t0 = time.monotonic()
    assert srv.restart() == 1
    assert done.wait(3) and time.monotonic() - t0 < 1.0
    assert got == [] and srv.open_watches() == 0
    resp = core.list_pod_for_all_namespaces(watch=True, resource_version=rv, timeout_seconds=1, _preload_content=False)
    assert json.loads(resp.data.decode().splitlines()[0])["object"]["code"] == 410
    # lists are unaffected (etcd still has the data)
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces().items] == ["a", "b"]


def test_slow_consumer_is_evicted_without_blocking_writers(core):
    with FakeApiServer(watch_buffer_size=20) as small:
        api = kubernetes.client.CoreV1Api(_client(small))
        resp = api.list_pod_for_all_namespaces(watch=True, resource_version=str(small.current_rv), timeout_seconds=30,
                                               _preload_content=False)
        assert small.wait_for_watches(1)
        # The response is never read while 500 large writes happen: the server's writer
        # blocks on the full socket, its buffer overflows and the watch is closed.
        t0 = time.monotonic()
        for i in range(500):
            pod = make_pod(f"p{i:04d}", "ml")
            pod["metadata"]["annotations"] = {"note": "x" * 50_000}
            small.apply(pod)
            if i < 10:
                time.sleep(0.02)  # these ten are written to the socket before the burst
        assert time.monotonic() - t0 < 10
        body = resp.data.decode()  # drains: what was sent before the eviction, then a clean end
        lines = body.splitlines()
        assert 10 <= len(lines) < 500
        assert [json.loads(x)["object"]["metadata"]["name"] for x in lines] == [f"p{i:04d}" for i in range(len(lines))]
        assert small.open_watches() == 0


def test_streaming_list_ends_initial_events_with_annotated_bookmark(core):
    with FakeApiServer(watch_list=True) as wl:
        api = kubernetes.client.CoreV1Api(_client(wl))
        wl.apply(make_pod("b", "ml"))
        wl.apply(make_pod("a", "ml"))
        resp = api.list_pod_for_all_namespaces(watch=True, send_initial_events=True, resource_version_match="NotOlderThan",
                                               allow_watch_bookmarks=True, timeout_seconds=1, _preload_content=False)
        events = [json.loads(x) for x in resp.data.decode().splitlines()]
        assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [("ADDED", "a"), ("ADDED", "b"), ("BOOKMARK", None)]
        assert events[2]["object"]["metadata"] == {"resourceVersion": str(wl.current_rv),
                                                   "annotations": {"k8s.io/initial-events-end": "true"}}
    with pytest.raises(ApiException) as info:  # the default server has no WatchList feature
        core.list_pod_for_all_namespaces(watch=True, send_initial_events=True, resource_version_match="NotOlderThan",
                                         _preload_content=False)
    assert info.value.status == 422


def test_periodic_bookmarks_and_age_based_history():
    with FakeApiServer(bookmark_interval_s=0.3, history_max_age_s=0.4) as srv:
        api = kubernetes.client.CoreV1Api(_client(srv))
        old = srv.apply(make_pod("a", "ml"))["metadata"]["resourceVersion"]
        srv.apply(make_pod("b", "ml"))
        got = [e["type"] for e in kubernetes.watch.Watch().stream(api.list_pod_for_all_namespaces, resource_version=old,
                                                                  allow_watch_bookmarks=True, timeout_seconds=1)]
        assert got[0] == "ADDED" and got[1:] in (["BOOKMARK"] * 3, ["BOOKMARK"] * 2)
        # by now both writes are older than 0.4 s: the history no longer covers them
        resp = api.list_pod_for_all_namespaces(watch=True, resource_version=old, timeout_seconds=1, _preload_content=False)
        assert json.loads(resp.data.decode().splitlines()[0])["object"]["message"] == (
            f"too old resource version: {old} ({srv.current_rv})")


def test_periodic_etcd_compaction_expires_continue_tokens():
    with FakeApiServer(compaction_interval_s=0.3) as srv:
        api = kubernetes.client.CoreV1Api(_client(srv))
        for i in range(3):
            srv.apply(make_pod(f"p{i}", "ml"))
        page = api.list_pod_for_all_namespaces(limit=1)
        srv.apply(make_pod("later", "ml"))
        time.sleep(0.75)  # two ticks: the second compacts past the page's snapshot
        with pytest.raises(ApiException) as info:
            api.list_pod_for_all_namespaces(limit=1, _continue=page.metadata._continue)
        assert info.value.status == 410
