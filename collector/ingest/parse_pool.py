"""Parsing input lines in worker processes while the ingest run writes (large CLI inputs).

Parsing is pure CPU work per line and the writer's work is per batch, so a long input is cut into
chunks of ``CHUNK_LINES`` lines (fewer past ``CHUNK_BYTES``) that worker processes parse (each with
its own ``LineParser``) while the run writes the chunks already parsed, in input order. The outcome of every line is the
one the run's own parser would give, because the only state a parser carries from one line to
the next is an unfinished partial line (CRI ``P`` chunks, Fluent Bit ``_p``, docker json-file
without ``\\n``); the PAN counter is a sum. So a worker's chunk is used only when the run's
parser holds no partial line at the chunk's start and the worker holds none at its end;
otherwise the run re-parses that chunk itself, in order (``IngestRun.ingest_stream``).

Outcomes cross the process boundary as plain tuples (``ParsedChunk.units``; a record as its
``record.PreparedRecord`` column values): already masked, with the dedup key computed — nothing
unmasked leaves the worker, and nothing here touches disk. Tuples of strings and numbers pickle
and unpickle several times faster than the objects they stand for.
Workers are forked (POSIX ``fork`` start method): ``forkserver``/``spawn`` would re-run the
caller's ``__main__`` in every worker, which a script without an ``if __name__ == "__main__"``
guard turns into a fork bomb. A forked worker never touches the parent's database connections or
threads: it only parses, and ends with ``os._exit`` (multiprocessing's worker exit), so no
finaliser runs on inherited handles. Without ``fork`` (not POSIX) the run parses in its own process.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
from dataclasses import dataclass
from typing import Any, Iterator

from collector.ingest import fastpath
from collector.ingest.parser import LineParser, Outcome
from collector.ingest.record import PreparedRecord

CHUNK_LINES = 1000
CHUNK_BYTES = 8 << 20  # a chunk also ends once its lines hold this many bytes (OTLP request lines are large)
MAX_WORKERS = 4

_parser: LineParser | None = None


def default_workers() -> int:
    """Parse workers for a CLI run: the CPUs this process may use, at most ``MAX_WORKERS``;
    1 (parse in the run's own process) on a single CPU."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cpus))


# One outcome as it crosses the process boundary: a record ``(source, position, values, exact_json,
# leaf)`` (``PreparedRecord``'s), a rejection ``(source, position, None, None, reason, raw_text, raw_sha256)``.
Unit = tuple[Any, ...]


def _unit(o: Outcome) -> Unit:
    if o.record is not None:
        prepared = o.record.prepared()
        return o.source, o.position, prepared.values, prepared.exact_json, prepared.leaf
    return o.source, o.position, None, None, o.reason, o.raw_text, o.raw_sha256


@dataclass(slots=True)
class ParsedChunk:
    """A worker's result: one unit per outcome (``Unit``), PANs masked, and whether a partial line was left open."""

    units: list[Unit]
    pan_masked: int
    open_partial: bool

    def outcomes(self) -> list[Outcome]:
        """The outcomes, records as ``PreparedRecord``."""
        return [Outcome(u[0], u[1], record=PreparedRecord(u[2], u[3], u[4])) if u[2] is not None
                else Outcome(u[0], u[1], reason=u[4], raw_text=u[5], raw_sha256=u[6]) for u in self.units]


Line = tuple[int, bytes, "int | None"]  # (line number, bytes without newline, total bytes if truncated)


def next_chunk(lines: Iterator[Line]) -> list[Line]:
    """The next chunk of ``lines``: ``CHUNK_LINES`` lines, or fewer once they hold ``CHUNK_BYTES``
    bytes (at least one line), so that the chunks in flight stay bounded in memory; [] at the end."""
    chunk: list[Line] = []
    size = 0
    for line in lines:
        chunk.append(line)
        size += len(line[1])
        if len(chunk) >= CHUNK_LINES or size >= CHUNK_BYTES:
            break
    return chunk


# glibc ``mallopt`` parameters (malloc.h): memory freed after a chunk stays in the worker's heap
# for the next one instead of going back to the kernel and being faulted in again.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_TRIM_THRESHOLD_BYTES = 256 << 20
_MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's maximum on 64-bit; above CHUNK_BYTES, so a chunk's buffers come from the heap


def _keep_freed_memory() -> bool:
    """Make this process's glibc malloc keep freed memory (no trim below 256 MiB free, no mmap for
    blocks under 32 MiB). A worker allocates and frees a few MiB per chunk (the pickled chunk, its
    lines, the units and their pickle): with glibc's defaults each chunk's memory was returned and
    faulted in again, ~1.3 page faults per line (measured: 64 k minor faults and 0.17 s of system
    time for 50 k lines, 3 µs per line; 6 k and 0.05 s with this). True when set; False where the
    C library is not glibc (nothing changes)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)) and bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES))


# Parse workers run this much nicer than the writer: on 2 cores the writer (the process that
# commits) is the pipeline's narrow end, and a worker that waits on it had taken its core
# (100 k bench lines, SQLite, back to back: 4.58 and 4.65 s -> 4.31 and 4.34 s). It also leaves the
# watcher and the HTTP server the CPU a backfill would take.
WORKER_NICENESS = 5


def _init_worker(parser_kwargs: dict[str, Any]) -> None:
    global _parser
    _keep_freed_memory()
    try:
        os.nice(WORKER_NICENESS)
    except OSError:  # not permitted here (a seccomp profile): same work, default priority
        pass
    _parser = LineParser(**parser_kwargs)
    # Everything inherited from the parent (the store, SQLAlchemy, the caller's own objects) lives
    # as long as the worker: out of the collector's sight, full collections scan only what parsing makes.
    gc.freeze()


def parse_chunk(source: str, lines: list[Line]) -> ParsedChunk:
    """Parse ``lines`` of ``source`` in a worker (its parser starts with no partial line)."""
    parser = _parser
    assert parser is not None, "parse_chunk runs in a pool worker set up by ParsePool"
    parser.drop_pending_partials()
    masked_before = parser.masker.masked
    units: list[Unit] = []
    feed = parser.feed_bytes
    fast = fastpath.unit
    for n, data, total in lines:
        position = str(n)
        # The dominant shape in one function (``fastpath``); None: the general path, from the start.
        u = fast(parser, data, source, position) if total is None else None
        if u is not None:
            units.append(u)
            continue
        for o in feed(data, source, position, total):
            units.append(_unit(o))
    open_partial = parser.has_pending_partials
    parser.drop_pending_partials()
    return ParsedChunk(units, parser.masker.masked - masked_before, open_partial)


class ParsePool:
    """A pool of parse workers configured like the run's parser.

    Args:
        workers: number of worker processes (≥ 1).
        parser_kwargs: ``LineParser`` keyword arguments (picklable).
    """

    def __init__(self, workers: int, parser_kwargs: dict[str, Any]) -> None:
        ctx = multiprocessing.get_context("fork")
        self.workers = workers
        self._pool = ctx.Pool(workers, initializer=_init_worker, initargs=(parser_kwargs,))

    def submit(self, source: str, lines: list[Line]):
        """Start parsing a chunk; ``.get()`` on the returned handle gives its ``ParsedChunk``."""
        return self._pool.apply_async(parse_chunk, (source, lines))

    def close(self) -> None:
        """Stop the workers (pending chunks are abandoned)."""
        self._pool.terminate()
        self._pool.join()
