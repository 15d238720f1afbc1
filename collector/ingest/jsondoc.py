"""Defensive JSON decoding for log lines: nesting limit, duplicate keys, dotted flattening.

- Nesting is measured *before* decoding, without recursion, so a 10 000-deep line costs a regex
  scan instead of the interpreter's stack (log-formats.md §0: "hostile lines").
- Duplicate member names are seen through ``object_pairs_hook`` (RFC 8259 §4 leaves them
  undefined; Python's default silently keeps the last). Equal values are harmless; disagreeing
  values are reported to the caller, who decides (the Fluent Bit ``Merge_Log`` + ``Keep_Log``
  pattern is reconciled by the envelope reader, anything else is quarantined).
- Speed: most lines are decoded by orjson (several times faster than the standard library with a
  pairs hook) and only fall back to the duplicate-aware standard decoder when orjson could differ
  from it (see ``Decoder.decode``): the result is the same value either way.
- ``flatten`` turns nested objects into dotted paths (Spring ECS 3.5 nested == 3.4 flat).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

DEFAULT_MAX_DEPTH = 64

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")
_DIGITS_TO_ONES = bytes.maketrans(b"0123456789", b"1111111111")
_THIRTEEN_ONES = b"1" * 13


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
    by_orjson: bool = False  # decoded by orjson (``Decoder.decode``'s fast path): no NaN, no integer beyond 64 bits


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
        self._exponent = False
        self._unchecked: list[bytes] = []  # orjson re-encodings not yet searched for large floats
        self._kept: tuple[str, bool, Decoded] | None = None  # ``decode(keep=True)``'s answer, for the next call

    @property
    def saw_exponent(self) -> bool:
        """True when a decoded number's digits may not appear in the text (an exponent, ``1.5e18``).

        PAN pre-filters on the text cannot vouch for such a number. Set by the standard decoder
        when a number had an exponent; for orjson-decoded texts, when the re-encoding shows a
        float of magnitude ≥ 1e12 (13+ digits in a row — the only floats ``PanMasker`` inspects).
        Conservative: digits in strings also count. The caller resets it (``= False``) per line.
        """
        if not self._exponent and self._unchecked:
            self._exponent = any(_THIRTEEN_ONES in d.translate(_DIGITS_TO_ONES) for d in self._unchecked)
            self._unchecked.clear()
        return self._exponent

    @saw_exponent.setter
    def saw_exponent(self, value: bool) -> None:
        self._exponent = value
        self._unchecked.clear()

    def _float(self, text: str) -> float:
        if "e" in text or "E" in text:
            self._exponent = True
        return float(text)

    def forget(self) -> None:
        """Drop an answer kept by ``decode(keep=True)``."""
        self._kept = None

    def decode(self, text: str, *, unicode_escapes: bool = True, keep: bool = False,
               max_depth: int | None = None) -> Decoded:
        """Decode one JSON text (``unicode_escapes`` False: the caller knows ``text`` holds no ``\\u``,
        which spares a scan of it).

        ``keep``: when orjson's value is taken because the text is its exact encoding (the branch
        without side effects on this decoder), keep the answer for the next call: if that call
        decodes an equal text with the same ``unicode_escapes``, it returns that very ``Decoded``
        (the parse workers' fast path decodes a line, declines it, and the general path decodes
        it again). Any next call drops it; so does ``forget``. The caller must not change the value.

        orjson decodes first; its value is used only when it is provably what the standard
        decoder with the duplicate-key hook returns; otherwise the standard decoder runs:

        - orjson rejected the text (it refuses NaN/Infinity, lone surrogates and out-of-range
          exponents, which the standard decoder takes, and every syntax error);
        - a duplicate member name. Every member of every object in valid JSON has exactly one
          colon outside strings, so ``text.count(":")`` = members + colons inside strings;
          orjson's re-encoding of the value has members kept + the same colons inside strings
          (it never escapes ``:``). The counts are equal exactly when no member was dropped,
          i.e. no name repeated in an object. A ``\\u003a`` escape (a colon the text does not
          show literally) goes to the standard decoder;
        - ``e+`` in the re-encoding: orjson reads integers beyond the 64-bit range as floats,
          which it writes with an exponent (so do floats ≥ 1e16); strings with ``e+`` in them
          only cost the slower path.

        ``max_depth``: this call's nesting limit instead of the decoder's (an OTLP/JSON request:
        ``otlp.json_depth_limit``).

        Raises:
            JsonRejected: ``nesting-too-deep`` (deeper than ``max_depth``) or ``unparseable``
                (syntax error, with the character offset).
        """
        limit = self.max_depth if max_depth is None else max_depth
        kept = self._kept
        if kept is not None:
            self._kept = None
            if kept[1] == unicode_escapes and kept[0] == text and limit == self.max_depth:
                return kept[2]
        if nesting_depth(text, limit) > limit:
            raise JsonRejected(f"nesting-too-deep: JSON nesting exceeds {limit} levels")
        if not unicode_escapes or ("\\u003a" not in text and "\\u003A" not in text):
            try:
                value = orjson.loads(text)
            except orjson.JSONDecodeError:
                pass  # the standard decoder gives the verdict (and the error position)
            else:
                try:
                    encoded = orjson.dumps(value)
                except orjson.JSONEncodeError:  # nested beyond orjson's 254 levels (an OTLP request's limit is higher)
                    return self._decode_slow(text)
                # The text re-encoded byte for byte (compact lines, as most shippers write them):
                # every member kept (a dropped duplicate would shorten it), every number spelled
                # in the text as decoded — the colon count and the exponent search are not needed.
                if len(encoded) == len(text) and encoded == text.encode("utf-8"):
                    decoded = Decoded(value, by_orjson=True)
                    if keep:
                        self._kept = (text, unicode_escapes, decoded)
                    return decoded
                # "+" first: one memchr pass; "e+" alone is a slow two-byte search ("e" is common).
                if text.count(":") == encoded.count(b":") and not (b"+" in encoded and b"e+" in encoded):
                    self._unchecked.append(encoded)
                    return Decoded(value, by_orjson=True)
        return self._decode_slow(text)

    def _decode_slow(self, text: str) -> Decoded:
        self._conflicts.clear()
        try:
            value = self._json.decode(text)
        except json.JSONDecodeError as exc:
            if exc.msg == "Extra data" and text[exc.pos:exc.pos + 1] in ("{", "["):
                # {"a":1}{"b":2}: objects back to back, as some batch writers emit
                raise JsonRejected(f"unparseable: a second JSON value starts at character {exc.pos}; one JSON "
                                   "object per line (or one JSON array of them)") from None
            if exc.msg == "Extra data":  # {"a":1} trailing text: a line two writers interleaved, or a cut one
                raise JsonRejected(f"unparseable: text after the JSON value at character {exc.pos}") from None
            # the standard decoder's message for a control character ends "… at" (its position follows)
            raise JsonRejected(f"unparseable: invalid JSON at character {exc.pos} ({exc.msg.removesuffix(' at')})") from None
        except RecursionError:  # unreachable after the depth check; kept as a guard
            raise JsonRejected(f"nesting-too-deep: JSON nesting exceeds {self.max_depth} levels") from None
        except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
            raise JsonRejected(f"unparseable: a number too long to read ({str(exc).split(';')[0]})") from None
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
        key = (prefix + k if prefix else k) if k.__class__ is str else f"{prefix}{k}"
        if v.__class__ is dict or isinstance(v, dict):
            if v:
                flatten(v, key + ".", out)
                continue
        if key not in out:
            out[key] = v
    return out
