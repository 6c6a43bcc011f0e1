#!/usr/bin/env bash
# TTFT as `vllm bench` defines it (first chunk with non-empty content), measured around curl.
#   scripts/curl/ttft.sh [BASE_URL] [MODEL]     (env: PROMPT, MAX_TOKENS)
# Includes curl's own start-up (a few ms): fine for a look, not for small differences.
# curl's time_starttransfer counts the first byte, which may be headers or a role-only chunk
# sent before any token; this waits for the first chunk that carries text.
set -euo pipefail
BASE_URL=${1:-http://127.0.0.1:8000}
MODEL=${2:-${MODEL:-sim-llama-8b}}  # the model `fleet-proxy demo` serves
PROMPT=${PROMPT:-"Write one sentence about routers."}
MAX_TOKENS=${MAX_TOKENS:-64}
HERE=$(cd "$(dirname "$0")" && pwd)
API=${API:-chat}
# shellcheck source=request.sh
. "$HERE/request.sh"

start=$(date +%s%N)
first=""
chunks=0
while IFS= read -r line; do
  case "$line" in
    *'"content":""'* | *'"content":null'*) ;;
    *'"content":"'* | *'"text":"'*)
      chunks=$((chunks + 1))
      [ -n "$first" ] || first=$(date +%s%N) ;;
  esac
done < <(curl -sS -N -H 'content-type: application/json' -d "$body" \
  "$BASE_URL$path")
end=$(date +%s%N)
[ -n "$first" ] || { echo "no content received" >&2; exit 1; }
echo "TTFT $(( (first - start) / 1000000 )) ms, E2E $(( (end - start) / 1000000 )) ms, $chunks content chunks"
