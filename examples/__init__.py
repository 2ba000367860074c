"""Examples built on the core of order-service, outside the wheel: each proves a seam by using only the core's
public modules."""
