"""`draudit verify` on archives listing a path twice; what `verify` says the pack covers; `draudit
ledger verify --anchor / --pack` against a ledger whose tail was cut back past a pack's anchor.

Packs are rendered from the store of ``tests.test_report`` (SQLite and PostgreSQL)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, select, update

from collector.cli import cli
from collector.store import ledger
from collector.store.models import LedgerEntry, LedgerHead
from reports.render import PackRequest, render_pack
from reports.verify import verify_pack
from tests.test_report import CLUSTER, PERIOD_FROM, PERIOD_TO, bundle, fill_store, key, render  # noqa: F401 (fixtures)


def public_key_file(key: Ed25519PrivateKey, path: Path) -> Path:
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def rewrite(archive: Path, target: Path, change) -> Path:
    """Copy ``archive`` member by member to ``target``; ``change(member, data)`` returns the list of
    (member, data) to write in its place."""
    with tarfile.open(archive) as src, tarfile.open(target, "w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            for out, body in change(m, data):
                dst.addfile(out, io.BytesIO(body) if body is not None else None)
    return target


def copy_of(m: tarfile.TarInfo, name: str | None = None, data: bytes | None = None) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name or m.name)
    info.type, info.mode, info.mtime = m.type, m.mode, m.mtime
    if data is not None:
        info.size = len(data)
    return info


def failures(checks):
    return [(c.name, c.detail) for c in checks if c.ok is False]


def test_an_archive_listing_a_path_twice_fails_whichever_copy_comes_first(sessions, tmp_path, bundle, key):
    """Breaker's D4: a tampered data/changes.csv placed before the genuine one verified PASS (the
    verifier kept the last copy) while `tar xzOf` showed the tampered one; an exact copy passed too."""
    fill_store(sessions)
    result = render(sessions, tmp_path / "pack", bundle, key, archive=True, pdf=False)
    archive = result.path.with_name("pack.tar.gz")
    assert failures(verify_pack(archive, key.public_key())) == []
    target = "pack/data/changes.csv"

    def forged_first(m, data):
        if m.name != target:
            return [(m, data)]
        forged = b"change_type,cluster,subject\n"
        return [(copy_of(m, data=forged), forged), (m, data)]

    def exact_twice(m, data):
        return [(m, data), (m, data)] if m.name == target else [(m, data)]

    def spelt_differently(m, data):  # tar resolves pack/./data/changes.csv to the same file
        return [(m, data), (copy_of(m, "pack/./data/changes.csv", data), data)] if m.name == target else [(m, data)]

    def directory_twice(m, data):
        return [(m, data), (m, data)] if m.name == "pack/data" else [(m, data)]

    def manifest_twice(m, data):
        return [(m, data), (m, data)] if m.name == "pack/manifest.json" else [(m, data)]

    for change, name in ((forged_first, target), (exact_twice, target), (spelt_differently, target),
                         (directory_twice, "pack/data"), (manifest_twice, "pack/manifest.json")):
        bad = rewrite(archive, tmp_path / f"{change.__name__}.tar.gz", change)
        failed = failures(verify_pack(bad, key.public_key()))
        dup = [d for n, d in failed if n == "archive"]
        assert dup and dup[0].startswith(f"member {name} listed twice"), (change.__name__, failed)

    runner = CliRunner()
    pub = public_key_file(key, tmp_path / "k.pub")
    res = runner.invoke(cli, ["verify", str(tmp_path / "forged_first.tar.gz"), "--public-key", str(pub)])
    assert res.exit_code == 1
    assert f"FAIL  archive: member {target} listed twice" in res.output and "verdict: FAIL" in res.output
    res = runner.invoke(cli, ["verify", str(tmp_path / "exact_twice.tar.gz"), "--public-key", str(pub),
                              "--output", "json"])
    assert res.exit_code == 1 and json.loads(res.output)["ok"] is False


def test_verify_states_the_period_scope_date_and_anchor_it_verified(sessions, tmp_path, bundle, key):
    """Breaker's D5: verify printed only the pack id, key and PASS, so a genuine pack of the wrong
    period or cluster passed unnoticed."""
    fill_store(sessions)
    pack = render_pack(sessions, PackRequest(PERIOD_FROM, PERIOD_TO, (CLUSTER,), ("marketing-ml",)), tmp_path / "pack",
                       sign_key=key, policy_bundle=bundle, pdf=False).path
    manifest = json.loads((pack / "manifest.json").read_text())
    seq, entry_hash = manifest["ledger"]["seq"], manifest["ledger"]["entry_hash"]
    assert seq > 0
    pub = public_key_file(key, tmp_path / "k.pub")
    runner = CliRunner()

    res = runner.invoke(cli, ["verify", str(pack), "--public-key", str(pub)])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "what this pack covers (from its manifest, signed by the key given and verified):" in out
    assert f"  pack id: {manifest['pack_id']}" in out
    assert "  period: 2026-11-28T00:00:00Z to 2026-11-29T00:00:00Z (end exclusive)" in out
    assert f"  scope: clusters {CLUSTER}; namespaces marketing-ml" in out
    assert f"  created: {manifest['created']}" in out
    assert f"  ledger anchor: entry {seq}, entry_hash {entry_hash}" in out
    assert "[unverified]" not in out and "[integrity-only]" not in out

    res = runner.invoke(cli, ["verify", str(pack), "--public-key", str(pub), "--output", "json"])
    doc = json.loads(res.output)
    assert res.exit_code == 0 and doc["ok"] is True
    assert doc["pack"] == {"pack_id": manifest["pack_id"], "status": "verified",
                           "period": {"from": "2026-11-28T00:00:00Z", "to": "2026-11-29T00:00:00Z"},
                           "scope": {"clusters": [CLUSTER], "namespaces": ["marketing-ml"]},
                           "created": manifest["created"], "ledger_anchor": {"seq": seq, "entry_hash": entry_hash}}

    # without the key: stated, but marked as not authenticated
    res = runner.invoke(cli, ["verify", str(pack), "--integrity-only"])
    assert res.exit_code == 0
    assert "authenticity NOT checked" in res.output
    assert f"  scope [integrity-only]: clusters {CLUSTER}; namespaces marketing-ml" in res.output
    res = runner.invoke(cli, ["verify", str(pack), "--output", "json"])
    assert json.loads(res.output)["pack"]["status"] == "integrity-only"

    # a pack that fails: its claims are marked unverified on every line
    data = bytearray((pack / "data/findings.csv").read_bytes())
    data[-2] ^= 0x01
    (pack / "data/findings.csv").write_bytes(bytes(data))
    res = runner.invoke(cli, ["verify", str(pack), "--public-key", str(pub)])
    assert res.exit_code == 1
    assert "UNVERIFIED: the pack failed verification" in res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("  ")]
    assert len(lines) == 5 and all("[unverified]" in ln for ln in lines), lines
    res = runner.invoke(cli, ["verify", str(pack), "--public-key", str(pub), "--output", "json"])
    assert json.loads(res.output)["pack"]["status"] == "unverified"


def cut_tail(sessions, from_seq: int) -> None:
    """Delete ledger entries ``from_seq``.. and the rows they cover, and rewind the head to the entry
    before: what someone removing evidence after a pack was rendered would do."""
    with sessions.begin() as s:
        entries = s.execute(select(LedgerEntry.seq, LedgerEntry.table_name, LedgerEntry.row_key)
                            .where(LedgerEntry.seq >= from_seq)).all()
        for e in entries:
            table = ledger.ledgered_table(e.table_name)
            pk = list(table.primary_key.columns)[0]
            s.execute(delete(table).where(pk == (int(e.row_key) if pk.type.python_type is int else e.row_key)))
        s.execute(delete(LedgerEntry).where(LedgerEntry.seq >= from_seq))
        last = s.execute(select(LedgerEntry.seq, LedgerEntry.entry_hash).where(LedgerEntry.seq == from_seq - 1)).one()
        s.execute(update(LedgerHead).where(LedgerHead.chain == ledger.CHAIN).values(seq=last.seq, entry_hash=last.entry_hash))


def test_ledger_verify_checks_a_packs_anchor_and_fails_on_a_tail_cut_past_it(sessions, database_url, tmp_path,
                                                                             bundle, key):
    """Breaker's D2: `ledger verify` passed after the tail was cut back (rows and entries deleted,
    ledger_head rewound) past the anchor a signed pack records."""
    fill_store(sessions)
    result = render(sessions, tmp_path / "pack", bundle, key, archive=True, pdf=False)
    pack, archive = result.path, result.path.with_name("pack.tar.gz")
    manifest = json.loads((pack / "manifest.json").read_text())
    seq, entry_hash = manifest["ledger"]["seq"], manifest["ledger"]["entry_hash"]
    pub = public_key_file(key, tmp_path / "k.pub")
    runner = CliRunner()
    base = ["ledger", "verify", "--no-projections", "--no-lineage", "--database-url", database_url]

    res = runner.invoke(cli, base + ["--pack", str(pack), "--pack", str(archive), "--public-key", str(pub),
                                     "--anchor", f"{seq}:{entry_hash}"])
    assert res.exit_code == 0, res.output
    assert res.output.count(f"anchor {seq}:{entry_hash} from ") == 3
    assert f"from pack {manifest['pack_id']} ({pack}), signature verified: present" in res.output
    assert f"from pack {manifest['pack_id']} ({archive}), signature verified: present" in res.output
    assert f"from --anchor: present — ledger entry {seq} holds entry_hash {entry_hash}" in res.output

    # another signer's key: the pack's anchor is not evidence
    res = runner.invoke(cli, base + ["--pack", str(pack), "--public-key",
                                     str(public_key_file(Ed25519PrivateKey.generate(), tmp_path / "other.pub"))])
    assert res.exit_code == 1 and "NOT CHECKED — the pack's signature fails" in res.output

    # an entry whose hash differs from the anchor's
    with sessions() as s:
        earlier = s.execute(select(LedgerEntry.entry_hash).where(LedgerEntry.seq == seq - 1)).scalar_one()
    res = runner.invoke(cli, base + ["--anchor", f"{seq}:{earlier}"])
    assert res.exit_code == 1 and f"ledger entry {seq} has entry_hash {entry_hash}, the anchor records {earlier}" in res.output

    # cut the tail back past the anchor, head rewound: the chain alone still looks intact
    cut_tail(sessions, seq - 1)
    with sessions() as s:
        assert ledger.verify(s).ok
    assert runner.invoke(cli, base).exit_code == 0
    for source in (pack, archive):
        res = runner.invoke(cli, base + ["--pack", str(source), "--public-key", str(pub)])
        assert res.exit_code == 1, res.output
        assert (f"FAILED — the store's ledger has no entry {seq}: it ends at entry {seq - 2}, so its tail was cut back "
                f"by at least entries {seq - 1}..{seq}") in res.output
    res = runner.invoke(cli, base + ["--anchor", f"{seq}:{entry_hash}", "--output", "json"])
    doc = json.loads(res.output)
    assert res.exit_code == 1 and doc["ok"] is False and doc["first_break"] is None
    assert [(a["seq"], a["entry_hash"], a["ok"]) for a in doc["anchors"]] == [(seq, entry_hash, False)]

    # input mistakes are usage errors
    res = runner.invoke(cli, base + ["--anchor", f"{seq}-{entry_hash}"])
    assert res.exit_code == 2 and "expected SEQ:HASH" in res.output
    # a final breaker's finding: beyond 64 bits, an OverflowError traceback; non-ASCII digits accepted
    for bad in (f"{2**63}:{entry_hash}", f"\u0662\u0667:{entry_hash}"):
        res = runner.invoke(cli, base + ["--anchor", bad])
        assert res.exit_code == 2 and "expected SEQ:HASH" in res.output and "Traceback" not in res.output
    res = runner.invoke(cli, base + ["--public-key", str(pub)])
    assert res.exit_code == 2 and "give --pack" in res.output
