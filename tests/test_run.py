"""`draudit run` as a process: health, readiness, metrics, ingestion and a clean SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import urllib3

from tests.watch_support import claim, wait_until

FLUENT_BIT_LINE = {
    "date": 1764442800.123456, "time": "2026-11-29T19:00:00.123456789Z", "stream": "stdout", "_p": "F",
    "log": json.dumps({"@timestamp": "2026-11-29T19:00:00.120Z", "log": {"level": "INFO", "logger": "c.b.r.ScoringController"},
                       "message": "scored transaction", "ecs": {"version": "8.11"}, "service": {"name": "fraud-scoring-service"},
                       "transaction": {"id": "TXN-RUN-0001"}, "model": {"name": "fraud-gbm", "version": "2.7.1"},
                       "decision": "APPROVE", "latency_ms": 7.4}),
    "kubernetes": {"pod_name": "fraud-scoring-service-7d9c-abcde", "namespace_name": "risk-inference",
                   "pod_id": "3f1c2b8e-4d5a-4e6f-9a0b-1c2d3e4f5a6b", "container_name": "risk-api", "host": "gpu-node-a"},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_serves_health_metrics_and_ingest_then_stops_on_sigterm(srv, database_url):
    env = {**os.environ, "DRAUDIT_DATABASE_URL": database_url, "DRAUDIT_INGEST_TOKEN": "s3cret-token",
           "DRAUDIT_HTTP_HOST": "127.0.0.1", "DRAUDIT_HTTP_PORT": str(_free_port()), "DRAUDIT_CLUSTER": "run-test"}
    subprocess.run([sys.executable, "-m", "collector.cli", "db", "upgrade"], env=env, check=True, capture_output=True)
    srv.apply(claim("fraud-gpu"))
    proc = subprocess.Popen([sys.executable, "-m", "collector.cli", "run", "--server", srv.url, "--no-scheduler"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{env['DRAUDIT_HTTP_PORT']}"
    http = urllib3.PoolManager(retries=False, timeout=5)
    try:
        wait_until(lambda: _status(http, base + "/livez") == 200, timeout_s=30, what="/livez")
        ready = wait_until(lambda: _status(http, base + "/readyz") == 200, timeout_s=30, what="/readyz")
        assert ready
        metrics = http.request("GET", base + "/metrics").data.decode()
        assert 'draudit_watch_relists_total{kind="ResourceClaim"}' in metrics
        # the per-kind series exist before their first increment, so alerts on rate() see them
        assert 'draudit_watch_gaps_total{kind="Pod"} ' in metrics
        assert 'draudit_watch_reconnects_total{kind="ResourceSlice"} ' in metrics
        body = (json.dumps(FLUENT_BIT_LINE) + "\n").encode()
        assert http.request("POST", base + "/v1/ingest", body=body, headers={"Content-Type": "application/x-ndjson"}).status == 401
        resp = http.request("POST", base + "/v1/ingest", body=body,
                            headers={"Content-Type": "application/x-ndjson", "Authorization": "Bearer s3cret-token"})
        assert resp.status == 200, resp.data
        assert json.loads(resp.data)["stored"] == 1
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        proc.wait(timeout=15)
        assert time.monotonic() - t0 < 8 and proc.returncode == 0, proc.stderr.read().decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()


def _status(http, url):
    try:
        return http.request("GET", url).status
    except urllib3.exceptions.HTTPError:
        return None


def test_run_on_a_port_in_use_is_one_line_naming_the_port(tmp_path):
    # A second collector (or anything else) already listens there: a user mistake, not a bug.
    from click.testing import CliRunner

    from collector.cli import cli
    db = f"sqlite:///{tmp_path / 'store.db'}"
    assert CliRunner().invoke(cli, ["db", "upgrade", "--database-url", db]).exit_code == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["run", "--server", "http://127.0.0.1:9", "--database-url", db,
                                          "--host", "127.0.0.1", "--port", str(port), "--no-scheduler"])
    assert result.exit_code == 2, result.output
    [line] = [x for x in result.output.splitlines() if x.startswith("draudit: error:")]  # (+ a no-token warning)
    assert "Traceback" not in result.output
    assert line.startswith(f"draudit: error: --host 127.0.0.1 --port {port}: cannot listen (")
    assert "in use" in line and "choose another --port" in line


def test_run_with_an_impossible_port_names_the_flag_that_was_given(tmp_path):
    from click.testing import CliRunner

    from collector.cli import cli
    result = CliRunner().invoke(cli, ["run", "--server", "http://127.0.0.1:9", "--database-url",
                                      f"sqlite:///{tmp_path / 'store.db'}", "--port", "99999"])
    assert result.exit_code == 2
    assert "--port must be a TCP port 1..65535" in result.output
