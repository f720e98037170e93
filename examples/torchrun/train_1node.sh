#!/usr/bin/env bash
# One node: torchrun starts NPROC trainer ranks; trainer rank 0 starts a local Ray instance for
# the rollout engines, or joins an existing cluster when RAY_ADDRESS=host:port is set (passed on as
# the override rollout.ray_address).
#
#   CONFIG=examples/configs/qwen3_8b_grpo.yaml NPROC=8 examples/torchrun/train_1node.sh [a.b=c ...]
#
# Environment (checked before torchrun starts):
#   CONFIG   YAML config (default: the repo's examples/configs/qwen3_8b_grpo.yaml)
#   NPROC    trainer ranks = GPUs used by Megatron (default: 8); must equal TP x PP x DP of the config
#   RESUME   auto | none | PATH (default: auto — continue from the newest complete checkpoint)
#   VENV     virtualenv holding megatron_rl (default: the repo's .venv)
# Relative paths (CONFIG, VENV, RESUME, overrides) are taken from the caller's directory.
# Extra arguments are dotted config overrides, e.g. trainer.steps=100.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CONFIG=${CONFIG:-$REPO/examples/configs/qwen3_8b_grpo.yaml}
NPROC=${NPROC:-8}
RESUME=${RESUME:-auto}
VENV=${VENV:-$REPO/.venv}
die() { echo "train_1node.sh: $*" >&2; exit 2; }
[[ -f "$CONFIG" ]] || die "CONFIG=$CONFIG: no such file"
[[ "$NPROC" =~ ^[1-9][0-9]*$ ]] || die "NPROC=$NPROC: want an integer >= 1"
case "$RESUME" in auto | none) ;; *) [[ -e "$RESUME" ]] || die "RESUME=$RESUME: want auto, none or an existing checkpoint path" ;; esac
[[ -x "$VENV/bin/torchrun" ]] || die "VENV=$VENV: no bin/torchrun there"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export WANDB_MODE=${WANDB_MODE:-offline}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}  # Megatron TP/SP comm overlap

RAY_OVERRIDE=()
if [[ -n "${RAY_ADDRESS:-}" ]]; then RAY_OVERRIDE=("rollout.ray_address=$RAY_ADDRESS"); fi

exec "$VENV/bin/torchrun" --standalone --nproc_per_node="$NPROC" \
  -m megatron_rl.cli train --config "$CONFIG" --resume "$RESUME" "${RAY_OVERRIDE[@]}" "$@"
