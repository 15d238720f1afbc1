"""Prometheus counters of the ingest stage (registered on the default registry the server exposes).

``draudit_ingest_lines_total{outcome}``: input units by outcome — ``stored`` (new row, conflicts
included), ``duplicate`` (already stored), ``quarantined``; their sum is the units read.
``draudit_ingest_conflicts_total``: stored rows flagged ``conflict``.
``draudit_ingest_pan_masked_total``: card numbers masked before storage.
Counters move only after the transaction that stored the rows committed.

``draudit_ingest_requests_total{path,code}``: HTTP ingestion requests (``POST /v1/ingest``,
``POST /v1/logs``) by the status code answered, successes and failures alike.
``draudit_ingest_requests_rejected_total{path,reason}``: those answered 4xx, by reason —
``unauthorized`` (401), ``method-not-allowed`` (405: not a POST), ``too-large`` (413),
``unsupported-media-type`` (415), ``bad-request`` (400).
Shippers do not retry a 4xx (Fluent Bit drops the chunk, an OTLP exporter the batch): each one
counted is data lost unless re-sent by hand, hence a series per path and reason from the start
(``rate()`` and ``increase()`` alerts see 0 before the first rejection). A 503 (database
unavailable, retried by the shipper) and a 500 count in ``draudit_ingest_requests_total`` only.
Label values are bounded: two paths, the status codes the server answers, five reasons.
"""

from __future__ import annotations

from prometheus_client import Counter

LINES = Counter("draudit_ingest_lines", "Ingested log input units by outcome.", ["outcome"])
CONFLICTS = Counter("draudit_ingest_conflicts", "Stored inference records flagged as conflicting with an earlier record.")
PAN_MASKED = Counter("draudit_ingest_pan_masked", "Card numbers (PANs) masked before storage.")
for _outcome in ("stored", "duplicate", "quarantined"):
    LINES.labels(outcome=_outcome)

INGEST_PATHS = ("/v1/ingest", "/v1/logs")
# The 4xx the ingestion routes answer, and the reason label of each.
REJECT_REASONS = {400: "bad-request", 401: "unauthorized", 405: "method-not-allowed", 413: "too-large",
                  415: "unsupported-media-type"}
REQUESTS = Counter("draudit_ingest_requests", "HTTP ingestion requests by path and status code answered.",
                   ["path", "code"])
REJECTED = Counter("draudit_ingest_requests_rejected",
                   "HTTP ingestion requests answered 4xx (not retried by shippers: their records are lost), "
                   "by path and reason.", ["path", "reason"])
for _path in INGEST_PATHS:
    REQUESTS.labels(path=_path, code="200")
    for _reason in REJECT_REASONS.values():
        REJECTED.labels(path=_path, reason=_reason)


def reject_reason(status: int) -> str | None:
    """The ``reason`` label of an answer's status code: None for a 2xx or 5xx (not a rejection)."""
    if 400 <= status < 500:
        return REJECT_REASONS.get(status, "bad-request")
    return None


def observe_request(path: str, status: int) -> str | None:
    """Count one answered ingestion request (``path`` one of ``INGEST_PATHS``); returns its
    rejection reason (``reject_reason``), counted in ``REJECTED`` too, or None."""
    REQUESTS.labels(path=path, code=str(status)).inc()
    reason = reject_reason(status)
    if reason is not None:
        REJECTED.labels(path=path, reason=reason).inc()
    return reason


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
