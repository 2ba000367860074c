"""An order id the HTTP client cannot send (a line break) is refused at the door; and one in the store anyway fails
its own call, not the batch."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.containers import Container
from service.orders.domain import DOMAIN
from service.orders.fakes import Downstream
from tests.support import Topics, eventually, produce, running, scalar
from tests.support.effects import effect, effect_settings
from tests.support.orders import placed


async def test_a_capture_whose_key_holds_a_line_break_does_not_take_the_batchs_outcomes_with_it(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics, downstream: Downstream
) -> None:
    # Given a placed order whose id holds a line break: the consumer refuses it at the door (INVALID_FIELD)
    settings = effect_settings(database_url, kafka, topics, downstream)
    await produce(
        kafka, topics.source, [("R-1", placed("R-1"), {}), ("R-2", placed("R-2"), {}), ("R-3", placed("R\n3"), {})]
    )
    async with running(settings, "consumer_loop"):
        await eventually(lambda: scalar(engine, "SELECT count(*) = 2 FROM effects WHERE state = 'pending'"))
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 1 FROM quarantine WHERE error_code = 'INVALID_FIELD'")
        )
    # And yet a capture whose key holds one, from a store written otherwise (an older version that took such ids):
    # its Idempotency-Key header cannot be written (the client refuses it before a byte leaves, as ConnectFailed)
    async with engine.begin() as connection:
        await connection.execute(text("UPDATE orders SET order_id = 'R' || chr(10) || '2' WHERE order_id = 'R-2'"))
        await connection.execute(
            text(
                "UPDATE effects SET aggregate_id = 'R' || chr(10) || '2',"
                " idempotency_key = 'R' || chr(10) || '2/payment.capture' WHERE aggregate_id = 'R-2'"
            )
        )

    # When one worker batch claims and calls both captures
    container = Container(settings=settings, domain=DOMAIN)
    await container.init_resources()
    try:
        worker = await container.effect_worker()
        raised: BaseException | None = None
        try:
            await worker.work_once("payment.capture")
        except Exception as error:  # what escapes the batch is the point of the test
            raised = error
    finally:
        await container.shutdown_resources()

    # Then the batch ends with an outcome for each: the good capture, which the provider made, is recorded
    # sent (not left in_flight to expire into uncertain), and no exception escapes the worker's lane
    assert downstream.calls("payments.post", "R-1/payment.capture") == 1
    assert (await effect(engine, "R-1/payment.capture"))["state"] == "sent", "the made call's outcome was lost"
    assert raised is None, f"{type(raised).__name__}: {raised}"
    bad = await effect(engine, "R\n2/payment.capture")
    assert (bad["state"], bad["attempts"]) == ("pending", 1), "its own call fails: not sent, tried again later"
