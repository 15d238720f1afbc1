"""Ed25519 signing key pairs on disk: ``PREFIX.key`` (PKCS#8 PEM, mode 0600) and ``PREFIX.pub``
(SubjectPublicKeyInfo PEM). Used by ``draudit keys generate`` and the demo."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def key_paths(prefix: str | os.PathLike) -> tuple[Path, Path]:
    """``(PREFIX.key, PREFIX.pub)``."""
    prefix = str(prefix)
    return Path(prefix + ".key"), Path(prefix + ".pub")


def write_key_pair(prefix: str | os.PathLike) -> Ed25519PrivateKey:
    """Generate a key pair and write it; existing files are never overwritten.

    Raises:
        FileExistsError: ``PREFIX.key`` or ``PREFIX.pub`` exists.
        OSError: the files cannot be written.
    """
    private_path, public_path = key_paths(prefix)
    for p in (private_path, public_path):
        if p.exists():
            raise FileExistsError(str(p))
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public_path.write_bytes(pub)
    return key
