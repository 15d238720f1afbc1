"""`draudit keys generate`: where the key files go, and refusals (no database involved)."""

from __future__ import annotations

import stat

from click.testing import CliRunner

from collector.cli import cli


def test_generate_writes_a_private_key_only_its_owner_can_read_and_a_public_key(tmp_path):
    result = CliRunner().invoke(cli, ["keys", "generate", "--out", str(tmp_path / "signing")])
    assert result.exit_code == 0, result.output
    private, public = tmp_path / "signing.key", tmp_path / "signing.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")


def test_a_directory_as_out_is_refused_instead_of_writing_keys_beside_it(tmp_path):
    # --out /tmp used to write /tmp.key: a private key outside the directory the user named.
    keys = tmp_path / "keys"
    keys.mkdir()
    for out in (str(keys), str(keys) + "/"):
        result = CliRunner().invoke(cli, ["keys", "generate", "--out", out])
        assert result.exit_code == 2
        assert f"--out {out} is a directory; give a file prefix such as --out {keys / 'signing'}" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys"] and list(keys.iterdir()) == []


def test_existing_key_files_are_never_overwritten(tmp_path):
    runner = CliRunner()
    assert runner.invoke(cli, ["keys", "generate", "--out", str(tmp_path / "k")]).exit_code == 0
    before = (tmp_path / "k.key").read_bytes()
    result = runner.invoke(cli, ["keys", "generate", "--out", str(tmp_path / "k")])
    assert result.exit_code == 2 and "exists; choose another --out prefix" in result.output
    assert (tmp_path / "k.key").read_bytes() == before
