"""Periodic jobs of ``draudit run``: attribution, policy evaluation, daily evidence pack, retention.

APScheduler 3 ``BackgroundScheduler`` with a ``SQLAlchemyJobStore`` in the store's own database.
Its table ``apscheduler_jobs`` is declared in ``collector.store.models`` (same shape as the job
store creates) so Alembic creates, compares and drops it with the rest of the schema; the job
store's own ``create(checkfirst=True)`` then does nothing. Jobs run in a thread pool, never in the
watcher's thread: a slow or failing job cannot block the watch.

The job store is the scheduler's memory across restarts: a start keeps each stored job's next run
time when its schedule is unchanged (a restart never postpones a job), reschedules it when the
schedule changed, adds a job switched on and removes one switched ``off`` (with its pending retry)
— ``Scheduler.sync_jobs``. Under leader election only the leader does that, when it becomes leader:
a standby reads and writes nothing in the job store. A job that came due while no scheduler ran
(the collector down, no leader) runs once as soon as one does (``coalesce``, no misfire grace: a
late daily pack or retention run is still wanted).

Every run is recorded in ``job_runs`` (started, finished, outcome ``success``/``error``/
``skipped``, the error, a one-line summary). A failing job is logged, recorded and retried once
after ``retry_delay_s`` (then at its next scheduled time); the other jobs keep running.

Configuration (environment; ``off`` disables a job):
- ``DRAUDIT_SCHEDULE_ATTRIBUTION`` (default ``interval:60``), ``DRAUDIT_SCHEDULE_POLICY``
  (``interval:300``), ``DRAUDIT_SCHEDULE_DAILY_PACK`` (``cron:15 0 * * *``, UTC),
  ``DRAUDIT_SCHEDULE_RETENTION`` (``cron:30 1 * * *``): ``interval:<seconds>`` or
  ``cron:<minute> <hour> <day> <month> <weekday>`` (crontab, UTC).
- ``DRAUDIT_RETENTION_DAYS_<CLASS>`` per data class (``TRANSACTIONS``, ``QUARANTINE``,
  ``FINDINGS``, ``EVALUATIONS`` (policy evaluation records), ``COVERAGE``, ``JOB_RUNS``): days to keep; unset keeps forever (DORA and NIS2 fix
  no retention period: RTS 2024/1774 Art. 12(2)(a) makes the entity choose).
- ``DRAUDIT_RETENTION_LEGAL_HOLD`` (``true`` stops every deletion), ``DRAUDIT_JOB_RETRY_DELAY_S``
  (300), ``DRAUDIT_PACK_CATCHUP_DAYS`` (7: missing daily packs of the last N days are rendered).
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from apscheduler.jobstores.base import ConflictingIdError, JobLookupError
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_RUNNING
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from collector.errors import UserError
from collector.settings import Settings
from collector.store import ledger
from collector.store.models import (
    CoverageInterval,
    EvidencePack,
    Finding,
    InferenceRecord,
    JobRun,
    Lineage,
    PolicyEvaluation,
    Quarantine,
    SchedulerJob,
    WatchState,
)
from collector.timeutil import dt_to_ns, ns_to_rfc3339, utcnow

log = logging.getLogger(__name__)

JOB_IDS = ("attribution", "policy", "daily_pack", "retention")
RETENTION_BATCH = 1_000
# Options of every periodic job. No misfire grace: with coalesce, a job that came due while no
# scheduler ran (collector down, no leader) runs once when one does, however late (APScheduler's
# default grace would drop a daily pack or retention run missed by more than a few minutes).
JOB_OPTIONS: dict[str, Any] = {"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
# Seconds between attempts to bring the job store in line when it failed on becoming leader.
RESYNC_DELAY_S = 10.0


# ------------------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class RetentionClass:
    """A class of stored data with its table, its age column and whether the ledger covers it."""

    name: str
    model: Any
    age_column: str
    unit: str  # "ns" (integer nanoseconds) or "dt" (aware datetime)
    ledgered: bool
    derived: tuple[Any, ...] = ()  # columns holding this table's primary key: their rows go with it


RETENTION_CLASSES: dict[str, RetentionClass] = {
    "transactions": RetentionClass("transactions", InferenceRecord, "event_time_ns", "ns", True,
                                   derived=(Lineage.__table__.c.record_id,)),
    "quarantine": RetentionClass("quarantine", Quarantine, "received_at", "dt", True),
    "findings": RetentionClass("findings", Finding, "evaluated_at", "dt", True),
    "evaluations": RetentionClass("evaluations", PolicyEvaluation, "evaluated_at", "dt", True),
    "coverage": RetentionClass("coverage", CoverageInterval, "ended_ns", "ns", True),
    "job_runs": RetentionClass("job_runs", JobRun, "started_at", "dt", False),
}


@dataclass(frozen=True)
class ScheduleConfig:
    """Schedules (``interval:<s>``, ``cron:<crontab>`` or ``off``) and retention, from the environment."""

    attribution: str = "interval:60"
    policy: str = "interval:300"
    daily_pack: str = "cron:15 0 * * *"
    retention: str = "cron:30 1 * * *"
    retention_days: dict[str, int] = field(default_factory=dict)
    legal_hold: bool = False
    retry_delay_s: float = 300.0
    pack_catchup_days: int = 7

    def schedule_of(self, job_id: str) -> str:
        return getattr(self, job_id)


def parse_trigger(spec: str, source: str):
    """APScheduler trigger for ``interval:<seconds>`` or ``cron:<m h dom mon dow>`` (UTC); None for ``off``.

    Raises:
        UserError: naming ``source`` (the environment variable) and the accepted forms.
    """
    text = spec.strip()
    if text.lower() == "off":
        return None
    kind, _, arg = text.partition(":")
    try:
        if kind == "interval":
            seconds = float(arg)
            if seconds <= 0:
                raise ValueError("must be positive")
            return IntervalTrigger(seconds=seconds, timezone=timezone.utc)
        if kind == "cron":
            return CronTrigger.from_crontab(arg.strip(), timezone=timezone.utc)
    except ValueError as exc:
        raise UserError(f"{source}={spec!r}: {exc}; use interval:<seconds>, cron:<m h dom mon dow> or off") from None
    raise UserError(f"{source}={spec!r}: use interval:<seconds>, cron:<m h dom mon dow> (UTC) or off")


def load_schedule_config(environ: Mapping[str, str] | None = None) -> ScheduleConfig:
    """``ScheduleConfig`` from ``environ`` (default ``os.environ``), validated.

    Raises:
        UserError: a malformed schedule, day count or flag, naming the variable.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for job in JOB_IDS:
        var = f"DRAUDIT_SCHEDULE_{job.upper()}"
        if var in env:
            parse_trigger(env[var], var)
            values[job] = env[var].strip()
    days: dict[str, int] = {}
    for name in RETENTION_CLASSES:
        var = f"DRAUDIT_RETENTION_DAYS_{name.upper()}"
        if env.get(var, "").strip():
            try:
                days[name] = int(env[var])
                if days[name] < 1:
                    raise ValueError
            except ValueError:
                raise UserError(f"{var}={env[var]!r} must be a positive number of days (unset keeps forever)") from None
    values["retention_days"] = days
    hold = env.get("DRAUDIT_RETENTION_LEGAL_HOLD", "").strip().lower()
    if hold not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
        raise UserError(f"DRAUDIT_RETENTION_LEGAL_HOLD={hold!r} must be true or false")
    values["legal_hold"] = hold in ("1", "true", "yes", "on")
    for var, key, cast in (("DRAUDIT_JOB_RETRY_DELAY_S", "retry_delay_s", float),
                           ("DRAUDIT_PACK_CATCHUP_DAYS", "pack_catchup_days", int)):
        if env.get(var, "").strip():
            try:
                values[key] = cast(env[var])
                if values[key] < 0:
                    raise ValueError
            except ValueError:
                raise UserError(f"{var}={env[var]!r} must be a non-negative number") from None
    return ScheduleConfig(**values)


def check_job_inputs(settings: Settings, config: ScheduleConfig) -> list[str]:
    """Read what the enabled jobs will read, so that ``draudit run`` refuses to start on a bad one
    instead of starting, staying ready and failing in every run of a job.

    - policy job on: the bundle ``DRAUDIT_POLICY_BUNDLE`` loads (``load_bundle``) and, for the
      embedded engine (no ``DRAUDIT_OPA_URL``), every module parses. An OPA server is not
      contacted (it may start after the collector; its URL's form is checked in ``Settings``).
    - daily pack on and ``DRAUDIT_SIGN_KEY`` set: the key reads as an Ed25519 private key.

    Returns:
        The bundle's warnings (``Bundle.warnings``), for the caller to show.

    Raises:
        UserError: one line naming the variable and what is wrong with it.
    """
    warnings: list[str] = []
    if parse_trigger(config.policy, "DRAUDIT_SCHEDULE_POLICY") is not None:
        from collector.policy.bundle import load_bundle
        from collector.policy.engines import RegorusEngine

        try:
            bundle = load_bundle(settings.policy_bundle)
            if not settings.opa_url:
                RegorusEngine().load_bundle(bundle)
        except UserError as exc:
            raise UserError(f"DRAUDIT_POLICY_BUNDLE={settings.policy_bundle}: {_one_line(exc)} "
                            "(the policy job evaluates it; or DRAUDIT_SCHEDULE_POLICY=off)") from None
        warnings.extend(bundle.warnings)
    if settings.sign_key and parse_trigger(config.daily_pack, "DRAUDIT_SCHEDULE_DAILY_PACK") is not None:
        from collector.cli.report import read_private_key

        try:
            read_private_key(settings.sign_key)
        except UserError as exc:
            raise UserError(f"DRAUDIT_SIGN_KEY={settings.sign_key}: {_one_line(exc)} "
                            "(the daily pack job signs with it)") from None
    return warnings


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


# ------------------------------------------------------------------------------------ jobs


@dataclass
class JobContext:
    """What jobs need: settings, sessions, schedule config, and the job functions by id."""

    settings: Settings
    sessions: sessionmaker[Session]
    config: ScheduleConfig
    jobs: dict[str, Callable[["JobContext"], str]]
    scheduler: BackgroundScheduler | None = None
    clock: Callable[[], datetime] = utcnow


class Skipped(Exception):
    """A job that cannot run here (its stage is not installed); recorded as ``skipped``."""


def job_attribution(ctx: JobContext) -> str:
    """Incremental attribution: ``collector.lineage.attribute`` over records without lineage."""
    try:
        from collector.lineage import attribute_run, pending_counts
    except ImportError as exc:
        raise Skipped(f"collector.lineage not available ({exc})") from None
    with ctx.sessions.begin() as session:
        summary = attribute_run(session, clock_skew_s=ctx.settings.clock_skew_s, cluster=ctx.settings.cluster)
        pending = pending_counts(session, ctx.settings.clock_skew_s, cluster=ctx.settings.cluster)
    # What it left pending is said too: "exact 0" alone read as nothing to do while records waited.
    waiting = ", ".join(f"{k} {v}" for k, v in sorted(pending.items()) if v) or "none"
    # New transactions apart from re-evaluated ones whose verdict changed (the counts by status hold both)
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(summary.by_status.items()))
    # pending first: `jobs list` cuts the line at 100 characters
    return (f"attributed {summary.new} new; pending: {waiting}; {summary.revised} of {summary.revisited} "
            f"re-evaluated changed; rows written: {statuses}")


def job_policy(ctx: JobContext) -> str:
    """Evaluate the policy bundle over the current UTC day (and the previous one in the first hour).

    The period is the whole day, so re-evaluating during the day is idempotent (findings are keyed
    by rule, subjects, interval, period and bundle digest).
    """
    try:
        from collector.policy.bundle import load_bundle
        from collector.policy.engines import make_policy_engine
        from collector.policy.findings import evaluate_period
    except ImportError as exc:
        raise Skipped(f"collector.policy not available ({exc})") from None
    now = ctx.clock()
    bundle = load_bundle(ctx.settings.policy_bundle)
    engine = make_policy_engine(ctx.settings.opa_url, ctx.settings.opa_timeout_s)
    engine.load_bundle(bundle)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    days = [day - timedelta(days=1), day] if now - day < timedelta(hours=1) else [day]
    parts = []
    for d in days:
        ev = evaluate_period(ctx.sessions, bundle, engine, dt_to_ns(d), dt_to_ns(d + timedelta(days=1)),
                             ctx.settings.cluster, now_ns=dt_to_ns(now))
        parts.append(f"{d.date()}: {len(ev.findings)} findings ({ev.inserted - ev.updated} new, {ev.updated} updated)")
    return "; ".join(parts)


def _first_observation_ns(session: Session) -> int | None:
    a = session.execute(select(func.min(CoverageInterval.started_ns))).scalar()
    b = session.execute(select(func.min(WatchState.state_since_ns))).scalar()
    vals = [v for v in (a, b) if v is not None]
    return min(vals) if vals else None


def job_daily_pack(ctx: JobContext) -> str:
    """Render the pack of every completed UTC day of the last ``pack_catchup_days`` that has none.

    Days before the collector's first observation are skipped (except yesterday, which is always
    rendered: an unobserved day is shown as such). Packs go to ``settings.pack_dir`` as
    ``draudit-<cluster>-<YYYY-MM-DD>`` plus its ``.tar.gz``, signed when ``settings.sign_key`` is set.
    """
    from collector.cli.report import read_private_key
    from reports.render import PackRequest, render_pack

    today = ctx.clock().replace(hour=0, minute=0, second=0, microsecond=0)
    cluster = ctx.settings.cluster
    with ctx.sessions() as session:
        first = _first_observation_ns(session)
        done = {(p.period_from_ns, p.period_to_ns) for p in session.execute(select(EvidencePack)).scalars()
                if p.scope == {"clusters": [cluster], "namespaces": ["*"]}}
    key = read_private_key(ctx.settings.sign_key) if ctx.settings.sign_key else None
    written = []
    for back in range(max(ctx.config.pack_catchup_days, 1), 0, -1):
        start = today - timedelta(days=back)
        end = start + timedelta(days=1)
        if (dt_to_ns(start), dt_to_ns(end)) in done:
            continue
        if back > 1 and (first is None or dt_to_ns(end) <= first):
            continue
        out = Path(ctx.settings.pack_dir) / f"draudit-{cluster}-{start.date().isoformat()}"
        if out.exists() and any(out.iterdir()):
            continue  # written before but not recorded (a crash between the two): left for an operator
        result = render_pack(ctx.sessions, PackRequest(start, end, (cluster,), ()), out, sign_key=key, archive=True,
                             policy_bundle=ctx.settings.policy_bundle, clock_skew_s=ctx.settings.clock_skew_s,
                             now=ctx.clock())
        written.append(f"{start.date()} → {result.path} ({result.pack_id})")
    return "; ".join(written) if written else "no day missing a pack"


def apply_retention(sessions: sessionmaker[Session], config: ScheduleConfig, now: datetime) -> dict[str, int]:
    """Delete rows older than each class's retention, tombstoning ledgered rows first.

    Each deleted row of a ledgered table gets a ledger tombstone (``append_tombstone``: table, key,
    the row's leaf hash and the reason) in the same transaction as the delete, so the chain still
    accounts for it (RTS 2024/1774 Art. 12, compliance.md §2.4). Batches of ``RETENTION_BATCH`` rows,
    one transaction each; rows derived from them (``RetentionClass.derived``: a transaction's lineage)
    are deleted in the same transaction. With ``legal_hold`` nothing is deleted.

    Returns:
        Rows deleted per class.
    """
    deleted: dict[str, int] = {}
    if config.legal_hold:
        return deleted
    for name, days in sorted(config.retention_days.items()):
        cls = RETENTION_CLASSES[name]
        cutoff = now - timedelta(days=days)
        cutoff_value = dt_to_ns(cutoff) if cls.unit == "ns" else cutoff
        table = cls.model.__table__
        pk = list(table.primary_key.columns)[0]
        age = table.c[cls.age_column]
        reason = f"retention: {name} kept {days} days; older than {cutoff.isoformat()}"
        total = 0
        while True:
            with sessions.begin() as session:
                rows = session.execute(select(table).where(age < cutoff_value).order_by(pk).limit(RETENTION_BATCH)).mappings().all()
                if not rows:
                    break
                if cls.ledgered:
                    for row in rows:
                        ledger.append_tombstone(session, table.name, row, reason)
                keys = [r[pk.name] for r in rows]
                for column in cls.derived:  # derived data (lineage): no ledger entry, no foreign key
                    session.execute(delete(column.table).where(column.in_(keys)))
                session.execute(delete(table).where(pk.in_(keys)))
                total += len(rows)
        deleted[name] = total
    return deleted


def job_retention(ctx: JobContext) -> str:
    """Apply the configured retention (see ``apply_retention``)."""
    if ctx.config.legal_hold:
        return "legal hold: nothing deleted"
    if not ctx.config.retention_days:
        return "no retention configured: everything kept"
    deleted = apply_retention(ctx.sessions, ctx.config, ctx.clock())
    return "deleted " + ", ".join(f"{k} {v}" for k, v in deleted.items())


DEFAULT_JOBS: dict[str, Callable[[JobContext], str]] = {
    "attribution": job_attribution, "policy": job_policy, "daily_pack": job_daily_pack, "retention": job_retention,
}

# Job context per scheduler key: persisted jobs carry only (key, job id), never live objects.
_CONTEXTS: dict[str, JobContext] = {}


def _record_start(ctx: JobContext, job_id: str) -> int | None:
    try:
        with ctx.sessions.begin() as session:
            run = JobRun(job_id=job_id, started_at=utcnow(), outcome="running")
            session.add(run)
            session.flush()
            return run.id
    except Exception:  # noqa: BLE001 - the store may be down; the job still runs and logs
        log.exception("job %s: cannot record its start", job_id)
        return None


def _record_end(ctx: JobContext, run_id: int | None, outcome: str, error: str | None, summary: str | None) -> None:
    if run_id is None:
        return
    try:
        with ctx.sessions.begin() as session:
            session.execute(update(JobRun).where(JobRun.id == run_id).values(
                finished_at=utcnow(), outcome=outcome, error=error, summary=(summary or "")[:2000] or None))
    except Exception:  # noqa: BLE001
        log.exception("job run %s: cannot record its outcome %s", run_id, outcome)


def run_job(context_key: str, job_id: str, is_retry: bool = False) -> str:
    """Entry point APScheduler calls: run one job, record the run, schedule a retry on failure.

    A failed retry is not retried again (the job's own schedule runs it next): re-adding the
    one-shot retry job from inside itself races APScheduler's removal of it (JobLookupError).
    Never raises: the outcome is in ``job_runs`` and the log. Returns the outcome.
    """
    ctx = _CONTEXTS.get(context_key)
    if ctx is None:
        log.error("job %s: no scheduler context %r in this process", job_id, context_key)
        return "error"
    run_id = _record_start(ctx, job_id)
    try:
        summary = ctx.jobs[job_id](ctx)
    except Skipped as exc:
        log.warning("job %s skipped: %s", job_id, exc)
        _record_end(ctx, run_id, "skipped", str(exc), None)
        return "skipped"
    except Exception as exc:  # noqa: BLE001 - a failing job must not stop the others
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:1000]
        log.exception("job %s failed: %s", job_id, message)
        _record_end(ctx, run_id, "error", message, None)
        if not is_retry:
            _schedule_retry(ctx, context_key, job_id)
        return "error"
    log.info("job %s: %s", job_id, summary)
    _record_end(ctx, run_id, "success", None, summary)
    return "success"


def _schedule_retry(ctx: JobContext, context_key: str, job_id: str) -> None:
    sched = ctx.scheduler
    if sched is None or not sched.running or ctx.config.retry_delay_s <= 0:
        return
    when = datetime.now(timezone.utc) + timedelta(seconds=ctx.config.retry_delay_s)
    try:
        # Never replace a pending retry: replacing removes it, and APScheduler, which may be running
        # that one-shot job right now, then fails to remove it after the run (JobLookupError).
        sched.add_job(run_job, DateTrigger(when, timezone=timezone.utc), args=[context_key, job_id, True],
                      id=f"{job_id}.retry", name=f"retry {job_id}", replace_existing=False, misfire_grace_time=None)
    except ConflictingIdError:
        log.info("job %s: a retry is already pending", job_id)
    except Exception:  # noqa: BLE001
        log.exception("job %s: cannot schedule its retry", job_id)


class _BackgroundScheduler(BackgroundScheduler):
    """``BackgroundScheduler`` that looks at due jobs only while running.

    APScheduler 3's main loop runs one more round after ``shutdown()`` (state stopped, which its
    paused-check does not cover): it finds the due jobs, cannot submit them (executors shut down:
    "cannot schedule new futures after shutdown") and advances their next run time in the shared
    job store. A standby's restart, or a stopping leader's, would so drop a due run. The check is
    made under the job store lock that ``shutdown()`` takes before shutting the executors down.
    """

    def _process_jobs(self):
        with self._jobstores_lock:
            if self.state != STATE_RUNNING:
                return None
            return super()._process_jobs()


def _trigger_key(trigger: Any) -> tuple | None:
    """What makes two triggers the same schedule (None: not comparable, always rescheduled).

    An ``IntervalTrigger``'s ``start_date`` is not part of it: it is the moment the job was first
    added, from which the stored job's run times count on.
    """
    if isinstance(trigger, IntervalTrigger):
        return ("interval", trigger.interval, trigger.jitter, str(trigger.timezone), trigger.end_date)
    if isinstance(trigger, CronTrigger):
        return ("cron", tuple((f.name, str(f)) for f in trigger.fields), trigger.jitter, str(trigger.timezone),
                trigger.start_date, trigger.end_date)
    return None


class Scheduler:
    """The periodic jobs of ``draudit run``: ``start()`` and ``shutdown()``; ``run_now`` for one job.

    ``triggers``: the configured trigger of each job id (None: switched off).
    """

    def __init__(self, aps: BackgroundScheduler, context: JobContext, key: str,
                 triggers: Mapping[str, Any] | None = None) -> None:
        self.aps = aps
        self.context = context
        self.key = key
        self.triggers: dict[str, Any] = dict(triggers or {})
        self._lock = threading.RLock()
        self._leading = False
        self._resync_timer: threading.Timer | None = None

    def start(self, paused: bool = False) -> None:
        """Start the scheduler thread.

        Not ``paused``: first bring the job store in line with the configured schedules
        (``sync_jobs``), then run jobs. ``paused`` (a standby under leader election): read and
        write nothing in the job store and run nothing until ``follow_leadership(True)``.

        Raises:
            SQLAlchemyError: the job store cannot be read or written (not paused).
        """
        self.aps.start(paused=True)  # nothing pending: starting writes nothing to the job store
        if not paused:
            self.sync_jobs()
            with self._lock:
                self._leading = True
                self.aps.resume()

    def sync_jobs(self) -> dict[str, str]:
        """Make the job store hold the configured jobs, keeping what is unchanged.

        Per job: ``kept`` (same schedule: its stored next run time stays, so a restart never
        postpones it), ``rescheduled`` (schedule changed: next run from now), ``added``, ``removed``
        (switched off: it and its pending retry leave the job store, so it stops running),
        ``off`` (switched off and not stored). Returns that per job id.
        """
        done: dict[str, str] = {}
        now = datetime.now(timezone.utc)
        for job_id in [*JOB_IDS, *(j for j in self.triggers if j not in JOB_IDS)]:
            trigger = self.triggers.get(job_id)
            stored = self._stored_job(job_id)
            if trigger is None:
                done[job_id] = "off"
                for jid in (job_id, f"{job_id}.retry"):
                    if (stored if jid == job_id else self._stored_job(jid)) is not None:
                        try:
                            self.aps.remove_job(jid)
                        except JobLookupError:  # a one-shot retry that just ran
                            continue
                        done[job_id] = "removed"
                if done[job_id] == "removed":
                    log.info("job %s: switched off (DRAUDIT_SCHEDULE_%s=off): removed from the job store",
                             job_id, job_id.upper())
                continue
            wanted = {"func": run_job, "args": (self.key, job_id), "name": job_id, **JOB_OPTIONS}
            if stored is None:
                self.aps.add_job(run_job, trigger, args=[self.key, job_id], id=job_id, name=job_id, **JOB_OPTIONS)
                done[job_id] = "added"
                continue
            if _trigger_key(stored.trigger) != _trigger_key(trigger) or stored.next_run_time is None:
                self.aps.modify_job(job_id, trigger=trigger, next_run_time=trigger.get_next_fire_time(None, now),
                                    **{**wanted, "args": list(wanted["args"])})
                done[job_id] = "rescheduled"
                log.info("job %s: schedule changed to %s: next run recomputed", job_id,
                         self.context.config.schedule_of(job_id) if job_id in JOB_IDS else trigger)
                continue
            changes = {k: v for k, v in wanted.items()
                       if (stored.func_ref != f"{run_job.__module__}:{run_job.__qualname__}" if k == "func"
                           else tuple(stored.args) != v if k == "args" else getattr(stored, k, None) != v)}
            if changes:
                self.aps.modify_job(job_id, **changes)
            done[job_id] = "kept"
            log.info("job %s: schedule unchanged, next run kept at %s", job_id, stored.next_run_time.isoformat())
        return done

    def _stored_job(self, job_id: str):
        """The job ``job_id`` in the job store, or None; one this APScheduler cannot read (stored
        by another version) is removed and counts as absent."""
        try:
            return self.aps.get_job(job_id)
        except Exception as exc:  # noqa: BLE001 - unpickling a foreign job state
            log.warning("job %s: the stored job cannot be read (%s): replaced", job_id, exc)
            try:
                self.aps.remove_job(job_id)
            except JobLookupError:
                pass
            return None

    def follow_leadership(self, leading: bool) -> None:
        """Run jobs only while this replica leads (``Watcher.leadership_listeners``).

        APScheduler 3 does not coordinate several schedulers on one job store: without this, every
        replica would run every job (two daily packs, retention twice). A job already running
        when leadership is lost finishes; none starts until leadership returns. On becoming
        leader the job store is first brought in line with this replica's schedules
        (``sync_jobs``); if that fails jobs stay paused and it is retried every ``RESYNC_DELAY_S``.
        """
        with self._lock:
            self._leading = leading
            if self._resync_timer is not None:
                self._resync_timer.cancel()
                self._resync_timer = None
            if not self.aps.running:
                return
            if not leading:
                self.aps.pause()
                return
            try:
                self.sync_jobs()
            except Exception:  # noqa: BLE001 - the store may be down: stay paused, try again
                log.exception("scheduler: cannot bring the job store in line with the configured schedules; "
                              "jobs stay paused, retrying in %.0f s", RESYNC_DELAY_S)
                self._resync_timer = threading.Timer(RESYNC_DELAY_S, self._resync)
                self._resync_timer.daemon = True
                self._resync_timer.start()
                return
            self.aps.resume()

    def _resync(self) -> None:
        with self._lock:
            leading = self._leading
        if leading:
            self.follow_leadership(True)

    def shutdown(self, wait: bool = True) -> None:
        """Stop scheduling; with ``wait`` let running jobs finish."""
        with self._lock:
            self._leading = False
            if self._resync_timer is not None:
                self._resync_timer.cancel()
                self._resync_timer = None
        if self.aps.running:
            self.aps.shutdown(wait=wait)
        _CONTEXTS.pop(self.key, None)

    def run_now(self, job_id: str) -> str:
        """Run one job in the caller's thread (for ``draudit`` commands and tests); returns its outcome."""
        return run_job(self.key, job_id)

    def job_ids(self) -> list[str]:
        return sorted(j.id for j in self.aps.get_jobs())


def build_scheduler(settings: Settings, session_factory: sessionmaker[Session], config: ScheduleConfig | None = None,
                    *, jobs: Mapping[str, Callable[[JobContext], str]] | None = None, key: str = "main",
                    max_workers: int = 4) -> Scheduler:
    """A ``Scheduler`` with the trigger of every job parsed (not started: the job store is only
    touched by ``Scheduler.start`` / ``follow_leadership(True)``, see ``Scheduler.sync_jobs``).

    Args:
        settings: the collector's settings (cluster, pack_dir, sign_key, policy bundle, OPA URL).
        session_factory: sessions on the store; the job store uses the same engine.
        config: schedules and retention (default: ``load_schedule_config()``).
        jobs: job functions by id (default ``DEFAULT_JOBS``; tests substitute their own). A job of
            ``JOB_IDS`` not given is switched off.
        key: names this scheduler's context in the process (persisted jobs carry it).
        max_workers: threads for jobs (separate from the watcher's).

    Raises:
        UserError: a malformed schedule.
    """
    config = config or load_schedule_config()
    ctx = JobContext(settings, session_factory, config, dict(jobs or DEFAULT_JOBS))
    triggers = {job_id: parse_trigger(config.schedule_of(job_id), f"DRAUDIT_SCHEDULE_{job_id.upper()}")
                for job_id in ctx.jobs}
    engine = session_factory.kw["bind"]
    aps = _BackgroundScheduler(jobstores={"default": SQLAlchemyJobStore(engine=engine, tablename=SchedulerJob.__tablename__)},
                              executors={"default": ThreadPoolExecutor(max_workers=max_workers)},
                              job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 300},
                              timezone=timezone.utc)
    ctx.scheduler = aps
    _CONTEXTS[key] = ctx
    return Scheduler(aps, ctx, key, triggers)


def _stored_schedule(job_state: bytes) -> str | None:
    """The schedule of a job as stored by APScheduler's SQLAlchemy job store (a pickled job state
    written by our own scheduler into our own database), in ``parse_trigger``'s syntax; None when
    it cannot be read (another APScheduler version)."""
    try:
        trigger = pickle.loads(job_state)["trigger"]  # noqa: S301 - our own job store, same database
    except Exception:  # noqa: BLE001
        return None
    if isinstance(trigger, IntervalTrigger):
        return f"interval:{trigger.interval.total_seconds():g}"
    if isinstance(trigger, CronTrigger):
        fields = {f.name: str(f) for f in trigger.fields}
        return "cron:" + " ".join(fields.get(n, "*") for n in ("minute", "hour", "day", "month", "day_of_week"))
    return str(trigger)


def job_overview(sessions: sessionmaker[Session], config: ScheduleConfig) -> list[dict[str, Any]]:
    """One row per job for ``draudit jobs list``: schedule, next run (job store), last run and outcome.

    ``next_run`` is the earliest of the job and its pending retry, from ``apscheduler_jobs``
    (None when ``draudit run`` never scheduled it); times are RFC 3339 UTC. ``schedule`` is the
    one the running scheduler registered (its job store; ``off`` for a job it removed), else
    ``config``'s (this process's environment, when no scheduler ever ran on this store) — they
    differ when ``draudit run`` was started with other settings.
    """
    schedules: dict[str, str] = {}
    with sessions() as session:
        next_runs: dict[str, float] = {}
        for job_id, next_run, state in session.execute(select(SchedulerJob.id, SchedulerJob.next_run_time, SchedulerJob.job_state)):
            base = job_id.split(".")[0]
            if next_run is not None:
                next_runs[base] = min(next_run, next_runs.get(base, next_run))
            if job_id == base:
                schedules[base] = _stored_schedule(state) or config.schedule_of(base)
        last: dict[str, JobRun] = {}
        latest = select(JobRun.job_id, func.max(JobRun.id).label("id")).group_by(JobRun.job_id).subquery()
        for run in session.execute(select(JobRun).join(latest, JobRun.id == latest.c.id)).scalars():
            last[run.job_id] = run
    # A job store that holds jobs is the running scheduler's: a job it lacks is switched off there.
    # An empty one after jobs ran: the scheduler removed every job (all switched off; it removes
    # only those) — else no scheduler ever started on this store and this process's config is shown.
    store_known = bool(schedules) or bool(last)
    rows = []
    for job_id in JOB_IDS:
        run = last.get(job_id)
        nxt = next_runs.get(job_id)
        schedule = schedules.get(job_id, "off" if store_known else config.schedule_of(job_id))
        rows.append({"job": job_id, "schedule": schedule,
                     "next_run": ns_to_rfc3339(int(nxt * 1e6) * 1000) if nxt is not None else None,
                     "last_run": run.started_at.strftime("%Y-%m-%dT%H:%M:%SZ") if run else None,
                     "outcome": run.outcome if run else None, "error": run.error if run else None,
                     "summary": run.summary if run else None})
    return rows


__all__ = ["ScheduleConfig", "Scheduler", "build_scheduler", "check_job_inputs", "load_schedule_config", "job_overview", "run_job",
           "apply_retention", "parse_trigger", "RETENTION_CLASSES"]
