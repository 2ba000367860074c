"""Which environment variables each command reads, shown at the end of its `--help`: generated from the settings
class, whose every field names the parts of the program that read it (service/readers.py); this module only says
which parts each command runs. A secret is marked, never shown: no value appears in the help at all."""

from __future__ import annotations

from typing import Any

from service.config import Settings
from service.readers import Reader, is_secret, read, variable

_PROCESS = (Reader.DATABASE, Reader.PROCESS)
_CONSUME = (*_PROCESS, Reader.KAFKA, Reader.CONSUMER)
_RELAY = (*_PROCESS, Reader.KAFKA, Reader.RELAY)
_EFFECTS = (*_PROCESS, Reader.EFFECTS, Reader.EFFECT_PROVIDERS)

# Command path (as typed after the program's name) → the parts of the program it runs; a group's commands run
# what the group's entry says unless they have their own. Every command reads Reader.EVERY's settings too.
RUNS: dict[str, tuple[Reader, ...]] = {
    "migrate": (Reader.DATABASE,),
    "status": (Reader.DATABASE,),
    "consume": _CONSUME,
    "relay": _RELAY,
    "effects": _EFFECTS,
    "run": (*_CONSUME, *_RELAY, *_EFFECTS),
    "reconcile": (Reader.DATABASE, Reader.RECONCILER, Reader.EFFECT_PROVIDERS),
    "quarantine": (Reader.DATABASE,),
    "quarantine edit": (Reader.DATABASE, Reader.EDITS),
    "quarantine approve-edit": (Reader.DATABASE, Reader.EDITS),
    "quarantine reject-edit": (Reader.DATABASE, Reader.EDITS),
    "reprocess": (Reader.DATABASE, Reader.KAFKA, Reader.REPROCESS),
    "parked": (Reader.DATABASE, Reader.PARKED),
    "effects list": (Reader.DATABASE, Reader.EFFECT_PROVIDERS),
    "effects show": (Reader.DATABASE,),
    "effects retry": (Reader.DATABASE,),
    "outbox": (Reader.DATABASE,),
    "topics": (Reader.KAFKA, Reader.TOPICS),  # never the database
    "topics acls": (Reader.KAFKA, Reader.ACLS),
    "console": (Reader.DATABASE, Reader.KAFKA, Reader.CONSOLE),
}
SECRET_MARK = "*"


def runs(path: str) -> frozenset[Reader]:
    """The parts of the program the command at `path` runs: its own entry, else its group's, and Reader.EVERY."""
    words = path.split()
    while words and " ".join(words) not in RUNS:
        words.pop()
    return frozenset({Reader.EVERY, *RUNS.get(" ".join(words), ())})


def reads(path: str, settings_cls: type[Settings] = Settings) -> tuple[str, ...]:
    """The variables the command at `path` reads, in the order the settings class (the core's, or a domain's
    subclass of it) declares them."""
    return tuple(variable(settings_cls, name) for name in read(settings_cls, runs(path)))


def epilog(path: str, settings_cls: type[Settings] = Settings) -> str:
    """The last paragraph of a command's help: the variables it reads, a secret's marked (never a value)."""
    if not path:
        return (
            f"Configuration comes from {settings_cls.variable('')}* environment variables (README, Configuration); "
            "each command's --help lists the ones it reads."
        )
    names = read(settings_cls, runs(path))
    secret = {name for name in names if is_secret(settings_cls.model_fields[name])}
    shown = [variable(settings_cls, name) + (SECRET_MARK if name in secret else "") for name in names]
    note = f"; {SECRET_MARK} a secret, also read from the file <VARIABLE>_FILE names" if secret else ""
    return f"Reads {', '.join(shown)} (README, Configuration{note})."


def describe(command: Any, settings_cls: type[Settings], path: str = "") -> None:
    """Add 'Reads …' to the help of every command under `command` (a click command tree)."""
    command.epilog = epilog(path, settings_cls)
    for name, sub in getattr(command, "commands", {}).items():
        describe(sub, settings_cls, f"{path} {name}".strip())
