"""The `order-service` command line as operators run it: real processes, real database."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.policy.records import SourceRecord
from tests.support import Topics, order_service, quarantine_directly, settings_for


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ORDERS_DEDUP_WINDOW", "5s"),
        ("ORDERS_ORDERING", "random"),
        ("ORDERS_MAX_ATTEMPTS", "zero"),
        ("ORDERS_CUSTOMERS_URL", "ftp://customers"),
        ("ORDERS_DATABASE_URL", "mysql://db"),
    ],
)
def test_bad_configuration_stops_with_one_line_naming_the_variable_and_exit_code_2(variable: str, value: str) -> None:
    result = order_service("consume", env={variable: value})

    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"invalid configuration: {variable}:")


async def test_quarantine_list_show_and_stats_answer_in_json(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given two quarantined records of different codes
    records = [
        SourceRecord(topics.source, 0, 0, 1_785_000_000_000, b"Q-1", b"nope", ((("message-id", b"Q-1.1/x")),)),
        SourceRecord(topics.source, 0, 1, 1_785_000_000_000, b"Q-2", b'{"schema": "order.x.v1"}', ()),
    ]
    owners = "SCHEMA_UNSUPPORTED=schema-team"
    await quarantine_directly(settings_for(database_url, kafka, topics, quarantine_owners=owners), records)
    env = {"ORDERS_DATABASE_URL": database_url}

    # When an operator lists, shows and summarises them
    listed = _json(order_service("quarantine", "list", "--json", env=env))
    filtered = _json(order_service("quarantine", "list", "--error-code", "SCHEMA_UNSUPPORTED", "--json", env=env))
    shown = _json(order_service("quarantine", "show", f"{topics.source}/0/0", "--json", env=env))
    with_payload = _json(
        order_service("quarantine", "show", f"{topics.source}/0/0", "--include-payload", "--json", env=env)
    )
    stats = _json(order_service("quarantine", "stats", "--json", env=env))
    missing = order_service("quarantine", "show", "nope/0/0", env=env)

    # Then each answer carries the rows, oldest first, and the payload only on request
    assert [row["failure_id"] for row in listed] == [f"{topics.source}/0/0", f"{topics.source}/0/1"]
    assert [row["error_code"] for row in filtered] == ["SCHEMA_UNSUPPORTED"]
    assert shown["envelope"]["messageId"] == "Q-1.1/x"
    assert shown["owner"] == "order-producers"
    assert "payload" not in shown
    assert with_payload["payload"] == "bm9wZQ=="  # base64 of b"nope"
    assert stats["open"] == 2
    assert stats["oldest_open_age_seconds"] >= 0
    assert {(g["error_code"], g["owner"], g["open"]) for g in stats["by_code"]} == {
        ("MALFORMED_PAYLOAD", "order-producers", 1),
        ("SCHEMA_UNSUPPORTED", "schema-team", 1),
    }
    assert missing.returncode == 1
    assert "no quarantined record" in missing.stderr


def _json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
