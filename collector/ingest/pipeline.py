"""One ingest run: input streams → ``LineParser`` → ``write_batch`` → counts that reconcile.

``read = stored + duplicates + quarantined`` for every run (``conflicts`` are stored rows
flagged ``conflict``). A unit is one input line — a CRI ``P…F`` group counts once, an OTLP
request counts one unit per LogRecord, an HTTP JSON array one per element; blank lines are not
units.

Two commit modes: per group of batches (CLI: ``commit_units`` units, written ``batch_size`` at a
time, then one commit — on SQLite five batches, on PostgreSQL one; a crash loses at most the
uncommitted group, and a rerun stores exactly those lines, finding the committed ones as
duplicates) and one transaction per run (HTTP: the shipper gets 2xx only after everything of its
request is committed, so a retry can never lose data).
"""

from __future__ import annotations

import gc
import gzip
import io
import itertools
import uuid
import zlib
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from sqlalchemy.orm import Session, sessionmaker

from collector.errors import UserError
from collector.ingest import metrics, parse_pool
from collector.ingest.aliases import AliasTable
from collector.ingest.parser import LineParser, Outcome
from collector.ingest.writer import reason_slug, write_batch
from collector.settings import Settings

DEFAULT_BATCH_SIZE = 2000
# Units per transaction in per-batch mode (CLI) on SQLite: five batches, then one commit. Measured (SQLite,
# 50 k Fluent Bit lines, writer only): a commit per 2 000 units cost 25 ms each, a third of the
# writer's time — every commit of that size crossed SQLite's WAL autocheckpoint (1 000 pages), so
# each one also checkpointed, and the random-order dedup_key index pages were rewritten to the WAL
# and checkpointed once per batch instead of once per group; per 10 000 units: -15 % writer CPU.
# Not on PostgreSQL, which commits every batch: a commit there costs little, a longer transaction
# holds the ledger's advisory lock (taken before each batch's lookup, ``writer.write_batch``) for
# longer against concurrent HTTP requests, and 10 000 units per commit measured slower (100 k
# Fluent Bit lines: 13.3-13.7 s against 9.2-11.0 s per 2 000). (Taking the lock before the lookup
# also ended the deadlock that once made several batches per transaction unsafe there.)
DEFAULT_COMMIT_UNITS = 10_000
AHEAD_UNITS = 10_000  # lines handed to parse workers beyond 2 chunks per worker (see _ingest_chunks)
IN_FLIGHT_BYTES = 64 << 20  # input bytes of the chunks handed to parse workers and not taken back yet
GC_YOUNG_THRESHOLD = 10_000  # allocations between young collections during a parallel run (Python's default: 700)
_GZIP_MAGIC = b"\x1f\x8b"
# What reading a truncated or corrupt gzip stream raises (``gzip._GzipReader.read`` returns every
# byte it can decompress first and raises only when no more can be produced).
READ_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


@dataclass
class IngestCounts:
    """Counts of one run; ``reasons`` tallies quarantine reason slugs (text before the colon)."""

    read: int = 0
    stored: int = 0
    duplicates: int = 0
    conflicts: int = 0
    quarantined: int = 0
    pan_masked: int = 0
    reasons: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, int]:
        """The six reconciling counts, in the order the CLI prints them."""
        return {"read": self.read, "stored": self.stored, "duplicates": self.duplicates,
                "conflicts": self.conflicts, "quarantined": self.quarantined, "pan_masked": self.pan_masked}

    @property
    def reconciles(self) -> bool:
        """``read == stored + duplicates + quarantined``."""
        return self.read == self.stored + self.duplicates + self.quarantined


READ_BYTES = 1 << 20  # one read of the input by iter_chunks


def iter_chunks(stream: BinaryIO, max_line_bytes: int, *, max_document_bytes: int | None = None,
                is_document: Callable[[bytes], bool] | None = None, first_line: int = 1) -> Iterator[parse_pool.Chunk]:
    """The lines of ``stream`` as ``parse_pool.Chunk`` s of ``parse_pool.CHUNK_LINES`` lines (fewer
    once they hold ``parse_pool.CHUNK_BYTES`` bytes, at least one line), numbered from 1.

    The lines and their ``(data, total)`` are exactly those of a ``readline`` loop (the reference
    reader ``tests/line_reader.py``; ``tests/test_ingest_chunks.py`` compares the two on random
    inputs and read sizes), found by searching ``READ_BYTES`` reads for newlines instead of a
    ``readline`` and a tuple per line: a run of ordinary lines goes into the chunk as one slice.
    Memory stays bounded: of a line over ``max_line_bytes`` only its first ``max_line_bytes + 1``
    bytes are kept, the rest is read in ``READ_BYTES`` pieces and only counted; a line whose first
    ``max_line_bytes + 1`` bytes satisfy ``is_document`` (an OTLP export request:
    ``LineParser.reads_documents``) is kept whole up to ``max_document_bytes``.
    """
    chunk_lines, chunk_bytes = parse_pool.CHUNK_LINES, parse_pool.CHUNK_BYTES
    documents = max_document_bytes is not None and max_document_bytes > max_line_bytes and is_document is not None
    read = getattr(stream, "read1", None) or stream.read
    buf, pos, eof, number = b"", 0, False, first_line
    while True:
        parts: list[bytes] = []
        special: dict[int, tuple[bytes, int | None]] | None = None
        start = pos  # the run of ordinary lines not yet in parts is buf[start:pos]
        count = size = 0
        while count < chunk_lines and size < chunk_bytes:
            end = buf.find(b"\n", pos)
            if end < 0:
                if not eof and len(buf) - pos <= max_line_bytes:  # this line may still be ordinary: read on
                    more = read(READ_BYTES)
                    if not more:
                        eof = True
                        continue
                    parts.append(buf[start:pos])
                    buf, pos, start = buf[pos:] + more, 0, 0
                    continue
                if eof:
                    if pos == len(buf):
                        break  # the end of the input
                    end = len(buf)  # the last line, without a newline
            if 0 <= end and end - pos <= max_line_bytes:  # an ordinary line: the run grows
                size += end - pos
                count += 1
                if end == len(buf):
                    parts.append(buf[start:end] + b"\n")
                    start = pos = end
                else:
                    pos = end + 1
                continue
            parts.append(buf[start:pos])
            data, total, buf, pos, eof = _long_line(buf, pos, eof, read, max_line_bytes,
                                                    max_document_bytes if documents else None, is_document)
            parts.append(b"\n")
            if special is None:
                special = {}
            special[count] = (data, None if total == len(data) else total)
            size += len(data)
            count += 1
            start = pos
        if count == 0:
            return
        parts.append(buf[start:pos])
        yield parse_pool.Chunk(number, b"".join(parts), special, size)
        number += count
        buf, pos = buf[pos:], 0


def _long_line(buf: bytes, pos: int, eof: bool, read: Callable[[int], bytes], max_line_bytes: int,
               max_document_bytes: int | None, is_document: Callable[[bytes], bool] | None
               ) -> tuple[bytes, int, bytes, int, bool]:
    """The line at ``buf[pos:]`` that is longer than ``max_line_bytes`` (at least ``max_line_bytes
    + 1`` of its bytes are in ``buf``), as the reference reader gives it: ``(data, total bytes, buf, pos,
    eof)`` with ``buf[pos:]`` what follows its newline. ``max_document_bytes``: None when no line
    is kept whole as a document."""
    limit = max_line_bytes + 1
    head = buf[pos:pos + limit]
    if max_document_bytes is not None and is_document(head):  # type: ignore[misc]
        # read on to max_document_bytes + 1 bytes, its newline included
        while buf.find(b"\n", pos, pos + max_document_bytes + 1) < 0 and len(buf) - pos <= max_document_bytes \
                and not eof:
            more = read(READ_BYTES)
            if more:
                buf = buf[pos:] + more
                pos = 0
            else:
                eof = True
        end = buf.find(b"\n", pos, pos + max_document_bytes + 1)
        if end >= 0:
            return buf[pos:end], end - pos, buf, end + 1, eof
        if eof and len(buf) - pos <= max_document_bytes:
            return buf[pos:], len(buf) - pos, b"", 0, eof
    counted = 0  # the bytes of the line before buf[pos:]
    while True:
        end = buf.find(b"\n", pos)
        if end >= 0:
            return head, counted + end - pos, buf, end + 1, eof
        counted += len(buf) - pos
        if eof:
            return head, counted, b"", 0, eof
        buf, pos = read(READ_BYTES), 0
        if not buf:
            eof = True


class EndAtReadError(io.RawIOBase):
    """A readable stream that ends where reading ``inner`` fails (a truncated or corrupt .gz):
    everything before that point is read; ``error`` then holds the exception (None otherwise)."""

    def __init__(self, inner: BinaryIO) -> None:
        super().__init__()
        self._inner = inner
        self.error: BaseException | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self.error is not None:
            return 0
        try:  # read1: one read of the decompressor, so nothing decompressed is lost when the next fails
            data = self._inner.read1(len(buffer))
        except READ_ERRORS as exc:
            self.error = exc
            return 0
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self._inner.close()
        super().close()


def read_error(stream: BinaryIO) -> BaseException | None:
    """The exception that ended ``stream`` (from ``open_input``) early, or None when it was read to its end."""
    raw = getattr(stream, "raw", None)
    return raw.error if isinstance(raw, EndAtReadError) else None


def open_input(path: str) -> tuple[BinaryIO, Callable[[], int], int | None]:
    """Open ``path`` (``-`` = stdin) for reading, transparently gunzipping (by magic bytes).

    A gzip stream that is truncated or corrupt ends where it stops being readable; what came
    before is read as usual and ``read_error(stream)`` tells the caller afterwards.

    Returns:
        ``(stream, position, size)``: ``position()`` gives the bytes consumed of the underlying
        file (for progress), ``size`` its length when known.

    Raises:
        UserError: the file cannot be opened, or its first read fails.
    """
    if path == "-":
        raw: BinaryIO = sys_stdin_buffer()
        size = None
    else:
        try:
            raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
            size = Path(path).stat().st_size
        except OSError as exc:
            raise UserError(f"{path}: cannot open it ({exc.strerror}); give a readable log file, a .gz, or - for stdin") from None
    buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw)  # type: ignore[arg-type]
    try:
        head = buffered.peek(2)[:2]
    except OSError as exc:  # an I/O error on the first read (a failing disk, a stale NFS handle)
        buffered.close()
        raise UserError(f"{'stdin' if path == '-' else path}: cannot read it ({exc.strerror or exc}); give a "
                        "readable log file, a .gz, or - for stdin") from None

    def position() -> int:
        try:
            return buffered.tell()
        except (OSError, ValueError):
            return 0

    if head == _GZIP_MAGIC:
        gunzipped = EndAtReadError(gzip.GzipFile(fileobj=buffered, mode="rb"))  # type: ignore[arg-type]
        return io.BufferedReader(gunzipped, 1 << 20), position, size  # type: ignore[return-value]
    return buffered, position, size


def sys_stdin_buffer() -> BinaryIO:
    """Standard input as a binary stream (separate so tests can substitute it)."""
    import sys

    return sys.stdin.buffer


class IngestRun:
    """Parse inputs, write batches, keep the counts.

    Args:
        session_factory: sessions on a migrated store.
        settings: ``ingest_max_line_bytes``, ``ingest_default_tz`` and ``cluster`` are used.
        forced_format: ``--format`` (None/``auto`` = detect per line).
        aliases: alias table (defaults when None).
        cluster: overrides ``settings.cluster``.
        one_transaction: write everything at ``finish()`` in one transaction (HTTP) instead of
            committing every ``commit_units`` units.
        batch_size: units per ``write_batch`` call (one dedupe lookup, one insert statement).
        commit_units: units per transaction in per-batch mode (None: ``DEFAULT_COMMIT_UNITS`` on
            SQLite, ``batch_size`` otherwise; at least ``batch_size``).
        run_id: stored in every row; a new UUID when None.
        workers: parse worker processes for ``ingest_stream`` (``parse_pool``); None = one per
            CPU (at most ``parse_pool.MAX_WORKERS``); 1 = parse in this process. Used only once an
            input has more than ``parse_pool.CHUNK_LINES`` lines, and never with
            ``one_transaction`` (HTTP requests are small and served from threads).

    Call ``finish()`` at the end (it also stops the workers); ``close()`` stops them without
    writing.
    """

    def __init__(self, session_factory: sessionmaker[Session], settings: Settings, *, forced_format: str | None = None,
                 aliases: AliasTable | None = None, cluster: str | None = None, one_transaction: bool = False,
                 batch_size: int = DEFAULT_BATCH_SIZE, run_id: str | None = None, workers: int | None = None,
                 commit_units: int | None = None) -> None:
        self.sessions = session_factory
        self.settings = settings
        self.run_id = run_id or uuid.uuid4().hex
        self._parser_kwargs = dict(aliases=aliases, default_tz=settings.ingest_default_tz,
                                   cluster=cluster or settings.cluster, max_line_bytes=settings.ingest_max_line_bytes,
                                   max_document_bytes=settings.ingest_max_body_bytes, forced=forced_format,
                                   pan_token_key=settings.resolved_pan_token_key())
        self.parser = LineParser(**self._parser_kwargs)
        self.workers = 1 if one_transaction else (workers if workers is not None else parse_pool.default_workers())
        self._pool: parse_pool.ParsePool | None = None
        self.one_transaction = one_transaction
        self.batch_size = batch_size
        if commit_units is None:
            bind = getattr(session_factory, "kw", {}).get("bind")
            sqlite = bind is not None and bind.dialect.name == "sqlite"
            commit_units = DEFAULT_COMMIT_UNITS if sqlite else batch_size
        self.commit_units = max(batch_size, commit_units)
        self.counts = IngestCounts()
        self.quarantined_sources: Counter = Counter()  # source → units refused from it (the CLI's hint)
        self._pending: list[Outcome] = []
        self._pan_reported = 0

    def add(self, outcomes: Iterable[Outcome]) -> None:
        """Queue outcomes; in per-batch mode ``commit_units`` queued units are written (in batches)
        and committed."""
        for o in outcomes:
            self.counts.read += 1
            if o.reason:
                self.counts.reasons[reason_slug(o.reason)] += 1
                self.quarantined_sources[o.source] += 1
            self._pending.append(o)
        if not self.one_transaction and len(self._pending) >= self.commit_units:
            self._write(self._pending)
            self._pending = []

    def ingest_stream(self, stream: BinaryIO, source: str, on_line: Callable[[], None] | None = None, *,
                      first_line: int = 1) -> None:
        """Every line of ``stream`` (``source`` names it in rows: a path, ``stdin``, ``http:body-<digest>``),
        numbered from ``first_line`` (the rest of an input after a JSON array).

        The input is read in chunks (``iter_chunks``). With parse workers, the first chunk is parsed
        here; the rest go to the workers (a few chunks ahead) and come back in input order. A chunk
        whose start or end is inside a partial line is re-parsed here, so every line's outcome is
        the one sequential parsing gives (see ``parse_pool``). ``on_line`` is called after each chunk.
        """
        chunks = iter_chunks(stream, self.parser.max_line_bytes, max_document_bytes=self.parser.max_document_bytes,
                             is_document=self.parser.reads_documents, first_line=first_line)
        for chunk in chunks:
            self._parse_here(chunk, source)
            if on_line is not None:
                on_line()
            if self.workers > 1:
                break  # the first chunk: an input no longer than that starts no worker
        rest = next(chunks, None)
        if rest is not None:
            self._ingest_parallel(itertools.chain((rest,), chunks), source, on_line)

    def _parse_here(self, chunk: parse_pool.Chunk, source: str) -> None:
        feed = self.parser.feed_bytes
        for n, data, total in chunk.lines():
            self.add(feed(data, source, str(n), total))

    def _ingest_parallel(self, chunks: Iterator[parse_pool.Chunk], source: str, on_line: Callable[[], None] | None) -> None:
        # The garbage collector took ~20 % of this process's CPU at 50 k lines (1.1 s): every chunk
        # unpickles ~30 k objects, and its full passes also walked everything that existed before
        # the run (imports, the engine, the caller's objects). While the run lasts, those stay out
        # of its sight (freeze; unfreeze puts them back) and it runs less often (measured: 0.2 s).
        # Process-wide, so only for the duration of this CLI-sized path, restored afterwards (a
        # caller that froze objects itself keeps its own freeze: then we neither freeze nor unfreeze).
        thresholds = gc.get_threshold()
        freeze = gc.get_freeze_count() == 0
        if freeze:
            gc.freeze()
        gc.set_threshold(max(thresholds[0], GC_YOUNG_THRESHOLD), max(thresholds[1], 50), max(thresholds[2], 100))
        try:
            self._ingest_chunks(chunks, source, on_line)
        finally:
            gc.set_threshold(*thresholds)
            if freeze:
                gc.unfreeze()

    def _ingest_chunks(self, chunks: Iterator[parse_pool.Chunk], source: str, on_line: Callable[[], None] | None) -> None:
        if self._pool is None:
            self._pool = parse_pool.ParsePool(self.workers, self._parser_kwargs, self.parser.streams)
        # Chunks submitted ahead of the one taken next: enough for the workers to keep parsing while
        # this process writes and commits a whole group (``commit_units``), bounded in bytes. With
        # 2 × workers chunks ahead the workers finished them during the write and waited (measured,
        # 100 k Fluent Bit lines, SQLite, 2 CPUs: 6.9-7.6 s -> 5.3 s wall, the same CPU time).
        ahead = 2 * self.workers + -(-max(self.commit_units, AHEAD_UNITS) // parse_pool.CHUNK_LINES)
        in_flight: deque[tuple[parse_pool.Chunk, Any]] = deque()
        in_flight_bytes = 0
        while True:
            chunk = next(chunks, None)
            if chunk is not None:
                in_flight.append((chunk, self._pool.submit(source, chunk)))
                in_flight_bytes += chunk.nbytes
            if in_flight and (chunk is None or len(in_flight) > 2 * self.workers
                              and (len(in_flight) > ahead or in_flight_bytes > IN_FLIGHT_BYTES)):
                done, handle = in_flight.popleft()
                in_flight_bytes -= done.nbytes
                self._take(done, handle.get(), source)
                if on_line is not None:
                    on_line()
            if chunk is None and not in_flight:
                return

    def _take(self, chunk: parse_pool.Chunk, parsed: parse_pool.ParsedChunk, source: str) -> None:
        if self.parser.has_pending_partials or parsed.open_partial:
            self._parse_here(chunk, source)  # a partial line spans the chunk's edge: parse it here, in order
            return
        self.parser.masker.masked += parsed.pan_masked
        self.parser.builder.logged_after_written += parsed.logged_after_written
        self.add(parsed.outcomes())

    def end_source(self, source: str, *, continued: bool = False) -> None:
        """The input ``source`` ended: its open partial lines are quarantined unless the next input
        continues its log stream (``LineParser.end_of_source``)."""
        self.add(self.parser.end_of_source(source, continued=continued))

    def close(self) -> None:
        """Stop the parse workers, if any were started."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def finish(self) -> IngestCounts:
        """Quarantine unfinished partial lines, write what is pending, stop the workers, return the counts."""
        self.close()
        self.add(self.parser.finish())
        if self._pending:
            self._write(self._pending)
            self._pending = []
        return self.counts

    def _write(self, outcomes: list[Outcome]) -> None:
        now = datetime.now(timezone.utc)
        received_ns = int(now.timestamp()) * 1_000_000_000 + now.microsecond * 1000
        with self.sessions() as session:
            results = [write_batch(session, outcomes[i:i + self.batch_size], run_id=self.run_id,
                                   received_ns=received_ns, received_at=now)
                       for i in range(0, len(outcomes), self.batch_size)]
            session.commit()
        pan = self.parser.masker.masked
        stored = sum(r.stored for r in results)
        dups = sum(r.duplicates for r in results)
        quar = sum(r.quarantined for r in results)
        conf = sum(r.conflicts for r in results)
        self.counts.stored += stored
        self.counts.duplicates += dups
        self.counts.quarantined += quar
        self.counts.conflicts += conf
        self.counts.pan_masked = pan
        metrics.observe(stored, dups, quar, conf, pan - self._pan_reported)
        self._pan_reported = pan
