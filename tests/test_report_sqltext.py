"""The transaction lineage rendered to CSV/JSON text by the database equals the Python writers' bytes.

Runs on SQLite and PostgreSQL: both are compared with the same Python reference (``csv_line``,
``JSON_ENCODER``, ``ns_to_rfc3339``), so the two backends give the same files for the same rows.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone

import pytest
from sqlalchemy import delete, func, insert, select

from collector.store.models import InferenceRecord, Lineage
from collector.timeutil import dt_to_ns, ns_to_rfc3339
from reports import populations as pop
from reports import sqltext
from reports.manifest import digest_bytes
from tests.pack_data import records


def split_table_bytes(data: bytes) -> tuple[list[str], list[list]]:
    """(columns, rows) of a split-table JSON file's bytes."""
    doc = json.loads(data)
    assert list(doc) == ["columns", "data"]
    return doc["columns"], doc["data"]

DAY_NS = dt_to_ns(datetime(2026, 11, 28, tzinfo=timezone.utc))
# Values a log line can carry into a transaction: separators, quotes, line ends, control and
# non-ASCII characters, JSON-looking text, empty strings.
NASTY = [
    'txn,with,commas', 'say "approve"', "line\nbreak", "carriage\rreturn", "crlf\r\n", "tab\there",
    "back\\slash", "\x01\x1f\x7f ctl", "é ü 中文 \u2028 \u2029 😀", '{"json":[1,2]}', "", " lead and trail ",
    "'single'", "%s %d %%", "\\.",
]


def _add(s, rid: int, t_ns: int, txn: str, text: str | None, status: str | None) -> None:
    s.execute(insert(InferenceRecord).values(
        id=rid, transaction_id=txn, event_time_ns=t_ns, event_time_precision_ns=1000, received_ns=t_ns + 1,
        cluster="prod-eu-1", pod_uid=None, pod_namespace="risk-inference", pod_name=text, container_name="scorer",
        node_name="node-a" if text is None else None, model_name=text, model_version="2026.11.3", decision=text,
        source_format="jsonl", envelope="plain", source="s.jsonl", position=str(rid), raw_sha256="ab" * 32,
        dedup_key=f"k{rid}", conflict=rid % 4 == 1))
    if status is not None:
        s.execute(insert(Lineage).values(
            record_id=rid, status=status, reason=text, candidates=rid % 3, pod_uid=f"pod-{rid}",
            claim_namespace="risk-inference", claim_name=text, request="gpu", driver="gpu.nvidia.com", pool="node-a",
            device="gpu-0", physical_gpu_uuid="GPU-7f3c2a1e", device_uuid="GPU-7f3c2a1e", mig_profile=None,
            node_name="node-a", attributed_at=datetime(2026, 11, 29, tzinfo=timezone.utc)))


def _fill(sessions) -> None:
    with sessions.begin() as s:
        for k, text in enumerate(NASTY):
            # nanosecond fractions with and without trailing zeros, and whole seconds
            t_ns = DAY_NS + k * 1_000_000_007 + (0 if k % 4 == 0 else 10 ** (k % 9))
            _add(s, k + 1, t_ns, f"txn-{k:03d}-{text}", text, "exact" if k % 5 else None)
        _add(s, 100, DAY_NS + 3_600_000_000_000, "txn-nulls", None, "unattributed")
        _add(s, 101, DAY_NS - 1, "before-period", "x", "exact")  # outside the period


def _reference(sessions, scope) -> tuple[bytes, bytes, int]:
    """What ``PopulationWriter`` (the Python path) writes for the same population."""
    population = next(p for p in pop.STREAMED if p.name == "transaction_lineage")
    rows = []
    with sessions() as s:
        rows = list(pop.stream(s, population, scope))
    csv_text = "".join(pop.csv_line(r) + "\n" for r in [pop.LINEAGE_COLUMNS] + rows)
    head = '{"columns":' + pop.JSON_ENCODER.encode(list(pop.LINEAGE_COLUMNS)) + ',"data":['
    arrays = [pop.JSON_ENCODER.encode(r) for r in rows]
    json_text = head + (("\n" + ",\n".join(arrays) + "\n]}\n") if arrays else "]}\n")
    return csv_text.encode(), json_text.encode(), len(rows)


@pytest.mark.parametrize("batch_rows", [4, 20_000])
def test_sql_rendered_lineage_equals_python_writers(sessions, tmp_path, batch_rows):
    _fill(sessions)
    scope = pop.Scope(DAY_NS, DAY_NS + 86_400 * 10**9, ("prod-eu-1",), ())
    want_csv, want_json, n = _reference(sessions, scope)
    assert n == len(NASTY) + 1
    with sessions() as s:
        written = pop.write_lineage(s, scope, tmp_path, batch_rows=batch_rows)
    got_csv = (tmp_path / "transaction_lineage.csv").read_bytes()
    got_json = (tmp_path / "transaction_lineage.json").read_bytes()
    assert got_csv == want_csv
    assert got_json == want_json
    assert written.count == n
    assert written.files == (digest_bytes("data/transaction_lineage.csv", got_csv),
                             digest_bytes("data/transaction_lineage.json", got_json))

    # and the text reads back as the stored values
    records = list(csv.reader(io.StringIO(got_csv.decode(), newline="")))
    columns, rows = split_table_bytes(got_json)
    objects = [dict(zip(columns, row)) for row in rows]
    assert records[0] == columns == list(pop.LINEAGE_COLUMNS)
    by_txn = {o["transaction_id"]: o for o in objects}
    for k, text in enumerate(NASTY):
        o = by_txn[f"txn-{k:03d}-{text}"]
        assert o["pod_name"] == o["decision"] == text
        assert o["status"] == ("exact" if k % 5 else pop.NOT_ATTRIBUTED)
        assert o["event_time"] == ns_to_rfc3339(o["event_time_ns"])
    for record, o in zip(records[1:], objects):
        assert record == ["" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for v in o.values()]
        assert o["conflict"] is (o["record_id"] % 4 == 1)
    nulls = by_txn["txn-nulls"]
    assert nulls["reason"] is None and nulls["node_name"] == "node-a" and nulls["candidates"] == 1
    assert "before-period" not in by_txn


def test_empty_period_writes_header_and_empty_array(sessions, tmp_path):
    _fill(sessions)
    scope = pop.Scope(DAY_NS - 10**12, DAY_NS - 10**10, (), ())
    with sessions() as s:
        written = pop.write_lineage(s, scope, tmp_path)
    assert written.count == 0
    assert (tmp_path / "transaction_lineage.csv").read_text() == ",".join(pop.LINEAGE_COLUMNS) + "\n"
    assert (tmp_path / "transaction_lineage.json").read_text() == \
        '{"columns":' + json.dumps(list(pop.LINEAGE_COLUMNS), separators=(",", ":")) + ',"data":[]}\n'


def test_sql_text_rejects_unknown_dialect_and_kind():
    with pytest.raises(ValueError, match="mysql"):
        sqltext.copy_json_value("t.a", sqltext.TEXT, "mysql")
    with pytest.raises(ValueError, match="unknown kind"):
        sqltext.json_array_sql([("a", "t.a", "float")], "sqlite")
    with pytest.raises(ValueError, match="mysql"):
        sqltext.json_array_sql([("a", "t.a", sqltext.TEXT)], "mysql")


def test_csv_field_quotes_rfc4180_specials_only():
    assert pop.csv_line(["plain", None, True, False, 7, 'a "q"', "x,y", "l\nf", "c\rr", "", {"b": 1, "a": [2]}, "\\.", "\\.x"]) == \
        'plain,,true,false,7,"a ""q""","x,y","l\nf","c\rr",,"{""a"":[2],""b"":1}",\\.,\\.x'


def test_co_tenant_namespaces_in_two_successive_renderings(sessions, tmp_path):
    _fill(sessions)
    scope = pop.Scope(DAY_NS, DAY_NS + 86_400 * 10**9, ("prod-eu-1",), ())
    shared = [pop.CoTenancy("GPU-7f3c2a1e", "risk-inference", DAY_NS, DAY_NS + 10 * 10**9, "kyc-docs;marketing-ml")]
    for run in ("one", "two"):  # each in its own session, as two renderings from one process
        (tmp_path / run).mkdir()
        with sessions() as s:
            written = pop.write_lineage(s, scope, tmp_path / run, co_tenancy=shared)
        objects = records(tmp_path / run / "transaction_lineage.json")
        assert written.count == len(objects)
        co = {o["transaction_id"][:7]: (o["co_tenant_namespaces"], o["co_tenant_namespaces_possible"])
              for o in objects if o["status"] == "exact"}
        # at 4 s both held the GPU over the whole tolerance (2 s, the default: no attribution
        # settings); at 1 s and 11 s the interval starts / ends within it: possibly; at 12 s neither
        assert co["txn-004"] == ("kyc-docs;marketing-ml", None)
        assert co["txn-001"] == co["txn-011"] == (None, "kyc-docs;marketing-ml")
        assert co["txn-012"] == (None, None)


def test_both_files_come_from_the_sessions_snapshot(sessions, tmp_path, monkeypatch):
    """Both files come from one pass over the session's snapshot. PostgreSQL reads the population in
    time segments on two connections (the session's and a twin adopting its exported snapshot): a
    transaction committed elsewhere after the snapshot began is in neither file (REPEATABLE READ, as
    render_pack reads), the co-tenancy table is joined on both, and the segments are written in
    order: without co-tenancy both files equal the Python writers' bytes."""
    monkeypatch.setattr(pop, "SEGMENT_ROWS", 4)
    twins = []
    real_twin = pop._snapshot_twin
    monkeypatch.setattr(pop, "_snapshot_twin", lambda *args: twins.append(True) or real_twin(*args))
    _fill(sessions)
    scope = pop.Scope(DAY_NS, DAY_NS + 86_400 * 10**9, ("prod-eu-1",), ())
    want_csv, want_json, n = _reference(sessions, scope)
    shared = [pop.CoTenancy("GPU-7f3c2a1e", "risk-inference", None, DAY_NS + 10 * 10**9, "kyc-docs")]
    with sessions() as s:
        postgresql = s.get_bind().dialect.name == "postgresql"
        if postgresql:
            s.connection(execution_options={"isolation_level": "REPEATABLE READ"})  # as render_pack does
        assert s.execute(select(func.count()).select_from(InferenceRecord)).scalar_one() == n + 1  # snapshot taken
        if postgresql:
            with sessions.begin() as other:
                _add(other, 500, DAY_NS + 7_200 * 10**9, "txn-committed-later", "late", "exact")
        written = pop.write_lineage(s, scope, tmp_path, batch_rows=2, co_tenancy=shared, expected_rows=n)
    assert twins == ([True] if postgresql else [])  # 16 rows, 4 segments
    got_csv = (tmp_path / "transaction_lineage.csv").read_bytes()
    got_json = (tmp_path / "transaction_lineage.json").read_bytes()
    columns, rows = split_table_bytes(got_json)
    objects = [dict(zip(columns, row)) for row in rows]
    assert written.count == len(objects) == n
    assert [o["event_time_ns"] for o in objects] == sorted(o["event_time_ns"] for o in objects)
    assert len(list(csv.reader(io.StringIO(got_csv.decode(), newline="")))) == n + 1
    assert b"txn-committed-later" not in got_csv + got_json
    assert {o["transaction_id"][:7]: o["co_tenant_namespaces"] for o in objects}["txn-001"] == "kyc-docs"
    (tmp_path / "plain").mkdir()
    if postgresql:
        with sessions.begin() as other:
            other.execute(delete(Lineage).where(Lineage.record_id == 500))
            other.execute(delete(InferenceRecord).where(InferenceRecord.id == 500))
    with sessions() as s:
        if postgresql:
            s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        written = pop.write_lineage(s, scope, tmp_path / "plain", batch_rows=3, expected_rows=n)
    assert twins == ([True, True] if postgresql else [])
    assert (tmp_path / "plain/transaction_lineage.csv").read_bytes() == want_csv
    assert (tmp_path / "plain/transaction_lineage.json").read_bytes() == want_json
    assert written.count == n


def test_a_failed_write_stops_the_read_ahead_copy(sessions, tmp_path, monkeypatch):
    """PostgreSQL reads the COPY ahead on threads, in segments on two connections: when turning a
    chunk into text fails, the error is raised, the COPYs are cancelled and their threads ended (no
    hang, no thread left), and the connection serves the next transaction. SQLite fails the same
    way, with no thread."""
    import threading

    monkeypatch.setattr(pop, "SEGMENT_ROWS", 2)
    _fill(sessions)
    scope = pop.Scope(DAY_NS, DAY_NS + 86_400 * 10**9, ("prod-eu-1",), ())
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        raise OSError("No space left on device")
    monkeypatch.setattr(pop, "csv_rows_from_copy", failing)
    with sessions() as s:
        if s.get_bind().dialect.name == "postgresql":
            s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        with pytest.raises(OSError, match="No space left"):
            pop.write_lineage(s, scope, tmp_path, batch_rows=2, expected_rows=len(NASTY) + 1)
        s.rollback()
        assert s.execute(select(func.count()).select_from(InferenceRecord)).scalar_one() == len(NASTY) + 2
    assert calls == [1]
    assert not [t for t in threading.enumerate() if t.name == "pack-lineage-copy"]


def test_csv_rows_from_json_arrays_equal_csv_line():
    """The CSV lines derived from JSON arrays equal ``csv_line`` of the values: nulls first, last
    and side by side, the text "null", empty strings (fast path), and values that need quoting or
    escaping (re-read from the arrays)."""
    clean = [[None, 1, "null", None, None, "", True, None], ["a b", -2, None, "", "x;y", "é", False, 7]]
    dirty = clean + [["a,b", 3, 'say "hi"', "l\nf", "c\r", "back\\slash", None, None],
                     ["\x01", 4, None, "", "t", "u", True, 0]]
    for rows in (clean, dirty, clean[:1]):
        arrays = [pop.JSON_ENCODER.encode(r).encode() for r in rows]
        csv_rows, json_rows = pop.csv_rows_from_json(arrays, separators=7)
        assert csv_rows == b"".join(pop.csv_line(r).encode() + b"\n" for r in rows)
        assert json_rows == b",\n".join(arrays)
    assert pop.csv_rows_from_json([], separators=7) == (b"", b"")


@pytest.mark.parametrize("clean", [False, True])
def test_copy_rows_give_json_dumps_and_csv_line_for_random_text(pg_database_url, clean):
    """PostgreSQL's COPY under ``copy_json_options`` gives, through ``json_rows_from_copy`` and
    ``csv_rows_from_copy``, exactly the reference writers' JSON arrays and CSV lines, for random text
    mixing quotes, backslashes, every control character, separators and non-ASCII, nulls and empty
    strings (``clean``: only values that need no quoting, nulls and empty strings anywhere in the
    row: the fast path), in chunks of 1, 7 and all rows."""
    import random

    import psycopg

    rng = random.Random(20261130)
    alphabet = ["a", "Z", "0", " ", "é", "中", "😀", "\u2028", "\x7f", "\t", "null", "-", ";", "'"]
    if not clean:
        alphabet += ['"', "\\", ",", "\n", "\r", "\b", "\f", *[chr(c) for c in range(1, 32)], '\\"', '""']
    rows = []
    for k in range(400):
        texts = [None if rng.random() < 0.3 else "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
                 for _ in range(4)]
        rows.append((*texts[:1], k, *texts[1:], rng.choice([True, False, None]),
                     rng.choice([None, rng.randrange(-10**18, 10**18)])))
    spec = [("a", "a", sqltext.TEXT), ("id", "id", sqltext.INT), ("b", "b", sqltext.TEXT),
            ("c", "c", sqltext.TEXT), ("d", "d", sqltext.TEXT), ("flag", "flag", sqltext.BOOL), ("n", "n", sqltext.INT)]
    fields = ", ".join(f"{sqltext.copy_json_value(e, kind, 'postgresql')} AS {name}" for name, e, kind in spec)
    with psycopg.connect(pg_database_url.replace("postgresql+psycopg", "postgresql")) as conn:
        conn.execute("CREATE TEMPORARY TABLE fuzz (a text, id bigint, b text, c text, d text, flag boolean, n bigint)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO fuzz VALUES (%s, %s, %s, %s, %s, %s, %s)", rows)
            messages = []
            with cur.copy(f"COPY (SELECT {fields} FROM fuzz ORDER BY id) TO STDOUT WITH ({sqltext.copy_json_options(spec)})") as copy:
                messages = [bytes(m) for m in copy]
    assert len(messages) == len(rows)
    want_json = b",\n".join(pop.JSON_ENCODER.encode(list(r)).encode() for r in rows)
    want_csv = b"".join(pop.csv_line(list(r)).encode() + b"\n" for r in rows)
    for size in (1, 7, len(rows)):
        got_json, got_csv = [], []
        for i in range(0, len(messages), size):
            chunk, n = b"".join(messages[i:i + size]), len(messages[i:i + size])
            got_json.append(sqltext.json_rows_from_copy(chunk, n))
            got_csv.append(pop.csv_rows_from_copy(chunk, n, got_json[-1], separators=len(spec) - 1))
        assert b",\n".join(got_json) == want_json
        assert b"".join(got_csv) == want_csv
    if clean:  # the fast path's cases are there: nulls first, last and side by side, empty strings, "null"
        assert any(r[0] is None for r in rows) and any(r[-1] is None for r in rows)
        assert any(r[2] is None and r[3] is None for r in rows) and b',"",' in b"".join(messages)
        assert b'"null"' in b"".join(messages)


def test_segments_cut_the_period_into_contiguous_pieces(monkeypatch):
    monkeypatch.setattr(pop, "SEGMENT_ROWS", 100)
    scope = pop.Scope(DAY_NS, DAY_NS + 86_400 * 10**9, ("prod-eu-1",), ("risk",))
    assert pop._segments(scope, 199) == [scope]  # fewer than two segments' worth
    pieces = pop._segments(scope, 1_000)
    assert len(pieces) == 10 and pieces[0].from_ns == scope.from_ns and pieces[-1].to_ns == scope.to_ns
    assert all(a.to_ns == b.from_ns for a, b in zip(pieces, pieces[1:]))
    assert {(p.clusters, p.namespaces) for p in pieces} == {(("prod-eu-1",), ("risk",))}
    assert len(pop._segments(scope, 10**9)) == pop.MAX_SEGMENTS
    assert len(pop._segments(pop.Scope(DAY_NS, DAY_NS + 3), 10**9)) == 3  # never shorter than 1 ns


def test_sqlite_segments_rendered_in_processes_equal_the_python_writers(sessions, tmp_path, monkeypatch):
    """SQLite, a large population: segments rendered by worker processes on read-only connections
    (the session holds the write lock, so they read its snapshot), written in order: the same bytes
    as the Python writers, with the co-tenancy table loaded in each worker."""
    if sessions.kw["bind"].dialect.name != "sqlite":
        pytest.skip("the process path is SQLite's")
    monkeypatch.setattr(pop, "SQLITE_PROCESS_MIN_ROWS", 1)
    monkeypatch.setattr(pop, "SEGMENT_ROWS", 3)
    used = []
    real = pop._sqlite_in_processes
    monkeypatch.setattr(pop, "_sqlite_in_processes", lambda *a: used.append(real(*a)) or used[-1])
    _fill(sessions)
    scope = pop.Scope(DAY_NS, DAY_NS + 86_400 * 10**9, ("prod-eu-1",), ())
    want_csv, want_json, n = _reference(sessions, scope)
    with sessions() as s:
        s.execute(select(func.count()).select_from(InferenceRecord)).scalar_one()  # in a transaction, as render_pack
        written = pop.write_lineage(s, scope, tmp_path, batch_rows=2, expected_rows=n)
    assert used == [n]  # the process path wrote them all
    assert (tmp_path / "transaction_lineage.csv").read_bytes() == want_csv
    assert (tmp_path / "transaction_lineage.json").read_bytes() == want_json
    assert written.count == n
    (tmp_path / "co").mkdir()
    shared = [pop.CoTenancy("GPU-7f3c2a1e", "risk-inference", None, DAY_NS + 10 * 10**9, "kyc-docs")]
    with sessions() as s:
        s.execute(select(func.count()).select_from(InferenceRecord)).scalar_one()
        pop.write_lineage(s, scope, tmp_path / "co", batch_rows=2, co_tenancy=shared, expected_rows=n)
    assert used[-1] == n
    objects = records(tmp_path / "co" / "transaction_lineage.json")
    assert {o["transaction_id"][:7]: o["co_tenant_namespaces"] for o in objects}["txn-001"] == "kyc-docs"
