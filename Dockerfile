# tailguard worker image: `docker compose up` runs `tailguard worker` from it
# (see docker-compose.yml); any other command works too, e.g.
# `docker run --rm tailguard simulate …` or `docker run --rm tailguard settings`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/tailguard
# jemalloc: `tailguard worker` re-executes itself on it (TAILGUARD_ALLOCATOR=auto), so memory a
# flood of node ids took goes back to the system once they are forgotten (docs/operating.md#floods).
RUN apt-get update && apt-get install -y --no-install-recommends libjemalloc2 \
    && rm -rf /var/lib/apt/lists/*
# Dependencies first, so that a code change does not re-download them.
# (the base and `worker` requirements, read from pyproject.toml; the package itself comes later)
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['worker']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
# Then the code (and the scenario files the simulator reads); .dockerignore keeps the rest out.
COPY . .
RUN pip install --no-deps . \
    && useradd --system --home-dir /var/lib/tailguard --create-home tailguard

USER tailguard
# faust's data directory (its tables are in memory, rebuilt from their changelog topics on start).
ENV TAILGUARD_DATA_DIR=/var/lib/tailguard
VOLUME ["/var/lib/tailguard"]
# 9464: Prometheus metrics; 6066: faust's web server.
EXPOSE 9464 6066

ENTRYPOINT ["tailguard"]
CMD ["worker"]
