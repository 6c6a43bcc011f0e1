#!/usr/bin/env bash
# End-to-end check of docker-compose.yml on a machine with a Docker engine and Compose v2
# (see scripts/compose_images.sh): build the image, bring the simulated stack up, send a completion through the proxy,
# read `up` for the proxy and every engine back from Prometheus, check that Grafana lists the
# dashboard and reaches its data source, then tear everything down (whatever happened).
#
# It runs as its own compose project on ports of its own (PROXY_PORT, PROMETHEUS_PORT,
# GRAFANA_PORT; defaults 18000, 19090, 13000), so a stack already up is left alone.
#
# On a machine that cannot pull public images it builds stand-ins for the base image and
# Prometheus, and runs without Grafana (see scripts/compose_images.sh): the Grafana checks are
# then skipped, said in a warning and in the last line (SMOKE_REQUIRE_GRAFANA=1 makes that a
# failure). Images built here are kept, and reused by the next run.
#
# Every step is bounded: pulls SMOKE_PULL_S (default 120 s) each, each build SMOKE_BUILD_S
# (900 s), the stack's healthchecks SMOKE_WAIT_S (300 s), the checks about 3 minutes, the
# teardown 2 minutes.
#
#   bash scripts/compose_smoke.sh            # exit 0: every check passed (or Grafana skipped)
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
pull_s="${SMOKE_PULL_S:-120}"
build_s="${SMOKE_BUILD_S:-900}"

say() { echo "compose_smoke: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }

# shellcheck source=scripts/compose_images.sh
source "$repo/scripts/compose_images.sh"

command -v docker >/dev/null || die "no docker client on PATH"
docker info >/dev/null 2>&1 || die "no Docker engine answers ('docker info' failed)"
find_compose
command -v curl >/dev/null || die "curl is needed"
command -v python3 >/dev/null || die "python3 is needed (to read JSON answers)"
command -v timeout >/dev/null || die "timeout (coreutils) is needed"

choose_images
if [[ -n "$grafana_skipped" ]]; then
  [[ "${SMOKE_REQUIRE_GRAFANA:-0}" == 0 ]] || die "$grafana_skipped (SMOKE_REQUIRE_GRAFANA=1)"
  warn_grafana_skipped "; the Grafana checks are SKIPPED"
fi

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ $rc -ne 0 ]]; then
    say "logs of the failed run:"
    timeout 60 "${COMPOSE[@]}" logs --no-color --tail 40 >&2 || true
  fi
  say "${COMPOSE[*]} down --volumes (project $COMPOSE_PROJECT_NAME)"
  timeout 120 "${COMPOSE[@]}" down --volumes --remove-orphans >/dev/null 2>&1 \
    || say "WARNING: docker compose down failed; see 'docker compose -p $COMPOSE_PROJECT_NAME ps -a'"
  exit $rc
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "${COMPOSE[*]} up ${services[*]} (build, then wait for every healthcheck; up to ${wait_s}s)"
started=$SECONDS
timeout $((build_s + wait_s)) "${COMPOSE[@]}" up -d --build --wait --wait-timeout "$wait_s" \
  "${services[@]}" >&2 || die "the stack did not become healthy"
say "ok: ${services[*]} healthy after $((SECONDS - started))s"
compose ps --format '{{.Service}} {{.Image}} {{.Status}}' >&2 || true

proxy="http://127.0.0.1:$PROXY_PORT"
prom="http://127.0.0.1:$PROMETHEUS_PORT"
graf="http://127.0.0.1:$GRAFANA_PORT"

# 1. A completion through the proxy.
request='{"model": "sim-llama-8b", "prompt": "Hello", "max_tokens": 8}'
say "POST $proxy/v1/completions $request"
answer="$(curl -sS --fail-with-body --max-time 60 "$proxy/v1/completions" \
  -H 'content-type: application/json' -d "$request")" \
  || die "completion through the proxy failed: $answer"
say "answer: $answer"
python3 -c 'import json,sys; a=json.loads(sys.argv[1]); assert a["choices"][0]["text"], a' \
  "$answer" || die "the completion has no text: $answer"
say "ok: completion through the proxy"

# The admin API is closed on this 0.0.0.0 listener unless FLEET_PROXY_ADMIN_TOKEN is set.
if [[ -z "${FLEET_PROXY_ADMIN_TOKEN:-}" ]]; then
  code="$(curl -s --max-time 10 -o /dev/null -w '%{http_code}' "$proxy/admin/backends")"
  [[ "$code" == 403 ]] || die "/admin/backends answered $code without a token, expected 403"
  say "ok: GET /admin/backends without a token: 403"
fi

# 2. up == 1 for the proxy and the four engines, read from Prometheus (DNS discovery refreshes
# every 15 s and scrapes run every 5 s: poll for up to 90 s).
expected='fleet-proxy/proxy:8000 vllm/sim:8101 vllm/sim:8102 vllm/sim:8103 vllm/sim:8104'
say "GET $prom/api/v1/query?query=up until up == 1 for: $expected"
deadline=$((SECONDS + 90))
while :; do
  all="$(curl -sS --max-time 5 "$prom/api/v1/query" --data-urlencode 'query=up' | python3 -c '
import json, sys
r = json.load(sys.stdin)["data"]["result"]
print(" ".join(sorted(m["metric"]["job"] + "/" + m["metric"]["instance"] + "=" + m["value"][1] for m in r)))
' 2>/dev/null || true)"
  missing=""
  for t in $expected; do [[ " $all " == *" $t=1 "* ]] || missing="$missing $t"; done
  [[ -z "$missing" ]] && break
  (( SECONDS < deadline )) || die "Prometheus has no up == 1 for:$missing (up: ${all:-none})"
  sleep 3
done
say "Prometheus up: $all"
say "ok: Prometheus scrapes the proxy and the four engines"

# The proxy's own series arrived too: the completion above was counted (by a scrape after
# it; the first scrape that made `up` 1 may have come before it: poll for up to 30 s).
query='sum(fleet_proxy_requests_total{endpoint="completions"})'
deadline=$((SECONDS + 30))
while :; do
  n="$(curl -sS --max-time 5 "$prom/api/v1/query" --data-urlencode "query=$query" | python3 -c '
import json, sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if r else 0)' 2>/dev/null || echo none)"
  [[ "$n" != none && "$n" != 0 ]] && break
  (( SECONDS < deadline )) || die "Prometheus answers $n for $query, expected at least 1"
  sleep 2
done
say "ok: Prometheus answers $n for $query"

# 3. Grafana lists the provisioned dashboard and reaches Prometheus through its data source.
if [[ -n "$grafana_skipped" ]]; then
  say "SKIPPED: the Grafana checks (dashboard listed, data source healthy): $grafana_skipped"
  say "all checks passed except Grafana's, SKIPPED: $grafana_skipped"
  exit 0
fi
auth="$GRAFANA_ADMIN_USER:$GRAFANA_ADMIN_PASSWORD"
say "GET $graf/api/search?type=dash-db&query=fleet-proxy"
curl -sS --fail --max-time 10 -u "$auth" "$graf/api/search?type=dash-db&query=fleet-proxy" \
  | python3 -c 'import json,sys; assert any(d.get("uid") == "fleet-proxy" for d in json.load(sys.stdin))' \
  || die "Grafana does not list the dashboard with uid fleet-proxy"
say "GET $graf/api/datasources/uid/prometheus/health"
curl -sS --fail --max-time 10 -u "$auth" "$graf/api/datasources/uid/prometheus/health" \
  | python3 -c 'import json,sys; h=json.load(sys.stdin); assert h.get("status") == "OK", h' \
  || die "Grafana's Prometheus data source is not healthy"
say "ok: Grafana lists the dashboard; its data source answers"

say "all checks passed"
