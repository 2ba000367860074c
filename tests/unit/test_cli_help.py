"""The help of every command shows names, not Python type placeholders (`<bool>`, `<list[str]>`; issue 14), and
lists the variables it reads, generated from the settings classes: every setting names its readers."""

from __future__ import annotations

import importlib
import re
from typing import Annotated, Any

import pytest
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.cli import command as cli_command
from service.config import Settings
from service.orders.domain import DOMAIN
from service.readers import Reader, is_secret, read, read_by, readers_of, variable


def _settings_classes() -> list[type[Settings]]:
    """The core's settings and every domain's."""
    from inventory.settings import InventorySettings
    from service.orders.settings import OrderSettings

    return [Settings, OrderSettings, InventorySettings]


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
    from service.cli.environment import RUNS, reads

    SETTINGS = DOMAIN.settings
    settings = {SETTINGS.variable(name) for name in SETTINGS.model_fields}
    listed = {variable for path in RUNS for variable in reads(path, SETTINGS)}

    assert listed - settings == set()
    assert "ORDERS_KAFKA_BOOTSTRAP_SERVERS" in reads("consume", SETTINGS)
    assert "ORDERS_DATABASE_URL" in reads("quarantine list", SETTINGS)  # a group's commands read what the group reads
    assert "ORDERS_CUSTOMERS_URL" in reads("consume", SETTINGS)  # and the domain's
    # The core's own settings class names the core's variables, and none of a domain's
    assert "SERVICE_KAFKA_BOOTSTRAP_SERVERS" in reads("consume")
    assert not [variable for variable in reads("consume") if "CUSTOMERS" in variable]


@pytest.mark.parametrize("settings_cls", _settings_classes(), ids=lambda cls: cls.__name__)
def test_every_setting_names_the_parts_of_the_program_that_read_it(settings_cls: type[Settings]) -> None:
    # A new setting cannot be left out of the help: it is declared with its readers, or this fails.
    unread = [name for name, field in settings_cls.model_fields.items() if not readers_of(field)]

    assert not unread, f"{settings_cls.__name__}: name the readers of {unread} (service/readers.py, read_by)"


@pytest.mark.parametrize("settings_cls", _settings_classes(), ids=lambda cls: cls.__name__)
def test_every_setting_but_the_tests_own_is_in_some_command_s_help(settings_cls: type[Settings]) -> None:
    from service.cli.environment import RUNS, reads

    listed = {variable for path in RUNS for variable in reads(path, settings_cls)}
    tests_only = {name for name, field in settings_cls.model_fields.items() if Reader.TESTS in readers_of(field)}

    assert {variable(settings_cls, name) for name in settings_cls.model_fields if name not in tests_only} == listed
    assert not {variable(settings_cls, name) for name in tests_only} & listed


@pytest.mark.parametrize(
    ("specs", "settings_cls"),
    [
        pytest.param("service.orders.effects", "service.orders.settings.OrderSettings", id="orders"),
        pytest.param("inventory.effects", "inventory.settings.InventorySettings", id="inventory"),
    ],
)
def test_an_effect_kind_s_provider_setting_is_listed_where_the_effect_kinds_are_known(
    specs: str, settings_cls: str
) -> None:
    module, _, name = settings_cls.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    providers = {spec.provider_setting for spec in importlib.import_module(specs).SPECS}

    assert providers
    assert all(Reader.EFFECT_PROVIDERS in readers_of(cls.model_fields[setting]) for setting in providers)


def test_the_help_lists_the_commands_variables_marks_the_secrets_and_shows_no_value() -> None:
    from service.cli.environment import epilog

    SETTINGS = DOMAIN.settings

    secrets = {name: field for name, field in SETTINGS.model_fields.items() if is_secret(field)}
    defaults = [str(field.default.get_secret_value()) for field in secrets.values() if field.default is not None]

    shown = epilog("console", SETTINGS)

    assert "ORDERS_CONSOLE_TOKENS*" in shown
    assert "ORDERS_CONSOLE_BIND," in shown
    assert "* a secret, also read from the file <VARIABLE>_FILE names" in shown
    assert not [value for value in defaults if value and value in shown]
    assert "postgresql" not in shown


def test_a_setting_s_variable_is_the_class_s_prefix_and_its_name_or_its_alias() -> None:
    class Shop(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="SHOP_")

        basket_size: Annotated[int, read_by(Reader.CONSUMER)] = 3
        legacy_url: Annotated[str, read_by(Reader.CONSUMER)] = Field(default="", validation_alias="OLD_URL")
        api_key: Annotated[SecretStr | None, read_by(Reader.RELAY)] = None

    assert read(Shop, frozenset({Reader.CONSUMER})) == ["basket_size", "legacy_url"]
    assert [variable(Shop, name) for name in Shop.model_fields] == ["SHOP_BASKET_SIZE", "OLD_URL", "SHOP_API_KEY"]
    assert [is_secret(field) for field in Shop.model_fields.values()] == [False, False, True]


@pytest.mark.parametrize(
    ("path", "reads_", "reads_not"),
    [
        ("migrate", {"ORDERS_DATABASE_URL", "ORDERS_LOG_LEVEL"}, {"ORDERS_KAFKA_BOOTSTRAP_SERVERS"}),
        (
            "relay",
            {"ORDERS_RELAY_BATCH_SIZE", "ORDERS_RETRY_TIERS", "ORDERS_KAFKA_SASL_PASSWORD"},
            {"ORDERS_BATCH_SIZE"},
        ),
        ("effects", {"ORDERS_EFFECT_CONCURRENCY", "ORDERS_PAYMENTS_URL", "ORDERS_PAYMENTS_TOKEN"}, {"ORDERS_ORDERING"}),
        ("effects list", {"ORDERS_PAYMENTS_URL", "ORDERS_EMAILS_URL"}, {"ORDERS_PAYMENTS_TOKEN"}),
        ("run", {"ORDERS_BATCH_SIZE", "ORDERS_RELAY_BATCH_SIZE", "ORDERS_EFFECT_LEASE"}, {"ORDERS_CONSOLE_TOKENS"}),
        ("reconcile", {"ORDERS_DEDUP_WINDOW", "ORDERS_EFFECT_LEASE", "ORDERS_EMAILS_URL"}, {"ORDERS_KNOWN_TENANTS"}),
        ("parked release", {"ORDERS_CONSUMER_NAME"}, {"ORDERS_SOURCE_TOPIC"}),
        ("topics acls", {"ORDERS_CONSUMER_NAME", "ORDERS_SOURCE_TOPIC"}, {"ORDERS_DATABASE_URL"}),
    ],
)
def test_each_command_lists_what_it_reads_and_not_what_it_does_not(
    path: str, reads_: set[str], reads_not: set[str]
) -> None:
    from service.cli.environment import reads

    SETTINGS = DOMAIN.settings

    listed = set(reads(path, SETTINGS))

    assert reads_ <= listed
    assert not reads_not & listed
