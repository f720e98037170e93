#!/usr/bin/env bash
# Convert a HF checkpoint to a Megatron distributed checkpoint (loadable at any TP/PP), then back.
#
#   HF=/models/Qwen3-8B OUT=/ckpt/qwen3-8b-mcore TP=2 PP=1 examples/torchrun/convert_hf_to_mcore.sh
#
# Environment (checked before torchrun starts; relative paths are from the caller's directory):
#   HF      folder with config.json + *.safetensors (required)
#   OUT     output folder of the Megatron checkpoint (required; refused if it holds one, unless FORCE=1)
#   TP, PP  layout written (default 1, 1); NPROC = TP x PP ranks run the conversion
#   BACK    if set, also export OUT back to HF safetensors into this folder (round-trip check)
#   VENV    virtualenv holding megatron_rl (default: the repo's .venv)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
die() { echo "convert_hf_to_mcore.sh: $*" >&2; exit 2; }
[[ -n "${HF:-}" ]] || die "set HF=folder of the HF checkpoint"
[[ -n "${OUT:-}" ]] || die "set OUT=output folder"
[[ -f "$HF/config.json" ]] || die "HF=$HF: no config.json there"
TP=${TP:-1}; PP=${PP:-1}; VENV=${VENV:-$REPO/.venv}
[[ "$TP" =~ ^[1-9][0-9]*$ && "$PP" =~ ^[1-9][0-9]*$ ]] || die "TP=$TP PP=$PP: want integers >= 1"
[[ -x "$VENV/bin/torchrun" ]] || die "VENV=$VENV: no bin/torchrun there"
FORCE_FLAG=(); [[ "${FORCE:-0}" == 1 ]] && FORCE_FLAG=(--force)

"$VENV/bin/torchrun" --standalone --nproc_per_node=$((TP * PP)) \
  -m megatron_rl.cli convert hf-to-mcore --hf "$HF" --out "$OUT" --tp "$TP" --pp "$PP" "${FORCE_FLAG[@]}"
if [[ -n "${BACK:-}" ]]; then
  "$VENV/bin/megatron-rl" convert mcore-to-hf --ckpt "$OUT" --out "$BACK" "${FORCE_FLAG[@]}"
fi
