"""Builders for realistic DRA objects in the ``resource.k8s.io/v1`` shape (plus core Pods).

Shapes and values follow dra-api.md: claims and templates §2.1–2.3 and §2.8, DeviceClasses
§3.2 and §6.1, ResourceSlices §4.1 and §4.3, NVIDIA device names/attributes §6.2–6.3, Pods §5.1.
Each function returns a new dict and never mutates its arguments, so the steps of a lifecycle
(``allocate`` → ``deallocate`` …) can be kept side by side. Objects carry no
``resourceVersion``; the server assigns it.
"""

from __future__ import annotations

import copy
import random
import uuid as uuidlib
from typing import Iterable, Sequence

from collector.sim.registry import timestamp

NVIDIA_GPU_DRIVER = "gpu.nvidia.com"
DELETE_PROTECTION_FINALIZER = "resource.kubernetes.io/delete-protection"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def _uid(rng: random.Random | None = None) -> str:
    if rng is None:
        return str(uuidlib.uuid4())
    return str(uuidlib.UUID(int=rng.getrandbits(128), version=4))


def make_device_class(
    name: str = "gpu.nvidia.com",
    driver: str = NVIDIA_GPU_DRIVER,
    device_type: str | None = "gpu",
    extended_resource_name: str | None = None,
    config: list[dict] | None = None,
) -> dict:
    """A DeviceClass selecting ``driver``'s devices of ``device_type`` (NVIDIA chart style, §6.1).

    Args:
        device_type: value of the driver's ``type`` attribute (``gpu``, ``mig``, ``vfio``); None
            selects on the driver only.
        extended_resource_name: e.g. ``nvidia.com/gpu`` (1.34 alpha field).
        config: ``spec.config`` entries (``{"opaque": {"driver", "parameters"}}``).
    """
    expr = f"device.driver == '{driver}'"
    if device_type:
        expr += f" && device.attributes['{driver}'].type == '{device_type}'"
    spec: dict = {"selectors": [{"cel": {"expression": expr}}]}
    if config:
        spec["config"] = copy.deepcopy(config)
    if extended_resource_name:
        spec["extendedResourceName"] = extended_resource_name
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def make_gpu_device(
    minor: int = 0,
    uuid: str | None = None,
    product_name: str = "NVIDIA H100 80GB HBM3",
    memory: str = "80Gi",
    architecture: str = "Hopper",
    brand: str = "Nvidia",
    cuda_compute_capability: str = "9.0.0",
    driver_version: str = "570.124.6",
    cuda_driver_version: str = "12.8.0",
    pci_bus_id: str | None = None,
) -> dict:
    """A full-GPU device entry as the NVIDIA driver v25.12+ publishes it (dra-api.md §6.2–6.3).

    Name ``gpu-<minor>``; attributes ``type``, ``uuid``, ``productName``, ``brand``,
    ``architecture``, versions, ``resource.kubernetes.io/pciBusID``; capacity ``memory``.
    """
    bus = pci_bus_id or f"0000:{0x1b + minor:02x}:00.0"
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid or f"GPU-{uuidlib.uuid4()}"},
            "productName": {"string": product_name},
            "brand": {"string": brand},
            "architecture": {"string": architecture},
            "cudaComputeCapability": {"version": cuda_compute_capability},
            "driverVersion": {"version": driver_version},
            "cudaDriverVersion": {"version": cuda_driver_version},
            "resource.kubernetes.io/pciBusID": {"string": bus},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        },
        "capacity": {"memory": {"value": memory}},
    }


def make_mig_device(
    parent_minor: int = 0,
    profile: str = "1g.10gb",
    parent_uuid: str | None = None,
    uuid: str | None = None,
    gi_profile_id: int = 19,
    placement_start: int = 0,
    memory: str = "9856Mi",
    multiprocessors: int = 14,
    product_name: str = "NVIDIA H100 80GB HBM3",
    dynamic: bool = False,
) -> dict:
    """A MIG device entry (NVIDIA driver v25.12+ naming, dra-api.md §6.2–6.3).

    Name ``gpu-<parentMinor>-mig-<profile without dots>-<giProfileId>-<placementStart>``.
    A static MIG device has its own ``uuid`` (``MIG-…``); with ``dynamic=True`` (driver gate
    DynamicMIG) it has none — only ``parentUUID`` and ``profile``.
    """
    attrs: dict = {
        "type": {"string": "mig"},
        "parentUUID": {"string": parent_uuid or f"GPU-{uuidlib.uuid4()}"},
        "profile": {"string": profile},
        "productName": {"string": product_name},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "570.124.6"},
        "cudaDriverVersion": {"version": "12.8.0"},
    }
    if not dynamic:
        attrs["uuid"] = {"string": uuid or f"MIG-{uuidlib.uuid4()}"}
    return {
        "name": f"gpu-{parent_minor}-mig-{profile.replace('.', '').lower()}-{gi_profile_id}-{placement_start}",
        "attributes": attrs,
        "capacity": {
            "memory": {"value": memory},
            "multiprocessors": {"value": str(multiprocessors)},
            "copyEngines": {"value": "1"},
            "decoders": {"value": "1"},
            "encoders": {"value": "0"},
            "jpegEngines": {"value": "1"},
            "ofaEngines": {"value": "0"},
            f"memorySlice{placement_start}": {"value": "1"},
        },
    }


def make_slice(
    node: str,
    devices: Sequence[dict],
    driver: str = NVIDIA_GPU_DRIVER,
    generation: int = 1,
    resource_slice_count: int = 1,
    pool: str | None = None,
    name: str | None = None,
    node_uid: str | None = None,
) -> dict:
    """A node-local ResourceSlice of ``driver`` (dra-api.md §4.1, §4.3).

    Args:
        node: ``spec.nodeName``; also the pool name unless ``pool`` is given (NVIDIA: pool = node).
        devices: entries from :func:`make_gpu_device` / :func:`make_mig_device` (v1 shape).
        generation / resource_slice_count: ``spec.pool`` bookkeeping.
        name: defaults to ``<node>-<driver>-<5 chars>`` (helper library ≤ 0.35 naming).
    """
    suffix = "".join(random.choice(_SUFFIX_ALPHABET) for _ in range(5))
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": name or f"{node}-{driver}-{suffix}",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid or _uid(), "controller": True}
            ],
        },
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": resource_slice_count},
            "devices": [copy.deepcopy(d) for d in devices],
        },
    }


def claim_spec(device_class: str = "gpu.nvidia.com", request: str = "gpu", count: int = 1, selectors: list[dict] | None = None, config: list[dict] | None = None) -> dict:
    """A ResourceClaimSpec with one ``exactly`` request (defaults filled in as the server does)."""
    exactly: dict = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if selectors:
        exactly["selectors"] = copy.deepcopy(selectors)
    devices: dict = {"requests": [{"name": request, "exactly": exactly}]}
    if config:
        devices["config"] = copy.deepcopy(config)
    return {"devices": devices}


def make_claim_template(name: str, namespace: str = "default", spec: dict | None = None, labels: dict | None = None) -> dict:
    """A ResourceClaimTemplate (dra-api.md §3.1); ``spec`` is a claim spec (default one GPU)."""
    tspec: dict = {"spec": copy.deepcopy(spec) if spec else claim_spec()}
    if labels:
        tspec["metadata"] = {"labels": dict(labels)}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": tspec,
    }


def make_claim(name: str, namespace: str = "default", spec: dict | None = None, labels: dict | None = None, annotations: dict | None = None) -> dict:
    """A user-created ResourceClaim (referenced by name from pods; no owner)."""
    meta: dict = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta, "spec": copy.deepcopy(spec) if spec else claim_spec()}


def make_pod(
    name: str,
    namespace: str = "default",
    claim_templates: dict[str, str] | None = None,
    claim_names: dict[str, str] | None = None,
    containers: list[dict] | None = None,
    node_name: str | None = None,
    uid: str | None = None,
    labels: dict | None = None,
    image: str = "registry.example/inference:1.0",
) -> dict:
    """A Pending Pod using DRA claims (dra-api.md §5.1).

    Args:
        claim_templates: pod claim name → ResourceClaimTemplate name (``resourceClaimTemplateName``).
        claim_names: pod claim name → existing ResourceClaim name (``resourceClaimName``).
        containers: full container dicts; default one container ``main`` whose
            ``resources.claims`` lists every pod claim (no ``request`` = all devices).
        uid: pin ``metadata.uid`` (the server keeps a supplied uid on create).
    """
    pod_claims = [{"name": n, "resourceClaimTemplateName": t} for n, t in (claim_templates or {}).items()]
    pod_claims += [{"name": n, "resourceClaimName": c} for n, c in (claim_names or {}).items()]
    if containers is None:
        container: dict = {"name": "main", "image": image}
        if pod_claims:
            container["resources"] = {"claims": [{"name": c["name"]} for c in pod_claims]}
        containers = [container]
    spec: dict = {"containers": copy.deepcopy(containers), "restartPolicy": "Never", "schedulerName": "default-scheduler"}
    if pod_claims:
        spec["resourceClaims"] = pod_claims
    if node_name:
        spec["nodeName"] = node_name
    meta: dict = {"name": name, "namespace": namespace, "uid": uid or _uid()}
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Pending", "qosClass": "BestEffort"}}


def make_claim_from_template(
    pod: dict,
    pod_claim_name: str = "gpu",
    template: dict | None = None,
    suffix: str | None = None,
    uid: str | None = None,
) -> dict:
    """The claim the resourceclaim controller creates for ``pod`` from a template (dra-api.md §2.1).

    ``generateName`` ``<pod>-<pod claim>-`` + 5 random characters, the pod-claim-name
    annotation, the pod as controlling owner, the template's labels/annotations and spec.

    Args:
        pod: the pod (needs ``metadata.name``, ``namespace``, ``uid``).
        template: the ResourceClaimTemplate object (default: one-GPU spec).
        suffix: the 5 random characters (for reproducible names).
    """
    pmeta = pod["metadata"]
    generate_name = f"{pmeta['name']}-{pod_claim_name}-"
    suffix = suffix or "".join(random.choice(_SUFFIX_ALPHABET) for _ in range(5))
    tspec = (template or {}).get("spec") or {}
    tmeta = tspec.get("metadata") or {}
    meta: dict = {
        "name": generate_name + suffix,
        "generateName": generate_name,
        "namespace": pmeta.get("namespace", "default"),
        "annotations": {**(tmeta.get("annotations") or {}), POD_CLAIM_NAME_ANNOTATION: pod_claim_name},
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": pmeta["name"], "uid": pmeta["uid"], "controller": True, "blockOwnerDeletion": True}
        ],
    }
    if tmeta.get("labels"):
        meta["labels"] = dict(tmeta["labels"])
    if uid:
        meta["uid"] = uid
    spec = copy.deepcopy(tspec.get("spec")) if tspec.get("spec") else claim_spec()
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta, "spec": spec}


def _pod_ref(pod: dict) -> dict:
    return {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}


def add_finalizer(obj: dict, finalizer: str = DELETE_PROTECTION_FINALIZER) -> dict:
    """Copy of ``obj`` with ``finalizer`` added (the scheduler's PreBind write, §2.6 step 4)."""
    out = copy.deepcopy(obj)
    fins = out["metadata"].setdefault("finalizers", [])
    if finalizer not in fins:
        fins.append(finalizer)
    return out


def remove_finalizer(obj: dict, finalizer: str = DELETE_PROTECTION_FINALIZER) -> dict:
    """Copy of ``obj`` without ``finalizer`` (the controller's write after deallocation, step 10)."""
    out = copy.deepcopy(obj)
    fins = [f for f in out["metadata"].get("finalizers", []) if f != finalizer]
    if fins:
        out["metadata"]["finalizers"] = fins
    else:
        out["metadata"].pop("finalizers", None)
    return out


def allocate(
    claim: dict,
    results: Iterable[dict | tuple],
    pod: dict | None = None,
    node: str | None = None,
    config: list[dict] | None = None,
    allocation_timestamp: str | None = None,
) -> dict:
    """Copy of ``claim`` with ``status.allocation`` and the pod in ``reservedFor`` — the
    scheduler's single status write (dra-api.md §2.5, §2.6 step 5, example §2.8).

    Args:
        results: allocation results, each a dict ``{request, driver, pool, device}`` or a tuple
            ``(request, driver, pool, device)`` or ``(request, device)`` (driver
            ``gpu.nvidia.com``, pool = ``node``).
        pod: consumer to reserve the claim for (None = allocate only).
        node: node for ``nodeSelector`` (matchFields ``metadata.name``); default: first result's pool.
        config: ``devices.config`` entries (``{"source", "requests", "opaque"}``).
        allocation_timestamp: set ``allocationTimestamp`` (only 1.36+ defaults fill it).

    Raises:
        ValueError: the claim is already allocated (allocation is immutable while set, §2.4).
    """
    if (claim.get("status") or {}).get("allocation"):
        raise ValueError(f"claim {claim['metadata'].get('name')!r} is already allocated; deallocate first")
    norm = []
    for r in results:
        if isinstance(r, dict):
            norm.append(dict(r))
        elif len(r) == 4:
            norm.append({"request": r[0], "driver": r[1], "pool": r[2], "device": r[3]})
        elif len(r) == 2:
            if node is None:
                raise ValueError("allocate: (request, device) results need node=")
            norm.append({"request": r[0], "driver": NVIDIA_GPU_DRIVER, "pool": node, "device": r[1]})
        else:
            raise ValueError(f"allocate: result {r!r} is not a dict, (request, device) or (request, driver, pool, device)")
    if not norm:
        raise ValueError("allocate: at least one result is required")
    node = node or norm[0]["pool"]
    out = copy.deepcopy(claim)
    devices: dict = {"results": norm}
    if config:
        devices["config"] = copy.deepcopy(config)
    allocation: dict = {
        "devices": devices,
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]},
    }
    if allocation_timestamp:
        allocation["allocationTimestamp"] = allocation_timestamp
    status = out.setdefault("status", {})
    status["allocation"] = allocation
    if pod is not None:
        status["reservedFor"] = [_pod_ref(pod)]
    return out


def reserve(claim: dict, pod: dict) -> dict:
    """Copy of an allocated ``claim`` with ``pod`` appended to ``reservedFor`` (shared claims).

    Raises:
        ValueError: the claim is not allocated (reservedFor needs an allocation, §2.4).
    """
    if not (claim.get("status") or {}).get("allocation"):
        raise ValueError(f"claim {claim['metadata'].get('name')!r} is not allocated; cannot reserve")
    out = copy.deepcopy(claim)
    refs = out["status"].setdefault("reservedFor", [])
    if all(r.get("uid") != pod["metadata"]["uid"] for r in refs):
        refs.append(_pod_ref(pod))
    return out


def unreserve(claim: dict, pod: dict) -> dict:
    """Copy of ``claim`` without ``pod`` in ``reservedFor`` (allocation stays)."""
    out = copy.deepcopy(claim)
    refs = [r for r in (out.get("status") or {}).get("reservedFor", []) if r.get("uid") != pod["metadata"]["uid"]]
    if refs:
        out["status"]["reservedFor"] = refs
    elif out.get("status"):
        out["status"].pop("reservedFor", None)
    return out


def deallocate(claim: dict) -> dict:
    """Copy of ``claim`` with ``reservedFor`` and ``allocation`` removed in one write (§2.6 step 9)."""
    out = copy.deepcopy(claim)
    status = out.get("status") or {}
    status.pop("allocation", None)
    status.pop("reservedFor", None)
    out["status"] = status
    return out


def set_claim_statuses(pod: dict, claims: dict[str, str | None]) -> dict:
    """Copy of ``pod`` with ``status.resourceClaimStatuses`` (pod claim name → generated claim
    name; None = no claim needed), the resourceclaim controller's write (§2.6 step 3)."""
    out = copy.deepcopy(pod)
    entries = []
    for name, claim_name in claims.items():
        entry = {"name": name}
        if claim_name:
            entry["resourceClaimName"] = claim_name
        entries.append(entry)
    out.setdefault("status", {})["resourceClaimStatuses"] = entries
    return out


def bind_pod(pod: dict, node: str, at: str | None = None) -> dict:
    """Copy of ``pod`` bound to ``node`` with a PodScheduled condition (§2.6 step 6)."""
    out = copy.deepcopy(pod)
    out["spec"]["nodeName"] = node
    conds = [c for c in out.setdefault("status", {}).get("conditions", []) if c.get("type") != "PodScheduled"]
    conds.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": at or timestamp()})
    out["status"]["conditions"] = conds
    return out


def pod_running(pod: dict, started_at: str | None = None) -> dict:
    """Copy of ``pod`` in phase Running with every container running since ``started_at``."""
    out = copy.deepcopy(pod)
    started = started_at or timestamp()
    st = out.setdefault("status", {})
    st["phase"] = "Running"
    st["startTime"] = st.get("startTime") or started
    st["containerStatuses"] = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": True,
            "restartCount": 0,
            "started": True,
            "state": {"running": {"startedAt": started}},
        }
        for c in out["spec"]["containers"]
    ]
    return out


def pod_finished(pod: dict, phase: str = "Succeeded", finished_at: str | None = None, exit_code: int | None = None) -> dict:
    """Copy of ``pod`` in a terminal ``phase`` (Succeeded/Failed) with terminated containers."""
    if phase not in ("Succeeded", "Failed"):
        raise ValueError(f"pod_finished phase={phase!r}: use Succeeded or Failed")
    out = copy.deepcopy(pod)
    finished = finished_at or timestamp()
    code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1)
    st = out.setdefault("status", {})
    st["phase"] = phase
    statuses = []
    for c in out["spec"]["containers"]:
        prev = next((s for s in st.get("containerStatuses", []) if s.get("name") == c["name"]), {})
        started = ((prev.get("state") or {}).get("running") or {}).get("startedAt") or finished
        statuses.append(
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": started, "finishedAt": finished}},
            }
        )
    st["containerStatuses"] = statuses
    return out
