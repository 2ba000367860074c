"""Values as JSON holds them, for the CLI's `--json` and the console's API alike."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any


def jsonable(value: Any) -> Any:
    """A value JSON can hold: timestamps ISO 8601, bytes base64, tuples as lists."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value
