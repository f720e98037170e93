"""The engine side of the adapter-only push (``lora.push: adapter``): versioned PEFT adapter dirs on the
engine's own disk and vLLM's rank bound.

vLLM 0.32 loads a LoRA adapter only from a path (``LoRARequest.lora_path``; its worker manager reads
``adapter_config.json`` + ``adapter_model.safetensors`` with ``PEFTHelper.from_local_dir``), not from tensors.
So the trainer sends the adapter TENSORS to each engine actor (through Ray, as any call argument), and the
engine writes them here, on its own node's disk — never a path the trainer wrote, so engines on other
nodes need no shared file system. Each version is one directory ``root/v{version}``, written into a
temporary sibling and renamed into place (a reader sees a whole adapter or none); the previous version's
directory is removed once the new one is loaded (:meth:`AdapterStore.drop`).

vLLM sizes its LoRA buffers by ``max_lora_rank``, one of a fixed set of values (its ``MaxLoRARanks``):
:func:`vllm_max_lora_rank` is the smallest of them that holds ``lora.rank`` (a smaller adapter is
zero-padded by vLLM, which leaves ``B A`` unchanged).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

#: vLLM 0.32's allowed ``max_lora_rank`` values (``vllm/config/lora.py`` ``MaxLoRARanks``)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

ADAPTER_CONFIG = "adapter_config.json"       # PEFT's file names (``convert/peft_adapter.py`` writes the same)
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest of :data:`VLLM_LORA_RANKS` >= ``rank`` (8 -> 8, 4 -> 8, 20 -> 32); above 512 raises."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"lora.rank={rank} exceeds vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})")


class AdapterStore:
    """Adapter versions of one engine under ``root`` (a fresh temporary directory by default, removed by
    :meth:`close`)."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="mrl-lora-"))
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, version: int) -> Path:
        return self.root / f"v{int(version)}"

    def write(self, version: int, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
        """``root/v{version}`` holding ``config`` (PEFT's ``adapter_config.json``) and ``tensors`` (PEFT names),
        written atomically (temporary directory, then one rename); returns its path."""
        from safetensors.torch import save_file  # lazy: defers safetensors to the call

        final = self.path(version)
        tmp = Path(tempfile.mkdtemp(prefix=f".v{int(version)}-", dir=self.root))
        try:
            save_file({k: v.detach().cpu().contiguous() for k, v in sorted(tensors.items())},
                      str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
            (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1) + "\n")
            if final.exists():       # a version re-sent (a retried push): replace it whole
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def read(self, version: int) -> dict[str, torch.Tensor]:
        """The tensors of version ``version`` as the engine loaded them (sync verification)."""
        from safetensors.torch import load_file  # lazy: defers safetensors to the call

        return load_file(str(self.path(version) / ADAPTER_WEIGHTS))

    def drop(self, version: int) -> None:
        shutil.rmtree(self.path(version), ignore_errors=True)

    def versions(self) -> list[int]:
        return sorted(int(p.name[1:]) for p in self.root.glob("v*") if p.is_dir())

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
