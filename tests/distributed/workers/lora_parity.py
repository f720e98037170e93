"""Worker: the Megatron LoRA side of the PEFT oracle (``tests/unit/models/test_lora_peft.py`` runs it as a plain
process at TP=1, ``tests/distributed/test_lora.py`` under torchrun at TP=2, with and without sequence parallelism).

Usage: lora_parity.py HF_DIR PEFT_DIR REF_PT OUT_DIR TP SP

Builds the tiny model with adapters (``models/lora.py``), loads the base from HF_DIR and the adapters from the
PEFT adapter PEFT_DIR, then on the ids and loss weights of REF_PT: logits with adapters on and off, the adapters'
gradients of ``Σ logits · w``, and the PEFT and merged exports. Rank 0 writes OUT_DIR/res.pt, OUT_DIR/peft,
OUT_DIR/merged.
"""
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def logits_of(model, ids, tp):
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

    b, s = ids.shape
    pos = torch.arange(s)[None].expand(b, -1)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)[None, None]
    out = model(ids, pos, mask)               # [b, s, V/tp]
    return gather_from_tensor_model_parallel_region(out) if tp > 1 else out


def main(hf_dir, peft_dir, ref_pt, out_dir, tp, sp):
    from megatron_rl.convert.live import export_hf, load_hf_into_model
    from megatron_rl.convert.peft_adapter import export_peft, gather_adapters, load_adapters, read_peft
    from megatron_rl.models.lora import LoraSpec, adapters_disabled, freeze_base
    from megatron_rl.models.provider import build_gpt_model, load_hf_config, transformer_config_from_hf
    from megatron_rl.runtime.parallel import destroy_parallel, init_parallel

    info = init_parallel(tp, 1, seed=0, sequence_parallel=sp)
    cfg = load_hf_config(hf_dir)
    conf, tensors = read_peft(peft_dir)
    lora = LoraSpec(conf["r"], float(conf["lora_alpha"]), tuple(sorted(conf["target_modules"])))
    tc = transformer_config_from_hf(cfg, tp=tp, sequence_parallel=sp, perform_initialization=False)
    model = build_gpt_model(cfg, tc, backend="local", lora=lora)
    load_hf_into_model([model], hf_dir)
    load_adapters([model], tensors)
    trainable = freeze_base(model)
    ref = torch.load(ref_pt)
    ids, w = ref["ids"], ref["w"]
    v = w.shape[-1]
    with torch.no_grad(), adapters_disabled([model]):
        base = logits_of(model, ids, tp)[..., :v].clone()
    logits = logits_of(model, ids, tp)[..., :v]
    (logits * w).sum().backward()
    grads = gather_adapters([model], grad=True)
    frozen_grads = [n for n, p in model.named_parameters() if not p.requires_grad and p.grad is not None]
    out = Path(out_dir)
    export_peft([model], lora, out / "peft", base_model=str(hf_dir))
    export_hf([model], cfg, out / "merged")
    if info.rank == 0:
        torch.save({"logits": logits.detach(), "base": base, "grads": grads, "trainable": trainable,
                    "frozen_grads": frozen_grads}, out / "res.pt")
    destroy_parallel(process_group=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], a[3], int(a[4]), a[5] == "1")
    if dist.is_initialized():
        dist.destroy_process_group()
