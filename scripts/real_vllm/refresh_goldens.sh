#!/usr/bin/env bash
# One command to refresh tests/golden/vllm-0.32/ from a real vLLM engine:
# prepares the tier if needed, starts ONE engine unless the tier already runs (then it uses
# engine 0 and leaves the engines running), captures, and stops what it started.
# Extra arguments go to capture_goldens.py (e.g. --reps 5).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${FLEET_VLLM_VENV:-$HOME/.cache/fleet-proxy/vllm-venv}"

bash "$here/prepare.sh"
started=0
if ! python3 "$here/engines.py" status >/dev/null 2>&1; then
  python3 "$here/engines.py" start --count 1 >/dev/null
  started=1
fi
cleanup() { if [[ "$started" == 1 ]]; then python3 "$here/engines.py" stop; fi; }
trap cleanup EXIT
"$venv/bin/python" "$here/capture_goldens.py" "$@"
