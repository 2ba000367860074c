"""A second domain on the core: inventory reservations (reserve and release stock, held at a warehouse).

Built only against the core's public API (docs/template-guide.md, "A second domain: inventory reservations"):
its messages, rules, codes, rows, migration, clients, effect kinds, handler, fakes and the composition that
rewires the core's container.
"""
