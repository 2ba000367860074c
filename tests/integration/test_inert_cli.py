"""The command line with hostile and with ordinary records, as an operator runs it: on a terminal of 80 and of 120
columns (a real pseudo-terminal) and piped. Record content is printed only as escapes (tables, `show`, TSV, CSV,
JSON), TSV, CSV and JSON decode back to the exact values, no id or code is cut, and `show` prints labelled
sections with one timestamp style.

Real PostgreSQL (a fresh migrated database per test); the CLI runs as a process.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service import inert
from service.config import Settings
from service.store import quarantine
from tests.support import ROOT, Topics, cli, env_for, quarantine_as, settings_for

BIDI = [chr(c) for c in (0x200E, 0x200F, 0x061C, *range(0x202A, 0x202F), *range(0x2066, 0x206A))]
CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]
CLIPBOARD = "\x1b]52;c;aGVsbG8=\x07"  # OSC 52: write the operator's clipboard
# A key, a message id, a header and a note from outside: a clipboard write, a screen clear, a window title, a
# right-to-left override, a C1 control, a tab and a newline, next to text that must stay readable.
HOSTILE_KEY = f"K-1{CLIPBOARD}\x1b[2J"
HOSTILE_ID = "m-1\u202egnp.exe\x9b31m"
HOSTILE_HEADER = ("x-title\x1b]0;owned\x07", "a\tb\nc\\d Zürich")
HOSTILE_NOTE = "see \u2066INC-7\u2069\r\nthen \x1b[31mred"
SGR = re.compile(r"\x1b\[[0-9;]*m")  # the styles Rich itself writes on a terminal (bold headers)
NOW = datetime.now(UTC).replace(microsecond=0)
ISO_Z = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")


def dangerous(printed: str) -> list[str]:
    """The characters of output, but for line ends and tab separators, a terminal would act on or hide text with."""
    return sorted({f"U+{ord(c):04X}" for c in printed if (c in CONTROLS and c not in "\r\n\t") or c in BIDI})


def record(offset: int, key: str, message_id: str, code: str = "MALFORMED_PAYLOAD", **extra: Any) -> Any:
    """A quarantined record as the consumer writes one, on partition 0 of `orders.v1`."""
    values: dict[str, Any] = {
        "failure_id": f"orders.v1/0/{offset}",
        "message_id": message_id,
        "error_code": code,
        "owner": "order-intake-team",
        "ordering_key": key,
        "envelope": {"failureId": f"orders.v1/0/{offset}", "errorCode": code, "key": key},
        "payload": b"\xff",
        "source_headers": [["message-id", message_id], ["sent-at", "1785000000000"]],
        "attempts": 1,
        "first_failed_at": NOW - timedelta(hours=1),
        "last_failed_at": NOW - timedelta(minutes=5),
    }
    return quarantine.QuarantineRow(**(values | extra))


@pytest.fixture
async def hostile(engine: AsyncEngine, database_url: str, kafka: str) -> Settings:
    """Two records, one with hostile content (and a note) and one ordinary, and an effect with a hostile payload."""
    settings = settings_for(database_url, kafka, Topics("orders.v1"))
    records = [
        record(0, HOSTILE_KEY, HOSTILE_ID, source_headers=[list(HOSTILE_HEADER), ["sent-at", "1785000000000"]]),
        record(1, "A-1001", "2f1c9a8e-6b7d-4c1e-9a3b-000000000001", "SCHEMA_UNSUPPORTED"),
    ]
    await quarantine_as(engine, settings.consumer_name, records)
    async with engine.begin() as connection:
        key = quarantine.RecordKey(settings.consumer_name, "orders.v1/0/0")
        await quarantine.annotate(connection, key, "bob", HOSTILE_NOTE)
        await connection.execute(
            text(
                "INSERT INTO effects (idempotency_key, aggregate_id, kind, payload)"
                " VALUES (:key, 'A-1', 'payment.capture', CAST(:payload AS jsonb))"
            ),
            {"key": f"A-1/{HOSTILE_KEY}", "payload": json.dumps({"note": HOSTILE_NOTE, "city": "Zürich"})},
        )
    return settings


def on_terminal(settings: Settings, columns: int, *args: str) -> str:
    """Run the CLI on a pseudo-terminal `columns` wide; what it printed there (styles removed)."""
    parent, child = pty.openpty()
    env = env_for(settings) | {"COLUMNS": str(columns), "LINES": "50", "TERM": "xterm-256color"}
    process = subprocess.Popen(
        [sys.executable, "-m", "service", *args], cwd=ROOT, env=env, stdin=child, stdout=child, stderr=child
    )
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # the terminal is closed once the process has exited and everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(parent)
    assert process.wait(timeout=60) == 0, b"".join(chunks)
    return SGR.sub("", b"".join(chunks).decode())


@pytest.mark.parametrize("columns", [80, 120])
async def test_on_a_terminal_tables_and_show_print_escapes_and_never_cut_an_id_or_a_code(
    hostile: Settings, columns: int
) -> None:
    # When an operator lists, summarises and shows records and an effect on a terminal of `columns`
    listed = on_terminal(hostile, columns, "quarantine", "list")
    stats = on_terminal(hostile, columns, "quarantine", "stats")
    shown = on_terminal(hostile, columns, "quarantine", "show", "orders.v1/0/0")
    effect = on_terminal(hostile, columns, "effects", "show", f"A-1/{HOSTILE_KEY}")

    # Then nothing of the content acts on the terminal: it is there as escapes
    for printed in (listed, stats, shown, effect):
        assert dangerous(printed) == [], printed
    for table in (listed, stats):
        assert all(len(line) <= columns for line in table.splitlines()), table
    assert inert.shown(HOSTILE_KEY) in listed
    assert inert.shown(HOSTILE_ID) in shown

    # And every id and code is whole on one line
    lines = listed.splitlines()
    for whole in (
        "orders.v1/0/0",
        "orders.v1/0/1",
        "2f1c9a8e-6b7d-4c1e-9a3b-000000000001",
        "MALFORMED_PAYLOAD",
        "SCHEMA_UNSUPPORTED",
        "order-intake-team",
        "A-1001",
    ):
        assert any(whole in line for line in lines), (whole, listed)
    for whole in ("MALFORMED_PAYLOAD", "SCHEMA_UNSUPPORTED", "order-intake-team"):
        assert any(whole in line for line in stats.splitlines()), (whole, stats)


async def test_show_prints_labelled_sections_one_timestamp_style_indented_json_and_no_none(
    hostile: Settings,
) -> None:
    # When an operator shows a record and an effect
    shown = (await cli(hostile, "quarantine", "show", "orders.v1/0/0")).stdout
    effect = (await cli(hostile, "effects", "show", f"A-1/{HOSTILE_KEY}")).stdout

    # Then each is labelled sections, every timestamp ISO 8601 in UTC with Z, nothing printed as None
    sections = [line for line in shown.splitlines() if line and not line.startswith(" ")]
    assert sections == [
        "facts",
        "source headers",
        "envelope",
        "notes",
        "reprocessing",
        "timeline (UTC, in the order it happened)",
    ]
    assert [line for line in effect.splitlines() if line and not line.startswith(" ")] == ["facts", "payload"]
    for printed in (shown, effect):
        assert "None" not in printed
        assert dangerous(printed) == []
        assert "+00:00" not in printed
    assert f"  first failed     {(NOW - timedelta(hours=1)).strftime('%Y-%m-%dT%H:%M:%SZ')}" in shown
    assert len(ISO_Z.findall(shown)) >= 4

    # And the envelope and the payload are indented JSON, readable and inert
    assert '    "errorCode": "MALFORMED_PAYLOAD",' in shown
    assert '    "city": "Zürich",' in effect
    assert '    "note": "see \\u2066INC-7\\u2069\\r\\nthen \\u001b[31mred"' in effect

    # And a header of epoch milliseconds is also shown as its time, the hostile header as escapes
    assert "  sent-at                  1785000000000 (2026-07-25T17:20:00Z)\n" in shown
    assert f"  {inert.shown(HOSTILE_HEADER[0])}  {inert.shown(HOSTILE_HEADER[1])}" in shown


async def test_piped_tsv_csv_and_json_print_escapes_and_decode_back_to_the_exact_values(hostile: Settings) -> None:
    # When an operator pipes the list as TSV, CSV and JSON
    tsv = (await cli(hostile, "quarantine", "list")).stdout
    as_csv = (await cli(hostile, "quarantine", "list", "--csv")).stdout
    as_json = (await cli(hostile, "quarantine", "list", "--json")).stdout
    shown = (await cli(hostile, "quarantine", "show", "orders.v1/0/0", "--json")).stdout

    # Then none holds a raw control or bidi character
    for printed in (tsv, as_csv, as_json, shown):
        assert dangerous(printed) == [], printed

    # And each decodes back to the exact key and message id
    header, *rows = [line.split("\t") for line in tsv.splitlines()]
    by_id = {row[0]: dict(zip(header, map(inert.unescaped, row), strict=True)) for row in rows}
    assert (by_id["orders.v1/0/0"]["key"], by_id["orders.v1/0/0"]["message id"]) == (HOSTILE_KEY, HOSTILE_ID)
    read = {row["failure_id"]: row for row in csv.DictReader(io.StringIO(as_csv))}
    assert inert.unescaped(read["orders.v1/0/0"]["ordering_key"]) == HOSTILE_KEY
    listed = {row["failure_id"]: row for row in json.loads(as_json)}
    assert (listed["orders.v1/0/0"]["ordering_key"], listed["orders.v1/0/0"]["message_id"]) == (HOSTILE_KEY, HOSTILE_ID)
    record = json.loads(shown)
    assert record["source_headers"][0] == list(HOSTILE_HEADER)
    assert [note["note"] for note in record["annotations"]] == [HOSTILE_NOTE]
    assert "Zürich" in shown  # readable: only the invisible characters are escaped


async def test_a_line_naming_a_hostile_key_or_effect_prints_it_as_escapes(hostile: Settings) -> None:
    # When an operator names a hostile key nothing holds, and a hostile effect key that names nothing
    released = await cli(hostile, "parked", "release", HOSTILE_KEY, "--dry-run", "--author", "ann", check=False)
    retried = await cli(
        hostile, "effects", "retry", f"B-2/{HOSTILE_KEY}", "--reason", "r", "--author", "ann", check=False
    )

    # Then each says so in one line that holds the key as escapes
    assert released.returncode == retried.returncode == 1
    for said in (released.stderr, retried.stderr):
        assert dangerous(said) == [], said
        assert inert.shown(HOSTILE_KEY) in said
