"""Card numbers whose digit groups are separated by Unicode spaces and dashes, line and paragraph
separators, vertical tab, form feed, the minus sign and "+" are masked (PCI DSS v4.0 3.3-3.5).

Tester's finding: ``card 4111–1111–1111–1111`` (EN DASH), ``card ４１１１　１１１１…`` (full-width
digits and IDEOGRAPHIC SPACE: the digits were stored as ASCII, the card number whole) and
``GET /pay?pan=4111+1111+1111+1111`` reached the database unmasked: only space, dash, tab, three
no-break spaces and invisible format characters counted as separators. Now every character of
Unicode categories Zs, Zl, Zp and Pd, vertical tab, form feed, U+2212, "+", middle dots and bullets
and NUL (between the digits of UTF-16 text read as UTF-8) does, written as
itself or as its JSON escape, in masking, in the pre-filters that let a line skip masking, and at
the ends of a cut text. Text holding those characters without a Luhn-valid 13-19 digit run stays.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import unicodedata

import pytest

from collector.ingest import fastpath, pan
from collector.ingest.parser import LineParser
from tests.test_ingest_fastpath import NESTED, SOURCE, _general, _with, fluent

VISA, AMEX = "4111111111111111", "378282246310005"
VISA_MASKED, AMEX_MASKED = "411111******1111", "378282*****0005"

# The separators this change adds, each with a name for the test ids.
NEW_SEPARATORS = {
    "en-dash": "\u2013", "em-dash": "\u2014", "hyphen": "\u2010", "non-breaking-hyphen": "\u2011",
    "figure-dash": "\u2012", "horizontal-bar": "\u2015", "two-em-dash": "\u2e3a", "three-em-dash": "\u2e3b",
    "small-em-dash": "\ufe58", "small-hyphen-minus": "\ufe63", "fullwidth-hyphen-minus": "\uff0d",
    "armenian-hyphen": "\u058a", "minus-sign": "\u2212", "plus": "+",
    "ideographic-space": "\u3000", "ogham-space": "\u1680", "en-quad": "\u2000", "em-space": "\u2003",
    "hair-space": "\u200a", "medium-math-space": "\u205f", "line-separator": "\u2028",
    "paragraph-separator": "\u2029", "vertical-tab": "\v", "form-feed": "\f",
    "yezidi-hyphenation-mark": "\U00010ead",  # beyond the BMP: a surrogate pair when JSON-escaped
    # middle dots and bullets (``4111 · 1111 · …`` was stored whole), and NUL (UTF-16 text read as UTF-8)
    "middle-dot": "\u00b7", "bullet": "\u2022", "hyphenation-point": "\u2027", "bullet-operator": "\u2219",
    "katakana-middle-dot": "\u30fb", "halfwidth-katakana-middle-dot": "\uff65", "dot-operator": "\u22c5",
    "hyphen-bullet": "\u2043", "white-bullet": "\u25e6", "nul": "\x00",
}
IDS = list(NEW_SEPARATORS)
SEPS = list(NEW_SEPARATORS.values())


def _grouped(card: str, sep: str) -> str:
    groups = [card[:4], card[4:8], card[8:12], card[12:]] if len(card) == 16 else [card[:4], card[4:10], card[10:]]
    return sep.join(groups)


def _unseparated(text: str) -> str:
    """``text`` without any separator character or its JSON escape: what a PAN search of a dump needs."""
    text = re.sub(r"\\+(?:u[0-9a-fA-F]{4}|[ntrf/])", "", text)
    return "".join(ch for ch in text if ch not in pan._SEP_UNIT_CHARS and ch != ".")


def test_the_separator_set_is_every_unicode_space_and_dash_and_no_field_delimiter():
    every = {chr(c) for c in range(sys.maxunicode + 1)
             if unicodedata.category(chr(c)) in ("Zs", "Zl", "Zp", "Pd")}
    assert len(every) > 40 and every <= set(pan._SINGLE_SEPARATORS)  # planes 4-16 hold none: the import scan suffices
    assert set("\v\f\u2212+") <= set(pan._SINGLE_SEPARATORS)
    assert not set(":,|.") & set(pan._SINGLE_SEPARATORS)
    assert set(SEPS) <= set(pan._SINGLE_SEPARATORS)
    # every byte of every separator is deleted by the pre-filters' tables
    for ch in pan._SINGLE_SEPARATORS:
        assert set(ch.encode("utf-8")) <= set(pan._SEP_BYTES), hex(ord(ch))


@pytest.mark.parametrize("sep", SEPS, ids=IDS)
def test_a_card_grouped_by_each_new_separator_is_masked(sep):
    for card, masked in ((VISA, VISA_MASKED), (AMEX, AMEX_MASKED)):
        text = f"card {_grouped(card, sep)} declined"
        assert pan.mask_text(text) == (f"card {masked} declined", 1), text
        assert pan.may_contain_pan(text) and not (text.isascii() and pan._clean_ascii(text))
        # any grouping with a single separator (4-12), and runs of it (two between groups); "+",
        # middle dots and bullets only in a card's groups (``pan._card_layout``:
        # tests/test_ingest_pan_escape_combinations.py; a middle dot is also a decimal point)
        split = f"pan={card[:4]}{sep}{card[4:]}"
        layout_only = sep == "+" or sep in pan._DOT_SEPARATORS
        assert pan.mask_text(split) == ((split, 0) if layout_only else (f"pan={masked}", 1))
        assert pan.mask_text(f"pan={_grouped(card, sep * 2)};") == (f"pan={masked};", 1)
    assert pan.mask_identifier(f"TX-{_grouped(VISA, sep)}") == (f"TX-{VISA_MASKED}", 1)


@pytest.mark.parametrize("sep", SEPS, ids=IDS)
def test_json_escapes_of_each_new_separator_in_a_raw_line_are_masked(sep):
    """A raw line spells the card as its decoded value does: escaped once (``\\u2013``, ``\\f``,
    ``\\ud803\\udead``) and twice (an application's line in a shipper's string)."""
    message = f"card {_grouped(VISA, sep)}"
    once = json.dumps({"message": message})  # ensure_ascii: every non-ASCII separator as \\uXXXX
    twice = json.dumps({"log": once})
    for raw in (once, twice, json.dumps({"message": message}, ensure_ascii=False)):
        masked, n = pan.mask_text(raw)
        assert n == 1 and VISA_MASKED in masked and "1111" * 2 not in _unseparated(masked), raw
        assert VISA not in _unseparated(masked)
        assert pan.may_contain_pan(raw)
        assert pan.may_contain_pan(raw, unicode_escapes="\\u" in raw)
        assert not (raw.isascii() and pan._clean_ascii(raw))


@pytest.mark.parametrize("sep", SEPS, ids=IDS)
def test_a_card_cut_at_either_end_keeps_no_more_than_a_masked_card_shows(sep):
    assert pan.mask_cut_end(f"card 4111{sep}1111{sep}11") == ("card 411111****", 1)
    assert pan.mask_cut_start(f"11{sep}1111 declined") == ("**1111 declined", 1)
    assert pan.mask_cut_start(f"{sep}111{sep}1111 ok") == (f"{sep}***1111 ok", 1)


LOOKALIKES = [
    "season 2025–2026, pages 10–20 — see note",
    "tel +49 30 1234 5678",  # 12 digits
    "x = 10 − 5 + 3 = 8",
    "card 4111–1111–1111–1112 rejected by Luhn",
    "4111\u30001111\u30001111\u3000111",  # 15 digits, not Luhn-valid
    "東京　２０２５年６月４日　１０時",
    "semver 2.17.1+build.20261130",
    "a+b+c 12+34+56+78",
    "order 2025—06—04 ref ７７７",
    "items\u2028line two\u2029para 12345",
    "col1\vcol2\fpage 3",
    "2025-06-04T10:15:00+02:00 took 12 ms",
    "card 4111:1111:1111:1111 | 4111,1111,1111,1111",  # ":" and "," are no separators
    "GET /search?q=red%20shoes&size=42%2D44&page=2%20of%2010",
    "GET /pay?pan=4111%201111%201111%201112",  # not Luhn-valid
]


@pytest.mark.parametrize("text", LOOKALIKES)
def test_text_with_the_new_separators_and_no_card_number_is_left_alone(text):
    ascii_digits = re.sub(r"\d", lambda m: str(unicodedata.decimal(m.group())), text)
    # digits of other scripts come back as ASCII digits (as before this change), nothing else changes
    assert pan.mask_text(text) == (ascii_digits, 0)
    assert pan.mask_text(json.dumps({"message": text})) == (json.dumps({"message": text}), 0)
    parser = LineParser(cluster="c")
    units, masked = _general(parser, fluent(_with(NESTED, txn_id="T-LOOK", message=text)).encode(), "1")
    assert masked == 0
    assert json.loads(units[0][2][-1])["message"] == ascii_digits  # the attributes column


@pytest.mark.parametrize("url,masked", [
    ("GET /pay?pan=4111%201111%201111%201111 200", "GET /pay?pan=411111******1111 200"),
    ("GET /pay?pan=4111%2D1111%2d1111%2D1111&x=1", "GET /pay?pan=411111******1111&x=1"),
    ("GET /pay?q=%204111111111111111", "GET /pay?q=%20411111******1111"),  # the escape's digits are no part of the run
    ("POST /v1/pay card=3782%E2%80%93822463%E2%80%9310005", "POST /v1/pay card=378282*****0005"),
    # escapes outside the masked card number stay as written (``pan._kept_escapes``)
    ("GET /a%20b?pan=4111%201111%201111%201111", "GET /a%20b?pan=411111******1111"),
])
def test_separators_written_as_url_percent_escapes_are_masked(url, masked):
    assert pan.mask_text(url) == (masked, 1)
    assert pan.may_contain_pan(json.dumps({"message": url})) and not pan._clean_ascii(url)
    parser = LineParser(cluster="c")
    units, n = _general(parser, fluent(_with(NESTED, txn_id="T-URL", message=url)).encode(), "1")
    assert n >= 1 and json.loads(units[0][2][-1])["message"] == masked


# -- through the parser: message, MDC field, key, Fluent Bit envelope, CRI line, quarantine ----------

SPELLINGS = {  # how each reaches a log line
    "en-dash": ("4111–1111–1111–1111", VISA_MASKED),
    "fullwidth-ideographic": ("４１１１　１１１１　１１１１　１１１１", VISA_MASKED),
    "plus": ("4111+1111+1111+1111", VISA_MASKED),
    "minus-amex": ("3782−822463−10005", AMEX_MASKED),
    "line-separator": ("4111\u20281111\u20281111\u20281111", VISA_MASKED),
    "form-feed": ("4111\f1111\f1111\f1111", VISA_MASKED),
    "vertical-tab": ("4111\v1111\v1111\v1111", VISA_MASKED),
    "fullwidth-hyphen": ("4111－1111－1111－1111", VISA_MASKED),
    "medium-math-space": ("4111\u205f1111\u205f1111\u205f1111", VISA_MASKED),
    "yezidi": ("4111\U00010ead1111\U00010ead1111\U00010ead1111", VISA_MASKED),
}


def _lines(card: str) -> dict[str, str]:
    flat = {"@timestamp": "2025-06-04T10:15:00.067Z", "log.level": "INFO", "message": "scored",
            "txn_id": "T-MDC", "decision": "APPROVE", "mdc": {"card": card, "user": "u-17"}}
    return {
        "message": json.dumps({"@timestamp": "2025-06-04T10:15:00Z", "txn_id": "T-MSG", "decision": "A",
                               "message": f"card {card}"}, ensure_ascii=False),
        "message-escaped": json.dumps({"@timestamp": "2025-06-04T10:15:00Z", "txn_id": "T-ESC", "decision": "A",
                                       "message": f"card {card}"}),
        "mdc": json.dumps(flat, ensure_ascii=False),
        "key": json.dumps({"@timestamp": "2025-06-04T10:15:00Z", "txn_id": "T-KEY", "decision": "A",
                           "extra": {f"card {card}": "declined"}}, ensure_ascii=False),
        "fluentbit": fluent(_with(NESTED, txn_id="T-FB", message=f"scored card {card}")),
        "cri": "2025-06-04T10:15:00.067462000Z stdout F " + json.dumps(
            {"@timestamp": "2025-06-04T10:15:00Z", "txn_id": "T-CRI", "decision": "A", "message": f"pay {card} ok"},
            ensure_ascii=False),
        "quarantined": f"2025-06-04 10:15:00 WARN payment failed for card {card} (plain text, no JSON)",
    }


def _values(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _values(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _values(v)
    else:
        yield value


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_each_spelling_is_masked_in_every_field_and_envelope_by_the_parser(name):
    card, masked = SPELLINGS[name]
    digits = masked[:6] + "*" * (len(masked) - 10) + masked[-4:]
    full = VISA if masked == VISA_MASKED else AMEX
    for where, line in _lines(card).items():
        parser = LineParser(cluster="c")
        data = line.encode("utf-8", "surrogatepass")
        outcomes = parser.feed_bytes(data, SOURCE, "1")
        (out,) = outcomes
        assert parser.masker.masked >= 1, where
        if where == "quarantined":
            assert out.record is None and out.reason.startswith("unparseable")
            assert out.raw_text == f"2025-06-04 10:15:00 WARN payment failed for card {digits} (plain text, no JSON)"
        else:
            rec = out.record
            assert rec is not None, (where, out.reason)
            texts = [v for v in _values(rec.attributes) if isinstance(v, str)]
            assert any(digits in t for t in texts), (where, rec.attributes)
            if where == "mdc":
                assert rec.attributes["mdc.card"] == digits
            if where == "key":
                assert rec.attributes == {f"extra.card {digits}": "declined"}  # the key masked, flattened
        dump = _unseparated(repr(outcomes))
        assert full not in dump, (where, dump)
        # the fast path declines the line and the general path gives one answer for it
        if where != "quarantined":
            assert pan.may_contain_pan(line)
            fast_parser, general_parser = LineParser(cluster="c"), LineParser(cluster="c")
            assert fastpath.unit(fast_parser, data, SOURCE, "1") is None, (where, line)
            assert _general(fast_parser, data, "1") == _general(general_parser, data, "1")


# -- draudit ingest into SQLite ------------------------------------------------------------------------

def _draudit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collector.cli", *args], capture_output=True, text=True, timeout=300)


def test_draudit_ingest_stores_no_full_card_number(tmp_path):
    db = tmp_path / "x.db"
    url = f"sqlite:///{db}"
    assert _draudit("db", "upgrade", "--database-url", url).returncode == 0
    lines = [  # the tester's three lines, then each spelling as a message, MDC field, Fluent Bit and CRI line
        '{"@timestamp":"2025-06-04T10:15:00Z","txn_id":"T-1","decision":"A","message":"card 4111–1111–1111–1111"}',
        '{"@timestamp":"2025-06-04T10:15:00Z","txn_id":"T-2","decision":"A","message":"card ４１１１　１１１１　１１１１　１１１１"}',
        '{"@timestamp":"2025-06-04T10:15:00Z","txn_id":"T-3","decision":"A","message":"GET /pay?pan=4111+1111+1111+1111"}',
    ]
    for i, (card, _) in enumerate(SPELLINGS.values()):
        for where, line in _lines(card).items():
            lines.append(line.replace('"T-', f'"T{i}-'))
    path = tmp_path / "fraud-api.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    run = _draudit("ingest", str(path), "--database-url", url, "--output", "json")
    assert run.returncode == 0, run.stderr
    counts = json.loads(run.stdout)
    assert counts["read"] == len(lines) == 3 + 7 * len(SPELLINGS)
    assert counts["quarantined"] == len(SPELLINGS) and counts["stored"] == len(lines) - len(SPELLINGS)
    assert counts["pan_masked"] >= 3 + 7 * len(SPELLINGS)
    conn = sqlite3.connect(db)
    messages = dict(conn.execute(
        "SELECT transaction_id, json_extract(attributes, '$.message') FROM inference_records "
        "WHERE transaction_id IN ('T-1', 'T-2', 'T-3')").fetchall())
    conn.close()
    assert messages == {"T-1": "card 411111******1111", "T-2": "card 411111******1111",
                        "T-3": "GET /pay?pan=411111******1111"}
    # a grep of the database file (and its WAL) for the digits, every separator spelling removed
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("x.db*"))
    assert b"411111******1111" in raw and b"378282*****0005" in raw
    text = _unseparated(raw.decode("utf-8", "replace"))
    for card in (VISA, AMEX, "41111111", "82246310005"):
        assert card not in text, card


# -- the pre-filters stay conservative ------------------------------------------------------------------

FUZZ_ALPHABET = (list("0123456789") * 4 + SEPS + ["\\u2013", "\\u3000", "\\\\u2212", "\\ud803\\udead", "\\f",
                                                  "\\\\f", "\\b", "\\n", "\\t", "\\u0020", " ", "-", "\u00a0"]
                 + list("abcdefABCDEFxyz\"{}:,.%=") + ["４", "\u0664", "%20", "%2d", "%E2%80%93", "%3D", "%25"])


def _fuzz(n: int, seed: int, *, ascii_only: bool = False) -> list[str]:
    import random

    rnd = random.Random(seed)
    alphabet = [c for c in FUZZ_ALPHABET if c.isascii()] if ascii_only else FUZZ_ALPHABET
    seps = [c for c in SEPS if c.isascii()] + ["\\u2013", "\\f", "\\\\u3000", "\\ud803\\udead", "\\f\\f",
                                               "%20", "%2D", "%e2%80%93", "%20%20"]
    out = []
    for _ in range(n):
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 50)))
        if rnd.random() < 0.4:  # a card grouped by one of the new separators or their escapes
            sep = rnd.choice(seps if ascii_only else seps + SEPS)
            cut = rnd.randint(0, len(text))
            text = text[:cut] + _grouped(rnd.choice([VISA, AMEX, "5500000000000004"]), sep) + text[cut:]
        if rnd.random() < 0.2:
            text *= 6  # long enough for the windowed search
        out.append(text)
    return out


FUZZ = _fuzz(6000, seed=23) + _fuzz(3000, seed=29, ascii_only=True)


def test_the_fuzz_holds_cards_and_clean_ascii_texts():
    assert sum(1 for t in FUZZ if pan.mask_text(t)[1]) > 1000
    assert sum(1 for t in FUZZ if t.isascii() and pan._clean_ascii(t)) > 500
    assert sum(1 for t in FUZZ if t.isascii() and "\\f" in t and pan.mask_text(t)[1]) > 200


def test_mask_text_answers_as_the_full_scan_does_with_the_new_separators(monkeypatch):
    fast = [pan.mask_text(t) for t in FUZZ]
    monkeypatch.setattr(pan, "_clean_ascii", lambda text: False)
    monkeypatch.setattr(pan, "_maybe_run", lambda text, start, end: pan._MAYBE.search(text, start, end) is not None)
    assert [pan.mask_text(t) for t in FUZZ] == fast


def test_may_contain_pan_says_maybe_wherever_a_field_or_the_raw_line_is_masked():
    for t in FUZZ:
        for raw in (t, json.dumps({"message": t}), json.dumps({"message": t}, ensure_ascii=False),
                    json.dumps({"log": json.dumps({"message": t})})):
            pan._LAST_VERDICT = (None, None, True)
            if pan.mask_text(t)[1] or pan.mask_text(raw)[1]:
                assert pan.may_contain_pan(raw), raw
                if "\\u" not in raw:
                    pan._LAST_VERDICT = (None, None, True)
                    assert pan.may_contain_pan(raw, unicode_escapes=False), raw


def test_the_form_feed_shortcut_is_the_exact_deletion():
    """``_ascii_digit_run``: 13 digits in a row once separators, escape letters n t r and each ``\\f``
    escape are deleted (its search for a ``\\f`` is made only where the rest finds no run)."""
    for t in FUZZ + [f"id 3f{'12f' * 6} \\f", "4111\\f1111\\f1111\\f1111", "4111f1111f1111f1111"]:
        if not t.isascii() or "\\u" in t:
            continue
        data = t.encode("ascii")
        exact = b"1" * 13 in data.replace(b"\\f", b"").translate(pan._DIGITS_TO_ONES, pan._SEP_AND_ESCAPE_BYTES)
        assert pan._ascii_digit_run(data) == exact, t
    assert not pan._ascii_digit_run(b"4111f1111f1111f1111") and pan._ascii_digit_run(b"4111\\f1111\\f1111\\f1111")


@pytest.mark.parametrize("card", [VISA, "4111 1111 1111 1111", "4111-1111-1111-1111", "4111 · 1111 · 1111 · 1111",
                                  "5500-0055-5555-5559=2812101"], ids=["plain", "spaces", "dashes", "middle-dots", "track2"])
@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-16"])
def test_a_card_number_in_utf16_text_is_masked_in_quarantine(encoding, card):
    """UTF-16 text read as UTF-8 has a NUL beside every ASCII character (quarantined with every digit
    readable, NUL stored as U+FFFD, also a grouped number's); a BOM makes it not UTF-8 at all. All masked."""
    parser = LineParser()
    (out,) = parser.feed_bytes(f"ERROR card {card} declined".encode(encoding), "file", "1")
    assert out.record is None and parser.masker.masked == 1
    digits = "".join(ch for ch in out.raw_text if ch.isdigit())
    assert len(digits) <= 10 and "\x00" not in out.raw_text, out.raw_text


@pytest.mark.parametrize("sep", ["\xa0", "\xb7", " "], ids=["no-break-space", "middle-dot", "space"])
def test_a_card_number_in_latin1_text_is_masked_in_quarantine(sep):
    """Latin-1 bytes are not UTF-8: shown as ``\\xa0`` escapes, the groups of a card number were kept readable."""
    parser = LineParser()
    (out,) = parser.feed_bytes(f"caf\xe9 card {_grouped(VISA, sep)}".encode("latin-1"), "file", "1")
    assert out.reason.startswith("not-utf8") and parser.masker.masked == 1
    assert out.raw_text == f"caf\xe9 card {VISA_MASKED}"


@pytest.mark.parametrize("debris", ["\x00", "\ufffd"], ids=["nul", "replacement-character"])
def test_decoding_debris_between_groups_hides_no_card_number_in_a_stored_field(debris):
    """NUL (replaced by U+FFFD for storage before the fields are masked) and U+FFFD, which shippers
    write for bytes they could not decode, between a card number's groups: stored whole before."""
    line = json.dumps({"@timestamp": "2025-06-04T10:15:00.067Z", "txn_id": "T-DEBRIS", "decision": "APPROVE",
                       "message": "card " + _grouped(VISA, debris)}, ensure_ascii=False)
    parser = LineParser()
    assert fastpath.unit(parser, line.encode(), SOURCE, "1") is None  # the fast path leaves it to the masker
    (out,) = parser.feed_bytes(line.encode(), SOURCE, "1")
    assert out.record.attributes["message"] == f"card {VISA_MASKED}" and parser.masker.masked == 1


def test_a_card_number_in_utf16_bytes_of_an_otlp_bytes_value_is_masked():
    import base64

    from collector.ingest.otlp import Tally, bytes_value_text

    tally = Tally()
    stored = base64.b64decode(bytes_value_text(f"card {VISA}".encode("utf-16-le"), tally))
    assert tally.pans == 1 and VISA not in stored.replace(b"\x00", b"").decode("latin-1")


@pytest.mark.parametrize("text", ["readings 98·00 89·57 34·92 29·75 13·40", "epoch 1775792846·339623",
                                  "• 41 • 11 • 11 • 11 • 11 • 11 • 11 • 11", "v1·2·3 build 4111111·111111111"])
def test_middle_dots_as_decimal_points_and_bullet_lists_are_left_alone(text):
    """Middle dots and bullets separate a card's groups only in its layout: as decimal points
    (British style) and list bullets they joined numbers into false card numbers (63 % of random
    reading lines were damaged)."""
    assert pan.mask_text(text) == (text, 0)
