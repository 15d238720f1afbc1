"""FakeApiServer: a Kubernetes API server for tests, speaking real HTTP/1.1 on loopback.

It serves ResourceClaim, ResourceClaimTemplate, ResourceSlice, DeviceClass (``resource.k8s.io``
in the configured versions), Pod (core v1) and Lease (``coordination.k8s.io/v1``) with the
list/watch protocol of watch-semantics.md (§14 is the checklist it implements) so that the
official ``kubernetes`` Python client works against it unchanged::

    srv = FakeApiServer(); srv.start()
    cfg = kubernetes.client.Configuration(); cfg.host = srv.url
    api = kubernetes.client.ResourceV1Api(kubernetes.client.ApiClient(cfg))

Tests drive the cluster through :meth:`FakeApiServer.apply` / :meth:`delete` and inject faults
with :meth:`add_fault`; every HTTP request is recorded in :attr:`FakeApiServer.requests`.
Watch responses are written byte by byte on the socket (chunked framing, flushes, FIN, RST),
so stream faults are exact. Deviations from a real apiserver are listed in the docstrings
(no PATCH, no authentication, no protobuf/CBOR, JSON only).
"""

from __future__ import annotations

import base64
import copy
import io
import json
import logging
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from collector.sim import registry, wire
from collector.sim.convert import to_served
from collector.sim.faults import CONTENT_ACTIONS, Fault, FaultQueue
from collector.sim.kinds import (
    BY_RESOURCE,
    COORDINATION_GROUP,
    KINDS,
    RESOURCE_GROUP,
    RESOURCE_VERSIONS_BEST_FIRST,
    KindInfo,
    kind_info,
)
from collector.sim.selectors import FieldRequirement, Filter, SelectorError, parse_field_selector, parse_label_selector
from collector.sim.storage import Compacted, Storage
from collector.sim.watchcache import (
    INITIAL_EVENTS_END,
    TooOldResourceVersion,
    WatchCache,
    Watcher,
    WatchItem,
    transition,
)

log = logging.getLogger(__name__)

CONTINUE_EXPIRED_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter, or use the continue token in this response to retrieve the "
    "remainder of the results. Continuing with the provided token results in an inconsistent list - "
    "objects that were created, modified, or deleted between the time the first chunk was returned and "
    "now may show up in the list."
)


@dataclass(frozen=True)
class RequestRecord:
    """One HTTP request as received.

    Attributes:
        method: ``GET`` | ``POST`` | ``PUT`` | ``DELETE`` | ``PATCH``.
        path: URL path without the query.
        query: query parameters (last value wins), e.g. ``{"watch": "true", "resourceVersion": "17"}``.
        headers: request headers.
        at: ``time.monotonic()`` when the request line was read (seconds; for backoff checks).
        at_wall: ``time.time()`` at the same moment (seconds since the epoch, UTC).
        body: request body bytes (None when empty).
    """

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    at: float
    at_wall: float = 0.0
    body: bytes | None = None


class _HttpError(Exception):
    def __init__(self, code: int, message: str, reason: str | None = None, details: dict | None = None, metadata: dict | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.details = details
        self.metadata = metadata


class _ConnectionDone(Exception):
    """The handler closed or aborted the connection itself; stop serving it."""


def _is_true(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _parse_rv(text: str, what: str = "resourceVersion") -> int:
    try:
        rv = int(text)
        if rv < 0:
            raise ValueError
        return rv
    except ValueError:
        raise _HttpError(400, f'{what}: Invalid value: "{text}": must be a non-negative integer') from None


def encode_continue(rv: int, start_key: str) -> str:
    """Continue token in the apiserver's format: base64url of ``{"v","rv","start"}`` (opaque to clients)."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start_key + "\x00"}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    """``(rv, start_key)`` of a token (``rv`` -1 = the inconsistent "latest" token of a 410).

    Raises:
        _HttpError: 400 for a malformed token.
    """
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        if data.get("v") != "meta.k8s.io/v1":
            raise ValueError("bad version")
        return int(data["rv"]), str(data["start"]).rstrip("\x00")
    except (ValueError, KeyError, TypeError) as exc:
        raise _HttpError(400, f"continue key is not valid: {exc}") from None


class FakeApiServer:
    """A faithful fake kube-apiserver on 127.0.0.1 (see the module docstring).

    Args:
        served_resource_versions: versions of ``resource.k8s.io`` served, e.g. ``("v1",)``,
            ``("v1beta1",)``, ``("v1beta2", "v1beta1")``; paths of other versions are 404 and
            discovery lists only these (preferredVersion = best of v1 > v1beta2 > v1beta1).
        history_limit: events kept per kind for watch resumption; older RVs get ERROR/410.
        default_watch_timeout_s: watch duration when the client sends no ``timeoutSeconds``
            (real servers: ``--min-request-timeout`` 1800 s × (1 + rand), see ``watch_timeout_jitter``).
        ignore_limit: LIST ignores ``limit`` and answers unpaged (watch-cache behaviour, §2.2).
        history_max_age_s: events older than this many seconds also leave the history (None = keep).
        watch_timeout_jitter: multiply the default timeout by (1 + U[0,1)) like the real server.
        bookmark_interval_s: send a BOOKMARK this often to watches that allow them (real ≈ 60 s;
            None = only :meth:`send_bookmark` and the one ~2 s before the deadline).
        watch_buffer_size: live events a watcher may have queued before it is closed as
            unresponsive (slow-consumer eviction, §7).
        watch_list: accept streaming lists (``sendInitialEvents``); False answers 422 as a server
            without the WatchList feature (§10).
        kube_version: ``gitVersion`` reported by ``/version``.
        initial_rv: the global counter before the first write (>= 1; real etcd is never at 0).
        compaction_interval_s: compact etcd periodically like kube-apiserver does (every 5 min by
            default there): each tick compacts to the RV seen at the previous tick, so Exact lists
            and continue tokens older than one interval get 410; the watch history is unaffected.
            None (default) = only :meth:`compact`.

    Raises:
        ValueError: unknown served version, bad limits.
    """

    def __init__(
        self,
        served_resource_versions: tuple[str, ...] = ("v1",),
        history_limit: int = 10_000,
        default_watch_timeout_s: float = 1800.0,
        ignore_limit: bool = False,
        *,
        history_max_age_s: float | None = None,
        watch_timeout_jitter: bool = False,
        bookmark_interval_s: float | None = None,
        watch_buffer_size: int = 10_000,
        watch_list: bool = False,
        kube_version: str = "v1.34.2",
        initial_rv: int = 1,
        compaction_interval_s: float | None = None,
    ) -> None:
        bad = [v for v in served_resource_versions if v not in RESOURCE_VERSIONS_BEST_FIRST]
        if bad or not served_resource_versions:
            raise ValueError(
                f"served_resource_versions={served_resource_versions!r}: use a non-empty subset of "
                f"{RESOURCE_VERSIONS_BEST_FIRST}"
            )
        if watch_buffer_size < 1:
            raise ValueError(f"watch_buffer_size={watch_buffer_size}: must be >= 1")
        self.served_resource_versions = tuple(v for v in RESOURCE_VERSIONS_BEST_FIRST if v in served_resource_versions)
        self.default_watch_timeout_s = float(default_watch_timeout_s)
        self.ignore_limit = ignore_limit
        self.watch_timeout_jitter = watch_timeout_jitter
        self.bookmark_interval_s = bookmark_interval_s
        self.watch_buffer_size = watch_buffer_size
        self.watch_list = watch_list
        self.kube_version = kube_version
        self._cache: WatchCache
        self._storage = Storage(on_event=lambda ev: self._cache.on_event(ev), initial_rv=initial_rv)
        self._cache = WatchCache(self._storage.lock, lambda: self._storage.rv, history_limit, history_max_age_s)
        self._faults = FaultQueue()
        self._requests: list[RequestRecord] = []
        self._requests_lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()  # set while down: ends stalls
        self._closed = threading.Event()  # set by stop(): ends background threads
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._port: int | None = None
        self._outage_timer: threading.Timer | None = None
        self.compaction_interval_s = compaction_interval_s
        self._compactor: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self, port: int = 0) -> "FakeApiServer":
        """Bind 127.0.0.1 on ``port`` (0: a free port) and serve in background threads; returns self.

        Raises:
            OSError: ``port`` cannot be bound (in use).
        """
        if self._httpd is not None or self._port is not None:
            raise RuntimeError("FakeApiServer already started")
        self._listen(port)
        if self.compaction_interval_s:
            self._compactor = threading.Thread(target=self._compact_periodically, name="fake-etcd-compactor", daemon=True)
            self._compactor.start()
        return self

    def _compact_periodically(self) -> None:
        previous = self._storage.rv
        while not self._closed.wait(self.compaction_interval_s):
            self._storage.compact(previous)
            previous = self._storage.rv

    def stop(self) -> None:
        """Close all watches and connections and stop listening (idempotent)."""
        self._closed.set()
        if self._outage_timer is not None:
            self._outage_timer.cancel()
        self._close_all_sockets(graceful=True)

    def go_down(self) -> None:
        """The apiserver process dies: open connections are closed (FIN, no terminating chunk
        on watches) and new connections are refused until :meth:`come_up`."""
        if self._httpd is None:
            raise RuntimeError("FakeApiServer is not serving")
        self._close_all_sockets(graceful=False)

    def come_up(self) -> None:
        """Serve again on the same port after :meth:`go_down`. Like a restarted apiserver, the
        watch history restarts at the current RV (older resume points get 410)."""
        if self._httpd is not None:
            return
        if self._port is None:
            raise RuntimeError("FakeApiServer was never started")
        with self._storage.lock:
            self._cache.forget(self._storage.rv)
        self._stopping.clear()
        self._listen(self._port)

    def outage(self, seconds: float) -> None:
        """:meth:`go_down` now and :meth:`come_up` after ``seconds`` (in a timer thread)."""
        self.go_down()
        self._outage_timer = threading.Timer(seconds, self.come_up)
        self._outage_timer.daemon = True
        self._outage_timer.start()

    def _listen(self, port: int) -> None:
        handler = type("_BoundHandler", (_Handler,), {"sim": self})
        httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._port = httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.name = f"fake-apiserver:{self._port}"
        self._thread.start()

    def _close_all_sockets(self, graceful: bool) -> None:
        """Stop listening and drop every connection; ``graceful`` ends watches with the
        terminating chunk first (apiserver shutdown), otherwise they just lose the socket."""
        httpd = self._httpd
        if httpd is None:
            return
        self._httpd = None
        if graceful:
            self._cache.close_all("shutdown")
        httpd.shutdown()
        httpd.server_close()
        with self._conns_lock:
            conns = list(self._conns)
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._stopping.set()
        self._cache.close_all("shutdown")
        if self._thread:
            self._thread.join(timeout=5)

    def __enter__(self) -> "FakeApiServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The TCP port (kept across :meth:`go_down`/:meth:`come_up`)."""
        if self._port is None:
            raise RuntimeError("FakeApiServer not started")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (for ``kubernetes.client.Configuration.host``)."""
        return f"http://127.0.0.1:{self.port}"

    # --- cluster state (test harness API) ------------------------------------------------------
    def apply(self, obj: dict) -> dict:
        """Create or update ``obj`` (v1 shape, or v1beta1 for resource.k8s.io kinds).

        Assigns uid (when new and not given), resourceVersion (the global counter),
        creationTimestamp (when new and not given) and generation. An update that changes
        nothing writes nothing. Removing the last finalizer of a terminating object deletes it.

        Returns:
            the stored object (v1 shape, with kind/apiVersion); a deep copy.

        Raises:
            ValueError: unknown kind, missing name or namespace.
        """
        info = kind_info(obj.get("kind", ""))
        try:
            result = registry.apply(self._storage, info, obj)
        except registry.Invalid as exc:
            raise ValueError(str(exc)) from None
        return copy.deepcopy(result.obj if hasattr(result, "obj") else result)

    def delete(self, kind: str, name: str, namespace: str | None = None, grace_period_s: int | None = None) -> dict:
        """Delete an object; the DELETED event carries its last state with the delete's new RV.

        Objects with finalizers are only marked (``deletionTimestamp`` set, MODIFIED) until the
        last finalizer is removed by an :meth:`apply`; a Pod bound to a node with
        ``grace_period_s`` > 0 is marked terminating and goes away on a second delete.

        Returns:
            the object as written by this call (DELETED or marked), a deep copy.

        Raises:
            KeyError: no such object.
        """
        info = kind_info(kind)
        result = registry.delete(self._storage, info, namespace, name, grace_period_s)
        return copy.deepcopy(result.obj if hasattr(result, "obj") else result)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        """The stored object (v1 shape, deep copy) or None."""
        info = kind_info(kind)
        obj = self._storage.get(info, info.key(namespace if info.namespaced else None, name))
        return copy.deepcopy(obj) if obj is not None else None

    def objects(self, kind: str) -> list[dict]:
        """All stored objects of ``kind`` (v1 shape, deep copies) in key order."""
        info = kind_info(kind)
        return [copy.deepcopy(o) for _k, o in self._storage.current(info)]

    @property
    def current_rv(self) -> int:
        """The global resourceVersion counter (last write, any kind incl. Leases and bumps)."""
        return self._storage.rv

    def bump_rv(self, n: int = 1) -> int:
        """Simulate ``n`` writes elsewhere in etcd (makes per-kind RVs sparse); returns the new RV."""
        return self._storage.bump(n)

    def compact(self) -> int:
        """Compact everything up to now: older watch RVs, Exact lists and continue tokens get 410.

        Returns the compaction RV.
        """
        with self._storage.lock:
            rv = self._storage.compact()
            self._cache.forget(rv)
            return rv

    def restart(self) -> int:
        """Apiserver restart: end every open watch cleanly now; watch history restarts at the
        current RV (resuming from an older RV gets 410). Stored objects and etcd history stay.

        Returns the number of watches closed.
        """
        with self._storage.lock:
            self._cache.forget(self._storage.rv)
            return self._cache.close_all("restart")

    def close_watches(self, kind: str | None = None) -> int:
        """End the open watches of ``kind`` (None = all) cleanly, keeping history — as a load
        balancer's idle timeout or a slow-consumer eviction does (watch-semantics §7). A client
        resuming from its last RV gets every later event, no 410. Returns how many were closed."""
        n = 0
        with self._storage.lock:
            for w in list(self._cache.watchers(kind)):
                w.close("closed by test")
                n += 1
        return n

    def send_bookmark(self, kind: str | None = None) -> int:
        """Queue a BOOKMARK (current RV) to every open watch of ``kind`` (None = all kinds)
        that set ``allowWatchBookmarks``; returns how many watches got one."""
        if kind is not None:
            kind_info(kind)
        n = 0
        with self._storage.lock:
            for w in self._cache.watchers(kind):
                if w.allow_bookmarks:
                    self._cache.bookmark(w)
                    n += 1
        return n

    def add_fault(self, fault: Fault) -> Fault:
        """Queue ``fault`` for the next matching request(s); returns it."""
        self._faults.add(fault)
        return fault

    def clear_faults(self) -> int:
        """Drop every queued fault, e.g. a ``count=100_000`` outage now over; returns how many were queued."""
        return self._faults.clear()

    def pending_faults(self) -> list[Fault]:
        """Faults not yet (fully) consumed."""
        return self._faults.pending()

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request received so far, in arrival order (a copy)."""
        with self._requests_lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._requests_lock:
            self._requests.clear()

    def open_watches(self, kind: str | None = None) -> int:
        """Number of watch streams currently open (of ``kind``, or all)."""
        return len(self._cache.watchers(kind))

    def wait_for_watches(self, n: int, kind: str | None = None, timeout_s: float = 5.0) -> bool:
        """Block until at least ``n`` watches of ``kind`` are open; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.open_watches(kind) >= n:
                return True
            time.sleep(0.01)
        return self.open_watches(kind) >= n

    # --- internals used by the handler ---------------------------------------------------------
    def _record(self, rec: RequestRecord) -> None:
        with self._requests_lock:
            self._requests.append(rec)

    def _watch_deadline(self, query: dict[str, str]) -> float:
        text = query.get("timeoutSeconds")
        if text not in (None, "", "0"):
            try:
                timeout_s = float(int(text))
            except ValueError:
                raise _HttpError(400, f'timeoutSeconds: Invalid value: "{text}"') from None
        else:
            timeout_s = self.default_watch_timeout_s
            if self.watch_timeout_jitter:
                timeout_s *= 1.0 + random.random()
        return time.monotonic() + timeout_s


def _served_versions(sim: FakeApiServer, group: str) -> tuple[str, ...]:
    return sim.served_resource_versions if group == RESOURCE_GROUP else ("v1",)


def _api_resource(info: KindInfo) -> list[dict]:
    verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
    main = {"name": info.plural, "singularName": info.singular, "namespaced": info.namespaced, "kind": info.kind, "verbs": verbs}
    if info.short_names:
        main["shortNames"] = list(info.short_names)
    out = [main]
    if info.kind in ("Pod", "ResourceClaim"):
        out.append(
            {"name": f"{info.plural}/status", "singularName": "", "namespaced": info.namespaced, "kind": info.kind, "verbs": ["get", "patch", "update"]}
        )
    return out


class _Handler(BaseHTTPRequestHandler):
    """One connection; requests are served in order (HTTP/1.1 keep-alive)."""

    protocol_version = "HTTP/1.1"
    server_version = "kube-apiserver-sim"
    sys_version = ""
    sim: FakeApiServer  # set on the bound subclass

    def log_message(self, format, *args) -> None:  # noqa: A002 - quiet by design
        return

    def setup(self) -> None:
        super().setup()
        with self.sim._conns_lock:
            self.sim._conns.add(self.connection)

    def finish(self) -> None:
        with self.sim._conns_lock:
            self.sim._conns.discard(self.connection)
        try:
            super().finish()
        except (OSError, ValueError):
            pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    # --- plumbing --------------------------------------------------------------------------
    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        self.sim._record(
            RequestRecord(method, url.path, query, dict(self.headers.items()), time.monotonic(), time.time(), body)
        )
        try:
            self._route(method, url.path.rstrip("/") or "/", query, body)
        except _HttpError as exc:
            self._send_status(exc.code, exc.message, exc.reason, exc.details, metadata=exc.metadata)
        except _Answered:
            pass
        except _ConnectionDone:
            self.close_connection = True
        except OSError:  # the client went away (broken pipe, reset…)
            self.close_connection = True
        except Exception as exc:  # a bug in the sim: keep the traceback, answer 500 if still possible
            log.exception("fake apiserver failed on %s %s", method, self.path)
            self.close_connection = True
            try:
                self._send_status(500, f"fake apiserver bug: {type(exc).__name__}: {exc}", "InternalError")
            except Exception:  # noqa: BLE001 - headers may already be on the wire
                pass

    def _send_bytes(self, code: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, code: int, obj: dict, headers: dict | None = None) -> None:
        self._send_bytes(code, wire.dumps(obj), "application/json", headers)

    def _send_status(self, code: int, message: str, reason: str | None = None, details: dict | None = None, headers: dict | None = None, metadata: dict | None = None) -> None:
        self._send_json(code, wire.status(code, message, reason, details, metadata), headers)

    def _abort(self, how: str) -> None:
        """End the connection without HTTP framing: ``rst`` or ``fin``."""
        if how == "rst":
            time.sleep(0.02)  # let bytes already written reach the peer before the RST discards them
        for f in (self.wfile, self.rfile):
            try:
                f.close()
            except (OSError, ValueError):
                pass
        (wire.reset if how == "rst" else wire.fin)(self.connection)
        # BaseHTTPRequestHandler flushes wfile after the handler returns: give it inert files
        self.wfile, self.rfile = io.BytesIO(), io.BytesIO()
        self.close_connection = True
        raise _ConnectionDone()

    def _stall(self, seconds: float) -> None:
        self.sim._stopping.wait(seconds)

    # --- routing ---------------------------------------------------------------------------
    def _route(self, method: str, path: str, query: dict[str, str], body: bytes | None) -> None:
        parts = [p for p in path.split("/") if p]
        if path in ("/healthz", "/readyz", "/livez"):
            return self._send_bytes(200, b"ok", "text/plain; charset=utf-8")
        if not parts or parts[0] not in ("api", "apis", "version"):
            raise _HttpError(404, "the server could not find the requested resource", "NotFound")
        if parts[0] == "version" or len(parts) <= (2 if parts[0] == "api" else 3):
            return self._discovery(method, parts)
        if parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        else:
            group, version, rest = parts[1], parts[2], parts[3:]
        if version not in _served_versions(self.sim, group):
            raise _HttpError(404, "the server could not find the requested resource", "NotFound")
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
        info = BY_RESOURCE.get((group, plural))
        if info is None or len(rest) > 3:
            raise _HttpError(404, "the server could not find the requested resource", "NotFound")
        all_namespaces_collection = info.namespaced and namespace is None and name is None
        if (namespace is not None) != info.namespaced and not all_namespaces_collection:
            raise _HttpError(404, "the server could not find the requested resource", "NotFound")
        if sub not in (None, "status"):
            raise _HttpError(404, "the server could not find the requested resource", "NotFound")
        watch = _is_true(query.get("watch"))
        verb = {
            ("GET", False): "list" if name is None else "get",
            ("GET", True): "watch",
            ("POST", False): "create",
            ("PUT", False): "update",
            ("DELETE", False): "delete",
        }.get((method, watch and method == "GET"))
        if verb is None or (verb == "create" and name is not None) or (verb in ("update", "delete") and name is None):
            raise _HttpError(405, f"the server does not allow this method on the requested resource ({method})", "MethodNotAllowed")
        faults = self.sim._faults.take(info.kind, verb, namespace)
        fault = faults[0] if faults and faults[0].action not in CONTENT_ACTIONS else None
        if fault is not None:
            self._http_level_fault(fault, info.kind)
        if verb == "list":
            return self._list(info, version, namespace, query, fault)
        if verb == "watch":
            content = [f for f in faults if f.action in CONTENT_ACTIONS]
            return self._watch(info, version, namespace, name, query, fault, content)
        if verb == "get":
            return self._get(info, version, namespace, name, fault)
        return self._write(verb, info, version, namespace, name, query, body, status_only=sub == "status")

    def _http_level_fault(self, fault: Fault, kind: str) -> None:
        """Faults answered before any normal response byte."""
        if fault.action == "reset_before_headers":
            self._abort("rst")
        if fault.action == "status":
            headers = {"Retry-After": int(fault.retry_after)} if fault.retry_after is not None else None
            plain = fault.plain if fault.plain is not None else fault.code == 429
            if plain:
                text = fault.message or (wire.TOO_MANY_REQUESTS_TEXT if fault.code == 429 else "error\n")
                self._send_bytes(fault.code, text.encode("utf-8"), "text/plain; charset=utf-8", headers)
            else:
                details = {"causes": fault.causes} if fault.causes else None
                message = fault.message or {
                    429: "the server has received too many requests and has asked us to try again later",
                    500: "Internal error occurred: etcdserver: request timed out",
                    503: "the server is currently unable to handle the request",
                    504: "Too large resource version",
                }.get(fault.code, f"error {fault.code}")
                self._send_status(fault.code, message, fault.reason, details, headers)
            raise _Answered()
        if fault.action == "http_410":
            oldest = self.sim._cache.oldest_rv(kind)
            self._send_status(410, fault.message or f"too old resource version: 0 ({oldest})", "Expired")
            raise _Answered()

    # --- discovery -------------------------------------------------------------------------
    def _discovery(self, method: str, parts: list[str]) -> None:
        sim = self.sim
        if method != "GET":
            raise _HttpError(405, "the server does not allow this method on the requested resource", "MethodNotAllowed")
        for fault in sim._faults.take("discovery", "get", None):
            self._http_level_fault(fault, "discovery")
        if parts == ["version"]:
            major, minor = sim.kube_version.lstrip("v").split(".")[:2]
            return self._send_json(
                200,
                {
                    "major": major,
                    "minor": minor,
                    "gitVersion": sim.kube_version,
                    "gitCommit": "0000000000000000000000000000000000000000",
                    "gitTreeState": "clean",
                    "buildDate": "2025-11-11T00:00:00Z",
                    "goVersion": "go1.24.9",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                },
            )
        if parts == ["api"]:
            return self._send_json(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{sim.port}"}],
                },
            )
        if parts == ["api", "v1"]:
            return self._send_json(
                200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": _api_resource(KINDS["Pod"])}
            )
        if parts == ["apis"]:
            return self._send_json(
                200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [self._group(g) for g in (RESOURCE_GROUP, COORDINATION_GROUP)]}
            )
        if len(parts) == 2 and parts[1] in (RESOURCE_GROUP, COORDINATION_GROUP):
            return self._send_json(200, {"kind": "APIGroup", "apiVersion": "v1", **self._group(parts[1])})
        if len(parts) == 3 and parts[1] in (RESOURCE_GROUP, COORDINATION_GROUP) and parts[2] in _served_versions(sim, parts[1]):
            resources = [r for k in KINDS.values() if k.group == parts[1] for r in _api_resource(k)]
            return self._send_json(
                200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{parts[1]}/{parts[2]}", "resources": resources}
            )
        raise _HttpError(404, "the server could not find the requested resource", "NotFound")

    def _group(self, group: str) -> dict:
        versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in _served_versions(self.sim, group)]
        return {"name": group, "versions": versions, "preferredVersion": versions[0]}

    # --- GET one / writes --------------------------------------------------------------------
    def _not_found(self, info: KindInfo, name: str) -> _HttpError:
        qualified = info.plural + (f".{info.group}" if info.group else "")
        return _HttpError(404, f'{qualified} "{name}" not found', "NotFound", {"name": name, "group": info.group, "kind": info.plural})

    def _get(self, info: KindInfo, version: str, namespace: str | None, name: str, fault: Fault | None) -> None:
        obj = self.sim._storage.get(info, info.key(namespace, name))
        if obj is None:
            raise self._not_found(info, name)
        body = wire.dumps(to_served(obj, info, version))
        self._respond_with_body_fault(body, fault)

    def _write(
        self,
        verb: str,
        info: KindInfo,
        version: str,
        namespace: str | None,
        name: str | None,
        query: dict[str, str],
        body: bytes | None,
        status_only: bool = False,
    ) -> None:
        """POST (create), PUT (update; ``/status`` replaces only ``status``) and DELETE."""
        storage = self.sim._storage
        qualified = info.plural + (f".{info.group}" if info.group else "")
        if verb == "delete":
            grace = query.get("gracePeriodSeconds")
            if grace is None and body:
                try:
                    grace = (json.loads(body) or {}).get("gracePeriodSeconds")
                except ValueError:
                    raise _HttpError(400, "DeleteOptions body is not valid JSON") from None
            try:
                result = registry.delete(storage, info, namespace, name, int(grace) if grace not in (None, "") else None)
            except KeyError:
                raise self._not_found(info, name) from None
            obj = result.obj if hasattr(result, "obj") else result
            return self._send_json(200, to_served(obj, info, version))
        try:
            obj = json.loads(body or b"")
        except ValueError as exc:
            raise _HttpError(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise _HttpError(400, "request body must be a JSON object")
        if obj.get("kind") not in (None, info.kind):
            raise _HttpError(400, f"kind {obj.get('kind')!r} does not match the resource {info.plural}")
        obj.setdefault("apiVersion", info.api_version(version))
        meta = obj.setdefault("metadata", {})
        if info.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise _HttpError(400, "the namespace of the provided object does not match the namespace sent on the request")
            meta["namespace"] = namespace
        try:
            if verb == "create":
                if meta.get("resourceVersion"):
                    raise _HttpError(400, "resourceVersion should not be set on objects to be created")
                try:
                    result = registry.create(storage, info, obj)
                except FileExistsError:
                    raise _HttpError(
                        409, f'{qualified} "{meta.get("name")}" already exists', "AlreadyExists", {"name": meta.get("name"), "group": info.group, "kind": info.plural}
                    ) from None
                return self._send_json(201, to_served(result.obj, info, version))
            if meta.get("name") != name:
                raise _HttpError(400, f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})")
            if status_only:
                existing = storage.get(info, info.key(namespace, name))
                if existing is None:
                    raise self._not_found(info, name)
                merged = copy.deepcopy(existing)
                merged["status"] = obj.get("status")
                merged["metadata"]["resourceVersion"] = meta.get("resourceVersion")
                obj, meta = merged, merged["metadata"]
            try:
                result = registry.update(storage, info, obj, expect_rv=meta.get("resourceVersion"))
            except KeyError:
                raise self._not_found(info, name) from None
            except PermissionError:
                raise _HttpError(
                    409,
                    f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; please apply your changes to the latest version and try again',
                    "Conflict",
                    {"name": name, "group": info.group, "kind": info.plural},
                ) from None
            out = result.obj if hasattr(result, "obj") else result
            return self._send_json(200, to_served(out, info, version))
        except registry.Invalid as exc:
            raise _HttpError(exc.code, str(exc)) from None

    # --- LIST ------------------------------------------------------------------------------
    def _filter(self, info: KindInfo, namespace: str | None, query: dict[str, str], name: str | None = None) -> Filter:
        try:
            labels = parse_label_selector(query.get("labelSelector"))
            fields = parse_field_selector(query.get("fieldSelector"), info)
        except SelectorError as exc:
            raise _HttpError(400, str(exc)) from None
        if name is not None:
            pinned = [f for f in fields if f.label == "metadata.name"]
            if any(f.op != "=" or f.value != name for f in pinned):
                raise _HttpError(400, "fieldSelector metadata.name doesn't match requested name")
            if not pinned:
                fields = fields + (FieldRequirement("metadata.name", "=", name),)
        return Filter(info, namespace, labels, fields)

    def _list(self, info: KindInfo, version: str, namespace: str | None, query: dict[str, str], fault: Fault | None) -> None:
        sim, storage = self.sim, self.sim._storage
        rv_text = query.get("resourceVersion") or None
        match = query.get("resourceVersionMatch") or None
        cont = query.get("continue") or None
        if "sendInitialEvents" in query:
            raise _HttpError(422, "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list")
        if match is not None:
            if match not in ("Exact", "NotOlderThan"):
                raise _HttpError(422, f'resourceVersionMatch: Unsupported value: "{match}": supported values: "Exact", "NotOlderThan"')
            if cont:
                raise _HttpError(422, "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided")
            if rv_text is None:
                raise _HttpError(422, "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided")
            if match == "Exact" and rv_text == "0":
                raise _HttpError(422, 'resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"')
        if cont and rv_text not in (None, "0"):
            raise _HttpError(400, "specifying resource version is not allowed when using continue")
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            raise _HttpError(400, f'limit: Invalid value: "{query.get("limit")}"') from None
        paged = limit > 0 and not sim.ignore_limit
        filt = self._filter(info, namespace, query)
        start_key = ""
        with storage.lock:
            current = storage.rv
            try:
                if cont:
                    token_rv, start_key = decode_continue(cont)
                    read_rv = current if token_rv < 0 else token_rv
                    objs = storage.state_at(info, read_rv)
                elif rv_text is None or rv_text == "0":
                    read_rv, objs = current, storage.current(info)
                else:
                    n = _parse_rv(rv_text)
                    if n > current:
                        raise _HttpError(
                            504,
                            f"Too large resource version: {n}, current: {current}",
                            "Timeout",
                            {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1},
                        )
                    if match == "Exact" or (match is None and paged):
                        read_rv, objs = n, storage.state_at(info, n)
                    else:
                        read_rv, objs = current, storage.current(info)
            except Compacted as exc:
                if cont:
                    raise _HttpError(410, CONTINUE_EXPIRED_MESSAGE, "Expired", metadata={"continue": encode_continue(-1, start_key)}) from None
                raise _HttpError(
                    410, f"The resourceVersion for the provided list is too old. (requested {exc.requested_rv}, oldest {exc.compacted_rv})", "Expired"
                ) from None
        selected = [(k, o) for k, o in objs if k > start_key and filt.matches(o)] if start_key else [(k, o) for k, o in objs if filt.matches(o)]
        meta: dict = {"resourceVersion": str(read_rv)}
        if paged and len(selected) > limit:
            page = selected[:limit]
            meta["continue"] = encode_continue(read_rv, page[-1][0])
            if not filt.has_selectors:
                meta["remainingItemCount"] = len(selected) - limit
        else:
            page = selected
        items = []
        for _k, o in page:
            served = to_served(o, info, version)
            served.pop("kind", None)
            served.pop("apiVersion", None)
            items.append(served)
        body = wire.dumps({"kind": info.list_kind, "apiVersion": info.api_version(version), "metadata": meta, "items": items})
        self._respond_with_body_fault(body, fault)

    def _respond_with_body_fault(self, body: bytes, fault: Fault | None) -> None:
        """Send a JSON body, applying ``stall`` / ``cut_mid_event`` / ``reset_mid_stream``."""
        action = fault.action if fault is not None else None
        if action not in ("stall", "cut_mid_event", "reset_mid_stream"):
            return self._send_bytes(200, body, "application/json")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if action == "stall":
            self._stall(float(fault.seconds))
            self.wfile.write(body)
            return
        self.wfile.write(body[: len(body) // 2])
        self._abort("fin" if action == "cut_mid_event" else "rst")

    # --- WATCH -----------------------------------------------------------------------------
    def _watch(
        self,
        info: KindInfo,
        version: str,
        namespace: str | None,
        name: str | None,
        query: dict[str, str],
        fault: Fault | None,
        content: list[Fault],
    ) -> None:
        sim, storage, cache = self.sim, self.sim._storage, self.sim._cache
        rv_text = query.get("resourceVersion") or None
        match = query.get("resourceVersionMatch") or None
        initial_events = query.get("sendInitialEvents")
        allow_bookmarks = _is_true(query.get("allowWatchBookmarks"))
        if initial_events is not None:
            if not sim.watch_list:
                raise _HttpError(422, "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled")
            if match != "NotOlderThan":
                raise _HttpError(422, 'resourceVersionMatch: Unsupported value: "%s": supported values: "NotOlderThan"' % (match or ""))
        elif match is not None:
            raise _HttpError(422, "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided")
        start_rv = _parse_rv(rv_text) if rv_text not in (None, "0") else None
        filt = self._filter(info, namespace, query, name)
        deadline = sim._watch_deadline(query)
        streaming_list = _is_true(initial_events)
        w = Watcher(info, version, filt, allow_bookmarks, deadline, sim.watch_buffer_size)
        error: dict | None = None
        with storage.lock:
            if fault is not None and fault.action == "error_event":
                oldest = cache.oldest_rv(info.kind)
                error = wire.status(410, fault.message or f"too old resource version: {start_rv or 0} ({oldest})", "Expired")
            elif start_rv is None or streaming_list:
                initial = [WatchItem("ADDED", o) for _k, o in storage.current(info) if filt.matches(o)]
                if streaming_list and allow_bookmarks:
                    initial.append(WatchItem("BOOKMARK", rv=storage.rv, annotations={INITIAL_EVENTS_END: "true"}))
                cache.register(w, initial)
            else:
                try:
                    history = cache.events_since(info.kind, start_rv)
                except TooOldResourceVersion as exc:
                    error = wire.too_old_status(exc.requested_rv, exc.oldest_rv)
                else:
                    cache.register(w, [it for ev in history if (it := transition(filt, ev)) is not None])
        try:
            self._stream(w, fault, content, error)
        finally:
            cache.unregister(w)

    def _encode(self, w: Watcher, item: WatchItem) -> bytes:
        if item.type == "ERROR":
            return wire.dumps({"type": "ERROR", "object": item.obj}) + b"\n"
        if item.type == "BOOKMARK":
            meta: dict = {"resourceVersion": str(item.rv)}
            if item.annotations:
                meta["annotations"] = dict(item.annotations)
            obj = {"kind": w.info.kind, "apiVersion": w.info.api_version(w.version), "metadata": meta}
            return wire.dumps({"type": "BOOKMARK", "object": obj}) + b"\n"
        return wire.dumps({"type": item.type, "object": to_served(item.obj, w.info, w.version)}) + b"\n"

    def _stream(self, w: Watcher, fault: Fault | None, content: list[Fault], error: dict | None) -> None:
        """Write the chunked watch response for ``w`` until deadline, close, or a fault.

        ``fault`` is the connection fault of this request (or None); ``content`` the content
        faults (injected lines, UTF-8 split) applied to the events written.
        """
        sim, cache, sock = self.sim, self.sim._cache, self.connection
        action = fault.action if fault is not None else None
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()  # flushes: headers reach the client before any event
        if error is not None:
            self.wfile.write(wire.chunk(self._encode(w, WatchItem("ERROR", error))) + wire.LAST_CHUNK)
            return
        if action == "close_immediately":
            self.wfile.write(wire.LAST_CHUNK)
            return
        if action == "stall":
            self._stall(float(fault.seconds))
        plan = _StreamPlan.from_faults(fault, content)
        started = time.monotonic()
        pre_deadline_bm = w.deadline - 2.0 if w.allow_bookmarks and w.deadline - started > 2.0 else None
        interval = sim.bookmark_interval_s if w.allow_bookmarks else None
        next_periodic = started + interval if interval else None
        while True:
            if plan.reset_at is not None and plan.written >= plan.reset_at:
                self._abort("rst")
            due = plan.due_injects()
            if due:  # injected lines go out as soon as due
                self.wfile.write(wire.chunk(due))
            now = time.monotonic()
            if now >= w.deadline:
                break
            if pre_deadline_bm is not None and now >= pre_deadline_bm:
                cache.bookmark(w)
                pre_deadline_bm = None
            if next_periodic is not None and now >= next_periodic:
                cache.bookmark(w)
                next_periodic += interval
            wake = min(t for t in (w.deadline, pre_deadline_bm, next_periodic) if t is not None)
            items = w.take(max(0.0, min(0.1, wake - now)))
            if not items:
                if w.closed:
                    break
                if wire.peer_closed(sock):
                    raise _ConnectionDone()
                continue
            self._write_batch(w, items, plan)
        self.wfile.write(wire.LAST_CHUNK)

    def _write_batch(self, w: Watcher, items: list[WatchItem], plan: "_StreamPlan") -> None:
        """Write queued events as one chunk (like the apiserver's flush-when-empty), applying
        the per-event faults of ``plan`` (cut, reset, UTF-8 split, late newline, injections)."""
        buf = bytearray()
        for item in items:
            line = self._encode(w, item)
            buf += plan.due_injects()
            if plan.reset_at is not None and plan.written >= plan.reset_at:
                break  # the loop resets the connection after this chunk
            if plan.cut_at is not None and plan.written >= plan.cut_at:
                if buf:  # complete events reach the client in complete chunks
                    self.wfile.write(wire.chunk(bytes(buf)))
                half = line[: max(1, len(line) // 2)]
                if plan.cut_mid_chunk:  # the chunk header announces the whole event, FIN inside it
                    self.wfile.write(b"%x\r\n" % len(line) + half)
                else:  # a well-formed chunk holding half the event, then FIN
                    self.wfile.write(wire.chunk(half))
                self._abort("fin")
            plan.written += 1
            if plan.split_utf8 is not None and any(b >= 0x80 for b in line):
                lead = next(i for i, b in enumerate(line) if b >= 0xC0)
                self.wfile.write(wire.chunk(bytes(buf) + line[: lead + 1]))
                time.sleep(plan.split_utf8)
                buf = bytearray(line[lead + 1 :])
                plan.split_utf8 = None
                continue
            if plan.delay_newline is not None:
                self.wfile.write(wire.chunk(bytes(buf) + line[:-1]))
                time.sleep(plan.delay_newline)
                buf = bytearray(b"\n")
                plan.delay_newline = None
                continue
            buf += line
        if buf:
            self.wfile.write(wire.chunk(bytes(buf)))


@dataclass
class _StreamPlan:
    """Per-watch fault state: where to reset/cut, pending injected lines and one-shot splits.

    ``written`` counts event lines written so far (injected lines excluded).
    """

    reset_at: int | None = None
    cut_at: int | None = None
    cut_mid_chunk: bool = False
    injects: list[tuple[int, bytes]] = field(default_factory=list)
    split_utf8: float | None = None  # pause (s) between the halves; None = no split pending
    delay_newline: float | None = None
    written: int = 0

    @classmethod
    def from_faults(cls, fault: Fault | None, content: list[Fault]) -> "_StreamPlan":
        action = fault.action if fault is not None else None
        plan = cls(
            reset_at=int(fault.after_events) if action == "reset_mid_stream" else None,
            cut_at=int(fault.after_events) if action == "cut_mid_event" else None,
            cut_mid_chunk=bool(fault.mid_chunk) if action == "cut_mid_event" else False,
        )
        for f in content:
            if f.action == "inject_line":
                plan.injects.append((int(f.after_events), bytes(f.raw)))
            elif f.action == "split_utf8" and plan.split_utf8 is None:
                plan.split_utf8 = float(f.pause_s)
            elif f.action == "delay_newline" and plan.delay_newline is None:
                plan.delay_newline = float(f.pause_s)
        plan.injects.sort(key=lambda t: t[0])  # stable: queue order among equal positions
        return plan

    def due_injects(self) -> bytes:
        out = bytearray()
        while self.injects and self.written >= self.injects[0][0]:
            out += self.injects.pop(0)[1] + b"\n"
        return bytes(out)


class _Answered(Exception):
    """A fault already answered the request; the connection stays usable."""
