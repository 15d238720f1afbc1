"""The sim's "etcd": one global resourceVersion counter and a multi-version object store.

Rules mirrored (watch-semantics.md §6): the resourceVersion is a single counter shared by every
kind (etcd revision), so one kind's RVs are sparse; a list's RV is the counter at the time of
the read; reads at an older revision work until that revision is compacted, then fail with 410.
Every kept version lets LIST serve ``resourceVersionMatch=Exact`` and consistent ``continue``
pages (a page is a read at the token's revision) exactly like etcd's MVCC does.

All methods take the storage lock; callers that need several operations to be atomic (read,
decide, write) hold ``storage.lock`` (re-entrant) around them.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass
from typing import Callable

from collector.sim.kinds import KindInfo


class Compacted(Exception):
    """A read at a revision older than the compaction point (the server answers 410 Expired).

    Attributes:
        requested_rv: the revision asked for.
        compacted_rv: the oldest revision still readable.
    """

    def __init__(self, requested_rv: int, compacted_rv: int) -> None:
        super().__init__(f"revision {requested_rv} compacted (oldest readable {compacted_rv})")
        self.requested_rv = requested_rv
        self.compacted_rv = compacted_rv


@dataclass(frozen=True)
class StoredEvent:
    """One persisted change of one object.

    Attributes:
        rv: resourceVersion of the write (global counter value).
        type: ``ADDED`` | ``MODIFIED`` | ``DELETED``.
        kind: the object's kind.
        obj: the object after the write; for ``DELETED`` the last stored state with ``rv``
            written into ``metadata.resourceVersion`` (watch-semantics.md §5.3).
        prev: the object before the write (``None`` for ``ADDED``); needed for selector
            transitions (§5.2).
        at: ``time.monotonic()`` of the write (seconds), for age-based history retention.
    """

    rv: int
    type: str
    kind: str
    obj: dict
    prev: dict | None
    at: float


class Storage:
    """Multi-version store keyed by (kind, key) with one global revision counter.

    Args:
        on_event: called under the lock with every :class:`StoredEvent`, in RV order (the
            watch cache hangs here).
        initial_rv: counter value before the first write. A real etcd is never at revision 0
            (bootstrap objects exist), and a list RV of "0" would mean "any" to a watch.
    """

    def __init__(self, on_event: Callable[[StoredEvent], None], initial_rv: int = 1) -> None:
        if initial_rv < 1:
            raise ValueError(f"initial_rv={initial_rv}: must be >= 1 (RV 0 means 'any' on the wire)")
        self.lock = threading.RLock()
        self._on_event = on_event
        self._rv = initial_rv
        self._compacted_rv = 0
        # kind -> key -> list of (rv, object or None for a deletion), oldest first
        self._versions: dict[str, dict[str, list[tuple[int, dict | None]]]] = {}
        self._current: dict[str, dict[str, dict]] = {}

    @property
    def rv(self) -> int:
        """Current revision (the value of the last write; ``initial_rv`` before any write)."""
        with self.lock:
            return self._rv

    @property
    def compacted_rv(self) -> int:
        """Revisions below this can no longer be read (0 = nothing compacted)."""
        with self.lock:
            return self._compacted_rv

    def bump(self, n: int = 1) -> int:
        """Advance the counter by ``n`` writes that concern no served kind; returns the new RV."""
        if n < 0:
            raise ValueError(f"bump_rv n={n}: must be >= 0")
        with self.lock:
            self._rv += n
            return self._rv

    def get(self, info: KindInfo, key: str) -> dict | None:
        """The current stored object (shared reference: do not mutate), or ``None``."""
        with self.lock:
            return self._current.get(info.kind, {}).get(key)

    def current(self, info: KindInfo) -> list[tuple[str, dict]]:
        """Current objects of ``info`` as ``(key, obj)`` sorted by key (etcd key order)."""
        with self.lock:
            return sorted(self._current.get(info.kind, {}).items())

    def state_at(self, info: KindInfo, rv: int) -> list[tuple[str, dict]]:
        """Objects of ``info`` as they were at revision ``rv``, sorted by key.

        Raises:
            Compacted: ``rv`` is older than the compaction point.
        """
        with self.lock:
            if rv < self._compacted_rv:
                raise Compacted(rv, self._compacted_rv)
            if rv >= self._rv:
                return self.current(info)
            out = []
            for key, versions in self._versions.get(info.kind, {}).items():
                found = None
                for vrv, obj in versions:
                    if vrv > rv:
                        break
                    found = obj
                if found is not None:
                    out.append((key, found))
            return sorted(out)

    def write(self, info: KindInfo, key: str, obj: dict | None, event_type: str) -> StoredEvent:
        """Persist ``obj`` (``None`` = delete) under a new revision and publish the event.

        ``obj`` must be a fresh dict owned by the storage from now on; its
        ``metadata.resourceVersion`` is set here.

        Raises:
            KeyError: delete of a key that does not exist.
        """
        with self.lock:
            prev = self._current.get(info.kind, {}).get(key)
            if obj is None and prev is None:
                raise KeyError(key)
            self._rv += 1
            rv = self._rv
            if obj is None:
                last = copy.deepcopy(prev)
                last.setdefault("metadata", {})["resourceVersion"] = str(rv)
                del self._current[info.kind][key]
                self._versions.setdefault(info.kind, {}).setdefault(key, []).append((rv, None))
                event = StoredEvent(rv, "DELETED", info.kind, last, prev, time.monotonic())
            else:
                obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
                self._current.setdefault(info.kind, {})[key] = obj
                self._versions.setdefault(info.kind, {}).setdefault(key, []).append((rv, obj))
                event = StoredEvent(rv, event_type, info.kind, obj, prev, time.monotonic())
            self._on_event(event)
            return event

    def compact(self, rv: int | None = None) -> int:
        """Forget every version older than what revision ``rv`` (default: now) needs.

        Afterwards reads (Exact lists, continue tokens) below ``rv`` raise :class:`Compacted`.
        Returns the compaction revision.
        """
        with self.lock:
            target = self._rv if rv is None else min(rv, self._rv)
            self._compacted_rv = max(self._compacted_rv, target)
            for kind_versions in self._versions.values():
                for key in list(kind_versions):
                    versions = kind_versions[key]
                    keep_from = 0
                    for i, (vrv, _obj) in enumerate(versions):
                        if vrv <= target:
                            keep_from = i
                    kept = versions[keep_from:]
                    if kept and kept[0][1] is None and kept[0][0] <= target:
                        kept = kept[1:]
                    if kept:
                        kind_versions[key] = kept
                    else:
                        del kind_versions[key]
            return self._compacted_rv
