"""``draudit report``, ``draudit verify``, ``draudit keys generate`` and ``draudit jobs list``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from collector.cli.options import database_option, echo_json, open_store, output_option, settings_from
from collector.errors import UserError
from collector.timeutil import parse_cli_time


def _time(ctx: click.Context, param: click.Parameter, value: str):
    try:
        return parse_cli_time(value)
    except ValueError as exc:
        raise UserError(f"--{param.name.replace('period_', '')} {exc}") from None


def read_private_key(path: str | os.PathLike):
    """Load the Ed25519 signing key at ``path`` (PEM, PKCS#8, unencrypted).

    Raises:
        UserError: unreadable file or not an Ed25519 private key, naming the path.
    """
    from reports.manifest import load_private_key

    try:
        return load_private_key(Path(path).read_bytes(), f"signing key {path}")
    except OSError as exc:
        raise UserError(f"signing key {path}: cannot read it ({exc.strerror}); create one with `draudit keys generate`") from None
    except ValueError as exc:
        raise UserError(f"{exc}; create one with `draudit keys generate`") from None


def read_public_key(path: str | os.PathLike):
    """Load an Ed25519 public key (PEM) from ``path``.

    Raises:
        UserError: unreadable file or not an Ed25519 public key, naming the path.
    """
    from reports.manifest import load_public_key

    try:
        return load_public_key(Path(path).read_bytes(), f"public key {path}")
    except OSError as exc:
        raise UserError(f"public key {path}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise UserError(str(exc)) from None


@click.command("report")
@click.option("--from", "period_from", required=True, callback=_time, metavar="TIME",
              help="Period start, inclusive: RFC 3339 with zone or YYYY-MM-DD (00:00 UTC).")
@click.option("--to", "period_to", required=True, callback=_time, metavar="TIME", help="Period end, exclusive.")
@click.option("--cluster", "clusters", multiple=True, metavar="NAME", help="Cluster(s) to include (default: all).")
@click.option("--namespace", "namespaces", multiple=True, metavar="NS", help="Namespace(s) to include (default: all).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Pack directory to create (must not exist or be empty).")
@click.option("--sign-key", "sign_key", default=None, metavar="KEY",
              help="Ed25519 private key (PEM) to sign the manifest (env DRAUDIT_SIGN_KEY).")
@click.option("--archive", is_flag=True, help="Also write OUT.tar.gz (deterministic).")
@database_option
def report_cmd(period_from, period_to, clusters, namespaces, out_dir, sign_key, archive, database_url) -> None:
    """Render a DORA/NIS2 evidence pack for a period: HTML, PDF, CSV/JSON populations, manifest."""
    from reports.render import PackRequest, render_pack
    from reports.scope_names import never_recorded

    settings = settings_from(database_url=database_url, sign_key=sign_key)
    key = read_private_key(settings.sign_key) if settings.sign_key else None
    request = PackRequest(period_from, period_to, tuple(clusters), tuple(namespaces))
    _engine, sessions = open_store(settings)
    with sessions() as session:  # a typo in a scope name would otherwise render a clean, empty pack
        unknown = never_recorded(session, request.clusters, request.namespaces)
    if unknown:
        click.echo(unknown.warning(), err=True)
    result = render_pack(sessions, request, out_dir, sign_key=key, archive=archive,
                         policy_bundle=settings.policy_bundle, clock_skew_s=settings.clock_skew_s)
    click.echo(f"pack {result.pack_id} written to {result.path}{' (signed)' if result.signed else ' (not signed)'}")
    for name, n in sorted(result.counts.items()):
        click.echo(f"  data/{name}: {n} row{'' if n == 1 else 's'}")
    if result.archive:
        click.echo(f"archive {result.archive}")
    click.echo(f"manifest sha256 {result.manifest_sha256}; "
               + ("recorded in evidence_packs and the ledger" if result.recorded else "already recorded"))
    for warning in _pack_warnings(result, scope_never_recorded=bool(unknown)):
        click.echo(f"draudit: warning: {warning}", err=True)
    if not result.signed:  # verify passes it only with --integrity-only: say so now, not at the auditor's
        click.echo("draudit: warning: the pack is not signed (no --sign-key or DRAUDIT_SIGN_KEY): `draudit verify "
                   "--public-key` fails on it and its manifest proves integrity only (whoever rewrote a file could "
                   "rewrite the manifest too); create a key with `draudit keys generate` and render the pack again "
                   "with it", err=True)


def _pack_warnings(result, scope_never_recorded: bool = False) -> list[str]:
    """What an auditor would otherwise find only inside the pack (``reports.render.PackResult``): no
    policy bundle evaluated over an observed period (its findings section is empty for that reason;
    for a period nothing observed the pack says an evaluation finds nothing to decide on, and
    advising one would contradict it) or over part of it only, transactions not attributed yet."""
    from reports.controls import share_text, stretches_text

    warnings = []
    # the cover says it; a script reading stderr or an operator with a typo'd period should too (a scope
    # name never recorded has had its own warning: nothing of it can have been observed)
    if not result.observed and not scope_never_recorded:
        warnings.append("the collector observed no part of the period (no watch coverage recorded in it): the pack "
                        "evidences nothing for it (its cover says so) — check --from/--to and --cluster against when "
                        "`draudit run` or `draudit watch` recorded the cluster")
    if result.observed and not result.bundles_evaluated:
        warnings.append("no policy bundle was evaluated over the period, so the pack states no findings (section 6 "
                        "says why); run `draudit policy eval --from … --to …` (or let `draudit run` do it) and render "
                        "the pack again")
    low = result.policy_partial
    if result.observed and result.bundles_evaluated and low is not None:
        stretches = stretches_text(low.not_evaluated, low.more)
        covered = f"{share_text(low.share)} of it" if low.share > 0 else "not at all"  # another cluster was evaluated
        warnings.append(f"policy evaluations covered only part of the period: {low.where()} {covered}, "
                        f"not evaluated {stretches} (section 8, data/policy_coverage.csv); run `draudit policy eval "
                        "--from … --to …` over those stretches — with the bundle that evaluated the rest (`--bundle DIR`; its "
                        "revision is in section 8) — and render the pack again")
    if result.not_attributed:
        warnings.append(f"{result.not_attributed} transaction(s) of the period are not attributed yet (shown as "
                        "not-attributed-yet); run `draudit attribute` and render the pack again")
    return warnings


@click.command("verify")
@click.argument("pack", type=click.Path(path_type=Path))
@click.option("--public-key", "public_key", default=None, metavar="KEY", help="Ed25519 public key (PEM) to check the signature.")
@click.option("--integrity-only", is_flag=True,
              help="Without --public-key, accept a check of the files against the pack's own manifest (exit 0); "
                   "authenticity is then not checked.")
@output_option
def verify_cmd(pack: Path, public_key: str | None, integrity_only: bool, output: str) -> None:
    """Check an evidence pack offline (directory or .tar.gz): digests, files, signature.

    Exit 0 only when every check passes and the signature was checked with --public-key (or
    --integrity-only was given); exit 1 on any failure or when authenticity was not checked. Then
    states what the pack covers as its manifest records it (period, scope, date, ledger anchor),
    each line marked unless the signed manifest verified.
    """
    from reports.manifest import pack_statement, verdict
    from reports.verify import verify_pack_details

    key = read_public_key(public_key) if public_key else None
    found = verify_pack_details(pack, key)
    checks = found.checks
    ok = verdict(checks)
    # Without the signer's public key, anyone who rewrote a file could have rewritten the manifest
    # too: the digests only prove the files match *a* manifest. That is not a pass unless asked for.
    unchecked = ok and key is None
    passed = ok and (key is not None or integrity_only)
    # What the pack says it covers (period, scope, ledger anchor), so a genuine pack of the wrong
    # period or cluster is noticed; stated as verified only when the signed manifest verified.
    status = "unverified" if not ok else ("integrity-only" if key is None else "verified")
    statement = None if found.manifest is None else pack_statement(found.manifest)
    if output == "json":
        echo_json({"ok": passed, "authenticity_checked": key is not None,
                   "pack": None if statement is None else {**statement, "status": status},
                   "checks": [{"check": c.name, "result": c.label, "detail": c.detail} for c in checks]})
    else:
        for c in checks:
            click.echo(f"{c.label}  {c.name}: {c.detail}")
        if statement is not None:
            for line in _statement_lines(statement, status):
                click.echo(line)
        skipped = [c.name for c in checks if c.ok is None]
        if not ok:
            click.echo("verdict: FAIL")
        elif unchecked and integrity_only:
            click.echo("verdict: PASS for integrity only (--integrity-only) — authenticity NOT checked: the pack "
                       "matches its own manifest, but a rewritten manifest would pass too")
        elif unchecked:
            click.echo("verdict: NOT VERIFIED — the files match the pack's own manifest, but authenticity was not "
                       "checked and a rewritten manifest would pass too; give the signer's key with --public-key KEY "
                       "(or --integrity-only to accept a digest-only check)")
        else:
            click.echo("verdict: PASS" + (f" (skipped: {', '.join(skipped)})" if skipped else ""))
    sys.exit(0 if passed else 1)


_STATEMENT_HEADINGS = {
    "verified": "what this pack covers (from its manifest, signed by the key given and verified):",
    "integrity-only": "what this pack says it covers (from its manifest; authenticity NOT checked, a rewritten "
                      "manifest would say anything):",
    "unverified": "what this pack CLAIMS to cover (UNVERIFIED: the pack failed verification, these are not facts):",
}


def _statement_lines(statement: dict, status: str) -> list[str]:
    """The pack's period, scope, creation time and ledger anchor, one per line, each line marked
    unless the manifest verified (a line copied into a working paper keeps its qualification)."""
    tag = "" if status == "verified" else f" [{status}]"
    missing = "not recorded"

    def names(values) -> str:
        if values is None:
            return missing
        return "all (*)" if values == ["*"] else ", ".join(values)

    period, scope, anchor = statement["period"], statement["scope"], statement["ledger_anchor"]
    return [
        _STATEMENT_HEADINGS[status],
        f"  pack id{tag}: {statement['pack_id'] or missing}",
        f"  period{tag}: {period['from'] or missing} to {period['to'] or missing} (end exclusive)",
        f"  scope{tag}: clusters {names(scope['clusters'])}; namespaces {names(scope['namespaces'])}",
        f"  created{tag}: {statement['created'] or missing}"
        + (" (the period end: a pack is dated by its period, so rendering it again gives the same bytes)"
           if statement["created"] and statement["created"] == period["to"] else ""),
        f"  ledger anchor{tag}: " + (missing if anchor is None else
                                     f"entry {anchor['seq']}, entry_hash {anchor['entry_hash']}"
                                     + (f" (the operator shows the store still holds it: `draudit ledger verify "
                                        f"--anchor {anchor['seq']}:{anchor['entry_hash']} --database-url <the store's URL>`)"
                                        if status == "verified" else "")),
    ]


@click.group("keys")
def keys_group() -> None:
    """Signing keys for evidence packs (Ed25519)."""


@keys_group.command("generate")
@click.option("--out", "prefix", required=True, metavar="PREFIX", help="Writes PREFIX.key (private, 0600) and PREFIX.pub.")
def keys_generate(prefix: str) -> None:
    """Generate an Ed25519 key pair: PKCS#8 PEM private key and SubjectPublicKeyInfo PEM public key."""
    from reports.keyfiles import key_paths, write_key_pair
    from reports.manifest import public_key_id

    if prefix.endswith(("/", os.sep)) or Path(prefix).is_dir():
        # PREFIX.key next to the directory would land a private key outside it (e.g. /tmp.key).
        example = Path(prefix) / "signing"
        raise UserError(f"--out {prefix} is a directory; give a file prefix such as --out {example} "
                        f"(writes {example}.key and {example}.pub)")
    private_path, public_path = key_paths(prefix)
    try:
        key = write_key_pair(prefix)
    except FileExistsError as exc:
        raise UserError(f"{exc} exists; choose another --out prefix (keys are never overwritten)") from None
    except OSError as exc:
        raise UserError(f"--out {prefix}: cannot write the key files ({exc.strerror})") from None
    click.echo(f"private key {private_path} (keep secret), public key {public_path}, key id {public_key_id(key.public_key())}")


@click.group("jobs")
def jobs_group() -> None:
    """Scheduled jobs run by `draudit run`."""


@jobs_group.command("list")
@database_option
@output_option
def jobs_list(database_url: str | None, output: str) -> None:
    """Each scheduled job: its schedule, next run, last run and outcome."""
    from collector.scheduler import job_overview, load_schedule_config

    settings = settings_from(database_url=database_url)
    _engine, sessions = open_store(settings)
    rows = job_overview(sessions, load_schedule_config())
    if output == "json":
        echo_json(rows)
        return
    header = ("JOB", "SCHEDULE", "NEXT RUN (UTC)", "LAST RUN (UTC)", "OUTCOME", "ERROR OR SUMMARY")
    table = [header] + [(r["job"], r["schedule"], r["next_run"] or "not scheduled", r["last_run"] or "never",
                         r["outcome"] or "—", _one_line(r["error"] or r["summary"] or "", 100)) for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
    if not any(r["next_run"] or r["last_run"] for r in rows):
        click.echo("note: no job has been scheduled or run in this store yet: `draudit run` schedules them when it "
                   "first starts on it (DRAUDIT_SCHEDULE_<JOB> sets each one's schedule); 'never' is no failure",
                   err=True)


def _one_line(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with ``…`` (the JSON output has it whole)."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


commands = [report_cmd, verify_cmd, keys_group, jobs_group]
