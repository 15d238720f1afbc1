"""Reading a pack's ``data/<name>.json`` split tables in tests, as an auditor's script would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def split_table(path: Path) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows) of a split table ``{"columns": [...], "data": [[...], ...]}``; asserts that shape."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    assert isinstance(doc, dict) and list(doc) == ["columns", "data"], path
    assert all(len(row) == len(doc["columns"]) for row in doc["data"]), path
    return doc["columns"], doc["data"]


def records(path: Path) -> list[dict[str, Any]]:
    """The rows of a split table as dicts keyed by column name, in file order."""
    columns, rows = split_table(path)
    return [dict(zip(columns, row)) for row in rows]
