"""A bundle whose parameters (data.draudit.params) are missing or mistyped is refused by
`draudit policy check|test|eval`, on the embedded engine and the OPA-server path alike: without
them the shipped rules are undefined, not failing (no `lib.tenant_of`, so no cross-tenant
violation), and each shipped test injects its own parameters, so nothing else would notice. A
parameter key no rule reads is a warning, and so is a package that defines no `findings`
rule (e.g. `finding`)."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from collector.cli import cli
from collector.policy.bundle import PARAMS, BundleError, load_bundle
from collector.store.models import Finding
from collector.timeutil import ns_to_rfc3339
from test_policy_support import DAY, EXPECTED_RULES, planted_sqlite_store

BUNDLE_DIR = Path(__file__).resolve().parent.parent / "policies"
SHIPPED_PARAMS = json.loads((BUNDLE_DIR / "data.json").read_text())["draudit"]["params"]


def _run(*args: str):
    return CliRunner().invoke(cli, list(args))


def _copy(tmp_path: Path, name: str = "bundle") -> Path:
    target = tmp_path / name
    shutil.copytree(BUNDLE_DIR, target)
    return target


def _custom(tmp_path: Path, rego: str) -> Path:
    """A bundle of the user's own: a manifest rooted at draudit and ``custom.rego`` holding ``rego``."""
    bundle = tmp_path / "custom"
    bundle.mkdir()
    (bundle / ".manifest").write_text(json.dumps({"revision": "custom-1", "roots": ["draudit"]}))
    (bundle / "custom.rego").write_text(rego)
    return bundle


def _set_params(bundle: Path, params: dict | None, key: str = "params") -> None:
    (bundle / "data.json").write_text(json.dumps({"draudit": {} if params is None else {key: params}}))


def _without(key: str, **extra) -> dict:
    return {**{k: v for k, v in SHIPPED_PARAMS.items() if k != key}, **extra}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SQLite store with the planted day: one instance of every problem, cross-tenant sharing included."""
    url, sessions, engine = planted_sqlite_store(tmp_path_factory.mktemp("bundle-params"))
    yield url, sessions
    engine.dispose()


def _eval(url: str, bundle: Path, *extra: str):
    return _run("policy", "eval", "--from", ns_to_rfc3339(DAY[0]), "--to", ns_to_rfc3339(DAY[1]), "--cluster", "prod-eu-1",
                "--bundle", str(bundle), "--database-url", url, "--output", "json", *extra)


def _stored(sessions) -> int:
    with sessions() as s:
        return s.execute(select(func.count()).select_from(Finding)).scalar_one()


def test_the_shipped_params_are_the_ones_the_checker_knows_and_pass_it():
    assert list(SHIPPED_PARAMS) == list(PARAMS)
    for key, spec in PARAMS.items():
        assert spec.valid(SHIPPED_PARAMS[key]), key
    bundle = load_bundle(BUNDLE_DIR)
    assert bundle.warnings == ()
    ok = _run("policy", "check", str(BUNDLE_DIR))
    assert ok.exit_code == 0 and ok.stderr == "" and "warning" not in ok.output


@pytest.mark.parametrize("command", ["check", "test"])
def test_a_bundle_without_data_json_is_refused_by_check_and_test(tmp_path, command):
    bundle = _copy(tmp_path)
    (bundle / "data.json").unlink()
    out = _run("policy", command, str(bundle))
    assert out.exit_code == 2, out.output
    assert out.stderr.startswith(f"draudit: error: {bundle}: no data.json defines data.draudit.params, "
                                 f"but {bundle}/lib.rego:14 reads data.draudit.params: without it rules such as "
                                 "isolation/cross-tenant-sharing never hold and their findings are silently dropped. "
                                 'data.json must hold {"draudit": {"params": {"tenants": {}, "approved_device_classes": '
                                 '["gpu.nvidia.com"], ')
    assert '"strict_mig": false}}}' in out.stderr
    assert "PASS" not in out.output and "bundle OK" not in out.output
    with pytest.raises(BundleError, match="no data.json defines data.draudit.params"):
        load_bundle(bundle)


def test_eval_refuses_the_bundle_without_params_instead_of_dropping_the_cross_tenant_violation(tmp_path, store):
    url, sessions = store
    bundle = _copy(tmp_path)
    (bundle / "data.json").unlink()
    before = _stored(sessions)
    out = _eval(url, bundle)
    assert out.exit_code == 2
    assert f"{bundle}: no data.json defines data.draudit.params" in out.stderr
    assert out.stdout == "" and _stored(sessions) == before  # nothing evaluated, nothing stored
    # the same bundle with the shipped data.json finds the planted cross-tenant sharing
    shutil.copy(BUNDLE_DIR / "data.json", bundle / "data.json")
    ok = _eval(url, bundle)
    assert ok.exit_code == 0, ok.output
    assert Counter(f["rule"] for f in json.loads(ok.stdout)) == EXPECTED_RULES


def test_a_mistyped_params_key_is_refused_with_the_typo_named(tmp_path, store):
    bundle = _copy(tmp_path)
    _set_params(bundle, SHIPPED_PARAMS, key="param")
    for args in (("check", str(bundle)), ("test", str(bundle))):
        out = _run("policy", *args)
        assert out.exit_code == 2
        assert out.stderr.startswith(f"draudit: error: {bundle}/data.json: data.draudit has \"param\", not \"params\" "
                                     f"(a typo?), but {bundle}/lib.rego:14 reads data.draudit.params: ")
    out = _eval(store[0], bundle)
    assert out.exit_code == 2 and 'data.draudit has "param", not "params"' in out.stderr


def test_an_empty_draudit_document_is_refused(tmp_path):
    bundle = _copy(tmp_path)
    _set_params(bundle, None)
    out = _run("policy", "check", str(bundle))
    assert out.exit_code == 2
    assert f"draudit: error: {bundle}/data.json: data.draudit.params is missing, but {bundle}/lib.rego:14 reads" in out.stderr


def test_a_missing_key_is_refused_naming_the_key_its_reader_its_shape_and_the_likely_typo(tmp_path):
    bundle = _copy(tmp_path)
    _set_params(bundle, _without("coverage_gap_max_s", coverage_gap_max=60))
    out = _run("policy", "test", str(bundle))
    assert out.exit_code == 2 and "PASS" not in out.output
    assert out.stderr == (
        f"draudit: error: {bundle}/data.json: data.draudit.params lacks \"coverage_gap_max_s\" (read at "
        f"{bundle}/coverage.rego:22; a number of seconds >= 0, e.g. \"coverage_gap_max_s\": 60; \"coverage_gap_max\" "
        "is there instead: a typo?): without it the rules that read it are undefined (their findings silently "
        "dropped) or fall back to a default nobody set. Add it to data.draudit.params\n")


def test_every_missing_key_is_named(tmp_path):
    bundle = _copy(tmp_path)
    _set_params(bundle, {"tenants": {}})
    out = _run("policy", "check", str(bundle))
    assert out.exit_code == 2
    named = re.findall(r'lacks (.*): without them the rules', out.stderr)[0]
    assert re.findall(r'(?:^|, )"(\w+)" \(read at ', named) == [k for k in PARAMS if k != "tenants"]


@pytest.mark.parametrize("key,value,shape", [
    ("strict_mig", "false", "true or false"),
    ("handover_min_gap_s", "300", "a number of seconds >= 0"),
    ("exact_attribution_min_ratio", 99, "a number from 0 to 1"),
    ("approved_device_classes", "gpu.nvidia.com", "a list of DeviceClass names"),
    ("tenants", {"kyc-docs": 1}, "an object namespace -> tenant"),
])
def test_a_parameter_of_the_wrong_shape_is_refused(tmp_path, key, value, shape):
    bundle = _copy(tmp_path)
    _set_params(bundle, {**SHIPPED_PARAMS, key: value})
    out = _run("policy", "check", str(bundle))
    assert out.exit_code == 2
    assert out.stderr.startswith(f"draudit: error: {bundle}/data.json: data.draudit.params.{key} must be {shape}")
    assert out.stderr.rstrip().endswith(f"not {json.dumps(value)}")


def test_every_problem_is_named_in_one_error_missing_keys_and_wrong_shapes(tmp_path):
    bundle = _copy(tmp_path)
    _set_params(bundle, _without("coverage_gap_max_s", strict_mig="false", handover_min_gap_s="300"))
    out = _run("policy", "check", str(bundle))
    assert out.exit_code == 2
    lines = out.stderr.splitlines()
    assert lines[0] == f"draudit: error: {bundle}/data.json: 3 problems:"
    assert lines[1].startswith('  - data.draudit.params lacks "coverage_gap_max_s" (read at ')
    # in data.json's order of keys, as the missing ones
    assert lines[2:] == ['  - data.draudit.params.handover_min_gap_s must be a number of seconds >= 0 (e.g. 300), not "300"',
                         '  - data.draudit.params.strict_mig must be true or false (e.g. false), not "false"']


def test_an_unknown_params_key_is_a_warning_naming_it_and_its_likely_intent(tmp_path, store):
    bundle = _copy(tmp_path)
    _set_params(bundle, {**SHIPPED_PARAMS, "handover_gap_s": 30})
    warning = (f"warning: {bundle}/data.json: data.draudit.params has key \"handover_gap_s\", which no rule of the "
               "bundle reads (a typo of \"handover_min_gap_s\"?)\n")
    checked = _run("policy", "check", str(bundle))
    assert checked.exit_code == 0 and checked.stderr == warning
    assert checked.stdout.startswith(f"bundle OK: {bundle}\n") and checked.stdout.endswith("\n  1 warning(s), on stderr\n")
    tested = _run("policy", "test", str(bundle))
    assert tested.exit_code == 0 and tested.stderr == warning and "PASS: 35/35" in tested.stdout
    evaluated = _eval(store[0], bundle)
    assert evaluated.exit_code == 0 and evaluated.stderr == warning
    assert Counter(f["rule"] for f in json.loads(evaluated.stdout)) == EXPECTED_RULES


def test_a_key_a_users_own_rule_reads_is_required_and_no_warning(tmp_path):
    bundle = _copy(tmp_path)
    (bundle / "quota.rego").write_text(
        "package draudit.quota\n\nimport data.draudit.lib\n\nfindings contains f if {\n"
        "\tcount(input.overlaps) > lib.params.max_overlaps\n"
        '\tf := {"rule": "quota/overlaps", "severity": "low", "kind": "warning", "message": "many", "subjects": {},\n'
        '\t      "evidence": {}, "physical_gpu_uuid": null, "from_ns": null, "to_ns": null}\n}\n')
    out = _run("policy", "check", str(bundle))
    assert out.exit_code == 2
    assert f'data.draudit.params lacks "max_overlaps" (read at {bundle}/quota.rego:6; a value)' in out.stderr
    _set_params(bundle, {**SHIPPED_PARAMS, "max_overlaps": 3})
    ok = _run("policy", "check", str(bundle))
    assert ok.exit_code == 0 and ok.stderr == "" and "draudit.quota" in ok.stdout


def test_params_from_a_nested_data_file_count(tmp_path):
    bundle = _copy(tmp_path)
    (bundle / "data.json").unlink()
    (bundle / "draudit" / "params").mkdir(parents=True)
    (bundle / "draudit" / "params" / "data.json").write_text(json.dumps(SHIPPED_PARAMS))
    ok = _run("policy", "check", str(bundle))
    assert ok.exit_code == 0 and ok.stderr == "", ok.output
    (bundle / "draudit" / "params" / "data.json").write_text(json.dumps(_without("strict_mig")))
    out = _run("policy", "check", str(bundle))
    assert out.exit_code == 2 and f"{bundle}/draudit/params/data.json: data.draudit.params lacks \"strict_mig\"" in out.stderr


def test_a_users_bundle_whose_tests_inject_params_still_tests_with_a_valid_data_json(tmp_path):
    bundle = tmp_path / "user"
    bundle.mkdir()
    (bundle / ".manifest").write_text(json.dumps({"revision": "user-1", "roots": ["draudit"]}))
    (bundle / "data.json").write_text(json.dumps({"draudit": {"params": {"idle_allocation_max_s": 3600}}}))
    (bundle / "idle.rego").write_text(
        "package draudit.idle\n\nfindings contains f if {\n\tsome i in input.idle_allocations\n"
        "\ti.duration_ns > data.draudit.params.idle_allocation_max_s * 1000000000\n"
        '\tf := {"rule": "idle/long", "claim": i.claim}\n}\n')
    (bundle / "idle_test.rego").write_text(
        "package draudit.idle_test\n\nimport data.draudit.idle\n\ntest_short_threshold if {\n"
        '\tcount(idle.findings) == 1 with input as {"idle_allocations": [{"claim": "c", "duration_ns": 2000000000}]}\n'
        '\t\twith data.draudit.params as {"idle_allocation_max_s": 1}\n}\n')
    tested = _run("policy", "test", str(bundle))
    assert tested.exit_code == 0 and tested.stderr == "", tested.output
    assert "data.draudit.idle_test.test_short_threshold: PASS" in tested.stdout
    (bundle / "data.json").unlink()  # the tests still inject theirs, but production has none
    refused = _run("policy", "test", str(bundle))
    assert refused.exit_code == 2
    assert (f"{bundle}: no data.json defines data.draudit.params, but {bundle}/idle.rego:5 reads data.draudit.params"
            in refused.stderr)


def test_a_bundle_that_reads_no_params_needs_none(tmp_path):
    bundle = _custom(tmp_path,
                     "package draudit.custom\n\n# not data.draudit.params: \"tenants\" below is a subject\n"
                     'findings contains f if {\n\tinput.period.from_ns > 0\n\tf := {"rule": "custom/x", "subjects": {"tenants": []}}\n}\n')
    ok = _run("policy", "check", str(bundle))
    assert ok.exit_code == 0 and ok.stderr == "", ok.output
    assert load_bundle(bundle).warnings == ()


def test_a_package_line_with_a_trailing_comment_is_a_package_declaration(tmp_path):
    """``package draudit.custom # my rules`` is valid Rego; it was refused as "no `package` declaration"."""
    bundle = _custom(tmp_path, "package draudit.custom # the bank's own rules\n\n"
                               'findings contains f if {\n\tinput.period.from_ns > 0\n\tf := {"rule": "custom/x"}\n}\n')
    assert [m.package for m in load_bundle(bundle).modules] == ["draudit.custom"]
    assert _run("policy", "check", str(bundle)).exit_code == 0


def test_check_warns_about_a_package_defining_finding_instead_of_findings(tmp_path, store):
    bundle = _copy(tmp_path)
    source = (bundle / "attribution.rego").read_text()
    (bundle / "attribution.rego").write_text(source.replace("\nfindings contains f if {", "\nfinding contains f if {"))
    warning = (f"warning: {bundle}/attribution.rego: package draudit.attribution defines `finding`, not `findings` "
               "(did you mean `findings contains f if {...}`?): draudit evaluates data.<package>.findings only, so no "
               "finding of this package is ever produced\n")
    out = _run("policy", "check", str(bundle))
    assert out.exit_code == 0 and out.stderr == warning
    assert "decision packages: draudit.coverage, draudit.inventory, draudit.isolation\n" in out.stdout
    evaluated = _eval(store[0], bundle)
    assert evaluated.exit_code == 0 and evaluated.stderr == warning
    assert not {f["rule"] for f in json.loads(evaluated.stdout)} & {"attribution/exact-ratio",
                                                                   "attribution/unattributed-transaction"}


def test_check_warns_about_findings_not_defined_as_a_multi_value_rule_and_an_unread_package(tmp_path):
    bundle = _copy(tmp_path)
    (bundle / "extra.rego").write_text('package draudit.extra\n\nfindings := {"a"}\n')
    (bundle / "helper.rego").write_text("package draudit.helper\n\ndouble(x) := x * 2\n")
    out = _run("policy", "check", str(bundle))
    assert out.exit_code == 0
    assert out.stderr == (
        f"warning: {bundle}/extra.rego: package draudit.extra defines `findings` but not as `findings contains f if "
        "{...}`, the only form draudit evaluates: draudit evaluates data.<package>.findings only, so no finding of "
        "this package is ever produced\n"
        f"warning: {bundle}/helper.rego: package draudit.helper defines no `findings contains f if {{...}}` rule and "
        "no other package reads it: draudit evaluates data.<package>.findings only, so no finding of this package is "
        "ever produced\n")


def test_a_bundle_whose_only_package_defines_finding_is_an_error(tmp_path):
    bundle = tmp_path / "only"
    bundle.mkdir()
    (bundle / ".manifest").write_text(json.dumps({"revision": "only-1", "roots": ["draudit"]}))
    (bundle / "x.rego").write_text('package draudit.x\n\nfinding contains f if {\n\tf := {"rule": "x/y"}\n}\n')
    out = _run("policy", "check", str(bundle))
    assert out.exit_code == 2
    assert "package draudit.x defines `finding`, not `findings`" in out.stderr
    assert (f"draudit: error: {bundle}: no package defines `findings contains ...`, so evaluation would produce "
            "nothing") in out.stderr


# ---------------------------------------------------------------------------------------------
# OPA-server path: the same refusal, before anything is pushed (stale parameters of an earlier
# bundle would otherwise stay on the server and be used)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def opa_server():
    try:
        from collector.policy.engines import OpaGoEngine

        OpaGoEngine()
    except (ImportError, OSError) as exc:
        pytest.skip(f"opa-golib-python-bindings not importable ({exc})")
    from collector.policy.opa_contract_server import OpaContractServer

    with OpaContractServer() as server:
        yield server


def test_the_opa_server_path_refuses_the_bundle_without_params_too(tmp_path, store, opa_server):
    url, sessions = store
    loaded = _run("policy", "test", str(BUNDLE_DIR), "--opa-url", opa_server.url)  # the server has the shipped params
    assert loaded.exit_code == 0, loaded.output
    bundle = _copy(tmp_path)
    (bundle / "data.json").unlink()
    before = _stored(sessions)
    for out in (_run("policy", "test", str(bundle), "--opa-url", opa_server.url),
                _eval(url, bundle, "--opa-url", opa_server.url)):
        assert out.exit_code == 2
        assert f"{bundle}: no data.json defines data.draudit.params" in out.stderr and "PASS" not in out.stdout
    assert _stored(sessions) == before
    unknown = _set_params(bundle, {**SHIPPED_PARAMS, "strict": True}) or _eval(url, bundle, "--opa-url", opa_server.url)
    assert unknown.exit_code == 0, unknown.output
    assert unknown.stderr == (f"warning: {bundle}/data.json: data.draudit.params has key \"strict\", which no rule of "
                              "the bundle reads (a typo of \"strict_mig\"?)\n")
    assert Counter(f["rule"] for f in json.loads(unknown.stdout)) == EXPECTED_RULES
