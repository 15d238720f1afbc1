"""Normalise ``resource.k8s.io`` objects served as v1beta1 or v1beta2 to the v1 shape.

Pure functions, no I/O: raw dicts in (the JSON as the API server sent it), new dicts out; the
input is never modified and fields we do not know are kept. What changes (dra-api.md §1.2–1.4):

- ResourceClaim / ResourceClaimTemplate, v1beta1: a request carries its parameters flat
  (``deviceClassName``, ``count``...). They move under ``exactly``; a request that uses
  ``firstAvailable`` keeps only that (v1beta1 serialises it with ``"deviceClassName": ""``).
- ResourceSlice, v1beta1: ``devices[].basic{...}`` is hoisted onto the device.
- v1beta1 and v1beta2 of 1.32/1.33 emit ``"adminAccess": null`` in allocation results (and
  requests); v1 omits it, so the nulls are dropped.
- DeviceClass, Pod and anything else: unchanged (a shallow copy).

The input is never modified; the result shares the subtrees that need no change with it.

Also the attribute helpers every consumer of slices needs: ``attribute_value`` (the typed union
``{string|int|bool|version: v}``), qualified-name lookup where short keys belong to the driver's
domain (§4.1, rule 11), and ``quantity_to_int`` (Kubernetes ``resource.Quantity`` → exact int).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from collections.abc import Mapping
from typing import Any

GROUP = "resource.k8s.io"
V1 = "v1"

# Kinds whose shape differs between versions; DeviceClass is identical in all three.
_CONVERTED_KINDS = ("ResourceClaim", "ResourceClaimTemplate", "ResourceSlice")

# Members of a v1beta1 DeviceRequest that sit under ``exactly`` in v1 (ExactDeviceRequest).
_EXACT_FIELDS = ("deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations", "capacity")

# Typed members of a DeviceAttribute; the list forms are 1.36 alpha (DRAListTypeAttributes).
_ATTRIBUTE_MEMBERS = ("string", "int", "bool", "version", "strings", "ints", "bools", "versions")


def served_version(api_version: str | None) -> str:
    """The version part of ``api_version``: ``"resource.k8s.io/v1beta1"`` or ``"v1beta1"`` → ``"v1beta1"``."""
    if not api_version:
        return ""
    return api_version.rsplit("/", 1)[-1]


def normalize(kind: str, api_version: str | None, obj: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``obj`` (a ``kind`` object served as ``api_version``) in the v1 shape, as a new dict.

    Args:
        kind: ``ResourceClaim``, ``ResourceClaimTemplate``, ``ResourceSlice``, ``DeviceClass``,
            ``Pod``...; other kinds are copied unchanged.
        api_version: the version served, with or without the group (``v1beta1``,
            ``resource.k8s.io/v1beta2``); falls back to ``obj["apiVersion"]`` when empty.
        obj: the raw object as decoded from JSON. It is never modified.

    Returns:
        A new top-level dict in the v1 shape; for ResourceClaim, ResourceClaimTemplate and
        ResourceSlice ``apiVersion`` (when present) becomes ``resource.k8s.io/v1``. Every dict and
        list on a path that changes is new; subtrees that need no change (metadata, selectors,
        attribute maps...) are shared with ``obj`` rather than copied, which keeps this cheap on a
        busy watch stream — ``copy.deepcopy`` the result before mutating it in place. DeviceClass
        (identical in all three versions), Pod and other kinds come back as a shallow copy.
        Unknown fields are kept.

    Raises:
        TypeError: ``obj`` is not a JSON object.

    Source: kubernetes/api ``resource/{v1beta1,v1beta2,v1}/types.go``; dra-api.md §1.2–1.4.
    """
    if not isinstance(obj, Mapping):
        raise TypeError(f"{kind} object must be a JSON object, got {type(obj).__name__}")
    out = dict(obj)
    if kind not in _CONVERTED_KINDS:
        return out
    version = served_version(api_version) or served_version(out.get("apiVersion"))
    if version == V1:
        # Already the v1 shape, and the only v1 quirk we repair (``adminAccess: null``) was fixed
        # in the same release that served v1 (1.34, dra-api.md §1.3): nothing to rewrite.
        return out
    beta1 = version == "v1beta1"
    if kind == "ResourceClaim":
        _edit(out, ("spec",), lambda spec: _normalise_claim_spec(spec, beta1))
        _edit(out, ("status", "allocation", "devices"), _normalise_results)
    elif kind == "ResourceClaimTemplate":
        _edit(out, ("spec", "spec"), lambda spec: _normalise_claim_spec(spec, beta1))
    elif beta1:  # ResourceSlice
        _edit(out, ("spec",), _hoist_basic)
    if "apiVersion" in out:
        out["apiVersion"] = f"{GROUP}/{V1}"
    return out


def _edit(root: dict[str, Any], path: tuple[str, ...], change) -> None:
    """Copy the dicts along ``path`` below ``root`` and let ``change`` edit the (copied) last one."""
    node = root
    for key in path:
        child = node.get(key)
        if not isinstance(child, dict):
            return
        node[key] = node = dict(child)
    change(node)


def _normalise_claim_spec(spec: dict[str, Any], beta1: bool) -> None:
    devices = spec.get("devices")
    requests = devices.get("requests") if isinstance(devices, dict) else None
    if not isinstance(requests, list):
        return
    new_requests = []
    for request in requests:
        if isinstance(request, dict):
            request = _request_to_v1(request) if beta1 else dict(request)
            exactly = request.get("exactly")
            if isinstance(exactly, dict) and "adminAccess" in exactly and exactly["adminAccess"] is None:
                request["exactly"] = {k: v for k, v in exactly.items() if k != "adminAccess"}
        new_requests.append(request)
    spec["devices"] = {**devices, "requests": new_requests}


def _request_to_v1(request: dict[str, Any]) -> dict[str, Any]:
    """One v1beta1 DeviceRequest → the v1 shape (``exactly`` or ``firstAvailable``), as a new dict."""
    if "exactly" in request:  # already v1-shaped (converted twice, or hand-written)
        return dict(request)
    out: dict[str, Any] = {k: v for k, v in request.items() if k not in _EXACT_FIELDS}
    if request.get("firstAvailable"):
        # v1beta1 always serialises deviceClassName (no omitempty); with firstAvailable it is "".
        # The flat members are unset then (validation); anything actually set is kept, not lost.
        out.update({k: request[k] for k in _EXACT_FIELDS if request.get(k) not in (None, "")})
        return out
    out["exactly"] = {k: request[k] for k in _EXACT_FIELDS if k in request and request[k] is not None}
    return out


def _normalise_results(devices: dict[str, Any]) -> None:
    results = devices.get("results")
    if isinstance(results, list):
        devices["results"] = [
            {k: v for k, v in r.items() if not (k == "adminAccess" and v is None)} if isinstance(r, dict) else r
            for r in results
        ]


def _hoist_basic(spec: dict[str, Any]) -> None:
    devices = spec.get("devices")
    if not isinstance(devices, list):
        return
    hoisted_devices = []
    for device in devices:
        if isinstance(device, dict) and "basic" in device:
            hoisted = {k: v for k, v in device.items() if k != "basic"}
            for key, value in (device.get("basic") or {}).items():
                hoisted.setdefault(key, value)  # a member already on the device (unexpected) wins
            device = hoisted
        hoisted_devices.append(device)
    spec["devices"] = hoisted_devices


# --------------------------------------------------------------------------------------------
# Attributes and capacity of ResourceSlice devices
# --------------------------------------------------------------------------------------------


def attribute_value(attr: Any) -> Any:
    """The value of a DeviceAttribute ``{string|int|bool|version: v}`` (or a 1.36 list form).

    Returns:
        The member's value (``str``, ``int``, ``bool``, version text, or a list for ``strings``,
        ``ints``...); ``None`` when ``attr`` is not a mapping or has no known member. A bare
        scalar (as in hand-written fixtures) is returned as is.

    Source: kubernetes/api ``resource/v1`` DeviceAttribute; dra-api.md §4.1.
    """
    if isinstance(attr, Mapping):
        for member in _ATTRIBUTE_MEMBERS:
            if member in attr:
                return attr[member]
        return None
    if isinstance(attr, (str, int, bool)):
        return attr
    return None


def qualified_name(key: str, driver: str) -> str:
    """``key`` as ``<domain>/<id>``: a short key (a C identifier) belongs to ``driver``'s domain.

    ``qualified_name("uuid", "gpu.nvidia.com")`` → ``"gpu.nvidia.com/uuid"``;
    ``"resource.kubernetes.io/pciBusID"`` stays as it is. Source: ResourceSlice QualifiedName
    (kubernetes/api ``resource/v1/types.go``); dra-api.md §4.1 and rule 11.
    """
    return key if "/" in key else f"{driver}/{key}"


def lookup_qualified(entries: Mapping[str, Any] | None, name: str, driver: str) -> Any:
    """The entry of an attributes/capacity map named ``name``, whichever way the slice spelled it.

    Args:
        entries: ``device.attributes`` or ``device.capacity`` (keys short or fully qualified).
        name: short (meaning ``driver``'s domain) or fully qualified.
        driver: the slice's ``spec.driver``, whose domain short keys belong to.

    Returns:
        The raw entry (e.g. ``{"string": "GPU-..."}`` or ``{"value": "80Gi"}``), or ``None``.
    """
    if not entries:
        return None
    wanted = qualified_name(name, driver)
    if wanted in entries:
        return entries[wanted]
    domain, _, ident = wanted.rpartition("/")
    if domain == driver and ident in entries:
        return entries[ident]
    return None


def device_attribute(device: Mapping[str, Any], name: str, driver: str) -> Any:
    """The value of attribute ``name`` of a (normalised) slice device, or ``None`` (see ``lookup_qualified``)."""
    return attribute_value(lookup_qualified(device.get("attributes"), name, driver))


def device_capacity_bytes(device: Mapping[str, Any], name: str, driver: str) -> int | None:
    """Capacity ``name`` of a slice device as an exact integer (bytes for ``memory``), or ``None``.

    Raises:
        ValueError: the capacity value is not a Kubernetes quantity.
    """
    entry = lookup_qualified(device.get("capacity"), name, driver)
    if entry is None:
        return None
    value = entry.get("value") if isinstance(entry, Mapping) else entry
    return None if value is None else quantity_to_int(value)


_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|n|u|m|k|M|G|T|P|E)?$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 10**3), "": Fraction(1),
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def quantity_to_int(quantity: str | int) -> int:
    """A Kubernetes quantity (``"24Gi"``, ``"80G"``, ``"1.5Ki"``, ``"12e3"``) as an exact integer.

    Binary (Ki…Ei = 2**10…2**60), decimal SI (n, u, m, k, M, G, T, P, E) and decimal-exponent
    (``e``/``E`` + integer) suffixes are supported; arithmetic is exact (``Fraction``, never a
    float). A fractional result rounds **up**, as ``resource.Quantity.Value()`` does.

    Args:
        quantity: the serialised quantity (an ``int`` is returned unchanged).

    Raises:
        ValueError: ``quantity`` is not a quantity (message names the value).

    Source: k8s.io/apimachinery ``pkg/api/resource/quantity.go`` (grammar and ``Value``).
    """
    if isinstance(quantity, bool):
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity")
    if isinstance(quantity, int):
        return quantity
    if not isinstance(quantity, str):
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity")
    m = _QUANTITY.match(quantity.strip())
    if not m:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity (e.g. 80Gi, 500M, 1.5Ki, 12e3)")
    number = Fraction(m["num"])
    suffix = m["suffix"] or ""
    if suffix in _BINARY:
        value = number * _BINARY[suffix]
    elif suffix in _DECIMAL:
        value = number * _DECIMAL[suffix]
    else:  # decimal exponent
        value = number * Fraction(10) ** int(suffix[1:])
    return math.ceil(value)
