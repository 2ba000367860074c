"""The core of a reliable Kafka consumer: applies a domain's messages from Kafka to PostgreSQL, every record to a known
terminal state (inbox, outbox and relay, retry tiers, parking, quarantine, effects, reprocess, the CLI and the console).
A domain plugs in through `service.ports`."""
