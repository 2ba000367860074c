"""The order domain: message schemas, order rules and the vocabulary of outcomes. No I/O here."""
