"""The order domain's settings, on top of the core's (service/config.py): its downstreams and its tenants."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from service.ports import BaseUrl, Settings, check_credentials

PROGRAM = "order-service"  # the console script, the distribution, the default consumer name
ENV_PREFIX = "ORDERS_"  # every setting is this prefix and its name in capitals: ORDERS_DATABASE_URL
DOWNSTREAMS = ("customers", "payments", "emails")


class OrderSettings(Settings):
    """The core's settings and the order domain's, each read from `ORDERS_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)
    program: ClassVar[str] = PROGRAM

    consumer_name: str = Field(default=PROGRAM, min_length=1, max_length=200)

    customers_url: BaseUrl = None
    payments_url: BaseUrl = None
    emails_url: BaseUrl = None
    # Each downstream's credentials (contract §6): a bearer token (a secret), its CA, a client certificate and key.
    customers_token: SecretStr | None = None
    customers_ca_file: str | None = None
    customers_cert_file: str | None = None
    customers_key_file: str | None = None
    payments_token: SecretStr | None = None
    payments_ca_file: str | None = None
    payments_cert_file: str | None = None
    payments_key_file: str | None = None
    emails_token: SecretStr | None = None
    emails_ca_file: str | None = None
    emails_cert_file: str | None = None
    emails_key_file: str | None = None
    known_tenants: Annotated[tuple[str, ...], NoDecode] = ("acme", "globex", "initech")

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


# The domain's variables each command reads besides the core's (service/cli/environment.py `READS`).
READS: dict[str, tuple[str, ...]] = {
    "consume": ("customers_url", "known_tenants"),
    "run": ("customers_url", "known_tenants", "payments_url", "emails_url"),
    "effects": ("payments_url", "emails_url"),
    "reconcile": ("payments_url", "emails_url"),
    "effects list": ("payments_url", "emails_url"),
}
