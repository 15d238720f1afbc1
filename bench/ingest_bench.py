"""Benchmark: ``draudit ingest`` of N Fluent Bit lines vs a raw executemany (and, on PostgreSQL, COPY) of the same rows.

Usage::

    .venv/bin/python bench/ingest_bench.py                      # 1 M lines, SQLite and PostgreSQL
    .venv/bin/python bench/ingest_bench.py --lines 100000 --backends sqlite

Input: N Fluent Bit records as the configuration in docs/shippers.md produces them
(``multiline.parser cri``, kubernetes filter, ``Merge_Log_Key app``, ``Keep_Log On``, ``json_lines``)
around Spring Boot 3.5 nested ECS decision lines, spread over 64 pods; every 50th line is a
non-decision log line (quarantined), every 20th carries a card number in its message (masked).

Measured per backend, each on a freshly migrated database:

- ``raw executemany``: the rows the pipeline would store, built beforehand (parsing not timed),
  inserted with the DB-API ``cursor.executemany`` in chunks of 2 000, one commit per chunk — no
  dedupe, no ledger, nothing else: the floor of writing those rows;
- ``raw COPY`` (PostgreSQL): the same rows and chunks through ``COPY … FROM STDIN``, the faster
  floor there; the ratio is printed against both floors, and the one against COPY is the demanding one;
- ``pipeline``: ``IngestRun`` over the file end to end (read, parse — in parse worker processes
  unless ``--workers 1``, which send each record back as a tuple of column values with its ledger
  leaf encoded up to the id, and take the lines of this shape through ``ingest.fastpath`` —, mask, dedupe
  lookup, insert — PostgreSQL: the lookup one ``= ANY(array)`` query, then the new records COPYed
  straight into ``inference_records`` with ids drawn beforehand, under a savepoint (a key stored
  meanwhile by another writer rolls it back to ``INSERT … ON CONFLICT DO NOTHING``); SQLite: ``IN``
  lookup, ``executemany`` of ``INSERT … ON CONFLICT DO NOTHING`` —, quarantine, ledger entries;
  a commit per batch of 2 000 on PostgreSQL, per 10 000 lines on SQLite). Its client CPU time is this process plus its
  parse workers (``RUSAGE_CHILDREN``: the workers are reaped at the end of the run), shown apart.

Each measurement is repeated ``--repeat`` times (default 3, raw and pipeline alternating so load
changes on a shared machine hit both); the best wall time of each is reported with the CPU time of
that run: ``client`` is this process (``time.process_time``), ``server`` the PostgreSQL backends
serving the bench database (utime + stime from ``/proc``, when readable). Prints lines/s of each and
``ratio = pipeline / raw`` (target ≥ 0.5), by wall time and by client (with parse workers) + server CPU time.
PostgreSQL: ``DRAUDIT_TEST_PG_URL`` (default ``postgresql://root@127.0.0.1:5432/test``) is an
administrative URL; the bench creates and drops its own databases.

Floors: ``raw executemany``/``raw COPY`` write the records only; ``raw all rows`` writes every row
the run stored into the same tables — its records, quarantine rows and ledger entries, ids and
hashes as the run left them (read from a first, untimed pipeline run) — the issue's "same rows into
the same tables with the same indexes".

Last measured (2 vCPUs, 2026-12-01 06:27, quiet): 1 M lines, one run each: PostgreSQL 17.8 k lines/s = 0.65x
executemany, 0.29x COPY (61.9 k rows/s), 0.45x all rows; CPU per line client 23 + parse workers 59 + server 23 µs.
SQLite 17.6 k lines/s = 0.68x executemany, 0.81x all rows.

Before (2 vCPUs, 2026-12-01 03:10, PostgreSQL 15, machine otherwise quiet; README's performance table keeps
the history): 1 M lines, one run: PostgreSQL 16.4 k lines/s = 0.77x executemany, 0.36x COPY (45.6 k rows/s), 0.47x
all rows (34.6 k rows/s); CPU per line: client 22 + parse workers 68 + server 26 µs; ``--parsed-beforehand`` (every
line parsed before timing): 19.6 k lines/s = 0.43x COPY, 0.57x all rows — the writer's serial path with the server
alone stays under 0.5x COPY. Earlier the same day, 1 M lines, one run: PostgreSQL 19.2 k lines/s = 0.68x executemany, 0.29x COPY (66.6 k rows/s), 0.42x all
rows (46.2 k rows/s); CPU per line: client 21 + parse workers 53 + server 22 µs; 1.85 of 2 CPUs busy; ceiling 0.31x
COPY, 0.45x all rows. Before (2026-11-30):
1 M lines, one run: PostgreSQL 17.6 k lines/s = 0.68x executemany, 0.30x COPY (58.1 k rows/s), 0.43x all
rows (41.2 k rows/s); CPU per line: client 25 + parse workers 56 + server 23 µs; 1.84 of 2 CPUs busy, so
the CPU-bound ceiling is 0.33x COPY and 0.47x all rows. SQLite (same day, 1 M): 14.0 k lines/s = 0.70x
executemany, 0.76x all rows.
Target >= 0.5x: met on SQLite and against executemany on PostgreSQL; not against COPY: parsing,
masking, hashing and ledgering take ~80 µs of client CPU per line against COPY's ~21 µs per row, and
both CPUs are busy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text  # noqa: E402

from bench.backends import ServerCpu  # noqa: E402

from collector.ingest.parser import LineParser  # noqa: E402
from collector.ingest.pipeline import IngestRun, iter_chunks  # noqa: E402
from collector.settings import Settings  # noqa: E402
from collector.store import migrate  # noqa: E402
from collector.store.db import make_engine, make_session_factory  # noqa: E402
from collector.store.models import InferenceRecord  # noqa: E402

PG_ADMIN_URL = os.environ.get("DRAUDIT_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/test")
START_NS = 1_764_403_200_000_000_000  # 2025-11-29T08:00:00Z
CHUNK = 2000
ALL_ROWS = "all rows"  # the floor that writes every row the run stored (records, quarantine, ledger)


def _iso(ns: int, digits: int = 6) -> str:
    s, rem = divmod(ns, 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s))
    return f"{base}.{str(rem).zfill(9)[:digits]}Z"


def write_input(path: Path, n: int) -> None:
    """N Fluent Bit json_lines records (see the module docstring)."""
    rnd = random.Random(7)
    pods = [(f"fraud-api-7c9d8-{rnd.getrandbits(20):05x}", str(uuid.UUID(int=rnd.getrandbits(128), version=4)),
             f"gpu-node-{i % 16:02d}", f"{rnd.getrandbits(256):064x}") for i in range(64)]
    with open(path, "w") as f:
        for i in range(n):
            pod, uid, node, cid = pods[i % len(pods)]
            ev = START_NS + i * 1_000_003
            rt = ev + 412_337
            app = {"@timestamp": _iso(ev), "log": {"level": "INFO", "logger": "com.example.fraud.ScoringService"},
                   "process": {"pid": 1, "thread": {"name": f"http-nio-8080-exec-{i % 200}"}},
                   "service": {"name": "fraud-api", "version": "2.7.1"},
                   "message": "scored card 4111 1111 1111 1111" if i % 20 == 0 else "scored",
                   "traceId": f"{rnd.getrandbits(128):032x}", "spanId": f"{rnd.getrandbits(64):016x}", "txn_id": f"T-{i:09d}", "model_name": "fraud_xgb",
                   "model_version": "7", "decision": "DECLINE" if i % 7 == 0 else "APPROVE",
                   "latency_ms": round(5 + (i % 97) * 0.13, 2), "ecs": {"version": "8.11"}}
            if i % 50 == 49:
                app = {"@timestamp": _iso(ev), "log": {"level": "INFO", "logger": "o.s.b.w.e.tomcat.TomcatWebServer"},
                       "message": "Tomcat started on port 8080 (http)", "ecs": {"version": "8.11"}}
            line = json.dumps(app, separators=(",", ":"))
            rec = {"date": _iso(rt), "time": _iso(rt, 9), "stream": "stdout", "_p": "F", "log": line, "app": app,
                   "kubernetes": {"pod_name": pod, "namespace_name": "risk-inference", "pod_id": uid,
                                  "labels": {"app.kubernetes.io/name": "fraud-api", "pod-template-hash": "7c9d8"},
                                  "host": node, "pod_ip": f"10.4.{i % 64}.21", "container_name": "api",
                                  "docker_id": cid, "container_image": "registry.example/fraud-api:2.7.1"}}
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


@dataclass
class Timing:
    """One measured run: rows or lines done, wall seconds, client and server CPU seconds."""

    n: int
    wall_s: float
    client_cpu_s: float
    server_cpu_s: float
    workers_cpu_s: float = 0.0  # parse worker processes (part of the client)

    @property
    def cpu_s(self) -> float:
        return self.client_cpu_s + self.workers_cpu_s + self.server_cpu_s


def fresh_database(backend: str, tmp: Path) -> tuple[str, callable]:
    if backend == "sqlite":
        path = tmp / f"bench-{uuid.uuid4().hex[:6]}.db"
        return f"sqlite:///{path}", lambda: None
    name = f"draudit_bench_{uuid.uuid4().hex[:10]}"
    admin = make_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' "
                              "AND pid <> pg_backend_pid()"))
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()

    return url, drop


def rows_for(path: Path, settings: Settings):
    """The rows the pipeline would store, in chunks (parsing happens here, outside the timing)."""
    parser = LineParser(cluster=settings.cluster, max_line_bytes=settings.ingest_max_line_bytes)
    chunk = []
    with open(path, "rb") as f:
        for n, data, total in (line for c in iter_chunks(f, settings.ingest_max_line_bytes) for line in c.lines()):
            for o in parser.feed_bytes(data, str(path), str(n), total):
                if o.record is not None:
                    row = o.record.row(START_NS, "bench")
                    row["conflict"] = False
                    chunk.append(row)
            if len(chunk) >= CHUNK:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _database_name(engine) -> str | None:
    return engine.url.database if engine.dialect.name == "postgresql" else None


_COLUMNS = [c.name for c in InferenceRecord.__table__.columns if c.name != "id"]


def _raw_floor(url: str, path: Path, settings: Settings, write_chunk) -> Timing:
    """The rows the pipeline would store, built beforehand (not timed), written chunk by chunk with
    ``write_chunk(raw DB-API connection, backend, rows)`` and one commit per chunk (timed)."""
    engine = make_engine(url)
    migrate.upgrade(engine)
    backend = engine.dialect.name
    rows_done, elapsed, cpu = 0, 0.0, 0.0
    raw = engine.raw_connection()
    server = ServerCpu(_database_name(engine))
    try:
        for chunk in rows_for(path, settings):
            params = [tuple(json.dumps(r[c]) if c == "attributes" else r[c] for c in _COLUMNS) for r in chunk]
            c0, t0 = time.process_time(), time.perf_counter()
            write_chunk(raw, backend, params)
            raw.commit()
            elapsed += time.perf_counter() - t0
            cpu += time.process_time() - c0
            rows_done += len(params)
        server_s = server.used_s()  # parsing happens in this process: the server only worked while timed
    finally:
        raw.close()
        engine.dispose()
    return Timing(rows_done, elapsed, cpu, server_s)


def _executemany_chunk(raw, backend: str, params: list[tuple]) -> None:
    mark = "?" if backend == "sqlite" else "%s"
    cur = raw.cursor()
    if backend == "sqlite":
        cur.execute("BEGIN")  # draudit's engine runs sqlite3 in autocommit mode and emits BEGIN itself
    cur.executemany(f"INSERT INTO inference_records ({', '.join(_COLUMNS)}) VALUES ({', '.join(mark for _ in _COLUMNS)})",
                    params)


def _copy_chunk(raw, _backend: str, params: list[tuple]) -> None:
    with raw.driver_connection.cursor() as cur:
        with cur.copy(f"COPY inference_records ({', '.join(_COLUMNS)}) FROM STDIN") as copy:
            for row in params:
                copy.write_row(row)


# The tables an ingest run writes, each with its key column (keyset order) — the "same tables" of
# the all-rows floor. ``ledger_head`` (one row, updated per batch) is left out.
STORED_TABLES = (("inference_records", "id"), ("quarantine", "id"), ("ledger", "seq"))


def _table_columns(table: str) -> list[str]:
    from collector.store.models import Base

    return [c.name for c in Base.metadata.tables[table].columns]


def _fetch_after(src, backend: str, table: str, key: str, after, limit: int) -> list[tuple]:
    """Up to ``limit`` rows of ``table`` in the source database with ``key`` above ``after``, as
    stored: PostgreSQL rows in COPY's text form (so writing them back is COPY of the same text)."""
    cols = ", ".join(_table_columns(table))
    if backend == "sqlite":
        return src.cursor().execute(f"SELECT {cols} FROM {table} WHERE {key} > ? ORDER BY {key} LIMIT ?", (after, limit)).fetchall()
    with src.cursor() as cur:
        with cur.copy(f"COPY (SELECT {cols} FROM {table} WHERE {key} > {int(after)} ORDER BY {key} LIMIT {int(limit)}) "
                      "TO STDOUT") as copy:
            return list(copy.rows())


def _write_table_rows(raw, backend: str, table: str, rows: list[tuple]) -> None:
    cols = _table_columns(table)
    if backend == "sqlite":
        raw.cursor().executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})", rows)
        return
    with raw.driver_connection.cursor() as cur:
        with cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def raw_all_tables(url: str, source_url: str) -> Timing:
    """The floor of writing *every* row an ingest run stored — its ``inference_records``,
    ``quarantine`` and ``ledger`` rows as the run left them in ``source_url`` (ids and hashes
    included) — into the same tables with the same indexes: PostgreSQL ``COPY``, SQLite
    ``executemany``, in chunks of 2 000 records with their share of the other two tables, one
    commit per chunk. Reading the source is not timed."""
    engine, src_engine = make_engine(url), make_engine(source_url)
    migrate.upgrade(engine)
    backend = engine.dialect.name
    raw, src = engine.raw_connection(), src_engine.raw_connection()
    server = ServerCpu(_database_name(engine))
    rows_done, elapsed, cpu = 0, 0.0, 0.0
    try:
        totals = {t: src.cursor().execute(f"SELECT count(*) FROM {t}").fetchone()[0] if backend == "sqlite" else
                  _pg_count(src, t) for t, _ in STORED_TABLES}
        chunks = max(1, -(-totals["inference_records"] // CHUNK))
        after = {t: -1 for t, _ in STORED_TABLES}
        for _ in range(chunks):
            parts = {}
            for table, key in STORED_TABLES:
                rows = _fetch_after(src, backend, table, key, after[table], -(-totals[table] // chunks))
                if rows:
                    after[table] = rows[-1][_table_columns(table).index(key)]
                parts[table] = rows
            c0, t0 = time.process_time(), time.perf_counter()
            if backend == "sqlite":
                raw.cursor().execute("BEGIN")
            for table, rows in parts.items():
                if rows:
                    _write_table_rows(raw, backend, table, rows)
            raw.commit()
            elapsed += time.perf_counter() - t0
            cpu += time.process_time() - c0
            rows_done += len(parts["inference_records"])
        server_s = server.used_s()
    finally:
        raw.close()
        src.close()
        engine.dispose()
        src_engine.dispose()
    return Timing(rows_done, elapsed, cpu, server_s)


def _pg_count(src, table: str) -> int:
    with src.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table}")
        return cur.fetchone()[0]


def raw_executemany(url: str, path: Path, settings: Settings) -> Timing:
    """The same rows through the DB-API ``executemany``, chunks of 2 000, one commit per chunk."""
    return _raw_floor(url, path, settings, _executemany_chunk)


def raw_copy(url: str, path: Path, settings: Settings) -> Timing:
    """PostgreSQL: the same rows through ``COPY inference_records FROM STDIN`` (psycopg formats each
    row in C), chunks of 2 000, one commit per chunk: the fastest way to write them."""
    return _raw_floor(url, path, settings, _copy_chunk)


def pipeline(url: str, path: Path, settings: Settings, workers: int | None = None) -> tuple[dict, Timing]:
    engine = make_engine(url)
    migrate.upgrade(engine)
    sessions = make_session_factory(engine)
    server = ServerCpu(_database_name(engine))
    w0 = _children_cpu_s()
    c0, t0 = time.process_time(), time.perf_counter()
    run = IngestRun(sessions, settings, **({} if workers is None else {"workers": workers}))
    with open(path, "rb") as f:
        run.ingest_stream(f, str(path))
    counts = run.finish()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    workers_s = _children_cpu_s() - w0  # finish() terminated and joined the workers
    server_s = server.used_s()
    engine.dispose()
    return counts.as_dict(), Timing(counts.read, elapsed, cpu, server_s, workers_s)


def pipeline_parsed_beforehand(url: str, path: Path, settings: Settings) -> tuple[dict, Timing]:
    """``pipeline`` with every chunk parsed before the clock starts: the parse workers only hand
    over the results (pickled as usual). What is left is the writer's own work and the server's on
    one connection — the pipeline's ceiling were parsing free. A measurement only: the workers
    read the results from memory their fork inherited (``parse_pool.parse_chunk`` replaced)."""
    from collector.ingest import parse_pool

    parse_pool._parser = LineParser(cluster=settings.cluster, max_line_bytes=settings.ingest_max_line_bytes,
                                    max_document_bytes=settings.ingest_max_body_bytes)
    with open(path, "rb") as f:
        parsed = {c.first: parse_pool.parse_chunk(str(path), c) for c in iter_chunks(f, settings.ingest_max_line_bytes)}
    original = parse_pool.parse_chunk
    parse_pool.parse_chunk = lambda _source, chunk: parsed[chunk.first]
    try:
        return pipeline(url, path, settings)
    finally:
        parse_pool.parse_chunk = original
        parse_pool._parser = None


def _cpus() -> int:
    """CPUs this process may run on (client, parse workers and, on this machine, the server share them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's reaped children (the parse workers)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _measure(backend: str, tmp: Path, fn, *args):
    url, drop = fresh_database(backend, tmp)
    try:
        return fn(url, *args)
    finally:
        drop()


def _show(t: Timing, unit: str) -> str:
    workers = f" + parse workers {t.workers_cpu_s:.2f} s" if t.workers_cpu_s else ""
    server = f" + server {t.server_cpu_s:.1f} s" if t.server_cpu_s else ""
    return (f"{t.n} {unit} in {t.wall_s:.2f} s = {t.n / t.wall_s:,.0f} {unit}/s "
            f"(CPU: client {t.client_cpu_s:.2f} s{workers}{server}; {1e6 * t.cpu_s / t.n:.0f} µs/{unit[:-1]})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the best is reported")
    ap.add_argument("--workers", type=int, default=None,
                    help="parse worker processes of the pipeline (default: one per CPU, at most 4; 1 = none)")
    ap.add_argument("--parsed-beforehand", action="store_true",
                    help="also run the pipeline once with every line parsed before timing (the writer's and "
                         "server's own ceiling; holds every parsed line in memory: ~3 GB per million)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        path = tmp / "fluentbit.jsonl"
        t0 = time.perf_counter()
        write_input(path, args.lines)
        print(f"input: {args.lines} Fluent Bit lines, {path.stat().st_size / 1e6:.0f} MB (written in "
              f"{time.perf_counter() - t0:.1f} s)")
        settings = Settings(cluster="bench")
        for backend in args.backends.split(","):
            # The rows one run stores in all three tables, kept for the all-rows floor (not timed).
            source_url, drop_source = fresh_database(backend, tmp)
            pipeline(source_url, path, settings, args.workers)
            # PostgreSQL's raw floor is COPY (also measured: executemany); SQLite has executemany only.
            floors = {"executemany": raw_executemany} | ({"COPY": raw_copy} if backend == "postgresql" else {})
            floors[ALL_ROWS] = lambda url, _path, _settings: raw_all_tables(url, source_url)
            raws: dict[str, list[Timing]] = {name: [] for name in floors}
            pipes: list[Timing] = []
            for rep in range(args.repeat):
                for name, fn in floors.items():
                    raws[name].append(_measure(backend, tmp, fn, path, settings))
                counts, t = _measure(backend, tmp, pipeline, path, settings, args.workers)
                pipes.append(t)
                shown = ", ".join(f"raw {name} {r[-1].n / r[-1].wall_s:,.0f} rows/s" for name, r in raws.items())
                print(f"{backend:10s} run {rep + 1}: {shown}, pipeline {t.n / t.wall_s:,.0f} lines/s", flush=True)
            pipe = min(pipes, key=lambda t: t.wall_s)
            for name, runs in raws.items():
                print(f"{backend:10s} raw {name:11s} (best of {args.repeat}): {_show(min(runs, key=lambda t: t.wall_s), 'rows')}")
            print(f"{backend:10s} pipeline        (best of {args.repeat}): {_show(pipe, 'lines')}  {counts}")
            cpus = _cpus()
            ceiling = cpus * pipe.n / pipe.cpu_s  # every CPU busy all the time with the pipeline's CPU per line
            for name, runs in raws.items():
                raw = min(runs, key=lambda t: t.wall_s)
                wall_ratio = (pipe.n / pipe.wall_s) / (raw.n / raw.wall_s)
                cpu_ratio = (pipe.n / pipe.cpu_s) / (raw.n / raw.cpu_s)
                print(f"{backend:10s} ratio pipeline/raw {name} = {wall_ratio:.2f} by wall time, {cpu_ratio:.2f} by CPU "
                      f"time (target ≥ 0.5); at most {ceiling / (raw.n / raw.wall_s):.2f} by wall time on {cpus} CPUs "
                      "with this CPU per line", flush=True)
            print(f"{backend:10s} pipeline used {pipe.cpu_s / pipe.wall_s:.2f} of {cpus} CPUs; {ceiling:,.0f} lines/s "
                  "if all were busy", flush=True)
            if args.parsed_beforehand:
                _counts, free = _measure(backend, tmp, pipeline_parsed_beforehand, path, settings)
                ratios = ", ".join(f"{(free.n / free.wall_s) / (min(r, key=lambda t: t.wall_s).n / min(r, key=lambda t: t.wall_s).wall_s):.2f}x {name}"
                                   for name, r in raws.items())
                print(f"{backend:10s} pipeline, lines parsed beforehand (writer + server ceiling): {_show(free, 'lines')}; "
                      f"{ratios}", flush=True)
            drop_source()


if __name__ == "__main__":
    main()
