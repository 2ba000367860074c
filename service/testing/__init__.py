"""Test doubles for the services order-service talks to (used by integration tests and the demo)."""
