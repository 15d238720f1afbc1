"""A loopback HTTP server speaking the part of OPA's REST API v1 that ``OpaServerEngine`` calls.

It exists to contract-test the OPA-server path without an OPA binary: requests are answered the
way OPA answers them (https://www.openpolicyagent.org/docs/rest-api) and evaluated by the real OPA
Go evaluator (``opa_bindings``, PyPI ``opa-golib-python-bindings``). Endpoints:

- ``GET /health`` → 200 ``{}``
- ``GET /v1/policies`` → 200 ``{"result": [{"id", "raw"}]}``; ``GET /v1/policies/<id>`` → 200 / 404
- ``PUT /v1/policies/<id>`` (text/plain Rego) → 200 ``{}``; a module that does not compile →
  400 ``{"code": "invalid_parameter", "message", "errors": [{"code", "message", "location"}]}``
- ``DELETE /v1/policies/<id>`` → 200 ``{}`` / 404
- ``PUT /v1/data/<path>`` (JSON) → 204
- ``POST|GET /v1/data/<path>`` (body ``{"input": ...}``) → 200 ``{"result": value}``, or 200 ``{}``
  when the document is undefined; an evaluation error → 500 ``{"code": "internal_error", ...}``.
- ``POST /v1/query`` (body ``{"query", "input"}``) → 200 ``{"result": [bindings, ...]}``; a query
  that does not compile → 400.

Not for production: no authentication, loopback only.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

_OPA_LOCATION = re.compile(r"(\S+?):(\d+): (rego_\w+): (.*)")


class _State:
    """Policies and data as OPA would hold them, plus the compiled evaluator (rebuilt on change)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.policies: dict[str, str] = {}
        self.data: dict[str, Any] = {}
        self._engine: Any = None

    def compile(self, policies: dict[str, str]) -> Any:
        from opa_bindings import OpaEngine

        engine = OpaEngine()
        for policy_id, source in sorted(policies.items()):
            engine.add_policy(policy_id, source)
        engine.add_data(self.data)
        return engine

    def engine(self) -> Any:
        if self._engine is None:
            self._engine = self.compile(self.policies)
        return self._engine

    def invalidate(self) -> None:
        self._engine = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
        return

    def setup(self) -> None:
        super().setup()
        # headers and body are separate writes: without NODELAY each answer waits for a delayed ACK
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # -- plumbing -----------------------------------------------------------------------------

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: Any = None) -> None:
        raw = b"" if status == 204 else json.dumps(body if body is not None else {}).encode("utf-8")
        self.send_response(status)
        if status != 204:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _route(self) -> tuple[str, str]:
        path = unquote(urlsplit(self.path).path)
        for prefix, kind in (("/v1/policies", "policies"), ("/v1/data", "data"), ("/v1/query", "query")):
            if path == prefix or path.startswith(prefix + "/"):
                return kind, path[len(prefix):].strip("/")
        return ("health" if path == "/health" else "unknown"), path

    # -- verbs --------------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        kind, rest = self._route()
        state = self.server.state
        if kind == "health":
            return self._send(200, {})
        if kind == "policies":
            with state.lock:
                if not rest:
                    return self._send(200, {"result": [{"id": i, "raw": s} for i, s in sorted(state.policies.items())]})
                if rest in state.policies:
                    return self._send(200, {"result": {"id": rest, "raw": state.policies[rest]}})
            return self._send(404, {"code": "resource_not_found", "message": f"storage_not_found_error: policy id {rest!r}"})
        if kind == "data":
            return self._evaluate(rest, None)
        return self._send(404, {"code": "resource_not_found", "message": f"no endpoint {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        kind, rest = self._route()
        if kind not in ("data", "query"):
            return self._send(404, {"code": "resource_not_found", "message": f"no endpoint {self.path}"})
        raw = self._body()
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError as exc:
            return self._send(400, {"code": "invalid_parameter", "message": f"body is not JSON: {exc}"})
        body = body if isinstance(body, dict) else {}
        if kind == "query":
            return self._ad_hoc(body.get("query"), body.get("input"))
        return self._evaluate(rest, body.get("input"))

    def _ad_hoc(self, query: Any, input: Any) -> None:
        from opa_bindings import OpaError

        if not isinstance(query, str) or not query.strip():
            return self._send(400, {"code": "invalid_parameter", "message": "missing query"})
        state = self.server.state
        try:
            with state.lock:
                rows = state.engine().eval_query(query, input)
        except OpaError as exc:
            return self._send(400, {"code": "invalid_parameter", "message": exc.message})
        return self._send(200, {"result": rows})

    def do_PUT(self) -> None:  # noqa: N802
        kind, rest = self._route()
        state = self.server.state
        raw = self._body()
        if kind == "policies" and rest:
            from opa_bindings import OpaError

            source = raw.decode("utf-8")
            with state.lock:
                candidate = {**state.policies, rest: source}
                try:
                    engine = state.compile(candidate)
                except OpaError as exc:
                    return self._send(400, _compile_error(exc.message))
                state.policies, state._engine = candidate, engine
            return self._send(200, {})
        if kind == "data":
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                return self._send(400, {"code": "invalid_parameter", "message": f"body is not JSON: {exc}"})
            with state.lock:
                _put(state.data, [p for p in rest.split("/") if p], value)
                state.invalidate()
            return self._send(204)
        return self._send(404, {"code": "resource_not_found", "message": f"no endpoint {self.path}"})

    def do_DELETE(self) -> None:  # noqa: N802
        kind, rest = self._route()
        state = self.server.state
        if kind == "policies" and rest:
            with state.lock:
                if rest not in state.policies:
                    return self._send(404, {"code": "resource_not_found", "message": f"storage_not_found_error: policy id {rest!r}"})
                del state.policies[rest]
                state.invalidate()
            return self._send(200, {})
        return self._send(404, {"code": "resource_not_found", "message": f"no endpoint {self.path}"})

    def _evaluate(self, path: str, input: Any) -> None:
        from opa_bindings import OpaError, OpaUndefinedError

        state = self.server.state
        dotted = ".".join(p for p in path.split("/") if p)
        try:
            with state.lock:
                value = state.engine().eval_document(dotted, input)
        except OpaUndefinedError:
            return self._send(200, {})
        except OpaError as exc:
            return self._send(500, {"code": "internal_error", "message": exc.message})
        return self._send(200, {"result": value})


def _put(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    if not parts:
        tree.clear()
        tree.update(value)
        return
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def _compile_error(message: str) -> dict[str, Any]:
    errors = []
    for line in message.splitlines():
        m = _OPA_LOCATION.search(line)
        if m:
            errors.append({"code": m.group(3), "message": m.group(4).strip(),
                           "location": {"file": m.group(1), "row": int(m.group(2)), "col": 1}})
    if not errors:
        errors.append({"code": "rego_compile_error", "message": message.strip()})
    return {"code": "invalid_parameter", "message": "error(s) occurred while compiling module(s)", "errors": errors}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self.state = _State()
        self.connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Cut kept-alive client connections, as a process that dies would."""
        with self._connections_lock:
            for conn in list(self.connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class OpaContractServer:
    """The server on ``127.0.0.1`` (port 0 = any free port), run in a background thread.

    Use as a context manager; ``url`` is ``http://127.0.0.1:<port>``.

    Raises:
        ImportError: ``opa-golib-python-bindings`` is not installed (on first evaluation).
    """

    def __init__(self, port: int = 0) -> None:
        self._server = _Server(("127.0.0.1", port))
        self._thread = threading.Thread(target=self._server.serve_forever, name="opa-contract-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "OpaContractServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut open connections (clients see the server go away)."""
        self._server.shutdown()
        self._server.server_close()
        self._server.drop_connections()

    def __enter__(self) -> "OpaContractServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
