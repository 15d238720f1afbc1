"""The list-watch loop for one kind: knows the Kubernetes protocol, nothing about SQL.

Modelled on client-go's Reflector (watch-semantics.md §11), avoiding the Python client's ``Watch``
pitfalls (§12): we frame the stream ourselves so that

- the resume point (``resume_rv``) advances only from a LIST's resourceVersion, a live event or a
  BOOKMARK — never from the unordered synthetic ADDED of an RV-less watch (we always LIST first);
- an ERROR event with code 410 leads to a relist (never a watch without RV, never a Status stored
  as an object); other ERROR codes back off and re-watch;
- a line that is not JSON, or an object the client's model rejects (a wrongly typed field), is sent
  to quarantine and the stream goes on — and since the resume point moves past it, it does not
  recur on reconnect;
- a silent connection is detected by a client-side read timeout (``read_timeout_s``);
- failures back off exponentially with jitter up to a cap, honouring ``Retry-After``.

Everything observed goes to a ``Sink`` (the recorder, which commits it and only then advances the
stored resume point). After 410 the relist is diffed against what the sink believes is alive —
including rows still in flight — to synthesise ``RELIST_DELETED`` (with the last known state),
``RELIST_MODIFIED`` and ``RELIST_ADDED``, and a coverage gap (from RV, to RV, times) is recorded.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol
from urllib.parse import urlencode

import kubernetes
import orjson
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3HTTPError, ReadTimeoutError

from collector.kube.discovery import KindSpec
from collector.timeutil import now_ns

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------
# What the reflector hands to its sink
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObservedEvent:
    """One object version to record: event type, the raw object, when we observed it (ns, UTC)."""

    event_type: str  # ADDED | MODIFIED | DELETED | RELIST_ADDED | RELIST_MODIFIED | RELIST_DELETED
    raw: dict[str, Any]
    observed_ns: int


@dataclass(frozen=True)
class KnownObject:
    """What the store (plus rows in flight) believes about a live object: its last version."""

    uid: str
    resource_version: str
    raw: dict[str, Any]


class Sink(Protocol):
    """Where a reflector sends what it observed; implemented by ``collector.kube.recorder``.

    Calls are ordered per kind: rows submitted before a resume point are committed before it.
    """

    def load_state(self, spec: KindSpec) -> tuple[str | None, dict[str, KnownObject]]:
        """The stored resume resourceVersion (None = never synced) and the live objects of ``spec``."""

    def submit_events(self, spec: KindSpec, events: list[ObservedEvent], resume_rv: str | None) -> None:
        """Record ``events``; after they are committed, store ``resume_rv`` (if not None)."""

    def submit_resume_point(self, spec: KindSpec, resume_rv: str) -> None:
        """Store ``resume_rv`` once everything submitted before it is committed (bookmarks)."""

    def submit_quarantine(self, spec: KindSpec, raw_text: str, reason: str, position: str | None) -> None:
        """Keep an unparseable line or object raw, with the reason."""

    def submit_synced(self, spec: KindSpec, list_rv: str, at_ns: int) -> None:
        """The kind is fully observed from ``at_ns`` on (after a LIST, or a successful resume)."""

    def submit_gap(self, spec: KindSpec, from_rv: str | None, reason: str, at_ns: int,
                   since_ns: int | None = None) -> None:
        """Events after ``from_rv`` may be lost (410 Gone) or were delivered late (a silent stream);
        a gap is open until the next sync. ``at_ns``: when it was noticed; ``since_ns``: the last
        instant the stream is known to have been complete, when the reflector knows it (else the
        sink takes its last commit or bookmark)."""

    def submit_contact_lost(self, spec: KindSpec, last_contact_ns: int | None) -> None:
        """The kind is out of contact with the API server since ``last_contact_ns`` (its requests
        fail or its stream went silent, with nothing seen since), or, with None, in contact again
        with nothing held back. Called on these transitions only; kept durably, so that after a
        crash the kind's coverage ends at that contact."""


# ------------------------------------------------------------------------------------------
# Settings and errors
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReflectorSettings:
    """Every time bound of the loop, named with its unit (kopf-style explicit settings).

    ``watch_timeout_s`` is the server-side ``timeoutSeconds`` (jittered up to 2x like client-go);
    ``read_timeout_s`` the client-side bound on a silent socket (must exceed the server's bookmark
    interval, ~60 s on a real API server); backoff is ``initial * 2**n`` capped at ``max``, with
    full jitter, reset after ``backoff_reset_s`` without failure. A resumed watch that stays open
    ``resume_confirm_s`` without an ERROR counts as synced (a too-old RV is refused at once).
    A kind whose requests have failed for ``unreachable_grace_s`` counts as unreachable (not ready).
    """

    list_page_size: int = 500
    watch_timeout_s: int = 300
    read_timeout_s: float = 75.0
    connect_timeout_s: float = 10.0
    backoff_initial_s: float = 0.8
    backoff_max_s: float = 30.0
    backoff_reset_s: float = 120.0
    batch_max_events: int = 500
    resume_confirm_s: float = 1.0
    unreachable_grace_s: float = 10.0


class _Expired(Exception):
    """The resume point is too old (410 Gone): relist."""


class _StreamError(Exception):
    """The watch ended abnormally (ERROR event other than 410, transport error)."""


@dataclass
class _Backoff:
    initial_s: float
    max_s: float
    reset_s: float
    attempt: int = 0
    last_failure: float = 0.0

    def next_delay(self, retry_after_s: float | None = None) -> float:
        now = time.monotonic()
        if self.last_failure and now - self.last_failure > self.reset_s:
            self.attempt = 0
        self.last_failure = now
        cap = min(self.max_s, self.initial_s * (2 ** self.attempt))
        self.attempt += 1
        delay = cap / 2 + random.uniform(0, cap / 2)
        return max(delay, retry_after_s or 0.0)

    def reset(self) -> None:
        self.attempt = 0


# ------------------------------------------------------------------------------------------
# The reflector
# ------------------------------------------------------------------------------------------


class Reflector:
    """List-watch loop for one ``KindSpec`` feeding a ``Sink``.

    Args:
        spec: the kind and the API version it is read in.
        api_client: the official ``kubernetes`` ApiClient (transport and auth).
        sink: where observations go (commits, resume points, quarantine, coverage).
        settings: time bounds and batch size.
        validate: checks that the client's model parses an object of this kind (``validate(obj)``);
            raises on a type mismatch.
        metrics: optional ``collector.metrics.WatchMetrics``.
        field_selector: optional server-side filter (e.g. ``spec.driver=gpu.nvidia.com`` for
            ResourceSlices). Objects leaving the selection arrive as DELETED (watch-semantics §5.2).
    """

    def __init__(self, spec: KindSpec, api_client: kubernetes.client.ApiClient, sink: Sink,
                 settings: ReflectorSettings | None = None, *,
                 validate: Callable[[dict], None] | None = None, metrics: Any = None,
                 field_selector: str | None = None) -> None:
        self.spec = spec
        self.field_selector = field_selector
        self.api = api_client
        self.sink = sink
        self.settings = settings or ReflectorSettings()
        self.validate = validate
        self.metrics = metrics
        self._event_counters: dict[str, Any] = {}
        self.stop_event = threading.Event()
        self.synced = threading.Event()
        self.in_gap = False
        self.resume_rv: str | None = None
        # Contact with the API server, ns UTC: the last response or stream chunk received, and,
        # while requests fail, since when (first failure) and the time of the last contact then.
        self.last_contact_ns: int | None = None
        self.failing_since_ns: int | None = None
        self.disconnected_since_ns: int | None = None
        self.last_failure: str | None = None
        self.known: dict[str, KnownObject] = {}
        self._backoff = _Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s, self.settings.backoff_reset_s)
        self._response: Any = None
        self._pending_rv: str | None = None
        self._relisting = False
        self._resume_refused = False
        self._confirm_lock = threading.Lock()
        # A stream found silent (read timeout), or requests failing (``_on_failure``): its last contact, until the resumed watch shows
        # whether changes were held back meanwhile (``_after_silence``); when the resumed watch was
        # answered; a gap opened for the replay, to close once the replayed changes are submitted
        # (a bookmark after them, or ``resume_confirm_s`` after the answer: ``_caught_up``).
        self._silent_since_ns: int | None = None
        self._silence_cause = ""  # what the gap's reason says made the stream late
        self._connected_ns = 0
        self._replay_gap_open = False
        self._caught_up = False

    # -- lifecycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to end; an open watch socket is shut down so a blocked read returns."""
        self.stop_event.set()
        resp = self._response
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # noqa: BLE001 - best effort, the socket may be gone already
                pass

    def run(self) -> None:
        """Run until ``stop()``: resume or list, then watch; relist on 410; back off on errors."""
        self.resume_rv, self.known = self.sink.load_state(self.spec)
        # Anything listed after we once had state is inferred from a relist, not a watch event.
        self._relisting = self.resume_rv is not None or bool(self.known)
        while not self.stop_event.is_set():
            try:
                if self.resume_rv is None:
                    self._list_and_sync()
                self._watch_once()
            except _Expired as exc:
                self._enter_gap(str(exc))
            except (_StreamError, ApiException, Urllib3HTTPError, OSError, ValueError) as exc:
                if self.stop_event.is_set():
                    break
                self._on_failure(exc)

    # -- LIST ----------------------------------------------------------------------------------

    def _list_and_sync(self) -> None:
        """Paged consistent LIST, diffed against what is known; then the kind counts as synced."""
        items, list_rv = self._list_all()
        observed = now_ns()
        listed: dict[str, dict] = {}
        events: list[ObservedEvent] = []
        for item in items:
            item.setdefault("apiVersion", self.spec.api_version)  # list items come without them (§2.1)
            item.setdefault("kind", self.spec.kind)
            uid = item.get("metadata", {}).get("uid")
            if not uid:
                continue
            if not self._acceptable(item, position=f"list@{list_rv}"):
                continue
            listed[uid] = item
            prior = self.known.get(uid)
            rv = item["metadata"].get("resourceVersion", "")
            if prior is None:
                events.append(ObservedEvent("RELIST_ADDED" if self._relisting else "ADDED", item, observed))
            elif prior.resource_version != rv:
                events.append(ObservedEvent("RELIST_MODIFIED", item, observed))
        for uid, prior in list(self.known.items()):
            if uid not in listed:
                events.append(ObservedEvent("RELIST_DELETED", prior.raw, observed))
        self._remember(events)
        for chunk_start in range(0, max(len(events), 1), self.settings.batch_max_events):
            chunk = events[chunk_start:chunk_start + self.settings.batch_max_events]
            last = chunk_start + self.settings.batch_max_events >= len(events)
            self.sink.submit_events(self.spec, chunk, list_rv if last else None)
        self.sink.submit_synced(self.spec, list_rv, observed)
        self.resume_rv = list_rv
        self.in_gap = False
        self._silent_since_ns = None  # complete as of the list: what the next watch sends is new
        self._relisting = True
        self.synced.set()
        if self.metrics:
            self.metrics.relists.labels(self.spec.kind).inc()
        log.info("%s: listed %d objects at resourceVersion %s (%d changes recorded)", self.spec.kind, len(items), list_rv, len(events))

    def _list_all(self) -> tuple[list[dict], str]:
        """All pages of one consistent snapshot; restart from scratch if a continue token expires."""
        while True:
            items: list[dict] = []
            token: str | None = None
            list_rv = ""
            try:
                while True:
                    query = {"limit": str(self.settings.list_page_size)}
                    if token:
                        query["continue"] = token
                    page = _loads(self._get(query, stream=False))
                    items.extend(page.get("items") or [])
                    meta = page.get("metadata") or {}
                    list_rv = list_rv or meta.get("resourceVersion", "")
                    token = meta.get("continue")
                    if not token:
                        return items, list_rv
            except ApiException as exc:
                if exc.status == 410 and token:
                    log.info("%s: continue token expired, restarting the list", self.spec.kind)
                    continue  # never use the inconsistent-continue token (watch-semantics §2.2)
                raise

    # -- WATCH ---------------------------------------------------------------------------------

    def _watch_once(self) -> None:
        """One WATCH from ``resume_rv`` until the stream ends; raises ``_Expired`` on 410."""
        timeout_s = int(self.settings.watch_timeout_s * (1 + random.random()))
        query = {"watch": "true", "resourceVersion": self.resume_rv, "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(timeout_s)}
        try:
            resp = self._get(query, stream=True)
        except ApiException as exc:
            if exc.status == 410:
                raise _Expired(f"HTTP 410 on watch from resourceVersion {self.resume_rv}") from None
            raise
        self._response = resp
        self.last_contact_ns = self._connected_ns = now_ns()  # the server answered: contact
        confirm = None
        if not self.synced.is_set():
            self._resume_refused = False
            # Resuming from a stored resume point: a too-old RV is refused with an ERROR event
            # *inside* the 200 stream, so the resume counts as synced only after a first
            # non-ERROR event, or once the stream has stayed open without one for a moment.
            confirm = threading.Timer(self.settings.resume_confirm_s, self._confirm_resume, args=(self.resume_rv,))
            confirm.daemon = True
            confirm.start()
        pending: list[ObservedEvent] = []
        position = 0
        try:
            for lines in _chunks_of_lines(resp):
                self.last_contact_ns = now_ns()
                for line in lines:
                    position += 1
                    if self.stop_event.is_set():
                        break
                    self._handle_line(line, position, pending)
                # The server flushes when its queue is empty, so a chunk boundary is a natural batch end.
                self._flush(pending)
                if self._replay_gap_open and (self._caught_up or now_ns() - self._connected_ns
                                              >= self.settings.resume_confirm_s * 1e9):
                    # The held-back changes are in — a bookmark came after them, or the burst the
                    # server sends at once has had its moment (a large one spans many reads): complete again.
                    self._replay_gap_open = False
                    self.sink.submit_synced(self.spec, self.resume_rv, now_ns())
                    self.in_gap = False
                if self.stop_event.is_set():
                    break
        except Urllib3HTTPError as exc:
            self._flush(pending)  # complete events before the failure are kept
            if isinstance(exc, ReadTimeoutError) and self._silent_since_ns is None:
                # Nothing for read_timeout_s, not even a bookmark (~1/min when asked for): a
                # half-open connection, most likely (watch-semantics §7). What changed after the
                # last contact is replayed by the resumed watch, late (``_after_silence``).
                self._lose_contact("watch stream silent (read timeout, a half-open connection?)")
            raise _StreamError(f"watch stream broke: {exc}") from None
        finally:
            if confirm is not None:
                confirm.cancel()
            self._response = None
            try:
                resp.release_conn()
            except Exception:  # noqa: BLE001
                pass
        if self._silent_since_ns is not None and not self.stop_event.is_set():
            # A stream that ended cleanly after the silence replayed nothing (one our stop shut
            # down says nothing: the contact stays lost, for ``observed_until_ns``).
            self._regain_contact()
        self._backoff.reset()

    def _handle_line(self, line: bytes, position: int, pending: list[ObservedEvent]) -> None:
        try:
            event = _loads(line)
            event_type = event["type"]
            obj = event["object"]
            if not isinstance(obj, dict):
                raise ValueError("event object is not a JSON object")
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            self._quarantine(line.decode("utf-8", "replace"), f"watch line is not a valid event: {exc}", f"watch@{self.resume_rv}+{position}")
            return
        if event_type != "ERROR":
            self._confirm_resume(self.resume_rv)
        if event_type == "ERROR":
            with self._confirm_lock:
                self._resume_refused = True
            self._flush(pending)
            code = obj.get("code")
            message = obj.get("message", "")
            if code == 410:
                raise _Expired(f"{obj.get('reason', 'Expired')}: {message}")
            raise _StreamError(f"ERROR event {code}: {message}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if self._silent_since_ns is not None:
            self._after_silence(event_type, pending)
        if event_type == "BOOKMARK":
            self._caught_up = True  # everything up to its resourceVersion has been sent
            self._flush(pending)
            if rv:
                self.resume_rv = rv
                self.sink.submit_resume_point(self.spec, rv)
            return
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            self._quarantine(line.decode("utf-8"), f"unknown watch event type {event_type!r}", f"watch@{self.resume_rv}+{position}")
            return
        if self.metrics:
            counter = self._event_counters.get(event_type)
            if counter is None:  # labels() costs a tuple build and a lock per call: keep the child
                counter = self._event_counters[event_type] = self.metrics.events.labels(self.spec.kind, event_type)
            counter.inc()
        if not self._acceptable(obj, position=f"watch@{self.resume_rv}+{position}"):
            if rv:  # move past the poison object so it does not recur on reconnect
                self._flush(pending)
                self.resume_rv = rv
                self.sink.submit_resume_point(self.spec, rv)
            return
        pending.append(ObservedEvent(event_type, obj, now_ns()))
        if rv:
            self.resume_rv = rv
            self._pending_rv = rv

    def _after_silence(self, event_type: str, pending: list[ObservedEvent]) -> None:
        """The first event of the watch resumed after a silent stream. Changes the server replays at
        once were made while we heard nothing: they are recorded when they arrive, but they happened
        at some unknown time since the last contact — a coverage gap from then until they are in
        (``_watch_once`` closes it after a bookmark, or ``resume_confirm_s`` after the answer). A
        bookmark first, or a change only after ``resume_confirm_s``, means nothing was held back: no
        gap (a quiet stream that timed out)."""
        since = self._silent_since_ns
        if event_type not in ("ADDED", "MODIFIED", "DELETED") or since is None \
                or now_ns() - self._connected_ns > self.settings.resume_confirm_s * 1e9:
            self._regain_contact()  # nothing was held back
            return
        self._silent_since_ns = None  # the gap opened below ends the kind's 'synced' coverage at ``since``
        self._flush(pending)
        self._caught_up = False
        log.warning("%s: the watch resumed after %s replays changes made since %s: coverage gap until they are "
                    "recorded", self.spec.kind, self._silence_cause, since)
        self._open_gap(f"{self._silence_cause}: changes made meanwhile were delivered late", since_ns=since)
        self._replay_gap_open = True

    def _confirm_resume(self, rv: str | None) -> None:
        """The server accepted our stored resume point: nothing was lost, the kind is synced."""
        with self._confirm_lock:
            if self.synced.is_set() or self._resume_refused or rv is None:
                return
            self.sink.submit_synced(self.spec, rv, now_ns())
            self.synced.set()

    def _flush(self, pending: list[ObservedEvent]) -> None:
        """Hand the pending events (or, if none were kept, the advanced resume point) to the sink."""
        if not pending:
            if self._pending_rv:
                self.sink.submit_resume_point(self.spec, self._pending_rv)
                self._pending_rv = None
            return
        batch = list(pending)
        pending.clear()
        self._remember(batch)
        self.sink.submit_events(self.spec, batch, self.resume_rv)
        self._pending_rv = None

    # -- helpers -------------------------------------------------------------------------------

    def _acceptable(self, obj: dict, position: str) -> bool:
        if self.validate is None:
            return True
        try:
            self.validate(obj)
            return True
        except Exception as exc:  # noqa: BLE001 - any model rejection is a reason to quarantine
            first = str(exc).strip().splitlines()
            reason = f"{self.spec.kind} ({self.spec.api_version}) does not parse with the client's model: {' '.join(first[:3])}"
            self._quarantine(json.dumps(obj, ensure_ascii=False, separators=(",", ":")), reason, position)
            return False

    def _remember(self, events: list[ObservedEvent]) -> None:
        for ev in events:
            meta = ev.raw.get("metadata") or {}
            uid = meta.get("uid")
            if not uid:
                continue
            if ev.event_type in ("DELETED", "RELIST_DELETED"):
                self.known.pop(uid, None)
            else:
                self.known[uid] = KnownObject(uid, meta.get("resourceVersion", ""), ev.raw)

    def _quarantine(self, raw_text: str, reason: str, position: str | None) -> None:
        log.warning("%s: quarantined input at %s: %s", self.spec.kind, position, reason)
        if self.metrics:
            self.metrics.quarantined.labels(self.spec.kind).inc()
        self.sink.submit_quarantine(self.spec, raw_text, reason, position)

    def _enter_gap(self, reason: str) -> None:
        log.warning("%s: %s — relisting; events after resourceVersion %s may be lost", self.spec.kind, reason, self.resume_rv)
        self._open_gap(reason)
        self.resume_rv = None

    def _open_gap(self, reason: str, since_ns: int | None = None) -> None:
        """Record a coverage gap from ``resume_rv`` (once while one is open; ``Sink.submit_gap``)."""
        if not self.in_gap:
            self.sink.submit_gap(self.spec, self.resume_rv, reason, now_ns(), since_ns=since_ns)
            if self.metrics:
                self.metrics.gaps.labels(self.spec.kind).inc()
        self.in_gap = True

    def unreachable_since_ns(self, at_ns: int) -> int | None:
        """The last contact with the API server (ns UTC) if requests have failed for longer than
        ``unreachable_grace_s`` at ``at_ns``; else None. A dropped stream that reconnects at once is
        not an outage; an API server down, unreachable or refusing us (401/403/5xx) is."""
        if self.failing_since_ns is None or at_ns - self.failing_since_ns < self.settings.unreachable_grace_s * 1e9:
            return None
        return self.disconnected_since_ns

    def observed_until_ns(self, at_ns: int) -> int | None:
        """Until when this kind is known observed, for a stop at ``at_ns``; None: until ``at_ns``.
        Requests failing (or the stream found silent) since the last contact, with the resumed
        watch not yet showing whether changes were held back (``_after_silence``): that contact,
        whatever the outage's length — a change the server made meanwhile was never seen (a final
        breaker's finding: a stop 2 s into a 503 outage left a claim created in it inside
        "synced" coverage). Else ``unreachable_since_ns``."""
        since = self._silent_since_ns
        return since if since is not None else self.unreachable_since_ns(at_ns)

    def _on_failure(self, exc: Exception) -> None:
        retry_after = None
        if isinstance(exc, ApiException) and exc.status == 429:
            retry_after = _retry_after_s(exc)
        delay = self._backoff.next_delay(retry_after)
        if self.metrics:
            self.metrics.reconnects.labels(self.spec.kind).inc()
        if self.failing_since_ns is None:
            self.failing_since_ns = now_ns()
            self.disconnected_since_ns = self.last_contact_ns or self.failing_since_ns
        if self.synced.is_set() and self.resume_rv is not None and self._silent_since_ns is None:
            # The watch resumes from resume_rv once the server answers again, and replays at once
            # what changed since the last contact — late, as after a silent stream: the same
            # coverage gap then (``_after_silence``). A 5xx, a reset or a refused connection lasting
            # seconds while a claim moved to another GPU was "synced" throughout, and its
            # transactions were attributed exact to the GPU it had left (a DRA breaker's finding).
            cause = f"HTTP {exc.status}" if isinstance(exc, ApiException) else type(exc).__name__
            self._lose_contact(f"requests to the API server failed ({cause})")
        self.last_failure = _describe(exc, self.spec)
        log.warning("%s: %s; retrying in %.1f s", self.spec.kind, self.last_failure, delay)
        self.stop_event.wait(delay)

    def _lose_contact(self, cause: str) -> None:
        """Out of contact since ``last_contact_ns`` (requests failing, or the stream found silent):
        what changed since is not seen until the resumed watch replays it (``_after_silence``).
        The sink keeps that contact durably (``Sink.submit_contact_lost``), once per outage, not
        per failed retry: a crash during the outage then ends the kind's 'synced' coverage there,
        not at the run's last sign of life, which the other kinds' bookmarks keep moving."""
        if self.last_contact_ns is None:
            return
        self._silent_since_ns = self.last_contact_ns
        self._silence_cause = cause
        self.sink.submit_contact_lost(self.spec, self._silent_since_ns)

    def _regain_contact(self) -> None:
        """In contact again and nothing was held back (``_lose_contact`` undone, at the sink too)."""
        self._silent_since_ns = None
        self.sink.submit_contact_lost(self.spec, None)

    def _get(self, query: dict[str, str | None], *, stream: bool):
        """GET the collection through the official client's transport; raw bytes, no models."""
        params = {k: v for k, v in query.items() if v is not None}
        if self.field_selector:
            params["fieldSelector"] = self.field_selector
        path = self.spec.collection_path
        url = self.api.configuration.host + path + "?" + urlencode(params)
        headers = {"Accept": "application/json", "User-Agent": self.api.user_agent}
        self.api.update_params_for_auth(headers, [], ["BearerToken"], path, "GET", None)
        rest = self.api.call_api("GET", url, header_params=headers,
                                 _request_timeout=(self.settings.connect_timeout_s, self.settings.read_timeout_s))
        resp = rest.response
        if 200 <= resp.status < 300:  # observing again (a 503 or 403 answer is not observation)
            self.last_contact_ns = now_ns()
            self.failing_since_ns = self.disconnected_since_ns = None
        else:
            body = resp.read()
            resp.release_conn()
            exc = _api_exception(resp, body)
            exc.verb = "watch" if stream else "list"  # for the message (_describe)
            raise exc
        if stream:
            return resp
        data = resp.read()
        resp.release_conn()
        return data


def _api_exception(resp: Any, body: bytes) -> ApiException:
    exc = ApiException(status=resp.status, reason=resp.reason)
    exc.body = body.decode("utf-8", "replace")
    exc.headers = resp.headers
    return exc


def _retry_after_s(exc: ApiException) -> float | None:
    try:
        value = (exc.headers or {}).get("Retry-After")
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


# The ClusterRole granting the watcher its reads (deploy/base/rbac.yaml).
WATCHER_CLUSTER_ROLE = "draudit-watcher"


def _describe(exc: Exception, spec: KindSpec | None = None) -> str:
    """One line for the log and readiness: the HTTP status, the message of the API server's Status
    body (a 403 says which user may not do what), and for 401/403 what to check."""
    if not isinstance(exc, ApiException):
        return f"{type(exc).__name__}: {exc}"
    text = f"HTTP {exc.status} {exc.reason or ''}".strip()
    message = _status_message(exc.body)
    if message:
        text += f": {message}"
    verb = getattr(exc, "verb", None) or "list/watch"
    if exc.status == 403 and spec is not None:
        group = f"API group {spec.group!r}" if spec.group else 'core API group ""'
        text += (f" — the collector may not {verb} {spec.plural} ({group}, all namespaces): check that ClusterRole "
                 f"{WATCHER_CLUSTER_ROLE} grants get, list, watch on {spec.plural} and that ClusterRoleBinding "
                 f"{WATCHER_CLUSTER_ROLE} binds it to the collector's service account (deploy/base/rbac.yaml)")
    elif exc.status == 401:
        text += (" — the API server did not accept the collector's credentials (service account token or "
                 "kubeconfig user)")
    return text


def _status_message(body: Any) -> str | None:
    """The ``message`` of a ``Status`` body, else the body's first line (a proxy's text), at most
    300 characters; None when empty."""
    if not body:
        return None
    raw = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    try:
        doc = json.loads(raw)
        message = doc.get("message") if isinstance(doc, dict) else None
    except ValueError:
        message = None
    if not isinstance(message, str) or not message.strip():
        message = next((line for line in raw.splitlines() if line.strip()), "")
    message = " ".join(message.split())
    return (message[:297] + "...") if len(message) > 300 else (message or None)


_LONG_DIGIT_RUN = re.compile(rb"[0-9]{19}")


def _loads(line: bytes) -> Any:
    """Decode one JSON document (a watch line, a list page; UTF-8).

    orjson first (several times faster on a busy stream), except where it would read differently
    from the standard library: it turns integers beyond 64 bits into floats, so a line with a run
    of 19+ digits goes to ``json`` (exact integers); and what orjson refuses but ``json`` accepts
    (``NaN``, lone surrogate escapes) goes there too. The value stored never depends on the path.

    Raises:
        UnicodeDecodeError, ValueError: the line is not UTF-8 or not JSON.
    """
    if _LONG_DIGIT_RUN.search(line):
        return json.loads(line.decode("utf-8"))
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line.decode("utf-8"))


def _chunks_of_lines(resp: Any):
    """Yield, per piece read from the chunked body, the complete ``\n``-terminated lines in it.

    Events may span chunks and a chunk may hold several events; bytes are joined before decoding,
    so a multi-byte UTF-8 character split across chunks arrives intact. A trailing partial line at
    connection loss is dropped (urllib3 raises ProtocolError, which the caller handles).
    """
    buffer = b""
    for piece in resp.stream(amt=65536, decode_content=False):
        if not piece:
            continue
        buffer += piece
        if b"\n" not in piece:
            continue
        *complete, buffer = buffer.split(b"\n")
        yield [line for line in complete if line.strip()]
