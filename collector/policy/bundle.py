"""An OPA bundle read from a directory: manifest, Rego modules, data documents, digest.

Layout (OPA bundle format, https://www.openpolicyagent.org/docs/management-bundles):
- ``.manifest``: JSON ``{"revision": str, "roots": [str, ...]}``; every package and every data
  path must lie under one of the roots (``"draudit"`` covers ``data.draudit.*``).
- ``**/*.rego``: Rego v1 modules; a module whose package ends in ``_test`` (or whose file ends in
  ``_test.rego``) holds tests. ``test_*`` rules are tests, as with ``opa test``.
- ``**/data.json``: data documents, mounted at the directory's path (``policies/data.json`` at the
  root of ``data``, ``policies/x/y/data.json`` at ``data.x.y``).

A *decision package* is a non-test package that defines ``findings contains ...``: draudit asks
every engine for ``data.<package>.findings``.

The digest is SHA-256 over the bundle files sorted by path: for each file,
``<posix relative path>\\n<SHA-256 hex of its bytes>\\n``. Any edit, addition, removal or rename of
a manifest, module or data file changes it; other files (README) do not count.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.errors import UserError

_PACKAGE = re.compile(r"^package\s+([A-Za-z_][\w.]*)\s*$", re.MULTILINE)
_TEST_RULE = re.compile(r"^(test_\w+)\b", re.MULTILINE)
_FINDINGS_RULE = re.compile(r"^findings\s+contains\b", re.MULTILINE)


class BundleError(UserError):
    """The bundle cannot be used: names the file (and line when known) and what to fix."""


@dataclass(frozen=True)
class Module:
    """One Rego module: path relative to the bundle, source text, package (``draudit.isolation``)."""

    path: str
    source: str
    package: str

    @property
    def is_test(self) -> bool:
        return self.package.endswith("_test") or self.path.endswith("_test.rego")


@dataclass(frozen=True)
class TestRule:
    """A ``test_*`` rule: ``data.<package>.<name>``, defined at ``path:line``."""

    package: str
    name: str
    path: str
    line: int

    @property
    def ref(self) -> str:
        return f"data.{self.package}.{self.name}"


@dataclass(frozen=True)
class Bundle:
    """A loaded bundle (see module docstring). ``data`` is the merged data document."""

    root: Path
    revision: str
    roots: tuple[str, ...]
    modules: tuple[Module, ...]
    data: dict[str, Any]
    digest: str
    tests: tuple[TestRule, ...] = field(default=())

    @property
    def decision_packages(self) -> list[str]:
        """Sorted packages that define ``findings``: the documents draudit evaluates."""
        return sorted({m.package for m in self.modules if not m.is_test and _FINDINGS_RULE.search(m.source)})


def _line_of(source: str, offset: int) -> int:
    return source.count("\n", 0, offset) + 1


def _under_roots(path: str, roots: tuple[str, ...]) -> bool:
    parts = path.split(".") if path else []
    for root in roots:
        rparts = [p for p in root.split("/") if p]
        if not rparts or parts[: len(rparts)] == rparts:
            return True
    return False


def _read_manifest(root: Path) -> tuple[str, tuple[str, ...]]:
    path = root / ".manifest"
    if not path.is_file():
        raise BundleError(f"{path}: missing; a bundle needs a .manifest with \"revision\" and \"roots\"")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BundleError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{path}: must be a JSON object with \"revision\" and \"roots\"")
    revision = manifest.get("revision")
    if not isinstance(revision, str) or not revision.strip():
        raise BundleError(f"{path}: \"revision\" must be a non-empty string (e.g. a release or commit id)")
    roots = manifest.get("roots", [""])
    if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
        raise BundleError(f"{path}: \"roots\" must be a list of strings such as [\"draudit\"]")
    return revision, tuple(roots)


def _merge(target: dict[str, Any], at: list[str], value: Any, where: Path) -> None:
    node = target
    for key in at[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise BundleError(f"{where}: data conflicts with another data file at {'.'.join(at)}")
    if not at:
        if not isinstance(value, dict):
            raise BundleError(f"{where}: the root data document must be a JSON object")
        for key, sub in value.items():
            _merge(target, [key], sub, where)
        return
    existing = node.get(at[-1])
    if isinstance(existing, dict) and isinstance(value, dict):
        for key, sub in value.items():
            _merge(existing, [key], sub, where)
    elif existing is not None:
        raise BundleError(f"{where}: data conflicts with another data file at {'.'.join(at)}")
    else:
        node[at[-1]] = value


def _leaf_paths(value: Any, prefix: list[str]) -> list[list[str]]:
    if isinstance(value, dict) and value:
        return [p for k, v in value.items() for p in _leaf_paths(v, prefix + [k])]
    return [prefix]


def load_bundle(directory: str | Path) -> Bundle:
    """Read and validate the bundle in ``directory`` (no Rego parsing: engines do that).

    Raises:
        BundleError: no such directory, bad ``.manifest``, a module without ``package`` or outside
            the roots, a data file that is not JSON or lies outside the roots.
    """
    root = Path(directory)
    if not root.is_dir():
        raise BundleError(f"{root}: not a directory; give the path of an OPA bundle (with .manifest and *.rego)")
    revision, roots = _read_manifest(root)
    files: dict[str, bytes] = {".manifest": (root / ".manifest").read_bytes()}
    modules: list[Module] = []
    tests: list[TestRule] = []
    data: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".rego":
            raw = path.read_bytes()
            files[rel] = raw
            try:
                source = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise BundleError(f"{path}: not UTF-8 text") from None
            m = _PACKAGE.search(source)
            if not m:
                raise BundleError(f"{path}:1: no `package` declaration")
            package = m.group(1)
            if not _under_roots(package, roots):
                raise BundleError(f"{path}:{_line_of(source, m.start())}: package {package} is outside the manifest roots {list(roots)}")
            modules.append(Module(rel, source, package))
            for t in _TEST_RULE.finditer(source):
                tests.append(TestRule(package, t.group(1), rel, _line_of(source, t.start())))
        elif path.name == "data.json":
            raw = path.read_bytes()
            files[rel] = raw
            try:
                doc = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise BundleError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
            at = list(path.relative_to(root).parent.parts)
            for leaf in _leaf_paths(doc, at):
                if not _under_roots(".".join(leaf), roots):
                    raise BundleError(f"{path}: data path {'.'.join(leaf) or '(root)'} is outside the manifest roots {list(roots)}")
            _merge(data, at, doc, path)
    if not modules:
        raise BundleError(f"{root}: no .rego modules found")
    seen: dict[str, TestRule] = {}
    for t in tests:
        seen.setdefault(t.ref, t)  # a test defined incrementally runs once, as in `opa test`
    return Bundle(root=root, revision=revision, roots=roots, modules=tuple(modules), data=data,
                  digest=bundle_digest(files), tests=tuple(seen.values()))


def bundle_digest(files: dict[str, bytes]) -> str:
    """SHA-256 (hex) over ``{relative path: bytes}`` as described in the module docstring."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f"{rel}\n{hashlib.sha256(files[rel]).hexdigest()}\n".encode("utf-8"))
    return h.hexdigest()
