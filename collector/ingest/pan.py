r"""Card-number (PAN) masking: no full primary account number is ever stored (PCI DSS v4.0 req. 3.3-3.5).

A PAN candidate is a run of 13-19 decimal digits that passes the Luhn check (ISO/IEC 7812-1
annex B), written in one of these ways:

- grouped in any way by single separators — space, dash, tab, every Unicode space and dash
  (categories Zs and Pd: no-break, thin, ideographic space U+3000, en dash U+2013, full-width
  hyphen-minus U+FF0D…), line and paragraph separator, vertical tab, form feed, minus sign U+2212,
  ``+`` (a space in URL form encoding) and middle dots and bullets (only between a card's groups,
  4-4-4-4, 4-6-5, 4-6-4…, with an issuer prefix, ``_card_layout``), NUL (UTF-16 text read as
  UTF-8), an invisible format character (soft hyphen, zero-width space / joiners, word joiner,
  byte order mark), each also as its JSON escape
  (``4111 1111 1111 1111``, ``3782 822463 10005``, ``4012\t8888\t8888\t1881``, ``4111\u00ad1111…``,
  ``4111–1111–1111–1111``, ``pan=4111+1111+1111+1111``), or as URL percent-escapes
  (``4111%201111%201111%201111``: ``percent_separators_decoded``; with digits written as JSON
  escapes too, ``\u0034111%201111…``: ``escapes_decoded``); not ``:``, ``,``, ``|``;
- in groups of 3 to 6 digits (how card numbers are printed: 4-4-4-4, 4-6-5, 4-4-4-4-3) separated
  by runs of up to three separator units, a unit being one of the characters above, a newline,
  CR, slash or underscore, or the JSON escape of one (``\n``, ``\t``, ``\r``, ``\/``, ``\f``,
  ``\u00a0``…, with any number of backslashes: an application's JSON line inside a shipper's JSON
  string is escaped twice): ``4111  1111  1111  1111``, ``4111\n1111\n1111\n1111``,
  ``4111/1111/1111/1111``, ``4111_1111_1111_1111``. The group sizes keep dates and times in file
  names and paths (``app_20250304_101500.log``, ``2025/03/04/1741083300``) from being candidates;
- in dotted 4-digit groups (``6011.0009.9013.9424``), or in a card's own grouping — 4-4-4-4,
  4-6-5 (American Express), 4-4-4-4-3 — with one dot, space, dash (or other single separator
  unit above) between each two groups, at least one of them a dot (``4111 1111 1111.1111``,
  ``4111 1111-1111.1111``, ``3782.822463 10005``). A dot is not a separator otherwise: it would
  turn every epoch time with a fraction (``1795987769.834784``) into a candidate, and versions,
  addresses and decimals (``1.2.3``, ``10.4.12.21``, ``12.345``) have no such grouping.

Decimal digits of any script (full-width ``４１１１…``, Arabic-Indic ``٤١١١…``, Devanagari…)
count as digits, by their value: a text holding such digits is stored with them as ASCII digits. Letters next to the run do not
protect it (``PAN4111…``, ``4111…EUR``, ``4111…DE``, ``card=4111…abc`` are masked) unless the
letters and the run together form one hexadecimal identifier — a hex token with letters on both
sides of the run (``ab4111…cd``) or of an identifier's length (16, 24, 32, 40, 64: span, trace,
container ids, digests, commits) — or the run sits inside a UUID; a percent-escape or a JSON
escape before the run (``pan%3D4000…``, URL-encoded ``=``; ``\b4111…``, a backspace) is not part
of a token. Track 2 data (``4111…D2512201…F`` in EMV tag 57, ``;4111…=2512101…?`` on a stripe) is
masked even inside a hex token, and every digit after its separator is starred. A match is
replaced by its first 6 and last 4 digits with ``*`` in between, separators dropped:
``411111******1111`` — the most PCI DSS 3.4.1 allows to be shown. Runs longer than 19 digits are
searched for a PAN that starts and ends on a group boundary (``ref 2024 4111 1111 1111 1111``);
a run of 20-23 digits that is a PAN with its expiry date glued on (``41111111111111112512``) is
masked as ``411111******1111****`` (``_is_pan_with_expiry`` says which).

Pure functions, no I/O. False positives (a 16-digit order number that happens to pass Luhn) are
masked too: over-masking loses a little detail, under-masking breaks the rule.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import unicodedata
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable

import orjson

from collector.ingest.jsondoc import flatten

PAN_MIN_DIGITS = 13
PAN_MAX_DIGITS = 19

# Separators people and systems put between digit groups; a single one of these allows any
# grouping. A dot is not among them: it would turn every epoch timestamp with a fraction
# (1795987769.834784) into a candidate; dotted card numbers are matched only in their 4-digit
# grouping (_DOTTED). Nor are ":", "," and "|": times (10:15:00), CSV rows and pipe-delimited
# records put them between numbers everywhere in logs, and each would make false candidates of
# them (a field list "4111,1111,1111,1111" is left as written: a deliberate limit).
# Invisible format characters (Unicode category Cf: soft hyphen, zero-width space / non-joiner /
# joiner, directional marks, word joiner and invisible operators, byte order mark) count as
# separators too: a PAN written 4111<U+00AD>1111<U+00AD>… displays as an unbroken number and was
# stored whole (newcomer re-check).
_INVISIBLE_SEPARATORS = "\u00ad\u200b\u200c\u200d\u200e\u200f\u2060\u2061\u2062\u2063\u2064\ufeff"
# Every space (Unicode category Zs: no-break, en/em/thin/hair…, ideographic U+3000, ogham U+1680,
# medium mathematical U+205F), line and paragraph separator (Zl U+2028, Zp U+2029), vertical tab
# and form feed, every dash (Pd: hyphen U+2010, en dash U+2013, em dash, full-width U+FF0D,
# small U+FE58/FE63, two- and three-em U+2E3A/2E3B…), U+2212 MINUS SIGN, and "+" (a space in
# URL form encoding, ``?pan=4111+1111+1111+1111``): ``4111–1111–1111–1111`` and
# ``4111　1111　1111　1111`` (full-width digits with ideographic spaces, stored as ASCII digits)
# were stored whole (tester's finding). Generated from ``unicodedata`` at import, so a new Python's
# Unicode database brings its new spaces and dashes; planes 0-1 only, 13 ms at import (planes 2-3
# hold CJK ideographs, 4-13 are unassigned, 14 tags and variation selectors, 15-16 private use: no
# Zs, Zl, Zp or Pd character; a test checks the whole range).
_SEPARATOR_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Pd"})
_CATEGORY_SEPARATORS = "".join(ch for ch in map(chr, range(0x20000))
                               if unicodedata.category(ch) in _SEPARATOR_CATEGORIES)
# Middle dots and bullets people put between groups on screens and receipts (``4111 · 1111 · …``:
# stored whole, tester's finding): U+00B7, U+2022, U+2027, U+2219, U+22C5, U+2043, U+25E6, U+30FB,
# U+FF65 — in a card's layout only, as "+" (``_card_layout``: a middle dot is also a decimal point).
# And NUL, which stands between the digits of UTF-16 text read as UTF-8 (``4\x001\x00…``; a
# rejected line is masked before its NULs become U+FFFD for storage): a card number in a UTF-16
# body was quarantined with every digit readable.
_DOT_SEPARATORS = "\u00b7\u2022\u2027\u2219\u22c5\u2043\u25e6\u30fb\uff65"
_ENCODING_DEBRIS = "\x00"
_SINGLE_SEPARATORS = "".join(dict.fromkeys(" -\t" + _CATEGORY_SEPARATORS + "\v\f\u2212+" + _INVISIBLE_SEPARATORS
                                           + _DOT_SEPARATORS + _ENCODING_DEBRIS))
_SEP = "".join(re.escape(ch) for ch in _SINGLE_SEPARATORS)  # for a character class
# Characters that also separate groups, in runs and next to groups of 3-6 digits only.
_SEP_CHARS = _SEP + "\n\r/_"
_SEP_UNIT_CHARS = _SINGLE_SEPARATORS + "\n\r/_"  # the same, as characters


def _hex_case(hexes: str) -> str:
    """A regex for the hex digits ``hexes`` in either case (``2e3a`` → ``2[eE]3[aA]``)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in hexes)


def _hex_trie(codes: list[str]) -> str:
    """A regex matching exactly the 4-hex-digit ``codes`` (lower case), either case, as a trie:
    the engine tries one branch per hex digit instead of every code in turn."""
    if codes == [""]:
        return ""
    heads: dict[str, list[str]] = {}
    for code in codes:
        heads.setdefault(code[:1], []).append(code[1:])
    branches = [_hex_case(h) + _hex_trie(rest) for h, rest in sorted(heads.items())]
    return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"


def _escape_codes(chars: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The JSON ``\\uXXXX`` escapes of ``chars``: the BMP ones' 4 hex digits, and the UTF-16
    surrogate pairs (high, low) of the others (JSON writes U+10EAD as ``\\ud803\\udead``)."""
    bmp, pairs = [], []
    for ch in chars:
        code = ord(ch)
        if code < 0x10000:
            bmp.append(f"{code:04x}")
        else:
            code -= 0x10000
            pairs.append((f"{0xD800 + (code >> 10):04x}", f"{0xDC00 + (code & 0x3FF):04x}"))
    return sorted(set(bmp)), sorted(set(pairs))


_SEP_ESCAPES, _SEP_ESCAPE_PAIRS = _escape_codes(_SEP_UNIT_CHARS)
# One separator unit: a character, or its JSON escape with any number of backslashes (an
# application's line inside a shipper's string is escaped twice): the short escapes \n \t \r \/ \f,
# or \uXXXX of any separator character above (a surrogate pair beyond the BMP).
_SEP_UNIT = (rf"(?:[{_SEP_CHARS}]|\\+(?:[ntrf/]|u(?:{_hex_trie(_SEP_ESCAPES)}"
             + "".join(rf"|{_hex_case(hi)}\\+u{_hex_case(lo)}" for hi, lo in _SEP_ESCAPE_PAIRS) + ")))")
_SEP_RUN = re.compile(f"{_SEP_UNIT}+")
# In a run cut off at a text's end or start (``mask_cut_end``, ``mask_cut_start``) a dot
# separates too: the cut leaves no layout to tell 4111.1111.1111.1 from a decimal, so both are masked.
CUT_SEP_UNIT = rf"(?:{_SEP_UNIT}|\.)"
CUT_SEP_RUN = re.compile(f"{CUT_SEP_UNIT}+")
# Digits and separators at the end of a text: what may be the first part of a PAN cut off there.
TRAILING_DIGIT_RUN = re.compile(rf"(?:\d|{CUT_SEP_UNIT})+$")
MAX_SEPARATOR_UNITS = 3
MIN_GROUP_DIGITS, MAX_GROUP_DIGITS = 3, 6  # digits per group when separator runs or new separators are used
# A digit run with separator runs between its digits, not touching another digit; a \uXXXX escape
# right before it (``\u00a04111…``) ends in hex digits that are not part of the run.
_RUN_START = r"(?:(?<!\d)|(?<=\\u[0-9a-fA-F]{4}))(?<!\\u)(?<!\\u[0-9a-fA-F])(?<!\\u[0-9a-fA-F]{2})(?<!\\u[0-9a-fA-F]{3})"
_CANDIDATE = re.compile(rf"{_RUN_START}\d(?:{_SEP_UNIT}{{0,{MAX_SEPARATOR_UNITS}}}\d){{12,}}(?!\d)")
# Full-width digits (U+FF10..U+FF19) are read as ASCII digits before the search.
# Any other decimal digit (Unicode Nd: Arabic-Indic, Devanagari, full-width…) is read as its ASCII
# digit before the search, as ``\d`` reads it: the Luhn check and the masked form need its value.
_NON_ASCII_DIGIT = re.compile(r"(?![0-9])\d")
_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}$")
_DOTTED = re.compile(r"(?<![\d.])\d{4}(?:\.\d{4}){2,3}(?:\.\d{1,3})?(?![\d.])")
# Digit groups joined by single separator units, dots among them (``_mask_mixed_dotted``): one unit
# (a dot, or a ``_SEP_UNIT``: space, dash, tab, their escapes…) between each two groups.
_MIXED_SEP = rf"(?:\.|{_SEP_UNIT})"
_MIXED_RUN = re.compile(rf"{_RUN_START}\d+(?:{_MIXED_SEP}\d+)+(?!\d)")
_MIXED_SPLIT = re.compile(f"({_MIXED_SEP})")
# How card numbers are printed (ISO/IEC 7812 lengths; the networks' groupings): Visa, Mastercard,
# Discover 4-4-4-4; American Express 4-6-5; 19-digit Visa, UnionPay, Maestro 4-4-4-4-3. Longest first.
CARD_LAYOUTS = ((4, 4, 4, 4, 3), (4, 4, 4, 4), (4, 6, 5))
# Digits as "1", dots kept, every other byte "x": a dot in a card layout follows a group of 4 or 6
# digits that a non-digit (a separator) or the text's start precedes.
_DOT_MARKS = bytes(0x31 if 0x30 <= b <= 0x39 else 0x2E if b == 0x2E else 0x78 for b in range(256))
_HEX_CHARS = frozenset("0123456789abcdefABCDEF")
_UUID = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")
# A hex token (trace, span, container ids) with at least one letter, bounded by characters that
# extend neither a digit run nor an alphanumeric token (see ``may_contain_pan``).
# Lengths of hexadecimal identifiers: span and other 64-bit ids (16), MongoDB ObjectId and the random
# part of an AWS X-Ray trace id (24), trace ids, MD5 and UUIDs without dashes (32), SHA-1 and git
# commits (40), SHA-256 digests and container ids (64).
HEX_ID_LENGTHS = (64, 40, 32, 24, 16)
# A hex identifier as ``_hex_token_sides`` protects the digit runs in it: a hex letter at both ends
# (every run inside has letters on both sides), or a known identifier length; with a letter.
_HEX_ID = (r"(?=[0-9]*[A-Fa-f])(?:[A-Fa-f][0-9A-Fa-f]{12,}[A-Fa-f]|"
           + "|".join(f"[0-9A-Fa-f]{{{n}}}" for n in HEX_ID_LENGTHS) + ")")
_HEX_TOKEN = rf"(?<![\w%{_SEP_CHARS}]){_HEX_ID}(?![\w{_SEP_CHARS}]|\\+[ntrf/u])"
# Either one, in one pass. The two never overlap (a hex token holds no dash and is bounded by
# characters a UUID cannot contain), so this finds the UUIDs ``_UUID.finditer`` finds.
_UUID_OR_HEX_TOKEN = re.compile(f"(?P<uuid>{_UUID.pattern})|{_HEX_TOKEN}")
# Cheap pre-filter: nothing to do unless the text has 13 digits in a row or some grouped digits.
_MAYBE = re.compile(rf"\d(?:{_SEP_UNIT}{{0,{MAX_SEPARATOR_UNITS}}}\d){{12}}")
# Fast pre-filter for whole lines (C-speed translate + substring search instead of a regex that
# is tried at every digit): digits become "1", separators are deleted, then look for 13 ones.
_DIGITS_TO_ONES = bytes.maketrans(b"0123456789", b"1111111111")
_THIRTEEN_ONES = b"1" * 13
_DOTTED_GROUPS = b"1111.1111.1111"  # what every _DOTTED match looks like after _DIGITS_TO_ONES
# Every byte of every separator character (``_SEP_UNIT_CHARS``: the UTF-8 bytes of the non-ASCII
# ones, lead and continuation bytes alike) and the backslash. Deleting a byte only joins digits, so
# deleting more bytes than a separator's own (a CJK character sharing U+3000's lead byte E3 and
# continuation bytes) makes a pre-filter say "maybe" more often, never "no PAN" wrongly.
_SEP_BYTES = bytes(sorted({b for ch in _SEP_UNIT_CHARS + "\\" for b in ch.encode("utf-8")}))
# The escapes \n \t \r \/ lose both bytes (their letters are deleted wherever they are). A
# \uXXXX escape of a separator is no concern of these tables: each pre-filter answers "maybe" for
# a text with ``\u`` in it before it looks at them.
_SEP_AND_ESCAPE_BYTES = _SEP_BYTES + b"ntr"
# The escape \f (a form feed) is a separator unit too; its letter cannot go wherever it is, as n, t
# and r do (hex ids are full of f's next to digits): the pairs are deleted, in a text that has one
# (``_form_feed_run``). Its search is the regex engine's (0.55 µs on a 1.5 kB Fluent Bit line,
# whose 69 backslashes make ``in`` take 1.5 µs), and only where the other bytes give no run.
_FORM_FEED_ESCAPE = re.compile(rb"\\f")


def _form_feed_run(data: bytes) -> bool:
    """Whether ``data`` (a text's UTF-8 bytes, with a backslash) has 13 ASCII digits in a row once
    its form-feed escapes ``\\f`` are deleted too (as well as every separator byte and the
    letters n, t, r: ``_SEP_AND_ESCAPE_BYTES``); for a text in which that deletion without the
    \\f pairs found none. A backslash followed by ``f`` after an escaped backslash (``C:\\\\fx``)
    goes too: deleting more only joins digits more (conservative)."""
    return (_FORM_FEED_ESCAPE.search(data) is not None
            and _THIRTEEN_ONES in data.replace(b"\\f", b"").translate(_DIGITS_TO_ONES, _SEP_AND_ESCAPE_BYTES))


def _ascii_digit_run(data: bytes, ones: bytes | None = None) -> bool:
    """13 ASCII digits in a row in ``data`` (a text's UTF-8 bytes, no ``\\u`` in it) once every
    separator byte (``_SEP_BYTES``), the letters n, t, r (escapes \\n \\t \\r) and every form-feed
    escape ``\\f`` are deleted. ``ones``: ``data`` translated so (``_DIGITS_TO_ONES``,
    ``_SEP_AND_ESCAPE_BYTES`` deleted), if the caller has it."""
    if ones is None:
        ones = data.translate(_DIGITS_TO_ONES, _SEP_AND_ESCAPE_BYTES)
    return _THIRTEEN_ONES in ones or (b"\\" in data and _form_feed_run(data))


# ``has_unicode_escape(text)``: whether ``text`` holds ``\\u``, as ``"\\u" in text`` says; the regex
# engine's literal search is 2.4 times faster on a whole log line full of escaped quotes (0.47 against
# 1.13 µs on a Fluent Bit line: ``in`` stops at every backslash). For long texts; short ones: ``in``.
has_unicode_escape = re.compile(r"\\u").search


def may_contain_pan(text: str, *, exponent_numbers: bool = False, unicode_escapes: bool = True) -> bool:
    """False when no field decoded from ``text`` (a raw JSON line) can hold a PAN.

    Conservative: a text with no 13 digits in a row (ignoring every separator and its escape) and no
    ``\\u`` escape cannot decode into a string or integer that has a PAN-like digit run. A JSON
    number in exponent form (``4.1111e15``) can; the decoder reports those
    (``exponent_numbers``). ``unicode_escapes`` False: the caller knows ``text`` holds no ``\\u``
    (a scan spared). Lets the parser skip per-field masking for almost every line.
    """
    if exponent_numbers or (unicode_escapes and has_unicode_escape(text)):
        return True
    # The parse workers' fast path asks about a line, declines it when the answer is True, and the
    # general path asks again about the same text: the last answer is kept (a pure function). One
    # immutable tuple, replaced whole: a thread reads a text and the answer that goes with it.
    global _LAST_VERDICT
    last = _LAST_VERDICT
    if last[0] == text and last[1] == unicode_escapes:
        return last[2]
    verdict = _may_contain_pan(text)
    if not verdict and "%" in text:  # a field's copy with URL separator escapes decoded (``mask_text``)
        decoded = percent_separators_decoded(text)
        verdict = decoded is not text and _may_contain_pan(decoded)
    _LAST_VERDICT = (text, unicode_escapes, verdict)
    return verdict


_LAST_VERDICT: tuple[Any, Any, bool] = (None, None, True)  # (text, unicode_escapes, may_contain_pan's answer)
_NOT_ASCII_DIGITS = bytes(b for b in range(256) if not 0x30 <= b <= 0x39)
# A JSON member name as a text shows it — quoted, or with escaped quotes inside a JSON string
# (a Fluent Bit ``log``) — followed by its colon: the backslashes before both quotes match.
_MEMBER_NAME = re.compile(r'(\\*)"([^"\\]*\d[^"\\]*)\1"(?=\s*:)')
ANY_DIGIT = re.compile(r"\d")  # also the parser's: a raw hash's digits hidden


def record_names_may_contain_pan(flat: dict[str, Any]) -> bool:
    """``member_names_may_contain_pan`` of a flattened record's keys, and of the name paths of the
    objects its arrays hold (flattening keeps arrays as values: ``{"kv":[{"4111":{"1111":…}}]}``)."""
    if member_names_may_contain_pan(flat):
        return True
    for v in flat.values():  # a loop, not any(): this runs for every line of the parse workers' fast path
        if v.__class__ is list and member_names_may_contain_pan(_name_paths(v)):
            return True
    return False


def _name_paths(value: Any) -> list[str]:
    """The dotted member-name paths of the objects in ``value`` as flattening gives them
    (``jsondoc.flatten``), each object in an array flattened on its own: the names a reader joins."""
    if isinstance(value, dict):
        flat = flatten(value)
        return [*flat, *(p for v in flat.values() if isinstance(v, list) for p in _name_paths(v))]
    if isinstance(value, list):
        return [p for v in value for p in _name_paths(v)]
    return []


def _enough_digits(text: str) -> bool:
    """False when ``text`` is ASCII with fewer digits than a PAN has (a cheap first test)."""
    return not text.isascii() or len(text.encode("ascii").translate(None, _NOT_ASCII_DIGITS)) >= PAN_MIN_DIGITS


def _holds_pan(paths: list[str]) -> bool:
    """Whether a path among ``paths`` holds a card number (``mask_text``; pre-filtered)."""
    return member_names_may_contain_pan(paths) and any(mask_text(p)[1] for p in paths)


def mask_member_name_digits(text: str) -> tuple[str, int]:
    """``text`` (a raw JSON line, as quarantined) with every digit of its member names starred when
    its nested names hold a card number: ``{"4111":{"1111":{"1111":{"1111":…}}}}``, which every
    reader that flattens the object joins into ``4111.1111.1111.1111``, while the text shows the
    groups apart. Decided on the name paths of the decoded line (``_name_paths``; a string member
    holding a JSON object — Fluent Bit's ``log`` — decoded too); a text that does not decode, on its
    names joined in the order they appear. Returns the text and 1 (one PAN counted) or 0.
    Conservative: names of unrelated members are starred too; only names holding digits are looked at."""
    names = [m.group(2) for m in _MEMBER_NAME.finditer(text)] if '"' in text else []
    if not _enough_digits("".join(names)):
        return text, 0
    try:
        paths = _text_paths(orjson.loads(text))
    except orjson.JSONDecodeError:
        paths = [".".join(names)]
    if not _holds_pan(paths):
        return text, 0
    return _MEMBER_NAME.sub(lambda m: f'{m.group(1)}"{ANY_DIGIT.sub("*", m.group(2))}{m.group(1)}"', text), 1


def _text_paths(value: Any) -> list[str]:
    """``_name_paths`` of a decoded line, with those of the JSON objects its string values hold."""
    paths = _name_paths(value)
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str) and v[:1] == "{":
            try:
                inner = orjson.loads(v)
            except orjson.JSONDecodeError:
                continue
            paths.extend(_name_paths(inner))
            stack.append(inner)
    return paths


def mask_names_in_arrays(value: Any) -> tuple[Any, int]:
    """``value`` (a flattened record's attribute value) with the member names of the objects inside
    its arrays starred digit by digit where their name paths hold a card number: flattening joins
    the names of nested objects but keeps arrays as values, so ``{"kv":[{"4111":{"1111":…}}]}``
    keeps its groups apart. Returns the value (the same object when nothing changed) and the PANs
    counted (0 or 1 per object)."""
    if isinstance(value, list):
        out, n = [], 0
        for v in value:
            v2, k = mask_names_in_arrays(v)
            out.append(v2)
            n += k
        return (out, n) if n else (value, 0)
    if isinstance(value, dict):
        if _holds_pan(list(flatten(value))):
            return _starred_names(value), 1
        out, n = {}, 0
        for k, v in value.items():
            out[k], m = mask_names_in_arrays(v)
            n += m
        return (out, n) if n else (value, 0)
    return value, 0


def _starred_names(value: Any) -> Any:
    if isinstance(value, dict):
        return {(ANY_DIGIT.sub("*", k) if isinstance(k, str) else k): _starred_names(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_starred_names(v) for v in value]
    return value


def member_names_may_contain_pan(names: Iterable[str]) -> bool:
    """False when no name among ``names`` can hold a PAN; for the keys of a flattened record
    (``payloads.prepare``), whose dots join the member names of nested objects:
    ``{"4790":{"4242":{"7528":{"3271":…}}}}`` is the key ``4790.4242.7528.3271``, a card layout the
    raw line's pre-filter (``may_contain_pan``) never sees whole — its groups stand apart there,
    between quotes and braces. Spring Boot 3.5's nested ECS nests every dotted MDC name so.

    Conservative: ASCII names with fewer than 13 digits in all → False; otherwise the names joined
    by ``|`` (which joins no digit run) get ``may_contain_pan``'s test (without its one-entry cache,
    which holds the line's own answer)."""
    joined = "|".join(names)
    if not _enough_digits(joined):
        return False
    if _may_contain_pan(joined):
        return True
    decoded = percent_separators_decoded(joined) if "%" in joined else joined
    return decoded is not joined and _may_contain_pan(decoded)


def _may_contain_pan(text: str) -> bool:
    """``may_contain_pan`` for a text that it has not answered True for by its flags already."""
    if ("\x00" in text or "\ufffd" in text) and _may_contain_pan(_without_debris(text)):
        return True  # ``mask_text`` masks the copy without decoding debris too
    ascii_text = text.isascii()
    if not ascii_text and _NON_ASCII_DIGIT.search(text):  # full-width, and every other digit ``\d`` matches
        return True
    data = text.encode("utf-8", "surrogatepass")
    # Digits become "1" and every separator byte goes, in one C pass (``_has_digit_run``).
    escapes = b"\\" in data
    ones = data.translate(_DIGITS_TO_ONES, _SEP_AND_ESCAPE_BYTES if escapes else _SEP_BYTES)
    # _DOTTED needs three dotted 4-digit groups: deleting separators keeps them (digits and dots stay).
    if _DOTTED_GROUPS in ones and _DOTTED.search(text):
        return True
    # A card layout with a dot (``4111 1111 1111.1111``): its digits next to the dot stay next to it
    # once the other separators are deleted; the exact test (Luhn included) when its shape is there.
    if b"1111." in ones and _mask_mixed_dotted(text)[1]:
        return True
    if _THIRTEEN_ONES not in ones and not (escapes and _form_feed_run(data)):  # \f escapes separate too
        return False
    # Second look without the identifiers that make most false alarms, pod UIDs and hex ids
    # (container, trace ids): ``mask_text`` looks only at the part of a run outside a UUID, and
    # a run cannot contain a UUID that has a letter, so blanking those UUIDs keeps every digit it
    # would look at; a hex token with a letter, bounded on both sides by characters that can
    # extend neither a run nor a token (not a word character, separator, separator escape or
    # ``%``), holds only runs that ``_hex_token_sides`` cuts off whole. The raw text shows a field's identifiers as decoded
    # unless an escape turns into a hex letter (\b, \f).
    if _HEX_LETTER_ESCAPE.search(text):
        return True
    # Track 2 is masked inside hex ids too.
    if _track2_hint(text):
        return True
    if ascii_text:
        return _run_outside_identifiers(text)
    blanked = _UUID_OR_HEX_TOKEN.sub(_blank_identifier, text)
    return _has_digit_run(blanked.encode("utf-8", "surrogatepass").translate(_DIGITS_TO_ONES))


def _run_outside_identifiers(text: str) -> bool:
    """``_has_digit_run`` of the ASCII ``text`` with its identifiers blanked
    (``_UUID_OR_HEX_TOKEN.sub(_blank_identifier, text)``), looking only at the windows
    (``_ascii_windows``) that hold a run before blanking.

    The same verdict: in ASCII text every byte ``_has_digit_run`` deletes (separators, backslash,
    ``n``, ``t``, ``r``) and every digit is a window character, so each run lies inside one
    window; each identifier match (hex digits and dashes) does too; blanking only removes digits.
    A window searched alone (``pos``, ``endpos`` one past its end) gives the whole text's matches
    in it: none reaches in from outside, the look-behind still sees the character before it, the
    look-ahead the one after it (``endpos``), and no match can include that non-window character.
    """
    delete = _SEP_AND_ESCAPE_BYTES if "\\" in text else _SEP_BYTES  # as _has_digit_run decides for the whole text
    size = len(text)
    # No \f escape here (the caller has answered True for one: ``_HEX_LETTER_ESCAPE``).
    for start, end in _ascii_windows(text):
        if _THIRTEEN_ONES not in text[start:end].encode("ascii").translate(_DIGITS_TO_ONES, delete):
            continue
        pieces = []
        last = start
        for m in _UUID_OR_HEX_TOKEN.finditer(text, start, min(end + 1, size)):
            pieces.append(text[last:m.start()])
            pieces.append(_blank_identifier(m))
            last = m.end()
        pieces.append(text[last:end])
        if _THIRTEEN_ONES in "".join(pieces).encode("ascii").translate(_DIGITS_TO_ONES, delete):
            return True
    return False


# A decimal digit other than 0-9 (full-width, Arabic-Indic, Devanagari…): ``_CANDIDATE``'s \d matches them
# all, so a text holding one is masked field by field (the digit-run test below sees only ASCII digits).
_NON_ASCII_DIGIT = re.compile(r"(?![0-9])\d")
_HEX_LETTER_ESCAPE = re.compile(r"\\[bf]")  # JSON escapes \b and \f: a hex letter in the raw text, not in the value


def _has_digit_run(ones: bytes) -> bool:
    """13 digits in a row once every separator byte and separator escape is deleted (``ones``:
    digits already "1")."""
    # Deleting the bytes of every separator (also the UTF-8 bytes of the no-break spaces, and
    # every backslash) only makes this test more permissive, never less. With a backslash in the
    # text, the letters of the escapes \n \t \r go too, wherever they are (one C pass instead of a
    # replace per escape; digits that only those letters separate are rare). A \f escape needs no
    # look: ``_may_contain_pan`` has answered True for a text holding one (``_HEX_LETTER_ESCAPE``).
    if b"\\" in ones:
        return _THIRTEEN_ONES in ones.translate(None, _SEP_AND_ESCAPE_BYTES)
    return _THIRTEEN_ONES in ones.translate(None, _SEP_BYTES)


def _blank_identifier(m: re.Match[str]) -> str:
    """ "U" for a hex token or a UUID with a letter; an all-digit UUID stays (a run may hold it)."""
    if m.group("uuid") is None:
        return "U"
    uuid = m.group()
    return uuid if uuid.replace("-", "").isdigit() else "U"


def _ascii_digit(match: re.Match[str]) -> str:
    return str(unicodedata.decimal(match.group()))


# Luhn's doubled digit (2d, less 9 above 9) of each ASCII digit, as a byte value.
_LUHN_DOUBLED = bytes.maketrans(b"0123456789", bytes([0, 2, 4, 6, 8, 1, 3, 5, 7, 9]))


def luhn_ok(digits: str) -> bool:
    """True when ``digits`` (decimal digits, of any script) passes the Luhn mod-10 check (ISO/IEC 7812-1 annex B)."""
    if digits.isascii() and digits.isdigit():  # in C: the undoubled digits summed, the doubled ones translated
        data = digits.encode("ascii")
        kept, doubled = data[-1::-2], data[-2::-2]
        return (sum(kept) - 48 * len(kept) + sum(doubled.translate(_LUHN_DOUBLED))) % 10 == 0
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if not 0 <= d <= 9:
            d = unicodedata.decimal(ch)
        if i & 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def mask_digits(digits: str) -> str:
    """``4111111111111111`` → ``411111******1111`` (first 6, last 4 kept)."""
    return digits[:6] + "*" * (len(digits) - 10) + digits[-4:]


def _is_expiry_yymm(four: str) -> bool:
    """``four`` digits read as an expiry date YYMM (month 01-12), as track 2 writes it."""
    return "01" <= four[2:] <= "12"


# A PAN with its expiry date glued on (``41111111111111112512``): a run of 20-23 digits whose
# first 16-19 digits start with 2-9 (not 20 or 21) and pass Luhn and whose last four are YYMM or MMYY.
PAN_EXPIRY_DIGITS = (20, 23)  # 16-19 digits + 4


def _is_pan_with_expiry(run: str) -> bool:
    """True when the digit ``run`` (20-23 ASCII digits) is a 16-19-digit PAN followed by an expiry
    date, YYMM or MMYY (month 01-12).

    Shorter PANs are left out: a 13-15-digit PAN and an expiry make 17-19 digits, which nanosecond
    times (19 digits) would match a few times in a hundred. A first digit 0 or 1 is left out too:
    no 16-19-digit card number starts with one (ISO/IEC 7812 major industry identifiers 0 and 1:
    industry assignments and airlines' 15-digit UATP cards), while 20-digit unsigned 64-bit
    integers (trace and span ids written in decimal) all start with 1 and zero-padded counters with
    0; and so are 20 and 21 (in no card network's range: Mastercard's 2-series is 2221-2720, Mir's
    2200-2204), where ids that start with a date (``20250304101500067462``) begin. About one random
    20-23-digit number in 44 among the others matches (Luhn 1 in 10, a month in one of the two
    places 23 in 100).
    """
    if not PAN_EXPIRY_DIGITS[0] <= len(run) <= PAN_EXPIRY_DIGITS[1] or run[0] in "01" or run[:2] in ("20", "21"):
        return False
    expiry = run[-4:]
    return (_is_expiry_yymm(expiry) or "01" <= expiry[:2] <= "12") and luhn_ok(run[:-4])


_ESCAPED_SEPARATOR = re.compile(r"\\+(?:u([0-9a-fA-F]{4})(?:\\+u([0-9a-fA-F]{4}))?|[tf])")


def _single_separator(sep: str) -> bool:
    """Whether ``sep`` (a separator run of ``_mask_run``) is one single separator, written as itself
    or as its JSON escape with any number of backslashes (``\\u0020``, ``\\u00ad``, ``\\t``, ``\\f``,
    a surrogate pair ``\\ud803\\udead``): a
    raw line spells the same PAN as the value it decodes to, so both must be found (its hash is
    stored: a PAN grouped 4-12 around an escaped space was hashed in clear)."""
    if len(sep) == 1:
        return sep in _SINGLE_SEPARATORS
    m = _ESCAPED_SEPARATOR.fullmatch(sep)
    if m is None:
        return False
    if m.group(1) is None:
        return True
    code = int(m.group(1), 16)
    if m.group(2) is not None:  # a surrogate pair
        code = 0x10000 + ((code - 0xD800) << 10) + (int(m.group(2), 16) - 0xDC00)
    return 0 <= code <= 0x10FFFF and chr(code) in _SINGLE_SEPARATORS


def _is_pan(groups: list[str], single: list[bool]) -> bool:
    """True when the digit ``groups`` joined are a PAN in an accepted spelling (module docstring):
    ``single[k]`` says whether the separator after ``groups[k]`` was one single separator."""
    digits = "".join(groups)
    if not PAN_MIN_DIGITS <= len(digits) <= PAN_MAX_DIGITS:
        return False
    if not all(single[:len(groups) - 1]) and not all(MIN_GROUP_DIGITS <= len(g) <= MAX_GROUP_DIGITS for g in groups):
        return False
    return luhn_ok(digits)


# How a card number is written in groups (``_card_layout``): Visa, Mastercard, Discover 4-4-4-4;
# 19-digit cards 4-4-4-4-3; American Express 4-6-5; Diners Club 4-6-4; 13-digit Visa 4-4-5; 15-digit 4-4-4-3.
PLUS_LAYOUTS = frozenset({(4, 4, 4, 4), (4, 4, 4, 4, 3), (4, 6, 5), (4, 6, 4), (4, 4, 5), (4, 4, 4, 3)})
# A "+" as a separator unit: itself, or its JSON escape (\u002b) with any number of backslashes.
_PLUS_ESCAPE = re.compile(r"\\+u002[bB]")


# The middle dots and bullets (``_DOT_SEPARATORS``) and their JSON escapes: separators in a card's layout only, as "+".
_DOT_ESCAPE = re.compile(r"\\+u(?:00[bB]7|202[27]|2219|22[cC]5|2043|25[eE]6|30[fF][bB]|[fF][fF]65)")


def _layout_only(sep: str) -> bool:
    """Whether the separator run ``sep`` holds a ``+`` (or its JSON escape; ``%2B`` is decoded to one
    in ``mask_text``'s decoded copy) or a middle dot or bullet (``_DOT_SEPARATORS``): separators
    that count only between a card's groups (``_card_layout``)."""
    if "+" in sep or any(ch in _DOT_SEPARATORS for ch in sep):
        return True
    return "\\" in sep and (_PLUS_ESCAPE.search(sep) is not None or _DOT_ESCAPE.search(sep) is not None)


def _card_layout(groups: list[str]) -> bool:
    """Whether digit ``groups`` joined by separators that include a ``+`` (or a middle dot or bullet)
    are a card number: its groups are a card's (``PLUS_LAYOUTS``) and it starts as a payment card
    does (``card_issuer_prefix``).

    ``+`` is a separator for one reason, URL form encoding of a card written in groups
    (``?pan=4111+1111+1111+1111``); elsewhere it joins numbers that are no card: a version's build
    metadata (``2.7.1+20250610012938``), an epoch time and its offset (``1744410386487+0100``), sums
    (``1271+3632+1768+4366``, ``3389065+8645929``): as a separator in any grouping it doubled the
    masking of such text (tester's measurement, e.g. 11% → 22% of epoch-ms-with-offset samples). A
    4-4-4-4 sum is a card's shape: the issuer prefix (every payment card network's PAN has one)
    leaves those starting 0, 1, 20-21, 28-29, 7, 80, 83-89, 9. Middle dots and bullets likewise
    (``4111 · 1111 · 1111 · 1111`` on a receipt), and for the same reason: a middle dot is also a
    decimal point (``98·00 89·57 34·92``, ``1775792846·339623``) and a bullet lists short numbers."""
    return (tuple(len(g) for g in groups) in PLUS_LAYOUTS
            and card_issuer_prefix(groups[0][0], groups[0][1]))


def _mask_run(run: str) -> tuple[str, int]:
    if run.isdigit():
        if PAN_MIN_DIGITS <= len(run) <= PAN_MAX_DIGITS and luhn_ok(run):
            return mask_digits(run), 1
        if _is_pan_with_expiry(run):  # the PAN masked as usual, the expiry date starred
            return mask_digits(run[:-4]) + "****", 1
        return run, 0
    # The whole run, else PANs aligned on group boundaries (``ref 2024 4111 1111 1111 1111``),
    # keeping the separators between the groups left.
    tokens = _SEP_RUN.split(run)
    seps = _SEP_RUN.findall(run)
    single = [_single_separator(sep) for sep in seps]
    layout_only = [_layout_only(sep) for sep in seps]
    out: list[str] = []
    count = 0
    i = 0
    while i < len(tokens):
        j_found = None
        for j in range(len(tokens), i, -1):
            # a window whose separators hold a "+", middle dot or bullet is a PAN only in a card's
            # groups (``_card_layout``)
            if _is_pan(tokens[i:j], single[i:]) and (not any(layout_only[i:j - 1]) or _card_layout(tokens[i:j])):
                j_found = j
                break
        if j_found is None:
            out.append(tokens[i])
            j_found = i + 1
        else:
            out.append(mask_digits("".join(tokens[i:j_found])))
            count += 1
        if j_found < len(tokens):
            out.append(seps[j_found - 1])
        i = j_found
    return ("".join(out), count) if count else (run, 0)


# Track 2 (ISO/IEC 7813; EMV tag 57, Track 2 Equivalent Data): PAN, separator ("=" on a magnetic
# stripe, "D" in EMV data), expiry YYMM, service code and discretionary data, in EMV data padded
# with "F". Up to 4 digits may come before the PAN (an EMV TLV dump's tag 57 and length, ``5713…``).
# The 3-digit service code is required (its first digit is 1, 2, 5, 6, 7 or 9, ISO/IEC 7813): without
# it about 1 random 64-character hex id in 10 000 would read as a PAN, "d" and an expiry.
_TRACK2 = re.compile(r"(?<!\d)(\d{%d,%d})([Dd=])(\d{4})([125679]\d\d\d*)" % (PAN_MIN_DIGITS, PAN_MAX_DIGITS + 4))
# What every track 2 candidate contains (``may_contain_pan``); written to start with the separator,
# which the regex engine skips to (4 times faster than trying 13 digits at every position).
_TRACK2_HINT = re.compile(r"[Dd=](?<=\d{%d}[Dd=])\d{7}" % PAN_MIN_DIGITS)


# An ASCII text with its digits as "1", the track 2 separators D, d and = as "d", all else ".":
# ``_TRACK2_HINT`` matches exactly where this holds 13 ones, a "d" and 7 ones in a row.
_TRACK2_MARKS = bytes(0x31 if chr(b).isdigit() else 0x64 if chr(b) in "Dd=" else 0x2E for b in range(128)) + b"." * 128
_TRACK2_SHAPE = b"1" * PAN_MIN_DIGITS + b"d" + b"1" * 7


def _track2_hint(text: str) -> bool:
    """``_may_hold_track2(text) and _TRACK2_HINT.search(text)``: for an ASCII text (where ``\\d`` is
    0-9) a C substring search of its shape (the regex, tried at every D, d and =, took 5 µs on a
    Fluent Bit line); other texts are searched."""
    if not text.isascii():
        return _TRACK2_HINT.search(text) is not None
    return _TRACK2_SHAPE in text.encode("ascii").translate(_TRACK2_MARKS)


def _may_hold_track2(text: str) -> bool:
    """False when ``_TRACK2_HINT`` cannot match: in an ASCII text its 13 digits before the separator
    are 13 ASCII digits in a row (one C pass instead of the search; its \\d is any Unicode digit,
    so other texts are searched)."""
    return not text.isascii() or _THIRTEEN_ONES in text.encode("ascii").translate(_DIGITS_TO_ONES)


def _track2_pan(digits: str) -> bool:
    """True when ``digits`` (before a track 2 separator) end with a PAN: a 13-19-digit suffix passes Luhn."""
    return any(luhn_ok(digits[-n:]) for n in range(min(len(digits), PAN_MAX_DIGITS), PAN_MIN_DIGITS - 1, -1))


def _mask_track2(text: str) -> tuple[str, int]:
    """Mask track 2 data (``4111111111111111D25122010000000000F``, ``;4111…=2512101…?``).

    It is masked even inside what looks like a hexadecimal identifier (EMV data is hex, and a
    track of 24 or 32 characters has an identifier's length). The digits before the separator are
    masked as one PAN (first 6 and last 4 shown: at most the PAN's first 6 when a TLV header comes
    first); every digit after it is starred: the expiry, the service code and the discretionary
    data, which holds the card verification value (sensitive authentication data, never stored
    after authorisation: PCI DSS 3.3.1.1). Separator and padding stay.
    """
    count = 0

    def repl(m: re.Match[str]) -> str:
        nonlocal count
        if not (_is_expiry_yymm(m.group(3)) and _track2_pan(m.group(1))):
            return m.group()
        count += 1
        return mask_digits(m.group(1)) + m.group(2) + "*" * (4 + len(m.group(4)))

    return _TRACK2.sub(repl, text), count


def _mask_dotted(text: str) -> tuple[str, int]:
    """Mask card numbers written in dotted 4-digit groups (``6011.0009.9013.9424``)."""
    count = 0

    def repl(m: re.Match[str]) -> str:
        nonlocal count
        digits = m.group().replace(".", "")
        if PAN_MIN_DIGITS <= len(digits) <= PAN_MAX_DIGITS and luhn_ok(digits):
            count += 1
            return mask_digits(digits)
        return m.group()

    return _DOTTED.sub(repl, text), count


def _dots_after_groups(data: bytes) -> list[int]:
    """Where in ``data`` (a text's bytes) a dot follows a digit group of 4 or 6 that starts the text
    or follows a non-digit: every dot of a ``_mask_mixed_dotted`` layout does (it follows the
    layout's first or another group). One C translation and a substring search that skips along
    the non-digits (a pattern holding the "x" mark stepped one byte at a time: 4 µs on a Fluent Bit
    line); ``1749032106.220081`` has 10 digits before its dot, ``17.0``, ``8.11``, ``10.4.7.21`` fewer than 4."""
    marks = data.translate(_DOT_MARKS)
    found = []
    i = marks.find(b"1111.")
    while i >= 0:
        if i == 0 or marks[i - 1] != 0x31:  # a group of 4
            found.append(i + 4)
        elif i >= 2 and marks[i - 2] == 0x31 and (i == 2 or marks[i - 3] != 0x31):  # of 6
            found.append(i + 4)
        i = marks.find(b"1111.", i + 1)
    return found


def _dot_after_group(data: bytes) -> bool:
    """Whether ``_dots_after_groups(data)`` finds one: False when no card layout with a dot can be in
    a text without ``\\u`` escapes (an escape's hex digits can touch a group: such texts are searched)."""
    return bool(_dots_after_groups(data))


def _maybe_mixed_dotted(text: str) -> bool:
    """False when ``_mask_mixed_dotted(text)`` provably masks nothing (see ``_dot_after_group``);
    a text with a ``\\u`` escape is searched."""
    if "." not in text:
        return False
    return "\\u" in text or _dot_after_group(text.encode("utf-8", "surrogatepass"))


# The characters a ``_MIXED_RUN`` match can contain: digits, dots, separators, and the backslashes,
# letters and hex digits of separator escapes. Every match lies inside one maximal stretch of them.
_MIXED_RUN_CHARS = frozenset(_SINGLE_SEPARATORS + "\n\r/_.\\0123456789abcdefABCDEFnrtu")


def _mixed_runs(text: str) -> list[re.Match[str]]:
    """The ``_MIXED_RUN`` matches of ``text`` that can hold a card layout with a dot, in order.

    In a text without ``\\u`` escapes whose digits are ASCII: the runs inside the stretch of run
    characters (``_MIXED_RUN_CHARS``) around each dot ``_dots_after_groups`` finds, the regex
    searched within that stretch only (tried at every position of a Fluent Bit line it took 170 µs).
    The same matches as the whole text's search there: none contains a character outside the
    stretch, the look-behind sees the characters before it, and the character after it (not a digit)
    answers the look-ahead as the text's end does. Any other text: the whole text is searched.
    """
    if "\\u" in text:
        return list(_MIXED_RUN.finditer(text))
    if text.isascii():
        dots = _dots_after_groups(text.encode("ascii"))
    else:  # byte offsets to character offsets (the digits are ASCII, or the whole text is searched)
        if _NON_ASCII_DIGIT.search(text):
            return list(_MIXED_RUN.finditer(text))
        data = text.encode("utf-8", "surrogatepass")
        dots = [len(data[:i].decode("utf-8", "surrogatepass")) for i in _dots_after_groups(data)]
    runs: list[re.Match[str]] = []
    size = len(text)
    end = 0  # the stretches searched so far end here
    for dot in dots:
        if dot < end:
            continue
        start = dot
        while start > 0 and text[start - 1] in _MIXED_RUN_CHARS:
            start -= 1
        end = dot + 1
        while end < size and text[end] in _MIXED_RUN_CHARS:
            end += 1
        runs.extend(_MIXED_RUN.finditer(text, start, end))
    return runs


def _mask_mixed_dotted(text: str) -> tuple[str, int]:
    """Mask card numbers printed in a card layout (``CARD_LAYOUTS``) whose groups are separated by
    single separator units, at least one a dot: ``4111 1111 1111.1111``, ``4111 1111-1111.1111``,
    ``3782.822463-10005``, ``4111.1111 1111 1111 111`` (19 digits). Each window of a run's groups
    that has a layout's group sizes, a dot among its separators, and passes Luhn is masked as one
    PAN (first 6 and last 4 digits, its separators dropped); the separators outside it stay.
    Windows without a dot are the general search's (``_CANDIDATE``). Decimals, versions, addresses
    and epoch times with a fraction have no card layout and stay (``12.345``, ``1.2.3``,
    ``10.4.12.21``, ``1764403200.123456``).

    Returns:
        ``(text, number_of_pans_masked)``; the same object when nothing was masked.
    """
    count = 0
    pieces: list[str] = []
    last = 0
    for m in _mixed_runs(text):
        parts = _MIXED_SPLIT.split(m.group())
        groups, seps = parts[0::2], parts[1::2]
        out: list[str] = []
        n = 0
        i = 0
        while i < len(groups):
            for layout in CARD_LAYOUTS:
                k = len(layout)
                window = groups[i:i + k]
                if (len(window) == k and all(len(g) == size for g, size in zip(window, layout))
                        and "." in seps[i:i + k - 1] and luhn_ok("".join(window))):
                    out.append(mask_digits("".join(window)))
                    n += 1
                    i += k
                    break
            else:
                out.append(groups[i])
                i += 1
            if i < len(groups):
                out.append(seps[i - 1])
        if n:
            pieces.append(text[last:m.start()])
            pieces.append("".join(out))
            last = m.end()
            count += n
    if not count:
        return text, 0
    pieces.append(text[last:])
    return "".join(pieces), count


def _hex_token_sides(text: str, start: int, end: int) -> tuple[bool, bool]:
    """Whether the run ``text[start:end]`` starts / ends inside a hexadecimal identifier: letters
    touch it, the whole alphanumeric token around that digit group is hexadecimal, and either it
    has hex letters on both sides of the group or its length is an identifier's (``HEX_ID_LENGTHS``:
    a span, trace or container id, a digest). A PAN only followed or only preceded by letters
    (``4111…DE``, ``card=4111…abc``) is not in one. ``(False, False)`` when it is not inside one."""
    left = start
    while left > 0 and text[left - 1].isalnum():
        left -= 1
    if left < start and left >= 1 and _PERCENT_ESCAPE.search(text[:start]) and text[start - 3] == "%":
        left = start  # "%3D" before the run is an escaped character, not part of a hex token
    elif left < start and left >= 1 and text[left - 1] == "\\":
        # A JSON escape before the run is not part of a hex token: "\b" (a backspace), "\u00a0".
        left += 5 if text[left] == "u" and start - left >= 5 and all(c in _HEX_CHARS for c in text[left + 1:left + 5]) else 1
    right = end
    while right < len(text) and text[right].isalnum():
        right += 1
    if left == start and right == end:
        return False, False
    if not (all(c in _HEX_CHARS for c in text[left:start]) and all(c in _HEX_CHARS for c in text[end:right])):
        return False, False
    first_end = start  # the first digit group ends where the run's first non-digit is
    while first_end < end and text[first_end].isdigit():
        first_end += 1
    last_start = end
    while last_start > start and text[last_start - 1].isdigit():
        last_start -= 1
    if first_end == end:  # one group: one token, an identifier with letters on both sides or of a known length
        inside = (left < start and right > end) or (right - left) in HEX_ID_LENGTHS
        return inside and left < start, inside and right > end
    return (left < start and (first_end - left) in HEX_ID_LENGTHS,
            right > end and (right - last_start) in HEX_ID_LENGTHS)


# An OTLP/JSON time field's value in a raw line (``"timeUnixNano":"1741083300067462000"``): a
# nanosecond time has 19 digits from 2001 to 2286 and passes Luhn one time in ten.
_OTLP_TIME_KEY = re.compile(r'"(?:timeUnixNano|observedTimeUnixNano)"\s*:\s*("?)$')
NS_TIME_DIGITS = 19


def _is_otlp_time(text: str, start: int, end: int) -> bool:
    """True when ``text[start:end]`` is exactly the 19-digit value of an OTLP ``timeUnixNano`` /
    ``observedTimeUnixNano`` member (a decimal string or a number), nothing more."""
    if end - start != NS_TIME_DIGITS or not (text[start:end].isascii() and text[start:end].isdigit()):
        return False
    key = _OTLP_TIME_KEY.search(text, max(0, start - 64), start)
    if key is None:
        return False
    after = text[end:end + 1]
    return after == '"' if key.group(1) else after in ("", ",", "}", " ", "\t", "\r", "\n")


def _outside_identifiers(text: str, start: int, end: int, uuids: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The part of the run ``text[start:end]`` outside the UUIDs and the hex token it starts or
    ends in: the digit groups inside the identifier and the separators next to them are cut off
    (``<uuid> 4111 1111 1111 1111`` still shows a PAN); None when nothing is left."""
    for s, e in uuids:
        if s <= start < e:
            start = e
        if s < end <= e:
            end = s
    start, end = _strip_separators(text, start, end)
    if start < end:
        cut_left, cut_right = _hex_token_sides(text, start, end)
        if cut_left:
            start = _first_group_end(text, start, end)
        if cut_right:
            end = _last_group_start(text, start, end)
        if cut_left or cut_right:
            start, end = _strip_separators(text, start, end)
    return (start, end) if start < end else None


def _strip_separators(text: str, start: int, end: int) -> tuple[int, int]:
    """``(start, end)`` without the separators at either edge of ``text[start:end]``."""
    lead = _SEP_RUN.match(text, start, end)
    if lead:
        start = lead.end()
    last = None
    for last in _SEP_RUN.finditer(text, start, end):
        pass
    if last is not None and last.end() == end:
        end = last.start()
    return start, end


def _first_group_end(text: str, start: int, end: int) -> int:
    """Where the run ``text[start:end]`` goes on after its first digit group (``end`` if it has one group)."""
    sep = _SEP_RUN.search(text, start, end)
    return sep.end() if sep else end


def _last_group_start(text: str, start: int, end: int) -> int:
    """Where the run ``text[start:end]``'s last digit group begins, less its separators (``start`` if one group)."""
    last = None
    for last in _SEP_RUN.finditer(text, start, end):
        pass
    return last.start() if last else start


def _clean_ascii(text: str) -> bool:
    """True when ``_mask_text`` provably leaves the ASCII ``text`` as it is and ``mask_text`` does
    not look at it again: fewer than 13 characters, or no ``\\u`` escape, no 13 digits in a row
    once every separator byte, escape letter and ``\\f`` escape is deleted (``_ascii_digit_run``),
    no three dotted 4-digit groups, and the same of its copy with URL separator escapes decoded
    (``percent_separators_decoded``: ``mask_text`` masks that copy too).

    One C pass instead of ``_mask_text``'s steps (a masker calls this for every field of a line
    that may hold a PAN; nearly all are clean). The same verdict, by each of its ways to mask:
    ``_DOTTED`` needs ``1111.1111.1111`` in the text with digits as ones, and deleting other bytes
    keeps that run (neither ``1`` nor ``.`` is deleted); every window ``_mask_text`` searches
    needs ``_maybe_run``, which for ASCII text without ``\\u`` needs 13 ones in the same
    translation of the window, a contiguous piece of this one; track 2 and every candidate are
    only looked for in such a window; without ``\\u`` there is no second pass."""
    if len(text) < PAN_MIN_DIGITS:
        return True
    if "\\u" in text:
        return False
    if "%" in text:  # mask_text masks the copy with separator escapes decoded too
        decoded = percent_separators_decoded(text)
        if decoded is not text and not (decoded.isascii() and _clean_ascii(decoded)):
            return False
    data = text.encode("ascii")
    ones = data.translate(_DIGITS_TO_ONES, _SEP_AND_ESCAPE_BYTES)
    if b"1111." in ones and _dot_after_group(data):  # a card layout with a dot may be there
        return False
    return _DOTTED_GROUPS not in ones and not _ascii_digit_run(data, ones)


def mask_text(text: str, *, keep_otlp_times: bool = False) -> tuple[str, int]:
    """Mask every PAN in ``text``.

    ``keep_otlp_times``: leave the 19-digit values of OTLP/JSON ``timeUnixNano`` and
    ``observedTimeUnixNano`` members as they are (raw OTLP lines in quarantine): the same rule
    as ``PanMasker.value``'s ``keep_int_keys`` for the parsed times. Any other run, also a 13-18
    digit value under those keys or one with separators, is masked as usual.

    A digit written as a JSON ``\\uXXXX`` escape (``\\u0034``, full-width ``\\uff14``, a surrogate
    pair for one beyond the BMP; any number of backslashes) counts as the digit (``unescape_digits``):
    a raw line is masked as the values decoded from it are. When such a digit is part of a PAN, the
    text returned has the escaped digits written as ASCII digits. Last, a copy with both escaped
    digits and percent-escaped separators decoded (``escapes_decoded``) is masked: a PAN there is
    masked in the text returned, the escapes outside it kept (``_kept_escapes``).

    NUL and U+FFFD are the debris of a wrong decoding (UTF-16 read as UTF-8: a NUL beside every
    character; bytes a shipper could not decode: U+FFFD), and they break a grouped card number's
    layout (``4\x001\x00 \x001\x00…``, ``4111\ufffd1111\ufffd…``): a text holding either is
    masked again with NUL deleted and U+FFFD as a space; a PAN found so is masked in the text
    returned, which then has them so.

    Returns:
        ``(masked_text, number_of_pans_masked)``; the text is returned unchanged (same object)
        when nothing was masked.
    """
    masked, count = _mask_all(text, keep_otlp_times)
    if "\x00" in masked or "\ufffd" in masked:
        again, more = _mask_all(_without_debris(masked), keep_otlp_times)
        if more:
            return again, count + more
    return masked, count


def _without_debris(text: str) -> str:
    """``text`` with NUL deleted and U+FFFD as a space (``mask_text``)."""
    return text.replace("\x00", "").replace("\ufffd", " ")


def _mask_all(text: str, keep_otlp_times: bool) -> tuple[str, int]:
    """``mask_text`` without its look at decoding debris."""
    if text.isascii() and _clean_ascii(text):
        return text, 0
    masked, count = _mask_text(text, keep_otlp_times, windowed=len(text) >= WINDOWED_FROM_CHARS)
    if not (("\\u" not in masked) if len(masked) < WINDOWED_FROM_CHARS else (has_unicode_escape(masked) is None)):
        # Second pass over the digits written as escapes: the first has masked the PANs written
        # plainly (an escaped digit next to one must not hide it by making the run longer).
        unescaped = unescape_digits(masked)
        if unescaped is not masked:
            again, more = _mask_text(unescaped, keep_otlp_times, windowed=len(unescaped) >= WINDOWED_FROM_CHARS)
            if more:
                masked, count = again, count + more
    if "%" in masked or "\\u" in masked:
        # Both decodings at once (``escapes_decoded``): a digit written ``\u0034`` in a card whose
        # groups are separated by ``%20`` is a PAN only in the copy with both applied (tester's
        # finding: neither pass alone saw it, and the raw line was hashed unmasked).
        decoded = escapes_decoded(masked)
        if decoded is not masked:
            again, more = _mask_text(decoded, keep_otlp_times, windowed=len(decoded) >= WINDOWED_FROM_CHARS)
            if more:
                return _track_data_after_masked(_kept_escapes(masked, decoded, again, keep_otlp_times)), count + more
    return (_track_data_after_masked(masked) if count else masked), count


# A masked PAN (first 6, 3-9 stars, last 4) followed by a track 2 field separator and 7 or more
# digits: the expiry YYMM, the service code and discretionary data of track 2 data whose PAN was
# written in groups (``5500-0055-5555-5559=2812101``), which the track 2 pattern (an unbroken PAN)
# does not see.
_MASKED_PAN_TRACK = re.compile(r"(\d{6}\*{3,9}\d{4})([Dd=])(\d{7,})")


def _track_data_after_masked(text: str) -> str:
    """``text`` with the digits of track 2 data after a masked PAN starred (PCI DSS 3.3.1: no track
    data is stored after authorisation; ``_MASKED_PAN_TRACK``)."""
    if "*" not in text:
        return text
    return _MASKED_PAN_TRACK.sub(lambda m: m.group(1) + m.group(2) + "*" * len(m.group(3)), text)


# A run of URL percent-escapes (RFC 3986 2.1): ``%20``, ``%2D``, ``%E2%80%93`` (an en dash in UTF-8).
_PERCENT_RUN = re.compile(r"(?:%[0-9A-Fa-f]{2})+")


def _percent_separators(match: re.Match[str]) -> str:
    """A ``_PERCENT_RUN`` match decoded when it is UTF-8 for separator characters only, else as it is."""
    try:
        decoded = bytes.fromhex(match.group().replace("%", "")).decode("utf-8")
    except UnicodeDecodeError:
        return match.group()
    return decoded if all(ch in _SEP_UNIT_CHARS for ch in decoded) else match.group()


def percent_separators_decoded(text: str) -> str:
    """``text`` with every run of URL percent-escapes that decodes (UTF-8) to separator characters
    only (``_SEP_UNIT_CHARS``) written as those characters: ``pan=4111%201111%201111%201111`` →
    ``pan=4111 1111 1111 1111``, also ``%2D``, ``%09``, ``%2B``, ``%E2%80%93``; the same object
    when there is none. Other escapes stay (``%3D``, ``%25``: a double-encoded ``%2520`` is left).

    Why a decoded copy and not ``%20`` as a separator unit: an escape's hex digits are decimal
    digits, so a run next to one would take them in (``q=%204111111111111111``: 18 digits, no PAN
    by Luhn — the card number was kept whole), and every digit-run rule would need an exception.
    ``mask_text`` masks such a copy (``escapes_decoded``: escaped digits decoded too) after the text
    itself; when it finds a PAN there, the text returned has the masked run as masked and every
    escape outside it as written (``_kept_escapes``). The ends of a cut text (``mask_cut_end``,
    ``mask_cut_start``) read percent-escaped separators too.
    """
    if "%" not in text:
        return text
    out = _PERCENT_RUN.sub(_percent_separators, text)
    return text if out == text else out


# A JSON \uXXXX escape, with any number of backslashes (an application's line escaped again in a
# shipper's string), or a UTF-16 surrogate pair of them (a character beyond the BMP). Written to
# start with a literal backslash: the engine then jumps from backslash to backslash (5x faster on a
# shipper's line than a pattern starting with a repeat, which is tried at every position).
_UNICODE_ESCAPE = re.compile(r"\\(?:\\*)u(?:[dD][89abAB][0-9a-fA-F]{2}\\+u[dD][c-fC-F][0-9a-fA-F]{2}|[0-9a-fA-F]{4})")


def _escaped_digit(match: re.Match[str]) -> str:
    """The ASCII digit a ``_UNICODE_ESCAPE`` match stands for when it is a decimal digit (Unicode Nd), else the match."""
    hexes = re.findall(r"u([0-9a-fA-F]{4})", match.group())
    units = [int(h, 16) for h in hexes]
    code = units[0] if len(units) == 1 else 0x10000 + ((units[0] - 0xD800) << 10) + (units[1] - 0xDC00)
    digit = unicodedata.decimal(chr(code), None)
    return match.group() if digit is None else str(digit)


def unescape_digits(text: str) -> str:
    """``text`` with every JSON ``\\uXXXX`` escape of a decimal digit (any script, any number of
    backslashes, surrogate pairs) written as the ASCII digit; the same object when there is none.

    ``{"note":"\\u0034111111111111111"}`` decodes to a PAN: masking the raw text without this would
    keep it, and a hash of that text would give its middle digits away to a brute force over
    10^6 candidates (PCI DSS 3.5.1.1). Other escapes stay as they are (separator escapes are
    separator units already: ``_SEP_UNIT``).
    """
    if "\\u" not in text:
        return text
    out = _UNICODE_ESCAPE.sub(_escaped_digit, text)
    return text if out == text else out


# A JSON ``\uXXXX`` escape (``_UNICODE_ESCAPE``) or a run of URL percent-escapes (``_PERCENT_RUN``).
_DECODABLE = re.compile(rf"(?P<u>{_UNICODE_ESCAPE.pattern})|{_PERCENT_RUN.pattern}")


def _decoded_piece(match: re.Match[str]) -> str:
    """A ``_DECODABLE`` match as ``escapes_decoded`` writes it (a digit, separators, or as it is)."""
    return _escaped_digit(match) if match.group("u") is not None else _percent_separators(match)


def escapes_decoded(text: str) -> str:
    """``text`` with both decodings ``mask_text`` reads a PAN through applied in one pass: every JSON
    ``\\uXXXX`` escape of a decimal digit written as the ASCII digit (``unescape_digits``) and every
    run of URL percent-escapes of separators written as those separators
    (``percent_separators_decoded``); the same object when neither is there.

    ``GET /pay?pan=\\u0034111%201111%201111%201111`` is a PAN only with both applied: masking each
    decoding alone left it whole in a raw line and in the hash stored for it (tester's finding)."""
    if "%" not in text and "\\u" not in text:
        return text
    out = _DECODABLE.sub(_decoded_piece, text)
    return text if out == text else out


def _decoded_starts(text: str) -> list[int]:
    """Where in ``text`` each character of ``escapes_decoded(text)`` comes from: ``starts[k]`` is the
    index of the first character of ``text`` that decoded character ``k`` is written with (an
    escape, a percent-escaped UTF-8 sequence, or the character itself); one more entry, ``len(text)``."""
    starts: list[int] = []
    last = 0
    for m in _DECODABLE.finditer(text):
        starts.extend(range(last, m.start()))
        piece = _decoded_piece(m)
        if piece == m.group():
            starts.extend(range(m.start(), m.end()))
        elif m.group("u") is not None:  # one digit
            starts.append(m.start())
        else:  # each character from its UTF-8 bytes, 3 characters (``%XX``) a byte
            pos = m.start()
            for ch in piece:
                starts.append(pos)
                pos += 3 * len(ch.encode("utf-8"))
        last = m.end()
    starts.extend(range(last, len(text) + 1))
    return starts


def _in_run(ch: str) -> bool:
    """A character a masked run can hold in a decoded copy: a digit, a separator, a dot, a star."""
    return ch.isdigit() or ch in _SEP_UNIT_CHARS or ch in ".*"


def _kept_escapes(text: str, decoded: str, masked: str, keep_otlp_times: bool) -> str:
    """``masked`` (``_mask_text`` of ``decoded``, ``escapes_decoded(text)``) with every stretch that
    masking left as it was written as in ``text``: a URL's ``%2B``, ``%20``, ``%3D`` and a JSON
    ``\\u0034`` outside a masked run keep their escapes (``%2B`` decoded to ``+`` changes what a
    query says). The masked runs are ``masked``'s own, whole, from digit to digit: the common
    start and end of ``decoded`` and ``masked`` less the run characters next to them (``_in_run``)
    up to a digit, and between them the stretches ``difflib`` finds equal, less the digits and
    stars next to a change (written as ``masked`` has them).

    Conservative: when the text this gives does not decode to a text ``_mask_text`` finds nothing
    more in, ``masked`` is returned (every escape decoded, as before)."""
    import difflib

    starts = _decoded_starts(text)
    if len(starts) != len(decoded) + 1:  # not expected; the decoded copy as it is
        return masked
    size = min(len(decoded), len(masked))
    head = 0
    while head < size and decoded[head] == masked[head]:
        head += 1
    common = head
    while head > 0 and _in_run(decoded[head - 1]):
        head -= 1
    while head < common and not decoded[head].isdigit():  # a run starts with a digit
        head += 1
    tail = 0
    while tail < size - head and decoded[-1 - tail] == masked[-1 - tail]:
        tail += 1
    common = tail
    while tail > 0 and _in_run(decoded[len(decoded) - tail]):
        tail -= 1
    while tail < common and not decoded[len(decoded) - tail - 1].isdigit():  # and ends with one
        tail += 1
    d_end, m_end = len(decoded) - tail, len(masked) - tail
    pieces = [text[:starts[head]]]
    matcher = difflib.SequenceMatcher(None, decoded[head:d_end], masked[head:m_end], autojunk=False)
    ops = matcher.get_opcodes()
    for k, (op, i1, i2, j1, j2) in enumerate(ops):
        if op != "equal":
            pieces.append(masked[head + j1:head + j2])
            continue
        # the digits and stars next to a change are the masked run's (written as ``masked`` has them)
        a, b = head + i1, head + i2
        if k > 0:
            while a < b and (decoded[a].isdigit() or decoded[a] == "*"):
                a += 1
        if k + 1 < len(ops):
            while b > a and (decoded[b - 1].isdigit() or decoded[b - 1] == "*"):
                b -= 1
        pieces.append(decoded[head + i1:a])
        pieces.append(text[starts[a]:starts[b]])
        pieces.append(decoded[b:head + i2])
    pieces.append(text[starts[d_end]:])
    out = "".join(pieces)
    if out != masked and _mask_text(escapes_decoded(out), keep_otlp_times,
                                     windowed=len(out) >= WINDOWED_FROM_CHARS)[1]:
        return masked
    return out


# From this length mask_text searches only the windows that can hold a candidate (whole lines).
WINDOWED_FROM_CHARS = 256
# The characters a candidate (``_CANDIDATE``), a UUID or a ``_MAYBE`` match can contain: digits,
# separators, backslashes and the letters and hex digits of separator escapes, hex digits. Every
# such match lies inside one maximal run of them, and a search confined to that run (``pos``,
# ``endpos``) finds the same matches as the search of the whole text: no match contains a
# character outside the run, and the character just outside it (neither a digit, a hex digit, a
# backslash nor ``u``) answers every look-behind and look-ahead of ``_CANDIDATE`` as the text's
# edge does.
_WINDOW = re.compile(rf"[\d{_SEP_CHARS}\\0-9A-Fa-fnrtu]{{{PAN_MIN_DIGITS},}}")
# The same runs in an ASCII text, found in C: its window characters become "w", the others ".".
_WINDOW_ASCII = bytes((0x77 if _WINDOW.fullmatch(chr(b) * PAN_MIN_DIGITS) else 0x2E) for b in range(256))
_WINDOW_MARKS = b"w" * PAN_MIN_DIGITS


def _ascii_windows(text: str) -> list[tuple[int, int]]:
    """The maximal runs of at least ``PAN_MIN_DIGITS`` window characters in the ASCII ``text``, as
    ``(start, end)``: those ``_WINDOW.finditer`` finds, by C substring searches (the first 13 marks
    in a row from a position start a run; the next non-mark ends it)."""
    marks = text.encode("ascii").translate(_WINDOW_ASCII)
    windows = []
    pos = 0
    while (start := marks.find(_WINDOW_MARKS, pos)) >= 0:
        end = marks.find(b".", start + PAN_MIN_DIGITS)
        if end < 0:
            end = len(marks)
        windows.append((start, end))
        pos = end
    return windows


def _maybe_run(text: str, start: int, end: int) -> bool:
    """``_MAYBE.search(text, start, end)`` found something; in ASCII text without a ``\\u`` escape
    a C-speed necessary test first: 13 digits in a row once every separator character and escape
    letter is deleted (every ``_SEP_UNIT`` there is made of those bytes: ``_has_digit_run``)."""
    part = text[start:end]
    if part.isascii() and "\\u" not in part:
        if not _ascii_digit_run(part.encode("ascii")):
            return False
    return _MAYBE.search(text, start, end) is not None


def _mask_text(text: str, keep_otlp_times: bool, *, windowed: bool) -> tuple[str, int]:
    """``mask_text``; ``windowed``: search the runs of ``_WINDOW`` instead of the whole text
    (same result, fewer positions tried on a long line)."""
    if len(text) < PAN_MIN_DIGITS and text.isascii():
        return text, 0  # every form masked here (plain, dotted, track 2) has 13 digits at least
    if not text.isascii():
        if _NON_ASCII_DIGIT.search(text):
            text = _NON_ASCII_DIGIT.sub(_ascii_digit, text)
        maybe_dotted = "." in text
    else:  # every _DOTTED match looks like 1111.1111.1111 once its ASCII digits are ones
        maybe_dotted = "." in text and _DOTTED_GROUPS in text.encode("ascii").translate(_DIGITS_TO_ONES)
    dotted = 0
    if maybe_dotted and _DOTTED.search(text):
        text, dotted = _mask_dotted(text)
    if _maybe_mixed_dotted(text):
        text, mixed = _mask_mixed_dotted(text)
        dotted += mixed
    if windowed:
        windows = _ascii_windows(text) if text.isascii() else [m.span() for m in _WINDOW.finditer(text)]
        windows = [w for w in windows if _maybe_run(text, *w)]
    else:
        windows = [(0, len(text))] if _maybe_run(text, 0, len(text)) else []
    if not windows:
        return text, dotted
    if _track2_hint(text):
        text, track2 = _mask_track2(text)
        if track2:  # masked text: fewer digits, the windows are searched again
            masked, n = _mask_text(text, keep_otlp_times, windowed=windowed)
            return masked, n + track2 + dotted
    uuids = [m.span() for w in windows for m in _UUID.finditer(text, *w)] if "-" in text else []
    pieces: list[str] = []
    last = 0
    count = 0
    for w in windows:
        for m in _CANDIDATE.finditer(text, *w):
            span = _outside_identifiers(text, *m.span(), uuids)
            if span is None:
                continue
            start, end = span
            if keep_otlp_times and _is_otlp_time(text, start, end):
                continue
            masked, n = _mask_run(text[start:end])
            if n:
                pieces.append(text[last:start])
                pieces.append(masked)
                last = end
                count += n
    if not count:
        return text, dotted
    pieces.append(text[last:])
    return "".join(pieces), count + dotted


# A PAN cut off at the end of a text: every digit after its first 6 is one PCI DSS 3.4.1 does not
# allow to be shown. Fewer digits would not do: the same PAN is often stored masked elsewhere
# (first 6, last 4), and a cut copy showing digits 7-10 next to it leaves 10 candidates (one
# digit, the other by Luhn) — a newcomer test found a CRI partial keeping 10 digits in quarantine.
CUT_PAN_MIN_DIGITS = 7
_CUT_END_CHARS = 512  # how far back from the end a trailing run is looked for
# The bytes of a multi-byte character cut at the end of a text, decoded with "replace" (U+FFFD)
# or "backslashreplace" (``\xc3``): the digits before them end the text as far as a cut PAN goes.
_UNDECODABLE_END = re.compile(r"(?:\ufffd|\\x[0-9a-fA-F]{2})+$")


# The characters a ``TRAILING_DIGIT_RUN`` match can end with besides a digit: a separator, or the
# last character of a separator escape (``\\n``, ``\\t``, ``\\r``, ``\\/``, or ``\\uXXXX``: a hex digit).
_RUN_LAST_CHARS = frozenset(_SINGLE_SEPARATORS + "\n\r/_." + "ntr" + "0123456789abcdefABCDEF")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _may_end_in_run(text: str) -> bool:
    """False when ``TRAILING_DIGIT_RUN`` cannot match in ``text`` from any position: its match ends
    at the end of the text, or before a final newline (``$``), so with a digit or the last
    character of a separator unit (``_RUN_LAST_CHARS``); a final newline is such a character
    itself. One look at the last character instead of a search tried at each of the last 512
    (30 µs on a quarantined line)."""
    last = text[-1:]
    return last.isdigit() or last in _RUN_LAST_CHARS if last else False


def _may_end_undecodable(text: str) -> bool:
    """False when ``_UNDECODABLE_END`` cannot match in ``text`` from any position: its match ends at
    the end of the text or before a final newline (``$``), with U+FFFD or a ``\\xNN`` escape."""
    end = text[:-1] if text.endswith("\n") else text
    return end.endswith("\ufffd") or (end[-4:-2] == "\\x" and all(c in _HEX_DIGITS for c in end[-2:])
                                       and len(end) >= 4)


def mask_cut_end(text: str) -> tuple[str, int]:
    """Mask the digits at the very end of ``text`` when they may be the start of a PAN cut off there.

    For text that may have been cut before it reached us (a quarantined line: a truncated file or
    .gz, an unterminated CRI partial, a JSON line that ends in the middle of a string): a run of
    ``CUT_PAN_MIN_DIGITS`` (7) or more digits (separators and their escapes between them, as for a PAN;
    the bytes of a multi-byte character cut after them, decoded as U+FFFD or ``\\xNN``, and an escape
    the cut left incomplete, ``%2``, ``\\u20``, ``%E2%80``, do not count; digits written as JSON
    escapes and separators as percent-escapes count as such: ``escapes_decoded``)
    that ends the text keeps its first 6 digits, every other digit becomes ``*`` and the separators
    inside the run go (``card 4111 1111 1111 111`` → ``card 411111*********``). Not first 6 / last 4:
    the last digits shown would be digits a masked copy of the same PAN elsewhere hides. Run
    ``mask_text`` first (a complete PAN at the end is masked as one, and then ends in 4 digits).

    Returns:
        ``(text, 1)`` with the run masked, or ``(text, 0)`` (same object) when none is there.
    """
    original = text
    undecodable = _UNDECODABLE_END.search(text, max(0, len(text) - _CUT_END_CHARS)) if _may_end_undecodable(text) else None
    if undecodable:
        text = text[:undecodable.start()]
    cut = _cut_escape_start(text)  # an escape the cut left incomplete (``%2``, ``\\u20``) is ignored too
    ignored = text[cut:] + (undecodable.group() if undecodable else "")
    text = text[:cut]
    tail = max(0, len(text) - _CUT_END_CHARS)
    # Digits written as \uXXXX escapes are digits and percent-escaped separators separators, read
    # in a decoded copy of the tail (``escapes_decoded``); the text before the run stays as written.
    piece = text[tail:]
    decoded = escapes_decoded(piece)
    m = TRAILING_DIGIT_RUN.search(decoded) if _may_end_in_run(decoded) else None
    if m is None:
        return original, 0
    start = m.start()
    lead = CUT_SEP_RUN.match(decoded, start)  # separators before the first digit stay
    if lead:
        start = lead.end()
    digits = "".join(CUT_SEP_RUN.split(decoded[start:]))
    if len(digits) < CUT_PAN_MIN_DIGITS:
        return original, 0
    if decoded is not piece:
        start = _decoded_starts(piece)[start]
    return text[:tail + start] + digits[:6] + "*" * (len(digits) - 6) + ignored, 1


# An escape cut off at the end of a text: a backslash run, ``\\u`` and up to 3 hex digits, a high
# surrogate whose low half is cut (``\\ud803\\u``), ``%`` and up to one hex digit.
_CUT_ESCAPE_END = re.compile(r"\\+u[dD][89abAB][0-9a-fA-F]{2}(?:\\+(?:u[0-9a-fA-F]{0,3})?)?$"
                             r"|\\+(?:u[0-9a-fA-F]{0,3})?$|%[0-9a-fA-F]?$")
_PERCENT_RUN_END = re.compile(r"(?:%[0-9A-Fa-f]{2})+$")


def _cut_escape_start(text: str) -> int:
    """Where an escape cut off at the end of ``text`` starts (``len(text)`` when there is none): a
    JSON escape or a URL percent-escape left incomplete (``_CUT_ESCAPE_END``), or a run of
    percent-escapes that ends in an incomplete UTF-8 sequence (``%E2%80``, an en dash cut), with
    that partial escape first cut off if there was one. ``mask_cut_end`` reads the digits before it."""
    end = len(text)
    m = _CUT_ESCAPE_END.search(text, max(0, end - 16))
    if m is not None:
        end = m.start()
    runs = _PERCENT_RUN_END.search(text, max(0, end - 12), end)
    if runs is not None:
        data = bytes.fromhex(runs.group().replace("%", ""))
        for back in range(1, min(3, len(data)) + 1):  # a UTF-8 lead byte whose sequence is cut
            byte = data[-back]
            need = 2 if 0xC0 <= byte < 0xE0 else 3 if 0xE0 <= byte < 0xF0 else 4 if 0xF0 <= byte < 0xF8 else 0
            if need:
                if need > back:
                    end = runs.end() - 3 * back
                break
            if not 0x80 <= byte < 0xC0:  # an ASCII byte: nothing cut
                break
    return end


CUT_START_KEEP = 4  # digits a continuation's leading digit run keeps (the last ones: a PAN's last 4)
_CUT_START_CHARS = 512  # how far from the start a leading run is looked for (as _CUT_END_CHARS)
# The bytes of a multi-byte character cut at the start (a separator such as U+00A0 split between
# the chunks), decoded as U+FFFD or written as ``\xNN``: they do not stop the run behind them.
_UNDECODABLE_START = re.compile(r"(?:\ufffd|\\x[0-9a-fA-F]{2})+")
# Separators, then digits with separators between them, ending on a digit.
_LEADING_DIGIT_RUN = re.compile(rf"(?:{_SEP_UNIT})*(?P<run>\d(?:(?:{CUT_SEP_UNIT})*\d)*)")


# A date in 4-2-2 groups (ISO 8601 and its slash/dot forms) starting the text: how plain-text log
# lines begin (Spring's console pattern, logback's default), never how a card number's tail is grouped.
_LEADING_DATE = re.compile(r"\d{4}([-/.])\d{2}\1\d{2}(?![0-9])")


def mask_cut_start(text: str) -> tuple[str, int]:
    """Mask the digits at the very start of ``text`` when they may be the end of a PAN cut off there.

    For the continuation of a partial line whose first chunks the parser did not see (another
    request, another file): a run of more than ``CUT_START_KEEP`` (4) digits (separators and their
    escapes and percent-escapes between them, as for a PAN; separators, the bytes of a cut
    multi-byte character and the rest of a cut separator escape, ``a0`` of ``\\u00a0``, before it
    stay: ``_cut_escape_rest_end``) that starts the text keeps its last 4 digits, every other digit becomes ``*``
    and the separators inside the run go (``11111111 ok`` → ``****1111 ok``), the mirror of
    ``mask_cut_end``. A run that starts with a date (``2025-06-04 10:15:06 INFO …``, how a
    plain-text log line begins) is left alone.

    Returns:
        ``(text, 1)`` with the run masked, or ``(text, 0)`` (same object) when none is there.
    """
    lead = _UNDECODABLE_START.match(text)
    skip = lead.end() if lead else 0
    skip = _cut_escape_rest_end(text, skip)  # the rest of a separator escape the cut began in
    # Digits written as \uXXXX escapes are digits and percent-escaped separators separators, read in
    # a decoded copy of the head (``escapes_decoded``); the text after the run stays as written.
    head = text[skip:skip + _CUT_START_CHARS]
    decoded = escapes_decoded(head)
    m = _LEADING_DIGIT_RUN.match(decoded)
    if m is None:
        return text, 0
    start, end = m.span("run")
    if _LEADING_DATE.match(decoded, start):  # "2025-06-04 10:15:06 INFO …": a plain-text log line's date
        return text, 0
    digits = "".join(CUT_SEP_RUN.split(decoded[start:end]))
    if len(digits) <= CUT_START_KEEP:
        return text, 0
    if decoded is not head:
        starts = _decoded_starts(head)
        start, end = starts[start], starts[end]
    start, end = skip + start, skip + end
    return text[:start] + "*" * (len(digits) - CUT_START_KEEP) + digits[-CUT_START_KEEP:] + text[end:], 1


# What a cut can leave of the JSON escape of a separator at a text's start (``a0`` of ``\u00a0``,
# ``u2013``): the ends of ``u`` and its 4 hex digits, each holding a letter (``0``, ``20`` of
# ``\u0020`` or ``%20`` are read as digits: more than a cut PAN's digits starred, never fewer).
_SEP_ESCAPE_RESTS = frozenset(("u" + code)[i:] for code in _SEP_ESCAPES for i in range(5)
                              if not ("u" + code)[i:].isdigit())


def _cut_escape_rest_end(text: str, pos: int) -> int:
    """Where the rest of a separator's JSON escape that starts ``text`` at ``pos`` ends (``pos`` when
    there is none): the shortest start of ``text[pos:]`` that is the end of such an escape and holds a
    letter (``_SEP_ESCAPE_RESTS``): ``a0`` of ``a01111\\u00a01111 ok``. The shortest: a longer one
    could take a digit of the card; a digit taken for a card's is only starred."""
    for size in range(1, 6):
        if text[pos:pos + size].lower() in _SEP_ESCAPE_RESTS:
            return pos + size
    return pos


# A JSON number written with an exponent (``4.111111111111111e15``): its digits as written need
# not be the digits of its value. Bounded: a value beyond 10^±40 holds no PAN-sized integer part.
_EXPONENT_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?[eE][+-]?\d+")
_MAX_EXPONENT = 40
_EXPONENT_HINT = re.compile(r"\d[eE][+-]?\d")


# The bytes ``_EXPONENT_NUMBER``'s look-behind refuses before a number, in ASCII: word characters and ".".
_BEFORE_NO_NUMBER = frozenset(b for b in range(128) if chr(b).isalnum() or chr(b) in "_.")


def _first_exponent_number_start(text: str) -> int:
    """A position no ``_EXPONENT_NUMBER`` match in ``text`` starts before, or -1 when there is none.

    In an ASCII text, by C searches for a digit followed by ``e``/``E`` (digits made ones) and, at
    each, a look at its number: a sign or not, then a digit after the ``e``; before it the digit
    run (``\\d+``), or a fraction and its integer part (``\\d+\\.\\d+``), preceded by neither a word
    character nor a dot (the look-behind: a number starts a run of digits; a ``-`` before it never
    stops it, and may start the match). The earliest such number's start (its ``-`` included); in
    ASCII, -1 exactly when the regex finds nothing. Hex ids are full of a digit and an ``e``
    (``3e4``) and a Fluent Bit line's pod UID and container id often start one: the substitution
    over the whole line took 21 µs. Other texts: 0, or -1 when ``_EXPONENT_HINT`` finds nothing."""
    if not text.isascii():
        return 0 if _EXPONENT_HINT.search(text) is not None else -1
    if "e" not in text and "E" not in text:
        return -1
    ones = text.encode("ascii").translate(_DIGITS_TO_ONES)
    size = len(ones)
    first = -1
    for e in (b"1e", b"1E"):
        i = ones.find(e)
        while i >= 0 and (first < 0 or i < first):
            j = i + 2
            if j < size and ones[j] in (0x2B, 0x2D):  # + -
                j += 1
            start = -1
            if j < size and ones[j] == 0x31:
                k = i  # the start of the digit run that ends before the e
                while k > 0 and ones[k - 1] == 0x31:
                    k -= 1
                if k > 0 and ones[k - 1] == 0x2E:  # a fraction: its integer part must start a number
                    m = k - 1
                    while m > 0 and ones[m - 1] == 0x31:
                        m -= 1
                    if m < k - 1 and (m == 0 or ones[m - 1] not in _BEFORE_NO_NUMBER):
                        start = m
                elif k == 0 or ones[k - 1] not in _BEFORE_NO_NUMBER:
                    start = k
            if start >= 0:
                if start > 0 and ones[start - 1] == 0x2D:
                    start -= 1
                first = start if first < 0 else min(first, start)
                break  # later ones of this letter start later
            i = ones.find(e, i + 1)
    return first


def mask_exponent_numbers(text: str) -> tuple[str, int]:
    """``text`` with each number written with an exponent whose value, written out, holds a PAN
    replaced by that value written out and masked (``4.111111111111111e15`` →
    ``411111******1111``, as ``PanMasker.value`` stores the decoded number); other numbers stay.

    For the raw text a hash is taken over (``raw_sha256``): ``mask_text`` reads
    ``4.111111111111111e15`` as no PAN, and a hash of a line holding it next to the masked field
    gives the middle digits away to a brute force (PCI DSS 3.5.1.1); a quarantined line shows them
    as they are. Slowish (a regex tried at every digit, after a search for an exponent): for
    quarantined text and the lines whose decoder saw such a number (``jsondoc.Decoder.saw_exponent``).

    Returns:
        ``(text, number_of_pans_masked)``; the same object when nothing was masked.
    """
    first = _first_exponent_number_start(text)
    if first < 0:
        return text, 0
    count = 0

    def expand(match: re.Match[str]) -> str:
        nonlocal count
        try:
            value = Decimal(match.group())
        except InvalidOperation:
            return match.group()
        if not -_MAX_EXPONENT < value.adjusted() < _MAX_EXPONENT:
            return match.group()
        masked, n = mask_text(format(value, "f"))
        count += n
        return masked if n else match.group()

    # ``_EXPONENT_NUMBER.sub(expand, text)`` from ``first`` on (no match starts before it; the
    # look-behind still sees the character before it)
    pieces: list[str] = []
    last = 0
    for match in _EXPONENT_NUMBER.finditer(text, first):
        pieces.append(text[last:match.start()])
        pieces.append(expand(match))
        last = match.end()
    if not count:
        return text, 0
    pieces.append(text[last:])
    return "".join(pieces), count


# Characters no text log line holds and binary data (a protobuf file read as lines) does: C0
# controls other than tab, LF, FF, CR and ESC (coloured logs), DEL, U+FFFD (an undecodable byte or NUL).
_BINARY_CHAR = re.compile("[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f\x7f\ufffd]")
_LONG_DIGIT_RUN = re.compile(r"\d{%d,}" % PAN_MIN_DIGITS)


def mask_binary(text: str) -> tuple[str, int]:
    """In text that holds binary data (``_BINARY_CHAR``), mask every run of 13 or more digits, Luhn or not.

    Binary data has no word boundaries: a protobuf tag or length byte that reads as a digit
    (``0``-``9`` are 0x30-0x39: field 6 and 7 tags, lengths 48-57) can touch either end of a PAN
    (``card 4111111111111111`` and the tag ``2``: 17 digits, not a PAN by Luhn). Each run keeps its
    first 6 and last 4 digits. Text without such a character is returned as it is.

    Returns:
        ``(masked_text, number_of_runs_masked)``.
    """
    if not _BINARY_CHAR.search(text):
        return text, 0
    return _LONG_DIGIT_RUN.subn(lambda m: mask_digits(m.group()), text)


# A PAN as ``mask_digits`` leaves it: its first six digits (the issuer identification number) kept.
_MASKED_PAN = re.compile(r"(\d)(\d)\d{4}\*{3,}\d{4}")


def card_issuer_prefix(first: str, second: str) -> bool:
    """Whether a number whose first two digits are ``first`` and ``second`` can be a payment card's
    PAN by its issuer identification number (ISO/IEC 7812-1 major industry identifier and the
    networks' ranges): 3 (American Express 34/37, Diners Club 30/36/38/39, JCB 35), 4 (Visa),
    5 (Mastercard 51–55, Maestro), 6 (Discover, UnionPay, Maestro, RuPay), 22–27 (Mir 2200–2204,
    Mastercard 2221–2720), 81–82 (RuPay, UnionPay). Not 0, 1, 20–21, 28–29, 7, 80, 83–89, 9:
    years (``20261130-…``), snowflake and sequence ids start so."""
    a, b = int(first), int(second)
    return 3 <= a <= 6 or (a == 2 and 2 <= b <= 7) or (a == 8 and b in (1, 2))


def number_holds_pan(value: Any, *, card_issuer_only: bool = False) -> bool:
    """Whether the integer part of the number ``value`` (an int, a float, a ``Decimal``, or a
    numeric string such as ``"4111111111111111"`` or ``"4111111111111111.5"``) holds a PAN as
    ``mask_text`` reads a digit run: 13-19 digits passing Luhn, or such a PAN with its expiry glued
    on. ``card_issuer_only``: only when it starts as a card can (``card_issuer_prefix``), the rule
    for identifiers — for values that are legitimately long Luhn-valid numbers one time in ten
    (epoch milliseconds, microseconds and nanoseconds start with 1 until 2033, 20-21 until 2039).

    For numeric columns: a float holds a 16-digit integer exactly (``latency_ms`` 4111111111111111
    was stored as 4.11111111111111e+15, the PAN whole), and a time read from one keeps its digits
    (``"4111111111111111"`` as epoch microseconds). Anything that is not a finite number: False.
    """
    if isinstance(value, bool):
        return False
    try:
        if isinstance(value, float):
            dec = Decimal(repr(value))
        elif isinstance(value, str):
            dec = Decimal(value.strip())
        else:
            dec = Decimal(value)
    except (InvalidOperation, ValueError, TypeError):
        return False
    if not dec.is_finite() or not -_MAX_EXPONENT < dec.adjusted() < _MAX_EXPONENT:
        return False
    candidates = {str(int(abs(dec)))}
    if isinstance(value, float):
        candidates.add(str(int(abs(value))))  # the float's exact value, beyond its shortest repr's digits
    for digits in candidates:
        masked, n = mask_text(digits)
        if n and (not card_issuer_only or any(card_issuer_prefix(m.group(1), m.group(2))
                                              for m in _MASKED_PAN.finditer(masked))):
            return True
    return False


def mask_identifier(value: str, key: bytes | None = None) -> tuple[str, int]:
    """``mask_text`` for an identifier (a transaction id): its PANs masked only when some masked
    number starts as a payment card can (``card_issuer_prefix``); else ``value`` unchanged, 0.
    With ``key`` (``DRAUDIT_PAN_TOKEN_KEY``) a masked id ends with ``~`` and a token: the first 16
    hex digits of HMAC-SHA256(key, value) (RFC 2104), so distinct ids stay distinct.

    Why: one number in ten passes the Luhn check, so numeric and date-based ids (``20261130-00012341``,
    ``1000000000000107``) were masked like card numbers, lost for ``draudit trace``, and two ids
    masked alike with the same content were stored as one transaction. A card number in an id field
    is still masked: every PAN starts with one of those prefixes. But so do ids of other shapes
    (``261130…``: a date in Mastercard's 2-series; snowflake ids from 4…): without a key, two such
    ids masked alike are one id in the store. The token is keyed (PCI DSS v4.0 3.5.1.1: a hash of a
    PAN must be a keyed cryptographic hash), so it cannot be searched for the hidden digits without
    the key, which the store never holds.
    """
    masked, n = mask_text(value)
    if n and any(card_issuer_prefix(m.group(1), m.group(2)) for m in _MASKED_PAN.finditer(masked)):
        if key:
            masked += "~" + hmac.new(key, value.encode("utf-8"), hashlib.sha256).hexdigest()[:16]
        return masked, n
    return value, 0


class NullMasker:
    """The ``PanMasker`` interface for input proven PAN-free by ``may_contain_pan``: returns values as given."""

    __slots__ = ()
    masked = 0

    def text(self, value: str, *, keep_otlp_times: bool = False) -> str:
        return value

    def identifier(self, value: str) -> str:
        return value

    def value(self, value: Any, keep_int_keys: frozenset[str] = frozenset()) -> Any:
        return value


NULL_MASKER = NullMasker()


class PanMasker:
    """Masks PANs in strings and nested JSON-like values and counts what it masked.

    ``masked`` is the running number of PAN occurrences replaced. Integers and floats whose decimal
    text contains a PAN become the masked string (a JSON number 4111111111111111 would otherwise
    reach the database intact).
    """

    __slots__ = ("masked", "key")

    def __init__(self, key: bytes | None = None) -> None:
        self.masked = 0
        self.key = key  # for identifiers' tokens (``mask_identifier``)

    def text(self, value: str, *, keep_otlp_times: bool = False) -> str:
        """``value`` with every PAN masked (``keep_otlp_times``: see ``mask_text``)."""
        out, n = mask_text(value, keep_otlp_times=keep_otlp_times)
        self.masked += n
        return out

    def identifier(self, value: str) -> str:
        """``value`` (a transaction id) as ``mask_identifier`` gives it (with this masker's ``key``),
        counting what it masked."""
        out, n = mask_identifier(value, self.key)
        self.masked += n
        return out

    def value(self, value: Any, keep_int_keys: frozenset[str] = frozenset()) -> Any:
        """Mask a JSON-like value (str, number, list, dict: keys and values), returning a new value.

        ``keep_int_keys``: dict keys whose *integer* values are our own parsed nanosecond times
        (``envelope.runtime_time_ns``…); a 19-digit epoch-ns value passes Luhn one time in ten and
        must not be garbled. Strings under those keys are still masked.
        """
        if isinstance(value, str):
            if value.__class__ is str and value.isascii() and _clean_ascii(value):
                return value  # what ``text`` returns for it (``mask_text``'s first test), without the calls
            return self.text(value)
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, int):
            if -10**12 < value < 10**12:
                return value
            out, n = mask_text(str(value))
            if n:
                self.masked += n
                return out
            return value
        if isinstance(value, float):
            if -1e12 < value < 1e12:
                return value
            out, n = mask_text(repr(value))
            if n:
                self.masked += n
                return out
            return value
        if isinstance(value, dict):
            # ``{text(k): value(v)}`` (a key of ``keep_int_keys`` keeps an integer), a clean ASCII
            # key or string value taken as it is in place of the calls (a line that may hold a PAN
            # has every field masked: nearly all are clean)
            out = {}
            for k, v in value.items():
                if k.__class__ is str:
                    key = k if k.isascii() and _clean_ascii(k) else self.text(k)
                else:
                    key = self.text(k) if isinstance(k, str) else k
                if v.__class__ is str:
                    out[key] = v if v.isascii() and _clean_ascii(v) else self.text(v)
                else:
                    out[key] = v if (k in keep_int_keys and isinstance(v, int)) else self.value(v, keep_int_keys)
            return out
        if isinstance(value, (list, tuple)):
            return [self.value(v, keep_int_keys) for v in value]
        return value
