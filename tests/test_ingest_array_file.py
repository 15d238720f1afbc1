"""``draudit ingest FILE`` where FILE is one JSON array of records (Fluent Bit ``format json``,
Vector ``codec: json``, exporters' batch files), pretty-printed over many lines, plain or gzip: each
element is one unit (``element <i>``), as in ``POST /v1/ingest``; counts reconcile on both stores.
Also the piece-by-piece array reader (``collector.ingest.jsonarray``) on its own."""

from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from collector.cli import cli
from collector.ingest.jsonarray import JsonArrayElements, NotAnArray
from collector.store.models import InferenceRecord, Quarantine

DATA = Path(__file__).parent / "data" / "logs"


def _vector_events() -> list:
    return [json.loads(line) for line in (DATA / "vector.jsonl").read_text().splitlines()]


def _ingest(database_url: str, path: Path) -> dict:
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", database_url]).exit_code == 0
    result = runner.invoke(cli, ["ingest", str(path), "--database-url", database_url, "--output", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _positions(sessions):
    with sessions() as s:
        stored = s.execute(select(InferenceRecord.position, InferenceRecord.transaction_id)
                           .order_by(InferenceRecord.id)).all()
        quarantined = s.execute(select(Quarantine.position, Quarantine.reason).order_by(Quarantine.id)).all()
    return [tuple(r) for r in stored], [(p, reason.split(":")[0]) for p, reason in quarantined]


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_pretty_printed_array_file_is_read_element_by_element(tmp_path, database_url, sessions, compress):
    events = _vector_events()  # T-000193, T-000194, then a start-up line without a transaction id
    text = json.dumps(events[:2] + ["not an object"] + events[2:], indent=2) + "\n"
    assert text.count("\n") > 40  # many physical lines per element
    path = tmp_path / ("batch.json.gz" if compress else "batch.json")
    path.write_bytes(gzip.compress(text.encode()) if compress else text.encode())
    counts = _ingest(database_url, path)
    assert counts == {"read": 4, "stored": 2, "duplicates": 0, "conflicts": 0, "quarantined": 2, "pan_masked": 0}
    stored, quarantined = _positions(sessions)
    assert stored == [("element 1", "T-000193"), ("element 2", "T-000194")]
    assert quarantined == [("element 3", "unparseable"), ("element 4", "missing-transaction-id")]


def test_array_file_with_trailing_text_and_an_empty_element(tmp_path, database_url, sessions):
    events = _vector_events()
    body = ("\ufeff  [\n" + json.dumps(events[0], indent=1) + ",\n ,\n" + json.dumps(events[1]) + "\n]\n"
            "this line is not part of the array\n")
    path = tmp_path / "batch.json"
    path.write_text(body, encoding="utf-8")
    counts = _ingest(database_url, path)
    assert (counts["read"], counts["stored"], counts["quarantined"]) == (4, 2, 2)
    stored, quarantined = _positions(sessions)
    assert [p for p, _txn in stored] == ["element 1", "element 3"]
    # the text after the array is read as lines of the file, positioned by their line number
    trailing_line = body.splitlines().index("this line is not part of the array") + 1
    assert quarantined == [("element 2", "unparseable"), (str(trailing_line), "unparseable")]


def _ecs_line(txn: str, decision: str = "APPROVE") -> str:
    return json.dumps({"@timestamp": "2025-06-04T10:15:00.067Z", "log.level": "INFO", "log.logger": "com.example.Scoring",
                       "message": "scored", "txn_id": txn, "decision": decision, "ecs.version": "8.11"})


@pytest.mark.parametrize("first", [
    "[0.011s][warning][os,thread] Failed to start thread \"GC Thread#0\" - pthread_create failed (EPERM)",
    "[main] INFO  o.s.b.StartupInfoLogger - Starting FraudApi using Java 21",
    "[]  the empty brackets of a plain-text line, then text",
], ids=["jvm-unified-logging", "logback-pattern", "brackets-then-text"])
def test_a_text_first_line_with_a_bracket_does_not_make_the_file_an_array(tmp_path, database_url, sessions, first):
    # A JVM warning (unified logging) or a Logback pattern line often comes first on stdout: the
    # file is JSON lines after it, every one of them read.
    path = tmp_path / "app.log"
    path.write_text(first + "\n" + "".join(_ecs_line(f"BR-{i}") + "\n" for i in range(1, 6)), encoding="utf-8")
    counts = _ingest(database_url, path)
    assert counts == {"read": 6, "stored": 5, "duplicates": 0, "conflicts": 0, "quarantined": 1, "pan_masked": 0}
    stored, quarantined = _positions(sessions)
    assert stored == [(str(i + 1), f"BR-{i}") for i in range(1, 6)]
    assert quarantined == [("1", "unparseable")]
    with sessions() as s:
        assert s.execute(select(Quarantine.raw_text)).scalar_one() == first  # the whole line, brackets included


def test_arrays_one_per_line_are_all_read_then_lines_after_them(tmp_path, database_url, sessions):
    # Saved HTTP batches: one JSON array per line; then JSON lines and a text line appended.
    batches = [[json.loads(_ecs_line("AR-1")), json.loads(_ecs_line("AR-2"))], [], [json.loads(_ecs_line("AR-3"))]]
    text = "".join(json.dumps(b) + "\n" for b in batches) + "\n" + _ecs_line("AR-4") + "\nthe end\n"
    path = tmp_path / "batches.json"
    path.write_text(text, encoding="utf-8")
    counts = _ingest(database_url, path)
    assert counts == {"read": 5, "stored": 4, "duplicates": 0, "conflicts": 0, "quarantined": 1, "pan_masked": 0}
    stored, quarantined = _positions(sessions)
    assert stored == [("1 element 1", "AR-1"), ("1 element 2", "AR-2"), ("3 element 1", "AR-3"), ("5", "AR-4")]
    assert quarantined == [("6", "unparseable")]


def test_a_broken_array_line_costs_only_itself(tmp_path, database_url, sessions):
    """Arrays one per line were streamed as arrays: a line left open took the next lines into its
    unterminated tail, one quarantined unit, and their records were lost (a tester's finding)."""
    good = [json.loads(_ecs_line(f"BA-{i}")) for i in range(1, 6)]
    text = json.dumps(good[:2]) + "\n" + '[{"broken": ' + "\n" + json.dumps(good[2:]) + "\n"
    path = tmp_path / "batches.json"
    path.write_text(text, encoding="utf-8")
    counts = _ingest(database_url, path)
    assert (counts["read"], counts["stored"], counts["quarantined"]) == (6, 5, 1)
    stored, quarantined = _positions(sessions)
    assert [txn for _, txn in stored] == [f"BA-{i}" for i in range(1, 6)]
    assert [p for p, _ in stored][2:] == ["3 element 1", "3 element 2", "3 element 3"]
    assert quarantined == [("2", "unparseable")]


def _batch(prefix: str, first: int, n: int) -> list:
    return [json.loads(_ecs_line(f"{prefix}-{i}")) for i in range(first, first + n)]


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_an_array_line_over_the_line_limit_is_read_record_by_record(tmp_path, database_url, sessions, compress):
    """A saved batch line of 600 records (~110 KB) is over the 64 KiB line limit, each record far
    within it: the line is held to the body limit, its records to the line limit. Before, the line
    was one ``line-too-long`` unit and its 600 records were never read."""
    text = json.dumps(_batch("BIG", 1, 2)) + "\n" + json.dumps(_batch("BIG", 3, 600)) + "\n" + json.dumps(_batch("BIG", 603, 2)) + "\n"
    assert len(text.splitlines()[1]) > 65536
    path = tmp_path / ("batches.json.gz" if compress else "batches.json")
    path.write_bytes(gzip.compress(text.encode()) if compress else text.encode())
    counts = _ingest(database_url, path)
    assert counts == {"read": 604, "stored": 604, "duplicates": 0, "conflicts": 0, "quarantined": 0, "pan_masked": 0}
    stored, _ = _positions(sessions)
    assert stored[1:3] == [("1 element 2", "BIG-2"), ("2 element 1", "BIG-3")]
    assert stored[-1] == ("3 element 2", "BIG-604")


def test_a_first_array_line_longer_than_the_peek_then_a_broken_line_costs_only_itself(tmp_path, database_url, sessions):
    """The first line (100 records, ~18 KB) ends past the first 4 KiB looked at: the file used to be
    streamed as arrays, and the broken second line took the third into its unterminated tail."""
    text = json.dumps(_batch("LB", 1, 100)) + "\n" + json.dumps(_batch("LB", 101, 10))[:-30] + "\n" + \
        json.dumps(_batch("LB", 111, 10)) + "\n"
    assert len(text.splitlines()[0]) > 4096
    path = tmp_path / "batches.json"
    path.write_text(text, encoding="utf-8")
    counts = _ingest(database_url, path)
    assert counts == {"read": 111, "stored": 110, "duplicates": 0, "conflicts": 0, "quarantined": 1, "pan_masked": 0}
    stored, quarantined = _positions(sessions)
    assert [txn for _, txn in stored] == [f"LB-{i}" for i in range(1, 101)] + [f"LB-{i}" for i in range(111, 121)]
    assert stored[100] == ("3 element 1", "LB-111")
    assert quarantined == [("2", "unparseable")]


@pytest.mark.parametrize("first_records", [3, 100], ids=["short-first-line", "first-line-past-the-peek"])
def test_a_broken_first_array_line_costs_only_itself(tmp_path, database_url, sessions, first_records):
    """The first batch line cut short (no closing ``]``) made the file one streamed array: its
    unterminated tail took every later line, and their records were neither stored nor counted."""
    text = json.dumps(_batch("BF", 1, first_records))[:-5] + "\n" + json.dumps(_batch("BF", 500, 2)) + "\n" + \
        json.dumps(_batch("BF", 502, 3)) + "\n"
    path = tmp_path / "batches.json"
    path.write_text(text, encoding="utf-8")
    counts = _ingest(database_url, path)
    assert counts == {"read": 6, "stored": 5, "duplicates": 0, "conflicts": 0, "quarantined": 1, "pan_masked": 0}
    stored, quarantined = _positions(sessions)
    assert stored == [("2 element 1", "BF-500"), ("2 element 2", "BF-501"), ("3 element 1", "BF-502"),
                      ("3 element 2", "BF-503"), ("3 element 3", "BF-504")]
    assert quarantined == [("1", "unparseable")]
    with sessions() as s:
        assert s.execute(select(Quarantine.reason)).scalar_one().startswith("unparseable: invalid JSON array")


def test_a_record_over_the_line_limit_inside_an_array_line_costs_only_itself(tmp_path, database_url, sessions):
    big = json.loads(_ecs_line("OV-2"))
    big["stack_trace"] = "x" * 70000  # one record over the 64 KiB line limit
    batch = [json.loads(_ecs_line("OV-1")), big, json.loads(_ecs_line("OV-3"))]
    path = tmp_path / "batches.json"
    path.write_text(json.dumps([json.loads(_ecs_line("OV-0"))]) + "\n" + json.dumps(batch) + "\n", encoding="utf-8")
    counts = _ingest(database_url, path)
    assert counts == {"read": 4, "stored": 3, "duplicates": 0, "conflicts": 0, "quarantined": 1, "pan_masked": 0}
    stored, quarantined = _positions(sessions)
    assert stored == [("1 element 1", "OV-0"), ("2 element 1", "OV-1"), ("2 element 3", "OV-3")]
    assert quarantined == [("2 element 2", "line-too-long")]


def test_a_read_error_names_the_input_without_a_traceback(tmp_path, database_url):
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", database_url]).exit_code == 0
    # Linux: reading /proc/self/mem at offset 0 fails with EIO, as a failing disk does.
    result = runner.invoke(cli, ["ingest", "/proc/self/mem", "--database-url", database_url])
    assert result.exit_code != 0
    assert "/proc/self/mem: cannot read it (Input/output error)" in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, OSError)


def test_unterminated_array_file_quarantines_its_tail(tmp_path, database_url, sessions):
    events = _vector_events()
    path = tmp_path / "cut.json"
    path.write_text("[" + json.dumps(events[0]) + ",\n" + json.dumps(events[1])[:40], encoding="utf-8")
    counts = _ingest(database_url, path)
    assert (counts["read"], counts["stored"], counts["quarantined"]) == (2, 1, 1)
    assert _positions(sessions)[1] == [("element 2", "unparseable")]


# -- the reader ------------------------------------------------------------------------------------

def _read(data: bytes, chunk: int, limit: int = 1 << 20, rest_bytes: int | None = None):
    elements = JsonArrayElements(io.BytesIO(data), limit, chunk_bytes=chunk, rest_bytes=rest_bytes)
    return list(elements), elements.rest, elements.rest_truncated


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(6 if depth < 3 else 3)
    if kind == 0:
        return "".join(rng.choice('ab[]{},:"\\\n\u00e9\u20ac ') for _ in range(rng.randrange(12)))
    if kind == 1:
        return rng.randrange(-10**6, 10**6) / 7
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}]": _random_value(rng, depth + 1) for i in range(rng.randrange(4))}


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_reader_gives_the_same_elements_whatever_the_piece_size(chunk):
    rng = random.Random(20261130)
    for _ in range(40):
        values = [_random_value(rng) for _ in range(rng.randrange(6))]
        data = json.dumps(values, indent=rng.choice([None, 1, 4]), ensure_ascii=rng.random() < 0.5).encode()
        elements, rest, _ = _read(data, chunk)
        assert [json.loads(e) for e, _total in elements] == values
        assert all(total == len(e) for e, total in elements) and rest is None


def test_reader_brackets_and_escapes_in_strings_across_pieces():
    data = b' [ {"a":"],[{\\"\\\\"}, [1,2], "x,y\\\\" ] trailing'
    for chunk in (1, 2, 5, 100):
        elements, rest, _ = _read(data, chunk)
        assert [e for e, _ in elements] == [b'{"a":"],[{\\"\\\\"}', b"[1,2]", b'"x,y\\\\"'] and rest == b"trailing"


def test_reader_keeps_a_prefix_of_an_oversize_element_and_its_length():
    big = json.dumps({"txn_id": "T-1", "pad": "x" * 5000}).encode()
    data = b"[" + big + b",\n" + b'{"b":2}' + b"]"
    elements, rest, _ = _read(data, chunk=256, limit=1000)
    (first, first_total), (second, second_total) = elements
    assert (len(first), first_total) == (1001, len(big)) and first == big[:1001]
    assert (second, second_total) == (b'{"b":2}', 7) and rest is None


def test_reader_empty_array_empty_elements_and_cut_rest():
    assert _read(b"[ ]", 1) == ([], None, False)
    assert _read(b"[1,,2,]", 2)[0] == [(b"1", 1), (b"", 0), (b"2", 1), (b"", 0)]
    assert _read(b"[1", 1)[1] == b"1"
    assert _read(b"[", 1)[1] == b"[unterminated array]"
    assert _read(b"[1] " + b"z" * 100, 8, rest_bytes=10)[1:] == (b"z" * 10, True)
    with pytest.raises(NotAnArray):
        list(JsonArrayElements(io.BytesIO(b'  {"a":1}'), 100))


def test_pretty_printed_objects_are_one_unit_each_not_a_row_per_line(tmp_path, database_url, sessions):
    """``jq .`` output (objects pretty-printed one after another): read line by line, every line
    was a junk quarantine row (read 18 for two objects)."""
    objects = [json.loads(_ecs_line("PP-1")), json.loads(_ecs_line("PP-2", "DECLINE")), {"message": "no id"}]
    path = tmp_path / "jq.json"
    pretty = "\n".join(json.dumps(o, indent=2) for o in objects) + "\n"
    # then an object cut short, an application's NDJSON line and a plain-text line
    text = pretty + '{\n  "cut": \n' + _ecs_line("PP-3") + "\nStarted FraudApi in 3.2 seconds\n"
    path.write_text(text, encoding="utf-8")
    counts = _ingest(database_url, path)
    assert counts == {"read": 7, "stored": 3, "duplicates": 0, "conflicts": 0, "quarantined": 4, "pan_masked": 0}
    stored, quarantined = _positions(sessions)
    cut = pretty.count("\n") + 1  # the line of the cut object's "{"
    assert stored == [("object 1", "PP-1"), ("object 2", "PP-2"), (str(cut + 2), "PP-3")]
    assert quarantined == [("object 3", "missing-transaction-id"), (str(cut), "unparseable"),
                           (str(cut + 1), "unparseable"), (str(cut + 3), "unparseable")]


def test_a_broken_pretty_object_loses_nothing_after_it(tmp_path, database_url, sessions):
    """An unclosed string in one object read the rest of the file as that string: every object
    after it was lost in one quarantined unit."""
    good = json.dumps(json.loads(_ecs_line("PP-9")), indent=2)
    text = '{\n  "transactionId": "TXN-BROKEN,\n  "decision": "X"\n}\n' + good + "\n" + _ecs_line("PP-10") + "\n"
    path = tmp_path / "broken.json"
    path.write_text(text, encoding="utf-8")
    counts = _ingest(database_url, path)
    assert (counts["read"], counts["stored"], counts["quarantined"]) == (3, 2, 1)
    stored, quarantined = _positions(sessions)
    assert stored == [("object 2", "PP-9"), (str(text.count("\n")), "PP-10")]
    assert quarantined == [("object 1", "unparseable")]


@pytest.mark.parametrize("broken", ["cut-at-the-end", "unclosed-mid-file"])
def test_a_broken_pretty_object_is_one_unit_and_the_next_keeps_its_number(tmp_path, database_url, sessions, broken):
    """``jq .`` output copied while still being written (the last object stops mid-string), or an
    object missing its closing brace before the next one: each of its lines was a junk quarantine
    row (8 and 13 in testers' files), and the objects after it were numbered one short. It is one
    unit, its raw text the whole broken object."""
    objects = [json.dumps(json.loads(_ecs_line(f"PB-{i}")), indent=2) for i in range(1, 4)]
    if broken == "cut-at-the-end":
        text, bad, shown = "\n".join(objects)[:-40], 3, objects[2][:-40]
    else:
        text, bad, shown = "\n".join([objects[0], objects[1][:-2], objects[2]]) + "\n", 2, objects[1][:-2]
    path = tmp_path / "pretty.json"
    path.write_text(text, encoding="utf-8")
    counts = _ingest(database_url, path)
    assert counts == {"read": 3, "stored": 2, "duplicates": 0, "conflicts": 0, "quarantined": 1, "pan_masked": 0}
    stored, quarantined = _positions(sessions)
    assert stored == [(f"object {i}", f"PB-{i}") for i in (1, 2, 3) if i != bad]
    assert quarantined == [(f"object {bad}", "unparseable")]
    with sessions() as s:
        assert s.execute(select(Quarantine.raw_text)).scalar_one() == shown


def test_pretty_printed_objects_after_a_text_line_are_still_one_unit_each(tmp_path, database_url, sessions):
    """A JVM warning before ``jq .`` output: only the first non-blank line was looked at, so every
    line of both objects was quarantined on its own (read 45, stored 0)."""
    objects = "\n".join(json.dumps(json.loads(_ecs_line(f"PT-{i}")), indent=2) for i in (1, 2))
    path = tmp_path / "jvm-then-jq.json"
    path.write_text("[0.011s][warning][gc] -XX:+UseG1GC is deprecated\n" + objects + "\n", encoding="utf-8")
    counts = _ingest(database_url, path)
    assert (counts["read"], counts["stored"], counts["quarantined"]) == (3, 2, 1)
    stored, quarantined = _positions(sessions)
    assert stored == [("object 1", "PT-1"), ("object 2", "PT-2")] and [p for p, _ in quarantined] == ["1"]
