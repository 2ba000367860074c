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
_RELAY = ("relay_batch_size",)
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


def reads(path: str, domain: Mapping[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """The variables the command at `path` reads: its own entry, else its group's, always with _EVERY, and the
    domain's for the same command (`domain`: a command path → the domain's settings it reads)."""
    words = path.split()
    while words and " ".join(words) not in READS:
        words.pop()
    command = " ".join(words)
    own = READS.get(command, ()) + (domain or {}).get(command, ())
    return tuple(f"{ENV_PREFIX}{name.upper()}" for name in dict.fromkeys(_EVERY + own))


def describe(command: Any, domain: Mapping[str, tuple[str, ...]], path: str = "") -> None:
    """Add 'Reads: …' to the help of every command under `command` (a click command tree)."""
    if not path:
        command.epilog = (
            f"Configuration comes from {ENV_PREFIX}* environment variables (README, Configuration); "
            "each command's --help lists the ones it reads."
        )
    else:
        command.epilog = "Reads " + ", ".join(reads(path, domain)) + " (README, Configuration)."
    for name, sub in getattr(command, "commands", {}).items():
        describe(sub, domain, f"{path} {name}".strip())
