"""Evidence-pack manifest and signature: pure functions, no I/O, so they can be tested exhaustively.

The manifest is one JSON object written to ``manifest.json`` as its canonical bytes
(``collector.store.canonical.canonical_json``: sorted keys, no whitespace, UTF-8). It lists every
other file of the pack with its size (bytes), media type and SHA-256 (FIPS 180-4), and carries the
pack's metadata (period, scope, collector version, policy bundles, ledger anchor, coverage).
``manifest.sig`` is the base64 text of an Ed25519 signature (RFC 8032) over exactly those bytes, so
``openssl pkeyutl -verify -rawin`` can check it by hand. The manifest names the signing key by
``key_id`` = SHA-256 of the raw 32-byte public key, so a verifier given the wrong key says so.

The checks (``check_pack``) take what the caller found on disk (paths with size and digest) and
return one verdict per check; reading the files is ``reports.verify``'s job.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from collector.store.canonical import canonical_json, sha256_hex

FORMAT = "draudit-evidence-pack/1"
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.sig"
# Files that describe the pack rather than belong to it: never listed in the manifest.
INTEGRITY_FILES = frozenset({MANIFEST_NAME, SIGNATURE_NAME})

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".pdf": "application/pdf",
    ".csv": "text/csv; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class FileDigest:
    """One file of a pack: path relative to the pack root (``/``-separated), size in bytes, SHA-256 hex."""

    path: str
    size: int
    sha256: str

    def entry(self) -> dict[str, Any]:
        """The manifest entry: path, size, SHA-256 and media type (from the extension)."""
        ext = "." + self.path.rsplit(".", 1)[-1] if "." in self.path else ""
        return {"path": self.path, "size": self.size, "sha256": self.sha256,
                "media_type": MEDIA_TYPES.get(ext, "application/octet-stream")}


class Sha256:
    """Streaming SHA-256 (FIPS 180-4) for pack files: ``update(bytes)``, then ``hexdigest()`` once.

    Uses ``cryptography``'s OpenSSL, which uses the CPU's SHA extensions where present; the Python
    build's ``hashlib`` may not (measured 4-5x slower on the benchmark host), and a pack of millions
    of transactions hashes gigabytes.
    """

    __slots__ = ("_h",)

    def __init__(self) -> None:
        self._h = hashes.Hash(hashes.SHA256())

    def update(self, data: bytes) -> None:
        """Add ``data`` to the digest."""
        self._h.update(data)

    def hexdigest(self) -> str:
        """The lowercase hex digest; the object cannot be updated afterwards."""
        return self._h.finalize().hex()


def digest_bytes(path: str, data: bytes) -> FileDigest:
    """``FileDigest`` of in-memory ``data`` (for small files and tests)."""
    return FileDigest(path, len(data), sha256_hex(data))


def public_key_id(public_key: Ed25519PublicKey) -> str:
    """Key id: SHA-256 hex of the raw 32-byte Ed25519 public key (RFC 8032 §5.1.5 encoding)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sha256_hex(raw)


def build_manifest(meta: Mapping[str, Any], files: Iterable[FileDigest], key_id: str | None = None) -> dict[str, Any]:
    """The manifest object: ``meta`` (pack id, period, scope, ...) plus the sorted file list.

    Args:
        meta: pack metadata; must not use the keys ``format``, ``files`` or ``signing``.
        files: every file of the pack except ``manifest.json`` and ``manifest.sig``.
        key_id: the signing key's id when the pack will be signed (``public_key_id``).

    Raises:
        ValueError: a reserved key in ``meta``, a duplicate path, an integrity file listed, or an
            unsafe path (absolute, ``..``, backslash).
    """
    reserved = {"format", "files", "signing"} & set(meta)
    if reserved:
        raise ValueError(f"manifest metadata uses reserved keys {sorted(reserved)}")
    entries: dict[str, dict[str, Any]] = {}
    for f in files:
        _check_path(f.path)
        if f.path in INTEGRITY_FILES:
            raise ValueError(f"{f.path} cannot be listed in its own manifest")
        if f.path in entries:
            raise ValueError(f"file {f.path} listed twice")
        entries[f.path] = f.entry()
    manifest = {**meta, "format": FORMAT, "files": [entries[p] for p in sorted(entries)]}
    if key_id is not None:
        manifest["signing"] = {"algorithm": "Ed25519", "key_id": key_id, "signature_file": SIGNATURE_NAME}
    return manifest


def _check_path(path: str) -> None:
    if not path or path.startswith("/") or "\\" in path or any(part in ("", ".", "..") for part in path.split("/")):
        raise ValueError(f"unsafe path in pack: {path!r}")


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """The exact bytes written to ``manifest.json`` and signed: ``canonical_json(manifest)``."""
    return canonical_json(manifest)


def sign_manifest(data: bytes, private_key: Ed25519PrivateKey) -> bytes:
    """``manifest.sig`` content: base64 (RFC 4648) of the Ed25519 signature over ``data``, plus a newline."""
    return base64.b64encode(private_key.sign(data)) + b"\n"


@dataclass(frozen=True)
class Check:
    """One verdict of the verifier: ``ok`` is True (pass), False (fail) or None (not checked)."""

    name: str
    ok: bool | None
    detail: str

    @property
    def label(self) -> str:
        return {True: "PASS", False: "FAIL", None: "SKIP"}[self.ok]


def parse_manifest(data: bytes) -> tuple[dict[str, Any] | None, Check]:
    """Parse ``manifest.json`` bytes and check that they are a canonical manifest of our format.

    Returns:
        (manifest or None, the ``manifest`` check).
    """
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, Check("manifest", False, f"manifest.json is not JSON ({exc})")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None, Check("manifest", False, f"manifest.json is not a {FORMAT} manifest")
    files = manifest.get("files")
    if not isinstance(files, list) or not all(
            isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("size"), int)
            and isinstance(f.get("sha256"), str) for f in files):
        return None, Check("manifest", False, "manifest.json has no valid file list (path, size, sha256)")
    try:
        for f in files:
            _check_path(f["path"])
    except ValueError as exc:
        return None, Check("manifest", False, f"manifest.json lists {exc}")
    if canonical_json(manifest) != data:
        return None, Check("manifest", False, "manifest.json is not in canonical form (edited after it was written)")
    return manifest, Check("manifest", True, f"pack {manifest.get('pack_id')}: {len(files)} files listed")


def check_files(manifest: Mapping[str, Any], present: Mapping[str, FileDigest]) -> list[Check]:
    """Compare the manifest's file list with the files found (integrity files excluded by the caller).

    One check per listed file (``file <path>``: missing, size or digest differs, or pass) and one
    failing check per file found but not listed (``extra <path>``).
    """
    checks: list[Check] = []
    listed = set()
    for entry in manifest["files"]:
        path = entry["path"]
        listed.add(path)
        found = present.get(path)
        if found is None:
            checks.append(Check(f"file {path}", False, "missing (listed in the manifest, not in the pack)"))
        elif found.size != entry["size"]:
            checks.append(Check(f"file {path}", False, f"size differs: manifest {entry['size']} bytes, found {found.size}"))
        elif found.sha256 != entry["sha256"]:
            checks.append(Check(f"file {path}", False, f"SHA-256 differs: manifest {entry['sha256']}, found {found.sha256}"))
        else:
            checks.append(Check(f"file {path}", True, f"{found.size} bytes, SHA-256 {found.sha256}"))
    for path in sorted(set(present) - listed):
        checks.append(Check(f"extra {path}", False, "file in the pack but not listed in the manifest (added)"))
    return checks


def load_public_key(pem: bytes, source: str = "public key") -> Ed25519PublicKey:
    """Load an Ed25519 public key from PEM (SubjectPublicKeyInfo).

    Raises:
        ValueError: not a PEM public key, or not Ed25519 (message names ``source``).
    """
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError as exc:
        raise ValueError(f"{source} is not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{source} is not an Ed25519 public key")
    return key


def load_private_key(pem: bytes, source: str = "private key") -> Ed25519PrivateKey:
    """Load an unencrypted Ed25519 private key from PEM (PKCS#8).

    Raises:
        ValueError: not a PEM private key, encrypted, or not Ed25519 (message names ``source``).
    """
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{source} is not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{source} is not an Ed25519 private key")
    return key


def check_signature(manifest: Mapping[str, Any], data: bytes, signature: bytes | None,
                    public_key: Ed25519PublicKey | None) -> Check:
    """Verdict on ``manifest.sig`` (``signature``, None when absent) for manifest bytes ``data``.

    Fails when: the manifest declares a signature and the file is missing; a signature file is
    present but the manifest declares none (manifest replaced); a key is given but the pack is
    unsigned; the key id differs from the manifest's; the signature does not verify. Without a key
    a signed pack's signature is reported as not checked.
    """
    signing = manifest.get("signing")
    declared_id = signing.get("key_id") if isinstance(signing, dict) else None
    if signing is None:
        if signature is not None:
            return Check("signature", False, "manifest.sig present but the manifest declares no signature (manifest replaced?)")
        if public_key is not None:
            return Check("signature", False, "pack is not signed, but a public key was given")
        return Check("signature", None, "pack is not signed")
    if signature is None:
        return Check("signature", False, f"manifest declares an Ed25519 signature by key {declared_id} but manifest.sig is missing")
    if public_key is None:
        return Check("signature", None, f"signed by key {declared_id}; pass --public-key to check it")
    given_id = public_key_id(public_key)
    if given_id != declared_id:
        return Check("signature", False, f"manifest is signed by key {declared_id}, the public key given is {given_id}")
    try:
        raw = base64.b64decode(signature.strip(), validate=True)
        public_key.verify(raw, data)
    except (binascii.Error, ValueError):
        return Check("signature", False, "manifest.sig is not a base64 Ed25519 signature")
    except InvalidSignature:
        return Check("signature", False, "signature does not verify over manifest.json (manifest or signature altered)")
    return Check("signature", True, f"Ed25519 signature by key {given_id} verifies")


def check_pack(manifest_data: bytes, signature: bytes | None, present: Mapping[str, FileDigest],
               public_key: Ed25519PublicKey | None) -> list[Check]:
    """All checks of a pack, from its manifest bytes, signature bytes and the files found.

    Args:
        manifest_data: bytes of ``manifest.json``.
        signature: bytes of ``manifest.sig`` or None when absent.
        present: every other file found in the pack, by path.
        public_key: the key to check the signature with, or None.

    Returns:
        Checks in order: manifest, signature, each listed file, each extra file. The pack is intact
        when none has ``ok is False``.
    """
    manifest, first = parse_manifest(manifest_data)
    if manifest is None:
        return [first]
    return [first, check_signature(manifest, manifest_data, signature, public_key), *check_files(manifest, present)]


def pack_statement(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What a pack states about itself, from its (parsed) manifest: the facts an auditor compares
    with what they asked for — pack id, period ``[from, to)``, scope, creation time and the ledger
    anchor. A value the manifest does not hold (in the expected shape) is None. Only as true as
    the manifest: the caller says whether that verified.
    """
    def text(value: Any) -> str | None:
        return value if isinstance(value, str) else None

    def names(value: Any) -> list[str] | None:
        return list(value) if isinstance(value, list) and all(isinstance(v, str) for v in value) else None

    period = manifest.get("period") if isinstance(manifest.get("period"), dict) else {}
    scope = manifest.get("scope") if isinstance(manifest.get("scope"), dict) else {}
    anchor = ledger_anchor(manifest)
    return {"pack_id": text(manifest.get("pack_id")),
            "period": {"from": text(period.get("from")), "to": text(period.get("to"))},
            "scope": {"clusters": names(scope.get("clusters")), "namespaces": names(scope.get("namespaces"))},
            "created": text(manifest.get("created")),
            "ledger_anchor": None if anchor is None else {"seq": anchor[0], "entry_hash": anchor[1]}}


def ledger_anchor(manifest: Mapping[str, Any]) -> tuple[int, str] | None:
    """(seq, entry_hash) of the ledger entry the pack was rendered at (manifest ``ledger``), or None
    when the manifest records none in that shape (seq a non-negative integer, a 64-hex hash)."""
    doc = manifest.get("ledger")
    if not isinstance(doc, dict):
        return None
    seq, entry_hash = doc.get("seq"), doc.get("entry_hash")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0 or not isinstance(entry_hash, str) \
            or len(entry_hash) != 64 or any(c not in "0123456789abcdef" for c in entry_hash):
        return None
    return seq, entry_hash


def verdict(checks: Iterable[Check]) -> bool:
    """True when no check failed (skipped checks do not fail a pack)."""
    return all(c.ok is not False for c in checks)
