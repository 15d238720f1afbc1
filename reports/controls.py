"""Control mapping: each DORA / RTS 2024/1774 / NIS2 control → the pack sections and files that evidence it.

Sources: Regulation (EU) 2022/2554 (DORA) Art. 8, 9, 10, 17, 28; Commission Delegated Regulation
(EU) 2024/1774 (RTS on the ICT risk-management framework) Art. 4, 12, 23; Directive (EU) 2022/2555
(NIS2) Art. 21(2)(a)–(j). Mapping after ``shared/reference/compliance.md`` §2.5. Requirements are
paraphrased; the Official Journal text is authoritative. Controls this tool cannot evidence are
listed with status ``not evidenced`` and the reason, never left out.
"""

from __future__ import annotations

from typing import Any

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


def _c(regulation: str, article: str, requirement: str, status: str, sections: list[str], files: list[str],
       note: str) -> dict[str, Any]:
    return {"regulation": regulation, "article": article, "requirement": requirement, "status": status,
            "sections": sections, "files": files, "note": note}


DORA = "DORA (EU) 2022/2554"
RTS = "RTS (EU) 2024/1774"
NIS2 = "NIS2 (EU) 2022/2555"

CONTROLS: list[dict[str, Any]] = [
    _c(DORA, "Art. 8(1)", "Identify, classify and document ICT assets supporting business functions",
       PARTIAL, ["scope", "inventory"], INVENTORY,
       "Physical GPUs and MIG instances with node, product, memory and driver are documented; business "
       "functions, roles and classification are not collected."),
    _c(DORA, "Art. 8(4)", "Identify all ICT assets incl. hardware; map their configuration and interdependencies",
       EVIDENCED, ["inventory", "lineage"], INVENTORY + LINEAGE,
       "Device → physical GPU → node, MIG profile and sharing; transaction → pod → claim → GPU dependencies."),
    _c(DORA, "Art. 8(5)", "Document processes depending on ICT third-party providers",
       NOT, [], [], "Cloud provider and region are not collected by draudit."),
    _c(DORA, "Art. 8(6)", "Keep inventories updated periodically and at every major change",
       EVIDENCED, ["inventory", "changes"], INVENTORY + CHANGES,
       "Every device record has a validity interval; driver and DeviceClass changes are listed."),
    _c(DORA, "Art. 9(1)", "Continuously monitor and control ICT security and functioning",
       EVIDENCED, ["coverage", "timeline"], COVERAGE + EPISODES + CONSUMERS,
       "Continuous list-watch of the DRA API; the coverage section states every gap."),
    _c(DORA, "Art. 9(2)", "Keep data available, authentic, intact and confidential",
       PARTIAL, ["integrity"], INTEGRITY,
       "Integrity of the collected evidence (hash-chained ledger, signed manifest); not of the bank's data."),
    _c(DORA, "Art. 9(4)(b)", "Sound infrastructure management incl. isolation of assets",
       EVIDENCED, ["sharing", "findings"], SHARING + FINDINGS,
       "Who shared which physical GPU when, with or without hardware partitioning (MIG)."),
    _c(DORA, "Art. 9(4)(c)", "Limit access to ICT assets to what legitimate functions need",
       PARTIAL, ["timeline", "sharing"], EPISODES + CONSUMERS,
       "Which namespace (tenant) held which device when; RBAC rights are not collected."),
    _c(DORA, "Art. 9(4)(d)", "Strong authentication; protection of cryptographic keys",
       NOT, [], [], "Key custody of the pack signing key is the operator's control."),
    _c(DORA, "Art. 9(4)(e)", "ICT change management: changes recorded, assessed, approved",
       PARTIAL, ["changes"], CHANGES,
       "Changes are recorded (DeviceClass, driver, policy bundle); actor and approver are not collected."),
    _c(DORA, "Art. 10(1)", "Detect anomalous activities promptly, with alert thresholds",
       EVIDENCED, ["findings", "coverage"], FINDINGS + COVERAGE,
       "Policy findings over the allocation history and observation gaps."),
    _c(DORA, "Art. 17(1)", "ICT-related incident management process",
       NOT, [], [], "The incident process and incident records are outside draudit."),
    _c(DORA, "Art. 17(2)–(3)", "Record incidents; identify, track, classify them; root causes",
       PARTIAL, ["findings", "lineage"], FINDINGS + LINEAGE,
       "Findings with their interval and the affected transactions per GPU support classification; "
       "linking findings to incident ids is not supported."),
    _c(DORA, "Art. 28(3)", "Register of information on ICT third-party contractual arrangements",
       NOT, [], [], "The register is contract data; this pack only shows usage of the GPU compute service."),
    _c(RTS, "Art. 4(2)(b)", "Asset records: unique id, location, classification, owner, functions, interdependencies",
       PARTIAL, ["inventory", "lineage"], INVENTORY + LINEAGE,
       "(i) unique id (GPU UUID), (ii) location (node), (viii) interdependencies are evidenced; "
       "(iii) classification, (iv) owner, (vi) RTO/RPO, (vii) exposure, (ix) end of support are not collected."),
    _c(RTS, "Art. 12(2)(a)", "Logging procedures: events logged and retention period",
       PARTIAL, ["methodology", "coverage"], COVERAGE,
       "The events logged are stated; retention is configured in the collector and deletions are ledger tombstones."),
    _c(RTS, "Art. 12(2)(c)", "Log capacity, change and ICT operations events",
       EVIDENCED, ["timeline", "changes"], EPISODES + CONSUMERS + CHANGES,
       "Allocation episodes and consumers with validity intervals; configuration changes."),
    _c(RTS, "Art. 12(2)(d)–(e)", "Protect logs against tampering, deletion and unauthorised access",
       EVIDENCED, ["integrity"], INTEGRITY,
       "Hash-chained ledger (anchor in the manifest), SHA-256 of every file, Ed25519 signature, offline verifier."),
    _c(RTS, "Art. 12(2)(f)", "Synchronise clocks to a documented reliable time source",
       PARTIAL, ["methodology"], [],
       "The clock-skew tolerance used for attribution is stated; the nodes' time source is not collected."),
    _c(RTS, "Art. 23", "Anomaly detection incl. alerts on completeness and integrity of log collection",
       EVIDENCED, ["coverage", "findings"], COVERAGE + FINDINGS,
       "Watch gaps are recorded per kind and shown; policy findings flag them."),
    _c(NIS2, "Art. 21(2)(a)", "Risk analysis and information system security policies",
       EVIDENCED, ["findings", "changes"], FINDINGS + CHANGES,
       "The policy bundle revisions in force and their findings."),
    _c(NIS2, "Art. 21(2)(b)", "Incident handling",
       PARTIAL, ["findings"], FINDINGS, "Findings feed incident handling; incident records are outside draudit."),
    _c(NIS2, "Art. 21(2)(c)", "Business continuity: backups, disaster recovery, crisis management",
       NOT, [], [], "Not collected."),
    _c(NIS2, "Art. 21(2)(d)", "Supply-chain security", NOT, [], [], "Provider and supplier data are not collected."),
    _c(NIS2, "Art. 21(2)(e)", "Security in acquisition, development and maintenance",
       PARTIAL, ["changes", "inventory"], CHANGES + INVENTORY, "Driver versions and their changes; vulnerability data is not collected."),
    _c(NIS2, "Art. 21(2)(f)", "Assess the effectiveness of risk-management measures",
       EVIDENCED, ["findings", "coverage"], FINDINGS + COVERAGE, "Continuous policy evaluation with stated coverage."),
    _c(NIS2, "Art. 21(2)(g)", "Basic cyber hygiene and training", NOT, [], [], "Not collected."),
    _c(NIS2, "Art. 21(2)(h)", "Cryptography and encryption",
       PARTIAL, ["integrity"], INTEGRITY, "Signatures and digests protect this pack; encryption of the bank's data is not assessed."),
    _c(NIS2, "Art. 21(2)(i)", "Human resources security, access control and asset management",
       PARTIAL, ["inventory", "sharing"], INVENTORY + SHARING,
       "Asset management and tenant access to devices; HR security is not collected."),
    _c(NIS2, "Art. 21(2)(j)", "Multi-factor authentication and secured communications", NOT, [], [], "Not collected."),
]


def controls_document(signed: bool) -> dict[str, Any]:
    """The ``controls.json`` content: sections and controls; ``manifest.sig`` named only when signed.

    Each control carries ``id`` (``"<regulation> <article>"``), requirement, status, section ids with
    titles, and the pack files that evidence it.
    """
    controls = []
    for c in CONTROLS:
        files = [f for f in c["files"] if signed or f != "manifest.sig"]
        controls.append({"id": f"{c['regulation']} {c['article']}", **c, "files": files,
                         "section_titles": [SECTION_TITLES[s] for s in c["sections"]]})
    return {"sections": [{"id": i, "title": t} for i, t in SECTIONS], "controls": controls,
            "statuses": [EVIDENCED, PARTIAL, NOT],
            "source": "Paraphrased requirements; the Official Journal text is authoritative."}
