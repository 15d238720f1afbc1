"""Control mapping: each DORA / RTS 2024/1774 / NIS2 control → the pack sections and files that evidence it.

Sources: Regulation (EU) 2022/2554 (DORA) Art. 8, 9, 10, 17, 28; Commission Delegated Regulation
(EU) 2024/1774 (RTS on the ICT risk-management framework) Art. 4, 12, 23; Directive (EU) 2022/2555
(NIS2) Art. 21(2)(a)–(j). Mapping after ``shared/reference/compliance.md`` §2.5. Requirements are
paraphrased; the Official Journal text is authoritative. Controls this tool cannot evidence are
listed with status ``not evidenced`` and the reason, never left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def share_text(fraction: float) -> str:
    """A share of the period (0..1) as text with one decimal: ``28.1 %``; a partial share is never
    rounded to 0 or 100 % (``< 0.1 %``, ``> 99.9 %``): an auditor reads 100 % as complete coverage."""
    if 0 < fraction < 0.0005:
        return "< 0.1 %"
    if 0.9995 <= fraction < 1:
        return "> 99.9 %"
    return f"{fraction * 100:.1f} %"


def stretches_text(stretches: Any, more: int = 0) -> str:
    """Half-open stretches given as ``(from, to)`` RFC 3339 UTC text, as the pack writes them:
    ``[2026-11-28T06:00:00Z, 2026-11-28T12:00:00Z)``, comma-separated, then ``and N more`` when ``more``."""
    text = ", ".join(f"[{a}, {b})" for a, b in stretches)
    return text + (f" and {more} more" if more else "")


# Section id → title, in report order. Templates use the ids as anchors.
SECTIONS: list[tuple[str, str]] = [
    ("scope", "1. Scope and period"),
    ("coverage", "2. Observation coverage"),
    ("inventory", "3. Accelerator inventory"),
    ("timeline", "4. Allocation timeline per physical GPU"),
    ("sharing", "5. Sharing and isolation"),
    ("findings", "6. Policy findings"),
    ("lineage", "7. Transaction lineage"),
    ("changes", "8. Changes"),
    ("methodology", "9. Methodology and limitations"),
    ("integrity", "10. Integrity and verification"),
    ("controls", "11. Control mapping"),
]
SECTION_TITLES = dict(SECTIONS)

# Population name → columns are defined in reports.populations; files are data/<name>.csv|json.
INVENTORY = ["data/inventory.csv", "data/inventory.json"]
EPISODES = ["data/allocation_episodes.csv", "data/allocation_episodes.json"]
CONSUMERS = ["data/consumer_intervals.csv", "data/consumer_intervals.json"]
LINEAGE = ["data/transaction_lineage.csv", "data/transaction_lineage.json"]
FINDINGS = ["data/findings.csv", "data/findings.json"]
COVERAGE = ["data/coverage.csv", "data/coverage.json"]
SHARING = ["data/sharing.csv", "data/sharing.json"]
CHANGES = ["data/changes.csv", "data/changes.json"]
INTEGRITY = ["manifest.json", "manifest.sig"]

EVIDENCED = "evidenced"
PARTIAL = "partially evidenced"
NOT = "not evidenced"
# What a status means, stated in the pack (section 11 and controls.json): an auditor read "evidenced"
# next to an open HIGH cross-tenant violation as "compliant" (newcomer finding F4).
STATUS_MEANING = ("A status says how far this pack holds the evidence a control asks for: evidenced (the "
                  "evidence is here), partially evidenced (part of it, with the reason) or not evidenced (none). "
                  "It is not an assessment that the control is effective or that it was complied with: the "
                  "evidence may show it was not. Open findings of high or critical severity in a control's "
                  "sections are shown next to its status.")
# Severities that are shown next to a control's status, most severe first.
SEVERE = ("critical", "high")
# Which section a finding of the shipped bundle's rules is about, beside section 6 (findings): a
# control evidenced by that section shows it too. Rules of other bundles count in section 6 only.
RULE_SECTIONS = {"isolation/": "sharing", "inventory/": "inventory", "coverage/": "coverage",
                 "attribution/": "lineage"}


# What a control's status depends on in the pack (``control_statuses``): the signature, a population
# that must not be empty, complete observation coverage, coverage records at all, or a policy bundle
# evaluated over the period.
SIGNED = "signed"
COVERAGE_COMPLETE = "coverage complete"
COVERAGE_RECORDED = "coverage recorded"
POLICY_EVALUATED = "policy evaluated"
# Sections whose content is what the watcher observed over time: a control evidenced by one of them
# is lowered when the observation was partial. A control evidenced by the findings section is lowered
# when no policy bundle was evaluated in the period. ``_c`` adds these needs, so that no control can
# be "evidenced" by observation or findings the pack does not have while another is lowered for it.
OBSERVED_SECTIONS = frozenset({"coverage", "timeline", "sharing", "changes"})
POPULATION_WORDS = {"inventory": "device", "allocation_episodes": "allocation", "transaction_lineage": "transaction",
                    "findings": "policy finding", "consumer_intervals": "claim consumer"}


def _c(regulation: str, article: str, requirement: str, status: str, sections: list[str], files: list[str],
       note: str, needs: tuple[str, ...] = ()) -> dict[str, Any]:
    """One control; ``status`` is the most this tool can evidence, ``needs`` what the pack must hold for it
    (plus complete coverage when a section is in ``OBSERVED_SECTIONS``, and an evaluated policy bundle
    when ``findings`` is one of its sections: a period evaluated without a finding is the compliant
    case and evidences the policy controls; the findings population is needed only where a finding
    itself is the evidence)."""
    derived = ((COVERAGE_COMPLETE,) if OBSERVED_SECTIONS & set(sections) else ()) + \
              ((POLICY_EVALUATED,) if "findings" in sections and "findings" not in needs else ())
    evidence = tuple(n for n in needs if n not in (SIGNED, COVERAGE_RECORDED, COVERAGE_COMPLETE))
    needs = needs + tuple(n for n in derived if n not in needs)
    return {"regulation": regulation, "article": article, "requirement": requirement, "status": status,
            "sections": sections, "files": files, "note": note, "needs": needs, "evidence": evidence}


DORA = "DORA (EU) 2022/2554"
RTS = "RTS (EU) 2024/1774"
NIS2 = "NIS2 (EU) 2022/2555"

CONTROLS: list[dict[str, Any]] = [
    _c(DORA, "Art. 8(1)", "Identify, classify and document ICT assets supporting business functions",
       PARTIAL, ["scope", "inventory"], INVENTORY,
       "Physical GPUs and MIG instances with node, product, memory and driver are documented; business "
       "functions, roles and classification are not collected.", needs=("inventory",)),
    _c(DORA, "Art. 8(4)", "Identify all ICT assets incl. hardware; map their configuration and interdependencies",
       EVIDENCED, ["inventory", "lineage"], INVENTORY + LINEAGE,
       "Device → physical GPU → node, MIG profile and sharing; transaction → pod → claim → GPU dependencies.", needs=("inventory", "transaction_lineage")),
    _c(DORA, "Art. 8(5)", "Document processes depending on ICT third-party providers",
       NOT, [], [], "Cloud provider and region are not collected by draudit."),
    _c(DORA, "Art. 8(6)", "Keep inventories updated periodically and at every major change",
       EVIDENCED, ["inventory", "changes"], INVENTORY + CHANGES,
       "Every device record has a validity interval; driver and DeviceClass changes are listed.", needs=("inventory", COVERAGE_COMPLETE)),
    _c(DORA, "Art. 9(1)", "Continuously monitor and control ICT security and functioning",
       EVIDENCED, ["coverage", "timeline"], COVERAGE + EPISODES + CONSUMERS,
       "Continuous list-watch of the DRA API; the coverage section states every gap.", needs=(COVERAGE_RECORDED, COVERAGE_COMPLETE)),
    _c(DORA, "Art. 9(2)", "Keep data available, authentic, intact and confidential",
       PARTIAL, ["integrity"], INTEGRITY,
       "Integrity of the collected evidence (hash-chained ledger, manifest digests, its signature when "
       "signed); not of the bank's data.", needs=(SIGNED,)),
    _c(DORA, "Art. 9(4)(b)", "Sound infrastructure management incl. isolation of assets",
       EVIDENCED, ["sharing", "findings"], SHARING + FINDINGS,
       "Who shared which physical GPU when, with or without hardware partitioning (MIG).", needs=("allocation_episodes", COVERAGE_COMPLETE)),
    _c(DORA, "Art. 9(4)(c)", "Limit access to ICT assets to what legitimate functions need",
       PARTIAL, ["timeline", "sharing"], EPISODES + CONSUMERS,
       "Which namespace (tenant) held which device when; RBAC rights are not collected.", needs=("allocation_episodes",)),
    _c(DORA, "Art. 9(4)(d)", "Strong authentication; protection of cryptographic keys",
       NOT, [], [], "Key custody of the pack signing key is the operator's control."),
    _c(DORA, "Art. 9(4)(e)", "ICT change management: changes recorded, assessed, approved",
       PARTIAL, ["changes"], CHANGES,
       "Changes are recorded (DeviceClass, driver, policy bundle); actor and approver are not collected.", needs=(COVERAGE_COMPLETE,)),
    _c(DORA, "Art. 10(1)", "Detect anomalous activities promptly, with alert thresholds",
       EVIDENCED, ["findings", "coverage"], FINDINGS + COVERAGE,
       "Policy findings over the allocation history and observation gaps.", needs=(COVERAGE_RECORDED, COVERAGE_COMPLETE)),
    _c(DORA, "Art. 17(1)", "ICT-related incident management process",
       NOT, [], [], "The incident process and incident records are outside draudit."),
    _c(DORA, "Art. 17(2)–(3)", "Record incidents; identify, track, classify them; root causes",
       PARTIAL, ["findings", "lineage"], FINDINGS + LINEAGE,
       "Findings with their interval and the affected transactions per GPU support classification; "
       "linking findings to incident ids is not supported.", needs=("transaction_lineage",)),
    _c(DORA, "Art. 28(3)", "Register of information on ICT third-party contractual arrangements",
       NOT, [], [], "The register is contract data; this pack only shows usage of the GPU compute service."),
    _c(RTS, "Art. 4(2)(b)", "Asset records: unique id, location, classification, owner, functions, interdependencies",
       PARTIAL, ["inventory", "lineage"], INVENTORY + LINEAGE,
       "(i) unique id (GPU UUID), (ii) location (node), (viii) interdependencies are evidenced; "
       "(iii) classification, (iv) owner, (vi) RTO/RPO, (vii) exposure, (ix) end of support are not collected.", needs=("inventory", "transaction_lineage")),
    _c(RTS, "Art. 12(2)(a)", "Logging procedures: events logged and retention period",
       PARTIAL, ["methodology", "coverage"], COVERAGE,
       "The events logged are stated; retention is configured in the collector and deletions are ledger tombstones.", needs=(COVERAGE_RECORDED,)),
    _c(RTS, "Art. 12(2)(c)", "Log capacity, change and ICT operations events",
       EVIDENCED, ["timeline", "changes"], EPISODES + CONSUMERS + CHANGES,
       "Allocation episodes and consumers with validity intervals; configuration changes.", needs=("allocation_episodes", COVERAGE_COMPLETE)),
    _c(RTS, "Art. 12(2)(d)–(e)", "Protect logs against tampering, deletion and unauthorised access",
       EVIDENCED, ["integrity"], INTEGRITY,
       "Hash-chained ledger (anchor in the manifest), SHA-256 of every file, Ed25519 signature of the manifest "
       "when the pack is signed, offline verifier.", needs=(SIGNED,)),
    _c(RTS, "Art. 12(2)(f)", "Synchronise clocks to a documented reliable time source",
       PARTIAL, ["methodology"], [],
       "The clock-skew tolerance used for attribution is stated; the nodes' time source is not collected."),
    _c(RTS, "Art. 23", "Anomaly detection incl. alerts on completeness and integrity of log collection",
       EVIDENCED, ["coverage", "findings"], COVERAGE + FINDINGS,
       "Watch gaps are recorded per kind and shown; policy findings flag them.", needs=(COVERAGE_RECORDED,)),
    _c(NIS2, "Art. 21(2)(a)", "Risk analysis and information system security policies",
       EVIDENCED, ["findings", "changes"], FINDINGS + CHANGES,
       "The policy bundle revisions in force and their findings.", needs=(POLICY_EVALUATED,)),
    _c(NIS2, "Art. 21(2)(b)", "Incident handling",
       PARTIAL, ["findings"], FINDINGS, "Findings feed incident handling; incident records are outside draudit.", needs=(POLICY_EVALUATED,)),
    _c(NIS2, "Art. 21(2)(c)", "Business continuity: backups, disaster recovery, crisis management",
       NOT, [], [], "Not collected."),
    _c(NIS2, "Art. 21(2)(d)", "Supply-chain security", NOT, [], [], "Provider and supplier data are not collected."),
    _c(NIS2, "Art. 21(2)(e)", "Security in acquisition, development and maintenance",
       PARTIAL, ["changes", "inventory"], CHANGES + INVENTORY, "Driver versions and their changes; vulnerability data is not collected.", needs=("inventory",)),
    _c(NIS2, "Art. 21(2)(f)", "Assess the effectiveness of risk-management measures",
       EVIDENCED, ["findings", "coverage"], FINDINGS + COVERAGE, "Continuous policy evaluation with stated coverage.", needs=(POLICY_EVALUATED, COVERAGE_COMPLETE)),
    _c(NIS2, "Art. 21(2)(g)", "Basic cyber hygiene and training", NOT, [], [], "Not collected."),
    _c(NIS2, "Art. 21(2)(h)", "Cryptography and encryption",
       PARTIAL, ["integrity"], INTEGRITY, "Digests and, when signed, an Ed25519 signature protect this pack; encryption of the bank's "
       "data is not assessed.", needs=(SIGNED,)),
    _c(NIS2, "Art. 21(2)(i)", "Human resources security, access control and asset management",
       PARTIAL, ["inventory", "sharing"], INVENTORY + SHARING,
       "Asset management and tenant access to devices; HR security is not collected.", needs=("inventory",)),
    _c(NIS2, "Art. 21(2)(j)", "Multi-factor authentication and secured communications", NOT, [], [], "Not collected."),
]


@dataclass(frozen=True)
class PolicyCoverage:
    """How much of the period the stored policy evaluations covered, for the control statuses: the
    least evaluated cluster in scope (``reports.policy_coverage.lowest``).

    ``share``: its evaluated share of the period (0..1, unrounded); ``cluster``: which (None: the
    evaluations stored without a cluster decide, the pack naming no cluster); ``not_evaluated``: its
    stretches no evaluation covered, ``(from, to)`` RFC 3339 UTC text, half-open, the first few;
    ``more``: how many further stretches; ``partial``: clusters evaluated for less than the whole
    period; ``any_evaluated``: some stretch of some cluster in scope was evaluated."""

    share: float
    cluster: str | None
    not_evaluated: tuple[tuple[str, str], ...] = ()
    more: int = 0
    partial: int = 1
    any_evaluated: bool = True

    def where(self) -> str:
        """The cluster in words: ``cluster prod-eu-1``, or the evaluations stored without a cluster."""
        return f"cluster {self.cluster}" if self.cluster else "the clusters (evaluations stored without a cluster)"


@dataclass(frozen=True)
class PackFacts:
    """What the control statuses are computed from: signed or not, population row counts, the
    lowest synced share of the period over the (cluster, kind) coverage rows (None: no coverage row),
    the number of policy bundles evaluated over the period or behind the pack's findings
    (``bundles``), how much of the period their evaluations covered (``policy``; None: not computed,
    then ``bundles`` alone decides), and whether any (cluster, kind) was synced at some time in the
    period (``observed``).

    ``findings``: the pack's findings as (rule, severity), for the open findings shown next to each
    control's status (``open_findings``).

    ``observed`` None (the caller did not say) is read from ``lowest_synced``: observed when the
    lowest share is above 0. That can only under-state it (a pack over two clusters, one of which
    was never watched in the period, reads as not observed), never claim observation that was not.
    """

    signed: bool
    counts: dict[str, int]
    lowest_synced: tuple[float, str, str] | None  # (synced fraction, cluster, kind)
    bundles: int = 0
    observed: bool | None = None
    findings: tuple[tuple[str, str], ...] = ()  # (rule, severity) of each finding of the pack, once per decision
    partial_kinds: int = 0  # (cluster, kind) coverage rows synced for less than the whole period
    policy: PolicyCoverage | None = None  # policy evaluation coverage of the period (reports.policy_coverage)

    def observed_in_period(self) -> bool:
        """Whether the watcher synced anything in the period (see the class docstring)."""
        if self.observed is not None:
            return self.observed
        return self.lowest_synced is not None and self.lowest_synced[0] > 0


def _unmet(need: str, facts: PackFacts) -> str | None:
    """Why ``need`` is not met by the pack, or None when it is."""
    if need == SIGNED:
        return None if facts.signed else ("the pack is not signed (no manifest.sig): its digests show integrity, "
                                          "not who issued it")
    if need == POLICY_EVALUATED:
        return _policy_unmet(facts)
    if need == COVERAGE_RECORDED:
        return None if facts.lowest_synced else "no observation coverage recorded in the period"
    if need == COVERAGE_COMPLETE:
        if facts.lowest_synced is None:
            return "no observation coverage recorded in the period"
        share, cluster, kind = facts.lowest_synced
        if share <= 0:
            return (f"observation coverage is missing: {kind} in {cluster} was not synced at any time in the period "
                    "(section 2)")
        others = (f"; the lowest of {facts.partial_kinds} partly synced cluster/kinds"
                  if facts.partial_kinds > 1 else "")
        return None if share >= 1 else (f"observation coverage is partial: {kind} in {cluster} synced for "
                                        f"{share_text(share)} of the period{others} (section 2)")
    if facts.counts.get(need, 0) > 0:
        return None
    return f"no {POPULATION_WORDS.get(need, need)} rows in the period (data/{need}.csv is empty)"


def _policy_unmet(facts: PackFacts) -> str | None:
    """Why the period is not (wholly) evaluated by the policies, or None: no bundle evaluated it,
    a cluster in scope none evaluated, or only part of it was (``partially evaluated``, with the
    stretches no evaluation covered)."""
    policy = facts.policy
    if not facts.bundles or (policy is not None and not policy.any_evaluated):
        return ("no policy bundle was evaluated over the period (no evaluation recorded): nothing was checked "
                "against the policies")
    if policy is None or policy.share >= 1:
        return None
    others = f"; the lowest of {policy.partial} partly evaluated clusters" if policy.partial > 1 else ""
    if policy.share <= 0:
        return (f"policy evaluation is missing: no policy bundle evaluated {policy.where()} at any time in the "
                f"period, so nothing there was checked against the policies{others} (section 8, "
                "data/policy_coverage.csv)")
    return (f"policy evaluation is partial: the period was partially evaluated, {policy.where()} for "
            f"{share_text(policy.share)} of the period; not evaluated: "
            f"{stretches_text(policy.not_evaluated, policy.more)} — findings, or their absence, say nothing about "
            f"those stretches{others} (section 8, data/policy_coverage.csv)")


def _absent(need: str, facts: PackFacts) -> bool:
    """Whether the evidence ``need`` names is missing altogether (not merely incomplete): for a
    policy evaluation, no bundle evaluated any stretch of the period in scope."""
    if need == POLICY_EVALUATED:
        return not facts.bundles or (facts.policy is not None and not facts.policy.any_evaluated)
    return _unmet(need, facts) is not None


def control_status(control: dict[str, Any], facts: PackFacts) -> tuple[str, list[str]]:
    """(status, reasons) of one control for this pack.

    The control's ``status`` is the ceiling. Every unmet need is a reason and lowers ``evidenced``
    to ``partially evidenced``; when the control's evidence is missing altogether it is ``not
    evidenced``: every population it needs is empty, or there is no coverage record, or it rests on
    observation (needs complete coverage) and nothing was observed in the period (0 % synced: the
    collector did not run, or never synced, in it) — rows carried from before the period are then
    not evidence of it. A control resting on a policy evaluation is never ``evidenced`` while the
    period was only partially evaluated (a stretch of a cluster in scope no evaluation covered), and
    is ``not evidenced`` when that evaluation is its whole evidence and none covered any of it.
    """
    if control["status"] == NOT:
        return NOT, []
    needs = control["needs"]
    reasons = [r for r in (_unmet(n, facts) for n in needs) if r]
    # What the control's evidence consists of, as declared: populations, or a recorded policy
    # evaluation (evidence also when it found nothing). When none of it is there: not evidenced.
    populations = control["evidence"]
    empty = populations and all(_absent(n, facts) for n in populations)
    unrecorded = COVERAGE_RECORDED in needs and facts.lowest_synced is None
    unobserved = COVERAGE_COMPLETE in needs and not facts.observed_in_period()
    if empty or unrecorded or unobserved:
        return NOT, reasons
    return (PARTIAL if reasons else control["status"]), reasons


def finding_sections(rule: str) -> set[str]:
    """The pack sections a finding of ``rule`` is about: always ``findings`` (section 6), and the
    section its rule family concerns (``RULE_SECTIONS``: isolation → sharing, …)."""
    return {"findings"} | {section for prefix, section in RULE_SECTIONS.items() if rule.startswith(prefix)}


def open_findings(control: dict[str, Any], facts: PackFacts) -> dict[str, int]:
    """Severity → number of the pack's findings of ``SEVERE`` severity in the control's sections
    (``finding_sections``), most severe first; empty when there are none."""
    sections = set(control["sections"])
    counts = {sev: 0 for sev in SEVERE}
    for rule, severity in facts.findings:
        if severity in counts and finding_sections(rule) & sections:
            counts[severity] += 1
    return {sev: n for sev, n in counts.items() if n}


def status_text(status: str, findings: dict[str, int]) -> str:
    """The status as the pack shows it: ``evidenced — 2 high findings open`` (``findings`` from
    ``open_findings``), or the status alone."""
    if not findings:
        return status
    return status + " — " + ", ".join(f"{n} {sev} finding{'' if n == 1 else 's'} open" for sev, n in findings.items())


def controls_document(facts: PackFacts) -> dict[str, Any]:
    """The ``controls.json`` content: sections and controls with their status computed for this pack.

    Each control carries ``id`` (``"<regulation> <article>"``), requirement, ``status`` (see
    ``control_status``), ``status_reasons``, ``ceiling`` (the most this tool evidences), section ids
    with titles, the pack files that evidence it (``manifest.sig`` only when signed), and
    ``open_findings`` (severity → count, ``open_findings``) with ``status_text`` (the status with
    them, as the HTML shows it). ``status_meaning`` says what a status states (``STATUS_MEANING``).
    """
    controls = []
    for c in CONTROLS:
        files = [f for f in c["files"] if facts.signed or f != "manifest.sig"]
        status, reasons = control_status(c, facts)
        severe = open_findings(c, facts)
        entry = {k: v for k, v in c.items() if k not in ("needs", "evidence")}
        controls.append({"id": f"{c['regulation']} {c['article']}", **entry, "files": files, "status": status,
                         "status_reasons": reasons, "ceiling": c["status"], "open_findings": severe,
                         "status_text": status_text(status, severe),
                         "section_titles": [SECTION_TITLES[s] for s in c["sections"]]})
    return {"sections": [{"id": i, "title": t} for i, t in SECTIONS], "controls": controls,
            "statuses": [EVIDENCED, PARTIAL, NOT], "status_meaning": STATUS_MEANING,
            "source": "Paraphrased requirements; the Official Journal text is authoritative. Statuses are "
                      "computed from this pack: signature, non-empty populations, coverage, policy evaluation."}
