"""``python -m collector.sim`` (the README's local `draudit run` recipe): refusals, then a real start."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def _sim(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "collector.sim", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_a_story_shorter_than_the_scenario_needs_and_a_port_in_use_are_one_line_errors(tmp_path):
    short = _sim("--duration-s", "5", "--logs", str(tmp_path / "logs"))
    _out, err = short.communicate(timeout=60)
    assert short.returncode == 2 and "--duration-s 5: the fraud-scoring story needs at least 20 s" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = _sim("--port", str(taken.getsockname()[1]), "--logs", str(tmp_path / "logs"))
        _out, err = busy.communicate(timeout=60)
    assert busy.returncode == 2 and "cannot listen" in err and "Traceback" not in err


def test_it_serves_the_kubernetes_api_and_writes_the_story_logs(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sim = _sim("--port", str(port), "--logs", str(tmp_path / "logs"), "--delay-s", "60", cwd=tmp_path)
    try:
        first = sim.stdout.readline()
        assert first.startswith(f"fake API server on http://127.0.0.1:{port};"), first
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/apis/resource.k8s.io/v1/resourceslices", timeout=10) as r:
            doc = json.load(r)
        assert doc["kind"] == "ResourceSliceList" and doc["items"] == []  # the story has not started
        lines = (tmp_path / "logs" / "fluentbit.jsonl").read_text().splitlines()
        assert len(lines) > 1000 and json.loads(lines[0])["kubernetes"]["namespace_name"]
    finally:
        sim.send_signal(signal.SIGTERM)
        sim.wait(timeout=30)
    assert sim.returncode == 0
