"""HTTP ingestion answers nobody saw: rejections counted and logged, an empty token file, a record
posted to /v1/logs, and a retry under a new request id — all over real HTTP against the
``draudit run`` app (``server.build_app`` + ``ingest_routes``) served by uvicorn on a loopback port.

A platform engineer's findings: 401/413/415/400 answers left no log line and no metric while
Fluent Bit and OTLP exporters drop what is answered 4xx (silent loss nobody could alert on); an
empty ``DRAUDIT_INGEST_TOKEN_FILE`` started a server refusing every request; one Fluent Bit record
sent to ``/v1/logs`` was answered ``{}`` 200 and lost; the same body sent twice through a proxy that
sets a new ``x-request-id`` per attempt was quarantined twice.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import urllib3
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from collector.errors import UserError
from collector.ingest.http import ingest_routes
from collector.server import HttpServer, build_app
from collector.settings import Settings
from collector.store.models import InferenceRecord, Quarantine
from collector.watcher import Readiness

DATA = Path(__file__).parent / "data" / "logs"
TOKEN = "rejections-t0ken-9f2c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NDJSON = {**AUTH, "Content-Type": "application/x-ndjson"}
OTLP_JSON = {**AUTH, "Content-Type": "application/json"}
FLUENT_BIT_RECORD = json.loads((DATA / "fluentbit_merge_log_key.jsonl").read_text().splitlines()[0])


class Served:
    """The run server's app on a free loopback port, with a urllib3 pool (no retries)."""

    def __init__(self, settings: Settings, sessions) -> None:
        app = build_app(lambda: Readiness(True, []), ingest_routes(settings, sessions))
        self.server = HttpServer(app, "127.0.0.1", 0)
        self.http = urllib3.PoolManager(retries=False, timeout=10)

    def __enter__(self) -> "Served":
        self.server.start()
        self.base = f"http://127.0.0.1:{self.server.port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> urllib3.BaseHTTPResponse:
        return self.http.request("POST", self.base + path, body=body, headers=headers)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = self.http.request("GET", self.base + "/metrics").data.decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


def _settings(database_url: str, **kw) -> Settings:
    return Settings(database_url=database_url, cluster="prod-eu", **{"ingest_token": TOKEN, **kw})


def _requests(metrics, path: str, code: int) -> float:
    return metrics.get(("draudit_ingest_requests_total", (("code", str(code)), ("path", path))), 0.0)


def _rejected(metrics, path: str, reason: str) -> float:
    return metrics.get(("draudit_ingest_requests_rejected_total", (("path", path), ("reason", reason))), 0.0)


def _count(sessions, model) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(model))


def test_every_rejection_is_counted_by_path_and_reason_and_logged_once(sessions, database_url, caplog):
    body = (json.dumps(FLUENT_BIT_RECORD) + "\n").encode()
    rejections = [  # (path, body, headers, status, reason)
        ("/v1/ingest", body, {"Content-Type": "application/x-ndjson", "X-Request-Id": "fb-nohdr-1"}, 401, "unauthorized"),
        ("/v1/logs", b"{}", {**OTLP_JSON, "Authorization": "Bearer not-the-token"}, 401, "unauthorized"),
        ("/v1/ingest", body * 40, NDJSON, 413, "too-large"),
        ("/v1/logs", gzip.compress(b"{}" + b" " * 100_000), {**OTLP_JSON, "Content-Encoding": "gzip"}, 413, "too-large"),
        ("/v1/ingest", b"\x92\xd7\x00", {**AUTH, "Content-Type": "application/msgpack"}, 415, "unsupported-media-type"),
        ("/v1/logs", b"x", {**AUTH, "Content-Type": "text/plain"}, 415, "unsupported-media-type"),
        ("/v1/ingest", b"\x1f\x8bnot gzip at all", {**NDJSON, "Content-Encoding": "gzip"}, 400, "bad-request"),
        ("/v1/logs", b'{"resourceLogs": 7}', OTLP_JSON, 400, "bad-request"),
    ]
    with Served(_settings(database_url, ingest_max_body_bytes=8192), sessions) as served:
        before = served.metrics()
        with caplog.at_level(logging.WARNING, logger="collector.ingest.http"):
            answered = [served.post(path, data, headers) for path, data, headers, _status, _reason in rejections]
            ok = served.post("/v1/ingest", body, {**NDJSON, "X-Request-Id": "fb-ok-1"})
            assert ok.status == 200, ok.data
        after = served.metrics()
    assert [r.status for r in answered] == [status for _path, _data, _headers, status, _reason in rejections]
    expected_rejected: dict[tuple[str, str], int] = {}
    expected_codes: dict[tuple[str, int], int] = {("/v1/ingest", 200): 1}
    for path, _data, _headers, status, reason in rejections:
        expected_rejected[(path, reason)] = expected_rejected.get((path, reason), 0) + 1
        expected_codes[(path, status)] = expected_codes.get((path, status), 0) + 1
    for path in ("/v1/ingest", "/v1/logs"):
        for reason in ("unauthorized", "too-large", "unsupported-media-type", "bad-request"):
            assert _rejected(after, path, reason) - _rejected(before, path, reason) == expected_rejected.get((path, reason), 0), \
                (path, reason)
        for code in (200, 400, 401, 413, 415):
            assert _requests(after, path, code) - _requests(before, path, code) == expected_codes.get((path, code), 0), \
                (path, code)

    lines = [r for r in caplog.records if r.name == "collector.ingest.http" and r.levelno == logging.WARNING]
    assert len(lines) == len(rejections)  # one per rejection, none for the 200
    for record, (path, _data, _headers, status, reason) in zip(lines, rejections):
        text = record.getMessage()
        assert f"path={path} status={status} reason={reason} client=127.0.0.1:" in text, text
        assert "request_id=" in text
    assert "request_id=fb-nohdr-1:" in lines[0].getMessage()  # the client's X-Request-Id, when it sends one
    assert "DRAUDIT_INGEST_MAX_BODY_BYTES" in lines[2].getMessage()  # the answer's message says the fix
    assert TOKEN not in caplog.text and "not-the-token" not in caplog.text  # never the token
    assert "fraud" not in caplog.text.lower() and "kubernetes" not in caplog.text  # nor the body
    # the answer names the request as the log line does
    assert [r.headers.get("X-Request-Id") for r in answered][0] == "fb-nohdr-1"
    assert all(f"request_id={r.headers.get('X-Request-Id')}:" in line.getMessage() for r, line in zip(answered, lines))


def test_the_rejection_series_exist_before_the_first_rejection(sessions, database_url):
    """An alert on ``increase(draudit_ingest_requests_rejected_total[…]) > 0`` needs the series at 0."""
    with Served(_settings(database_url), sessions) as served:
        metrics = served.metrics()
    for path in ("/v1/ingest", "/v1/logs"):
        for reason in ("unauthorized", "method-not-allowed", "too-large", "unsupported-media-type", "bad-request"):
            assert ("draudit_ingest_requests_rejected_total", (("path", path), ("reason", reason))) in metrics
        assert ("draudit_ingest_requests_total", (("code", "200"), ("path", path))) in metrics


@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_a_method_other_than_post_is_answered_405_counted_and_logged(sessions, database_url, caplog, method):
    """A shipper configured with another method (Vector's ``method = "put"``) or a probe's GET was
    answered 405 by the router: no count, no log line, nothing to alert on."""
    body = (json.dumps(FLUENT_BIT_RECORD) + "\n").encode()
    with Served(_settings(database_url), sessions) as served:
        before = served.metrics()
        with caplog.at_level(logging.WARNING, logger="collector.ingest.http"):
            answer = served.http.request(method, served.base + "/v1/ingest", body=body, headers=NDJSON)
        after = served.metrics()
    assert answer.status == 405 and answer.headers["Allow"] == "POST"
    assert f"{method} is not accepted on /v1/ingest; send the records with POST" in answer.data.decode()
    assert _requests(after, "/v1/ingest", 405) - _requests(before, "/v1/ingest", 405) == 1
    assert _rejected(after, "/v1/ingest", "method-not-allowed") - _rejected(before, "/v1/ingest", "method-not-allowed") == 1
    [line] = [r.getMessage() for r in caplog.records if r.name == "collector.ingest.http"]
    assert "path=/v1/ingest status=405 reason=method-not-allowed" in line
    assert _count(sessions, InferenceRecord) == 0


@pytest.mark.parametrize("content", ["", "  \n\t\n"])
def test_an_empty_token_file_refuses_to_start_naming_it(tmp_path, content):
    """It started, /readyz 200, and answered every POST 401 "ingestion is closed" (a Secret mounted
    empty); as an empty DRAUDIT_PAN_TOKEN_KEY_FILE, it is now refused at start, naming the file."""
    token_file = tmp_path / "token"
    token_file.write_text(content)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DRAUDIT_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}", "DRAUDIT_HTTP_HOST": "127.0.0.1",
           "DRAUDIT_HTTP_PORT": str(port), "DRAUDIT_INGEST_TOKEN_FILE": str(token_file)}
    env.pop("DRAUDIT_INGEST_TOKEN", None)
    subprocess.run([sys.executable, "-m", "collector.cli", "db", "upgrade"], env=env, check=True, capture_output=True)
    try:
        result = subprocess.run([sys.executable, "-m", "collector.cli", "run", "--server", "http://127.0.0.1:9",
                                 "--no-scheduler"], env=env, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"draudit run started with an empty token file: {exc.stderr!r}") from None
    assert result.returncode == 2, result.stderr
    assert f"DRAUDIT_INGEST_TOKEN_FILE={token_file}: the file is empty" in result.stderr
    assert "HTTP on" not in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(UserError, match="the file is empty"):
        Settings(ingest_token_file=str(token_file)).resolved_ingest_token()


def test_a_token_file_emptied_while_running_answers_503_and_logs_it(sessions, database_url, tmp_path, caplog):
    """Read per request (a rotated Secret is picked up): emptied afterwards, the shipper is told to
    retry (503 + Retry-After: nothing dropped) instead of 401 (chunk dropped), the log names the file."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    body = (json.dumps(FLUENT_BIT_RECORD) + "\n").encode()
    with Served(_settings(database_url, ingest_token=None, ingest_token_file=str(token_file)), sessions) as served:
        assert served.post("/v1/ingest", body, NDJSON).status == 200
        token_file.write_text("")
        with caplog.at_level(logging.WARNING, logger="collector.ingest.http"):
            r = served.post("/v1/ingest", body, NDJSON)
            assert r.status == 503 and r.headers["Retry-After"] == "5", r.data
            assert served.post("/v1/logs", b"{}", OTLP_JSON).status == 503
        assert f"DRAUDIT_INGEST_TOKEN_FILE={token_file}: the file is empty" in caplog.text
        assert str(token_file) not in r.data.decode()  # the client is not told where the server keeps it
        token_file.write_text(TOKEN)
        assert served.post("/v1/ingest", body, NDJSON).status == 200


def test_one_record_posted_to_v1_logs_is_400_naming_v1_ingest(sessions, database_url):
    """The OTLP spec makes receivers ignore unknown JSON fields, so such a body read as an empty
    request was answered ``{}`` 200 with nothing stored: no OTLP sender sends an object without
    ``resourceLogs`` but with other members (collector/ingest/http.py ``_misrouted_otlp_json``)."""
    with Served(_settings(database_url), sessions) as served:
        r = served.post("/v1/logs", json.dumps(FLUENT_BIT_RECORD).encode(), OTLP_JSON)
        assert r.status == 400 and r.headers["Content-Type"] == "application/json", r.data
        status = json.loads(r.data)
        assert status["code"] == 3 and "/v1/ingest" in status["message"] and "'date', 'time'" in status["message"]
        snake = served.post("/v1/logs", json.dumps({"resource_logs": []}).encode(), OTLP_JSON)
        assert snake.status == 400 and "resourceLogs" in json.loads(snake.data)["message"]
        # what the spec keeps valid: an empty request, and unknown members next to resourceLogs
        for doc in ({}, {"resourceLogs": []}, {"resourceLogs": None}, {"resourceLogs": [], "aNewerField": {"x": 1}}):
            ok = served.post("/v1/logs", json.dumps(doc).encode(), OTLP_JSON)
            assert (ok.status, json.loads(ok.data)) == (200, {}), doc
    assert _count(sessions, InferenceRecord) == 0 and _count(sessions, Quarantine) == 0


def test_a_retry_under_a_new_request_id_is_quarantined_once(sessions, database_url):
    """Envoy / Istio set a new x-request-id per attempt: the quarantine identity is the body's,
    the request id names the attempt (answer, log, the rows' run id)."""
    from collector.cli import cli

    ndjson = (DATA / "fluentbit_merge_log_key.jsonl").read_bytes()  # 2 records, 1 line quarantined
    otlp = (DATA / "otlp_logs.json").read_bytes()  # 1 record quarantined
    with Served(_settings(database_url), sessions) as served:
        first = json.loads(served.post("/v1/ingest", ndjson, {**NDJSON, "X-Request-Id": "envoy-a1"}).data)
        again = json.loads(served.post("/v1/ingest", gzip.compress(ndjson),
                                       {**NDJSON, "Content-Encoding": "gzip", "X-Request-Id": "envoy-b2"}).data)
        assert (first["quarantined"], again["quarantined"], again["duplicates"]) == (1, 1, 2)
        assert _count(sessions, Quarantine) == 1  # one per body, not one per attempt
        for rid in ("otel-1", "otel-2"):
            r = served.post("/v1/logs", otlp, {**OTLP_JSON, "X-Request-Id": rid})
            assert r.status == 200 and json.loads(r.data)["partialSuccess"]["rejectedLogRecords"] == "1"
        assert _count(sessions, Quarantine) == 2
        otlp_source = json.loads(r.data)["partialSuccess"]["errorMessage"].rsplit("--source ", 1)[1].rstrip(")")
        assert otlp_source.startswith("http:body-") and otlp_source != first["source"]
    assert (first["request_id"], again["request_id"]) == ("envoy-a1", "envoy-b2")
    assert first["source"] == again["source"] and first["source"].startswith("http:body-")
    listed = CliRunner().invoke(cli, ["quarantine", "--database-url", database_url, "--source", first["source"],
                                      "--output", "json"])
    assert listed.exit_code == 0, listed.output
    [row] = json.loads(listed.output)["lines"]
    assert (row["source"], row["position"], row["run_id"]) == (first["source"], "3", "envoy-a1")
