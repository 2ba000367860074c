"""What every domain shares: the vocabulary of outcomes (error codes) and the field types of message schemas. No
I/O here."""
