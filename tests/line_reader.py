"""The reference line reader of the tests: a ``readline`` loop, simple enough to be obviously right.

``pipeline.iter_chunks`` (the production reader) must give exactly its lines — numbers, bytes,
truncation totals, OTLP request lines kept whole — whatever sizes the stream hands out
(``test_ingest_chunks``). ``chunk_from_lines`` builds a ``parse_pool.Chunk`` from given lines.
"""

from __future__ import annotations

from typing import BinaryIO, Callable, Iterator

from collector.ingest import parse_pool


def iter_lines(stream: BinaryIO, max_line_bytes: int, *, max_document_bytes: int | None = None,
               is_document: Callable[[bytes], bool] | None = None) -> Iterator[tuple[bytes, int]]:
    """Physical lines of ``stream`` as ``(data, total_bytes)``, newline removed.

    Memory stays bounded: of a line longer than ``max_line_bytes`` only the first
    ``max_line_bytes + 1`` bytes are kept; the rest is read in 1 MiB pieces and only counted.
    A line whose first ``max_line_bytes + 1`` bytes satisfy ``is_document`` (an OTLP export
    request: ``LineParser.reads_documents``) is kept whole up to ``max_document_bytes``.
    """
    limit = max_line_bytes + 1
    while True:
        line = stream.readline(limit)
        if not line:
            return
        if line.endswith(b"\n"):
            yield line[:-1], len(line) - 1
            continue
        if len(line) < limit:  # last line without a newline
            yield line, len(line)
            continue
        if max_document_bytes is not None and max_document_bytes > max_line_bytes and is_document is not None \
                and is_document(line):
            line += stream.readline(max_document_bytes + 1 - len(line))
            if line.endswith(b"\n"):
                yield line[:-1], len(line) - 1
                continue
            if len(line) <= max_document_bytes:  # last line without a newline
                yield line, len(line)
                continue
        total = len(line)
        line = line[:limit]
        while True:
            more = stream.readline(1 << 20)
            if not more:
                break
            if more.endswith(b"\n"):
                total += len(more) - 1
                break
            total += len(more)
        yield line, total


def chunk_from_lines(lines: "list[parse_pool.Line]") -> parse_pool.Chunk:
    """The ``parse_pool.Chunk`` of ``lines`` — ``(line number, data, total or None)``, consecutive
    numbers, none holding ``\\n`` — as ``iter_chunks`` would make it."""
    special = {i: (data, total) for i, (_, data, total) in enumerate(lines) if total is not None}
    text = b"".join(b"\n" if i in special else data + b"\n" for i, (_, data, _t) in enumerate(lines))
    return parse_pool.Chunk(lines[0][0], text, special or None, sum(len(data) for _, data, _ in lines))
