"""`draudit verify` on archives that are not what `report --archive` wrote: cut or not an archive."""

from __future__ import annotations

import os
import tarfile

import pytest
from click.testing import CliRunner

from collector.cli import cli
from collector.errors import UserError
from reports.verify import verify_pack


@pytest.fixture
def archive(tmp_path):
    pack = tmp_path / "pack-2026-11-29"
    (pack / "data").mkdir(parents=True)
    (pack / "manifest.json").write_text('{"files": []}')
    (pack / "data" / "transaction_lineage.csv").write_bytes(os.urandom(300_000))  # incompressible
    path = tmp_path / "pack.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(pack, arcname=pack.name)
    return path


def test_a_truncated_archive_is_a_failed_check_naming_the_file(archive, tmp_path):
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(archive.read_bytes()[:100_000])
    [check] = verify_pack(cut)
    assert (check.name, check.ok) == ("archive", False)
    assert check.detail.startswith("cut.tar.gz is truncated or corrupt (")
    result = CliRunner().invoke(cli, ["verify", str(cut)])
    assert result.exit_code == 1
    assert "FAIL  archive: cut.tar.gz is truncated or corrupt" in result.output and "verdict: FAIL" in result.output


def test_a_file_that_is_not_an_archive_is_one_line(tmp_path):
    fake = tmp_path / "fake.tar.gz"
    fake.write_text("not a pack\n")
    with pytest.raises(UserError) as caught:
        verify_pack(fake)
    assert "\n" not in str(caught.value)
    result = CliRunner().invoke(cli, ["verify", str(fake)])
    assert result.exit_code == 2
    assert result.output.strip() == (f"draudit: error: pack {fake}: not a directory or a tar / tar.gz archive; "
                                     "give the pack directory or the archive `draudit report --archive` wrote")


def test_a_bit_flipped_inside_the_archive_is_reported_as_damage_not_as_a_missing_manifest(archive, tmp_path):
    """A newcomer flipped one bit in the middle of a pack archive: tarfile stopped at the garbled
    member header as if the archive ended there, and verify said the manifest was missing. The gzip
    stream's own check (CRC-32 and length, RFC 1952) names the damage."""
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x10
    flipped = tmp_path / "flipped.tar.gz"
    flipped.write_bytes(bytes(data))
    [check] = verify_pack(flipped)
    assert (check.name, check.ok) == ("archive", False)
    assert check.detail.startswith("flipped.tar.gz is truncated or corrupt (")


def test_a_file_of_zeros_or_a_tar_with_a_zeroed_header_is_refused_at_once(archive, tmp_path):
    """A tester's finding: `verify` of a 1 GiB file of zeros read it for 89 s, then said the manifest
    was missing; a plain tar whose first header was zeroed said the same. Neither starts as an archive."""
    zeros = tmp_path / "zeros.tar"
    with zeros.open("wb") as f:
        f.truncate(64 << 20)
    plain = tmp_path / "plain.tar"
    with tarfile.open(archive) as src, tarfile.open(plain, "w") as dst:
        for member in src:
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    data = bytearray(plain.read_bytes())
    data[:512] = bytes(512)
    plain.write_bytes(bytes(data))
    for bad in (zeros, plain):
        with pytest.raises(UserError, match="not a directory or a tar / tar.gz archive"):
            verify_pack(bad)
