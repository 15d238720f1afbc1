"""``--from``/``--to`` of `report`, `policy eval` and `findings` outside what the store can hold, or
with an offset beyond ±23:59: one line naming the flag, exit 2, no traceback (an auditor-breaker's
finding: year 0001 raised OverflowError on SQLite and NumericValueOutOfRange on PostgreSQL, and
+24:00 was read as a day's shift)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from collector.cli import cli


@pytest.mark.parametrize("command", [["report", "--out", "{tmp}/pack"], ["policy", "eval"], ["findings"]])
@pytest.mark.parametrize("flag, value, says", [
    ("--from", "0001-01-01T00:00:00Z", "out of range; times are stored as 64-bit nanoseconds since 1970"),
    ("--from", "1677-09-20", "out of range"),
    ("--to", "2262-04-12T00:00:00Z", "out of range"),
    ("--from", "2026-11-30T10:00:00-24:00", "zone offset -24:00 is not a valid offset (at most ±23:59)"),
])
def test_times_the_store_cannot_hold_are_refused_naming_the_flag(database_url, tmp_path, command, flag, value, says):
    assert CliRunner().invoke(cli, ["db", "upgrade", "--database-url", database_url]).exit_code == 0
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    other = ["--to", "2026-11-30T12:00:00Z"] if flag == "--from" else ["--from", "2026-11-29T12:00:00Z"]
    res = CliRunner().invoke(cli, [*args, flag, value, *other, "--database-url", database_url])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"draudit: error: {flag} '{value}': ") and says in res.output
    assert "Traceback" not in res.output and res.output.count("\n") == 1
    assert not (tmp_path / "pack").exists()
