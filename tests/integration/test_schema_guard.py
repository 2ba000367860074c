"""A database a newer release migrated (its version table names a revision this release does not know): every
command that touches the database says so in one line and exits 1, having changed nothing (README, Commands)."""

from __future__ import annotations

import socket

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.policy.records import SourceRecord
from tests.support import Topics, cli, quarantine_directly, rows, settings_for

FUTURE = "0999_from_a_newer_release"
TOKEN = "operator-token-" + "x" * 32

COMMANDS = [
    ("migrate",),
    ("quarantine", "list"),
    ("quarantine", "show", "{record}", "--include-payload", "--author", "me"),
    ("quarantine", "stats"),
    ("quarantine", "annotate", "{record}", "--note", "n", "--author", "me"),
    ("quarantine", "resolve", "{record}", "--reason", "r", "--author", "me"),
    ("quarantine", "resolve", "--error-code", "INVALID_FIELD", "--reason", "r", "--yes", "--author", "me"),
    ("parked", "list"),
    ("parked", "release", "K-1", "--author", "me"),
    ("effects", "list"),
    ("effects", "show", "A-1/payment.capture"),
    ("effects", "retry", "A-1/payment.capture", "--reason", "r", "--author", "me"),
    ("reprocess", "--reason", "r", "--failure-id", "{record}", "--yes", "--author", "me"),
    ("reprocess", "list"),
    ("reprocess", "show", "R-1"),
    ("outbox", "set-aside"),
    ("outbox", "put-back", "1", "--author", "me"),
    ("reconcile",),
    ("consume",),
    ("relay",),
    ("effects",),
    ("run",),
    ("console",),
]


async def _fingerprint(engine: AsyncEngine) -> dict[str, object]:
    """Every table's row count and a digest of its rows: equal before and after means nothing was written."""
    tables = await rows(
        engine,
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
    )
    found: dict[str, object] = {}
    async with engine.connect() as connection:
        for table in sorted(row["table_name"] for row in tables):
            digest = f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM \"{table}\" t"
            found[table] = tuple((await connection.execute(text(digest))).one())
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
async def test_a_database_a_newer_release_migrated_is_one_line_exit_1_and_nothing_written(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, command: tuple[str, ...]
) -> None:
    # Given a quarantined record, in a database whose version table also names a revision this release does not know
    settings: Settings = settings_for(
        database_url, kafka, topics, console_tokens=f"ops:operator:{TOKEN}", console_bind=f"127.0.0.1:{_free_port()}"
    )
    await quarantine_directly(settings, [SourceRecord(topics.source, 0, 0, 0, b"SG-1", b"nope")])
    async with engine.begin() as connection:
        await connection.execute(text("INSERT INTO alembic_version VALUES (:v)"), {"v": FUTURE})
    before = await _fingerprint(engine)

    # When the command runs against it
    args = [word.replace("{record}", f"{topics.source}/0/0") for word in command]
    finished = await cli(settings, *args, check=False)

    # Then it is one line naming the unknown revision and what to do, exit 1, and no row changed
    lines = [line for line in finished.stderr.splitlines() if line.strip()]
    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert len(lines) == 1, finished.stderr
    assert f"{FUTURE} is newer than this release knows" in lines[0]
    assert "run a newer release of order-service" in lines[0]
    assert await _fingerprint(engine) == before
