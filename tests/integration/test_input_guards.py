"""Flags and query parameters out of range are refused before the database sees them: the CLI in one line and exit
2, the console with a 400 naming the parameter (service/bounds.py; README, Commands)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.test_console_security import OPERATOR_TOKEN, WATCHED, seed, serving
from tests.support import Topics, cli, rows, settings_for


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (("quarantine", "list", "--older-than", "99999999d"), "--older-than"),
        (("quarantine", "resolve", "--older-than", "99999999d", "--reason", "r"), "--older-than"),
        (("quarantine", "list", "--offset", "99999999999999999999"), "--offset"),
        (("effects", "list", "--offset", "99999999999999999999"), "--offset"),
        (("reprocess", "list", "--offset", "99999999999999999999"), "--offset"),
        (("outbox", "put-back", "99999999999999999999"), "ID"),
        (("quarantine", "list", "--since", "0001-01-01T00:00:00+01:00"), "--since"),
        (("reprocess", "--reason", "r", "--error-code", "INVALID_FIELD", "--rate", "nan"), "--rate"),
        (("reprocess", "--reason", "r", "--error-code", "INVALID_FIELD", "--max-failure-rate", "nan"), "--max-failure"),
        (("reconcile", "--max-seconds", "inf"), "--max-seconds"),
        (("quarantine", "list", "--limit", "0"), "--limit"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, tuple) else value,
)
async def test_a_flag_out_of_range_is_one_line_naming_it_and_exit_2(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, command: tuple[str, ...], named: str
) -> None:
    # Given a migrated database
    before = await rows(engine, "SELECT action FROM audit_log")

    # When an operator passes a value out of range
    finished = await cli(settings_for(database_url, kafka, topics), *command, check=False)

    # Then it is one line naming the command and the flag, exit 2, nothing written
    lines = [line for line in finished.stderr.splitlines() if line.strip()]
    assert finished.returncode == 2, finished.stdout + finished.stderr
    assert len(lines) == 1, finished.stderr
    assert lines[0].startswith(f"order-service {command[0]}")
    assert named in lines[0]
    assert "Traceback" not in finished.stderr
    assert await rows(engine, "SELECT action FROM audit_log") == before


async def test_a_file_of_failure_ids_holding_nul_is_one_line_and_exit_2(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, tmp_path: Path
) -> None:
    # Given a file of failure ids, one of them holding NUL
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b"orders/0/1\norders/0/\x002\n")
    before = await rows(engine, "SELECT action FROM audit_log")

    # When an operator resolves them
    finished = await cli(
        settings_for(database_url, kafka, topics),
        *("quarantine", "resolve", "--from-file", str(ids), "--reason", "r", "--yes"),
        check=False,
    )

    # Then it is one line naming the file's flag, exit 2, nothing written
    lines = [line for line in finished.stderr.splitlines() if line.strip()]
    assert finished.returncode == 2, finished.stdout + finished.stderr
    assert len(lines) == 1, finished.stderr
    assert "--from-file" in lines[0]
    assert "NUL" in lines[0]
    assert await rows(engine, "SELECT action FROM audit_log") == before


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/quarantine?key=%00", "key"),
        ("/api/quarantine?key=K-%00", "key"),
        ("/quarantine?message_id=%00", "message_id"),
        ("/quarantine?older_than=99999999d", "older_than"),
        ("/api/quarantine?older_than=99999999d", "older_than"),
        ("/api/quarantine?offset=99999999999999999999", "offset"),
        ("/api/quarantine?limit=%C2%B2", "limit"),
        ("/effects?offset=99999999999999999999", "offset"),
        ("/runs?offset=-1", "offset"),
        ("/quarantine?since=0001-01-01T00:00:00%2B01:00", "since"),
        ("/quarantine/orders%2F0%2F%00", "failure_id"),
        ("/api/quarantine/orders%2F0%2F1?consumer=%00", "consumer"),
        ("/keys?consumer=%00", "consumer"),
        ("/effects/K-1%00", "key"),
        ("/runs/r%00", "run_id"),
    ],
)
async def test_a_query_parameter_out_of_range_or_holding_nul_is_400_naming_it(
    engine: AsyncEngine, database_url: str, path: str, named: str
) -> None:
    # Given the console on a database with quarantined records
    await seed(engine)
    async with serving(engine, database_url) as console:
        before = [await rows(engine, query) for query in WATCHED]

        # When a client asks with a value out of range, or one holding NUL
        answer = await console.client.get(path, headers={"authorization": f"Bearer {OPERATOR_TOKEN}"})

        # Then it is a 400 naming the parameter, not a server error, and nothing changed
        assert answer.status_code == 400, answer.text
        assert named in answer.json()["error"]
        assert "\n" not in answer.json()["error"]
        assert [await rows(engine, query) for query in WATCHED] == before


async def test_a_form_field_holding_nul_is_400(engine: AsyncEngine, database_url: str) -> None:
    # Given the console on a database with quarantined records
    await seed(engine)
    async with serving(engine, database_url) as console:
        before = [await rows(engine, query) for query in WATCHED]

        # When an operator's action carries NUL in a field
        answer = await console.client.post(
            "/actions/annotate",
            data={"failure_id": "orders/3/1200", "note": "a\x00note", "consumer": "orders-consumer", "confirm": "yes"},
            headers={"authorization": f"Bearer {OPERATOR_TOKEN}"},
        )

        # Then it is refused, and nothing was written
        assert answer.status_code == 400, answer.text
        assert "note" in answer.json()["error"]
        assert [await rows(engine, query) for query in WATCHED] == before
