"""Clients of the outside world: downstream HTTP APIs and Kafka. They translate errors into service errors."""
