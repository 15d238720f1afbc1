"""The fraud-scoring demo scenario: v1 shapes, §2.6 lifecycle order, the planted overlap, and logs
that agree with the placement ground truth (dra-api.md, log-formats.md, issue 7)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import kubernetes_validate
import kubernetes_validate.utils
import pytest

from collector import demo_scenario as ds
from collector.timeutil import NS_PER_S, parse_rfc3339_ns

START_NS = 1_749_032_100_000_000_000  # 2025-06-04T10:15:00Z
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"


@pytest.fixture(scope="module")
def scenario() -> ds.Scenario:
    return ds.build_timeline(START_NS, 30.0, seed=7)


@pytest.fixture(scope="module")
def logs(scenario, tmp_path_factory) -> ds.LogSet:
    return ds.generate_logs(scenario, tmp_path_factory.mktemp("logs"), n_transactions=3000, seed=7)


# ---- helpers that read the steps independently of the builder's own bookkeeping ----------------


def applied(scenario, kind):
    return [(i, s) for i, s in enumerate(scenario.steps) if s["op"] == "apply" and s["object"]["kind"] == kind]


def step_ns(scenario, step) -> int:
    return scenario.start_ns + round(step["at_s"] * NS_PER_S)


def slice_devices(scenario) -> dict[tuple[str, str, str], dict]:
    out = {}
    for _, step in applied(scenario, "ResourceSlice"):
        spec = step["object"]["spec"]
        for dev in spec["devices"]:
            out[(spec["driver"], spec["pool"]["name"], dev["name"])] = dev
    return out


def physical_uuid(dev: dict) -> str:
    attrs = dev["attributes"]
    return attrs["parentUUID"]["string"] if "parentUUID" in attrs else attrs["uuid"]["string"]


def quantity_bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", text)
    assert m, text
    return int(m.group(1)) * {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2)]


def claim_episodes(scenario) -> list[dict]:
    """Allocation episodes read from claim steps: device, namespace, [from_ns, to_ns)."""
    devices = slice_devices(scenario)
    episodes, open_ = [], {}
    for step in scenario.steps:
        obj = step["object"]
        if obj["kind"] != "ResourceClaim":
            continue
        uid = obj["metadata"]["uid"]
        alloc = obj.get("status", {}).get("allocation") if step["op"] == "apply" else None
        if alloc and uid not in open_:
            for r in alloc["devices"]["results"]:
                dev = devices[(r["driver"], r["pool"], r["device"])]
                open_.setdefault(uid, []).append({
                    "claim": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"],
                    "pool": r["pool"], "device": r["device"], "type": dev["attributes"]["type"]["string"],
                    "gpu": physical_uuid(dev), "from_ns": step_ns(scenario, step), "to_ns": None,
                })
        elif not alloc and uid in open_:
            for ep in open_.pop(uid):
                ep["to_ns"] = step_ns(scenario, step)
                episodes.append(ep)
    for eps in open_.values():
        for ep in eps:
            ep["to_ns"] = scenario.end_ns
            episodes.append(ep)
    return episodes


# ---- objects -------------------------------------------------------------------------------------


def test_every_applied_object_validates_against_the_kubernetes_1_36_schema(scenario, monkeypatch):
    # validate() re-reads the schema files on every call; reading each once keeps this test fast
    monkeypatch.setattr(kubernetes_validate.utils, "schema_contents",
                        functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents))
    kinds = set()
    for _, step in enumerate(scenario.steps):
        obj = step["object"]
        kinds.add(obj["kind"])
        if step["op"] == "apply":
            kubernetes_validate.validate(obj, "1.36", strict=True)
        else:
            assert set(obj) == {"apiVersion", "kind", "metadata"} and obj["metadata"]["name"]
    assert kinds == {"DeviceClass", "ResourceSlice", "ResourceClaimTemplate", "ResourceClaim", "Pod"}


def test_requests_sit_under_exactly_and_class_selectors_compare_quantities(scenario):
    for kind in ("ResourceClaimTemplate", "ResourceClaim"):
        for _, step in applied(scenario, kind):
            spec = step["object"]["spec"]
            spec = spec["spec"] if kind == "ResourceClaimTemplate" else spec
            for req in spec["devices"]["requests"]:
                assert set(req) == {"name", "exactly"}, req  # v1: no flat v1beta1 fields
                assert req["exactly"]["deviceClassName"]
    expressions = [sel["cel"]["expression"] for _, step in applied(scenario, "DeviceClass")
                   for sel in step["object"]["spec"]["selectors"]]
    capacity_exprs = [e for e in expressions if "device.capacity" in e]
    assert capacity_exprs == ['device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("12Gi")) >= 0']
    for e in expressions:
        assert not re.search(r"(attributes|capacity)\[[\"'][^\"']*/", e), e  # domain only as the key
        assert ".quantity" not in e and not re.search(r"memory\s*[<>]=?\s*quantity", e), e
    names = {step["object"]["metadata"]["name"] for _, step in applied(scenario, "DeviceClass")}
    assert names == {"gpu.nvidia.com", "mig.nvidia.com", ds.A10G_CLASS}


def test_slice_devices_are_flat_shared_a10gs_and_mig_slices_of_one_h100(scenario):
    devices = slice_devices(scenario)
    assert all("basic" not in dev for dev in devices.values())
    a10gs = {k: d for k, d in devices.items() if d["attributes"]["productName"]["string"] == "NVIDIA A10G"}
    assert sorted(k[1] for k in a10gs) == ["gpu-node-a", "gpu-node-b"]
    for dev in a10gs.values():
        assert dev["allowMultipleAllocations"] is True
        assert dev["attributes"]["type"]["string"] == "gpu"
        memory = dev["capacity"]["memory"]
        assert memory["value"] == "24Gi" and memory["requestPolicy"]["validRange"]["min"] == "1Gi"
    assert len({physical_uuid(d) for d in a10gs.values()}) == 2
    migs = {k: d for k, d in devices.items() if d["attributes"]["type"]["string"] == "mig"}
    assert {k[1] for k in migs} == {"gpu-node-c"} and len(migs) == 4
    parents = {d["attributes"]["parentUUID"]["string"] for d in migs.values()}
    assert len(parents) == 1 and parents.pop().startswith("GPU-")
    memory_slices = []
    for (_, _, name), dev in migs.items():
        profile = dev["attributes"]["profile"]["string"]
        assert dev["attributes"]["uuid"]["string"].startswith("MIG-")
        # v25.12+ name: gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>
        m = re.fullmatch(r"gpu-0-mig-([0-9a-z]+)-(\d+)-(\d+)", name)
        assert m and m.group(1) == profile.replace(".", "")
        slices = sorted(int(k[len("memorySlice"):]) for k in dev["capacity"] if k.startswith("memorySlice"))
        assert slices[0] == int(m.group(3))
        memory_slices += slices
    assert sorted(memory_slices) == list(range(8))  # the layout fills the H100's 8 memory slices once


def test_allocations_reference_published_devices_and_their_own_pods(scenario):
    devices = slice_devices(scenario)
    pods = {step["object"]["metadata"]["uid"]: step["object"] for _, step in applied(scenario, "Pod")}
    seen = 0
    for _, step in applied(scenario, "ResourceClaim"):
        claim = step["object"]
        status = claim.get("status", {})
        assert not status.get("reservedFor") or status.get("allocation"), "reservedFor without allocation"
        if not status.get("allocation"):
            continue
        seen += 1
        owner = claim["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "Pod" and owner["controller"] is True
        assert status["reservedFor"] == [{"resource": "pods", "name": owner["name"], "uid": owner["uid"]}]
        pod = pods[owner["uid"]]
        assert pod["metadata"]["name"] == owner["name"]
        assert claim["metadata"]["annotations"][ds.POD_CLAIM_ANNOTATION] == pod["spec"]["resourceClaims"][0]["name"]
        requested = claim["spec"]["devices"]["requests"][0]
        for result in status["allocation"]["devices"]["results"]:
            dev = devices[(result["driver"], result["pool"], result["device"])]
            assert result["request"] == requested["name"]
            node = status["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"]
            assert node == [result["pool"]]
            if dev.get("allowMultipleAllocations"):
                assert re.fullmatch(r"[0-9a-f-]{36}", result["shareID"])
                assert result["consumedCapacity"] == requested["exactly"]["capacity"]["requests"]
            else:
                assert "shareID" not in result and "consumedCapacity" not in result
    assert seen == 6  # six claims; no claim write after the allocation keeps it (the next one clears it)
    share_ids = [r["shareID"] for _, s in applied(scenario, "ResourceClaim")
                 for r in s["object"].get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
                 if "shareID" in r]
    assert len(set(share_ids)) == 4  # one share per A10G claim


def test_each_claim_follows_the_documented_lifecycle_order(scenario):
    steps = scenario.steps
    claims = {}
    for i, step in enumerate(steps):
        obj = step["object"]
        if obj["kind"] == "ResourceClaim":
            claims.setdefault(obj["metadata"]["uid"], []).append(i)

    def first(indices, pred, after=-1):
        return next(i for i in indices if i > after and pred(steps[i]))

    assert len(claims) == 6
    for claim_uid, idx in claims.items():
        claim0 = steps[idx[0]]["object"]
        pod_uid = claim0["metadata"]["ownerReferences"][0]["uid"]
        name = claim0["metadata"]["name"]
        pidx = [i for i, s in enumerate(steps) if s["object"]["kind"] == "Pod" and s["object"]["metadata"]["uid"] == pod_uid]
        status = lambda s: s["object"].get("status", {})  # noqa: E731
        pod_added = pidx[0]
        claim_added = idx[0]
        statuses = first(pidx, lambda s: status(s).get("resourceClaimStatuses", [{}])[0].get("resourceClaimName") == name)
        finalizer = first(idx, lambda s: DELETE_PROTECTION in s["object"]["metadata"].get("finalizers", []))
        allocation = first(idx, lambda s: "allocation" in status(s))
        bound = first(pidx, lambda s: s["object"]["spec"].get("nodeName"))
        running = first(pidx, lambda s: status(s).get("phase") == "Running")
        assert pod_added < claim_added < statuses < finalizer < allocation < bound < running, name
        alloc_step = steps[allocation]["object"]
        assert alloc_step["status"]["reservedFor"] and DELETE_PROTECTION in alloc_step["metadata"]["finalizers"]
        sched = [e for e in alloc_step["metadata"]["managedFields"]
                 if e["manager"] == "kube-scheduler" and e.get("subresource") == "status"]
        assert len(sched) == 1
        assert parse_rfc3339_ns(sched[0]["time"])[0] == step_ns(scenario, steps[allocation]) // NS_PER_S * NS_PER_S
        # the allocation is written once and never modified while set
        allocs = [steps[i]["object"]["status"]["allocation"] for i in idx
                  if steps[i]["op"] == "apply" and "allocation" in steps[i]["object"]["status"]]
        assert all(a == allocs[0] for a in allocs)
        if steps[idx[-1]]["op"] != "delete":
            continue
        terminal = first(pidx, lambda s: status(s).get("phase") == "Succeeded")
        deleting = first(pidx, lambda s: "deletionTimestamp" in s["object"]["metadata"])
        dealloc = first(idx, lambda s: s["op"] == "apply" and status(s) == {}, after=allocation)
        unfinalized = first(idx, lambda s: s["op"] == "apply" and not s["object"]["metadata"].get("finalizers"), after=dealloc)
        assert running < deleting < terminal < dealloc < unfinalized < idx[-1] < pidx[-1], name
        assert steps[pidx[-1]]["op"] == "delete" and unfinalized == dealloc + 1


def test_devices_are_never_overcommitted(scenario):
    devices = slice_devices(scenario)
    events = []
    episodes = claim_episodes(scenario)
    for i, ep in enumerate(episodes):
        dev = devices[(ds.DRIVER, ep["pool"], ep["device"])]
        if dev.get("allowMultipleAllocations"):
            events += [(ep["from_ns"], 1, ep), (ep["to_ns"], -1, ep)]
        else:  # an exclusive device (MIG slice) belongs to one claim at a time
            assert not [o for o in episodes[i + 1:] if (o["pool"], o["device"]) == (ep["pool"], ep["device"])
                        and max(o["from_ns"], ep["from_ns"]) < min(o["to_ns"], ep["to_ns"])]
    load: dict[tuple, int] = {}
    peak: dict[tuple, int] = {}
    for _t, sign, ep in sorted(events, key=lambda e: (e[0], e[1])):
        key = (ep["pool"], ep["device"])
        load[key] = load.get(key, 0) + sign * quantity_bytes(ds.SHARE_MEMORY)
        peak[key] = max(peak.get(key, 0), load[key])
        assert load[key] <= quantity_bytes(devices[(ds.DRIVER,) + key]["capacity"]["memory"]["value"])
    assert peak[("gpu-node-a", "gpu-0")] == 24 * 2**30  # two replicas fill the card before the update


def test_the_planted_overlap_is_the_only_cross_tenant_overlap_without_mig(scenario):
    episodes = claim_episodes(scenario)
    cross = []
    for i, a in enumerate(episodes):
        for b in episodes[i + 1:]:
            if a["gpu"] == b["gpu"] and a["namespace"] != b["namespace"] and \
                    max(a["from_ns"], b["from_ns"]) < min(a["to_ns"], b["to_ns"]):
                cross.append((a, b))
    non_mig = [(a, b) for a, b in cross if not (a["type"] == b["type"] == "mig" and a["device"] != b["device"])]
    assert len(non_mig) == 1
    a, b = non_mig[0]
    assert {a["namespace"], b["namespace"]} == {"risk-inference", "kyc-docs"}
    assert (a["pool"], a["device"]) == (b["pool"], b["device"]) == ("gpu-node-a", "gpu-0")
    v = scenario.violation
    assert v["physical_gpu_uuid"] == a["gpu"] and v["tenants"] == ["kyc-docs", "risk-inference"]
    assert v["from_ns"] == max(a["from_ns"], b["from_ns"]) and v["to_ns"] == min(a["to_ns"], b["to_ns"])
    assert {p["claim"] for p in v["pods"]} == {a["claim"], b["claim"]}
    assert 5 * NS_PER_S <= v["to_ns"] - v["from_ns"] <= 10 * NS_PER_S  # "for a while"


def test_rolling_update_moves_one_replica_to_gpu_node_b(scenario):
    fraud = {}
    for _, step in applied(scenario, "Pod"):
        meta = step["object"]["metadata"]
        if meta["namespace"] == "risk-inference":
            fraud[meta["uid"]] = step["object"]
    assert len(fraud) == 3
    replica_sets = {p["metadata"]["ownerReferences"][0]["name"] for p in fraud.values()}
    assert len(replica_sets) == 2 and all(r.startswith("fraud-scoring-service-") for r in replica_sets)
    for pod in fraud.values():
        assert [c["name"] for c in pod["spec"]["containers"]] == ["risk-api", "triton-sidecar"]
        claim_refs = {c["name"]: c["resources"].get("claims") for c in pod["spec"]["containers"]}
        assert claim_refs["risk-api"] is None and claim_refs["triton-sidecar"] == [{"name": "scorer-gpu", "request": "gpu"}]
        assert pod["spec"]["resourceClaims"] == [{"name": "scorer-gpu", "resourceClaimTemplateName": ds.FRAUD_TEMPLATE}]
    deleted = [s["object"]["metadata"]["uid"] for s in scenario.steps
               if s["op"] == "delete" and s["object"]["kind"] == "Pod" and s["object"]["metadata"]["uid"] in fraud]
    assert len(deleted) == 1
    gpus = {uid: [iv["node"] for iv in scenario.placement[uid]] for uid in fraud}
    new = [uid for uid, nodes in gpus.items() if nodes == ["gpu-node-b"]]
    assert len(new) == 1 and gpus[deleted[0]] == ["gpu-node-a"]
    created_new = scenario.placement[new[0]][0]["from_ns"]
    assert created_new < scenario.placement[deleted[0]][0]["to_ns"]  # surge first, then delete
    mid = scenario.start_ns + scenario.duration_s * NS_PER_S / 2
    assert abs(scenario.pods[deleted[0]]["deletion_ns"] - mid) < 2 * NS_PER_S  # "halfway"


def test_placement_agrees_with_the_claim_steps(scenario):
    by_claim = {ep["claim"]: ep for ep in claim_episodes(scenario)}
    assert sum(len(v) for v in scenario.placement.values()) == len(by_claim) == 6
    for pod_uid, intervals in scenario.placement.items():
        for iv in intervals:
            ep = by_claim[iv["claim_name"]]
            assert (iv["from_ns"], iv["to_ns"] or scenario.end_ns) == (ep["from_ns"], ep["to_ns"])
            assert (iv["pool"], iv["device"], iv["physical_gpu_uuid"]) == (ep["pool"], ep["device"], ep["gpu"])
            assert iv["namespace"] == ep["namespace"] == scenario.pods[pod_uid]["namespace"]


# ---- logs ----------------------------------------------------------------------------------------


def read_fluentbit(logs):
    """Classify every line as the ingest must: (kind, envelope, event)."""
    out = []
    for line in logs.fluentbit_path.read_text(encoding="utf-8").splitlines():
        try:
            env = json.loads(line)
        except json.JSONDecodeError:
            out.append(("bad-envelope", None, None))
            continue
        try:
            event = json.loads(env["log"])
        except json.JSONDecodeError:
            out.append(("bad-event", env, None))
            continue
        if "transaction" not in event:
            out.append(("no-transaction-id", env, event))
        elif not event["@timestamp"].endswith("Z"):
            out.append(("naive-time", env, event))
        else:
            out.append(("valid", env, event))
    return out


def read_otlp(logs):
    req = json.loads(logs.otlp_path.read_text(encoding="utf-8"))
    rows = []
    for rl in req["resourceLogs"]:
        res = {a["key"]: a["value"]["stringValue"] for a in rl["resource"]["attributes"]}
        for sl in rl["scopeLogs"]:
            for rec in sl["logRecords"]:
                attrs = {a["key"]: next(iter(a["value"].values())) for a in rec["attributes"]}
                rows.append((res, rec, attrs))
    return rows


def valid_records(scenario, logs):
    """(transaction_id, pod_uid, event_ns) for every valid record in both files."""
    out = []
    for kind, env, event in read_fluentbit(logs):
        if kind == "valid":
            out.append((event["transaction"]["id"], env["kubernetes"]["pod_id"], parse_rfc3339_ns(event["@timestamp"])[0]))
    for res, rec, attrs in read_otlp(logs):
        out.append((attrs["transaction.id"], res["k8s.pod.uid"], int(rec["timeUnixNano"])))
    return out


def test_counts_reconcile_with_the_files(scenario, logs):
    kinds = [k for k, _, _ in read_fluentbit(logs)]
    otlp = read_otlp(logs)
    assert len(kinds) == logs.counts["fluentbit_lines"]
    assert len(otlp) == logs.counts["otlp_records"] > 0
    assert kinds.count("valid") + len(otlp) == logs.counts["valid"] == 3000
    assert len(kinds) - kinds.count("valid") == logs.counts["malformed"] == 5
    assert {k for k in kinds if k != "valid"} == {"bad-envelope", "bad-event", "no-transaction-id", "naive-time"}
    ids = [r[0] for r in valid_records(scenario, logs)]
    assert len(ids) == len(set(ids))


def test_every_valid_record_lies_inside_its_pods_placement(scenario, logs):
    skew = set(logs.skew_window_transaction_ids)
    assert len(skew) == logs.counts["skew_window"] == 3
    for kind, env, event in read_fluentbit(logs):
        if env is None:
            continue
        k8s = env["kubernetes"]
        pod = scenario.pods[k8s["pod_id"]]
        assert (k8s["container_name"], k8s["namespace_name"], k8s["pod_name"], k8s["host"]) == \
            ("risk-api", "risk-inference", pod["name"], pod["node"])
        if kind == "valid":
            assert event["log"]["level"] in ("INFO", "WARN") and event["service"]["name"] == "fraud-scoring-service"
            assert set(event["model"]) == {"name", "version"} and event["decision"] in ("APPROVE", "REVIEW", "DECLINE")
            assert re.fullmatch(r"[0-9a-f]{32}", event["traceId"]) and re.fullmatch(r"[0-9a-f]{16}", event["spanId"])
            assert parse_rfc3339_ns(env["time"])[0] >= parse_rfc3339_ns(event["@timestamp"])[0]
    for res, rec, attrs in read_otlp(logs):
        assert res["k8s.container.name"] == "risk-api" and res["k8s.namespace.name"] == "risk-inference"
        assert res["k8s.node.name"] == scenario.pods[res["k8s.pod.uid"]]["node"]
        assert re.fullmatch(r"[0-9a-f]{32}", rec["traceId"]) and re.fullmatch(r"[0-9a-f]{16}", rec["spanId"])
        assert rec["timeUnixNano"].isdigit() and int(rec["observedTimeUnixNano"]) >= int(rec["timeUnixNano"])
    per_pod: dict[str, int] = {}
    for tx, pod_uid, t in valid_records(scenario, logs):
        intervals = [iv for iv in scenario.placement[pod_uid] if iv["from_ns"] <= t < (iv["to_ns"] or scenario.end_ns)]
        assert len(intervals) == 1, tx
        iv, pod = intervals[0], scenario.pods[pod_uid]
        edges = [iv["from_ns"], pod["running_ns"]] + [e for e in (iv["to_ns"], pod["deletion_ns"]) if e]
        nearest = min(abs(t - e) for e in edges)
        if tx in skew:
            assert abs(t - iv["to_ns"]) < 2 * NS_PER_S  # inside the default skew tolerance: ambiguous
        else:
            assert nearest >= 3 * NS_PER_S, tx
            assert t <= scenario.end_ns - 2 * NS_PER_S
        per_pod[pod_uid] = per_pod.get(pod_uid, 0) + 1
    assert len(per_pod) == 3  # the three fraud-scoring replicas, nobody else


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def test_exactly_one_line_carries_a_card_number(scenario, logs):
    run = re.compile(r"\d(?:[ -]?\d){12,18}(?![ -]?\d)")
    hits = []
    for n, line in enumerate(logs.fluentbit_path.read_text(encoding="utf-8").splitlines()):
        hits += [(n, m.group()) for m in run.finditer(line)]
    strings = []

    def walk(value, key=None):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and key not in ("timeUnixNano", "observedTimeUnixNano"):
            strings.append(value)

    walk(json.loads(logs.otlp_path.read_text(encoding="utf-8")))
    hits += [("otlp", m.group()) for s in strings for m in run.finditer(s)]
    assert len(hits) == 1 and hits[0][1] == ds.TEST_PAN
    assert luhn_ok(re.sub(r"\D", "", hits[0][1]))
    assert logs.counts["pan_lines"] == 1
    line = logs.fluentbit_path.read_text(encoding="utf-8").splitlines()[hits[0][0]]
    event = json.loads(json.loads(line)["log"])
    assert ds.TEST_PAN in event["message"] and event["transaction"]["id"]  # a valid record to be masked


def test_sample_is_taken_from_the_placement(scenario, logs):
    records = {tx: (pod, t) for tx, pod, t in valid_records(scenario, logs)}
    assert 3 <= len(logs.sample) <= 5
    gpus = set()
    for item in logs.sample:
        assert set(item) == {"transaction_id", "physical_gpu_uuid"}
        pod_uid, t = records[item["transaction_id"]]
        iv = scenario.placement_at(pod_uid, t)
        assert iv["physical_gpu_uuid"] == item["physical_gpu_uuid"]
        gpus.add(item["physical_gpu_uuid"])
        assert item["transaction_id"] not in logs.skew_window_transaction_ids
    devices = slice_devices(scenario)
    a10g_uuids = {physical_uuid(d) for d in devices.values() if d["attributes"]["productName"]["string"] == "NVIDIA A10G"}
    assert gpus == a10g_uuids  # both cards, before and after the rolling update
    assert scenario.violation["physical_gpu_uuid"] in gpus


def test_same_seed_same_bytes_other_seed_other_scenario(tmp_path):
    a = ds.build_timeline(START_NS, seed=11)
    b = ds.build_timeline(START_NS, seed=11)
    c = ds.build_timeline(START_NS, seed=12)
    dump = lambda s: json.dumps([s.timeline_document(), s.placement_document()])  # noqa: E731
    assert dump(a) == dump(b) != dump(c)
    la = ds.generate_logs(a, tmp_path / "a", n_transactions=400, seed=11)
    lb = ds.generate_logs(b, tmp_path / "b", n_transactions=400, seed=11)
    lc = ds.generate_logs(a, tmp_path / "c", n_transactions=400, seed=12)
    for name in ("fluentbit.jsonl", "otlp.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()
    assert la.sample == lb.sample != lc.sample


@pytest.mark.parametrize("duration_s", [20.0, 45.0])
def test_other_durations_keep_the_story_and_the_log_margins(tmp_path, duration_s):
    s = ds.build_timeline(START_NS, duration_s=duration_s, seed=3)
    assert s.end_ns == START_NS + int(duration_s * NS_PER_S)
    episodes = claim_episodes(s)
    assert all(ep["from_ns"] < ep["to_ns"] <= s.end_ns for ep in episodes)
    logs = ds.generate_logs(s, tmp_path, n_transactions=200, seed=3)
    for tx, pod_uid, t in valid_records(s, logs):
        iv = s.placement_at(pod_uid, t)
        assert iv is not None
        if tx not in logs.skew_window_transaction_ids:
            assert t - iv["from_ns"] >= 3 * NS_PER_S and (iv["to_ns"] is None or iv["to_ns"] - t >= 3 * NS_PER_S)


def test_bad_parameters_are_rejected_with_the_input_named():
    with pytest.raises(ValueError, match="duration_s=10"):
        ds.build_timeline(START_NS, duration_s=10)
    with pytest.raises(ValueError, match="start_ns"):
        ds.build_timeline(0)
    with pytest.raises(ValueError, match="n_transactions=5"):
        ds.generate_logs(ds.build_timeline(START_NS), "/nonexistent-not-created", n_transactions=5)


def test_cli_writes_the_inspection_files(tmp_path, capsys):
    assert ds.main(["--out", str(tmp_path), "--start", "2025-06-04T10:15:00Z", "--transactions", "60"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["fluentbit.jsonl", "logset.json", "otlp.json", "placement.json", "timeline.json"]
    timeline = json.loads((tmp_path / "timeline.json").read_text())
    assert timeline["start_ns"] == START_NS and timeline["steps"][0]["op"] == "apply"
    placement = json.loads((tmp_path / "placement.json").read_text())
    out = capsys.readouterr().out
    assert placement["violation"]["physical_gpu_uuid"] in out and "kyc-docs/doc-classifier-burst-" in out
    logset = json.loads((tmp_path / "logset.json").read_text())
    assert logset["counts"]["valid"] == 60 and logset["fluentbit"] == "fluentbit.jsonl"
    assert ds.main(["--out", str(tmp_path / "x"), "--start", "yesterday"]) == 2
    assert "--start 'yesterday'" in capsys.readouterr().err


def test_committed_sample_is_what_the_code_produces(tmp_path):
    sample = Path(__file__).resolve().parents[1] / "examples" / "fraud-scoring" / "sample"
    ds.write_scenario(tmp_path, parse_rfc3339_ns("2025-06-04T10:15:00Z")[0], n_transactions=60)
    names = sorted(p.name for p in sample.iterdir())
    assert names == sorted(p.name for p in tmp_path.iterdir())
    for name in names:
        assert (sample / name).read_bytes() == (tmp_path / name).read_bytes(), f"regenerate {name} (README)"


def test_the_steps_play_through_the_fake_api_server(scenario):
    import kubernetes

    from collector.sim.server import FakeApiServer

    with FakeApiServer() as srv:
        for step in scenario.steps:
            obj = step["object"]
            if step["op"] == "apply":
                stored = srv.apply(obj)
                assert stored["metadata"]["uid"] == obj["metadata"]["uid"] and stored["metadata"]["resourceVersion"]
            else:
                srv.delete(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))
        cfg = kubernetes.client.Configuration()
        cfg.host = srv.url
        with kubernetes.client.ApiClient(cfg) as api:  # raw JSON: the watcher keeps objects raw too
            claims = json.loads(kubernetes.client.ResourceV1Api(api).list_resource_claim_for_all_namespaces(
                _preload_content=False).data)["items"]
            pods = json.loads(kubernetes.client.CoreV1Api(api).list_pod_for_all_namespaces(
                _preload_content=False).data)["items"]
    still_held = {uid for uid, ivs in scenario.placement.items() if ivs[-1]["to_ns"] is None}
    assert {p["metadata"]["uid"] for p in pods} == still_held
    assert all(p["status"]["phase"] == "Running" for p in pods)
    assert {c["status"]["reservedFor"][0]["uid"] for c in claims} == still_held
    shared = [c["status"]["allocation"]["devices"]["results"][0] for c in claims
              if c["metadata"]["namespace"] == "risk-inference"]
    assert len(shared) == 2 and all(r["shareID"] and r["consumedCapacity"] == {"memory": "12Gi"} for r in shared)
