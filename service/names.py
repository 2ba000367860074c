"""The program's names: its console script, its environment variables' prefix, its metrics' prefix.

The lowest layer: the settings, the store, the adapters and every entrypoint name the program with these, and they
import nothing of the service.
"""

from __future__ import annotations

PROGRAM = "order-service"  # the console script, the distribution, the default consumer name
ENV_PREFIX = "ORDERS_"  # every setting is this prefix and its name in capitals: ORDERS_DATABASE_URL
METRICS_PREFIX = "orders"  # every metric is named <prefix>_<what>: orders_records_total
