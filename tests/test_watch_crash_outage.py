"""A crash (SIGKILL, no clean stop) while one kind is out of contact with the API server, the others
not: the out-of-contact kind's coverage ends at its own last contact, not at the run's last sign of
life (which the other kinds' bookmarks keep moving). Against the fake API server over real HTTP, and
at the recorder level, on SQLite and PostgreSQL.

A builder's task (watch correctness): a claim changed during a ResourceClaim outage of a few seconds
before a SIGKILL fell inside 'synced' coverage after the restart (the kind was taken as observed
until the Pod stream's last bookmark, minus the read timeout), so a transaction in that span could
be attributed ``exact`` to a device its claim had left.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from sqlalchemy import select, update

from collector.kube.discovery import watched_kinds
from collector.kube.recorder import CRASHED_REASON, Recorder
from collector.sim import Fault
from collector.store import ledger
from collector.store.models import CoverageInterval, WatchState
from collector.timeutil import now_ns
from tests.watch_support import claim, gaps, start_watcher, versions, wait_until, watch_requests

S = 10**9
US = 1000  # updated_at is stored to the microsecond


@pytest.fixture
def watchers(srv, sessions):
    started = []

    def make():
        w = start_watcher(srv, sessions)
        started.append(w)
        assert w.wait_synced(15), "watcher did not sync"
        return w

    yield make
    for w in started:
        w.stop(timeout_s=5)


def _kill(w) -> None:
    """What a SIGKILL leaves: the writer stops after its current transaction and nothing more is
    committed (what was queued is lost); no clean stop closes the coverage intervals."""
    rec = w.recorder
    rec._stop.set()
    rec._thread.join(5)
    for r in w.reflectors:
        r.stop()
    for t in [t for t in w._threads if t.name.startswith("draudit-reflector-")]:
        t.join(5)
    w.recorder, w.reflectors = None, []  # the fixture's stop() then has nothing left to close
    w._threads = [t for t in w._threads if not t.name.startswith("draudit-reflector-")]


def _coverage(sessions, kind: str) -> list[tuple[str, int, int, str | None]]:
    with sessions() as s:
        return [tuple(r) for r in s.execute(
            select(CoverageInterval.state, CoverageInterval.started_ns, CoverageInterval.ended_ns, CoverageInterval.reason)
            .where(CoverageInterval.kind == kind).order_by(CoverageInterval.started_ns, CoverageInterval.id)).all()]


def _state_at(intervals, at_ns: int) -> list[str]:
    return [state for state, a, b, _ in intervals if a <= at_ns < b]


def _pod_alive(sessions) -> int:
    with sessions() as s:
        st = s.get(WatchState, ("test-cluster", "Pod"))
        return int(st.updated_at.timestamp()) * S + st.updated_at.microsecond * 1000


@pytest.mark.parametrize("failure", [dict(action="status", code=503), dict(action="reset_before_headers")],
                         ids=["503", "reset"])
def test_a_crash_during_one_kinds_outage_ends_its_coverage_at_its_last_contact(srv, sessions, watchers, failure):
    """ResourceClaim requests fail (503, or connections reset) for seconds while the Pod stream's
    bookmarks keep the run alive; a claim is created 0.5 s in; then SIGKILL. After the restart, the
    claim kind's 'synced' coverage ends at its last contact before the outage, and the creation
    falls in a span that is not 'synced' (it was never seen when it happened)."""
    w = watchers()
    time.sleep(0.5)  # a few bookmarks committed: the kind's last contact before the outage
    srv.add_fault(Fault(kind="ResourceClaim", verb="any", count=100_000, **failure))
    srv.close_watches("ResourceClaim")
    cut = now_ns()
    time.sleep(0.5)
    made = now_ns()
    srv.apply(claim("during"))
    time.sleep(2.5)  # longer than the read timeout (1 s): the Pod stream's bookmarks go on
    _kill(w)
    alive = _pod_alive(sessions)
    assert alive - made > 1.5 * S, "the other kinds kept the run alive past the claim's creation"
    srv.clear_faults()
    restarted = now_ns()
    watchers()
    wait_until(lambda: len(versions(sessions, "ResourceClaim")) == 1, what="the claim recorded after the restart")
    cov = _coverage(sessions, "ResourceClaim")
    synced_before = [(a, b) for state, a, b, _ in cov if state == "synced" and a < cut]
    assert synced_before and max(b for _, b in synced_before) <= cut  # ends at the last contact ...
    assert _state_at(cov, made) == ["stopped"]  # ... the creation is in no 'synced' span
    stopped = [(a, b, reason) for state, a, b, reason in cov if state == "stopped"]
    assert len(stopped) == 1 and stopped[0][0] == max(b for _, b in synced_before) and stopped[0][1] >= restarted
    assert stopped[0][2] == CRASHED_REASON
    # the Pod kind, in contact throughout, is observed until the run's last sign of life
    pods = _coverage(sessions, "Pod")
    assert [s for s, *_ in pods[:2]] == ["synced", "stopped"] and abs(pods[0][2] - alive) < US
    with sessions() as s:
        assert s.get(WatchState, ("test-cluster", "ResourceClaim")).observed_until_ns is None  # consumed
        assert ledger.verify(s).ok


def test_an_outage_that_ended_before_the_crash_leaves_no_gap(srv, sessions, watchers):
    """The outage ended (the watch resumed, its bookmarks first: nothing held back) well before the
    SIGKILL: the kind was in contact again, so it is observed until the run's last sign of life
    (within the read timeout), with no gap and nothing cut at the outage."""
    w = watchers()
    srv.add_fault(Fault(kind="ResourceClaim", verb="any", count=100_000, action="status", code=503))
    srv.close_watches("ResourceClaim")
    cut = now_ns()
    time.sleep(1.0)
    n_watches = len([q for q in watch_requests(srv, "resourceclaims") if q.get("watch") == "true"])
    srv.clear_faults()
    wait_until(lambda: len([q for q in watch_requests(srv, "resourceclaims") if q.get("watch") == "true"]) > n_watches,
               what="the watch resumed")
    recovered = now_ns()
    time.sleep(1.5)  # the resumed watch's bookmarks: in contact again, nothing held back
    with sessions() as s:
        assert s.get(WatchState, ("test-cluster", "ResourceClaim")).observed_until_ns is None  # cleared on recovery
    _kill(w)
    alive = _pod_alive(sessions)
    watchers()
    cov = _coverage(sessions, "ResourceClaim")
    assert gaps(sessions, "ResourceClaim") == []
    assert [s for s, *_ in cov[:2]] == ["synced", "stopped"]
    assert cov[0][1] < cut and cov[0][2] > recovered and alive - cov[0][2] <= 1 * S + US


def _specs(*kinds):
    return {k.kind: k for k in watched_kinds("v1") if k.kind in kinds}


def _set_updated_at(sessions, **last_ns) -> None:
    with sessions() as s, s.begin():
        for kind, last in last_ns.items():
            s.execute(update(WatchState).where(WatchState.kind == kind)
                      .values(updated_at=datetime.fromtimestamp(last / 1e9, timezone.utc)))


def _kill_recorder(rec: Recorder) -> None:
    rec._stop.set()
    rec._thread.join(5)


def test_a_failure_mark_is_committed_once_per_outage_and_cut_the_coverage_after_a_crash(sessions):
    """Recorder level: the reflector reports the loss of contact (once, at the onset) and the return;
    a crash with the mark set ends the kind's 'synced' coverage there, whatever the other kinds did
    after; a mark cleared before the crash cuts nothing."""
    specs = _specs("Pod", "ResourceClaim", "DeviceClass")
    t0 = now_ns() - 600 * S
    first = Recorder(sessions, "test-cluster", silence_bound_s=75)
    first.start()
    for spec in specs.values():
        first.submit_synced(spec, "100", t0)
    lost = t0 + 200 * S
    first.submit_contact_lost(specs["ResourceClaim"], lost)
    first.submit_contact_lost(specs["DeviceClass"], t0 + 210 * S)
    first.submit_contact_lost(specs["DeviceClass"], None)  # back in contact, nothing held back
    assert first.flush()
    _kill_recorder(first)
    alive = t0 + 400 * S
    # every kind's last commit or bookmark: the claim kind's well before the others' (an outage of minutes)
    _set_updated_at(sessions, Pod=alive, ResourceClaim=t0 + 199 * S, DeviceClass=alive - S)
    restart = t0 + 420 * S
    second = Recorder(sessions, "test-cluster", silence_bound_s=75)
    second.start()
    try:
        for spec in specs.values():
            second.submit_synced(spec, "200", restart)
        assert second.flush()
    finally:
        second.stop()
    with sessions() as s:
        rows = s.execute(select(CoverageInterval.kind, CoverageInterval.state, CoverageInterval.started_ns,
                                CoverageInterval.ended_ns).where(CoverageInterval.started_ns < restart)).all()
    observed = {k: b for k, state, a, b in rows if state == "synced"}
    stopped = {k: (a, b) for k, state, a, b in rows if state == "stopped"}
    assert observed["ResourceClaim"] == lost  # not alive - 75 s (the read-timeout bound)
    assert abs(observed["Pod"] - alive) < US and abs(observed["DeviceClass"] - (alive - S)) < US
    assert stopped["ResourceClaim"] == (lost, restart)


def test_a_kind_out_of_contact_through_a_whole_second_run_is_not_covered_by_it(sessions):
    """Run 1 crashes with ResourceClaim 'synced'; run 2 never reaches that kind (its requests fail
    throughout) while Pod commits, and crashes too. Run 3: ResourceClaim is observed until run 1's
    last sign of life for it, not into run 2 (whose Pod commits said the process, not that kind,
    was alive)."""
    specs = _specs("Pod", "ResourceClaim")
    t0 = now_ns() - 900 * S
    first = Recorder(sessions, "test-cluster", silence_bound_s=75)
    first.start()
    for spec in specs.values():
        first.submit_synced(spec, "100", t0)
    assert first.flush()
    _kill_recorder(first)
    run1_alive = t0 + 100 * S
    _set_updated_at(sessions, Pod=run1_alive, ResourceClaim=run1_alive)
    run2 = t0 + 300 * S
    second = Recorder(sessions, "test-cluster", silence_bound_s=75)
    second.start()
    second.submit_synced(specs["Pod"], "200", run2)
    second.submit_resume_point(specs["Pod"], "201")  # run 2's Pod bookmarks: updated_at now
    assert second.flush()
    _kill_recorder(second)
    run3 = now_ns()
    third = Recorder(sessions, "test-cluster", silence_bound_s=75)
    third.start()
    try:
        for spec in specs.values():
            third.submit_synced(spec, "300", run3)
        assert third.flush()
    finally:
        third.stop()
    cov = _coverage(sessions, "ResourceClaim")
    assert [(s, a) for s, a, b, _ in cov[:2]] == [("synced", t0), ("stopped", cov[0][2])]
    assert abs(cov[0][2] - run1_alive) < US and cov[1][2] == run3
