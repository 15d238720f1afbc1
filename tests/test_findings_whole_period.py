"""A finding about its whole evaluation period (no interval of its own) is a statement of the
evaluation that made it: a later or wider evaluation by the same bundle that decided more of the
period and did not state it again overrides it — in ``draudit findings`` and in packs (both go
through ``reports.finding_scope.scoped_findings``). SQLite and PostgreSQL."""

from __future__ import annotations

import json

from click.testing import CliRunner

from collector.cli import cli
from test_policy_support import plant_history

# fires only over windows shorter than an hour, as a ratio can dip over a few seconds of traffic
SHORT_WINDOW_REGO = """package draudit.custom

findings contains f if {
	input.period.to_ns - input.period.from_ns < 3600000000000
	f := {"rule": "custom/short-window-ratio", "severity": "medium", "kind": "warning",
	      "message": "215 of 228 transactions attributed exactly", "subjects": {"cluster": input.period.cluster}}
}
"""


def _run(*args: str):
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == 0, res.output
    return res


def _listed(url: str, frm: str, to: str) -> list[tuple[str, str, str]]:
    rows = json.loads(_run("findings", "--database-url", url, "--output", "json", "--cluster", "prod-eu-1",
                           "--rule", "custom/short-window-ratio", "--from", frm, "--to", to).stdout)
    return [(r["from"], r["to"], r["message"]) for r in rows]


def _evaluator(database_url: str, sessions, tmp_path, monkeypatch):
    """The planted day in the store and a ``(from, to) -> None`` running ``policy eval`` of the
    short-window bundle over prod-eu-1."""
    monkeypatch.delenv("DRAUDIT_CLUSTER", raising=False)
    with sessions.begin() as s:
        plant_history(s)
    bundle = tmp_path / "custom"
    bundle.mkdir()
    (bundle / ".manifest").write_text(json.dumps({"revision": "custom-1", "roots": ["draudit"]}))
    (bundle / "custom.rego").write_text(SHORT_WINDOW_REGO)

    def evaluate(frm: str, to: str) -> None:
        _run("policy", "eval", "--from", frm, "--to", to, "--cluster", "prod-eu-1", "--bundle", str(bundle),
             "--database-url", database_url)

    return evaluate


def test_a_short_window_statement_does_not_stand_for_a_period_evaluated_whole_and_clean(database_url, sessions,
                                                                                       tmp_path, monkeypatch):
    evaluate = _evaluator(database_url, sessions, tmp_path, monkeypatch)
    evaluate("2026-11-29T00:00:00Z", "2026-11-30T00:00:00Z")  # the whole day: nothing stated
    evaluate("2026-11-29T10:00:15Z", "2026-11-29T10:00:18Z")  # later, 3 s: the statement
    assert _listed(database_url, "2026-11-29T00:00:00Z", "2026-11-30T00:00:00Z") == []
    # over those 3 seconds both decided all of it: the later, which stated it, is shown
    assert _listed(database_url, "2026-11-29T10:00:15Z", "2026-11-29T10:00:18Z") == [
        ("2026-11-29T10:00:15Z", "2026-11-29T10:00:18Z", "215 of 228 transactions attributed exactly")]
    evaluate("2026-11-29T00:00:00Z", "2026-11-30T00:00:00Z")  # the day again, later still: it overrides
    assert _listed(database_url, "2026-11-29T10:00:15Z", "2026-11-29T10:00:18Z") == []


def test_a_re_run_or_another_window_does_not_hide_a_whole_period_statement(database_url, sessions, tmp_path,
                                                                           monkeypatch):
    """A re-run of the same evaluation stores no new finding row (findings are stored once, under
    their first run): taken for silence, every scheduled re-run hid the statement. A wider window
    elsewhere did not decide the statement's stretch: it overrides nothing (a tester's findings)."""
    evaluate = _evaluator(database_url, sessions, tmp_path, monkeypatch)
    short = ("2026-11-29T10:00:15Z", "2026-11-29T10:00:18Z")
    evaluate(*short)
    evaluate(*short)  # the same evaluation again
    stated = [(*short, "215 of 228 transactions attributed exactly")]
    assert _listed(database_url, *short) == stated
    evaluate("2026-11-29T09:00:00Z", "2026-11-29T10:00:00Z")  # an hour before it: clean, and wider
    assert _listed(database_url, "2026-11-29T00:00:00Z", "2026-11-30T00:00:00Z") == stated
