"""The inventory domain's settings, on top of the core's: its two downstreams, each read from `INVENTORY_<FIELD>`."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from service.ports import BaseUrl, Reader, Settings, check_credentials, read_as_the_core_does, read_by

PROGRAM = "inventory-service"  # the console script, the distribution, the default consumer name
ENV_PREFIX = "INVENTORY_"  # every setting is this prefix and its name in capitals: INVENTORY_DATABASE_URL
DOWNSTREAMS = ("stock", "warehouse")
# Who reads each setting: each command's --help lists the settings of the parts it runs.
_CONSUMER = read_by(Reader.CONSUMER)
_EFFECT_PROVIDER = read_by(Reader.EFFECT_PROVIDERS)  # the warehouse's URL: its effect kinds run only with one
_EFFECT_CALLS = read_by(Reader.EFFECTS, Reader.RECONCILER)


class InventorySettings(Settings):
    """The core's settings and the inventory domain's. Unset, `stock_url` means a reserve is not checked against
    the stock before it is applied (the warehouse's hold is then the only check), and `warehouse_url` means the
    holds and releases wait, pending."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)
    program: ClassVar[str] = PROGRAM

    database_url: Annotated[SecretStr, read_as_the_core_does("database_url")] = SecretStr(
        "postgresql+asyncpg://postgres@127.0.0.1:55432/inventory"
    )
    consumer_name: Annotated[str, read_as_the_core_does("consumer_name")] = Field(
        default=PROGRAM, min_length=1, max_length=200
    )
    source_topic: Annotated[str, read_as_the_core_does("source_topic")] = Field(
        default="inventory", pattern=r"^[A-Za-z0-9._-]{1,200}$"
    )

    stock_url: Annotated[BaseUrl, _CONSUMER] = None  # the handler's look-ups
    warehouse_url: Annotated[BaseUrl, _EFFECT_PROVIDER] = None  # the reservation effects' provider
    # Each downstream's credentials: a bearer token (a secret), its CA, a client certificate and key.
    stock_token: Annotated[SecretStr | None, _CONSUMER] = None
    stock_ca_file: Annotated[str | None, _CONSUMER] = None
    stock_cert_file: Annotated[str | None, _CONSUMER] = None
    stock_key_file: Annotated[str | None, _CONSUMER] = None
    warehouse_token: Annotated[SecretStr | None, _EFFECT_CALLS] = None
    warehouse_ca_file: Annotated[str | None, _EFFECT_CALLS] = None
    warehouse_cert_file: Annotated[str | None, _EFFECT_CALLS] = None
    warehouse_key_file: Annotated[str | None, _EFFECT_CALLS] = None

    @model_validator(mode="after")
    def _check_credentials(self) -> InventorySettings:
        check_credentials(self, DOWNSTREAMS)
        return self
