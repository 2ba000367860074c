"""A second domain on the core: inventory reservations (reserve and release stock, held at a warehouse).

Built only on the core's seam module (`service.ports`): its messages, rules, codes, rows, migrations, clients,
effect kinds, handler and fake APIs, described to the core by one value, `inventory.domain.DOMAIN`, from which
the console script `inventory-service` is built.
"""
