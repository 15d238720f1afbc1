"""The bundle on both engines: `_test` suites, agreement of regorus and the real OPA evaluator, the
OPA-server path against a loopback server speaking OPA's REST API, and `draudit policy test|check`.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from collector.cli import cli
from collector.errors import UserError
from collector.policy.bundle import BundleError, load_bundle
from collector.policy.engines import OpaServerEngine, RegorusEngine
from collector.policy.facts import build_facts
from collector.policy.findings import evaluate_period
from collector.timeutil import ns_to_rfc3339
from test_policy_support import DAY, EXPECTED_RULES, planted_sqlite_store

BUNDLE_DIR = Path(__file__).resolve().parent.parent / "policies"

try:
    from collector.policy.engines import OpaGoEngine

    OpaGoEngine()
    OPA_MISSING = None
except (ImportError, OSError) as exc:
    OPA_MISSING = f"opa-golib-python-bindings not importable ({exc}); install it with pip --ignore-requires-python"
needs_opa = pytest.mark.skipif(OPA_MISSING is not None, reason=OPA_MISSING or "")


@pytest.fixture(scope="module")
def bundle():
    return load_bundle(BUNDLE_DIR)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SQLite store holding the planted history (engine behaviour does not depend on the backend)."""
    url, sessions, engine = planted_sqlite_store(tmp_path_factory.mktemp("policy-engines"))
    yield url, sessions
    engine.dispose()


@pytest.fixture(scope="module")
def facts(store):
    _url, sessions = store
    with sessions.begin() as s:
        return build_facts(s, *DAY)


def _loaded(engine, bundle):
    engine.load_bundle(bundle)
    return engine


def _broken_copy(tmp_path: Path) -> Path:
    """The shipped bundle with cross-tenant sharing downgraded to medium (a policy regression)."""
    broken = tmp_path / "broken"
    shutil.copytree(BUNDLE_DIR, broken)
    rego = broken / "isolation.rego"
    source = rego.read_text()
    marker = '"rule": "isolation/cross-tenant-sharing",\n\t\t"severity": "high",'
    assert marker in source
    rego.write_text(source.replace(marker, marker.replace('"high"', '"medium"')))
    return broken


# ---------------------------------------------------------------------------------------------
# _test suites and agreement
# ---------------------------------------------------------------------------------------------


def test_every_test_rule_of_the_bundle_passes_on_regorus(bundle):
    results = _loaded(RegorusEngine(), bundle).run_tests()
    assert len(results) == len(bundle.tests) >= 25
    assert [r.ref for r in results if not r.passed] == []
    assert {r.package for r in results} == {"draudit.isolation_test", "draudit.inventory_test",
                                            "draudit.attribution_test", "draudit.coverage_test"}


@needs_opa
def test_every_test_rule_of_the_bundle_passes_on_the_real_opa_engine(bundle):
    results = _loaded(OpaGoEngine(), bundle).run_tests()
    assert len(results) == len(bundle.tests)
    assert [r.ref for r in results if not r.passed] == []


@needs_opa
def test_regorus_and_opa_agree_on_every_policy_and_every_test(bundle, facts, tmp_path):
    strict_dir = tmp_path / "strict"
    shutil.copytree(BUNDLE_DIR, strict_dir)
    data = json.loads((strict_dir / "data.json").read_text())
    data["draudit"]["params"].update(strict_mig=True, tenants={"marketing": "risk-inference"})
    (strict_dir / "data.json").write_text(json.dumps(data))
    for variant in (bundle, load_bundle(strict_dir), load_bundle(_broken_copy(tmp_path))):
        regorus, opa = _loaded(RegorusEngine(), variant), _loaded(OpaGoEngine(), variant)
        regorus_findings, opa_findings = regorus.evaluate(facts), opa.evaluate(facts)
        assert set(regorus_findings) == set(variant.decision_packages)
        assert regorus_findings == opa_findings
        assert [(r.ref, r.passed) for r in regorus.run_tests()] == [(r.ref, r.passed) for r in opa.run_tests()]
    # the variants really differ: the same facts give different findings
    default = Counter(f["rule"] for fs in _loaded(RegorusEngine(), bundle).evaluate(facts).values() for f in fs)
    assert default == EXPECTED_RULES
    merged = _loaded(RegorusEngine(), load_bundle(strict_dir)).evaluate(facts)["draudit.isolation"]
    assert not [f for f in merged if f["rule"] == "isolation/shared-with-isolation"]  # one tenant now


@needs_opa
def test_a_broken_policy_fails_its_test_on_both_engines(tmp_path):
    broken = load_bundle(_broken_copy(tmp_path))
    expected = ["data.draudit.isolation_test.test_two_tenants_holding_shares_of_one_device_is_a_high_violation"]
    for engine in (RegorusEngine(), OpaGoEngine()):
        assert [r.ref for r in _loaded(engine, broken).run_tests() if not r.passed] == expected


# ---------------------------------------------------------------------------------------------
# draudit policy test | check
# ---------------------------------------------------------------------------------------------


def test_cli_policy_test_passes_on_the_shipped_bundle(bundle):
    out = CliRunner().invoke(cli, ["policy", "test", str(BUNDLE_DIR)])
    assert out.exit_code == 0, out.output
    assert out.output.count(": PASS (") == len(bundle.tests)
    assert f"PASS: {len(bundle.tests)}/{len(bundle.tests)}" in out.output


def test_cli_policy_test_fails_naming_the_failing_test(tmp_path):
    broken = _broken_copy(tmp_path)
    out = CliRunner().invoke(cli, ["policy", "test", str(broken)])
    assert out.exit_code == 1
    failing = [line for line in out.output.splitlines() if ": FAIL (" in line]
    assert failing == [next(line for line in out.output.splitlines()
                            if line.startswith("data.draudit.isolation_test.test_two_tenants_holding_shares_of_one_device_is_a_high_violation"))]
    assert "isolation_test.rego:" in out.output and "FAIL: 1/" in out.output


def test_cli_policy_test_rejects_a_bundle_that_does_not_parse_with_file_and_line(tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(BUNDLE_DIR, bad)
    rego = bad / "coverage.rego"
    lines = rego.read_text().splitlines()
    target = next(i for i, line in enumerate(lines) if "g.duration_ns >" in line)
    lines[target] = "\tg.duration_ns > > 1"
    rego.write_text("\n".join(lines) + "\n")
    out = CliRunner().invoke(cli, ["policy", "test", str(bad)])
    assert out.exit_code == 2
    assert f"coverage.rego:{target + 1}:" in out.output


def test_cli_policy_check_validates_manifest_roots_and_parsing(tmp_path, bundle):
    ok = CliRunner().invoke(cli, ["policy", "check", str(BUNDLE_DIR)])
    assert ok.exit_code == 0, ok.output
    assert f"digest sha256:{bundle.digest}" in ok.output and "draudit.isolation" in ok.output

    outside = tmp_path / "outside"
    shutil.copytree(BUNDLE_DIR, outside)
    (outside / ".manifest").write_text(json.dumps({"revision": "r1", "roots": ["acme"]}))
    out = CliRunner().invoke(cli, ["policy", "check", str(outside)])
    assert out.exit_code == 2 and "outside the manifest roots" in out.output

    (outside / ".manifest").write_text('{"roots": ["draudit"]}')
    out = CliRunner().invoke(cli, ["policy", "check", str(outside)])
    assert out.exit_code == 2 and ".manifest" in out.output and "revision" in out.output


def test_the_digest_covers_every_bundle_file_and_nothing_else(tmp_path, bundle):
    copy = tmp_path / "copy"
    shutil.copytree(BUNDLE_DIR, copy)
    assert load_bundle(copy).digest == bundle.digest
    (copy / "README.md").write_text("notes for compliance engineers\n")
    assert load_bundle(copy).digest == bundle.digest
    (copy / "data.json").write_text((copy / "data.json").read_text() + "\n")
    assert load_bundle(copy).digest != bundle.digest


# ---------------------------------------------------------------------------------------------
# OPA server path, contract-tested against a loopback OPA REST API backed by the real evaluator
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def opa_server():
    if OPA_MISSING:
        pytest.skip(OPA_MISSING)
    from collector.policy.opa_contract_server import OpaContractServer

    with OpaContractServer() as server:
        yield server


def test_the_opa_server_engine_gives_the_same_findings_as_regorus(opa_server, bundle, facts):
    remote = OpaServerEngine(opa_server.url, timeout_s=10)
    remote.load_bundle(bundle)
    assert remote.evaluate(facts) == _loaded(RegorusEngine(), bundle).evaluate(facts)
    results = remote.run_tests()
    assert len(results) == len(bundle.tests) and all(r.passed for r in results)
    remote.close()


def test_findings_from_opa_and_regorus_share_their_keys(opa_server, bundle, store):
    _url, sessions = store
    first = evaluate_period(sessions, bundle, _loaded(RegorusEngine(), bundle), *DAY)
    remote = OpaServerEngine(opa_server.url, timeout_s=10)
    second = evaluate_period(sessions, bundle, _loaded(remote, bundle), *DAY)
    assert second.inserted == 0
    assert [f["finding_key"] for f in second.findings] == [f["finding_key"] for f in first.findings]


def test_cli_runs_tests_and_evaluates_through_an_opa_server(opa_server, store, bundle):
    url, _sessions = store
    tested = CliRunner().invoke(cli, ["policy", "test", str(BUNDLE_DIR), "--opa-url", opa_server.url])
    assert tested.exit_code == 0, tested.output
    assert "engine opa-server" in tested.output
    evaluated = CliRunner().invoke(cli, ["policy", "eval", "--from", ns_to_rfc3339(DAY[0]), "--to", ns_to_rfc3339(DAY[1]),
                                         "--opa-url", opa_server.url, "--database-url", url, "--output", "json"])
    assert evaluated.exit_code == 0, evaluated.output
    assert Counter(f["rule"] for f in json.loads(evaluated.output)) == EXPECTED_RULES


def test_a_module_opa_rejects_names_the_file_and_line(opa_server, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(BUNDLE_DIR, bad)
    (bad / "lib.rego").write_text((bad / "lib.rego").read_text() + "\nbroken_rule if {\n")
    with pytest.raises(BundleError, match=r"lib\.rego: OPA rejected the module: line \d+"):
        OpaServerEngine(opa_server.url).load_bundle(load_bundle(bad))


def test_reloading_a_smaller_bundle_removes_stale_modules_from_opa(opa_server, bundle, tmp_path, facts):
    remote = OpaServerEngine(opa_server.url)
    remote.load_bundle(bundle)
    smaller = tmp_path / "smaller"
    shutil.copytree(BUNDLE_DIR, smaller)
    (smaller / "coverage.rego").unlink()
    (smaller / "coverage_test.rego").unlink()
    remote.load_bundle(load_bundle(smaller))
    assert "draudit.coverage" not in remote.evaluate(facts)
    with pytest.raises(UserError, match=r"no document data\.draudit\.coverage\.findings.*no findings were produced"):
        remote._bundle = bundle  # a caller that believes the full bundle is loaded
        remote.evaluate(facts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_opa_down_is_a_loud_error_not_empty_findings(bundle, store):
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(UserError, match=rf"OPA at {url} failed while connecting: connection failed"):
        OpaServerEngine(url, timeout_s=1).load_bundle(bundle)
    db_url, _sessions = store
    out = CliRunner().invoke(cli, ["policy", "eval", "--opa-url", url, "--database-url", db_url])
    assert out.exit_code == 2 and "no findings were produced" in out.output


def test_opa_stopping_mid_way_fails_the_evaluation(bundle, facts):
    if OPA_MISSING:
        pytest.skip(OPA_MISSING)
    from collector.policy.opa_contract_server import OpaContractServer

    server = OpaContractServer().start()
    remote = OpaServerEngine(server.url, timeout_s=2)
    remote.load_bundle(bundle)
    server.stop()
    with pytest.raises(UserError, match="failed while evaluating data.draudit.attribution.findings"):
        remote.evaluate(facts)


def test_an_opa_that_never_answers_times_out_with_a_clear_error(bundle):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_hang() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept_and_hang, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(UserError, match=r"no answer within 0\.3 s"):
            OpaServerEngine(url, timeout_s=0.3, retries=0).load_bundle(bundle)
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()


def test_a_bad_opa_url_is_rejected_before_any_request():
    with pytest.raises(UserError, match="must look like http://opa.example:8181"):
        OpaServerEngine("opa.internal:8181")
