"""The failure state machine's decisions: pure functions returning frozen values, tested without I/O."""
