"""The elements of one JSON array, read from a stream piece by piece: each element is one unit.
Also JSON objects written one after another (``split_json_stream``: Fluent Bit ``json_stream``,
pretty-printed objects), each object one unit.

Fluent Bit's ``http`` output with ``format json``, Vector's ``http`` sink with ``codec: json`` and
exporters that save a batch to a file write one JSON array of records, often pretty-printed over
many lines (``[{…},\n {…}]``). ``POST /v1/ingest`` (``http.py``) and ``draudit ingest FILE``
(``cli/ingest.py``) both read such an array here, so an element is positioned and quarantined the
same way in both: ``element <i>`` (1-based).

The array is split without decoding it (the ``LineParser`` decodes each element, with its duplicate
key and PAN rules): the scanner only tracks string literals (with their escapes) and bracket depth,
never recurses, and holds one element at a time, so a multi-GB file is never in memory as a whole.
No JSON library in the project's dependencies streams (the standard ``json`` and ``orjson`` decode
whole texts), hence this scanner of JSON's structural characters (RFC 8259 §2, §7).
"""

from __future__ import annotations

import re
from typing import Any, BinaryIO, Iterator

UTF8_BOM = b"\xef\xbb\xbf"  # a byte order mark some tools write before UTF-8 text; dropped
CHUNK_BYTES = 1 << 20
REST_BYTES = 65536  # of the text after the array (or an unterminated tail), kept for quarantine

# Greedy, not possessive (``*+``): CPython 3.11.2 (Debian 12's python3) matched the possessive form
# wrongly (548 of 1,200 random arrays split wrong; 3.11.7 right). Nothing follows these loops, so a
# greedy match stops at the same place.
_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
# What the scanner skips in one C-level match: complete string literals and every byte that is not
# a bracket (nor, inside the array itself, a comma). It stops at a bracket, a comma between
# elements, the opening quote of a string that goes on in the next piece, or the end of the buffer.
_SKIP_TOP = re.compile(rb'(?:[^"\[\]{},]+|' + _STRING + rb')*', re.S)
_SKIP_NESTED = re.compile(rb'(?:[^"\[\]{}]+|' + _STRING + rb')*', re.S)
# The rest of a string literal after its opening quote, up to (not including) the closing quote;
# stops early at the end of the buffer, also right after a lone backslash (its escaped byte is
# in the next piece).
_STRING_BODY = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.S)
_WHITESPACE = b" \t\r\n"
# A string literal or a bracket / brace / comma: the tokens ``split_json_stream`` walks.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},]', re.S)


class NotAnArray(ValueError):
    """The stream's first non-whitespace byte is not ``[``."""


class JsonArrayElements:
    """Iterate over the elements of the JSON array that ``stream`` holds.

    Yields ``(data, total_bytes)`` per element: its bytes with surrounding whitespace removed, and
    its full length. An element longer than ``max_element_bytes`` keeps only its first
    ``max_element_bytes + 1`` bytes (``total_bytes`` says how long it was; ``LineParser.feed_bytes``
    quarantines it as too long). An empty element (``[1,,2]``, ``[1,]``) yields ``b""``.

    After the iteration, ``rest`` holds the text after the closing bracket, or the unterminated
    last element (``b"[unterminated array]"`` when the array just stops), stripped, at most
    ``rest_bytes`` bytes of it (``rest_truncated`` then True); None when there is nothing.
    ``keep_after``: once the array has closed, the stream is not read on; ``after`` holds the bytes
    read past the closing bracket, as read (the caller reads what follows them from the stream),
    and ``rest`` stays None (an unterminated array still gives its ``rest``).

    Raises:
        NotAnArray: (on the first ``next``) the stream does not start with ``[`` (after an optional
            UTF-8 byte order mark and whitespace).
    """

    def __init__(self, stream: BinaryIO, max_element_bytes: int, *, chunk_bytes: int = CHUNK_BYTES,
                 rest_bytes: int | None = REST_BYTES, keep_after: bool = False) -> None:
        self._stream = stream
        self._limit = max_element_bytes
        self._chunk = chunk_bytes
        self._rest_bytes = rest_bytes
        self._keep_after = keep_after
        self.rest: bytes | None = None
        self.rest_truncated = False
        self.after: bytes | None = None

    def _read(self) -> bytes:
        return self._stream.read(self._chunk)

    def _opening(self) -> tuple[bytes, int]:
        """The buffer and the index just after the opening ``[``."""
        buf = self._read().removeprefix(UTF8_BOM)
        while True:
            start = len(buf) - len(buf.lstrip(_WHITESPACE))
            if start < len(buf):
                if buf[start] != 0x5B:
                    raise NotAnArray(f"the input starts with {buf[start:start + 1]!r}, not '['")
                return buf, start + 1
            more = self._read()
            if not more:
                raise NotAnArray("the input holds only whitespace")
            buf = more

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        buf, pos = self._opening()
        elem = pos        # where the current element starts in buf
        depth = 1         # bracket depth; the array itself is 1
        in_string = False
        kept: bytes | None = None  # the first bytes of an element longer than the limit
        dropped = 0       # bytes of that element no longer in buf
        eof = False
        any_comma = False
        while True:
            if in_string:
                end = _STRING_BODY.match(buf, pos).end()  # type: ignore[union-attr]  # always matches
                if end < len(buf) and buf[end] == 0x22:
                    pos, in_string = end + 1, False
                    continue
                pos = end  # the literal goes on in the next piece
            else:
                at = (_SKIP_TOP if depth == 1 else _SKIP_NESTED).match(buf, pos).end()  # type: ignore[union-attr]
                if at < len(buf):
                    c, pos = buf[at], at + 1
                    if c == 0x22:  # a string literal that goes on in the next piece
                        in_string = True
                    elif c in (0x5B, 0x7B):  # [ {
                        depth += 1
                    elif c in (0x5D, 0x7D):  # ] }
                        depth -= 1
                        if depth == 0:
                            if any_comma or buf[elem:at].strip(_WHITESPACE) or kept is not None:
                                yield self._element(buf[elem:at], kept, dropped)
                            if self._keep_after:
                                self.after = buf[pos:]
                            else:
                                self._set_rest(buf[pos:], eof)
                            return
                    else:  # a comma between elements (_SKIP_NESTED skips the others)
                        any_comma = True
                        yield self._element(buf[elem:at], kept, dropped)
                        elem, kept, dropped = pos, None, 0
                    continue
                pos = at
            if eof:  # the array never closed: its unterminated last element is the rest
                tail = kept if kept is not None else buf[elem:]
                self._set_rest(tail if tail.strip(_WHITESPACE) else b"[unterminated array]", True)
                return
            if kept is None and len(buf) - elem > self._limit:
                kept = buf[elem:elem + self._limit + 1].lstrip(_WHITESPACE)
            if kept is not None:  # keep only what is not scanned yet
                dropped += pos - elem
                elem = pos
            more = self._read()
            eof = not more
            buf, pos = buf[elem:] + more, pos - elem
            elem = 0

    @staticmethod
    def _element(data: bytes, kept: bytes | None, dropped: int) -> tuple[bytes, int]:
        if kept is not None:
            return kept, dropped + len(data)
        data = data.strip(_WHITESPACE)
        return data, len(data)

    def _set_rest(self, rest: bytes, eof: bool) -> None:
        """Store the stripped rest, reading on (bounded) to find out whether there is any."""
        rest = rest.lstrip(_WHITESPACE)
        while not eof and len(rest) <= (self._rest_bytes if self._rest_bytes is not None else len(rest)):
            more = self._read()
            eof = not more
            rest = (rest + more).lstrip(_WHITESPACE)
        if self._rest_bytes is not None and len(rest) > self._rest_bytes:
            rest, self.rest_truncated = rest[:self._rest_bytes], True
        rest = rest.rstrip(_WHITESPACE)
        self.rest = rest or None


def starts_record_array(head: bytes) -> bool:
    """``head`` (the first bytes of an input) starts like a JSON array of records: ``[`` followed by
    ``{``, or an empty array ``[]`` alone on its line (whitespace allowed between) — not a text line
    that starts with a bracket (a JVM ``[0.011s][warning]…``, Logback's ``[main] INFO …``)."""
    head = head.lstrip(_WHITESPACE)
    after = head[1:].lstrip(_WHITESPACE)
    if head[:1] != b"[" or after[:1] not in (b"{", b"]"):
        return False
    return after[:1] == b"{" or after[1:].lstrip(b" \t\r")[:1] in (b"\n", b"")


def arrays_one_per_line(first_line: bytes, following: bytes) -> bool:
    """Whether an input that starts like a record array (``starts_record_array``) holds arrays one
    per line (saved batches: Fluent Bit ``format json``, Vector ``codec: json``), to be read line by
    line — each array line's elements units, a broken line costing only itself — rather than one
    array streamed element by element (pretty-printed, or one element per line).

    ``first_line``: the input's first line with its newline (without one, the line is not known to
    end: False); ``following``: bytes after it (some, not necessarily all). True when the first line
    ends the array it opens (its last non-blank byte is ``]``), or the next non-blank line starts
    another array: then the first line is a batch of its own, even one cut short — streamed, its
    unterminated tail took every later line (a tester's finding)."""
    if not first_line.endswith(b"\n"):
        return False
    return first_line.rstrip(_WHITESPACE).endswith(b"]") or following.lstrip(_WHITESPACE)[:1] == b"["


def feed_elements(run: Any, elements: JsonArrayElements, source: str, *, on_element: Any = None,
                  first: int = 1, read: list[tuple[bytes, int]] | None = None) -> int:
    """Parse every element of ``elements`` into ``run`` (an ``IngestRun``; no commit); returns
    the number of the last position taken (``first - 1`` when none). ``read``: the elements,
    when the caller has iterated ``elements`` already.

    Each element is one unit positioned ``element <i>`` (from ``first``: the arrays of one file
    are numbered on), so ``read`` counts elements; an empty element and the text after the array
    (or its unterminated tail) are quarantined as ``unparseable`` at the position they take.
    """
    parser = run.parser
    n = first - 1
    for n, (data, total) in enumerate(elements if read is None else read, start=first):
        position = f"element {n}"
        if data:
            run.add(parser.feed_bytes(data, source, position, total if total != len(data) else None))
        else:
            run.add([parser.reject("", "unparseable: empty element in the JSON array (two commas, or a comma "
                                       "before the closing bracket)", source, position)])
        if on_element is not None and n % 1024 == 0:
            on_element()
    if elements.rest is not None:
        n += 1
        run.add([parser.reject(elements.rest.decode("utf-8", "replace"),
                               "unparseable: data after the JSON array or an unterminated array", source,
                               f"element {n}", truncated=elements.rest_truncated)])
    return n


def _objects(body: bytes) -> tuple[list[bytes], int]:
    """The top-level JSON objects written back to back at the start of ``body`` (whitespace between
    them allowed), found without decoding (iterative, no recursion), and the offset just after the
    last complete one (0 when there is none)."""
    objects: list[bytes] = []
    end = depth = start = 0
    for m in _TOKEN.finditer(body):
        c = body[m.start()]
        if depth == 0:
            if c != 0x7B or body[end:m.start()].strip():  # only whitespace, then "{", between objects
                return objects, end
            start = m.start()
        if c == 0x22:  # a string literal
            continue
        if c in (0x5B, 0x7B):  # [ {
            depth += 1
        elif c in (0x5D, 0x7D):  # ] }
            depth -= 1
            if depth == 0:
                end = m.end()
                objects.append(body[start:end])
    return objects, end


def split_json_stream(body: bytes) -> tuple[list[bytes], bytes | None]:
    """Top-level JSON objects written back to back (Fluent Bit ``format json_stream``), found
    without decoding (iterative, no recursion); whitespace between them is allowed.

    Returns:
        ``(objects, rest)``: ``rest`` holds the text from the first byte that does not start an
        object, or the unterminated last object, when there is any, else None.
    """
    objects, end = _objects(body)
    return objects, body[end:].strip() or None


def json_object_stream(body: bytes) -> tuple[list[bytes], int] | None:
    """``(objects, end)`` when the first line of ``body`` holds more than one JSON object written
    back to back (Fluent Bit ``json_stream``; NDJSON has one per line), else None. ``end`` is the
    offset just after the last complete object: the caller reads what follows line by line, so
    nothing after it is lost in one quarantined unit."""
    lead = len(body) - len(body.lstrip(_WHITESPACE))
    newline = body.find(b"\n", lead)
    first_line = body[lead:] if newline < 0 else body[lead:newline]
    objects, rest = split_json_stream(first_line)
    if len(objects) + (rest is not None and rest.startswith(b"{")) < 2:
        return None
    objects, end = _objects(body[lead:])
    return objects, lead + end


def starts_pretty_object(head: bytes) -> bool:
    """A line of ``head`` (the first bytes of an input) is a lone ``{``: JSON objects pretty-printed
    over many lines, as ``jq .`` or Jackson's pretty printer write them (``pretty_units``), also
    after a few text lines (a JVM warning, a start-up banner)."""
    return any(line.strip(_WHITESPACE) == b"{" for line in head.split(b"\n"))


def pretty_units(body: bytes, max_object_bytes: int, first_line: int = 1) -> list[tuple[str, bytes]]:
    """The units of a text of pretty-printed JSON objects and other lines, ``(position, data)``:
    an object runs from a line that is a lone ``{`` to the next line that is a lone ``}`` at its
    start (a pretty printer indents every nested closing brace), at most ``max_object_bytes``,
    and is positioned ``object <i>``; every other line is a unit of its own, positioned by its
    line number (from ``first_line``). A lone ``{`` whose object never closes that way (a broken
    object, an NDJSON line after it) is a line too, and reading goes on from the next line: one
    bad object, or text between the objects (NDJSON after a pretty-printed start-up block),
    loses nothing after it. An object cut off by the end of ``body``, or by the next object's
    lone ``{``, is one unit (its parse quarantines it whole)."""
    lines = body.split(b"\n")
    units: list[tuple[str, bytes]] = []
    objects = 0
    i = 0
    while i < len(lines):
        if lines[i].strip(_WHITESPACE) == b"{":
            size, j = len(lines[i]), i + 1
            while j < len(lines) and size <= max_object_bytes:
                line = lines[j]
                if line.rstrip(_WHITESPACE) == b"}" or line[:1] == b"{":  # the close, or an NDJSON line
                    break
                size += len(line) + 1
                j += 1
            closed = j < len(lines) and lines[j].rstrip(_WHITESPACE) == b"}"
            cut = j == len(lines) or (j > i + 1 and lines[j].strip(_WHITESPACE) == b"{")
            if (closed or cut) and size <= max_object_bytes:
                # closed, or cut off by the end of the input (a file still being written, a copy
                # cut short) or by the next object's lone "{": one unit either way, not a junk
                # row per line of the cut object; reading goes on at the next object
                objects += 1
                units.append((f"object {objects}", b"\n".join(lines[i:j + 1] if closed else lines[i:j])))
                i = j + 1 if closed else j
                continue
        units.append((str(first_line + i), lines[i]))
        i += 1
    return units


def feed_values(run: Any, source: str, values: list[bytes], unit: str) -> None:
    """Parse each JSON text of ``values`` into ``run`` as one unit positioned ``<unit> <i>`` (from 1)."""
    parser = run.parser
    for i, value in enumerate(values, start=1):
        run.add(parser.feed_bytes(value, source, f"{unit} {i}"))


def feed_pretty(run: Any, body: bytes, source: str, first_line: int = 1) -> None:
    """Parse the units of ``body`` (``pretty_units``: pretty-printed objects and other lines) into
    ``run``, each object held to the parser's line limit."""
    parser = run.parser
    for position, data in pretty_units(body, parser.max_line_bytes, first_line):
        run.add(parser.feed_bytes(data, source, position))
