"""Model provider: HF config -> Megatron TransformerConfig, layer spec and GPTModel.

Public: :data:`provider.SUPPORTED_ARCHITECTURES`, :func:`provider.load_hf_config`,
:func:`provider.model_arch_info`, :func:`provider.validate_layout`,
:func:`provider.transformer_config_from_hf`, :func:`provider.layer_spec`,
:func:`provider.build_gpt_model`, :func:`provider.padded_vocab_size`.
"""
