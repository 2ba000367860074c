"""order-service: applies order events from Kafka to PostgreSQL, every record to a known terminal state."""
