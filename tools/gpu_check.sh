#!/usr/bin/env bash
# GPU bring-up on ONE GPU machine with no network (make gpu-check; docs/gpu-status.md says how to run it on the
# lent machine). One command; needs torch, transformers, safetensors, pytest and the megatron-core wheel carried
# in WHEELS (nothing of vLLM, Ray or Transformer Engine: what needs them skips, with the reason).
#   1. installs the carried wheels (at most 64 MiB, --no-index --no-deps) into WORK/site, first on PYTHONPATH,
#      with this checkout (NOT installed: the tree as it is);
#   2. runs tools/gpu_check_run.py: env, random checkpoint drawn on the GPU, actor + reference, HF round trip,
#      log-prob parity with HF, train steps (tokens/s, MFU, peak vs plan), attention-score bytes, export,
#      offload/onload, CUDA IPC hand-off, one megatron-rl train step (skipped without Ray), the mu pass on an
#      8192 x 151936 shard, tests/gpu; each stage appends its record to OUT/gpu_check.json. The env stage fails
#      without the C compiler / Python headers Triton needs.
# OUT holds small files only (gpu_check.json, gpu_check.log, tests_gpu.log); the checkpoints go to WORK.
# Usage: [WHEELS=dir (default .whl/ when there; empty: none)] [OUT=dir] [WORK=dir] [PYTHON=python3] [SHAPE=qwen3-1.7b] [SEQ_LEN=2048] [ROWS=8]
#        [BUDGET_S=480] [GPU_CHECK_ALLOW_CPU=1 (the CPU rehearsal)] tools/gpu_check.sh [more gpu_check_run.py options]
# Exit status: 2 for bad input (no GPU, wheels over the limit), else gpu_check_run.py's (0: every stage ok).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-$REPO/runs/gpu_check}"
WORK="${WORK:-${TMPDIR:-/tmp}/megatron_rl_gpu_check}"
SHAPE="${SHAPE:-qwen3-1.7b}"
SEQ_LEN="${SEQ_LEN:-2048}"
ROWS="${ROWS:-8}"
BUDGET_S="${BUDGET_S:-480}"
LIMIT_BYTES=$((64 * 1024 * 1024))
if [[ -z "${WHEELS+set}" && -d "$REPO/.whl" ]]; then WHEELS="$REPO/.whl"; fi   # unset: .whl/ (make gpu-wheels); WHEELS= : none

die() { echo "gpu_check: error: $*" >&2; exit 2; }

command -v "$PYTHON" >/dev/null 2>&1 || die "PYTHON=$PYTHON not found"
[[ "$SEQ_LEN" =~ ^[1-9][0-9]*$ ]] || die "SEQ_LEN=$SEQ_LEN is not a positive integer"
[[ "$ROWS" =~ ^[1-9][0-9]*$ ]] || die "ROWS=$ROWS is not a positive integer"
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
if [[ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]]; then
  "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || die "no CUDA device visible to $PYTHON (torch.cuda.is_available() is false); run this on the GPU machine"
fi
mkdir -p "$OUT" "$WORK"

# 1. wheels carried to the machine (no index: nothing is fetched)
if ((${#wheels[@]} > 0)); then
  echo "[gpu-check] installing ${#wheels[@]} wheel(s) ($((total / 1024)) KiB) --no-deps into $WORK/site"
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --upgrade \
    --target "$WORK/site" "${wheels[@]}"
  export PYTHONPATH="$WORK/site:$REPO${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" WANDB_MODE="${WANDB_MODE:-offline}" PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# 2. the stages (each appends to OUT/gpu_check.json as it finishes); the log beside it
status=0
"$PYTHON" "$REPO/tools/gpu_check_run.py" --out "$OUT" --work "$WORK" --shape "$SHAPE" --seq-len "$SEQ_LEN" \
  --rows "$ROWS" --budget-s "$BUDGET_S" "$@" 2>&1 | tee "$OUT/gpu_check.log" || status=$?
echo "[gpu-check] exit status $status; record: $OUT/gpu_check.json"
exit "$status"
