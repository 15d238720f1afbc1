"""The fraud-scoring demo scenario: a bank's GPU inference cluster as data, plus its logs.

Used by ``draudit demo`` (issue 7, "The scenario") and by tests that need a realistic history.
Two pure builders and one small CLI:

* :func:`build_timeline` — the ``resource.k8s.io/v1`` and core/v1 objects of the story as an ordered
  list of steps ``{"at_s", "op", "object"}`` that ``collector.sim`` plays against the fake API
  server in real time, and the ground truth of which pod held which physical GPU when
  (:attr:`Scenario.placement`).
* :func:`generate_logs` — the scored transactions that the ``risk-api`` containers log while their
  pods run: Spring Boot 3.5 ECS lines inside Fluent Bit ``kubernetes``-filter envelopes
  (``fluentbit.jsonl``) and, for the pod of the new release, OTLP/JSON (``otlp.json``); plus a
  handful of malformed lines and exactly one line carrying a card number.
* ``python -m collector.demo_scenario --out DIR --start NOW`` writes both for inspection.

The story (times for the default 30 s run; the README in ``examples/fraud-scoring/`` tells it):
``risk-inference`` runs Deployment ``fraud-scoring-service`` with two replicas sharing the A10G of
``gpu-node-a`` through consumable capacity (12Gi each, ``shareID`` + ``consumedCapacity``);
``kyc-docs`` runs ``document-classifier`` on two MIG 1g.12gb slices of the H100 NVL of
``gpu-node-c`` (allowed: hardware partitioning). At 12 s a rolling update starts a pod of the new
ReplicaSet on ``gpu-node-b``'s A10G and at 14.5 s one old replica is deleted; at 18 s a
``kyc-docs`` pod (``doc-classifier-burst``) takes the 12Gi just freed on ``gpu-node-a``'s A10G,
next to the remaining fraud-scoring replica, until it is deleted at 25 s. That overlap — two
tenants on one physical GPU without hardware partitioning — is the planted violation
(:attr:`Scenario.violation`).

Shapes follow ``../shared/reference/dra-api.md`` (§2.6 lifecycle order, §2.7 managedFields, §2.8
claim, §3 CEL with ``compareTo``, §4.1 slice without ``basic``, §6 NVIDIA attributes and MIG device
names) and ``log-formats.md`` (§1.2 nested ECS, §2.2 Fluent Bit envelope, §3.2 OTLP/JSON). The
cluster is Kubernetes 1.36 with default gates, so ``DRAConsumableCapacity`` (beta) and
``allocationTimestamp`` (beta gates) are on. Everything is a pure function of ``(start_ns,
duration_s, seed)``; the files are byte-identical for the same inputs.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from collector.timeutil import NS_PER_S, ns_to_rfc3339

NS_PER_MS = 1_000_000

#: Length of the story the anchor times below are written for; other durations scale them.
BASE_DURATION_S = 30.0
#: Below this the log windows of the short-lived replica would vanish.
MIN_DURATION_S = 20.0
#: Regular transactions stay this far from any lifecycle transition of their own pod and claim,
#: so that attribution (default skew tolerance 2 s, issue 4) can be ``exact``.
LOG_MARGIN_NS = 3 * NS_PER_S
#: No log line in the last seconds of the run (the watcher is still catching up there).
END_MARGIN_NS = 2 * NS_PER_S

DRIVER = "gpu.nvidia.com"
RISK_NS = "risk-inference"
KYC_NS = "kyc-docs"
FRAUD_DEPLOYMENT = "fraud-scoring-service"
FRAUD_TEMPLATE = "fraud-scorer-gpu-claim-template"
KYC_MIG_TEMPLATE = "doc-classifier-mig-claim-template"
KYC_A10G_TEMPLATE = "doc-classifier-a10g-claim-template"
A10G_CLASS = "a10g-shared-memory"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
SHARE_MEMORY = "12Gi"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
LOGGER_NAME = "com.bank.risk.scoring.FraudScoringService"
TEST_PAN = "4111 1111 1111 1111"

#: Characters of apimachinery's ``rand.String`` (generateName suffixes, pod-template-hash).
_K8S_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
#: A run of 13+ digits with optional single space/dash separators looks like a card number to the
#: ingest PAN filter; generated identifiers must never contain one (only the planted line may).
_PAN_LIKE = re.compile(r"\d(?:[ -]?\d){12,}")

# Lifecycle offsets inside one pod's story (dra-api.md §2.6), in ms after its anchor.
_POD_ADDED_MS = 0
_CLAIM_ADDED_MS = 30
_CLAIM_STATUSES_MS = 45
_FINALIZER_MS = 120
_ALLOCATED_MS = 150
_BOUND_MS = 190
_CREATING_MS = 400
_RUNNING_MS = 1400
# Termination offsets, in ms after the deletion request.
_TERMINATED_MS = 1000
_DEALLOCATED_MS = 1100
_FINALIZER_REMOVED_MS = 1150
_CLAIM_DELETED_MS = 1200
_POD_DELETED_MS = 1300


# --------------------------------------------------------------------------------------------
# Public results
# --------------------------------------------------------------------------------------------


@dataclass
class Scenario:
    """The demo cluster's history and its ground truth.

    Attributes:
        start_ns: wall-clock time (ns since the epoch, UTC) that ``at_s == 0`` stands for.
        duration_s: length of the story in seconds (the sim plays it in real time).
        seed: RNG seed the identifiers were drawn from.
        steps: ordered ``{"at_s": float, "op": "apply"|"delete", "object": dict}``; ``apply``
            carries the full object as the API server would store it (no ``resourceVersion``:
            the server assigns it), ``delete`` carries ``apiVersion``/``kind``/``metadata``
            (name, namespace, uid).
        placement: pod uid → list of intervals ``{"from_ns", "to_ns" (None = still held at the
            end), "namespace", "pod_name", "node", "claim_name", "claim_uid", "request",
            "driver", "pool", "device", "device_uuid", "physical_gpu_uuid", "mig_profile",
            "product_name", "share_id", "consumed_memory"}``. An interval runs from the write that
            allocated and reserved the claim to the write that cleared it (§2.6 steps 5 and 9).
        pods: pod uid → facts the log generator and the demo need (``key``: the pod's role —
            ``fraud-a`` stays, ``fraud-b`` is replaced, ``fraud-c`` is the new release,
            ``kyc-mig-1``/``kyc-mig-2``, ``kyc-burst`` is the violator; namespace, name, node,
            deployment, service/model version, ``running_ns``, ``deletion_ns``,
            ``terminated_ns``, ``log_window_ns`` [from, to] for regular lines, ``drain_window_ns``
            while a deleted pod finishes in-flight requests, ``logs_via``, container ids, …).
        violation: the planted isolation violation: ``rule``, ``physical_gpu_uuid``, ``node``,
            ``device``, ``tenants``, ``pods`` (namespace, name, uid, claim), ``from_ns``,
            ``to_ns``.
    """

    start_ns: int
    duration_s: float
    seed: int
    steps: list[dict]
    placement: dict[str, list[dict]]
    pods: dict[str, dict]
    violation: dict

    @property
    def end_ns(self) -> int:
        """Wall-clock end of the story (ns)."""
        return self.start_ns + round(self.duration_s * NS_PER_S)

    def placement_at(self, pod_uid: str, event_time_ns: int) -> dict | None:
        """The placement interval of ``pod_uid`` holding ``event_time_ns``, or ``None``."""
        for interval in self.placement.get(pod_uid, ()):
            to_ns = interval["to_ns"] if interval["to_ns"] is not None else self.end_ns
            if interval["from_ns"] <= event_time_ns < to_ns:
                return interval
        return None

    def timeline_document(self) -> dict:
        """JSON document of the steps (``timeline.json``)."""
        return {
            "start_ns": self.start_ns,
            "start": ns_to_rfc3339(self.start_ns),
            "duration_s": self.duration_s,
            "seed": self.seed,
            "steps": self.steps,
        }

    def placement_document(self) -> dict:
        """JSON document of the ground truth (``placement.json``)."""
        return {
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "placement": self.placement,
            "pods": self.pods,
            "violation": self.violation,
        }


@dataclass
class LogSet:
    """What :func:`generate_logs` wrote.

    Attributes:
        fluentbit_path: JSON lines, one Fluent Bit record per line (``log`` kept as a string).
        otlp_path: one OTLP/JSON ``ExportLogsServiceRequest``.
        counts: ``valid`` (transaction records with id and zoned time, the PAN line included),
            ``malformed`` (lines the ingest must quarantine), ``pan_lines`` (always 1),
            ``fluentbit_lines``, ``otlp_records``, ``skew_window`` (valid records deliberately
            inside the clock-skew tolerance of their pod's last transition; ``ambiguous``).
        sample: a few ``{"transaction_id", "physical_gpu_uuid"}`` taken from the scenario's
            placement (never from a store); none of them is a skew-window or PAN record.
        skew_window_transaction_ids: the ids counted in ``counts["skew_window"]``.
    """

    fluentbit_path: Path
    otlp_path: Path
    counts: dict[str, int]
    sample: list[dict]
    skew_window_transaction_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready summary."""
        return {
            "fluentbit": str(self.fluentbit_path),
            "otlp": str(self.otlp_path),
            "counts": self.counts,
            "sample": self.sample,
            "skew_window_transaction_ids": self.skew_window_transaction_ids,
        }


# --------------------------------------------------------------------------------------------
# Time and identifier helpers
# --------------------------------------------------------------------------------------------


def _meta_time(ns: int) -> str:
    """``metav1.Time``: RFC 3339, whole seconds (truncated), ``Z``."""
    return datetime.fromtimestamp(ns // NS_PER_S, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _instant_text(ns: int) -> str:
    """Java ``Instant.toString()``: fraction in groups of 3 digits, none for a whole second."""
    seconds, rem = divmod(ns, NS_PER_S)
    base = datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    if rem == 0:
        return base + "Z"
    if rem % 1_000_000 == 0:
        return f"{base}.{rem // 1_000_000:03d}Z"
    if rem % 1_000 == 0:
        return f"{base}.{rem // 1_000:06d}Z"
    return f"{base}.{rem:09d}Z"


class _Ids:
    """Identifiers drawn from one seeded RNG, in call order (so the order of calls is part of
    the scenario's determinism)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def _clean(self, make) -> str:
        while True:
            value = make()
            if not _PAN_LIKE.search(value):
                return value

    def uid(self) -> str:
        """A lowercase version-4 UUID, as the API server assigns to ``metadata.uid``."""
        return self._clean(lambda: str(uuid.UUID(int=self.rng.getrandbits(128), version=4)))

    def device_uuid(self, prefix: str) -> str:
        """An NVML-style UUID such as ``GPU-…`` or ``MIG-…``."""
        return self._clean(lambda: f"{prefix}-{uuid.UUID(int=self.rng.getrandbits(128))}")

    def hex(self, length: int) -> str:
        """Lowercase hex of ``length`` characters, not all zero (trace/span/container ids)."""
        return self._clean(lambda: f"{self.rng.getrandbits(4 * length) | 1:0{length}x}")

    def suffix(self, length: int = 5) -> str:
        """``rand.String(length)`` from apimachinery's alphabet."""
        return "".join(self.rng.choice(_K8S_ALPHABET) for _ in range(length))


def _fields_of(value: Any) -> dict:
    """A ``FieldsV1`` map for the keys of ``value`` (lists and scalars are leaves)."""
    if isinstance(value, dict):
        return {f"f:{k}": _fields_of(v) for k, v in value.items()}
    return {}


def _set_managed(obj: dict, manager: str, operation: str, at_ns: int, fields: dict,
                 subresource: str | None = None) -> None:
    """Create or refresh one ``metadata.managedFields`` entry (dra-api.md §2.7)."""
    entries = obj["metadata"].setdefault("managedFields", [])
    entry = {
        "manager": manager,
        "operation": operation,
        "apiVersion": obj["apiVersion"],
        "time": _meta_time(at_ns),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    if subresource:
        entry["subresource"] = subresource
    for i, old in enumerate(entries):
        if (old["manager"], old["operation"], old.get("subresource")) == (manager, operation, subresource):
            entries[i] = entry
            return
    entries.append(entry)


def _drop_managed(obj: dict, manager: str, subresource: str | None = None) -> None:
    """Remove a manager's entry once it owns no field any more."""
    obj["metadata"]["managedFields"] = [
        e for e in obj["metadata"].get("managedFields", [])
        if not (e["manager"] == manager and e.get("subresource") == subresource)
    ]


# --------------------------------------------------------------------------------------------
# Inventory: nodes, devices, slices, classes, templates
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Node:
    name: str
    uid: str
    host_ip: str
    pod_prefix: str  # first three octets of the node's pod CIDR


@dataclass(frozen=True)
class _Device:
    node: str
    name: str
    uuid: str
    physical_gpu_uuid: str
    product: str
    memory: str
    shared: bool
    mig_profile: str | None = None


# H100 NVL (94 GB) MIG layout: 7 compute slices, 8 memory slices. (name part, GI profile id,
# placement start, memory slices, multiprocessors, copy engines, decoders, jpeg, memory).
# Memory sizes are illustrative (dra-api.md §10: attribute values are not verified).
_H100_MIG_LAYOUT = (
    ("1g.12gb", 19, 0, 1, 16, 1, 1, 1, "11008Mi"),
    ("1g.12gb", 19, 1, 1, 16, 1, 1, 1, "11008Mi"),
    ("2g.24gb", 14, 2, 2, 32, 2, 2, 2, "22272Mi"),
    ("3g.47gb", 9, 4, 4, 60, 3, 3, 3, "46592Mi"),
)
_NVIDIA_DRIVER_VERSION = "570.172.8"  # 570.172.08, semver-normalised by the driver
_CUDA_DRIVER_VERSION = "12.8.0"


def _common_gpu_attributes(product: str, arch: str, cc: str, pci: str) -> dict:
    return {
        "productName": {"string": product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": arch},
        "cudaComputeCapability": {"version": cc},
        "driverVersion": {"version": _NVIDIA_DRIVER_VERSION},
        "cudaDriverVersion": {"version": _CUDA_DRIVER_VERSION},
        "resource.kubernetes.io/pciBusID": {"string": pci},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
    }


def _a10g_device(device: _Device) -> dict:
    attributes = {"type": {"string": "gpu"}, "uuid": {"string": device.uuid}}
    attributes.update(_common_gpu_attributes("NVIDIA A10G", "Ampere", "8.6.0", "0000:00:1e.0"))
    return {
        "name": device.name,
        "attributes": attributes,
        "capacity": {
            "memory": {
                "value": device.memory,
                # Consumable capacity (dra-api.md §4.1, 1.34 alpha / 1.36 beta): claims must ask
                # for whole GiB between 1Gi and the card's 24Gi; no request means 4Gi.
                "requestPolicy": {
                    "default": "4Gi",
                    "validRange": {"min": "1Gi", "max": device.memory, "step": "1Gi"},
                },
            },
        },
        "allowMultipleAllocations": True,
    }


def _mig_device(device: _Device, layout: tuple) -> dict:
    profile, _gi, start, slices, sms, copy_engines, decoders, jpeg, memory = layout
    attributes = {
        "type": {"string": "mig"},
        "uuid": {"string": device.uuid},
        "parentUUID": {"string": device.physical_gpu_uuid},
        "profile": {"string": profile},
    }
    attributes.update(_common_gpu_attributes("NVIDIA H100 NVL", "Hopper", "9.0.0", "0000:c1:00.0"))
    capacity = {
        "multiprocessors": {"value": str(sms)},
        "copyEngines": {"value": str(copy_engines)},
        "decoders": {"value": str(decoders)},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": str(jpeg)},
        "ofaEngines": {"value": "0"},
        "memory": {"value": memory},
    }
    for s in range(start, start + slices):
        capacity[f"memorySlice{s}"] = {"value": "1"}
    return {"name": device.name, "attributes": attributes, "capacity": capacity}


def _resource_slice(ids: _Ids, node: _Node, devices: list[dict], at_ns: int) -> dict:
    name = f"{node.name}-{DRIVER}-"
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": name + ids.suffix(),
            "generateName": name,
            "uid": ids.uid(),
            "creationTimestamp": _meta_time(at_ns),
            "generation": 1,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid, "controller": True}
            ],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node.name,
            "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
    _set_managed(obj, "gpu-kubelet-plugin", "Update", at_ns,
                 {"f:metadata": {"f:generateName": {}, "f:ownerReferences": {}}, "f:spec": _fields_of(obj["spec"])})
    return obj


def _device_class(ids: _Ids, name: str, expressions: list[str], at_ns: int, manager: str,
                  labels: dict | None = None, extended_resource: str | None = None) -> dict:
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "uid": ids.uid(), "creationTimestamp": _meta_time(at_ns), "generation": 1},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }
    if labels:
        obj["metadata"]["labels"] = labels
    if extended_resource:
        obj["spec"]["extendedResourceName"] = extended_resource
    _set_managed(obj, manager, "Update", at_ns, {"f:spec": _fields_of(obj["spec"])})
    return obj


def _claim_template(ids: _Ids, namespace: str, name: str, request: dict, labels: dict, at_ns: int) -> dict:
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace, "uid": ids.uid(), "creationTimestamp": _meta_time(at_ns)},
        "spec": {"metadata": {"labels": labels}, "spec": {"devices": {"requests": [request]}}},
    }
    _set_managed(obj, "argocd-controller", "Update", at_ns, {"f:spec": _fields_of(obj["spec"])})
    return obj


# --------------------------------------------------------------------------------------------
# Pods and claims
# --------------------------------------------------------------------------------------------


@dataclass
class _PodPlan:
    """One pod's part in the story (all times are offsets from ``start_ns``)."""

    key: str
    namespace: str
    deployment: str
    rs_hash: str
    rs_uid: str
    name: str
    uid: str
    node: _Node
    device: _Device
    template: str
    pod_claim: str
    request: str
    consumed_memory: str | None
    anchor_ns: int
    delete_ns: int | None
    containers: list[dict]
    gpu_container: str
    labels: dict
    service_account: str
    service_version: str | None = None
    model_version: str | None = None
    logs_via: str | None = None
    pod_ip: str = ""
    container_ids: dict = field(default_factory=dict)
    image_ids: dict = field(default_factory=dict)


def _fraud_containers(version: str, pod_claim: str) -> list[dict]:
    return [
        {
            "name": "risk-api",
            "image": f"registry.bank.example/risk/fraud-scoring-api:{version}",
            "imagePullPolicy": "IfNotPresent",
            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
            "env": [
                {"name": "SPRING_PROFILES_ACTIVE", "value": "prod"},
                {"name": "TRITON_GRPC_ENDPOINT", "value": "localhost:8001"},
            ],
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
            "readinessProbe": {
                "httpGet": {"path": "/actuator/health/readiness", "port": 8080, "scheme": "HTTP"},
                "periodSeconds": 5, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3,
            },
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
        },
        {
            "name": "triton-sidecar",
            "image": "nvcr.io/nvidia/tritonserver:25.04-py3",
            "imagePullPolicy": "IfNotPresent",
            "args": ["tritonserver", "--model-repository=/models", "--log-format=ISO8601"],
            "ports": [
                {"name": "triton-http", "containerPort": 8000, "protocol": "TCP"},
                {"name": "triton-grpc", "containerPort": 8001, "protocol": "TCP"},
                {"name": "triton-metrics", "containerPort": 8002, "protocol": "TCP"},
            ],
            "resources": {
                "requests": {"cpu": "2", "memory": "8Gi"},
                "limits": {"memory": "8Gi"},
                "claims": [{"name": pod_claim, "request": "gpu"}],
            },
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
        },
    ]


def _classifier_containers(pod_claim: str, request: str) -> list[dict]:
    return [
        {
            "name": "classifier",
            "image": "registry.bank.example/kyc/document-classifier:1.4.2",
            "imagePullPolicy": "IfNotPresent",
            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
            "resources": {
                "requests": {"cpu": "2", "memory": "6Gi"},
                "limits": {"memory": "6Gi"},
                "claims": [{"name": pod_claim, "request": request}],
            },
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
        }
    ]


def _pod_object(plan: _PodPlan, at_ns: int) -> dict:
    rs_name = f"{plan.deployment}-{plan.rs_hash}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": plan.name,
            "generateName": rs_name + "-",
            "namespace": plan.namespace,
            "uid": plan.uid,
            "creationTimestamp": _meta_time(at_ns),
            "labels": dict(plan.labels),
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs_name, "uid": plan.rs_uid,
                "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": {
            "containers": copy.deepcopy(plan.containers),
            "resourceClaims": [{"name": plan.pod_claim, "resourceClaimTemplateName": plan.template}],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": plan.service_account,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
            "schedulerName": "default-scheduler",
            "enableServiceLinks": True,
            "priority": 0,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [  # added by the DefaultTolerationSeconds admission plugin
                {"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300}
                for taint in ("not-ready", "unreachable")
            ],
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }
    _set_managed(pod, "kube-controller-manager", "Update", at_ns, {
        "f:metadata": {"f:generateName": {}, "f:labels": _fields_of(plan.labels), "f:ownerReferences": {}},
        "f:spec": _fields_of(pod["spec"]),
    })
    return pod


def _claim_object(plan: _PodPlan, template_spec: dict, template_labels: dict, name: str, uid: str, at_ns: int) -> dict:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "generateName": f"{plan.name}-{plan.pod_claim}-",
            "namespace": plan.namespace,
            "uid": uid,
            "creationTimestamp": _meta_time(at_ns),
            "labels": dict(template_labels),
            "annotations": {POD_CLAIM_ANNOTATION: plan.pod_claim},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": plan.name, "uid": plan.uid,
                "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": copy.deepcopy(template_spec),
        "status": {},
    }
    _set_managed(claim, "kube-controller-manager", "Update", at_ns, {
        "f:metadata": {"f:annotations": _fields_of(claim["metadata"]["annotations"]), "f:generateName": {},
                       "f:labels": _fields_of(template_labels), "f:ownerReferences": {}},
        "f:spec": _fields_of(claim["spec"]),
    })
    return claim


def _container_statuses(plan: _PodPlan, state: str, at_ns: int, started_ns: int | None = None) -> list[dict]:
    out = []
    for c in plan.containers:
        status: dict[str, Any] = {"name": c["name"], "image": c["image"], "imageID": plan.image_ids[c["name"]]}
        if state == "creating":  # no container yet: the kubelet reports an empty imageID
            status.update({"imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}, "lastState": {},
                           "ready": False, "restartCount": 0, "started": False})
        elif state == "running":
            status.update({"containerID": plan.container_ids[c["name"]],
                           "state": {"running": {"startedAt": _meta_time(at_ns)}}, "lastState": {},
                           "ready": True, "restartCount": 0, "started": True})
        else:  # terminated
            status.update({"containerID": plan.container_ids[c["name"]],
                           "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                    "startedAt": _meta_time(started_ns or at_ns),
                                                    "finishedAt": _meta_time(at_ns),
                                                    "containerID": plan.container_ids[c["name"]]}},
                           "lastState": {}, "ready": False, "restartCount": 0, "started": False})
        out.append(status)
    return out


_KUBELET_STATUS_FIELDS = {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:hostIP": {}, "f:hostIPs": {},
                                      "f:phase": {}, "f:podIP": {}, "f:podIPs": {}, "f:startTime": {}}}


def _condition(kind: str, status: str, at_ns: int, reason: str | None = None) -> dict:
    cond = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": _meta_time(at_ns)}
    if reason:
        cond["reason"] = reason
    return cond


class _Timeline:
    """Collects steps with their offsets; objects are deep-copied at emission."""

    def __init__(self) -> None:
        self._steps: list[tuple[int, int, str, dict]] = []

    def apply(self, offset_ns: int, obj: dict) -> None:
        self._steps.append((offset_ns, len(self._steps), "apply", copy.deepcopy(obj)))

    def delete(self, offset_ns: int, obj: dict) -> None:
        meta = {"name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"]}
        if "namespace" in obj["metadata"]:
            meta["namespace"] = obj["metadata"]["namespace"]
        self._steps.append((offset_ns, len(self._steps), "delete",
                            {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": meta}))

    def steps(self) -> list[dict]:
        return [{"at_s": off / NS_PER_S, "op": op, "object": obj}
                for off, _seq, op, obj in sorted(self._steps, key=lambda s: (s[0], s[1]))]


def _play_pod(tl: _Timeline, ids: _Ids, plan: _PodPlan, template: dict, start_ns: int) -> tuple[dict, dict]:
    """Emit one pod's start and claim lifecycle in dra-api.md §2.6 order (and its deletion when
    planned); return (placement interval, facts)."""
    t0 = plan.anchor_ns
    at = lambda off_ms: t0 + off_ms * NS_PER_MS  # noqa: E731 — offset inside this pod's story
    wall = lambda off_ns: start_ns + off_ns  # noqa: E731

    # 1. pods ADDED (ReplicaSet controller)
    pod = _pod_object(plan, wall(at(_POD_ADDED_MS)))
    tl.apply(at(_POD_ADDED_MS), pod)

    # 2. resourceclaims ADDED (resourceclaim controller, from the template)
    claim_name = f"{plan.name}-{plan.pod_claim}-{ids.suffix()}"
    claim_uid = ids.uid()
    claim = _claim_object(plan, template["spec"]["spec"], template["spec"]["metadata"]["labels"],
                          claim_name, claim_uid, wall(at(_CLAIM_ADDED_MS)))
    tl.apply(at(_CLAIM_ADDED_MS), claim)

    # 3. pods MODIFIED: status.resourceClaimStatuses (server-side apply, ResourceClaimController)
    pod["status"]["resourceClaimStatuses"] = [{"name": plan.pod_claim, "resourceClaimName": claim_name}]
    _set_managed(pod, "ResourceClaimController", "Apply", wall(at(_CLAIM_STATUSES_MS)),
                 {"f:status": {"f:resourceClaimStatuses": {}}}, subresource="status")
    tl.apply(at(_CLAIM_STATUSES_MS), pod)

    # 4. resourceclaims MODIFIED: delete-protection finalizer (kube-scheduler, PreBind)
    claim["metadata"]["finalizers"] = [DELETE_PROTECTION]
    _set_managed(claim, "kube-scheduler", "Update", wall(at(_FINALIZER_MS)),
                 {"f:metadata": {"f:finalizers": {".": {}, f'v:"{DELETE_PROTECTION}"': {}}}})
    tl.apply(at(_FINALIZER_MS), claim)

    # 5. resourceclaims MODIFIED: allocation + reservedFor in one status write (kube-scheduler)
    allocated_ns = at(_ALLOCATED_MS)
    result: dict[str, Any] = {"request": plan.request, "driver": DRIVER, "pool": plan.node.name,
                              "device": plan.device.name}
    share_id = None
    if plan.consumed_memory:
        share_id = ids.uid()
        result["shareID"] = share_id
        result["consumedCapacity"] = {"memory": plan.consumed_memory}
    claim["status"] = {
        "allocation": {
            "devices": {"results": [result]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [plan.node.name]}]}]},
            "allocationTimestamp": _meta_time(wall(allocated_ns)),
        },
        "reservedFor": [{"resource": "pods", "name": plan.name, "uid": plan.uid}],
    }
    _set_managed(claim, "kube-scheduler", "Update", wall(allocated_ns), {"f:status": {
        "f:allocation": _fields_of(claim["status"]["allocation"]),
        "f:reservedFor": {".": {}, f'k:{{"uid":"{plan.uid}"}}': {".": {}, "f:name": {}, "f:resource": {}, "f:uid": {}}},
    }}, subresource="status")
    tl.apply(allocated_ns, claim)

    # 6. pods MODIFIED: bound (spec.nodeName, PodScheduled)
    pod["spec"]["nodeName"] = plan.node.name
    pod["status"]["conditions"] = [_condition("PodScheduled", "True", wall(at(_BOUND_MS)))]
    tl.apply(at(_BOUND_MS), pod)

    # 7. (no claim write for NVIDIA) kubelet prepares devices, creates containers
    creating_ns = at(_CREATING_MS)
    pod["status"].update({
        "conditions": [
            _condition("PodReadyToStartContainers", "False", wall(creating_ns)),
            _condition("Initialized", "True", wall(creating_ns)),
            _condition("Ready", "False", wall(creating_ns), "ContainersNotReady"),
            _condition("ContainersReady", "False", wall(creating_ns), "ContainersNotReady"),
            _condition("PodScheduled", "True", wall(at(_BOUND_MS))),
        ],
        "hostIP": plan.node.host_ip,
        "hostIPs": [{"ip": plan.node.host_ip}],
        "startTime": _meta_time(wall(creating_ns)),
        "containerStatuses": _container_statuses(plan, "creating", wall(creating_ns)),
    })
    _set_managed(pod, "kubelet", "Update", wall(creating_ns),
                 {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:hostIP": {}, "f:hostIPs": {},
                               "f:startTime": {}}}, subresource="status")
    tl.apply(creating_ns, pod)

    # 8. pods MODIFIED: Running and Ready
    running_ns = at(_RUNNING_MS)
    pod["status"].update({
        "phase": "Running",
        "conditions": [
            _condition("PodReadyToStartContainers", "True", wall(running_ns)),
            _condition("Initialized", "True", wall(creating_ns)),
            _condition("Ready", "True", wall(running_ns)),
            _condition("ContainersReady", "True", wall(running_ns)),
            _condition("PodScheduled", "True", wall(at(_BOUND_MS))),
        ],
        "podIP": plan.pod_ip,
        "podIPs": [{"ip": plan.pod_ip}],
        "containerStatuses": _container_statuses(plan, "running", wall(running_ns)),
    })
    _set_managed(pod, "kubelet", "Update", wall(running_ns), _KUBELET_STATUS_FIELDS, subresource="status")
    tl.apply(running_ns, pod)

    facts = {
        "namespace": plan.namespace, "name": plan.name, "uid": plan.uid, "node": plan.node.name,
        "deployment": plan.deployment, "replica_set": f"{plan.deployment}-{plan.rs_hash}",
        "pod_ip": plan.pod_ip, "labels": dict(plan.labels),
        "containers": [c["name"] for c in plan.containers], "gpu_container": plan.gpu_container,
        "container_ids": dict(plan.container_ids), "image_ids": dict(plan.image_ids),
        "images": {c["name"]: c["image"] for c in plan.containers},
        "service_version": plan.service_version, "model_version": plan.model_version,
        "logs_via": plan.logs_via, "claim_name": claim_name, "claim_uid": claim_uid,
        "running_ns": wall(running_ns), "deletion_ns": None, "terminated_ns": None,
        "drain_window_ns": None,
    }
    interval = {
        "from_ns": wall(allocated_ns), "to_ns": None,
        "namespace": plan.namespace, "pod_name": plan.name, "node": plan.node.name,
        "claim_name": claim_name, "claim_uid": claim_uid, "request": plan.request,
        "driver": DRIVER, "pool": plan.node.name, "device": plan.device.name,
        "device_uuid": plan.device.uuid, "physical_gpu_uuid": plan.device.physical_gpu_uuid,
        "mig_profile": plan.device.mig_profile, "product_name": plan.device.product,
        "share_id": share_id, "consumed_memory": plan.consumed_memory,
    }

    if plan.delete_ns is not None:
        _stop_pod(tl, plan, pod, claim, start_ns, interval, facts)
    return interval, facts


def _stop_pod(tl: _Timeline, plan: _PodPlan, pod: dict, claim: dict, start_ns: int,
              interval: dict, facts: dict) -> None:
    """Emit the deletion of a running pod and its generated claim (dra-api.md §2.6 steps 8–11,
    §2.5 "who writes what"); close the placement interval and record the drain window."""
    wall = lambda off_ns: start_ns + off_ns  # noqa: E731
    at = lambda off_ms: plan.anchor_ns + off_ms * NS_PER_MS  # noqa: E731 — start-phase times
    d0 = plan.delete_ns
    dat = lambda off_ms: d0 + off_ms * NS_PER_MS  # noqa: E731 — offset after the deletion request
    # 8'. pods MODIFIED: deletion requested; deletionTimestamp = request + the 30 s grace period
    pod["metadata"]["deletionTimestamp"] = _meta_time(wall(d0 + 30 * NS_PER_S))
    pod["metadata"]["deletionGracePeriodSeconds"] = 30
    tl.apply(d0, pod)
    # 8''. pods MODIFIED: containers exited after draining in-flight requests; terminal phase (kubelet)
    terminated_ns = dat(_TERMINATED_MS)
    pod["status"].update({
        "phase": "Succeeded",
        "conditions": [
            _condition("PodReadyToStartContainers", "False", wall(terminated_ns)),
            _condition("Initialized", "True", wall(at(_CREATING_MS))),
            _condition("Ready", "False", wall(terminated_ns), "PodCompleted"),
            _condition("ContainersReady", "False", wall(terminated_ns), "PodCompleted"),
            _condition("PodScheduled", "True", wall(at(_BOUND_MS))),
        ],
        "containerStatuses": _container_statuses(plan, "terminated", wall(terminated_ns), wall(at(_RUNNING_MS))),
    })
    _set_managed(pod, "kubelet", "Update", wall(terminated_ns), _KUBELET_STATUS_FIELDS, subresource="status")
    tl.apply(terminated_ns, pod)
    # 9. resourceclaims MODIFIED: reservedFor and allocation cleared in one write (controller)
    deallocated_ns = dat(_DEALLOCATED_MS)
    claim["status"] = {}
    _drop_managed(claim, "kube-scheduler", "status")
    tl.apply(deallocated_ns, claim)
    # 10. resourceclaims MODIFIED: finalizer removed (controller)
    del claim["metadata"]["finalizers"]
    _drop_managed(claim, "kube-scheduler")
    creator = next(e for e in claim["metadata"]["managedFields"] if e["manager"] == "kube-controller-manager")
    _set_managed(claim, "kube-controller-manager", "Update", wall(dat(_FINALIZER_REMOVED_MS)), creator["fieldsV1"])
    tl.apply(dat(_FINALIZER_REMOVED_MS), claim)
    # 11. resourceclaims DELETED (controller: the owner pod is done), then the pod object goes
    tl.delete(dat(_CLAIM_DELETED_MS), claim)
    tl.delete(dat(_POD_DELETED_MS), pod)
    interval["to_ns"] = wall(deallocated_ns)
    facts.update({"deletion_ns": wall(d0), "terminated_ns": wall(terminated_ns),
                  "drain_window_ns": [wall(d0), wall(terminated_ns)]})


# --------------------------------------------------------------------------------------------
# The timeline
# --------------------------------------------------------------------------------------------


def build_timeline(start_ns: int, duration_s: float = BASE_DURATION_S, seed: int = 7) -> Scenario:
    """Build the fraud-scoring story as API steps plus its placement ground truth.

    Args:
        start_ns: wall-clock time (ns since the epoch, UTC) of ``at_s == 0``; object timestamps
            (``creationTimestamp``, managedFields ``time``, conditions…) derive from it. To keep
            the watcher's observation times and the log times in step, build the timeline right
            before playing it at speed 1 (a start lag well under a second is absorbed by the 3 s
            log margin).
        duration_s: story length in seconds (default 30). The phase anchors (rolling update at
            40 %, replica deletion at 48 %, the other tenant's pod from 60 % to 83 %) scale with
            it; the steps inside one pod's lifecycle keep their real spacing (tens of ms to 1.4 s).
        seed: seed of the RNG that draws UIDs, UUIDs, name suffixes and container ids.

    Returns:
        :class:`Scenario` — steps in play order, placement, per-pod facts and the violation.

    Raises:
        ValueError: ``duration_s`` below :data:`MIN_DURATION_S` (the replaced replica would have
            no log window at least 3 s away from its transitions) or ``start_ns`` not positive.
    """
    if not isinstance(start_ns, int) or start_ns <= 0:
        raise ValueError(f"start_ns={start_ns!r}: give integer nanoseconds since the epoch (e.g. time.time_ns())")
    if duration_s < MIN_DURATION_S:
        raise ValueError(f"duration_s={duration_s}: the fraud-scoring story needs at least {MIN_DURATION_S} s")
    rng = random.Random(f"draudit-demo-timeline/{seed}")
    ids = _Ids(rng)
    scale = duration_s / BASE_DURATION_S
    anchor = lambda at_s: round(at_s * scale * NS_PER_S)  # noqa: E731 — scaled phase anchor
    tl = _Timeline()
    wall = lambda off_ns: start_ns + off_ns  # noqa: E731

    # Nodes and devices.
    nodes = {
        name: _Node(name, ids.uid(), host_ip, prefix)
        for name, host_ip, prefix in (
            ("gpu-node-a", "10.0.1.11", "10.244.1"),
            ("gpu-node-b", "10.0.1.12", "10.244.2"),
            ("gpu-node-c", "10.0.1.13", "10.244.3"),
        )
    }
    a10g = {}
    for node_name in ("gpu-node-a", "gpu-node-b"):
        gpu = ids.device_uuid("GPU")
        a10g[node_name] = _Device(node_name, "gpu-0", gpu, gpu, "NVIDIA A10G", "24Gi", shared=True)
    h100_uuid = ids.device_uuid("GPU")
    migs = []
    for layout in _H100_MIG_LAYOUT:
        profile, gi, start, *_rest, memory = layout
        name = f"gpu-0-mig-{profile.replace('.', '').lower()}-{gi}-{start}"
        migs.append((_Device("gpu-node-c", name, ids.device_uuid("MIG"), h100_uuid, "NVIDIA H100 NVL",
                             memory, shared=False, mig_profile=profile), layout))

    # Infrastructure at t = 0: classes (driver chart + platform team), slices (driver), templates.
    t = 0
    step_ns = 20 * NS_PER_MS
    gpu_type = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{}'"
    for obj in (
        _device_class(ids, GPU_CLASS, [gpu_type.format("gpu")], wall(t), "helm",
                      {"app.kubernetes.io/managed-by": "Helm"}, extended_resource="nvidia.com/gpu"),
        _device_class(ids, MIG_CLASS, [gpu_type.format("mig")], wall(t), "helm",
                      {"app.kubernetes.io/managed-by": "Helm"}),
        _device_class(ids, A10G_CLASS, [
            'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"',
            'device.attributes["gpu.nvidia.com"].productName == "NVIDIA A10G" && device.allowMultipleAllocations',
            f'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("{SHARE_MEMORY}")) >= 0',
        ], wall(t), "kubectl", {"app.kubernetes.io/managed-by": "platform-team"}),
    ):
        tl.apply(t, obj)
        t += step_ns
    for node_name in ("gpu-node-a", "gpu-node-b"):
        tl.apply(t, _resource_slice(ids, nodes[node_name], [_a10g_device(a10g[node_name])], wall(t)))
        t += step_ns
    tl.apply(t, _resource_slice(ids, nodes["gpu-node-c"], [_mig_device(d, lay) for d, lay in migs], wall(t)))
    t += step_ns
    a10g_request = {"name": "gpu", "exactly": {
        "deviceClassName": A10G_CLASS, "allocationMode": "ExactCount", "count": 1,
        "capacity": {"requests": {"memory": SHARE_MEMORY}},
    }}
    templates = {
        FRAUD_TEMPLATE: _claim_template(ids, RISK_NS, FRAUD_TEMPLATE, copy.deepcopy(a10g_request),
                                        {"app.kubernetes.io/name": FRAUD_DEPLOYMENT}, wall(t)),
        KYC_MIG_TEMPLATE: _claim_template(ids, KYC_NS, KYC_MIG_TEMPLATE, {"name": "mig", "exactly": {
            "deviceClassName": MIG_CLASS, "allocationMode": "ExactCount", "count": 1,
            "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].profile == "1g.12gb"'}}],
        }}, {"app.kubernetes.io/name": "document-classifier"}, wall(t + step_ns)),
        KYC_A10G_TEMPLATE: _claim_template(ids, KYC_NS, KYC_A10G_TEMPLATE, copy.deepcopy(a10g_request),
                                           {"app.kubernetes.io/name": "doc-classifier-burst"}, wall(t + 2 * step_ns)),
    }
    for obj in templates.values():
        tl.apply(t, obj)
        t += step_ns

    # Workloads: ReplicaSets (identities only; the sim serves no apps/v1) and their pods.
    def replica_set() -> tuple[str, str]:
        return ids.suffix(10), ids.uid()  # (pod-template-hash, ReplicaSet uid)

    fraud_old, fraud_new = replica_set(), replica_set()
    kyc_mig, kyc_burst = replica_set(), replica_set()
    ip_counter = {name: 10 for name in nodes}

    def plan(key, namespace, deployment, rs_pair, node_name, device, template, pod_claim, request,
             consumed, anchor_ns, delete_ns, version=None, model=None, logs_via=None) -> _PodPlan:
        rs_hash, rs_uid = rs_pair
        if namespace == RISK_NS:
            containers = _fraud_containers(version, pod_claim)
            labels = {"app.kubernetes.io/name": deployment, "app.kubernetes.io/part-of": "risk-platform",
                      "app.kubernetes.io/version": version, "pod-template-hash": rs_hash}
            gpu_container, sa = "triton-sidecar", deployment
        else:
            containers = _classifier_containers(pod_claim, request)
            labels = {"app.kubernetes.io/name": deployment, "app.kubernetes.io/part-of": "kyc-platform",
                      "pod-template-hash": rs_hash}
            gpu_container, sa = "classifier", "document-classifier"
        node = nodes[node_name]
        ip_counter[node_name] += rng.randint(1, 9)
        p = _PodPlan(key=key, namespace=namespace, deployment=deployment, rs_hash=rs_hash, rs_uid=rs_uid,
                     name=f"{deployment}-{rs_hash}-{ids.suffix()}", uid=ids.uid(), node=node, device=device,
                     template=template, pod_claim=pod_claim, request=request, consumed_memory=consumed,
                     anchor_ns=anchor_ns, delete_ns=delete_ns, containers=containers,
                     gpu_container=gpu_container, labels=labels, service_account=sa,
                     service_version=version, model_version=model, logs_via=logs_via,
                     pod_ip=f"{node.pod_prefix}.{ip_counter[node_name]}")
        for c in containers:
            p.container_ids[c["name"]] = "containerd://" + ids.hex(64)
            repo = c["image"].rsplit(":", 1)[0]
            p.image_ids[c["name"]] = f"{repo}@sha256:{ids.hex(64)}"
        return p

    fixed = lambda s: round(s * NS_PER_S)  # noqa: E731 — early starts keep real spacing
    plans = [
        plan("fraud-a", RISK_NS, FRAUD_DEPLOYMENT, fraud_old, "gpu-node-a", a10g["gpu-node-a"], FRAUD_TEMPLATE,
             "scorer-gpu", "gpu", SHARE_MEMORY, fixed(0.5), None, "2.7.1", "7", "fluentbit"),
        plan("fraud-b", RISK_NS, FRAUD_DEPLOYMENT, fraud_old, "gpu-node-a", a10g["gpu-node-a"], FRAUD_TEMPLATE,
             "scorer-gpu", "gpu", SHARE_MEMORY, fixed(0.905), anchor(14.5), "2.7.1", "7", "fluentbit"),
        plan("kyc-mig-1", KYC_NS, "document-classifier", kyc_mig, "gpu-node-c", migs[0][0], KYC_MIG_TEMPLATE,
             "mig-slice", "mig", None, fixed(1.31), None),
        plan("kyc-mig-2", KYC_NS, "document-classifier", kyc_mig, "gpu-node-c", migs[1][0], KYC_MIG_TEMPLATE,
             "mig-slice", "mig", None, fixed(1.715), None),
        plan("fraud-c", RISK_NS, FRAUD_DEPLOYMENT, fraud_new, "gpu-node-b", a10g["gpu-node-b"], FRAUD_TEMPLATE,
             "scorer-gpu", "gpu", SHARE_MEMORY, anchor(12.0), None, "2.8.0", "8", "otlp"),
        plan("kyc-burst", KYC_NS, "doc-classifier-burst", kyc_burst, "gpu-node-a", a10g["gpu-node-a"],
             KYC_A10G_TEMPLATE, "gpu", "gpu", SHARE_MEMORY, anchor(18.0), anchor(25.0)),
    ]

    placement: dict[str, list[dict]] = {}
    pods: dict[str, dict] = {}
    by_key: dict[str, tuple[_PodPlan, dict, dict]] = {}
    end_ns = start_ns + round(duration_s * NS_PER_S)
    for p in plans:
        interval, facts = _play_pod(tl, ids, p, templates[p.template], start_ns)
        facts["key"] = p.key
        running = facts["running_ns"]
        last = facts["deletion_ns"] if facts["deletion_ns"] is not None else end_ns + LOG_MARGIN_NS - END_MARGIN_NS
        window = [running + LOG_MARGIN_NS, last - LOG_MARGIN_NS]
        facts["log_window_ns"] = window if p.logs_via and window[0] < window[1] else None
        placement[p.uid] = [interval]
        pods[p.uid] = facts
        by_key[p.key] = (p, interval, facts)

    kept, kept_iv, _ = by_key["fraud-a"]
    burst, burst_iv, _ = by_key["kyc-burst"]
    violation = {
        "rule": "cross-tenant-gpu-sharing-without-hardware-partitioning",
        "physical_gpu_uuid": kept.device.physical_gpu_uuid,
        "node": kept.node.name,
        "device": kept.device.name,
        "tenants": sorted({kept.namespace, burst.namespace}),
        "pods": [
            {"namespace": x.namespace, "name": x.name, "uid": x.uid, "claim": iv["claim_name"],
             "share_id": iv["share_id"]}
            for x, iv in ((kept, kept_iv), (burst, burst_iv))
        ],
        "from_ns": max(kept_iv["from_ns"], burst_iv["from_ns"]),
        "to_ns": burst_iv["to_ns"],
    }
    return Scenario(start_ns=start_ns, duration_s=float(duration_s), seed=seed, steps=tl.steps(),
                    placement=placement, pods=pods, violation=violation)


# --------------------------------------------------------------------------------------------
# The logs
# --------------------------------------------------------------------------------------------


@dataclass
class _Txn:
    transaction_id: str | None
    event_ns: int
    pod_uid: str
    thread: str
    trace_id: str
    span_id: str
    decision: str | None
    latency_ms: float | None
    level: str = "INFO"
    message: str = "Transaction scored"


def _ecs_document(txn: _Txn, pod: dict, timestamp: str | None = None) -> dict:
    """A Spring Boot 3.5 ECS event (nested form, log-formats.md §1.2); MDC keys with dots nest."""
    doc: dict[str, Any] = {
        "@timestamp": timestamp or _instant_text(txn.event_ns),
        "log": {"level": txn.level, "logger": LOGGER_NAME},
        "process": {"pid": 1, "thread": {"name": txn.thread}},
        "service": {"name": FRAUD_DEPLOYMENT, "version": pod["service_version"], "environment": "prod"},
        "message": txn.message,
        "traceId": txn.trace_id,
        "spanId": txn.span_id,
    }
    if txn.transaction_id is not None:
        doc["transaction"] = {"id": txn.transaction_id}
        doc["model"] = {"name": "fraud_xgb", "version": pod["model_version"]}
        doc["decision"] = txn.decision
        doc["latency_ms"] = txn.latency_ms  # fluent key-value: stays a JSON number
    doc["ecs"] = {"version": "8.11"}
    return doc


def _fluentbit_record(pod: dict, runtime_ns: int, log_text: str, stream: str = "stdout") -> dict:
    """Fluent Bit tail (``multiline.parser cri``) + kubernetes filter, ``Merge_Log Off``,
    ``out_http``/``file`` JSON lines with ``json_date_key date`` (log-formats.md §2.2)."""
    seconds, rem = divmod(runtime_ns, NS_PER_S)
    container_id = pod["container_ids"]["risk-api"].split("://", 1)[1]
    return {
        "date": float(f"{seconds}.{rem // 1000:06d}"),
        "time": ns_to_rfc3339(runtime_ns),
        "stream": stream,
        "_p": "F",
        "log": log_text,
        "kubernetes": {
            "pod_name": pod["name"],
            "namespace_name": pod["namespace"],
            "pod_id": pod["uid"],
            "labels": pod["labels"],
            "host": pod["node"],
            "pod_ip": pod["pod_ip"],
            "container_name": "risk-api",
            "docker_id": container_id,
            "container_hash": pod["image_ids"]["risk-api"],
            "container_image": pod["images"]["risk-api"],
        },
    }


def _otlp_value(value: Any) -> dict:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _otlp_attrs(pairs: list[tuple[str, Any]]) -> list[dict]:
    return [{"key": k, "value": _otlp_value(v)} for k, v in pairs]


def _otlp_request(pod_txns: list[tuple[dict, list[tuple[_Txn, int]]]]) -> dict:
    """OTLP/JSON ``ExportLogsServiceRequest`` (log-formats.md §3.2): one ResourceLogs per pod, as
    the OpenTelemetry Logback appender with ``captureMdcAttributes=*`` and ``k8sattributes``
    produce it; ids are hex, times decimal strings."""
    resource_logs = []
    for pod, txns in pod_txns:
        records = []
        for txn, observed_ns in txns:
            records.append({
                "timeUnixNano": str(txn.event_ns),
                "observedTimeUnixNano": str(observed_ns),
                "severityNumber": 9 if txn.level == "INFO" else 13,
                "severityText": txn.level,
                "body": {"stringValue": txn.message},
                "attributes": _otlp_attrs([
                    ("transaction.id", txn.transaction_id),
                    ("model.name", "fraud_xgb"),
                    ("model.version", pod["model_version"]),
                    ("decision", txn.decision),
                    ("latency_ms", txn.latency_ms),
                    ("thread.name", txn.thread),
                ]),
                "flags": 1,
                "traceId": txn.trace_id,
                "spanId": txn.span_id,
            })
        resource_logs.append({
            "resource": {"attributes": _otlp_attrs([
                ("service.name", FRAUD_DEPLOYMENT),
                ("service.version", pod["service_version"]),
                ("deployment.environment.name", "prod"),
                ("k8s.namespace.name", pod["namespace"]),
                ("k8s.pod.name", pod["name"]),
                ("k8s.pod.uid", pod["uid"]),
                ("k8s.container.name", "risk-api"),
                ("k8s.node.name", pod["node"]),
                ("k8s.deployment.name", pod["deployment"]),
                ("container.id", pod["container_ids"]["risk-api"].split("://", 1)[1]),
            ])},
            "scopeLogs": [{"scope": {"name": LOGGER_NAME}, "logRecords": records}],
        })
    return {"resourceLogs": resource_logs}


def _split_counts(total: int, weights: list[int]) -> list[int]:
    """Largest-remainder split of ``total`` in proportion to ``weights``."""
    wsum = sum(weights)
    raw = [total * w / wsum for w in weights]
    counts = [math.floor(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: (counts[i] - raw[i], i))[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _compact(doc: dict) -> str:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


class _LogWriter:
    """Draws transactions from one seeded RNG and collects Fluent Bit lines (runtime_ns, seq, text).

    The order of calls is part of the output's determinism."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.ids = _Ids(rng)
        self.seen_ids: set[str] = set()
        self.lines: list[tuple[int, int, str]] = []

    def new_txn_id(self) -> str:
        while True:
            tx = f"TXN-{self.rng.getrandbits(48):012X}"
            if tx not in self.seen_ids and not _PAN_LIKE.search(tx):
                self.seen_ids.add(tx)
                return tx

    def make_txn(self, pod_uid: str, event_ns: int, with_id: bool = True) -> _Txn:
        r = self.rng.random()
        decision = "APPROVE" if r < 0.92 else ("REVIEW" if r < 0.98 else "DECLINE")
        latency = round(self.rng.lognormvariate(math.log(14.0), 0.35), 1)
        return _Txn(self.new_txn_id() if with_id else None, event_ns, pod_uid,
                    f"http-nio-8080-exec-{self.rng.randint(1, 40)}", self.ids.hex(32), self.ids.hex(16),
                    decision if with_id else None, latency if with_id else None)

    def times_in(self, window: list[int], count: int) -> list[int]:
        """``count`` sorted event times in ``[from, to)``, µs resolution like Logback's Instant."""
        lo, hi = window
        return sorted((self.rng.randrange(lo, hi) // 1000) * 1000 for _ in range(count))

    def emit(self, pod: dict, event_ns: int, text: str, stream: str = "stdout") -> dict:
        """Add one Fluent Bit line; the runtime reads the pipe 40 µs – 3 ms after the app wrote."""
        runtime_ns = event_ns + self.rng.randint(40_000, 3_000_000)
        record = _fluentbit_record(pod, runtime_ns, text, stream)
        self.lines.append((runtime_ns, len(self.lines), _compact(record)))
        return record

    def emit_malformed(self, pods: list[dict]) -> int:
        """Add the lines the ingest must quarantine (log-formats.md §0, issue 4); return how many."""
        kinds = ("truncated-envelope", "truncated-event", "missing-transaction-id", "naive-timestamp", "plain-text")
        for n, kind in enumerate(kinds):
            pod = pods[n % len(pods)]
            event_ns = self.times_in(pod["log_window_ns"], 1)[0]
            if kind == "missing-transaction-id":
                bad = self.make_txn(pod["uid"], event_ns, with_id=False)
                bad.level, bad.message = "WARN", "Rejected scoring request: header X-Transaction-Id is missing"
                self.emit(pod, event_ns, _compact(_ecs_document(bad, pod)))
            elif kind == "naive-timestamp":  # a hand-written appender that drops the zone
                bad = self.make_txn(pod["uid"], event_ns)
                naive = _instant_text(event_ns).rstrip("Z")
                self.emit(pod, event_ns, _compact(_ecs_document(bad, pod, timestamp=naive)))
            elif kind == "plain-text":
                self.emit(pod, event_ns, "OpenJDK 64-Bit Server VM warning: Sharing is only supported for boot "
                                         "loader classes because bootstrap classpath has been appended", "stderr")
            else:
                event = _compact(_ecs_document(self.make_txn(pod["uid"], event_ns), pod))
                if kind == "truncated-event":
                    self.emit(pod, event_ns, event[: len(event) * 3 // 5])
                else:  # the shipper died mid-record
                    text = _compact(self.emit(pod, event_ns, event))
                    runtime_ns, seq, _ = self.lines[-1]
                    self.lines[-1] = (runtime_ns, seq, text[: len(text) * 11 // 20])
        return len(kinds)

    def sorted_lines(self) -> list[str]:
        return [text for _, _, text in sorted(self.lines, key=lambda x: (x[0], x[1]))]


def _pick_sample(scenario: Scenario, eligible: list[_Txn], loggers: list[str]) -> list[dict]:
    """Per logging pod the record nearest the middle of its window, plus one of a violating pod's
    records well inside the violation; the GPU comes from the placement ground truth."""
    picks: list[_Txn] = []
    for uid in loggers:
        lo, hi = scenario.pods[uid]["log_window_ns"]
        mine = [x for x in eligible if x.pod_uid == uid]
        if mine:
            picks.append(min(mine, key=lambda x: (abs(x.event_ns - (lo + hi) // 2), x.transaction_id)))
    v = scenario.violation
    violators = {p["uid"] for p in v["pods"]}
    during = [x for x in eligible if v["from_ns"] + LOG_MARGIN_NS <= x.event_ns < v["to_ns"] - LOG_MARGIN_NS
              and x.pod_uid in violators and x not in picks]
    if during:
        picks.append(during[len(during) // 2])
    sample = []
    for x in picks:
        interval = scenario.placement_at(x.pod_uid, x.event_ns)
        if interval is None:  # window records are inside their placement by construction
            raise AssertionError(f"{x.transaction_id} at {x.event_ns} is outside its pod's placement")
        sample.append({"transaction_id": x.transaction_id, "physical_gpu_uuid": interval["physical_gpu_uuid"]})
    return sample


def generate_logs(scenario: Scenario, out_dir: str | Path, n_transactions: int = 3000, seed: int = 7,
                  skew_transactions: int = 3) -> LogSet:
    """Write the transactions the ``risk-api`` containers log during ``scenario``.

    Regular records lie inside their pod's ``log_window_ns``: from 3 s after the pod is Running
    to 3 s before its deletion request (or 2 s before the end), hence at least 3 s from every
    transition of the pod and its claim, so attribution is ``exact``. ``skew_transactions``
    records are logged by the replaced replica while it drains in-flight requests after its
    deletion request: still inside its placement interval, but within 2 s of the claim's
    deallocation, so a correct attribution calls them ``ambiguous``.

    Files (in ``out_dir``, created if missing):
        ``fluentbit.jsonl`` — pods of release 2.7.1: one Fluent Bit record per line, sorted by
        the runtime (CRI) time, the Spring Boot 3.5 ECS event as the ``log`` string; also 5
        malformed lines (truncated envelope, truncated event, event without transaction id,
        event with a zone-less ``@timestamp``, a plain-text JVM warning) and exactly one valid
        record whose message carries the test PAN ``4111 1111 1111 1111``.
        ``otlp.json`` — the pod of release 2.8.0 (OpenTelemetry Logback appender): one
        ``ExportLogsServiceRequest``.

    Args:
        scenario: from :func:`build_timeline`.
        out_dir: directory to write into.
        n_transactions: valid transaction records in total (≥ 10), PAN and skew records included.
        seed: RNG seed for transaction ids, trace ids, decisions and latencies.
        skew_transactions: records placed in the skew window (0 to disable).

    Returns:
        :class:`LogSet` with the paths, counts and a placement-derived sample.

    Raises:
        ValueError: ``n_transactions`` < 10 or ``skew_transactions`` negative or ≥ n_transactions.
    """
    if n_transactions < 10:
        raise ValueError(f"n_transactions={n_transactions}: need at least 10 to place the PAN and sample records")
    if not 0 <= skew_transactions < n_transactions:
        raise ValueError(f"skew_transactions={skew_transactions}: must be between 0 and n_transactions - 1")
    w = _LogWriter(random.Random(f"draudit-demo-logs/{seed}"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    loggers = [uid for uid, p in scenario.pods.items() if p["log_window_ns"]]
    drainers = [uid for uid in loggers if scenario.pods[uid]["drain_window_ns"]]
    if skew_transactions and not drainers:
        raise ValueError("scenario has no draining pod to place skew-window records in")

    # Regular transactions, split by window length; skew-window ones while a replica drains.
    widths = [scenario.pods[u]["log_window_ns"][1] - scenario.pods[u]["log_window_ns"][0] for u in loggers]
    txns: list[_Txn] = []
    for uid, count in zip(loggers, _split_counts(n_transactions - skew_transactions, widths)):
        txns.extend(w.make_txn(uid, t) for t in w.times_in(scenario.pods[uid]["log_window_ns"], count))
    skew: list[_Txn] = []
    if skew_transactions:
        d_from, d_to = scenario.pods[drainers[0]]["drain_window_ns"]
        window = [d_from + 100 * NS_PER_MS, d_to - 100 * NS_PER_MS]
        skew = [w.make_txn(drainers[0], t) for t in w.times_in(window, skew_transactions)]

    # The one PAN record: an issuer decline whose message leaked the card number.
    fb_txns = [x for x in txns if scenario.pods[x.pod_uid]["logs_via"] == "fluentbit"]
    pan_txn = fb_txns[len(fb_txns) // 3]
    pan_txn.level, pan_txn.decision = "WARN", "DECLINE"
    pan_txn.message = f"Issuer declined authorisation for card {TEST_PAN}: insufficient funds"

    otlp_by_pod: dict[str, list[tuple[_Txn, int]]] = {}
    for txn in sorted(txns + skew, key=lambda x: (x.event_ns, x.transaction_id)):
        pod = scenario.pods[txn.pod_uid]
        if pod["logs_via"] == "otlp":
            observed_ns = txn.event_ns + w.rng.randint(200_000, 900_000_000)  # collector batching
            otlp_by_pod.setdefault(txn.pod_uid, []).append((txn, observed_ns))
        else:
            w.emit(pod, txn.event_ns, _compact(_ecs_document(txn, pod)))
    fb_pods = [u for u in loggers if scenario.pods[u]["logs_via"] == "fluentbit"]
    malformed = w.emit_malformed([scenario.pods[u] for u in fb_pods])

    fluentbit_path = out / "fluentbit.jsonl"
    fluentbit_path.write_text("".join(text + "\n" for text in w.sorted_lines()), encoding="utf-8")
    otlp_path = out / "otlp.json"
    otlp_path.write_text(_compact(_otlp_request([(scenario.pods[u], v) for u, v in otlp_by_pod.items()])) + "\n",
                         encoding="utf-8")

    counts = {
        "valid": len(txns) + len(skew),
        "malformed": malformed,
        "pan_lines": 1,
        "fluentbit_lines": len(w.lines),
        "otlp_records": sum(len(v) for v in otlp_by_pod.values()),
        "skew_window": len(skew),
    }
    sample = _pick_sample(scenario, [x for x in txns if x is not pan_txn], loggers)
    return LogSet(fluentbit_path=fluentbit_path, otlp_path=otlp_path, counts=counts, sample=sample,
                  skew_window_transaction_ids=sorted(x.transaction_id for x in skew))


# --------------------------------------------------------------------------------------------
# CLI: python -m collector.demo_scenario --out DIR --start NOW
# --------------------------------------------------------------------------------------------


def _parse_start(text: str) -> int:
    """``now``, integer ns since the epoch, or RFC 3339 with a zone → ns."""
    from collector.timeutil import now_ns, parse_rfc3339_ns

    t = text.strip()
    if t.lower() == "now":
        return now_ns()
    if t.isdigit():
        return int(t)
    try:
        return parse_rfc3339_ns(t)[0]
    except ValueError as exc:
        raise ValueError(f"--start {text!r}: use 'now', integer ns since the epoch or RFC 3339 with a zone "
                         "(2025-06-04T10:15:00Z)") from exc


def write_scenario(out_dir: str | Path, start_ns: int, duration_s: float = BASE_DURATION_S, seed: int = 7,
                   n_transactions: int = 3000) -> tuple[Scenario, LogSet]:
    """Build the scenario and write ``timeline.json``, ``placement.json``, ``fluentbit.jsonl``,
    ``otlp.json`` and ``logset.json`` (counts and sample) into ``out_dir``.

    Raises:
        ValueError: as :func:`build_timeline` / :func:`generate_logs`.
        OSError: when ``out_dir`` cannot be written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scenario = build_timeline(start_ns, duration_s, seed)
    logs = generate_logs(scenario, out, n_transactions=n_transactions, seed=seed)
    dump = lambda obj: json.dumps(obj, ensure_ascii=False, indent=1) + "\n"  # noqa: E731
    (out / "timeline.json").write_text(dump(scenario.timeline_document()), encoding="utf-8")
    (out / "placement.json").write_text(dump(scenario.placement_document()), encoding="utf-8")
    summary = logs.to_dict()
    summary.update(fluentbit=logs.fluentbit_path.name, otlp=logs.otlp_path.name)
    (out / "logset.json").write_text(dump(summary), encoding="utf-8")
    return scenario, logs


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m collector.demo_scenario``; returns the exit status."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m collector.demo_scenario",
                                     description="Write the fraud-scoring demo scenario and its logs.")
    parser.add_argument("--out", required=True, help="directory to write into")
    parser.add_argument("--start", default="now", help="'now', ns since the epoch, or RFC 3339 (default now)")
    parser.add_argument("--duration", type=float, default=BASE_DURATION_S, help="story length in seconds")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--transactions", type=int, default=3000)
    args = parser.parse_args(argv)
    try:
        scenario, logs = write_scenario(args.out, _parse_start(args.start), args.duration, args.seed,
                                        args.transactions)
    except ValueError as exc:
        print(f"demo_scenario: error: {exc}", file=sys.stderr)
        return 2
    v = scenario.violation
    print(f"wrote {len(scenario.steps)} steps, {logs.counts['valid']} transactions "
          f"({logs.counts['malformed']} malformed lines, {logs.counts['pan_lines']} PAN line) to {args.out}")
    print(f"planted violation: {' + '.join(p['namespace'] + '/' + p['name'] for p in v['pods'])} on "
          f"{v['physical_gpu_uuid']} ({v['node']}) from {ns_to_rfc3339(v['from_ns'])} to {ns_to_rfc3339(v['to_ns'])}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
