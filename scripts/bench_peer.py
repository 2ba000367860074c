"""The peer scripts/bench.py measures order-service against: a FastStream subscriber with one SQLAlchemy session per
message, as a team would write it (run by the bench as `bench.py peer …`, in its own process).
"""

from __future__ import annotations

import asyncio
import signal
from datetime import UTC, datetime

from aiokafka import ConsumerRecord
from faststream import AckPolicy
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import func
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from service.orders.tables import orders
from service.store.tables import inbox


class PeerItem(BaseModel):
    """An order line, as the peer team would model it."""

    sku: str
    quantity: int = Field(gt=0)
    unit_price_cents: int = Field(ge=0)


class PeerOrderPlaced(BaseModel):
    """`order.placed.v1`, as the peer team would model it."""

    order_id: str
    tenant: str
    customer_id: str
    currency: str
    items: list[PeerItem] = Field(min_length=1)


async def peer_handle(sessions: async_sessionmaker[AsyncSession], consumer: str, record: ConsumerRecord) -> None:
    """One message, one session, one transaction: the inbox row, then the order if the row is new.

    Bytes that do not validate are terminal too: an inbox row `quarantined`, nothing else.
    """
    headers = {name: value.decode() for name, value in record.headers}
    message_id = headers.get("message-id") or f"{record.topic}/{record.partition}/{record.offset}"
    try:
        order: PeerOrderPlaced | None = PeerOrderPlaced.model_validate_json(record.value or b"")
    except ValidationError:
        order = None
    row = {
        "consumer_name": consumer,
        "message_id": message_id,
        "status": "processed" if order else "quarantined",
        "source_topic": record.topic,
        "source_partition": record.partition,
        "source_offset": record.offset,
        "aggregate_id": order.order_id if order else None,
        "error_code": None if order else "MALFORMED_PAYLOAD",
        "received_at": datetime.fromtimestamp(record.timestamp / 1000, UTC),
    }
    async with sessions() as session:
        new = await session.execute(insert(inbox).values(row).on_conflict_do_nothing().returning(inbox.c.message_id))
        if order is not None and new.first() is not None:
            upsert = insert(orders).values(
                order_id=order.order_id,
                tenant=order.tenant,
                customer_id=order.customer_id,
                status="placed",
                amount_cents=sum(item.quantity * item.unit_price_cents for item in order.items),
                currency=order.currency,
                sequence=1,
            )
            set_ = {"status": upsert.excluded.status, "updated_at": func.now()}
            await session.execute(upsert.on_conflict_do_update(index_elements=[orders.c.order_id], set_=set_))
        await session.commit()


async def run_peer(bootstrap: str, topic: str, group: str, database_url: str) -> None:
    """The FastStream subscriber, until SIGTERM; the broker commits each message after its handler."""
    engine = create_async_engine(database_url)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    # FastStream logs two lines per message by default; off, so that the peer is measured at its best.
    broker = KafkaBroker(bootstrap, logger=None)

    @broker.subscriber(topic, group_id=group, auto_offset_reset="earliest", ack_policy=AckPolicy.ACK)
    async def handle(message: KafkaMessage) -> None:
        await peer_handle(sessions, group, message.raw_message)

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await broker.start()
    try:
        await stopping.wait()
    finally:
        await broker.stop()
        await engine.dispose()
