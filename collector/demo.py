"""``draudit demo``: the fraud-scoring story end to end, on the embedded defaults.

A fake Kubernetes API server (``collector.sim``) plays the scenario of ``collector.demo_scenario``
in real time on a loopback port; the real watcher records it through the official ``kubernetes``
client; the scored-transaction logs are ingested (Fluent Bit lines from a file, OTLP/JSON over
HTTP to the real ``/v1/logs`` endpoint); attribution, the Rego policies (embedded regorus engine),
the evidence pack and its offline verification follow — the same code paths as production.

Nothing is shared with a real installation: the demo writes only into its output directory
(SQLite database, logs, keys, pack).
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import urllib3
from sqlalchemy import func, select

from collector.errors import UserError
from collector.settings import Settings, load_settings
from collector.store import migrate
from collector.store.db import make_engine, make_session_factory
from collector.timeutil import NS_PER_S, now_ns, ns_to_dt, ns_to_rfc3339

DEMO_CLUSTER = "bank-eu-inference-1"
MARKER = ".draudit-demo"

Progress = Callable[[str, float], None]  # (message, fraction 0..1 of the whole run)


@dataclass
class DemoResult:
    """What the demo produced (``--output json`` prints ``as_json()``)."""

    out_dir: Path
    database_url: str
    transactions: dict[str, int]
    by_reason: dict[str, int]
    ingest: dict[str, int]
    findings: list[dict[str, Any]]
    pack_path: Path
    archive_path: Path | None
    verified: bool
    checks: list[tuple[str, bool, str]]
    sample: list[dict[str, str]]
    violation: dict[str, Any]
    timings_s: dict[str, float] = field(default_factory=dict)
    suggested_trace: str | None = None  # the sample id the demo suggests tracing (``_suggested_trace``)
    quarantine_reasons: dict[str, int] = field(default_factory=dict)  # reason slug → quarantined lines stored

    def as_json(self) -> dict[str, Any]:
        return {
            "transactions": self.transactions,
            "findings": [{"rule": f["rule"], "severity": f["severity"], "kind": f["kind"], "subjects": f["subjects"],
                          "physical_gpu_uuid": f.get("physical_gpu_uuid"), "from": ns_to_rfc3339(f.get("from_ns")),
                          "to": ns_to_rfc3339(f.get("to_ns")), "message": f.get("message"), "pods": f.get("pods", [])}
                         for f in self.findings],
            "pack": str(self.pack_path),
            "verified": self.verified,
            "database": self.database_url,
            "sample": self.sample,
            "suggested_trace": self.suggested_trace,
            "ingest": self.ingest,
            "quarantine_reasons": self.quarantine_reasons,
        }


def _prepare_out_dir(out_dir: Path) -> None:
    """Create ``out_dir``; a previous demo's directory (marked) is reused, anything else must be empty."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir}: is a file, not a directory; choose a new directory")
    if out_dir.exists():
        if (out_dir / MARKER).exists():
            for child in out_dir.iterdir():
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        elif any(out_dir.iterdir()):
            raise UserError(f"--out {out_dir}: the directory exists and is not a previous demo's; choose an empty or new directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).write_text("created by `draudit demo`; rerunning the demo empties this directory\n")


def _demo_bundle(product_bundle: Path, target: Path) -> Path:
    """The shipped policy bundle, with the bank's parameters set the way a user would in data.json:
    the DeviceClasses its platform team approved (the A10G shared-memory class included)."""
    shutil.copytree(product_bundle, target)
    data_path = target / "data.json"
    data = json.loads(data_path.read_text())
    params = data["draudit"]["params"]
    params["approved_device_classes"] = sorted(set(params["approved_device_classes"]) | {"a10g-shared-memory"})
    data_path.write_text(json.dumps(data, indent=2) + "\n")
    # Other content, other revision: a revision names one bundle to an auditor (packs show both).
    manifest_path = target / ".manifest"
    manifest = json.loads(manifest_path.read_text())
    manifest["revision"] = f"{manifest['revision']}+demo-bank"
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return target


def steps_for_sim(steps: list[dict]):
    """The demo timeline's steps (``{at_s, op, object}`` dicts) as ``collector.sim.scenario.Step``s."""
    from collector.sim.scenario import Step

    out = []
    for step in steps:
        obj = step["object"]
        if step["op"] == "apply":
            out.append(Step(step["at_s"], "apply", obj))
        else:
            meta = obj["metadata"]
            out.append(Step(step["at_s"], "delete", {"kind": obj["kind"], "name": meta["name"], "namespace": meta.get("namespace")}))
    return out


def _post_otlp(url: str, token: str, body: bytes) -> dict[str, Any]:
    http = urllib3.PoolManager()
    resp = http.request("POST", url, body=body, headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
                        timeout=urllib3.Timeout(connect=5, read=60), retries=False)
    if resp.status != 200:
        raise RuntimeError(f"POST {url} answered HTTP {resp.status}: {resp.data[:200]!r}")
    return json.loads(resp.data or b"{}")


def run_demo(out_dir: Path, *, duration_s: float = 30.0, n_transactions: int = 3000, seed: int = 7,
             progress: Progress | None = None) -> DemoResult:
    """Play the fraud-scoring scenario through every stage; returns the summary.

    Args:
        out_dir: working directory of the demo (created; a previous demo's is emptied first).
        duration_s: real time the cluster history takes to play (seconds, >= 20).
        n_transactions: scored transactions logged by the fraud-scoring service.
        seed: the scenario's random seed (same seed → same identifiers and logs).
        progress: called with a message and the fraction of the run done.

    Raises:
        UserError: ``out_dir`` is not usable.
        RuntimeError: a stage failed (a bug: the demo's input is fixed).
    """
    from collector.demo_scenario import build_timeline, generate_logs
    from collector.ingest.pipeline import IngestRun
    from collector.kube.client import make_api_client
    from collector.kube.reflector import ReflectorSettings
    from collector.lineage import attribute_run
    from collector.policy.bundle import load_bundle
    from collector.policy.engines import make_policy_engine
    from collector.policy.findings import evaluate_period
    from collector.server import HttpServer, build_app
    from collector.ingest.http import ingest_routes
    from collector.sim import FakeApiServer
    from collector.sim.scenario import play, wait_caught_up
    from collector.watcher import Watcher
    from reports.keyfiles import write_key_pair
    from reports.render import PackRequest, render_pack
    from reports.verify import verify_pack

    say = progress or (lambda _m, _f: None)
    timings: dict[str, float] = {}
    out_dir = out_dir.resolve()
    _prepare_out_dir(out_dir)
    db_url = f"sqlite:///{out_dir / 'draudit-demo.db'}"
    token = secrets.token_urlsafe(24)
    base = load_settings()
    bundle_dir = _demo_bundle(base.policy_bundle, out_dir / "policies")
    settings = Settings(database_url=db_url, cluster=DEMO_CLUSTER, policy_bundle=bundle_dir, http_host="127.0.0.1",
                        http_port=1, ingest_token=token, clock_skew_s=2.0, identity="draudit-demo")
    engine = make_engine(db_url)
    migrate.upgrade(engine)
    sessions = make_session_factory(engine)

    t0 = time.monotonic()
    say("starting the fake Kubernetes API server and the watcher", 0.01)
    srv = FakeApiServer(bookmark_interval_s=10.0)  # a real API server's ~1/min, within the read timeout below
    srv.start()
    http = None
    watcher = Watcher(settings, sessions, make_api_client(host=srv.url),
                      reflector_settings=ReflectorSettings(watch_timeout_s=300, read_timeout_s=30, backoff_initial_s=0.1, backoff_max_s=2))
    try:
        watcher.start()
        if not watcher.wait_synced(20):
            raise RuntimeError("the watcher did not sync with the fake API server")
        synced_ns = now_ns()  # every kind is observed from here on: the pack's period starts here
        http = HttpServer(build_app(watcher.readiness, ingest_routes(settings, sessions)), "127.0.0.1", 0)
        http.start()

        start_ns = now_ns() + NS_PER_S // 2
        scenario = build_timeline(start_ns, duration_s=duration_s, seed=seed)
        logs = generate_logs(scenario, out_dir / "logs", n_transactions=n_transactions, seed=seed)
        (out_dir / "logs" / "placement.json").write_text(json.dumps(scenario.placement_document(), indent=1))
        steps = steps_for_sim(scenario.steps)
        say(f"playing {len(steps)} cluster changes in real time ({duration_s:.0f} s)", 0.02)
        delay_s = (start_ns - now_ns()) / NS_PER_S
        if delay_s > 0:
            time.sleep(delay_s)

        def on_step(step, _result):
            say(f"cluster: {step.op} {step.payload.get('kind')} {(step.payload.get('metadata') or step.payload).get('name')}",
                0.02 + 0.6 * min(1.0, step.at_s / duration_s))

        play(srv, steps, speed=1.0, on_step=on_step)
        remaining_s = (scenario.end_ns - now_ns()) / NS_PER_S
        if remaining_s > 0:
            time.sleep(remaining_s)
        wait_caught_up(srv, watcher, timeout_s=20)
        timings["watch_s"] = time.monotonic() - t0

        t1 = time.monotonic()
        say("ingesting the fraud-scoring service's logs (Fluent Bit file, OTLP over HTTP)", 0.65)
        # In-process parsing: the watcher, HTTP and fake API threads are alive (no fork under threads).
        run = IngestRun(sessions, settings, cluster=DEMO_CLUSTER, workers=1)
        with open(logs.fluentbit_path, "rb") as fh:
            run.ingest_stream(fh, str(logs.fluentbit_path))
        file_counts = run.finish()
        otlp_answer = _post_otlp(f"http://127.0.0.1:{http.port}/v1/logs", token, logs.otlp_path.read_bytes())
        timings["ingest_s"] = time.monotonic() - t1
    finally:
        if http is not None:
            http.stop()
        stopping_ns = now_ns()  # observation ends at the stop: the pack's period ends by then
        watcher.stop()
        srv.stop()

    ingest = _ingest_totals(sessions, file_counts, otlp_answer, logs.otlp_path.read_bytes())
    _mask_ingested_inputs(logs.fluentbit_path, logs.otlp_path)

    t2 = time.monotonic()
    say("attributing transactions to physical GPUs", 0.75)
    with sessions.begin() as s:
        attribution = attribute_run(s, clock_skew_s=settings.clock_skew_s, cluster=DEMO_CLUSTER)
    timings["attribute_s"] = time.monotonic() - t2

    t3 = time.monotonic()
    say("evaluating the Rego policies (embedded engine)", 0.8)
    # The observed window, so the showcase pack is a fully covered one: from the moment every kind
    # was synced (before the scenario's first change) to the stop (or 5 s after the last change).
    period_from = synced_ns
    period_to = min(scenario.end_ns + 5 * NS_PER_S, stopping_ns)
    bundle = load_bundle(settings.policy_bundle)
    policy_engine = make_policy_engine(None)
    policy_engine.load_bundle(bundle)
    evaluation = evaluate_period(sessions, bundle, policy_engine, period_from, period_to, DEMO_CLUSTER)
    timings["policy_s"] = time.monotonic() - t3

    t4 = time.monotonic()
    say("rendering and verifying the evidence pack", 0.85)
    keys_dir = out_dir / "keys"
    keys_dir.mkdir()
    key = write_key_pair(keys_dir / "demo-signing")  # as `draudit keys generate --out keys/demo-signing`
    pack = render_pack(sessions, PackRequest(ns_to_dt(period_from), ns_to_dt(period_to), clusters=(DEMO_CLUSTER,)),
                       out_dir / "pack", sign_key=key, archive=True, policy_bundle=settings.policy_bundle,
                       clock_skew_s=settings.clock_skew_s)
    checks = verify_pack(pack.path, key.public_key())
    timings["report_s"] = time.monotonic() - t4
    say("done", 1.0)

    with sessions() as s:
        from collector.store.models import Lineage

        by_status = dict(s.execute(select(Lineage.status, func.count()).group_by(Lineage.status)).all())
        findings = [{**f, "pods": _consumer_pods(s, f)} for f in evaluation.findings]
        suggested = _suggested_trace(s, [x["transaction_id"] for x in logs.sample])
        reasons = _quarantine_reasons(s)
    transactions = {st: int(by_status.get(st, 0)) for st in ("exact", "ambiguous", "unattributed")}
    engine.dispose()
    return DemoResult(
        out_dir=out_dir, database_url=db_url, transactions=transactions, by_reason=dict(attribution.by_reason),
        ingest=ingest, findings=sorted(findings, key=lambda f: (_KIND_ORDER.get(f["kind"], 9), f["rule"])),
        pack_path=pack.path, archive_path=pack.archive, verified=all(c.ok for c in checks),
        checks=[(c.name, c.ok, c.detail) for c in checks], sample=list(logs.sample), violation=scenario.violation,
        timings_s=timings, suggested_trace=suggested, quarantine_reasons=reasons)


def _quarantine_reasons(session) -> dict[str, int]:
    """Quarantined ingest lines by reason slug, most first (``writer.quarantine_reason_slugs``)."""
    from collector.ingest.writer import quarantine_reason_slugs
    from collector.store.models import Quarantine

    return dict(quarantine_reason_slugs(session, Quarantine.stage == "ingest"))


def _suggested_trace(session, ids: list[str]) -> str | None:
    """The sample transaction whose trace answers "who else was on it" with another tenant's pod
    (one scored during the planted violation) — an ``exact`` one whose other tenant was surely there
    (``certain``) first, else one with a possible tenant — else the first; None without a sample."""
    from collector.lineage import trace

    possible = None
    for doc in trace(session, ids, cluster=DEMO_CLUSTER):
        others = [c for c in doc["co_tenants"] if c["namespace"] != doc["pod"]["namespace"]]
        if others and doc["status"] == "exact" and any(c["certain"] for c in others):
            return doc["transaction_id"]
        if others and possible is None:
            possible = doc["transaction_id"]
    return possible or (ids[0] if ids else None)


def _mask_ingested_inputs(*paths: Path) -> None:
    """Once ingested, the demo's synthetic input files keep the planted card number masked as the
    store holds it (first 6, last 4): no file ``draudit demo`` leaves behind holds a full card
    number, which a bank's data-loss scanner would flag. The ingest itself read the number whole."""
    from collector.demo_scenario import TEST_PAN
    from collector.ingest.pan import mask_text

    for path in paths:
        text = path.read_text(encoding="utf-8")
        masked = text.replace(TEST_PAN, mask_text(TEST_PAN)[0]).replace(TEST_PAN.replace(" ", ""),
                                                                         mask_text(TEST_PAN.replace(" ", ""))[0])
        if masked != text:
            path.write_text(masked, encoding="utf-8")


_KIND_ORDER = {"violation": 0, "warning": 1, "observation": 2}


def _consumer_pods(session, finding: dict[str, Any]) -> list[str]:
    """``namespace/pod`` of the consumers of the finding's claims during the finding's interval."""
    from collector.store.models import AllocationEpisode, ClaimConsumer

    claims = (finding.get("subjects") or {}).get("claims") or []
    if not isinstance(claims, list) or not claims:
        return []
    names = {(c.get("namespace"), c.get("name")) if isinstance(c, dict) else tuple(str(c).split("/", 1)) for c in claims}
    lo, hi = finding.get("from_ns") or 0, finding.get("to_ns") or 2**62
    rows = session.execute(select(AllocationEpisode.claim_namespace, AllocationEpisode.claim_name, ClaimConsumer.consumer_name)
                           .join(ClaimConsumer, ClaimConsumer.episode_id == AllocationEpisode.id)
                           .where(ClaimConsumer.valid_from_ns < hi,
                                  (ClaimConsumer.valid_to_ns.is_(None)) | (ClaimConsumer.valid_to_ns > lo))).all()
    return sorted({f"{ns}/{pod}" for ns, claim, pod in rows if (ns, claim) in names})


def _ingest_totals(sessions, file_counts, otlp_answer: dict[str, Any], otlp_body: bytes) -> dict[str, int]:
    """Lines and log records read, stored, duplicated, quarantined over both sources.

    ``read`` (the file's lines + the OTLP request's log records) = ``stored`` + ``duplicates`` +
    ``quarantined``, each counted where it happened: the file run's counters, the OTLP answer's
    ``rejectedLogRecords`` (OTLP/HTTP ``partialSuccess``), and the store (rows of a fresh demo store)."""
    from collector.store.models import InferenceRecord, Quarantine

    with sessions() as s:
        stored = s.execute(select(func.count()).select_from(InferenceRecord)).scalar_one()
        quarantined = s.execute(select(func.count()).select_from(Quarantine).where(Quarantine.stage == "ingest")).scalar_one()
    counts = file_counts.as_dict() if hasattr(file_counts, "as_dict") else dict(vars(file_counts))
    rejected = int(((otlp_answer or {}).get("partialSuccess") or {}).get("rejectedLogRecords") or 0)
    otlp_records = sum(len(scope.get("logRecords") or []) for resource in json.loads(otlp_body).get("resourceLogs") or []
                       for scope in resource.get("scopeLogs") or [])
    file_read, file_stored = int(counts.get("read", 0)), int(counts.get("stored", 0))
    file_duplicates = int(counts.get("duplicates", 0))
    otlp_duplicates = otlp_records - rejected - (int(stored) - file_stored)  # accepted, not stored again
    return {"read": file_read + otlp_records, "stored": int(stored), "duplicates": file_duplicates + otlp_duplicates,
            "quarantined": int(quarantined), "pan_masked": int(counts.get("pan_masked", 0)),
            "file_read": file_read, "file_stored": file_stored, "file_duplicates": file_duplicates,
            "file_quarantined": int(counts.get("quarantined", 0)), "otlp_records": otlp_records, "otlp_rejected": rejected}
