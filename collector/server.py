"""The ``draudit run`` HTTP server: health, readiness, Prometheus metrics, and ingestion routes.

Starlette app served by uvicorn on its own thread, so the watcher and the scheduler never wait
for HTTP clients.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Callable

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from collector.errors import UserError
from collector.watcher import Readiness

log = logging.getLogger(__name__)


def build_app(readiness: Callable[[], Readiness], extra_routes: list[BaseRoute] | None = None) -> Starlette:
    """The ASGI app.

    - ``GET /livez``: 200 while the process serves requests (the kubelet restarts it otherwise);
    - ``GET /readyz``: 200 when ``readiness()`` says ready, else 503 with the reasons;
    - ``GET /metrics``: Prometheus text exposition of the default registry;
    - ``extra_routes``: e.g. ``POST /v1/ingest`` and ``POST /v1/logs`` from ``collector.ingest.http``.
    """

    async def livez(_request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(_request: Request) -> Response:
        state = readiness()
        body = {"ready": state.ready, "reasons": state.reasons}
        return JSONResponse(body, status_code=200 if state.ready else 503)

    async def metrics(_request: Request) -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    routes: list[BaseRoute] = [Route("/livez", livez), Route("/readyz", readyz), Route("/metrics", metrics)]
    return Starlette(routes=routes + list(extra_routes or []))


class HttpServer:
    """uvicorn on a background thread; ``stop()`` shuts it down gracefully."""

    def __init__(self, app: Starlette, host: str, port: int) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="draudit-http", daemon=True)

    def start(self, timeout_s: float = 10.0) -> None:
        """Serve on the background thread; returns once uvicorn listens.

        Raises:
            UserError: the address cannot be bound (in use, not an address of this host, a
                privileged port), named with the OS's reason and the fix.
            RuntimeError: uvicorn did not report started within ``timeout_s`` seconds (a bug).
        """
        self._check_bind()
        self.thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout_s / 0.05)):
            if self.server.started:
                return
            deadline.wait(0.05)
        raise RuntimeError("HTTP server did not start")

    def _check_bind(self) -> None:
        # uvicorn reports a failed bind by logging and exiting its thread; bind once here (with
        # SO_REUSEADDR, as uvicorn does) to fail as one line instead.
        host, port = self.server.config.host, self.server.config.port
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, kind, proto, _name, address = infos[0]
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise UserError(f"--host {host} --port {port}: cannot listen ({reason}); choose another --port "
                            f"(env DRAUDIT_HTTP_PORT) or stop the process using it") from None

    @property
    def port(self) -> int:
        sockets = [s for server in (self.server.servers or []) for s in server.sockets]
        return sockets[0].getsockname()[1] if sockets else 0

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
