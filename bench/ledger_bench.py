"""Ledger append throughput: N entries (default 100 000) on SQLite and PostgreSQL.

Appends in transactions of ``--batch`` rows covering ``object_versions`` rows inserted in the
same transaction (as the watcher does), then verifies the whole chain. Prints entries/s for the
append alone (the rows are inserted first, outside the timed section) and for verify, per backend.

    .venv/bin/python -m bench.ledger_bench [--n 100000] [--batch 5000] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import datetime, timezone

from sqlalchemy import insert, select

from bench.backends import for_each_backend
from collector.store import ledger, migrate
from collector.store.canonical import content_hash
from collector.store.db import make_engine, make_session_factory
from collector.store.models import ObjectVersion


def _rows(n: int) -> list[dict]:
    now = datetime.now(timezone.utc)
    out = []
    for i in range(n):
        raw = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": f"c-{i}", "namespace": "risk-inference", "uid": str(uuid.uuid4()), "resourceVersion": str(i + 1)},
               "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com",
                                                                   "pool": "gpu-node-a", "device": f"gpu-{i % 8}"}]}}}}
        out.append({"cluster": "bench", "api_group": "resource.k8s.io", "api_version": "v1", "kind": "ResourceClaim",
                    "namespace": "risk-inference", "name": raw["metadata"]["name"], "uid": raw["metadata"]["uid"],
                    "resource_version": str(i + 1), "event_type": "ADDED", "observed_at": now, "raw": raw,
                    "content_hash": content_hash(raw)})
    return out


def run(url: str, n: int, batch: int) -> None:
    engine = make_engine(url)
    migrate.downgrade(engine, "base")
    migrate.upgrade(engine)
    sessions = make_session_factory(engine)
    rows = _rows(n)
    with sessions.begin() as s:
        for i in range(0, n, 5000):
            s.execute(insert(ObjectVersion), rows[i:i + 5000])
        ids = [r for (r,) in s.execute(select(ObjectVersion.id).order_by(ObjectVersion.id))]
    for row, new_id in zip(rows, ids):
        row["id"] = new_id
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        with sessions.begin() as s:
            ledger.append(s, "object_versions", rows[i:i + batch])
    append_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with sessions() as s:
        result = ledger.verify(s)
    verify_s = time.perf_counter() - t0
    assert result.ok and result.entries == n, result
    print(f"{engine.dialect.name:10s} append {n} entries: {append_s:6.2f} s = {n / append_s:9.0f} entries/s   "
          f"verify: {verify_s:6.2f} s = {n / verify_s:9.0f} entries/s")
    migrate.downgrade(engine, "base")
    engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=5_000)
    ap.add_argument("--pg-url", default="postgresql://root@127.0.0.1:5432/test")
    args = ap.parse_args()
    for_each_backend(lambda url: run(url, args.n, args.batch), args.pg_url)

if __name__ == "__main__":
    main()
