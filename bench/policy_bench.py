"""Benchmark: policy evaluation over 100 k allocation intervals on 500 GPUs, embedded engine (regorus).

Builds two days of history as projection rows in a fresh store (SQLite file by default, or an
empty PostgreSQL database with ``--database-url``), then times, separately:
- facts: ``collector.policy.facts.build_facts`` (SQL: intervals, overlaps, handovers, idle, ...);
- Rego: ``RegorusEngine.evaluate`` (input conversion + the four decision packages);
- store: findings rows inserted and ledgered.
Target (issue #5): facts + Rego < 5 s.

The history: 480 full GPUs and 20 GPUs split into two MIG partitions (520 devices) on 125 nodes;
each device runs back-to-back allocations of 3–11 minutes separated by 5–10 minutes (1 % of
handovers are fast), a device usually stays with its namespace (80 %) among 40 namespaces, MIG
partitions of one GPU mostly serve one namespace, 0.5 % of allocations sit idle, 20 k transactions
are attributed (0.5 % unattributed).

Usage: .venv/bin/python bench/policy_bench.py [--intervals 100000] [--gpus 500] [--database-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import insert, text  # noqa: E402

from collector.policy.bundle import load_bundle  # noqa: E402
from collector.policy.engines import RegorusEngine  # noqa: E402
from collector.policy.facts import build_facts  # noqa: E402
from collector.policy.findings import store_findings, to_rows  # noqa: E402
from collector.settings import DEFAULT_POLICY_BUNDLE  # noqa: E402
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
)
from collector.timeutil import NS_PER_S, dt_to_ns  # noqa: E402

T0 = dt_to_ns(datetime(2026, 11, 29, tzinfo=timezone.utc))
DAY_NS = 86_400 * NS_PER_S
PERIOD_NS = 2 * DAY_NS  # the whole history: ~192 allocations of ~14 min (with gaps) per device
CLUSTER = "prod-eu-1"
NAMESPACES = [f"team-{i:02d}" for i in range(40)]


def _devices(gpus: int) -> list[dict]:
    mig_gpus = max(1, gpus // 25)
    devices = []
    for g in range(gpus):
        node, minor = f"gpu-node-{g // 4:03d}", g % 4
        uuid = f"GPU-{g:08x}-6b7d-4e21-9f00-3a5b7c9d1e01"
        if g < gpus - mig_gpus:
            devices.append(dict(pool=node, device=f"gpu-{minor}", device_type="gpu", uuid=uuid, parent_uuid=None,
                                physical_gpu_uuid=uuid, profile=None))
        else:
            for p in range(2):
                devices.append(dict(pool=node, device=f"gpu-{minor}-mig-3g40gb-9-{p * 4}", device_type="mig",
                                    uuid=f"MIG-{g:08x}-{p}", parent_uuid=uuid, physical_gpu_uuid=uuid, profile="3g.40gb"))
    return devices


def build_history(sessions, intervals: int, gpus: int, records: int, seed: int = 7) -> dict[str, int]:
    """Bulk-insert the history; returns row counts."""
    rng = random.Random(seed)
    now = datetime.now(timezone.utc)
    devices = _devices(gpus)
    per_device = intervals // len(devices)
    with sessions.begin() as s:
        s.execute(insert(ObjectVersion).values(
            id=1, cluster=CLUSTER, api_group="resource.k8s.io", api_version="v1", kind="ResourceSlice", namespace=None,
            name="bench", uid="bench", resource_version="1", event_type="ADDED", observed_at=now, raw={}, content_hash="0" * 64))
        s.execute(insert(DeviceState), [
            dict(id=i + 1, cluster=CLUSTER, driver="gpu.nvidia.com", slice_name=f"{d['pool']}-gpu.nvidia.com-x", pool_generation=1,
                 node_name=d["pool"], product_name="NVIDIA H100 80GB HBM3", allow_multiple_allocations=False,
                 valid_from_ns=T0 - 3600 * NS_PER_S, valid_to_ns=None, source_version_id=1, **d)
            for i, d in enumerate(devices)])
        episodes, results, consumers = [], [], []
        eid = 0
        gpu_namespace: dict[str, str] = {}
        for d in devices:
            t = T0 + rng.randrange(0, 600) * NS_PER_S
            ns = gpu_namespace.setdefault(d["physical_gpu_uuid"], rng.choice(NAMESPACES))
            if d["device_type"] == "mig" and rng.random() < 0.1:
                ns = rng.choice(NAMESPACES)
            for _ in range(per_device):
                eid += 1
                if rng.random() < 0.2:
                    ns = rng.choice(NAMESPACES)
                length = rng.randrange(180, 660) * NS_PER_S
                claim = f"job-{eid:06d}-gpu"
                episodes.append(dict(id=eid, cluster=CLUSTER, claim_uid=f"uid-{eid:06d}", claim_namespace=ns, claim_name=claim,
                                     first_rv=str(eid), node_name=d["pool"], valid_from_ns=t, valid_to_ns=t + length,
                                     source_version_id=1))
                results.append(dict(id=eid, episode_id=eid, request="gpu", driver="gpu.nvidia.com", pool=d["pool"],
                                    device=d["device"], device_class_name="mig.nvidia.com" if d["device_type"] == "mig" else "gpu.nvidia.com",
                                    admin_access=False, share_id=None))
                consumer_end = t + length if rng.random() >= 0.005 else t + 60 * NS_PER_S
                consumers.append(dict(id=eid, cluster=CLUSTER, claim_uid=f"uid-{eid:06d}", episode_id=eid, consumer_api_group="",
                                      consumer_resource="pods", consumer_name=f"{claim}-pod", consumer_uid=f"pod-{eid:06d}",
                                      valid_from_ns=t, valid_to_ns=consumer_end))
                gap_s = rng.randrange(0, 120) if rng.random() < 0.01 else rng.randrange(300, 600)
                t += length + gap_s * NS_PER_S
        for table, rows in ((AllocationEpisode, episodes), (AllocationResult, results), (ClaimConsumer, consumers)):
            for i in range(0, len(rows), 20_000):
                s.execute(insert(table), rows[i:i + 20_000])
        recs, lineage = [], []
        for i in range(records):
            recs.append(dict(id=i + 1, transaction_id=f"txn-{i:07d}", event_time_ns=T0 + i * NS_PER_S, event_time_precision_ns=1000,
                             received_ns=T0 + i * NS_PER_S, cluster=CLUSTER, source_format="jsonl", envelope="plain", source="bench",
                             raw_sha256="0" * 64, dedup_key=f"{i:064d}", conflict=False))
            status = "unattributed" if rng.random() < 0.005 else "exact"
            lineage.append(dict(record_id=i + 1, status=status, reason="no-pod" if status == "unattributed" else None,
                                candidates=1, attributed_at=now))
        for table, rows in ((InferenceRecord, recs), (Lineage, lineage)):
            for i in range(0, len(rows), 20_000):
                s.execute(insert(table), rows[i:i + 20_000])
    return {"devices": len(devices), "physical_gpus": gpus, "allocation_intervals": len(episodes), "records": records}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", type=int, default=100_000)
    parser.add_argument("--gpus", type=int, default=500)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--database-url", default=None, help="an EMPTY database (default: a temporary SQLite file)")
    parser.add_argument("--bundle", default=str(DEFAULT_POLICY_BUNDLE))
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="draudit-policy-bench-")
    url = args.database_url or f"sqlite:///{Path(tmp.name) / 'bench.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    sessions = make_session_factory(engine)
    with sessions() as s:
        if s.execute(text("SELECT COUNT(*) FROM allocation_episodes")).scalar_one():
            print(f"{url}: not empty; give an empty database", file=sys.stderr)
            return 2
    started = time.perf_counter()
    sizes = build_history(sessions, args.intervals, args.gpus, args.records)
    print(f"history: {sizes} on {engine.dialect.name} in {time.perf_counter() - started:.1f} s")

    bundle = load_bundle(args.bundle)
    rego = RegorusEngine()
    rego.load_bundle(bundle)
    with sessions.begin() as s:
        t0, c0 = time.perf_counter(), time.process_time()
        facts = build_facts(s, T0, T0 + PERIOD_NS, now_ns=T0 + PERIOD_NS)
        t1, c1 = time.perf_counter(), time.process_time()
        results = rego.evaluate(facts)
        t2, c2 = time.perf_counter(), time.process_time()
        rows = to_rows(results, bundle, rego.name, None, T0, T0 + PERIOD_NS, datetime.now(timezone.utc))
        _stored, inserted = store_findings(s, rows)
        t3 = time.perf_counter()
    counts = {k: len(v) for k, v in facts.items() if isinstance(v, list)}
    input_mb = len(json.dumps(facts)) / 1e6
    by_rule: dict[str, int] = {}
    for r in rows:
        by_rule[r["rule"]] = by_rule.get(r["rule"], 0) + 1
    print(f"facts: {counts}, {input_mb:.1f} MB of JSON input")
    print(f"load average during the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"findings: {inserted} stored, by rule {dict(sorted(by_rule.items()))}")
    # CPU time of this process is what the run costs without competing load (SQLite and regorus
    # run in-process; with PostgreSQL the server's share is only in the wall time).
    print(f"facts query time: {t1 - t0:.3f} s wall, {c1 - c0:.3f} s CPU")
    print(f"Rego time (regorus): {t2 - t1:.3f} s wall, {c2 - c1:.3f} s CPU")
    print(f"facts + Rego: {t2 - t0:.3f} s wall, {c2 - c0:.3f} s CPU "
          f"(target < 5 s: {'met' if t2 - t0 < 5 else 'missed'} on wall time, {'met' if c2 - c0 < 5 else 'missed'} on CPU time)")
    print(f"store findings (+ ledger): {t3 - t2:.3f} s")
    engine.dispose()
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
