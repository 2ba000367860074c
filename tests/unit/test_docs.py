"""The docs name only error codes that exist, and every record error code is documented."""

from __future__ import annotations

import re
from pathlib import Path

from service.domain.codes import ErrorCode

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "runbook.md"]
_SETTINGS = ("ORDERS_", "KAFKA_", "PG_")  # environment variables, not codes
_CODE = re.compile(r"`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)`")


def test_every_error_code_the_docs_name_exists() -> None:
    known = {code.value for code in ErrorCode} | {"MESSAGE_TOO_LARGE", "MESSAGE_INVALID"}  # set-aside codes
    for path in DOCS:
        named = {name for name in _CODE.findall(path.read_text()) if not name.startswith(_SETTINGS)}
        codes = {name for name in named if not name.endswith("_EXHAUSTED") or name.removesuffix("_EXHAUSTED") in known}
        unknown = {name for name in codes if name not in known and name != "CODE_EXHAUSTED"}
        assert not unknown, f"{path.name} names codes that do not exist: {sorted(unknown)}"


def test_every_error_code_is_in_the_readme() -> None:
    readme = ROOT.joinpath("README.md").read_text()
    exhausted_rule = "`<CODE>_EXHAUSTED`" in readme
    missing = [
        code.value
        for code in ErrorCode
        if f"`{code.value}`" not in readme and not (exhausted_rule and code.value.endswith("_EXHAUSTED"))
    ]
    assert not missing, f"README does not document {missing}"
