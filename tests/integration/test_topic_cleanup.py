"""Each test deletes its topics: a broker keeps every partition's state in its heap, and a suite's topics, left
there run after run, filled the local broker's (docs/performance.md, "The machine")."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from tests.support import Topics, create_topics, delete_topics, eventually


async def _listed(kafka: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def _none_left(kafka: str, of: list[Topics]) -> None:
    async def gone() -> bool:
        listed = await _listed(kafka)
        return not any(topics.owns(name) for topics in of for name in listed)

    await eventually(gone, timeout=30)


@pytest.fixture
async def none_left_after(kafka: str) -> AsyncIterator[list[Topics]]:
    """The topics a test records here are gone once its other fixtures are torn down (requested before `topics`,
    this fixture is torn down after it)."""
    recorded: list[Topics] = []
    yield recorded
    await _none_left(kafka, recorded)


async def test_the_topics_fixture_deletes_a_tests_topics_after_it_those_it_made_by_writing_included(
    none_left_after: list[Topics], topics: Topics, kafka: str
) -> None:
    # Given a test's topics, and one more it made by writing to it (the broker creates topics on first use)
    producer = AIOKafkaProducer(bootstrap_servers=kafka)
    await producer.start()
    try:
        await producer.send_and_wait(f"{topics.source}.wide", b"x")
    finally:
        await producer.stop()
    assert {*topics.all(), f"{topics.source}.wide"} <= await _listed(kafka)

    # When the test ends, Then none of them is left (checked by `none_left_after`, after `topics` is torn down)
    none_left_after.append(topics)


async def test_deleting_a_tests_topics_leaves_every_other_topic(topics: Topics, kafka: str) -> None:
    # Given another test's topics, whose source starts with this test's source
    other = Topics(f"{topics.source}x")
    await create_topics(kafka, other)
    try:
        # When this test's topics are deleted
        await delete_topics(kafka, topics)

        # Then none of them is left, and the other test's are all there
        await _none_left(kafka, [topics])
        assert set(other.all()) <= await _listed(kafka)
    finally:
        await delete_topics(kafka, other)
