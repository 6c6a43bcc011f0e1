#!/usr/bin/env bash
# End-to-end check of docker-compose.yml on a machine with a Docker engine and the compose
# plugin: build the image, bring the simulated stack up, send a completion through the proxy,
# read `up` for the proxy and every engine back from Prometheus, check that Grafana lists the
# dashboard and reaches its data source, then tear everything down (whatever happened).
#
# It runs as its own compose project on ports of its own (PROXY_PORT, PROMETHEUS_PORT,
# GRAFANA_PORT; defaults 18000, 19090, 13000), so a stack already up is left alone.
#
# The base image: BASE_IMAGE if set; else python:3.11-slim if present or pullable; else a
# stand-in built here from Debian packages (debootstrap bookworm with python3-venv, imported
# with `docker import`), for machines that cannot pull public images. Prometheus's and
# Grafana's images must be present or pullable (their versions: PROMETHEUS_VERSION,
# GRAFANA_VERSION as in docker-compose.yml).
#
#   bash scripts/compose_smoke.sh            # exit 0: every check passed
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-fleet-proxy-smoke}"
export COMPOSE_PROFILES=sim
export PROXY_PORT="${PROXY_PORT:-18000}"
export PROMETHEUS_PORT="${PROMETHEUS_PORT:-19090}"
export GRAFANA_PORT="${GRAFANA_PORT:-13000}"
export BIND_ADDRESS=127.0.0.1
export FLEET_PROXY_IMAGE="${FLEET_PROXY_IMAGE:-fleet-proxy:smoke}"
export GRAFANA_ADMIN_USER="${GRAFANA_ADMIN_USER:-admin}"
export GRAFANA_ADMIN_PASSWORD="${GRAFANA_ADMIN_PASSWORD:-admin}"
# The proxy's client keys are off for this check (a completion without a key must pass).
unset FLEET_PROXY_API_KEYS
wait_s="${SMOKE_WAIT_S:-300}"

say() { echo "compose_smoke: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }
compose() { docker compose "$@"; }

command -v docker >/dev/null || die "no docker client on PATH"
docker info >/dev/null 2>&1 || die "no Docker engine answers ('docker info' failed)"
docker compose version >/dev/null 2>&1 || die "the docker compose plugin is missing"
command -v curl >/dev/null || die "curl is needed"
command -v python3 >/dev/null || die "python3 is needed (to read JSON answers)"

have_image() { docker image inspect "$1" >/dev/null 2>&1 || docker pull -q "$1" >/dev/null 2>&1; }

standin_base() {
  # A Debian bookworm root file system with Python 3.11 and its venv module, from Debian's
  # packages, imported as an image.
  local tag=fleet-proxy-base:bookworm
  if docker image inspect "$tag" >/dev/null 2>&1; then echo "$tag"; return; fi
  command -v debootstrap >/dev/null || die "python:3.11-slim cannot be pulled and debootstrap \
is missing for a stand-in base (apt-get install debootstrap), or set BASE_IMAGE"
  local mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  local root
  root="$(mktemp -d)"
  say "building the stand-in base $tag from $mirror (debootstrap, a few minutes)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
    "$root" "$mirror" >&2 || die "debootstrap failed"
  # It trusts what this host trusts, for pip behind a TLS-inspecting proxy as well.
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  tar -C "$root" -c . | docker import -c 'ENV LANG=C.UTF-8' \
    -c 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' - "$tag" >/dev/null \
    || die "docker import of the stand-in base failed"
  rm -rf "$root"
  echo "$tag"
}

if [[ -z "${BASE_IMAGE:-}" ]]; then
  if have_image python:3.11-slim; then
    export BASE_IMAGE=python:3.11-slim
  else
    BASE_IMAGE="$(standin_base)"
    export BASE_IMAGE
  fi
fi
say "base image: $BASE_IMAGE"

images="$(compose config --format json | python3 -c '
import json, sys
services = json.load(sys.stdin)["services"]
print(services["prometheus"]["image"], services["grafana"]["image"])')" \
  || die "docker compose config failed"
for image in $images; do
  have_image "$image" || die "image $image is neither present nor pullable"
done

teardown() {
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    say "logs of the failed run:"
    compose logs --no-color --tail 40 >&2 || true
  fi
  compose down --volumes --remove-orphans >/dev/null 2>&1 || true
  exit $rc
}
trap teardown EXIT

say "docker compose up (build, then wait for every healthcheck; up to ${wait_s}s)"
compose up -d --build --wait --wait-timeout "$wait_s" >&2 || die "the stack did not become healthy"

proxy="http://127.0.0.1:$PROXY_PORT"
prom="http://127.0.0.1:$PROMETHEUS_PORT"
graf="http://127.0.0.1:$GRAFANA_PORT"

# 1. A completion through the proxy.
answer="$(curl -sS --fail-with-body --max-time 60 "$proxy/v1/completions" \
  -H 'content-type: application/json' \
  -d '{"model": "sim-llama-8b", "prompt": "Hello", "max_tokens": 8}')" \
  || die "completion through the proxy failed: $answer"
python3 -c 'import json,sys; a=json.loads(sys.argv[1]); assert a["choices"][0]["text"], a' \
  "$answer" || die "the completion has no text: $answer"
say "ok: completion through the proxy"

# The admin API is closed on this 0.0.0.0 listener unless FLEET_PROXY_ADMIN_TOKEN is set.
if [[ -z "${FLEET_PROXY_ADMIN_TOKEN:-}" ]]; then
  code="$(curl -s -o /dev/null -w '%{http_code}' "$proxy/admin/backends")"
  [[ "$code" == 403 ]] || die "/admin/backends answered $code without a token, expected 403"
  say "ok: /admin refused without a token"
fi

# 2. up == 1 for the proxy and the four engines, read from Prometheus (DNS discovery refreshes
# every 15 s and scrapes run every 5 s: poll for up to 90 s).
expected='fleet-proxy/proxy:8000 vllm/sim:8101 vllm/sim:8102 vllm/sim:8103 vllm/sim:8104'
deadline=$((SECONDS + 90))
while :; do
  got="$(curl -sS --max-time 5 "$prom/api/v1/query" --data-urlencode 'query=up' | python3 -c '
import json, sys
r = json.load(sys.stdin)["data"]["result"]
print(" ".join(sorted(m["metric"]["job"] + "/" + m["metric"]["instance"] for m in r if m["value"][1] == "1")))
' 2>/dev/null || true)"
  missing=""
  for t in $expected; do [[ " $got " == *" $t "* ]] || missing="$missing $t"; done
  [[ -z "$missing" ]] && break
  (( SECONDS < deadline )) || die "Prometheus has no up == 1 for:$missing (up == 1: ${got:-none})"
  sleep 3
done
say "ok: Prometheus scrapes $expected"

# The proxy's own series arrived too (the completion above was counted).
n="$(curl -sS --max-time 5 "$prom/api/v1/query" \
  --data-urlencode 'query=sum(fleet_proxy_requests_total{endpoint="/v1/completions"})' \
  | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)')"
python3 -c 'import sys; assert float(sys.argv[1]) >= 1' "$n" \
  || die "fleet_proxy_requests_total for /v1/completions is $n in Prometheus"
say "ok: fleet_proxy_requests_total in Prometheus"

# 3. Grafana lists the provisioned dashboard and reaches Prometheus through its data source.
auth="$GRAFANA_ADMIN_USER:$GRAFANA_ADMIN_PASSWORD"
curl -sS --fail --max-time 10 -u "$auth" "$graf/api/search?type=dash-db&query=fleet-proxy" \
  | python3 -c 'import json,sys; assert any(d.get("uid") == "fleet-proxy" for d in json.load(sys.stdin))' \
  || die "Grafana does not list the dashboard with uid fleet-proxy"
curl -sS --fail --max-time 10 -u "$auth" "$graf/api/datasources/uid/prometheus/health" \
  | python3 -c 'import json,sys; h=json.load(sys.stdin); assert h.get("status") == "OK", h' \
  || die "Grafana's Prometheus data source is not healthy"
say "ok: Grafana lists the dashboard; its data source answers"

say "all checks passed"
