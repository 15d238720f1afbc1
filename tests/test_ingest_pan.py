"""PAN masking (PCI DSS v4.0 req. 3.3/3.4): card numbers never survive, lookalikes mostly do.

Card numbers below are the public test PANs card networks and PSPs publish for integration tests
(they pass Luhn by construction and are not real accounts).
"""

from __future__ import annotations

import pytest

from collector.ingest.pan import PanMasker, luhn_ok, mask_text

TEST_PANS = [
    "4111111111111111",     # Visa, 16
    "5555555555554444",     # Mastercard
    "378282246310005",      # American Express, 15
    "6011111111111117",     # Discover
    "4222222222222",        # Visa, 13 digits
    "6205500000000000004",  # UnionPay, 19 digits
]


@pytest.mark.parametrize("pan", TEST_PANS)
def test_published_test_pans_pass_luhn_and_are_masked_first6_last4(pan):
    assert luhn_ok(pan)
    masked, n = mask_text(f"card {pan} declined")
    assert n == 1
    assert masked == f"card {pan[:6]}{'*' * (len(pan) - 10)}{pan[-4:]} declined"
    assert pan not in masked


def test_luhn_rejects_a_changed_digit():
    assert not luhn_ok("4111111111111112")
    assert not luhn_ok("5555555555554445")


@pytest.mark.parametrize("text", [
    "4111 1111 1111 1111", "4111-1111-1111-1111", "pan=4111111111111111;", '"4111111111111111"',
    "3782 822463 10005", "PAN4111111111111111", "5555555555554444EUR", "card_6011111111111117",
])
def test_grouped_and_delimited_forms(text):
    masked, n = mask_text(text)
    assert n == 1
    digits = "".join(c for c in masked if c.isdigit())
    assert len(digits) == 10 and "*" in masked


def test_pan_inside_a_longer_grouped_run_is_found():
    masked, n = mask_text("ref 2024 4111 1111 1111 1111 ok")
    assert n == 1 and masked == "ref 2024 411111******1111 ok"


@pytest.mark.parametrize("text", [
    "4111111111111112",                           # fails Luhn
    "411111111111",                               # 12 digits: too short
    "41111111111111111111111",                    # 23 digits in one group: not a PAN
    "trace 4bf92f3577b34da6a3ce929d0e0e4736",    # hex id
    "id a4111111111111111b",                      # inside a hex token
    "sha256:ab4111111111111111cdef0123",          # digest
    "uid 12345678-1234-4111-1111-111111111111",   # UUID-shaped
    "2025-03-04T10:15:00.067462Z",
])
def test_lookalikes_are_left_alone(text):
    assert mask_text(text) == (text, 0)


def test_masker_handles_nested_values_numbers_and_keys():
    m = PanMasker()
    value = {"card": 4111111111111111, "nested": {"list": ["x 5555555555554444"]},
             "4111111111111111": "key", "latency_ms": 12.4, "ok": True, "count": 3}
    out = m.value(value)
    assert out == {"card": "411111******1111", "nested": {"list": ["x 555555******4444"]},
                   "411111******1111": "key", "latency_ms": 12.4, "ok": True, "count": 3}
    assert m.masked == 3


def test_masking_is_idempotent():
    once, _ = mask_text("4111111111111111 and 5555-5555-5555-4444")
    assert mask_text(once) == (once, 0)


@pytest.mark.parametrize("text, masked", [
    ("card 6011.0009.9013.9424 ok", "card 601100******9424 ok"),                    # dotted groups
    ("x 4012\t8888\t8888\t1881 y", "x 401288******1881 y"),                         # tab-separated
    ("n 4111\u00a01111\u00a01111\u00a01111", "n 411111******1111"),                # no-break spaces
    ("n 4111\u202f1111\u202f1111\u202f1111", "n 411111******1111"),                # narrow no-break spaces
    ("q?pan%3D4000056655665556&x=1", "q?pan%3D400005******5556&x=1"),              # URL-encoded "="
    ("ff \uff14\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11",
     "ff 411111******1111"),                                                        # full-width digits
    ("card \u0664\u0661\u0661\u0661 \u0661\u0661\u0661\u0661 \u0661\u0661\u0661\u0661 \u0661\u0661\u0661\u0661",
     "card 411111******1111"),                                                      # Arabic-Indic digits
    ("\u096b\u096b\u0966\u0966\u0966\u0966\u096b\u096b\u096b\u096b\u096b\u096b\u096b\u096b\u096b\u096f",
     "550000******5559"),                                                           # Devanagari digits
    ("amount 4111111111111111.0", "amount 411111******1111.0"),                     # a float's text
])
def test_pan_forms_seen_in_the_wild_are_masked(text, masked):
    from collector.ingest.pan import mask_text, may_contain_pan

    assert may_contain_pan(text)
    assert mask_text(text) == (masked, 1)


@pytest.mark.parametrize("text", ["trace ab4111111111111111cd", "v 1234567.8901234", "uuid 123e4567-e89b-12d3-a456-426614174000",
                                  "date 1795987769.834784", "v 1234.5678.9012.3456"])
def test_non_pans_next_to_the_new_separators_are_left_alone(text):
    from collector.ingest.pan import mask_text

    assert mask_text(text) == (text, 0)


# Spellings a newcomer test found stored unmasked: separator runs (double spaces, CR LF), newlines,
# slashes and underscores, as characters and as the JSON escapes a raw line shows them in (once, or
# twice when an application's JSON line sits inside a shipper's JSON string).
SEPARATOR_SPELLINGS = [
    "4111  1111  1111  1111", "4111\n1111\n1111\n1111", "4111\\n1111\\n1111\\n1111", "4111\\\\n1111\\\\n1111\\\\n1111",
    "4111/1111/1111/1111", "4111\\/1111\\/1111\\/1111", "4111_1111_1111_1111", "4111 - 1111 - 1111 - 1111",
    "4111\r\n1111\r\n1111\r\n1111", "4111\\u00a01111\\u00a01111\\u00a01111", "4111\u00a0\u00a01111\u00a01111 1111",
    "3782_822463_10005", "4111\\t\\t1111\\t\\t1111\\t\\t1111",
]


@pytest.mark.parametrize("spelling", SEPARATOR_SPELLINGS)
def test_pans_split_by_runs_of_separators_and_their_escapes_are_masked(spelling):
    from collector.ingest.pan import may_contain_pan

    digits = "".join(c for c in spelling.replace("u00a0", "") if c.isdigit())
    masked, n = mask_text(f"card {spelling} declined")
    assert n == 1 and masked == f"card {digits[:6]}{'*' * (len(digits) - 10)}{digits[-4:]} declined"
    assert may_contain_pan(f'{{"m":"card {spelling}"}}')


@pytest.mark.parametrize("text", [
    "file app_20250304_101500.log",                 # date_time in a file name: 14 digits, groups 8 and 6
    "/data/2025/03/04/1741083300/part-0.log",        # dated path with an epoch directory
    "at 1741083300\\n1741083301\\n",                # epoch seconds, one per line: 20 digits
    "run_2025_03_04_1234_5678",                      # two-digit groups do not make a card number
    "ids 12345678-1234-4111-1111-111111111111/4111", # a UUID next to a slash
])
def test_separator_runs_do_not_turn_dates_paths_and_ids_into_pans(text):
    assert mask_text(text) == (text, 0)


def test_a_hex_letter_that_is_a_json_escape_does_not_hide_a_pan():
    # "\b4111…" in a raw line is a backspace escape before the PAN, not the hex token "b4111…".
    assert mask_text('{"m":"\\b4111111111111111"}') == ('{"m":"\\b411111******1111"}', 1)


def test_separators_written_as_unicode_escapes_in_a_raw_line_are_masked():
    raw = '{"m":"4111\\u00201111\\u002d1111\\u005f1111"}'
    assert mask_text(raw) == ('{"m":"411111******1111"}', 1)


def test_a_pan_cut_by_the_line_limit_leaves_no_digits_before_the_cut():
    from collector.ingest.parser import LineParser

    head = '{"txn_id":"T-1","m":"card '
    line = (head + "4111\\n1111\\n1111\\n1111" + "x" * 100 + '"}').encode()
    (out,) = LineParser(max_line_bytes=len(head) + 14).feed_bytes(line, "src", "1")
    assert out.reason.startswith("line-too-long") and out.raw_text == head.rstrip() + "…"


def test_otlp_nanosecond_times_in_a_raw_line_are_not_pans_but_everything_else_is():
    time_ns = next(t for t in range(1_741_083_300_067_462_000, 1_741_083_300_067_462_100) if luhn_ok(str(t)))
    raw = (f'{{"timeUnixNano":"{time_ns}","observedTimeUnixNano": {time_ns},"body":{{"stringValue":"{time_ns}"}},'
           f'"attributes":[{{"key":"card","value":{{"stringValue":"6205500000000000004"}}}}],'
           f'"spanTime":"{time_ns}"}} {{"timeUnixNano":"4111111111111111"}}')
    masked, n = mask_text(raw, keep_otlp_times=True)
    assert masked.startswith(f'{{"timeUnixNano":"{time_ns}","observedTimeUnixNano": {time_ns},"body"')
    assert n == 4 and str(time_ns) not in masked[masked.index('"body"'):]
    assert "620550*********0004" in masked and '"timeUnixNano":"411111******1111"' in masked
    assert mask_text(raw)[1] == 6  # without the flag every Luhn-valid run is masked


@pytest.mark.parametrize("text, masked", [
    ("id 123e4567-e89b-12d3-a456-426614174000 4111111111111111", "id 123e4567-e89b-12d3-a456-426614174000 411111******1111"),
    ("card 4111111111111111 123e4567-e89b-12d3-a456-426614174000", "card 411111******1111 123e4567-e89b-12d3-a456-426614174000"),
    ("span dab0792946709312 4111 1111 1111 1111", "span dab0792946709312 411111******1111"),
    ("id ab12 4111111111111111", "id ab12 411111******1111"),
    ('{"m":"dab0792946709312\\n4111111111111111"}', '{"m":"dab0792946709312\\n411111******1111"}'),
])
def test_a_pan_next_to_a_uuid_or_hex_id_is_masked_and_the_identifier_kept(text, masked):
    from collector.ingest.pan import may_contain_pan

    assert mask_text(text) == (masked, 1)
    assert may_contain_pan(text)


@pytest.mark.parametrize("text, masked", [
    ('{"m":"card\\u00a04111\\u00a01111\\u00a01111\\u00a01111"}', '{"m":"card\\u00a0411111******1111"}'),
    ('{"m":"card\\u00204111111111111111"}', '{"m":"card\\u0020411111******1111"}'),
])
def test_a_pan_right_after_a_unicode_escape_in_a_raw_line_is_masked(text, masked):
    # The escape's last hex digits ("a0", "20") are not the start of the run, nor a hex token.
    assert mask_text(text) == (masked, 1)


# A PAN glued to letters or to track 2 data was taken for a hex id (a newcomer test found them stored in full).
@pytest.mark.parametrize("text, masked", [
    # EMV tag 57 (Track 2 Equivalent Data): PAN, "D", expiry YYMM, service code, discretionary data, "F" padding
    ("EMV tag57=4111111111111111D25122010000000000F", "EMV tag57=411111******1111D*****************F"),
    ("emv 57134111111111111111D25122010000000000F", "emv 571341**********1111D*****************F"),  # TLV tag + length first
    ('{"t2":"5555555555554444D2709201123400000"}', '{"t2":"555555******4444D****************"}'),      # 32 chars: an id's length
    (";4111111111111111=25121010000000000000?", ";411111******1111=********************?"),         # magnetic stripe track 2
    ("4111111111111111DE", "411111******1111DE"),
    ("card=4111111111111111abc", "card=411111******1111abc"),
    ("x ab4111111111111111", "x ab411111******1111"),                       # letters on one side only
    ("card 4111 1111 1111 1111ab", "card 411111******1111ab"),               # the last group used to be cut off
    # track 2 data behind a PAN written in groups: expiry, service code and discretionary data went unmasked
    ("5500-0055-5555-5559=2812101", "550000******5559=*******"),
    ("track2 4111 1111 1111 1111D28121010000", "track2 411111******1111D***********"),
])
def test_a_pan_followed_or_preceded_by_letters_or_track2_data_is_masked(text, masked):
    from collector.ingest.pan import may_contain_pan

    assert may_contain_pan(text)
    assert mask_text(text) == (masked, 1)
    assert mask_text(masked) == (masked, 0)


@pytest.mark.parametrize("text", [
    "trace 4111111111111111a3ce929d0e0e4736",                                    # trace id starting with a Luhn-valid run
    '{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"4111111111111abc"}',  # span id: 16 characters
    "image sha256:5c5b9ef4d1b4ab1e3e4111111111111111f0e8c2a1b3d4e5f6a7b8c9d0e1f2a3",  # 64: a digest
    "git 4111111111111111aa9d5e7b9c4f3e2d1c0b9a87",                               # 40: a commit
    "oid 65f1a2b34111111111111111",                                              # 24: ObjectId
    "containerd://4111111111111111cafe0123456789abcdef0123456789abcdef0123456789ab",  # 64 after //
    "uuid 41111111-1111-1111-1111-111111111111",
    "id 0af7651916cd43dd8448eb211c80319cd25121010",                              # "d" + digits, no PAN before it
])
def test_hex_ids_holding_a_luhn_valid_run_are_left_alone(text):
    assert mask_text(text) == (text, 0)


@pytest.mark.parametrize("text, masked", [
    ("pan+exp 41111111111111112512", "pan+exp 411111******1111****"),                # YYMM
    ("pan+exp 55555555555544441227", "pan+exp 555555******4444****"),                # MMYY
    ("x 62055000000000000042512", "x 620550*********0004****"),                      # 19 + 4 = 23 digits
])
def test_a_pan_with_its_expiry_glued_on_is_masked(text, masked):
    assert mask_text(text) == (masked, 1)
    assert PanMasker().value(int(text.split()[-1])) == masked.split()[-1]


@pytest.mark.parametrize("text", [
    "ts 1741083300067771169",       # nanosecond time, 19 digits: its first 15 pass Luhn, its last 4 read as MMYY
    "u64 18446744073709551615",     # 20 digits: unsigned 64-bit ids all start with 1
    "id 20250304101500067462",      # date-first id: no card network numbers start with 20 or 21
    "n 00000000000041111111",       # zero-padded counter
    "n 41111111111111112513",       # month 13: no expiry date
    "n 41111111111111122512",       # PAN part fails Luhn
    "n 411111111111111112512",      # 17 + 4: the 17 digits fail Luhn
    "n 411111111111111111112512",   # 24 digits: too long
])
def test_long_numbers_that_are_not_a_pan_and_expiry_are_left_alone(text):
    assert mask_text(text) == (text, 0)


@pytest.mark.parametrize("text, masked", [
    ("card 4111 1111 1111 111", "card 411111*********"),                          # 15 of 16 digits: the 16th is the check digit
    ('{"message":"card 41111111111', '{"message":"card 411111*****'),                # 11 digits
    ("p card 4111\\u00201111\\u00201111\\u0020111", "p card 411111*********"),        # separators as escapes
    # 10 digits: next to a masked copy of the same PAN (first 6, last 4) they left 10 candidates
    ('{"card":"4111111111', '{"card":"411111****'),
    ("card 4111111", "card 411111*"),                                                # any digit after the 6th
    ('{"card":"4111111111\ufffd', '{"card":"411111****\ufffd'),                  # a multi-byte character cut after them
    ('{"card":"\\u0034111111111', '{"card":"411111****'),                           # a digit as an escape
])
def test_digits_at_the_end_of_a_cut_text_are_masked_as_the_start_of_a_pan(text, masked):
    from collector.ingest.pan import mask_cut_end

    assert mask_cut_end(text) == (masked, 1)
    assert mask_cut_end(masked) == (masked, 0)


@pytest.mark.parametrize("text", ["card 411111", "card 411111******1111", "card 4111 1111 1111 111 declined", "n 123456"])
def test_short_or_masked_or_inner_digit_runs_are_not_taken_for_a_cut_pan(text):
    from collector.ingest.pan import mask_cut_end

    assert mask_cut_end(text) == (text, 0)


def test_in_binary_text_a_pan_touching_a_digit_byte_is_masked():
    from collector.ingest.pan import mask_binary

    # An OTLP LogRecord body "card 4111111111111111" followed by the tag of field 6 (0x32, "2").
    junk = "\x15card 41111111111111112\x0f\n\x06txn_id"
    assert mask_text(junk) == (junk, 0)  # 17 digits: no PAN by Luhn
    assert mask_binary(junk) == ("\x15card 411111*******1112\x0f\n\x06txn_id", 1)
    assert mask_binary("ref 41111111111111112 ok") == ("ref 41111111111111112 ok", 0)  # text: the usual rules


@pytest.mark.parametrize("final", [None, '2025-03-04T10:15:00.069Z stdout F  declined"'])
def test_a_pan_split_between_partial_chunks_is_masked_in_quarantine(final):
    from collector.ingest.parser import LineParser

    parser = LineParser()
    lines = ['2025-03-04T10:15:00.067Z stdout P {"txn_id":"T-1","m":"card 4111 1111',
             "2025-03-04T10:15:00.068Z stdout P  1111 1111"] + ([final] if final else [])
    outcomes = [o for i, line in enumerate(lines) for o in parser.feed_text(line, "src", str(i + 1))] + parser.finish()
    (out,) = outcomes
    assert out.reason.startswith("incomplete-partial" if final is None else "unparseable")
    # the reassembled payload, masked: the raw chunks each hold 8 digits of the PAN
    assert out.raw_text == '{"txn_id":"T-1","m":"card 411111******1111' + (" declined\"" if final else "")
    assert parser.masker.masked == 1


def test_digits_of_other_scripts_are_checked_by_their_value():
    # luhn_ok read ord(ch) - 48: an Arabic-Indic PAN passed or failed at random, and was stored whole.
    arabic = "".join(chr(0x0660 + int(c)) for c in "4111111111111111")
    assert luhn_ok(arabic) and not luhn_ok(arabic[:-1] + chr(0x0662))
    not_a_pan = "ref " + arabic[:-1] + chr(0x0662)  # Luhn fails: kept, digits read as ASCII
    assert mask_text(not_a_pan) == ("ref 4111111111111112", 0)


@pytest.mark.parametrize("text, masked", [
    # a digit written as a JSON escape: the raw line of {"note": "4111111111111111"} (a newcomer test
    # recovered the PAN from raw_sha256, a hash of the line with this left unmasked)
    ('{"note":"\\u0034111111111111111"}', '{"note":"411111******1111"}'),
    ('{"note":"\\uff14\\uff11\\uff11\\uff11\\uff11\\uff11\\uff11\\uff11\\uff11\\uff11\\uff11\\uff11\\uff11\\uff11'
     '\\uff11\\uff11"}', '{"note":"411111******1111"}'),                                      # full-width, escaped
    ('{"log":"{\\"n\\":\\"\\\\u0034111 1111\\\\u00201111 1111\\"}"}', '{"log":"{\\"n\\":\\"411111******1111\\"}"}'),  # escaped twice
    ('{"n":"' + "".join("\\ud835\\udf%02x" % (0xce + int(c)) for c in "4111111111111111") + '"}',
     '{"n":"411111******1111"}'),                                                           # surrogate pairs
    ('{"a":"4111111111111111\\u0031","b":"\\u0035555555555554444"}',                        # plain PAN next to an escaped digit
     '{"a":"411111******11111","b":"555555******4444"}'),  # escapes written as digits once one hides a PAN
])
def test_digits_written_as_unicode_escapes_are_masked_as_digits(text, masked):
    import json

    from collector.ingest.pan import may_contain_pan, unescape_digits

    assert may_contain_pan(text)
    assert mask_text(text)[0] == masked and mask_text(text)[1] >= 1
    decoded = json.loads(masked)
    assert PanMasker().value(decoded) == decoded  # no PAN left once decoded either
    assert unescape_digits('{"m":"caf\\u00e9 \\u00a0 \\u0031"}') == '{"m":"caf\\u00e9 \\u00a0 1"}'


def test_escaped_digits_that_are_no_pan_are_left_as_written():
    text = '{"m":"order \\u0034\\u0032 of 13 items, ref 4111111111111112"}'  # Luhn fails
    assert mask_text(text) == (text, 0)


@pytest.mark.parametrize("text, masked", [
    ('{"a":4.111111111111111e15}', '{"a":411111******1111}'),
    ('{"a":41111111111111110e-1,"b":1.5e3}', '{"a":411111******1111.0,"b":1.5e3}'),
    ('{"a":-41.11111111111111E+14}', '{"a":-411111******1111}'),
    ('{"a":4.111111111111112e15,"b":1e999999}', '{"a":4.111111111111112e15,"b":1e999999}'),  # no PAN; out of range
])
def test_numbers_with_an_exponent_are_masked_by_their_value_for_hashing(text, masked):
    from collector.ingest.pan import mask_exponent_numbers

    assert mask_text(text) == (text, 0)  # the digits as written are no PAN
    assert mask_exponent_numbers(text) == (masked, 0 if masked == text else 1)


@pytest.mark.parametrize("sep", ["\u00ad", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"])
def test_invisible_format_characters_between_digits_are_separators(sep):
    # a newcomer re-check stored 4111<soft hyphen>1111<soft hyphen>… whole: it displays as one number
    for value in (sep.join(["4111", "1111", "1111", "1111"]), "4111" + sep + "111111111111", "card 4111" + sep * 2 + "1111 1111 1111"):
        masked = PanMasker().value({"d": value})["d"]
        assert "411111******1111" in masked and "1111" + sep not in masked, (sep, value)
    escaped = '{"d":"4111\\u%04x111111111111"}' % ord(sep)  # the raw line: its hash must not hold the PAN
    assert mask_text(escaped) == ('{"d":"411111******1111"}', 1)
    emoji = "family \U0001F468\u200d\U0001F469 order 12"  # no digit run: left as written
    assert mask_text(emoji) == (emoji, 0)
