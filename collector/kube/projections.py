"""Keep the projection tables current as object versions arrive (and rebuild them from history).

The watcher inserts rows into ``object_versions`` and, in the same transaction, calls
``apply_versions(session, rows)``. Each projection row is a fact with a validity interval
``[valid_from_ns, valid_to_ns)`` in the collector's observation time (``observed_at`` as integer
ns; an open interval has ``valid_to_ns`` NULL):

- ``pod_states``           a pod's node and phase (every pod, also one without ResourceClaims);
- ``pod_claim_refs``       pod claim name → the ResourceClaim name it resolves to;
- ``pod_container_claims`` container → pod claim name → request (immutable spec, written once);
- ``allocation_episodes``  one allocation of one claim, keyed by (claim uid, first RV) — rule 10;
- ``allocation_results``   the devices of an episode (frozen when the allocation is first seen);
- ``claim_consumers``      ``status.reservedFor`` membership per consumer uid;
- ``device_states``        a device of a ResourceSlice with its attributes (highest pool
  generation only, §4.3), keyed by (driver, pool, device).

How a version is applied: the facts it shows are compared with the open intervals of the same
object; facts that changed or vanished are closed at the version's observed time and new facts
are opened at it. Hence applying a version twice changes nothing. A version observed *before*
the object's latest recorded boundary is stale (a replay of an older version) and is skipped, so
re-applying a whole batch is a no-op too — unless it is the newest stored version of its object,
which is always applied (its diff is empty if it was applied before), so a backwards clock step
cannot drop new data.

Device identity is (driver, pool, device): a device listed by another slice of its pool moves
its open interval to that slice. Known limit: if two slices of a pool list the same device at
once and the one that listed it first drops it last, the device is closed until the other slice
is next updated (the slices' other contents are not kept in the projection). A pool generation
is judged among the devices currently open in the pool, so a pool whose slices were all deleted
may restart at a lower generation (a re-created Node); the flip side: after a newer generation
that publishes no devices at all, a later update of an old-generation slice is not recognised
as stale.

Versions of one object arrive in resourceVersion order; across kinds they may arrive in any
order (a claim before its pod) — no projection here joins across kinds, lineage does that.
Work is batched per call: a few SELECTs per kind to load open state, bulk INSERT/UPDATE to
write, never one query per row.

Sources: dra-api.md §2.3–2.8 (claim status and lifecycle), §4 (ResourceSlice), §5 (pod →
container → device), §6.3 (NVIDIA attributes), §9 (design notes).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import JSON, BigInteger, String, bindparam, cast, delete, func, null, select, union_all
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from collector.kube.normalize import device_attribute, device_capacity_bytes, normalize
from collector.store.canonical import canonical_json
from collector.store.bulk import pg_copy_insert, pg_next_ids
from collector.store.models import (
    AllocationEpisode,
    AllocationResult,
    ClaimConsumer,
    DeviceState,
    ObjectVersion,
    PodClaimRef,
    PodContainerClaim,
    PodState,
)
from collector.timeutil import dt_to_ns, ns_to_dt, parse_rfc3339_ns

log = logging.getLogger(__name__)

POD = "Pod"
RESOURCE_CLAIM = "ResourceClaim"
RESOURCE_SLICE = "ResourceSlice"
PROJECTED_KINDS = (POD, RESOURCE_CLAIM, RESOURCE_SLICE)
DELETE_EVENTS = frozenset({"DELETED", "RELIST_DELETED"})

#: ``pod_claim_name`` used for the claim in ``pod.status.extendedResourceClaimStatus`` (§5.2).
#: Not a DNS label, so it cannot collide with a ``pod.spec.resourceClaims[].name``.
EXTENDED_POD_CLAIM = "<extended>"

SCHEDULER_MANAGER = "kube-scheduler"
IN_CHUNK = 500  # ids per IN (...) list: well under SQLite's bound-parameter limit
REBUILD_CHUNK = 2_000


# ============================================================================================
# Facts: pure functions from one (normalised) object to the rows it implies
# ============================================================================================


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class PodFacts:
    """What the projections keep of one Pod version (dra-api.md §5.1).

    ``claim_refs``: pod claim name → (claim name or None while unresolved, template name or None).
    ``container_claims``: (container name, pod claim name, request) → is it an init container;
    request ``""`` means all devices of the claim.
    """

    namespace: str
    name: str
    node_name: str | None
    phase: str | None
    claim_refs: dict[str, tuple[str | None, str | None]]
    container_claims: dict[tuple[str, str, str], bool]


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    """The facts of a Pod: its placement, and its claim references when ``spec.resourceClaims`` is
    non-empty or ``status.extendedResourceClaimStatus`` is set (none otherwise: a pod without
    claims is projected too, so a transaction it logged is ``no-claim``). Template claims resolve through
    ``status.resourceClaimStatuses`` (unresolved until the controller writes it; an entry without
    ``resourceClaimName`` means "no claim needed" and also stays unresolved).

    Source: core/v1 PodSpec.ResourceClaims, PodStatus.ResourceClaimStatuses,
    PodStatus.ExtendedResourceClaimStatus; dra-api.md §5.2.
    """
    meta, spec, status = _dict(pod.get("metadata")), _dict(pod.get("spec")), _dict(pod.get("status"))
    pod_claims = [rc for rc in _list(spec.get("resourceClaims")) if isinstance(rc, dict) and rc.get("name")]
    extended = _dict(status.get("extendedResourceClaimStatus"))
    statuses = {st.get("name"): st for st in _list(status.get("resourceClaimStatuses")) if isinstance(st, dict)}
    refs: dict[str, tuple[str | None, str | None]] = {}
    for rc in pod_claims:
        if rc.get("resourceClaimName"):
            refs[rc["name"]] = (rc["resourceClaimName"], None)
        else:
            template = rc.get("resourceClaimTemplateName")
            refs[rc["name"]] = (_dict(statuses.get(rc["name"])).get("resourceClaimName") or None, template)
    if extended.get("resourceClaimName"):
        refs[EXTENDED_POD_CLAIM] = (extended["resourceClaimName"], None)

    container_claims: dict[tuple[str, str, str], bool] = {}
    init_names = set()
    for init, key in ((True, "initContainers"), (False, "containers")):
        for container in _list(spec.get(key)):
            if not isinstance(container, dict) or not container.get("name"):
                continue
            if init:
                init_names.add(container["name"])
            for ref in _list(_dict(container.get("resources")).get("claims")):
                if isinstance(ref, dict) and ref.get("name"):
                    container_claims[(container["name"], ref["name"], ref.get("request") or "")] = init
    for mapping in _list(extended.get("requestMappings")):
        if isinstance(mapping, dict) and mapping.get("containerName"):
            name = mapping["containerName"]
            container_claims[(name, EXTENDED_POD_CLAIM, mapping.get("requestName") or "")] = name in init_names
    return PodFacts(
        namespace=meta.get("namespace") or "",
        name=meta.get("name") or "",
        node_name=spec.get("nodeName") or None,
        phase=status.get("phase") or None,
        claim_refs=refs,
        container_claims=container_claims,
    )


@dataclass(frozen=True)
class AllocationFacts:
    """``status.allocation`` of one ResourceClaim version (dra-api.md §2.3).

    ``results`` are ``allocation_results`` column dicts (without ``episode_id``); ``identity``
    tells two allocations apart (results, node, allocationTimestamp).
    """

    results: tuple[dict[str, Any], ...]
    node_name: str | None
    config: Any
    allocation_timestamp: datetime | None
    scheduler_write_time: datetime | None

    @property
    def identity(self) -> tuple:
        return allocation_identity(self.results, self.node_name, self.allocation_timestamp)


def allocation_identity(results: Iterable[Mapping[str, Any]], node_name: str | None,
                        allocation_timestamp: datetime | None) -> tuple:
    """A comparable key of an allocation: its device results, node and allocationTimestamp.

    Allocation is immutable while set (§2.4), so two versions with different keys hold different
    allocations. Used on facts from a raw object and on rows read back from the database alike.
    """
    key = sorted(
        (r["request"], r["driver"], r["pool"], r["device"], r.get("share_id") or "", bool(r.get("admin_access")),
         canonical_json(r.get("consumed_capacity")).decode())
        for r in results
    )
    return (tuple(key), node_name, allocation_timestamp)


def _parse_time(text: Any, where: str) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return ns_to_dt(parse_rfc3339_ns(text)[0])
    except ValueError:
        log.warning("ignoring unparsable time %r at %s", text, where)
        return None


def node_from_selector(node_selector: Any) -> str | None:
    """The node a node-local allocation is bound to: ``matchFields metadata.name In [node]``.

    Returns the node name when every term names exactly the same single node, else ``None``
    (network-attached devices, several nodes). Source: dra-api.md §2.3 (allocator output).
    """
    nodes: set[str] = set()
    terms = _list(_dict(node_selector).get("nodeSelectorTerms"))
    for term in terms:
        found = [f for f in _list(_dict(term).get("matchFields"))
                 if isinstance(f, dict) and f.get("key") == "metadata.name" and f.get("operator") == "In"]
        if len(found) != 1 or len(_list(found[0].get("values"))) != 1:
            return None
        nodes.add(found[0]["values"][0])
    return nodes.pop() if len(nodes) == 1 else None


def device_class_for(claim_spec: Mapping[str, Any], request: str) -> str | None:
    """The DeviceClass a result's ``request`` was allocated from, per the (normalised) claim spec.

    ``"gpu"`` → ``requests[gpu].exactly.deviceClassName``; ``"flexible/small"`` → the
    ``firstAvailable`` entry ``small`` of request ``flexible``. ``None`` when not found.
    Source: DeviceRequestAllocationResult.Request (kubernetes/api resource/v1); dra-api.md §1.2.
    """
    base, _, sub = request.partition("/")
    for req in _list(_dict(claim_spec.get("devices")).get("requests")):
        if not isinstance(req, dict) or req.get("name") != base:
            continue
        if sub:
            for alternative in _list(req.get("firstAvailable")):
                if isinstance(alternative, dict) and alternative.get("name") == sub:
                    return alternative.get("deviceClassName") or None
            return None
        return _dict(req.get("exactly")).get("deviceClassName") or None
    return None


def allocation_facts(claim: Mapping[str, Any]) -> AllocationFacts | None:
    """The allocation of a normalised ResourceClaim, or ``None`` when ``status.allocation`` is unset.

    ``node_name`` comes from ``nodeSelector`` (matchFields ``metadata.name``); ``config`` from
    ``allocation.devices.config``; ``allocation_timestamp`` when present (1.36+ defaults, rule 5);
    ``scheduler_write_time`` from the ``kube-scheduler`` managedFields entry for the ``status``
    subresource (rule 6 — a proxy, not an allocation timestamp).
    """
    allocation = _dict(claim.get("status")).get("allocation")
    if not isinstance(allocation, dict):
        return None
    meta = _dict(claim.get("metadata"))
    where = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    devices = _dict(allocation.get("devices"))
    spec = _dict(claim.get("spec"))
    results = []
    for r in _list(devices.get("results")):
        if not isinstance(r, dict) or not all(r.get(k) for k in ("request", "driver", "pool", "device")):
            log.warning("ignoring incomplete allocation result %r in %s", r, where)
            continue
        results.append({
            "request": r["request"], "driver": r["driver"], "pool": r["pool"], "device": r["device"],
            "device_class_name": device_class_for(spec, r["request"]),
            "admin_access": bool(r.get("adminAccess")),
            "share_id": r.get("shareID") or None,
            "consumed_capacity": r.get("consumedCapacity") or None,
        })
    scheduler_time = None
    for entry in _list(meta.get("managedFields")):
        if isinstance(entry, dict) and entry.get("manager") == SCHEDULER_MANAGER and entry.get("subresource") == "status":
            scheduler_time = _parse_time(entry.get("time"), where + " managedFields")
    return AllocationFacts(
        results=tuple(results),
        node_name=node_from_selector(allocation.get("nodeSelector")),
        config=devices.get("config") or None,
        allocation_timestamp=_parse_time(allocation.get("allocationTimestamp"), where + " allocationTimestamp"),
        scheduler_write_time=scheduler_time,
    )


def reserved_for(claim: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """``status.reservedFor`` as consumer uid → ``claim_consumers`` columns (group, resource, name).

    Entries with an empty uid are ignored (the list is keyed by uid). Non-pod consumers
    (PodGroups, 1.36+) are kept with their resource, as §9 advises.
    """
    out: dict[str, dict[str, str]] = {}
    for ref in _list(_dict(claim.get("status")).get("reservedFor")):
        if isinstance(ref, dict) and ref.get("uid"):
            out[ref["uid"]] = {"consumer_api_group": ref.get("apiGroup") or "",
                               "consumer_resource": ref.get("resource") or "",
                               "consumer_name": ref.get("name") or ""}
    return out


def owner_pod_uid(obj: Mapping[str, Any]) -> str | None:
    """UID of the controller ownerReference of kind Pod (generated claims, rule 7), else ``None``."""
    for ref in _list(_dict(obj.get("metadata")).get("ownerReferences")):
        if isinstance(ref, dict) and ref.get("controller") and ref.get("kind") == "Pod":
            return ref.get("uid") or None
    return None


@dataclass(frozen=True)
class SliceFacts:
    """A normalised ResourceSlice: its pool, generation and devices (name → ``device_states`` columns)."""

    driver: str
    pool: str
    generation: int
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)


_PHYSICAL_FROM_UUID = ("gpu", "vfio")  # a full GPU (or one passed through): the device is the GPU
#: ``type`` values that make a device a GPU whoever publishes it: the NVIDIA GPU driver's full GPU and
#: MIG device (dra-api.md §6.1, §6.3). Not ``vfio``: that names a PCI function handed to a VM or a
#: user-space driver, a GPU only when a GPU driver publishes it (``gpu.nvidia.com``'s ``gpu-vfio-N``,
#: §6.2); an SR-IOV NIC driver publishes its virtual functions as ``vfio`` too. Nothing in a VFIO
#: device's attributes is GPU-specific (§6.3: ``uuid``, ``deviceID``, ``vendorID``, ``numa``,
#: ``productName``, ``iommuFDEnabled``, PCI attributes), so its driver decides.
GPU_DEVICE_TYPES = ("gpu", "mig")


def is_gpu_driver(driver: str) -> bool:
    """Whether a DRA driver name is a GPU driver's: its first DNS label is ``gpu`` (``gpu.nvidia.com``,
    the dra-example-driver's ``gpu.example.com``, ``gpu.amd.com``, ``gpu.intel.com``: the DRA GPU
    drivers' naming convention; not ``compute-domain.nvidia.com``, nor a NIC driver's)."""
    return driver.split(".", 1)[0] == "gpu"


def is_gpu_device(device_type: str | None, driver: str) -> bool:
    """Whether a published device is (part of) a GPU, so that its ``uuid``/``parentUUID`` name a
    physical GPU: its ``type`` is ``gpu`` or ``mig`` (``GPU_DEVICE_TYPES``, dra-api.md §6.1), or its
    driver is a GPU driver (``is_gpu_driver``: also the drivers that publish no ``type``, types of
    their own, or ``vfio`` for a GPU passed through). Any other device is not a GPU: a NIC driver's
    (with a ``uuid`` of its own, or SR-IOV virtual functions of ``type`` ``vfio``), a compute
    domain's ``daemon``/``channel``, another accelerator's (a TPU's, published without ``type``;
    ``slice_facts`` logs a warning naming such a driver). Stated in SQL for stored rows by
    ``not_gpu_sql`` (policy facts) and, as of their revision, by ``migrations/versions/0004`` and
    ``0006``."""
    return device_type in GPU_DEVICE_TYPES or is_gpu_driver(driver)


def not_gpu_sql(prefix: str = "") -> str:
    """``not is_gpu_device(device_type, driver)`` as an SQL condition over ``device_states`` columns
    (``prefix``: the table alias with its dot, e.g. ``"ds."``), for SQLite and PostgreSQL alike.
    Driver names are lowercase DNS subdomains (validated by the API server), so ``LIKE`` (case-blind
    in SQLite) agrees with ``is_gpu_driver``."""
    types = ", ".join(f"'{t}'" for t in GPU_DEVICE_TYPES)
    return (f"COALESCE({prefix}device_type, '') NOT IN ({types}) "
            f"AND {prefix}driver <> 'gpu' AND {prefix}driver NOT LIKE 'gpu.%'")


# Drivers already warned about in this process (``_warn_not_gpus``): a slice is republished often.
_warned_drivers: set[tuple[str, str]] = set()


def _warn_not_gpus(driver: str, slice_name: str, devices: Mapping[str, Mapping[str, Any]]) -> None:
    """Log once per process and driver that devices whose classification is inferred, not declared,
    are not counted as GPUs: devices without ``type`` (an accelerator that is no GPU, e.g. a TPU
    driver's, or a GPU driver not named ``gpu.*``) and ``vfio`` devices of a driver that is no GPU
    driver (SR-IOV virtual functions). Devices of a declared other type (``nic``, ``daemon``,
    ``channel``) are not mentioned. A GPU driver's devices never are."""
    if is_gpu_driver(driver):
        return
    for kind, what in (("untyped", None), ("vfio", "vfio")):
        names = sorted(n for n, cols in devices.items() if cols["device_type"] == what)
        if not names or (driver, kind) in _warned_drivers:
            continue
        _warned_drivers.add((driver, kind))
        shown = ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
        published = "without a type attribute" if what is None else "of type vfio"
        log.warning(
            "ResourceSlice %s: driver %s publishes device(s) %s (%s); they are not counted as GPUs: draudit "
            "counts a device as a GPU when its type is gpu or mig, or its driver's first DNS label is 'gpu' "
            "(gpu.nvidia.com, gpu.amd.com). They get no GPU identity, take no part in GPU sharing or "
            "handovers, and a transaction served only by them is unattributed (no-device-record). "
            "Logged once per driver and process.", slice_name, driver, published, shown)


def device_columns(device: Mapping[str, Any], driver: str, slice_name: str, generation: int,
                   node_name: str | None) -> dict[str, Any]:
    """The ``device_states`` columns of one device of a normalised slice (without key/interval).

    Extracted in the driver's domain (short or qualified keys, rule 11): ``type``, ``uuid``,
    ``parentUUID``, ``profile``, ``productName``, ``driverVersion``; ``memory`` capacity in bytes.
    ``physical_gpu_uuid`` is ``uuid`` for type gpu/vfio and ``parentUUID`` for type mig (also
    dynamic MIG, which has no uuid). Source: dra-api.md §6.3.

    A device that is not a GPU (``is_gpu_device``: a NIC driver's ``nic-0`` with a ``uuid`` of its
    own) gets no ``uuid``, ``parent_uuid`` nor ``physical_gpu_uuid`` (they stay in ``attributes``):
    the GPU identity every reader takes, ``coalesce(physical_gpu_uuid, parent_uuid, uuid)``
    (``device_states.gpu_uuid``), is then NULL, so attribution, co-tenants, policies and packs do
    not take it for a GPU.
    """
    where = f"ResourceSlice {slice_name} device {device.get('name')}"

    def text(name: str) -> str | None:
        value = device_attribute(device, name, driver)
        return None if value is None or isinstance(value, (list, dict)) else str(value)

    device_type = text("type")
    if is_gpu_device(device_type, driver):
        uuid, parent_uuid = text("uuid"), text("parentUUID")
    else:
        uuid = parent_uuid = None
    physical = uuid if device_type in _PHYSICAL_FROM_UUID else parent_uuid if device_type == "mig" else None
    try:
        memory = device_capacity_bytes(device, "memory", driver)
    except ValueError as exc:
        log.warning("%s: memory capacity ignored: %s", where, exc)
        memory = None
    return {
        "slice_name": slice_name,
        "pool_generation": generation,
        "node_name": device.get("nodeName") or node_name,
        "device_type": device_type,
        "uuid": uuid,
        "parent_uuid": parent_uuid,
        "physical_gpu_uuid": physical,
        "profile": text("profile"),
        "product_name": text("productName"),
        "driver_version": text("driverVersion"),
        "memory_bytes": memory,
        "allow_multiple_allocations": bool(device.get("allowMultipleAllocations")),
        "attributes": device.get("attributes") or None,
        "capacity": device.get("capacity") or None,
    }


def slice_facts(resource_slice: Mapping[str, Any]) -> SliceFacts | None:
    """The facts of a normalised ResourceSlice, or ``None`` without driver or pool name.

    Logs a warning (once per driver and process) when the slice's driver is no GPU driver and
    publishes devices without ``type`` or of type ``vfio``: they are not counted as GPUs
    (``is_gpu_device``), which an operator running another accelerator needs to be told."""
    meta, spec = _dict(resource_slice.get("metadata")), _dict(resource_slice.get("spec"))
    pool = _dict(spec.get("pool"))
    if not spec.get("driver") or not pool.get("name"):
        return None
    try:
        generation = int(pool.get("generation") or 0)
    except (TypeError, ValueError):
        generation = 0
    name = meta.get("name") or ""
    devices = {}
    for device in _list(spec.get("devices")):
        if isinstance(device, dict) and device.get("name"):
            devices[device["name"]] = device_columns(device, spec["driver"], name, generation, spec.get("nodeName"))
    _warn_not_gpus(spec["driver"], name, devices)
    return SliceFacts(spec["driver"], pool["name"], generation, devices)


# ============================================================================================
# Applying versions
# ============================================================================================


@dataclass(frozen=True)
class _Version:
    id: int
    cluster: str
    kind: str
    namespace: str | None
    name: str
    uid: str
    resource_version: str
    deleted: bool
    observed_ns: int
    raw: Any
    api_version: str


def _get(row: Any, name: str) -> Any:
    if type(row) is dict:  # the common case, checked first: ABC isinstance is slow on hot paths
        return row.get(name)
    if isinstance(row, Mapping):
        return row.get(name)
    mapping = getattr(row, "_mapping", None)  # SQLAlchemy Row
    if mapping is not None:
        return mapping.get(name)
    return getattr(row, name, None)


def _as_version(row: Any) -> _Version:
    if type(row) is dict:  # the recorder's rows: one bound method for every field
        get = row.get
    else:
        def get(name: str, _row: Any = row) -> Any:
            return _get(_row, name)
    return _Version(
        id=int(get("id")), cluster=get("cluster"), kind=get("kind"), namespace=get("namespace"), name=get("name"),
        uid=get("uid"), resource_version=str(get("resource_version")), deleted=get("event_type") in DELETE_EVENTS,
        observed_ns=dt_to_ns(get("observed_at")), raw=get("raw"), api_version=get("api_version") or "",
    )


class _Row:
    """One interval row tracked during a batch: loaded open from the database (``id``) or new."""

    __slots__ = ("id", "values", "valid_to_ns", "closed")

    def __init__(self, values: dict[str, Any], row_id: int | None = None) -> None:
        self.id = row_id
        self.values = values
        self.valid_to_ns: int | None = None
        self.closed = False

    def close(self, at_ns: int) -> None:
        self.valid_to_ns = at_ns
        self.closed = True


def _chunks(items: Sequence[Any], size: int = IN_CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _boundaries(session: Session, key_col: Any, from_col: Any, to_col: Any, where: Sequence[Any],
                keys: Sequence[Any]) -> dict[Any, int]:
    """key → the latest valid_from/valid_to recorded for it (the object's last applied change)."""
    out: dict[Any, int] = {}
    for chunk in _chunks(keys):
        stmt = select(key_col, func.max(from_col), func.max(to_col)).where(*where, key_col.in_(chunk)).group_by(key_col)
        for key, max_from, max_to in session.execute(stmt):
            out[key] = max(v for v in (max_from, max_to, 0) if v is not None)
    return out


# JSON columns: Python None would be stored as the JSON text 'null'; absent keys are SQL NULL.
_JSON_COLUMNS = {AllocationEpisode: ("config",), AllocationResult: ("consumed_capacity",),
                 DeviceState: ("attributes", "capacity")}


def _sql_nulls(model: type, values: dict[str, Any]) -> dict[str, Any]:
    for column in _JSON_COLUMNS.get(model, ()):
        if values.get(column, 0) is None:
            del values[column]
    return values


def _insert(session: Session, model: type, rows: list[dict[str, Any]], returning: bool = False,
            ignore_duplicates: bool = False) -> list[int]:
    """Core executemany INSERT (one statement per distinct column set); ids in row order if asked.

    ``ignore_duplicates`` adds ``ON CONFLICT DO NOTHING`` (SQLite and PostgreSQL both have it).
    """
    table = model.__table__  # type: ignore[attr-defined]
    if session.get_bind().dialect.name == "postgresql" and rows:
        return _pg_copy(session, table, rows, returning, ignore_duplicates)
    dialect = sqlite
    groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        groups[tuple(sorted(row))].append(i)
    ids: list[int] = [0] * len(rows)
    for members in groups.values():
        params = [rows[i] for i in members]
        if returning:
            stmt = table.insert().returning(table.c.id, sort_by_parameter_order=True)
            for i, new_id in zip(members, session.execute(stmt, params).scalars().all()):
                ids[i] = new_id
        elif ignore_duplicates:
            session.execute(dialect.insert(table).on_conflict_do_nothing(), params)
        else:
            session.execute(table.insert(), params)
    return ids


def _pg_copy(session: Session, table: Any, rows: list[dict[str, Any]], returning: bool, ignore_duplicates: bool) -> list[int]:
    """PostgreSQL: the same insert through COPY (multi-row VALUES make psycopg re-parse a huge
    statement per batch). Ids, when asked, are drawn from the table's sequence first so they come
    back in row order; JSON columns get the text SQLAlchemy's JSON type would write (``None`` →
    JSON ``null``, its default)."""
    present = set().union(*rows)
    columns = [c.name for c in table.columns if c.name != "id" and c.name in present]
    json_cols = {c.name for c in table.columns if isinstance(c.type, JSON)}
    # An absent key takes the column's Python-side default, as SQLAlchemy's INSERT would.
    defaults = {c.name: c.default.arg for c in table.columns
                if c.name in present and c.default is not None and c.default.is_scalar}
    conn = session.connection()
    ids = pg_next_ids(session, table.name, len(rows)) if returning else []

    def values(i: int, row: dict[str, Any]) -> list[Any]:
        out = [ids[i]] if returning else []
        for c in columns:
            if c in row:
                v = row[c]
                out.append(orjson.dumps(v).decode() if c in json_cols else v)
            else:
                out.append(defaults.get(c))  # absent JSON keys stay SQL NULL (see _sql_nulls)
        return out

    cols = (["id"] if returning else []) + columns
    if ignore_duplicates:
        pg_copy_insert(session, table.name, cols, (values(i, r) for i, r in enumerate(rows)), (), ("id",))
    else:
        with conn.connection.driver_connection.cursor() as cur:
            with cur.copy(f"COPY {table.name} ({', '.join(cols)}) FROM STDIN") as copy:
                for i, r in enumerate(rows):
                    copy.write_row(values(i, r))
    return ids if returning else [0] * len(rows)


class _Batch:
    """Open state of the objects in one batch, the changes made to it, and the bulk writes."""

    def __init__(self, session: Session, cluster: str) -> None:
        self.session = session
        self.cluster = cluster
        self.new: dict[type, list[_Row]] = defaultdict(list)
        self.loaded_closed: dict[type, list[_Row]] = defaultdict(list)
        self.skipped_stale = 0
        self.known_episodes: set[tuple[str, str]] = set()  # (claim uid, first RV) in the database
        self.newest: dict[str, int] = {}  # object uid → newest object_versions.id stored for it

    def load_newest(self, kind: str, uids: Sequence[str]) -> None:
        """Remember the newest stored version id of each object (covering index on object_versions)."""
        for chunk in _chunks(list(uids)):
            self.newest.update(self.session.execute(
                select(ObjectVersion.uid, func.max(ObjectVersion.id)).where(
                    ObjectVersion.cluster == self.cluster, ObjectVersion.kind == kind, ObjectVersion.uid.in_(chunk))
                .group_by(ObjectVersion.uid)).all())

    def is_stale(self, v: _Version, boundary_ns: int) -> bool:
        """A replay of an older version: observed before the object's last recorded change.

        The newest stored version of an object is never stale (applying it again is a no-op), so
        a backwards clock step or a leader with a lagging clock cannot make us drop new data.
        """
        if v.observed_ns >= boundary_ns or v.id >= self.newest.get(v.uid, v.id):
            return False
        self.skipped_stale += 1
        return True

    def open(self, model: type, values: dict[str, Any]) -> _Row:
        row = _Row(values)
        self.new[model].append(row)
        return row

    def close(self, model: type, row: _Row, at_ns: int) -> None:
        if row.closed:
            return
        # Never end an interval before it began (a backwards clock step between two versions).
        row.close(max(at_ns, row.values.get("valid_from_ns", at_ns)))
        if row.id is not None:
            self.loaded_closed[model].append(row)

    # -- writing ---------------------------------------------------------------------------

    def flush(self) -> None:
        s = self.session
        episodes = self.new.get(AllocationEpisode, [])
        if episodes:
            self._drop_existing_episodes(episodes)
            kept = [r for r in episodes if r.values is not None]
            ids = _insert(s, AllocationEpisode, [_sql_nulls(AllocationEpisode, {**r.values, "valid_to_ns": r.valid_to_ns})
                                                 for r in kept], returning=True)
            for row, new_id in zip(kept, ids):
                row.id = new_id
        for model in (PodState, PodClaimRef, DeviceState, AllocationResult, ClaimConsumer, PodContainerClaim):
            ignore_duplicates = model is PodContainerClaim
            rows = []
            for r in self.new.get(model, []):
                values = dict(r.values)
                episode = values.pop("_episode", None)
                if episode is not None:
                    if episode.id is None:  # its episode was already recorded (replay): nothing to add
                        continue
                    values["episode_id"] = episode.id
                if model is not PodContainerClaim and model is not AllocationResult:
                    values["valid_to_ns"] = r.valid_to_ns
                rows.append(_sql_nulls(model, values))
            _insert(s, model, rows, ignore_duplicates=ignore_duplicates)
        for model, closed in self.loaded_closed.items():
            if closed:
                table = model.__table__
                stmt = table.update().where(table.c.id == bindparam("row_id")).values(valid_to_ns=bindparam("to_ns"))
                s.execute(stmt, [{"row_id": r.id, "to_ns": r.valid_to_ns} for r in closed])

    def _drop_existing_episodes(self, episodes: list[_Row]) -> None:
        """Guard the (claim uid, first RV) key: an episode already recorded is not opened again.

        Only reachable when an older version is re-applied with the same observed time as a
        later one (the stale check compares times); the rows are then dropped, not duplicated.
        """
        for row in episodes:
            key = (row.values["claim_uid"], row.values["first_rv"])
            if key in self.known_episodes:
                log.warning("allocation episode %s@%s already recorded; not opened again", *key)
                row.values = None  # type: ignore[assignment]
            self.known_episodes.add(key)


# -- Pods -------------------------------------------------------------------------------------


class _PodProjector:
    """pod_states, pod_claim_refs, pod_container_claims for the pods of one batch."""

    def __init__(self, batch: _Batch, versions: list[tuple[_Version, PodFacts]]) -> None:
        self.batch = batch
        s, c = batch.session, batch.cluster
        uids = sorted({v.uid for v, _ in versions})
        self.state: dict[str, _Row] = {}
        self.refs: dict[str, dict[str, _Row]] = defaultdict(dict)
        self.container_claims: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
        self.boundary: dict[str, int] = defaultdict(int)
        for chunk in _chunks(uids):
            for row in s.execute(select(PodState.id, PodState.pod_uid, PodState.node_name, PodState.phase,
                                        PodState.valid_from_ns, PodState.valid_to_ns).where(
                    PodState.cluster == c, PodState.pod_uid.in_(chunk))):
                self._see(row.pod_uid, row.valid_from_ns, row.valid_to_ns)
                if row.valid_to_ns is None:
                    self.state[row.pod_uid] = _Row(
                        {"node_name": row.node_name, "phase": row.phase, "valid_from_ns": row.valid_from_ns}, row.id)
            for row in s.execute(select(PodClaimRef.id, PodClaimRef.pod_uid, PodClaimRef.pod_claim_name,
                                        PodClaimRef.claim_name, PodClaimRef.template_name, PodClaimRef.valid_from_ns,
                                        PodClaimRef.valid_to_ns).where(
                    PodClaimRef.cluster == c, PodClaimRef.pod_uid.in_(chunk))):
                self._see(row.pod_uid, row.valid_from_ns, row.valid_to_ns)
                if row.valid_to_ns is None:
                    self.refs[row.pod_uid][row.pod_claim_name] = _Row(
                        {"claim_name": row.claim_name, "template_name": row.template_name,
                         "valid_from_ns": row.valid_from_ns}, row.id)

    def _see(self, uid: str, *times: int | None) -> None:
        self.boundary[uid] = max([self.boundary[uid], *(t for t in times if t is not None)])

    def apply(self, v: _Version, facts: PodFacts) -> None:
        t = v.observed_ns
        if self.batch.is_stale(v, self.boundary[v.uid]):
            return
        b = self.batch
        state, refs = self.state.get(v.uid), self.refs[v.uid]
        if v.deleted:
            if state is not None:
                b.close(PodState, state, t)
                del self.state[v.uid]
            for name in list(refs):
                b.close(PodClaimRef, refs.pop(name), t)
            self._see(v.uid, t)
            return
        if state is None or (state.values["node_name"], state.values["phase"]) != (facts.node_name, facts.phase):
            if state is not None:
                b.close(PodState, state, t)
            self.state[v.uid] = b.open(PodState, {
                "cluster": b.cluster, "pod_uid": v.uid, "namespace": facts.namespace, "name": facts.name,
                "node_name": facts.node_name, "phase": facts.phase, "valid_from_ns": t, "source_version_id": v.id})
        for name in list(refs):
            if name not in facts.claim_refs:
                b.close(PodClaimRef, refs.pop(name), t)
        opened = False
        for name, (claim_name, template_name) in facts.claim_refs.items():
            current = refs.get(name)
            if current is not None and (current.values["claim_name"], current.values["template_name"]) == (claim_name, template_name):
                continue
            if current is not None:
                b.close(PodClaimRef, current, t)
            refs[name] = b.open(PodClaimRef, {
                "cluster": b.cluster, "pod_uid": v.uid, "namespace": facts.namespace, "pod_claim_name": name,
                "claim_name": claim_name, "template_name": template_name, "valid_from_ns": t})
            opened = True
        if opened:
            # The container map is immutable spec, except the extended-resource mappings that arrive
            # with their claim: (re)offer it whenever a claim reference opens; duplicates are ignored.
            known = self.container_claims[v.uid]
            for key, init in facts.container_claims.items():
                if key not in known:
                    known.add(key)
                    b.open(PodContainerClaim, {"cluster": b.cluster, "pod_uid": v.uid, "container_name": key[0],
                                               "init_container": init, "pod_claim_name": key[1], "request": key[2]})
        self._see(v.uid, t)


# -- ResourceClaims ----------------------------------------------------------------------------


class _ClaimProjector:
    """allocation_episodes, allocation_results, claim_consumers for the claims of one batch."""

    def __init__(self, batch: _Batch, uids: Sequence[str]) -> None:
        self.batch = batch
        s, c = batch.session, batch.cluster
        self.episode: dict[str, _Row] = {}
        self.identity: dict[str, tuple] = {}
        self.consumers: dict[str, dict[str, _Row]] = defaultdict(dict)
        self.boundary: dict[str, int] = defaultdict(int)
        # Every episode of these claims (a claim has few): boundaries, the open one, known first RVs.
        open_by_id: dict[int, tuple[str, Any]] = {}
        for chunk in _chunks(list(uids)):
            for ep in s.execute(select(AllocationEpisode.id, AllocationEpisode.claim_uid, AllocationEpisode.first_rv,
                                       AllocationEpisode.valid_from_ns, AllocationEpisode.valid_to_ns,
                                       AllocationEpisode.node_name, AllocationEpisode.allocation_timestamp).where(
                    AllocationEpisode.cluster == c, AllocationEpisode.claim_uid.in_(chunk))):
                self._see(ep.claim_uid, ep.valid_from_ns, ep.valid_to_ns)
                batch.known_episodes.add((ep.claim_uid, ep.first_rv))
                if ep.valid_to_ns is None:
                    self.episode[ep.claim_uid] = _Row({"claim_uid": ep.claim_uid, "valid_from_ns": ep.valid_from_ns}, ep.id)
                    open_by_id[ep.id] = (ep.claim_uid, ep)
        results: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for chunk in _chunks(sorted(open_by_id)):
            for r in s.execute(select(AllocationResult.episode_id, AllocationResult.request, AllocationResult.driver,
                                      AllocationResult.pool, AllocationResult.device, AllocationResult.share_id,
                                      AllocationResult.admin_access, AllocationResult.consumed_capacity).where(
                    AllocationResult.episode_id.in_(chunk))):
                results[r.episode_id].append({"request": r.request, "driver": r.driver, "pool": r.pool, "device": r.device,
                                              "share_id": r.share_id, "admin_access": r.admin_access,
                                              "consumed_capacity": r.consumed_capacity})
            # Open consumers, plus (id NULL) the latest close per claim, for the stale-version guard.
            open_consumers = select(ClaimConsumer.id, ClaimConsumer.claim_uid, ClaimConsumer.consumer_uid,
                                    ClaimConsumer.valid_from_ns).where(
                ClaimConsumer.episode_id.in_(chunk), ClaimConsumer.valid_to_ns.is_(None))
            latest_close = select(cast(null(), BigInteger), ClaimConsumer.claim_uid, cast(null(), String),
                                  func.max(ClaimConsumer.valid_to_ns)).where(
                ClaimConsumer.episode_id.in_(chunk), ClaimConsumer.valid_to_ns.is_not(None)).group_by(ClaimConsumer.claim_uid)
            for row_id, claim_uid, consumer_uid, at_ns in s.execute(union_all(open_consumers, latest_close)):
                if row_id is not None:
                    self.consumers[claim_uid][consumer_uid] = _Row({"valid_from_ns": at_ns}, row_id)
                self._see(claim_uid, at_ns)
        for episode_id, (uid, ep) in open_by_id.items():
            self.identity[uid] = allocation_identity(results[episode_id], ep.node_name, ep.allocation_timestamp)

    def _see(self, uid: str, *times: int | None) -> None:
        self.boundary[uid] = max([self.boundary[uid], *(t for t in times if t is not None)])

    def _close_episode(self, uid: str, t: int) -> None:
        b = self.batch
        for consumer in self.consumers.pop(uid, {}).values():
            b.close(ClaimConsumer, consumer, t)
        episode = self.episode.pop(uid, None)
        if episode is not None:
            b.close(AllocationEpisode, episode, t)
        self.identity.pop(uid, None)

    def apply(self, v: _Version, claim: Mapping[str, Any] | None) -> None:
        t = v.observed_ns
        if self.batch.is_stale(v, self.boundary[v.uid]):
            return
        if claim is None and not v.deleted:
            return  # unreadable raw (logged): it proves nothing about the allocation
        self._see(v.uid, t)
        allocation = None if v.deleted or claim is None else allocation_facts(claim)
        if allocation is None:
            self._close_episode(v.uid, t)
            return
        b = self.batch
        if self.identity.get(v.uid) != allocation.identity:
            self._close_episode(v.uid, t)  # no-op when none is open; else a missed deallocation (gap)
            meta = _dict(claim.get("metadata"))
            episode = b.open(AllocationEpisode, {
                "cluster": b.cluster, "claim_uid": v.uid, "claim_namespace": meta.get("namespace") or v.namespace or "",
                "claim_name": meta.get("name") or v.name, "owner_pod_uid": owner_pod_uid(claim),
                "first_rv": v.resource_version, "node_name": allocation.node_name,
                "allocation_timestamp": allocation.allocation_timestamp,
                "scheduler_write_time": allocation.scheduler_write_time, "config": allocation.config,
                "valid_from_ns": t, "source_version_id": v.id})
            self.episode[v.uid] = episode
            self.identity[v.uid] = allocation.identity
            for result in allocation.results:
                b.open(AllocationResult, {**result, "_episode": episode})
        episode = self.episode[v.uid]
        consumers = self.consumers[v.uid]
        wanted = reserved_for(claim)
        for uid in [u for u in consumers if u not in wanted]:
            b.close(ClaimConsumer, consumers.pop(uid), t)
        for uid, columns in wanted.items():
            if uid not in consumers:
                consumers[uid] = b.open(ClaimConsumer, {
                    "cluster": b.cluster, "claim_uid": v.uid, "_episode": episode, "consumer_uid": uid,
                    **columns, "valid_from_ns": t})


# -- ResourceSlices ----------------------------------------------------------------------------

_DEVICE_FACT_COLUMNS = ("slice_name", "pool_generation", "node_name", "device_type", "uuid", "parent_uuid",
                        "physical_gpu_uuid", "profile", "product_name", "driver_version", "memory_bytes",
                        "allow_multiple_allocations", "attributes", "capacity")


class _SliceProjector:
    """device_states for the pools touched by the slices of one batch."""

    def __init__(self, batch: _Batch, versions: list[tuple[_Version, SliceFacts]]) -> None:
        self.batch = batch
        s, c = batch.session, batch.cluster
        pools = {(f.driver, f.pool) for _, f in versions}
        drivers, pool_names = sorted({d for d, _ in pools}), sorted({p for _, p in pools})
        self.open: dict[tuple[str, str], dict[str, _Row]] = defaultdict(dict)
        for chunk in _chunks(pool_names):
            for row in s.execute(select(DeviceState.id, DeviceState.driver, DeviceState.pool, DeviceState.device,
                                        DeviceState.valid_from_ns,
                                        *(getattr(DeviceState, col) for col in _DEVICE_FACT_COLUMNS)).where(
                    DeviceState.cluster == c, DeviceState.driver.in_(drivers), DeviceState.pool.in_(chunk),
                    DeviceState.valid_to_ns.is_(None))):
                if (row.driver, row.pool) in pools:
                    values = {col: getattr(row, col) for col in _DEVICE_FACT_COLUMNS}
                    values["valid_from_ns"] = row.valid_from_ns
                    self.open[(row.driver, row.pool)][row.device] = _Row(values, row.id)
        slice_names = sorted({v.name for v, _ in versions})
        self.boundary: dict[str, int] = defaultdict(int, _boundaries(
            s, DeviceState.slice_name, DeviceState.valid_from_ns, DeviceState.valid_to_ns,
            [DeviceState.cluster == c, DeviceState.driver.in_(drivers), DeviceState.pool.in_(pool_names)], slice_names))

    def _see(self, slice_name: str, t: int) -> None:
        self.boundary[slice_name] = max(self.boundary[slice_name], t)

    def apply(self, v: _Version, facts: SliceFacts) -> None:
        t = v.observed_ns
        if self.batch.is_stale(v, self.boundary[v.name]):
            return
        b = self.batch
        pool_key = (facts.driver, facts.pool)
        devices = self.open[pool_key]
        newest = max((r.values["pool_generation"] for r in devices.values()), default=None)
        wanted: dict[str, dict[str, Any]] = {}
        if not v.deleted and (newest is None or facts.generation >= newest):
            wanted = facts.devices
            if newest is not None and facts.generation > newest:
                # A newer generation supersedes every device of older ones, in any slice (§4.3).
                for name in [n for n, r in devices.items() if r.values["pool_generation"] < facts.generation]:
                    self._close(devices, name, t)
        for name in [n for n, r in devices.items() if r.values["slice_name"] == v.name and n not in wanted]:
            self._close(devices, name, t)
        for name, columns in wanted.items():
            current = devices.get(name)
            if current is not None and all(current.values[k] == columns[k] for k in _DEVICE_FACT_COLUMNS):
                continue
            if current is not None:
                self._close(devices, name, t)
            devices[name] = b.open(DeviceState, {
                "cluster": b.cluster, "driver": facts.driver, "pool": facts.pool, "device": name, **columns,
                "valid_from_ns": t, "source_version_id": v.id})
        self._see(v.name, t)

    def _close(self, devices: dict[str, _Row], name: str, t: int) -> None:
        row = devices.pop(name)
        self.batch.close(DeviceState, row, t)
        self._see(row.values["slice_name"], t)


# -- entry points ------------------------------------------------------------------------------


def _normalised(v: _Version) -> dict[str, Any] | None:
    if not isinstance(v.raw, Mapping):
        log.warning("object_versions id %s (%s %s): raw is not a JSON object; not projected", v.id, v.kind, v.name)
        return None
    return normalize(v.kind, v.api_version, v.raw)


def _apply_cluster(session: Session, cluster: str, versions: list[_Version], just_inserted: bool) -> int:
    batch = _Batch(session, cluster)
    pods: list[tuple[_Version, PodFacts]] = []
    claims: list[tuple[_Version, dict[str, Any] | None]] = []
    slices: list[tuple[_Version, SliceFacts]] = []
    for v in versions:
        if v.kind == POD:
            # Pods are the bulk of the stream: core/v1 needs no normalisation.
            if isinstance(v.raw, Mapping):
                pods.append((v, pod_facts(v.raw)))
        elif v.kind == RESOURCE_CLAIM:
            claims.append((v, _normalised(v)))
        elif v.kind == RESOURCE_SLICE:
            obj = _normalised(v)
            facts = slice_facts(obj) if obj is not None else None
            if facts is None:
                log.warning("object_versions id %s: ResourceSlice %s has no driver or pool; not projected", v.id, v.name)
            else:
                slices.append((v, facts))
    for kind, group in ((POD, pods), (RESOURCE_CLAIM, claims), (RESOURCE_SLICE, slices)):
        if not group:
            continue
        if just_inserted:  # every other stored version of these objects has a lower id
            batch.newest.update({v.uid: v.id for v, _ in group})  # id order: the last one wins
        else:
            batch.load_newest(kind, sorted({v.uid for v, _ in group}))
    if pods:
        projector = _PodProjector(batch, pods)
        for v, facts in pods:
            projector.apply(v, facts)
    if claims:
        claim_projector = _ClaimProjector(batch, sorted({v.uid for v, _ in claims}))
        for v, obj in claims:
            claim_projector.apply(v, obj)
    if slices:
        slice_projector = _SliceProjector(batch, slices)
        for v, facts in slices:
            slice_projector.apply(v, facts)
    batch.flush()
    return batch.skipped_stale


def _by_id(v: _Version) -> int:
    return v.id


def apply_versions(session: Session, versions: Sequence[Any], *, just_inserted: bool = False) -> None:
    """Update the projections from newly stored ``object_versions`` rows, in the caller's transaction.

    Args:
        session: the session that inserted the rows; nothing is committed here.
        versions: the inserted rows (ORM ``ObjectVersion`` objects, SQLAlchemy rows or mappings)
            with at least ``id, cluster, kind, api_version, namespace, name, uid,
            resource_version, event_type, observed_at`` (aware UTC) and ``raw`` (the object as
            served; normalised here). Kinds other than Pod, ResourceClaim and ResourceSlice are
            ignored. ``RELIST_*`` event types count
            as their plain counterparts.

    Versions are applied in ``id`` order. Applying a version again, or one older than what is
    already projected for its object, changes nothing.

    ``just_inserted``: the caller inserted ``versions`` in this transaction as the cluster's only
    writer (the recorder, fenced by the leader Lease), so no stored version of these objects has a
    higher id and the newest version of each is known without a query.

    Raises:
        ValueError: a row whose ``observed_at`` is naive (no zone).
    """
    parsed = sorted((_as_version(v) for v in versions if _get(v, "kind") in PROJECTED_KINDS), key=_by_id)
    by_cluster: dict[str, list[_Version]] = defaultdict(list)
    for v in parsed:
        by_cluster[v.cluster].append(v)
    for cluster, cluster_versions in by_cluster.items():
        skipped = _apply_cluster(session, cluster, cluster_versions, just_inserted)
        if skipped:
            log.debug("cluster %s: %d stale version(s) skipped", cluster, skipped)


PROJECTION_MODELS = (ClaimConsumer, AllocationResult, AllocationEpisode, PodContainerClaim, PodClaimRef, PodState,
                     DeviceState)


def clear(session: Session, cluster: str | None = None) -> None:
    """Delete every projection row (of ``cluster``, or of all clusters), children first."""
    for model in PROJECTION_MODELS:
        stmt = delete(model)
        if cluster is not None:
            if model is AllocationResult:
                stmt = stmt.where(AllocationResult.episode_id.in_(
                    select(AllocationEpisode.id).where(AllocationEpisode.cluster == cluster)))
            else:
                stmt = stmt.where(model.cluster == cluster)
        session.execute(stmt)


def rebuild(session: Session, cluster: str | None = None, chunk_size: int = REBUILD_CHUNK) -> int:
    """Delete the projections and replay every stored version in ``id`` order (after a history fix).

    Args:
        session: runs in the caller's transaction (commit is the caller's).
        cluster: only this cluster; ``None`` = all clusters.
        chunk_size: versions read and applied per step (memory bound).

    Returns:
        The number of versions replayed (Pod, ResourceClaim and ResourceSlice rows).
    """
    clear(session, cluster)
    last_id, replayed = 0, 0
    cols = (ObjectVersion.id, ObjectVersion.cluster, ObjectVersion.kind, ObjectVersion.api_version,
            ObjectVersion.namespace, ObjectVersion.name, ObjectVersion.uid, ObjectVersion.resource_version,
            ObjectVersion.event_type, ObjectVersion.observed_at, ObjectVersion.raw)
    while True:
        stmt = select(*cols).where(ObjectVersion.id > last_id, ObjectVersion.kind.in_(PROJECTED_KINDS))
        if cluster is not None:
            stmt = stmt.where(ObjectVersion.cluster == cluster)
        rows = session.execute(stmt.order_by(ObjectVersion.id).limit(chunk_size)).all()
        if not rows:
            return replayed
        apply_versions(session, [row._mapping for row in rows])
        replayed += len(rows)
        last_id = rows[-1].id
