"""`draudit demo` end to end (a shorter play than the default): the planted violation is found,
the pack verifies, and `draudit trace` agrees with the scenario's own placement."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    proc = subprocess.run([sys.executable, "-m", "collector.cli", "demo", "--out", str(out), "--output", "json",
                           "--duration-s", "20", "--transactions", "600"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout)


def test_demo_reports_the_planted_violation_and_a_verified_pack(demo):
    out, result = demo
    placement = json.loads((out / "logs" / "placement.json").read_text())
    violation = placement["violation"]
    cross = [f for f in result["findings"] if f["rule"] == "isolation/cross-tenant-sharing"]
    assert len(cross) == 1
    assert cross[0]["severity"] == "high" and cross[0]["kind"] == "violation"
    assert cross[0]["physical_gpu_uuid"] == violation["physical_gpu_uuid"]
    assert sorted(cross[0]["subjects"]["tenants"]) == sorted(violation["tenants"])
    assert {p["name"] for p in violation["pods"]} <= {p.split("/")[1] for p in cross[0]["pods"]}
    assert [f for f in result["findings"] if f["kind"] == "violation"] == cross, "nothing else is a violation"
    assert result["verified"] is True
    assert (out / "pack" / "report.pdf").exists() and (out / "pack" / "manifest.sig").exists()
    t = result["transactions"]
    assert t["unattributed"] == 0 and t["exact"] >= 0.99 * sum(t.values())
    ing = result["ingest"]
    assert ing["pan_masked"] == 1 and ing["quarantined"] == 5
    # both sources counted; the store's quarantine rows are the file's plus the OTLP rejections
    assert ing["read"] == ing["file_read"] + ing["otlp_records"] and ing["otlp_records"] > 0
    assert ing["quarantined"] == ing["file_quarantined"] + ing["otlp_rejected"]
    assert ing["read"] == ing["stored"] + ing["duplicates"] + ing["quarantined"]
    # the stored quarantine rows by reason slug, as `draudit quarantine` lists them
    reasons = result["quarantine_reasons"]
    assert sum(reasons.values()) == ing["quarantined"] and all(k and ":" not in k for k in reasons)


def test_trace_of_sample_ids_matches_the_scenario_placement(demo):
    out, result = demo
    assert result["sample"]
    ids = [s["transaction_id"] for s in result["sample"]]
    proc = subprocess.run([sys.executable, "-m", "collector.cli", "trace", *ids, "--output", "json",
                           "--database-url", result["database"]], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    traced = {t["transaction_id"]: t for t in json.loads(proc.stdout)}
    for s in result["sample"]:
        assert traced[s["transaction_id"]]["status"] == "exact"
        assert traced[s["transaction_id"]]["physical_gpu_uuid"] == s["physical_gpu_uuid"]


def test_the_trace_the_demo_suggests_names_the_other_tenant(demo):
    """The sample the demo prints as its next command is a record scored during the planted
    violation: its trace answers "who else was on that GPU" with the other tenant's pod."""
    out, result = demo
    ids = [s["transaction_id"] for s in result["sample"]]
    proc = subprocess.run([sys.executable, "-m", "collector.cli", "trace", *ids, "--output", "json",
                           "--database-url", result["database"]], capture_output=True, text=True, timeout=60)
    docs = {d["transaction_id"]: d for d in json.loads(proc.stdout)}
    crossed = [i for i in ids if any(c["namespace"] != docs[i]["pod"]["namespace"] for c in docs[i]["co_tenants"])]
    # a tenant surely there first (the final tester's run suggested one listed only as possible)
    surely = [i for i in crossed if docs[i]["status"] == "exact" and any(
        c["certain"] and c["namespace"] != docs[i]["pod"]["namespace"] for c in docs[i]["co_tenants"])]
    # this short play may have scored no sample during the violation; the full demo does (README)
    assert result["suggested_trace"] == (surely or crossed or ids)[0]


def test_no_full_card_number_anywhere_in_the_demo_outputs(demo):
    out, _ = demo
    pan_plain, pan_spaced = b"4111111111111111", b"4111 1111 1111 1111"
    for path in out.rglob("*"):  # the synthetic input in logs/ too: masked once ingested
        if path.is_file():
            data = path.read_bytes()
            assert pan_plain not in data and pan_spaced not in data, path
    assert b"411111******1111" in (out / "logs" / "fluentbit.jsonl").read_bytes()


def test_the_text_summary_names_the_quarantine_reasons_and_the_command_that_lists_them(demo, capsys):
    """A newcomer's finding: the summary said "5 quarantined with reasons" without giving them."""
    from collector.cli.demo import _print_summary
    from collector.demo import DemoResult

    out, result = demo
    r = DemoResult(out_dir=out, database_url=result["database"], transactions=result["transactions"], by_reason={},
                   ingest=result["ingest"], findings=[], pack_path=out / "pack", archive_path=None, verified=True,
                   checks=[], sample=[], violation={}, quarantine_reasons=result["quarantine_reasons"])
    _print_summary(r)
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.strip().startswith("quarantined by reason:"))
    assert line.split(": ", 1)[1] == ", ".join(f"{k} {v}" for k, v in result["quarantine_reasons"].items())
    assert f"quarantine --database-url {result['database']}" in text
