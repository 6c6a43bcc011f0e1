#!/usr/bin/env bash
# The whole real-vLLM tier, as CI runs it: prepare (the install is kept between runs), start
# two engines (with KV-cache events), run the tests marked real_vllm, then start an embedding
# engine beside them for the pooling tests, stop every engine whatever happens.
#   --with-pd   then also the prefill/decode pair with NixlConnector and its test
# A missing tier fails here instead of skipping (FLEET_REAL_VLLM_REQUIRED=1,
# FLEET_REAL_VLLM_POOLING_REQUIRED=1 and, with --with-pd, FLEET_REAL_VLLM_PD_REQUIRED=1).
# PYTEST (default: the repo's .venv/bin/pytest) runs the tests. Each phase's seconds are
# printed at its end.
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
# The pooling engine's own state file, read by tests/real_vllm/test_pooling.py.
export FLEET_VLLM_POOLING_STATE="${FLEET_VLLM_POOLING_STATE:-$HOME/.cache/fleet-proxy/real-vllm/pooling-state.json}"
engines() { python3 "$here/engines.py" "$@"; }
cleanup() {
  engines stop || true
  engines stop --state "$FLEET_VLLM_POOLING_STATE" || true
  engines stop --pd-nixl || true
}
phase_start=$SECONDS
phase_done() { echo "[run_tier] $1: $((SECONDS - phase_start)) s" >&2; phase_start=$SECONDS; }
trap cleanup EXIT
cd "$repo"

if [[ "$with_pd" == 1 ]]; then bash "$here/prepare.sh" --with-nixl; else bash "$here/prepare.sh"; fi
phase_done prepare

# --kv-events: vLLM's KV-cache event publishers too, for test_kv_events.py.
engines start --count 2 --kv-events >/dev/null
FLEET_REAL_VLLM_REQUIRED=1 "$pytest_bin" -m real_vllm tests/real_vllm -v \
  --ignore tests/real_vllm/test_pd_nixl.py --ignore tests/real_vllm/test_engine_kill.py \
  --ignore tests/real_vllm/test_pooling.py
phase_done "ordinary pair"

# An embedding engine under its own model name beside the idle pair: the pooling tests put a
# generation engine and it behind one proxy. Started only now, so it never competes with the
# pair's tests for the 2 cores.
engines start --count 1 --pooling --served-model-name tiny-embed \
  --state "$FLEET_VLLM_POOLING_STATE" >/dev/null
FLEET_REAL_VLLM_REQUIRED=1 FLEET_REAL_VLLM_POOLING_REQUIRED=1 \
  "$pytest_bin" -m real_vllm tests/real_vllm/test_pooling.py -v
engines stop --state "$FLEET_VLLM_POOLING_STATE"
phase_done pooling

# Last on these engines: it SIGKILLs one of them mid-stream.
FLEET_REAL_VLLM_REQUIRED=1 "$pytest_bin" -m real_vllm tests/real_vllm/test_engine_kill.py -v
engines stop
phase_done "engine kill"

if [[ "$with_pd" == 1 ]]; then
  # One pair at a time: the 2 cores cannot carry four engines' start-up at once.
  engines start --pd-nixl >/dev/null
  FLEET_REAL_VLLM_PD_REQUIRED=1 "$pytest_bin" -m real_vllm tests/real_vllm/test_pd_nixl.py -v
  engines stop --pd-nixl
  phase_done "prefill/decode pair"
fi
