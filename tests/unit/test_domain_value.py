"""A domain describes itself to the core with one `Domain` value (service/ports.py), and the core takes every name it
shows from it: the command line, the variables, the metrics, the loggers, the owners. A small domain that is not the
order domain shows it."""

from __future__ import annotations

import io
import json
import logging
from contextlib import redirect_stderr
from typing import Any, ClassVar

import pytest
import structlog
from pydantic_settings import SettingsConfigDict

from service import logs
from service.cli import command, common
from service.containers import Container
from service.ports import DecodeFailure, Domain, DomainCode, EffectRegistry, ErrorCode, Owners, Plumbing, Settings


class ShelfSettings(Settings):
    """A domain's settings: the core's, under its own prefix and program."""

    model_config = SettingsConfigDict(env_prefix="SHELF_")
    program: ClassVar[str] = "shelf-service"


class ShelfCode(DomainCode):
    """A domain's own business answer."""

    SHELF_FULL = "SHELF_FULL"


def _decode(value: bytes | None) -> Any:
    return DecodeFailure(ErrorCode.MALFORMED_PAYLOAD)


def _no_handler(parts: Plumbing) -> Any:
    raise AssertionError("the handler is not built for these tests")


def _no_effects(parts: Plumbing) -> EffectRegistry:
    return EffectRegistry([])


@pytest.fixture(autouse=True)
def _served_domain_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a command line makes its domain the one the process serves; each test here gives it back."""
    monkeypatch.setattr(common, "_domain", common._domain)


def shelf(**changes: Any) -> Domain:
    values: dict[str, Any] = {
        "program": "shelf-service",
        "summary": "Keep shelves from Kafka in PostgreSQL.",
        "env_prefix": "SHELF_",
        "metrics_prefix": "shelf",
        "alerts_prefix": "Shelf",
        "logger_root": "shelf_service",
        "settings": ShelfSettings,
        "decode": _decode,
        "failing_field": lambda value: None,
        "handler": _no_handler,
        "effects": _no_effects,
        "effect_specs": (),
        "codes": (ShelfCode,),
        "owners": Owners(producers="shelf-producers", oncall="shelf-oncall"),
        **changes,
    }
    return Domain(**values)


def test_a_domain_whose_settings_read_another_prefix_or_program_is_refused() -> None:
    with pytest.raises(ValueError, match="SHELF_"):
        shelf(env_prefix="SHELVES_")
    with pytest.raises(ValueError, match="shelf-service"):
        shelf(program="shelves")


def test_the_error_codes_are_the_cores_and_the_domains() -> None:
    codes = shelf().error_codes

    assert "SHELF_FULL" in codes
    assert "MALFORMED_PAYLOAD" in codes


def test_the_command_line_names_the_domains_program_and_variables(capsys: pytest.CaptureFixture[str]) -> None:
    built = command(shelf())

    with pytest.raises(SystemExit):
        built(["parked", "--help"], prog_name="shelf-service")
    shown = capsys.readouterr().out

    assert "Usage: shelf-service parked" in shown
    assert "SHELF_ORDERING=key" in shown


def test_a_bad_variable_is_named_with_the_domains_prefix(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHELF_DEDUP_WINDOW", "1s")

    with pytest.raises(SystemExit) as ended:
        command(shelf())(["quarantine", "list"], prog_name="shelf-service")

    assert ended.value.code == 2
    assert "SHELF_DEDUP_WINDOW: must be between 20s and 7d" in capsys.readouterr().err


def test_the_container_names_the_metrics_with_the_domains_prefix() -> None:
    container = Container(settings=ShelfSettings(), domain=shelf())

    names = {family.name for family in container.metrics().registry.collect()}

    assert "shelf_records" in names
    assert not [name for name in names if not name.startswith("shelf_")]


def test_the_loggers_are_named_under_the_domains_root() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    written = io.StringIO()
    try:
        with redirect_stderr(written):
            logs.configure("info", "shelf_service")
            structlog.get_logger("consumer").info("started")
    finally:
        structlog.reset_defaults()
        root.handlers[:] = handlers
        root.setLevel(level)

    assert json.loads(written.getvalue())["logger"] == "shelf_service.consumer"
