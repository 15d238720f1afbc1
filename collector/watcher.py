"""Assembles the watcher: discovery → one reflector per kind → the recorder, under leader election.

``Watcher`` owns threads and lifecycle only; the protocol is in ``collector.kube.reflector``, the
SQL in ``collector.kube.recorder``.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

import kubernetes
from pydantic_core import SchemaValidator
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from collector.errors import UserError
from collector.kube.discovery import DiscoveryUnavailable, KindSpec, discover_resource_version, watched_kinds
from collector.kube.leader import LeaseElector
from collector.kube.recorder import Recorder
from collector.kube.reflector import Reflector, ReflectorSettings
from collector.metrics import watch_metrics
from collector.settings import Settings
from collector.timeutil import now_ns, ns_to_rfc3339

log = logging.getLogger(__name__)


@functools.cache
def client_model(spec: KindSpec) -> type:
    """The official client's model class for ``spec``.

    The generator names most models ``<Version><Kind>`` (``V1ResourceSlice``); where two API
    groups define the same kind it prefixes the group (``ResourceV1ResourceClaim``, since core v1
    also has a ``ResourceClaim`` type).

    Cached: the client package resolves model names lazily through a module ``__getattr__`` that
    imports on every lookup, which costs more than validating a small object.

    Raises:
        RuntimeError: the installed client has no model for the kind (an incompatible client).
    """
    version = spec.version[0].upper() + spec.version[1:]
    group = (spec.group.split(".")[0].capitalize()) if spec.group else "Core"
    for name in (f"{version}{spec.kind}", f"{group}{version}{spec.kind}"):
        model = getattr(kubernetes.client, name, None)
        if model is not None and hasattr(model, "model_validate"):
            return model
    raise RuntimeError(f"the installed kubernetes client has no model for {spec.kind} {spec.api_version}")


def model_validator(spec: KindSpec, obj: dict[str, Any]) -> None:
    """Raise if the official client's model for ``spec`` rejects ``obj`` (e.g. a wrongly typed field).

    Unknown fields are accepted: the client's generated models forbid extra fields, which would
    quarantine every object of a kind the day the API server adds a field this client version does
    not know (a newer cluster, an alpha feature gate). We store the raw object anyway, so only the
    fields the client knows are checked, with the client's own types (strict strings, integers,
    timestamps). Validation does not build model instances (about 2x faster than ``model_validate``).

    Raises:
        pydantic_core.ValidationError: a known field has the wrong type or a required one is missing.
    """
    _lenient_validator(spec).validate_python(obj)


def kind_validator(spec: KindSpec) -> Callable[[dict[str, Any]], Any]:
    """``model_validator`` bound to one kind (what each reflector calls per object, without a
    cache lookup per call)."""
    return _lenient_validator(spec).validate_python


@functools.cache
def _lenient_validator(spec: KindSpec) -> SchemaValidator:
    return SchemaValidator(_fields_only(client_model(spec).__pydantic_core_schema__))


def _fields_only(schema: Any) -> Any:
    """A copy of a pydantic-core schema where every ``model`` node is replaced by its
    ``model-fields`` schema with ``extra_behavior: ignore`` (references kept): the same field
    checks, unknown keys ignored, plain dicts out instead of model instances."""
    if isinstance(schema, dict):
        if schema.get("type") == "model":
            fields = _fields_only(schema["schema"])
            fields["extra_behavior"] = "ignore"
            if "ref" in schema:
                fields["ref"] = schema["ref"]
            return fields
        return {k: _fields_only(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_fields_only(v) for v in schema]
    return schema


@dataclass(frozen=True)
class Readiness:
    """Whether the watcher is ready (every kind synced, no gap, database reachable), and why not."""

    ready: bool
    reasons: list[str]


class Watcher:
    """Run the reflectors of one cluster into the store.

    Args:
        settings: configuration (cluster name, time bounds, leader election).
        session_factory: sessions on the migrated store.
        api_client: the official Kubernetes ``ApiClient``.
        reflector_settings: overrides for the protocol's time bounds (tests use short ones).
    """

    def __init__(self, settings: Settings, session_factory: sessionmaker[Session], api_client: kubernetes.client.ApiClient,
                 reflector_settings: ReflectorSettings | None = None) -> None:
        self.settings = settings
        self.sessions = session_factory
        self.api = api_client
        self.metrics = watch_metrics()
        self.reflector_settings = reflector_settings or ReflectorSettings(
            list_page_size=settings.list_page_size, watch_timeout_s=settings.watch_timeout_s,
            read_timeout_s=settings.watch_read_timeout_s, backoff_initial_s=settings.backoff_initial_s,
            backoff_max_s=settings.backoff_max_s)
        self.elector: LeaseElector | None = None
        self.recorder: Recorder | None = None
        self.reflectors: list[Reflector] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.kinds: list[KindSpec] = []
        self._stopping = threading.Event()
        # Called with True when this replica starts recording (leader, or no election) and False
        # when it stops: ``draudit run`` runs its scheduled jobs only while leading.
        self.leadership_listeners: list[Callable[[bool], None]] = []
        self._discovery_error: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Discover the API version, then start reflecting (now, or once elected leader).

        If the API server cannot be reached yet (or answers 401/403/429/5xx), discovery is retried
        in the background with capped exponential backoff and ``readiness`` says why it is not
        ready: a collector started before its API server, or during an outage, never gives up.

        Raises:
            UserError: the API server answered that DRA is not served in a version we read.
        """
        try:
            self._discovered(discover_resource_version(self.api))
        except DiscoveryUnavailable as exc:
            self._discovery_error = str(exc)
            log.warning("%s; retrying in the background", exc)
            t = threading.Thread(target=self._discover_until_answered, name="draudit-discovery", daemon=True)
            t.start()
            self._threads.append(t)

    def _discover_until_answered(self) -> None:
        delay = self.reflector_settings.backoff_initial_s
        while not self._stopping.wait(delay):
            try:
                self._discovered(discover_resource_version(self.api))
                return
            except DiscoveryUnavailable as exc:
                self._discovery_error = str(exc)
                log.warning("%s; retrying in %.1f s", exc, delay)
            except UserError as exc:  # a definite answer: nothing to wait for
                self._discovery_error = str(exc)
                log.error("%s", exc)
                return
            delay = min(delay * 2, self.reflector_settings.backoff_max_s)

    def _discovered(self, resource_version: str) -> None:
        self.kinds = watched_kinds(resource_version)
        self._discovery_error = None
        for spec in self.kinds:
            client_model(spec)  # fail at start, not per object, if the client lacks a model
        log.info("watching %s in cluster %r", ", ".join(f"{k.kind} ({k.api_version})" for k in self.kinds), self.settings.cluster)
        if self._stopping.is_set():
            return
        if self.settings.leader_elect:
            self.elector = LeaseElector(self.api, self.settings.lease_namespace, self.settings.lease_name, self.settings.identity,
                                        lease_duration_s=self.settings.lease_duration_s,
                                        renew_deadline_s=self.settings.lease_duration_s * 2 / 3,
                                        retry_period_s=self.settings.lease_duration_s * 2 / 15,
                                        on_started_leading=self._start_reflecting, on_stopped_leading=self._stop_reflecting)
            t = threading.Thread(target=self.elector.run, name="draudit-leader", daemon=True)
            t.start()
            self._threads.append(t)
        else:
            self._start_reflecting()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop reflectors, commit what was received, close coverage, release the Lease."""
        self._stopping.set()
        for t in [t for t in self._threads if t.name == "draudit-discovery"]:
            t.join(timeout_s)  # a discovery answered now must not start reflectors behind our back
        self._stop_reflecting(timeout_s)
        if self.elector:
            self.elector.stop()
        for t in self._threads:
            t.join(timeout_s)

    def _start_reflecting(self) -> None:
        with self._lock:
            if self.recorder is not None:
                return
            fence = self.elector.is_leader if self.elector else None
            for spec in self.kinds:
                self.metrics.declare_kind(spec.kind)
            self.recorder = Recorder(self.sessions, self.settings.cluster, fence=fence, metrics=self.metrics,
                                     silence_bound_s=self.reflector_settings.read_timeout_s)
            self.recorder.start()
            self.reflectors = [
                # Every pod, also one that references no ResourceClaim: a transaction it logged is
                # then ``no-claim`` (the pod is known and held no GPU), which an auditor can rely
                # on, not ``no-pod`` (nothing known of it).
                Reflector(spec, self.api, self.recorder, self.reflector_settings,
                          validate=kind_validator(spec), metrics=self.metrics)
                for spec in self.kinds
            ]
            for r in self.reflectors:
                t = threading.Thread(target=r.run, name=f"draudit-reflector-{r.spec.kind}", daemon=True)
                t.start()
                self._threads.append(t)
            self.metrics.leader.set(1)
        self._notify_leadership(True)

    def _stop_reflecting(self, timeout_s: float = 10.0) -> None:
        with self._lock:
            for r in self.reflectors:
                r.stop()
            for t in [t for t in self._threads if t.name.startswith("draudit-reflector-")]:
                t.join(timeout_s)
            self._threads = [t for t in self._threads if not t.name.startswith("draudit-reflector-")]
            if self.recorder is not None:
                at = now_ns()
                observed_until = {r.spec.kind: r.observed_until_ns(at) for r in self.reflectors}
                self.recorder.stop(timeout_s, {kind: t for kind, t in observed_until.items() if t is not None})
            was_recording = self.recorder is not None
            self.recorder = None
            self.reflectors = []
            self.metrics.leader.set(0)
        if was_recording:
            self._notify_leadership(False)

    def _notify_leadership(self, leading: bool) -> None:
        for listener in self.leadership_listeners:
            try:
                listener(leading)
            except Exception:  # noqa: BLE001 - a listener must not break the watcher
                log.exception("leadership listener failed (leading=%s)", leading)

    # -- state ----------------------------------------------------------------------------------

    def wait_synced(self, timeout_s: float = 60.0) -> bool:
        """Block until every kind has synced and its rows are committed (``--exit-when-synced``)."""
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                reflectors, recorder = list(self.reflectors), self.recorder
            if reflectors and recorder and all(r.synced.wait(0.05) for r in reflectors):
                return recorder.flush(max(0.1, deadline - time.monotonic()))
            threading.Event().wait(0.05)
        return False

    def readiness(self) -> Readiness:
        """Ready when the database answers and every reflector is synced and not in a gap."""
        reasons: list[str] = []
        try:
            with self.sessions() as s:
                s.execute(text("SELECT 1"))
        except Exception as exc:  # noqa: BLE001
            reasons.append(f"database unreachable: {str(exc).splitlines()[0]}")
        with self._lock:
            reflectors, recorder = list(self.reflectors), self.recorder
        if self._discovery_error:
            reasons.append(f"API discovery: {self._discovery_error}")
        elif self.elector and not self.elector.is_leader():
            reasons.append("standby: not the leader")
        elif not reflectors:
            reasons.append("not started")
        at = now_ns()
        for r in reflectors:
            unreachable = r.unreachable_since_ns(at)
            if r.in_gap:
                reasons.append(f"{r.spec.kind}: in a coverage gap (relisting)")
            elif not r.synced.is_set():  # with why, when it failed (a 403 names the ClusterRole to check)
                reasons.append(f"{r.spec.kind}: not synced yet" + (f" ({r.last_failure})" if r.last_failure else ""))
            elif unreachable is not None:
                reasons.append(f"{r.spec.kind}: API server unreachable since {ns_to_rfc3339(unreachable)} "
                               f"({r.last_failure}); changes since then are not observed yet")
            self.metrics.synced.labels(r.spec.kind).set(1 if r.synced.is_set() and not r.in_gap and unreachable is None else 0)
        if recorder and recorder.last_error:
            reasons.append(f"recorder: {recorder.last_error}")
        # A standby replica is healthy and ready to take over; only the leader's sync matters.
        standby_only = reasons == ["standby: not the leader"]
        return Readiness(not reasons or standby_only, reasons)
