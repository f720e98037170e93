#!/usr/bin/env bash
# Convert a HF checkpoint to a Megatron distributed checkpoint (loadable at any TP/PP), then back.
#
#   HF=/models/Qwen3-8B OUT=/ckpt/qwen3-8b-mcore TP=2 PP=1 examples/torchrun/convert_hf_to_mcore.sh
#
# Environment:
#   HF      folder with config.json + *.safetensors (required)
#   OUT     output folder of the Megatron checkpoint (required; refused if it holds one, unless FORCE=1)
#   TP, PP  layout written (default 1, 1); NPROC = TP x PP ranks run the conversion
#   BACK    if set, also export OUT back to HF safetensors into this folder (round-trip check)
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${HF:?set HF=folder of the HF checkpoint}" "${OUT:?set OUT=output folder}"
TP=${TP:-1}; PP=${PP:-1}; VENV=${VENV:-.venv}
FORCE_FLAG=(); [[ "${FORCE:-0}" == 1 ]] && FORCE_FLAG=(--force)

"$VENV/bin/torchrun" --standalone --nproc_per_node=$((TP * PP)) \
  -m megatron_rl.cli convert hf-to-mcore --hf "$HF" --out "$OUT" --tp "$TP" --pp "$PP" "${FORCE_FLAG[@]}"
if [[ -n "${BACK:-}" ]]; then
  "$VENV/bin/megatron-rl" convert mcore-to-hf --ckpt "$OUT" --out "$BACK" "${FORCE_FLAG[@]}"
fi
