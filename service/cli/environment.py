"""Which environment variables each command reads, shown at the end of its `--help` (settings by name;
the variable is ENV_PREFIX and the name in capitals)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.config import ENV_PREFIX

_EVERY = ("database_url", "log_level")
_KAFKA = ("kafka_bootstrap_servers",)
_PROCESS = ("metrics_port", "metrics_refresh")
_CONSUME = (
    "consumer_name",
    "source_topic",
    "retry_tiers",
    "max_attempts",
    "max_elapsed",
    "blocking_attempts",
    "blocking_elapsed",
    "processing_timeout",
    "quarantine_owners",
    "ordering",
    "dedup_window",
    "http_timeout",
    "batch_size",
)
# The relay checks at start-up that the topics it writes exist: the retry tiers' and the other derived topics.
_RELAY = ("source_topic", "retry_tiers", "relay_batch_size")
# The declared topics and their configs: the retry horizon (tiers, budgets) and the dedup window set the retention.
_TOPICS = (
    "source_topic",
    "retry_tiers",
    "max_attempts",
    "max_elapsed",
    "blocking_attempts",
    "blocking_elapsed",
    "ordering",
    "dedup_window",
    "topic_partitions",
    "topic_replication_factor",
)
# Commands that never connect to the database (every other one reads ORDERS_DATABASE_URL).
_WITHOUT_DATABASE = ("topics",)
_EFFECTS = (
    "source_topic",
    "http_timeout",
    "effect_lease",
    "effect_max_attempts",
    "effect_concurrency",
)

# Command path (as typed after `order-service`) → the variables it reads besides _EVERY.
READS: dict[str, tuple[str, ...]] = {
    "migrate": (),
    "consume": _KAFKA + _PROCESS + _CONSUME,
    "relay": _KAFKA + _PROCESS + _RELAY,
    "effects": _PROCESS + _EFFECTS,
    "run": _KAFKA + _PROCESS + _CONSUME + _RELAY + _EFFECTS,
    "reconcile": (
        "source_topic",
        "http_timeout",
        "effect_lease",
        "dedup_window",
    ),
    "quarantine": (),
    "reprocess": (*_KAFKA, "consumer_name", "source_topic"),
    "parked": ("consumer_name",),
    "effects list": (),
    "effects show": (),
    "effects retry": (),
    "outbox": (),
    "topics plan": _KAFKA + _TOPICS,
    "topics apply": _KAFKA + _TOPICS,
    "topics acls": ("kafka_bootstrap_servers", "consumer_name", "source_topic"),
    "console": (
        "console_bind",
        "console_tokens",
        "console_behind_tls",
        "console_session_ttl",
        *_KAFKA,
        "consumer_name",
        "source_topic",
    ),
}


def reads(path: str, domain: Mapping[str, tuple[str, ...]] | None = None, prefix: str = ENV_PREFIX) -> tuple[str, ...]:
    """The variables (`prefix` and the setting's name) the command at `path` reads: its own entry, else its group's,
    always with _EVERY (but the database URL for a group of _WITHOUT_DATABASE), and the domain's for the same
    command (`domain`: a command path → the domain's settings it reads)."""
    words = path.split()
    while words and " ".join(words) not in READS:
        words.pop()
    command = " ".join(words)
    own = READS.get(command, ()) + (domain or {}).get(command, ())
    every: tuple[str, ...] = _EVERY
    if path.strip().partition(" ")[0] in _WITHOUT_DATABASE:
        every = tuple(name for name in _EVERY if name != "database_url")
    return tuple(f"{prefix}{name.upper()}" for name in dict.fromkeys(every + own))


def describe(command: Any, domain: Mapping[str, tuple[str, ...]], prefix: str = ENV_PREFIX, path: str = "") -> None:
    """Add 'Reads: …' to the help of every command under `command` (a click command tree); the variables are
    `prefix` and the setting's name."""
    if not path:
        command.epilog = (
            f"Configuration comes from {prefix}* environment variables (README, Configuration); "
            "each command's --help lists the ones it reads."
        )
    else:
        command.epilog = "Reads " + ", ".join(reads(path, domain, prefix)) + " (README, Configuration)."
    for name, sub in getattr(command, "commands", {}).items():
        describe(sub, domain, prefix, f"{path} {name}".strip())
