"""Offline verification of an evidence pack (a directory or its ``.tar.gz``): no database, no network.

Reads the files, hashes them in 1 MiB chunks, and hands the digests to the pure checks in
``reports.manifest``. An archive must hold exactly one top-level directory of regular files; a
link, device, absolute path or ``..`` member is reported as a failure, never extracted, and so is a
path listed twice (tar tools show or extract one copy or another, and the verifier must not check a
different copy from the one an auditor opens).
"""

from __future__ import annotations

import gzip
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from collector.errors import UserError
from reports.manifest import MANIFEST_NAME, SIGNATURE_NAME, Check, FileDigest, Sha256, check_pack, parse_manifest
from reports.render import digest_file, pack_files

CHUNK_BYTES = 1 << 20
SMALL_FILE_BYTES = 64 << 20  # manifest and signature are read whole; refuse absurd sizes


@dataclass(frozen=True)
class PackVerification:
    """What ``verify_pack_details`` found: every check, and the manifest they were made against
    (parsed; None when ``manifest.json`` is missing or not a canonical manifest of our format).
    The manifest's statements (period, scope, ledger anchor) are only as good as the checks: the
    caller says they were verified only when none failed and the signature was checked."""

    checks: list[Check]
    manifest: dict[str, Any] | None


def verify_pack(path: Path, public_key: Ed25519PublicKey | None = None) -> list[Check]:
    """Every check of the pack at ``path`` (see ``reports.manifest.check_pack``).

    Raises:
        UserError: ``path`` does not exist or is neither a directory nor a readable ``.tar.gz``.
    """
    return verify_pack_details(path, public_key).checks


def verify_pack_details(path: Path, public_key: Ed25519PublicKey | None = None) -> PackVerification:
    """``verify_pack``'s checks with the manifest they were made against.

    Raises:
        UserError: as ``verify_pack``.
    """
    path = Path(path)
    if path.is_dir():
        checks, manifest_data = _verify_directory(path, public_key)
    elif path.is_file():
        checks, manifest_data = _verify_archive(path, public_key)
    else:
        raise UserError(f"pack {path}: no such directory or archive")
    manifest = parse_manifest(manifest_data)[0] if manifest_data is not None else None
    return PackVerification(checks, manifest)


def read_manifest(path: Path) -> tuple[bytes, bytes | None]:
    """The bytes of the pack's ``manifest.json`` and ``manifest.sig`` (None when absent), without
    reading the other files' contents (to take the ledger anchor from a pack, for example).

    Raises:
        UserError: no such pack, not an archive, a damaged archive, no manifest, or a manifest or
            signature listed twice in the archive.
    """
    path = Path(path)
    if path.is_dir():
        manifest_path, sig_path = path / MANIFEST_NAME, path / SIGNATURE_NAME
        if not manifest_path.is_file() or manifest_path.is_symlink():
            raise UserError(f"pack {path}: {MANIFEST_NAME} is missing")
        return manifest_path.read_bytes(), (sig_path.read_bytes() if sig_path.is_file() else None)
    if not path.is_file():
        raise UserError(f"pack {path}: no such directory or archive")
    tar = _open_archive(path)
    found: dict[str, bytes] = {}
    try:
        with tar:
            seen: set[PurePosixPath] = set()
            tops: set[str] = set()
            for member in tar:
                name = PurePosixPath(member.name)
                if name in seen:
                    raise UserError(f"pack {path}: member {member.name} listed twice; the archive is not the one "
                                    "`draudit report --archive` wrote")
                seen.add(name)
                tops.add(name.parts[0] if name.parts else "")
                if len(name.parts) == 2 and name.parts[1] in (MANIFEST_NAME, SIGNATURE_NAME) and member.isfile() \
                        and not name.is_absolute():
                    if member.size > SMALL_FILE_BYTES:
                        raise UserError(f"pack {path}: {member.name} is implausibly large")
                    found[name.parts[1]] = tar.extractfile(member).read()
            while tar.fileobj.read(CHUNK_BYTES):  # to the end: gzip checks its CRC-32 (see _verify_members)
                pass
    except _DAMAGED as exc:
        raise UserError(f"pack {path}: truncated or corrupt ({type(exc).__name__}: {exc})") from None
    if len(tops) > 1:
        raise UserError(f"pack {path}: the archive holds {len(tops)} top-level entries; a pack archive holds one "
                        "directory")
    if MANIFEST_NAME not in found:
        raise UserError(f"pack {path}: {MANIFEST_NAME} is missing")
    return found[MANIFEST_NAME], found.get(SIGNATURE_NAME)


def _verify_directory(root: Path, public_key: Ed25519PublicKey | None) -> tuple[list[Check], bytes | None]:
    manifest_path = root / MANIFEST_NAME
    if not manifest_path.is_file():
        return [Check("manifest", False, f"{MANIFEST_NAME} is missing from {root}")], None
    sig_path = root / SIGNATURE_NAME
    present = {rel: digest_file(p, rel) for rel, p in pack_files(root) if rel not in (MANIFEST_NAME, SIGNATURE_NAME)}
    oddities = [Check(f"extra {p.relative_to(root).as_posix()}", False, "not a regular file (link or device)")
                for p in sorted(root.rglob("*")) if p.is_symlink()]
    directories = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir() and not p.is_symlink()]
    signature = sig_path.read_bytes() if sig_path.is_file() else None
    manifest_data = manifest_path.read_bytes()
    return (check_pack(manifest_data, signature, present, public_key) + oddities
            + _empty_directories(directories, present)), manifest_data


def _empty_directories(directories, files) -> list[Check]:
    """A failed ``extra`` check per directory (pack-relative POSIX path) that holds none of the pack's
    ``files``: nothing in the manifest lives there, so it was added after the pack was written."""
    parents = {parent.as_posix() for rel in files for parent in PurePosixPath(rel).parents}
    return [Check(f"extra {d}/", False, "a directory holding no file of the pack (added after it was written)")
            for d in sorted(set(directories) - parents)]


# What reading a damaged archive raises: a cut gzip stream (EOFError), a corrupt one (zlib.error,
# BadGzipFile), a cut or corrupt tar (TarError).
_DAMAGED = (EOFError, zlib.error, gzip.BadGzipFile, tarfile.TarError)


# How a pack archive starts: gzip, bzip2 or xz magic bytes, or a tar header (POSIX "ustar" magic at
# offset 257; tarfile writes it in every format it makes).
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")


def _looks_like_archive(archive: Path) -> bool:
    """True when ``archive`` starts as a compressed file or a tar header: a file that does neither
    (a zeroed header, any other file) is refused at once — ``tarfile.open`` read a 1 GiB file of
    zeros for 89 s before saying nothing."""
    with archive.open("rb") as f:
        head = f.read(512)
    return head.startswith(_COMPRESSED_MAGIC) or head[257:262] == b"ustar"


def _open_archive(archive: Path) -> tarfile.TarFile:
    try:
        if not _looks_like_archive(archive):
            raise tarfile.ReadError("no compressed-file magic, no tar header")
        return tarfile.open(archive, mode="r:*")
    except tarfile.ReadError:  # tarfile lists every compression it tried, over several lines
        raise UserError(f"pack {archive}: not a directory or a tar / tar.gz archive; give the pack directory "
                        "or the archive `draudit report --archive` wrote") from None
    except (tarfile.TarError, OSError) as exc:
        raise UserError(f"pack {archive}: cannot be read ({exc})") from None


def _verify_archive(archive: Path, public_key: Ed25519PublicKey | None) -> tuple[list[Check], bytes | None]:
    tar = _open_archive(archive)
    try:
        return _verify_members(tar, archive, public_key)
    except _DAMAGED as exc:
        # A verdict, not a usage error: the archive is not the one that was written (cut or corrupted
        # in transfer), and the digests of what follows cannot be checked.
        return [Check("archive", False, f"{archive.name} is truncated or corrupt ({type(exc).__name__}: {exc}); "
                                        "copy the pack again and compare its size")], None


def _verify_members(tar: tarfile.TarFile, archive: Path,
                    public_key: Ed25519PublicKey | None) -> tuple[list[Check], bytes | None]:
    bad: list[Check] = []
    present: dict[str, FileDigest] = {}
    manifest_data: bytes | None = None
    signature: bytes | None = None
    tops: set[str] = set()
    directories: list[str] = []
    # Each path as tar tools resolve it ("a//b", "a/./b" and "a/b/" are "a/b"), with the number of
    # members naming it: a second member of one path is a copy that `tar xzOf` prints (before or
    # after the other) and extraction overwrites, so which copy an auditor opens depends on the tool.
    listed: dict[PurePosixPath, int] = {}
    with tar:
        for member in tar:
            name = PurePosixPath(member.name)
            listed[name] = listed.get(name, 0) + 1
            if listed[name] > 1:
                continue  # reported below; the first copy's digest stands in the file checks
            if name.is_absolute() or ".." in name.parts:
                bad.append(Check(f"extra {member.name}", False, "unsafe path in archive (absolute or ..)"))
                continue
            tops.add(name.parts[0])
            if member.isdir():
                if len(name.parts) > 1:
                    directories.append(PurePosixPath(*name.parts[1:]).as_posix())
                continue
            rel = PurePosixPath(*name.parts[1:]).as_posix() if len(name.parts) > 1 else ""
            if not member.isfile() or not rel:
                bad.append(Check(f"extra {member.name}", False, "not a regular file inside the pack directory"))
                continue
            fh = tar.extractfile(member)
            if rel in (MANIFEST_NAME, SIGNATURE_NAME):
                if member.size > SMALL_FILE_BYTES:
                    bad.append(Check(f"extra {rel}", False, "implausibly large"))
                    continue
                data = fh.read()
                if rel == MANIFEST_NAME:
                    manifest_data = data
                else:
                    signature = data
                continue
            h, size = Sha256(), 0
            while chunk := fh.read(CHUNK_BYTES):
                h.update(chunk)
                size += len(chunk)
            present[rel] = FileDigest(rel, size, h.hexdigest())
        # To the end of the (decompressed) stream: tarfile stops at a member header a flipped bit
        # garbled as if the archive ended there; reading on makes gzip check its CRC-32 and length
        # (RFC 1952; bzip2 and xz their own checks) and raise, so the pack is reported damaged, not
        # as missing what followed. An intact archive has only its end-of-archive padding left.
        while tar.fileobj.read(CHUNK_BYTES):
            pass
    if len(tops) > 1:
        bad.append(Check("archive", False, f"archive holds {len(tops)} top-level entries; a pack archive holds one directory"))
    bad.extend(Check("archive", False, f"member {name} listed {'twice' if n == 2 else f'{n} times'}: tar tools show "
                                       "or extract one copy or another, so the pack an auditor opens may not be the "
                                       "one checked; the archive is not the one `draudit report --archive` wrote")
               for name, n in listed.items() if n > 1)
    if manifest_data is None:
        return [Check("manifest", False, f"{MANIFEST_NAME} is missing from {archive}")] + bad, None
    return (check_pack(manifest_data, signature, present, public_key) + bad
            + _empty_directories(directories, present)), manifest_data
