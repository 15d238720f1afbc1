"""Object lifecycle rules applied on every write: metadata the server owns, finalizers, deletion.

Mirrors the apiserver's generic registry (``registry/generic/registry/store.go``) closely enough
for a watcher to see realistic event sequences (watch-semantics.md §5.3, dra-api.md §2.6):

* create assigns ``uid`` (a caller-supplied uid is kept so scenarios can pin owner references),
  ``creationTimestamp`` (kept if supplied, for replaying recorded history), ``generation`` 1 and
  a name from ``generateName`` + 5 random characters;
* update keeps ``uid``/``creationTimestamp``, bumps ``generation`` when ``spec`` changes, and an
  update that changes nothing is a no-op (no new resourceVersion, no event);
* delete of an object with finalizers (or a graceful pod delete) only sets
  ``deletionTimestamp`` (MODIFIED); the object goes away (DELETED, last stored state with the
  delete's RV) when the last finalizer is removed or on a later immediate delete;
* Lease ``spec.acquireTime``/``renewTime`` are MicroTime: parsed and re-rendered as RFC 3339
  UTC with 6 fractional digits, as the server does.
"""

from __future__ import annotations

import copy
import random
import uuid
from datetime import timedelta

from collector.sim.convert import to_storage
from collector.sim.kinds import KindInfo
from collector.sim.storage import Storage, StoredEvent
from collector.timeutil import ns_to_dt, parse_rfc3339_ns, utcnow

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery names.SimpleNameGenerator


class Invalid(ValueError):
    """The object cannot be stored (the HTTP layer answers 422 or 400).

    Attributes:
        code: HTTP status the server answers with.
    """

    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


def timestamp(dt=None) -> str:
    """``metav1.Time`` text: RFC 3339 UTC, second precision (``2026-11-29T20:01:02Z``)."""
    return (dt or utcnow()).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(text: str) -> str:
    """Normalise a MicroTime value to ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (UTC).

    Raises:
        Invalid: the text is not RFC 3339 with a zone (code 400, as the server's decoder fails).
    """
    try:
        ns, _precision = parse_rfc3339_ns(text)
    except ValueError as exc:
        raise Invalid(f"invalid MicroTime {text!r}: {exc}", code=400) from None
    return ns_to_dt(ns).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def object_key(info: KindInfo, obj: dict) -> tuple[str | None, str]:
    """``(namespace, name)`` of ``obj`` for ``info``.

    Raises:
        Invalid: missing name, or missing namespace on a namespaced kind.
    """
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise Invalid(f"{info.kind}: metadata.name: Required value: name or generateName is required")
    ns = meta.get("namespace") if info.namespaced else None
    if info.namespaced and not ns:
        raise Invalid(f"{info.kind} {name!r}: metadata.namespace: Required value")
    return ns, name


def _strip_server_fields(meta: dict) -> None:
    meta.pop("resourceVersion", None)
    meta.pop("selfLink", None)


def _normalise(info: KindInfo, obj: dict) -> dict:
    new = to_storage(copy.deepcopy(obj), info)
    meta = new.setdefault("metadata", {})
    if not info.namespaced:
        meta.pop("namespace", None)
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + "".join(random.choice(_GENERATE_ALPHABET) for _ in range(5))
    if info.kind == "Lease" and isinstance(new.get("spec"), dict):
        for field in ("acquireTime", "renewTime"):
            if new["spec"].get(field):
                new["spec"][field] = micro_time(new["spec"][field])
    _strip_server_fields(meta)
    return new


def _same_content(a: dict, b: dict) -> bool:
    def scrub(o: dict) -> dict:
        o = dict(o)
        meta = dict(o.get("metadata") or {})
        meta.pop("resourceVersion", None)
        o["metadata"] = meta
        return o

    return scrub(a) == scrub(b)


def create(storage: Storage, info: KindInfo, obj: dict) -> StoredEvent:
    """Store a new object.

    Raises:
        Invalid: missing name/namespace.
        FileExistsError: an object with that key exists (409 AlreadyExists).
    """
    with storage.lock:
        new = _normalise(info, obj)
        ns, name = object_key(info, new)
        key = info.key(ns, name)
        if storage.get(info, key) is not None:
            raise FileExistsError(key)
        meta = new["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", timestamp())
        meta["generation"] = 1
        return storage.write(info, key, new, "ADDED")


def update(storage: Storage, info: KindInfo, obj: dict, expect_rv: str | None = None) -> StoredEvent | dict:
    """Replace an existing object.

    Args:
        expect_rv: the caller's ``metadata.resourceVersion`` precondition (None/"" = none).

    Returns:
        the :class:`StoredEvent` of the write, or the unchanged stored object when nothing changed.

    Raises:
        Invalid: missing name/namespace.
        KeyError: no such object (404).
        PermissionError: stale ``expect_rv`` (409 Conflict).
    """
    with storage.lock:
        new = _normalise(info, obj)
        ns, name = object_key(info, new)
        key = info.key(ns, name)
        existing = storage.get(info, key)
        if existing is None:
            raise KeyError(key)
        old_meta = existing["metadata"]
        if expect_rv and expect_rv != old_meta.get("resourceVersion"):
            raise PermissionError(key)
        meta = new["metadata"]
        meta["uid"] = old_meta["uid"]
        meta["creationTimestamp"] = old_meta.get("creationTimestamp")
        if old_meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = old_meta["deletionTimestamp"]
            if "deletionGracePeriodSeconds" in old_meta:
                meta["deletionGracePeriodSeconds"] = old_meta["deletionGracePeriodSeconds"]
        gen = int(old_meta.get("generation") or 1)
        meta["generation"] = gen + 1 if new.get("spec") != existing.get("spec") else gen
        if _same_content(new, existing):
            return existing
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and old_meta.get("finalizers"):
            # last finalizer removed from a terminating object: the server deletes it
            return storage.write(info, key, None, "DELETED")
        return storage.write(info, key, new, "MODIFIED")


def apply(storage: Storage, info: KindInfo, obj: dict) -> StoredEvent | dict:
    """Create or update (no resourceVersion precondition): the test harness's write path."""
    with storage.lock:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        ns = meta.get("namespace") if info.namespaced else None
        if name and storage.get(info, info.key(ns, name)) is not None:
            return update(storage, info, obj)
        return create(storage, info, obj)


def delete(
    storage: Storage,
    info: KindInfo,
    namespace: str | None,
    name: str,
    grace_period_s: int | None = None,
) -> StoredEvent | dict:
    """Delete an object, honouring finalizers and graceful pod deletion.

    Args:
        grace_period_s: for Pods bound to a node, a value > 0 only marks the pod terminating
            (``deletionTimestamp`` = now + grace, ``deletionGracePeriodSeconds``); None or 0
            deletes at once.

    Returns:
        the event of the write (DELETED, or MODIFIED when only marked terminating), or the
        stored object when it was already terminating and nothing changed.

    Raises:
        KeyError: no such object (404).
    """
    with storage.lock:
        key = info.key(namespace if info.namespaced else None, name)
        existing = storage.get(info, key)
        if existing is None:
            raise KeyError(key)
        meta = existing.get("metadata") or {}
        graceful = (
            info.kind == "Pod"
            and grace_period_s is not None
            and grace_period_s > 0
            and (existing.get("spec") or {}).get("nodeName")
        )
        if meta.get("finalizers") or graceful:
            if meta.get("deletionTimestamp"):
                if not meta.get("finalizers") and not grace_period_s:
                    return storage.write(info, key, None, "DELETED")
                return existing
            marked = copy.deepcopy(existing)
            grace = int(grace_period_s or 0) if graceful else 0
            marked["metadata"]["deletionTimestamp"] = timestamp(utcnow() + timedelta(seconds=grace))
            marked["metadata"]["deletionGracePeriodSeconds"] = grace
            return storage.write(info, key, marked, "MODIFIED")
        return storage.write(info, key, None, "DELETED")
