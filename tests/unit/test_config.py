"""Configuration comes from `ORDERS_*` variables (contract §2); a bad one stops start-up with one line naming it."""

from __future__ import annotations

import os
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from service.config import ConfigurationError, load_settings
from service.durations import format_duration, parse_duration
from service.orders.settings import OrderSettings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No `ORDERS_*` variable of the machine running the tests leaks into them (pydantic-settings ignores case)."""
    for name in list(os.environ):
        if name.upper().startswith("ORDERS_"):
            monkeypatch.delenv(name)


def configuration_error(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> str:
    """Set one variable, load the settings, and return the message of the ConfigurationError that must follow."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings(OrderSettings)
    return str(caught.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500ms", timedelta(milliseconds=500)),
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("1h", timedelta(hours=1)),
        ("7d", timedelta(days=7)),
        ("1.5h", timedelta(minutes=90)),
    ],
)
def test_a_duration_written_as_in_the_contract_is_parsed(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "30", "s", "-5s", "5w", "1e3s", "30 seconds", "thirty seconds", "5m30s"])
def test_anything_else_is_refused_with_the_accepted_format_in_the_message(text: str) -> None:
    with pytest.raises(ValueError, match="500ms, 30s, 5m, 1h or 7d"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(seconds=30), "30s"),
        (timedelta(seconds=90), "90s"),
        (timedelta(minutes=5), "5m"),
        (timedelta(hours=1), "1h"),
        (timedelta(days=7), "7d"),
        (timedelta(milliseconds=1500), "1500ms"),
    ],
)
def test_a_duration_is_written_back_in_the_shortest_exact_form(value: timedelta, expected: str) -> None:
    assert format_duration(value) == expected
    assert parse_duration(expected) == value


def test_without_any_variable_the_contract_defaults_apply() -> None:
    settings = load_settings(OrderSettings)

    assert settings.consumer_name == "order-service"
    assert settings.source_topic == "orders"
    assert settings.retry_tiers == "30s,5m"
    assert settings.ordering == "key"
    assert settings.dedup_window == timedelta(days=7)
    assert settings.known_tenants == ("acme", "globex", "initech")
    assert settings.metrics_port == 9108
    assert settings.customers_url is None
    assert settings.payments_url is None
    assert settings.emails_url is None
    # Unset budget: build_policy derives it from the retry tiers (test_retry_schedule.py pins the values).
    assert settings.max_attempts is None
    assert settings.max_elapsed is None
    assert settings.blocking_attempts == 3
    assert settings.blocking_elapsed == timedelta(seconds=5)
    assert settings.processing_timeout == timedelta(seconds=30)


@pytest.mark.parametrize(
    ("variable", "value", "field", "expected"),
    [
        ("ORDERS_CONSUMER_NAME", "orders-eu", "consumer_name", "orders-eu"),
        ("ORDERS_SOURCE_TOPIC", "shop.orders", "source_topic", "shop.orders"),
        ("ORDERS_RETRY_TIERS", " 10s, 1m ,1h", "retry_tiers", "10s,1m,1h"),
        ("ORDERS_RETRY_TIERS", "rocketmq", "retry_tiers", "rocketmq"),
        ("ORDERS_ORDERING", "versioned", "ordering", "versioned"),
        ("ORDERS_ORDERING", "unordered", "ordering", "unordered"),
        ("ORDERS_DEDUP_WINDOW", "1h", "dedup_window", timedelta(hours=1)),
        ("ORDERS_DEDUP_WINDOW", "7d", "dedup_window", timedelta(days=7)),
        ("ORDERS_MAX_ATTEMPTS", "8", "max_attempts", 8),
        ("ORDERS_MAX_ELAPSED", "2m", "max_elapsed", timedelta(minutes=2)),
        ("ORDERS_BLOCKING_ATTEMPTS", "1", "blocking_attempts", 1),
        ("ORDERS_BLOCKING_ATTEMPTS", "100", "blocking_attempts", 100),
        ("ORDERS_BLOCKING_ELAPSED", "500ms", "blocking_elapsed", timedelta(milliseconds=500)),
        ("ORDERS_PROCESSING_TIMEOUT", "2m", "processing_timeout", timedelta(minutes=2)),
        ("ORDERS_KNOWN_TENANTS", " acme , umbrella,,", "known_tenants", ("acme", "umbrella")),
        ("ORDERS_KNOWN_TENANTS", "acme", "known_tenants", ("acme",)),
        ("ORDERS_METRICS_PORT", "9200", "metrics_port", 9200),
        ("ORDERS_CUSTOMERS_URL", "http://customers.internal:8080", "customers_url", "http://customers.internal:8080"),
        ("ORDERS_PAYMENTS_URL", "https://payments.internal/", "payments_url", "https://payments.internal"),
        ("ORDERS_EMAILS_URL", "", "emails_url", None),
        ("ORDERS_EMAILS_URL", "   ", "emails_url", None),
        ("ORDERS_CONSOLE_TRACE_URL", "", "console_trace_url", ""),
        (
            "ORDERS_CONSOLE_TRACE_URL",
            " http://jaeger.internal:16686/trace/{trace_id} ",
            "console_trace_url",
            "http://jaeger.internal:16686/trace/{trace_id}",
        ),
        (
            "ORDERS_CONSOLE_TRACE_URL",
            "https://grafana.internal/explore?trace={trace_id}&left=%7B%7D#x",
            "console_trace_url",
            "https://grafana.internal/explore?trace={trace_id}&left=%7B%7D#x",
        ),
    ],
)
def test_a_valid_variable_is_read_into_its_setting(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, field: str, expected: object
) -> None:
    monkeypatch.setenv(variable, value)

    read = getattr(load_settings(OrderSettings), field)
    assert (read.get_secret_value() if isinstance(read, SecretStr) else read) == expected


def test_an_explicit_override_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERS_SOURCE_TOPIC", "from-environment")

    assert load_settings(OrderSettings, source_topic="from-override").source_topic == "from-override"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ORDERS_DATABASE_URL", "postgres://localhost/orders"),
        ("ORDERS_CONSUMER_NAME", ""),
        ("ORDERS_SOURCE_TOPIC", "orders topic"),
        ("ORDERS_SOURCE_TOPIC", ""),
        ("ORDERS_RETRY_TIERS", "30s,often"),
        ("ORDERS_RETRY_TIERS", "0s"),
        ("ORDERS_RETRY_TIERS", "kafka"),
        ("ORDERS_MAX_ATTEMPTS", "0"),
        ("ORDERS_MAX_ATTEMPTS", "many"),
        ("ORDERS_MAX_ELAPSED", "0s"),
        ("ORDERS_MAX_ELAPSED", "forever"),
        ("ORDERS_MAX_ELAPSED", "99999999999d"),
        ("ORDERS_BLOCKING_ATTEMPTS", "0"),
        ("ORDERS_BLOCKING_ATTEMPTS", "101"),
        ("ORDERS_BLOCKING_ATTEMPTS", "few"),
        ("ORDERS_BLOCKING_ELAPSED", "0s"),
        ("ORDERS_BLOCKING_ELAPSED", "briefly"),
        ("ORDERS_PROCESSING_TIMEOUT", "0s"),
        ("ORDERS_PROCESSING_TIMEOUT", "30"),
        ("ORDERS_PROCESSING_TIMEOUT", "99999999999d"),
        ("ORDERS_ORDERING", "strict"),
        ("ORDERS_ORDERING", "KEY"),
        ("ORDERS_DEDUP_WINDOW", "19s"),
        ("ORDERS_DEDUP_WINDOW", "8d"),
        ("ORDERS_DEDUP_WINDOW", "0s"),
        ("ORDERS_DEDUP_WINDOW", "7 days"),
        ("ORDERS_DEDUP_WINDOW", "99999999999d"),
        ("ORDERS_CUSTOMERS_URL", "ftp://customers.internal"),
        ("ORDERS_PAYMENTS_URL", "payments.internal"),
        ("ORDERS_EMAILS_URL", "localhost:8080"),
        ("ORDERS_KNOWN_TENANTS", " , "),
        ("ORDERS_METRICS_PORT", "70000"),
        ("ORDERS_METRICS_PORT", "http"),
        ("ORDERS_CONSOLE_TRACE_URL", "http://jaeger.internal:16686/trace/"),
        ("ORDERS_CONSOLE_TRACE_URL", "http://jaeger/{trace_id}/{trace_id}"),
        ("ORDERS_CONSOLE_TRACE_URL", "http://jaeger/{trace_id}?span={span_id}"),
        ("ORDERS_CONSOLE_TRACE_URL", "javascript:alert(1)//{trace_id}"),
    ],
)
def test_an_invalid_variable_stops_start_up_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    message = configuration_error(monkeypatch, variable, value)

    assert message.startswith(f"invalid configuration: {variable}")
    assert "\n" not in message
    assert "Traceback" not in message
    assert "pydantic" not in message


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("ORDERS_ORDERING", "strict", ["key", "versioned", "unordered"]),
        ("ORDERS_DEDUP_WINDOW", "19s", ["20s", "7d"]),
        ("ORDERS_DEDUP_WINDOW", "soon", ["500ms", "30s", "7d"]),
        ("ORDERS_RETRY_TIERS", "30s,often", ["30s", "5m"]),
        ("ORDERS_RETRY_TIERS", "rocketMQ", ["rocketmq"]),
        ("ORDERS_CUSTOMERS_URL", "ftp://customers.internal", ["http://", "https://"]),
        ("ORDERS_METRICS_PORT", "70000", ["65535"]),
        ("ORDERS_BLOCKING_ATTEMPTS", "101", ["100"]),
        ("ORDERS_BLOCKING_ELAPSED", "briefly", ["500ms", "30s", "7d"]),
        ("ORDERS_PROCESSING_TIMEOUT", "0s", ["longer than 0"]),
        ("ORDERS_CONSOLE_TRACE_URL", "http://jaeger/trace", ["{trace_id} once", "http://", "empty for no link"]),
    ],
)
def test_the_message_names_the_allowed_values(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, allowed: list[str]
) -> None:
    message = configuration_error(monkeypatch, variable, value)

    for fragment in allowed:
        assert fragment in message


def test_the_error_does_not_chain_the_validation_error_that_would_print_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ORDERS_ORDERING", "strict")

    with pytest.raises(ConfigurationError) as caught:
        load_settings(OrderSettings)

    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


def test_a_rejected_database_url_is_not_echoed_with_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    message = configuration_error(monkeypatch, "ORDERS_DATABASE_URL", "mysql://orders:s3cret-pw@db.internal/orders")

    assert message.startswith("invalid configuration: ORDERS_DATABASE_URL")
    assert "s3cret-pw" not in message


def test_several_invalid_variables_are_all_named_on_the_same_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given two bad variables
    monkeypatch.setenv("ORDERS_ORDERING", "strict")
    monkeypatch.setenv("ORDERS_METRICS_PORT", "http")

    # When the settings load
    with pytest.raises(ConfigurationError) as caught:
        load_settings(OrderSettings)

    # Then one line names both, so an operator fixes them in one go
    message = str(caught.value)
    assert "\n" not in message
    assert "ORDERS_ORDERING" in message
    assert "ORDERS_METRICS_PORT" in message


def test_topic_names_derive_from_the_default_source_topic() -> None:
    topics = load_settings(OrderSettings).topics

    assert topics.source == "orders"
    assert topics.quarantine == "orders.quarantine"
    assert topics.reprocess == "orders.reprocess"
    assert topics.rejected == "orders.rejected"
    assert topics.events == "orders.events"
    assert topics.retry("30s") == "orders.retry.30s"
    assert topics.retry("5m") == "orders.retry.5m"


def test_topic_names_follow_a_configured_source_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERS_SOURCE_TOPIC", "shop.orders")

    topics = load_settings(OrderSettings).topics

    assert topics.quarantine == "shop.orders.quarantine"
    assert topics.reprocess == "shop.orders.reprocess"
    assert topics.rejected == "shop.orders.rejected"
    assert topics.events == "shop.orders.events"
    assert topics.retry("5m") == "shop.orders.retry.5m"


def test_each_default_retry_tier_names_its_topic_with_the_duration_as_written() -> None:
    settings = load_settings(OrderSettings)

    names = [settings.topics.retry(format_duration(parse_duration(tier))) for tier in settings.retry_tiers.split(",")]

    assert names == ["orders.retry.30s", "orders.retry.5m"]


def test_the_shortest_dedup_window_is_accepted_when_the_retry_horizon_fits_in_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No tiers and a 5 s blocking budget: 5 s horizon + 10 s margin fit in 20 s.
    monkeypatch.setenv("ORDERS_RETRY_TIERS", "")
    monkeypatch.setenv("ORDERS_DEDUP_WINDOW", "20s")

    assert load_settings(OrderSettings).dedup_window == timedelta(seconds=20)


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        (
            {"ORDERS_DEDUP_WINDOW": "20s"},
            "invalid configuration: ORDERS_DEDUP_WINDOW: 20s is shorter than the retry horizon 15m plus a margin "
            "of 90s: it must be at least 990s; raise it, or shorten ORDERS_MAX_ELAPSED / ORDERS_RETRY_TIERS",
        ),
        (
            {"ORDERS_DEDUP_WINDOW": "1h", "ORDERS_RETRY_TIERS": "rocketmq"},
            "invalid configuration: ORDERS_DEDUP_WINDOW: 1h is shorter than the retry horizon 1d plus a margin "
            "of 144m: it must be at least 1584m; raise it, or shorten ORDERS_MAX_ELAPSED / ORDERS_RETRY_TIERS",
        ),
        (
            {"ORDERS_EFFECT_LEASE": "2s"},
            "invalid configuration: ORDERS_EFFECT_LEASE: must be longer than twice ORDERS_HTTP_TIMEOUT (4s)",
        ),
    ],
)
def test_a_window_shorter_than_the_retry_horizon_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], expected: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)

    with pytest.raises(ConfigurationError) as refused:
        load_settings(OrderSettings)

    assert str(refused.value) == expected


@pytest.mark.parametrize(("value", "level"), [("DEBUG", "debug"), (" Info ", "info"), ("warning", "warning")])
def test_the_log_level_is_taken_in_any_case(monkeypatch: pytest.MonkeyPatch, value: str, level: str) -> None:
    monkeypatch.setenv("ORDERS_LOG_LEVEL", value)
    assert load_settings(OrderSettings).log_level == level


# ---------------------------------------------------------------- addresses: URLs and servers (issue 43)

SECRET = "s3cret-pw"  # a password no message may show


@pytest.mark.parametrize(
    ("variable", "value", "field", "expected"),
    [
        ("ORDERS_PAYMENTS_URL", "http://[::1]:8080/", "payments_url", "http://[::1]:8080"),
        ("ORDERS_PAYMENTS_URL", "http://127.0.0.1:1", "payments_url", "http://127.0.0.1:1"),
        (
            "ORDERS_PAYMENTS_URL",
            "https://payments.internal:65535/v1/",
            "payments_url",
            "https://payments.internal:65535/v1",
        ),
        ("ORDERS_PAYMENTS_URL", "HTTPS://Payments.Internal.", "payments_url", "HTTPS://Payments.Internal."),
        ("ORDERS_EMAILS_URL", "http://emails_fake:8080/api%20v2", "emails_url", "http://emails_fake:8080/api%20v2"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "kafka-0.kafka:9092", "kafka_bootstrap_servers", "kafka-0.kafka:9092"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", " k0:9092 , k1:9093,", "kafka_bootstrap_servers", "k0:9092,k1:9093"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "[::1]:9092,10.0.0.7:1", "kafka_bootstrap_servers", "[::1]:9092,10.0.0.7:1"),
        (
            "ORDERS_DATABASE_URL",
            f"postgresql+asyncpg://orders:{SECRET}@db.internal:6432/orders?ssl=verify-full",
            "database_url",
            f"postgresql+asyncpg://orders:{SECRET}@db.internal:6432/orders?ssl=verify-full",
        ),
        ("ORDERS_DATABASE_URL", "postgresql+asyncpg://u@[::1]/o", "database_url", "postgresql+asyncpg://u@[::1]/o"),
        (  # no host: libpq's default, here a Unix socket's directory
            "ORDERS_DATABASE_URL",
            "postgresql+asyncpg:///orders?host=/run/postgresql",
            "database_url",
            "postgresql+asyncpg:///orders?host=/run/postgresql",
        ),
    ],
)
def test_an_address_that_can_be_connected_to_is_read(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, field: str, expected: str
) -> None:
    monkeypatch.setenv(variable, value)

    read = getattr(load_settings(OrderSettings), field)
    assert (read.get_secret_value() if isinstance(read, SecretStr) else read) == expected


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("ORDERS_PAYMENTS_URL", "http://127.0.0.1:474010", "the port must be a number from 1 to 65535"),
        ("ORDERS_PAYMENTS_URL", "http://127.0.0.1:99999/", "the port must be a number from 1 to 65535"),
        ("ORDERS_PAYMENTS_URL", "http://127.0.0.1:0", "the port must be a number from 1 to 65535"),
        ("ORDERS_PAYMENTS_URL", "http://payments:80a", "the port must be a number from 1 to 65535"),
        ("ORDERS_PAYMENTS_URL", "http://payments:/", "the port must be a number from 1 to 65535"),
        ("ORDERS_PAYMENTS_URL", "http://payments:+80", "the port must be a number from 1 to 65535"),
        ("ORDERS_PAYMENTS_URL", f"http://user:{SECRET}@payments/", "must not hold credentials"),
        ("ORDERS_CUSTOMERS_URL", f"https://{SECRET}@customers.internal", "must not hold credentials"),
        ("ORDERS_PAYMENTS_URL", "http://payments/?tenant=acme", "must not have a query or a fragment"),
        ("ORDERS_PAYMENTS_URL", "http://payments/api#v1", "must not have a query or a fragment"),
        ("ORDERS_PAYMENTS_URL", "http://payments?", "must not have a query or a fragment"),
        ("ORDERS_EMAILS_URL", "http:///emails", "the host must be a host name or an IP address"),
        ("ORDERS_EMAILS_URL", "http://:8080", "the host must be a host name or an IP address"),
        ("ORDERS_EMAILS_URL", "http://a..b/", "the host must be a host name or an IP address"),
        ("ORDERS_EMAILS_URL", "http://10.0.0.256/", "the host must be a host name or an IP address"),
        ("ORDERS_EMAILS_URL", "http://::1:8080/", "an IPv6 address must be written in brackets"),
        ("ORDERS_EMAILS_URL", "http://[::1/", "brackets must hold an IPv6 address"),
        ("ORDERS_EMAILS_URL", "http://[127.0.0.1]:80", "brackets must hold an IPv6 address"),
        ("ORDERS_EMAILS_URL", "http://[::1]x/", "brackets must hold an IPv6 address"),
        ("ORDERS_EMAILS_URL", "http://emails internal/", "must be visible ASCII"),
        ("ORDERS_EMAILS_URL", "http://bücher.example/", "must be visible ASCII"),
        ("ORDERS_EMAILS_URL", "http:/emails", "must start with http:// or https://"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "", "needs at least one server"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", " , ", "needs at least one server"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1", "every server needs its port"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "k0:9092,k1", "every server needs its port"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "[::1]", "every server needs its port"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "k0:99999", "the port must be a number from 1 to 65535"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "k0:0", "the port must be a number from 1 to 65535"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "k0:", "the port must be a number from 1 to 65535"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "k0 9092", "the host must be a host name or an IP address"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "::1:9092", "an IPv6 address must be written in brackets"),
        ("ORDERS_KAFKA_BOOTSTRAP_SERVERS", "PLAINTEXT://k0:9092", "without a scheme"),
        ("ORDERS_DATABASE_URL", f"postgresql+asyncpg://orders:{SECRET}@db:5743a/orders", "SQLAlchemy can read"),
        ("ORDERS_DATABASE_URL", f"postgresql+asyncpg://orders:{SECRET}@db:99999/orders", "from 1 to 65535"),
        ("ORDERS_DATABASE_URL", f"postgresql+asyncpg://orders:{SECRET}@db:0/orders", "from 1 to 65535"),
        ("ORDERS_DATABASE_URL", f"postgresql+asyncpg://orders:{SECRET}@a:1,b:2/orders", "SQLAlchemy can read"),
        ("ORDERS_DATABASE_URL", f"postgresql+asyncpg://orders:{SECRET}@@db/orders", "the host must be"),
        ("ORDERS_DATABASE_URL", f"postgresql://orders:{SECRET}@db/orders", "postgresql+asyncpg://"),
        ("ORDERS_CONSOLE_TRACE_URL", "http://jaeger/trace/{traceid}", "must hold {trace_id} exactly once"),
        ("ORDERS_CONSOLE_TRACE_URL", "http://j/{trace_id}{trace_id}", "must hold {trace_id} exactly once"),
        ("ORDERS_CONSOLE_TRACE_URL", "http://j/{trace_id}/{span}", "must hold no placeholder or brace but"),
        ("ORDERS_CONSOLE_TRACE_URL", 'http://j/?q={"t":"{trace_id}"}', "must hold no placeholder or brace"),
        ("ORDERS_CONSOLE_TRACE_URL", "ftp://jaeger/{trace_id}", "must start with http:// or https://"),
        ("ORDERS_CONSOLE_TRACE_URL", "/trace/{trace_id}", "must start with http:// or https://"),
        ("ORDERS_CONSOLE_TRACE_URL", f"http://u:{SECRET}@jaeger/{{trace_id}}", "must not hold credentials"),
        ("ORDERS_CONSOLE_TRACE_URL", "http://jaeger:0/{trace_id}", "the port must be a number from 1 to 65535"),
        ("ORDERS_CONSOLE_TRACE_URL", "http:///trace/{trace_id}", "the host must be a host name or an IP address"),
        ("ORDERS_CONSOLE_TRACE_URL", "http://jaeger/trace id/{trace_id}", "must be visible ASCII"),
    ],
)
def test_an_address_that_cannot_be_connected_to_stops_start_up_with_one_line(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, problem: str
) -> None:
    message = configuration_error(monkeypatch, variable, value)

    # Then one line names the variable, what is wrong and what is allowed, and shows no password
    assert message.startswith(f"invalid configuration: {variable}: ")
    assert problem in message
    assert "allowed: " in message
    assert "\n" not in message
    assert SECRET not in message


def loaded_or_refused(**overrides: str) -> tuple[OrderSettings | None, str]:
    """The settings these overrides give, or None and the ConfigurationError's message."""
    try:
        return load_settings(OrderSettings, **overrides), ""
    except ConfigurationError as refused:
        return None, str(refused)


# The characters URLs are made of, so that the pieces drawn reach every check (the first branch of `urls` draws any
# text at all).
_URLISH = st.text(st.sampled_from("aZ09.-_:/@?#[]%+"), max_size=12)


@st.composite
def urls(draw: st.DrawFn) -> tuple[str, str | None]:
    """Any text, or a URL of any scheme, host, port and rest, with a password (returned too, `Pw…`) or not."""
    if draw(st.integers(0, 3)) == 0:
        return draw(st.text(max_size=60)), None
    password = draw(st.none() | _URLISH.map("Pw{}".format))
    userinfo = "" if password is None else f"{draw(_URLISH)}:{password}@"
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "ftp", "postgresql+asyncpg", "postgresql+asyncpg", ""]))
    host = draw(st.sampled_from(["payments", "10.0.0.1", "[::1]", "", "a..b", "10.0.0.256"]) | _URLISH)
    port = draw(st.sampled_from(["", ":", ":0", ":80", ":65535", ":65536", ":474010", ":5743a"]) | _URLISH)
    rest = draw(st.sampled_from(["", "/", "/orders", "/v1?x=1", "#f"]) | _URLISH)
    return f"{scheme}://{userinfo}{host}{port}{rest}", password


@settings(max_examples=500, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["customers_url", "payments_url", "emails_url", "database_url"]), url=urls())
def test_any_text_given_as_a_url_is_read_or_refused_in_one_line_without_its_password(
    field: str, url: tuple[str, str | None]
) -> None:
    value, password = url

    # Given any text as a URL setting, When the settings load
    loaded, message = loaded_or_refused(**{field: value})

    # Then either it is refused in one line naming the variable, never showing the URL's password
    if loaded is None:
        assert message.startswith(f"invalid configuration: ORDERS_{field.upper()}: ")
        assert "\n" not in message
        assert password is None or password not in message
    # Or it is a URL the service can connect to
    elif field == "database_url":
        parsed = make_url(loaded.database_url.get_secret_value())
        assert parsed.drivername == "postgresql+asyncpg"
        assert parsed.port is None or 1 <= parsed.port <= 65535
    elif (read := getattr(loaded, field)) is not None:
        parts = urlsplit(read)
        assert parts.scheme in ("http", "https")
        assert parts.hostname
        assert parts.port is None or 1 <= parts.port <= 65535
        assert (parts.username, parts.password, parts.query, parts.fragment) == (None, None, "", "")


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.text(max_size=40)
    | st.lists(st.sampled_from(["k0", "[::1]", "10.0.0.1", ":", "9092", "0", ",", " "])).map("".join)
)
def test_any_text_given_as_bootstrap_servers_is_read_or_refused_in_one_line(value: str) -> None:
    # Given any text as the bootstrap servers, When the settings load
    loaded, message = loaded_or_refused(kafka_bootstrap_servers=value)

    # Then either it is refused in one line naming the variable
    if loaded is None:
        assert message.startswith("invalid configuration: ORDERS_KAFKA_BOOTSTRAP_SERVERS: ")
        assert "\n" not in message
        return
    # Or it is a list of host:port, each port one a client can connect to
    for server in loaded.kafka_bootstrap_servers.split(","):
        host, _, port = server.rpartition(":")
        assert host.strip() == host != ""
        assert port.isascii()
        assert 1 <= int(port) <= 65535


# The placeholder and its near misses; what a URL's path, query and fragment are made of.
_PLACEHOLDERS = st.sampled_from(["{trace_id}", "{trace_id}", "{trace_id", "{span_id}", "", "{trace_id}{trace_id}"])
_URL_PIECES = st.sampled_from(["/trace/", "?q=", "#", "%7B", "{", "}", " ", "-"])


@st.composite
def trace_urls(draw: st.DrawFn) -> str:
    """Any text, or a URL template of any scheme, credentials or none, host, port, placeholder and rest."""
    if draw(st.integers(0, 3)) == 0:
        return draw(st.text(max_size=60))
    scheme = draw(st.sampled_from(["http://", "https://", "HTTP://", "javascript:", "ftp://", ""]))
    userinfo = draw(st.sampled_from(["", "", "user:pw@"]))
    host = draw(st.sampled_from(["jaeger", "10.0.0.1", "[::1]", "", "a..b", "{trace_id}.jaeger"]))
    port = draw(st.sampled_from(["", ":16686", ":0", ":65536"]))
    before, after = (draw(st.lists(_URL_PIECES, max_size=2)) for _ in range(2))
    return f"{scheme}{userinfo}{host}{port}/{''.join(before)}{draw(_PLACEHOLDERS)}{''.join(after)}"


@settings(max_examples=500)
@given(trace_urls())
def test_any_text_given_as_the_trace_url_is_read_or_refused_in_one_line(value: str) -> None:
    # Given any text as the console's trace URL, When the settings load
    loaded, message = loaded_or_refused(console_trace_url=value)

    # Then either it is refused in one line naming the variable
    if loaded is None:
        assert message.startswith("invalid configuration: ORDERS_CONSOLE_TRACE_URL: ")
        assert "\n" not in message
        return
    # Or it is empty (no link), or an http(s) URL with a host that holds the placeholder once and no other brace
    template = loaded.console_trace_url
    if not template:
        assert value.strip() == ""
        return
    assert template.count("{trace_id}") == 1
    link = template.replace("{trace_id}", "4bf92f3577b34da6a3ce929d0e0e4736")
    parts = urlsplit(link)
    assert parts.scheme.lower() in ("http", "https")
    assert parts.hostname
    assert (parts.username, parts.password) == (None, None)
    assert not {"{", "}", " "} & set(link)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("collector:4318", "must start with http:// or https://"),
        ("http://collector:99999", "the port must be a number from 1 to 65535"),
        ("http://user:secret@collector:4318", "must not hold credentials"),
        ("http://", "the host must be a host name or an IP address"),
    ],
)
@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"])
def test_an_otlp_endpoint_that_cannot_be_posted_to_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, says: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as refused:
        load_settings(OrderSettings)
    assert str(refused.value).startswith(f"invalid configuration: {variable} {says}")
    assert "secret" not in str(refused.value)
    assert "\n" not in str(refused.value)
    # And none is checked while the SDK is disabled (nothing would post to it), nor a well formed one
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    load_settings(OrderSettings)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "false")
    monkeypatch.setenv(variable, "http://collector.internal:4318/")
    load_settings(OrderSettings)
