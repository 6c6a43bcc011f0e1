#!/usr/bin/env bash
# Fire N streamed requests at concurrency C with curl and print p50/p90/p99 of TTFB and total.
#   scripts/curl/loop.sh [BASE_URL] [N] [C]     (env: MODEL, PROMPT, MAX_TOKENS, API)
# Percentiles are nearest-rank over successful (HTTP 200) requests. Bounded: N requests, and
# each curl gives up after MAX_TIME seconds (default 120).
set -euo pipefail
BASE_URL=${1:-http://127.0.0.1:8000}
N=${2:-100}
C=${3:-8}
MODEL=${MODEL:-sim-llama-8b}  # the model `fleet-proxy demo` serves
PROMPT=${PROMPT:-"Write one sentence about routers."}
MAX_TOKENS=${MAX_TOKENS:-32}
MAX_TIME=${MAX_TIME:-120}
API=${API:-chat}
HERE=$(cd "$(dirname "$0")" && pwd)

# shellcheck source=request.sh
. "$HERE/request.sh"
out=$(mktemp)
trap 'rm -f "$out"' EXIT

start=$(date +%s%N)
seq "$N" | xargs -P "$C" -I{} curl -sS -N -o /dev/null --max-time "$MAX_TIME" \
  -w '%{http_code} %{time_starttransfer} %{time_total}\n' \
  -H 'content-type: application/json' -d "$body" "$BASE_URL$path" >>"$out" 2>/dev/null || true
wall_ms=$(( ($(date +%s%N) - start) / 1000000 ))

ok=$(awk '$1 == 200' "$out" | wc -l)
awk -v ok="$ok" -v n="$N" -v c="$C" -v ms="$wall_ms" 'BEGIN {
  printf "%d requests at concurrency %d: %d ok, %d failed, %.2f s, %.1f req/s\n",
    n, c, ok, n - ok, ms / 1000, ok * 1000 / (ms > 0 ? ms : 1) }'
[ "$ok" -gt 0 ] || exit 1

# Nearest-rank percentiles of one column over the successful requests (portable awk).
pcts() {
  awk '$1 == 200 { print $'"$1"' }' "$out" | sort -g | awk '
    { v[NR] = $1 }
    END {
      split("50 90 99", ps, " ")
      for (j = 1; j <= 3; j++) { i = int(ps[j] / 100 * NR + 0.999999); if (i < 1) i = 1
        printf " %8.1fms", v[i] * 1000 }
      printf "\n" }'
}
printf '%-14s %10s %10s %10s\n' "" p50 p90 p99
printf '%-14s%s\n' "TTFB (~TTFT)" "$(pcts 2)"
printf '%-14s%s\n' "total (E2E)" "$(pcts 3)"
