"""A card number cut between two partial chunks that reach the collector apart.

Fluent Bit's classic ``cri`` parser can send the ``P`` chunk of a line at the end of one HTTP
request and its ``F`` chunk in the next; a log file can end in a ``P`` chunk continued in the next
file. The parser then never sees the two together: the ``P`` chunk is quarantined as
``incomplete-partial`` and the ``F`` chunk as ``unparseable``. Neither alone is a PAN, yet the two
stored texts together were one (newcomer test: ``card 41111111`` + ``11111111 ok``). Now the digits
that end an unfinished partial keep their first 6 (in every envelope, not only raw CRI), the
digits that start a continuation seen alone keep their last 4, and the quarantine hash is taken
over the masked text. Everything runs through ``IngestRun`` into a SQLite store (and the HTTP
endpoint), each fragment in a run of its own.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path

import pytest
from sqlalchemy import select
from starlette.applications import Starlette
from starlette.testclient import TestClient

from collector.ingest.http import ingest_routes
from collector.ingest.pan import mask_cut_start
from collector.ingest.parser import LineParser
from collector.ingest.pipeline import IngestRun
from collector.settings import Settings
from collector.store import migrate
from collector.store.db import make_engine, make_session_factory
from collector.store.models import InferenceRecord, Quarantine

PAN = "4111111111111111"
K8S = {"pod_name": "fraud-scoring-service-h8z6kd726d-s2rld", "namespace_name": "risk-inference",
       "pod_id": "65a064e2-a545-43d8-8e05-8a93667967d6", "host": "gpu-node-a", "container_name": "risk-api"}
APP_HEAD = '{"@timestamp": "2025-06-04T10:15:06.219335Z", "service.name": "fraud-scoring-service", "message": "card '
APP_TAIL = ' ok", "transaction.id": "SPLIT-1", "model.name": "fraud_xgb", "decision": "APPROVE", "latency_ms": 12.5}'
TOKEN = "s3cr3t-ingest-token"


def _fluent(tag_key: str, tag: str, log: str) -> str:
    return json.dumps({"time": "2025-06-04T10:15:06.1Z", "stream": "stdout", tag_key: tag, "log": log,
                       "kubernetes": K8S})


def _fluent_pair(tag_key: str) -> tuple[str, str]:
    return (_fluent(tag_key, "P", APP_HEAD + PAN[:8]), _fluent(tag_key, "F", PAN[8:] + APP_TAIL))


def _cri_pair(cut: int) -> tuple[str, str]:
    return (f"2025-06-04T10:15:06.1Z stdout P {APP_HEAD}{PAN[:cut]}",
            f"2025-06-04T10:15:06.1Z stdout F {PAN[cut:]}{APP_TAIL}")


def _docker_pair() -> tuple[str, str]:
    return (json.dumps({"log": APP_HEAD + PAN[:8], "stream": "stdout", "time": "2025-06-04T10:15:06.1Z"}),
            json.dumps({"log": PAN[8:] + APP_TAIL + "\n", "stream": "stdout", "time": "2025-06-04T10:15:06.1Z"}))


def _masked_fluent_pair(tag_key: str) -> tuple[str, str]:
    return (_fluent(tag_key, "P", APP_HEAD + "411111**"), _fluent(tag_key, "F", "****1111" + APP_TAIL))


def _vector(log: str, partial: bool) -> str:
    doc = {"file": "/var/log/pods/risk-inference_fraud-scoring-service-h8z6kd726d-s2rld_"
                   "65a064e2-a545-43d8-8e05-8a93667967d6/risk-api/0.log",
           "kubernetes": {"container_name": "risk-api", "pod_name": "fraud-scoring-service-h8z6kd726d-s2rld",
                          "pod_namespace": "risk-inference", "pod_node_name": "gpu-node-a",
                          "pod_uid": "65a064e2-a545-43d8-8e05-8a93667967d6"},
           "message": log, "source_type": "kubernetes_logs", "stream": "stdout",
           "timestamp": "2025-06-04T10:15:06.1Z"}
    return json.dumps({**doc, "_partial": True} if partial else doc)


CASES = {
    # name: (first file's line, second file's line, the two quarantined texts expected)
    "fluentbit-_p": (*_fluent_pair("_p"), _masked_fluent_pair("_p")),
    "fluentbit-logtag": (*_fluent_pair("logtag"), _masked_fluent_pair("logtag")),
    # the tester's c1.log / c2.log: 11 digits then 5
    "cri-11-5": (*_cri_pair(11), (f"2025-06-04T10:15:06.1Z stdout P {APP_HEAD}411111*****",
                                 f"2025-06-04T10:15:06.1Z stdout F *1111{APP_TAIL}")),
    "cri-8-8": (*_cri_pair(8), (f"2025-06-04T10:15:06.1Z stdout P {APP_HEAD}411111**",
                               f"2025-06-04T10:15:06.1Z stdout F ****1111{APP_TAIL}")),
    "docker-json": (*_docker_pair(), (
        json.dumps({"log": APP_HEAD + "411111**", "stream": "stdout", "time": "2025-06-04T10:15:06.1Z"}),
        json.dumps({"log": "****1111" + APP_TAIL + "\n", "stream": "stdout", "time": "2025-06-04T10:15:06.1Z"}))),
    # Vector kubernetes_logs with auto_partial_merge: false marks the chunks but the last "_partial": true
    "vector-_partial": (_vector(APP_HEAD + PAN[:8], True), _vector(PAN[8:] + APP_TAIL, False),
                        (_vector(APP_HEAD + "411111**", True), _vector("****1111" + APP_TAIL, False))),
}


@pytest.fixture
def sqlite_db(tmp_path):
    path = tmp_path / "draudit.db"
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    yield url, make_session_factory(engine), path
    engine.dispose()


def _runs(sessions, url: str, lines: list[str], tmp_path: Path) -> list[int]:
    """Each line in a file of its own, ingested by a run of its own; the runs' ``pan_masked``."""
    masked = []
    for i, line in enumerate(lines):
        path = tmp_path / f"part{i}.log"
        path.write_text(line + "\n", encoding="utf-8")
        run = IngestRun(sessions, Settings(database_url=url, cluster="prod-eu"), workers=1)
        with open(path, "rb") as f:
            run.ingest_stream(f, str(path))
        counts = run.finish()
        assert (counts.read, counts.stored, counts.quarantined) == (1, 0, 1)
        masked.append(counts.pan_masked)
    return masked


def _stored(sessions) -> list[Quarantine]:
    with sessions() as s:
        assert s.execute(select(InferenceRecord)).first() is None
        return list(s.execute(select(Quarantine).order_by(Quarantine.id)).scalars())


def _digit_runs(text: str) -> list[str]:
    return [re.sub(r"[ \-]", "", m) for m in re.findall(r"\d(?:[ \-]?\d)*", text)]


def _assert_no_pan_rebuilt(texts: list[str], db_path: Path, halves: tuple[str, str]) -> None:
    runs = [r for t in texts for r in _digit_runs(t)]
    for a, b in itertools.product(runs, repeat=2):
        assert PAN not in a + b, (a, b)
    assert PAN not in "".join(runs)
    blob = b"".join(p.read_bytes() for p in db_path.parent.glob(db_path.name + "*"))
    for piece in (PAN, *halves):
        assert piece.encode() not in blob, piece


@pytest.mark.parametrize("case", list(CASES))
def test_a_pan_cut_between_two_runs_cannot_be_rebuilt_from_quarantine(case, sqlite_db, tmp_path):
    url, sessions, db_path = sqlite_db
    first, second, (masked_first, masked_second) = CASES[case]
    assert _runs(sessions, url, [first, second], tmp_path) == [1, 1]
    rows = _stored(sessions)
    assert [r.reason.split(":")[0] for r in rows] == ["incomplete-partial", "unparseable"]
    assert [r.raw_text for r in rows] == [masked_first, masked_second]
    for r in rows:  # the hash is over the masked text: a hash of the cut digits would give them away
        assert r.raw_sha256 == hashlib.sha256(r.raw_text.encode("utf-8")).hexdigest()
    cut = 8 if case != "cri-11-5" else 11
    # the halves as the input had them, next to their context (a bare "11111" is in many hashes)
    _assert_no_pan_rebuilt([r.raw_text for r in rows], db_path,
                           (f"card {PAN[:cut]}", f"{PAN[cut:]} ok"))
    if cut == 8:
        blob = b"".join(p.read_bytes() for p in db_path.parent.glob(db_path.name + "*"))
        assert PAN[:8].encode() not in blob and PAN[8:].encode() not in blob


@pytest.mark.parametrize("case", list(CASES))
def test_the_two_chunks_in_one_run_still_give_the_record(case, sqlite_db, tmp_path):
    url, sessions, _ = sqlite_db
    path = tmp_path / "both.log"
    path.write_text("\n".join(CASES[case][:2]) + "\n", encoding="utf-8")
    run = IngestRun(sessions, Settings(database_url=url, cluster="prod-eu"), workers=1)
    with open(path, "rb") as f:
        run.ingest_stream(f, str(path))
    counts = run.finish()
    assert (counts.stored, counts.quarantined, counts.pan_masked) == (1, 0, 1)
    with sessions() as s:
        rec = s.execute(select(InferenceRecord)).scalar_one()
    assert rec.transaction_id == "SPLIT-1" and PAN not in json.dumps(rec.attributes)


def test_a_pan_cut_between_two_http_requests(sqlite_db):
    url, sessions, db_path = sqlite_db
    client = TestClient(Starlette(routes=ingest_routes(Settings(database_url=url, ingest_token=TOKEN,
                                                                cluster="prod-eu"), sessions)))
    first, second = _fluent_pair("_p")
    answers = []
    for i, line in enumerate((first, second)):
        r = client.post("/v1/ingest", content=(line + "\n").encode(), headers={
            "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-ndjson", "X-Request-Id": f"split-{i}"})
        assert r.status_code == 200, r.text
        answers.append((r.json()["quarantined"], r.json()["pan_masked"]))
    assert answers == [(1, 1), (1, 1)]
    rows = _stored(sessions)
    assert [r.raw_text for r in rows] == list(_masked_fluent_pair("_p"))
    _assert_no_pan_rebuilt([r.raw_text for r in rows], db_path, (PAN[:8], PAN[8:]))


@pytest.mark.parametrize("text, masked", [
    ("11111111 ok", "****1111 ok"),
    (" 1111 1111 ok", " ****1111 ok"),                 # separators before the run stay, inside it go
    ("\\u00201111\\u00201111 ok", "\\u0020****1111 ok"),  # separator escapes
    ("\\u003111111 ok", "**1111 ok"),                 # a digit written as an escape
    ("\ufffd11111 ok", "\ufffd*1111 ok"),              # after a multi-byte character cut at the start
])
def test_digits_at_the_start_of_a_continuation_keep_their_last_four(text, masked):
    assert mask_cut_start(text) == (masked, 1)
    assert mask_cut_start(masked) == (masked, 0)


@pytest.mark.parametrize("text", ["1111 ok", "ok 11111111", "{\"n\": 11111111}", "*1111 ok", ""])
def test_short_or_inner_or_masked_runs_are_not_taken_for_a_cut_pan_end(text):
    assert mask_cut_start(text) == (text, 0)


def test_a_complete_line_that_fails_is_quarantined_as_before():
    # a JSON payload (it starts with "{"), and a plain-text line without leading digits
    parser = LineParser()
    line = _fluent("_p", "F", '{"message": "no id"}')
    (out,) = parser.feed_text(line, "src", "1")
    assert out.reason.startswith("missing-transaction-id") and out.raw_text == line
    line = _fluent("_p", "F", "plain text of no digits")
    (out,) = parser.feed_text(line, "src", "2")
    assert out.raw_text == line and parser.masker.masked == 0
    # digits ending a rejected payload: they may be a PAN a shipper's line limit cut (below), as the
    # digits ending a rejected bare line may (``LineParser.reject``): first 6 kept
    (out,) = parser.feed_text(_fluent("_p", "F", "plain text 11111111"), "src", "3")
    assert out.raw_text == _fluent("_p", "F", "plain text 111111**") and parser.masker.masked == 1


@pytest.mark.parametrize("text", ["2025-06-04 10:15:06.219 INFO 1 --- [main] o.s.b.w.e.tomcat.TomcatWebServer : Tomcat started",
                                  "2025/06/04 10:15:06 fraud-api started"])
def test_a_plain_text_log_lines_leading_date_is_not_taken_for_the_end_of_a_card_number(text):
    assert mask_cut_start(text) == (text, 0)
    assert mask_cut_start("1111 1111 ok") == ("****1111 ok", 1)  # a card number's tail still is


_VECTOR_CUT = ('{"timestamp":"2025-06-04T10:15:00.067901337Z","stream":"stdout","message":"{\\"@timestamp\\":'
               '\\"2025-06-04T10:15:00Z\\",\\"txn_id\\":\\"T-V-1\\",\\"message\\":\\"pan 5500005555",'
               '"kubernetes":{"pod_name":"p","pod_namespace":"fraud","container_name":"api"},"source_type":"kubernetes_logs"}')
_FLUENT_CUT = ('{"date":1749032100.067901,"stream":"stdout","_p":"F","log":"{\\"@timestamp\\":\\"2025-06-04T10:15:00Z\\",'
               '\\"txn_id\\":\\"T-F-1\\",\\"message\\":\\"pan 5500 0055 55","kubernetes":{"pod_name":"p",'
               '"namespace_name":"fraud","container_name":"api"}}')


@pytest.mark.parametrize("line, kept", [(_VECTOR_CUT, "pan 550000****"), (_FLUENT_CUT, "pan 550000****")])
def test_a_payload_cut_inside_a_pan_within_a_complete_envelope_keeps_its_first_six(line, kept):
    """A tester's finding: a shipper's line limit cuts the application's line inside a card number
    while the envelope around it is complete JSON (Vector, Fluent Bit). The cut digits end the
    payload string, not the raw line, and were quarantined whole (10 of 16 digits, the other piece
    showing the last 4): they now keep their first 6, as in a bare or CRI line."""
    parser = LineParser(cluster="c")
    [out] = parser.feed_bytes(line.encode(), "shipper.jsonl", "1")
    assert out.record is None and out.reason.startswith("unparseable")
    assert kept in out.raw_text and "5500005555" not in out.raw_text.replace(" ", "")
    assert parser.masker.masked == 1
    assert json.loads(out.raw_text)  # still the envelope's JSON, the payload's digits starred in place
    # a payload that ends in a few digits but was quarantined for another reason keeps them
    [other] = LineParser(cluster="c").feed_bytes(line.replace("5500005555", "55").replace("5500 0055 55", "55")
                                                 .encode(), "shipper.jsonl", "1")
    assert "pan 55" in other.raw_text and "*" not in other.raw_text


def _sweep_pairs() -> list[tuple[str, str, str]]:
    """``(name, P line, F line)`` for a PAN, bare and grouped, cut at every position, in each envelope
    (the breaker's sweep: the raw lines joined by a newline and a runtime prefix showed no 13
    digits in a row, so the joined payload was never scanned)."""
    pairs = []
    for pan in (PAN, "4111 1111 1111 1111", "5500-0000-0000-0004"):
        for cut in range(1, len(pan)):
            head, tail = APP_HEAD + pan[:cut], pan[cut:] + APP_TAIL
            pairs.append((f"cri-{pan}-{cut}", f"2025-06-04T10:15:06.1Z stdout P {head}",
                          f"2025-06-04T10:15:06.2Z stdout F {tail}"))
            pairs.append((f"fluentbit-{pan}-{cut}", _fluent("_p", "P", head), _fluent("_p", "F", tail)))
            pairs.append((f"docker-{pan}-{cut}",
                          json.dumps({"log": head, "stream": "stdout", "time": "2025-06-04T10:15:06.1Z"}),
                          json.dumps({"log": tail + "\n", "stream": "stdout", "time": "2025-06-04T10:15:06.2Z"})))
    return pairs


def test_a_pan_cut_anywhere_between_two_chunks_of_one_run_is_masked_in_the_record(sqlite_db, tmp_path):
    url, sessions, db_path = sqlite_db
    pairs = _sweep_pairs()
    for i, (name, first, second) in enumerate(pairs):
        path = tmp_path / f"{name.split('-')[0]}-{i}.log"  # one file per pair: one stream each
        path.write_text(first.replace("SPLIT-1", f"SPLIT-{i}") + "\n" + second.replace("SPLIT-1", f"SPLIT-{i}") + "\n")
        run = IngestRun(sessions, Settings(database_url=url, cluster="prod-eu"), workers=1)
        with open(path, "rb") as f:
            run.ingest_stream(f, str(path))
        counts = run.finish()
        assert (counts.stored, counts.quarantined, counts.pan_masked) == (1, 0, 1), name
    with sessions() as s:
        messages = [r.attributes["message"] for r in s.execute(select(InferenceRecord)).scalars()]
    assert len(messages) == len(pairs)
    assert {re.sub(r"[ \-]", "", m) for m in messages} == {"card411111******1111ok", "card550000******0004ok"}
    blob = b"".join(p.read_bytes() for p in db_path.parent.glob(db_path.name + "*"))
    for pan in (PAN, "4111 1111 1111 1111", "5500000000000004", "5500-0000-0000-0004"):
        assert pan.encode() not in blob
