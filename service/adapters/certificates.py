"""The Kafka clients' TLS context, loaded from the CA, certificate and key files, and reloaded when they change.

A certificate manager (cert-manager, Strimzi, a Kubernetes secret) rotates a client certificate by replacing its
files while the process runs. The clients keep the context they were made with; loading the new files into that same
context makes every connection opened after it (a reconnection, a new broker) present the new certificate and trust
the new CA, without a restart. `watch` looks every 30 s; a file caught half-written fails to load and is tried again
at the next look, the loaded ones kept meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import dataclass

import structlog
from aiokafka.helpers import create_ssl_context

from service.stopping import sleep_unless_stopped

log = structlog.get_logger("kafka")

WATCH_EVERY_SECONDS = 30.0

Files = tuple[str | None, str | None, str | None]  # the CA file, the certificate file, its key file
Stamp = tuple[int, int] | None  # a file's modification time (ns) and size; None: it cannot be read


@dataclass
class _Loaded:
    context: ssl.SSLContext
    stamps: tuple[Stamp, ...]


_LOADED: dict[Files, _Loaded] = {}


def context_for(cafile: str | None, certfile: str | None, keyfile: str | None) -> ssl.SSLContext:
    """A TLS context that verifies the brokers' certificates and host names (the system's CAs without `cafile`),
    with a client certificate when given; one per process and files, kept up to date with them by `reload`."""
    files = (cafile, certfile, keyfile)
    loaded = _LOADED.get(files)
    if loaded is None:
        stamps = _stamps(files)
        context: ssl.SSLContext = create_ssl_context(cafile=cafile, certfile=certfile, keyfile=keyfile)
        context.check_hostname = True
        context.verify_mode = ssl.CERT_REQUIRED
        loaded = _LOADED[files] = _Loaded(context, stamps)
    return loaded.context


def reload() -> int:
    """Load again into their contexts the files that changed since they were loaded; return how many contexts were
    reloaded. A CA file adds its certificates to those trusted (the old CA stays trusted until the restart)."""
    reloaded = 0
    for files, loaded in _LOADED.items():
        stamps = _stamps(files)
        if stamps == loaded.stamps:
            continue
        cafile, certfile, keyfile = files
        try:
            if cafile:
                loaded.context.load_verify_locations(cafile=cafile)
            if certfile:
                loaded.context.load_cert_chain(certfile, keyfile)
        except (OSError, ssl.SSLError) as error:
            log.warning("kafka_certificates_not_reloaded", error=type(error).__name__, files=_named(files))
            continue
        loaded.stamps = stamps
        reloaded += 1
        log.info("kafka_certificates_reloaded", files=_named(files))
    return reloaded


async def watch(stop: asyncio.Event, every: float = WATCH_EVERY_SECONDS) -> None:
    """Until `stop` is set, every `every` seconds: `reload`."""
    while not stop.is_set():
        await sleep_unless_stopped(stop, every)
        if _LOADED:
            reload()


def _stamps(files: Files) -> tuple[Stamp, ...]:
    return tuple(_stamp(path) for path in files)


def _stamp(path: str | None) -> Stamp:
    if not path:
        return None
    try:
        status = os.stat(path)  # (through a symbolic link: a Kubernetes secret's files are links swapped at once)
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


def _named(files: Files) -> list[str]:
    return [os.path.basename(path) for path in files if path]
