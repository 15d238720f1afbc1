"""Wrap the Spring Boot sample lines in the envelopes real shippers produce (log-formats.md §2, §3).

Run from this directory to regenerate the ``*.jsonl``/``*.log``/``*.json`` envelope samples:
``python compose_envelopes.py``. The application lines come from ``spring_ecs_35_nested.jsonl``
and ``spring_ecs_34_flat.jsonl`` (hand-written from the field tables of §1.2); the envelope field
names follow the tables of §2.2 (Fluent Bit), §2.3 (Fluentd), §2.4 (Vector), §2.5 (Filebeat),
§2.1 (CRI, docker json-file) and §3.2 (OTLP/JSON).
"""

import json

NESTED = open("spring_ecs_35_nested.jsonl").read().splitlines()
FLAT = open("spring_ecs_34_flat.jsonl").read().splitlines()
POD = {"namespace": "risk-inference", "name": "fraud-api-7c9d8-x2k4q", "uid": "0f3c2a9e-6a51-4d0e-9d7e-1b2c3d4e5f60",
       "node": "gpu-node-07", "container": "api", "ip": "10.4.7.21",
       "cid": "a3f1c9e27b5d4c8e9f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6",
       "image": "registry.example/fraud-api:2.7.1"}
CRI_TIMES = ["2025-03-04T10:15:00.067901337Z", "2025-03-04T10:15:00.11234Z", "2025-03-04T10:15:01.000412Z"]
DATES = ["2025-03-04T10:15:00.067901Z", "2025-03-04T10:15:00.112340Z", "2025-03-04T10:15:01.000412Z"]


def dumps(v):
    return json.dumps(v, separators=(",", ":"))


def fb_k8s():
    return {"pod_name": POD["name"], "namespace_name": POD["namespace"], "pod_id": POD["uid"],
            "labels": {"app.kubernetes.io/name": "fraud-api", "pod-template-hash": "7c9d8"}, "host": POD["node"],
            "pod_ip": POD["ip"], "container_name": POD["container"], "docker_id": POD["cid"],
            "container_hash": "registry.example/fraud-api@sha256:9b2f0c1d4e5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e",
            "container_image": POD["image"]}


def write(name, lines):
    with open(name, "w") as f:
        f.write("\n".join(lines) + "\n")


# Fluent Bit, multiline.parser cri, Merge_Log Off: the app line stays a string under `log`.
write("fluentbit_merge_off.jsonl", [
    dumps({"date": DATES[i], "time": CRI_TIMES[i], "stream": "stdout", "_p": "F", "log": NESTED[i],
           "kubernetes": fb_k8s()}) for i in range(3)])

# Merge_Log On + Keep_Log On, no Merge_Log_Key, Spring 3.5 nested ECS: two `log` keys (§2.2).
lines = []
for i in range(3):
    app = json.loads(NESTED[i])
    head = dumps({"date": DATES[i], "time": CRI_TIMES[i], "stream": "stdout", "_p": "F", "log": NESTED[i],
                  "kubernetes": fb_k8s()})[:-1]
    lines.append(head + "," + dumps(app)[1:])
write("fluentbit_merge_keep_log.jsonl", lines)

# Merge_Log On, Merge_Log_Key app, Keep_Log On (the configuration docs/shippers.md recommends).
write("fluentbit_merge_log_key.jsonl", [
    dumps({"date": DATES[i], "time": CRI_TIMES[i], "stream": "stdout", "_p": "F", "log": NESTED[i],
           "app": json.loads(NESTED[i]), "kubernetes": fb_k8s()}) for i in range(3)])

# Merge_Log On, Keep_Log Off, Spring 3.4 flat ECS: the app's keys at top level, no raw line.
write("fluentbit_merge_keep_log_off.jsonl", [
    dumps({"date": DATES[i], "time": CRI_TIMES[i], "stream": "stdout", "_p": "F", **json.loads(FLAT[i]),
           "kubernetes": fb_k8s()}) for i in range(3)])

# Merge_Log_Key log_processed (AWS Container Insights style), Keep_Log Off.
write("fluentbit_merge_log_key_keep_off.jsonl", [
    dumps({"date": DATES[i], "time": CRI_TIMES[i], "stream": "stdout", "_p": "F",
           "log_processed": json.loads(NESTED[i]), "kubernetes": fb_k8s()}) for i in range(3)])

# Classic [PARSER] cri regex: content under `message`, `logtag` instead of `_p`.
write("fluentbit_classic_parser.jsonl", [
    dumps({"date": 1741083300.067901 if i == 0 else 1741083300.11234 if i == 1 else 1741083301.000412,
           "time": CRI_TIMES[i], "stream": "stdout", "logtag": "F", "message": NESTED[i],
           "kubernetes": {k: v for k, v in fb_k8s().items() if k != "pod_id"}}) for i in range(3)])

# Fluentd kubernetes_metadata: docker.container_id, namespace_id, container_image_id.
write("fluentd.jsonl", [
    dumps({"stream": "stdout", "logtag": "F", "log": NESTED[i],
           "docker": {"container_id": POD["cid"]},
           "kubernetes": {"container_name": POD["container"], "namespace_name": POD["namespace"],
                          "pod_name": POD["name"], "container_image": POD["image"],
                          "container_image_id": "registry.example/fraud-api@sha256:9b2f0c1d",
                          "pod_id": POD["uid"], "pod_ip": POD["ip"], "host": POD["node"],
                          "labels": {"app.kubernetes.io/name": "fraud-api"},
                          "master_url": "https://10.96.0.1:443/api",
                          "namespace_id": "5d7e2b1a-0c3f-4e6d-8a9b-7c6d5e4f3a2b"}}) for i in range(3)])

# Vector kubernetes_logs → http sink (codec json / ndjson): message is the raw line.
write("vector.jsonl", [
    dumps({"file": f"/var/log/pods/{POD['namespace']}_{POD['name']}_{POD['uid']}/{POD['container']}/0.log",
           "kubernetes": {"container_id": "containerd://" + POD["cid"], "container_image": POD["image"],
                          "container_name": POD["container"], "namespace_labels": {"kubernetes.io/metadata.name": POD["namespace"]},
                          "pod_ip": POD["ip"], "pod_ips": [POD["ip"]], "pod_labels": {"app.kubernetes.io/name": "fraud-api"},
                          "pod_name": POD["name"], "pod_namespace": POD["namespace"], "pod_node_name": POD["node"],
                          "pod_owner": "ReplicaSet/fraud-api-7c9d8", "pod_uid": POD["uid"]},
           "message": NESTED[i], "source_type": "kubernetes_logs", "stream": "stdout",
           "timestamp": CRI_TIMES[i]}) for i in range(3)])

# Filebeat / Elastic Agent (filestream + container parser + add_kubernetes_metadata), ms @timestamp.
write("filebeat.jsonl", [
    dumps({"@timestamp": DATES[i][:23] + "Z", "message": NESTED[i], "stream": "stdout",
           "input": {"type": "filestream"}, "agent": {"type": "filebeat", "version": "8.15.0"},
           "ecs": {"version": "8.0.0"},
           "log": {"offset": 1024 * i, "file": {"path": f"/var/log/containers/{POD['name']}_{POD['namespace']}_{POD['container']}-{POD['cid']}.log"}},
           "container": {"id": POD["cid"], "runtime": "containerd", "image": {"name": POD["image"]}},
           "kubernetes": {"namespace": POD["namespace"], "namespace_uid": "5d7e2b1a-0c3f-4e6d-8a9b-7c6d5e4f3a2b",
                          "pod": {"name": POD["name"], "uid": POD["uid"], "ip": POD["ip"]},
                          "node": {"name": POD["node"]}, "container": {"name": POD["container"]},
                          "labels": {"app_kubernetes_io/name": "fraud-api"},
                          "replicaset": {"name": "fraud-api-7c9d8"}, "deployment": {"name": "fraud-api"}},
           "orchestrator": {"cluster": {"name": "prod-eu"}}}) for i in range(3)])

# Docker json-file driver (dockershim-era nodes).
write("docker_json.log", [dumps({"log": NESTED[i] + "\n", "stream": "stdout", "time": CRI_TIMES[i]}) for i in range(3)])

# CRI file as containerd writes it: the first app line split into P, P, F chunks, with a stderr
# JVM warning in between (partials are per stream), then a full line and a plain-text line.
first = NESTED[0]
chunks = [first[:120], first[120:260], first[260:]]
write("cri_containerd.log", [
    f"{CRI_TIMES[0]} stdout P {chunks[0]}",
    "2025-03-04T10:15:00.067950001Z stderr F OpenJDK 64-Bit Server VM warning: Sharing is only supported for boot loader classes because bootstrap classpath has been appended",
    f"{CRI_TIMES[0][:-4]}412Z stdout P {chunks[1]}",
    f"{CRI_TIMES[0][:-4]}530Z stdout F {chunks[2]}",
    f"{CRI_TIMES[1]} stdout F {NESTED[1]}",
    f"{CRI_TIMES[2]} stdout F {NESTED[2]}",
])


def kv(key, value):
    if isinstance(value, bool):
        v = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, float):
        v = {"doubleValue": value}
    else:
        v = {"stringValue": value}
    return {"key": key, "value": v}


# OTLP/JSON ExportLogsServiceRequest on one line (an OTel Collector `file` exporter line, or a
# /v1/logs body): an app exporting itself (Logback appender with captureMdcAttributes; ids in
# hex), and a filelog + container parser + k8sattributes record whose body is the raw app line.
resource_app = [kv("service.name", "fraud-api"), kv("service.version", "2.8.0"),
                kv("k8s.pod.uid", "7d1e4b2a-93c5-4f60-8a1b-2c3d4e5f6a7b"), kv("k8s.pod.name", "fraud-api-6f5b4-q9z7m"),
                kv("k8s.namespace.name", POD["namespace"]), kv("k8s.container.name", POD["container"]),
                kv("k8s.node.name", "gpu-node-03")]
resource_file = [kv("k8s.namespace.name", POD["namespace"]), kv("k8s.pod.name", POD["name"]),
                 kv("k8s.pod.uid", POD["uid"]), kv("k8s.container.name", POD["container"]),
                 kv("k8s.container.restart_count", 0), kv("k8s.node.name", POD["node"])]
otlp = {"resourceLogs": [
    {"resource": {"attributes": resource_app},
     "scopeLogs": [{"scope": {"name": "com.example.fraud.ScoringService"}, "logRecords": [
         {"timeUnixNano": "1741083302250123456", "observedTimeUnixNano": "1741083302250900000", "severityNumber": 9,
          "severityText": "INFO", "traceId": "0AF7651916CD43DD8448EB211C80319C", "spanId": "B7AD6B7169203331",
          "body": {"stringValue": "scored"},
          "attributes": [kv("txn_id", "T-000201"), kv("model_name", "fraud_xgb"), kv("model_version", "8"),
                         kv("decision", "APPROVE"), kv("latency_ms", 7.9), kv("thread.name", "http-nio-8080-exec-1")]},
         {"timeUnixNano": "1741083302731000000", "observedTimeUnixNano": "1741083302731500000", "severityNumber": 9,
          "severityText": "INFO", "traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "00f067aa0ba902b7",
          "body": {"stringValue": "scored"},
          "attributes": [kv("txn_id", "T-000202"), kv("model_name", "fraud_xgb"), kv("model_version", 8),
                         kv("decision", "DECLINE"), kv("latency_ms", "15.25")]},
         {"timeUnixNano": "1741083302800000000", "severityNumber": 13, "severityText": "WARN",
          "body": {"stringValue": "model cache miss"}, "attributes": []}]}]},
    {"resource": {"attributes": resource_file},
     "scopeLogs": [{"scope": {}, "logRecords": [
         {"timeUnixNano": "1741083300067901337", "observedTimeUnixNano": "1741083300070112000",
          "body": {"stringValue": NESTED[0]},
          "attributes": [kv("log.iostream", "stdout"), kv("logtag", "F"),
                         kv("log.file.path", f"/var/log/pods/{POD['namespace']}_{POD['name']}_{POD['uid']}/{POD['container']}/0.log")]}]}]},
]}
write("otlp_logs.json", [dumps(otlp)])
