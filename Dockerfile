# The order-service image: one image, one process per container, the command picks the role
# (migrate, consume, relay, effects, run, reconcile, ...). It runs what the wheel runs: the wheel is built in
# the first stage and installed, not editable, with the pinned and hashed runtime requirements, into a
# virtualenv that the slim final stage copies (no compilers, no sources, no alembic.ini; a non-root user).

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements/runtime.txt requirements/dev.txt ./requirements/
RUN python -m venv /opt/order-service \
    && /opt/order-service/bin/pip install --require-hashes --no-deps -r requirements/runtime.txt \
    && pip install "$(grep -o '^build==[^ ]*' requirements/dev.txt)"
COPY pyproject.toml README.md ./
COPY service ./service
COPY migrations ./migrations
RUN python -m build --wheel --outdir /dist . \
    && /opt/order-service/bin/pip install --no-deps /dist/order_service-*.whl

FROM python:3.11-slim
ENV PATH=/opt/order-service/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /opt/order-service /opt/order-service
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin orders
USER 10001
WORKDIR /tmp
EXPOSE 9108
ENTRYPOINT ["order-service"]
CMD ["--help"]
