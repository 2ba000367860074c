"""Who reads each setting: every field of the settings classes names the parts of the program that read it, and
each command's `--help` lists the variables of the parts it runs (service/cli/environment.py).

A setting is declared with its readers (`Annotated[int, read_by(Reader.CONSUMER)]`), so that a new one is listed
wherever it is read without a second table to keep; tests/unit/test_cli_help.py fails on a field that names none.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo


class Reader(StrEnum):
    """A part of the program that reads settings."""

    EVERY = "every command"
    DATABASE = "every command that connects to the database"
    KAFKA = "every command with a Kafka client"
    PROCESS = "every long-running process (its /metrics listener)"
    CONSUMER = "consume"
    RELAY = "relay"
    EFFECTS = "the effect worker"
    EFFECT_PROVIDERS = "what knows which effect kinds have a provider (their URLs): effects, reconcile, effects list"
    RECONCILER = "reconcile"
    REPROCESS = "reprocess"
    PARKED = "parked"
    TOPICS = "topics plan and apply"
    ACLS = "topics acls"
    CONSOLE = "console"
    EDITS = "quarantine edit and its approvals"
    TESTS = "tests only: no command's help lists it"


@dataclass(frozen=True)
class ReadBy:
    """A setting's field metadata: the parts of the program that read it."""

    readers: frozenset[Reader]


def read_by(*readers: Reader) -> ReadBy:
    """The metadata naming a setting's readers."""
    return ReadBy(frozenset(readers))


def readers_of(field: FieldInfo) -> frozenset[Reader]:
    """The readers a field names; none when it names none (a test holds every field to naming some)."""
    return frozenset().union(*(item.readers for item in field.metadata if isinstance(item, ReadBy)))


def is_secret(field: FieldInfo) -> bool:
    """Whether a setting is a secret (typed `SecretStr`): its value is never shown, and may come from a file."""
    return field.annotation is SecretStr or SecretStr in getattr(field.annotation, "__args__", ())


def variable(settings_cls: Any, name: str) -> str:
    """The environment variable of a setting: its alias when it has one (pydantic-settings then adds no prefix),
    else the class's prefix and the field's name, in capitals."""
    field: FieldInfo = settings_cls.model_fields[name]
    alias = field.validation_alias if isinstance(field.validation_alias, str) else field.alias
    if alias:
        return alias.upper()
    return f"{settings_cls.model_config.get('env_prefix', '')}{name}".upper()


def read(settings_cls: Any, readers: frozenset[Reader]) -> list[str]:
    """The settings that any of `readers` reads, in the order the class declares them."""
    return [name for name, field in settings_cls.model_fields.items() if readers_of(field) & readers]
