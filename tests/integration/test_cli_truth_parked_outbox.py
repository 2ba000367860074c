"""`parked release` and `outbox put-back` on named keys and ids (contract §10): one that nothing holds, or that no
row has, is one line naming it and exit 1, its dry run too; a known one is changed only without --dry-run; every
--json key is snake_case."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from tests.support import Finished, Topics, cli, rows, scalar, settings_for

SNAKE_CASE = re.compile(r"^[a-z][a-z0-9_]*$")
DRY_RUN = [(), ("--dry-run",)]


@pytest.fixture
def settings(database_url: str, kafka: str, topics: Topics) -> Settings:
    return settings_for(database_url, kafka, topics, ordering="key")


async def _execute(engine: AsyncEngine, sql: str, **params: object) -> Any:
    async with engine.begin() as connection:
        result = await connection.execute(text(sql), params)
        return result.scalar() if result.returns_rows else None


async def _block(engine: AsyncEngine, settings: Settings, key: str) -> None:
    await _execute(
        engine,
        "INSERT INTO key_blocks (consumer_name, ordering_key, failure_id, reason) VALUES (:c, :k, :f, 'quarantined')",
        c=settings.consumer_name,
        k=key,
        f=f"{key}#f",
    )


async def _set_aside(engine: AsyncEngine) -> int:
    row_id: int = await _execute(
        engine,
        "INSERT INTO outbox (topic, key, headers, payload, set_aside_at, set_aside_code)"
        " VALUES ('t', 'k', '{}', 'x', now(), 'MESSAGE_TOO_LARGE') RETURNING id",
    )
    return row_id


def _one_line_naming(finished: Finished, name: str) -> str:
    lines = [line for line in finished.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, finished.stderr
    assert name in lines[0]
    assert finished.stdout == ""
    return lines[0]


def _snake_case_keys(document: dict[str, Any]) -> None:
    assert [key for key in document if not SNAKE_CASE.match(key)] == []


@pytest.mark.parametrize("dry_run", DRY_RUN, ids=["run", "dry-run"])
async def test_releasing_a_key_nothing_holds_names_it_and_exits_1(
    engine: AsyncEngine, settings: Settings, dry_run: tuple[str, ...]
) -> None:
    # Given a key that another key's block and nothing else is about
    await _block(engine, settings, "HELD")

    # When an operator releases a key nothing holds
    finished = await cli(settings, "parked", "release", "NOPE", *dry_run, check=False)

    # Then one line names it, the exit is 1, and the other key stays held
    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert _one_line_naming(finished, "NOPE") == "parked release: nothing holds NOPE and nothing is parked behind it"
    assert await scalar(engine, "SELECT count(*) FROM key_blocks") == 1


async def test_a_held_key_is_freed_only_without_dry_run_and_its_json_keys_are_snake_case(
    engine: AsyncEngine, settings: Settings
) -> None:
    # Given a key held by a quarantined head
    await _block(engine, settings, "HELD")

    # When an operator asks for a dry run, it names the consumer and frees nothing
    dry = await cli(settings, "parked", "release", "HELD", "--dry-run")
    assert dry.stdout.strip() == (
        f"parked release (dry run): would free HELD under consumer {settings.consumer_name}; nothing changed"
    )
    assert await scalar(engine, "SELECT count(*) FROM key_blocks") == 1

    # When it is released for real, as JSON, the key is free and every key of the document is snake_case
    released = json.loads((await cli(settings, "parked", "release", "HELD", "--json")).stdout)
    assert released == {
        "key": "HELD",
        "consumer": settings.consumer_name,
        "released": True,
        "blocked_by": "HELD#f",
        "retrying": [],
        "parked": 0,
    }
    _snake_case_keys(released)
    assert await scalar(engine, "SELECT count(*) FROM key_blocks") == 0


@pytest.mark.parametrize("dry_run", DRY_RUN, ids=["run", "dry-run"])
async def test_putting_back_an_outbox_id_no_row_has_names_it_and_exits_1(
    engine: AsyncEngine, settings: Settings, dry_run: tuple[str, ...]
) -> None:
    # Given one set-aside row
    row_id = await _set_aside(engine)

    # When an operator puts back an id no row has
    missing = row_id + 1000
    finished = await cli(settings, "outbox", "put-back", str(missing), *dry_run, check=False)

    # Then one line names it, the exit is 1, and the set-aside row is left as it was
    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert _one_line_naming(finished, str(missing)) == f"outbox put-back: no set-aside row with id {missing}"
    assert await rows(engine, "SELECT id FROM outbox WHERE set_aside_at IS NOT NULL") == [{"id": row_id}]


async def test_a_set_aside_row_is_put_back_only_without_dry_run_and_its_json_keys_are_snake_case(
    engine: AsyncEngine, settings: Settings
) -> None:
    # Given one set-aside row
    row_id = await _set_aside(engine)

    # When an operator asks for a dry run, it is still set aside
    dry = await cli(settings, "outbox", "put-back", str(row_id), "--dry-run", "--json")
    assert json.loads(dry.stdout) == {"id": row_id, "put_back": False, "dry_run": True}
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE set_aside_at IS NOT NULL") == 1

    # When it is put back for real, the relay may take it again
    done = json.loads((await cli(settings, "outbox", "put-back", str(row_id), "--json")).stdout)
    assert done == {"id": row_id, "put_back": True}
    _snake_case_keys(done)
    assert await scalar(engine, "SELECT count(*) FROM outbox WHERE set_aside_at IS NOT NULL") == 0
