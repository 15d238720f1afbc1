"""SQL expressions that render a population row as its JSON text inside the database.

Why: a pack for millions of transactions spends its time turning row tuples into text twice (CSV
and JSON). Done in Python that is microseconds per row; done by the database engine (SQLite's
``json_array``, PostgreSQL's ``COPY`` output) it is C code, and on PostgreSQL it runs in the server
process, in parallel with the renderer. The database renders each row once, as its JSON array (or
COPY's JSON-quoted row); ``reports.populations.csv_rows_from_copy`` derives the CSV lines from that
text, and Python otherwise only joins the lines of a batch.

The text is the same on both backends and the same as the Python writers in
``reports.populations`` (``csv_line``, ``JSON_ENCODER``), which are the reference:

- CSV (RFC 4180 §2): fields separated by ``,``; a text field is quoted when it contains ``,``,
  ``"``, LF or CR, with ``"`` doubled inside; null and the empty string are an empty field; integers in decimal.
- JSON: one array per row (the ``data`` rows of a split table, ``reports.populations``), values in
  column order, no whitespace, strings escaped as Python's ``json.dumps(..., ensure_ascii=False)``
  does (``\\" \\\\ \\b \\f \\n \\r \\t``, other control characters ``\\u00xx``, everything else
  as UTF-8); null as ``null``; integers in decimal.
- Times ``*_at``/``event_time``: RFC 3339 UTC with the nanoseconds trimmed of trailing zeros
  (``collector.timeutil.ns_to_rfc3339``), for times at or after 1970-01-01.

Column kinds: ``text``, ``int`` (integers), ``time`` (integer nanoseconds rendered as text) and
``bool`` (``true``/``false`` in both files, as ``csv_field`` and JSON write Python booleans; null stays null).
"""

from __future__ import annotations

import re
from typing import Sequence

TEXT, INT, TIME, BOOL = "text", "int", "time", "bool"
SUPPORTED_DIALECTS = ("sqlite", "postgresql")


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _time_text(expr: str, dialect: str) -> str:
    """RFC 3339 text of integer nanoseconds ``expr`` (NULL stays NULL)."""
    frac = f"({expr} % 1000000000)"
    if dialect == "sqlite":
        seconds = f"strftime('%Y-%m-%dT%H:%M:%S', {expr} / 1000000000, 'unixepoch')"
        digits = f"rtrim(substr('00000000' || {frac}, -9), '0')"
    else:
        seconds = f"to_char(to_timestamp({expr} / 1000000000) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS')"
        digits = f"rtrim(lpad(CAST({frac} AS text), 9, '0'), '0')"
    return f"({seconds} || CASE WHEN {frac} = 0 THEN '' ELSE '.' || {digits} END || 'Z')"


def _bool_text(expr: str) -> str:
    """``true``/``false`` of a boolean ``expr`` (SQLite stores 0/1; NULL stays NULL): never quoted."""
    return f"(CASE WHEN {expr} THEN 'true' WHEN NOT {expr} THEN 'false' END)"


def copy_json_value(expr: str, kind: str, dialect: str) -> str:
    """A field for PostgreSQL's ``COPY ... TO STDOUT WITH (copy_json_options(...))``, whose output row
    is the JSON array's content (``json_rows_from_copy``): text and times as they are (COPY quotes
    and escapes them), integers as they are, booleans as ``true``/``false``, NULL as ``null``.

    Raises:
        ValueError: ``dialect`` is not ``postgresql`` or ``kind`` is unknown.
    """
    if dialect != "postgresql":
        raise ValueError(f"COPY is PostgreSQL's; dialect {dialect!r} renders text with json_array_sql")
    _check([("field", expr, kind)], dialect)
    if kind == TIME:
        return _time_text(expr, dialect)
    if kind == BOOL:
        return _bool_text(expr)
    return expr


def copy_json_options(columns: Sequence[tuple[str, str, str]]) -> str:
    """``COPY`` options under which each output row of ``copy_json_value`` fields is, once
    ``json_rows_from_copy`` has bracketed it, the row's JSON array (RFC 8259), at the cost of COPY's
    CSV output rather than of a JSON function per field (PostgreSQL 15, 1 M lineage rows: 7.3 s of
    server CPU against 17 s with ``to_json`` per field).

    Why it is JSON: CSV mode with ``QUOTE '"'`` and ``ESCAPE '\\'`` writes a quote or backslash inside
    a value as ``\\"`` / ``\\\\`` (PostgreSQL's CSV output escapes both the quote and the escape
    character), which is JSON's escaping; ``FORCE_QUOTE`` on every text and time column quotes each
    non-null value, the empty string as ``""``; NULL is written unquoted as ``null`` (never quoted,
    and a non-quoted field never equals ``null`` here: integers and ``true``/``false``); the
    delimiter is ``,``. Control characters stay raw inside the quotes: ``json_rows_from_copy``
    escapes them as Python's ``json`` does.

    Args:
        columns: ``(output name, SQL expression, kind)`` as ``json_array_sql``; the statement's
            columns must carry these output names (``FORCE_QUOTE`` names them).
    """
    _check(columns, "postgresql")
    quoted = ", ".join(_quote_ident(name) for name, _expr, kind in columns if kind in (TEXT, TIME))
    return "FORMAT csv, DELIMITER ',', QUOTE '\"', ESCAPE E'\\\\', NULL 'null'" + (
        f", FORCE_QUOTE ({quoted})" if quoted else "")


_CONTROL = re.compile(rb"[\x00-\x1f]")
# Deleted by bytes.translate to test a chunk for them: 13x faster than a regex search (10 vs 136 ms on 8 MB).
_CONTROL_BUT_LF = bytes(range(0x0A)) + bytes(range(0x0B, 0x20))
# A quoted field of copy_json_options' output (an escape takes the next byte, whatever it is), or
# a line feed outside one: a row's end. Greedy, never possessive (CPython 3.11.2, see ingest).
_QUOTED_OR_ROW_END = re.compile(rb'"(?:[^"\\]|\\.)*"|\n', re.S)
_JSON_SHORT_ESCAPES = {0x08: b"\\b", 0x09: b"\\t", 0x0A: b"\\n", 0x0C: b"\\f", 0x0D: b"\\r"}


def _json_control_escape(match: re.Match) -> bytes:
    code = match.group()[0]
    return _JSON_SHORT_ESCAPES.get(code) or b"\\u%04x" % code


def _json_row_piece(match: re.Match) -> bytes:
    piece = match.group()
    return b"],\n[" if piece == b"\n" else _CONTROL.sub(_json_control_escape, piece)


def json_rows_from_copy(chunk: bytes, rows: int) -> bytes:
    """The JSON arrays of ``rows`` whole rows of ``COPY`` output under ``copy_json_options``
    (``chunk``: each row ended by a line feed), separated by ``,`` + line feed as in a split
    table's ``data``; no separator before the first or after the last.

    Values without control characters are JSON as COPY wrote them (one ``replace`` over the
    chunk); in a chunk holding any, every control character inside a quoted value is escaped as
    ``json.dumps`` does (``\\b \\t \\n \\f \\r``, others ``\\u00xx``), the row ends found outside quotes.
    """
    if not rows:
        return b""
    if chunk.count(b"\n") == rows and len(chunk.translate(None, _CONTROL_BUT_LF)) == len(chunk):
        return b"[" + chunk[:-1].replace(b"\n", b"],\n[") + b"]"  # [:-1]: the last row's line feed
    return b"[" + _QUOTED_OR_ROW_END.sub(_json_row_piece, chunk[:-1]) + b"]"


def _format_call(template: str, args: Sequence[str], dialect: str) -> str:
    """One ``printf`` (SQLite) / ``format`` (PostgreSQL) call: the line is built once, not by ``||`` per field."""
    function = "printf" if dialect == "sqlite" else "format"
    return f"{function}({_sql_string(template)}, {', '.join(args)})"


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def json_array_sql(columns: Sequence[tuple[str, str, str]], dialect: str) -> str:
    """SQL text of the JSON array (values in column order, compact) of one row: a ``data`` row of the
    population's split table. The column names are not in it: they are written once, in the file's
    ``columns`` member.

    Args:
        columns: ``(output name, SQL expression, kind)`` in column order; ``kind`` is ``text``,
            ``int``, ``time`` or ``bool``.
        dialect: ``sqlite`` or ``postgresql``.

    Raises:
        ValueError: unsupported dialect or column kind.
    """
    _check(columns, dialect)
    if dialect == "sqlite":  # json_array: compact, json_quote escaping, NULL as null
        return f"json_array({', '.join(_sqlite_json_value(e, k) for _n, e, k in columns)})"
    values = []
    for _name, expr, kind in columns:
        if kind == INT:
            values.append(f"coalesce(CAST({expr} AS text), 'null')")
        elif kind == BOOL:
            values.append(f"coalesce({_bool_text(expr)}, 'null')")
        else:
            text = _time_text(expr, dialect) if kind == TIME else expr
            values.append(f"coalesce(CAST(to_json(CAST({text} AS text)) AS text), 'null')")
    return _format_call("[" + ",".join(["%s"] * len(columns)) + "]", values, dialect)


def _sqlite_json_value(expr: str, kind: str) -> str:
    """An argument of SQLite's ``json_array``: a boolean as JSON ``true``/``false`` (``json()`` of
    the text; NULL stays NULL, rendered ``null``), a time as its text, others as they are."""
    if kind == TIME:
        return _time_text(expr, "sqlite")
    if kind == BOOL:
        return f"json({_bool_text(expr)})"
    return expr


def _check(columns: Sequence[tuple[str, str, str]], dialect: str) -> None:
    if dialect not in SUPPORTED_DIALECTS:
        raise ValueError(f"database dialect {dialect!r} is not supported (use {', '.join(SUPPORTED_DIALECTS)})")
    for name, _expr, kind in columns:
        if kind not in (TEXT, INT, TIME, BOOL):
            raise ValueError(f"column {name!r}: unknown kind {kind!r}")


def column_ref(table_alias: str, name: str) -> str:
    """``alias."name"``: a quoted reference to a subquery column."""
    return f"{table_alias}.{_quote_ident(name)}"
