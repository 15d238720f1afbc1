"""Defensive JSON decoding for log lines: nesting limit, duplicate keys, dotted flattening.

- Nesting is measured *before* decoding, without recursion, so a 10 000-deep line costs a regex
  scan instead of the interpreter's stack (log-formats.md §0: "hostile lines").
- Duplicate member names are seen through ``object_pairs_hook`` (RFC 8259 §4 leaves them
  undefined; Python's default silently keeps the last). Equal values are harmless; disagreeing
  values are reported to the caller, who decides (the Fluent Bit ``Merge_Log`` + ``Keep_Log``
  pattern is reconciled by the envelope reader, anything else is quarantined).
- ``flatten`` turns nested objects into dotted paths (Spring ECS 3.5 nested == 3.4 flat).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_DEPTH = 64

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


class JsonRejected(ValueError):
    """A JSON text we refuse: ``reason`` is the quarantine reason (a short slug + detail)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def nesting_depth(text: str, limit: int) -> int:
    """Maximum nesting depth of arrays/objects in ``text`` (JSON), stopping once it exceeds ``limit``.

    Iterative (no recursion); brackets inside string literals are ignored. Malformed text gives a
    best-effort figure — the decoder reports the syntax error afterwards.
    """
    if text.count("{") + text.count("[") <= limit:
        return 0 if "{" not in text and "[" not in text else 1  # cannot exceed the limit
    stripped = _STRING.sub('""', text) if '"' in text else text
    depth = deepest = 0
    for m in _BRACKET.finditer(stripped):
        if m.group() in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        else:
            depth -= 1
    return deepest


@dataclass
class Decoded:
    """A decoded JSON value and the duplicate member names whose values disagreed.

    ``conflicts``: ``(key, first_value, later_value)`` for every object that repeated ``key``
    with a different value; ``top_conflicts`` the subset found in the outermost object.
    """

    value: Any
    conflicts: list[tuple[str, Any, Any]] = field(default_factory=list)
    top_conflicts: dict[str, list[Any]] = field(default_factory=dict)


class _DupDict(dict):
    """A dict that remembers, per repeated key, every value given (first one kept as the value)."""

    __slots__ = ("dups",)


def _pairs_hook(conflicts: list[tuple[str, Any, Any]]):
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        d = dict(pairs)
        if len(d) == len(pairs):
            return d
        out = _DupDict()
        out.dups = {}
        for k, v in pairs:
            if k in out:
                if out[k] != v:
                    out.dups.setdefault(k, [out[k]]).append(v)
                    conflicts.append((k, out[k], v))
            else:
                out[k] = v
        return out

    return hook


class Decoder:
    """A reusable decoder (one per parser: not thread-safe) with the nesting limit and duplicate-key detection."""

    def __init__(self, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.max_depth = max_depth
        self._conflicts: list[tuple[str, Any, Any]] = []
        self._json = json.JSONDecoder(object_pairs_hook=_pairs_hook(self._conflicts), parse_float=self._float)
        #: set when a decoded number had an exponent (``1.5e18``): its value's digits are not in
        #: the text, so PAN pre-filters on the text cannot vouch for it. The caller resets it.
        self.saw_exponent = False

    def _float(self, text: str) -> float:
        if "e" in text or "E" in text:
            self.saw_exponent = True
        return float(text)

    def decode(self, text: str) -> Decoded:
        """Decode one JSON text.

        Raises:
            JsonRejected: ``nesting-too-deep`` (deeper than ``max_depth``) or ``unparseable``
                (syntax error, with the character offset).
        """
        if nesting_depth(text, self.max_depth) > self.max_depth:
            raise JsonRejected(f"nesting-too-deep: JSON nesting exceeds {self.max_depth} levels")
        self._conflicts.clear()
        try:
            value = self._json.decode(text)
        except json.JSONDecodeError as exc:
            raise JsonRejected(f"unparseable: invalid JSON at character {exc.pos} ({exc.msg})") from None
        except RecursionError:  # unreachable after the depth check; kept as a guard
            raise JsonRejected(f"nesting-too-deep: JSON nesting exceeds {self.max_depth} levels") from None
        conflicts = list(self._conflicts) if self._conflicts else []
        top = dict(value.dups) if isinstance(value, _DupDict) else {}
        return Decoded(value, conflicts, top)


def decode(text: str, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Decoded:
    """Decode one JSON text with the nesting limit and duplicate-key detection (see ``Decoder``).

    Raises:
        JsonRejected: ``nesting-too-deep`` or ``unparseable``.
    """
    return Decoder(max_depth).decode(text)


def flatten(value: dict[str, Any], prefix: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Flatten nested objects into dotted keys: ``{"log":{"level":"INFO"}}`` → ``{"log.level":"INFO"}``.

    Arrays stay values. An empty object stays an empty object under its key. When a flat key and a
    nested path collide (``"a.b"`` and ``{"a":{"b":…}}``) the first one seen wins. Depth is bounded
    by the caller (``decode``'s limit), so recursion is safe.
    """
    if out is None:
        out = {}
    for k, v in value.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            flatten(v, key + ".", out)
        elif key not in out:
            out[key] = v
    return out
