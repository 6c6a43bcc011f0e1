#!/usr/bin/env bash
# One streamed chat request with curl's timing fields.
#   scripts/curl/one.sh [BASE_URL] [MODEL]      (env: PROMPT, MAX_TOKENS)
# time_starttransfer (first byte) is the TTFT curl can see; time_total is E2E.
# Caveat: the first byte is often not the first token. A server may send the headers at once
# (vLLM and fleet-proxy stream through frameworks that do) and vLLM's first chat chunk carries
# only the role, so TTFB can be far below TTFT. scripts/curl/ttft.sh waits for the first
# chunk with text; `fleet-proxy bench` does the same per request.
set -euo pipefail
BASE_URL=${1:-http://127.0.0.1:8000}
MODEL=${2:-${MODEL:-sim-llama-8b}}  # the model `fleet-proxy demo` serves
PROMPT=${PROMPT:-"Write one sentence about routers."}
MAX_TOKENS=${MAX_TOKENS:-64}
API=${API:-chat}
HERE=$(cd "$(dirname "$0")" && pwd)

# shellcheck source=request.sh
. "$HERE/request.sh"

# -N: no buffering, so the stream arrives as it is produced; -D-: show the headers
# (x-fleet-backend tells which backend served it).
curl -sS -N -o /dev/null -D - -w "@$HERE/timing.fmt" \
  -H 'content-type: application/json' -d "$body" "$BASE_URL$path" \
  | grep -iE '^(x-fleet-backend|x-request-id|http/)|^ ' || true
