"""Watcher throughput: events/s from the fake API server to committed rows, and the watch lag.

Method: the fake API server runs in its own process (so the collector does not share a GIL with
it). Start a watcher on it, stop it, write N changes (ResourceClaim lifecycles:
created, allocated + reserved, released, deleted; realistic v1 objects) while it is down, then start it again: it resumes from its
stored resourceVersion and receives the N events as one burst. We time from the
restart to the commit of the last event (rows in object_versions, ledger entries and projections),
and report the commit lag (receive → commit) percentiles from the recorder's metric at that rate.

Then the steady mode (``--rate``, default 5 000 events/s, for ``--seconds``): the same lifecycles
written at that rate while the watcher is live, each version stamped with its write time. It
reports whether the watcher keeps up (events committed, drain time after the last write) and the
lag at that rate: write → receive per event (exact, from the stored ``observed_at``) and
receive → commit (the recorder's histogram, bucket bounds).

    .venv/bin/python -m bench.watch_bench [--events 20000] [--rate 5000 --seconds 10] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

from collector.kube.client import make_api_client
from collector.kube.reflector import ReflectorSettings
from collector.settings import Settings
from bench.backends import ServerCpu, for_each_backend
from collector.store import migrate
from collector.store.db import make_engine, make_session_factory
from collector.store.models import ObjectVersion
from collector.watcher import Watcher

SETTINGS = ReflectorSettings(list_page_size=500, watch_timeout_s=600, read_timeout_s=30, backoff_initial_s=0.1, backoff_max_s=1)


SERVER_SCRIPT = r"""
import sys, time, uuid
from collector.sim import FakeApiServer
from collector.sim.dra_objects import allocate, deallocate, make_claim, make_gpu_device, make_pod, make_slice
n = int(sys.argv[1])
srv = FakeApiServer(history_limit=n + 1000)
srv.start()
srv.apply(make_slice("node-a", [make_gpu_device(m, uuid=f"GPU-{uuid.uuid4()}") for m in range(8)]))
claims = [srv.apply(make_claim(f"c-{i}", "risk-inference")) for i in range(50)]
pods = [srv.apply(make_pod(f"p-{i}", "risk-inference", claim_names={"gpu": f"c-{i}"})) for i in range(50)]
print("URL", srv.url, flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "write":
        # Claim lifecycles, as a busy inference cluster produces them: created, allocated and
        # reserved for a pod, released, deleted (four events per claim).
        for i in range(n // 4):
            claim = srv.apply(make_claim(f"job-{i}", "risk-inference"))
            claim = srv.apply(allocate(claim, [("gpu", f"gpu-{i % 8}")], pods[i % 50], node="node-a"))
            srv.apply(deallocate(claim))
            srv.delete("ResourceClaim", f"job-{i}", "risk-inference")
        print("RV", srv.current_rv, flush=True)
    elif cmd[0] == "paced":
        # The same lifecycles at a steady rate (events/s) for a duration, each version stamped with
        # its write time (server wall clock, ns) so the bench can measure write -> receive per event.
        rate, seconds = float(cmd[1]), float(cmd[2])
        total, written, i, t0 = int(rate * seconds) // 4 * 4, 0, 0, time.time()
        def stamped(obj):
            obj.setdefault("metadata", {}).setdefault("annotations", {})["bench/written-ns"] = str(time.time_ns())
            return obj
        while written < total:
            due = min(total, int((time.time() - t0) * rate))
            while written < due:
                step = written % 4
                if step == 0:
                    claim = srv.apply(stamped(make_claim(f"paced-{i}", "risk-inference")))
                elif step == 1:
                    claim = srv.apply(stamped(allocate(claim, [("gpu", f"gpu-{i % 8}")], pods[i % 50], node="node-a")))
                elif step == 2:
                    claim = srv.apply(stamped(deallocate(claim)))
                else:
                    srv.delete("ResourceClaim", f"paced-{i}", "risk-inference")
                    i += 1
                written += 1
            time.sleep(0.002)
        print("RV", srv.current_rv, written, time.time() - t0, flush=True)
    elif cmd[0] == "quit":
        break
srv.stop()
"""


class _Server:
    """The fake API server in a child process, driven over stdin/stdout."""

    def __init__(self, n: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, str(n)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.url = self._expect("URL")

    def cpu_s(self) -> float:
        """CPU seconds the server process has used (utime + stime, from /proc)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _expect(self, word: str) -> str:
        return self._expect_all(word)[0]

    def _expect_all(self, word: str) -> list[str]:
        line = self.proc.stdout.readline().split()
        assert line and line[0] == word, line
        return line[1:] or [""]

    def call(self, cmd: str, answer: str) -> str:
        return self.call_all(cmd, answer)[0]

    def call_all(self, cmd: str, answer: str) -> list[str]:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._expect_all(answer)

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(10)


def run(url: str, n: int) -> None:
    engine = make_engine(url)
    migrate.downgrade(engine, "base")
    migrate.upgrade(engine)
    sessions = make_session_factory(engine)
    srv = _Server(n)
    cfg = Settings(database_url=url, cluster="bench")
    w = Watcher(cfg, sessions, make_api_client(host=srv.url), reflector_settings=SETTINGS)
    w.start()
    assert w.wait_synced(30)
    w.stop()
    target_rv = int(srv.call("write", "RV"))
    with sessions() as s:
        before = s.execute(select(func.count()).select_from(ObjectVersion)).scalar_one()
    w2 = Watcher(cfg, sessions, make_api_client(host=srv.url), reflector_settings=SETTINGS)
    lag = w2.metrics.commit_lag
    lag_before = _histogram(lag)
    server_cpu = ServerCpu(engine.url.database if engine.dialect.name == "postgresql" else None)
    api_cpu0 = srv.cpu_s()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    w2.start()
    # The burst is ResourceClaim events: wait until its reflector has read the last one, then until
    # everything read is committed. (Bookmarks for the idle kinds are not needed to measure this,
    # and sending them in a tight loop would time our bookmark commits, not the event stream.)
    while not w2.reflectors or not all(int(r.resume_rv or 0) >= target_rv for r in w2.reflectors
                                       if r.spec.kind == "ResourceClaim"):
        time.sleep(0.01)
    w2.recorder.flush(60)
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    db_cpu = server_cpu.used_s()
    api_cpu = srv.cpu_s() - api_cpu0
    with sessions() as s:
        rows = s.execute(select(func.count()).select_from(ObjectVersion)).scalar_one() - before
    lag_after = _histogram(lag)
    w2.stop()
    srv.close()
    print(f"{engine.dialect.name:10s} {rows} events committed in {elapsed:6.2f} s (collector CPU {cpu:5.2f} s, "
          f"database server CPU {db_cpu:5.2f} s, fake API server CPU {api_cpu:5.2f} s) = "
          f"{rows / elapsed:8.0f} events/s; commit lag p50 ≤ {_quantile(lag_before, lag_after, 0.5)} s, "
          f"p99 ≤ {_quantile(lag_before, lag_after, 0.99)} s")
    migrate.downgrade(engine, "base")
    engine.dispose()


def run_paced(url: str, rate: float, seconds: float) -> None:
    """Steady load: the server writes ``rate`` events/s for ``seconds`` while the watcher is live.

    Prints the committed rate and the lag per event: write (server clock) -> receive (the stored
    ``observed_at``; same machine, same clock), exact per version; receive -> commit from the
    recorder's histogram (bucket bounds); and the drain time after the last write.
    """
    engine = make_engine(url)
    migrate.downgrade(engine, "base")
    migrate.upgrade(engine)
    sessions = make_session_factory(engine)
    srv = _Server(int(rate * seconds) + 1000)
    cfg = Settings(database_url=url, cluster="bench")
    w = Watcher(cfg, sessions, make_api_client(host=srv.url), reflector_settings=SETTINGS)
    w.start()
    assert w.wait_synced(30)
    lag_before = _histogram(w.metrics.commit_lag)
    server_cpu = ServerCpu(engine.url.database if engine.dialect.name == "postgresql" else None)
    cpu0 = time.process_time()
    target_rv, written, write_s = srv.call_all(f"paced {rate} {seconds}", "RV")
    target_rv, written, write_s = int(target_rv), int(written), float(write_s)
    t_written = time.perf_counter()
    while not all(int(r.resume_rv or 0) >= target_rv for r in w.reflectors if r.spec.kind == "ResourceClaim"):
        time.sleep(0.005)
    w.recorder.flush(60)
    drain = time.perf_counter() - t_written
    cpu = time.process_time() - cpu0
    db_cpu = server_cpu.used_s()
    lag_after = _histogram(w.metrics.commit_lag)
    w.stop()
    srv.close()
    with sessions() as s:
        rows = s.execute(select(ObjectVersion.event_type, ObjectVersion.observed_at, ObjectVersion.raw)
                         .where(ObjectVersion.kind == "ResourceClaim", ObjectVersion.name.like("paced-%"))).all()
    receive_ms = sorted((r.observed_at.timestamp() * 1e9 - int(r.raw["metadata"]["annotations"]["bench/written-ns"])) / 1e6
                        for r in rows if r.event_type != "DELETED")
    pct = lambda q: receive_ms[min(len(receive_ms) - 1, int(q * len(receive_ms)))]  # noqa: E731
    print(f"{engine.dialect.name:10s} steady {rate:.0f} events/s for {seconds:g} s: {len(rows)}/{written} events "
          f"committed, written in {write_s:.2f} s ({written / write_s:.0f} events/s), drained {drain:.2f} s after "
          f"the last write (collector CPU {cpu:.2f} s = {cpu / written * 1e6:.0f} µs/event, database server CPU "
          f"{db_cpu:.2f} s)\n{'':10s} lag write -> receive p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms, "
          f"max {receive_ms[-1]:.1f} ms; receive -> commit p50 ≤ {_quantile(lag_before, lag_after, 0.5)} s, "
          f"p99 ≤ {_quantile(lag_before, lag_after, 0.99)} s")
    migrate.downgrade(engine, "base")
    engine.dispose()


def _histogram(h) -> dict[float, float]:
    out = {}
    for metric in h.collect():
        for sample in metric.samples:
            if sample.name.endswith("_bucket"):
                out[float(sample.labels["le"])] = sample.value
    return out


def _quantile(before: dict, after: dict, q: float) -> str:
    deltas = sorted((le, after[le] - before.get(le, 0)) for le in after)
    total = deltas[-1][1] if deltas else 0
    for le, count in deltas:
        if total and count >= q * total:
            return f"{le:g}"
    return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--pg-url", default="postgresql://root@127.0.0.1:5432/test")
    ap.add_argument("--backends", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    ap.add_argument("--rate", type=float, default=5000,
                    help="steady mode: events/s written while the watcher is live (0: burst mode only)")
    ap.add_argument("--seconds", type=float, default=10, help="steady mode: duration of the writes")
    args = ap.parse_args()

    def both(url: str) -> None:
        run(url, args.events)
        if args.rate:
            run_paced(url, args.rate, args.seconds)

    for_each_backend(both, args.pg_url, tuple(args.backends.split(",")))

if __name__ == "__main__":
    main()
