"""The ingest fast paths give exactly what the slow, obviously-correct paths give.

- ``jsondoc.Decoder``: orjson with the duplicate-key / big-integer / exponent checks vs the
  standard decoder with the duplicate-aware ``object_pairs_hook``;
- ``ledger.leaf_hash``: one orjson call vs ``SHA-256(canonical_json(row_content(...)))``;
- parse workers (``parse_pool``) vs parsing in the run's own process, with partial lines cut by
  chunk edges;
- driver-level inserts (COPY / multi-row VALUES) vs the values SQLAlchemy's types would store.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import select

from collector.ingest import parse_pool
from collector.ingest.jsondoc import Decoder
from collector.ingest.pan import mask_text
from collector.ingest.parser import LineParser
from collector.ingest.pipeline import IngestRun
from collector.ingest.record import PREPARED_COLUMNS
from collector.settings import Settings
from collector.store import ledger
from collector.store.canonical import canonical_json
from collector.store.models import InferenceRecord, Quarantine

DATA = Path(__file__).parent / "data" / "logs"
APP = ('{"@timestamp":"2025-03-04T10:15:00.067462Z","log":{"level":"INFO","logger":"c.e.Scoring"},'
       '"message":"scored","txn_id":"T-1","decision":"DECLINE","latency_ms":12.4,"ecs":{"version":"8.11"}}')

# Texts on which orjson alone would differ from the standard decoder, or must not be trusted.
TRICKY = [
    APP,
    '{"a":1,"a":1}',                                   # duplicate, same value
    '{"a":1,"a":2}',                                   # duplicate, different values
    '{"x":{"k":"v","k":"w"},"y":[{"z":1,"z":1}]}',     # nested duplicates
    '{"a":"x:y:z","b":"http://h:80/p","a":"x:y:z"}',   # colons in strings + duplicate
    '{"a":"x\\u003ay"}',                               # escaped colon
    '{"a":"x\\u003Ay","a":"x:y"}',                     # escaped colon hiding a duplicate
    '{"n":18446744073709551615}',                      # largest uint64: same in both
    '{"n":18446744073709551616}',                      # beyond 64 bits: orjson would give a float
    '{"n":-9223372036854775809}',
    '{"f":4.111111111111111e15}',                      # exponent: the PAN pre-filter must hear of it
    '{"f":1.5E3,"g":1e-7}',
    '{"f":1e400}',                                     # orjson rejects, stdlib gives inf
    '{"f":NaN,"g":-Infinity}',
    '{"s":"\\ud800"}',                                 # lone surrogate
    '{"s":"e+ is not a number here"}',
    '{"s":"caf\u00e9 \u00fc:\u00df"}',                 # non-ASCII with a colon
    '{"a" : 1 , "b" :\t2 }',                           # whitespace around colons
    '{"a":1}x',                                        # trailing garbage
    '{"a":}',
    '[1,2,3]',
    '"just a string"',
]


def _slow(text: str):
    d = Decoder()
    try:
        got = d._decode_slow(text)
    except ValueError as exc:
        return ("error", str(exc)), False
    return (got.value, got.conflicts, got.top_conflicts), d.saw_exponent


def _fast(text: str):
    d = Decoder()
    try:
        got = d.decode(text)
    except ValueError as exc:
        return ("error", str(exc)), False
    return (got.value, got.conflicts, got.top_conflicts), d.saw_exponent


def _same(a, b) -> bool:
    # NaN != NaN: compare through repr, which also tells int from float
    return repr(a) == repr(b)


@pytest.mark.parametrize("text", TRICKY)
def test_decoder_fast_path_gives_the_standard_decoders_value_conflicts_and_exponent_flag(text):
    slow, slow_exp = _slow(text)
    fast, fast_exp = _fast(text)
    assert _same(fast, slow)
    # Never misses an exponent that matters: one on a float PanMasker inspects (|value| >= 1e12).
    if slow_exp and _large_floats(slow[0]):
        assert fast_exp


def _large_floats(value) -> bool:
    if isinstance(value, float):
        return abs(value) >= 1e12
    if isinstance(value, dict):
        return any(_large_floats(v) for v in value.values())
    if isinstance(value, list):
        return any(_large_floats(v) for v in value)
    return False


def test_decoder_reports_disagreeing_duplicates_found_by_the_colon_count():
    got = Decoder().decode('{"kubernetes":{"pod_name":"a","pod_name":"b"},"log":"x"}')
    assert got.conflicts == [("pod_name", "a", "b")]
    assert got.value["kubernetes"]["pod_name"] == "a"  # the first value is kept, as before


def test_every_sample_line_decodes_the_same_on_both_paths():
    lines = [ln for p in sorted(DATA.iterdir()) if p.suffix in (".jsonl", ".json")
             for ln in p.read_text().splitlines() if ln.strip()]
    assert len(lines) > 20
    for line in lines:
        assert _same(_fast(line)[0], _slow(line)[0]), line[:80]


def test_a_pan_written_as_an_exponent_number_is_masked():
    # 4.111111111111111e15 has no 13-digit run in the text; its value 4111111111111111.0 does.
    line = APP.replace('"latency_ms":12.4', '"amount":4.111111111111111e15')
    parser = LineParser()
    (out,) = parser.feed_text(line, "src", "1")
    assert out.record.attributes["amount"] == "411111******1111.0"
    assert parser.masker.masked == 1


def test_a_pan_grouped_by_json_escaped_tabs_is_masked():
    line = APP.replace('"scored"', '"card 4012\\t8888\\t8888\\t1881"')
    parser = LineParser()
    (out,) = parser.feed_text(line, "src", "1")
    assert out.record.attributes["message"] == "card 401288******1881"
    assert parser.masker.masked == 1


# Pieces of field text that the line pre-filter must see through: identifiers that are not PANs,
# PANs glued to them or next to them, separators (also as JSON escapes), escapes that decode to
# hex letters or separators.
_PAN_PIECES = ["4111111111111111", "4012 8888 8888 1881", "4012-8888-8888-1881", "5555\t5555\t5555\t4444", "4111",
               "1a26f889-3870-4800-949e-259b5f0e1c2d", "12345678-1234-1234-1234-123456789012", "bd6851676693403612",
               "abcdef", "ab", "cd", "x", "é", "%3D", "\b", "\f", "\n", " ", "-", "_", "0", "1111 ", "4929",
               "/", "\r", "  ", "\u00a0", "\\", "1111", "4111_1111", "4111/"]


def test_the_line_pre_filter_passes_every_line_in_which_masking_finds_a_pan():
    from random import Random

    from collector.ingest.pan import PanMasker, may_contain_pan

    rnd = Random(20251130)
    for _ in range(20_000):
        value = "".join(rnd.choice(_PAN_PIECES) for _ in range(rnd.randint(1, 6)))
        line = json.dumps({"txn_id": "T-1", "k": value}, ensure_ascii=rnd.random() < 0.3)
        masker = PanMasker()
        masker.value(json.loads(line))
        if masker.masked:
            assert may_contain_pan(line), line


def test_the_windowed_identifier_look_gives_the_whole_text_verdict():
    """``may_contain_pan``'s second look (identifiers blanked) searched window by window gives the
    verdict of blanking the whole text, on shipper lines whose application JSON is an escaped
    string holding the same fields as the merged object next to it (where ids are quoted twice)."""
    from random import Random

    from collector.ingest import pan

    def whole(text: str) -> bool:
        blanked = pan._UUID_OR_HEX_TOKEN.sub(pan._blank_identifier, text)
        return pan._has_digit_run(blanked.encode("utf-8", "surrogatepass").translate(pan._DIGITS_TO_ONES))

    rnd = Random(20251201)
    pieces = _PAN_PIECES + ["0ed904759531985d5d9dc9f81818e811892f902bd23f0824128b2f330c5c7fd0", "g", "%3D", "ab", "-",
                            "12345678-1234-1234-1234-123456789012", "1a26f889-3870-4800-949e-259b5d5a1b2c", "\\u00a0"]
    seen = {True: 0, False: 0}
    for _ in range(10_000):
        fields = {f"k{i}": "".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 3)))
                  for i in range(rnd.randint(1, 4))}
        app = json.dumps(fields)
        line = json.dumps({"log": app, "app": fields, "kubernetes": {"pod_id": rnd.choice(pieces)}})
        verdict = whole(line)
        assert pan._run_outside_identifiers(line) == verdict, line
        seen[verdict] += 1
        masker = pan.PanMasker()
        masker.value(json.loads(line))
        if masker.masked:
            assert pan.may_contain_pan(line), line
    assert seen[True] > 1000 and seen[False] > 1000  # both verdicts happened


def test_a_trace_id_with_a_long_digit_run_does_not_send_the_line_to_masking():
    # 13+ digits inside quoted hex ids (escaped inside the log string, and in the merged object):
    # not a PAN candidate for mask_text, so not for the pre-filter either.
    from collector.ingest.pan import mask_text, may_contain_pan

    trace = "4bf92f3577b34d1234567890123456ab"
    app = APP.replace('"txn_id"', f'"traceId":"{trace}","txn_id"')
    line = json.dumps({"log": app, "app": json.loads(app), "kubernetes": {"docker_id": "ab" + "1234567890123" * 4 + "cd"}})
    assert not may_contain_pan(line)
    assert mask_text(line) == (line, 0)


_MASK_PIECES = _PAN_PIECES + ["6011.0009.9013.9424", "\u0664\u0661\u0661\u0661" * 4, "\uff14\uff11\uff11\uff11" * 4,
                              "4111\u00a01111\u00a01111\u00a01111", "4111\\u00a01111\\u00a01111\\u00a01111",
                              '"timeUnixNano":"1741083300067462000"', "\\\\n", "T", ".", ",", '"', "u", "\\u00a0",
                              "1795987769.834784", "%3D", "ntru", "x" * 40]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_windowed_masking_of_a_long_line_is_masking_of_the_whole_text(seed):
    """``pan.mask_text`` on a long line searches only the runs that can hold a candidate; the
    result (text and count) is the search of the whole text, on lines with PANs in every spelling
    next to identifiers, escapes, dotted groups, non-ASCII digits and OTLP times."""
    from random import Random

    from collector.ingest import pan

    rnd = Random(seed)
    masked = 0
    for _ in range(1500):
        text = "".join(rnd.choice(_MASK_PIECES) for _ in range(rnd.randint(20, 80)))
        if rnd.random() < 0.5:
            text = json.dumps({"log": text, "k": text}, ensure_ascii=rnd.random() < 0.5)
        keep = rnd.random() < 0.3
        full = pan._mask_text(text, keep, windowed=False)
        assert pan._mask_text(text, keep, windowed=True) == full, text
        masked += full[1] > 0
    assert masked > 500
    fb = (DATA / "fluentbit_merge_keep_log.jsonl").read_text().splitlines()[0]
    line = fb.replace('"scored"', '"card 4111 1111 1111 1111"')
    assert len(line) >= pan.WINDOWED_FROM_CHARS and pan.mask_text(line)[1] >= 1
    assert pan.mask_text(line) == pan._mask_text(line, False, windowed=False)


# -- ledger leaves ------------------------------------------------------------------------------


def _reference_leaf(table, row) -> str:
    return hashlib.sha256(canonical_json(ledger.row_content(table, row))).hexdigest()


BERLIN = timezone(timedelta(hours=1))


@pytest.mark.parametrize("table_name,row", [
    ("quarantine", {"id": 1, "stage": "ingest", "source": "f", "position": None, "reason": "x", "raw_text": "y",
                    "raw_sha256": "0" * 64, "received_at": datetime(2025, 3, 4, 10, 15, tzinfo=timezone.utc), "run_id": None}),
    ("quarantine", {"id": 2, "stage": "ingest", "source": "f", "position": "3", "reason": "x", "raw_text": "y",
                    "raw_sha256": "0" * 64, "received_at": datetime(2025, 3, 4, 11, 15, 0, 5, tzinfo=BERLIN), "run_id": "r"}),
    ("quarantine", {"id": 3, "stage": "ingest", "source": "f", "position": None, "reason": "x", "raw_text": "y",
                    "raw_sha256": "0" * 64, "received_at": datetime(2025, 3, 4, 10, 15), "run_id": None}),  # naive
    ("quarantine", {"id": 4, "stage": "ingest", "source": datetime(2025, 1, 1), "position": None,  # datetime in a text column
                    "reason": "x", "raw_text": "y", "raw_sha256": "0", "received_at": None, "run_id": None}),
    ("inference_records", {"id": 5, "transaction_id": "T", "event_time_ns": 2**63 + 5, "attributes": {"n": 2**70}}),
    ("inference_records", {"id": 6, "transaction_id": "T", "attributes": {"at": datetime(2025, 1, 1, tzinfo=timezone.utc),
                                                                          "d": Decimal("1.10"), "b": b"\x00\x01"}}),
    ("inference_records", {"id": 7, "transaction_id": "T", "latency_ms": 12.4, "conflict": True, "attributes": None}),
])
def test_leaf_hash_fast_path_is_the_canonical_definition(table_name, row):
    table = ledger.ledgered_table(table_name)
    assert ledger.leaf_hash(table, row) == _reference_leaf(table, row)


@pytest.mark.parametrize("table_name,row", [
    ("inference_records", {"id": 5, "transaction_id": "T", "event_time_ns": 2**63 + 5, "attributes": {"n": 2**70}}),
    ("inference_records", {"id": 6, "transaction_id": "T", "attributes": {"at": datetime(2025, 1, 1, tzinfo=timezone.utc),
                                                                          "d": Decimal("1.10"), "b": b"\x00\x01"}}),
    ("inference_records", {"id": 7, "transaction_id": "T-000193", "event_time_ns": 1_764_403_200_000_000_000,
                           "event_time_precision_ns": 1000, "received_ns": 1_764_403_201_000_000_000, "cluster": "c1",
                           "pod_uid": "0f9c2a4e-1b7d-4c1e-9a53-77d0c2b1e8aa", "pod_uid_source": "envelope",
                           "pod_namespace": "risk-inference", "pod_name": "fraud-api-7c9d8-x2x9q", "container_name": "api",
                           "node_name": "gpu-node-01", "model_name": "fraud_xgb", "model_version": "7", "decision": "DECLINE",
                           "latency_ms": 12.4, "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7",
                           "source_format": "spring_ecs_nested", "envelope": "fluentbit", "source": "/var/log/x.log",
                           "position": "193", "raw_sha256": "a" * 64, "dedup_key": "b" * 64, "run_id": "r", "conflict": True,
                           "attributes": {"message": "scored card 411111******1111", "envelope.labels": {"app": "fraud-api"},
                                          "envelope.runtime_time_ns": 1_764_403_200_412_337_000}}),
    ("inference_records", {"id": 8, "transaction_id": "T", "attributes": None}),  # columns missing from the tuple
    ("quarantine", {"id": 2, "stage": "ingest", "source": "f", "position": "3", "reason": "x", "raw_text": "y",
                    "raw_sha256": "0" * 64, "received_at": datetime(2025, 3, 4, 11, 15, 0, 5, tzinfo=BERLIN), "run_id": "r"}),
])
@pytest.mark.parametrize("fragment", [False, True])
def test_ledger_entries_from_value_tuples_are_those_of_row_mappings(sessions, table_name, row, fragment):
    """``ledger.append_values`` (the writer's tuples) appends the entries ``ledger.append`` does."""
    import orjson

    if fragment and row.get("attributes") is not None:
        try:  # the writer hands over exactly-encoded attributes as their JSON text
            row = dict(row, attributes=orjson.Fragment(orjson.dumps(row["attributes"], option=orjson.OPT_SORT_KEYS)))
        except orjson.JSONEncodeError:
            pytest.skip("not exactly encodable: the writer passes the decoded value")
    columns = tuple(reversed(list(row)))  # any order
    heads = []
    for append in (lambda s: ledger.append(s, table_name, [row]),
                   lambda s: ledger.append_values(s, table_name, columns, [tuple(row[c] for c in columns)])):
        with sessions() as s:
            before = ledger.current_head(s)
            heads.append((append(s), before))
            s.rollback()
    (by_mapping, before_1), (by_tuple, before_2) = heads
    assert before_1 == before_2 and by_tuple == by_mapping and by_tuple.seq == before_1.seq + 1
    assert ledger._values_leaf(ledger.ledgered_table(table_name), columns)(tuple(row[c] for c in columns)) \
        == _reference_leaf(ledger.ledgered_table(table_name), row)


_FULL_ROW = {"transaction_id": "T-000193", "event_time_ns": 1_764_403_200_000_000_000, "event_time_precision_ns": 1000,
             "cluster": "c1", "pod_uid": "0f9c2a4e-1b7d-4c1e-9a53-77d0c2b1e8aa", "pod_uid_source": "envelope",
             "pod_namespace": "risk-inference", "pod_name": "fraud-api-7c9d8-x2x9q", "container_name": "api",
             "node_name": "gpu-node-01", "model_name": "fraud_xgb", "model_version": "7", "decision": "DECLINE",
             "latency_ms": 12.4, "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7",
             "source_format": "spring_ecs_nested", "envelope": "fluentbit", "source": "/var/log/x.log",
             "position": "193", "raw_sha256": "a" * 64, "dedup_key": "b" * 64}


@pytest.mark.parametrize("attributes", [
    None,
    {"message": "scored card 411111******1111", "envelope.labels": {"app": "fraud-api"},
     "envelope.runtime_time_ns": 1_764_403_200_412_337_000},
    # members named like the late columns, nested and at the top of the attributes object
    {"conflict": True, "id": None, "received_ns": 1, "run_id": "x", "z": {"id": 2, "conflict": "\",\"id\":"}},
    {"s": "caf\u00e9 \u2028 \"quoted\" \\ \t", "f": -0.0, "e": 1e300, "l": [1, {"b": 2, "a": 1}], "empty": {}},
    {"%b": "%s", "p": "50%", "nul": "\u0000"},
])
@pytest.mark.parametrize("overrides", [
    {},
    {"latency_ms": None, "trace_id": None, "span_id": None, "pod_uid": None, "position": None},
    {"transaction_id": "T\u00e9\"", "source": "/p/\u2603.log", "latency_ms": 1e-7},
    {"transaction_id": "100%b %s %%", "source": "/p/%d.log", "position": "%b"},
    {"transaction_id": "", "cluster": None, "event_time_ns": -2 ** 63, "event_time_precision_ns": 1},
])
@pytest.mark.parametrize("late", [(False, 1, 1_764_403_201_000_000_000, "r"), (True, 2 ** 62, 0, None)])
def test_ledger_leaf_completed_from_a_records_template_is_the_rows_leaf(attributes, overrides, late):
    """``record.ledger_template`` (made in a parse worker) completed by the writer
    (``ledger.leaf_from_template``) hashes the bytes ``leaf_hash`` hashes for the stored row."""
    import orjson

    from collector.ingest.record import LATE_COLUMNS, ledger_template

    row = dict(_FULL_ROW, **overrides)
    text = "null" if not attributes else orjson.dumps(attributes, option=orjson.OPT_SORT_KEYS).decode()
    values = tuple(row[c] for c in PREPARED_COLUMNS[:-1]) + (text,)
    template = ledger_template(values, True)
    assert template is not None and template.count(b"%b") - template.count(b"%%b") == len(LATE_COLUMNS)
    leaf = ledger.leaf_from_template(template, (text.encode(),) + tuple(orjson.dumps(v) for v in late))
    stored = dict(row, attributes=attributes, **dict(zip(LATE_COLUMNS[1:], late)))
    table = ledger.ledgered_table("inference_records")
    assert leaf == _reference_leaf(table, stored) == ledger.leaf_hash(table, stored)


def test_no_ledger_template_where_the_fast_leaf_encoding_does_not_apply():
    from collector.ingest.record import LATE_COLUMNS, ledger_template

    values = tuple(_FULL_ROW[c] for c in PREPARED_COLUMNS[:-1]) + ("null",)
    assert ledger_template(values, False) is None  # attributes text not exact
    big = tuple(2 ** 64 if c == "event_time_ns" else v for c, v in zip(PREPARED_COLUMNS, values))
    assert ledger_template(big, True) is None  # beyond 64 bits: canonical_json's fallback
    assert ledger.leaf_template("inference_records", PREPARED_COLUMNS, values, tuple(reversed(LATE_COLUMNS))) is None
    assert ledger.leaf_template("quarantine", ("id",), (1,), ("run_id",)) is None  # a datetime column


# -- parse workers ------------------------------------------------------------------------------


def _cri(ts: str, tag: str, content: str) -> str:
    return f"2025-03-04T10:15:{ts}Z stdout {tag} {content}"


def _mixed_lines(n: int) -> list[str]:
    """Fluent Bit / plain / CRI lines, with CRI P…F groups of 2-4 chunks at every offset."""
    fb = (DATA / "fluentbit_merge_keep_log.jsonl").read_text().splitlines()[0]
    out: list[str] = []
    i = 0
    while len(out) < n:
        app = APP.replace('"T-1"', f'"T-{i}"')
        if i % 9 == 0:
            app = app.replace('"scored"', '"card 4111 1111 1111 1111"')
        kind = i % 5
        if kind == 0:
            out.append(fb.replace("T-000193", f"T-{i}"))
        elif kind == 1:
            out.append(app)
        elif kind == 2:  # a partial group: the application line in 2-4 chunks
            parts = 2 + i % 3
            size = len(app) // parts + 1
            chunks = [app[k:k + size] for k in range(0, len(app), size)]
            for k, chunk in enumerate(chunks):
                out.append(_cri(f"00.{i:06d}", "F" if k == len(chunks) - 1 else "P", chunk))
        elif kind == 3:
            out.append("plain text, not JSON")
        else:
            out.append(app.replace('"txn_id"', '"txn_id":"dup","txn_id"'))
        i += 1
    out.append(_cri("59.000000", "P", '{"txn_id":"never-finished"'))  # left open at the end
    return out


class _CapturingRun(IngestRun):
    """An IngestRun that keeps the outcomes it would write, as comparable values."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list = []

    def _write(self, outcomes):
        self.counts.pan_masked = self.parser.masker.masked
        for o in outcomes:
            if o.record is not None:
                self.seen.append(("record", o.source, o.position, o.record.row(0, "r")))
            else:
                self.seen.append(("quarantine", o.source, o.position, o.reason, o.raw_text, o.raw_sha256))


@pytest.mark.parametrize("chunk_lines", [3, 7, 50])
def test_parse_workers_give_the_outcomes_of_parsing_in_order(tmp_path, monkeypatch, chunk_lines):
    monkeypatch.setattr(parse_pool, "CHUNK_LINES", chunk_lines)
    path = tmp_path / "mixed.log"
    path.write_text("\n".join(_mixed_lines(400)) + "\n")
    taken: list[bool] = []  # per chunk from a worker: re-parsed here (a partial line at an edge)?
    original_take = IngestRun._take

    def take(self, chunk, parsed, source):
        taken.append(self.parser.has_pending_partials or parsed.open_partial)
        original_take(self, chunk, parsed, source)

    monkeypatch.setattr(IngestRun, "_take", take)
    results = []
    for workers in (1, 3):
        run = _CapturingRun(None, Settings(cluster="c1"), workers=workers, batch_size=64)
        with open(path, "rb") as f:
            run.ingest_stream(f, str(path))
        counts = run.finish()
        results.append((run.seen, counts.as_dict(), dict(counts.reasons)))
    (seq, seq_counts, seq_reasons), (par, par_counts, par_reasons) = results
    assert par == seq
    assert (par_counts, par_reasons) == (seq_counts, seq_reasons)
    kinds = {s[3].split(":", 1)[0] for s in seq if s[0] == "quarantine"}
    assert {"duplicate-key", "unparseable", "incomplete-partial"} <= kinds
    assert seq_counts["pan_masked"] > 0 and seq_counts["read"] > 250
    assert True in taken and False in taken  # both kinds of chunk happened


def test_parallel_ingest_into_the_store_reconciles_and_the_ledger_verifies(sessions, tmp_path, monkeypatch):
    monkeypatch.setattr(parse_pool, "CHUNK_LINES", 40)
    path = tmp_path / "mixed.log"
    path.write_text("\n".join(_mixed_lines(300) * 2) + "\n")  # the second copy: duplicates
    run = IngestRun(sessions, Settings(cluster="c1"), workers=2, batch_size=100)
    with open(path, "rb") as f:
        run.ingest_stream(f, str(path))
    counts = run.finish()
    assert counts.reconciles and counts.duplicates > 0 and counts.stored > 0
    with sessions() as s:
        assert s.scalar(select(InferenceRecord.id).order_by(InferenceRecord.id.desc()).limit(1)) is not None
        stored = s.execute(select(InferenceRecord)).scalars().all()
        quarantined = s.execute(select(Quarantine)).scalars().all()
        verdict = ledger.verify(s)
    assert (len(stored), len(quarantined)) == (counts.stored, counts.quarantined)
    assert verdict.ok, verdict.first_break
    assert verdict.entries == counts.stored + counts.quarantined
    assert not any("4111 1111 1111 1111" in json.dumps(r.attributes) for r in stored if r.attributes)


# -- driver-level inserts -----------------------------------------------------------------------


def test_rows_written_through_the_driver_read_back_as_the_record(sessions, tmp_path):
    lines = [APP, APP.replace('"T-1"', '"T-2"').replace(',"latency_ms":12.4', ""),
             '{"@timestamp":"2025-03-04T10:15:00Z","txn_id":"T-3"}']  # no attributes at all
    path = tmp_path / "app.log"
    path.write_text("\n".join(lines) + "\n")
    parser = LineParser(cluster="c1")
    expected = {o.record.transaction_id: o.record.row(0, None) for n, line in enumerate(lines, 1)
                for o in parser.feed_text(line, str(path), str(n))}
    run = IngestRun(sessions, Settings(cluster="c1"), run_id="run-1")
    with open(path, "rb") as f:
        run.ingest_stream(f, str(path))
    assert run.finish().stored == 3
    with sessions() as s:
        rows = s.execute(select(InferenceRecord.__table__)).mappings().all()
    assert len(rows) == 3
    for row in rows:
        want = dict(expected[row["transaction_id"]], run_id="run-1", conflict=False)
        got = {k: v for k, v in row.items() if k not in ("id", "received_ns")}
        assert got == {k: v for k, v in want.items() if k != "received_ns"}
    assert {r["transaction_id"]: r["attributes"] for r in rows}["T-3"] is None


def test_the_utc_timestamp_shortcut_gives_the_iso_pattern_groups():
    """``timestamps._utc_groups`` (the common ``…Z`` shape, one match) returns what ``_ISO`` gives,
    on variants with wrong separators, fraction lengths, zones and non-ASCII digits."""
    from random import Random

    from collector.ingest import timestamps

    base = ["2025-11-29T08:00:00.412337Z", "2025-11-29T08:00:00Z", "2025-11-29 08:00:00,1Z",
            "2025-11-29t08:00:00.123456789Z", "2025-11-29T08:00:00.1234567890Z", "2025-11-29T08:00:00.Z",
            "2025-11-29T08:00:00+01:00", "\u0662025-11-29T08:00:00Z"]
    rnd = Random(5)
    hits = 0
    for _ in range(50_000):
        text = list(rnd.choice(base))
        for _ in range(rnd.randint(0, 2)):
            text[rnd.randrange(len(text))] = rnd.choice("0123456789-:TtZz., +\u0661x")
        text = "".join(text)
        got = timestamps._utc_groups(text)
        if got is not None:
            hits += 1
            assert got == timestamps._ISO.match(text).groups(), text
    assert hits > 10_000
    assert timestamps.parse_iso("2025-11-29T08:00:00.412337Z") == (1_764_403_200_412_337_000, 1000)


def test_ledger_times_written_through_the_driver_are_what_sqlalchemy_binds(sessions, monkeypatch):
    """``appended_at`` (COPY / executemany) and the head's ``updated_at`` (driver-level UPDATE) are
    stored as Core stores them, also for a whole second (SQLite text with ``.000000``)."""
    whole_second = datetime(2025, 3, 4, 10, 15, tzinfo=timezone.utc)

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return whole_second

    monkeypatch.setattr(ledger, "datetime", Frozen)
    row = {"id": 1, "stage": "ingest", "source": "f", "position": None, "reason": "x", "raw_text": "y",
           "raw_sha256": "0" * 64, "received_at": whole_second, "run_id": None}
    with sessions() as s:
        ledger.append(s, "quarantine", [row])
        ledger.append(s, "quarantine", [dict(row, id=2)])  # the head exists now: the UPDATE path
        conn = s.connection()
        stored = conn.exec_driver_sql("SELECT appended_at FROM ledger ORDER BY seq").scalars().all()
        head = conn.exec_driver_sql("SELECT updated_at FROM ledger_head").scalar_one()
        s.rollback()
    if conn.dialect.name == "sqlite":
        assert stored == ["2025-03-04 10:15:00.000000"] * 2 and head == "2025-03-04 10:15:00.000000"
    else:
        assert stored == [whole_second] * 2 and head == whole_second


def test_a_parallel_run_gives_the_garbage_collector_back_as_it_found_it(tmp_path, monkeypatch):
    import gc

    monkeypatch.setattr(parse_pool, "CHUNK_LINES", 20)
    path = tmp_path / "mixed.log"
    path.write_text("\n".join(_mixed_lines(120)) + "\n")
    before = (gc.get_threshold(), gc.get_freeze_count())
    seen = []
    original = IngestRun._take

    def take(self, chunk, parsed, source):  # while the run lasts: frozen, rarer young collections
        seen.append((gc.get_threshold()[0], gc.get_freeze_count() > 0))
        original(self, chunk, parsed, source)

    monkeypatch.setattr(IngestRun, "_take", take)
    run = _CapturingRun(None, Settings(cluster="c1"), workers=2, batch_size=64)
    with open(path, "rb") as f:
        run.ingest_stream(f, str(path))
    run.finish()
    assert seen and all(t >= 10_000 and frozen for t, frozen in seen)
    assert (gc.get_threshold(), gc.get_freeze_count()) == before
    gc.freeze()  # a caller's own freeze is left alone
    try:
        frozen = gc.get_freeze_count()
        run = _CapturingRun(None, Settings(cluster="c1"), workers=2, batch_size=64)
        with open(path, "rb") as f:
            run.ingest_stream(f, str(path))
        run.finish()
        assert frozen > 0 and gc.get_freeze_count() > 0  # not unfrozen by the run (frozen objects may die)
    finally:
        gc.unfreeze()


def _fluent_line(log_text: str, app_text: str | None) -> str:
    """A Fluent Bit record (kubernetes filter, ``Merge_Log_Key app``, ``Keep_Log On``) around ``log_text``,
    with ``app_text`` (JSON text) as the merged object, or none."""
    app = f',"app":{app_text}' if app_text is not None else ""
    return ('{"time":"2025-03-04T10:15:00.1Z","stream":"stdout","_p":"F","log":'
            + json.dumps(log_text, ensure_ascii=False) + app
            + ',"kubernetes":{"pod_name":"fraud-api-1","namespace_name":"risk","pod_id":'
            '"0b2f3c8e-6f1a-4d2b-9c1e-2f6b8a7d4e10","container_name":"api","host":"gpu-node-01"}}')


MERGED_CASES = [
    (APP, APP),                                                                     # the same object
    (APP, APP.replace('"DECLINE"', '"APPROVE"')),                                   # the object differs
    (APP, APP.replace('"txn_id":"T-1",', '')),                                      # a member missing
    (APP.replace('12.4', '12.40'), APP.replace('12.4', '12.40')),                   # a number not as orjson writes it
    (APP.replace('"scored"', '"card 4111 1111 1111 1111"'),) * 2,                   # a PAN in both
    (APP.replace('12.4', '1.24e+1'),) * 2,                                          # an exponent
    (APP.replace('12.4', 'NaN'), APP.replace('12.4', 'NaN')),                       # not orjson's: NaN
    (APP.replace('12.4', 'null'), APP.replace('12.4', 'NaN')),                      # NaN re-encodes as null
    (APP.replace('"scored"', '"caf\u00e9"'),) * 2,                                  # non-ASCII
    (APP.replace('"scored"', '"x\\u0000y"'),) * 2,                                  # an escape in the text
    (APP.replace('"INFO"', '"DEBUG"'), APP),                                        # the log member differs
]


@pytest.mark.parametrize("log_text, app_text", MERGED_CASES)
def test_a_merged_object_used_in_place_of_decoding_the_log_text_gives_the_same_record(log_text, app_text):
    """The object Fluent Bit merged from ``log`` replaces decoding ``log`` only when it is exactly
    what decoding gives: every record, rejection and PAN count is the one decoding ``log`` gives."""
    with_app, without_app = LineParser(cluster="c"), LineParser(cluster="c")
    got = with_app.feed_text(_fluent_line(log_text, app_text), "s", "1")
    want = without_app.feed_text(_fluent_line(log_text, None), "s", "1")
    assert len(got) == len(want) == 1
    assert (got[0].reason is None) == (want[0].reason is None)
    if want[0].record is not None:
        g, w = got[0].record.prepared().values, want[0].record.prepared().values
        skip = {"raw_sha256"}  # the lines differ by the app member
        assert [v for c, v in zip(PREPARED_COLUMNS, g) if c not in skip] == \
               [v for c, v in zip(PREPARED_COLUMNS, w) if c not in skip]
    assert with_app.masker.masked == without_app.masker.masked


@pytest.mark.parametrize("digits", ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "０１２３４５６７８９"])
def test_the_line_pre_filter_passes_a_line_whose_non_ascii_digits_masking_takes_for_a_pan(digits):
    """Masking's digit runs are any Unicode decimal digits (Arabic-Indic, Devanagari…, not only
    full-width): a line holding such a run that masking masks is never let through unmasked."""
    from collector.ingest.pan import may_contain_pan

    runs = ["".join(digits[int(c)] for c in f"{n:016d}") for n in range(4111111111111111, 4111111111111411)]
    masked = [run for run in runs if mask_text(f"card {run}")[1]]
    assert masked, "some 16-digit run of these digits is masked"
    run = masked[0]
    line = _fluent_line(APP.replace('"scored"', f'"card {run}"'), None)
    assert "\\u" not in line and may_contain_pan(line, unicode_escapes=False)
    got = LineParser(cluster="c").feed_text(line, "s", "1")[0].record
    assert run not in got.attributes["message"] and got.attributes["message"] == mask_text(f"card {run}")[0]


def test_the_cached_utc_second_gives_what_parsing_the_whole_timestamp_gives(monkeypatch):
    """``timestamps._utc_fast`` (the whole second from a cache) returns ``parse_iso``'s result or
    leaves the text to it, also for impossible dates and times of day, leap seconds and bad fractions."""
    from random import Random

    from collector.ingest import timestamps

    def parse(text):
        try:
            return timestamps.parse_iso(text, "Europe/Berlin")
        except timestamps.BadTimestamp as exc:
            return type(exc), str(exc)

    base = ["2025-11-29T08:00:00.412337Z", "2025-11-29T08:00:00Z", "2025-11-29 08:00:00,1Z", "2025-02-29T08:00:00Z",
            "2025-11-29T23:59:60.5Z", "2025-11-29T24:00:00Z", "2025-11-29T08:00:00.Z", "2024-02-29T08:00:00.123456789Z",
            "2025-11-29T08:00:00+01:00", "2025-11-29T08:00:00"]
    rnd = Random(6)
    texts = []
    for _ in range(20_000):
        text = list(rnd.choice(base))
        for _ in range(rnd.randint(0, 2)):
            text[rnd.randrange(len(text))] = rnd.choice("0123456789-:TtZz., \u0661x")
        texts.append("".join(text))
    fast = [parse(t) for t in texts]
    assert sum(timestamps._utc_fast(t) is not None for t in texts) > 3_000
    monkeypatch.setattr(timestamps, "_utc_fast", lambda text: None)
    assert [parse(t) for t in texts] == fast


def test_an_impossible_zone_offset_is_a_bad_timestamp():
    """RFC 3339 ``time-numoffset`` is ``time-hour ":" time-minute``: +25:00 or +01:60 is no instant
    (it was read as one: 2025-06-04T10:15+25:00 became 09:15 the day before; breaker's finding)."""
    from collector.ingest import timestamps

    for text in ("2025-06-04T10:15:00.067+25:00", "2025-06-04T10:15:00+01:60", "2025-06-04T10:15:00-2400"):
        with pytest.raises(timestamps.BadTimestamp, match="impossible zone offset"):
            timestamps.parse_iso(text)
    assert timestamps.parse_iso("2025-06-04T10:15:00.067+23:59")[0] == timestamps.parse_iso("2025-06-03T10:16:00.067Z")[0]
    assert timestamps.parse_iso("2025-06-04T10:15:00-00:30")[0] == timestamps.parse_iso("2025-06-04T10:45:00Z")[0]
