"""The help of every command shows names, not Python type placeholders (`<bool>`, `<list[str]>`; issue 14)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from service.cli import command as cli_command
from service.orders.domain import DOMAIN

_PLACEHOLDER = re.compile(r"<(bool|int|float|str|path|list\[[a-z]+\])>")


def _command() -> Any:
    return cli_command(DOMAIN)


def _paths(command: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    for name, sub in getattr(command, "commands", {}).items():
        found += _paths(sub, (*prefix, name))
    return found


@pytest.mark.parametrize("path", _paths(_command()), ids=lambda path: " ".join(path) or "(top)")
def test_help_shows_no_type_placeholders(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        _command()([*path, "--help"], prog_name="order-service")
    assert ended.value.code == 0
    shown = capsys.readouterr().out
    assert "Usage: order-service" in shown
    assert not _PLACEHOLDER.findall(shown), shown


def test_every_variable_a_command_says_it_reads_is_a_setting() -> None:
    from service.cli.environment import READS, reads
    from service.config import ENV_PREFIX

    DOMAIN_READS, SETTINGS = DOMAIN.reads, DOMAIN.settings
    settings = {f"{ENV_PREFIX}{name.upper()}" for name in SETTINGS.model_fields}
    listed = {variable for path in READS | DOMAIN_READS for variable in reads(path, DOMAIN_READS)}

    assert listed - settings == set()
    assert "ORDERS_KAFKA_BOOTSTRAP_SERVERS" in reads("consume")
    assert "ORDERS_DATABASE_URL" in reads("quarantine list")  # a group's commands read what the group reads
    assert "ORDERS_CUSTOMERS_URL" in reads("consume", DOMAIN_READS)  # and the domain's
    assert "ORDERS_CUSTOMERS_URL" not in reads("consume")
