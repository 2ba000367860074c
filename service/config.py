"""All configuration, from `ORDERS_*` environment variables (contract §2), in one pydantic-settings class."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, overload

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from service import addresses
from service.credentials import check_kafka_security
from service.durations import FORMAT_HINT, format_duration, parse_duration
from service.names import ENV_PREFIX, PROGRAM
from service.policy.operators import parse_tokens
from service.policy.owners import parse_owners
from service.policy.retry import Budget, RetryPolicy, build_policy
from service.readers import ReadBy, Reader, is_secret, read_by, readers_of
from service.store import connect


def _to_timedelta(value: Any) -> Any:
    return parse_duration(value) if isinstance(value, str) else value


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be longer than 0")
    return value


Duration = Annotated[timedelta, BeforeValidator(_to_timedelta), AfterValidator(_positive)]

RETENTION_MIN = timedelta(hours=1)
RETENTION_MAX = timedelta(days=36_500)  # a century: PostgreSQL's timestamps take `now() - period` far beyond


def _retention_range(value: timedelta) -> timedelta:
    if not RETENTION_MIN <= value <= RETENTION_MAX:
        raise ValueError(f"must be {format_duration(RETENTION_MIN)} … {format_duration(RETENTION_MAX)}")
    return value


Retention = Annotated[Duration, AfterValidator(_retention_range)]

DEDUP_WINDOW_MIN = timedelta(seconds=20)
DEDUP_WINDOW_MAX = timedelta(days=7)
# Beyond the retry horizon, a record may still come again: a consumer restart redelivers uncommitted offsets,
# and a tier copy waits for the relay and the consumer. The window covers that with this margin (or 10%).
DEDUP_MARGIN = timedelta(seconds=10)


# Who reads each setting (service/readers.py): each command's --help lists the settings of the parts it runs.
_DATABASE = read_by(Reader.DATABASE)
_KAFKA = read_by(Reader.KAFKA)
_PROCESS = read_by(Reader.PROCESS)
_CONSUMER = read_by(Reader.CONSUMER)
_EFFECTS = read_by(Reader.EFFECTS)
_TOPICS = read_by(Reader.TOPICS)
_CONSOLE = read_by(Reader.CONSOLE)
_TESTS = read_by(Reader.TESTS)
# The retry budget: the consumer spends it, and the tier topics' retention outlasts it.
_BUDGET = read_by(Reader.CONSUMER, Reader.TOPICS)
_RETENTION = read_by(Reader.RECONCILER)
# The source topic names every topic: whatever reads, writes or declares one reads it.
_TOPIC_NAMES = read_by(
    Reader.CONSUMER,
    Reader.RELAY,
    Reader.EFFECTS,
    Reader.RECONCILER,
    Reader.REPROCESS,
    Reader.TOPICS,
    Reader.ACLS,
    Reader.CONSOLE,
)
# The consumer's name: its Kafka group and the inbox's key.
_CONSUMER_NAME = read_by(Reader.CONSUMER, Reader.REPROCESS, Reader.PARKED, Reader.ACLS, Reader.CONSOLE)


class Settings(BaseSettings):
    """Every knob of the core; each field is read from `<env_prefix><FIELD>`. A domain adds its own (its downstream
    URLs, its rules' parameters) in a subclass that names its service (`program`) and its variables' prefix
    (`model_config`'s `env_prefix`)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")
    program: ClassVar[str] = PROGRAM  # the console script that reads these settings

    @classmethod
    def variable(cls, name: str) -> str:
        """The environment variable of a setting, or of a group of them (`database_url` → `<PREFIX>DATABASE_URL`)."""
        return f"{cls.model_config.get('env_prefix', '')}{name.upper()}"

    # A secret: it may hold the password (contract §11); see `database` for what connects.
    database_url: Annotated[SecretStr, _DATABASE] = SecretStr("postgresql+asyncpg://postgres@127.0.0.1:55432/service")
    database_password: Annotated[SecretStr | None, _DATABASE] = None
    kafka_bootstrap_servers: Annotated[str, _KAFKA] = "127.0.0.1:19092"
    # Kafka's security (contract §11): every client the service builds takes these (service/adapters/kafka.py).
    kafka_security_protocol: Annotated[Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"], _KAFKA] = "PLAINTEXT"
    kafka_sasl_mechanism: Annotated[Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"], _KAFKA] = "PLAIN"
    kafka_sasl_username: Annotated[str | None, _KAFKA] = None
    kafka_sasl_password: Annotated[SecretStr | None, _KAFKA] = None
    kafka_oauth_token_url: Annotated[str | None, _KAFKA] = None
    kafka_oauth_client_id: Annotated[str | None, _KAFKA] = None
    kafka_oauth_client_secret: Annotated[SecretStr | None, _KAFKA] = None
    kafka_oauth_scope: Annotated[str | None, _KAFKA] = None
    kafka_ssl_cafile: Annotated[str | None, _KAFKA] = None
    kafka_ssl_certfile: Annotated[str | None, _KAFKA] = None
    kafka_ssl_keyfile: Annotated[str | None, _KAFKA] = None
    # The topics `topics apply` creates (contract §11): partitions (None: the source topic's count, else 6) and
    # replication factor (None: the broker's default).
    topic_partitions: Annotated[int | None, _TOPICS] = Field(default=None, ge=1, le=100_000)
    topic_replication_factor: Annotated[int | None, _TOPICS] = Field(default=None, ge=1, le=100)
    consumer_name: Annotated[str, _CONSUMER_NAME] = Field(default=PROGRAM, min_length=1, max_length=200)
    source_topic: Annotated[str, _TOPIC_NAMES] = Field(default="events", pattern=r"^[A-Za-z0-9._-]{1,200}$")
    retry_tiers: Annotated[str, read_by(Reader.CONSUMER, Reader.RELAY, Reader.TOPICS)] = "30s,5m"
    max_attempts: Annotated[int | None, _BUDGET] = Field(default=None, ge=1, le=1000)
    max_elapsed: Annotated[Duration | None, _BUDGET] = None
    blocking_attempts: Annotated[int, _BUDGET] = Field(default=3, ge=1, le=100)
    blocking_elapsed: Annotated[Duration, _BUDGET] = timedelta(seconds=5)
    processing_timeout: Annotated[Duration, _CONSUMER] = timedelta(seconds=30)
    effect_lease: Annotated[Duration, read_by(Reader.EFFECTS, Reader.RECONCILER)] = timedelta(seconds=30)
    effect_max_attempts: Annotated[int, _EFFECTS] = Field(default=8, ge=1, le=1000)
    effect_concurrency: Annotated[int, _EFFECTS] = Field(default=32, ge=1, le=1000)
    quarantine_owners: Annotated[str, _CONSUMER] = ""
    ordering: Annotated[Literal["key", "versioned", "unordered"], read_by(Reader.CONSUMER, Reader.TOPICS)] = "key"
    dedup_window: Annotated[Duration, read_by(Reader.CONSUMER, Reader.RECONCILER, Reader.TOPICS)] = timedelta(days=7)
    metrics_port: Annotated[int, _PROCESS] = Field(default=9108, ge=0, le=65535)
    metrics_refresh: Annotated[Duration, _PROCESS] = timedelta(seconds=10)
    # How often a long-running process writes its heartbeat (the console's Processes page, `status`); silent for
    # three of them, it is shown as gone.
    heartbeat_interval: Annotated[Duration, _PROCESS] = timedelta(seconds=5)
    http_timeout: Annotated[Duration, read_by(Reader.CONSUMER, Reader.EFFECTS, Reader.RECONCILER)] = timedelta(
        seconds=2
    )
    # How long a downstream's circuit breaker may stay open before the alert OrdersDownstreamBreakerOpen fires.
    breaker_alert_after: Annotated[Duration, _PROCESS] = timedelta(minutes=5)
    batch_size: Annotated[int, _CONSUMER] = Field(default=3000, ge=1, le=10_000)
    relay_batch_size: Annotated[int, read_by(Reader.RELAY)] = Field(default=2000, ge=1, le=10_000)
    log_level: Annotated[Literal["debug", "info", "warning", "error"], read_by(Reader.EVERY)] = "info"
    # The operator console (contract §9): where it listens, who may use it, and for how long a login lasts.
    console_bind: Annotated[str, _CONSOLE] = "127.0.0.1:8088"
    console_tokens: Annotated[SecretStr, _CONSOLE] = SecretStr("")
    console_behind_tls: Annotated[bool, _CONSOLE] = False
    console_session_ttl: Annotated[Duration, _CONSOLE] = timedelta(hours=8)
    # Where a record page links its trace: a URL holding `{trace_id}` (addresses.trace_url); empty: no link.
    console_trace_url: Annotated[str, _CONSOLE, BeforeValidator(addresses.trace_url)] = ""
    # How long the reconciler keeps what operators no longer need (docs/runbook.md, Retention and erasure): the
    # original bytes and header values of closed quarantined records, then the closed records with their timelines,
    # the audit log, reprocess and reconcile runs, and ended console sessions. Open records are never purged.
    retention_quarantine_payload: Annotated[Retention, _RETENTION] = timedelta(days=30)
    retention_quarantine: Annotated[Retention, _RETENTION] = timedelta(days=90)
    retention_audit: Annotated[Retention, _RETENTION] = timedelta(days=400)
    retention_runs: Annotated[Retention, _RETENTION] = timedelta(days=90)
    retention_console_sessions: Annotated[Retention, _RETENTION] = timedelta(days=7)
    # Whether an edit of a quarantined record (console or `quarantine edit`) waits for a second operator's approval.
    console_edit_approval: Annotated[bool, read_by(Reader.CONSOLE, Reader.EDITS)] = False
    # Test instrumentation only (see service/faults.py): a named point where the process kills itself.
    fault_crash_at: Annotated[Literal["after-commit", "mid-write", "after-publish"] | None, _TESTS] = None
    # Test instrumentation only: a named write that fails as if the store refused its content.
    fault_fail_at: Annotated[Literal["quarantine-write"] | None, _TESTS] = None

    @field_validator("retry_tiers")
    @classmethod
    def _check_tiers(cls, value: str) -> str:
        if value.strip() == "rocketmq":
            return "rocketmq"
        parts = [part.strip() for part in value.split(",") if part.strip()]
        for part in parts:
            try:
                _positive(parse_duration(part))
            except ValueError as error:
                raise ValueError(f"{error}; allowed: comma-separated durations (30s,5m) or rocketmq") from None
        return ",".join(parts)

    @field_validator("quarantine_owners")
    @classmethod
    def _check_owners(cls, value: str) -> str:
        parse_owners(value)
        return value

    @field_validator("console_bind")
    @classmethod
    def _check_bind(cls, value: str) -> str:
        host, _, port = value.strip().rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError("must be host:port, e.g. 127.0.0.1:8088")
        return value.strip()

    @field_validator("console_tokens")
    @classmethod
    def _check_tokens(cls, value: SecretStr) -> SecretStr:
        parse_tokens(value.get_secret_value())  # the message names the entry and its name, never the token
        return value

    @property
    def console_host_port(self) -> tuple[str, int]:
        """The console's bind address as (host, port); an IPv6 host without its brackets."""
        host, _, port = self.console_bind.rpartition(":")
        return host.removeprefix("[").removesuffix("]"), int(port)

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("heartbeat_interval")
    @classmethod
    def _check_heartbeat(cls, value: timedelta) -> timedelta:
        if not timedelta(milliseconds=100) <= value <= timedelta(minutes=5):
            raise ValueError("must be between 100ms and 5m")
        return value

    @field_validator("dedup_window")
    @classmethod
    def _check_window(cls, value: timedelta) -> timedelta:
        if not DEDUP_WINDOW_MIN <= value <= DEDUP_WINDOW_MAX:
            raise ValueError("must be between 20s and 7d")
        return value

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: SecretStr) -> SecretStr:
        addresses.check_database_url(value.get_secret_value())
        try:
            connect.database(value.get_secret_value())
        except connect.DatabaseUrlError as error:
            raise ValueError(f"{error}; {addresses.DATABASE_URL_FORM}") from None
        return value

    @property
    def database(self) -> connect.Database:
        """The database every connection of the service goes to (the password of ORDERS_DATABASE_PASSWORD, TLS)."""
        password = self.database_password.get_secret_value() if self.database_password is not None else None
        return connect.database(self.database_url.get_secret_value(), password)

    @field_validator("kafka_bootstrap_servers")
    @classmethod
    def _check_bootstrap_servers(cls, value: str) -> str:
        return addresses.bootstrap_servers(value)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment, and every secret also from a file named by `<VARIABLE>_FILE` (contract §11)."""
        return init_settings, SecretFiles(settings_cls), env_settings, dotenv_settings, file_secret_settings

    @model_validator(mode="after")
    def _check_kafka_security(self) -> Settings:
        check_kafka_security(self)
        return self

    @model_validator(mode="after")
    def _check_together(self) -> Settings:
        v = self.variable
        if self.effect_lease <= 2 * self.http_timeout:
            timeout = format_duration(2 * self.http_timeout)
            raise ValueError(f"{v('effect_lease')}: must be longer than twice {v('http_timeout')} ({timeout})")
        horizon = self.retry_policy().horizon
        margin = max(DEDUP_MARGIN, horizon / 10)
        if self.dedup_window < horizon + margin:
            raise ValueError(
                f"{v('dedup_window')}: {format_duration(self.dedup_window)} is shorter than the retry horizon "
                f"{format_duration(horizon)} plus a margin of {format_duration(margin)}: it must be at least "
                f"{format_duration(horizon + margin)}; raise it, or shorten {v('max_elapsed')} / "
                f"{v('retry_tiers')}"
            )
        return self

    def retry_policy(self) -> RetryPolicy:
        """The retry plan these settings describe (tiers, budgets, documented defaults)."""
        return build_policy(
            self.retry_tiers,
            self.ordering,
            max_attempts=self.max_attempts,
            max_elapsed=self.max_elapsed,
            blocking=Budget(self.blocking_attempts, self.blocking_elapsed),
        )

    @property
    def topics(self) -> Topics:
        """The topic names derived from the source topic (contract §4)."""
        return Topics(self.source_topic)


class Topics:
    """Topic names derived from the source topic (contract §4)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.quarantine = f"{source}.quarantine"
        self.reprocess = f"{source}.reprocess"
        self.rejected = f"{source}.rejected"
        self.events = f"{source}.events"
        self.retry_prefix = f"{source}.retry."  # every retry tier's topic name starts so

    def retry(self, delay_label: str) -> str:
        """The retry tier topic for one delay, e.g. `<source>.retry.30s`."""
        return f"{self.retry_prefix}{delay_label}"


class ConfigurationError(Exception):
    """Configuration that cannot be used; its message is one line naming the variable."""


def secret_fields(settings_cls: type[BaseSettings]) -> list[str]:
    """The settings that are secrets (typed `SecretStr`): the one place that says which ones (contract §11)."""
    return [name for name, field in settings_cls.model_fields.items() if is_secret(field)]


class SecretFiles(PydanticBaseSettingsSource):
    """Each secret from the file `<VARIABLE>_FILE` names (one trailing newline ignored), as Kubernetes and Docker
    mount secrets; both the variable and its file set is a configuration error."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """(Fields are read together, in `__call__`.)"""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for name in secret_fields(self.settings_cls):
            variable = f"{self.config.get('env_prefix', '')}{name.upper()}"
            path = os.environ.get(f"{variable}_FILE")
            if path is None:
                continue
            if variable in os.environ:
                raise ConfigurationError(
                    f"invalid configuration: {variable} and {variable}_FILE are both set: give the secret one way"
                )
            try:
                value = Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise ConfigurationError(
                    f"invalid configuration: {variable}_FILE: cannot read {path} ({type(error).__name__})"
                ) from None
            found[name] = value.removesuffix("\n").removesuffix("\r")
        return found


def describe_validation_error(error: ValidationError, prefix: str = ENV_PREFIX) -> str:
    """Turn pydantic's report into one line per contract §2: the variable (`prefix` and the field's name), the
    value's problem, what is allowed."""
    parts = []
    for item in error.errors():
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] in {"timedelta_parsing", "timedelta_type"}:
            message = f"must be {FORMAT_HINT}"
        # A check across fields names its variable itself; a field check is named by its field.
        parts.append(f"{prefix}{str(item['loc'][0]).upper()}: {message}" if item["loc"] else message)
    return "invalid configuration: " + "; ".join(parts)


# What an address setting may hold. The messages never repeat the value: a URL may hold a password.
BaseUrl = Annotated[str | None, BeforeValidator(addresses.base_url)]


S = TypeVar("S", bound=Settings)


@overload
def load_settings(settings_class: None = None, **overrides: Any) -> Settings:
    """The core's settings."""


@overload
def load_settings(settings_class: type[S], **overrides: Any) -> S:
    """A domain's settings (a subclass of the core's)."""


def load_settings(settings_class: type[Settings] | None = None, **overrides: Any) -> Settings:
    """Read the settings (the core's, or a domain's subclass of them) from the environment, raising
    ConfigurationError with a one-line message."""
    chosen = settings_class or Settings
    try:
        settings = chosen(**overrides)
    except ValidationError as error:
        raise ConfigurationError(describe_validation_error(error, chosen.variable(""))) from None
    disabled = os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    for name in () if disabled else addresses.OTLP_ENDPOINTS:  # the SDK's own: checked as every URL setting is
        if value := os.environ.get(name, "").strip():
            try:
                addresses.check_otlp_endpoint(value)
            except ValueError as error:
                raise ConfigurationError(f"invalid configuration: {name} {error}") from None
    return settings


def read_as_the_core_does(setting: str) -> ReadBy:
    """The readers of one of the core's settings, for a domain's settings class that overrides its default (its own
    database, consumer name or source topic): `Annotated[str, read_as_the_core_does("source_topic")]`."""
    return ReadBy(readers_of(Settings.model_fields[setting]))
