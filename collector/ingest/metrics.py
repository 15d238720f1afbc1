"""Prometheus counters of the ingest stage (registered on the default registry the server exposes).

``draudit_ingest_lines_total{outcome}``: input units by outcome — ``stored`` (new row, conflicts
included), ``duplicate`` (already stored), ``quarantined``; their sum is the units read.
``draudit_ingest_conflicts_total``: stored rows flagged ``conflict``.
``draudit_ingest_pan_masked_total``: card numbers masked before storage.
Counters move only after the transaction that stored the rows committed.
"""

from __future__ import annotations

from prometheus_client import Counter

LINES = Counter("draudit_ingest_lines", "Ingested log input units by outcome.", ["outcome"])
CONFLICTS = Counter("draudit_ingest_conflicts", "Stored inference records flagged as conflicting with an earlier record.")
PAN_MASKED = Counter("draudit_ingest_pan_masked", "Card numbers (PANs) masked before storage.")
for _outcome in ("stored", "duplicate", "quarantined"):
    LINES.labels(outcome=_outcome)


def observe(stored: int, duplicates: int, quarantined: int, conflicts: int, pan_masked: int) -> None:
    """Add one committed batch's counts to the counters."""
    if stored:
        LINES.labels(outcome="stored").inc(stored)
    if duplicates:
        LINES.labels(outcome="duplicate").inc(duplicates)
    if quarantined:
        LINES.labels(outcome="quarantined").inc(quarantined)
    if conflicts:
        CONFLICTS.inc(conflicts)
    if pan_masked:
        PAN_MASKED.inc(pan_masked)
