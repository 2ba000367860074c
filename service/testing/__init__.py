"""The generic fault-injection HTTP server that domains put their fake downstream APIs on (tests, the demo)."""
