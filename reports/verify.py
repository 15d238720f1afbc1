"""Offline verification of an evidence pack (a directory or its ``.tar.gz``): no database, no network.

Reads the files, hashes them in 1 MiB chunks, and hands the digests to the pure checks in
``reports.manifest``. An archive must hold exactly one top-level directory of regular files; a
link, device, absolute path or ``..`` member is reported as a failure, never extracted.
"""

from __future__ import annotations

import gzip
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from collector.errors import UserError
from reports.manifest import MANIFEST_NAME, SIGNATURE_NAME, Check, FileDigest, Sha256, check_pack
from reports.render import digest_file, pack_files

CHUNK_BYTES = 1 << 20
SMALL_FILE_BYTES = 64 << 20  # manifest and signature are read whole; refuse absurd sizes


def verify_pack(path: Path, public_key: Ed25519PublicKey | None = None) -> list[Check]:
    """Every check of the pack at ``path`` (see ``reports.manifest.check_pack``).

    Raises:
        UserError: ``path`` does not exist or is neither a directory nor a readable ``.tar.gz``.
    """
    path = Path(path)
    if path.is_dir():
        return _verify_directory(path, public_key)
    if path.is_file():
        return _verify_archive(path, public_key)
    raise UserError(f"pack {path}: no such directory or archive")


def _verify_directory(root: Path, public_key: Ed25519PublicKey | None) -> list[Check]:
    manifest_path = root / MANIFEST_NAME
    if not manifest_path.is_file():
        return [Check("manifest", False, f"{MANIFEST_NAME} is missing from {root}")]
    sig_path = root / SIGNATURE_NAME
    present = {rel: digest_file(p, rel) for rel, p in pack_files(root) if rel not in (MANIFEST_NAME, SIGNATURE_NAME)}
    oddities = [Check(f"extra {p.relative_to(root).as_posix()}", False, "not a regular file (link or device)")
                for p in sorted(root.rglob("*")) if p.is_symlink()]
    directories = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir() and not p.is_symlink()]
    signature = sig_path.read_bytes() if sig_path.is_file() else None
    return (check_pack(manifest_path.read_bytes(), signature, present, public_key) + oddities
            + _empty_directories(directories, present))


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


def _verify_archive(archive: Path, public_key: Ed25519PublicKey | None) -> list[Check]:
    try:
        if not _looks_like_archive(archive):
            raise tarfile.ReadError("no compressed-file magic, no tar header")
        tar = tarfile.open(archive, mode="r:*")
    except tarfile.ReadError:  # tarfile lists every compression it tried, over several lines
        raise UserError(f"pack {archive}: not a directory or a tar / tar.gz archive; give the pack directory "
                        "or the archive `draudit report --archive` wrote") from None
    except (tarfile.TarError, OSError) as exc:
        raise UserError(f"pack {archive}: cannot be read ({exc})") from None
    try:
        return _verify_members(tar, archive, public_key)
    except _DAMAGED as exc:
        # A verdict, not a usage error: the archive is not the one that was written (cut or corrupted
        # in transfer), and the digests of what follows cannot be checked.
        return [Check("archive", False, f"{archive.name} is truncated or corrupt ({type(exc).__name__}: {exc}); "
                                        "copy the pack again and compare its size")]


def _verify_members(tar: tarfile.TarFile, archive: Path, public_key: Ed25519PublicKey | None) -> list[Check]:
    bad: list[Check] = []
    present: dict[str, FileDigest] = {}
    manifest_data: bytes | None = None
    signature: bytes | None = None
    tops: set[str] = set()
    directories: list[str] = []
    with tar:
        for member in tar:
            name = PurePosixPath(member.name)
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
    if manifest_data is None:
        return [Check("manifest", False, f"{MANIFEST_NAME} is missing from {archive}")] + bad
    return check_pack(manifest_data, signature, present, public_key) + bad + _empty_directories(directories, present)
