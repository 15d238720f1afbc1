"""Lease-based leader election (``coordination.k8s.io/v1``) with fencing.

Protocol as client-go's (watch-semantics.md §13): take over a Lease only after observing the same
record unchanged for ``leaseDurationSeconds`` on our own clock (never trusting the remote
``renewTime``: clock skew); every write is a full PUT with the read ``resourceVersion``, so
optimistic concurrency (409 Conflict) keeps two candidates from both winning.

Fencing: ``is_leader()`` is true only until ``renew_started + lease_duration_s - safety_margin_s``
measured on the local monotonic clock from the *start* of the last successful renewal. Another
replica cannot take over before it has watched our record unchanged for a whole lease duration,
which starts after our write, so a writer that checks ``is_leader()`` right before each commit
stops before the next leader starts — not "eventually".
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Callable

import kubernetes
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


class LeaseElector:
    """Campaign for one Lease and keep it.

    Args:
        api_client: official ``kubernetes`` ApiClient.
        namespace, name: the Lease.
        identity: this replica's holder identity (the pod name in-cluster).
        lease_duration_s, renew_deadline_s, retry_period_s: client-go's meanings and defaults
            (15/10/2 s); must satisfy lease > renew_deadline > 1.2 × retry.
        on_started_leading, on_stopped_leading: callbacks, run on the elector's thread.
    """

    def __init__(self, api_client: kubernetes.client.ApiClient, namespace: str, name: str, identity: str, *,
                 lease_duration_s: float = 15.0, renew_deadline_s: float = 10.0, retry_period_s: float = 2.0,
                 safety_margin_s: float = 1.0, on_started_leading: Callable[[], None] | None = None,
                 on_stopped_leading: Callable[[], None] | None = None) -> None:
        if not lease_duration_s > renew_deadline_s > 1.2 * retry_period_s:
            raise ValueError("need lease_duration_s > renew_deadline_s > 1.2 * retry_period_s")
        self.api = kubernetes.client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.safety_margin_s = safety_margin_s
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self._valid_until = 0.0
        self._leading = False
        self._observed: tuple | None = None
        self._observed_at = 0.0
        self.stop_event = threading.Event()

    def is_leader(self) -> bool:
        """True while the last successful renewal still guarantees exclusivity (fencing check)."""
        return time.monotonic() < self._valid_until

    def run(self) -> None:
        """Campaign and renew until ``stop()``; releases the Lease on a clean stop."""
        while not self.stop_event.is_set():
            started = time.monotonic()
            try:
                ok = self._try_acquire_or_renew(started)
            except Exception as exc:  # noqa: BLE001 - API errors: not renewed this round
                log.warning("leader election: %s", exc)
                ok = False
            if ok:
                self._valid_until = started + self.lease_duration_s - self.safety_margin_s
                if not self._leading:
                    self._leading = True
                    log.info("became leader (%s/%s as %s)", self.namespace, self.name, self.identity)
                    if self.on_started_leading:
                        self.on_started_leading()
            elif self._leading and time.monotonic() - (self._valid_until - self.lease_duration_s + self.safety_margin_s) > self.renew_deadline_s:
                self._lose()
            self.stop_event.wait(self.retry_period_s)
        if self._leading:
            self._release()
            self._lose()

    def stop(self) -> None:
        self.stop_event.set()

    def _lose(self) -> None:
        self._leading = False
        self._valid_until = 0.0
        log.warning("no longer leader (%s/%s)", self.namespace, self.name)
        if self.on_stopped_leading:
            self.on_stopped_leading()

    def _now(self) -> datetime:
        return datetime.now(timezone.utc)

    def _try_acquire_or_renew(self, now_mono: float) -> bool:
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = kubernetes.client.V1Lease(
                metadata=kubernetes.client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=kubernetes.client.V1LeaseSpec(holder_identity=self.identity, lease_duration_seconds=int(self.lease_duration_s),
                                                   acquire_time=self._now(), renew_time=self._now(), lease_transitions=0))
            try:
                self.api.create_namespaced_lease(self.namespace, body)
                return True
            except ApiException as exc2:
                if exc2.status == 409:
                    return False
                raise
        spec = lease.spec or kubernetes.client.V1LeaseSpec()
        record = (spec.holder_identity, spec.renew_time, lease.metadata.resource_version)
        if record != self._observed:
            self._observed, self._observed_at = record, now_mono
        holder = spec.holder_identity or ""
        if holder == self.identity:
            spec.renew_time = self._now()
        elif holder == "" or now_mono - self._observed_at >= (spec.lease_duration_seconds or self.lease_duration_s):
            spec.holder_identity = self.identity
            spec.acquire_time = self._now()
            spec.renew_time = self._now()
            spec.lease_duration_seconds = int(self.lease_duration_s)
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        else:
            return False
        lease.spec = spec
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    def _release(self) -> None:
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = ""
                lease.spec.lease_duration_seconds = 1
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except Exception as exc:  # noqa: BLE001
            log.info("could not release the Lease: %s", exc)
