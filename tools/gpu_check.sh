#!/usr/bin/env bash
# GPU bring-up on ONE GPU machine with no internet (make gpu-check):
#   1. installs what it can from at most 64 MiB of wheels carried to it (WHEELS=dir: megatron-core and other
#      small pure-Python wheels, --no-deps, into OUT/site, put first on PYTHONPATH); torch, vLLM and
#      Transformer Engine must already be there (their wheels are far larger);
#   2. names the installed vs supported vLLM / Transformer Engine / megatron-core versions (megatron_rl/runtime/stack.py);
#   3. runs tests/gpu/ (tests that need more GPUs than the machine has skip, with the reason);
#   4. runs a 2-step actor + reference run on a random Qwen3-1.7B-shaped model (tools/gpu_check_run.py) and
#      prints plan's estimate beside torch.cuda.max_memory_allocated.
# Usage: [WHEELS=dir] [OUT=dir] [PYTHON=python] [SHAPE=qwen3-1.7b] [SEQ_LEN=4096] tools/gpu_check.sh
# Exit status: 2 for bad input (no GPU, wheels over the limit), else the first failing step's.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-$REPO/runs/gpu_check}"
SHAPE="${SHAPE:-qwen3-1.7b}"
SEQ_LEN="${SEQ_LEN:-4096}"
LIMIT_BYTES=$((64 * 1024 * 1024))

die() { echo "gpu_check: error: $*" >&2; exit 2; }

command -v "$PYTHON" >/dev/null 2>&1 || die "PYTHON=$PYTHON not found"
[[ "$SEQ_LEN" =~ ^[1-9][0-9]*$ ]] || die "SEQ_LEN=$SEQ_LEN is not a positive integer"
wheels=()
total=0
if [[ -n "${WHEELS:-}" ]]; then
  [[ -d "$WHEELS" ]] || die "WHEELS=$WHEELS is not a directory"
  shopt -s nullglob
  wheels=("$WHEELS"/*.whl)
  shopt -u nullglob
  ((${#wheels[@]} > 0)) || die "WHEELS=$WHEELS holds no .whl files"
  for w in "${wheels[@]}"; do total=$((total + $(stat -c %s "$w"))); done
  ((total <= LIMIT_BYTES)) || die "WHEELS=$WHEELS holds $((total / 1024 / 1024)) MiB of wheels, over the 64 MiB limit"
fi
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
  || die "no CUDA device visible to $PYTHON (torch.cuda.is_available() is false); run this on the GPU machine"
mkdir -p "$OUT"

# 1. wheels carried to the machine (no index: nothing is fetched)
if ((${#wheels[@]} > 0)); then
  echo "[gpu-check] installing ${#wheels[@]} wheel(s) ($((total / 1024)) KiB) --no-deps into $OUT/site"
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --target "$OUT/site" "${wheels[@]}"
  export PYTHONPATH="$OUT/site:$REPO${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" WANDB_MODE="${WANDB_MODE:-offline}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# 2. the stack against the versions the code is written for (reported, not fatal here: the tests say more)
"$PYTHON" - <<'EOF'
import torch
from megatron_rl import stack
from megatron_rl.models.provider import te_import_error
print(f"[gpu-check] torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.cuda.device_count()} GPU(s): "
      f"{torch.cuda.get_device_name(0)}")
for pkg in stack.SUPPORTED:
    v = stack.installed_version(pkg)
    print(f"[gpu-check] {pkg}: installed {v or 'absent'}, supported {stack.SUPPORTED[pkg][0]}"
          + (f"  <- {stack.mismatch(pkg, v)}" if stack.mismatch(pkg, v) else ""))
print(f"[gpu-check] transformer_engine.pytorch: {te_import_error() or 'imports'}")
EOF

# 3. the GPU tests
status=0
"$PYTHON" -m pytest "$REPO/tests/gpu" -q -rs --timeout=1200 -p no:cacheprovider || status=$?
echo "[gpu-check] tests/gpu exit status $status"

# 4. the 2-step actor + reference run, plan beside the measured peak
run_status=0
"$PYTHON" "$REPO/tools/gpu_check_run.py" --out "$OUT" --shape "$SHAPE" --seq-len "$SEQ_LEN" || run_status=$?
echo "[gpu-check] actor + reference run exit status $run_status; record: $OUT/gpu_check.json"
if ((status != 0)); then exit "$status"; fi
exit "$run_status"
