# The order-service image: one image, one process per container, the command picks the role
# (migrate, consume, relay, run, reconcile, ...).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY pyproject.toml README.md alembic.ini ./
COPY service ./service
COPY migrations ./migrations
# Editable, so `order-service migrate` finds migrations/ and alembic.ini next to the package.
RUN pip install -e . && useradd --uid 10001 --no-create-home orders

USER 10001
EXPOSE 9108
ENTRYPOINT ["order-service"]
CMD ["--help"]
