# One image for the proxy and the simulated engines: `fleet-proxy serve`, `fleet-proxy sim`,
# `fleet-proxy demo` (the default command). docker-compose.yml builds it once and runs both
# (and once more with Envoy, EXTRAS="[gateway]", for its gateway profile).
#
# BASE_IMAGE: any image with Python 3.11 or newer as `python3`, its venv module, and
# groupadd/useradd (python:3.11-slim; or a Debian bookworm image with python3-venv, which
# scripts/compose_smoke.sh builds from Debian packages where no public image can be pulled).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/fleet-proxy \
    PATH=/opt/fleet-proxy/bin:$PATH

# A virtual environment: a distribution's own Python refuses system-wide pip installs.
RUN python3 -m venv /opt/fleet-proxy

WORKDIR /src
COPY pyproject.toml README.md ./
COPY fleet ./fleet
COPY proxy ./proxy
COPY policies ./policies
COPY flowcontrol ./flowcontrol
COPY rescheduler ./rescheduler
COPY planner ./planner
COPY simulator ./simulator
COPY bench ./bench
# EXTRAS: optional dependencies, e.g. "[gateway]" for Envoy (docker-compose.yml's gateway
# profile); none by default.
ARG EXTRAS=""
RUN pip install ".${EXTRAS}" && rm -rf /src

# Runs as an unprivileged user (numeric, so runAsNonRoot can check it); its home is the
# working directory, where the planner keeps its state file.
RUN groupadd --system --gid 10001 fleet \
 && useradd --system --uid 10001 --gid fleet --home-dir /var/lib/fleet-proxy --create-home \
    --shell /usr/sbin/nologin fleet
WORKDIR /var/lib/fleet-proxy
USER 10001:10001

EXPOSE 8000
ENTRYPOINT ["fleet-proxy"]
CMD ["demo", "--host", "0.0.0.0"]
