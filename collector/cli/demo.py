"""``draudit demo``: the fraud-scoring story end to end on the embedded defaults."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from collector.cli.options import echo_json
from collector.timeutil import ns_to_rfc3339


@click.command("demo")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("draudit-demo"), show_default=True,
              help="Working directory (SQLite store, logs, keys, evidence pack). A previous demo's is emptied first.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Human summary, or one JSON object for scripts.")
@click.option("--duration-s", type=click.FloatRange(min=20), default=30.0, show_default=True,
              help="Real time the cluster history takes to play.")
@click.option("--transactions", type=click.IntRange(min=10), default=3000, show_default=True,
              help="Scored transactions logged by the fraud-scoring service.")
@click.option("--seed", type=int, default=7, show_default=True, help="Scenario seed (same seed, same story).")
def demo_cmd(out_dir: Path, output: str, duration_s: float, transactions: int, seed: int) -> None:
    """Play a bank's GPU cluster through the whole product: watch → ingest → attribute → policies → evidence pack.

    Starts a fake Kubernetes API server on a free loopback port, runs the real watcher against it,
    ingests the fraud-scoring service's logs, attributes each transaction to a physical GPU,
    evaluates the Rego policies, renders, signs and verifies the evidence pack. About a minute.
    """
    from collector.demo import run_demo

    progress = _progress_printer(enabled=output == "text")
    try:
        result = run_demo(out_dir, duration_s=duration_s, n_transactions=transactions, seed=seed, progress=progress)
    finally:
        progress.close()
    if output == "json":
        echo_json(result.as_json())
    else:
        _print_summary(result)
    sys.exit(0 if result.verified else 1)


class _progress_printer:
    """Progress on stderr: a rich progress bar on a terminal, plain lines otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None
        self.last_line = ""
        if enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]draudit demo[/]"), BarColumn(), TextColumn("{task.description}"),
                                TimeElapsedColumn(), transient=True)
            self.task = self.bar.add_task("starting", total=1.0)
            self.bar.start()

    def __call__(self, message: str, fraction: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=fraction, description=message[:70])
        elif not message.startswith("cluster:") and message != self.last_line:
            click.echo(f"[{fraction * 100:3.0f}%] {message}", err=True)
            self.last_line = message

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _print_summary(r) -> None:
    e = click.echo
    t = r.transactions
    total = sum(t.values())
    e("")
    e("draudit demo — fraud-scoring on a shared-GPU inference cluster")
    e(f"  transactions: {total} attributed  exact {t['exact']}  ambiguous {t['ambiguous']}  unattributed {t['unattributed']}"
      + (f"  (reasons: {', '.join(f'{k} {v}' for k, v in sorted(r.by_reason.items()))})" if r.by_reason else ""))
    ing = r.ingest
    e(f"  ingest: {ing['read']} read ({ing['file_read']} file lines, {ing['otlp_records']} OTLP log records) = "
      f"{ing['stored']} stored + {ing['duplicates']} duplicates + {ing['quarantined']} quarantined; "
      f"{ing['pan_masked']} card number(s) masked")
    reasons = r.quarantine_reasons
    if reasons:
        e(f"  quarantined by reason: {', '.join(f'{k} {v}' for k, v in reasons.items())}")
    e("  findings:")
    for f in r.findings:
        subjects = f.get("subjects") or {}
        who = _subjects_text(subjects)
        e(f"    [{f['severity']:>6} {f['kind']}] {f['rule']}: {f.get('message', '')}")
        if who:
            e(f"        {who}")
        if f.get("pods"):
            e(f"        pods: {', '.join(f['pods'])}")
        if f.get("physical_gpu_uuid"):
            e(f"        physical GPU {f['physical_gpu_uuid']}  from {ns_to_rfc3339(f.get('from_ns'))} to {ns_to_rfc3339(f.get('to_ns'))}")
    e(f"  evidence pack: {r.pack_path}  (archive {r.archive_path})")
    e(f"  verification: {'PASSED' if r.verified else 'FAILED'} ({sum(1 for c in r.checks if c[1])}/{len(r.checks)} checks)")
    e(f"  store: {r.database_url}")
    sample = r.suggested_trace or "<transaction id>"  # one whose trace names another tenant's pod
    e("")
    e("next:")
    prog = _invoked_as()
    e(f"  {prog} trace {sample} --database-url {r.database_url}")
    if reasons:
        e(f"  {prog} quarantine --database-url {r.database_url}   (each refused line, its reason and place)")
    e(f"  xdg-open {r.pack_path / 'index.html'}   (macOS: open; or report.pdf)")
    e(f"  {prog} verify {r.pack_path} --public-key {r.out_dir / 'keys' / 'demo-signing.pub'}")


def _invoked_as() -> str:
    """The command as the user typed it (``.venv/bin/draudit``, ``draudit`` on PATH), so the
    suggested next commands work from where they are."""
    prog = sys.argv[0] if sys.argv and sys.argv[0] else "draudit"
    if prog.endswith("__main__.py") or not Path(prog).name.startswith("draudit"):
        return f"{shlex.quote(sys.executable)} -m collector.cli"
    return shlex.quote(prog)


def _subjects_text(subjects) -> str:
    if isinstance(subjects, dict):
        parts = []
        for key in ("tenants", "pods", "claims", "namespace", "namespaces"):
            if key in subjects:
                value = subjects[key]
                if isinstance(value, list):
                    value = ", ".join(v if isinstance(v, str) else "/".join(str(x) for x in (v.get("namespace"), v.get("name")) if x)
                                      for v in value)
                parts.append(f"{key}: {value}")
        return "; ".join(parts)
    return str(subjects)


commands = [demo_cmd]
