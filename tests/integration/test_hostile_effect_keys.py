"""An idempotency key the HTTP client cannot send (a line break in an order id) fails its own call, not the batch."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from service.containers import Container
from service.orders.fakes import Downstream
from tests.support import Topics, eventually, produce, running, scalar
from tests.support.effects import effect, effect_settings, state_is
from tests.support.orders import placed


async def test_a_capture_whose_key_holds_a_line_break_does_not_take_the_batchs_outcomes_with_it(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given two placed orders, one of them with a line break inside its id (valid for the message schema):
    # its capture's Idempotency-Key header cannot be written (aiohttp raises ValueError, httpx raised a
    # TransportError, LocalProtocolError, which the client turned into an outcome)
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(kafka, topics.source, [("R-1", placed("R-1"), {}), ("R-2", placed("R\n2"), {})], partition=0)
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 2 FROM effects WHERE state = 'pending'"))

    # When one worker batch claims and calls both captures
    container = Container(settings=settings)
    await container.init_resources()
    try:
        worker = await container.effect_worker()
        raised: BaseException | None = None
        try:
            await worker.work_once(["payment.capture"])
        except Exception as error:  # what escapes the batch is the point of the test
            raised = error
    finally:
        await container.shutdown_resources()

    # Then the batch ends with an outcome for each: the good capture, which the provider made, is recorded
    # sent (not left in_flight to expire into uncertain), and no exception escapes the worker's lane
    assert downstream.calls("payments.post", "R-1/payment.capture") == 1
    assert (await effect(engine, "R-1/payment.capture"))["state"] == "sent", "the made call's outcome was lost"
    assert raised is None, f"{type(raised).__name__}: {raised}"
    assert not await state_is(engine, "R\n2/payment.capture", "in_flight")
