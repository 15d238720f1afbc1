"""``draudit watch`` (watcher only) and ``draudit run`` (watcher + HTTP server + scheduler)."""

from __future__ import annotations

import logging
import signal
import sys
import threading

import click

from collector.cli.options import database_option, open_store, settings_from
from collector.store.db import shown_url

log = logging.getLogger(__name__)


def _kube_options(fn):
    fn = click.option("--kubeconfig", default=None, metavar="FILE", help="kubeconfig file (env DRAUDIT_KUBECONFIG or KUBECONFIG; default: in-cluster service account, then ~/.kube/config).")(fn)
    fn = click.option("--context", "kube_context", default=None, help="kubeconfig context (env DRAUDIT_KUBE_CONTEXT).")(fn)
    fn = click.option("--server", "api_server", default=None, metavar="URL", help="Plain-HTTP API server URL, no authentication: the local simulator (python -m collector.sim), tests, the demo. In a cluster use the service account or --kubeconfig.")(fn)
    fn = click.option("--cluster", default=None, help="Name recorded with every row (env DRAUDIT_CLUSTER, default 'default').")(fn)
    fn = click.option("--leader-elect/--no-leader-elect", default=None, help="Lease leader election (env DRAUDIT_LEADER_ELECT).")(fn)
    return fn


def _wait_for_signal(stop: threading.Event) -> None:
    def handler(signum, _frame):
        log.info("received signal %s: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    while not stop.wait(0.5):
        pass


def _build_watcher(settings, sessions, api_server):
    from collector.kube.client import make_api_client
    from collector.watcher import Watcher

    api = make_api_client(kubeconfig=settings.kubeconfig, context=settings.kube_context, host=api_server)
    return Watcher(settings, sessions, api)


@click.command("watch")
@_kube_options
@database_option
@click.option("--exit-when-synced", is_flag=True, help="Exit 0 once every kind is listed and committed (for scripts).")
@click.option("--sync-timeout-s", default=120.0, show_default=True, help="With --exit-when-synced: give up after this long (exit 1).")
def watch_cmd(kubeconfig, kube_context, api_server, cluster, leader_elect, database_url, exit_when_synced, sync_timeout_s) -> None:
    """List-watch ResourceClaims, ResourceSlices, DeviceClasses and Pods (every pod: one without a claim
    makes its transactions no-claim, not no-pod) into the store."""
    settings = settings_from(database_url=database_url, kubeconfig=kubeconfig, kube_context=kube_context, cluster=cluster,
                             leader_elect=leader_elect)
    _engine, sessions = open_store(settings)
    watcher = _build_watcher(settings, sessions, api_server)
    watcher.start()
    click.echo(f"draudit watch: recording cluster {settings.cluster!r} into {shown_url(_engine.url)}"
               + ("" if exit_when_synced else " (SIGTERM or Ctrl-C to stop)"), err=True)
    stop = threading.Event()
    try:
        if exit_when_synced:
            ok = watcher.wait_synced(sync_timeout_s)
            click.echo("synced" if ok else "not synced within the timeout", err=not ok)
            if not ok:
                sys.exit(1)
        else:
            _wait_for_signal(stop)
    finally:
        watcher.stop()


@click.command("run")
@_kube_options
@database_option
@click.option("--host", "http_host", default=None, help="HTTP listen address (env DRAUDIT_HTTP_HOST, default 0.0.0.0).")
@click.option("--port", "http_port", type=int, default=None, help="HTTP port (env DRAUDIT_HTTP_PORT, default 8080).")
@click.option("--no-scheduler", is_flag=True, help="Do not run the periodic jobs (attribution, policies, packs).")
def run_cmd(kubeconfig, kube_context, api_server, cluster, leader_elect, database_url, http_host, http_port, no_scheduler) -> None:
    """Run the collector: watcher, HTTP server (/livez /readyz /metrics /v1/ingest /v1/logs), scheduler."""
    from collector.server import HttpServer, build_app

    settings = settings_from(database_url=database_url, kubeconfig=kubeconfig, kube_context=kube_context, cluster=cluster,
                             leader_elect=leader_elect, http_host=http_host, http_port=http_port)
    _engine, sessions = open_store(settings)
    if settings.resolved_ingest_token() is None:  # raises UserError for an unreadable token file
        click.echo("draudit run: no DRAUDIT_INGEST_TOKEN / DRAUDIT_INGEST_TOKEN_FILE: /v1/ingest and /v1/logs refuse every request",
                   err=True)
    watcher = _build_watcher(settings, sessions, api_server)
    from collector.ingest.http import ingest_routes
    from collector.scheduler import build_scheduler, check_job_inputs, load_schedule_config

    scheduler = None
    if not no_scheduler:
        # What the jobs read is checked now (bundle, signing key): a bad one refuses the start
        # instead of failing every run of a job behind a ready /readyz.
        config = load_schedule_config()
        for warning in check_job_inputs(settings, config):
            click.echo(f"draudit run: warning: {warning}", err=True)
        scheduler = build_scheduler(settings, sessions, config)
    http = HttpServer(build_app(watcher.readiness, ingest_routes(settings, sessions)), settings.http_host, settings.http_port)
    http.start()
    click.echo(f"draudit run: HTTP on {settings.http_host}:{http.port}", err=True)
    stop = threading.Event()
    try:
        if scheduler is not None:
            if settings.leader_elect:  # one replica runs the jobs: the Lease holder; a standby
                scheduler.start(paused=True)  # leaves the job store alone (no rescheduling)
                watcher.leadership_listeners.append(scheduler.follow_leadership)
            else:
                scheduler.start()
        watcher.start()
        _wait_for_signal(stop)
    finally:
        if scheduler is not None:
            scheduler.shutdown()
        watcher.stop()
        http.stop()


commands = [watch_cmd, run_cmd]
