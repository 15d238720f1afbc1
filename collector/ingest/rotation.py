"""Kubelet container log rotation: which input files are one log stream, and in which order.

The kubelet rotates a container's log ``…/<container>/<restart>.log`` by renaming it to
``<log>.<YYYYMMDD-HHMMSS>`` (Go layout ``20060102-150405``, the time of the rotation) and asking
the runtime to reopen the log; older rotated files are gzipped to ``<log>.<timestamp>.gz``
(kubernetes ``pkg/kubelet/logs/container_log_manager.go``: ``rotateLatestLog``, ``compressLog``;
``GetAllLogs`` lists them oldest first: the rotated files sorted by name, then the live log).

A CRI line longer than the runtime's buffer is written as ``P`` chunks and a final ``F`` chunk
(log-formats.md §2.1); a rotation between two chunks leaves the first ones at the end of the rotated
file and the rest at the start of its successor. Reading the files of one stream oldest first,
as one stream, joins them again (``LineParser`` keys partial lines by ``log_stream``).
"""

from __future__ import annotations

import re
from typing import Sequence

# <live log>.<YYYYMMDD-HHMMSS>[.gz]; the live log's own name is anything ending in ".log"
_ROTATED = re.compile(r"^(?P<live>.+\.log)\.(?P<stamp>\d{8}-\d{6})(?:\.gz)?$")


def log_stream(source: str) -> str:
    """The live log a file belongs to: ``source`` without a kubelet rotation suffix
    (``/var/log/pods/…/api/0.log.20251129-081500.gz`` → ``/var/log/pods/…/api/0.log``); any
    other source (a live log, ``stdin``, ``http:body-<digest>``) is its own stream."""
    m = _ROTATED.match(source)
    return m.group("live") if m else source


def _age(source: str) -> tuple[int, str]:
    """Sort key within one stream: rotated files by their timestamp (the kubelet's name order,
    which is time order), the live log last."""
    m = _ROTATED.match(source)
    return (0, m.group("stamp")) if m else (1, "")


def in_rotation_order(sources: Sequence[str]) -> list[int]:
    """Indexes of ``sources`` in reading order: the files of one log stream (``log_stream``)
    together, oldest first, where the stream's first file was given; every other input keeps its
    place. A shell glob gives ``0.log`` before ``0.log.20251129-081500``: newest first.

    Example: ``["b/0.log", "a.log", "b/0.log.20251129-091500.gz", "b/0.log.20251129-081500"]``
    → ``[3, 2, 0, 1]`` (the stream ``b/0.log`` oldest first, then ``a.log``).
    """
    groups: dict[str, list[int]] = {}
    for i, source in enumerate(sources):
        groups.setdefault(log_stream(source), []).append(i)
    order: list[int] = []
    for members in groups.values():  # dicts keep insertion order: a stream where its first file was given
        order.extend(sorted(members, key=lambda i: _age(sources[i])))
    return order


def continues(source: str, following: str | None) -> bool:
    """True when the input ``following`` (None: nothing follows) is the next file of ``source``'s
    log stream: a partial line left open at the end of ``source`` may end there."""
    return following is not None and following != source and log_stream(following) == log_stream(source)
