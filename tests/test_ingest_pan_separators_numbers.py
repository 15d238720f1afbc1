"""Card numbers with dots among other separators, card numbers in numeric fields, and local times a
daylight-saving change skips or repeats (a newcomer's findings).

1. ``card 4111 1111 1111.1111`` and ``4111 1111-1111.1111`` were stored verbatim: a dot counted only
   in all-dotted 4-digit groups. A card layout (4-4-4-4, 4-6-5, 4-4-4-4-3) whose single separators
   mix dots with spaces and dashes is a PAN; decimals, versions, addresses, epoch times are not.
2. ``"latency_ms": 4111111111111111`` was stored as the double 4.11111111111111e+15 (the PAN whole),
   and ``"@timestamp": "4111111111111111"`` as epoch microseconds (its digits in ``event_time_ns``).
   Such a latency is kept as masked text in the attributes with a warning; such a time is unreadable.
3. With ``--default-tz Europe/Warsaw``, ``2026-10-25T02:30:00`` (shown twice) was stored as 00:30Z with
   its 1 ms precision, and ``2026-03-29T02:30:00`` (never shown) as 00:30Z... read silently.
"""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import inspect, select, text

from collector.ingest import fastpath, pan, timestamps
from collector.ingest.parser import LineParser
from collector.ingest.pipeline import IngestRun
from collector.settings import Settings
from collector.store.models import InferenceRecord, Quarantine
from tests.test_ingest_fastpath import NESTED, SOURCE, _general, _with, fluent

# Public test PANs (Visa, Mastercard, American Express, UnionPay 19 digits).
VISA, MC, AMEX, UNIONPAY = "4111111111111111", "5500000000000004", "378282246310005", "6205500000000000004"
TEST_PANS = (VISA, MC, AMEX, UNIONPAY)

# Card numbers in a card layout with at least one dot, and what mask_text makes of them.
MIXED_MASKED = [
    ("card 4111 1111 1111.1111", "card 411111******1111"),
    ("4111 1111-1111.1111", "411111******1111"),
    ("4111-1111.1111 1111 ok", "411111******1111 ok"),
    ("pan=4111.1111 1111-1111;", "pan=411111******1111;"),
    ("amex 3782.822463 10005", "amex 378282*****0005"),
    ("amex 3782 822463.10005", "amex 378282*****0005"),
    ("up 6205 5000.0000 0000 004", "up 620550*********0004"),
    ("ref 2024 4111 1111 1111.1111 ok", "ref 2024 411111******1111 ok"),
    ("card 5500 0000.0000-0004.", "card 550000******0004."),
    ("card 4111\t1111.1111\u00a01111", "card 411111******1111"),
    ('{"m":"card 4111\\t1111.1111 1111"}', '{"m":"card 411111******1111"}'),  # a JSON escape as separator
    ("x4111.1111 1111 1111y", "x411111******1111y"),
]
# Dots among digits that are no card number: left alone.
MIXED_LOOKALIKES = [
    "version 1.2.3", "pod ip 10.4.12.21 port 8080", "latency 12.345 ms", "date 1764403200.123456",
    "semver 2.17.1-rc.3+build.20261130", "ips 192.168.100.200 10.104.112.121", "took 1234.5678 9012.3456 s",
    "4111 1111 1111.1112", "4111.11111 1111 1111", "1764403200.1234 5678 9012", "2026.11.30 14.46.25.123",
    "4111 1111 1111 1111.1111 1111".replace("4111 1111 1111 1111", "4111 1111 1111 1112"),
    "v4.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1", "1.0000 2.0000 3.0000 4.0000",
]
# The same spellings in shapes the pre-filter sees: every text here is added to the PAN
# pre-filter tests' hostile corpus (``tests/test_ingest_pan_prefilters.corpus``).
MIXED_SEPARATOR_TEXTS = (
    [t for t, _ in MIXED_MASKED] + MIXED_LOOKALIKES
    + [f"{a}{s1}{b}{s2}{c}{s3}{d}" for a, b, c, d in (("4111", "1111", "1111", "1111"), ("5500", "0000", "0000", "0004"))
       for s1 in " -." for s2 in " -." for s3 in " -.\\t"]
    + [f"{a}{s1}{b}{s2}{c}" for a, b, c in (("3782", "822463", "10005"),) for s1 in " -." for s2 in " -."]
    + ["1749032106.220081", "date 1749032106.220081, 17.0, 8.11", "latency_ms\":1234.5, \"x\":4111.1111"]
)


@pytest.mark.parametrize("raw,masked", MIXED_MASKED)
def test_a_card_layout_with_dots_among_its_separators_is_masked(raw, masked):
    assert pan.mask_text(raw) == (masked, 1)
    assert pan.may_contain_pan(raw)
    assert not (raw.isascii() and pan._clean_ascii(raw))
    assert pan.mask_text(masked) == (masked, 0)  # masked once: stays


@pytest.mark.parametrize("raw", MIXED_LOOKALIKES)
def test_decimals_versions_addresses_and_epoch_times_are_left_alone(raw):
    assert pan.mask_text(raw) == (raw, 0)


def test_every_mix_of_space_dash_and_dot_is_masked():
    for p in (VISA, MC):
        for s1 in " -.":
            for s2 in " -.":
                for s3 in " -.":
                    raw = f"card {p[:4]}{s1}{p[4:8]}{s2}{p[8:12]}{s3}{p[12:]} ok"
                    assert pan.mask_text(raw) == (f"card {p[:6]}******{p[-4:]} ok", 1), raw
                    assert pan.may_contain_pan(json.dumps({"message": raw})), raw


def test_the_prefilter_says_maybe_wherever_the_mixed_search_masks():
    """``may_contain_pan`` and ``_clean_ascii`` never skip a text the dot-aware search masks (their
    shortcut ``_dot_after_group`` is conservative), over the mixed corpus written every way."""
    texts = MIXED_SEPARATOR_TEXTS + [json.dumps({"message": t}) for t in MIXED_SEPARATOR_TEXTS]
    texts += [json.dumps({"log": json.dumps({"message": t})}) for t in MIXED_SEPARATOR_TEXTS]
    masked = 0
    for t in texts:
        n = pan._mask_mixed_dotted(t)[1]
        masked += bool(n)
        if n:
            assert pan.may_contain_pan(t) and pan._dot_after_group(t.encode()), t
            assert not (t.isascii() and pan._clean_ascii(t)), t
    assert masked > 100


def test_the_runs_searched_near_dots_are_the_whole_texts_runs(monkeypatch):
    """``_mixed_runs`` searches only the stretches around the dots a card layout can have; masking
    with it gives what masking with the regex over the whole text gives (seeded fuzz of groups,
    separators, escapes, letters, non-ASCII text)."""
    import random

    rnd = random.Random(4)
    alphabet = (list("0123456789") * 3 + list(" -._/\t\n:\"x") + ["\\t", "\\n", "\\\\n", "ab", "\u00a0", "é",
                                                                   "\\u0020", "\u0664"])
    texts = []
    for _ in range(20000):
        t = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 40)))
        if rnd.random() < 0.6:
            groups = rnd.choice([VISA, MC]) if rnd.random() < 0.7 else AMEX
            groups = [groups[:4], groups[4:8], groups[8:12], groups[12:]] if len(groups) == 16 else [
                groups[:4], groups[4:10], groups[10:]]
            cut = rnd.randint(0, len(t))
            t = t[:cut] + groups[0] + "".join(rnd.choice([" ", "-", ".", ".", "\\t", "\u00a0"]) + g
                                              for g in groups[1:]) + t[cut:]
        texts.append(t * rnd.choice([1, 1, 8]))
    near = [pan._mask_mixed_dotted(t) for t in texts]
    assert sum(1 for _, n in near if n) > 1500
    assert sum(1 for t in texts if t.isascii() and "." in t and not pan._dot_after_group(t.encode())) > 500
    monkeypatch.setattr(pan, "_mixed_runs", lambda text: list(pan._MIXED_RUN.finditer(text)))
    assert [pan._mask_mixed_dotted(t) for t in texts] == near


def test_the_dot_shortcut_is_its_regex():
    import random

    rnd = random.Random(1)
    regex = re.compile(r"(?<![0-9])(?:[0-9]{4}|[0-9]{6})\.")
    for _ in range(100000):
        t = "".join(rnd.choice("0123456789.x ") for _ in range(rnd.randint(0, 14)))
        assert pan._dots_after_groups(t.encode()) == [m.end() - 1 for m in regex.finditer(t)], t


# -- numbers ----------------------------------------------------------------------------------------

def test_a_number_holding_a_pan_is_recognised_in_every_numeric_form():
    for value in (4111111111111111, 4111111111111111.0, "4111111111111111", " 4111111111111111.25 ",
                  -4111111111111111, 5500000000000004.0, 378282246310005, 6205500000000000004, "4.111111111111111e15"):
        assert pan.number_holds_pan(value), value
    for value in (12.5, "12.4", 4111111111111112, 1e300, float("nan"), "fast", True, None, 10 ** 30, 999999999999):
        assert not pan.number_holds_pan(value), value
    # epoch milliseconds / microseconds / nanoseconds start with 1: Luhn-valid ones are times, not cards
    assert pan.luhn_ok("1796049980123") and pan.number_holds_pan(1796049980123)
    assert not pan.number_holds_pan(1796049980123, card_issuer_only=True)
    assert not pan.number_holds_pan("1796049980123456789", card_issuer_only=True)
    assert pan.luhn_ok("1000000000000107") and pan.number_holds_pan(1000000000000107)
    assert not pan.number_holds_pan(1000000000000107, card_issuer_only=True)


def test_a_pan_is_never_a_latency_nor_a_time():
    from collector.ingest.record import OutOfRange, coerce_latency_ms
    for value in (4111111111111111, 5500000000000004.0, "4111111111111111", "378282246310005.5"):
        with pytest.raises(OutOfRange, match="card number"):
            coerce_latency_ms(value)
        with pytest.raises(timestamps.BadTimestamp, match="card number"):
            timestamps.parse_any(value)
    # a latency is held to the stricter rule (13 integer digits of milliseconds are no latency anyway)
    with pytest.raises(OutOfRange, match="card number"):
        coerce_latency_ms(1796049980123)
    assert coerce_latency_ms(1796049980124) == 1796049980124.0  # fails Luhn: a (wrong) number, stored
    assert timestamps.parse_any("1796049980123") == (1796049980123000000, 1_000_000)  # epoch ms, Luhn-valid
    assert timestamps.parse_any(1796049980123456789) == (1796049980123456789, 1)
    assert timestamps.parse_any(1764403200.123456) == (1764403200123456000, 1000)


# -- through the ingest path --------------------------------------------------------------------------

CARD_LINES = {
    "MIX-SPACE-DOT": fluent(_with(NESTED, txn_id="MIX-SPACE-DOT", message="card 4111 1111 1111.1111")),
    "MIX-ALL": fluent(_with(NESTED, txn_id="MIX-ALL", message="card 4111 1111-1111.1111")),
    "MIX-AMEX": fluent(_with(NESTED, txn_id="MIX-AMEX", message="amex 3782.822463 10005 declined")),
    "LAT-INT": fluent(_with(NESTED, txn_id="LAT-INT", latency_ms=int(VISA))),
    "LAT-FLOAT": fluent(_with(NESTED, txn_id="LAT-FLOAT", latency_ms=float(MC))),
    "LAT-STR": fluent(_with(NESTED, txn_id="LAT-STR", latency_ms=UNIONPAY)),
    "TS-STR": fluent(_with(NESTED, txn_id="TS-STR", **{"@timestamp": VISA})),
    "TS-INT": fluent(_with(NESTED, txn_id="TS-INT", **{"@timestamp": int(AMEX)})),
    # lookalikes: a version, an address, a decimal latency, an epoch time with a fraction
    "PLAIN": fluent(_with(NESTED, txn_id="PLAIN", message="model 1.2.3 from 10.4.12.21 took 12.345 ms",
                          latency_ms=12.345, **{"@timestamp": 1764403200.123456})),
}


def _dump(engine, database_url: str) -> str:
    """Every row of every table, and on SQLite the database file's bytes (and its WAL)."""
    with engine.connect() as conn:
        rows = [str(tuple(r)) for t in inspect(conn).get_table_names() for r in conn.execute(text(f'SELECT * FROM "{t}"'))]
    out = "\n".join(rows)
    if database_url.startswith("sqlite"):
        path = database_url.split("///", 1)[1]
        for suffix in ("", "-wal"):
            try:
                with open(path + suffix, "rb") as f:
                    out += f.read().decode("latin-1")
            except FileNotFoundError:
                pass
    return out


def _assert_no_pan(dump: str) -> None:
    joined = re.sub(r"[ .\-\t]|\\t|\xa0", "", dump)  # any separator spelling gone
    for p in TEST_PANS:
        assert p not in joined, p
    # nor as the double that held it (4.11111111111111e+15) or its digits as a number
    assert "4.11111111111111e+15" not in dump and "4111111111111111000" not in dump


def test_mixed_separators_and_pan_numbers_through_the_ingest_run(sessions, engine, database_url, tmp_path):
    path = tmp_path / "fraud-api.log"
    path.write_text("\n".join(CARD_LINES.values()) + "\n")
    run = IngestRun(sessions, Settings(database_url=database_url, cluster="prod-eu"))
    with open(path, "rb") as f:
        run.ingest_stream(f, str(path))
    counts = run.finish()
    assert (counts.read, counts.stored, counts.quarantined) == (9, 7, 2) and counts.reconciles
    # three messages, three latencies, the two timestamps' raw lines (masked in quarantine)
    assert counts.pan_masked >= 6
    with sessions() as s:
        rows = {r.transaction_id: r for r in s.execute(select(InferenceRecord)).scalars()}
        quarantine = s.execute(select(Quarantine.reason, Quarantine.raw_text).order_by(Quarantine.id)).all()
    assert rows["MIX-SPACE-DOT"].attributes["message"] == "card 411111******1111"
    assert rows["MIX-ALL"].attributes["message"] == "card 411111******1111"
    assert rows["MIX-AMEX"].attributes["message"] == "amex 378282*****0005 declined"
    for txn, masked in (("LAT-INT", "411111******1111"), ("LAT-FLOAT", "550000******0004.0"),
                        ("LAT-STR", "620550*********0004")):
        row = rows[txn]
        assert row.latency_ms is None
        assert row.attributes["latency_ms"] == masked
        assert "latency field 'latency_ms' holds a card number; kept in attributes as masked text" \
            in row.attributes["draudit.warnings"]
    plain = rows["PLAIN"]
    assert plain.attributes["message"] == "model 1.2.3 from 10.4.12.21 took 12.345 ms"
    assert plain.latency_ms == 12.345 and plain.event_time_ns == 1764403200123456000
    assert plain.event_time_precision_ns == 1000
    assert [r for r, _ in quarantine] == [
        "bad-timestamp: field '@timestamp': timestamp not read: its digits read as a card number (PAN)"] * 2
    assert '\\"@timestamp\\":\\"411111******1111\\"' in quarantine[0][1]
    assert '\\"@timestamp\\":378282*****0005' in quarantine[1][1]
    assert not {r.event_time_ns for r in rows.values()} & {4111111111111111000, 378282246310005000}
    _assert_no_pan(_dump(engine, database_url))


def test_the_fast_path_declines_these_lines_and_both_paths_agree():
    """The fast path answers only lines ``may_contain_pan`` calls PAN-free: each of these lines is
    declined, and the general path gives one result for it, whichever parser state it comes in."""
    fast_parser, general_parser = LineParser(cluster="c"), LineParser(cluster="c")
    for n, line in enumerate(CARD_LINES.values(), start=1):
        data = line.encode()
        expected = _general(general_parser, data, str(n))
        if "PLAIN" in line:
            fast = fastpath.unit(fast_parser, data, SOURCE, str(n))
            assert fast is not None and expected == ([fast], 0)  # no PAN: taken, the same unit
            continue
        assert pan.may_contain_pan(line)
        assert fastpath.unit(fast_parser, data, SOURCE, str(n)) is None, line
        assert _general(fast_parser, data, str(n)) == expected


# -- daylight-saving changes under a default zone ------------------------------------------------------

def _local(txn: str, ts: str) -> str:
    return fluent(_with(NESTED, txn_id=txn, **{"@timestamp": ts}))


HOUR_NS = 3_600_000_000_000


def test_local_times_a_daylight_saving_change_repeats_or_skips():
    ambiguous = timestamps.parse_iso("2026-10-25T02:30:00.000", "Europe/Warsaw")
    assert ambiguous == (1792888200000000000, HOUR_NS + 1_000_000)  # 00:30Z (CEST) … 01:30Z + 1 ms (CET)
    assert timestamps.ambiguous_local_time(ambiguous) == (
        "event time 2026-10-25T02:30:00.000 occurs twice in Europe/Warsaw (daylight-saving change): stored as "
        "the earlier, precision widened by 3600 s to cover both")
    with pytest.raises(timestamps.NonexistentLocalTime, match="2026-03-29T02:30:00 does not exist in Europe/Warsaw"):
        timestamps.parse_iso("2026-03-29T02:30:00", "Europe/Warsaw")
    # the hours either side are ordinary readings
    for ts, ns in (("2026-10-25T01:59:59.999", 1792886399999000000), ("2026-10-25T03:00:00.000", 1792893600000000000),
                   ("2026-03-29T01:59:59", 1774745999000000000), ("2026-03-29T03:00:00", 1774746000000000000)):
        reading = timestamps.parse_iso(ts, "Europe/Warsaw")
        assert reading[0] == ns and timestamps.ambiguous_local_time(reading) is None, ts
        assert reading[1] in (1_000_000, 1_000_000_000)
    # Lord Howe Island moves its clocks by 30 minutes: the widening is the zone's own step
    assert timestamps.parse_iso("2026-04-05T01:45:00", "Australia/Lord_Howe")[1] == HOUR_NS // 2 + 1_000_000_000


def test_daylight_saving_times_through_the_ingest_run(sessions, database_url, tmp_path):
    path = tmp_path / "fraud-api.log"
    path.write_text("\n".join([_local("TZ-AMBIG", "2026-10-25T02:30:00.000"), _local("TZ-GAP", "2026-03-29T02:30:00.000"),
                               _local("TZ-NORMAL", "2026-11-30T15:46:25.000")]) + "\n")
    run = IngestRun(sessions, Settings(database_url=database_url, cluster="prod-eu", ingest_default_tz="Europe/Warsaw"))
    with open(path, "rb") as f:
        run.ingest_stream(f, str(path))
    counts = run.finish()
    assert (counts.read, counts.stored, counts.quarantined) == (3, 2, 1)
    with sessions() as s:
        rows = {r.transaction_id: r for r in s.execute(select(InferenceRecord)).scalars()}
        reasons = s.execute(select(Quarantine.reason)).scalars().all()
    ambiguous = rows["TZ-AMBIG"]
    # the earlier instant, 00:30Z; [t, t + precision) reaches the later reading 01:30Z and its millisecond,
    # which lineage's skew test (t + precision + skew) then counts as near a transition in that hour
    assert (ambiguous.event_time_ns, ambiguous.event_time_precision_ns) == (1792888200000000000, HOUR_NS + 1_000_000)
    assert (rows["TZ-NORMAL"].event_time_ns, rows["TZ-NORMAL"].event_time_precision_ns) == (1796049985000000000, 1_000_000)  # 14:46:25Z (CET)
    assert reasons == ["naive-timestamp: field '@timestamp': timestamp 2026-03-29T02:30:00.000 does not exist in "
                       "Europe/Warsaw (the clocks skip it at the daylight-saving change); no instant to store"]


def test_an_ambiguous_local_time_is_warned_about_in_the_record():
    parser = LineParser(cluster="c", default_tz="Europe/Warsaw")
    units, _ = _general(parser, _local("TZ-AMBIG", "2026-10-25T02:30:00.000").encode(), "1")
    attributes = json.loads(units[0][2][-1])  # the attributes column: the last prepared value
    assert any("occurs twice in Europe/Warsaw" in w for w in attributes["draudit.warnings"])
