"""The PAN module's C-speed pre-filters never skip what the full scan would mask (or find).

Each pre-filter lets a function answer "nothing here" without its regex search; each must be
conservative. Over the PAN tests' own hostile corpus (every string parametrised in
``tests/test_ingest_pan.py``, the fast-path test's hand-made lines, the shipped log samples) and a
seeded fuzz of digits, separators, their escapes, hex letters, dots, ``e``, U+FFFD and ``\\x``
escapes, each function gives the same answer with its pre-filter as with the pre-filter
replaced by "maybe" (the full scan alone): ``mask_text`` (``_clean_ascii``), ``mask_cut_end``
(``_may_end_in_run``, ``_may_end_undecodable``), ``mask_exponent_numbers``
(``_first_exponent_number_start``),
the track 2 hint (``_track2_hint``) and ``may_contain_pan``'s memory of its last answer.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from collector.ingest import pan
from tests import test_ingest_fastpath, test_ingest_pan, test_ingest_pan_separators_numbers

DATA = Path(__file__).parent / "data" / "logs"


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    values = getattr(value, "values", None)  # pytest.param
    return _strings(values) if values is not None else []


def _pan_test_strings() -> list[str]:
    out = list(test_ingest_pan.TEST_PANS)
    for obj in vars(test_ingest_pan).values():
        for mark in getattr(obj, "pytestmark", []):
            if mark.name == "parametrize":
                out.extend(_strings(list(mark.args[1])))
    return out


ALPHABET = (list("0123456789") * 4 + list(" -\t\n\r/_.") + ["\u00a0", "\u00ad", "\u200b", "\ufeff", "\u2007"]
            + ["\\n", "\\t", "\\r", "\\/", "\\u0020", "\\u002d", "\\u00a0", "\\u00ad", "\\\\u0020", "\\u0034", "\\uff14"]
            + list("abcdefABCDEFxyzeE=+;?\"{}:,") + ["\ufffd", "\\xc3", "\\x9", "%3D", "\u0664", "\uff14"])


def _fuzz(n: int, seed: int = 11) -> list[str]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        text = "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 60)))
        if rnd.random() < 0.3:  # a grouped card number somewhere, written with random separators
            groups = ["4111", "1111", "1111", "1111"] if rnd.random() < 0.5 else ["3782", "822463", "10005"]
            sep = rnd.choice([" ", "-", "\\u0020", "\u00ad", "  ", "\\n", "/", ""])
            cut = rnd.randint(0, len(text))
            text = text[:cut] + sep.join(groups) + text[cut:]
        if rnd.random() < 0.2:  # long enough for the windowed search
            text = text * 6
        out.append(text)
    return out


def _mixed_fuzz(n: int, seed: int = 13) -> list[str]:
    """Card layouts (and near misses: a group one digit off) whose gaps are each a random separator,
    dots among them, inside random text: the dot-aware search and its shortcut see every mix."""
    rnd = random.Random(seed)
    layouts = [["4111", "1111", "1111", "1111"], ["3782", "822463", "10005"], ["6205", "5000", "0000", "0000", "004"],
               ["5500", "0000", "0000", "0004"], ["4111", "1111", "1111", "11111"], ["1764403200", "123456"]]
    out = []
    for _ in range(n):
        groups = rnd.choice(layouts)
        card = groups[0] + "".join(rnd.choice([" ", "-", ".", ".", "\\t", "\u00a0", "\u00ad", "\n"]) + g for g in groups[1:])
        text = "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 30)))
        cut = rnd.randint(0, len(text))
        out.append(text[:cut] + card + text[cut:])
    return out


def corpus() -> list[str]:
    lines = []
    for path in sorted(DATA.glob("*")):
        lines.extend(path.read_text(encoding="utf-8").splitlines())
    texts = (_pan_test_strings() + test_ingest_fastpath.hand_made() + lines + _fuzz(4000)
             + test_ingest_pan_separators_numbers.MIXED_SEPARATOR_TEXTS + _mixed_fuzz(1500))
    # each also with the endings the cut-PAN and undecodable-end searches look at
    endings = ["", "\n", " 4111 1111", "4111\ufffd", "4111\\xc3", "4111\\xc3\n", "\\u0034", " 1.5e16", "5E-3"]
    return [t + e for t in texts for e in endings]


CORPUS = corpus()


def test_the_corpus_holds_pans_and_their_hostile_spellings():
    masked = sum(1 for t in CORPUS if pan.mask_text(t)[1])
    assert len(CORPUS) > 30_000 and masked > 5_000
    assert any("\\u0034" in t and pan.mask_text(t)[1] for t in CORPUS)


def _without(monkeypatch, name: str, maybe) -> None:
    monkeypatch.setattr(pan, name, maybe)


@pytest.mark.parametrize("keep_otlp_times", [False, True])
def test_mask_text_answers_as_the_full_scan_does(monkeypatch, keep_otlp_times):
    fast = [pan.mask_text(t, keep_otlp_times=keep_otlp_times) for t in CORPUS]
    assert sum(1 for t in CORPUS if t.isascii() and pan._clean_ascii(t)) > 2_000  # the pre-filter does skip
    _without(monkeypatch, "_clean_ascii", lambda text: False)
    assert [pan.mask_text(t, keep_otlp_times=keep_otlp_times) for t in CORPUS] == fast


def test_mask_cut_end_answers_as_the_full_search_does(monkeypatch):
    texts = CORPUS + [pan.mask_text(t)[0] for t in CORPUS]
    fast = [pan.mask_cut_end(t) for t in texts]
    assert sum(1 for t in texts if not pan._may_end_in_run(t)) > 10_000
    _without(monkeypatch, "_may_end_in_run", lambda text: True)
    _without(monkeypatch, "_may_end_undecodable", lambda text: True)
    assert [pan.mask_cut_end(t) for t in texts] == fast


def test_the_end_checks_never_say_no_where_their_regex_matches():
    for t in CORPUS:
        for pos in (0, max(0, len(t) - 512), max(0, len(t) - 5)):
            if pan.TRAILING_DIGIT_RUN.search(t, pos):
                assert pan._may_end_in_run(t), t
            if pan._UNDECODABLE_END.search(t, pos):
                assert pan._may_end_undecodable(t), t


def test_mask_exponent_numbers_answers_as_the_regex_does(monkeypatch):
    fast = [pan.mask_exponent_numbers(t) for t in CORPUS]
    assert any(n for _, n in fast)
    _without(monkeypatch, "_first_exponent_number_start", lambda text: 0)
    assert [pan.mask_exponent_numbers(t) for t in CORPUS] == fast


def test_may_contain_pan_remembers_only_the_same_question():
    """The last answer is reused for an equal text asked with the same flag, and only then."""
    fresh = [pan._may_contain_pan(t) if not ("\\u" in t) else True for t in CORPUS[:3000]]
    rnd = random.Random(5)
    for i in rnd.choices(range(3000), k=6000):  # repeats, neighbours, alternating flags
        t = CORPUS[i]
        assert pan.may_contain_pan(t) == fresh[i]
        assert pan.may_contain_pan(t, exponent_numbers=True) is True
        if "\\u" not in t:
            assert pan.may_contain_pan(t, unicode_escapes=False) == fresh[i]
    card = '{"message":"card 4111 1111 1111 1111"}'
    assert pan.may_contain_pan(card, unicode_escapes=False) and pan.may_contain_pan(card)
    assert not pan.may_contain_pan('{"message":"scored"}')
    assert pan.may_contain_pan('{"message":"\\u0034111111111111111"}')


def test_the_track2_hint_is_the_regex_search():
    texts = CORPUS + [f"{p}{sep}2512201{tail}" for p in test_ingest_pan.TEST_PANS for sep in "Dd=" for tail in ("", "F", "x")]
    hits = 0
    for t in texts:
        expected = bool(pan._may_hold_track2(t) and pan._TRACK2_HINT.search(t))
        assert pan._track2_hint(t) == expected, t
        hits += expected
    assert hits > 20


def test_has_unicode_escape_is_the_substring_test():
    assert sum(1 for t in CORPUS if "\\u" in t) > 1000
    for t in CORPUS:
        assert (pan.has_unicode_escape(t) is not None) == ("\\u" in t), t


def _documents() -> list[dict]:
    """Objects made of the corpus: its strings as keys and values, nested, with PAN-sized numbers
    and the runtime time key a masker keeps integers under."""
    docs = []
    for i in range(0, 6000, 6):
        a, b, c, d, e, f = CORPUS[i:i + 6]
        docs.append({a: b, "message": c, "nested": {d: [e, f, 4111111111111111, 4.111111111111111e15]},
                     "envelope.runtime_time_ns": 1741083300067462001, e: {}, "n": 7, f: None, "ok": True,
                     Text(c): Text(d)})
    return docs


class Text(str):
    """A ``str`` subclass: not the exact type the masker's shortcut takes."""


def test_the_masker_masks_objects_as_it_does_field_by_field(monkeypatch):
    def run():
        masker = pan.PanMasker()
        out = [masker.value(doc, frozenset({"envelope.runtime_time_ns"})) for doc in _documents()]
        out += [masker.value(t) for t in CORPUS[:3000]]
        return out, masker.masked

    fast, fast_count = run()
    assert fast_count > 1000
    _without(monkeypatch, "_clean_ascii", lambda text: False)
    assert run() == (fast, fast_count)


def _luhn_by_the_book(digits: str) -> bool:
    """ISO/IEC 7812-1 annex B, digit by digit from the right (every second one doubled, 9 taken off above 9)."""
    import unicodedata
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = unicodedata.decimal(ch)
        total += (d * 2 - 9 if d * 2 > 9 else d * 2) if i % 2 else d
    return total % 10 == 0


def test_luhn_in_c_answers_as_the_book_does():
    rnd = random.Random(3)
    strings = ["", "0", "4111111111111111", "4111111111111112", "79927398713", "٤١١١١١١١١١١١١١١١", "４１１１１１１１１１１１１１１１"]
    strings += ["".join(rnd.choice("0123456789") for _ in range(n)) for n in range(0, 32) for _ in range(400)]
    strings += ["".join(rnd.choice("0123456789٤١۴४") for _ in range(16)) for _ in range(500)]
    assert sum(pan.luhn_ok(s) for s in strings) > 1000
    for s in strings:
        assert pan.luhn_ok(s) == _luhn_by_the_book(s), s


def test_the_exponent_number_start_is_never_after_the_regex_match():
    rnd = random.Random(9)
    numbers = ["4.111111111111111e15", "-4.111111111111111E+15", "1e5", "3e4", "ab3e4", "x.5e3", "1.e5", "_2e3", "-2e-3",
               "12.5e", "12.5e+", "a-12e5", "5E-3", ".5e3", "0.5e3", "1..5e3", "1.2.3e4", "x3e4 -5E2 7e1", "3E4 1e2"]
    texts = CORPUS + numbers + [" ".join(numbers)]
    texts += ["".join(rnd.choice("0123456789eE.+-_ ax:\"") for _ in range(rnd.randint(1, 40))) for _ in range(20000)]
    found_some = 0
    for t in texts:
        match = pan._EXPONENT_NUMBER.search(t)
        first = pan._first_exponent_number_start(t)
        if match is not None:
            assert 0 <= first <= match.start(), t
            found_some += 1
        elif t.isascii():
            assert first == -1, t  # in ASCII text it answers exactly
    assert found_some > 3000


def test_the_remembered_answer_is_read_with_its_own_text():
    """A caller interrupted while it compares the remembered text (another thread, HTTP ingest, asks
    about another text meanwhile) still gets the answer that goes with the text it compared: the
    text and its answer are replaced together, as one tuple."""
    card, clean = "card 4111 1111 1111 1111", "scored"

    class Interrupting(str):
        armed = fired = False

        def __eq__(self, other):
            if Interrupting.armed and not Interrupting.fired:
                Interrupting.fired = True
                assert pan.may_contain_pan(clean) is False  # the other caller, in the middle of the comparison
            return str.__eq__(self, other)

        __hash__ = str.__hash__

    assert pan.may_contain_pan(Interrupting(card)) is True  # remembered
    Interrupting.armed = True
    assert pan.may_contain_pan(card) is True  # compares the remembered text: interrupted there
    assert Interrupting.fired
