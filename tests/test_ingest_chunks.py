"""Reading the input in chunks (``pipeline.iter_chunks``) for the parse workers (``parse_pool``).

``iter_chunks`` must give exactly the lines of the reference reader (``tests/line_reader.iter_lines``) — numbers, bytes, truncation totals,
OTLP request lines kept whole — whatever the sizes the stream hands out; and the pool must answer
in input order and fail loudly, never hang, when a worker does.
"""

from __future__ import annotations

import io
import os
import random
import signal

import pytest

from collector.ingest import parse_pool, pipeline
from collector.ingest.parser import LineParser
from collector.ingest.pipeline import iter_chunks
from tests.line_reader import chunk_from_lines, iter_lines


class _Trickle(io.RawIOBase):
    """A stream whose reads return a random number of bytes (1 to ``most``), as a pipe or a gzip reader may."""

    def __init__(self, data: bytes, rnd: random.Random, most: int) -> None:
        super().__init__()
        self._data, self._pos, self._rnd, self._most = data, 0, rnd, most

    def readable(self) -> bool:
        return True

    def read1(self, n: int = -1) -> bytes:
        size = min(n if n >= 0 else len(self._data), self._rnd.randint(1, self._most))
        out = self._data[self._pos:self._pos + size]
        self._pos += len(out)
        return out

    def readinto(self, buffer) -> int:
        out = self.read1(len(buffer))
        buffer[:len(out)] = out
        return len(out)


def _lines_of_chunks(chunks) -> list[tuple[int, bytes, int | None]]:
    return [line for chunk in chunks for line in chunk.lines()]


def _expected(data: bytes, max_line: int, max_doc: int | None, is_doc) -> list[tuple[int, bytes, int | None]]:
    # what ingest_stream made of iter_lines before: total None where nothing was cut off
    return [(n, d, None if t == len(d) else t)
            for n, (d, t) in enumerate(iter_lines(io.BytesIO(data), max_line, max_document_bytes=max_doc,
                                                  is_document=is_doc), start=1)]


def _random_input(rnd: random.Random, max_line: int, max_doc: int) -> bytes:
    lines = []
    for _ in range(rnd.randint(0, 40)):
        size = rnd.choice([0, 1, max_line - 1, max_line, max_line + 1, max_line + 2, max_doc - 1, max_doc,
                           max_doc + 1, max_doc + 2, rnd.randint(0, 3 * max_doc)])
        body = bytes(rnd.choice(b"ab{ \r\t\x00\xff") for _ in range(size))
        lines.append(body)
    data = b"\n".join(lines)
    return data + (b"\n" if lines and rnd.random() < 0.5 else b"")


@pytest.mark.parametrize("seed", range(6))
def test_chunks_hold_exactly_the_lines_iter_lines_reads(monkeypatch, seed):
    rnd = random.Random(seed)
    monkeypatch.setattr(parse_pool, "CHUNK_LINES", rnd.choice([1, 3, 7, 1000]))
    monkeypatch.setattr(parse_pool, "CHUNK_BYTES", rnd.choice([1, 50, 8 << 20]))
    monkeypatch.setattr(pipeline, "READ_BYTES", rnd.choice([1, 5, 64, 1 << 20]))
    is_doc = lambda head: head.startswith(b"{")  # noqa: E731 - an OTLP request line's test
    for _ in range(150):
        max_line = rnd.randint(1, 12)
        max_doc = rnd.choice([max_line - 1, max_line, max_line + rnd.randint(1, 30)])
        data = _random_input(rnd, max_line, max(max_doc, 1))
        for doc in (None, max_doc):
            want = _expected(data, max_line, doc, is_doc)
            chunks = list(iter_chunks(_Trickle(data, rnd, rnd.choice([1, 3, 100])), max_line,
                                      max_document_bytes=doc, is_document=is_doc))
            assert _lines_of_chunks(chunks) == want, (data, max_line, doc)
            assert all(c.lines() for c in chunks)
            # consecutive numbering, and the chunk limits as next_chunk kept them
            for c in chunks:
                lines = c.lines()
                assert c.first == lines[0][0] and c.nbytes == sum(len(d) for _, d, _ in lines)
                assert len(lines) <= parse_pool.CHUNK_LINES
                assert sum(len(d) for _, d, _ in lines[:-1]) < parse_pool.CHUNK_BYTES


def test_chunks_are_bounded_in_lines_and_in_bytes(monkeypatch):
    monkeypatch.setattr(parse_pool, "CHUNK_LINES", 10)
    monkeypatch.setattr(parse_pool, "CHUNK_BYTES", 100)
    data = b"".join(b"x" * size + b"\n" for size in [40, 40, 40, 5, 500, 1, 1])
    chunks = list(iter_chunks(io.BytesIO(data), 1000))
    assert [[n for n, _, _ in c.lines()] for c in chunks] == [[1, 2, 3], [4, 5], [6, 7]]


def test_a_long_line_is_truncated_without_reading_it_whole(monkeypatch):
    """A 10 MB line: the chunk keeps its first max_line_bytes + 1 bytes and its length, and the
    reader never holds more than one read of it."""
    monkeypatch.setattr(pipeline, "READ_BYTES", 64 << 10)
    data = b'{"a":1}\n' + b"y" * (10 << 20) + b"\nlast"
    [chunk] = list(iter_chunks(io.BytesIO(data), 1000))
    assert chunk.lines() == [(1, b'{"a":1}', None), (2, b"y" * 1001, 10 << 20), (3, b"last", None)]
    assert len(chunk.text) < 2000


def test_an_otlp_request_line_stays_whole_up_to_the_document_limit():
    parser = LineParser()
    request = b'{"resourceLogs":[' + b" " * 5000 + b"]}"
    data = request + b"\n" + b'{"x":"' + b"z" * 5000 + b'"}\n'
    lines = _lines_of_chunks(iter_chunks(io.BytesIO(data), 1000, max_document_bytes=10_000,
                                         is_document=parser.reads_documents))
    assert lines == [(1, request, None), (2, data.split(b"\n")[1][:1001], 5008)]


def test_chunk_from_lines_round_trips():
    lines = [(7, b"a", None), (8, b"", None), (9, b"b" * 5, 900), (10, b"c", None)]
    chunk = chunk_from_lines(lines)
    assert chunk.lines() == lines and chunk.first == 7 and chunk.nbytes == 7


def _fluent_chunks(count: int, size: int) -> list[parse_pool.Chunk]:
    from tests.test_ingest_fastpath import NESTED, fluent

    line = fluent(NESTED).encode("utf-8")
    return [chunk_from_lines([(k * size + i, line.replace(b"T-1", b"T-%d" % (k * size + i)), None)
                                         for i in range(1, size + 1)]) for k in range(count)]


def test_answers_come_back_in_input_order_from_several_workers():
    chunks = _fluent_chunks(9, 50)
    pool = parse_pool.ParsePool(3, {"cluster": "c"})
    try:
        handles = [pool.submit("/var/log/app.log", c) for c in chunks]
        positions = [int(u[1]) for h in handles for u in h.get().units]
    finally:
        pool.close()
    assert positions == list(range(1, 451))


def test_a_worker_that_raises_is_reported_with_its_traceback(monkeypatch):
    monkeypatch.setattr(parse_pool, "parse_chunk", lambda source, chunk: 1 / 0)  # inherited by the forked worker
    pool = parse_pool.ParsePool(1, {"cluster": "c"})
    try:
        handle = pool.submit("app.log", _fluent_chunks(1, 2)[0])
        with pytest.raises(parse_pool.WorkerFailed, match="ZeroDivisionError"):
            handle.get()
    finally:
        pool.close()


def test_a_worker_killed_mid_run_fails_the_run_instead_of_hanging():
    """multiprocessing.Pool replaced a killed worker and its chunk's answer never came: a hang."""
    pool = parse_pool.ParsePool(2, {"cluster": "c"})
    try:
        first = pool.submit("app.log", _fluent_chunks(1, 2)[0])
        first.get()
        os.kill(pool.pids[1], signal.SIGKILL)  # the out-of-memory killer, say
        pool._processes[1].join()
        with pytest.raises(parse_pool.WorkerFailed, match=r"ended .*exit code -9"):
            pool.submit("app.log", _fluent_chunks(1, 2)[0]).get()  # the killed worker's turn
    finally:
        pool.close()
    assert pool.pids == []
