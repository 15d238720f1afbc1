"""Policy findings in words for the pack's readers (pure functions, no I/O).

A finding as stored names its subjects and evidence rows as JSON (kept as such in
``data/findings.json``). An auditor wants the sentence behind it: *tenant A pod X and tenant B
pod Y shared physical GPU G without hardware partitioning from t1 to t2*. ``describe`` builds that
sentence and readable tables from facts the pack already holds: the consumer pods of each claim
(``data/consumer_intervals.csv``), the allocation rows named as evidence
(``data/allocation_episodes.csv``) and the sharing analysis (``data/sharing.csv``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from collector.timeutil import ns_to_rfc3339

OPEN_END_NS = 2**62

# Evidence keys the bundle uses → (what one id is, where the pack holds that row)
EVIDENCE_SOURCES = {
    "allocation_results": ("allocation result", "data/allocation_episodes.csv, column allocation_result_id"),
    "allocation_episodes": ("allocation episode", "data/allocation_episodes.csv, column episode_id"),
    "inference_records": ("transaction record", "data/transaction_lineage.csv, column record_id"),
    "coverage_intervals": ("coverage interval", "data/coverage.csv, the row of the finding's kind and interval "
                                                "(the id is the store's)"),
}
SUBJECT_LABELS = {
    "claims": "Claims (namespace/name)", "devices": "Devices (driver/pool/device)", "tenants": "Tenants",
    "namespaces": "Namespaces", "cluster": "Cluster", "kinds": "Kubernetes kinds", "transactions": "Transactions",
    "device_classes": "DeviceClasses",
}


@dataclass(frozen=True)
class Allocation:
    """One allocation row (episode × result) as the pack shows it: claim, device, GPU, node, interval."""

    result_id: int | None
    episode_id: int
    namespace: str
    claim_name: str
    device_key: str
    physical_gpu_uuid: str | None
    node_name: str | None
    mig_profile: str | None
    from_ns: int
    to_ns: int | None
    stopped_at_ns: int | None = None  # still allocated when the collector stopped observing (to_ns is None)

    def text(self) -> str:
        """``ns/claim on driver/pool/device (GPU …, MIG 1g.12gb, node …) from … to …``."""
        where = ", ".join(x for x in (self.physical_gpu_uuid, self.mig_profile and f"MIG {self.mig_profile}",
                                       self.node_name and f"node {self.node_name}") if x)
        if self.to_ns is not None:
            until = f" to {ns_to_rfc3339(self.to_ns)}"
        elif self.stopped_at_ns is not None:
            until = f", {open_at_last_observation(self.stopped_at_ns)}"
        else:
            until = ", still allocated at the period end"
        return (f"claim {self.namespace}/{self.claim_name} on {self.device_key}{f' ({where})' if where else ''} "
                f"from {ns_to_rfc3339(self.from_ns)}{until}")


def open_at_last_observation(stopped_at_ns: int) -> str:
    """How the pack says that something was still going on when the collector stopped observing."""
    return f"open at last observation, collector stopped at {ns_to_rfc3339(stopped_at_ns)}"


@dataclass
class FindingFacts:
    """What the pack knows about claims, pods and allocations, indexed for ``describe``.

    ``pods``: (namespace, claim name) → [(pod name, from_ns, to_ns or None)];
    ``allocations``: evidence key → id → ``Allocation``; ``sharing``: (GPU UUID, from_ns, to_ns,
    claims as ``ns/name``, hardware-partitioned) per sharing interval; ``nodes``: GPU UUID → node;
    ``stops``: cluster → last observation when the collector stopped before the period end;
    ``scope_namespaces``: the pack's namespace scope (empty = all): consumers of claims in other
    namespaces are not in the pack, so their absence says nothing.
    """

    pods: dict[tuple[str, str], list[tuple[str, int, int | None]]] = field(default_factory=dict)
    allocations: dict[str, dict[int, Allocation]] = field(default_factory=lambda: {
        "allocation_results": {}, "allocation_episodes": {}})
    sharing: list[tuple[str, int, int, tuple[str, ...], bool]] = field(default_factory=list)
    nodes: dict[str, str] = field(default_factory=dict)
    stops: dict[str, int] = field(default_factory=dict)
    scope_namespaces: tuple[str, ...] = ()
    # cluster → closed intervals (from_ns, to_ns, state) in which ResourceClaims were not observed
    # (gap, or the collector not running): an allocation first seen at their end began at or before it
    blind: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)

    def out_of_scope(self, namespace: str) -> bool:
        """True when the pack's namespace scope leaves ``namespace`` out (its pods are not in the pack)."""
        return bool(self.scope_namespaces) and namespace not in self.scope_namespaces

    def add_consumer(self, namespace: str, claim_name: str, pod: str, from_ns: int, to_ns: int | None) -> None:
        """Record that ``pod`` consumed the claim over ``[from_ns, to_ns)``."""
        self.pods.setdefault((namespace, claim_name), []).append((pod, from_ns, to_ns))

    def add_allocation(self, a: Allocation) -> None:
        """Index an allocation row by result id and episode id (the first row of an episode stands for it)."""
        if a.result_id is not None:
            self.allocations["allocation_results"][a.result_id] = a
        self.allocations["allocation_episodes"].setdefault(a.episode_id, a)
        if a.physical_gpu_uuid and a.node_name:
            self.nodes.setdefault(a.physical_gpu_uuid, a.node_name)


def duration_text(from_ns: int | None, to_ns: int | None) -> str:
    """``7.944 s``, ``12 min 5 s``, ``3 h 02 min``, ``2 d 4 h``; empty when an end is missing."""
    if from_ns is None or to_ns is None:
        return ""
    s = (to_ns - from_ns) / 1e9
    if s < 60:
        return f"{s:.3f} s".replace(".000 s", " s")
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min" if h < 24 else f"{h // 24} d {h % 24} h"


def _claim_refs(value: Any) -> list[tuple[str, str]]:
    """(namespace, name) of claim subjects given as ``ns/name`` strings or ``{namespace, name}`` objects."""
    refs = []
    for c in value if isinstance(value, list) else []:
        if isinstance(c, dict) and c.get("name"):
            refs.append((str(c.get("namespace") or ""), str(c["name"])))
        elif isinstance(c, str) and "/" in c:
            ns, name = c.split("/", 1)
            refs.append((ns, name))
    return refs


def _pods_during(facts: FindingFacts, claim: tuple[str, str], lo: int, hi: int) -> list[str]:
    return sorted({pod for pod, f, t in facts.pods.get(claim, ()) if f < hi and (t is None or t > lo)})


def parties(finding: dict[str, Any], facts: FindingFacts, tenant_of: Callable[[str], str]) -> list[dict[str, Any]]:
    """Per tenant named by the finding's claims: namespace(s), the pods that consumed the claims during
    the finding's interval (the whole period when it has none) and the claims; sorted by tenant.
    ``outside_scope`` is True when every namespace of the party is outside the pack's namespace
    scope (its pods were not read, so none are listed)."""
    lo = finding.get("from_ns") or 0
    hi = finding.get("to_ns") or OPEN_END_NS
    by_tenant: dict[str, dict[str, Any]] = {}
    for ns, name in _claim_refs((finding.get("subjects") or {}).get("claims")):
        tenant = tenant_of(ns) or ns
        p = by_tenant.setdefault(tenant, {"tenant": tenant, "namespaces": set(), "pods": set(), "claims": set()})
        p["namespaces"].add(ns)
        p["claims"].add(f"{ns}/{name}")
        p["pods"].update(f"{ns}/{pod}" for pod in _pods_during(facts, (ns, name), lo, hi))
    out = []
    for t in sorted(by_tenant):
        p = {k: sorted(v) if isinstance(v, set) else v for k, v in by_tenant[t].items()}
        p["outside_scope"] = all(facts.out_of_scope(ns) for ns in p["namespaces"])
        out.append(p)
    return out


def _who(party: dict[str, Any]) -> str:
    pods = party["pods"]
    if pods:
        things = (f"pod {pods[0]}" if len(pods) == 1 else f"pods {', '.join(pods)}")
    elif party.get("outside_scope"):
        things = f"claim {', '.join(party['claims'])} (namespace outside this pack's scope: its pods are not listed)"
    else:
        things = f"claim {', '.join(party['claims'])} (no consuming pod recorded)"
    return f"tenant {party['tenant']} {things}"


def _sharing_mode(finding: dict[str, Any], facts: FindingFacts) -> str | None:
    """How the finding's claims shared its GPU according to the pack's sharing analysis, if it overlaps."""
    gpu, lo, hi = finding.get("physical_gpu_uuid"), finding.get("from_ns"), finding.get("to_ns")
    claims = {f"{ns}/{n}" for ns, n in _claim_refs((finding.get("subjects") or {}).get("claims"))}
    if not gpu or lo is None or hi is None or len(claims) < 2:
        return None
    modes = {partitioned for g, f, t, seg_claims, partitioned in facts.sharing
             if g == gpu and f < hi and t > lo and claims <= set(seg_claims)}
    if modes == {False}:
        return "without hardware partitioning (no MIG: the same device or the whole GPU)"
    if modes == {True}:
        return "on separate MIG partitions (hardware-isolated)"
    return None


def headline(finding: dict[str, Any], who: Sequence[dict[str, Any]], facts: FindingFacts) -> str | None:
    """One sentence: who held or shared which physical GPU, how, and when; None without claims."""
    if not who:
        return None
    names = " and ".join(_who(p) for p in who)
    gpu = finding.get("physical_gpu_uuid")
    n_claims = sum(len(p["claims"]) for p in who)
    verb = "shared" if n_claims > 1 else "held"
    target = f"physical GPU {gpu}" if gpu else "the devices listed below"
    node = facts.nodes.get(gpu or "")
    parts = [f"{names[0].upper()}{names[1:]} {verb} {target}"]
    if node:
        parts.append(f"on node {node}")
    mode = _sharing_mode(finding, facts)
    if mode:
        parts.append(mode)
    if finding.get("from"):
        stop = _stop_within(finding, facts)
        if stop is not None:
            dur = duration_text(finding.get("from_ns"), stop)
            parts.append(f"from {finding['from']}{f' ({dur} observed)' if dur else ''}, {open_at_last_observation(stop)}")
        elif finding.get("to") is None and finding.get("seen_until"):
            # still going on as far as its evaluation could see (``collector.policy.findings.seen_until_ns``)
            dur = duration_text(finding.get("from_ns"), finding.get("seen_until_ns"))
            parts.append(f"from {finding['from']}{f' ({dur} observed)' if dur else ''}, still going on when last "
                         f"evaluated, at {finding['seen_until']}")
        else:
            dur = duration_text(finding.get("from_ns"), finding.get("to_ns"))
            parts.append(f"from {finding['from']} to {finding.get('to') or 'the end of the period'}"
                         f"{f' ({dur})' if dur else ''}")
    return " ".join(parts) + "."


def _stop_within(finding: dict[str, Any], facts: FindingFacts) -> int | None:
    """The collector's stop when the finding's interval runs past it (open or to the period end)."""
    stop = facts.stops.get(finding.get("cluster") or "")
    lo, hi = finding.get("from_ns"), finding.get("to_ns")
    if stop is None or lo is None or lo >= stop or (hi is not None and hi <= stop):
        return None
    return stop


def _values(value: Any) -> list[str]:
    if isinstance(value, list):
        return [v if isinstance(v, str) else _inline(v) for v in value]
    return [value if isinstance(value, str) else _inline(value)]


def _inline(value: Any) -> str:
    if isinstance(value, dict) and set(value) <= {"namespace", "name"} and value.get("name"):
        return f"{value['namespace']}/{value['name']}" if value.get("namespace") else str(value["name"])
    if isinstance(value, dict):
        return ", ".join(f"{k} {_inline(v)}" for k, v in sorted(value.items()))
    if isinstance(value, list):
        return ", ".join(_inline(v) for v in value)
    return "—" if value is None else str(value)


def subject_rows(subjects: Any) -> list[tuple[str, list[str]]]:
    """(label, values) per subject key, sorted by key; a non-object subject is one unlabelled row."""
    if not isinstance(subjects, dict):
        return [("Subject", _values(subjects))] if subjects not in (None, {}, []) else []
    return [(SUBJECT_LABELS.get(k, k.replace("_", " ")), _values(v)) for k, v in sorted(subjects.items())]


def evidence_rows(evidence: Any, facts: FindingFacts) -> list[dict[str, Any]]:
    """Per evidence key: a label, where to find the ids in the pack, and one line per id.

    Allocation ids are spelt out (claim, device, GPU, node, interval) from the pack's allocation
    population; counts are shown as ``name value`` pairs; other ids as they are.
    """
    if not isinstance(evidence, dict):
        return [{"label": "Evidence", "source": None, "lines": _values(evidence)}] if evidence is not None else []
    rows = []
    for key, value in sorted(evidence.items()):
        what, source = EVIDENCE_SOURCES.get(key, (key.replace("_", " "), None))
        index = facts.allocations.get(key, {})
        if isinstance(value, list):
            lines = [f"{what} {v}: {index[v].text()}" if v in index else f"{what} {v}" for v in value]
        else:
            lines = [_inline(value)]
        rows.append({"label": what.capitalize() + ("s" if isinstance(value, list) and len(value) > 1 else ""),
                     "source": source, "lines": lines})
    return rows


def describe(findings: Iterable[dict[str, Any]], facts: FindingFacts,
             tenant_of: Callable[[str], str]) -> list[dict[str, Any]]:
    """The findings with their reading added: ``headline``, ``parties``, ``subject_rows``,
    ``evidence_rows``, ``duration``, ``open_note`` (set when the interval runs past the
    collector's last observation) and ``start_note`` (set when it starts where the collector was
    blind: ``unobserved_start``). The input dicts are not changed."""
    out = []
    for f in findings:
        who = parties(f, facts, tenant_of)
        out.append({**f, "parties": who, "headline": headline(f, who, facts), "subject_rows": subject_rows(f["subjects"]),
                    "evidence_rows": evidence_rows(f["evidence"], facts),
                    "duration": duration_text(f.get("from_ns"),
                                              _stop_within(f, facts) or f.get("to_ns") or f.get("seen_until_ns")),
                    "open_note": _open_note(f, facts),
                    "start_note": unobserved_start(f, facts)})
    return out


def _open_note(finding: dict[str, Any], facts: FindingFacts) -> str | None:
    """How the pack says that the finding's interval had not ended: it runs past the collector's
    last observation, or it was still going on when the evaluation stating it ran
    (``seen_until``, ``reports.finding_scope``); None when it ended."""
    stop = _stop_within(finding, facts)
    if stop is not None:
        return open_at_last_observation(stop)
    if finding.get("to") is None and finding.get("seen_until"):
        return f"still going on when last evaluated, at {finding['seen_until']}"
    return None


# How long after a blind interval's end a first observation still counts as made at that end: the
# relist that ends it is read before the interval is closed, its events a moment later.
BLIND_END_TOLERANCE_NS = 5 * 10**9


def unobserved_start(finding: dict[str, Any], facts: FindingFacts) -> str | None:
    """For an allocation finding (not a coverage one) whose interval starts (or ends) inside, or just
    at the end of, an interval in which its cluster's ResourceClaims were not observed: the sentence
    saying its start is the first observation, and that it may have begun as early as the blind
    interval's start (its end, that it may have ended that early). None otherwise. Why: an
    allocation made (or released) while the collector was down is recorded when the collector sees
    it again, so the interval (and its duration) is a lower bound."""
    lo, hi = finding.get("from_ns"), finding.get("to_ns")
    subjects = finding.get("subjects") if isinstance(finding.get("subjects"), dict) else {}
    if lo is None or not (finding.get("physical_gpu_uuid") or "claims" in subjects):
        return None  # not about an allocation (a coverage finding starts in its gap by definition)
    notes = []
    for start, end, state in facts.blind.get(finding.get("cluster") or "", []):
        why = "the collector was not running" if state == "stopped" else "the watch of ResourceClaims was lost"
        if start <= lo <= end + BLIND_END_TOLERANCE_NS:
            notes.append(f"start not observed: {why} from {ns_to_rfc3339(start)} to {ns_to_rfc3339(end)}; the first "
                         f"observation is {ns_to_rfc3339(lo)}, so this may have begun as early as "
                         f"{ns_to_rfc3339(start)} and lasted longer than stated")
        if hi is not None and lo < hi and start <= hi <= end + BLIND_END_TOLERANCE_NS:
            notes.append(f"end not observed: {why} from {ns_to_rfc3339(start)} to {ns_to_rfc3339(end)}; the end "
                         f"stated ({ns_to_rfc3339(hi)}) is when the change was first seen, so this may have ended as "
                         f"early as {ns_to_rfc3339(start)}")
    return "; ".join(notes) or None
