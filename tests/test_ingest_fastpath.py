"""The parse workers' fast path (``ingest.fastpath``) gives exactly what the general path gives.

Every line below goes through both: ``fastpath.unit`` and ``LineParser.feed_bytes`` → the unit the
workers send (``parse_pool._unit``: the stored column values, the attributes' JSON text, the raw
hash, the dedup key, the ledger leaf template). Where the fast path answers, the general path must
give that very unit, mask nothing and reject nothing; where it declines (None), the general path
decides alone. Lines: the shipped samples of every format, the bench's shape, and hand-made and
random variations of a Fluent Bit record around Spring ECS 3.4 flat and 3.5 nested lines — PANs in
the message, in an MDC field, in Kubernetes labels and only on one side of the merged pair,
duplicate keys at every level, naive and unreadable timestamps, missing ids and times, malformed
trace ids and latencies, escapes, partial lines, over-long fields.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from collector.ingest import fastpath, parse_pool
from collector.ingest.parser import LineParser
from tests.line_reader import chunk_from_lines

DATA = Path(__file__).parent / "data" / "logs"
SOURCE = "/var/log/containers/fraud-api.log"

K8S = {"pod_name": "fraud-api-7c9d8-x2k4q", "namespace_name": "risk-inference",
       "pod_id": "0f3c2a9e-6a51-4d0e-9d7e-1b2c3d4e5f60",
       "labels": {"app.kubernetes.io/name": "fraud-api", "pod-template-hash": "7c9d8"}, "host": "gpu-node-07",
       "pod_ip": "10.4.7.21", "container_name": "api",
       "docker_id": "a3f1c9e27b5d4c8e9f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6",
       "container_image": "registry.example/fraud-api:2.7.1"}
NESTED = {"@timestamp": "2025-03-04T10:15:00.067462Z", "log": {"level": "INFO", "logger": "com.example.fraud.Scoring"},
          "process": {"pid": 1, "thread": {"name": "http-nio-8080-exec-3"}},
          "service": {"name": "fraud-api", "version": "2.7.1"}, "message": "scored",
          "traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "00f067aa0ba902b7", "txn_id": "T-000193",
          "model_name": "fraud_xgb", "model_version": "7", "decision": "DECLINE", "latency_ms": 12.4,
          "ecs": {"version": "8.11"}}
FLAT = {"@timestamp": "2025-03-04T10:15:00.067Z", "log.level": "INFO", "log.logger": "com.example.fraud.Scoring",
        "process.pid": 1, "process.thread.name": "main", "service.name": "fraud-api", "message": "scored",
        "ecs.version": "8.11", "mdc": {"txn_id": "T-34", "decision": "APPROVE", "latency_ms": "7.25"},
        "traceId": "4bf92f3577b34da6", "spanId": "00f067aa0ba902b7"}


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def fluent(app, /, *, log=None, k8s=None, merge_key: str = "app", **top) -> str:
    """A Fluent Bit record (Merge_Log_Key + Keep_Log On) around ``app``; ``log`` overrides the raw
    line (default: ``app`` as compact JSON); ``top`` adds or replaces (None: drops) top-level keys."""
    rec = {"date": "2025-03-04T10:15:00.067901Z", "time": "2025-03-04T10:15:00.067901337Z", "stream": "stdout",
           "_p": "F", "log": _compact(app) if log is None else log, merge_key: app,
           "kubernetes": dict(K8S) if k8s is None else k8s}
    for k, v in top.items():
        if v is None:
            rec.pop(k, None)
        else:
            rec[k] = v
    return _compact(rec)


def _with(base: dict, **changes) -> dict:
    out = dict(base)
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def hand_made() -> list[str]:
    """Realistic and hostile variations, one property each."""
    pan, pan_dashed = "4111 1111 1111 1111", "5500-0000-0000-0004"
    lines = [
        fluent(NESTED), fluent(FLAT), fluent(NESTED, merge_key="log_processed"),
        # PANs: message, MDC field, a label, a Luhn-valid digit run in the id, only in the raw line
        fluent(_with(NESTED, message=f"scored card {pan}")),
        fluent(_with(FLAT, mdc={"txn_id": "T-35", "card": pan_dashed})),
        fluent(NESTED, k8s=_with(K8S, labels={"card": "4111111111111111"})),
        fluent(_with(NESTED, txn_id="4111111111111111")),
        fluent(NESTED, log=_compact(_with(NESTED, message=f"card {pan}"))),
        fluent(_with(NESTED, latency_ms=4.111111111111111e15)),
        # a card layout with dots among its separators; PANs as a latency and as a time (numbers, strings)
        fluent(_with(NESTED, message="card 4111 1111-1111.1111")), fluent(_with(NESTED, message="amex 3782.822463 10005")),
        fluent(_with(NESTED, latency_ms=4111111111111111)), fluent(_with(NESTED, latency_ms="5500000000000004")),
        fluent(_with(NESTED, **{"@timestamp": "4111111111111111"})), fluent(_with(NESTED, **{"@timestamp": 378282246310005})),
        fluent(_with(NESTED, message="v1.2.3 at 10.4.12.21 took 12.345", latency_ms=1234.5678)),
        fluent(_with(NESTED, message="ref ٤١١١١١١١١١١١١١١١")),  # Arabic-Indic digits
        # a card layout only the flattened names show (Spring 3.5 nests dotted MDC names)
        fluent(_with(NESTED, **{"4790": {"4242": {"7528": {"3271": "x"}}}})),
        fluent(_with(NESTED, mdc={"ref": {"2024": {"0611": "x"}}})),  # digits, no card: the fast path keeps it
        # duplicate keys: top level, in kubernetes, in the app object (both sides), agreeing or not
        fluent(NESTED).replace('"stream":"stdout"', '"stream":"stdout","stream":"stderr"'),
        fluent(NESTED).replace('"stream":"stdout"', '"stream":"stdout","stream":"stdout"'),
        fluent(NESTED).replace('"host":"gpu-node-07"', '"host":"gpu-node-07","host":"gpu-node-08"'),
        fluent(NESTED).replace('"txn_id":"T-000193"', '"txn_id":"T-000193","txn_id":"T-2"'),
        fluent(NESTED).replace('\\"txn_id\\":\\"T-000193\\"', '\\"txn_id\\":\\"T-000193\\",\\"txn_id\\":\\"T-9\\"'),
        fluent(NESTED).replace('"_p":"F",', '"_p":"F","log":{"level":"INFO"},'),
        # timestamps: naive, unreadable, missing (envelope time used), none at all, epoch, zone offset
        fluent(_with(NESTED, **{"@timestamp": "2025-03-04T10:15:00.067"})),
        fluent(_with(NESTED, **{"@timestamp": "2025-03-04 10:15:00"})),
        fluent(_with(NESTED, **{"@timestamp": "yesterday"})),
        fluent(_with(NESTED, **{"@timestamp": None})),
        fluent(_with(NESTED, **{"@timestamp": None}), time=None),
        fluent(_with(NESTED, **{"@timestamp": None}), time=None, date=None),
        fluent(_with(NESTED, **{"@timestamp": None}), time="not a time"),
        fluent(_with(NESTED, **{"@timestamp": None}), time=1741083300.067),
        fluent(_with(NESTED, **{"@timestamp": "2025-03-04T11:15:00.067+01:00"})),
        fluent(_with(NESTED, **{"@timestamp": "2025-03-04T11:15:00.067462Z"})),  # CET written with a Z: after the write
        fluent(_with(NESTED, **{"@timestamp": "2025-03-04T10:15:00.967Z"})),  # 0.9 s after it: within the slack
        fluent(_with(NESTED, **{"@timestamp": "2025-02-30T10:15:00Z"})),
        fluent(NESTED, time="2025-03-04T10:15:00"),
        # local times a daylight-saving change repeats and skips (Europe/Berlin and Europe/Warsaw alike)
        fluent(_with(NESTED, **{"@timestamp": "2026-10-25T02:30:00.000"})),
        fluent(_with(NESTED, **{"@timestamp": "2026-03-29T02:30:00"})),
        fluent(_with(NESTED, **{"@timestamp": "9999999-01-01T00:00:00Z"})),
        # ids: missing, empty, a number, a boolean, too long, blank
        fluent(_with(NESTED, txn_id=None)), fluent(_with(NESTED, txn_id="")), fluent(_with(NESTED, txn_id=987654)),
        fluent(_with(NESTED, txn_id=True)), fluent(_with(NESTED, txn_id="T" * 300)), fluent(_with(NESTED, txn_id="  ")),
        fluent(_with(NESTED, transactionId="T-alias", txn_id=None)),
        # trace / span / latency / model fields
        fluent(_with(NESTED, traceId="xyz")), fluent(_with(NESTED, traceId="0" * 32)), fluent(_with(NESTED, spanId=12)),
        fluent(_with(NESTED, latency_ms="12.5")), fluent(_with(NESTED, latency_ms="fast")),
        fluent(_with(NESTED, latency_ms=True)), fluent(_with(NESTED, latency_ms=10 ** 30)),
        fluent(_with(NESTED, model_version="v" * 80)), fluent(_with(NESTED, decision=["A"])),
        fluent(_with(NESTED, model_name=" fraud ")),
        # envelope variations
        fluent(NESTED, k8s=_with(K8S, pod_id="0F3C2A9E-6A51-4D0E-9D7E-1B2C3D4E5F60")),
        fluent(NESTED, k8s=_with(K8S, pod_id="not-a-uid", docker_id="containerd://ABC")),
        fluent(NESTED, k8s=_with(K8S, labels={}, container_image="", pod_ip=None)),
        fluent(NESTED, k8s=_with(K8S, namespace_name="", host=7)),
        # the per-pod cache: a value that cannot be a key, and keys equal but for one value's type or case
        fluent(NESTED, k8s=_with(K8S, pod_name=["fraud-api"])), fluent(NESTED, k8s=_with(K8S, host={"n": 1})),
        fluent(NESTED, k8s=_with(K8S, host=1)), fluent(NESTED, k8s=_with(K8S, host=True)),
        fluent(NESTED, k8s=_with(K8S, host=1.0)), fluent(NESTED, k8s=_with(K8S, docker_id="docker://A3F1C9E2")),
        fluent(NESTED, k8s=_with(K8S, docker_id="docker://a3f1c9e2")),
        fluent(NESTED, k8s=_with(K8S, namespace_name="n" * 300)),
        fluent(NESTED, docker={"container_id": "abc"}),  # fluentd
        fluent(NESTED, k8s=_with(K8S, namespace_id="x")),
        fluent(NESTED, k8s={"pod_namespace": "x", "pod_uid": "y"}),  # vector
        fluent(NESTED, stream=None), fluent(NESTED, stream=""), fluent(NESTED, logtag="F", _p=None),
        fluent(NESTED, extra_key={"txn_id": "T-other"}),
        # the merged pair: different, reordered, whitespace, missing merged object, plain text log
        fluent(NESTED, log=_compact(_with(NESTED, decision="APPROVE"))),
        fluent(NESTED, log=json.dumps(NESTED)),  # spaces: not the merged object's encoding
        fluent(NESTED, log=" " + _compact(NESTED)), fluent(NESTED, log=_compact(NESTED) + "\n"),
        fluent(NESTED, app=None), fluent(NESTED, log="scored", app=None), fluent(NESTED, log=None),
        fluent(NESTED, log=_compact(NESTED).replace("scored", "sc\\u006fred")),
        # escapes and odd text
        fluent(_with(NESTED, message="caf\u00e9 \u2028 ok")), fluent(_with(NESTED, message="tab\tand \"quote\"")),
        fluent(_with(NESTED, message="nul \x00 here")), fluent(NESTED) + "\r", " " + fluent(NESTED),
        "\ufeff" + fluent(NESTED), fluent(NESTED) + " ",
        # partials: a P chunk then its F chunk, and a record after an unfinished P
        fluent(NESTED, _p="P", log='{"txn_id":"T-p",', app=None),
        fluent(NESTED, log='"decision":"A"}', app=None),
        fluent(NESTED, _p="P", log='{"txn_id":"T-q",', app=None),
        fluent(NESTED),
    ]
    return lines


def random_variations(n: int, seed: int) -> list[str]:
    """Random edits of the Fluent Bit record: fields dropped, retyped, renamed, PANs and escapes added."""
    rnd = random.Random(seed)
    values = [None, "", " ", "x", "4111111111111111", "4111 1111 1111 1111", 0, 1, -1, 1.5, 1e300, 10 ** 19,
              True, [], {}, {"a": 1}, "2025-03-04T10:15:00Z", "2025-03-04T10:15:00", "T-1", "é", "0" * 32]
    out = []
    for i in range(n):
        app = dict(rnd.choice([NESTED, FLAT]))
        app["txn_id" if "txn_id" in app else "traceId"] = f"T-{i}"
        for _ in range(rnd.randint(0, 3)):
            key = rnd.choice(list(app) + ["decision", "model_version", "latency_ms", "spanId", "mdc", "x.y"])
            app[key] = rnd.choice(values)
        k8s = dict(K8S)
        if rnd.random() < 0.3:
            k8s[rnd.choice(list(K8S))] = rnd.choice(values)
        top = {}
        if rnd.random() < 0.2:
            top[rnd.choice(["time", "date", "stream", "_p"])] = rnd.choice(values)
        log = None
        if rnd.random() < 0.1:
            log = _compact(dict(app, message="different"))
        out.append(fluent(app, log=log, k8s=k8s, **top))
    return out


def samples() -> list[str]:
    return [ln for p in sorted(DATA.iterdir()) if p.suffix in (".jsonl", ".json", ".log")
            for ln in p.read_text().splitlines() if ln.strip()]


def _general(parser: LineParser, data: bytes, position: str):
    before = parser.masker.masked
    units = [parse_pool._unit(o) for o in parser.feed_bytes(data, SOURCE, position)]
    return units, parser.masker.masked - before


@pytest.mark.parametrize("cluster,default_tz", [("bench", None), (None, "Europe/Berlin")])
def test_the_fast_path_gives_the_general_paths_unit_or_declines(cluster, default_tz):
    lines = hand_made() + random_variations(1500, seed=11) + samples()
    fast_parser = LineParser(cluster=cluster, default_tz=default_tz)
    general_parser = LineParser(cluster=cluster, default_tz=default_tz)
    taken = 0
    for n, line in enumerate(lines, start=1):
        data = line.encode("utf-8", "surrogatepass")
        # Both parsers see every line (the partial-line state moves alike); the fast one first tries its path.
        fast = fastpath.unit(fast_parser, data, SOURCE, str(n))
        general, masked = _general(general_parser, data, str(n))
        if fast is None:
            assert _general(fast_parser, data, str(n)) == (general, masked)
            continue
        taken += 1
        assert general == [fast], line
        assert masked == 0 and fast_parser.masker.masked == general_parser.masker.masked, line
    assert taken > 400  # the fast path is exercised (most random variations stay in its shape)


def test_the_fast_path_declines_every_line_the_general_path_masks_or_rejects():
    parser, general_parser = LineParser(cluster="c"), LineParser(cluster="c")
    for n, line in enumerate(hand_made() + random_variations(600, seed=5), start=1):
        data = line.encode("utf-8", "surrogatepass")
        general, masked = _general(general_parser, data, str(n))
        rejected = any(u[2] is None for u in general)
        fast = fastpath.unit(parser, data, SOURCE, str(n))
        if fast is None:
            parser.feed_bytes(data, SOURCE, str(n))  # keep the partial-line state in step
        if masked or rejected:
            assert fast is None, line


def test_parse_chunk_with_the_fast_path_gives_sequential_parsing(tmp_path):
    """A worker's chunk (fast path first, general path otherwise) = parsing line by line in order."""
    lines = hand_made() + random_variations(300, seed=3)
    sequential = LineParser(cluster="c")
    expected, masked = [], 0
    for n, line in enumerate(lines, start=1):
        got, m = _general(sequential, line.encode("utf-8", "surrogatepass"), str(n))
        expected += got
        masked += m
    parse_pool._init_worker({"cluster": "c"})
    try:
        chunk = parse_pool.parse_chunk(SOURCE, chunk_from_lines(
            [(n, line.encode("utf-8", "surrogatepass"), None) for n, line in enumerate(lines, start=1)]))
    finally:
        import gc

        gc.unfreeze()
        parse_pool._parser = None
    assert chunk.units == expected
    assert chunk.pan_masked == masked > 0
