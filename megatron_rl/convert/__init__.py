"""HF <-> Megatron conversion.

Name maps (``name_maps.py``) are the single source of truth for Megatron <-> HF names; QKV grouping
and gate/up fusion are the named transforms of ``transforms.py``.

Live models (collective when torch.distributed is up):
    ``load_hf_into_model(model_chunks, hf_dir, parallel_info=None)`` fill this rank's shard
    ``iter_hf_tensors(model_chunks, hf_cfg)`` -> ``(hf_name, full tensor)`` on every rank
    ``stream_hf_tensors(model_chunks, hf_cfg, sender=0)`` -> the same, on the weight-sync sender only
    ``hf_tensor_meta(hf_cfg, dtype)`` -> ``(hf_name, dtype, shape)`` of that stream (no gather)
    ``export_hf(model_chunks, hf_cfg, out_dir, force=True, tokenizer_dir=None, dtype=None)`` (rank 0
    writes, tensor by tensor from ``stream_hf_tensors``)
Offline (``megatron-rl convert ...``):
    ``hf_to_mcore(hf_dir, out_dir, tp, pp, force, engine="stream")`` / ``mcore_to_hf(ckpt_dir, out_dir, force, dtype=None)``
    The default streaming engine builds no model: ``config_json`` (shape facts) -> ``mcore_layout``
    (the dist-checkpoint chunks) -> ``dcp_writer`` (byte copies from ``safetensors_index``), driven
    by ``stream.py``; ``engine="model"`` is the model-building reference. ``mcore_to_hf`` is the
    reverse stream: ``dcp_reader`` (chunks of any TP/PP) -> ``export.py`` -> ``hf_io.HFWriter``.
    Both keep the weights' dtype.
"""
from megatron_rl.convert.live import export_hf, hf_tensor_meta, iter_hf_tensors, load_hf_into_model, stream_hf_tensors

__all__ = ["export_hf", "hf_tensor_meta", "iter_hf_tensors", "stream_hf_tensors", "load_hf_into_model", "hf_to_mcore", "mcore_to_hf"]


def hf_to_mcore(*args, **kwargs):
    from megatron_rl.convert.checkpoints import hf_to_mcore as f  # lazy: defers torch.distributed.checkpoint (and sympy) to the call

    return f(*args, **kwargs)


def mcore_to_hf(*args, **kwargs):
    from megatron_rl.convert.checkpoints import mcore_to_hf as f  # lazy: defers torch.distributed.checkpoint (and sympy) to the call

    return f(*args, **kwargs)
