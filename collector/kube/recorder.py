"""The store side of the watcher: one writer thread that commits what the reflectors observed.

The reflectors (protocol, no SQL) submit operations to one ordered queue; the writer drains it in
batches and, per transaction, inserts object versions (replays absorbed by the unique key), appends
their ledger entries, updates the projections, records quarantine and coverage, and only then
stores each kind's resume resourceVersion. So the resume point never runs ahead of committed rows,
and a crash at any moment loses nothing the server will not send again on resume.

One writer also suits SQLite (one write transaction at a time) and makes leader fencing simple:
before every commit the writer asks ``fence()`` whether this replica still holds the Lease, and
rolls back otherwise.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import psycopg
from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from collector.kube.discovery import KindSpec
from collector.kube.projections import apply_versions
from collector.kube.reflector import KnownObject, ObservedEvent
from collector.store import ledger
from collector.store.bulk import core_bind, pg_copy_insert, pg_next_ids, sqlite_insert_new
from collector.store.canonical import canonical_json, sha256_hex
from collector.store.models import CoverageInterval, ObjectVersion, Quarantine, WatchState
from collector.timeutil import dt_to_ns, ns_to_dt, now_ns

log = logging.getLogger(__name__)

DELETED_TYPES = ("DELETED", "RELIST_DELETED")
_VERSION_KEY = ["cluster", "kind", "uid", "resource_version", "event_type"]
_VERSION_COLUMNS = ("cluster", "api_group", "api_version", "kind", "namespace", "name", "uid", "resource_version",
                    "event_type", "observed_at", "raw", "content_hash")


class _ReplayedVersion(Exception):
    """A version in the batch is already stored: commit the batch again through the replay-safe path."""


def _pg_copy_versions(s: Session, values: list[tuple], replays_possible: bool) -> list[tuple]:
    """PostgreSQL: insert ``object_versions`` rows (tuples in ``_VERSION_COLUMNS`` order); returns
    ``(id, uid, resource_version, event_type)`` of the rows inserted.

    A replay (a key already stored) is rare: the resume point is committed with the rows. So the
    rows are COPYed straight into the table with ids drawn from its sequence, with no savepoint
    (two round trips per batch saved); if a key is already there the unique index refuses the COPY,
    the transaction is rolled back (``_ReplayedVersion``) and the recorder commits the same batch
    again with ``replays_possible``: through ``pg_copy_insert`` (staging table,
    ``ON CONFLICT DO NOTHING``), which skips the replays. Same rows either way, half the work.

    Raises:
        _ReplayedVersion: a key is already stored (only when not ``replays_possible``).
    """
    if replays_possible:
        return pg_copy_insert(s, "object_versions", _VERSION_COLUMNS, values, _VERSION_KEY,
                              ("id", "uid", "resource_version", "event_type"))
    ids = pg_next_ids(s, "object_versions", len(values))
    try:
        with s.connection().connection.driver_connection.cursor() as cur:
            with cur.copy(f"COPY object_versions (id, {', '.join(_VERSION_COLUMNS)}) FROM STDIN") as copy:
                for new_id, row in zip(ids, values):
                    copy.write_row((new_id, *row))
    except psycopg.errors.UniqueViolation:
        raise _ReplayedVersion() from None
    uid_at, rv_at, type_at = (_VERSION_COLUMNS.index(c) for c in ("uid", "resource_version", "event_type"))
    return [(new_id, row[uid_at], row[rv_at], row[type_at]) for new_id, row in zip(ids, values)]


_SQLITE_INSERT_VERSIONS = (f"INSERT INTO object_versions ({', '.join(_VERSION_COLUMNS)}) "
                           f"VALUES ({', '.join('?' for _ in _VERSION_COLUMNS)}) "
                           f"ON CONFLICT ({', '.join(_VERSION_KEY)}) DO NOTHING")


def _sqlite_insert_versions(s: Session, values: list[tuple]) -> list[tuple]:
    """SQLite: insert ``object_versions`` rows (tuples in ``_VERSION_COLUMNS`` order, ``raw`` as its
    JSON text); returns ``(id, uid, resource_version, event_type)`` of the rows inserted (replays
    skipped by ``ON CONFLICT DO NOTHING``).

    Through ``bulk.sqlite_insert_new``: Core compiled the dialect insert again for every batch,
    most of the recorder's CPU under a steady event rate, where batches are small.
    """
    conn = s.connection()
    at = _VERSION_COLUMNS.index("observed_at")
    bind_at = core_bind(ObjectVersion.__table__.c.observed_at, conn.dialect)  # the text Core would store
    values = [(*v[:at], bind_at(v[at]), *v[at + 1:]) for v in values]
    return sqlite_insert_new(s, "object_versions", _SQLITE_INSERT_VERSIONS, values,
                             ("id", "uid", "resource_version", "event_type"))


@dataclass
class _Op:
    kind: str  # events | resume | quarantine | synced | gap | contact | barrier
    spec: KindSpec | None
    payload: Any = None
    resume_rv: str | None = None
    done: threading.Event | None = None


@dataclass
class KindStatus:
    """What has been committed for one kind: resume point, coverage state, counters."""

    resume_rv: str | None = None
    state: str = "unknown"  # synced | gap | stopped | unknown
    rows: int = 0
    quarantined: int = 0


class FencedOut(Exception):
    """This replica lost the Lease: nothing may be committed any more."""


_UNREAD = object()


class Recorder:
    """Single-writer sink for every reflector of one cluster.

    Args:
        session_factory: sessions on the migrated store.
        cluster: the cluster name stamped on every row.
        fence: called right before each commit; False means "not the leader" → roll back.
        metrics: optional ``collector.metrics.WatchMetrics``.
        batch_max_events: events per transaction at most.
        retry_delay_s: wait after a failed commit before retrying the same operations.
        silence_bound_s: the reflectors' read timeout (``ReflectorSettings.read_timeout_s``): a
            stream silent that long is noticed by a live process. After a crash each kind is taken as
            observed until its own last commit or bookmark, but no earlier than this before the run
            was last seen alive (``_previous_run_alive_ns``); None: until then, every kind alike.
    """

    def __init__(self, session_factory: sessionmaker[Session], cluster: str, *, fence: Callable[[], bool] | None = None,
                 metrics: Any = None, batch_max_events: int = 5_000, retry_delay_s: float = 1.0,
                 queue_max: int = 100_000, silence_bound_s: float | None = None) -> None:
        self.sessions = session_factory
        self.cluster = cluster
        self.fence = fence
        self.metrics = metrics
        self.batch_max_events = batch_max_events
        self.retry_delay_s = retry_delay_s
        self.silence_bound_ns = None if silence_bound_s is None else int(silence_bound_s * 1e9)
        self.queue: queue.Queue[_Op] = queue.Queue(maxsize=queue_max)
        self.status: dict[str, KindStatus] = {}
        self.fenced_out = threading.Event()
        self.last_error: str | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._status_lock = threading.Lock()
        self._previous_alive_ns: Any = _UNREAD  # read in this run's first transaction
        self._states_committed: set[str] = set()  # kinds whose coverage state this run has committed

    # -- Sink interface (called from reflector threads) -----------------------------------------

    def load_state(self, spec: KindSpec) -> tuple[str | None, dict[str, KnownObject]]:
        """The stored resume point and the live objects (latest version not deleted) of ``spec.kind``."""
        with self.sessions() as s:
            state = s.get(WatchState, (self.cluster, spec.kind))
            latest = (select(func.max(ObjectVersion.id)).where(ObjectVersion.cluster == self.cluster, ObjectVersion.kind == spec.kind)
                      .group_by(ObjectVersion.uid))
            rows = s.execute(select(ObjectVersion.uid, ObjectVersion.resource_version, ObjectVersion.event_type, ObjectVersion.raw)
                             .where(ObjectVersion.id.in_(latest))).all()
        known = {uid: KnownObject(uid, rv, raw) for uid, rv, et, raw in rows if et not in DELETED_TYPES}
        with self._status_lock:
            st = self.status.setdefault(spec.kind, KindStatus())
            st.resume_rv = state.resource_version if state else None
            st.state = state.state if state else "unknown"
        return (state.resource_version if state else None), known

    def submit_events(self, spec: KindSpec, events: list[ObservedEvent], resume_rv: str | None) -> None:
        self._put(_Op("events", spec, events, resume_rv))

    def submit_resume_point(self, spec: KindSpec, resume_rv: str) -> None:
        self._put(_Op("resume", spec, None, resume_rv))

    def submit_quarantine(self, spec: KindSpec, raw_text: str, reason: str, position: str | None) -> None:
        self._put(_Op("quarantine", spec, (raw_text, reason, position)))

    def submit_synced(self, spec: KindSpec, list_rv: str, at_ns: int) -> None:
        self._put(_Op("synced", spec, at_ns, list_rv))

    def submit_gap(self, spec: KindSpec, from_rv: str | None, reason: str, at_ns: int,
                   since_ns: int | None = None) -> None:
        self._put(_Op("gap", spec, (reason, at_ns, since_ns), from_rv))

    def submit_contact_lost(self, spec: KindSpec, last_contact_ns: int | None) -> None:
        """``spec.kind`` is out of contact with the API server since ``last_contact_ns`` (ns UTC:
        its requests fail or its stream went silent), or, with None, in contact again with nothing
        held back. Stored as ``WatchState.observed_until_ns`` (one UPDATE, in order with the other
        operations of the kind), so that a crash during the outage ends the kind's 'synced'
        coverage at that contact, not at the run's last sign of life (``_mark_synced``). Called on
        the transitions only, not per failed retry (``Reflector._lose_contact``)."""
        self._put(_Op("contact", spec, last_contact_ns))

    def _put(self, op: _Op) -> None:
        if self.fenced_out.is_set():
            return
        self.queue.put(op)
        if self.metrics:
            self.metrics.queue_depth.set(self.queue.qsize())

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread."""
        self._thread = threading.Thread(target=self._run, name="draudit-recorder", daemon=True)
        self._thread.start()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything submitted so far is committed; False on timeout or fencing."""
        done = threading.Event()
        self._put(_Op("barrier", None, done=done))
        return done.wait(timeout_s) and not self.fenced_out.is_set()

    def stop(self, timeout_s: float = 10.0, observed_until_ns: dict[str, int] | None = None) -> None:
        """Commit what is queued, close open 'synced' coverage intervals, stop the thread.

        ``observed_until_ns``: per kind, the last contact with the API server (ns UTC) of a kind
        that was unreachable at the stop: its interval ends there, not at the stop (what changed
        in between was not seen, and a later run may not be able to replay it).
        """
        if self._thread is None:
            return
        self.flush(timeout_s)
        self._stop.set()
        self._thread.join(timeout_s)
        if not self.fenced_out.is_set():
            self._close_coverage(now_ns(), observed_until_ns or {})

    def kind_status(self, kind: str) -> KindStatus:
        with self._status_lock:
            st = self.status.get(kind) or KindStatus()
            return KindStatus(st.resume_rv, st.state, st.rows, st.quarantined)

    # -- the writer -----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                first = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            ops = [first]
            n_events = len(first.payload) if first.kind == "events" else 0
            while n_events < self.batch_max_events:
                try:
                    op = self.queue.get_nowait()
                except queue.Empty:
                    break
                ops.append(op)
                if op.kind == "events":
                    n_events += len(op.payload)
            self._commit_with_retry(ops)
            if self.metrics:
                self.metrics.queue_depth.set(self.queue.qsize())

    def _commit_with_retry(self, ops: list[_Op]) -> None:
        replays_possible = False
        while not self.fenced_out.is_set():
            first = self._previous_alive_ns is _UNREAD
            try:
                try:
                    self._commit(ops, replays_possible)
                except BaseException:
                    if first:  # rolled back: the next attempt reads (and freezes) the previous run's rows again
                        self._previous_alive_ns = _UNREAD
                    raise
                self.last_error = None
                break
            except _ReplayedVersion:  # rolled back; at once again, skipping the versions already stored
                replays_possible = True
            except FencedOut:
                log.error("lost the leader Lease: stopped writing (nothing after the last commit was stored)")
                self.fenced_out.set()
                break
            except Exception as exc:  # noqa: BLE001 - a database error must not kill the writer
                self.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                log.warning("commit failed (%s); retrying in %.1f s", self.last_error, self.retry_delay_s)
                if self._stop.wait(self.retry_delay_s):
                    break
        for op in ops:
            if op.done is not None:
                op.done.set()

    def _commit(self, ops: list[_Op], replays_possible: bool = False) -> None:
        committed_rv: dict[str, str] = {}
        states: dict[str, str] = {}
        counts: dict[str, list[int]] = {}
        lag_ns: list[int] = []
        new_versions: list[dict] = []
        # A reflector submits each chunk of its stream as it arrives (a few events under a steady
        # rate): the events of one kind are inserted together, one statement per kind and
        # transaction, in the order they were submitted.
        events: dict[str, tuple[KindSpec, list[ObservedEvent]]] = {}
        with self.sessions() as s:
            with s.begin():
                if self._previous_alive_ns is _UNREAD:  # before this run's first write changes a row
                    self._previous_alive_ns = self._read_previous_run_alive_ns(s)
                    self._freeze_previous_run(s)
                for op in ops:
                    if op.kind == "barrier":
                        continue
                    kind = op.spec.kind
                    c = counts.setdefault(kind, [0, 0])
                    if op.kind == "events":
                        events.setdefault(kind, (op.spec, []))[1].extend(op.payload)
                        lag_ns.extend(ev.observed_ns for ev in op.payload)
                    elif op.kind == "quarantine":
                        self._insert_quarantine(s, op.spec, *op.payload)
                        c[1] += 1
                    elif op.kind == "synced":
                        self._mark_synced(s, op.spec, op.payload, op.resume_rv)
                        states[kind] = "synced"
                    elif op.kind == "gap":
                        self._mark_gap(s, op.spec, op.resume_rv, *op.payload)
                        states[kind] = "gap"
                    elif op.kind == "contact":
                        self._mark_contact(s, kind, op.payload)
                    if op.resume_rv is not None and op.kind in ("events", "resume", "synced"):
                        committed_rv[kind] = op.resume_rv
                for kind, (spec, kind_events) in events.items():
                    rows = self._insert_versions(s, spec, kind_events, replays_possible)
                    new_versions.extend(rows)
                    counts[kind][0] += len(rows)
                # One ledger append and one projection pass per transaction (in id order, which is
                # the order the events arrived per object), not one per submitted batch.
                if new_versions:
                    ledger.append(s, "object_versions", new_versions)
                    apply_versions(s, new_versions, just_inserted=True)
                for kind, rv in committed_rv.items():
                    self._store_resume_point(s, kind, rv)
                if self.fence is not None and not self.fence():
                    raise FencedOut()
        now = now_ns()
        with self._status_lock:
            for kind, rv in committed_rv.items():
                self.status.setdefault(kind, KindStatus()).resume_rv = rv
            for kind, state in states.items():
                self.status.setdefault(kind, KindStatus()).state = state
            self._states_committed.update(states)
            for kind, (rows, quarantined) in counts.items():
                st = self.status.setdefault(kind, KindStatus())
                st.rows += rows
                st.quarantined += quarantined
        if self.metrics:
            for observed in lag_ns:
                self.metrics.commit_lag.observe((now - observed) / 1e9)

    # -- SQL -----------------------------------------------------------------------------------

    def _insert_versions(self, s: Session, spec: KindSpec, events: list[ObservedEvent],
                         replays_possible: bool = True) -> list[dict]:
        """Insert the versions (replays absorbed); returns the rows actually inserted, with ids.

        Raises:
            _ReplayedVersion: PostgreSQL, a version is already stored and not ``replays_possible``.
        """
        rows = []
        raw_texts = []  # canonical JSON of each raw object, serialised once: hashed, and COPYed on PostgreSQL
        for ev in events:
            meta = ev.raw.get("metadata") or {}
            api_version = ev.raw.get("apiVersion") or spec.api_version
            group, _, version = api_version.rpartition("/")
            raw_json = canonical_json(ev.raw)
            raw_texts.append(raw_json)
            rows.append({
                "cluster": self.cluster, "api_group": group, "api_version": version, "kind": spec.kind,
                "namespace": meta.get("namespace"), "name": meta.get("name", ""), "uid": meta.get("uid", ""),
                "resource_version": meta.get("resourceVersion", ""), "event_type": ev.event_type,
                "observed_at": ns_to_dt(ev.observed_ns), "raw": ev.raw, "content_hash": sha256_hex(raw_json),
            })
        if not rows:
            return []
        by_key = {(r["uid"], r["resource_version"], r["event_type"]): r for r in rows}
        values = [(*(r[c] for c in _VERSION_COLUMNS[:-2]), text.decode(), r["content_hash"]) for r, text in zip(rows, raw_texts)]
        if s.get_bind().dialect.name == "postgresql":
            result = _pg_copy_versions(s, values, replays_possible)
        else:
            result = _sqlite_insert_versions(s, values)
        inserted: list[dict] = []
        for new_id, uid, rv, et in result:
            row = by_key.get((uid, rv, et))
            if row is not None:
                inserted.append({**row, "id": new_id})
        inserted.sort(key=lambda r: r["id"])
        return inserted

    def _insert_quarantine(self, s: Session, spec: KindSpec, raw_text: str, reason: str, position: str | None) -> None:
        raw_sha = sha256_hex(raw_text.encode("utf-8", "replace"))
        source = f"watch:{self.cluster}/{spec.kind}"
        exists = s.execute(select(Quarantine.id).where(Quarantine.stage == "watch", Quarantine.source == source,
                                                       Quarantine.raw_sha256 == raw_sha)).first()
        if exists:  # the same bad line re-delivered after a reconnect is recorded once
            return
        row = {"stage": "watch", "source": source, "position": position, "reason": reason[:2000],
               "raw_text": raw_text, "raw_sha256": raw_sha, "received_at": datetime.now(timezone.utc), "run_id": None}
        new_id = s.execute(insert(Quarantine).values(**row).returning(Quarantine.id)).scalar_one()
        ledger.append(s, "quarantine", [{**row, "id": new_id}])

    def _state(self, s: Session, kind: str) -> WatchState | None:
        return s.get(WatchState, (self.cluster, kind))

    def _store_resume_point(self, s: Session, kind: str, rv: str) -> None:
        now = datetime.now(timezone.utc)
        # One UPDATE round trip (ORM-enabled, so a WatchState already loaded in this session follows).
        moved = s.execute(update(WatchState).where(WatchState.cluster == self.cluster, WatchState.kind == kind)
                          .values(resource_version=rv, updated_at=now)).rowcount
        if not moved:
            s.add(WatchState(cluster=self.cluster, kind=kind, api_version="", resource_version=rv, synced=False,
                             state="unknown", state_since_ns=now_ns(), updated_at=now))
            s.flush()

    def _mark_synced(self, s: Session, spec: KindSpec, at_ns: int, rv: str | None) -> None:
        st = self._ensure_state(s, spec, at_ns)
        if st.state == "gap":
            s_add_interval(s, self.cluster, spec.kind, "gap", st.state_since_ns, at_ns, st.state_from_rv, rv, st.state_reason)
        elif st.state == "stopped":
            # Back after a clean stop: the collector was not running in between (a pack shows it as
            # such; leaving no interval there made it "unobserved", as before the first start).
            s_add_interval(s, self.cluster, spec.kind, "stopped", st.state_since_ns, at_ns, st.state_from_rv, rv,
                           STOPPED_REASON)
        elif st.state == "synced" and self._synced_in_this_run(spec.kind):
            # synced again in this run (a list while synced): nothing was missed, one interval ends here
            s_add_interval(s, self.cluster, spec.kind, "synced", st.state_since_ns, at_ns, st.state_from_rv, rv, None)
        elif st.state == "synced":
            # The previous run ended without closing its interval (crash or SIGKILL): it was synced
            # until it was last seen alive. The resume succeeded, so no event was lost, but none was
            # seen when it happened until now: the collector was not running in between. Until
            # when the kind was observed was frozen at this run's start (``_freeze_previous_run``:
            # its own last contact if it was out of contact, e.g. its requests failing while the
            # other kinds' bookmarks kept the run alive).
            until = st.observed_until_ns if st.observed_until_ns is not None else self._previous_run_alive_ns(st)
            last_alive = min(max(st.state_since_ns, until), at_ns)
            s_add_interval(s, self.cluster, spec.kind, "synced", st.state_since_ns, last_alive, st.state_from_rv, st.resource_version, None)
            if last_alive < at_ns:
                s_add_interval(s, self.cluster, spec.kind, "stopped", last_alive, at_ns, st.resource_version, rv,
                               CRASHED_REASON)
        st.state, st.state_since_ns, st.state_from_rv, st.state_reason = "synced", at_ns, rv, None
        st.observed_until_ns = None  # complete from at_ns on: in contact
        st.synced = True
        st.api_version = spec.version
        st.updated_at = datetime.now(timezone.utc)
        s.flush()

    def _mark_gap(self, s: Session, spec: KindSpec, from_rv: str | None, reason: str, at_ns: int,
                  since_ns: int | None = None) -> None:
        st = self._ensure_state(s, spec, at_ns)
        # Events after the last committed resume point may be lost: the gap starts at the last
        # moment we know we were complete (last commit or bookmark, or the stream's last contact
        # when the reflector knows it: ``since_ns``), not when we noticed.
        known_complete = dt_to_ns(st.updated_at) if since_ns is None else since_ns
        gap_start = min(at_ns, max(st.state_since_ns, known_complete))
        if st.state == "synced":
            s_add_interval(s, self.cluster, spec.kind, "synced", st.state_since_ns, gap_start, st.state_from_rv, from_rv, None)
        elif st.state == "stopped":  # the collector was not running until now: that, then the gap
            s_add_interval(s, self.cluster, spec.kind, "stopped", st.state_since_ns, at_ns, st.state_from_rv, from_rv,
                           STOPPED_REASON)
            gap_start = at_ns
        if st.state != "gap":
            st.state, st.state_since_ns, st.state_from_rv, st.state_reason = "gap", gap_start, from_rv, reason
        st.observed_until_ns = None  # the gap says it now
        st.synced = False
        st.updated_at = datetime.now(timezone.utc)
        s.flush()

    def _mark_contact(self, s: Session, kind: str, last_contact_ns: int | None) -> None:
        """Store (or, with None, clear) the kind's last contact while it is out of contact
        (``submit_contact_lost``): one UPDATE of its ``watch_state`` row, ``updated_at`` untouched
        (it is no sign of life). No row yet: nothing 'synced' to bound."""
        s.execute(update(WatchState).where(WatchState.cluster == self.cluster, WatchState.kind == kind)
                  .values(observed_until_ns=last_contact_ns))

    def _freeze_previous_run(self, s: Session) -> None:
        """In this run's first transaction, before it changes a row: for every kind an earlier run
        left 'synced' (it ended without a clean stop), store in ``observed_until_ns`` until when
        that run observed it — its last sign of life for the kind (``_previous_run_alive_ns``), or
        the kind's last contact if it was out of contact then (a mark it left), whichever is
        earlier. ``_mark_synced`` ends the interval there once the kind syncs in this run.

        Frozen now, not when the kind syncs: meanwhile this run's commits of the other kinds move
        the cluster's liveness (and a relist's events the kind's own ``updated_at``); a kind this run
        never reaches (its requests failing throughout, then another crash) was taken as observed
        into this run, whose commits said the process was alive, not that the kind was seen."""
        for st in s.execute(select(WatchState).where(WatchState.cluster == self.cluster,
                                                     WatchState.state == "synced")).scalars():
            until = self._previous_run_alive_ns(st)
            if st.observed_until_ns is not None:
                until = min(until, st.observed_until_ns)
            st.observed_until_ns = max(st.state_since_ns, until)
        s.flush()

    def _synced_in_this_run(self, kind: str) -> bool:
        """Whether this run has committed a coverage state for ``kind`` (its row's state is then ours)."""
        with self._status_lock:
            return kind in self._states_committed

    def _read_previous_run_alive_ns(self, s: Session) -> int | None:
        """The last instant an earlier run is known to have been alive: its latest commit or bookmark
        of any kind of this cluster (one process watches them all, so a quiet kind's watch was open
        while another kind committed); read before this run changes any row. None: no earlier run."""
        latest = s.execute(select(func.max(WatchState.updated_at)).where(WatchState.cluster == self.cluster)).scalar()
        return None if latest is None else dt_to_ns(latest)

    def _previous_run_alive_ns(self, st: WatchState) -> int:
        """For a kind the previous run left 'synced' (it crashed): until when it was observed.

        The run was last seen alive at its latest commit or bookmark of any kind
        (``_read_previous_run_alive_ns``); the kind's own stream was last heard at its own
        (``st.updated_at``). A stream silent since then (a half-open connection) held back what
        changed, but the live process would have noticed a silence of ``silence_bound_ns`` (the
        read timeout) — and recorded a gap: the kind is observed until its own last contact, or
        that bound before the run's end if later. A quiet kind thus loses at most the bound at a
        crash (with an API server's bookmarks, ~1/min, less), not everything since its last
        change; the breaker's claim stream, deaf seconds before a SIGKILL, is no longer taken as
        observed until the Pod stream's last commit."""
        own = dt_to_ns(st.updated_at)
        alive = self._previous_alive_ns
        if alive is _UNREAD or alive is None:
            return own
        if self.silence_bound_ns is None:
            return alive
        return min(alive, max(own, alive - self.silence_bound_ns))

    def _ensure_state(self, s: Session, spec: KindSpec, at_ns: int) -> WatchState:
        st = self._state(s, spec.kind)
        if st is None:
            st = WatchState(cluster=self.cluster, kind=spec.kind, api_version=spec.version, resource_version=None,
                            synced=False, state="unknown", state_since_ns=at_ns, updated_at=datetime.now(timezone.utc))
            s.add(st)
            s.flush()
        return st

    def _close_coverage(self, at_ns: int, observed_until_ns: dict[str, int]) -> None:
        """On a clean stop: close every open 'synced' interval at ``at_ns``, or at the kind's last
        contact in ``observed_until_ns`` if earlier (state becomes 'stopped')."""
        try:
            with self.sessions() as s, s.begin():
                for st in s.execute(select(WatchState).where(WatchState.cluster == self.cluster, WatchState.state == "synced")).scalars():
                    end = min(at_ns, observed_until_ns.get(st.kind, at_ns))
                    if st.observed_until_ns is not None:  # out of contact since (``submit_contact_lost``)
                        end = max(st.state_since_ns, min(end, st.observed_until_ns))
                    st.observed_until_ns = None
                    s_add_interval(s, self.cluster, st.kind, "synced", st.state_since_ns, end, st.state_from_rv, st.resource_version, None)
                    st.state, st.state_since_ns, st.state_from_rv = "stopped", end, st.resource_version
                    st.synced = False
                    st.updated_at = datetime.now(timezone.utc)
                if self.fence is not None and not self.fence():
                    raise FencedOut()
        except FencedOut:
            log.info("not the leader at shutdown: coverage left to the leader")
        except Exception as exc:  # noqa: BLE001
            log.warning("could not close coverage intervals at shutdown: %s", exc)


STOPPED_REASON = "collector stopped: not watching"
CRASHED_REASON = "collector not running: its previous run ended without a clean stop"


def s_add_interval(s: Session, cluster: str, kind: str, state: str, started_ns: int, ended_ns: int,
                   from_rv: str | None, to_rv: str | None, reason: str | None) -> None:
    """Append one closed coverage interval and its ledger entry (intervals never change)."""
    if ended_ns < started_ns:
        ended_ns = started_ns
    row = {"cluster": cluster, "kind": kind, "state": state, "started_ns": started_ns, "ended_ns": ended_ns,
           "from_rv": from_rv, "to_rv": to_rv, "reason": reason}
    new_id = s.execute(insert(CoverageInterval).values(**row).returning(CoverageInterval.id)).scalar_one()
    ledger.append(s, "coverage_intervals", [{**row, "id": new_id}])


def _chunks(seq: list, size: int):
    for i in range(0, len(seq), size):
        yield seq[i:i + size]
