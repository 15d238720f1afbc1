# syntax=docker/dockerfile:1
# draudit collector image: `docker build -t draudit:0.1.0 .`
# Used by docker-compose.yml and by deploy/ (Kustomize image name `draudit`).

# --- build: wheels for draudit and every dependency (no compiler needed: all ship wheels) ---
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY collector ./collector
COPY reports ./reports
COPY migrations ./migrations
# collector/policy/default_bundle links to ../../policies: the wheel carries the shipped bundle.
COPY policies ./policies
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# --- runtime ---
FROM python:3.11-slim-bookworm
# WeasyPrint (report.pdf) needs Pango, HarfBuzz's subsetter and at least one font; nothing else
# in draudit links to system libraries (psycopg[binary] bundles libpq).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0 fontconfig fonts-dejavu-core \
 && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 draudit \
 && useradd --system --uid 10001 --gid draudit --home-dir /var/lib/draudit --no-create-home \
      --shell /usr/sbin/nologin draudit \
 && mkdir -p /var/lib/draudit/packs /var/lib/draudit/policies \
 && chown -R draudit:draudit /var/lib/draudit

COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-index --find-links=/tmp/wheels draudit \
 && rm -rf /tmp/wheels

# The shipped bundle also at a fixed path, the default below: a ConfigMap or volume mounted there
# (deploy/) replaces it with the bank's own bundle without rebuilding the image.
COPY policies /opt/draudit/policies

# TZ=UTC: the Kubernetes client's leader election builds naive local times (watch-semantics.md §13).
# XDG_CACHE_HOME: fontconfig's cache must be writable under a read-only root filesystem.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TZ=UTC \
    XDG_CACHE_HOME=/tmp/.cache \
    DRAUDIT_POLICY_BUNDLE=/opt/draudit/policies \
    DRAUDIT_PACK_DIR=/var/lib/draudit/packs

USER 10001:10001
WORKDIR /var/lib/draudit
EXPOSE 8080
ENTRYPOINT ["draudit"]
CMD ["run"]
