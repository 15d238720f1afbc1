"""Pure parts of the evidence pack: manifest and signature checks, coverage summary, sharing analysis."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from reports.manifest import (
    FileDigest,
    build_manifest,
    check_pack,
    digest_bytes,
    manifest_bytes,
    public_key_id,
    sign_manifest,
    verdict,
)
from reports.populations import Scope, coverage_summary
from reports.timeline import Bar, sharing_segments, timeline_svgs

S = 1_000_000_000
FILES = {"index.html": b"<html>pack</html>", "data/findings.csv": b"rule\nisolation\n"}


def _pack(key=None):
    digests = [digest_bytes(p, d) for p, d in FILES.items()]
    manifest = build_manifest({"pack_id": "p1", "period": {"from": "a", "to": "b"}}, digests,
                              public_key_id(key.public_key()) if key else None)
    data = manifest_bytes(manifest)
    return manifest, data, (sign_manifest(data, key) if key else None), {d.path: d for d in digests}


def test_manifest_lists_files_sorted_with_media_types_and_rejects_unsafe_paths():
    manifest, data, _sig, _present = _pack()
    assert [f["path"] for f in manifest["files"]] == ["data/findings.csv", "index.html"]
    assert manifest["files"][0]["media_type"] == "text/csv; charset=utf-8"
    assert data.startswith(b'{"files":[{"media_type"') and b'", "' not in data and json.loads(data) == manifest
    for bad in ("../etc/passwd", "/abs", "data//x", "a\\b", "manifest.json"):
        with pytest.raises(ValueError):
            build_manifest({}, [FileDigest(bad, 1, "0" * 64)])
    with pytest.raises(ValueError, match="reserved"):
        build_manifest({"files": []}, [])


def test_checks_pass_untouched_and_name_each_problem():
    key = Ed25519PrivateKey.generate()
    _m, data, sig, present = _pack(key)
    checks = check_pack(data, sig, present, key.public_key())
    assert verdict(checks) and [c.ok for c in checks] == [True, True, True, True]
    # no key: signature skipped, still a pass
    assert [c.ok for c in check_pack(data, sig, present, None)][1] is None
    # a changed byte in the signature
    raw = bytearray(base64.b64decode(sig))
    raw[0] ^= 1
    bad = check_pack(data, base64.b64encode(bytes(raw)), present, key.public_key())
    assert not verdict(bad) and bad[1].name == "signature" and "does not verify" in bad[1].detail
    # a non-canonical manifest (pretty-printed) is refused
    reformatted = data.replace(b",", b", ")
    assert check_pack(reformatted, sig, present, key.public_key())[0].detail.endswith("(edited after it was written)")
    # size and digest differences are told apart
    short = dict(present, **{"index.html": FileDigest("index.html", 3, "0" * 64)})
    same_size = dict(present, **{"index.html": FileDigest("index.html", present["index.html"].size, "0" * 64)})
    assert "size differs" in [c for c in check_pack(data, sig, short, None) if c.name == "file index.html"][0].detail
    assert "SHA-256 differs" in [c for c in check_pack(data, sig, same_size, None) if c.name == "file index.html"][0].detail
    # signature file without a declared signature: the manifest was replaced by an unsigned one
    _m2, unsigned, _s, _p = _pack()
    assert "declares no signature" in check_pack(unsigned, sig, present, None)[1].detail


def test_coverage_summary_clips_and_counts_unobserved_time():
    scope = Scope(100 * S, 200 * S)
    intervals = [
        {"cluster": "c", "kind": "Pod", "state": "synced", "started_ns": 50 * S, "ended_ns": 150 * S},
        {"cluster": "c", "kind": "Pod", "state": "gap", "started_ns": 150 * S, "ended_ns": 160 * S},
        {"cluster": "c", "kind": "Pod", "state": "synced", "started_ns": 160 * S, "ended_ns": None},  # open
        {"cluster": "c", "kind": "ResourceSlice", "state": "synced", "started_ns": 120 * S, "ended_ns": 180 * S},
    ]
    pod, rs = coverage_summary(intervals, scope)
    assert (pod["synced_s"], pod["gap_s"], pod["unobserved_s"], pod["gaps"]) == (90.0, 10.0, 0.0, 1)
    assert (rs["synced_s"], rs["gap_s"], rs["unobserved_s"], rs["gaps"]) == (60.0, 0.0, 40.0, 0)


def _bar(gpu, device, tenant, claim, start, end, mig=False):
    return Bar(gpu, "node-a", device, "mig" if mig else "gpu", f"{device}-uuid", "3g.40gb" if mig else None, tenant,
               f"{tenant}-ns", claim, claim, start * S, None if end is None else end * S)


def test_sharing_segments_tell_mig_partitioning_from_shared_devices():
    bars = [
        _bar("GPU-A", "gpu-0", "risk", "c1", 0, 50),
        _bar("GPU-A", "gpu-0", "marketing", "c2", 20, 30),
        _bar("GPU-A", "gpu-0", "risk", "c3", 40, 60),  # same tenant overlap 40..50
        _bar("GPU-B", "mig-0", "risk", "c4", 0, None, mig=True),
        _bar("GPU-B", "mig-1", "marketing", "c5", 10, 20, mig=True),
        _bar("GPU-C", "gpu-0", "risk", "c6", 0, 10),
        _bar("GPU-C", "gpu-0", "marketing", "c7", 10, 20),  # back to back: no sharing
    ]
    segs = [(s.physical_gpu_uuid, s.from_ns // S, s.to_ns // S, s.tenants, s.partitioned) for s in
            sharing_segments(bars, 0, 100 * S)]
    assert segs == [
        ("GPU-A", 20, 30, ("marketing", "risk"), False),
        ("GPU-A", 40, 50, ("risk",), False),
        ("GPU-B", 10, 20, ("marketing", "risk"), True),
    ]
    svg = timeline_svgs(bars + [_bar("GPU-<x>", "d", "t&t", "c9", 0, 1)], 0, 100 * S, lanes_per_chart=2)
    assert len(svg) == 2 and "GPU-&lt;x&gt;" in "".join(svg) and "t&amp;t" in "".join(svg)
    assert 'stroke-dasharray="2,1"' in svg[1] and 'stroke-dasharray' not in svg[0]  # MIG drawn distinctly
