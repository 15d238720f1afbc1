"""Conversion of stored ``resource.k8s.io/v1`` objects to the served version and back.

The sim stores every object once, in the v1 shape, and converts on the way out — as the real
apiserver does with its storage version. Rules from dra-api.md §1.2–1.3 and §4.2:

* v1beta2 is field-for-field identical to v1 (only ``apiVersion`` differs).
* v1beta1 requests are flat: ``{name, deviceClassName, allocationMode, count, selectors, …}``
  instead of ``{name, exactly: {…}}``; a request using ``firstAvailable`` carries
  ``"deviceClassName": ""`` (the v1beta1 JSON tag has no ``omitempty``).
* v1beta1 ResourceSlice devices wrap everything but ``name`` in ``basic``.

Conversion never mutates its input; it returns new dicts (shallow copies where untouched).
"""

from __future__ import annotations

import copy
from typing import Any

from collector.sim.kinds import RESOURCE_GROUP, KindInfo

_FLAT_REQUEST_KEYS = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)


def _requests_v1_to_v1beta1(requests: list[dict]) -> list[dict]:
    out = []
    for req in requests:
        flat: dict[str, Any] = {"name": req.get("name")}
        if "exactly" in req:
            flat.update(copy.deepcopy(req["exactly"]))
        elif "firstAvailable" in req:
            flat["deviceClassName"] = ""
            flat["firstAvailable"] = copy.deepcopy(req["firstAvailable"])
        else:  # already flat or empty: keep what is there
            flat = copy.deepcopy(req)
        out.append(flat)
    return out


def _requests_v1beta1_to_v1(requests: list[dict]) -> list[dict]:
    out = []
    for req in requests:
        if "exactly" in req or ("firstAvailable" in req and not req.get("deviceClassName")):
            new = {k: copy.deepcopy(v) for k, v in req.items() if not (k == "deviceClassName" and v == "")}
            out.append(new)
            continue
        exactly = {k: copy.deepcopy(req[k]) for k in req if k != "name"}
        out.append({"name": req.get("name"), "exactly": exactly})
    return out


def _map_claim_spec(spec: dict | None, fn) -> dict | None:
    if not isinstance(spec, dict):
        return spec
    devices = spec.get("devices")
    if not isinstance(devices, dict) or not isinstance(devices.get("requests"), list):
        return spec
    new_devices = dict(devices)
    new_devices["requests"] = fn(devices["requests"])
    new_spec = dict(spec)
    new_spec["devices"] = new_devices
    return new_spec


def _map_slice_devices(spec: dict | None, to_v1beta1: bool) -> dict | None:
    if not isinstance(spec, dict) or not isinstance(spec.get("devices"), list):
        return spec
    devices = []
    for dev in spec["devices"]:
        if to_v1beta1:
            if "basic" in dev:
                devices.append(copy.deepcopy(dev))
                continue
            body = {k: copy.deepcopy(v) for k, v in dev.items() if k != "name"}
            devices.append({"name": dev.get("name"), "basic": body})
        else:
            if "basic" not in dev:
                devices.append(copy.deepcopy(dev))
                continue
            hoisted = {"name": dev.get("name")}
            hoisted.update(copy.deepcopy(dev.get("basic") or {}))
            devices.append(hoisted)
    new_spec = dict(spec)
    new_spec["devices"] = devices
    return new_spec


def _convert(obj: dict, kind: str, to_v1beta1: bool) -> dict:
    out = dict(obj)
    if kind == "ResourceClaim":
        fn = _requests_v1_to_v1beta1 if to_v1beta1 else _requests_v1beta1_to_v1
        out["spec"] = _map_claim_spec(obj.get("spec"), fn)
    elif kind == "ResourceClaimTemplate":
        fn = _requests_v1_to_v1beta1 if to_v1beta1 else _requests_v1beta1_to_v1
        tspec = obj.get("spec")
        if isinstance(tspec, dict):
            new_tspec = dict(tspec)
            new_tspec["spec"] = _map_claim_spec(tspec.get("spec"), fn)
            out["spec"] = new_tspec
    elif kind == "ResourceSlice":
        out["spec"] = _map_slice_devices(obj.get("spec"), to_v1beta1)
    return {k: v for k, v in out.items() if v is not None or k in obj}


def to_served(obj: dict, info: KindInfo, version: str) -> dict:
    """Stored v1-shape object → the shape of ``version``, with ``apiVersion``/``kind`` set.

    Args:
        obj: stored object (v1 shape; may lack ``kind``/``apiVersion``).
        info: its kind.
        version: the served version of the request path (``v1``, ``v1beta2``, ``v1beta1``).
    """
    out = _convert(obj, info.kind, True) if info.group == RESOURCE_GROUP and version == "v1beta1" else dict(obj)
    served = {"apiVersion": info.api_version(version), "kind": info.kind}
    served.update({k: v for k, v in out.items() if k not in ("apiVersion", "kind")})
    return served


def to_storage(obj: dict, info: KindInfo) -> dict:
    """An incoming object in any supported shape → the v1 storage shape (apiVersion ``…/v1``).

    Objects that already have the v1 shape pass unchanged (apart from ``apiVersion``).
    """
    api_version = obj.get("apiVersion") or info.api_version("v1")
    out = dict(obj)
    if info.group == RESOURCE_GROUP and api_version.endswith("/v1beta1"):
        out = _convert(obj, info.kind, False)
    out["apiVersion"] = info.api_version("v1")
    out["kind"] = info.kind
    return out
