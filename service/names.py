"""The core's default names: its console script and its environment variables' prefix, for a settings class that
names none (a domain's settings class names its own: service/ports.py, `Domain`).

The lowest layer: the settings, the store, the adapters and every entrypoint name the program with these, and they
import nothing of the service.
"""

from __future__ import annotations

PROGRAM = "service"  # the default console script and consumer name (a domain names its own)
ENV_PREFIX = "SERVICE_"  # every core setting is this prefix and its name in capitals (a domain names its own)
