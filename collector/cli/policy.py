"""``draudit policy test|check|eval``: the CI entry point for bundles and the evaluation over the store."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import click

from collector.cli.options import database_option, echo_json, open_store, output_option, settings_from
from collector.errors import UserError
from collector.timeutil import dt_to_ns, ns_to_rfc3339, parse_cli_time, utcnow

DEFAULT_PERIOD = timedelta(days=1)


def _opa_url_option(fn):
    return click.option("--opa-url", "opa_url", default=None, metavar="URL",
                        help="Evaluate on this OPA server instead of the embedded engine (env DRAUDIT_OPA_URL).")(fn)


def _load(bundle_dir):
    """The bundle in ``bundle_dir`` (``load_bundle``), its warnings printed on stderr."""
    from collector.policy.bundle import load_bundle

    bundle = load_bundle(bundle_dir)
    for warning in bundle.warnings:
        click.echo(f"warning: {warning}", err=True)
    return bundle


@click.group("policy")
def policy_group() -> None:
    """Rego policies (an OPA bundle): test it, check it, evaluate it over the stored history."""


@policy_group.command("test")
@click.argument("bundle_dir", required=False, type=click.Path(path_type=Path))
@_opa_url_option
def policy_test(bundle_dir: Path | None, opa_url: str | None) -> None:
    """Run every test_ rule of BUNDLE_DIR (default: the shipped bundle), like `opa test`.

    The bundle must load as `policy eval` loads it: parameters its rules read (data.draudit.params
    in data.json) must be there even when every test injects its own with `with`.

    Exit status: 0 when all pass, 1 when a test fails or none exist, 2 when the bundle does not load.
    """
    from collector.policy.engines import make_policy_engine

    settings = settings_from(opa_url=opa_url)
    bundle = _load(bundle_dir or settings.policy_bundle)
    engine = make_policy_engine(settings.opa_url, settings.opa_timeout_s)
    engine.load_bundle(bundle)
    results = engine.run_tests()
    if not results:
        click.echo(f"no test_ rules found in {bundle.root}")
        sys.exit(1)
    for r in results:
        click.echo(f"{r.ref}: {'PASS' if r.passed else 'FAIL'} ({r.duration_s * 1000:.1f}ms)")
        if not r.passed:
            click.echo(f"    {bundle.root / r.path}:{r.line}: {r.error}")
    failed = [r for r in results if not r.passed]
    click.echo("-" * 60)
    click.echo(f"PASS: {len(results) - len(failed)}/{len(results)}" + (f"  FAIL: {len(failed)}/{len(results)}" if failed else "")
               + f"  (engine {engine.name}, bundle revision {bundle.revision})")
    sys.exit(1 if failed else 0)


@policy_group.command("check")
@click.argument("bundle_dir", type=click.Path(path_type=Path))
def policy_check(bundle_dir: Path) -> None:
    """Validate BUNDLE_DIR: .manifest (revision, roots), packages under the roots, every module parses,
    the parameters the rules read (data.draudit.params) are all there; warns about parameter keys no
    rule reads and packages nothing evaluates (no `findings contains` rule)."""
    from collector.policy.bundle import BundleError
    from collector.policy.engines import RegorusEngine

    bundle = _load(bundle_dir)
    RegorusEngine().load_bundle(bundle)
    if not bundle.decision_packages:
        raise BundleError(f"{bundle.root}: no package defines `findings contains ...`, so evaluation would produce nothing")
    warned = f"\n  {len(bundle.warnings)} warning(s), on stderr" if bundle.warnings else ""
    click.echo(f"bundle OK: {bundle.root}\n  revision {bundle.revision}, roots {list(bundle.roots)}\n"
               f"  {len(bundle.modules)} modules, {len(bundle.tests)} tests\n"
               f"  decision packages: {', '.join(bundle.decision_packages)}\n  digest sha256:{bundle.digest}{warned}")


def _default_cluster(sessions) -> str | None:
    """The cluster an evaluation without ``--cluster`` is about: ``DRAUDIT_CLUSTER`` when set (as
    ``draudit run`` evaluates), else the store's only cluster, else None (all clusters).

    A finding's identity includes the evaluated cluster: the scheduler's rows (its cluster) and a
    manual evaluation of the same one-cluster store (no cluster) must be the same decisions, not
    two findings each in every pack.
    """
    import os

    from reports.scope_names import known_clusters

    if os.environ.get("DRAUDIT_CLUSTER", "").strip():
        return os.environ["DRAUDIT_CLUSTER"].strip()
    with sessions() as session:
        clusters = known_clusters(session)
    return clusters[0] if len(clusters) == 1 else None


def _time(value: str | None, flag: str):
    if value is None:
        return None
    try:
        return parse_cli_time(value)
    except ValueError as exc:
        raise UserError(f"{flag} {exc}") from None


@policy_group.command("eval")
@click.option("--from", "from_", default=None, metavar="TIME", help="Period start (RFC 3339 or date; default: --to minus 1 day).")
@click.option("--to", "to", default=None, metavar="TIME", help="Period end, exclusive (default: now).")
@click.option("--bundle", "bundle_dir", default=None, type=click.Path(path_type=Path),
              help="OPA bundle directory (env DRAUDIT_POLICY_BUNDLE; default: the shipped policies/).")
@click.option("--cluster", default=None,
              help="Only this cluster (default: env DRAUDIT_CLUSTER, else the store's only cluster, else all clusters).")
@_opa_url_option
@database_option
@output_option
def policy_eval(from_: str | None, to: str | None, bundle_dir: Path | None, cluster: str | None, opa_url: str | None,
                database_url: str | None, output: str) -> None:
    """Evaluate the bundle over [--from, --to), store the findings (idempotently) and print them."""
    from collector.policy.bundle import BundleError
    from collector.policy.engines import make_policy_engine
    from collector.policy.findings import evaluate_period, seen_until_ns
    from collector.policy.period import future_end_error
    from reports.scope_names import known_clusters, never_recorded

    settings = settings_from(database_url=database_url, opa_url=opa_url, policy_bundle=bundle_dir)
    now = utcnow()
    end = _time(to, "--to") or now
    start = _time(from_, "--from") or end - DEFAULT_PERIOD
    if end <= start:
        raise UserError(f"--from {start.isoformat()} is not before --to {end.isoformat()}")
    # as `draudit report`: facts of a period that has not ended would be stated before they happen
    refusal = future_end_error(end, now, "an evaluation")
    if refusal:
        raise UserError(refusal)
    bundle = _load(settings.policy_bundle)
    if not bundle.decision_packages:
        raise BundleError(f"{bundle.root}: no package defines `findings contains ...`")
    engine = make_policy_engine(settings.opa_url, settings.opa_timeout_s)
    engine.load_bundle(bundle)
    _engine, sessions = open_store(settings)
    cluster = cluster or _default_cluster(sessions)
    if cluster:  # a typo in --cluster would otherwise read as a clean "0 findings" (as `draudit report` warns)
        with sessions() as session:
            unknown = never_recorded(session, (cluster,), ())
            watched = known_clusters(session)
        if unknown:  # refused: a stored evaluation of nothing would count as policy coverage in packs
            raise UserError(unknown.warning("nothing of it can be evaluated; no evaluation is stored — an evaluation "
                                            "of nothing would count in packs as the policies covering the period")
                            .removeprefix("warning: "))
        if cluster not in watched:  # only ingested records name it (ingest --allow-unwatched-cluster): as above
            raise UserError(f"cluster {cluster} has no watch history in this store (watched: "
                            f"{', '.join(watched) or 'none'}), only ingested records: its allocations cannot be "
                            "evaluated; no evaluation is stored — an evaluation of nothing would count in packs as "
                            "the policies covering the period")
    result = evaluate_period(sessions, bundle, engine, dt_to_ns(start), dt_to_ns(end), cluster)
    for name, last in sorted(result.unobserved.items()):  # "0 findings" there means "not observed", not "clean"
        click.echo(f"note: cluster {name} was not observed in this period: its ResourceClaims were last observed at "
                   f"{ns_to_rfc3339(last)} (the collector stopped or lost the watch stream); no allocation of it is "
                   "evaluated, only that loss of observation is stated", err=True)
    # an interval still going on when evaluated is open, "seen until" then, not ended then (seen_until_ns)
    seen = [seen_until_ns(f["from_ns"], f["to_ns"], f["period_to_ns"], f["evaluated_at"]) for f in result.findings]
    if output == "json":
        echo_json([{"rule": f["rule"], "severity": f["severity"], "kind": f["kind"], "subjects": f["subjects"],
                    "physical_gpu_uuid": f["physical_gpu_uuid"], "from": ns_to_rfc3339(f["from_ns"]),
                    "to": None if s is not None else ns_to_rfc3339(f["to_ns"]), "seen_until": ns_to_rfc3339(s),
                    "message": f["message"]} for f, s in zip(result.findings, seen)])
        return
    for f, s in zip(result.findings, seen):
        gpu = f" gpu={f['physical_gpu_uuid']}" if f["physical_gpu_uuid"] else ""
        until = f"open (seen until {ns_to_rfc3339(s)})" if s is not None else ns_to_rfc3339(f["to_ns"])
        click.echo(f"{f['severity'].upper():8} {f['kind']:11} {f['rule']}{gpu} "
                   f"[{ns_to_rfc3339(f['from_ns'])} .. {until}]\n    {f['message']}")
    click.echo(f"{len(result.findings)} findings ({_news(result)}) for [{ns_to_rfc3339(dt_to_ns(start))}, "
               f"{ns_to_rfc3339(dt_to_ns(end))}) — bundle {bundle.revision} sha256:{bundle.digest[:12]}, engine {engine.name}; "
               f"facts {result.facts_s:.3f} s, Rego {result.rego_s:.3f} s")


commands = [policy_group]


def _news(result) -> str:
    """"N new" and, when some rows re-state a decision stored before (same rule, cluster, subjects,
    start and bundle: over another period, or an interval still open with a moved end), "M re-stated"."""
    fresh = f"{result.inserted - result.updated} new"
    return fresh if not result.updated else f"{fresh} decisions, {result.updated} re-stated: stored before, kept as one finding"
