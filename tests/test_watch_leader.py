"""Leader election over the fake API server's Leases: one writer, fenced handover, clean stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


from tests.watch_support import claim, start_watcher, versions, wait_until


def test_only_the_leader_writes_and_handover_is_fenced(srv, sessions):
    common = dict(leader_elect=True, lease_namespace="draudit", lease_name="draudit-collector", lease_duration_s=3.0)
    a = start_watcher(srv, sessions, identity="replica-a", **common)
    wait_until(lambda: a.elector.is_leader(), what="replica-a leads")
    b = start_watcher(srv, sessions, identity="replica-b", **common)
    try:
        assert a.wait_synced(10)
        time.sleep(1.0)
        assert not b.elector.is_leader() and b.recorder is None, "the standby does not write"
        assert b.readiness().ready  # a healthy standby is ready to take over
        srv.apply(claim("before-handover"))
        wait_until(lambda: versions(sessions, "ResourceClaim", "before-handover"), what="leader records")

        # replica-a can no longer renew (API partition for it alone): it must stop writing before
        # replica-b starts.
        a_became_invalid = {}

        def fail(_now):
            raise OSError("partitioned")

        a.elector._try_acquire_or_renew = fail
        wait_until(lambda: not a.elector.is_leader(), timeout_s=10, what="replica-a fenced")
        a_became_invalid["t"] = time.monotonic()
        wait_until(lambda: b.elector.is_leader(), timeout_s=15, what="replica-b takes over")
        b_started = time.monotonic()
        assert b_started >= a_became_invalid["t"]
        assert b.wait_synced(10)
        srv.apply(claim("after-handover"))
        wait_until(lambda: versions(sessions, "ResourceClaim", "after-handover"), what="new leader records")
        lease = srv.get("Lease", "draudit-collector", "draudit")
        assert lease["spec"]["holderIdentity"] == "replica-b"
        assert lease["spec"]["leaseTransitions"] >= 1
    finally:
        b.stop(5)
        a.stop(5)


def test_sigterm_stops_cleanly_and_commits(srv, tmp_path):
    db = tmp_path / "draudit.db"
    env = {**os.environ, "DRAUDIT_DATABASE_URL": f"sqlite:///{db}", "DRAUDIT_CLUSTER": "sig"}
    subprocess.run([sys.executable, "-m", "collector.cli", "db", "upgrade"], env=env, check=True, capture_output=True)
    srv.apply(claim("pre-existing"))
    proc = subprocess.Popen([sys.executable, "-m", "collector.cli", "watch", "--server", srv.url], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        from collector.store.db import make_engine, make_session_factory

        sessions = make_session_factory(make_engine(f"sqlite:///{db}"))
        wait_until(lambda: versions(sessions, "ResourceClaim"), timeout_s=20, what="initial list stored")
        for i in range(20):
            srv.apply(claim(f"burst-{i}"))
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        assert time.monotonic() - t0 < 5
        assert proc.returncode == 0, proc.stderr.read().decode()
        assert len(versions(sessions, "ResourceClaim")) == 21
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigkill_loses_nothing_the_server_sends_again_on_resume(srv, tmp_path):
    db = tmp_path / "draudit.db"
    env = {**os.environ, "DRAUDIT_DATABASE_URL": f"sqlite:///{db}", "DRAUDIT_CLUSTER": "kill"}
    subprocess.run([sys.executable, "-m", "collector.cli", "db", "upgrade"], env=env, check=True, capture_output=True)
    from collector.store import ledger
    from collector.store.db import make_engine, make_session_factory

    sessions = make_session_factory(make_engine(f"sqlite:///{db}"))
    proc = subprocess.Popen([sys.executable, "-m", "collector.cli", "watch", "--server", srv.url], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: _state_rows(sessions) >= 4, timeout_s=20, what="watcher synced")
        created = [srv.apply(claim(f"burst-{i}")) for i in range(200)]
        time.sleep(0.2)
        proc.kill()  # SIGKILL mid-burst: some events received, not all committed
        proc.wait(10)
        for i in range(200, 220):
            created.append(srv.apply(claim(f"burst-{i}")))
        proc = subprocess.Popen([sys.executable, "-m", "collector.cli", "watch", "--server", srv.url, "--exit-when-synced"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.wait(60) == 0, proc.stderr.read().decode()[-2000:]
        # the resumed watch is then confirmed and replays the tail; run once more to drain it
        proc = subprocess.Popen([sys.executable, "-m", "collector.cli", "watch", "--server", srv.url], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_until(lambda: len(versions(sessions, "ResourceClaim")) >= 220, timeout_s=30, what="every claim recorded")
        rows = versions(sessions, "ResourceClaim")
        assert sorted(r[1] for r in rows) == sorted(c["metadata"]["resourceVersion"] for c in created)  # each once
        with sessions() as s:
            assert ledger.verify(s).ok
            from sqlalchemy import select

            from collector.store.models import CoverageInterval
            cov = s.execute(select(CoverageInterval).where(CoverageInterval.kind == "ResourceClaim")
                            .order_by(CoverageInterval.started_ns, CoverageInterval.id)).scalars().all()
        # synced until the killed run's last commit, then not running until the restart synced
        assert [c.state for c in cov[:2]] == ["synced", "stopped"] and cov[0].ended_ns == cov[1].started_ns
        assert cov[1].reason.startswith("collector not running: its previous run ended without a clean stop")
        # every kind, the quiet ones too, stops being observed at its own last contact — with the
        # server's bookmarks (every 0.3 s here, ~1/min on a real one) close to when the process was
        # last seen alive, not at its own last change (third newcomer pass); a stream silent before
        # a crash is not observed past its own last contact (attribution breaker, recorder._previous_run_alive_ns)
        with sessions() as s:
            crashes = dict(s.execute(select(CoverageInterval.kind, CoverageInterval.started_ns)
                                     .where(CoverageInterval.state == "stopped",
                                            CoverageInterval.reason.like("collector not running:%"))).all())
        assert set(crashes) == {"DeviceClass", "Pod", "ResourceClaim", "ResourceSlice"}
        assert crashes["ResourceClaim"] == cov[1].started_ns
        assert all(max(crashes.values()) - t < 2_000_000_000 for t in crashes.values()), crashes
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)


def _state_rows(sessions):
    from sqlalchemy import func, select

    from collector.store.models import WatchState

    with sessions() as s:
        return s.execute(select(func.count()).select_from(WatchState).where(WatchState.state == "synced")).scalar_one()
