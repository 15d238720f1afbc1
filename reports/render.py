"""Render an evidence pack from the store: populations, HTML, PDF, controls, manifest, signature, archive.

Reproducibility: the pack depends only on the store's content, the scope and the collector version.
Its id is derived from those inputs; its date is the period end (also the PDF creation date and
the archive's file times); every query has a total order. Rendering twice from the same store
gives byte-identical files. The ledger anchor is the last ledger entry that is not itself a pack
record, so recording a pack does not change the next rendering of the same period.

The pack is assembled in a temporary sibling directory and renamed into place at the end: a
failed rendering leaves no half-written pack behind.
"""

from __future__ import annotations

import gzip
import json
import logging
import multiprocessing
import os
import shutil
import tarfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from collector import __version__
from collector.errors import UserError
from collector.kube.projections import is_gpu_device
from collector.policy.period import future_end_error
from collector.store import ledger
from collector.store.canonical import canonical_json, sha256_hex
from collector.store.models import (AttributionSettings, EvidencePack, InferenceRecord, LedgerEntry, Lineage,
                                     ObjectVersion)
from collector.timeutil import dt_to_ns, ns_to_dt, ns_to_rfc3339, utcnow
from reports import policy_coverage as polcov
from reports import populations as pop
from reports import scope_names
from reports.controls import SECTIONS, PackFacts, PolicyCoverage, controls_document, share_text
from reports.finding_scope import scoped_evaluations, scoped_findings
from reports.finding_text import Allocation, FindingFacts, describe, duration_text, unobserved_start
from reports.manifest import (
    FileDigest,
    INTEGRITY_FILES,
    MANIFEST_NAME,
    SIGNATURE_NAME,
    Sha256,
    build_manifest,
    manifest_bytes,
    public_key_id,
    sign_manifest,
)
from reports.timeline import SHARING_COLUMNS, Bar, legend, sharing_segments, timeline_svgs

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).resolve().parent / "templates"
# Sample sizes in the HTML/PDF (the full populations are in data/). WeasyPrint's layout and drawing time
# grows with every table cell and SVG rect: these bound the PDF's cost whatever the period holds.
HTML_ROW_LIMIT = 50  # rows per table
FINDING_DETAIL_LIMIT = 20  # findings spelt out one by one; all are counted by rule
TIMELINE_GPU_LIMIT = 60  # lanes drawn
CHANGE_COLUMNS = ("change_type", "cluster", "subject", "at", "at_ns", "from_value", "to_value", "detail", "source_id")
CHUNK_BYTES = 1 << 20
PARALLEL_PDF_MIN_TRANSACTIONS = 200_000  # below this, a worker process costs more (start-up) than it saves
# What a lineage status or reason code means (collector/lineage.py decides them), shown next to the counts.
STATUS_MEANINGS = {
    "exact": "one device of the container's claim was allocated at the transaction time, with no allocation "
             "change within the clock-skew tolerance",
    "skew-window": "an allocation change lies within the clock-skew tolerance of the transaction time",
    "several-pods": "more than one pod matched the transaction's pod reference",
    "several-devices": "the claim's request had more than one device at that time",
    "coverage-gap": "the transaction time lies in an observation gap or while the collector was not running "
                    "(section 2): no device is stated",
    "no-pod": "no pod matched the transaction's pod reference at that time",
    "no-claim": "the pod had no claim for the transaction's container at that time",
    "no-allocation": "the claim was not allocated at that time",
    "no-device-record": "no ResourceSlice record of a GPU among the allocated devices within the tolerance of the "
                        "allocation (none published, published late, or none of them a GPU: a NIC)",
    "pod-identity-conflict": "the record's pod uid belongs to a pod whose namespace, name or node at that time is "
                             "not the one the record names: the record contradicts itself, no device is stated",
    "unknown-cluster": "the record names a cluster this store holds no watch history of (re-evaluated once the "
                       "watcher has recorded it)",
    pop.NOT_ATTRIBUTED: "logged but the attribution job has not processed it yet",
}
# What one row of each population file is (the scope section lists the files with their row counts).
POPULATION_ROWS = {
    "inventory": "a device published in a ResourceSlice, over the interval its attributes held",
    "allocation_episodes": "a device allocated to a claim (allocation result), over the claim's allocation",
    "consumer_intervals": "a pod reserving an allocated claim (status.reservedFor), over that interval",
    "transaction_lineage": "a logged transaction with the pod, claim, device and physical GPU that served it, the "
                           "other namespaces holding that GPU throughout the clock-skew tolerance around it "
                           "(co_tenant_namespaces) and those holding it at some instant within the tolerance "
                           "only, which may have held it at the transaction's instant "
                           "(co_tenant_namespaces_possible); "
                           "conflict is true when the record repeats a transaction id stored before with "
                           "different content",
    "findings": "a policy decision (rule, severity, subjects, evidence), once per decision however many bundle "
                "revisions found it (bundle_revision and bundle_digest then list them, separated by \"; \")",
    "coverage": "an interval in which the watcher was synced, or a gap, per cluster and kind",
    "sharing": "an interval in which two or more claims held the same physical GPU",
    "changes": "a DeviceClass version, GPU driver-version change or policy bundle revision",
    "policy_coverage": "how much of the period the policy evaluations covered, per cluster: overall (any bundle; "
                       "overall true) and per bundle revision, with the stretches evaluated and not evaluated",
}
CHANGE_LABELS = {"DeviceClass": "DeviceClass version", "driver_version": "GPU driver version",
                 "policy_bundle": "policy bundle revision"}
# counts in the order they were written before the lineage moved last (it is part of the pack id)
COUNT_ORDER = ("inventory", "allocation_episodes", "consumer_intervals", "transaction_lineage", "findings", "coverage",
               "sharing", "changes", "policy_coverage")


@dataclass(frozen=True)
class PackRequest:
    """What to render: period ``[period_from, period_to)`` (aware UTC), clusters and namespaces (empty = all)."""

    period_from: datetime
    period_to: datetime
    clusters: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.period_from.tzinfo is None or self.period_to.tzinfo is None:
            raise UserError("--from/--to must carry a time zone (UTC)")
        if self.period_to <= self.period_from:
            raise UserError(f"--to {self.period_to.isoformat()} must be after --from {self.period_from.isoformat()}")


def refuse_future_period(request: PackRequest, now: datetime) -> None:
    """Refuse a period that ends after ``now``.

    A pack states what was observed in a period that has ended, and is dated by its end: a future
    end would count hours that have not happened as "collector not running", date the pack (and
    the archive's file times) in the future, and differ when rendered again later. A scheduled
    daily pack is always for the previous day.

    Raises:
        UserError: naming ``--to``, the current time and what to give instead.
    """
    error = future_end_error(request.period_to, now, "a pack")
    if error:
        raise UserError(error)


@dataclass
class PackResult:
    """Outcome of ``render_pack``: where it is, its id, manifest digest, row counts, archive path."""

    path: Path
    pack_id: str
    manifest_sha256: str
    counts: dict[str, int]
    archive: Path | None = None
    recorded: bool = False
    signed: bool = False
    files: list[FileDigest] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)  # wall seconds per phase (for benchmarks and logs)
    observed: bool = True  # the collector ran at some point of the period (what the pack's sections say)
    bundles_evaluated: int = 0  # policy bundle revisions evaluated over the period
    not_attributed: int = 0  # transactions of the period no attribution run has processed yet
    # the least evaluated cluster when policy evaluations covered only part of the period (else None)
    policy_partial: PolicyCoverage | None = None
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds of this process (all threads) per phase


def _partial(policy_rows: list[dict[str, Any]]) -> PolicyCoverage | None:
    """``polcov.lowest`` of the rows when some cluster was evaluated for part of the period only."""
    low = polcov.lowest(policy_rows)
    return low if low is not None and low.any_evaluated and low.partial else None


def _fmt_dt(ns: int | None) -> str:
    return ns_to_rfc3339(ns) or "—"


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "—"
    gib = n / 2**30
    return f"{gib:.1f} GiB" if gib >= 1 else f"{n / 2**20:.0f} MiB"


def _fmt_uuid(value: str | None) -> Markup:
    """A UUID (or device key) that may wrap only after its hyphens: ``<wbr>`` there, and the
    ``uuid`` class turns off breaking anywhere else. ``—`` for None."""
    if value is None:
        return Markup("—")
    return Markup('<span class="uuid">{}</span>').format(Markup("-<wbr>").join(str(value).split("-")))


def _fmt_s(seconds: float) -> str:
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else (f"{m}m {sec:02d}s" if m else f"{seconds:.3f}s".rstrip("0").rstrip("."))


def tenant_map(bundle_dir: Path | None) -> dict[str, str]:
    """Namespace → tenant from the policy bundle's ``data.json``; empty when absent (tenant = namespace).

    Accepts ``{"namespace_tenants": {ns: tenant}}``, ``{"tenants": {ns: tenant}}`` or
    ``{"tenants": {tenant: [ns, ...]}}``, at the top level or under ``draudit``.
    """
    if bundle_dir is None:
        return {}
    path = Path(bundle_dir) / "data.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    for doc in (data, data.get("draudit") if isinstance(data, dict) else None):
        if not isinstance(doc, dict):
            continue
        for key in ("namespace_tenants", "tenants"):
            value = doc.get(key)
            if isinstance(value, dict) and value and all(isinstance(v, str) for v in value.values()):
                return {str(k): v for k, v in value.items()}
            if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
                return {str(ns): str(t) for t, nss in value.items() for ns in nss}
    return {}


def ledger_anchor(session: Session) -> tuple[int, str]:
    """(seq, entry_hash) of the last ledger entry that is not an ``evidence_packs`` record; (0, zeros) if none."""
    row = session.execute(select(LedgerEntry.seq, LedgerEntry.entry_hash)
                          .where(LedgerEntry.table_name != "evidence_packs")
                          .order_by(LedgerEntry.seq.desc()).limit(1)).first()
    return (row.seq, row.entry_hash) if row else (0, "0" * 64)


def digest_file(path: Path, rel: str) -> FileDigest:
    """Size and SHA-256 of a file on disk, read in 1 MiB chunks."""
    h, size = Sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            h.update(chunk)
            size += len(chunk)
    return FileDigest(rel, size, h.hexdigest())


def pack_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, absolute path) of every regular file under ``root``, sorted by relative path."""
    found = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            found.append((p.relative_to(root).as_posix(), p))
    yield from sorted(found)


# ------------------------------------------------------------------------------------------ gather


class _Collector:
    """Compact summaries gathered while the populations stream past (bounded by devices and claims)."""

    def __init__(self, scope: pop.Scope, stops: dict[str, int]) -> None:
        self.scope = scope
        self.stops = stops  # cluster → last observation (collector stopped before the period end)
        self.gpus: dict[tuple[str, str], dict[str, Any]] = {}
        self.migs: dict[tuple[str, str], dict[str, Any]] = {}
        self.driver_seq: dict[tuple[str, str, str, str], list[tuple[int, str | None, str | None, str | None, int]]] = {}
        self.bars: list[Bar] = []
        self.facts = FindingFacts()

    def inventory_row(self, r) -> None:
        d = dict(zip(pop.INVENTORY_COLUMNS, r))
        physical = d["physical_gpu_uuid"]
        if physical:
            g = self.gpus.setdefault((d["cluster"], physical), {
                "cluster": d["cluster"], "uuid": physical, "node": d["node_name"], "product": None, "memory": None,
                "driver_versions": set(), "mig": 0, "devices": set()})
            g["devices"].add(f"{d['driver']}/{d['pool']}/{d['device']}")
            if d["driver_version"]:
                g["driver_versions"].add(d["driver_version"])
            if d["device_type"] == "mig" or d["mig_profile"]:
                self.migs[(d["cluster"], d["device_uuid"] or d["device"])] = {
                    "uuid": d["device_uuid"] or "—", "parent": physical, "profile": d["mig_profile"],
                    "node": d["node_name"], "memory": d["memory_bytes"], "device": d["device"]}
                g["mig"] = len({k for k, m in self.migs.items() if m["parent"] == physical and k[0] == d["cluster"]})
            else:
                g["product"] = d["product_name"] or g["product"]
                g["memory"] = d["memory_bytes"] or g["memory"]
                g["node"] = d["node_name"] or g["node"]
            if g["product"] is None and d["product_name"]:
                g["product"] = d["product_name"]
        key = (d["cluster"], d["driver"], d["pool"], d["device"])
        self.driver_seq.setdefault(key, []).append((d["valid_from_ns"], d["driver_version"], physical, d["node_name"],
                                                   d["device_state_id"]))

    def bar(self, d: dict[str, Any]) -> Bar:
        """The timeline bar of an allocation-episodes row (``d`` keyed by ``pop.EPISODE_COLUMNS``): an
        allocation still open when its cluster's collector stopped ends at that last observation, flagged."""
        stop = self.stops.get(d["cluster"]) if d["valid_to_ns"] is None else None
        return Bar(
            physical_gpu_uuid=d["physical_gpu_uuid"] or f"unresolved:{d['driver']}/{d['pool']}/{d['device']}",
            node_name=d["node_name"], device_key=f"{d['driver']}/{d['pool']}/{d['device']}",
            device_type=d["device_type"], device_uuid=d["device_uuid"], mig_profile=d["mig_profile"],
            tenant=d["tenant"], namespace=d["claim_namespace"], claim_name=d["claim_name"], claim_uid=d["claim_uid"],
            from_ns=d["valid_from_ns"], to_ns=d["valid_to_ns"] if stop is None else max(stop, d["valid_from_ns"]),
            admin_access=d["admin_access"], stopped_at_ns=stop)

    def episode_row(self, r) -> None:
        d = dict(zip(pop.EPISODE_COLUMNS, r))
        stop = self.stops.get(d["cluster"]) if d["valid_to_ns"] is None else None
        if is_gpu_device(d["device_type"], d["driver"]):  # a NIC's allocations share no GPU: no lane, no bar
            self.bars.append(self.bar(d))
        self.facts.add_allocation(Allocation(
            d["allocation_result_id"], d["episode_id"], d["claim_namespace"], d["claim_name"],
            f"{d['driver']}/{d['pool']}/{d['device']}", d["physical_gpu_uuid"], d["node_name"], d["mig_profile"],
            d["valid_from_ns"], d["valid_to_ns"], stop))

    def consumer_row(self, r) -> None:
        d = dict(zip(pop.CONSUMER_COLUMNS, r))
        self.facts.add_consumer(d["claim_namespace"], d["claim_name"], d["consumer_name"], d["valid_from_ns"],
                                d["valid_to_ns"])

    def driver_changes(self) -> list[dict[str, Any]]:
        """Driver-version changes per physical GPU (one row even when several MIG devices republish)."""
        seen: dict[tuple, dict[str, Any]] = {}
        for (cluster, driver, pool, device), seq in self.driver_seq.items():
            seq.sort()
            for prev, cur in zip(seq, seq[1:]):
                if prev[1] != cur[1] and cur[0] >= self.scope.from_ns:
                    subject = cur[2] or f"{driver}/{pool}/{device}"
                    seen.setdefault((cluster, subject, cur[0], prev[1], cur[1]), {
                        "change_type": "driver_version", "cluster": cluster, "subject": subject,
                        "at": ns_to_rfc3339(cur[0]), "at_ns": cur[0], "from_value": prev[1], "to_value": cur[1],
                        "detail": f"node {cur[3] or '?'}, device {driver}/{pool}/{device}", "source_id": cur[4]})
        return [seen[k] for k in sorted(seen, key=lambda k: (k[2], k[0], k[1]))]


def _device_class_changes(session: Session, scope: pop.Scope) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(DeviceClass versions observed in the period, DeviceClasses in force during it)."""
    ov = ObjectVersion
    cluster_ok = pop.in_clusters(ov.cluster, scope)
    rows = session.execute(select(ov.id, ov.cluster, ov.name, ov.uid, ov.resource_version, ov.event_type,
                                  ov.observed_at, ov.content_hash, ov.raw)
                           .where(ov.kind == "DeviceClass", cluster_ok, ov.observed_at < ns_to_dt(scope.to_ns))
                           .order_by(ov.cluster, ov.uid, ov.observed_at, ov.id)).all()
    changes, latest = [], {}
    for r in rows:
        at_ns = dt_to_ns(r.observed_at)
        if at_ns >= scope.from_ns:
            changes.append({"change_type": "DeviceClass", "cluster": r.cluster, "subject": r.name,
                            "at": ns_to_rfc3339(at_ns), "at_ns": at_ns, "from_value": None,
                            "to_value": f"resourceVersion {r.resource_version}",
                            "detail": f"watch event {r.event_type}, content SHA-256 {r.content_hash[:16]}…",
                            "source_id": r.id})
        latest.setdefault((r.cluster, r.uid), []).append(r)
    in_force = []
    for (cluster, _uid), versions in sorted(latest.items()):
        before = [v for v in versions if dt_to_ns(v.observed_at) < scope.from_ns]
        during = [v for v in versions if dt_to_ns(v.observed_at) >= scope.from_ns]
        if before and before[-1].event_type.endswith("DELETED") and not during:
            continue
        last = versions[-1]
        selectors = ((last.raw or {}).get("spec") or {}).get("selectors") or []
        cel = "; ".join(str((s.get("cel") or {}).get("expression", "")) for s in selectors if isinstance(s, dict))
        in_force.append({"cluster": cluster, "name": last.name, "resource_version": last.resource_version,
                         "deleted": last.event_type.endswith("DELETED"), "selectors": cel or "—"})
    changes.sort(key=lambda c: (c["at_ns"], c["cluster"], c["subject"], c["source_id"]))
    return changes, in_force


def _bundle_changes(findings: list[dict[str, Any]], evaluations: list[dict[str, Any]],
                    scope: pop.Scope) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(policy bundle revision changes in the period, the bundles evaluated over it).

    A bundle counts when it produced a finding of the pack or was evaluated over the period
    (``policy_evaluations``, also when it found nothing: the compliant case); ``findings`` is the
    number of the pack's findings it decided.

    A change is a bundle's first evaluation; it is listed only when that instant lies in the period
    ``[from, to)``: a period's findings are usually evaluated after it ends, and the "changes in the
    period" table must not date a revision into it. Every bundle, with its first and last evaluation,
    is in the second list whatever its times.
    """
    bundles: dict[tuple[str, str], dict[str, Any]] = {}
    for f in [*findings, *evaluations]:
        # a finding of the pack may have been found by several bundles (reports.finding_scope)
        for d in _deciders(f):
            b = bundles.setdefault((d["revision"], d["digest"]), {
                "revision": d["revision"], "digest": d["digest"], "first": d["evaluated_at"],
                "last": d["evaluated_at"], "findings": 0, "engines": set()})
            b["first"], b["last"] = min(b["first"], d["evaluated_at"]), max(b["last"], d["evaluated_at"])
            b["engines"].add(d["engine"])
    for f in findings:
        for d in _deciders(f):
            bundles[(d["revision"], d["digest"])]["findings"] += 1
    ordered = sorted(bundles.values(), key=lambda b: (b["first"], b["revision"], b["digest"]))
    for b in ordered:
        b["engines"] = ", ".join(sorted(b["engines"]))
    changes = [{"change_type": "policy_bundle", "cluster": None, "subject": "policy bundle", "at": b["first"],
                "at_ns": _evaluated_ns(b["first"]), "from_value": prev["revision"] if prev else None,
                "to_value": b["revision"], "detail": f"digest {b['digest']}", "source_id": None}
               for prev, b in zip([None] + ordered[:-1], ordered)]
    return [c for c in changes if scope.from_ns <= c["at_ns"] < scope.to_ns], ordered


def _deciders(row: dict[str, Any]) -> list[dict[str, Any]]:
    """``{revision, digest, engine, evaluated_at}`` of every bundle behind a pack finding (its
    ``bundles``: several bundles may have found it, ``reports.finding_scope``) or an evaluation row."""
    if "bundles" in row:
        return row["bundles"]
    return [{"revision": row["bundle_revision"], "digest": row["bundle_digest"], "engine": row["engine"],
             "evaluated_at": row["evaluated_at"]}]


def _evaluated_ns(evaluated_at: str) -> int:
    """UTC ns of a finding's ``evaluated_at`` text (``%Y-%m-%dT%H:%M:%S.%fZ``, ``reports.finding_scope``)."""
    return dt_to_ns(datetime.strptime(evaluated_at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc))


@dataclass(frozen=True)
class LineageSummary:
    """The transactions in scope counted in one pass: by status and reason (``by_status``), by
    physical GPU (``by_gpu``, ascending UUID), those whose lineage names no GPU (``no_gpu``: no
    pod, claim or allocation, several devices, not attributed yet; same keys, ``gpu`` None; None
    when there are none), in all (``total`` = the sum of the ``by_gpu`` and ``no_gpu`` totals: the
    table in section 7 reconciles with it), and the lineage rows by the clock-skew tolerance
    (seconds, None = not recorded) they were computed with (``tolerances``, ascending, None last),
    as ``collector.lineage.tolerances_in_use`` counts them. ``undecided``: the records without a
    decision (the transaction's other log lines, which share its id)."""

    by_status: list[dict[str, Any]]
    by_gpu: list[dict[str, Any]]
    total: int
    tolerances: dict[float | None, int]
    no_gpu: dict[str, Any] | None = None
    undecided: int = 0  # records without a decision: a transaction's other log lines (ids in Spring's MDC)


def _lineage_summary(session: Session, scope: pop.Scope) -> LineageSummary:
    """One GROUP BY pass over the transactions in scope and their lineage rows (``LineageSummary``).

    The tolerances are counted here by each row's ``settings_id``, not by a second pass joining every
    lineage row to ``attribution_settings`` (at 10 M transactions that pass took 59–323 s on SQLite);
    the few settings rows are read afterwards.
    """
    i, l = InferenceRecord, Lineage
    postgresql = session.get_bind().dialect.name == "postgresql"
    if postgresql:
        # JIT compiling this plan cost ≈ 0.5-0.8 s, more than it saved (1 M transactions). Sorting: the
        # planner guesses ~10 % of the rows are distinct groups and sorts them all (10 M rows: an
        # external merge sort, 44 s); there are a few thousand groups at most (GPUs x statuses), which a
        # hash aggregate holds in under 1 MiB (21 s).
        session.execute(text("SET LOCAL jit = off"))
        session.execute(text("SET LOCAL enable_sort = off"))
    rows = session.execute(select(l.physical_gpu_uuid, l.status, l.reason, l.settings_id, func.count(),
                                  func.count(i.decision))  # records with a decision (a scored transaction)
                           .select_from(i).outerjoin(l, l.record_id == i.id).where(pop.lineage_filter(scope))
                           .group_by(l.physical_gpu_uuid, l.status, l.reason, l.settings_id)).all()
    if postgresql:
        session.execute(text("RESET jit"))
        session.execute(text("RESET enable_sort"))
    statuses: dict[tuple[str, str | None], int] = {}
    by_gpu: dict[str, dict[str, Any]] = {}
    by_settings: dict[int | None, int] = {}
    undecided = 0
    for gpu, st, reason, settings_id, n, decided in rows:
        undecided += n - decided
        if st is not None:  # a lineage row (its status is never null)
            by_settings[settings_id] = by_settings.get(settings_id, 0) + n
        st = st if st is not None else pop.NOT_ATTRIBUTED
        statuses[(st, reason)] = statuses.get((st, reason), 0) + n
        # every transaction counts in one row, a GPU's or "no GPU", so the table adds up to the total
        g = by_gpu.setdefault(gpu, {"gpu": gpu, "exact": 0, "ambiguous": 0, "other": 0, "total": 0})
        g[st if st in ("exact", "ambiguous") else "other"] += n
        g["total"] += n
    by_status = [{"status": st, "reason": reason or "—", "count": n}
                 for (st, reason), n in sorted(statuses.items(), key=lambda kv: (kv[0][0], kv[0][1] is None, kv[0][1] or ""))]
    return LineageSummary(by_status, [by_gpu[g] for g in sorted(g for g in by_gpu if g is not None)],
                          sum(statuses.values()), _tolerances(session, by_settings), by_gpu.get(None), undecided)


def _tolerances(session: Session, by_settings: dict[int | None, int]) -> dict[float | None, int]:
    """Lineage rows per ``settings_id`` → per clock-skew tolerance in seconds (None: no settings
    recorded, or the settings row is missing), ascending with None last."""
    ids = sorted(k for k in by_settings if k is not None)
    skew_ns = dict(session.execute(select(AttributionSettings.id, AttributionSettings.clock_skew_ns)
                                   .where(AttributionSettings.id.in_(ids))).all()) if ids else {}
    found: dict[float | None, int] = {}
    for settings_id, n in by_settings.items():
        ns = skew_ns.get(settings_id)
        key = None if ns is None else ns / 1_000_000_000
        found[key] = found.get(key, 0) + n
    return {k: found[k] for k in sorted(found, key=lambda k: (k is None, k or 0.0))}


def _transactions(n: int) -> str:
    return f"{n:,} transaction{'' if n == 1 else 's'}"


def _skew_tolerances(found: dict[float | None, int], setting_s: float) -> dict[str, Any]:
    """The clock-skew tolerance(s) the stored lineage in scope was computed with, from ``found``
    (``LineageSummary.tolerances``).

    Returns ``rows``: ``[{"tolerance_s": seconds or None (not recorded), "lineage_rows": n}]``
    ascending; ``single``: the tolerance when every row recorded the same one, else None (several,
    or rows without recorded settings, or no row); ``text``: the same in words for the methodology,
    naming ``setting_s`` (the collector's current setting) where the store does not tell.
    """
    rows = [{"tolerance_s": t, "lineage_rows": n} for t, n in found.items()]
    known = [t for t in found if t is not None]
    single = known[0] if len(known) == 1 and None not in found else None
    if not found:
        text = f"no transaction in the period was attributed; the collector's setting at rendering is {setting_s:g} s"
    elif single is not None:
        text = f"{single:g} s (the tolerance every attribution in the period was computed with)"
    else:
        parts = [f"{t:g} s for {_transactions(n)}" for t, n in found.items() if t is not None]
        if None in found:
            parts.append(f"not recorded for {_transactions(found[None])} (the collector's setting at rendering "
                         f"is {setting_s:g} s)")
        text = "as each row was computed: " + "; ".join(parts)
    return {"rows": rows, "single": single, "text": text}


# ------------------------------------------------------------------------------------------ render


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(["html", "j2", "xml"]),
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["dt"] = _fmt_dt
    env.filters["bytes"] = _fmt_bytes
    env.filters["dur"] = _fmt_s
    env.filters["pct"] = share_text
    env.filters["uuid"] = _fmt_uuid
    env.globals["duration"] = duration_text
    env.filters["n"] = lambda v: f"{v:,}"  # thousands separated: 1,000,000
    return env


def render_pack(sessions: sessionmaker[Session], request: PackRequest, out_dir: Path, *,
                sign_key: Ed25519PrivateKey | None = None, archive: bool = False, record: bool = True,
                policy_bundle: Path | None = None, clock_skew_s: float = 2.0, pdf: bool = True,
                now: datetime | None = None) -> PackResult:
    """Render an evidence pack for ``request`` into ``out_dir`` (which must not exist or be empty).

    Args:
        sessions: session factory on a migrated store.
        request: period and scope.
        out_dir: the pack directory to create.
        sign_key: Ed25519 private key; when given, ``manifest.sig`` is written.
        archive: also write ``<out_dir>.tar.gz`` (deterministic: sorted members, times = period end).
        record: insert the pack into ``evidence_packs`` and the ledger (skipped if the pack id exists).
        policy_bundle: directory whose ``data.json`` maps namespaces to tenants (optional).
        clock_skew_s: the collector's clock-skew setting; the pack states the tolerance(s) the stored
            lineage was computed with (counted as ``collector.lineage.tolerances_in_use`` does), and this setting
            only for rows computed without recorded settings or when no row is in scope.
        pdf: render ``report.pdf`` (benchmarks may skip it to measure the populations alone).
        now: the current time (aware UTC; default: the system clock; the scheduler passes its clock).

    Returns:
        ``PackResult``.

    Raises:
        UserError: ``out_dir`` exists and is not empty, or cannot be written; the period ends after
            ``now`` (``refuse_future_period``).
    """
    refuse_future_period(request, now or utcnow())
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UserError(f"--out {out_dir}: exists and is not an empty directory; choose a new directory")
    scope = pop.Scope(dt_to_ns(request.period_from), dt_to_ns(request.period_to), tuple(sorted(set(request.clusters))),
                      tuple(sorted(set(request.namespaces))), tenant_map(policy_bundle))
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "data").mkdir(parents=True)
    except OSError as exc:
        raise UserError(f"--out {out_dir}: cannot create it ({exc.strerror})") from None
    timings: dict[str, float] = {}
    cpu: dict[str, float] = {}
    mark, cpu_mark = time.perf_counter(), time.process_time()

    def lap(phase: str) -> None:
        nonlocal mark, cpu_mark
        now, cpu_now = time.perf_counter(), time.process_time()
        timings[phase], cpu[phase] = round(now - mark, 3), round(cpu_now - cpu_mark, 3)
        mark, cpu_mark = now, cpu_now

    try:
        with sessions() as session:
            if session.get_bind().dialect.name == "postgresql":
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})  # one snapshot
            context, meta, digests = _gather_and_write(session, scope, tmp / "data", clock_skew_s, lap,
                                                       signed=sign_key is not None)
            pack_id = meta["pack_id"]
            html = _environment().get_template("report.html.j2").render(**context)
            digests.append(_write_text(tmp, "index.html", html))
            lap("html")
            # The PDF depends only on the HTML: with a large population it is laid out in a child
            # process while this one streams the transactions (WeasyPrint is CPU-bound Python).
            pdf_job = None
            if pdf and context["transactions"] >= PARALLEL_PDF_MIN_TRANSACTIONS:
                pdf_job = _pdf_pool().submit(_write_pdf, html, tmp / "report.pdf", pack_id, scope.to_ns)
            try:
                lineage = pop.write_lineage(session, scope, tmp / "data", co_tenancy=context["co_tenancy"],
                                            expected_rows=meta["counts"]["transaction_lineage"])
            except BaseException:
                if pdf_job is not None:
                    pdf_job.cancel()
                raise
            if lineage.count != meta["counts"]["transaction_lineage"]:
                raise RuntimeError(f"transaction lineage: {lineage.count} rows written but {meta['counts']['transaction_lineage']} "
                                   "counted in the same snapshot")
            digests.extend(lineage.files)
            lap("transaction_lineage")
        if pdf_job is not None:
            pdf_job.result()
        elif pdf:
            _write_pdf(html, tmp / "report.pdf", pack_id, scope.to_ns)
        lap("pdf_wait" if pdf_job is not None else "pdf")
        signed = sign_key is not None
        digests.append(_write_text(tmp, "controls.json", json.dumps(context["controls_doc"], indent=2, sort_keys=True,
                                                                    ensure_ascii=False) + "\n"))
        known = {d.path: d for d in digests}
        files = [known.get(rel) or digest_file(p, rel) for rel, p in pack_files(tmp) if rel not in INTEGRITY_FILES]
        manifest = build_manifest(meta, files, public_key_id(sign_key.public_key()) if signed else None)
        data = manifest_bytes(manifest)
        (tmp / MANIFEST_NAME).write_bytes(data)
        if signed:
            (tmp / SIGNATURE_NAME).write_bytes(sign_manifest(data, sign_key))
        if out_dir.exists():
            out_dir.rmdir()
        tmp.rename(out_dir)
        lap("manifest")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result = PackResult(out_dir, pack_id, sha256_hex(data), context["counts"], signed=signed, files=files,
                        timings_s=timings, cpu_s=cpu, observed=context["observed"],
                        bundles_evaluated=len(context["bundles"]), policy_partial=_partial(context["policy_coverage"]),
                        not_attributed=sum(r["count"] for r in context["lineage_by_status"]
                                           if r["status"] == pop.NOT_ATTRIBUTED))
    log.info("pack %s rendered: %s", pack_id, ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    if archive:
        result.archive = write_archive(out_dir, out_dir.with_name(out_dir.name + ".tar.gz"), scope.to_ns)
    if record:
        result.recorded = record_pack(sessions, meta, out_dir, result.manifest_sha256)
    return result


def _gather_and_write(session: Session, scope: pop.Scope, data_dir: Path, clock_skew_s: float,
                      lap: Callable[[str], None], signed: bool):
    """Write every population except the transaction lineage (whose count comes from its SQL summary)
    and gather the template context; ``lap(phase)`` is called after each phase (timings).
    Returns (context, manifest metadata, digests of the files written)."""
    coverage = pop.coverage(session, scope)  # first: where the collector stopped bounds what the pack states
    stops = pop.collector_stops(coverage, scope)
    # the populations flag intervals open at a stopped collector's last observation, as the HTML does
    scope = pop.Scope(scope.from_ns, scope.to_ns, scope.clusters, scope.namespaces, scope.tenants, stops)
    col = _Collector(scope, stops)
    col.facts.stops = stops
    col.facts.scope_namespaces = scope.namespaces
    for iv in coverage:  # where ResourceClaims were not observed: allocations first seen there began earlier
        if iv["kind"] == "ResourceClaim" and iv["state"] != "synced" and iv["ended_ns"] is not None:
            col.facts.blind.setdefault(iv["cluster"], []).append((iv["started_ns"], iv["ended_ns"], iv["state"]))
    counts: dict[str, int] = {}
    written: list[pop.WrittenPopulation] = []
    sinks = {"inventory": col.inventory_row, "allocation_episodes": col.episode_row,
             "consumer_intervals": col.consumer_row}
    for population in pop.STREAMED:
        if population.name == "transaction_lineage":
            continue  # written by pop.write_lineage, rendered to text in SQL
        written.append(pop.write_rows(data_dir, population.name, population.columns,
                                      pop.stream(session, population, scope), sinks.get(population.name)))
        lap(population.name)
    in_scope = scoped_findings(session, scope)
    findings = in_scope.findings
    written.append(pop.write_dicts(data_dir, "findings", pop.FINDING_COLUMNS, findings))
    written.append(pop.write_dicts(data_dir, "coverage", pop.COVERAGE_COLUMNS, coverage))
    cov_summary = pop.coverage_summary(coverage, scope)
    segments, beside = _sharing(session, scope, col)
    col.facts.sharing = [(s.physical_gpu_uuid, s.from_ns, s.to_ns, s.claims, s.partitioned) for s in segments]
    written.append(pop.write_dicts(data_dir, "sharing", SHARING_COLUMNS, (s.row() for s in segments)))
    dc_changes, device_classes = _device_class_changes(session, scope)
    evaluations = scoped_evaluations(session, scope)
    bundle_changes, bundles = _bundle_changes(findings, evaluations, scope)
    changes = dc_changes + col.driver_changes() + bundle_changes
    written.append(pop.write_dicts(data_dir, "changes", CHANGE_COLUMNS, changes))
    policy_rows = polcov.scope_rows(session, scope, evaluations, (k["cluster"] for k in cov_summary))
    written.append(pop.write_dicts(data_dir, "policy_coverage", polcov.COLUMNS, policy_rows))
    lap("findings_coverage_sharing_changes")
    summary = _lineage_summary(session, scope)
    by_status, by_gpu, total_txn = summary.by_status, summary.by_gpu, summary.total
    skew = _skew_tolerances(summary.tolerances, clock_skew_s)
    lap("lineage_summary")
    for w in written:
        counts[w.name] = w.count
    counts["transaction_lineage"] = total_txn
    counts = {name: counts[name] for name in COUNT_ORDER}
    anchor_seq, anchor_hash = ledger_anchor(session)

    period = {"from": ns_to_rfc3339(scope.from_ns), "to": ns_to_rfc3339(scope.to_ns), "from_ns": scope.from_ns,
              "to_ns": scope.to_ns}
    scope_doc = {"clusters": list(scope.clusters) or ["*"], "namespaces": list(scope.namespaces) or ["*"]}
    bundle_doc = [{"revision": b["revision"], "digest": b["digest"]} for b in bundles]
    identity = {"period": period, "scope": scope_doc, "collector": __version__, "bundles": bundle_doc,
                "ledger": [anchor_seq, anchor_hash], "counts": counts}
    pack_id = sha256_hex(canonical_json(identity))[:32]
    gaps = [c for c in coverage if c["state"] not in ("synced", pop.STOPPED)]
    # the collector ran (synced or in a gap) at some point of the period; otherwise every state shown
    # is carried from before it and the pack says so instead of stating it as a fact of the period
    observed = any(k["synced_s"] > 0 or k["gap_s"] > 0 for k in cov_summary)
    stopped = [c for c in coverage if c["state"] == pop.STOPPED]
    meta = {
        "pack_id": pack_id, "created": period["to"], "period": period, "scope": scope_doc,
        "collector": {"name": "draudit", "version": __version__},
        "policy_bundles": bundle_doc,
        "ledger": {"seq": anchor_seq, "entry_hash": anchor_hash,
                   "note": "last ledger entry covering evidence rows when the pack was rendered"},
        "coverage": {"kinds": cov_summary, "gaps": len(gaps), "collector_not_running": len(stopped),
                     "observed_in_period": observed,
                     "last_observation": {c: ns_to_rfc3339(t) for c, t in sorted(stops.items())}},
        "counts": counts,
        "findings_scope": in_scope.statement(),
        "policy_coverage": polcov.manifest_doc(policy_rows),
        "clock_skew_tolerance_s": skew["single"],
        "clock_skew_tolerances": skew["rows"],
        "quarantined": pop.quarantined(session, scope),
        "scope_never_recorded": scope_names.never_recorded(session, scope.clusters, scope.namespaces).doc(),
        "observed_before_period": scope_names.observed_before(session, scope.from_ns, scope.clusters),
    }
    drawn_bars = col.bars + beside  # the other tenant of a shared GPU is drawn beside the scoped one
    drawn_gpus = _timeline_gpus(drawn_bars, segments)
    svgs = [Markup(s) for s in timeline_svgs([b for b in drawn_bars if b.physical_gpu_uuid in drawn_gpus],
                                             scope.from_ns, scope.to_ns)]
    gpus = sorted(col.gpus.values(), key=lambda g: (g["cluster"], g["node"] or "", g["uuid"]))
    for g in gpus:
        g["driver_versions"] = ", ".join(sorted(g["driver_versions"])) or "—"
        g["devices"] = len(g["devices"])
    migs = sorted(col.migs.values(), key=lambda m: (m["parent"], m["profile"] or "", m["uuid"]))
    cross = [s for s in segments if s.cross_tenant]
    lowest = min(((k["synced_fraction"], k["cluster"], k["kind"]) for k in cov_summary), default=None)
    observed = any(k["synced_s"] > 0 for k in cov_summary)  # a cluster never watched must not hide another's
    partial_kinds = sum(1 for k in cov_summary if k["synced_fraction"] < 1)
    controls = controls_document(PackFacts(signed, counts, lowest, len(bundles), observed=observed,
                                           partial_kinds=partial_kinds, policy=polcov.lowest(policy_rows),
                                           findings=tuple((f["rule"], f["severity"]) for f in findings)))
    context = {
        "pack_id": pack_id, "meta": meta, "period": period, "scope": scope_doc, "counts": counts,
        "sections": SECTIONS, "controls": controls["controls"], "controls_doc": controls, "limit": HTML_ROW_LIMIT,
        "finding_limit": FINDING_DETAIL_LIMIT, "findings_by_rule": _findings_by_rule(findings),
        "coverage": coverage, "coverage_summary": cov_summary, "gaps": gaps, "stopped": stopped,
        "stops": {c: ns_to_rfc3339(t) for c, t in sorted(stops.items())},
        "gpus": gpus, "migs": migs, "device_classes": device_classes,
        "svgs": svgs, "legend": legend(drawn_bars), "timeline_drawn": len(drawn_gpus),
        "timeline_omitted": len({b.physical_gpu_uuid for b in drawn_bars}) - len(drawn_gpus),
        "outside_tenants": sorted({b.tenant for b in beside}),
        "cross_tenant_findings": sum(1 for f in findings if _names_two_tenants(f)),
        "resends": conflicting_resends(session, scope, total_txn),
        "undecided": summary.undecided,
        "claims": len({b.claim_uid for b in col.bars if b.from_ns < scope.to_ns and (b.to_ns is None or b.to_ns > scope.from_ns)}),
        "observed": observed,
        # coverage that supports a negative statement only for part of the period (the template qualifies it)
        "partial": ({"share": lowest[0], "cluster": lowest[1], "kind": lowest[2]}
                    if observed and lowest is not None and lowest[0] < 1 else None),
        "segments": _segment_rows(segments, col), "cross_segments": [s.row() for s in cross],
        "unpartitioned_cross": [s.row() for s in cross if not s.partitioned],
        "findings": served_during(session, scope, describe(findings, col.facts, scope.tenant_of), stops),
        "findings_scope": in_scope.statement(), "findings_by_severity": _count_by(findings, "severity", pop.SEVERITY_ORDER),
        "lineage_by_status": by_status, "lineage_by_gpu": by_gpu, "lineage_no_gpu": summary.no_gpu,
        "transactions": total_txn,
        "changes": changes, "bundles": bundles, "policy_coverage": policy_rows,
        # the clusters evaluated for less than the whole period (the template says "partially evaluated")
        "policy_partial": [r for r in polcov.deciding(policy_rows) if r["status"] != polcov.EVALUATED],
        # some stretch of the period in scope was evaluated (else the pack says "not evaluated")
        "policy_evaluated": bool(bundles) and (not policy_rows or polcov.any_evaluated(policy_rows)),
        "policy_rule": polcov.RULE, "clock_skew_s": clock_skew_s, "skew": skew, "version": __version__,
        "anchor": {"seq": anchor_seq, "hash": anchor_hash}, "co_tenancy": co_tenancy(segments, scope, clock_skew_s),
        "columns": {"inventory": pop.INVENTORY_COLUMNS, "allocation_episodes": pop.EPISODE_COLUMNS,
                    "consumer_intervals": pop.CONSUMER_COLUMNS, "transaction_lineage": pop.LINEAGE_COLUMNS,
                    "findings": pop.FINDING_COLUMNS, "coverage": pop.COVERAGE_COLUMNS, "sharing": SHARING_COLUMNS,
                    "changes": CHANGE_COLUMNS, "policy_coverage": polcov.COLUMNS},
        "status_meaning": STATUS_MEANINGS, "change_labels": CHANGE_LABELS, "population_rows": POPULATION_ROWS,
    }
    return context, meta, [f for w in written for f in w.files]


def _write_text(root: Path, rel: str, text: str) -> FileDigest:
    with pop.TextSink(root / rel) as sink:
        sink.write(text)
    return sink.digest(rel)


_PDF_POOL: ProcessPoolExecutor | None = None


def _segment_rows(segments: list[Any], col: "_Collector") -> list[dict[str, Any]]:
    """The sharing intervals' rows for the HTML (cross-tenant sharing without partitioning first),
    each with ``start_note``: ``finding_text.unobserved_start`` of its start, the GPU's cluster
    taken from the inventory (none when the UUID is in several clusters)."""
    clusters: dict[str, set[str]] = {}
    for cluster, uuid in col.gpus:
        clusters.setdefault(uuid, set()).add(cluster)

    def note(s: Any) -> str | None:
        found = clusters.get(s.physical_gpu_uuid, set())
        if len(found) != 1:
            return None
        return unobserved_start({"from_ns": s.from_ns, "cluster": next(iter(found)),
                                 "physical_gpu_uuid": s.physical_gpu_uuid}, col.facts)
    return [{**s.row(), "start_note": note(s)}
            for s in sorted(segments, key=lambda s: not (s.cross_tenant and not s.partitioned))]


def _pdf_pool() -> ProcessPoolExecutor:
    """One spawned worker process for PDF layout, started on first use and reused."""
    global _PDF_POOL
    if _PDF_POOL is None:
        _PDF_POOL = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    return _PDF_POOL


def shutdown_pdf_worker() -> None:
    """Stop the PDF worker process if one was started (it is otherwise stopped at interpreter exit)."""
    global _PDF_POOL
    if _PDF_POOL is not None:
        _PDF_POOL.shutdown(wait=True)
        _PDF_POOL = None


def co_tenancy(segments, scope: pop.Scope, clock_skew_s: float) -> pop.CoTenancyInput:
    """Per sharing interval and namespace in it, the other namespaces on the same physical GPU
    (intervals where only one namespace's claims shared the GPU have no co-tenant), for the lineage's
    co-tenant columns; with ``clock_skew_s``, the tolerance of transactions whose lineage names no
    attribution settings. An interval cut at the period's start or end (``sharing_segments`` clips
    them) is open on that side: the cut is no bound of the sharing, which a transaction near it
    would call possible only."""
    out = []
    for s in segments:
        namespaces = sorted({claim.split("/", 1)[0] for claim in s.claims})
        if len(namespaces) > 1:
            start = None if s.from_ns <= scope.from_ns else s.from_ns
            end = None if s.to_ns >= scope.to_ns else s.to_ns
            out.extend(pop.CoTenancy(s.physical_gpu_uuid, ns, start, end, ";".join(n for n in namespaces if n != ns))
                       for ns in namespaces)
    return pop.CoTenancyInput(out, int(round(clock_skew_s * 1_000_000_000)))


def _sharing(session: Session, scope: pop.Scope, col: _Collector) -> tuple[list, list[Bar]]:
    """(sharing intervals of the pack, bars of allocations outside the namespace scope that took part in them).

    Without a namespace scope: the intervals over ``col.bars`` (every allocation in the clusters).
    With one: computed over every namespace of the scoped clusters (``col.bars`` and the episodes
    of ``pop.episodes_beside_scope``), then kept when a scoped namespace took part: a scoped
    tenant's GPU was shared whoever the other tenant was, and computing over the scoped
    namespaces alone would state that nobody else held it.
    """
    if not scope.namespaces:
        return sharing_segments(col.bars, scope.from_ns, scope.to_ns), []
    others = [col.bar(d) for d in (dict(zip(pop.EPISODE_COLUMNS, row)) for row in pop.episodes_beside_scope(session, scope))
              if is_gpu_device(d["device_type"], d["driver"])]
    scoped = set(scope.namespaces)
    kept = [s for s in sharing_segments(col.bars + others, scope.from_ns, scope.to_ns)
            if any(claim.split("/", 1)[0] in scoped for claim in s.claims)]
    taking_part = {(s.physical_gpu_uuid, claim) for s in kept for claim in s.claims}
    beside = [b for b in others if (b.physical_gpu_uuid, f"{b.namespace}/{b.claim_name}") in taking_part]
    return kept, beside


def conflicting_resends(session: Session, scope: pop.Scope, records: int) -> dict[str, int]:
    """Transaction ids stored more than once with different content, among the ``records``
    transactions in scope (``pop.lineage_filter``).

    The ingest writer stores a later record whose transaction id was already stored with other
    content with ``conflict`` set (``collector.ingest.writer``), never overwriting the first. Here:
    the ids of the flagged records in scope, then how many records in scope carry each of them.

    Returns ``{"records": records, "transaction_ids": distinct ids in scope, "conflicting_ids": ids
    with a flagged record in scope, "conflicting_records": the records in scope carrying those ids}``.
    """
    i, l = InferenceRecord, Lineage
    in_scope = select(i.transaction_id).select_from(i).outerjoin(l, l.record_id == i.id).where(pop.lineage_filter(scope))
    ids = sorted(session.execute(in_scope.where(i.conflict.is_(True)).distinct()).scalars())
    copies = 0
    for k in range(0, len(ids), 500):  # SQLite's bound-parameter limit
        copies += session.execute(select(func.count()).select_from(
            in_scope.where(i.transaction_id.in_(ids[k:k + 500])).subquery())).scalar_one()
    return {"records": records, "transaction_ids": records - (copies - len(ids)), "conflicting_ids": len(ids),
            "conflicting_records": copies}


def served_during(session: Session, scope: pop.Scope, findings: list[dict[str, Any]],
                  stops: dict[str, int]) -> list[dict[str, Any]]:
    """``findings`` (described) with ``served`` set on those naming two tenants on one physical GPU
    over an interval: the transactions in scope attributed to that GPU within the interval, clipped
    to the period and to the cluster's last observation (``stops``); None on the others.

    The figure an incident classification needs (how many transactions ran on the GPU while the
    other tenant held it, DORA Art. 18); only the first ``FINDING_DETAIL_LIMIT`` findings, which the
    pack spells out, are counted (one indexed range count each).
    """
    i, l = InferenceRecord, Lineage
    out = []
    for k, f in enumerate(findings):
        served = None
        if (k < FINDING_DETAIL_LIMIT and f.get("physical_gpu_uuid") and f.get("from_ns") is not None
                and _names_two_tenants(f)):
            # an interval still going on counts what was observed: up to when its evaluation ran
            known_end = f.get("to_ns") if f.get("to_ns") is not None else f.get("seen_until_ns")
            end = min(v for v in (known_end, scope.to_ns, stops.get(f.get("cluster"))) if v is not None)
            served = session.execute(select(func.count()).select_from(i).join(l, l.record_id == i.id).where(
                pop.lineage_filter(scope), l.physical_gpu_uuid == f["physical_gpu_uuid"],
                i.event_time_ns >= max(f["from_ns"], scope.from_ns), i.event_time_ns < end)).scalar_one()
        out.append({**f, "served": served})
    return out


def _names_two_tenants(finding: dict[str, Any]) -> bool:
    """Whether a finding's subjects name two or more tenants (``subjects.tenants``, as the shipped
    isolation rules write them): a finding about tenants sharing something."""
    subjects = finding.get("subjects")
    tenants = subjects.get("tenants") if isinstance(subjects, dict) else None
    return isinstance(tenants, list) and len({json.dumps(t, sort_keys=True) for t in tenants}) > 1


def _timeline_gpus(bars: list[Bar], segments) -> set[str]:
    """GPUs drawn in the timeline: those shared across tenants first, then by node and UUID, up to the limit."""
    nodes = {b.physical_gpu_uuid: b.node_name or "" for b in bars}
    shared = sorted({s.physical_gpu_uuid for s in segments if s.cross_tenant}, key=lambda g: (nodes.get(g, ""), g))
    rest = sorted(set(nodes) - set(shared), key=lambda g: (nodes[g], g))
    return set((shared + rest)[:TIMELINE_GPU_LIMIT])


def _findings_by_rule(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings counted per (rule, severity, kind), ordered like the findings (severity, then rule)."""
    counts: dict[tuple[str, str, str], int] = {}
    for f in findings:
        key = (f["rule"], f["severity"], f["kind"])
        counts[key] = counts.get(key, 0) + 1
    return [{"rule": r, "severity": sev, "kind": kind, "count": n} for (r, sev, kind), n in
            sorted(counts.items(), key=lambda kv: (pop.SEVERITY_ORDER.get(kv[0][1], 9), kv[0]))]


def _count_by(rows: list[dict[str, Any]], key: str, order: dict[str, int]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r[key]] = counts.get(r[key], 0) + 1
    return sorted(counts.items(), key=lambda kv: (order.get(kv[0], 9), kv[0]))


def _write_pdf(html: str, target: Path, pack_id: str, date_ns: int) -> None:
    """WeasyPrint from the same HTML, byte-identical for the same HTML.

    The PDF creation date comes from ``<meta name=dcterms.created>`` (the period end) and the file
    identifier is the pack id. Font subsets are written by fontTools, which stamps the font's
    ``head.modified`` with the current time unless ``SOURCE_DATE_EPOCH`` is set
    (reproducible-builds.org convention): it is set to the period end for the duration of the call.
    """
    from weasyprint import HTML

    previous = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = str(date_ns // 1_000_000_000)
    try:
        HTML(string=html, base_url=str(TEMPLATES)).write_pdf(str(target), pdf_identifier=pack_id.encode("ascii"))
    finally:
        if previous is None:
            os.environ.pop("SOURCE_DATE_EPOCH", None)
        else:
            os.environ["SOURCE_DATE_EPOCH"] = previous


def write_archive(pack_dir: Path, target: Path, mtime_ns: int) -> Path:
    """Deterministic ``.tar.gz`` of ``pack_dir`` under one top directory named like the pack directory.

    Members are sorted, owned by 0:0 with empty names, mode 0644/0755, timestamps = ``mtime_ns``
    (the period end); the gzip header carries the same time and no file name.
    """
    mtime = mtime_ns // 1_000_000_000
    top = pack_dir.name
    tmp = target.with_name(target.name + ".partial")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=mtime) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(rel).parent) for rel, _ in pack_files(pack_dir)} - {"."})
        for name in [top] + [f"{top}/{d}" for d in dirs]:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(info)
        for rel, path in pack_files(pack_dir):
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size, info.mode, info.mtime = path.stat().st_size, 0o644, mtime
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
    tmp.replace(target)
    return target


def record_pack(sessions: sessionmaker[Session], meta: dict[str, Any], path: Path, manifest_sha256: str) -> bool:
    """Insert the pack into ``evidence_packs`` and ledger it; False when that pack id is already recorded."""
    with sessions.begin() as session:
        exists = session.execute(select(EvidencePack.id).where(EvidencePack.pack_id == meta["pack_id"])).first()
        if exists:
            log.info("pack %s already recorded; not recorded again", meta["pack_id"])
            return False
        row = {"pack_id": meta["pack_id"], "period_from_ns": meta["period"]["from_ns"],
               "period_to_ns": meta["period"]["to_ns"], "scope": meta["scope"], "path": str(path.resolve()),
               "manifest_sha256": manifest_sha256, "ledger_head_seq": meta["ledger"]["seq"],
               "ledger_head_hash": meta["ledger"]["entry_hash"], "created_at": utcnow()}
        obj = EvidencePack(**row)
        session.add(obj)
        session.flush()
        ledger.append(session, "evidence_packs", [{**row, "id": obj.id}])
    return True
