"""Provider: HF config -> TransformerConfig mapping for the supported architectures, bad input."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.models import provider as P


def _cfg(arch="Qwen3ForCausalLM", **kw):
    base = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=256, architectures=[arch])
    mt = {"Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}.get(arch, "llama")
    base.update(kw)
    return P.load_hf_config({"model_type": mt, **base})


@pytest.mark.parametrize("arch,qkv_bias,qk_norm", [("LlamaForCausalLM", False, False),
                                                   ("Qwen2ForCausalLM", True, False),
                                                   ("Qwen3ForCausalLM", False, True)])
def test_transformer_config_mapping(arch, qkv_bias, qk_norm):
    c = P.transformer_config_from_hf(_cfg(arch, head_dim=32), tp=1, pp=1)
    assert c.add_qkv_bias is qkv_bias and c.qk_layernorm is qk_norm
    assert c.kv_channels == 32  # head_dim != hidden / heads (16): kv_channels must follow head_dim
    assert c.num_query_groups == 2 and c.layernorm_epsilon == 1e-6 and c.gated_linear_unit
    assert c.hidden_dropout == 0 and c.attention_dropout == 0 and not c.add_bias_linear


def test_llama3_rope_scaling_is_read():
    a = P.model_arch_info(_cfg("LlamaForCausalLM", rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                               rope_theta=500000.0))
    assert a.rope_scaling["factor"] == 8.0 and a.rope_theta == 500000.0
    inv = 1.0 / (500000.0 ** (torch.arange(0, 16, 2).float() / 16))
    out = P.llama3_inv_freq(inv, **a.rope_scaling)
    # highest frequency (short wavelength) unchanged; lowest frequency divided by the factor
    assert torch.isclose(out[0], inv[0]) and torch.isclose(out[-1], inv[-1] / 8.0)


def test_tied_and_vocab_padding():
    a = P.model_arch_info(_cfg(tie_word_embeddings=True))
    assert a.tied_embeddings
    assert P.padded_vocab_size(a, 1) == 128 and P.padded_vocab_size(a, 2) == 256


@pytest.mark.parametrize("kw,tp,pp,msg", [({}, 3, 1, "num_attention_heads=4 is not divisible"),
                                          ({}, 1, 3, "num_hidden_layers=4 is not divisible"),
                                          ({"num_key_value_heads": 1}, 2, 1, "num_key_value_heads=1")])
def test_layout_errors(kw, tp, pp, msg):
    with pytest.raises(ValueError, match=msg):
        P.validate_layout(_cfg(**kw), tp, pp)


def test_unsupported_architecture_names_supported():
    with pytest.raises(ValueError, match="supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"):
        P.load_hf_config({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})


def test_te_backend_fails_clearly_without_te():
    with pytest.raises(ValueError, match="Transformer Engine"):
        P.layer_spec(_cfg(), "te")
    with pytest.raises(ValueError, match="fp8 needs a CUDA GPU"):
        P.transformer_config_from_hf(_cfg(), fp8="e4m3")


def test_te_detection_is_strict():
    """TE counts as present only when its torch extension imports (``transformer_engine.pytorch``);
    here it is not installed, and the reason is named."""
    import importlib.util

    err = P.te_import_error()
    if importlib.util.find_spec("transformer_engine") is None:
        assert err is not None and "transformer_engine" in err
    assert P.resolve_backend("auto") == "local"     # CPU: always the local spec


@pytest.mark.parametrize("backend,cuda,te,sp,expect", [
    ("auto", True, True, True, "te"), ("auto", True, False, False, "local"), ("auto", False, True, True, "local"),
    ("auto", True, False, True, "parallel.sequence_parallel=true on CUDA needs the Transformer Engine layer spec"),
    ("local", True, True, True, "parallel.sequence_parallel=true on CUDA needs the Transformer Engine layer spec"),
    ("local", False, False, True, "local"),          # CPU: the cpu_megatron_norm_sp patch makes it exact
    ("te", False, True, False, "model.backend=te needs a CUDA GPU"),
])
def test_backend_never_resolves_to_a_spec_that_cannot_run(backend, cuda, te, sp, expect):
    if expect in ("te", "local"):
        assert P.resolve_model_backend(backend, None, sp, cuda=cuda, te=te) == expect
    else:
        with pytest.raises(ValueError, match=expect) as e:
            P.resolve_model_backend(backend, None, sp, cuda=cuda, te=te)
        assert "\n" not in str(e.value)


def test_cuda_fusions_follow_device_and_backend():
    assert not any(P.cuda_fusions("local", cuda=False).values())
    assert P.cuda_fusions("local", cuda=True) == {"bias_activation_fusion": True, "apply_rope_fusion": False,
                                                  "gradient_accumulation_fusion": False}
    assert all(P.cuda_fusions("te", cuda=True, wgrad_ext=True).values())
    assert P.cuda_fusions("te", cuda=True, wgrad_ext=False)["gradient_accumulation_fusion"] is False   # no apex
    cfg = P.transformer_config_from_hf(_cfg())
    assert cfg.use_cpu_initialization is True and cfg.bias_activation_fusion is False   # CPU build
