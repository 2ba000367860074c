"""Which environment variables each command reads, shown at the end of its `--help`."""

from __future__ import annotations

from typing import Any

_EVERY = ("ORDERS_DATABASE_URL", "ORDERS_LOG_LEVEL")
_KAFKA = ("ORDERS_KAFKA_BOOTSTRAP_SERVERS",)
_PROCESS = ("ORDERS_METRICS_PORT", "ORDERS_METRICS_REFRESH")
_CONSUME = (
    "ORDERS_CONSUMER_NAME",
    "ORDERS_SOURCE_TOPIC",
    "ORDERS_RETRY_TIERS",
    "ORDERS_MAX_ATTEMPTS",
    "ORDERS_MAX_ELAPSED",
    "ORDERS_BLOCKING_ATTEMPTS",
    "ORDERS_BLOCKING_ELAPSED",
    "ORDERS_PROCESSING_TIMEOUT",
    "ORDERS_QUARANTINE_OWNERS",
    "ORDERS_ORDERING",
    "ORDERS_DEDUP_WINDOW",
    "ORDERS_CUSTOMERS_URL",
    "ORDERS_KNOWN_TENANTS",
    "ORDERS_HTTP_TIMEOUT",
    "ORDERS_BATCH_SIZE",
)
_RELAY = ("ORDERS_RELAY_BATCH_SIZE",)
_EFFECTS = (
    "ORDERS_SOURCE_TOPIC",
    "ORDERS_PAYMENTS_URL",
    "ORDERS_EMAILS_URL",
    "ORDERS_HTTP_TIMEOUT",
    "ORDERS_EFFECT_LEASE",
    "ORDERS_EFFECT_MAX_ATTEMPTS",
)

# Command path (as typed after `order-service`) → the variables it reads besides _EVERY.
READS: dict[str, tuple[str, ...]] = {
    "migrate": (),
    "consume": _KAFKA + _PROCESS + _CONSUME,
    "relay": _KAFKA + _PROCESS + _RELAY,
    "effects": _PROCESS + _EFFECTS,
    "run": _KAFKA + _PROCESS + _CONSUME + _RELAY + _EFFECTS,
    "reconcile": (
        "ORDERS_SOURCE_TOPIC",
        "ORDERS_PAYMENTS_URL",
        "ORDERS_EMAILS_URL",
        "ORDERS_HTTP_TIMEOUT",
        "ORDERS_EFFECT_LEASE",
        "ORDERS_DEDUP_WINDOW",
    ),
    "quarantine": (),
    "reprocess": (*_KAFKA, "ORDERS_CONSUMER_NAME", "ORDERS_SOURCE_TOPIC"),
    "parked": ("ORDERS_CONSUMER_NAME",),
    "effects list": ("ORDERS_PAYMENTS_URL", "ORDERS_EMAILS_URL"),
    "effects show": (),
    "effects retry": (),
    "outbox": (),
}


def reads(path: str) -> tuple[str, ...]:
    """The variables the command at `path` reads: its own entry, else its group's, always with _EVERY."""
    words = path.split()
    while words and " ".join(words) not in READS:
        words.pop()
    own = READS.get(" ".join(words), ())
    return tuple(dict.fromkeys(_EVERY + own))


def describe(command: Any, path: str = "") -> None:
    """Add 'Reads: …' to the help of every command under `command` (a click command tree)."""
    if not path:
        command.epilog = (
            "Configuration comes from ORDERS_* environment variables (README, Configuration); "
            "each command's --help lists the ones it reads."
        )
    else:
        command.epilog = "Reads " + ", ".join(reads(path)) + " (README, Configuration)."
    for name, sub in getattr(command, "commands", {}).items():
        describe(sub, f"{path} {name}".strip())
