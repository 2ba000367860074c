"""The order domain as the core sees it: the one value (`DOMAIN`) the `order-service` entry point builds the core
from (service/__main__.py)."""

from __future__ import annotations

from service.orders.codes import OrderCode
from service.orders.customers import CustomersClient
from service.orders.effects import SPECS, order_effects
from service.orders.handler import OrderHandler
from service.orders.messages import OrderMessage, decode, invalid_field
from service.orders.migrations import LOCATION as MIGRATIONS
from service.orders.model import CustomerStatus, Order
from service.orders.providers import EmailsClient, PaymentsClient
from service.orders.settings import ENV_PREFIX, PROGRAM, READS, OrderSettings
from service.ports import Domain, EffectRegistry, Handler, Owners, Plumbing


def order_handler(parts: Plumbing) -> Handler[OrderMessage, Order, CustomerStatus]:
    """The handler of one process: the customer directory's client on the process's HTTP client and breakers."""
    settings: OrderSettings = parts.settings
    customers = CustomersClient(parts.http, settings.customers_url, parts.breakers, parts.credentials("customers"))
    return OrderHandler(customers, settings.known_tenants)


def effect_kinds(parts: Plumbing) -> EffectRegistry:
    """The effect kinds of one process, with the payment and email providers' clients."""
    settings: OrderSettings = parts.settings
    payments = PaymentsClient(parts.http, settings.payments_url, parts.breakers, parts.credentials("payments"))
    emails = EmailsClient(parts.http, settings.emails_url, parts.breakers, parts.credentials("emails"))
    return order_effects(payments, emails)


DOMAIN = Domain(
    program=PROGRAM,
    summary="Apply order events from Kafka to PostgreSQL; every record reaches a known terminal state.",
    env_prefix=ENV_PREFIX,
    metrics_prefix="orders",
    alerts_prefix="Orders",
    logger_root="order_service",
    settings=OrderSettings,
    decode=decode,
    failing_field=invalid_field,
    handler=order_handler,
    effects=effect_kinds,
    effect_specs=SPECS,
    codes=(OrderCode,),
    owners=Owners(producers="order-producers", oncall="order-service-oncall"),
    # The order domain's Alembic branch `orders`, beside the core's history.
    migrations=(MIGRATIONS,),
    fakes="service.orders.fakes",
    reads=READS,
)
