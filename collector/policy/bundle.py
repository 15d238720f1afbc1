"""An OPA bundle read from a directory: manifest, Rego modules, data documents, digest.

Layout (OPA bundle format, https://www.openpolicyagent.org/docs/management-bundles):
- ``.manifest``: JSON ``{"revision": str, "roots": [str, ...]}``; every package and every data
  path must lie under one of the roots (``"draudit"`` covers ``data.draudit.*``).
- ``**/*.rego``: Rego v1 modules; a module whose package ends in ``_test`` (or whose file ends in
  ``_test.rego``) holds tests. ``test_*`` rules are tests, as with ``opa test``.
- ``**/data.json``: data documents, mounted at the directory's path (``policies/data.json`` at the
  root of ``data``, ``policies/x/y/data.json`` at ``data.x.y``).

A *decision package* is a non-test package that defines ``findings contains ...``: draudit asks
every engine for ``data.<package>.findings``. Any other non-test package that no other module
refers to (``data.<package>``) is never read: a ``warnings`` entry names it (e.g. a package that
defines ``finding`` instead of ``findings``).

Parameters: a bundle whose (non-test) Rego reads ``data.draudit.params`` must carry that object
in its data, with every key of ``PARAMS`` that its Rego mentions and every key it reads as
``lib.params.<key>`` / ``data.draudit.params.<key>``, each of the shape ``PARAMS`` states.
Without them the rules do not fail: they are undefined and drop their findings (no
``lib.tenant_of``, no cross-tenant violation), so ``load_bundle`` refuses the bundle, whatever
its tests (which inject their own parameters with ``with``) say. A key no rule reads is a warning
(probably a typo).

The digest is SHA-256 over the bundle files sorted by path: for each file,
``<posix relative path>\\n<SHA-256 hex of its bytes>\\n``. Any edit, addition, removal or rename of
a manifest, module or data file changes it; other files (README) do not count.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collector.errors import UserError

_PACKAGE = re.compile(r"^package\s+([A-Za-z_][\w.]*)\s*(?:#.*)?$", re.MULTILINE)  # a trailing comment is valid Rego
_TEST_RULE = re.compile(r"^(test_\w+)\b", re.MULTILINE)
_FINDINGS_RULE = re.compile(r"^findings\s+contains\b", re.MULTILINE)
_RULE_HEAD = re.compile(r"^(?:default\s+)?([A-Za-z_]\w*)\b", re.MULTILINE)
_NOT_RULES = {"package", "import", "default"}
# Rego strings (kept) and comments (dropped) when the code, not its prose, is searched
_STRING_OR_COMMENT = re.compile(r'("(?:\\.|[^"\\\n])*"|`[^`]*`)|#[^\n]*')
# where a module reads data.draudit.params (also through `import data.draudit`)
_READS_PARAMS = re.compile(r'\bdraudit\s*\.\s*params\b|\bdata\s*\[\s*"draudit"\s*\]\s*\[\s*"params"\s*\]')
_PARAM_REF = re.compile(r'\b(?:lib|draudit)\s*\.\s*params\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*"([^"]+)"\s*\])')
_DATA_REF = re.compile(r"\bdata((?:\s*\.\s*[A-Za-z_]\w*)+)")
PARAMS_PATH = ("draudit", "params")


@dataclass(frozen=True)
class ParamSpec:
    """A parameter the shipped rules read: what it must be (words), an example value, a check."""

    shape: str
    example: Any
    valid: Any  # Callable[[Any], bool]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) and x for x in v)


# data.draudit.params as the shipped rules read it (policies/lib.rego documents each key;
# policies/data.json sets every one of them).
PARAMS: dict[str, ParamSpec] = {
    "tenants": ParamSpec("an object namespace -> tenant ({} when every namespace is its own tenant)", {},
                         lambda v: isinstance(v, dict) and all(isinstance(t, str) and t for t in v.values())),
    "approved_device_classes": ParamSpec("a list of DeviceClass names", ["gpu.nvidia.com"], _strings),
    "admin_access_namespaces": ParamSpec("a list of namespaces", ["gpu-monitoring"], _strings),
    "handover_min_gap_s": ParamSpec("a number of seconds >= 0", 300, lambda v: _number(v) and v >= 0),
    "exact_attribution_min_ratio": ParamSpec("a number from 0 to 1", 0.99, lambda v: _number(v) and 0 <= v <= 1),
    "coverage_gap_max_s": ParamSpec("a number of seconds >= 0", 60, lambda v: _number(v) and v >= 0),
    "idle_allocation_max_s": ParamSpec("a number of seconds >= 0", 3600, lambda v: _number(v) and v >= 0),
    "strict_mig": ParamSpec("true or false", False, lambda v: isinstance(v, bool)),
}


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
    warnings: tuple[str, ...] = field(default=())

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


def _code(source: str) -> str:
    """``source`` without comments (strings kept, lines kept) for searching what the Rego does."""
    return _STRING_OR_COMMENT.sub(lambda m: m.group(1) or "", source)


def _close(word: str, candidates: Any) -> str | None:
    import difflib

    found = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def _defined_in(data_files: list[tuple[Path, list[str], Any]], path: tuple[str, ...]) -> Path | None:
    """The (last) data file whose document reaches ``path`` of ``data``."""
    found = None
    for file, at, doc in data_files:
        if tuple(at[: len(path)]) == path[: len(at)]:
            node = doc
            for key in path[len(at):]:
                node = node.get(key) if isinstance(node, dict) else None
            if node is not None:
                found = file
    return found


def _params_example() -> str:
    return json.dumps({"draudit": {"params": {k: spec.example for k, spec in PARAMS.items()}}})


def _check_params(root: Path, modules: list[Module], data: dict[str, Any],
                  data_files: list[tuple[Path, list[str], Any]]) -> list[str]:
    """Refuse parameters the bundle's rules read but its data lacks (see module docstring); the
    warnings about keys no rule reads.

    Raises:
        BundleError: ``data.draudit.params`` missing or not an object, a key missing or of the
            wrong shape; names the data file, the key, the module that reads it and an example.
    """
    code = {m.path: _code(m.source) for m in modules if not m.is_test}
    readers = [(path, _line_of(text, found.start())) for path, text in code.items()
               if (found := _READS_PARAMS.search(text))]
    if not readers:
        return []
    reader = f"{root / readers[0][0]}:{readers[0][1]}"
    all_code = "\n".join(code.values())
    needed: dict[str, str] = {}  # key -> "file:line" of its first mention
    for path, text in code.items():
        for key in PARAMS:
            if key not in needed and (m := re.search(rf"\b{key}\b", text)):
                needed[key] = f"{path}:{_line_of(text, m.start())}"
        for m in _PARAM_REF.finditer(text):
            key = m.group(1) or m.group(2)
            needed.setdefault(key, f"{path}:{_line_of(text, m.start())}")
    draudit = data.get(PARAMS_PATH[0])
    params = draudit.get(PARAMS_PATH[1]) if isinstance(draudit, dict) else None
    where = _defined_in(data_files, PARAMS_PATH)
    if params is None:
        siblings = sorted(draudit) if isinstance(draudit, dict) else []
        typo = _close(PARAMS_PATH[1], siblings)
        file = _defined_in(data_files, PARAMS_PATH[:1]) or (data_files[-1][0] if data_files else None)
        what = (f"{file}: data.draudit has {json.dumps(typo)}, not \"params\" (a typo?)" if typo
                else f"{file}: data.draudit.params is missing" if file
                else f"{root}: no data.json defines data.draudit.params")
        raise BundleError(
            f"{what}, but {reader} reads data.draudit.params: without it rules such as isolation/cross-tenant-sharing never hold "
            f"and their findings are silently dropped. data.json must hold {_params_example()} "
            "(your values; draudit's policies/data.json sets every key)")
    where = where or root / "data.json"
    if not isinstance(params, dict):
        raise BundleError(f"{where}: data.draudit.params must be a JSON object such as {_params_example()}, "
                          f"not {json.dumps(params)[:80]}")
    unknown = [k for k in params if k not in PARAMS and k not in needed and not re.search(rf"\b{re.escape(k)}\b", all_code)]
    order = {k: i for i, k in enumerate(PARAMS)}  # the shipped keys in data.json's order, then the bundle's own
    missing = sorted((k for k in needed if k not in params), key=lambda k: order.get(k, len(order)))
    problems = []
    if missing:
        parts = []
        for key in missing:
            spec = PARAMS.get(key)
            what = f"{spec.shape}, e.g. {json.dumps(key)}: {json.dumps(spec.example)}" if spec else "a value"
            typo = _close(key, unknown)
            parts.append(f"{json.dumps(key)} (read at {root / needed[key]}; {what}"
                         + (f"; {json.dumps(typo)} is there instead: a typo?" if typo else "") + ")")
        it = "it" if len(missing) == 1 else "them"
        problems.append(
            f"data.draudit.params lacks {', '.join(parts)}: without {it} the rules that read {it} are "
            f"undefined (their findings silently dropped) or fall back to a default nobody set. Add {it} to "
            "data.draudit.params")
    # every problem in one error: a user fixing one key at a time would otherwise run check once per key
    problems += [f"data.draudit.params.{key} must be {spec.shape} (e.g. {json.dumps(spec.example)}), "
                 f"not {json.dumps(params[key])[:80]}"
                 for key, spec in PARAMS.items() if key in params and key in needed and not spec.valid(params[key])]
    if problems:
        raise BundleError(f"{where}: " + (problems[0] if len(problems) == 1 else
                                          f"{len(problems)} problems:" + "".join(f"\n  - {p}" for p in problems)))
    warnings = []
    for key in unknown:
        typo = _close(key, set(PARAMS) | set(needed))
        warnings.append(f"{where}: data.draudit.params has key {json.dumps(key)}, which no rule of the bundle reads"
                        + (f" (a typo of {json.dumps(typo)}?)" if typo else " (a typo?)"))
    return warnings


def _data_refs(code: str) -> list[list[str]]:
    """The paths of ``data.a.b.c`` references in ``code``: ``[["a", "b", "c"], ...]``."""
    return [re.sub(r"\s", "", ref).lstrip(".").split(".") for ref in _DATA_REF.findall(code)]


def _package_warnings(root: Path, modules: list[Module], decision: set[str]) -> list[str]:
    """Non-test packages that nothing evaluates: neither a decision package nor referred to by
    another module as ``data.<package>`` (or a prefix of it)."""
    code = [(m, _code(m.source)) for m in modules]
    warnings = []
    seen: set[str] = set()
    for module, text in code:
        package = module.package
        if module.is_test or package in decision or package in seen:
            continue
        seen.add(package)
        parts = package.split(".")
        refs = [ref for m, other in code if not m.is_test and m.package != package for ref in _data_refs(other)]
        if any(ref[: len(parts)] == parts[: len(ref)] for ref in refs):
            continue  # another package reads it (import data.draudit.lib, data.draudit.x.y, data.draudit)
        heads = {h for t in (c for m, c in code if m.package == package) for h in _RULE_HEAD.findall(t)} - _NOT_RULES
        near = "findings" if "findings" in heads else _close("findings", heads)
        if near == "findings":
            why = "defines `findings` but not as `findings contains f if {...}`, the only form draudit evaluates"
        elif near:
            why = f"defines `{near}`, not `findings` (did you mean `findings contains f if {{...}}`?)"
        else:
            why = "defines no `findings contains f if {...}` rule and no other package reads it"
        warnings.append(f"{root / module.path}: package {package} {why}: draudit evaluates data.<package>.findings "
                        "only, so no finding of this package is ever produced")
    return warnings


def load_bundle(directory: str | Path) -> Bundle:
    """Read and validate the bundle in ``directory`` (no Rego parsing: engines do that).

    Raises:
        BundleError: no such directory, bad ``.manifest``, a module without ``package`` or outside
            the roots, a data file that is not JSON or lies outside the roots, parameters the Rego
            reads missing or of the wrong shape (module docstring). ``Bundle.warnings``: keys of
            ``data.draudit.params`` no rule reads, packages nothing evaluates.
    """
    root = Path(directory)
    if not root.is_dir():
        raise BundleError(f"{root}: not a directory; give the path of an OPA bundle (with .manifest and *.rego)")
    revision, roots = _read_manifest(root)
    files: dict[str, bytes] = {".manifest": (root / ".manifest").read_bytes()}
    modules: list[Module] = []
    tests: list[TestRule] = []
    data: dict[str, Any] = {}
    data_files: list[tuple[Path, list[str], Any]] = []
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
            data_files.append((path, at, doc))
    if not modules:
        raise BundleError(f"{root}: no .rego modules found")
    seen: dict[str, TestRule] = {}
    for t in tests:
        seen.setdefault(t.ref, t)  # a test defined incrementally runs once, as in `opa test`
    warnings = _check_params(root, modules, data, data_files)
    bundle = Bundle(root=root, revision=revision, roots=roots, modules=tuple(modules), data=data,
                    digest=bundle_digest(files), tests=tuple(seen.values()))
    warnings += _package_warnings(root, modules, set(bundle.decision_packages))
    return replace(bundle, warnings=tuple(warnings))


def bundle_digest(files: dict[str, bytes]) -> str:
    """SHA-256 (hex) over ``{relative path: bytes}`` as described in the module docstring."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f"{rel}\n{hashlib.sha256(files[rel]).hexdigest()}\n".encode("utf-8"))
    return h.hexdigest()
