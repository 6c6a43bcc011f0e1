#!/usr/bin/env bash
# `docker compose up` for a machine that cannot pull public images: the simulated stack of
# docker-compose.yml, as the `fleet-proxy` compose project on the usual ports (PROXY_PORT,
# PROMETHEUS_PORT, GRAFANA_PORT; defaults 8000, 9090, 3000), with each image it cannot pull
# built here instead (see scripts/compose_images.sh): a Debian base for the proxy's image, a
# Prometheus from Debian's package; Grafana is left out, with a warning, when its image cannot
# be had. Images built here are kept, and the next `up` reuses them.
#
#   bash scripts/compose_offline.sh up     # build what it must, start the stack, wait until healthy
#   bash scripts/compose_offline.sh down   # stop it and remove its containers and network
#   OFFLINE_PROFILE=gateway bash scripts/compose_offline.sh up   # Envoy + `fleet-proxy epp`
#
# Once up, `docker compose ps`, `logs` and `down` work on the stack as usual. Every step is
# bounded: pulls OFFLINE_PULL_S (default 20 s) each, each build OFFLINE_BUILD_S (900 s), the
# healthchecks OFFLINE_WAIT_S (300 s).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

say() { echo "compose_offline: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }
usage() { echo "usage: bash scripts/compose_offline.sh up|down" >&2; exit 2; }

[[ $# -eq 1 ]] || usage
verb="$1"
[[ "$verb" == up || "$verb" == down ]] || usage

# The simulated fleet behind the proxy (OFFLINE_PROFILE=sim, the default) or behind Envoy
# with fleet-proxy as its endpoint picker (OFFLINE_PROFILE=gateway), whatever profiles the
# caller's environment names.
case "${OFFLINE_PROFILE:-sim}" in
  sim | gateway) export COMPOSE_PROFILES="${OFFLINE_PROFILE:-sim}" ;;
  *) die "OFFLINE_PROFILE is sim or gateway, not ${OFFLINE_PROFILE}" ;;
esac
pull_s="${OFFLINE_PULL_S:-20}"
build_s="${OFFLINE_BUILD_S:-900}"
wait_s="${OFFLINE_WAIT_S:-300}"

# shellcheck source=scripts/compose_images.sh
source "$repo/scripts/compose_images.sh"

command -v docker >/dev/null || die "no docker client on PATH"
find_compose
docker info >/dev/null 2>&1 || die "no Docker engine answers ('docker info' failed)"

if [[ "$verb" == down ]]; then
  say "${COMPOSE[*]} down --remove-orphans"
  timeout 120 "${COMPOSE[@]}" down --remove-orphans
  exit
fi

command -v python3 >/dev/null || die "python3 is needed (to read docker compose config)"
command -v timeout >/dev/null || die "timeout (coreutils) is needed"
choose_images
[[ -z "$grafana_skipped" ]] || warn_grafana_skipped " (the proxy, the engines and Prometheus run)"

say "${COMPOSE[*]} up ${services[*]} (build, then wait for every healthcheck; up to ${wait_s}s)"
if ! timeout $((build_s + wait_s)) "${COMPOSE[@]}" up -d --build --wait \
  --wait-timeout "$wait_s" "${services[@]}" >&2; then
  timeout 60 "${COMPOSE[@]}" logs --no-color --tail 40 >&2 || true
  die "the stack did not become healthy (bash scripts/compose_offline.sh down removes it)"
fi

host="${BIND_ADDRESS:-127.0.0.1}"
[[ "$host" != 0.0.0.0 ]] || host=127.0.0.1
say "up: ${services[*]}"
if [[ "$COMPOSE_PROFILES" == gateway ]]; then
  entry="http://$host:${GATEWAY_PORT:-8080}"
  say "  gateway     $entry/v1   (Envoy, fleet-proxy its endpoint picker; model \"${SIM_MODEL:-sim-llama-8b}\")"
else
  entry="http://$host:${PROXY_PORT:-8000}"
  say "  proxy       $entry/v1   (model \"${SIM_MODEL:-sim-llama-8b}\")"
fi
say "  Prometheus  http://$host:${PROMETHEUS_PORT:-9090}"
if [[ -z "$grafana_skipped" ]]; then
  say "  Grafana     http://$host:${GRAFANA_PORT:-3000}"
fi
say "try: curl -s $entry/v1/completions -H 'content-type: application/json' \
-d '{\"model\": \"${SIM_MODEL:-sim-llama-8b}\", \"prompt\": \"Hello\", \"max_tokens\": 16}'"
say "stop: bash scripts/compose_offline.sh down"
