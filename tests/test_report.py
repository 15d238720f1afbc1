"""Evidence packs rendered from a store with realistic rows: contents, reproducibility, tamper detection."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import shutil
import tarfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pypdf import PdfReader
from sqlalchemy import delete, insert, select, update

from collector.cli import cli
from collector.lineage import tolerances_in_use
from collector.store import ledger
from collector.store.canonical import content_hash
from collector.store.models import (
    AllocationEpisode,
    AttributionSettings,
    AllocationResult,
    ClaimConsumer,
    CoverageInterval,
    DeviceState,
    EvidencePack,
    Finding,
    InferenceRecord,
    Lineage,
    ObjectVersion,
    WatchState,
)
from collector.timeutil import dt_to_ns
from reports import populations as pop
from reports.manifest import load_private_key, load_public_key, manifest_bytes
from reports.render import PackRequest, _lineage_summary, render_pack
from reports.verify import verify_pack
from tests.pack_data import records, split_table

CLUSTER = "prod-eu-1"
DAY = datetime(2026, 11, 28, tzinfo=timezone.utc)
PERIOD_FROM, PERIOD_TO = DAY, DAY + timedelta(days=1)
GPU_A = "GPU-7f3c2a1e-4b5d-6e7f-8091-a2b3c4d5e6f7"  # H100, whole GPU, time-sliced
GPU_B = "GPU-19d8e7f6-0a1b-2c3d-4e5f-60718293a4b5"  # A100, MIG-partitioned
MIG_B1 = "MIG-0b7e5c3a-1111-5d2e-9f80-1a2b3c4d5e01"
MIG_B2 = "MIG-0b7e5c3a-2222-5d2e-9f80-1a2b3c4d5e02"
GAP_REASON = "watch closed with 410 Gone; relisted"
FINDING_RULE = "isolation.cross_tenant_without_partitioning"
TENANTS = {"risk-inference": "risk", "marketing-ml": "marketing"}


def at(hours: float) -> datetime:
    return DAY + timedelta(hours=hours)


def ns(hours: float) -> int:
    return dt_to_ns(at(hours))


# --------------------------------------------------------------------------------- store builders


def add_version(s, kind: str, name: str, uid: str, rv: str, hours: float, raw: dict | None = None,
                namespace: str | None = None, event: str = "ADDED") -> int:
    raw = raw or {"kind": kind, "metadata": {"name": name, "uid": uid, "resourceVersion": rv}}
    row = {"cluster": CLUSTER, "api_group": "resource.k8s.io", "api_version": "v1", "kind": kind,
           "namespace": namespace, "name": name, "uid": uid, "resource_version": rv, "event_type": event,
           "observed_at": at(hours), "raw": raw, "content_hash": content_hash(raw)}
    new_id = s.execute(insert(ObjectVersion).values(**row).returning(ObjectVersion.id)).scalar_one()
    ledger.append(s, "object_versions", [{**row, "id": new_id}])
    return new_id


def add_device(s, source: int, device: str, node: str, hours_from: float, hours_to: float | None, *,
               device_type: str, uuid: str, parent: str | None = None, profile: str | None = None,
               product: str, memory_gib: int, driver_version: str, multiple: bool = False) -> None:
    s.execute(insert(DeviceState).values(
        cluster=CLUSTER, driver="gpu.nvidia.com", pool=node, device=device, slice_name=f"{node}-gpu.nvidia.com-x7k2",
        pool_generation=1, node_name=node, device_type=device_type, uuid=uuid, parent_uuid=parent,
        physical_gpu_uuid=parent or uuid, profile=profile, product_name=product, driver_version=driver_version,
        memory_bytes=memory_gib * 2**30, allow_multiple_allocations=multiple, attributes={}, capacity={},
        valid_from_ns=ns(hours_from), valid_to_ns=None if hours_to is None else ns(hours_to), source_version_id=source))


def add_claim(s, source: int, namespace: str, name: str, uid: str, node: str, device: str, hours_from: float,
              hours_to: float | None, pod: str) -> int:
    ep = s.execute(insert(AllocationEpisode).values(
        cluster=CLUSTER, claim_uid=uid, claim_namespace=namespace, claim_name=name, owner_pod_uid=None, first_rv="1",
        node_name=node, valid_from_ns=ns(hours_from), valid_to_ns=None if hours_to is None else ns(hours_to),
        source_version_id=source).returning(AllocationEpisode.id)).scalar_one()
    s.execute(insert(AllocationResult).values(episode_id=ep, request="gpu", driver="gpu.nvidia.com", pool=node,
                                              device=device, device_class_name="gpu.nvidia.com"))
    s.execute(insert(ClaimConsumer).values(
        cluster=CLUSTER, claim_uid=uid, episode_id=ep, consumer_resource="pods", consumer_name=pod,
        consumer_uid=f"pod-{uid}", valid_from_ns=ns(hours_from), valid_to_ns=None if hours_to is None else ns(hours_to)))
    return ep


def add_transaction(s, txn: str, hours: float, pod: str, namespace: str, status: str, reason: str | None,
                    gpu: str | None, device: str | None) -> None:
    row = {"transaction_id": txn, "event_time_ns": ns(hours), "event_time_precision_ns": 1_000_000,
           "received_ns": ns(hours) + 5_000_000, "cluster": CLUSTER, "pod_uid": None, "pod_namespace": namespace,
           "pod_name": pod, "container_name": "scorer", "model_name": "fraud-gbm", "model_version": "2026.11.3",
           "decision": "approve", "latency_ms": 4.2, "source_format": "jsonl", "envelope": "plain",
           "source": "/var/log/scoring/scoring.jsonl", "position": str(int(hours * 100)), "raw_sha256": "ab" * 32,
           "dedup_key": content_hash({"t": txn}), "conflict": False}
    rid = s.execute(insert(InferenceRecord).values(**row).returning(InferenceRecord.id)).scalar_one()
    ledger.append(s, "inference_records", [{**row, "id": rid, "attributes": None, "trace_id": None, "span_id": None,
                                            "node_name": None, "pod_uid_source": None, "run_id": None}])
    s.execute(insert(Lineage).values(
        record_id=rid, status=status, reason=reason, candidates=1 if gpu else 0, claim_namespace=namespace if gpu else None,
        claim_name="fraud-0-gpu" if gpu else None, driver="gpu.nvidia.com" if gpu else None, device=device,
        physical_gpu_uuid=gpu, device_uuid=gpu, node_name="gpu-node-a" if gpu else None, attributed_at=at(30)))


def fill_store(sessions) -> None:
    """One day on two GPU nodes: cross-tenant time-slicing on an H100, MIG sharing on an A100, a watch gap."""
    with sessions.begin() as s:
        dc = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
              "metadata": {"name": "gpu.nvidia.com", "uid": "dc-1", "resourceVersion": "900"},
              "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}
        src = add_version(s, "DeviceClass", "gpu.nvidia.com", "dc-1", "900", 0.5, dc)
        slices = add_version(s, "ResourceSlice", "gpu-node-a-gpu.nvidia.com-x7k2", "rs-1", "901", 0.1)
        add_device(s, slices, "gpu-0", "gpu-node-a", -24, 6, device_type="gpu", uuid=GPU_A, product="NVIDIA H100 80GB HBM3",
                   memory_gib=80, driver_version="550.90.07", multiple=True)
        add_device(s, slices, "gpu-0", "gpu-node-a", 6, None, device_type="gpu", uuid=GPU_A,
                   product="NVIDIA H100 80GB HBM3", memory_gib=80, driver_version="560.35.03", multiple=True)
        for dev, mig in (("gpu-0-mig-3g40gb-0", MIG_B1), ("gpu-0-mig-3g40gb-1", MIG_B2)):
            add_device(s, slices, dev, "gpu-node-b", -24, None, device_type="mig", uuid=mig, parent=GPU_B,
                       profile="3g.40gb", product="NVIDIA A100-SXM4-80GB", memory_gib=40, driver_version="550.90.07")
        claim_src = add_version(s, "ResourceClaim", "fraud-0-gpu", "claim-1", "1001", 1, namespace="risk-inference")
        add_claim(s, claim_src, "risk-inference", "fraud-0-gpu", "claim-1", "gpu-node-a", "gpu-0", 1, 5, "fraud-0")
        add_claim(s, claim_src, "marketing-ml", "recsys-gpu", "claim-2", "gpu-node-a", "gpu-0", 3, 4, "recsys-0")
        add_claim(s, claim_src, "risk-inference", "scoring-mig", "claim-3", "gpu-node-b", "gpu-0-mig-3g40gb-0", 8, None,
                  "scoring-0")
        add_claim(s, claim_src, "marketing-ml", "embed-mig", "claim-4", "gpu-node-b", "gpu-0-mig-3g40gb-1", 9, 12,
                  "embed-0")
        add_claim(s, claim_src, "risk-inference", "yesterday", "claim-0", "gpu-node-a", "gpu-0", -10, -2, "old-0")
        cov = []
        for state, start, end, reason in (("synced", 0, 10, None), ("gap", 10, 10 + 5 / 60, GAP_REASON)):
            row = {"cluster": CLUSTER, "kind": "ResourceClaim", "state": state, "started_ns": ns(start),
                   "ended_ns": ns(end), "from_rv": "1001" if state == "gap" else None,
                   "to_rv": "1042" if state == "gap" else None, "reason": reason}
            cid = s.execute(insert(CoverageInterval).values(**row).returning(CoverageInterval.id)).scalar_one()
            cov.append({**row, "id": cid})
        ledger.append(s, "coverage_intervals", cov)
        s.add(WatchState(cluster=CLUSTER, kind="ResourceClaim", api_version="v1", resource_version="2000", synced=True,
                         state="synced", state_since_ns=ns(10 + 5 / 60), updated_at=at(30)))
        for i, h in enumerate((2.0, 2.5, 3.5)):
            add_transaction(s, f"txn-{i:04d}", h, "fraud-0", "risk-inference", "exact", None, GPU_A, "gpu-0")
        add_transaction(s, "txn-0100", 5.0, "fraud-0", "risk-inference", "ambiguous", "skew-window", GPU_A, "gpu-0")
        add_transaction(s, "txn-0200", 7.0, "ghost-0", "risk-inference", "unattributed", "no-pod", None, None)
        add_transaction(s, "txn-9999", 25.0, "fraud-0", "risk-inference", "exact", None, GPU_A, "gpu-0")  # next day
        for rule, sev, kind, msg, frm, to, gpu, subjects in (
                (FINDING_RULE, "high", "violation",
                 "tenants marketing and risk shared GPU without hardware partitioning", 3, 4, GPU_A,
                 {"tenants": ["marketing", "risk"], "claims": [{"namespace": "marketing-ml", "name": "recsys-gpu"},
                                                               {"namespace": "risk-inference", "name": "fraud-0-gpu"}]}),
                ("coverage.watch_gap", "medium", "warning", "ResourceClaim watch gap of 300 s", 10, 10 + 5 / 60, None,
                 {"kind": "ResourceClaim"})):
            for evaluated in (at(26), at(27)):  # re-evaluated: must appear once in the pack
                row = {"finding_key": content_hash([rule, frm, evaluated.isoformat()]), "cluster": CLUSTER, "rule": rule,
                       "severity": sev, "kind": kind, "message": msg, "subjects": subjects, "evidence": {"episode_ids": [1, 2]},
                       "physical_gpu_uuid": gpu, "from_ns": ns(frm), "to_ns": ns(to), "period_from_ns": ns(0),
                       "period_to_ns": ns(24), "bundle_revision": "2026.11.2", "bundle_digest": "d1" * 32,
                       "engine": "regorus", "evaluated_at": evaluated}
                fid = s.execute(insert(Finding).values(**row).returning(Finding.id)).scalar_one()
                ledger.append(s, "findings", [{**row, "id": fid}])


@pytest.fixture
def bundle(tmp_path) -> Path:
    d = tmp_path / "bundle"
    d.mkdir()
    (d / "data.json").write_text(json.dumps({"namespace_tenants": TENANTS}))
    return d


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def render(sessions, out: Path, bundle: Path, key=None, archive=False, **kw):
    return render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,), ()), out, sign_key=key,
                       archive=archive, policy_bundle=bundle, **kw)


def flat(text: str) -> str:
    return re.sub(r"\s+", "", text)


# --------------------------------------------------------------------------------- tests


def test_pack_shows_planted_facts_in_html_pdf_and_data(sessions, tmp_path, bundle, key):
    fill_store(sessions)
    result = render(sessions, tmp_path / "pack", bundle, key)
    pack = result.path
    names = sorted(p.relative_to(pack).as_posix() for p in pack.rglob("*") if p.is_file())
    for expected in ("index.html", "report.pdf", "controls.json", "manifest.json", "manifest.sig",
                     "data/inventory.csv", "data/allocation_episodes.json", "data/transaction_lineage.csv",
                     "data/findings.csv", "data/coverage.csv", "data/consumer_intervals.csv", "data/sharing.csv"):
        assert expected in names

    html = (pack / "index.html").read_text()
    pdf_text = "\n".join(page.extract_text() for page in PdfReader(pack / "report.pdf").pages)
    for text in (re.sub(r"<[^>]+>", " ", html), pdf_text):
        for fact in (GPU_A, GPU_B, MIG_B1, FINDING_RULE, GAP_REASON, result.pack_id):
            assert flat(fact) in flat(text), fact
        # the cross-tenant time-slicing interval on the H100: both tenants named with the mode
        assert re.search(r"marketing,\s*risk\s*shared\s*device", text)
        assert "MIG-partitioned" in text
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")  # self-contained
    assert "<script" not in html
    # the finding was evaluated twice but is one decision: one row in the findings section, and
    # the cover's summary names it once
    findings_section = html[html.index('<section id="findings">'):]
    findings_section = findings_section[:findings_section.index("</section>")]
    assert findings_section.count(FINDING_RULE) == 1
    cover = html[:html.index('<nav class="toc">')]
    assert cover.count(FINDING_RULE) == 1 and "1 violation(s)" in cover
    # the finding in words, with the pods of both tenants, in the findings section and on the cover
    who = (f"tenant marketing pod marketing-ml/recsys-0 and tenant risk pod risk-inference/fraud-0 shared physical "
           f"GPU {GPU_A} on node gpu-node-a without hardware partitioning")
    when = "from 2026-11-28T03:00:00Z to 2026-11-28T04:00:00Z (1 h 00 min)"
    pdf_findings = pdf_text[pdf_text.index("6. Policy findings\n"):pdf_text.index("7. Transaction lineage\n")]
    for text in (re.sub(r"<[^>]+>", " ", findings_section), re.sub(r"<[^>]+>", " ", cover), pdf_findings):
        assert flat(who).lower() in flat(text).lower() and flat(when) in flat(text)
    # subjects and evidence as readable rows, not JSON (the JSON stays in data/findings.json)
    for text in (re.sub(r"<[^>]+>", " ", findings_section), pdf_findings):
        assert '{"' not in text and '"namespace"' not in text and "namespace" in text
        assert flat("Finding 1 of 2") in flat(text) and flat("Subject: Tenants marketing risk") in flat(text)
        assert flat("Subject: Claims (namespace/name) marketing-ml/recsys-gpu risk-inference/fraud-0-gpu") in flat(text)
        assert flat("episode ids 1") in flat(text)
    assert records(pack / "data/findings.json")[0]["subjects"]["claims"][0] == {
        "namespace": "marketing-ml", "name": "recsys-gpu"}
    # the timeline axis of a one-day period: round hours every 3 h, the date above the first tick and above midnight
    svg = html[html.index('<section id="timeline">'):html.index('<section id="sharing">')]
    labels = re.findall(r'text-anchor="\w+">([^<]+)</text>', svg)
    assert labels == ["2026-11-28", "00:00", "03:00", "06:00", "09:00", "12:00", "15:00", "18:00", "21:00",
                      "2026-11-29", "00:00"]
    assert "grid every 3 h" in svg and "grid every 3 h" in pdf_text
    reader = PdfReader(pack / "report.pdf")
    pages = len(reader.pages)
    assert f"page 1 of {pages}" in reader.pages[0].extract_text()
    assert result.pack_id in reader.pages[pages - 1].extract_text()
    assert reader.metadata["/CreationDate"].startswith("D:20261129000000")

    lineage = (pack / "data/transaction_lineage.csv").read_text().splitlines()
    assert lineage[0].startswith("transaction_id,event_time,event_time_ns,cluster")
    assert [l.split(",")[0] for l in lineage[1:]] == ["txn-0000", "txn-0001", "txn-0002", "txn-0100", "txn-0200"]
    episodes = records(pack / "data/allocation_episodes.json")
    assert {(e["claim_name"], e["tenant"], e["physical_gpu_uuid"]) for e in episodes} == {
        ("fraud-0-gpu", "risk", GPU_A), ("recsys-gpu", "marketing", GPU_A), ("scoring-mig", "risk", GPU_B),
        ("embed-mig", "marketing", GPU_B)}
    sharing = records(pack / "data/sharing.json")
    assert [(s["physical_gpu_uuid"], s["from"], s["to"], s["mode"]) for s in sharing] == [
        (GPU_B, "2026-11-28T09:00:00Z", "2026-11-28T12:00:00Z", "MIG-partitioned"),
        (GPU_A, "2026-11-28T03:00:00Z", "2026-11-28T04:00:00Z", "shared device (no hardware partitioning)")]
    changes = records(pack / "data/changes.json")
    assert {"change_type": "driver_version", "subject": GPU_A, "from_value": "550.90.07", "to_value": "560.35.03"}.items() \
        <= next(c for c in changes if c["change_type"] == "driver_version").items()

    manifest = json.loads((pack / "manifest.json").read_text())
    assert manifest["period"] == {"from": "2026-11-28T00:00:00Z", "to": "2026-11-29T00:00:00Z",
                                  "from_ns": dt_to_ns(PERIOD_FROM), "to_ns": dt_to_ns(PERIOD_TO)}
    assert manifest["policy_bundles"] == [{"revision": "2026.11.2", "digest": "d1" * 32}]
    gap_kind = next(k for k in manifest["coverage"]["kinds"] if k["kind"] == "ResourceClaim")
    assert gap_kind["gap_s"] == 300.0 and gap_kind["gaps"] == 1 and gap_kind["unobserved_s"] == 0.0
    with sessions() as s:
        head = ledger.current_head(s)
        stored = s.execute(select(EvidencePack)).scalar_one()
        assert ledger.verify(s).ok
    assert manifest["ledger"]["seq"] == head.seq - 1  # the pack's own record is the entry after the anchor
    assert stored.pack_id == result.pack_id and stored.manifest_sha256 == result.manifest_sha256
    controls = json.loads((pack / "controls.json").read_text())
    by_id = {c["id"]: c for c in controls["controls"]}
    assert by_id["DORA (EU) 2022/2554 Art. 9(4)(b)"]["files"] == ["data/sharing.csv", "data/sharing.json",
                                                                 "data/findings.csv", "data/findings.json"]
    assert by_id["NIS2 (EU) 2022/2555 Art. 21(2)(j)"]["status"] == "not evidenced"
    for c in controls["controls"]:
        for f in c["files"]:
            assert f in names, f
    checks = verify_pack(pack, key.public_key())
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]


def test_tables_cut_to_the_row_limit_say_how_many_of_how_many(sessions, tmp_path, bundle, monkeypatch):
    fill_store(sessions)
    monkeypatch.setattr("reports.render.HTML_ROW_LIMIT", 1)
    monkeypatch.setattr("reports.render.FINDING_DETAIL_LIMIT", 1)
    result = render(sessions, tmp_path / "pack", bundle, pdf=False)
    html = (result.path / "index.html").read_text()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
    assert "Showing the first 1 of 2 findings in detail (by severity, rule, start); all 2 are in data/findings.csv" in text
    assert f"Findings by rule Rule Severity and kind Findings {FINDING_RULE} high violation 1 coverage.watch_gap " \
           "medium warning 1" in text
    assert "Showing the first 1 of 2 intervals" in text and "all 2 are in data/sharing.csv" in text
    assert "Finding 2 of 2" not in text
    # the cross-tenant interval without partitioning is the one shown
    sharing = html[html.index('<section id="sharing">'):html.index('<section id="findings">')].replace("<wbr>", "")
    assert GPU_A in sharing and GPU_B not in sharing


def test_namespace_scope_filters_claims_and_transactions(sessions, tmp_path, bundle):
    fill_store(sessions)
    result = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,), ("marketing-ml",)),
                         tmp_path / "pack", policy_bundle=bundle, pdf=False)
    episodes = records(result.path / "data/allocation_episodes.json")
    assert sorted(e["claim_name"] for e in episodes) == ["embed-mig", "recsys-gpu"]
    assert result.counts["transaction_lineage"] == 0
    findings = records(result.path / "data/findings.json")
    assert sorted(f["rule"] for f in findings) == ["coverage.watch_gap", FINDING_RULE]


def _as_csv_field_text(value) -> str:
    """What a JSON value reads as in the CSV (pack methodology): null empty, booleans true/false,
    numbers in decimal, nested values as compact JSON with sorted keys."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def test_every_json_population_is_a_split_table_of_the_csv_rows(sessions, tmp_path, bundle):
    fill_store(sessions)
    for label, namespaces in (("all", ()), ("marketing", ("marketing-ml",))):  # the second has no transaction
        result = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,), namespaces), tmp_path / label,
                             policy_bundle=bundle, pdf=False, record=False)
        data = result.path / "data"
        names = sorted(p.stem for p in data.glob("*.json"))
        assert names == sorted(p.stem for p in data.glob("*.csv")) == sorted(result.counts)
        for name in names:
            columns, rows = split_table(data / f"{name}.json")
            with open(data / f"{name}.csv", newline="", encoding="utf-8") as fh:
                header, *csv_rows = list(csv.reader(fh))
            assert columns == header, name
            assert [[_as_csv_field_text(v) for v in row] for row in rows] == csv_rows, name
            assert len(rows) == result.counts[name], name
            text = (data / f"{name}.json").read_text(encoding="utf-8")
            assert text.startswith('{"columns":' + json.dumps(columns, separators=(",", ":")) + ',"data":[')
            assert text.endswith("\n]}\n" if rows else '"data":[]}\n')  # one row per line, as the CSV
            assert text.count("\n") == len(rows) + (2 if rows else 1)
        assert result.counts["transaction_lineage"] == (0 if namespaces else 5)


def test_rendering_twice_gives_byte_identical_files(sessions, tmp_path, bundle, key):
    fill_store(sessions)
    first = render(sessions, tmp_path / "one", bundle, key, archive=True)
    second = render(sessions, tmp_path / "two" / "one", bundle, key, archive=True)
    assert first.recorded and not second.recorded  # same pack id: recorded once
    assert first.pack_id == second.pack_id
    files = sorted(p.relative_to(first.path) for p in first.path.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second.path) for p in second.path.rglob("*") if p.is_file())
    for rel in files:
        assert (first.path / rel).read_bytes() == (second.path / rel).read_bytes(), rel
    assert second.archive.read_bytes() == first.archive.read_bytes()  # same top directory name "one"


def _fail_names(checks):
    return [(c.name, c.detail) for c in checks if c.ok is False]


def test_tampering_is_detected_and_named(sessions, tmp_path, bundle, key):
    fill_store(sessions)
    clean = render(sessions, tmp_path / "pack", bundle, key, pdf=False).path  # the PDF is covered by the CLI test
    assert _fail_names(verify_pack(clean, key.public_key())) == []

    def copy(name: str) -> Path:
        return Path(shutil.copytree(clean, tmp_path / name))

    # change one byte of every file in turn
    for rel in sorted(p.relative_to(clean).as_posix() for p in clean.rglob("*") if p.is_file()):
        pack = copy("flip")
        data = bytearray((pack / rel).read_bytes())
        data[len(data) // 2] ^= 0x01
        (pack / rel).write_bytes(bytes(data))
        failed = _fail_names(verify_pack(pack, key.public_key()))
        assert failed, rel
        if rel not in ("manifest.json", "manifest.sig"):
            assert failed == [(f"file {rel}", failed[0][1])] and "SHA-256 differs" in failed[0][1]
        elif rel == "manifest.sig":
            assert failed[0][0] == "signature"
        else:
            assert failed[0][0] in ("manifest", "signature")
        shutil.rmtree(pack)

    pack = copy("deleted")
    (pack / "data/findings.csv").unlink()
    assert _fail_names(verify_pack(pack, key.public_key())) == [
        ("file data/findings.csv", "missing (listed in the manifest, not in the pack)")]
    shutil.rmtree(pack)

    pack = copy("added")
    (pack / "data/extra.csv").write_text("transaction_id\ntxn-forged\n")
    assert [n for n, _ in _fail_names(verify_pack(pack, key.public_key()))] == ["extra data/extra.csv"]
    shutil.rmtree(pack)

    pack = copy("added-directory")  # an empty directory (nested too) is not part of the pack either
    (pack / "data/notes/draft").mkdir(parents=True)
    (pack / "evidence").mkdir()
    assert [n for n, _ in _fail_names(verify_pack(pack, key.public_key()))] == [
        "extra data/notes/", "extra data/notes/draft/", "extra evidence/"]
    with tarfile.open(tmp_path / "with-directory.tar.gz", "w:gz") as tar:
        tar.add(pack, arcname="pack")
    assert [n for n, _ in _fail_names(verify_pack(tmp_path / "with-directory.tar.gz", key.public_key()))] == [
        "extra data/notes/", "extra data/notes/draft/", "extra evidence/"]
    shutil.rmtree(pack)

    # swap the manifest for one recomputed over a forged file: digests match, the signature does not
    pack = copy("swapped")
    (pack / "data/findings.csv").write_text("rule\nnothing-to-see\n")
    manifest = json.loads((pack / "manifest.json").read_text())
    from reports.manifest import digest_bytes, manifest_bytes

    for entry in manifest["files"]:
        if entry["path"] == "data/findings.csv":
            d = digest_bytes(entry["path"], (pack / entry["path"]).read_bytes())
            entry["size"], entry["sha256"] = d.size, d.sha256
    (pack / "manifest.json").write_bytes(manifest_bytes(manifest))
    failed = _fail_names(verify_pack(pack, key.public_key()))
    assert [n for n, _ in failed] == ["signature"] and "does not verify" in failed[0][1]
    # ... and with the signature removed and its declaration stripped, a key holder still notices
    del manifest["signing"]
    (pack / "manifest.json").write_bytes(manifest_bytes(manifest))
    (pack / "manifest.sig").unlink()
    assert _fail_names(verify_pack(pack, key.public_key())) == [("signature", "pack is not signed, but a public key was given")]
    shutil.rmtree(pack)

    other = Ed25519PrivateKey.generate().public_key()
    failed = _fail_names(verify_pack(clean, other))
    assert [n for n, _ in failed] == ["signature"] and "the public key given is" in failed[0][1]


def test_verify_archive_and_cli(sessions, tmp_path, bundle, database_url):
    fill_store(sessions)
    runner = CliRunner()
    res = runner.invoke(cli, ["keys", "generate", "--out", str(tmp_path / "k")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["report", "--from", "2026-11-28", "--to", "2026-11-29T00:00:00Z", "--cluster", CLUSTER,
                              "--out", str(tmp_path / "pack"), "--sign-key", str(tmp_path / "k.key"), "--archive",
                              "--database-url", database_url], env={"DRAUDIT_POLICY_BUNDLE": str(bundle)})
    assert res.exit_code == 0, res.output
    assert "not signed" not in res.output
    archive = tmp_path / "pack.tar.gz"
    assert archive.is_file()
    res = runner.invoke(cli, ["verify", str(archive), "--public-key", str(tmp_path / "k.pub")])
    assert res.exit_code == 0, res.output
    assert "PASS  signature" in res.output and "verdict: PASS" in res.output

    # tamper inside the archive: rewrite it with one changed member
    tampered = tmp_path / "tampered.tar.gz"
    with tarfile.open(archive) as src, tarfile.open(tampered, "w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            if m.name.endswith("data/coverage.csv"):
                data = data.replace(b"gap", b"synced")
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    res = runner.invoke(cli, ["verify", str(tampered), "--public-key", str(tmp_path / "k.pub")])
    assert res.exit_code == 1
    assert "FAIL  file data/coverage.csv" in res.output and "verdict: FAIL" in res.output

    pdf = tmp_path / "pack" / "report.pdf"
    data = bytearray(pdf.read_bytes())
    data[-100] ^= 0x20
    pdf.write_bytes(bytes(data))
    res = runner.invoke(cli, ["verify", str(tmp_path / "pack"), "--public-key", str(tmp_path / "k.pub")])
    assert res.exit_code == 1 and "FAIL  file report.pdf: SHA-256 differs" in res.output
    data[-100] ^= 0x20
    pdf.write_bytes(bytes(data))

    wrong = tmp_path / "wrong"
    assert runner.invoke(cli, ["keys", "generate", "--out", str(wrong)]).exit_code == 0
    res = runner.invoke(cli, ["verify", str(tmp_path / "pack"), "--public-key", str(wrong) + ".pub"])
    assert res.exit_code == 1 and "FAIL  signature" in res.output

    # a rewritten coverage file with a rewritten manifest: only the signature tells
    rewritten = tmp_path / "rewritten"
    shutil.copytree(tmp_path / "pack", rewritten)
    original = (rewritten / "data/coverage.csv").read_bytes()
    coverage = original.replace(b",gap,", b",synced,")
    assert coverage != original
    (rewritten / "data/coverage.csv").write_bytes(coverage)
    manifest = json.loads((rewritten / "manifest.json").read_text())
    entry = next(f for f in manifest["files"] if f["path"] == "data/coverage.csv")
    entry["sha256"], entry["size"] = hashlib.sha256(coverage).hexdigest(), len(coverage)
    (rewritten / "manifest.json").write_bytes(manifest_bytes(manifest))
    res = runner.invoke(cli, ["verify", str(rewritten)])
    assert res.exit_code == 1 and "verdict: NOT VERIFIED" in res.output and "--public-key" in res.output
    res = runner.invoke(cli, ["verify", str(rewritten), "--output", "json"])
    assert res.exit_code == 1 and json.loads(res.output)["ok"] is False
    res = runner.invoke(cli, ["verify", str(rewritten), "--integrity-only"])
    assert res.exit_code == 0 and "verdict: PASS for integrity only (--integrity-only)" in res.output
    res = runner.invoke(cli, ["verify", str(rewritten), "--public-key", str(tmp_path / "k.pub")])
    assert res.exit_code == 1 and "FAIL  signature" in res.output

    # keys round-trip and refuse to overwrite
    load_private_key((tmp_path / "k.key").read_bytes())
    load_public_key((tmp_path / "k.pub").read_bytes())
    res = runner.invoke(cli, ["keys", "generate", "--out", str(tmp_path / "k")])
    assert res.exit_code == 2 and "exists" in res.output


def test_report_refuses_non_empty_out_dir_and_bad_period(sessions, tmp_path, database_url):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    runner = CliRunner()
    res = runner.invoke(cli, ["report", "--from", "2026-11-28", "--to", "2026-11-29", "--out", str(tmp_path / "busy"),
                              "--database-url", database_url])
    assert res.exit_code == 2 and "not an empty directory" in res.output
    assert (tmp_path / "busy" / "notes.txt").read_text() == "keep me"
    res = runner.invoke(cli, ["report", "--from", "2026-11-29", "--to", "2026-11-28", "--out", str(tmp_path / "p"),
                              "--database-url", database_url])
    assert res.exit_code == 2 and "must be after" in res.output
    res = runner.invoke(cli, ["report", "--from", "yesterday", "--to", "2026-11-28", "--out", str(tmp_path / "p"),
                              "--database-url", database_url])
    assert res.exit_code == 2 and "RFC 3339" in res.output


def stop_collector(sessions, hours: float) -> None:
    """The collector shuts down cleanly at ``hours`` and does not come back (as collector.kube.recorder does)."""
    with sessions.begin() as s:
        st = s.get(WatchState, (CLUSTER, "ResourceClaim"))
        row = {"cluster": CLUSTER, "kind": "ResourceClaim", "state": "synced", "started_ns": st.state_since_ns,
               "ended_ns": ns(hours), "from_rv": None, "to_rv": "2000", "reason": None}
        cid = s.execute(insert(CoverageInterval).values(**row).returning(CoverageInterval.id)).scalar_one()
        ledger.append(s, "coverage_intervals", [{**row, "id": cid}])
        st.state, st.state_since_ns, st.synced = "stopped", ns(hours), False


def test_a_stopped_collector_is_not_a_gap_and_nothing_after_it_is_stated_as_fact(sessions, tmp_path, bundle, key):
    fill_store(sessions)
    with sessions.begin() as s:  # risk and marketing on the H100 from 18:00 and 19:00, never seen released
        src = add_version(s, "ResourceClaim", "fraud-1-gpu", "claim-5", "1101", 18, namespace="risk-inference")
        add_claim(s, src, "risk-inference", "fraud-1-gpu", "claim-5", "gpu-node-a", "gpu-0", 18, None, "fraud-1")
        add_claim(s, src, "marketing-ml", "recsys-late", "claim-6", "gpu-node-a", "gpu-0", 19, None, "recsys-1")
    stop_collector(sessions, 20)
    result = render(sessions, tmp_path / "pack", bundle, key)
    pack = result.path
    html = (pack / "index.html").read_text()
    pdf_text = flat("\n".join(page.extract_text() for page in PdfReader(pack / "report.pdf").pages))
    cover = html[:html.index('<nav class="toc">')]
    coverage_html = html[html.index('<section id="coverage">'):html.index('<section id="inventory">')]
    # the stop is its own category: the one real gap (10:00, 5 min) stays the only gap
    assert "1 gap interval(s)" in cover and "Collector not running" in cover
    assert "the collector stopped at 2026-11-28T20:00:00Z" in cover
    assert flat("Collector not running") in pdf_text and flat("stopped at 2026-11-28T20:00:00Z") in pdf_text
    rc = next(k for k in result_meta(pack)["coverage"]["kinds"] if k["kind"] == "ResourceClaim")
    assert (rc["gap_s"], rc["stopped_s"], rc["gaps"]) == (300.0, 4 * 3600.0, 1)
    assert "not ended by one" in coverage_html
    # sharing after 19:00 ends at the last observation, flagged; never "to the period end"
    sharing = [r for r in records(pack / "data/sharing.json") if r["from"] == "2026-11-28T19:00:00Z"]
    assert [(r["to"], r["tenants"], r["open_at_last_observation"]) for r in sharing] == [
        ("2026-11-28T20:00:00Z", "marketing;risk", True)]
    assert flat("open at last observation, collector stopped") in flat(re.sub(r"<[^>]+>", " ", html))
    # timeline bars stop at 20:00 with a dotted trail, their titles say why
    svg = html[html.index('<section id="timeline">'):html.index('<section id="sharing">')]
    assert "fraud-1-gpu on gpu.nvidia.com/gpu-node-a/gpu-0 2026-11-28T18:00:00Z – open at last observation, " \
           "collector stopped at 2026-11-28T20:00:00Z" in svg
    assert "still allocated" not in svg
    assert "still allocated at the period end" not in html.replace(coverage_html, "")


def result_meta(pack: Path) -> dict:
    return json.loads((pack / "manifest.json").read_text())


def test_control_statuses_follow_the_pack_signature_populations_and_coverage(sessions, tmp_path, bundle, key):
    fill_store(sessions)
    signed = render(sessions, tmp_path / "signed", bundle, key, pdf=False)
    by_id = {c["id"]: c for c in json.loads((signed.path / "controls.json").read_text())["controls"]}
    integrity, assets = by_id["RTS (EU) 2024/1774 Art. 12(2)(d)–(e)"], by_id["DORA (EU) 2022/2554 Art. 8(4)"]
    assert (integrity["status"], integrity["status_reasons"]) == ("evidenced", [])
    assert (assets["status"], assets["status_reasons"]) == ("evidenced", [])
    monitoring = by_id["DORA (EU) 2022/2554 Art. 9(1)"]  # the 5-minute ResourceClaim gap: partial, with the share
    assert monitoring["status"] == "partially evidenced" and monitoring["ceiling"] == "evidenced"
    assert monitoring["status_reasons"] == ["observation coverage is partial: ResourceClaim in prod-eu-1 synced for "
                                            "99.7 % of the period (section 2)"]
    # unsigned, and no transaction in the marketing namespace
    unsigned = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,), ("marketing-ml",)),
                           tmp_path / "unsigned", policy_bundle=bundle, record=False)
    assert unsigned.counts["transaction_lineage"] == 0
    by_id = {c["id"]: c for c in json.loads((unsigned.path / "controls.json").read_text())["controls"]}
    integrity, assets = by_id["RTS (EU) 2024/1774 Art. 12(2)(d)–(e)"], by_id["DORA (EU) 2022/2554 Art. 8(4)"]
    assert integrity["status"] == "partially evidenced" and "not signed" in integrity["status_reasons"][0]
    assert "manifest.sig" not in integrity["files"]
    assert assets["status"] == "partially evidenced"
    assert assets["status_reasons"] == ["no transaction rows in the period (data/transaction_lineage.csv is empty)"]
    assert by_id["DORA (EU) 2022/2554 Art. 17(2)–(3)"]["status"] == "not evidenced"  # its only population is empty
    # the HTML and PDF control mapping say the same
    pdf_text = flat("\n".join(page.extract_text() for page in PdfReader(unsigned.path / "report.pdf").pages))
    html = (unsigned.path / "index.html").read_text()
    mapping = html[html.index('<section id="controls">'):]
    assert mapping.count('class="status-evidenced"') == sum(c["status"] == "evidenced" for c in by_id.values())
    for text in (flat(re.sub(r"<[^>]+>", " ", mapping)), pdf_text):
        assert flat("Here: no transaction rows in the period (data/transaction_lineage.csv is empty).") in text
        assert flat("Here: the pack is not signed (no manifest.sig)") in text


def test_inventory_reads_memory_from_capacity_keeps_uuids_whole_and_rounds_shares(sessions, tmp_path, bundle):
    fill_store(sessions)
    with sessions.begin() as s:  # the H100's slice published memory only as a capacity (qualified name)
        s.execute(update(DeviceState).where(DeviceState.uuid == GPU_A).values(
            memory_bytes=None, capacity={"gpu.nvidia.com/memory": {"value": "80Gi"}}))
    pack = render(sessions, tmp_path / "pack", bundle, record=False).path
    inventory = records(pack / "data/inventory.json")
    assert {r["memory_bytes"] for r in inventory if r["device_uuid"] == GPU_A} == {80 * 2**30}
    html = (pack / "index.html").read_text()
    section = html[html.index('<section id="inventory">'):html.index('<section id="timeline">')]
    row = next(r for r in section.split("<tr>") if "7f3c2a1e" in r)
    assert "80.0 GiB" in row and "not published" not in row
    # UUIDs may wrap only after a hyphen; the PDF text keeps them whole
    assert '<span class="uuid">GPU-<wbr>7f3c2a1e-<wbr>4b5d-<wbr>6e7f-<wbr>8091-<wbr>a2b3c4d5e6f7</span>' in row
    pdf_text = "\n".join(page.extract_text() for page in PdfReader(pack / "report.pdf").pages)
    joined_at_hyphens = pdf_text.replace("-\n", "-")
    for uuid in (GPU_A, GPU_B, MIG_B1, MIG_B2):  # every wrapped UUID wrapped after a hyphen, none inside a group
        assert flat(pdf_text).count(uuid) == joined_at_hyphens.count(uuid) > 0, uuid
    # coverage shares with one decimal
    coverage = html[html.index('<section id="coverage">'):html.index('<section id="inventory">')]
    assert "99.7 %" in coverage and not re.search(r"\d\.\d{2,} %", coverage)


def test_pack_states_the_tolerances_the_stored_lineage_was_computed_with(sessions, tmp_path, bundle):
    fill_store(sessions)
    with sessions.begin() as s:  # the day's attributions ran with 0.5 s; one later run with 5 s
        ids = {}
        for skew_ns in (500_000_000, 5_000_000_000):
            ids[skew_ns] = s.execute(insert(AttributionSettings).values(
                digest=content_hash([skew_ns]), clock_skew_ns=skew_ns, cluster=CLUSTER, serving_containers="{}")
                .returning(AttributionSettings.id)).scalar_one()
        records = {t: i for t, i in s.execute(select(InferenceRecord.transaction_id, InferenceRecord.id))}
        s.execute(update(Lineage).values(settings_id=ids[500_000_000]))
        s.execute(update(Lineage).where(Lineage.record_id == records["txn-0200"]).values(settings_id=ids[5_000_000_000]))
    mixed = render(sessions, tmp_path / "mixed", bundle, record=False, pdf=False, clock_skew_s=2.0).path
    manifest = result_meta(mixed)
    assert manifest["clock_skew_tolerance_s"] is None
    assert manifest["clock_skew_tolerances"] == [{"tolerance_s": 0.5, "lineage_rows": 4},
                                                 {"tolerance_s": 5.0, "lineage_rows": 1}]
    html = re.sub(r"\s+", " ", (mixed / "index.html").read_text())
    assert "clock-skew tolerance (as each row was computed: 0.5 s for 4 transactions; 5 s for 1 transaction)" in html
    with sessions.begin() as s:
        s.execute(update(Lineage).values(settings_id=ids[500_000_000]))
    single = render(sessions, tmp_path / "single", bundle, record=False, pdf=False, clock_skew_s=2.0).path
    assert result_meta(single)["clock_skew_tolerance_s"] == 0.5  # not the 2 s setting at rendering
    assert "0.5 s (the tolerance every attribution in the period was computed with)" in \
        re.sub(r"\s+", " ", (single / "index.html").read_text())
    # counted in the lineage summary's pass exactly as collector.lineage counts them, per scope,
    # with rows without recorded settings and transactions without a lineage row
    with sessions.begin() as s:
        s.execute(update(Lineage).where(Lineage.record_id == records["txn-0100"]).values(settings_id=ids[5_000_000_000]))
        s.execute(update(Lineage).where(Lineage.record_id == records["txn-0001"]).values(settings_id=None))
        s.execute(delete(Lineage).where(Lineage.record_id == records["txn-0002"]))
    with sessions() as s:
        for namespaces in ((), ("risk-inference",), ("marketing-ml",)):
            scope = pop.Scope(dt_to_ns(PERIOD_FROM), dt_to_ns(PERIOD_TO), (CLUSTER,), namespaces)
            summary = _lineage_summary(s, scope)
            assert summary.tolerances == tolerances_in_use(s, pop.lineage_filter(scope)), namespaces
            assert list(summary.tolerances) == sorted(summary.tolerances, key=lambda k: (k is None, k or 0))
        assert _lineage_summary(s, pop.Scope(dt_to_ns(PERIOD_FROM), dt_to_ns(PERIOD_TO), (CLUSTER,), ())).tolerances \
            == {0.5: 2, 5.0: 1, None: 1}


def test_lineage_names_the_other_namespaces_on_the_same_gpu_at_the_transaction_time(sessions, tmp_path, bundle):
    fill_store(sessions)
    first = render(sessions, tmp_path / "one", bundle, record=False, pdf=False)
    lineage = {r["transaction_id"]: r for r in records(first.path / "data/transaction_lineage.json")}
    # marketing-ml's recsys-gpu held the H100 with risk-inference's fraud-0-gpu from 03:00 to 04:00
    assert lineage["txn-0002"]["co_tenant_namespaces"] == "marketing-ml"  # 03:30
    assert lineage["txn-0000"]["co_tenant_namespaces"] is None  # 02:00: fraud-0-gpu alone
    assert lineage["txn-0200"]["co_tenant_namespaces"] is None  # not attributed to a GPU
    assert len(lineage) == first.counts["transaction_lineage"]  # the join adds no row
    header = (first.path / "data/transaction_lineage.csv").read_text().splitlines()[0].split(",")
    assert header.index("co_tenant_namespaces") == header.index("node_name") + 1
    second = render(sessions, tmp_path / "two", bundle, record=False, pdf=False)  # the temporary table is gone
    for name in ("transaction_lineage.csv", "transaction_lineage.json"):
        assert (first.path / "data" / name).read_bytes() == (second.path / "data" / name).read_bytes()


def test_the_cover_states_unobserved_time_and_the_warnings_beside_violations(sessions, tmp_path, bundle):
    """Newcomer: a pack whose period began 6 h before the collector first started said "Observation
    gaps: 1 gap interval(s)…" on its cover and nothing of the 6 h section 2 shows as unobserved; and
    with violations the cover's findings line left the warnings out."""
    fill_store(sessions)
    request = PackRequest(PERIOD_FROM - timedelta(hours=6), PERIOD_TO, (CLUSTER,), ())
    result = render_pack(sessions, request, tmp_path / "pack", policy_bundle=bundle, pdf=False)
    html = (result.path / "index.html").read_text()
    cover = re.sub(r"<[^>]+>", "", html[:html.index('<nav class="toc">')])
    assert ("1 gap interval(s) and 0 collector-not-running interval(s) in the period; 1 cluster/kind(s) partly "
            "unobserved (no coverage record), up to 6h 00m 00s of the period — see section 2") in cover
    findings = json.loads((result.path / "data" / "findings.json").read_text())
    kinds = [row[findings["columns"].index("kind")] for row in findings["data"]]
    violations = kinds.count("violation")
    assert violations and len(kinds) > violations
    assert f"{violations} violation(s)" in cover
    assert f"and {len(kinds) - violations} warning(s)/observation(s)" in cover


def test_a_finding_first_observed_when_the_watch_resumed_says_its_start_was_not_observed(sessions, tmp_path, bundle):
    """Second newcomer: a sharing that began while the collector was down was reported from the
    restart on, as if that were its start. A finding whose interval starts inside, or at the end of,
    an interval in which ResourceClaims were not observed now says its start is a first observation."""
    fill_store(sessions)  # ResourceClaim watch lost 10:00-10:05
    with sessions.begin() as s:
        row = {"finding_key": content_hash(["late-sharing"]), "cluster": CLUSTER, "rule": FINDING_RULE,
               "severity": "high", "kind": "violation", "message": "tenants shared GPU after the gap",
               "subjects": {"tenants": ["marketing", "risk"], "claims": ["marketing-ml/late", "risk-inference/late"]},
               "evidence": None, "physical_gpu_uuid": GPU_A, "from_ns": ns(10 + 5 / 60) + 10**9, "to_ns": ns(11),
               "period_from_ns": ns(0), "period_to_ns": ns(24), "bundle_revision": "2026.11.2",
               "bundle_digest": "d1" * 32, "engine": "regorus", "evaluated_at": at(26)}
        fid = s.execute(insert(Finding).values(**row).returning(Finding.id)).scalar_one()
        ledger.append(s, "findings", [{**row, "id": fid}])
        # and the sharing itself, first seen by the relist that ended the gap
        first_seen = 10 + 5 / 60 + 1 / 3600
        src = add_version(s, "ResourceClaim", "late-a", "claim-7", "1201", first_seen, namespace="risk-inference")
        add_claim(s, src, "risk-inference", "late-a", "claim-7", "gpu-node-a", "gpu-0", first_seen, 11, "late-a-0")
        add_claim(s, src, "marketing-ml", "late-b", "claim-8", "gpu-node-a", "gpu-0", first_seen, 11, "late-b-0")
    result = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,), ()), tmp_path / "pack",
                         policy_bundle=bundle, pdf=False)
    html = (result.path / "index.html").read_text()
    sharing = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html[html.index('<section id="sharing">'):]))
    assert sharing.count("first observed here: it may have begun earlier") == 1
    assert "2026-11-28T10:05:01Z first observed here" in sharing
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
    assert ("start not observed: the watch of ResourceClaims was lost from 2026-11-28T10:00:00Z to "
            "2026-11-28T10:05:00Z; the first observation is 2026-11-28T10:05:01Z, so this may have begun as early "
            "as 2026-11-28T10:00:00Z and lasted longer than stated") in text
    assert text.count("start not observed") == 1  # not the 03:00 sharing, nor the gap's own finding
    assert "end not observed" not in text


def test_a_crash_and_restart_is_listed_as_collector_not_running_with_its_reason(sessions, tmp_path, bundle):
    """As the recorder writes it after a crash (collector.kube.recorder.CRASHED_REASON): a closed
    'stopped' interval, shown under "Collector not running" with its end and why, counted in
    section 2's not-running time, and not a gap."""
    from collector.kube.recorder import CRASHED_REASON

    fill_store(sessions)
    with sessions.begin() as s:
        row = {"cluster": CLUSTER, "kind": "ResourceClaim", "state": "stopped", "started_ns": ns(12),
               "ended_ns": ns(12.25), "from_rv": "1500", "to_rv": "1510", "reason": CRASHED_REASON}
        cid = s.execute(insert(CoverageInterval).values(**row).returning(CoverageInterval.id)).scalar_one()
        ledger.append(s, "coverage_intervals", [{**row, "id": cid}])
    result = render(sessions, tmp_path / "pack", bundle, pdf=False)
    html = (result.path / "index.html").read_text()
    coverage_html = html[html.index('<section id="coverage">'):html.index('<section id="inventory">')]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", coverage_html))
    assert "Collector not running" in text and "2026-11-28T12:15:00Z" in text and CRASHED_REASON in text
    rc = next(k for k in result_meta(result.path)["coverage"]["kinds"] if k["kind"] == "ResourceClaim")
    assert (rc["gaps"], rc["stopped_s"]) == (1, 900.0)
