#!/usr/bin/env bash
# One command to refresh every golden capture in tests/golden/vllm-0.32/ from real vLLM:
#   1. ONE ordinary engine (timings with nothing else busy): responses, SSE, /metrics, timings;
#   2. the prefill/decode pair with NixlConnector: both legs of the P/D protocol;
#   3. ONE engine running the model as an embedding model, then ONE as a classifier: the
#      pooling routes' answers;
#   4. KV-cache events (kv-events/): capture_kv_events.py starts and stops its own engine.
# Prepares the tier if needed (with NIXL), starts what is not running, and stops what it
# started. Extra arguments go to the first capture (e.g. --reps 10).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${FLEET_VLLM_VENV:-$HOME/.cache/fleet-proxy/vllm-venv}"
engines() { python3 "$here/engines.py" "$@"; }
started=()
cleanup() { for mode in "${started[@]}"; do engines stop $mode || true; done; }
trap cleanup EXIT

bash "$here/prepare.sh" --with-nixl

if ! engines status >/dev/null 2>&1; then
  engines start --count 1 >/dev/null
  started+=("")
fi
"$venv/bin/python" "$here/capture_goldens.py" "$@"
if [[ ${#started[@]} -gt 0 ]]; then engines stop; started=(); fi  # one pair at a time on 2 cores

if ! engines status --pd-nixl >/dev/null 2>&1; then
  engines start --pd-nixl >/dev/null
  started+=("--pd-nixl")
fi
"$venv/bin/python" "$here/capture_goldens.py" --pd
if [[ ${#started[@]} -gt 0 ]]; then engines stop --pd-nixl; started=(); fi

if ! engines status >/dev/null 2>&1; then
  engines start --count 1 --pooling >/dev/null
  started+=("")
fi
"$venv/bin/python" "$here/capture_goldens.py" --pooling
if [[ ${#started[@]} -gt 0 ]]; then engines stop; started=(); fi

if ! engines status >/dev/null 2>&1; then
  engines start --count 1 --pooling classify >/dev/null
  started+=("")
fi
"$venv/bin/python" "$here/capture_goldens.py" --pooling classify
if [[ ${#started[@]} -gt 0 ]]; then engines stop; started=(); fi

"$venv/bin/python" "$here/capture_kv_events.py"
