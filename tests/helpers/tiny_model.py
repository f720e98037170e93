"""A tiny random Qwen3 saved as an HF dir (vocab 64; head_dim 32: vLLM-CPU's attention kernels reject 16),
with weights spread wide (std 0.3) so its next-token distributions are far from uniform."""
from __future__ import annotations

from pathlib import Path


def save_tiny_qwen3(d: Path) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, max_position_embeddings=256, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(0)
    m = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)
    m.save_pretrained(str(d))
    return d
