"""The core names no domain (contract §12): no file of it (code, docstrings, strings, templates, static text) holds
the order domain's words. The order domain's names reach the user (the program, the variables, the metrics, the
owners) through its `Domain` value, never through the core's text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.orders.codes import OrderCode
from service.orders.domain import DOMAIN
from tests.unit.test_architecture import PACKAGE, REPO_ROOT

DOMAIN_PACKAGE = PACKAGE / "orders"
# What a scanned file may still hold, exactly: nothing (the core's own defaults are generic: service/names.py).
STILL_NAMED: dict[str, list[str]] = {}


def _words() -> re.Pattern[str]:
    """The order domain's words: its vocabulary, its schema names, its service's names, its owners and its codes."""
    fixed = [r"order_id", r"payment", r"customer", r"refund", r"e-?mail", r"\border\.[a-z]", r"order[-_ ]?service"]
    named = [DOMAIN.program, DOMAIN.logger_root, DOMAIN.owners.producers, DOMAIN.owners.oncall]
    codes = [code.value for code in OrderCode]
    return re.compile("|".join([*fixed, *(re.escape(name) for name in [*named, *codes])]), re.IGNORECASE)


WORDS = _words()


def core_files() -> list[Path]:
    """Every file of the core: everything under service/ but the order domain's package and compiled files."""
    return sorted(
        path
        for path in PACKAGE.rglob("*")
        if path.is_file() and DOMAIN_PACKAGE not in path.parents and "__pycache__" not in path.parts
    )


def found_in(path: Path) -> list[str]:
    """The order domain's words a file holds, in order."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return [match.group(0) for match in WORDS.finditer(text)]


def test_no_file_of_the_core_holds_the_order_domains_words() -> None:
    found = {
        relative: words
        for path in core_files()
        if (words := found_in(path)) != STILL_NAMED.get(relative := path.relative_to(REPO_ROOT).as_posix(), [])
    }

    assert found == {}


def test_the_scan_reads_templates_static_text_and_python() -> None:
    suffixes = {path.suffix for path in core_files()}

    assert {".py", ".html", ".css"} <= suffixes
    assert len(core_files()) > 100


@pytest.mark.parametrize(
    "text",
    [
        'log = get_logger("order_service.consumer")',
        "class OrderServiceError(Exception):",
        '"""Execute pending effects (payments, emails)."""',
        "{{ x }} · order-service console",
        'KIND = "payment.capture"',
        "the order.placed.v1 schema",
        'owner = "order-producers"',
        "ORDERS_CUSTOMERS_URL",
        "a Refund",
        "code ORDER_NOT_FOUND",
        'row["order_id"]',
    ],
)
def test_the_scan_finds_each_kind_of_word(text: str) -> None:
    assert WORDS.search(text), text


@pytest.mark.parametrize("text", ["in order. The next", "ORDER BY id", "the orders topic", "border.left", "ordering"])
def test_the_scan_leaves_english_and_sql_alone(text: str) -> None:
    assert not WORDS.search(text), text


def test_the_files_still_named_exist() -> None:
    assert all((REPO_ROOT / path).is_file() for path in STILL_NAMED)


def test_the_names_users_see_are_the_order_domains() -> None:
    # The core takes them from the value; they stay as they always were for the order service.
    assert (DOMAIN.program, DOMAIN.env_prefix, DOMAIN.metrics_prefix, DOMAIN.logger_root) == (
        "order-service",
        "ORDERS_",
        "orders",
        "order_service",
    )
    assert DOMAIN.settings.variable("database_url") == "ORDERS_DATABASE_URL"
    assert DOMAIN.settings().consumer_name == "order-service"
