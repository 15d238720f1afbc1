"""Parse workers keep the memory they free (glibc ``mallopt``), so chunk after chunk is not faulted in again."""

from __future__ import annotations

import platform
import resource
import subprocess
import sys

import pytest

from collector.ingest import parse_pool
from tests.line_reader import chunk_from_lines
from tests.test_ingest_fastpath import NESTED, fluent

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_a_worker_process_sets_its_malloc_to_keep_freed_memory():
    # in a fresh process: the setting is process-wide and lasts
    out = subprocess.run([sys.executable, "-c", "from collector.ingest import parse_pool as p; print(p._keep_freed_memory())"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_workers_fault_in_fewer_pages_than_they_parse_lines():
    """30 chunks of 1 000 Fluent Bit lines (1.4 MB each): with glibc's defaults every chunk's buffers
    were returned to the kernel and faulted in again (~1.3 minor faults per line measured); kept,
    the faults are those of the first chunks only."""
    line = fluent(NESTED).encode("utf-8")
    chunk = chunk_from_lines([(n, line, None) for n in range(1, 1001)])
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    pool = parse_pool.ParsePool(1, {"cluster": "c"})
    try:  # two chunks in flight at a time, as a run keeps a few (its in-flight bytes are bounded)
        pending = [pool.submit("/var/log/app.log", chunk)]
        units = []
        for _ in range(29):
            pending.append(pool.submit("/var/log/app.log", chunk))
            units += pending.pop(0).get().units
        units += pending.pop(0).get().units
    finally:
        pool.close()
    faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before
    assert len(units) == 30_000 and all(u[2] is not None for u in units)
    assert faults < 0.4 * len(units), faults


def test_workers_run_nicer_than_the_writer():
    """The writer commits; the workers yield the CPU to it (and to the watcher) when both want it."""
    import os

    pool = parse_pool.ParsePool(1, {"cluster": "c"})
    try:
        pool.submit("app.log", chunk_from_lines([(1, b"{}", None)])).get()  # the worker is set up
        worker_nice = os.getpriority(os.PRIO_PROCESS, pool.pids[0])
    finally:
        pool.close()
    assert worker_nice == os.nice(0) + parse_pool.WORKER_NICENESS
