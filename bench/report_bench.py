"""Benchmark: render an evidence pack for N transactions and M claims; seconds and peak RSS.

Usage::

    .venv/bin/python bench/report_bench.py                      # 1 M transactions, 10 k claims, SQLite
    .venv/bin/python bench/report_bench.py --long               # 10 M transactions
    .venv/bin/python bench/report_bench.py --backend postgresql --n 1000000 --claims 10000
    .venv/bin/python bench/report_bench.py --no-pdf             # populations only

The store holds one day: ``--gpus`` physical GPUs (every 8th split into two MIG slices), ``--claims``
allocation episodes spread over them (every 50th overlapping its predecessor on the same GPU, so the
sharing analysis has work), one consumer per claim, N transactions evenly spread over the day, each
with a lineage row (exact), a few findings and a coverage gap. Transactions and lineage are
generated in the database with a recursive CTE (fast on both backends); the rest with executemany.

The pack is rendered in a child process so that its peak RSS (``ru_maxrss``) is the renderer's
alone; the PDF worker process it starts for large packs is reported separately (CPU, peak RSS).
Per phase (each population, the lineage summary, the HTML, the transaction lineage, the PDF, the
manifest) it prints wall and CPU seconds: on a shared machine the CPU figures are the comparable ones.
``--keep-store`` keeps the filled store and prints its URL; ``--store URL`` renders from it again
(profiling: ``py-spy record -- python bench/report_bench.py --render-only URL OUT``).
Targets (issue 6): 10 M transactions in < 60 s, peak RSS < 1 GiB. The pack is about 670 B per
transaction (CSV ≈ 300 B + JSON ≈ 360 B, the JSON a split table without per-row keys), so 10 M
transactions write ≈ 6.7 GB: the disk's sustained write rate bounds the run from below. After
rendering, the bench measures that rate (``--disk-probe-mb`` MiB written to the pack's file system
with ``fdatasync``, 0 to skip) and prints the bound it sets (pack bytes ÷ rate) next to the CPU
bound: renderer (+ PDF worker) CPU seconds, plus on a PostgreSQL server on this host the CPU of
the server processes serving the bench database (``ServerCpu``: the text is rendered there),
divided by the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import insert, text  # noqa: E402

from collector.store import migrate  # noqa: E402
from collector.store.db import make_engine, make_session_factory  # noqa: E402
from collector.store.models import (  # noqa: E402
    AllocationEpisode,
    AllocationResult,
    ClaimConsumer,
    CoverageInterval,
    DeviceState,
    Finding,
    ObjectVersion,
)
from collector.timeutil import dt_to_ns  # noqa: E402

DAY = datetime(2026, 11, 28, tzinfo=timezone.utc)
DAY_NS = 86_400 * 10**9
CLUSTER = "bench-1"
NAMESPACES = [f"tenant-{i}" for i in range(8)]
TARGET_S = 60.0  # issue 6: 10 M transactions in < 60 s


def fill(url: str, n: int, claims: int, gpus: int) -> None:
    engine = make_engine(url)
    migrate.upgrade(engine)
    sessions = make_session_factory(engine)
    t0 = dt_to_ns(DAY)
    with sessions.begin() as s:
        src = s.execute(insert(ObjectVersion).values(
            cluster=CLUSTER, api_group="resource.k8s.io", api_version="v1", kind="ResourceSlice", namespace=None,
            name="bench", uid="bench", resource_version="1", event_type="ADDED", observed_at=DAY, raw={},
            content_hash="0" * 64).returning(ObjectVersion.id)).scalar_one()
        devices = []
        for g in range(gpus):
            node = f"node-{g // 8:04d}"
            gpu_uuid = f"GPU-{uuid.UUID(int=g + 1)}"
            if g % 8 == 7:
                for m in range(2):
                    devices.append(dict(cluster=CLUSTER, driver="gpu.nvidia.com", pool=node, device=f"gpu-{g % 8}-mig-{m}",
                                        slice_name=node, pool_generation=1, node_name=node, device_type="mig",
                                        uuid=f"MIG-{uuid.UUID(int=10**6 + g * 2 + m)}", parent_uuid=gpu_uuid,
                                        physical_gpu_uuid=gpu_uuid, profile="3g.40gb", product_name="NVIDIA A100-SXM4-80GB",
                                        driver_version="550.90.07", memory_bytes=40 * 2**30,
                                        allow_multiple_allocations=False, valid_from_ns=t0 - DAY_NS, valid_to_ns=None,
                                        source_version_id=src))
            else:
                devices.append(dict(cluster=CLUSTER, driver="gpu.nvidia.com", pool=node, device=f"gpu-{g % 8}",
                                    slice_name=node, pool_generation=1, node_name=node, device_type="gpu", uuid=gpu_uuid,
                                    parent_uuid=None, physical_gpu_uuid=gpu_uuid, profile=None,
                                    product_name="NVIDIA H100 80GB HBM3", driver_version="550.90.07",
                                    memory_bytes=80 * 2**30, allow_multiple_allocations=True,
                                    valid_from_ns=t0 - DAY_NS, valid_to_ns=None, source_version_id=src))
        s.execute(insert(DeviceState), devices)
        per_device = max(claims // len(devices), 1)
        slot_ns = DAY_NS // per_device
        episodes, results, consumers = [], [], []
        for k in range(claims):
            d = devices[k % len(devices)]
            slot = k // len(devices)
            start = t0 + slot * slot_ns
            end = start + slot_ns + (slot_ns // 2 if k % 50 == 0 else 0)
            ns = NAMESPACES[k % len(NAMESPACES)]
            episodes.append(dict(id=k + 1, cluster=CLUSTER, claim_uid=f"claim-{k}", claim_namespace=ns,
                                 claim_name=f"scorer-{k}-gpu", first_rv=str(k), node_name=d["node_name"],
                                 valid_from_ns=start, valid_to_ns=end, source_version_id=src))
            results.append(dict(episode_id=k + 1, request="gpu", driver=d["driver"], pool=d["pool"], device=d["device"],
                                device_class_name="gpu.nvidia.com", admin_access=False))
            consumers.append(dict(cluster=CLUSTER, claim_uid=f"claim-{k}", episode_id=k + 1, consumer_resource="pods",
                                  consumer_name=f"scorer-{k}", consumer_uid=f"pod-{k}", valid_from_ns=start,
                                  valid_to_ns=end))
        for table, rows in ((AllocationEpisode, episodes), (AllocationResult, results), (ClaimConsumer, consumers)):
            for i in range(0, len(rows), 5000):
                s.execute(insert(table), rows[i:i + 5000])
        s.execute(insert(CoverageInterval), [
            dict(cluster=CLUSTER, kind="ResourceClaim", state="synced", started_ns=t0, ended_ns=t0 + DAY_NS // 2),
            dict(cluster=CLUSTER, kind="ResourceClaim", state="gap", started_ns=t0 + DAY_NS // 2,
                 ended_ns=t0 + DAY_NS // 2 + 300 * 10**9, reason="410 Gone"),
            dict(cluster=CLUSTER, kind="ResourceClaim", state="synced", started_ns=t0 + DAY_NS // 2 + 300 * 10**9,
                 ended_ns=t0 + DAY_NS)])
        s.execute(insert(Finding), [dict(
            finding_key=f"{i:064d}", cluster=CLUSTER, rule="isolation.cross_tenant_without_partitioning",
            severity="high", kind="violation", message="bench", subjects={"claims": [i]}, evidence=None,
            physical_gpu_uuid=None, from_ns=t0 + i, to_ns=t0 + i + 10**9, period_from_ns=t0, period_to_ns=t0 + DAY_NS,
            bundle_revision="bench", bundle_digest="b" * 64, engine="regorus", evaluated_at=DAY) for i in range(50)])
    step = DAY_NS // n
    series = f"WITH RECURSIVE seq(i) AS (SELECT CAST(0 AS BIGINT) UNION ALL SELECT i + 1 FROM seq WHERE i < {n - 1}) "
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO inference_records (id, transaction_id, event_time_ns, event_time_precision_ns, received_ns, "
            "cluster, pod_namespace, pod_name, container_name, model_name, model_version, decision, source_format, "
            "envelope, source, position, raw_sha256, dedup_key, conflict) " + series +
            f"SELECT i + 1, 'txn-' || i, {t0} + i * {step}, 1000000, {t0} + i * {step} + 1000, '{CLUSTER}', "
            f"'tenant-' || (i % 8), 'scorer-' || (i % {claims}), 'scorer', 'fraud-gbm', '2026.11.3', 'approve', "
            f"'jsonl', 'plain', 'bench.jsonl', '' || i, '{'a' * 64}', 'k' || i, false FROM seq"))
        conn.execute(text(
            "INSERT INTO lineage (record_id, status, reason, candidates, claim_namespace, claim_name, request, driver, "
            "pool, device, physical_gpu_uuid, device_uuid, node_name, attributed_at) " + series +
            f"SELECT i + 1, 'exact', NULL, 1, 'tenant-' || (i % 8), 'scorer-' || (i % {claims}) || '-gpu', 'gpu', "
            f"'gpu.nvidia.com', 'node-0000', 'gpu-0', 'GPU-bench-' || (i % {gpus}), 'GPU-bench-' || (i % {gpus}), "
            f"'node-0000', :at FROM seq"), {"at": DAY if engine.dialect.name == "postgresql" else DAY.replace(tzinfo=None)})
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT setval(pg_get_serial_sequence('inference_records', 'id'), :n)"), {"n": n})
            conn.execute(text("ANALYZE"))
    engine.dispose()


class ServerCpu:
    """CPU seconds (user + system) of the PostgreSQL server processes serving the bench database,
    when the server runs on this host: its backends (``pg_stat_activity`` rows of the database,
    parallel workers included) are listed every ``interval_s`` and their ``/proc/PID/stat`` times
    read; a process counts with its last reading (up to ``interval_s`` of a process's last work is
    missed). ``seconds()`` is None when the server is not local or not PostgreSQL."""

    def __init__(self, url: str, interval_s: float = 0.2) -> None:
        self._ticks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = None
        if not url.startswith("postgresql"):
            return
        self._engine = make_engine(url)
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        with self._engine.connect() as conn:
            while not self._stop.is_set():
                pids = conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                         "AND pid <> pg_backend_pid()")).scalars().all()
                conn.rollback()
                for pid in pids:
                    try:
                        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    except OSError:  # not on this host, or it ended
                        continue
                    self._ticks[pid] = int(fields[11]) + int(fields[12])
                self._stop.wait(self._interval_s)

    def seconds(self) -> float | None:
        """Stop sampling; the CPU seconds counted (None when not measurable here)."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._engine.dispose()
        return sum(self._ticks.values()) / os.sysconf("SC_CLK_TCK") if self._ticks else None


def render_child(url: str, out: str, pdf: bool) -> None:
    from reports import render
    from reports.render import PackRequest, render_pack

    shutdown_pdf_worker = getattr(render, "shutdown_pdf_worker", lambda: None)  # absent in older revisions

    engine = make_engine(url)
    sessions = make_session_factory(engine)
    server = ServerCpu(url)
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = render_pack(sessions, PackRequest(DAY, DAY + timedelta(days=1), (CLUSTER,)), Path(out), pdf=pdf,
                         record=False)
    seconds = time.perf_counter() - started
    server_cpu_s = server.seconds()
    shutdown_pdf_worker()  # so that its CPU and peak RSS are counted in RUSAGE_CHILDREN
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime
    peak = usage.ru_maxrss * 1024
    sizes = {f.path: f.size for f in result.files}
    print(json.dumps({"backend": engine.dialect.name, "seconds": round(seconds, 2), "cpu_seconds": round(cpu_s, 2), "peak_rss_bytes": peak,
                      "counts": result.counts, "phases_s": getattr(result, "timings_s", {}),
                      "phases_cpu_s": getattr(result, "cpu_s", {}),
                      "children_peak_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
                      "children_cpu_seconds": round(sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2]), 2),
                      "server_cpu_seconds": None if server_cpu_s is None else round(server_cpu_s, 2), "pack_bytes": sum(sizes.values()), "pdf_bytes": sizes.get("report.pdf")}))


def disk_write_rate(directory: Path, mib: int) -> float:
    """Sustained write rate of ``directory``'s file system in bytes/s: ``mib`` MiB of incompressible
    data written in 8 MiB blocks then ``fdatasync`` (as ``dd conv=fdatasync``); the file is removed."""
    block = os.urandom(8 << 20)
    path = directory / "disk-probe.bin"
    started = time.perf_counter()
    with open(path, "wb") as fh:
        for _ in range(max(mib // 8, 1)):
            fh.write(block)
        fh.flush()
        os.fdatasync(fh.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return max(mib // 8, 1) * len(block) / seconds


def explain_bound(m: dict, rate: float | None, cores: int) -> list[str]:
    """What bounds the rendering: bytes written ÷ the measured disk rate, CPU ÷ cores."""
    pack, n = m["pack_bytes"], max(m["counts"].get("transaction_lineage", 0), 1)
    lines = [f"bytes: {pack / 1e9:.2f} GB written, {pack / n:.0f} B per transaction"]
    if rate:
        lines.append(f"disk: {rate / 1e6:.0f} MB/s sustained (fdatasync) -> writing the pack takes >= {pack / rate:.1f} s "
                     "once the page cache's dirty limit is reached (the kernel buffers the first GBs, so a run can "
                     "return before its bytes are on disk)")
    cpu = m["cpu_seconds"] + m["children_cpu_seconds"] + (m.get("server_cpu_seconds") or 0.0)
    server = m.get("server_cpu_seconds")
    if server is not None:
        lines.append(f"cpu: {cpu - server:.1f} s renderer + PDF worker + {server:.1f} s PostgreSQL server on {cores} "
                     f"cores -> >= {cpu / cores:.1f} s ({cpu / n * 1e6:.1f} µs per transaction)")
    else:
        lines.append(f"cpu: {cpu:.1f} s renderer + PDF worker on {cores} cores -> >= {cpu / cores:.1f} s "
                     f"({cpu / n * 1e6:.1f} µs per transaction)"
                     + (" (plus the database server's CPU, not measurable from here)"
                        if m.get("backend") == "postgresql" else ""))
    bounds = {"cpu": cpu / cores, **({"disk": pack / rate} if rate else {})}
    tightest = max(bounds, key=bounds.get)
    lines.append(f"bound: {tightest} ({bounds[tightest]:.1f} s) of {m['seconds']:.1f} s wall"
                 + (f"; under {TARGET_S:.0f} s needs <= {TARGET_S * cores / n * 1e6:.1f} µs CPU per transaction"
                    if tightest == "cpu" and bounds["cpu"] >= TARGET_S else ""))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="transactions (default 1 M)")
    ap.add_argument("--claims", type=int, default=10_000, help="claims (default 10 k)")
    ap.add_argument("--gpus", type=int, default=1_000, help="physical GPUs (default 1000)")
    ap.add_argument("--long", action="store_true", help="10 M transactions")
    ap.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--no-pdf", action="store_true", help="skip report.pdf (populations and HTML only)")
    ap.add_argument("--store", metavar="URL", help="render from an existing bench store (filled by --keep-store)")
    ap.add_argument("--keep-store", action="store_true", help="keep the filled store and print its URL")
    ap.add_argument("--disk-probe-mb", type=int, default=2048,
                    help="MiB written with fdatasync after rendering to measure the disk's rate (0: skip)")
    ap.add_argument("--render-only", nargs=2, metavar=("URL", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.render_only:
        render_child(args.render_only[0], args.render_only[1], not args.no_pdf)
        return
    n = 10_000_000 if args.long else args.n
    work = Path(tempfile.mkdtemp(prefix="draudit-report-bench-"))
    admin = name = None
    if args.store:
        url = args.store
    elif args.backend == "sqlite":
        store_dir = Path(tempfile.mkdtemp(prefix="draudit-report-store-")) if args.keep_store else work
        url = f"sqlite:///{store_dir / 'bench.db'}"
    else:
        admin_url = os.environ.get("DRAUDIT_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/test")
        name = f"draudit_report_bench_{uuid.uuid4().hex[:8]}"
        admin = make_engine(admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = admin.url.set(database=name).render_as_string(hide_password=False)
    try:
        if not args.store:
            started = time.perf_counter()
            fill(url, n, args.claims, args.gpus)
            print(f"store: {n} transactions, {args.claims} claims, {args.gpus} GPUs on {args.backend} "
                  f"filled in {time.perf_counter() - started:.1f} s", flush=True)
            if args.keep_store:
                print(f"store kept: --store {url}", flush=True)
        cmd = [sys.executable, __file__, "--render-only", url, str(work / "pack")] + (["--no-pdf"] if args.no_pdf else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        m = json.loads(out)
        print(f"pack: {m['seconds']:.1f} s wall, {m['cpu_seconds']:.1f} s CPU (renderer), "
              f"peak RSS {m['peak_rss_bytes'] / 2**20:.0f} MiB, "
              f"{m['pack_bytes'] / 2**20:.0f} MiB on disk (PDF {(m['pdf_bytes'] or 0) / 2**10:.0f} KiB)")
        print(f"phases (wall s): {m['phases_s']}")
        print(f"phases (renderer CPU s): {m['phases_cpu_s']}")
        print(f"PDF worker process: {m['children_cpu_seconds']:.1f} s CPU, peak RSS {m['children_peak_rss_bytes'] / 2**20:.0f} MiB")
        if m.get("server_cpu_seconds") is not None:
            print(f"PostgreSQL server processes: {m['server_cpu_seconds']:.1f} s CPU")
        print(f"rows: {m['counts']}")
        shutil.rmtree(work / "pack", ignore_errors=True)  # its page cache no longer competes with the probe
        rate = disk_write_rate(work, args.disk_probe_mb) if args.disk_probe_mb > 0 else None
        for line in explain_bound(m, rate, os.cpu_count() or 1):
            print(line)
        print("targets: 10 M transactions < 60 s, peak RSS < 1 GiB")
    finally:
        if admin is not None and not args.keep_store:
            with admin.connect() as conn:
                conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' "
                                  "AND pid <> pg_backend_pid()"))
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        if admin is not None:
            admin.dispose()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
