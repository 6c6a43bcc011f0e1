#!/usr/bin/env bash
# The whole real-vLLM tier, as CI runs it: prepare (the install is kept between runs), start
# two engines (with KV-cache events), run the tests marked real_vllm, stop the engines
# whatever happens.
#   --with-pd   then also the prefill/decode pair with NixlConnector and its test
# A missing tier fails here instead of skipping (FLEET_REAL_VLLM_REQUIRED=1 and, with
# --with-pd, FLEET_REAL_VLLM_PD_REQUIRED=1). PYTEST (default: the repo's .venv/bin/pytest)
# runs the tests.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
pytest_bin="${PYTEST:-$repo/.venv/bin/pytest}"
with_pd=0
for arg in "$@"; do
  case "$arg" in
    --with-pd) with_pd=1 ;;
    *) echo "run_tier.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done
engines() { python3 "$here/engines.py" "$@"; }
cleanup() { engines stop || true; engines stop --pd-nixl || true; }
trap cleanup EXIT
cd "$repo"

if [[ "$with_pd" == 1 ]]; then bash "$here/prepare.sh" --with-nixl; else bash "$here/prepare.sh"; fi

# --kv-events: vLLM's KV-cache event publishers too, for test_kv_events.py.
engines start --count 2 --kv-events >/dev/null
FLEET_REAL_VLLM_REQUIRED=1 "$pytest_bin" -m real_vllm tests/real_vllm -v \
  --ignore tests/real_vllm/test_pd_nixl.py --ignore tests/real_vllm/test_engine_kill.py
# Last on these engines: it SIGKILLs one of them mid-stream.
FLEET_REAL_VLLM_REQUIRED=1 "$pytest_bin" -m real_vllm tests/real_vllm/test_engine_kill.py -v
engines stop

if [[ "$with_pd" == 1 ]]; then
  # One pair at a time: the 2 cores cannot carry four engines' start-up at once.
  engines start --pd-nixl >/dev/null
  FLEET_REAL_VLLM_PD_REQUIRED=1 "$pytest_bin" -m real_vllm tests/real_vllm/test_pd_nixl.py -v
  engines stop --pd-nixl
fi
