"""Kubelet log rotation: a CRI line whose ``P`` chunks end a rotated file and whose ``F`` chunk
starts its successor is one record when both files are ingested in one run, in whatever order the
paths are given (a shell glob gives the live ``0.log`` first); a partial line left open at the end
of a file whose successor is not in the run is quarantined there (``incomplete-partial``), and
later files still go to the parse workers. Both stores."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from collector.cli import cli
from collector.ingest import parse_pool
from collector.ingest.pipeline import IngestRun
from collector.ingest.rotation import continues, in_rotation_order, log_stream
from collector.store.models import InferenceRecord, Quarantine

POD_DIR = "var/log/pods/risk-inference_fraud-api-7c9d8-x2x4q_0b6f7a52-6c5e-4a8e-9a57-0b8c1f2a3d4e/api"
CHUNK = 16384  # containerd's buffer: a longer line is written as P chunks and a final F chunk


def _ecs(txn: str, second: int, stack: int = 80) -> str:
    return json.dumps({"@timestamp": f"2025-11-29T08:00:{second:02d}.123Z", "log.level": "INFO",
                       "log.logger": "com.example.fraud.ScoringService", "message": "scored", "txn_id": txn,
                       "decision": "APPROVE", "model_name": "fraud_xgb", "error.stack_trace": "at x\n" * (stack // 5)})


def _cri(second: int, content: str, tag: str = "F") -> str:
    return f"2025-11-29T08:00:{second:02d}.200000000Z stdout {tag} {content}\n"


def _split(second: int, content: str) -> tuple[str, str]:
    """The P chunks of a long line, and its F chunk."""
    pieces = [content[i:i + CHUNK] for i in range(0, len(content), CHUNK)]
    return "".join(_cri(second, p, "P") for p in pieces[:-1]), _cri(second, pieces[-1])


def _ingest(database_url: str, *paths: Path) -> dict:
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", database_url]).exit_code == 0
    result = runner.invoke(cli, ["ingest", *map(str, paths), "--database-url", database_url, "--output", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _stored(sessions) -> list[tuple[str, str, str, str | None]]:
    with sessions() as s:
        rows = s.execute(select(InferenceRecord.transaction_id, InferenceRecord.source, InferenceRecord.position,
                                InferenceRecord.pod_name).order_by(InferenceRecord.id)).all()
    return [(txn, Path(src).name, pos, pod) for txn, src, pos, pod in rows]


@pytest.fixture
def rotated(tmp_path) -> tuple[Path, Path, Path, str]:
    """An older gzipped file, the file rotated at 08:00:10 ending inside RT-3's P chunks, and the
    live log starting with RT-3's F chunk. Returns the three paths and RT-3's whole line."""
    d = tmp_path / POD_DIR
    d.mkdir(parents=True)
    long_line = _ecs("RT-3", 3, stack=40000)
    first_chunks, final_chunk = _split(3, long_line)
    assert first_chunks.count(" P ") == 2
    oldest = d / "0.log.20251129-070000.gz"
    oldest.write_bytes(gzip.compress(_cri(0, _ecs("RT-0", 0)).encode()))
    rotated_file = d / "0.log.20251129-080010"
    rotated_file.write_text(_cri(1, _ecs("RT-1", 1)) + _cri(2, _ecs("RT-2", 2)) + first_chunks)
    live = d / "0.log"
    live.write_text(final_chunk + _cri(4, _ecs("RT-4", 4)))
    return oldest, rotated_file, live, long_line


@pytest.mark.parametrize("order", [(2, 0, 1), (0, 1, 2), (1, 2, 0)], ids=["glob-order", "oldest-first", "scrambled"])
def test_a_line_split_by_a_rotation_is_one_record(rotated, database_url, sessions, order):
    paths = [rotated[i] for i in order]
    counts = _ingest(database_url, *paths)
    # the three chunks of RT-3, in two files, are one unit read: one record
    assert counts == {"read": 5, "stored": 5, "duplicates": 0, "conflicts": 0, "quarantined": 0, "pan_masked": 0}
    pod = "fraud-api-7c9d8-x2x4q"
    assert _stored(sessions) == [("RT-0", "0.log.20251129-070000.gz", "1", pod), ("RT-1", "0.log.20251129-080010", "1", pod),
                                 ("RT-2", "0.log.20251129-080010", "2", pod), ("RT-3", "0.log.20251129-080010", "3", pod),
                                 ("RT-4", "0.log", "2", pod)]
    with sessions() as s:
        attributes = s.execute(select(InferenceRecord.attributes).where(InferenceRecord.transaction_id == "RT-3")).scalar_one()
    assert attributes["error.stack_trace"] == json.loads(rotated[3])["error.stack_trace"]  # the whole line, joined


def test_without_its_successor_an_open_line_is_quarantined_at_the_end_of_its_file(rotated, database_url, sessions):
    oldest, rotated_file, _live, _line = rotated
    other = rotated_file.parent.parent / "sidecar"
    other.mkdir()
    (other / "0.log").write_text(_cri(5, _ecs("SC-1", 5)))
    counts = _ingest(database_url, rotated_file, other / "0.log")
    assert counts == {"read": 4, "stored": 3, "duplicates": 0, "conflicts": 0, "quarantined": 1, "pan_masked": 0}
    with sessions() as s:
        (reason, source, position), = s.execute(select(Quarantine.reason, Quarantine.source, Quarantine.position)).all()
    assert reason.startswith("incomplete-partial:")
    assert (Path(source).name, position) == ("0.log.20251129-080010", "3")
    assert [t[0] for t in _stored(sessions)] == ["RT-1", "RT-2", "SC-1"]


def test_a_file_left_open_no_longer_keeps_later_files_from_the_parse_workers(tmp_path, database_url, sessions, monkeypatch):
    """A partial line held to the end of the run made every later chunk of every file be parsed in
    the writer's process (``IngestRun._take``); it ends with its file now."""
    monkeypatch.setattr(parse_pool, "CHUNK_LINES", 50)
    first = tmp_path / "a" / "0.log"
    first.parent.mkdir()
    first.write_text(_cri(1, _ecs("OP-1", 1)) + _cri(2, "{\"txn_id\": \"OP-2\", ", "P"))
    second = tmp_path / "b" / "0.log"
    second.parent.mkdir()
    second.write_text("".join(_cri(i % 60, _ecs(f"W-{i}", i % 60)) for i in range(400)))
    reparsed = []
    original = IngestRun._parse_here

    def parse_here(self, chunk, source):
        reparsed.append((Path(source).parent.name, chunk.first))
        return original(self, chunk, source)

    monkeypatch.setattr(IngestRun, "_parse_here", parse_here)
    monkeypatch.setattr(parse_pool, "default_workers", lambda: 2)
    counts = _ingest(database_url, first, second)
    assert counts == {"read": 402, "stored": 401, "duplicates": 0, "conflicts": 0, "quarantined": 1, "pan_masked": 0}
    # each file's first chunk is parsed here (an input no longer than that starts no worker); none after it
    assert reparsed == [("a", 1), ("b", 1)]


def test_a_file_given_twice_is_read_once(rotated, database_url, sessions):
    """Overlapping globs (``0.log* *.gz``) name the gzipped file twice: read twice, its records were
    duplicates and the line it left open was quarantined as never completed, though joined."""
    oldest, rotated_file, live, _line = rotated
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", database_url]).exit_code == 0
    result = runner.invoke(cli, ["ingest", str(live), str(rotated_file), str(oldest), str(rotated_file),
                                 "--database-url", database_url, "--output", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"read": 5, "stored": 5, "duplicates": 0, "conflicts": 0, "quarantined": 0,
                                         "pan_masked": 0}
    assert result.stderr == f"draudit: warning: {rotated_file} is the file {rotated_file} given again: read once\n"


def test_a_live_log_named_through_a_containers_link_is_joined_with_its_rotated_files(rotated, database_url, sessions,
                                                                                      tmp_path):
    """``/var/log/containers/<pod>_<ns>_<container>-<id>.log`` links to the pod's live ``0.log``:
    its name is not the rotated files' stream, nor does it give the pod identity the same way."""
    _oldest, rotated_file, live, _line = rotated
    containers = tmp_path / "var/log/containers"
    containers.mkdir(parents=True)
    link = containers / f"fraud-api-7c9d8-x2x4q_risk-inference_api-{'ab' * 32}.log"
    link.symlink_to(live)
    counts = _ingest(database_url, link, rotated_file)
    assert counts == {"read": 4, "stored": 4, "duplicates": 0, "conflicts": 0, "quarantined": 0, "pan_masked": 0}
    assert [(t, f, p) for t, f, p, _pod in _stored(sessions)] == [
        ("RT-1", "0.log.20251129-080010", "1"), ("RT-2", "0.log.20251129-080010", "2"),
        ("RT-3", "0.log.20251129-080010", "3"), ("RT-4", link.name, "2")]


def test_rotation_order_and_streams():
    live = "/var/log/pods/ns_p_0b6f7a52-6c5e-4a8e-9a57-0b8c1f2a3d4e/api/0.log"
    assert log_stream(live + ".20251129-081500.gz") == live
    assert log_stream(live + ".20251129-081500") == live
    assert log_stream(live) == live and log_stream("stdin") == "stdin"
    assert log_stream(live + ".1") == live + ".1"  # not the kubelet's suffix
    assert in_rotation_order(["b/0.log", "a.log", "b/0.log.20251129-091500.gz", "b/0.log.20251129-081500"]) == [3, 2, 0, 1]
    assert in_rotation_order(["x.log", "y.log"]) == [0, 1]
    assert continues(live + ".20251129-081500", live) and not continues(live, None)
    assert not continues(live, "/other/0.log") and not continues(live, live)


def test_a_log_named_through_its_containers_link_carries_the_pod_uid_of_the_file_it_links_to(
        tmp_path, database_url, sessions, monkeypatch):
    """The link's name has namespace, pod, container and container id, not the pod UID; the file
    it points to has it. Lines read under either name are one pod identity: read again under the
    other, they are duplicates (they were stored twice, one copy without a UID). Parse workers too."""
    monkeypatch.setattr(parse_pool, "CHUNK_LINES", 50)
    monkeypatch.setattr(parse_pool, "default_workers", lambda: 2)
    d = tmp_path / POD_DIR
    d.mkdir(parents=True)
    live = d / "3.log"
    live.write_text("".join(_cri(i % 60, _ecs(f"LK-{i}", i % 60)) for i in range(200)))
    containers = tmp_path / "var/log/containers"
    containers.mkdir(parents=True)
    link = containers / f"fraud-api-7c9d8-x2x4q_risk-inference_api-{'ab' * 32}.log"
    link.symlink_to(live)
    assert _ingest(database_url, link)["stored"] == 200
    with sessions() as s:
        rows = s.execute(select(InferenceRecord.pod_uid, InferenceRecord.pod_namespace, InferenceRecord.container_name,
                                InferenceRecord.attributes)).all()
    assert {(uid, ns, c) for uid, ns, c, _a in rows} == {("0b6f7a52-6c5e-4a8e-9a57-0b8c1f2a3d4e", "risk-inference", "api")}
    assert {a["envelope.restart_count"] for *_x, a in rows} == {3}
    assert _ingest(database_url, live) == {"read": 200, "stored": 0, "duplicates": 200, "conflicts": 0,
                                           "quarantined": 0, "pan_masked": 0}


def test_a_containers_link_to_another_pods_file_gives_no_uid(tmp_path, database_url, sessions):
    d = tmp_path / POD_DIR
    d.mkdir(parents=True)
    (d / "0.log").write_text(_cri(1, _ecs("LX-1", 1)))
    containers = tmp_path / "var/log/containers"
    containers.mkdir(parents=True)
    link = containers / f"other-pod-5d4f9-abcde_risk-inference_api-{'cd' * 32}.log"
    link.symlink_to(d / "0.log")
    assert _ingest(database_url, link)["stored"] == 1
    with sessions() as s:
        assert s.execute(select(InferenceRecord.pod_name, InferenceRecord.pod_uid)).one() == ("other-pod-5d4f9-abcde", None)


def test_a_containers_link_through_the_pods_name_to_a_docker_file_carries_the_pod_uid(tmp_path, database_url, sessions):
    """With the docker engine (cri-dockerd) the chain is two links long: /var/log/containers/X.log →
    /var/log/pods/<ns>_<pod>_<uid>/<c>/0.log → /var/lib/docker/containers/<id>/<id>-json.log; the
    final file's name has no uid, the middle one does (the final tester's finding)."""
    docker = tmp_path / "var/lib/docker/containers" / ("ef" * 32)
    docker.mkdir(parents=True)
    target = docker / f"{'ef' * 32}-json.log"
    target.write_text(json.dumps({"log": _ecs("DK-1", 1) + "\n", "stream": "stdout",
                                  "time": "2025-11-29T08:00:01.200000000Z"}) + "\n")
    pods = tmp_path / POD_DIR
    pods.mkdir(parents=True)
    (pods / "0.log").symlink_to(target)
    containers = tmp_path / "var/log/containers"
    containers.mkdir(parents=True)
    link = containers / f"fraud-api-7c9d8-x2x4q_risk-inference_api-{'ef' * 32}.log"
    link.symlink_to(pods / "0.log")
    assert _ingest(database_url, link)["stored"] == 1
    assert _ingest(database_url, pods / "0.log")["duplicates"] == 1
    with sessions() as s:
        assert s.execute(select(InferenceRecord.pod_uid)).scalar_one() == "0b6f7a52-6c5e-4a8e-9a57-0b8c1f2a3d4e"
