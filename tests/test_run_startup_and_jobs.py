"""`draudit run`'s start: a job switched off leaves the job store, a restart or a standby never
postpones a job, a job due while no scheduler ran runs once; settings that would fail later (lease,
clock skew, bundle, signing key, OPA URL, --server) refuse the start; a 403 says what to check.

The job store is APScheduler 3's SQLAlchemyJobStore on the store's own database (SQLite and
PostgreSQL: the ``sessions``/``database_url`` fixtures).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from collector.errors import UserError
from collector.scheduler import JOB_IDS, ScheduleConfig, build_scheduler, job_overview
from collector.settings import DEFAULT_POLICY_BUNDLE, Settings, load_settings
from collector.store.models import JobRun, SchedulerJob

DRAUDIT = [sys.executable, "-m", "collector.cli"]


def _settings(database_url: str, tmp_path) -> Settings:
    return Settings(database_url=database_url, cluster="startup", pack_dir=tmp_path / "packs",
                    policy_bundle=tmp_path / "no-bundle")


def _stored(sessions) -> dict[str, tuple[float | None, bytes]]:
    """The job store's rows: id → (next_run_time, job_state)."""
    with sessions() as s:
        return {i: (n, bytes(st)) for i, n, st in s.execute(select(SchedulerJob.id, SchedulerJob.next_run_time,
                                                                         SchedulerJob.job_state))}


def _wait_for(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _ok(ctx) -> str:
    return "ok"


# ------------------------------------------------------------------------------ 1a: off removes


def test_a_job_switched_off_leaves_the_job_store_with_its_retry_and_stops_running(sessions, database_url, tmp_path):
    runs: list[float] = []

    def retention(ctx):
        runs.append(time.monotonic())
        raise RuntimeError("retention failed")  # leaves a pending retry in the job store too

    jobs = {"attribution": _ok, "retention": retention}
    on = ScheduleConfig(attribution="interval:3600", policy="off", daily_pack="off", retention="interval:0.3",
                        retry_delay_s=3600)
    first = build_scheduler(_settings(database_url, tmp_path), sessions, on, jobs=jobs, key="t-off")
    first.start()
    try:
        assert _wait_for(lambda: runs and "retention.retry" in _stored(sessions))
    finally:
        first.shutdown()
    assert sorted(_stored(sessions)) == ["attribution", "retention", "retention.retry"]
    ran = len(runs)

    # the operator switches retention off and restarts: it must stop deleting
    off = dataclasses.replace(on, retention="off")
    second = build_scheduler(_settings(database_url, tmp_path), sessions, off, jobs=jobs, key="t-off")
    second.start()
    try:
        assert sorted(_stored(sessions)) == ["attribution"]
        time.sleep(1.0)
    finally:
        second.shutdown()
    assert len(runs) == ran, "retention ran after it was switched off"
    shown = {r["job"]: r["schedule"] for r in job_overview(sessions, ScheduleConfig())}
    assert shown == {"attribution": "interval:3600", "policy": "off", "daily_pack": "off", "retention": "off"}

    # every job off: the store is empty, and `jobs list` still says off (not this process's defaults)
    all_off = ScheduleConfig(attribution="off", policy="off", daily_pack="off", retention="off")
    third = build_scheduler(_settings(database_url, tmp_path), sessions, all_off, jobs=jobs, key="t-off")
    third.start()
    third.shutdown()
    assert _stored(sessions) == {}
    assert {r["schedule"] for r in job_overview(sessions, ScheduleConfig())} == {"off"}


def test_draudit_run_with_a_job_switched_off_stops_running_it(sessions, database_url, tmp_path):
    """The breaker's reproduction: run with DRAUDIT_SCHEDULE_RETENTION=interval:…, then with off."""
    env = {**os.environ, "DRAUDIT_DATABASE_URL": database_url, "DRAUDIT_INGEST_TOKEN": "t", "DRAUDIT_HTTP_HOST": "127.0.0.1",
           "DRAUDIT_SCHEDULE_RETENTION": "interval:0.5", "DRAUDIT_SCHEDULE_POLICY": "off", "DRAUDIT_PACK_DIR": str(tmp_path)}

    def retention_runs() -> int:
        with sessions() as s:
            return s.execute(select(func.count()).select_from(JobRun).where(JobRun.job_id == "retention")).scalar()

    def run_for(seconds: float, **extra) -> str:
        proc = subprocess.Popen([*DRAUDIT, "run", "--server", "http://127.0.0.1:9", "--port", str(_free_port())],
                                env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(seconds)
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err[-2000:]
        return err

    run_for(4.0)
    assert retention_runs() >= 1
    before = retention_runs()
    run_for(4.0, DRAUDIT_SCHEDULE_RETENTION="off")
    assert retention_runs() == before, "the second process (retention off) ran retention"
    listed = subprocess.run([*DRAUDIT, "jobs", "list"], env=env, capture_output=True, text=True, check=True).stdout
    row = next(line for line in listed.splitlines() if line.startswith("retention"))
    assert row.split()[1] == "off", listed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ 1b: next run kept


def test_a_restart_keeps_the_next_run_of_an_unchanged_schedule_and_reschedules_a_changed_one(sessions, database_url, tmp_path):
    cfg = ScheduleConfig(attribution="interval:3600", policy="interval:7200", daily_pack="cron:15 0 * * *", retention="off")
    jobs = dict.fromkeys(JOB_IDS, _ok)
    first = build_scheduler(_settings(database_url, tmp_path), sessions, cfg, jobs=jobs, key="t-keep")
    first.start()
    first.shutdown()
    stored = _stored(sessions)
    assert sorted(stored) == ["attribution", "daily_pack", "policy"]

    time.sleep(1.1)  # a start that re-added the jobs would now compute later next runs
    second = build_scheduler(_settings(database_url, tmp_path), sessions, cfg, jobs=jobs, key="t-keep")
    second.start()
    second.shutdown()
    assert {k: v[0] for k, v in _stored(sessions).items()} == {k: v[0] for k, v in stored.items()}

    # only the job whose schedule changed is rescheduled, from now
    changed = dataclasses.replace(cfg, policy="interval:60")
    third = build_scheduler(_settings(database_url, tmp_path), sessions, changed, jobs=jobs, key="t-keep")
    before = time.time()
    third.aps.start(paused=True)
    try:
        assert third.sync_jobs() == {"attribution": "kept", "policy": "rescheduled", "daily_pack": "kept", "retention": "off"}
    finally:
        third.shutdown()
    after = _stored(sessions)
    assert after["attribution"][0] == stored["attribution"][0] and after["daily_pack"][0] == stored["daily_pack"][0]
    assert before + 60 - 1 <= after["policy"][0] <= time.time() + 60
    assert {r["job"]: r["schedule"] for r in job_overview(sessions, ScheduleConfig())}["policy"] == "interval:60"


def test_a_standby_never_writes_the_job_store_and_syncs_it_on_becoming_leader(sessions, database_url, tmp_path):
    cfg = ScheduleConfig(attribution="interval:3600", policy="off", daily_pack="off", retention="off")
    jobs = dict.fromkeys(JOB_IDS, _ok)
    leader = build_scheduler(_settings(database_url, tmp_path), sessions, cfg, jobs=jobs, key="t-a")
    leader.start()
    leader.shutdown()
    stored = _stored(sessions)

    # a standby with other settings (a rolling update) starts paused: the store is not touched
    other = dataclasses.replace(cfg, attribution="interval:1800", policy="interval:600")
    standby = build_scheduler(_settings(database_url, tmp_path), sessions, other, jobs=jobs, key="t-b")
    standby.start(paused=True)
    try:
        time.sleep(0.5)
        assert _stored(sessions) == stored  # same rows, same next runs, same pickled jobs
        now = time.time()
        standby.follow_leadership(True)  # elected: its schedules now apply
        synced = _stored(sessions)
        assert sorted(synced) == ["attribution", "policy"]
        assert now + 1800 - 1 <= synced["attribution"][0] <= time.time() + 1800
        standby.follow_leadership(False)
        standby.follow_leadership(True)  # leadership regained, nothing changed: nothing rescheduled
        assert {k: v[0] for k, v in _stored(sessions).items()} == {k: v[0] for k, v in synced.items()}
    finally:
        standby.shutdown()


def test_stopping_a_standby_while_a_job_is_due_leaves_it_due(sessions, database_url, tmp_path):
    """APScheduler 3 runs one more round of its loop after shutdown(); it found the due job, could
    not submit it (executors shut down) and advanced its next run: the leader's run was lost."""
    cfg = ScheduleConfig(attribution="interval:3600", policy="off", daily_pack="off", retention="off")
    jobs = dict.fromkeys(JOB_IDS, _ok)
    leader = build_scheduler(_settings(database_url, tmp_path), sessions, cfg, jobs=jobs, key="t-due")
    leader.start()
    leader.aps.pause()
    leader.aps.modify_job("attribution", next_run_time=datetime.now(timezone.utc) - timedelta(seconds=30))
    leader.shutdown()
    due = _stored(sessions)
    assert due["attribution"][0] < time.time()
    for _ in range(3):
        standby = build_scheduler(_settings(database_url, tmp_path), sessions, cfg, jobs=jobs, key="t-due-standby")
        standby.start(paused=True)
        time.sleep(0.2)
        standby.shutdown()
        assert _stored(sessions) == due


def test_a_standby_restarting_more_often_than_the_interval_does_not_starve_the_leader(sessions, database_url, tmp_path):
    runs: list[float] = []
    cfg = ScheduleConfig(attribution="interval:1", policy="off", daily_pack="off", retention="off")
    leader = build_scheduler(_settings(database_url, tmp_path), sessions, cfg,
                             jobs={"attribution": lambda ctx: runs.append(time.monotonic()) or "ok"}, key="t-leader")
    leader.start()
    try:
        end = time.monotonic() + 4.0
        while time.monotonic() < end:  # a crash-looping standby: start (paused), stop, every 0.3 s
            standby = build_scheduler(_settings(database_url, tmp_path), sessions, cfg, jobs={"attribution": _ok},
                                      key="t-standby")
            standby.start(paused=True)
            time.sleep(0.3)
            standby.shutdown()
    finally:
        leader.shutdown()
    assert len(runs) >= 2, f"the leader ran attribution {len(runs)} times in 4 s at interval:1"


def test_a_job_that_came_due_while_no_scheduler_ran_runs_once_at_the_next_start(sessions, database_url, tmp_path):
    runs: list[float] = []
    cfg = ScheduleConfig(attribution="off", policy="off", daily_pack="cron:15 0 * * *", retention="off")
    jobs = {"daily_pack": lambda ctx: runs.append(time.monotonic()) or "ok"}
    first = build_scheduler(_settings(database_url, tmp_path), sessions, cfg, jobs=jobs, key="t-late")
    first.start()
    first.aps.pause()
    # the collector was down across the pack's time (3 h ago): the stored next run is in the past
    first.aps.modify_job("daily_pack", next_run_time=datetime.now(timezone.utc) - timedelta(hours=3))
    first.shutdown()
    assert _stored(sessions)["daily_pack"][0] < time.time() - 3 * 3600 + 5

    second = build_scheduler(_settings(database_url, tmp_path), sessions, cfg, jobs=jobs, key="t-late")
    second.start()
    try:
        assert _wait_for(lambda: runs, timeout_s=10), "the missed daily pack did not run"
        time.sleep(0.5)
    finally:
        second.shutdown()
    assert len(runs) == 1  # coalesced: one run, not one per missed time
    assert _stored(sessions)["daily_pack"][0] > time.time()


# ------------------------------------------------------------------------------ 8, 10: refused at start


@pytest.mark.parametrize("env, message", [
    ({"DRAUDIT_LEADER_ELECT": "true", "DRAUDIT_LEASE_DURATION_S": "0"}, "DRAUDIT_LEASE_DURATION_S=0 must be 2 to 86400 seconds"),
    ({"DRAUDIT_LEADER_ELECT": "true", "DRAUDIT_LEASE_DURATION_S": "1.5"}, "DRAUDIT_LEASE_DURATION_S=1.5 must be 2 to 86400"),
    ({"DRAUDIT_LEASE_DURATION_S": "inf"}, "DRAUDIT_LEASE_DURATION_S must be a finite"),
    ({"DRAUDIT_CLOCK_SKEW_S": "inf"}, "DRAUDIT_CLOCK_SKEW_S=inf must be a non-negative number of seconds, at most 86400"),
    ({"DRAUDIT_CLOCK_SKEW_S": "86400.5"}, "DRAUDIT_CLOCK_SKEW_S=86400.5 must be"),
    ({"DRAUDIT_CLOCK_SKEW_S": "nan"}, "DRAUDIT_CLOCK_SKEW_S=nan must be"),
    ({"DRAUDIT_OPA_TIMEOUT_S": "inf"}, "DRAUDIT_OPA_TIMEOUT_S must be a finite"),
    ({"DRAUDIT_OPA_URL": "opa:8181"}, "DRAUDIT_OPA_URL='opa:8181' must look like http://opa.example:8181"),
    ({"DRAUDIT_OPA_URL": "http://opa:81x81"}, "DRAUDIT_OPA_URL='http://opa:81x81' must look like"),
    ({"DRAUDIT_OPA_URL": "http://opa:8181/v1/data"}, "must look like http://opa.example:8181"),
])
def test_settings_that_would_fail_later_are_refused_naming_the_variable(env, message):
    with pytest.raises(UserError) as caught:
        load_settings(env)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_settings_accept_what_is_valid():
    assert load_settings({"DRAUDIT_LEADER_ELECT": "true", "DRAUDIT_LEASE_DURATION_S": "2"}).lease_duration_s == 2
    assert load_settings({"DRAUDIT_LEASE_DURATION_S": "0"}).lease_duration_s == 0  # no election: unused
    assert load_settings({"DRAUDIT_CLOCK_SKEW_S": "86400"}).clock_skew_s == 86400
    assert load_settings({"DRAUDIT_OPA_URL": "https://opa.internal:8181/"}).opa_url == "https://opa.internal:8181/"
    import collector.lineage
    from collector import settings
    assert settings.MAX_CLOCK_SKEW_S == collector.lineage.MAX_CLOCK_SKEW_S  # `attribute`'s rule


@pytest.fixture(scope="module")
def store_db(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('startup') / 'store.db'}"
    subprocess.run([*DRAUDIT, "db", "upgrade", "--database-url", url], check=True, capture_output=True)
    return url


def _broken_bundle(tmp_path) -> str:
    bundle = tmp_path / "bundle"
    shutil.copytree(DEFAULT_POLICY_BUNDLE, bundle)
    rego = sorted(p for p in bundle.rglob("*.rego") if not p.name.endswith("_test.rego"))[0]
    rego.write_text(rego.read_text() + "\nfindings contains f if {\n  f := \n")
    return str(bundle)


def _garbage_key(tmp_path) -> str:
    key = tmp_path / "sign.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n")
    return str(key)


@pytest.mark.parametrize("case", ["lease-0", "lease-inf", "skew-inf", "bundle-missing", "bundle-broken", "key-missing",
                                  "key-garbage", "opa-url", "server-no-scheme"])
def test_run_refuses_to_start_with_one_line_naming_the_variable(case, store_db, tmp_path):
    args, env, expected = ["--server", "http://127.0.0.1:9"], {}, ""
    if case == "lease-0":
        args, env, expected = [*args, "--leader-elect"], {"DRAUDIT_LEASE_DURATION_S": "0"}, "DRAUDIT_LEASE_DURATION_S=0"
    elif case == "lease-inf":
        args, env, expected = [*args, "--leader-elect"], {"DRAUDIT_LEASE_DURATION_S": "inf"}, "DRAUDIT_LEASE_DURATION_S"
    elif case == "skew-inf":
        env, expected = {"DRAUDIT_CLOCK_SKEW_S": "inf"}, "DRAUDIT_CLOCK_SKEW_S=inf"
    elif case == "bundle-missing":
        env, expected = {"DRAUDIT_POLICY_BUNDLE": str(tmp_path / "nope")}, f"DRAUDIT_POLICY_BUNDLE={tmp_path / 'nope'}: "
    elif case == "bundle-broken":
        bundle = _broken_bundle(tmp_path)
        env, expected = {"DRAUDIT_POLICY_BUNDLE": bundle}, f"DRAUDIT_POLICY_BUNDLE={bundle}: "
    elif case == "key-missing":
        env, expected = {"DRAUDIT_SIGN_KEY": str(tmp_path / "nokey.pem")}, f"DRAUDIT_SIGN_KEY={tmp_path / 'nokey.pem'}: "
    elif case == "key-garbage":
        key = _garbage_key(tmp_path)
        env, expected = {"DRAUDIT_SIGN_KEY": key}, f"DRAUDIT_SIGN_KEY={key}: "
    elif case == "opa-url":
        env, expected = {"DRAUDIT_OPA_URL": "opa.internal:8181"}, "DRAUDIT_OPA_URL='opa.internal:8181'"
    elif case == "server-no-scheme":
        args, expected = ["--server", "localhost:16443"], "--server 'localhost:16443' is not a URL of the form https://host:port"
    full_env = {**os.environ, "DRAUDIT_DATABASE_URL": store_db, "DRAUDIT_INGEST_TOKEN": "t", "DRAUDIT_HTTP_HOST": "127.0.0.1",
                "DRAUDIT_HTTP_PORT": str(_free_port()), **env}
    try:
        proc = subprocess.run([*DRAUDIT, "run", *args], env=full_env, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"draudit run started instead of refusing: {exc.stderr!r}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("draudit: error: " + expected), proc.stderr
    assert "HTTP on" not in proc.stderr and "Traceback" not in proc.stderr


def test_run_with_a_valid_bundle_key_and_opa_url_starts(store_db, tmp_path):
    """The checks do not refuse what works: the shipped bundle, a generated key, an OPA URL of the
    right form whose server is not up (it may start after the collector)."""
    subprocess.run([*DRAUDIT, "keys", "generate", "--out", str(tmp_path / "sign")], check=True, capture_output=True)
    key = tmp_path / "sign.key"
    port = _free_port()
    env = {**os.environ, "DRAUDIT_DATABASE_URL": store_db, "DRAUDIT_INGEST_TOKEN": "t", "DRAUDIT_HTTP_HOST": "127.0.0.1",
           "DRAUDIT_HTTP_PORT": str(port), "DRAUDIT_SIGN_KEY": str(key), "DRAUDIT_OPA_URL": f"http://127.0.0.1:{_free_port()}",
           "DRAUDIT_PACK_DIR": str(tmp_path / "packs")}
    proc = subprocess.Popen([*DRAUDIT, "run", "--server", "http://127.0.0.1:9"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(lambda: _listening(port) or proc.poll() is not None, timeout_s=30)
        assert proc.poll() is None, proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_server_without_a_scheme_is_refused_by_the_client_factory():
    from collector.kube.client import make_api_client

    for bad in ("localhost:16443", "127.0.0.1", "http://:6443", "https://k8s:99999"):
        with pytest.raises(UserError, match="--server .* https://host:port"):
            make_api_client(host=bad)
    assert make_api_client(host="https://k8s.example:6443/").configuration.host == "https://k8s.example:6443"


# ------------------------------------------------------------------------------ 7: a 403 says why


FORBIDDEN = ('pods is forbidden: User "system:serviceaccount:draudit:draudit" cannot list resource "pods" '
             'in API group "" at the cluster scope')


def test_a_403_logs_the_servers_message_the_verb_the_resource_and_the_cluster_role(srv, sessions, caplog):
    from collector.sim.faults import Fault
    from tests.watch_support import start_watcher, wait_until

    srv.add_fault(Fault(kind="Pod", verb="list", action="status", count=1000, code=403, reason="Forbidden", message=FORBIDDEN))
    caplog.set_level(logging.WARNING, logger="collector.kube.reflector")
    watcher = start_watcher(srv, sessions)
    try:
        record = wait_until(lambda: next((r for r in caplog.records if r.getMessage().startswith("Pod: HTTP 403")), None),
                            what="the 403 logged")
        pod = next(r for r in watcher.reflectors if r.spec.kind == "Pod")
        ready = watcher.readiness()  # /readyz says why too, not only "not synced yet"
    finally:
        watcher.stop()
    pod_reason = next(x for x in ready.reasons if x.startswith("Pod: "))
    assert pod_reason.startswith("Pod: not synced yet (") and "ClusterRole draudit-watcher" in pod_reason
    line = record.getMessage()
    assert FORBIDDEN in line  # the API server's Status message: who may not do what
    assert "may not list pods" in line and "ClusterRole draudit-watcher" in line and "deploy/base/rbac.yaml" in line
    assert FORBIDDEN in pod.last_failure and "draudit-watcher" in pod.last_failure
