"""The operator console: the quarantine queue, held keys, effects and reprocess runs in a browser (contract §9)."""
