#!/usr/bin/env bash
# The whole real-vLLM tier, as CI runs it: prepare (install is cached between runs), start
# two engines, run the tests marked real_vllm, stop the engines whatever happens.
# FLEET_REAL_VLLM_REQUIRED=1 turns "tier not running" from a skip into a failure.
# PYTEST (default: .venv/bin/pytest of the repo) runs the tests; extra args go to pytest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
pytest_bin="${PYTEST:-$repo/.venv/bin/pytest}"

bash "$here/prepare.sh"
python3 "$here/engines.py" start --count 2 >/dev/null
trap 'python3 "$here/engines.py" stop' EXIT
cd "$repo"
FLEET_REAL_VLLM_REQUIRED=1 "$pytest_bin" -m real_vllm tests/real_vllm -v "$@"
