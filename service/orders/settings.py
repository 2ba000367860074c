"""The order domain's settings, on top of the core's (service/config.py): its downstreams and its tenants."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from service.ports import BaseUrl, Reader, Settings, check_credentials, read_as_the_core_does, read_by

# Who reads each setting (the core's readers): each command's --help lists the settings of the parts it runs.
_CONSUMER = read_by(Reader.CONSUMER)
_EFFECT_PROVIDER = read_by(Reader.EFFECT_PROVIDERS)  # a provider's URL: its effect kind runs only with one
_EFFECT_CALLS = read_by(Reader.EFFECTS, Reader.RECONCILER)

PROGRAM = "order-service"  # the console script, the distribution, the default consumer name
ENV_PREFIX = "ORDERS_"  # every setting is this prefix and its name in capitals: ORDERS_DATABASE_URL
DOWNSTREAMS = ("customers", "payments", "emails")


class OrderSettings(Settings):
    """The core's settings and the order domain's, each read from `ORDERS_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)
    program: ClassVar[str] = PROGRAM

    database_url: Annotated[SecretStr, read_as_the_core_does("database_url")] = SecretStr(
        "postgresql+asyncpg://postgres@127.0.0.1:55432/orders"
    )
    consumer_name: Annotated[str, read_as_the_core_does("consumer_name")] = Field(
        default=PROGRAM, min_length=1, max_length=200
    )
    source_topic: Annotated[str, read_as_the_core_does("source_topic")] = Field(
        default="orders", pattern=r"^[A-Za-z0-9._-]{1,200}$"
    )

    # The customers' look-ups are the consumer's; payments and emails are effects, called by the effect worker and
    # looked up by the reconciler.
    customers_url: Annotated[BaseUrl, _CONSUMER] = None
    payments_url: Annotated[BaseUrl, _EFFECT_PROVIDER] = None
    emails_url: Annotated[BaseUrl, _EFFECT_PROVIDER] = None
    # Each downstream's credentials (contract §6): a bearer token (a secret), its CA, a client certificate and key.
    customers_token: Annotated[SecretStr | None, _CONSUMER] = None
    customers_ca_file: Annotated[str | None, _CONSUMER] = None
    customers_cert_file: Annotated[str | None, _CONSUMER] = None
    customers_key_file: Annotated[str | None, _CONSUMER] = None
    payments_token: Annotated[SecretStr | None, _EFFECT_CALLS] = None
    payments_ca_file: Annotated[str | None, _EFFECT_CALLS] = None
    payments_cert_file: Annotated[str | None, _EFFECT_CALLS] = None
    payments_key_file: Annotated[str | None, _EFFECT_CALLS] = None
    emails_token: Annotated[SecretStr | None, _EFFECT_CALLS] = None
    emails_ca_file: Annotated[str | None, _EFFECT_CALLS] = None
    emails_cert_file: Annotated[str | None, _EFFECT_CALLS] = None
    emails_key_file: Annotated[str | None, _EFFECT_CALLS] = None
    known_tenants: Annotated[tuple[str, ...], NoDecode, _CONSUMER] = ("acme", "globex", "initech")

    @model_validator(mode="after")
    def _check_credentials(self) -> OrderSettings:
        check_credentials(self, DOWNSTREAMS)
        return self

    @field_validator("known_tenants", mode="before")
    @classmethod
    def _split_tenants(cls, value: Any) -> Any:
        if isinstance(value, str):
            tenants = tuple(part.strip() for part in value.split(",") if part.strip())
            if not tenants:
                raise ValueError("needs at least one tenant id, comma-separated")
            return tenants
        return value
