"""Scheduled jobs: configured schedules, failure isolation and retry, run records, retention tombstones."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner
from sqlalchemy import func, insert, select

from collector.cli import cli
from collector.errors import UserError
from collector.scheduler import (
    RETENTION_CLASSES,
    ScheduleConfig,
    apply_retention,
    build_scheduler,
    job_overview,
    load_schedule_config,
)
from collector.settings import Settings
from collector.store import ledger
from collector.store.canonical import content_hash
from collector.store.models import CoverageInterval, EvidencePack, Finding, InferenceRecord, JobRun, LedgerEntry, Lineage, SchedulerJob
from collector.timeutil import dt_to_ns
from reports.verify import verify_pack

NOW = datetime(2026, 11, 29, 0, 20, tzinfo=timezone.utc)


def _settings(database_url: str, tmp_path) -> Settings:
    return Settings(database_url=database_url, cluster="prod-eu-1", pack_dir=tmp_path / "packs",
                    policy_bundle=tmp_path / "no-bundle")


def _wait_for(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _store_coverage(sessions, intervals) -> None:
    """ResourceClaim coverage intervals of prod-eu-1, each ``(state, started h before NOW, ended h
    before NOW, reason)``, stored and ledgered as the recorder stores them."""
    rows = [{"cluster": "prod-eu-1", "kind": "ResourceClaim", "state": state, "started_ns": dt_to_ns(NOW - timedelta(hours=h0)),
             "ended_ns": dt_to_ns(NOW - timedelta(hours=h1)), "from_rv": None, "to_rv": None, "reason": reason}
            for state, h0, h1, reason in intervals]
    with sessions.begin() as s:
        ids = s.execute(insert(CoverageInterval).returning(CoverageInterval.id, sort_by_parameter_order=True), rows).scalars().all()
        ledger.append(s, "coverage_intervals", [{**r, "id": i} for r, i in zip(rows, ids)])


def _run_twice_at_now(settings, sessions, config, job: str) -> list[str]:
    """Outcomes of running ``job`` twice on a scheduler whose clock reads NOW."""
    sched = build_scheduler(settings, sessions, config, key=f"t-{job}")
    sched.context.clock = lambda: NOW
    try:
        return [sched.run_now(job), sched.run_now(job)]
    finally:
        sched.shutdown()


def test_config_from_environment_and_errors():
    cfg = load_schedule_config({"DRAUDIT_SCHEDULE_POLICY": "off", "DRAUDIT_SCHEDULE_ATTRIBUTION": "interval:30",
                                "DRAUDIT_RETENTION_DAYS_TRANSACTIONS": "400", "DRAUDIT_RETENTION_LEGAL_HOLD": "true"})
    assert (cfg.attribution, cfg.policy, cfg.daily_pack) == ("interval:30", "off", "cron:15 0 * * *")
    assert cfg.retention_days == {"transactions": 400} and cfg.legal_hold
    with pytest.raises(UserError, match="DRAUDIT_SCHEDULE_DAILY_PACK='every day'"):
        load_schedule_config({"DRAUDIT_SCHEDULE_DAILY_PACK": "every day"})
    with pytest.raises(UserError, match="DRAUDIT_SCHEDULE_RETENTION='cron:61 \\* \\* \\* \\*'"):
        load_schedule_config({"DRAUDIT_SCHEDULE_RETENTION": "cron:61 * * * *"})
    with pytest.raises(UserError, match="DRAUDIT_RETENTION_DAYS_FINDINGS"):
        load_schedule_config({"DRAUDIT_RETENTION_DAYS_FINDINGS": "-3"})


def test_jobs_registered_with_configured_schedules(sessions, database_url, tmp_path):
    cfg = load_schedule_config({"DRAUDIT_SCHEDULE_ATTRIBUTION": "interval:30", "DRAUDIT_SCHEDULE_POLICY": "off",
                                "DRAUDIT_SCHEDULE_DAILY_PACK": "cron:5 2 * * *"})
    sched = build_scheduler(_settings(database_url, tmp_path), sessions, cfg, key="t-registered")
    try:
        sched.start()  # the job store is written at start (Scheduler.sync_jobs), not when built
        jobs = {j.id: j for j in sched.aps.get_jobs()}
        assert sorted(jobs) == ["attribution", "daily_pack", "retention"]
        assert jobs["attribution"].trigger.interval == timedelta(seconds=30)
        fields = {f.name: str(f) for f in jobs["daily_pack"].trigger.fields}
        assert (fields["minute"], fields["hour"]) == ("5", "2")
        with sessions() as s:
            stored = dict(s.execute(select(SchedulerJob.id, SchedulerJob.next_run_time)).all())
        assert sorted(stored) == ["attribution", "daily_pack", "retention"]
        next_pack = datetime.fromtimestamp(stored["daily_pack"], tz=timezone.utc)
        assert (next_pack.hour, next_pack.minute, next_pack.second) == (2, 5, 0)
        # `draudit jobs list` runs in another process with other settings: it shows the running ones
        shown = {r["job"]: r["schedule"] for r in job_overview(sessions, ScheduleConfig())}
        assert shown == {"attribution": "interval:30", "policy": "off", "daily_pack": "cron:5 2 * * *",
                         "retention": ScheduleConfig().retention}
    finally:
        sched.shutdown()


def test_failing_job_is_recorded_retried_and_does_not_stop_others(sessions, database_url, tmp_path):
    calls = {"attribution": 0, "policy": 0}

    def failing(ctx):
        calls["attribution"] += 1
        raise RuntimeError("lineage query failed: relation is locked")

    def working(ctx):
        calls["policy"] += 1
        return f"evaluated {calls['policy']}"

    cfg = ScheduleConfig(attribution="interval:0.4", policy="interval:0.3", daily_pack="off", retention="off",
                         retry_delay_s=0.2)
    sched = build_scheduler(_settings(database_url, tmp_path), sessions, cfg,
                            jobs={"attribution": failing, "policy": working}, key="t-failing")
    sched.start()
    try:
        assert _wait_for(lambda: calls["attribution"] >= 3 and calls["policy"] >= 3)
    finally:
        sched.shutdown()
    with sessions() as s:
        runs = s.execute(select(JobRun).order_by(JobRun.id)).scalars().all()
    attribution = [r for r in runs if r.job_id == "attribution" and r.outcome != "running"]
    policy = [r for r in runs if r.job_id == "policy" and r.outcome != "running"]
    assert attribution and all(r.outcome == "error" for r in attribution)
    assert attribution[0].error == "RuntimeError: lineage query failed: relation is locked"
    assert policy and all(r.outcome == "success" for r in policy)
    assert policy[0].summary == "evaluated 1" and policy[0].finished_at >= policy[0].started_at

    overview = {r["job"]: r for r in job_overview(sessions, cfg)}
    assert overview["attribution"]["outcome"] == "error" and "relation is locked" in overview["attribution"]["error"]
    assert overview["policy"]["outcome"] == "success"
    assert overview["daily_pack"]["last_run"] is None

    res = CliRunner().invoke(cli, ["jobs", "list", "--database-url", database_url],
                             env={"DRAUDIT_SCHEDULE_ATTRIBUTION": "interval:0.4", "DRAUDIT_SCHEDULE_POLICY": "interval:0.3"})
    assert res.exit_code == 0, res.output
    lines = {line.split()[0]: line for line in res.output.splitlines()[1:]}
    assert "error" in lines["attribution"] and "RuntimeError: lineage query failed" in lines["attribution"]
    assert "success" in lines["policy"] and "interval:0.3" in lines["policy"]
    # the schedules the scheduler registered, not this process's defaults (daily_pack is on by default)
    assert "never" in lines["daily_pack"] and lines["daily_pack"].split()[1] == "off"


def test_jobs_list_on_a_store_draudit_run_never_used_says_why_every_job_reads_never(tmp_path):
    """A newcomer read 'never' beside every job of a new store as jobs failing to run."""
    url = f"sqlite:///{tmp_path / 'new.db'}"
    assert CliRunner().invoke(cli, ["db", "upgrade", "--database-url", url]).exit_code == 0
    res = CliRunner().invoke(cli, ["jobs", "list", "--database-url", url])
    assert res.exit_code == 0, res.output
    assert all("never" in line and "not scheduled" in line for line in res.stdout.splitlines()[1:])
    assert res.stderr.startswith("note: no job has been scheduled or run in this store yet: `draudit run` schedules")


def test_real_attribution_job_runs_against_the_store(sessions, database_url, tmp_path):
    """The job's summary also says what it left pending (newcomer: "exact 0…" while records waited),
    and `jobs list` shows it."""
    later = datetime.now(timezone.utc) + timedelta(days=2)  # a wrong clock: pending, future-event-time
    with sessions.begin() as s:
        s.execute(insert(InferenceRecord).values(
            transaction_id="txn-future", event_time_ns=dt_to_ns(later), event_time_precision_ns=1000,
            received_ns=dt_to_ns(later), source_format="jsonl", envelope="plain", source="scoring.jsonl",
            raw_sha256="00" * 32, dedup_key=content_hash("txn-future"), conflict=False))
    sched = build_scheduler(_settings(database_url, tmp_path), sessions, ScheduleConfig(), key="t-real")
    try:
        assert sched.run_now("attribution") == "success"
    finally:
        sched.shutdown()
    with sessions() as s:
        run = s.execute(select(JobRun)).scalar_one()
    assert run.outcome == "success"
    # new transactions apart from re-evaluated ones (the counts by status cover both)
    assert run.summary == ("attributed 0 new; pending: future-event-time 1; 0 of 0 re-evaluated changed; rows written: "
                           "ambiguous 0, exact 0, unattributed 0")
    res = CliRunner().invoke(cli, ["jobs", "list", "--database-url", database_url])
    assert res.exit_code == 0, res.output
    line = next(line for line in res.output.splitlines() if line.startswith("attribution"))
    assert "success" in line and "pending: future-event-time 1" in line


def _record(s, txn: str, when: datetime) -> int:
    row = {"transaction_id": txn, "event_time_ns": dt_to_ns(when), "event_time_precision_ns": 1000, "received_ns": dt_to_ns(when),
           "source_format": "jsonl", "envelope": "plain", "source": "scoring.jsonl", "raw_sha256": "00" * 32,
           "dedup_key": content_hash(txn), "conflict": False}
    rid = s.execute(insert(InferenceRecord).values(**row).returning(InferenceRecord.id)).scalar_one()
    stored = s.execute(select(InferenceRecord.__table__).where(InferenceRecord.id == rid)).mappings().one()
    ledger.append(s, "inference_records", [dict(stored)])
    s.execute(insert(Lineage).values(record_id=rid, status="unattributed", reason="no-pod", attributed_at=when))
    return rid


def test_retention_tombstones_every_deleted_row(sessions):
    with sessions.begin() as s:
        for i in range(5):
            _record(s, f"old-{i}", NOW - timedelta(days=40 + i))
        for i in range(3):
            _record(s, f"new-{i}", NOW - timedelta(days=2))
    held = ScheduleConfig(retention_days={"transactions": 30}, legal_hold=True)
    assert apply_retention(sessions, held, NOW) == {}
    assert apply_retention(sessions, ScheduleConfig(retention_days={"transactions": 30}), NOW) == {"transactions": 5}
    with sessions() as s:
        kept = sorted(s.execute(select(InferenceRecord.transaction_id)).scalars())
        assert kept == ["new-0", "new-1", "new-2"]
        assert s.execute(select(func.count()).select_from(Lineage)).scalar_one() == 3  # lineage cascaded
        tombs = s.execute(select(LedgerEntry).where(LedgerEntry.op == "tombstone")).scalars().all()
        assert len(tombs) == 5 and all("transactions kept 30 days" in t.tombstone["reason"] for t in tombs)
        assert ledger.verify(s).ok
    assert set(RETENTION_CLASSES) == {"transactions", "quarantine", "findings", "evaluations", "coverage", "job_runs"}


def test_real_policy_job_evaluates_the_shipped_bundle_and_is_idempotent_on_a_closed_day(sessions, database_url, tmp_path):
    # A watch gap on 11-28 (yesterday for NOW): the shipped bundle reports it. The job must load the
    # bundle into its engine (it once did not, and failed every run); a second run adds nothing.
    _store_coverage(sessions, [("synced", 10, 3, None), ("gap", 3, 2, "410 Gone"), ("synced", 2, 1, None)])
    settings = dataclasses.replace(_settings(database_url, tmp_path), policy_bundle=Settings().policy_bundle)  # shipped
    assert _run_twice_at_now(settings, sessions, ScheduleConfig(), "policy") == ["success", "success"]
    with sessions() as s:
        runs = s.execute(select(JobRun).where(JobRun.job_id == "policy").order_by(JobRun.id)).scalars().all()
        gaps = s.execute(select(Finding).where(Finding.rule == "coverage/observation-gap",
                                               Finding.period_from_ns == dt_to_ns(datetime(2026, 11, 28, tzinfo=timezone.utc)))).scalars().all()
    assert [r.outcome for r in runs] == ["success", "success"]
    assert runs[0].summary.startswith("2026-11-28: ") and "(0 new" not in runs[0].summary.split(";")[0]
    assert runs[1].summary.split(";")[0].endswith("(0 new, 0 updated)")
    assert [(g.from_ns, g.to_ns) for g in gaps] == [(dt_to_ns(NOW - timedelta(hours=3)), dt_to_ns(NOW - timedelta(hours=2)))]


def test_daily_pack_job_renders_missing_days_once(sessions, database_url, tmp_path):
    _store_coverage(sessions, [("synced", 10, 1, None)])
    settings = _settings(database_url, tmp_path)
    assert _run_twice_at_now(settings, sessions, ScheduleConfig(pack_catchup_days=3), "daily_pack") == ["success", "success"]
    with sessions() as s:
        packs = s.execute(select(EvidencePack).order_by(EvidencePack.period_from_ns)).scalars().all()
        summaries = [r.summary for r in s.execute(select(JobRun).order_by(JobRun.id)).scalars()]
    # observation began on 11-28 at 14:20: a pack for 11-28, none for the unobserved 11-26 and 11-27
    assert [(p.period_from_ns, p.period_to_ns) for p in packs] == [
        (dt_to_ns(datetime(2026, 11, 28, tzinfo=timezone.utc)), dt_to_ns(datetime(2026, 11, 29, tzinfo=timezone.utc)))]
    assert summaries[1] == "no day missing a pack"
    pack = settings.pack_dir / "draudit-prod-eu-1-2026-11-28"
    assert all(c.ok is not False for c in verify_pack(pack))
    assert all(c.ok is not False for c in verify_pack(pack.with_name(pack.name + ".tar.gz")))


def test_jobs_run_only_while_this_replica_leads(sessions, database_url, tmp_path):
    # draudit run --leader-elect: every replica has a scheduler on the shared job store; only the
    # Lease holder's runs jobs (APScheduler 3 does not coordinate schedulers itself).
    runs: list[float] = []
    cfg = ScheduleConfig(attribution="interval:0.2", policy="off", daily_pack="off", retention="off")
    sched = build_scheduler(_settings(database_url, tmp_path), sessions, cfg,
                            jobs={"attribution": lambda ctx: runs.append(time.monotonic()) or "ok"}, key="t-leader")
    sched.start(paused=True)
    try:
        time.sleep(0.8)
        assert runs == []  # standby
        sched.follow_leadership(True)
        assert _wait_for(lambda: len(runs) >= 2)
        sched.follow_leadership(False)
        lost_at = time.monotonic()
        time.sleep(0.8)
        assert all(t <= lost_at + 0.05 for t in runs)  # nothing started after leadership was lost
    finally:
        sched.shutdown()


def test_watcher_tells_listeners_when_it_starts_and_stops_recording(srv, sessions):
    from collector.kube.client import make_api_client
    from collector.settings import Settings
    from collector.watcher import Watcher
    from tests.watch_support import FAST, wait_until

    for leader_elect in (False, True):
        seen: list[bool] = []
        cfg = Settings(database_url="sqlite://", cluster="test-cluster", leader_elect=leader_elect)
        w = Watcher(cfg, sessions, make_api_client(host=srv.url), reflector_settings=FAST)
        w.leadership_listeners.append(seen.append)
        w.start()
        try:
            wait_until(lambda: seen == [True], what="recording started")
        finally:
            w.stop()
        assert seen == [True, False]


def test_retention_of_policy_evaluation_records_keeps_the_recent_ones_and_tombstones_the_rest(sessions):
    from collector.policy.bundle import load_bundle
    from collector.policy.findings import record_evaluation
    from collector.store.models import PolicyEvaluation
    bundle = load_bundle(Settings().policy_bundle)
    with sessions.begin() as s:
        for days in (90, 45, 3):
            at = NOW - timedelta(days=days)
            record_evaluation(s, bundle, "regorus", "prod-eu-1", dt_to_ns(at - timedelta(days=1)), dt_to_ns(at), at, 0)
    assert apply_retention(sessions, ScheduleConfig(retention_days={"evaluations": 30}), NOW) == {"evaluations": 2}
    with sessions() as s:
        [kept] = s.execute(select(PolicyEvaluation)).scalars().all()
        assert kept.evaluated_at == NOW - timedelta(days=3)
        assert ledger.verify(s).ok
