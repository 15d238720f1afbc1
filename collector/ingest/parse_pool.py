"""Parsing input lines in worker processes while the ingest run writes (large CLI inputs).

Parsing is pure CPU work per line and the writer's work is per batch, so a long input is cut into
chunks of ``CHUNK_LINES`` lines (fewer past ``CHUNK_BYTES``) that worker processes parse (each with
its own ``LineParser``) while the run writes the chunks already parsed, in input order. The outcome of every line is the
one the run's own parser would give, because the only state a parser carries from one line to
the next is an unfinished partial line (CRI ``P`` chunks, Fluent Bit ``_p``, docker json-file
without ``\\n``); the PAN counter is a sum. So a worker's chunk is used only when the run's
parser holds no partial line at the chunk's start and the worker holds none at its end;
otherwise the run re-parses that chunk itself, in order (``IngestRun.ingest_stream``).

A chunk's lines cross to the worker as one ``bytes`` object (``Chunk``: the writer's process
neither splits the input into lines nor pickles them one by one); outcomes cross back as plain tuples (``ParsedChunk.units``; a record as its
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
import fcntl
import gc
import multiprocessing
import os
import queue
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

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
    """A worker's result: one unit per outcome (``Unit``), PANs masked, whether a partial line was
    left open, and records whose event time is later than their runtime write time
    (``payloads.logged_after_written``)."""

    units: list[Unit]
    pan_masked: int
    open_partial: bool
    logged_after_written: int = 0

    def outcomes(self) -> list[Outcome]:
        """The outcomes, records as ``PreparedRecord``."""
        return [Outcome(u[0], u[1], record=PreparedRecord(u[2], u[3], u[4])) if u[2] is not None
                else Outcome(u[0], u[1], reason=u[4], raw_text=u[5], raw_sha256=u[6]) for u in self.units]


Line = tuple[int, bytes, "int | None"]  # (line number, bytes without newline, total bytes if truncated)


@dataclass(slots=True)
class Chunk:
    """Consecutive input lines as they cross to a worker: one ``bytes`` object, not a list of lines.

    ``text`` holds every line followed by ``\\n``, in order; a line listed in ``special`` (one
    longer than the line limit: truncated, or an OTLP request line kept whole) is an empty line in
    ``text`` and its ``(data, total)`` is in ``special`` under its index in the chunk. ``first`` is
    the first line's number, ``nbytes`` the bytes of the lines (what the in-flight bound counts).
    Made by ``pipeline.iter_chunks``; ``lines()`` gives its lines back.
    """

    first: int
    text: bytes
    special: "dict[int, tuple[bytes, int | None]] | None"
    nbytes: int

    def lines(self) -> "list[Line]":
        """``(line number, data, total or None)`` of each line, in order."""
        parts = self.text.split(b"\n")
        parts.pop()  # after the last newline
        special = self.special
        if not special:
            return list(zip(range(self.first, self.first + len(parts)), parts, [None] * len(parts)))
        return [(self.first + i, *special[i]) if i in special else (self.first + i, data, None)
                for i, data in enumerate(parts)]


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


def _init_worker(parser_kwargs: dict[str, Any], streams: dict[str, str] | None = None) -> None:
    global _parser
    _keep_freed_memory()
    try:
        os.nice(WORKER_NICENESS)
    except OSError:  # not permitted here (a seccomp profile): same work, default priority
        pass
    _parser = LineParser(**parser_kwargs)
    _parser.streams.update(streams or {})  # the run's parser's: a linked log's pod identity (``LineParser._linked``)
    # Everything inherited from the parent (the store, SQLAlchemy, the caller's own objects) lives
    # as long as the worker: out of the collector's sight, full collections scan only what parsing makes.
    gc.freeze()


def parse_chunk(source: str, chunk: Chunk) -> ParsedChunk:
    """Parse the lines of ``chunk`` of ``source`` in a worker (its parser starts with no partial line)."""
    parser = _parser
    assert parser is not None, "parse_chunk runs in a pool worker set up by ParsePool"
    parser.drop_pending_partials()
    masked_before = parser.masker.masked
    late_before = parser.builder.logged_after_written
    units: list[Unit] = []
    feed = parser.feed_bytes
    fast = fastpath.unit
    for n, data, total in chunk.lines():
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
    return ParsedChunk(units, parser.masker.masked - masked_before, open_partial,
                       parser.builder.logged_after_written - late_before)


class WorkerFailed(RuntimeError):
    """A parse worker raised (its traceback is the message) or ended without answering (``WorkerEnded``)."""


class WorkerEnded(WorkerFailed):
    """A parse worker process ended before answering: killed (the out-of-memory killer, a signal)."""


@dataclass(slots=True)
class _Failure:
    traceback: str


def _serve(tasks_in: Connection, answers_out: Connection, parser_kwargs: dict[str, Any],
           streams: dict[str, str] | None = None) -> None:
    """A worker's life: answer each chunk received with its ``ParsedChunk``, in the order received.

    A thread receives the chunks as they come, so the writer's ``send`` never waits on this
    worker's ``send`` of an answer (each would wait for the other to read: a deadlock once both
    pipes are full)."""
    _init_worker(parser_kwargs, streams)
    tasks: queue.SimpleQueue = queue.SimpleQueue()

    def receive() -> None:
        try:
            while True:
                tasks.put(tasks_in.recv())
        except (EOFError, OSError):  # the writer closed its end: stop after the chunks received
            tasks.put(None)

    threading.Thread(target=receive, name="draudit-parse-receive", daemon=True).start()
    while (task := tasks.get()) is not None:
        try:
            answer: Any = parse_chunk(*task)
        except Exception:  # noqa: BLE001 - reported to the writer, which raises WorkerFailed
            answer = _Failure(traceback.format_exc())
        try:
            answers_out.send(answer)
        except OSError:  # the writer is gone
            return


_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux; the constant is in fcntl from Python 3.10 on Linux only)
PIPE_BYTES = 1 << 20  # the default /proc/sys/fs/pipe-max-size


def _widen(conn: Connection) -> None:
    """Give the pipe under ``conn`` a ``PIPE_BYTES`` buffer where Linux allows it (64 KiB otherwise).

    A chunk (~1.5 MB) or an answer (~1.6 MB) then crosses in two writes and two reads instead of
    ~25: each read of a 64 KiB piece had the worker's receiving thread wait for the parsing thread
    to let go of the GIL (up to 5 ms), and the writer's ``send`` waited on it."""
    try:
        fcntl.fcntl(conn.fileno(), getattr(fcntl, "F_SETPIPE_SZ", _F_SETPIPE_SZ), PIPE_BYTES)
    except OSError:  # not Linux, or above the system's pipe-max-size: the default buffer
        pass


class _Answer:
    """The pending answer to one submitted chunk, received ahead by the pool's receiving thread."""

    __slots__ = ("_conn", "_process", "_done", "_value", "_error")

    def __init__(self, conn: Connection, process: Any) -> None:
        self._conn, self._process = conn, process
        self._done = threading.Event()
        self._value: Any = None
        self._error: WorkerFailed | None = None

    def _receive(self) -> None:
        """Read the answer off the worker's pipe (the receiving thread, in the order submitted)."""
        try:
            answer = self._conn.recv()
        except (EOFError, OSError):
            self._process.join(1)
            self._error = WorkerEnded(f"parse worker {self._process.pid} ended without answering "
                                      f"(exit code {self._process.exitcode})")
        else:
            if isinstance(answer, _Failure):
                self._error = WorkerFailed(f"parse worker {self._process.pid} failed:\n{answer.traceback}")
            else:
                self._value = answer
        self._done.set()

    def get(self) -> ParsedChunk:
        """The worker's ``ParsedChunk``.

        Raises:
            WorkerFailed: the worker raised while parsing, or ended (killed: out of memory…).
        """
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


def _receive_answers(pending: "queue.SimpleQueue[_Answer | None]") -> None:
    """The pool's receiving thread: each answer read and unpickled as soon as it comes, in the order
    the chunks were submitted, while the writer writes (sqlite3 and psycopg let go of the GIL while
    the database works: reading the next answer then costs the writer nothing)."""
    while (answer := pending.get()) is not None:
        answer._receive()


class ParsePool:
    """Worker processes configured like the run's parser, each fed by a pipe of its own.

    Chunks go to the workers in turn and each worker answers its chunks in the order it got them,
    so answers taken in the order submitted come back in input order; one thread of this process
    receives them ahead (``_receive_answers``). ``multiprocessing.Pool`` ran three, and its
    worker-handler thread woke at every byte of an answer waiting to be read (it waits on the
    result pipe), spinning while a 1.6 MB answer was read (measured, 100 k Fluent Bit lines: 0.4 s
    of the writer's CPU, ~10 %).

    Args:
        workers: number of worker processes (≥ 1).
        parser_kwargs: ``LineParser`` keyword arguments (picklable).
        streams: the run's parser's ``streams`` (source → the real log file), copied to each worker.
    """

    def __init__(self, workers: int, parser_kwargs: dict[str, Any], streams: dict[str, str] | None = None) -> None:
        ctx = multiprocessing.get_context("fork")
        self.workers = workers
        self._conns: list[Connection] = []  # chunks to each worker
        self._answers: list[Connection] = []  # its answers
        self._processes: list[Any] = []
        self._turn = 0
        self._pending: queue.SimpleQueue[_Answer | None] = queue.SimpleQueue()
        self._receiver: threading.Thread | None = None
        try:
            for _ in range(workers):
                tasks_in, tasks_out = ctx.Pipe(duplex=False)  # one pipe each way: a pipe's buffer can be widened
                answers_in, answers_out = ctx.Pipe(duplex=False)
                _widen(tasks_out)
                _widen(answers_out)
                process = ctx.Process(target=_serve, args=(tasks_in, answers_out, parser_kwargs, dict(streams or {})), name="draudit-parse",
                                      daemon=True)
                process.start()
                tasks_in.close()
                answers_out.close()
                self._conns.append(tasks_out)
                self._answers.append(answers_in)
                self._processes.append(process)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [p.pid for p in self._processes]

    def submit(self, source: str, chunk: Chunk) -> _Answer:
        """Hand ``chunk`` to the next worker; ``.get()`` on the returned handle gives its ``ParsedChunk``
        (take the handles in the order submitted).

        Raises:
            WorkerFailed: that worker has ended.
        """
        i = self._turn
        self._turn = (i + 1) % len(self._conns)
        try:
            self._conns[i].send((source, chunk))
        except OSError:
            process = self._processes[i]
            process.join(1)
            raise WorkerEnded(f"parse worker {process.pid} ended (exit code {process.exitcode})") from None
        answer = _Answer(self._answers[i], self._processes[i])
        if self._receiver is None:
            self._receiver = threading.Thread(target=_receive_answers, args=(self._pending,),
                                              name="draudit-parse-answers", daemon=True)
            self._receiver.start()
        self._pending.put(answer)
        return answer

    def close(self) -> None:
        """Stop the workers (chunks not answered yet are abandoned) and the receiving thread."""
        for process in self._processes:
            process.terminate()  # first: a receive in progress then ends (EOF) instead of waiting
        self._pending.put(None)
        if self._receiver is not None:
            self._receiver.join()
            self._receiver = None
        for conn in self._conns + self._answers:
            conn.close()
        for process in self._processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
        self._conns, self._answers, self._processes = [], [], []
