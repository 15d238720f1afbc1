"""Benchmark: attribution of N transactions vs the bare interval join, and ``trace`` latency.

Usage::

    .venv/bin/python bench/lineage_bench.py                 # 1 M transactions, SQLite and PostgreSQL
    .venv/bin/python bench/lineage_bench.py --n 100000 --backends sqlite --trace-runs 500

The store holds a day of history: ``--nodes`` nodes × 8 GPUs, on each GPU a sequence of pods
(``--pod-lifetime-s``, 10 s apart; a StatefulSet-like name per slot) whose ``triton`` container holds
a template claim; every ResourceSlice is republished every 6 h. Transactions (logged by the
``risk-api`` container: the sidecar pattern) are spread evenly over the day, half carrying the pod
uid and half only namespace/name, so the run yields exact, skew-window and no-pod results.

Measured per backend:
- ``attribute``: ``collector.lineage.attribute_run`` over all records (``--chunk`` records per chunk);
- ``bare join``: one INSERT ... SELECT joining each record to the device interval valid at its time
  on its node (``device_states`` by (cluster, driver, pool, device) and ``[valid_from, valid_to)``)
  into a scratch table: the floor any interval-based attribution pays (the issue's baseline);
- ``bare join into lineage``: the same join writing lineage rows into ``lineage`` itself (same table,
  indexes and foreign key as attribution), i.e. the floor including the cost of the output;
- ``trace``: p50/p99 of ``collector.lineage.trace`` for one random transaction id at that stored size.

Each of the first three is run ``--repeat`` times, rolled back each time; the best wall time is
reported with its CPU time (this process + the PostgreSQL backend: the machine may be shared, and
CPU time is the steadier number there).

PostgreSQL: ``DRAUDIT_TEST_PG_URL`` (default ``postgresql://root@127.0.0.1:5432/test``) is an
administrative URL; the bench creates and drops its own database.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import (  # noqa: E402
    BigInteger, Column, MetaData, String, Table, and_, case, cast, func, insert, literal, null, or_, select, text,
)
from sqlalchemy.orm import Session  # noqa: E402

from collector.lineage import DEFAULT_CHUNK_RECORDS, attribute_run, trace  # noqa: E402
from collector.store import migrate  # noqa: E402
from collector.store.db import make_engine, make_session_factory  # noqa: E402
from collector.store.models import (  # noqa: E402
    AllocationEpisode,
    AllocationResult,
    ClaimConsumer,
    DeviceState,
    InferenceRecord,
    Lineage,
    ObjectVersion,
    PodClaimRef,
    PodContainerClaim,
    PodState,
    UTCDateTime,
    WatchState,
)
from collector.timeutil import NS_PER_S, dt_to_ns  # noqa: E402

S = NS_PER_S
DAY_S = 86_400
START = dt_to_ns(datetime(2026, 11, 28, 0, 0, tzinfo=timezone.utc))
CLUSTER = "bench"
NS = "risk-inference"
DRIVER = "gpu.nvidia.com"
GPUS_PER_NODE = 8
POD_GAP_S = 10
SLICE_REPUBLISH_S = 6 * 3600
PG_ADMIN_URL = os.environ.get("DRAUDIT_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/test")


def build_history(session: Session, nodes: int, pod_lifetime_s: int) -> int:
    """Write the projections of one day; returns the number of pod instances."""
    now = datetime.now(timezone.utc)
    vid = session.execute(insert(ObjectVersion).values(
        cluster=CLUSTER, api_group="", api_version="v1", kind="Pod", namespace=NS, name="bench", uid="bench",
        resource_version="1", event_type="ADDED", observed_at=now, raw={}, content_hash="0" * 64,
    ).returning(ObjectVersion.id)).scalar_one()
    for kind in ("Pod", "ResourceClaim", "ResourceSlice"):
        session.execute(insert(WatchState).values(cluster=CLUSTER, kind=kind, api_version="v1", synced=True,
                                                  state="synced", state_since_ns=START - 3600 * S, updated_at=now))
    devices = []
    for n in range(nodes):
        node = f"gpu-node-{n}"
        for g in range(GPUS_PER_NODE):
            gpu_uuid = f"GPU-{uuid.UUID(int=(n << 8) | g)}"
            for gen, t in enumerate(range(0, DAY_S, SLICE_REPUBLISH_S), start=1):
                end = t + SLICE_REPUBLISH_S
                devices.append(dict(
                    cluster=CLUSTER, driver=DRIVER, pool=node, device=f"gpu-{g}", slice_name=f"{node}-gpu",
                    pool_generation=gen, node_name=node, device_type="gpu", uuid=gpu_uuid, parent_uuid=None,
                    physical_gpu_uuid=gpu_uuid, product_name="NVIDIA H100 80GB HBM3", valid_from_ns=START + t * S,
                    valid_to_ns=None if end >= DAY_S else START + end * S, source_version_id=vid))
    session.execute(insert(DeviceState), devices)

    pods, refs, containers, episodes, consumers = [], [], [], [], []
    slots = DAY_S // pod_lifetime_s
    for n in range(nodes):
        node = f"gpu-node-{n}"
        for g in range(GPUS_PER_NODE):
            for k in range(slots):
                uid, name = pod_uid(n, g, k), pod_name(n, g, k)
                t0, t1 = START + (k * pod_lifetime_s + POD_GAP_S) * S, START + (k + 1) * pod_lifetime_s * S
                pods.append(dict(cluster=CLUSTER, pod_uid=uid, namespace=NS, name=name, node_name=node, phase="Running",
                                 valid_from_ns=t0, valid_to_ns=t1, source_version_id=vid))
                refs.append(dict(cluster=CLUSTER, pod_uid=uid, namespace=NS, pod_claim_name="gpu",
                                 claim_name=f"{name}-gpu", template_name="h100", valid_from_ns=t0, valid_to_ns=t1))
                containers.append(dict(cluster=CLUSTER, pod_uid=uid, container_name="triton", init_container=False,
                                       pod_claim_name="gpu", request=""))
                episodes.append(dict(cluster=CLUSTER, claim_uid=f"claim-{uid}", claim_namespace=NS,
                                     claim_name=f"{name}-gpu", owner_pod_uid=uid, first_rv=str(len(episodes) + 10),
                                     node_name=node, valid_from_ns=t0, valid_to_ns=t1, source_version_id=vid))
                consumers.append((uid, name, t0, t1, node, g))
    session.execute(insert(PodState), pods)
    session.execute(insert(PodClaimRef), refs)
    session.execute(insert(PodContainerClaim), containers)
    session.execute(insert(AllocationEpisode), episodes)
    ids = dict(session.execute(select(AllocationEpisode.claim_uid, AllocationEpisode.id)).all())
    session.execute(insert(AllocationResult), [
        dict(episode_id=ids[f"claim-{uid}"], request="gpu", driver=DRIVER, pool=node, device=f"gpu-{g}",
             device_class_name="gpu.nvidia.com", admin_access=False) for uid, _, _, _, node, g in consumers])
    session.execute(insert(ClaimConsumer), [
        dict(cluster=CLUSTER, claim_uid=f"claim-{uid}", episode_id=ids[f"claim-{uid}"], consumer_resource="pods",
             consumer_name=name, consumer_uid=uid, valid_from_ns=t0, valid_to_ns=t1)
        for uid, name, t0, t1, _, _ in consumers])
    return len(pods)


def pod_uid(n: int, g: int, k: int) -> str:
    return f"uid-{n}-{g}-{k}"


def pod_name(n: int, g: int, k: int) -> str:
    return f"scorer-{n}-{g}-{k}"


def build_records(session: Session, n_records: int, nodes: int, pod_lifetime_s: int) -> None:
    """Insert ``n_records`` transactions set-based (a recursive counter), spread evenly over the day.

    Record ``i`` is logged on GPU ``i mod GPUs`` by the pod of the slot containing its time; even
    records carry the pod uid, odd ones only namespace/name.
    """
    gpus = nodes * GPUS_PER_NODE
    step_ns = DAY_S * S // n_records
    counter = select(literal(0, BigInteger).label("i")).cte("counter", recursive=True)
    counter = counter.union_all(select(counter.c.i + 1).where(counter.c.i + 1 < n_records))
    i = counter.c.i
    t = START + i * step_ns
    node_no, gpu_no, slot = (i % gpus) // GPUS_PER_NODE, i % GPUS_PER_NODE, (i * step_ns) // (pod_lifetime_s * S)
    n_txt, g_txt, k_txt = (cast(x, String) for x in (node_no, gpu_no, slot))
    suffix = n_txt + "-" + g_txt + "-" + k_txt
    rows = select(
        ("txn-" + cast(i, String)).label("transaction_id"),
        t.label("event_time_ns"),
        literal(1_000_000).label("event_time_precision_ns"),
        (t + 50_000_000).label("received_ns"),
        literal(CLUSTER).label("cluster"),
        case((i % 2 == 0, "uid-" + suffix), else_=null()).label("pod_uid"),
        literal(NS).label("pod_namespace"),
        ("scorer-" + suffix).label("pod_name"),
        literal("risk-api").label("container_name"),
        ("gpu-node-" + n_txt).label("node_name"),
        literal("spring_ecs_nested").label("source_format"),
        literal("cri").label("envelope"),
        literal("bench").label("source"),
        literal("0" * 64).label("raw_sha256"),
        ("k" + cast(i, String)).label("dedup_key"),
    )
    session.execute(insert(InferenceRecord).from_select([c.name for c in rows.selected_columns], rows))


class Clock:
    """Wall and CPU seconds of one measured step; CPU = this process + the PostgreSQL backend.

    SQLite runs in-process, so ``time.process_time`` covers it. A PostgreSQL backend is a separate
    process on this machine: its user+system time is read from ``/proc/<backend pid>/stat``.
    The machine is shared with other jobs: CPU time moves far less than wall time under load.
    """

    def __init__(self, session: Session):
        self.backend_pid = None
        if session.get_bind().dialect.name == "postgresql":
            self.backend_pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()

    def _backend_cpu(self) -> float:
        if self.backend_pid is None:
            return 0.0
        try:
            fields = Path(f"/proc/{self.backend_pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def __enter__(self) -> "Clock":
        self._wall, self._cpu, self._backend = time.perf_counter(), time.process_time(), self._backend_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._wall
        self.cpu_s = time.process_time() - self._cpu + self._backend_cpu() - self._backend


def bare_join(session: Session) -> tuple[Clock, int]:
    """The floor: one INSERT ... SELECT joining every record to the device interval valid at its time.

    Writes (record id, device state id) into a scratch temporary table. Returns the clock of the
    INSERT ... SELECT and the rows written.
    """
    md = MetaData()
    scratch = Table("bench_bare_join", md, Column("record_id", BigInteger), Column("device_state_id", BigInteger),
                    prefixes=["TEMPORARY"])
    scratch.create(session.connection())
    with Clock(session) as clock:
        session.execute(insert(scratch).from_select(["record_id", "device_state_id"], _bare_select(full=False)))
    n = session.execute(select(func.count()).select_from(scratch)).scalar_one()
    scratch.drop(session.connection())
    return clock, n


def _bare_select(full: bool):
    r, ds = InferenceRecord.__table__, DeviceState.__table__
    t = r.c.event_time_ns
    cols = [ds.c.uuid, ds.c.physical_gpu_uuid, ds.c.product_name, ds.c.pool, ds.c.device, ds.c.node_name] if full else []
    return select(r.c.id, ds.c.id, *cols).select_from(r.join(ds, and_(
                      ds.c.cluster == r.c.cluster, ds.c.driver == DRIVER, ds.c.pool == r.c.node_name,
                      ds.c.device == "gpu-0", ds.c.valid_from_ns <= t, or_(ds.c.valid_to_ns.is_(None), t < ds.c.valid_to_ns))))


def bare_join_into_lineage(session: Session) -> tuple[Clock, int]:
    """The same bare join writing what it can fill of a lineage row into ``lineage`` itself
    (same table, same indexes and foreign key as attribution writes). Caller rolls back."""
    b = _bare_select(full=True).subquery()
    c = b.c
    q = select(c[0], literal("exact"), literal(1), c[7], literal(DRIVER), c[5], c[6], c[1], c[2], c[3], c[4],
               literal(datetime.now(timezone.utc), UTCDateTime()))
    with Clock(session) as clock:
        session.execute(insert(Lineage).from_select(
            ["record_id", "status", "candidates", "node_name", "driver", "pool", "device", "device_state_id",
             "device_uuid", "physical_gpu_uuid", "product_name", "attributed_at"], q))
    return clock, session.execute(select(func.count()).select_from(Lineage)).scalar_one()


def best(runs: list[Clock]) -> Clock:
    return min(runs, key=lambda c: c.wall_s)


def run_backend(label: str, url: str, args: argparse.Namespace) -> None:
    engine = make_engine(url)
    migrate.upgrade(engine)
    sessions = make_session_factory(engine)
    t0 = time.perf_counter()
    with sessions.begin() as s:
        n_pods = build_history(s, args.nodes, args.pod_lifetime_s)
        build_records(s, args.n, args.nodes, args.pod_lifetime_s)
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
    else:
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    print(f"[{label}] stored {args.n:,} transactions, {n_pods:,} pod instances on {args.nodes * GPUS_PER_NODE} GPUs "
          f"in {time.perf_counter() - t0:.1f} s; best of {args.repeat} (each run rolled back)")

    bare, bare_lineage, attr = [], [], []
    n_bare = n_bare_lineage = 0
    summary = None
    for _ in range(args.repeat):
        with sessions() as s:
            clock, n_bare = bare_join(s)
            bare.append(clock)
            s.rollback()
        with sessions() as s:
            clock, n_bare_lineage = bare_join_into_lineage(s)
            bare_lineage.append(clock)
            s.rollback()
        with sessions() as s:
            with Clock(s) as clock:
                summary = attribute_run(s, clock_skew_s=2.0, chunk_records=args.chunk)
            attr.append(clock)
            s.rollback()
    b, bl, a = best(bare), best(bare_lineage), best(attr)
    written = sum(summary.by_status.values())

    def line(name: str, c: Clock, rows: int) -> str:
        return (f"[{label}] {name:<26}: {c.wall_s:7.2f} s wall {c.cpu_s:7.2f} s CPU  ({rows:,} rows, "
                f"{rows / c.wall_s:,.0f} rows/s)")

    print(line("bare interval join", b, n_bare))
    print(line("bare join into lineage", bl, n_bare_lineage))
    print(line("attribute", a, written))
    print(f"[{label}] ratio attribute / bare join          : {a.wall_s / b.wall_s:5.2f}x wall  "
          f"{a.cpu_s / b.cpu_s:5.2f}x CPU   (speed {100 * b.wall_s / a.wall_s:.0f} % of the bare join; target >= 50 %)")
    print(f"[{label}] ratio attribute / bare join -> lineage: {a.wall_s / bl.wall_s:5.2f}x wall  "
          f"{a.cpu_s / bl.cpu_s:5.2f}x CPU")
    print(f"[{label}]   {summary.as_json()}")

    with sessions.begin() as s:
        attribute_run(s, clock_skew_s=2.0, chunk_records=args.chunk)
    rng = random.Random(7)
    latencies = []
    with sessions() as s:
        assert s.execute(select(func.count()).select_from(Lineage)).scalar_one() == args.n
        for _ in range(args.trace_runs):
            txn = f"txn-{rng.randrange(args.n)}"
            t0 = time.perf_counter()
            trace(s, [txn], cluster=CLUSTER)
            latencies.append((time.perf_counter() - t0) * 1000)
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(f"[{label}] trace (one id, {args.n:,} stored): p50 {p50:.2f} ms  p99 {p99:.2f} ms  ({args.trace_runs} runs)")
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="transactions to store and attribute")
    parser.add_argument("--nodes", type=int, default=8, help="GPU nodes (8 GPUs each)")
    parser.add_argument("--pod-lifetime-s", type=int, default=3600, help="lifetime of each pod instance")
    parser.add_argument("--trace-runs", type=int, default=200)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is reported")
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK_RECORDS, help="attribution chunk (records)")
    args = parser.parse_args()

    backends = args.backends.split(",")
    if "sqlite" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            run_backend("sqlite", f"sqlite:///{tmp}/bench.db", args)
    if "postgresql" in backends:
        name = f"draudit_bench_{uuid.uuid4().hex[:8]}"
        admin = make_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            run_backend("postgresql", admin.url.set(database=name).render_as_string(hide_password=False), args)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


if __name__ == "__main__":
    main()
