"""Watcher scenarios (issue: lossless list-watch), each against our fake API server over real HTTP
through the official kubernetes client, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math
import time

import pytest
from sqlalchemy import func, select

from collector.kube import reflector as reflector_module
from collector.sim import Fault
from collector.store import ledger
from collector.store.models import CoverageInterval, ObjectVersion
from tests.watch_support import (FAST, claim, device_class, gaps, gpu_slice, pod, quarantined, resume_rv, start_watcher,
                                 stored_raw, versions, wait_until, watch_requests)


@pytest.fixture
def watcher_factory(srv, sessions):
    started = []

    def make(**kw):
        w = start_watcher(srv, sessions, **kw)
        started.append(w)
        return w

    yield make
    for w in started:
        w.stop(timeout_s=5)


def _synced(watcher):
    assert watcher.wait_synced(15), "watcher did not sync"


def test_initial_list_then_live_events_recorded_once(srv, sessions, watcher_factory):
    srv.apply(device_class())
    srv.apply(claim("fraud-gpu"))
    w = watcher_factory()
    _synced(w)
    c = srv.apply({**srv.get("ResourceClaim", "fraud-gpu", "risk-inference"), "metadata": {
        **srv.get("ResourceClaim", "fraud-gpu", "risk-inference")["metadata"], "labels": {"tier": "gold"}}})
    wait_until(lambda: len(versions(sessions, "ResourceClaim")) == 2, what="MODIFIED stored")
    assert versions(sessions, "ResourceClaim") == [("fraud-gpu", versions(sessions, "ResourceClaim")[0][1], "ADDED"),
                                                   ("fraud-gpu", c["metadata"]["resourceVersion"], "MODIFIED")]
    wait_until(lambda: resume_rv(sessions, "ResourceClaim") == c["metadata"]["resourceVersion"], what="resume point")
    with sessions() as s:
        assert ledger.verify(s).ok


def test_pods_without_claims_are_recorded_too(srv, sessions, watcher_factory):
    """Every pod: one without claims proves its transactions held no GPU (``no-claim``)."""
    srv.apply(pod("web-1", namespace="frontend", claim_name=None))
    srv.apply(pod("fraud-1"))
    w = watcher_factory()
    _synced(w)
    assert sorted(v[0] for v in versions(sessions, "Pod")) == ["fraud-1", "web-1"]


def test_1_silent_connection_detected_and_resumed(srv, sessions, watcher_factory):
    w = watcher_factory()
    _synced(w)
    before = srv.current_rv
    srv.add_fault(Fault(kind="ResourceClaim", verb="watch", action="stall", seconds=30))
    # Force a new watch so the stall applies: close the open streams cleanly.
    srv.close_watches()
    wait_until(lambda: not srv.pending_faults(), what="the fault taken by the next watch")
    created = [srv.apply(claim(f"c{i}")) for i in range(3)]
    wait_until(lambda: len(versions(sessions, "ResourceClaim")) == 3, timeout_s=15, what="changes after the stall")
    assert sorted(v[1] for v in versions(sessions, "ResourceClaim")) == sorted(c["metadata"]["resourceVersion"] for c in created)
    watches = [q for q in watch_requests(srv, "resourceclaims") if q.get("watch") == "true"]
    assert all(q.get("resourceVersion") for q in watches), "every watch carries a resourceVersion"
    lists = [q for q in watch_requests(srv, "resourceclaims") if q.get("watch") != "true"]
    assert len(lists) <= 2  # the initial list (paged) ...
    assert int(watches[-1]["resourceVersion"]) >= before


def _ns(dt) -> int:
    return int(dt.timestamp()) * 1_000_000_000 + dt.microsecond * 1000


def _stall_claim_watch(srv) -> None:
    """The next ResourceClaim watch sends its headers, then nothing (a half-open connection)."""
    srv.add_fault(Fault(kind="ResourceClaim", verb="watch", action="stall", seconds=30))
    srv.close_watches()
    wait_until(lambda: not srv.pending_faults(), what="the fault taken by the next watch")


def _claim_gap_and_observed(sessions, n: int):
    """Once ``n`` claims are stored and the ResourceClaim gap closed: the gap, and the claims' observed times (ns)."""
    wait_until(lambda: len(versions(sessions, "ResourceClaim")) == n, timeout_s=20, what="the held-back claims")
    wait_until(lambda: [g for g in gaps(sessions, "ResourceClaim") if g.ended_ns], what="the gap closed")
    (gap,) = gaps(sessions, "ResourceClaim")
    with sessions() as s:
        observed = [_ns(t) for t in s.execute(select(ObjectVersion.observed_at).where(ObjectVersion.kind == "ResourceClaim"))
                    .scalars()]
    return gap, observed


def test_1b_changes_a_silent_stream_held_back_are_a_coverage_gap(srv, sessions, watcher_factory):
    """A half-open connection (headers, then nothing): the claims made meanwhile reach the store only
    when the read timeout has fired and the watch is resumed, observed then — seconds after they
    were made. The span from the stream's last contact until they are recorded is a gap: a
    transaction in it cannot be told the claims' state (the breaker's `exact` on a replaced GPU)."""
    w = watcher_factory()
    _synced(w)
    _stall_claim_watch(srv)
    stalled = time.time_ns()
    time.sleep(0.2)
    made = time.time_ns()
    for i in range(2):
        srv.apply(claim(f"late{i}"))
    gap, observed = _claim_gap_and_observed(sessions, 2)
    assert gap.started_ns <= stalled < made  # from the stalled stream's last contact (its headers) ...
    assert min(observed) - made >= 700_000_000  # ... while the claims arrived a read timeout late ...
    assert max(observed) <= gap.ended_ns  # ... until they were in
    assert "silent" in gap.reason and gaps(sessions, "Pod") == []
    wait_until(lambda: w.readiness().ready, what="ready again after the gap")


@pytest.mark.parametrize("failure", [dict(action="status", code=500), dict(action="status", code=503),
                                     dict(action="reset_before_headers")], ids=["500", "503", "reset"])
def test_1e_changes_made_while_requests_failed_are_a_coverage_gap(srv, sessions, watcher_factory, failure):
    """A DRA breaker's finding: the API server answering 5xx (or resetting connections) for seconds
    while claims change, then answering again: the watch resumes from its resourceVersion and the
    server replays the changes at once — recorded when they arrive, made at some time since the last
    contact. That span was "synced" (only a read timeout opened such a gap), and a transaction in it
    was attributed exact to the GPU its claim had left. It is a gap now, from the last contact until
    the replayed changes are in; an outage during which nothing changed is none (test_1f)."""
    w = watcher_factory()
    _synced(w)
    srv.add_fault(Fault(kind="ResourceClaim", verb="any", count=100_000, **failure))
    srv.close_watches("ResourceClaim")
    cut = time.time_ns()
    time.sleep(0.5)
    made = time.time_ns()
    for i in range(2):
        srv.apply(claim(f"during{i}"))
    time.sleep(1.0)
    srv.clear_faults()
    gap, observed = _claim_gap_and_observed(sessions, 2)
    assert gap.started_ns <= cut < made  # from the last contact before the failures ...
    assert min(observed) - made >= 500_000_000  # ... the claims arriving when the server answered again ...
    assert max(observed) <= gap.ended_ns  # ... until they were in
    assert gap.reason.startswith("requests to the API server failed (") and "delivered late" in gap.reason
    assert gaps(sessions, "Pod") == []
    wait_until(lambda: w.readiness().ready, what="ready again after the gap")


def test_1g_a_stop_during_a_short_outage_ends_the_coverage_at_the_last_contact(srv, sessions, watcher_factory):
    """A final breaker's finding: stopped 2 s into a 503 outage (under the 10 s after which the API
    server counts as unreachable), the run's "synced" coverage reached the stop, over a claim created
    during the outage that it never saw. It ends at the last contact now."""
    w = watcher_factory()
    _synced(w)
    srv.add_fault(Fault(kind="ResourceClaim", verb="any", count=100_000, action="status", code=503))
    srv.close_watches("ResourceClaim")
    time.sleep(0.5)
    made = time.time_ns()
    srv.apply(claim("during"))
    time.sleep(2.0)
    w.stop(timeout_s=5)
    with sessions() as s:
        synced = s.execute(select(CoverageInterval).where(CoverageInterval.kind == "ResourceClaim",
                                                          CoverageInterval.state == "synced")).scalars().all()
    assert synced and all(i.ended_ns is not None and i.ended_ns <= made for i in synced)


def test_1f_an_outage_during_which_nothing_changed_is_no_gap(srv, sessions, watcher_factory):
    w = watcher_factory()
    _synced(w)
    srv.add_fault(Fault(kind="ResourceClaim", verb="any", count=100_000, action="status", code=503))
    srv.close_watches("ResourceClaim")
    time.sleep(1.0)
    srv.clear_faults()
    _a_claim_after_the_watch_resumed_opens_no_gap(srv, sessions)


def test_1d_a_replay_longer_than_one_read_stays_inside_the_gap(srv, sessions, watcher_factory):
    """80 claims of ~2 kB held back: the replay spans several 64 KiB reads; the gap closed after the
    first one left most of them recorded after it (the final tester's finding)."""
    w = watcher_factory()
    _synced(w)
    _stall_claim_watch(srv)
    for i in range(80):
        srv.apply(claim(f"big{i}", annotations={"bank.example/note": "x" * 2000}))
    gap, observed = _claim_gap_and_observed(sessions, 80)
    assert max(observed) <= gap.ended_ns


def test_1c_a_silent_stream_that_held_nothing_back_is_no_gap(srv, sessions, watcher_factory):
    w = watcher_factory()
    _synced(w)
    _stall_claim_watch(srv)
    _a_claim_after_the_watch_resumed_opens_no_gap(srv, sessions)


def _a_claim_after_the_watch_resumed_opens_no_gap(srv, sessions) -> None:
    """Once the next ResourceClaim watch is open and its bookmarks came first (nothing held back), a
    claim made then is live: stored, and no gap."""
    watches = len([q for q in watch_requests(srv, "resourceclaims") if q.get("watch") == "true"])
    wait_until(lambda: len([q for q in watch_requests(srv, "resourceclaims") if q.get("watch") == "true"]) > watches,
               what="the watch resumed")
    time.sleep(1.5)  # the resumed watch's bookmarks came first: nothing was held back
    srv.apply(claim("live"))
    wait_until(lambda: len(versions(sessions, "ResourceClaim")) == 1, what="the claim")
    assert gaps(sessions) == []


def test_2_stream_cut_mid_event_keeps_complete_events_once(srv, sessions, watcher_factory):
    w = watcher_factory()
    _synced(w)
    lists_before = len([q for q in watch_requests(srv, "resourceclaims") if q.get("watch") != "true"])
    srv.add_fault(Fault(kind="ResourceClaim", verb="watch", action="cut_mid_event", after_events=2))
    srv.close_watches()
    wait_until(lambda: not srv.pending_faults(), what="the fault taken by the next watch")
    created = [srv.apply(claim(f"cut{i}")) for i in range(3)]
    wait_until(lambda: len(versions(sessions, "ResourceClaim")) == 3, timeout_s=15, what="all three claims")
    assert sorted(v[1] for v in versions(sessions, "ResourceClaim")) == sorted(c["metadata"]["resourceVersion"] for c in created)
    lists_after = len([q for q in watch_requests(srv, "resourceclaims") if q.get("watch") != "true"])
    assert lists_after == lists_before, "a cut stream is resumed, not relisted"
    watches = [q for q in watch_requests(srv, "resourceclaims") if q.get("watch") == "true"]
    assert watches[-1]["resourceVersion"] == created[1]["metadata"]["resourceVersion"]


def test_3_multibyte_character_split_across_chunks(srv, sessions, watcher_factory):
    w = watcher_factory()
    _synced(w)
    text = "Überweisung – 取引 😀 prüfen"
    srv.add_fault(Fault(kind="ResourceClaim", verb="watch", action="split_utf8"))
    srv.close_watches()
    wait_until(lambda: not srv.pending_faults(), what="the fault taken by the next watch")
    srv.apply(claim("utf8", annotations={"bank.example/purpose": text}))
    wait_until(lambda: stored_raw(sessions, "ResourceClaim", "utf8"), what="claim stored")
    assert stored_raw(sessions, "ResourceClaim", "utf8")[0]["metadata"]["annotations"]["bank.example/purpose"] == text


def test_4_bookmark_moves_resume_point_after_rows(srv, sessions, watcher_factory):
    w = watcher_factory()
    _synced(w)
    c = srv.apply(claim("bm"))
    srv.bump_rv(5)  # writes elsewhere: only a bookmark can move the claim watch's resume point here
    target = str(srv.current_rv)

    def stored():
        srv.send_bookmark("ResourceClaim")  # again at each poll: the watch may be reconnecting
        return resume_rv(sessions, "ResourceClaim") == target

    wait_until(stored, interval_s=0.05, what="bookmark RV stored")
    assert ("bm", c["metadata"]["resourceVersion"], "ADDED") in versions(sessions, "ResourceClaim")


def test_5_never_resumes_from_synthetic_added(srv, sessions, watcher_factory):
    for i in range(5):
        srv.apply(claim(f"pre{i}"))
    w = watcher_factory()
    _synced(w)
    reqs = watch_requests(srv, "resourceclaims")
    assert reqs[0].get("watch") != "true", "the reflector lists first"
    assert all(q.get("resourceVersion") for q in reqs if q.get("watch") == "true")
    list_rv = str(srv.current_rv)
    assert resume_rv(sessions, "ResourceClaim") == list_rv


def test_6_restart_after_compaction_relists_with_inferred_changes_and_one_gap(srv, sessions, watcher_factory):
    keep = srv.apply(claim("keep"))
    gone = srv.apply(claim("gone"))
    w = watcher_factory()
    _synced(w)
    w.stop()
    modified = srv.apply({**keep, "metadata": {**keep["metadata"], "labels": {"changed": "yes"}}})
    srv.delete("ResourceClaim", "gone", "risk-inference")
    new = srv.apply(claim("new"))
    srv.compact()
    w2 = watcher_factory()
    _synced(w2)
    rows = versions(sessions, "ResourceClaim")
    assert ("keep", modified["metadata"]["resourceVersion"], "RELIST_MODIFIED") in rows
    assert ("gone", gone["metadata"]["resourceVersion"], "RELIST_DELETED") in rows
    assert ("new", new["metadata"]["resourceVersion"], "RELIST_ADDED") in rows
    last_gone = stored_raw(sessions, "ResourceClaim", "gone")[-1]
    assert last_gone["metadata"]["resourceVersion"] == gone["metadata"]["resourceVersion"]  # last known state
    g = gaps(sessions, "ResourceClaim")
    assert len(g) == 1 and g[0].to_rv is not None and g[0].from_rv is not None
    assert int(g[0].from_rv) < int(g[0].to_rv)


def test_6b_restart_within_history_gets_exact_events_and_no_gap(srv, sessions, watcher_factory):
    keep = srv.apply(claim("keep"))
    srv.apply(claim("gone"))
    w = watcher_factory()
    _synced(w)
    w.stop()
    modified = srv.apply({**keep, "metadata": {**keep["metadata"], "labels": {"changed": "yes"}}})
    srv.delete("ResourceClaim", "gone", "risk-inference")
    new = srv.apply(claim("new"))
    w2 = watcher_factory()
    wait_until(lambda: len(versions(sessions, "ResourceClaim")) == 5, what="exact events replayed")
    rows = versions(sessions, "ResourceClaim")
    assert [r[2] for r in rows[2:]] == ["MODIFIED", "DELETED", "ADDED"]
    assert rows[2][1] == modified["metadata"]["resourceVersion"] and rows[4][1] == new["metadata"]["resourceVersion"]
    assert gaps(sessions) == []
    w2.stop()
    # The time between the clean stop and the restart is recorded as the collector not running, per
    # kind, from where the first run's synced interval ended to where the second run's began (without
    # it a pack called that time "unobserved", as before the first start).
    with sessions() as s:
        rows = s.execute(select(CoverageInterval).where(CoverageInterval.kind == "ResourceClaim")
                         .order_by(CoverageInterval.started_ns, CoverageInterval.id)).scalars().all()
    assert [r.state for r in rows] == ["synced", "stopped", "synced"]
    assert rows[0].ended_ns == rows[1].started_ns and rows[1].ended_ns == rows[2].started_ns
    assert rows[1].reason == "collector stopped: not watching" and rows[1].ended_ns > rows[1].started_ns


def test_7_410_on_resume_relists_after_at_most_one_watch(srv, sessions, watcher_factory):
    w = watcher_factory()
    _synced(w)
    n_before = len(watch_requests(srv, "resourceclaims"))
    srv.add_fault(Fault(kind="ResourceClaim", verb="watch", action="error_event"))
    srv.close_watches()
    wait_until(lambda: len([q for q in watch_requests(srv, "resourceclaims")[n_before:] if q.get("watch") != "true"]) >= 1,
               what="relist after 410")
    after = watch_requests(srv, "resourceclaims")[n_before:]
    first_list = next(i for i, q in enumerate(after) if q.get("watch") != "true")
    assert first_list <= 1, f"a LIST follows after at most one extra WATCH: {after}"
    assert all(q.get("resourceVersion") for q in after if q.get("watch") == "true")
    with sessions() as s:
        assert s.execute(select(func.count()).select_from(ObjectVersion).where(ObjectVersion.kind == "Status")).scalar_one() == 0
    assert all(v[2] != "ERROR" for v in versions(sessions))


def test_8_resets_then_503_then_success_backs_off_and_is_not_ready(srv, sessions, watcher_factory):
    srv.add_fault(Fault(kind="DeviceClass", verb="list", action="reset_before_headers", count=2))
    srv.add_fault(Fault(kind="DeviceClass", verb="list", action="status", code=503, count=4))
    srv.apply(device_class())
    w = watcher_factory()
    time.sleep(0.05)
    assert not w.readiness().ready
    _synced(w)
    assert w.readiness().ready
    lists = [r.at for r in srv.requests if r.path.endswith("/deviceclasses") and r.query.get("watch") != "true"]
    assert len(lists) >= 7  # 2 resets (retried inside urllib3), 4 × 503 (our backoff), then success
    delays = [b - a for a, b in zip(lists[2:], lists[3:7])]
    # Half-jitter backoff: attempt n waits within [cap_n / 2, cap_n], cap doubling from 0.05 s. Only
    # the lower bounds are checked: on a loaded machine any wait may run long (a CI run saw the first
    # at 0.63 s), never short, so each wait is at least half its doubled cap — the 4th at least 0.2 s.
    assert all(d >= 0.05 * 2 ** n / 2 * 0.98 for n, d in enumerate(delays)) and delays[3] >= 0.2, \
        f"delays grow: {delays}"
    assert [v[0] for v in versions(sessions, "DeviceClass")] == ["gpu.nvidia.com"]


def test_api_server_down_makes_the_watcher_unready_and_coverage_ends_at_the_last_contact(srv, sessions):
    # The API server goes away while the collector runs: after the grace period /readyz says so
    # (with the last contact) and the synced gauge drops; a stop while it is still away closes the
    # synced intervals at the last contact, not at the stop (nothing after it was observed).
    import dataclasses

    from collector.store.models import CoverageInterval
    from collector.timeutil import now_ns
    srv.apply(device_class())
    w = start_watcher(srv, sessions, settings=dataclasses.replace(FAST, unreachable_grace_s=0.5))
    try:
        _synced(w)
        assert w.readiness().ready
        before_down = now_ns()
        srv.stop()
        down = now_ns()
        # each kind notices on its own schedule (its next request): wait for every one of them
        wait_until(lambda: len([r for r in w.readiness().reasons if ": API server unreachable since 20" in r]) == 4,
                   timeout_s=10, what="every kind unreachable")
        assert not w.readiness().ready
        assert w.metrics.synced.labels("DeviceClass")._value.get() == 0
        time.sleep(1.0)
    finally:
        stopped = now_ns()
        w.stop()
    with sessions() as s:
        ends = {c.kind: c.ended_ns for c in s.execute(select(CoverageInterval).where(CoverageInterval.state == "synced"))
                .scalars()}
    assert set(ends) == {"DeviceClass", "ResourceClaim", "ResourceSlice", "Pod"}
    # last contact: an idle watch reconnects every read timeout (1 s here), so within 1.5 s before the
    # server stopped; bytes it sent while closing may be read a moment later (a loaded machine), but
    # never near the watcher's stop, ≥ 1 s after
    assert stopped - down >= 1.0e9
    assert all(before_down - 1.5e9 <= end <= down + 0.5e9 for end in ends.values()), (before_down, down, ends, stopped)


def test_9_field_selector_watch_with_first_event_410_recovers(srv, sessions):
    from collector.kube.client import make_api_client
    from collector.kube.discovery import watched_kinds
    from collector.kube.recorder import Recorder
    from collector.kube.reflector import Reflector
    import threading

    spec = next(k for k in watched_kinds("v1") if k.kind == "ResourceSlice")
    srv.apply(gpu_slice("gpu-node-a", [("gpu-0", "GPU-6f1d1e2a-0000-4000-8000-00000000000a")]))
    recorder = Recorder(sessions, "test-cluster")
    recorder.start()
    r = Reflector(spec, make_api_client(host=srv.url), recorder, FAST, field_selector="spec.driver=gpu.nvidia.com")
    srv.add_fault(Fault(kind="ResourceSlice", verb="watch", action="error_event"))
    t = threading.Thread(target=r.run, daemon=True)
    t.start()
    try:
        wait_until(lambda: r.synced.is_set(), what="slice reflector synced")
        srv.apply(gpu_slice("gpu-node-b", [("gpu-0", "GPU-6f1d1e2a-0000-4000-8000-00000000000b")]))
        wait_until(lambda: len(versions(sessions, "ResourceSlice")) == 2, what="second slice")
        assert all(q.get("fieldSelector") == "spec.driver=gpu.nvidia.com" for q in watch_requests(srv, "resourceslices"))
        assert t.is_alive()
    finally:
        r.stop()
        t.join(5)
        recorder.stop()


def test_10_in_flight_added_still_gets_inferred_deleted(srv, sessions):
    import threading

    from collector.kube.client import make_api_client
    from collector.kube.discovery import watched_kinds
    from collector.kube.recorder import Recorder
    from collector.kube.reflector import Reflector

    gate = threading.Event()
    gate.set()
    spec = next(k for k in watched_kinds("v1") if k.kind == "ResourceClaim")
    recorder = Recorder(sessions, "test-cluster", fence=lambda: gate.wait(30))
    recorder.start()
    r = Reflector(spec, make_api_client(host=srv.url), recorder, FAST)
    t = threading.Thread(target=r.run, daemon=True)
    t.start()
    try:
        wait_until(lambda: r.synced.is_set(), what="synced")
        assert recorder.flush(5)
        gate.clear()  # commits now hang: the next ADDED stays in flight
        srv.apply(claim("flighty"))
        wait_until(lambda: "flighty" in {k.raw["metadata"]["name"] for k in r.known.values()}, what="ADDED received")
        srv.delete("ResourceClaim", "flighty", "risk-inference")
        srv.compact()
        srv.restart()
        wait_until(lambda: not r.in_gap and r.synced.is_set() and r.known == {}, timeout_s=10, what="relisted")
        gate.set()
        assert recorder.flush(10)
        assert [v[2] for v in versions(sessions, "ResourceClaim", "flighty")] == ["ADDED", "RELIST_DELETED"]
    finally:
        gate.set()
        r.stop()
        t.join(5)
        recorder.stop()


def test_11_invalid_json_and_wrongly_typed_object_quarantined_once(srv, sessions, watcher_factory):
    w = watcher_factory()
    _synced(w)
    bad_slice = gpu_slice("gpu-node-z", [("gpu-0", "GPU-bad")])
    bad_slice["metadata"].update({"uid": "0e6c-bad", "resourceVersion": str(srv.current_rv + 1)})
    bad_slice["spec"]["pool"]["resourceSliceCount"] = "1"
    import json

    srv.add_fault(Fault(kind="ResourceSlice", verb="watch", action="inject_line", raw=b'{"type":"ADDED","object":{"kind":'))
    srv.add_fault(Fault(kind="ResourceSlice", verb="watch", action="inject_line",
                        raw=json.dumps({"type": "ADDED", "object": bad_slice}).encode()))
    srv.close_watches()
    wait_until(lambda: not srv.pending_faults(), what="the fault taken by the next watch")
    good = srv.apply(gpu_slice("gpu-node-a", [("gpu-0", "GPU-good")]))
    wait_until(lambda: len(versions(sessions, "ResourceSlice")) == 1, what="good slice after the bad lines")
    wait_until(lambda: len(quarantined(sessions)) == 2, what="two quarantined lines")
    reasons = [q.reason for q in quarantined(sessions)]
    assert "not a valid event" in reasons[0] and "resourceSliceCount" in reasons[1]
    assert quarantined(sessions)[1].raw_text.count("GPU-bad") == 1
    srv.restart()  # reconnect: the bad lines must not come back
    srv.apply(gpu_slice("gpu-node-b", [("gpu-0", "GPU-good-2")]))
    wait_until(lambda: len(versions(sessions, "ResourceSlice")) == 2, what="watch continues")
    assert len(quarantined(sessions)) == 2
    assert versions(sessions, "ResourceSlice")[0][1] == good["metadata"]["resourceVersion"]


def test_client_models_reject_wrong_types_for_every_kind():
    from collector.kube.discovery import watched_kinds
    from collector.watcher import client_model, model_validator

    for version in ("v1", "v1beta2", "v1beta1"):
        assert all(client_model(spec) for spec in watched_kinds(version))
    samples = {"DeviceClass": device_class(), "ResourceSlice": gpu_slice("gpu-node-a", [("gpu-0", "GPU-1")]),
               "ResourceClaim": claim("c"), "Pod": pod("p")}
    for spec in watched_kinds("v1"):
        good = samples[spec.kind]
        good["metadata"].update({"uid": "0b1c", "resourceVersion": "7"})
        model_validator(spec, good)
        bad = {**good, "metadata": {**good["metadata"], "generation": "not-a-number"}}
        with pytest.raises(Exception, match="generation"):
            model_validator(spec, bad)


def test_fields_unknown_to_the_client_are_accepted_for_every_kind():
    # A newer API server (or an alpha feature gate) adds fields this client version does not know:
    # the objects must still be recorded, not quarantined.
    from collector.kube.discovery import watched_kinds
    from collector.watcher import model_validator

    samples = {"DeviceClass": device_class(), "ResourceSlice": gpu_slice("gpu-node-a", [("gpu-0", "GPU-1")]),
               "ResourceClaim": claim("c"), "Pod": pod("p")}
    for spec in watched_kinds("v1"):
        obj = samples[spec.kind]
        obj["metadata"]["futureMetadataField"] = {"x": 1}
        obj["spec"]["futureSpecField"] = ["a"]
        model_validator(spec, {**obj, "futureTopLevel": True})


def test_an_object_with_new_api_fields_is_recorded_through_the_watch(srv, sessions, watcher_factory):
    w = watcher_factory()
    _synced(w)
    newer = gpu_slice("gpu-node-n", [("gpu-0", "GPU-newer")])
    newer["spec"]["devices"][0]["bindingConditions"] = ["dra.example.com/is-prepared"]  # not in this client
    newer["spec"]["perDeviceNodeSelection"] = False
    newer["spec"]["futureField"] = {"enabled": True}
    srv.apply(newer)
    wait_until(lambda: len(versions(sessions, "ResourceSlice")) == 1, what="the newer slice recorded")
    assert quarantined(sessions) == []


def test_malformed_pods_are_quarantined_with_or_without_claims(srv, sessions, watcher_factory):
    w = watcher_factory()
    _synced(w)
    plain = pod("batch-job", claim_name=None)
    plain["spec"]["priority"] = "high"  # wrongly typed (an integer field)
    dra = pod("risk-api-0")
    dra["spec"]["priority"] = "high"
    srv.apply(plain)
    srv.apply(dra)
    srv.apply(pod("risk-api-1"))
    wait_until(lambda: len(versions(sessions, "Pod")) == 1, what="the well-formed pod")
    wait_until(lambda: len(quarantined(sessions)) == 2, what="both malformed pods quarantined")
    texts = " ".join(q.raw_text for q in quarantined(sessions))
    assert "batch-job" in texts and "risk-api-0" in texts
    assert versions(sessions, "Pod")[0][0] == "risk-api-1"


def test_integers_beyond_64_bits_in_opaque_driver_data_are_stored_exactly(srv, sessions, watcher_factory):
    # AllocatedDeviceStatus.data is arbitrary driver JSON: nothing bounds its integers.
    w = watcher_factory()
    _synced(w)
    big = 123456789012345678901234567890
    c = claim("opaque")
    c["status"] = {"devices": [{"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0",
                                "data": {"serial": big, "temperature": 41.5}}]}
    srv.apply(c)
    wait_until(lambda: len(versions(sessions, "ResourceClaim", "opaque")) == 1, what="the claim recorded")
    with sessions() as s:
        raw = s.execute(select(ObjectVersion.raw).where(ObjectVersion.name == "opaque")).scalar_one()
        assert raw["status"]["devices"][0]["data"] == {"serial": big, "temperature": 41.5}
        assert ledger.verify(s).ok


@pytest.mark.parametrize("line", [
    b'{"type":"ADDED","object":{"metadata":{"name":"caf\xc3\xa9","resourceVersion":"7"}}}',
    b'{"type":"ADDED","object":{"spec":{"n":123456789012345678901234567890}}}',  # beyond 64 bits
    b'{"type":"ADDED","object":{"spec":{"s":"\\ud800"}}}',  # a lone surrogate: only the stdlib takes it
])
def test_watch_lines_decode_as_the_standard_library_decodes_them(line):
    assert reflector_module._loads(line) == json.loads(line.decode("utf-8"))


def test_a_nan_in_a_watch_line_decodes_as_the_standard_library_takes_it():
    assert math.isnan(reflector_module._loads(b'{"type":"ADDED","object":{"x":NaN}}')["object"]["x"])


@pytest.mark.parametrize("line", [b'{"type":"ADDED","object":', b'{"type":"ADDED","object":{"a":"\xff"}}'])
def test_watch_lines_that_are_not_json_or_not_utf8_are_refused(line):
    with pytest.raises(ValueError):  # UnicodeDecodeError is a ValueError
        reflector_module._loads(line)


def test_replayed_versions_in_a_batch_are_stored_once_with_no_ledger_entry(sessions):
    # The same (uid, resourceVersion, event type) delivered again — alone, and inside a batch with
    # new versions — is absorbed: one row, one ledger entry; the new versions of the batch are stored.
    from collector.kube.discovery import watched_kinds
    from collector.kube.recorder import Recorder
    from collector.kube.reflector import ObservedEvent

    spec = next(k for k in watched_kinds("v1") if k.kind == "ResourceClaim")

    def event(name: str, rv: int) -> ObservedEvent:
        obj = claim(name)
        obj["metadata"].update({"uid": f"uid-{name}", "resourceVersion": str(rv)})
        return ObservedEvent("ADDED", obj, time.time_ns())

    recorder = Recorder(sessions, "test-cluster")
    recorder.start()
    try:
        recorder.submit_events(spec, [event("a", 10), event("b", 11)], "11")
        assert recorder.flush(10)
        recorder.submit_events(spec, [event("b", 11), event("c", 12), event("a", 10), event("d", 13)], "13")
        assert recorder.flush(10)
        recorder.submit_events(spec, [event("d", 13)], "13")
        assert recorder.flush(10)
    finally:
        recorder.stop()
    assert versions(sessions, "ResourceClaim") == [("a", "10", "ADDED"), ("b", "11", "ADDED"), ("c", "12", "ADDED"),
                                                   ("d", "13", "ADDED")]
    with sessions() as s:
        entries = s.execute(select(func.count()).select_from(ledger.LedgerEntry)
                            .where(ledger.LedgerEntry.table_name == "object_versions")).scalar_one()
        assert entries == 4
        assert ledger.verify(s).ok


def test_api_server_unreachable_at_start_is_retried_until_it_answers(srv, sessions):
    # Scenario 8 at start-up: discovery itself fails (reset before headers, then 503); the watcher
    # keeps trying, not ready meanwhile and saying why, then records normally.
    srv.apply(claim("early"))
    srv.add_fault(Fault(kind="discovery", verb="get", action="reset_before_headers", count=2))
    srv.add_fault(Fault(kind="discovery", verb="get", action="status", code=503, count=2))
    w = start_watcher(srv, sessions)
    try:
        verdict = w.readiness()
        assert not verdict.ready and any("API discovery" in r for r in verdict.reasons), verdict.reasons
        wait_until(lambda: w.readiness().ready, timeout_s=30, what="ready once discovery answers")
        wait_until(lambda: [v[0] for v in versions(sessions, "ResourceClaim")] == ["early"], what="the claim recorded")
        assert not srv.pending_faults()
    finally:
        w.stop()


def test_a_cluster_without_dra_is_a_clear_error_at_start(srv, sessions):
    from collector.errors import UserError

    srv.add_fault(Fault(kind="discovery", verb="get", action="status", code=404))
    with pytest.raises(UserError, match="does not serve resource.k8s.io"):
        start_watcher(srv, sessions)


@pytest.mark.parametrize("content,expected", [("garbage: [\n", "line 2"), ("- a\n- b\n", "cannot configure"),
                                              ("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n", "current-context")])
def test_a_broken_kubeconfig_is_a_one_line_error_naming_the_file(tmp_path, content, expected):
    from collector.errors import UserError
    from collector.kube.client import make_api_client

    path = tmp_path / "kubeconfig"
    path.write_text(content)
    with pytest.raises(UserError, match=expected) as err:
        make_api_client(kubeconfig=str(path))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_kind_listed_again_while_synced_in_one_run_is_not_called_a_crash(sessions):
    """The crash rule (a kind left 'synced' by the previous run: 'collector not running' from that
    run's last sign of life) applies to a run's first synced state only: listed again in the same
    run, a synced kind just starts a new synced interval, with nothing called not running."""
    from collector.kube.discovery import watched_kinds
    from collector.kube.recorder import Recorder

    from collector.timeutil import now_ns

    spec = next(k for k in watched_kinds("v1") if k.kind == "DeviceClass")
    t1 = now_ns()
    t2, t3 = t1 + 60 * 10**9, t1 + 120 * 10**9  # the second list a minute after the row's last commit
    recorder = Recorder(sessions, "test-cluster")
    recorder.start()
    try:
        recorder.submit_synced(spec, "100", t1)
        assert recorder.flush()
        recorder.submit_synced(spec, "200", t2)
        assert recorder.flush()
    finally:
        recorder.stop(observed_until_ns={"DeviceClass": t3})
    with sessions() as s:
        rows = s.execute(select(CoverageInterval.state, CoverageInterval.started_ns, CoverageInterval.ended_ns)
                         .order_by(CoverageInterval.started_ns)).all()
    assert rows[:2] == [("synced", t1, t2), ("synced", t2, rows[1][2])] and "stopped" not in {r[0] for r in rows}


def test_after_a_crash_a_kind_is_observed_until_its_own_last_contact_within_the_read_timeout(sessions):
    """A run killed while one stream was silent (a half-open claim watch, seconds before SIGKILL): the
    claims made then reach the store at the restart. That kind is observed until its own last
    commit or bookmark — not until the other streams' last commit (the attribution breaker's
    crash variant: ``exact`` and a false ``no-allocation`` in the silence) — and a quiet kind whose
    last contact is older than the read timeout loses only that much (``Recorder.silence_bound_s``)."""
    from datetime import datetime, timezone

    from sqlalchemy import update

    from collector.kube.discovery import watched_kinds
    from collector.kube.recorder import Recorder
    from collector.store.models import WatchState
    from collector.timeutil import now_ns

    specs = {k.kind: k for k in watched_kinds("v1") if k.kind in ("Pod", "ResourceClaim", "DeviceClass")}
    s_ = 10**9
    t0 = now_ns() - 600 * s_
    alive, deaf, quiet = t0 + 400 * s_, t0 + 390 * s_, t0 + 100 * s_  # last contacts of Pod, ResourceClaim, DeviceClass
    first = Recorder(sessions, "test-cluster", silence_bound_s=75)
    first.start()
    for spec in specs.values():
        first.submit_synced(spec, "100", t0)
    assert first.flush()
    first._stop.set()  # killed: no clean stop closes the intervals
    first._thread.join(5)
    with sessions() as s, s.begin():
        for kind, last in (("Pod", alive), ("ResourceClaim", deaf), ("DeviceClass", quiet)):
            s.execute(update(WatchState).where(WatchState.kind == kind)
                      .values(updated_at=datetime.fromtimestamp(last / 1e9, timezone.utc)))
    restart = t0 + 420 * s_
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
    observed = {k: (a, b) for k, state, a, b in rows if state == "synced"}
    stopped = {k: (a, b) for k, state, a, b in rows if state == "stopped"}
    us = 1000  # updated_at is stored to the microsecond
    assert abs(observed["Pod"][1] - alive) < us and abs(observed["ResourceClaim"][1] - deaf) < us
    assert abs(observed["DeviceClass"][1] - (alive - 75 * s_)) < us  # older than the bound: the bound
    assert {k: b for k, (a, b) in stopped.items()} == {k: restart for k in specs}
