"""No stored hash gives a PAN away (PCI DSS 3.5.1.1: a hash of a PAN must not be brute-forceable).

A masked PAN shows its first 6 and last 4 digits; what is left is 10^6 middle digits, 10^5 of them
Luhn-valid. An unkeyed SHA-256 of a text that holds the PAN unmasked (``raw_sha256``, a dedup key,
a ledger leaf, a quarantine content key) next to that masked value is recovered by hashing every
candidate: a newcomer test did it in 0.4 s for a PAN written with a JSON ``\\u`` escape. Every
line below writes the PAN in a way a field decoder reads as a PAN (escapes, other digit scripts,
escaped separators, an escape inside a shipper's string, a PAN cut between two CRI partial
chunks, a number with an exponent); the test hashes each line for every
candidate and looks for the hashes among every 64-hex-digit value stored in the database.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
from pathlib import Path

from sqlalchemy import select, text

from collector.ingest.pan import luhn_ok
from collector.ingest.pipeline import IngestRun
from collector.settings import Settings
from collector.store.models import InferenceRecord, Quarantine

PAN = "4111111111111111"  # Visa's published test PAN
FULL_WIDTH = {str(d): chr(0xFF10 + d) for d in range(10)}
MATH_BOLD = {str(d): chr(0x1D7CE + d) for d in range(10)}  # beyond the BMP: a surrogate pair in JSON


def _spell(pan: str, digits: dict[str, str]) -> str:
    return "".join(digits.get(c, c) for c in pan)


_DIGITS = {ord(v): k for table in (FULL_WIDTH, MATH_BOLD) for k, v in table.items()}


def _ecs(txn: str, **fields) -> dict:
    return {"@timestamp": "2026-11-30T08:46:18Z", "transaction.id": txn, **fields}


def _fluentbit(app_line: str) -> str:
    return json.dumps({"time": "2026-11-30T08:46:18.000000000Z", "stream": "stdout", "log": app_line,
                       "kubernetes": {"namespace_name": "risk-inference", "pod_name": "fraud-api-7c9d8-x2k4q",
                                      "container_name": "api", "host": "gpu-node-a"}})


# Each form: the raw line for a given PAN, and whether it is stored (else quarantined).
FORMS = {
    # the newcomer's repro: one digit as a \u escape
    "escape": (lambda pan: '{"@timestamp":"2026-11-30T08:46:18Z","transaction.id":"TXN-ESC","note":"\\u%04x%s"}'
               % (ord(pan[0]), pan[1:]), True),
    # full-width digits as Python's json.dumps(ensure_ascii=True) writes them, in the decision
    "full-width-escaped": (lambda pan: json.dumps(_ecs("TXN-FW", decision=_spell(pan, FULL_WIDTH))), True),
    "full-width-literal": (lambda pan: json.dumps(_ecs("TXN-FWL", decision=_spell(pan, FULL_WIDTH)),
                                                  ensure_ascii=False), True),
    "surrogate-pairs": (lambda pan: json.dumps(_ecs("TXN-SP", note=_spell(pan, MATH_BOLD))), True),
    # escaped digits and escaped separators mixed
    "escaped-separators": (lambda pan: '{"@timestamp":"2026-11-30T08:46:18Z","transaction.id":"TXN-SEP","note":"card '
                           '\\u%04x%s\\u0020%s\\u00a0%s-\\uff1%s%s"}' % (ord(pan[0]), pan[1:4], pan[4:8], pan[8:12],
                                                                    pan[12], pan[13:]), True),
    # the application's line escaped again inside a Fluent Bit record: \\u0034
    "shipper": (lambda pan: _fluentbit('{"@timestamp":"2026-11-30T08:46:18Z","transaction.id":"TXN-FB","note":"\\u%04x%s"}'
                                       % (ord(pan[0]), pan[1:])), True),
    # a CRI line written in two partial chunks, the PAN cut between them: the record's raw text is both lines
    "cri-partials": (lambda pan: "2026-11-30T08:46:18.000000000Z stdout P "
                     '{"@timestamp":"2026-11-30T08:46:18Z","transaction.id":"TXN-CRI","note":"card %s %s\n'
                     '2026-11-30T08:46:18.000000001Z stdout F %s %s"}' % (pan[:4], pan[4:8], pan[8:12], pan[12:]), True),
    # a JSON number with an exponent: its value is the PAN, its digits as written are not (stored "411111******1111.0")
    "exponent": (lambda pan: '{"@timestamp":"2026-11-30T08:46:18Z","transaction.id":"TXN-EXP","note":%s.%se15}'
                 % (pan[0], pan[1:]), True),
    "exponent-quarantined": (lambda pan: '{"@timestamp":"2026-11-30T08:46:18Z","note":%s.%se15}' % (pan[0], pan[1:]), False),
    # invisible format characters between the groups (soft hyphen, zero-width space, BOM): the number
    # displays unbroken; literal in the line and as JSON escapes, grouped 4-4-4-4 and 4-12
    "soft-hyphens": (lambda pan: json.dumps(_ecs("TXN-SH1", decision="\u00ad".join(
        (pan[:4], pan[4:8], pan[8:12], pan[12:]))), ensure_ascii=False), True),
    "soft-hyphens-escaped": (lambda pan: json.dumps(_ecs("TXN-SH2", decision="\u00ad".join(
        (pan[:4], pan[4:8], pan[8:12], pan[12:])))), True),
    "zero-width-4-12": (lambda pan: json.dumps(_ecs("TXN-ZW1", note=pan[:4] + "\u200b" + pan[4:]), ensure_ascii=False), True),
    "zero-width-4-12-escaped": (lambda pan: json.dumps(_ecs("TXN-ZW2", note=pan[:4] + "\u200b" + pan[4:])), True),
    "bom-escaped-4-12": (lambda pan: json.dumps(_ecs("TXN-BM1", note=pan[:4] + "\ufeff" + pan[4:])), True),
    "space-escaped-4-12": (lambda pan: '{"@timestamp":"2026-11-30T08:46:18Z","transaction.id":"TXN-SP1","note":"%s\\u0020%s"}'
                           % (pan[:4], pan[4:]), True),
    # no transaction id: quarantined, its text and hash stored
    "quarantined": (lambda pan: '{"@timestamp":"2026-11-30T08:46:18Z","note":"\\u%04x%s"}' % (ord(pan[0]), pan[1:]), False),
}


@functools.cache
def _candidates() -> tuple[str, ...]:
    """The middle 6 digits of every PAN with ``PAN``'s first 6 and last 4 digits that passes Luhn
    (what a brute force tries: 10^5 of the 10^6): the last middle digit follows from the others."""
    def luhn_term(digit: int, doubled: bool) -> int:
        return digit if not doubled else (2 * digit - 9 if digit > 4 else 2 * digit)

    fixed = PAN[:6] + "000000" + PAN[-4:]
    base = sum(luhn_term(int(c), (len(fixed) - 1 - i) % 2 == 1) for i, c in enumerate(fixed))
    doubled = [(len(fixed) - 1 - i) % 2 == 1 for i in range(6, 12)]
    out = []
    for first in itertools.product(range(10), repeat=5):
        partial = base + sum(luhn_term(d, doubled[k]) for k, d in enumerate(first))
        last = next(d for d in range(10) if (partial + luhn_term(d, doubled[5])) % 10 == 0)
        out.append("".join(map(str, first)) + str(last))
    assert len(out) == 10**5 and all(luhn_ok(PAN[:6] + m + PAN[-4:]) for m in out[::997])
    return tuple(out)


def _brute_force(make, hashes: set[str]) -> list[str]:
    """The PANs ``p`` among the candidates whose line ``make(p)`` hashes (SHA-256) to one of ``hashes``.

    ``make`` is called once per digit, not per candidate: the line is cut where the 6 middle
    digits go (``make`` of a PAN with letters there: ``FULL_WIDTH``/``MATH_BOLD`` leave letters
    as they are) and each candidate's line joined from the pieces and the digits' spellings.
    """
    pieces = re.split("[JKQVYO]", make(PAN[:6] + "JKQVYO" + PAN[-4:]))  # letters no line holds
    assert len(pieces) == 7
    fixed = sum(map(len, pieces))
    spelling = {}
    for d in "0123456789":
        line = make(PAN[:6] + d * 6 + PAN[-4:])
        width = (len(line) - fixed) // 6
        spelling[d] = line[len(pieces[0]):len(pieces[0]) + width]
        assert "".join(p + (spelling[d] if i < 6 else "") for i, p in enumerate(pieces)) == line
    found = []
    for mid in _candidates():
        line = "".join((pieces[0], spelling[mid[0]], pieces[1], spelling[mid[1]], pieces[2], spelling[mid[2]], pieces[3],
                        spelling[mid[3]], pieces[4], spelling[mid[4]], pieces[5], spelling[mid[5]], pieces[6]))
        if hashlib.sha256(line.encode("utf-8")).hexdigest() in hashes:
            found.append(PAN[:6] + mid + PAN[-4:])
    return found


def _stored_hashes(engine, database_url: str) -> set[str]:
    """Every 64-hex-digit value in every table of the database (hash columns, ledger, attributes…)."""
    values: set[str] = set()
    with engine.connect() as conn:
        if database_url.startswith("sqlite"):
            tables = conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'")).scalars().all()
        else:
            tables = conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars().all()
        for table in tables:
            for row in conn.execute(text(f'SELECT * FROM "{table}"')):
                for v in row:
                    if isinstance(v, bytes):
                        values.add(v.hex())
                    values.update(re.findall(r"[0-9a-f]{64}", str(v)))
    return values


def test_no_stored_hash_recovers_a_pan_however_it_is_written(sessions, engine, database_url, tmp_path):
    lines = {name: make(PAN) for name, (make, _stored) in FORMS.items()}
    for name, line in lines.items():
        if line[:1].isdigit():  # CRI lines: the application line is the chunks' contents joined
            line = "".join(part.split(" ", 3)[3] for part in line.split("\n"))
        decoded = json.dumps(json.loads(line, parse_float=lambda f: str(int(float(f)))), ensure_ascii=False).translate(_DIGITS)
        assert PAN in re.sub("[ \xa0\u00ad\u200b\ufeff-]", "", decoded.split("card")[-1]), name  # it decodes to the PAN
    path = tmp_path / "var/log/app.log"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines.values()) + "\n", encoding="utf-8")
    run = IngestRun(sessions, Settings(database_url=database_url, cluster="prod-eu"))
    with open(path, "rb") as f:
        run.ingest_stream(f, str(path))
    counts = run.finish()
    stored = sum(1 for _make, keep in FORMS.values() if keep)
    assert (counts.read, counts.stored, counts.quarantined) == (len(FORMS), stored, len(FORMS) - stored)
    assert counts.pan_masked == len(FORMS)
    with sessions() as s:
        rows = s.execute(select(InferenceRecord.decision, InferenceRecord.attributes)).all()
        quarantined = s.execute(select(Quarantine.raw_text)).scalars().all()
    shown = [r.decision or r.attributes["note"] for r in rows]  # the PAN is the decision or the note
    assert [v.replace("card ", "").removesuffix(".0") for v in shown] == ["411111******1111"] * stored
    assert all("411111******1111" in q for q in quarantined)

    # The brute force: every Luhn-valid middle, each line written with that candidate.
    hashes = _stored_hashes(engine, database_url)
    assert len(hashes) >= 3 * len(FORMS)  # raw_sha256, dedup keys, ledger entries: we look at the right data
    recovered = {name: pans for name, (make, _keep) in FORMS.items() if (pans := _brute_force(make, hashes))}
    assert not recovered, f"PAN recovered from a stored hash: {recovered}"


def test_the_brute_force_finds_the_hash_of_a_line_holding_the_pan():
    # What the test above would see if a hash of an unmasked line were stored.
    for name, (make, _keep) in FORMS.items():
        assert _brute_force(make, {hashlib.sha256(make(PAN).encode("utf-8")).hexdigest()}) == [PAN], name


def test_a_pan_under_the_name_of_a_time_field_is_masked(sessions, engine, database_url, tmp_path):
    # Integers under timeUnixNano, envelope.runtime_time_ns… were kept unmasked wherever they were
    # (draudit's own nanosecond times must not be garbled): an application's or an OTLP attribute's
    # value of that name was stored in clear, and hashed in clear in the OTLP record's raw_sha256.
    otlp = {"resourceLogs": [{"resource": {"attributes": [{"key": "k8s.pod.name", "value": {"stringValue": "p"}}]},
                              "scopeLogs": [{"logRecords": [{
                                  "timeUnixNano": "1796028378000000000", "observedTimeUnixNano": "1796028378000000001",
                                  "body": {"stringValue": "scored"},
                                  "attributes": [{"key": "txn_id", "value": {"stringValue": "TXN-OTLP"}},
                                                 {"key": "timeUnixNano", "value": {"intValue": PAN}},
                                                 {"key": "nested", "value": {"kvlistValue": {"values": [
                                                     {"key": "observedTimeUnixNano", "value": {"intValue": PAN}}]}}}]},
                                  {"timeUnixNano": "1796028378000000000", "body": {"stringValue": "no id"},
                                   "attributes": [{"key": "timeUnixNano", "value": {"intValue": PAN}}]}]}]}]}
    lines = ['{"@timestamp":"2026-11-30T08:46:18Z","transaction.id":"TXN-TIME","timeUnixNano":%s,'
             '"envelope.runtime_time_ns":%s}' % (PAN, PAN),
             json.dumps(otlp)]
    path = tmp_path / "times.log"
    path.write_text("\n".join(lines) + "\n")
    run = IngestRun(sessions, Settings(database_url=database_url, cluster="prod-eu"))
    with open(path, "rb") as f:
        run.ingest_stream(f, str(path))
    counts = run.finish()
    assert (counts.read, counts.stored, counts.quarantined) == (3, 2, 1)
    with sessions() as s:
        attrs = dict(s.execute(select(InferenceRecord.transaction_id, InferenceRecord.attributes)).all())
        quarantined = s.execute(select(Quarantine.raw_text)).scalar_one()
    assert attrs["TXN-TIME"]["timeUnixNano"] == attrs["TXN-TIME"]["envelope.runtime_time_ns"] == "411111******1111"
    assert attrs["TXN-OTLP"]["timeUnixNano"] == attrs["TXN-OTLP"]["nested.observedTimeUnixNano"] == "411111******1111"
    assert attrs["TXN-OTLP"]["envelope.observed_time_ns"] == 1796028378000000001  # our own time: a number, kept
    assert '"timeUnixNano":1796028378000000000' in quarantined and "411111******1111" in quarantined
    hashes = _stored_hashes(engine, database_url)
    with engine.connect() as conn:
        dump = [str(tuple(row)) for table in ("inference_records", "quarantine", "ledger")
                for row in conn.execute(text(f"SELECT * FROM {table}"))]
    assert "TXN-OTLP" in "".join(dump) and PAN not in "".join(dump)
    # the OTLP record's raw text is its view's canonical JSON: no hash of it with the PAN in clear
    assert not [c for c in _candidates() if hashlib.sha256(
        quarantined.replace("411111******1111", PAN[:6] + c + PAN[-4:]).encode()).hexdigest() in hashes]


def test_no_digit_after_the_first_6_of_a_cut_pan_reaches_quarantine(sessions, engine, database_url, tmp_path):
    # The newcomer's repro: a pod log whose last line is a CRI partial never finished, cut 10 digits
    # into the PAN that a complete line before it stores masked (first 6, last 4): the 10 digits in
    # quarantine and the last 4 in the record left 10 candidates. Also a truncated file, an NDJSON
    # line cut inside a multi-byte character, and a JSON array cut short.
    pod = tmp_path / "var/log/pods/risk-inference_fraud-api-7c9d8-x2k4q_0f3c2a9e-6a51-4d0e-9d7e-1b2c3d4e5f60/api/0.log"
    pod.parent.mkdir(parents=True)
    pod.write_text('2026-11-30T08:46:18.000000000Z stdout F {"@timestamp":"2026-11-30T08:46:18Z",'
                   '"transaction.id":"TXN-F","card":"4111111111111111"}\n'
                   '2026-11-30T08:46:19.000000000Z stdout P {"@timestamp":"2026-11-30T08:46:19Z",'
                   '"transaction.id":"TXN-P","card":"4111111111\n')
    cut = tmp_path / "cut.log"
    cut.write_bytes(b'{"transaction.id":"TXN-CUT","card":"5555 5555 55' + "é".encode()[:1] + b"\n")
    array = tmp_path / "array.json"
    array.write_bytes(b'[{"@timestamp":"2026-11-30T08:46:18Z","transaction.id":"TXN-A"},{"card":"37828224')
    run = IngestRun(sessions, Settings(database_url=database_url, cluster="prod-eu"))
    for path in (pod, cut, array):
        with open(path, "rb") as f:
            if path is array:
                from collector.ingest.jsonarray import JsonArrayElements, feed_elements
                feed_elements(run, JsonArrayElements(f, path.stat().st_size), str(path))
            else:
                run.ingest_stream(f, str(path))
    counts = run.finish()
    assert (counts.read, counts.stored, counts.quarantined) == (5, 2, 3) and counts.reconciles
    with sessions() as s:
        raw = dict(s.execute(select(Quarantine.source, Quarantine.raw_text)).all())
    assert raw[str(pod)].endswith('"transaction.id":"TXN-P","card":"411111****')
    assert raw[str(cut)] == '{"transaction.id":"TXN-CUT","card":"555555****\\xc3'  # not-utf8: the byte shown escaped
    assert raw[str(array)].endswith('{"card":"378282**')
    with engine.connect() as conn:
        dump = "".join(str(tuple(row)) for table in ("inference_records", "quarantine", "ledger")
                       for row in conn.execute(text(f"SELECT * FROM {table}")))
    assert "TXN-P" in dump
    for seven in ("4111111", "5555555", "3782822"):  # no digit after the 6th, separators removed
        assert seven not in re.sub(r"[ ]", "", dump)
