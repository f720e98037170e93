"""Answers the dry run's measurements are held against, computed without Megatron's model code.

* :func:`hf_param_count`: transformers' own model of the HF config, built on the meta device
  (``AutoModelForCausalLM.from_config``): the parameters every rank's share must sum to.
* :func:`megatron_state_bytes`: the weight-and-optimizer memory of Megatron-LM's theoretical memory
  estimate (``megatron/training/theoretical_memory_usage.py``), re-derived here: with SwiGLU (gated MLP,
  factor 3/2), GQA (k query groups of a heads, head dim d) and RMSNorm, the transformer's parameters are

      P_layers = 2·L·h²·( (1 + k/a)·(a·d/h) + (f/h)·3/2 + 1/h )     (Wq+Wo, Wk+Wv; W1, W2, W3; two norms)

  and the most loaded shard holds ``(P_layers / p + V·h) / t`` (+ V·h / t more for an untied output layer
  without pipelining), V the padded vocabulary, t TP, p PP. Bytes per parameter: 18 (bf16 weight 2, fp32
  grad 4, fp32 master + Adam m and v 12), or with the distributed optimizer 6 + 12 / (DP·CP); in fp32 (which
  the original does not cover: no master copy) 16, or 8 + 8 / (DP·CP). Like the
  original it leaves out QK-norm weights and QKV biases (a few hundred thousand parameters) and divides the
  norms by t (they are replicated): an estimate to about 1e-4 of a shard.
"""
from __future__ import annotations

import dataclasses


def hf_param_count(hf_path: str) -> int:
    """Parameters of transformers' model of the ``config.json`` in ``hf_path`` (built on the meta device)."""
    import torch  # lazy: transformers and torch only when asked
    from transformers import AutoConfig, AutoModelForCausalLM  # lazy: as above

    cfg = AutoConfig.from_pretrained(hf_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


@dataclasses.dataclass(frozen=True)
class MegatronEstimate:
    """Megatron-LM's weight-and-optimizer estimate (module docstring): parameters and bytes of the most loaded
    shard."""

    params: int
    bytes_per_param: float

    @property
    def bytes(self) -> float:
        return self.params * self.bytes_per_param


def megatron_state_bytes(arch, padded_vocab: int, tp: int, pp: int, dp: int, cp: int = 1,
                         dist_opt: bool = True, bf16: bool = True) -> MegatronEstimate:
    """The estimate for ``arch`` (a ``planning.arch.ArchSpec``) at a layout (module docstring)."""
    h, a, k, d = arch.hidden, arch.heads, arch.kv_heads, arch.head_dim
    layers = 2 * arch.layers * h * h * ((1 + k / a) * (a * d / h) + (arch.ffn / h) * 1.5 + 1 / h)
    emb = h * padded_vocab
    shard = (layers / pp + emb) / tp
    if not arch.tied and pp == 1:
        shard += emb / tp
    fixed, sharded = (6, 12) if bf16 else (8, 8)
    per = fixed + sharded / (dp * cp) if dist_opt else fixed + sharded
    return MegatronEstimate(int(round(shard)), per)
