#!/usr/bin/env bash
# One node: torchrun starts NPROC trainer ranks; trainer rank 0 starts a local Ray instance for
# the rollout engines, or joins an existing cluster when RAY_ADDRESS=host:port is set (passed on as
# the override rollout.ray_address).
#
#   CONFIG=examples/configs/qwen3_8b_grpo.yaml NPROC=8 examples/torchrun/train_1node.sh [a.b=c ...]
#
# Environment:
#   CONFIG   YAML config (default: examples/configs/qwen3_8b_grpo.yaml)
#   NPROC    trainer ranks = GPUs used by Megatron (default: 8); must equal TP x PP x DP of the config
#   RESUME   auto | PATH | none (default: auto — continue from the newest complete checkpoint)
#   VENV     virtualenv holding megatron_rl (default: .venv)
# Extra arguments are dotted config overrides, e.g. trainer.steps=100.
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${CONFIG:-examples/configs/qwen3_8b_grpo.yaml}
NPROC=${NPROC:-8}
RESUME=${RESUME:-auto}
VENV=${VENV:-.venv}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export WANDB_MODE=${WANDB_MODE:-offline}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}  # Megatron TP/SP comm overlap

RAY_OVERRIDE=()
if [[ -n "${RAY_ADDRESS:-}" ]]; then RAY_OVERRIDE=("rollout.ray_address=$RAY_ADDRESS"); fi

exec "$VENV/bin/torchrun" --standalone --nproc_per_node="$NPROC" \
  -m megatron_rl.cli train --config "$CONFIG" --resume "$RESUME" "${RAY_OVERRIDE[@]}" "$@"
