"""Worker: load an HF checkpoint into Megatron at (tp, pp) — directly from safetensors, or from a
Megatron dist checkpoint — and compare logits / final hidden states with HF reference outputs;
also check the gathered HF tensors are bit-identical to the files. Prints one JSON line (rank 0)."""
import json
import sys

import torch
import torch.distributed as dist


def forward(model, ids, info):
    from megatron.core import parallel_state as ps

    b, s = ids.shape
    pos = torch.arange(s)[None].expand(b, -1)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)[None, None]
    captured = {}
    if info.is_last_stage:
        model.decoder.final_layernorm.register_forward_hook(lambda m, i, o: captured.setdefault("h", o))
    if info.pp > 1 and not info.is_first_stage:
        buf = torch.empty(s, b, model.config.hidden_size)
        dist.recv(buf, src=dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group())[info.pp_rank - 1])
        model.set_input_tensor(buf)
    out = model(ids, pos, mask)
    if info.pp > 1 and not info.is_last_stage:
        dist.send(out.contiguous(), dst=dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group())[info.pp_rank + 1])
        return None, None
    if info.tp > 1:
        parts = [torch.empty_like(out) for _ in range(info.tp)]
        dist.all_gather(parts, out.contiguous(), group=ps.get_tensor_model_parallel_group())
        out = torch.cat(parts, -1)
    return out, captured["h"].transpose(0, 1)


def main():
    mode, hf_dir, ref_path, tp, pp = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    from safetensors.torch import load_file

    from megatron_rl.convert import iter_hf_tensors, load_hf_into_model
    from megatron_rl.models.provider import build_gpt_model, load_hf_config
    from megatron_rl.parallel import init_parallel

    info = init_parallel(tp, pp, seed=0)
    cfg = load_hf_config(hf_dir)
    model = build_gpt_model(cfg).eval()
    if mode == "hf":
        load_hf_into_model([model], hf_dir, info)
    else:  # a Megatron dist checkpoint written at another layout
        from megatron.core import dist_checkpointing

        st = dist_checkpointing.load({"model": model.sharded_state_dict(prefix="")}, sys.argv[6] + "/dist")
        model.load_state_dict(st["model"], strict=True)
    ref = torch.load(ref_path)
    with torch.no_grad():
        logits, hidden = forward(model, ref["ids"], info)
    res = {}
    if logits is not None:
        v = ref["logits"].shape[-1]
        res["logit_max_diff"] = float((logits[..., :v] - ref["logits"]).abs().max())
        res["hidden_max_diff"] = float((hidden - ref["hidden"]).abs().max())
        res["logit_scale"] = float(ref["logits"].abs().max())
    files = {}
    for f in __import__("pathlib").Path(hf_dir).glob("*.safetensors"):
        files.update(load_file(str(f)))
    bad = [n for n, t in iter_hf_tensors([model], cfg) if n in files and not torch.equal(t, files[n])]
    seen = {n for n, _ in iter_hf_tensors([model], cfg)}
    res["roundtrip_mismatch"] = bad
    res["roundtrip_missing"] = sorted(set(files) - seen - ({"lm_head.weight"} if cfg.tie_word_embeddings else set()))
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, res)
    if dist.get_rank() == 0:
        merged = {}
        for r in out:
            merged.update({k: v for k, v in r.items() if v is not None})
        print("RESULT " + json.dumps(merged), flush=True)


if __name__ == "__main__":
    main()
