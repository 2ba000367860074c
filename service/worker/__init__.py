"""Long-running loops: the consumer, the outbox relay. Each applies decisions made elsewhere."""
