"""A starting command reads the revision files' heads without Alembic: they must be the heads Alembic finds."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.orders.migrations import LOCATION as ORDERS
from service.store import schema

INVENTORY = Path(__file__).resolve().parents[2] / "examples" / "inventory" / "inventory" / "migrations" / "versions"


def _alembic_heads(extra_locations: tuple[Path, ...] = ()) -> frozenset[str]:
    """The heads Alembic finds, the packaged revisions' and those of `extra_locations`."""
    return frozenset(schema.head_revision(extra_locations).split(", "))


def _write(versions: Path, name: str, body: str) -> None:
    (versions / name).write_text(f'"""A revision."""\n{body}\n\ndef upgrade() -> None:\n    pass\n')


def test_the_packaged_revisions_declare_the_heads_alembic_finds() -> None:
    assert schema._declared_heads(()) == _alembic_heads()
    assert schema._declared_heads((INVENTORY,)) == _alembic_heads((INVENTORY,))
    assert schema._declared_heads((ORDERS,)) == _alembic_heads((ORDERS,))


def test_the_version_table_leaves_out_a_head_that_another_head_depends_on(tmp_path: Path) -> None:
    # The order domain's branch depends on 0016 and the inventory domain's on 0010, both older than the core's head
    # (0021), so the core's head is recorded beside each
    assert schema._recorded_heads(()) == {"0021"}
    assert schema._recorded_heads((ORDERS,)) == {"0021", "orders_0001"}
    assert schema._recorded_heads((INVENTORY,)) == {"0021", "inv_0001"}
    assert schema._recorded_heads((ORDERS, INVENTORY)) == {"0021", "orders_0001", "inv_0001"}
    # A branch that depends on the core's head stands for it in the version table
    _write(
        tmp_path, "d_0001.py", "revision = 'd_0001'\ndown_revision = None\nbranch_labels = ('d',)\ndepends_on = '0021'"
    )
    assert schema._recorded_heads((tmp_path,)) == {"d_0001"}


def test_a_depends_on_naming_no_declared_revision_leaves_the_decision_to_alembic(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", "revision = 'a'\ndown_revision = None\ndepends_on = 'nowhere'")
    assert schema._declared_heads((tmp_path,)) is None
    assert schema._recorded_heads((tmp_path,)) is None


@st.composite
def _histories(draw: st.DrawFn) -> list[tuple[str, tuple[str, ...]]]:
    """Revisions r0, r1, …, each below none, one or several (a merge) of the ones before it."""
    history: list[tuple[str, tuple[str, ...]]] = []
    for number in range(draw(st.integers(min_value=1, max_value=8))):
        earlier = [revision for revision, _ in history]
        below = draw(st.lists(st.sampled_from(earlier), max_size=2, unique=True)) if earlier else []
        history.append((f"r{number}", tuple(below)))
    return history


@settings(max_examples=40, deadline=None)
@given(_histories(), st.sampled_from(["plain", "annotated"]))
def test_any_history_declares_the_heads_alembic_finds(history: list[tuple[str, tuple[str, ...]]], style: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        versions = Path(directory) / "versions"
        versions.mkdir()
        for revision, below in history:
            down = None if not below else below[0] if len(below) == 1 else below
            if style == "plain":
                body = f"revision = {revision!r}\ndown_revision = {down!r}"
            else:
                body = f"revision: str = {revision!r}\ndown_revision: str | tuple[str, ...] | None = {down!r}"
            _write(versions, f"{revision}_step.py", body)
        (versions / "__init__.py").write_text("revision = 'not a revision'\n")  # Alembic skips it too

        assert schema._declared_heads((versions,)) == _alembic_heads((versions,))


def test_a_revision_not_written_as_a_literal_leaves_the_decision_to_alembic(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", 'revision = "a"\ndown_revision = None')
    _write(tmp_path, "b.py", 'revision = "b"\ndown_revision = "a"')
    assert schema._declared_heads((tmp_path,)) == _alembic_heads() | {"b"}

    _write(tmp_path, "c.py", 'PARENT = "b"\nrevision = "c"\ndown_revision = PARENT')
    assert schema._declared_heads((tmp_path,)) is None


def test_a_file_without_a_revision_or_that_does_not_parse_leaves_the_decision_to_alembic(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", "down_revision = None")
    assert schema._declared_heads((tmp_path,)) is None
    (tmp_path / "a.py").write_text("revision = (\n")
    assert schema._declared_heads((tmp_path,)) is None
    (tmp_path / "a.py").write_bytes(b'revision = "a"\x00\ndown_revision = None\n')
    assert schema._declared_heads((tmp_path,)) is None
    (tmp_path / "a.py").write_bytes(b'revision = "\xff"\ndown_revision = None\n')  # not UTF-8
    assert schema._declared_heads((tmp_path,)) is None


def test_a_missing_version_location_holds_no_revisions(tmp_path: Path) -> None:
    assert schema._declared_heads((tmp_path / "absent",)) == _alembic_heads()


@pytest.mark.parametrize(
    "files",
    [
        {"b.py": 'revision = "b"\ndown_revision = "a"\nif True:\n    down_revision = None'},  # set again in a block
        {"b.py": 'revision = "b"\ndown_revision = "a"\ndown_revision += ""'},  # augmented
        {"b.py": 'revision = other = "b"\ndown_revision = "a"'},  # chained
        {"b.py": 'from elsewhere import down_revision\nrevision = "b"'},  # imported
        {"b.py": 'from elsewhere import *\nrevision = "b"\ndown_revision = "a"'},  # maybe imported
        {"b.py": 'revision = "b"\ndown_revision = "a"\ndef revision():\n    pass'},  # rebound by a definition
        {"a2.py": 'revision = "a"\ndown_revision = None'},  # one id in two files: Alembic keeps one of them
        {"b.py": 'revision = "b"\ndown_revision = "c"', "c.py": 'revision = "c"\ndown_revision = "b"'},  # a cycle
        {"b.py": 'revision = "b"\ndown_revision = "core"'},  # a branch label, not a revision
        {"b.py": 'revision = "b-1"\ndown_revision = "a"'},  # an id Alembic refuses
        {"b.py": 'revision = ""\ndown_revision = "a"'},
    ],
    ids=["block", "augmented", "chained", "import", "star", "definition", "twice", "cycle", "label", "dash", "empty"],
)
def test_a_history_alembic_could_read_otherwise_leaves_the_decision_to_alembic(
    tmp_path: Path, files: dict[str, str]
) -> None:
    _write(tmp_path, "a.py", 'revision = "a"\ndown_revision = None')
    for name, body in files.items():
        _write(tmp_path, name, body)
    assert schema._declared_heads((tmp_path,)) is None


def test_a_linked_revision_file_leaves_the_decision_to_alembic(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", 'revision = "a"\ndown_revision = None')
    (tmp_path / "b.txt").write_text('revision = "b"\ndown_revision = "a"\n')
    (tmp_path / "b.py").symlink_to(tmp_path / "b.txt")  # Alembic matches the target's name, and skips it
    assert schema._declared_heads((tmp_path,)) is None
