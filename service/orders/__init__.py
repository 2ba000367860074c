"""The order domain: the first domain built on the reusable core (schemas, rules, its effects and clients)."""
