"""The docs name only error codes, files and modules that exist, link only to files that exist, and every record
error code is documented."""

from __future__ import annotations

import re
from pathlib import Path

from service.codes import ErrorCode, registered
from service.orders.codes import OrderCode

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "runbook.md", ROOT / "docs" / "console.md"]
_SETTINGS = ("ORDERS_", "KAFKA_", "PG_", "CONSOLE_", "DEMO_", "OTEL_")  # environment variables, not codes
_CODE = re.compile(r"`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)`")


def test_every_error_code_the_docs_name_exists() -> None:
    # Besides the error codes: the set-aside codes, and Kafka's security protocols (contract §11, a setting's values).
    known = set(registered(OrderCode)) | {"MESSAGE_TOO_LARGE", "MESSAGE_INVALID", "SASL_PLAINTEXT", "SASL_SSL"}
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
        for code in (*ErrorCode, *OrderCode)
        if f"`{code.value}`" not in readme and not (exhausted_rule and code.value.endswith("_EXHAUSTED"))
    ]
    assert not missing, f"README does not document {missing}"


_GUIDES = [
    *DOCS,
    ROOT / "docs" / "template-guide.md",
    ROOT / "docs" / "performance.md",
    ROOT / "docs" / "security.md",
    ROOT / "docs" / "tracing.md",
]
_PATH = re.compile(r"`((?:service|tests|scripts|docs|deploy|migrations|examples)/[A-Za-z0-9_./-]+?)(?::\d+)?`")
_MODULE = re.compile(r"`((?:service|examples)(?:\.[a-z_]+)+)`")


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def test_every_file_and_module_the_docs_name_exists() -> None:
    missing = []
    for path in _GUIDES:
        text = path.read_text()
        missing += [f"{path.name}: {name}" for name in _PATH.findall(text) if not (ROOT / name.rstrip("/")).exists()]
        for name in _MODULE.findall(text):
            parts = name.split(".")
            # `service.store.outbox` or an attribute of a module: `service.orders.messages.invalid_field`
            if not any(_importable(".".join(parts[:n])) for n in (len(parts), len(parts) - 1)):
                missing.append(f"{path.name}: {name}")
    assert not missing, "the docs name what does not exist:\n" + "\n".join(missing)


_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")  # a markdown link or image: [text](target) or ![alt](target)


def test_every_link_and_image_in_the_docs_points_at_a_file_that_exists() -> None:
    missing = [
        f"{path.name}: {target}"
        for path in _GUIDES
        for target in _LINK.findall(path.read_text())
        if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not (path.parent / target).exists()
    ]
    assert not missing, "the docs link to what does not exist:\n" + "\n".join(missing)


_TEST = re.compile(r"`(test_[a-z0-9_]+)`")


def test_every_test_the_docs_name_exists() -> None:
    defined = set(re.findall(r"def (test_[a-z0-9_]+)\(", "\n".join(p.read_text() for p in ROOT.glob("tests/**/*.py"))))
    missing = [f"{path.name}: {name}" for path in _GUIDES for name in _TEST.findall(path.read_text())]
    missing = [entry for entry in missing if entry.split(": ")[1] not in defined]
    assert not missing, "the docs name tests that do not exist:\n" + "\n".join(missing)
