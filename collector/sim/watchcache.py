"""The sim's watch cache: per-kind event history, open watchers and their buffers.

Rules mirrored (watch-semantics.md §5, §6.3, §9; apiserver ``cacher/watch_cache.go`` and
``cache_watcher.go``):

* Each kind keeps a bounded ring of recent events (``history_limit`` events and optionally
  ``history_max_age_s`` seconds). A watch from RV=N replays every held event with RV > N; if N
  is older than the ring holds the watch gets one ERROR/410 "too old resource version: N (M)",
  M being the newest RV that fell out of the ring (``oldest - 1`` in the real cache).
* A selector is evaluated on the old and the new object: entering the selection is ADDED,
  leaving it is DELETED carrying the previous content with the new RV (§5.2).
* Every watcher has its own buffer, so a slow consumer never blocks writers; a watcher whose
  buffer of live events is full is closed ("forcing watcher close due to unresponsiveness"),
  and bookmarks are dropped rather than queued when the buffer is full.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from collector.sim.kinds import KindInfo
from collector.sim.selectors import Filter
from collector.sim.storage import StoredEvent

#: Annotation on the bookmark that ends the initial events of a streaming list (§10).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class TooOldResourceVersion(Exception):
    """A watch start RV older than the history holds.

    Attributes:
        requested_rv: the watch's ``resourceVersion``.
        oldest_rv: M in "too old resource version: N (M)".
    """

    def __init__(self, requested_rv: int, oldest_rv: int) -> None:
        super().__init__(f"too old resource version: {requested_rv} ({oldest_rv})")
        self.requested_rv = requested_rv
        self.oldest_rv = oldest_rv


@dataclass
class WatchItem:
    """One thing a watch stream will write.

    ``type`` is ``ADDED`` | ``MODIFIED`` | ``DELETED`` (``obj`` = stored v1 object),
    ``BOOKMARK`` (``rv`` and optional ``annotations``) or ``ERROR`` (``obj`` = Status).
    """

    type: str
    obj: dict | None = None
    rv: int = 0
    annotations: dict | None = None


def transition(filt: Filter, ev: StoredEvent) -> WatchItem | None:
    """What a watcher with ``filt`` sees of ``ev`` (None = nothing), per watch-semantics.md §5.2."""
    if ev.type == "DELETED":
        return WatchItem("DELETED", ev.obj) if filt.matches(ev.obj) else None
    old_in = filt.matches(ev.prev)
    new_in = filt.matches(ev.obj)
    if new_in and not old_in:
        return WatchItem("ADDED", ev.obj)
    if new_in and old_in:
        return WatchItem("MODIFIED" if ev.type == "MODIFIED" else ev.type, ev.obj)
    if old_in and not new_in:
        left = copy.deepcopy(ev.prev)
        left.setdefault("metadata", {})["resourceVersion"] = str(ev.rv)
        return WatchItem("DELETED", left)
    return None


_ids = itertools.count(1)


@dataclass(eq=False)
class Watcher:
    """One open watch: its filter, served version and buffer.

    Attributes:
        info: kind watched.
        version: served API version of the request path.
        filt: namespace + selectors.
        allow_bookmarks: the client sent ``allowWatchBookmarks=true``.
        deadline: ``time.monotonic()`` at which the stream ends cleanly.
        buffer_size: live events the buffer may hold before the watcher is evicted.
    """

    info: KindInfo
    version: str
    filt: Filter
    allow_bookmarks: bool
    deadline: float
    buffer_size: int
    id: int = field(default_factory=lambda: next(_ids))
    items: deque = field(default_factory=deque)
    closed: bool = False
    close_reason: str = ""
    cond: threading.Condition = field(default_factory=threading.Condition)

    def push(self, item: WatchItem, live: bool = True) -> None:
        """Queue ``item``; a full buffer evicts the watcher (live events) or drops a bookmark."""
        with self.cond:
            if self.closed:
                return
            if live and len(self.items) >= self.buffer_size:
                if item.type == "BOOKMARK":
                    return
                self.closed = True
                self.close_reason = "unresponsive"
                self.items.clear()
            else:
                self.items.append(item)
            self.cond.notify_all()

    def close(self, reason: str) -> None:
        """End the stream cleanly as soon as the writer notices; pending items are dropped."""
        with self.cond:
            if not self.closed:
                self.closed = True
                self.close_reason = reason
                self.items.clear()
            self.cond.notify_all()

    def take(self, timeout_s: float) -> list[WatchItem]:
        """All pending items (possibly empty after ``timeout_s`` seconds or when closed)."""
        with self.cond:
            if not self.items and not self.closed and timeout_s > 0:
                self.cond.wait(timeout_s)
            out = list(self.items)
            self.items.clear()
            return out


class WatchCache:
    """Per-kind history rings and the registry of open watchers.

    Args:
        lock: the storage lock (registration and dispatch must be atomic with writes).
        current_rv: returns the storage's current RV (for bookmarks).
        history_limit: events kept per kind.
        history_max_age_s: events older than this (seconds) are dropped too (None = no limit).
    """

    def __init__(
        self,
        lock: threading.RLock,
        current_rv: Callable[[], int],
        history_limit: int,
        history_max_age_s: float | None = None,
    ) -> None:
        if history_limit < 1:
            raise ValueError(f"history_limit={history_limit}: must be >= 1")
        self.lock = lock
        self._current_rv = current_rv
        self.history_limit = history_limit
        self.history_max_age_s = history_max_age_s
        self._history: dict[str, deque[StoredEvent]] = {}
        self._start_rv: dict[str, int] = {}  # events with rv > start are all held
        self._base_rv = 0
        self._watchers: set[Watcher] = set()

    # --- history -------------------------------------------------------------------------
    def _prune(self, kind: str) -> None:
        ring = self._history.get(kind)
        if not ring:
            return
        while len(ring) > self.history_limit:
            self._start_rv[kind] = ring.popleft().rv
        if self.history_max_age_s is not None:
            cutoff = time.monotonic() - self.history_max_age_s
            while ring and ring[0].at < cutoff:
                self._start_rv[kind] = ring.popleft().rv

    def on_event(self, ev: StoredEvent) -> None:
        """Storage hook (called under the lock): remember ``ev`` and hand it to matching watchers."""
        self._history.setdefault(ev.kind, deque()).append(ev)
        self._prune(ev.kind)
        for w in list(self._watchers):
            if w.info.kind == ev.kind:
                item = transition(w.filt, ev)
                if item is not None:
                    w.push(item)

    def oldest_rv(self, kind: str) -> int:
        """Every event of ``kind`` with an RV above this value is still held."""
        with self.lock:
            self._prune(kind)
            return self._start_rv.get(kind, self._base_rv)

    def events_since(self, kind: str, rv: int) -> list[StoredEvent]:
        """Held events of ``kind`` with RV > ``rv``, in RV order.

        Raises:
            TooOldResourceVersion: ``rv`` is older than the history holds.
        """
        with self.lock:
            oldest = self.oldest_rv(kind)
            if rv < oldest:
                raise TooOldResourceVersion(rv, oldest)
            return [ev for ev in self._history.get(kind, ()) if ev.rv > rv]

    def forget(self, rv: int) -> None:
        """Drop all history: only watches from ``rv`` or later can resume (compaction/restart)."""
        with self.lock:
            self._history.clear()
            self._start_rv.clear()
            self._base_rv = rv

    # --- watchers ------------------------------------------------------------------------
    def register(self, w: Watcher, initial: list[WatchItem]) -> None:
        """Add ``w`` with its initial items (synthetic ADDED or replayed history) queued first."""
        with self.lock:
            with w.cond:
                w.items.extend(initial)
            self._watchers.add(w)

    def unregister(self, w: Watcher) -> None:
        with self.lock:
            self._watchers.discard(w)

    def watchers(self, kind: str | None = None) -> list[Watcher]:
        with self.lock:
            return [w for w in self._watchers if kind is None or w.info.kind == kind]

    def bookmark(self, w: Watcher, annotations: dict | None = None) -> None:
        """Queue a BOOKMARK at the current RV for ``w`` (all its events up to there are queued)."""
        with self.lock:
            w.push(WatchItem("BOOKMARK", rv=self._current_rv(), annotations=annotations))

    def close_all(self, reason: str) -> int:
        """Close every open watcher cleanly; returns how many were closed."""
        with self.lock:
            ws = list(self._watchers)
            for w in ws:
                w.close(reason)
            self._watchers.clear()
            return len(ws)
