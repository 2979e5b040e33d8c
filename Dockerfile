# tailguard worker image: `docker compose up` runs `tailguard worker` from it
# (see docker-compose.yml); any other command works too, e.g.
# `docker run --rm tailguard simulate …` or `docker run --rm tailguard settings`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/tailguard
# Dependencies first, so that a code change does not re-download them.
COPY pyproject.toml README.md ./
RUN mkdir -p app && touch app/__init__.py \
    && pip install '.[worker]' \
    && pip uninstall -y tailguard
# Then the code (and the scenario files the simulator reads); .dockerignore keeps the rest out.
COPY . .
RUN pip install --no-deps . \
    && useradd --system --home-dir /var/lib/tailguard --create-home tailguard

USER tailguard
# faust keeps its table state (RocksDB/in-memory changelog cache) here.
ENV TAILGUARD_DATA_DIR=/var/lib/tailguard
VOLUME ["/var/lib/tailguard"]
# 9464: Prometheus metrics; 6066: faust's web server.
EXPOSE 9464 6066

ENTRYPOINT ["tailguard"]
CMD ["worker"]
