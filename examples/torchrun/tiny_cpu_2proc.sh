#!/usr/bin/env bash
# CPU smoke run with 2 trainer ranks on gloo (no GPU): the tiny GRPO config with DP=2
# (data-parallel size = ranks / (TP x PP)).
#
#   examples/torchrun/tiny_cpu_2proc.sh [a.b=c ...]
#
# Environment: CONFIG (default: the repo's examples/configs/tiny_cpu_grpo.yaml), VENV (default: the
# repo's .venv). Relative paths (CONFIG, VENV, overrides) are taken from the caller's directory.
# Extra arguments are dotted config overrides (e.g. parallel.tp=2 for TP=2 instead of DP=2).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CONFIG=${CONFIG:-$REPO/examples/configs/tiny_cpu_grpo.yaml}
VENV=${VENV:-$REPO/.venv}
die() { echo "tiny_cpu_2proc.sh: $*" >&2; exit 2; }
[[ -f "$CONFIG" ]] || die "CONFIG=$CONFIG: no such file"
[[ -x "$VENV/bin/torchrun" ]] || die "VENV=$VENV: no bin/torchrun there"
export OMP_NUM_THREADS=1 WANDB_MODE=${WANDB_MODE:-offline} RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}

exec "$VENV/bin/torchrun" --standalone --nproc_per_node=2 \
  -m megatron_rl.cli train --config "$CONFIG" "$@"
