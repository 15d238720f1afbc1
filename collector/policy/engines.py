"""Rego engines behind one small interface: regorus (embedded) and a real OPA server.

``PolicyEngine``:
- ``load_bundle(bundle)``: parse every module and load the data document; a module that does not
  parse raises ``BundleError`` naming the file and line.
- ``evaluate(input) -> {package: [finding, ...]}``: ``data.<package>.findings`` for every decision
  package of the bundle, each list sorted by canonical JSON (sets have no order).
- ``run_tests() -> [TestResult]``: every ``test_*`` rule of the bundle, like ``opa test``: a test
  passes when the rule evaluates to ``true``.

Implementations:
- ``RegorusEngine`` (default; PyPI ``gordon-to-regorus``). Known gaps against OPA, which our own
  bundle stays clear of and users' bundles should too: ``with`` cannot replace builtins; a builtin
  error aborts the whole query (OPA leaves that rule undefined); ``time.add_date`` differs at
  month ends.
- ``OpaServerEngine``: a running OPA server through ``opa-python-client`` (REST API v1: policies
  pushed with ``PUT /v1/policies/<id>``, data with ``PUT /v1/data/<path>``, queries with
  ``POST /v1/data/<package path>/findings``, tests in one ``POST /v1/query``). Unreachable, slow or failing servers raise
  ``UserError``: evaluation fails loudly, findings are never silently empty.
- ``OpaGoEngine``: the real OPA Go evaluator in-process (PyPI ``opa-golib-python-bindings``, whose
  wheel declares Python >= 3.14; installed with ``--ignore-requires-python`` for tests and CI). Used to
  check that regorus agrees with OPA and by the OPA contract server.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol
from urllib.parse import urlsplit

from collector.errors import UserError
from collector.policy.bundle import Bundle, BundleError, TestRule
from collector.store.canonical import canonical_json

OPA_POLICY_PREFIX = "draudit-bundle"


@dataclass(frozen=True)
class TestResult:
    """Outcome of one ``test_*`` rule: passed, or failed with the reason; ``duration_s`` in seconds."""

    package: str
    name: str
    path: str
    line: int
    passed: bool
    duration_s: float
    error: str | None = None

    @property
    def ref(self) -> str:
        return f"data.{self.package}.{self.name}"


class PolicyEngine(Protocol):
    """What draudit needs from a Rego engine (see module docstring)."""

    name: str

    def load_bundle(self, bundle: Bundle) -> None: ...

    def evaluate(self, input: dict[str, Any]) -> dict[str, list[dict[str, Any]]]: ...

    def run_tests(self) -> list[TestResult]: ...


def sort_findings(values: Any) -> list[Any]:
    """A set serialised by an engine, in a canonical order (by canonical JSON)."""
    if values is None:
        return []
    if not isinstance(values, list):
        raise UserError(f"the policy produced findings that are not a set but {type(values).__name__}; "
                        "define them as `findings contains f if {...}`")
    return sorted(values, key=canonical_json)


def _run_tests(bundle: Bundle, evaluate_rule: Callable[[TestRule], Any]) -> list[TestResult]:
    results = []
    for test in bundle.tests:
        started = time.perf_counter()
        error = None
        try:
            value = evaluate_rule(test)
            passed = value is True
            if not passed:
                error = "undefined (a condition did not hold)" if value is None else f"evaluated to {json.dumps(value)[:200]}"
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 - an engine error fails this test, with its message
            passed, error = False, _first_lines(str(exc))
        results.append(TestResult(test.package, test.name, test.path, test.line, passed,
                                  time.perf_counter() - started, error))
    return results


def _first_lines(message: str) -> str:
    """Engine messages without native backtraces, on one line."""
    text = message.split("Stack backtrace")[0].strip()
    return " ".join(line.strip() for line in text.splitlines() if line.strip() and line.strip() != "|")


def batch_test_query(bundle: Bundle) -> str:
    """One Rego query binding ``results`` to ``{test ref: [value]}`` (``[]`` when undefined)."""
    terms = ", ".join(f"{json.dumps(t.ref)}: [v | v := {t.ref}]" for t in bundle.tests)
    return f"results := {{{terms}}}"


def batch_test_results(bundle: Bundle, values: dict[str, Any], duration_s: float) -> list[TestResult]:
    """``TestResult``s from a ``batch_test_query`` answer; each test gets an equal share of the time."""
    share = duration_s / max(len(bundle.tests), 1)
    out = []
    for t in bundle.tests:
        got = values.get(t.ref) or []
        passed = got == [True]
        error = None if passed else ("undefined (a condition did not hold)" if not got
                                     else f"evaluated to {json.dumps(got[0])[:200]}")
        out.append(TestResult(t.package, t.name, t.path, t.line, passed, share, error))
    return out


_REGORUS_LOCATION = re.compile(r"-->\s*(\S+?):(\d+):(\d+)")
_REGORUS_ERROR = re.compile(r"^error:\s*(.*)$", re.MULTILINE)


def _regorus_parse_error(exc: Exception, fallback_path: str) -> BundleError:
    text = str(exc).split("Stack backtrace")[0]
    loc = _REGORUS_LOCATION.search(text)
    err = _REGORUS_ERROR.search(text)
    what = err.group(1).strip() if err else _first_lines(text)
    where = f"{loc.group(1)}:{loc.group(2)}:{loc.group(3)}" if loc else fallback_path
    return BundleError(f"{where}: {what}")


class RegorusEngine:
    """The embedded engine (regorus). Not thread-safe: one instance per thread."""

    name = "regorus"

    def __init__(self) -> None:
        import regorus

        self._regorus = regorus
        self._engine: Any = None
        self._bundle: Bundle | None = None

    def load_bundle(self, bundle: Bundle) -> None:
        """Parse every module of ``bundle`` and load its data.

        Raises:
            BundleError: a module does not parse (``file:line:col: message``).
        """
        engine = self._regorus.Engine()
        for module in bundle.modules:
            path = str(bundle.root / module.path)
            try:
                engine.add_policy(path, module.source)
            except Exception as exc:  # noqa: BLE001 - regorus raises RuntimeError for parse errors
                raise _regorus_parse_error(exc, path) from None
        engine.add_data(bundle.data)
        self._engine, self._bundle = engine, bundle

    def _loaded(self) -> tuple[Any, Bundle]:
        if self._engine is None or self._bundle is None:
            raise RuntimeError("load_bundle() must be called first")
        return self._engine, self._bundle

    def evaluate(self, input: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
        """``{package: findings}`` for every decision package.

        Raises:
            UserError: the evaluation failed (e.g. a builtin error, which aborts the query in regorus).
        """
        engine, bundle = self._loaded()
        engine.set_input(input)  # from Python objects: faster than JSON text, integers stay exact
        out: dict[str, list[dict[str, Any]]] = {}
        for package in bundle.decision_packages:
            try:
                raw = engine.eval_rule_as_json(f"data.{package}.findings")
            except Exception as exc:  # noqa: BLE001
                raise UserError(f"policy evaluation of data.{package}.findings failed in regorus: {_first_lines(str(exc))}") from None
            out[package] = sort_findings(json.loads(raw) if raw else [])
        return out

    def run_tests(self) -> list[TestResult]:
        """Every ``test_*`` rule (input undefined, as in ``opa test``)."""
        engine, bundle = self._loaded()
        engine = engine.clone()
        engine.set_input_json("{}")  # tests provide their own input with `with input as`
        return _run_tests(bundle, lambda t: engine.eval_rule(t.ref))


class OpaGoEngine:
    """The real OPA Go evaluator in-process (``opa_bindings``); raises ImportError without the package."""

    name = "opa-go"

    def __init__(self) -> None:
        from opa_bindings import OpaEngine, OpaError, OpaUndefinedError

        self._new, self._error, self._undefined = OpaEngine, OpaError, OpaUndefinedError
        self._engine: Any = None
        self._bundle: Bundle | None = None

    def load_bundle(self, bundle: Bundle) -> None:
        """Compile every module of ``bundle`` and load its data.

        Raises:
            BundleError: a module does not parse or compile (OPA's message, with file and line).
        """
        engine = self._new()
        for module in bundle.modules:
            path = str(bundle.root / module.path)
            try:
                engine.add_policy(path, module.source)
            except self._error as exc:
                raise BundleError(f"{path}: {_first_lines(exc.message)}") from None
        engine.add_data(bundle.data)
        self._engine, self._bundle = engine, bundle

    def _loaded(self) -> tuple[Any, Bundle]:
        if self._engine is None or self._bundle is None:
            raise RuntimeError("load_bundle() must be called first")
        return self._engine, self._bundle

    def document(self, path: str, input: Any = None) -> Any:
        """``data.<path>`` (dotted, without ``data.``), or ``None`` when undefined."""
        engine, _ = self._loaded()
        try:
            return engine.eval_document(path, input)
        except self._undefined:
            return None

    def evaluate(self, input: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
        """``{package: findings}`` for every decision package.

        Raises:
            UserError: OPA reported an evaluation error.
        """
        _, bundle = self._loaded()
        out = {}
        for package in bundle.decision_packages:
            try:
                out[package] = sort_findings(self.document(f"{package}.findings", input))
            except self._error as exc:
                raise UserError(f"policy evaluation of data.{package}.findings failed in OPA: {_first_lines(exc.message)}") from None
        return out

    def run_tests(self) -> list[TestResult]:
        """Every ``test_*`` rule (input undefined, as in ``opa test``).

        OPA prepares (compiles) each distinct query, which costs ~0.1 s, so all tests run in one
        query and each gets an equal share of its time; if that query fails (a test raises an
        error), every test runs on its own so the error lands on the test that caused it.
        """
        engine, bundle = self._loaded()
        if not bundle.tests:
            return []
        started = time.perf_counter()
        try:
            rows = engine.eval_query(batch_test_query(bundle))
        except self._error:
            return _run_tests(bundle, lambda t: self.document(t.ref.removeprefix("data.")))
        return batch_test_results(bundle, rows[0]["results"] if rows else {}, time.perf_counter() - started)


class OpaServerEngine:
    """A running OPA server (``--opa-url`` / ``DRAUDIT_OPA_URL``) through ``opa-python-client``.

    Modules are pushed as policies ``draudit-bundle/<relative path>`` (stale ones from an earlier
    bundle are deleted); data under each manifest root is pushed per child object
    (``data.draudit.params`` → ``PUT /v1/data/draudit/params``).

    Args:
        url: ``http://host:port`` or ``https://host:port`` of the OPA server.
        timeout_s: per-request timeout in seconds (``DRAUDIT_OPA_TIMEOUT_S``).
        retries: retries on connection errors and 500/502/504.

    Raises (from every method):
        UserError: OPA unreachable, timing out, or answering with an error — one line naming the URL.
    """

    name = "opa-server"

    def __init__(self, url: str, timeout_s: float = 10.0, retries: int = 1) -> None:
        from opa_client import OpaClient

        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            raise UserError(f"OPA URL {url!r} must look like http://opa.example:8181 (scheme, host, port; no path) "
                            "— fix --opa-url / DRAUDIT_OPA_URL")
        port = parts.port or (443 if parts.scheme == "https" else 8181)
        self.url = f"{parts.scheme}://{parts.hostname}:{port}"
        self._client = OpaClient(host=parts.hostname, port=port, ssl=parts.scheme == "https",
                                 timeout=timeout_s, retries=retries)
        self._bundle: Bundle | None = None

    def close(self) -> None:
        """Close the HTTP session."""
        self._client.close_connection()

    def _fail(self, doing: str, exc: Exception) -> UserError:
        import requests

        reason = getattr(exc.args[0], "reason", None) if exc.args else None
        if isinstance(exc, requests.Timeout) or "timed out" in str(reason or "").lower():
            why = f"no answer within {self._client.timeout} s"
        elif isinstance(exc, requests.ConnectionError):
            why = "connection failed"
        elif isinstance(exc, requests.HTTPError) and exc.response is not None:
            why = f"HTTP {exc.response.status_code}: {_opa_message(exc.response)}"
        else:
            why = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        return UserError(f"OPA at {self.url} failed while {doing}: {why} — check that OPA is running and "
                         "--opa-url / DRAUDIT_OPA_URL points at it (no findings were produced)")

    def load_bundle(self, bundle: Bundle) -> None:
        """Push modules and data to the server.

        Raises:
            BundleError: OPA rejected a module (with OPA's file and line).
            UserError: OPA unreachable or failing.
        """
        from opa_client.errors import ConnectionsError, RegoParseError

        try:
            self._client.check_connection()
        except ConnectionsError as exc:
            raise self._fail("connecting", exc.__cause__ or exc) from None
        try:
            wanted = {f"{OPA_POLICY_PREFIX}/{m.path}": m for m in bundle.modules}
            for stale in self._client.get_policies_list():
                if stale.startswith(f"{OPA_POLICY_PREFIX}/") and stale not in wanted:
                    self._client.delete_policy(stale)
            for policy_id, module in wanted.items():
                try:
                    self._client.update_policy_from_string(module.source, policy_id, rego_compat=False)
                except RegoParseError as exc:
                    raise BundleError(f"{bundle.root / module.path}: OPA rejected the module: {_rego_errors(exc)}") from None
            for endpoint, value in _data_pushes(bundle):
                try:
                    self._client.update_or_create_data(value, endpoint)
                except RegoParseError as exc:
                    raise UserError(f"OPA at {self.url} refused data at {endpoint}: {_rego_errors(exc)}") from None
        except (UserError, BundleError):
            raise
        except Exception as exc:  # noqa: BLE001 - requests errors become one-line user errors
            raise self._fail("loading the bundle", exc) from None
        self._bundle = bundle

    def _loaded(self) -> Bundle:
        if self._bundle is None:
            raise RuntimeError("load_bundle() must be called first")
        return self._bundle

    def _query(self, package: str, rule: str, input: Any) -> Any:
        try:
            body = self._client.query_rule(input, package, rule)
        except Exception as exc:  # noqa: BLE001
            raise self._fail(f"evaluating data.{package}.{rule}", exc) from None
        return body.get("result")

    def evaluate(self, input: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
        """``{package: findings}``; a package OPA does not know is an error, never an empty list.

        Raises:
            UserError: OPA unreachable, failing, or without the bundle's decision documents.
        """
        bundle = self._loaded()
        out = {}
        for package in bundle.decision_packages:
            result = self._query(package, "findings", input)
            if result is None:
                raise UserError(f"OPA at {self.url} has no document data.{package}.findings — the bundle is not "
                                "loaded there (was the policy deleted or OPA restarted?); no findings were produced")
            out[package] = sort_findings(result)
        return out

    def run_tests(self) -> list[TestResult]:
        """Every ``test_*`` rule, evaluated by the server (input undefined).

        All tests go in one ad-hoc query (``POST /v1/query``); if the server refuses it, each test
        is queried on its own (``POST /v1/data/<package>/<test>``) so a failure lands on its test.
        """
        import requests

        bundle = self._loaded()
        if not bundle.tests:
            return []
        started = time.perf_counter()
        try:
            body = self._client.ad_hoc_query(batch_test_query(bundle))
        except requests.HTTPError:
            return _run_tests(bundle, lambda t: self._query(t.package, t.name, None))
        except Exception as exc:  # noqa: BLE001
            raise self._fail("running the bundle's tests", exc) from None
        rows = body.get("result") or []
        return batch_test_results(bundle, rows[0].get("results", {}) if rows else {}, time.perf_counter() - started)


def _opa_message(response: Any) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    return body.get("message") or json.dumps(body)[:200]


def _rego_errors(exc: Any) -> str:
    details = []
    for err in getattr(exc, "errors", None) or []:
        loc = err.get("location") or {}
        where = f"line {loc.get('row')}: " if loc.get("row") else ""
        details.append(f"{where}{err.get('message', '')}")
    return "; ".join(details) or str(getattr(exc, "message", exc))


def _data_pushes(bundle: Bundle) -> list[tuple[str, dict[str, Any]]]:
    """``(endpoint, object)`` pairs: each child object of each manifest root of the data document."""
    pushes = []
    for root in bundle.roots:
        parts = [p for p in root.split("/") if p]
        node: Any = bundle.data
        for p in parts:
            node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        for key, value in sorted(node.items()):
            if not isinstance(value, dict):
                raise BundleError(f"{bundle.root}: data at {'.'.join(parts + [key])} must be a JSON object "
                                  "to be pushed to OPA (wrap the value in an object)")
            pushes.append(("/".join(parts + [key]), value))
    return pushes


def make_policy_engine(opa_url: str | None = None, opa_timeout_s: float = 10.0) -> PolicyEngine:
    """``OpaServerEngine`` when ``opa_url`` is given, else the embedded ``RegorusEngine``."""
    if opa_url:
        return OpaServerEngine(opa_url, timeout_s=opa_timeout_s)
    return RegorusEngine()
