"""Worker: run a plan of conversion cases in ONE process tree (torchrun, or a plain process).

Usage: convert_parity.py PLAN_JSON OUT_JSON

PLAN_JSON is a list of steps, each ``{"key": .., "op": ..}``:

* ``op="parity"``: load an HF checkpoint into Megatron at (tp, pp) — directly from safetensors
  (``mode="hf"``) or from a Megatron dist checkpoint written at another layout (``mode="mcore"``,
  ``ckpt``) — and compare logits / final hidden states with the HF reference outputs (``ref``);
  also check the gathered HF tensors are bit-identical to the files. Megatron's model-parallel
  groups are built for the case and destroyed after it (``destroy_parallel``), as a trainer
  switching layouts would; TP=1/PP=1 in a 2-rank world is DP=2 (every rank holds the whole model).
* ``op="convert"``: ``megatron-rl convert`` (``megatron_rl.convert.cli.main``, what
  ``tools/convert/*.py`` call) with ``argv``; under torchrun every rank takes part.

One launch instead of one per case: each launch costs seconds of imports (torch, megatron) per rank.
Rank 0 writes ``{key: result}`` to OUT_JSON (a convert step's result is its exit code).
"""
import json
import os
import sys
from pathlib import Path

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


def parity(step: dict) -> dict | None:
    """One load-and-compare case; the merged result on rank 0 (None elsewhere)."""
    from safetensors.torch import load_file

    from megatron_rl.convert import iter_hf_tensors, load_hf_into_model
    from megatron_rl.models.provider import build_gpt_model, load_hf_config
    from megatron_rl.runtime.parallel import destroy_parallel, init_parallel

    hf_dir, tp, pp = step["hf"], int(step["tp"]), int(step["pp"])
    info = init_parallel(tp, pp, seed=0)
    cfg = load_hf_config(hf_dir)
    model = build_gpt_model(cfg).eval()
    if step["mode"] == "hf":
        load_hf_into_model([model], hf_dir, info)
    else:  # a Megatron dist checkpoint written at another layout
        from megatron.core import dist_checkpointing

        st = dist_checkpointing.load({"model": model.sharded_state_dict(prefix="")}, step["ckpt"] + "/dist")
        model.load_state_dict(st["model"], strict=True)
    ref = torch.load(step["ref"])
    with torch.no_grad():
        logits, hidden = forward(model, ref["ids"], info)
    res = {}
    if logits is not None:
        v = ref["logits"].shape[-1]
        res["logit_max_diff"] = float((logits[..., :v] - ref["logits"]).abs().max())
        res["hidden_max_diff"] = float((hidden - ref["hidden"]).abs().max())
        res["logit_scale"] = float(ref["logits"].abs().max())
    files = {}
    for f in Path(hf_dir).glob("*.safetensors"):
        files.update(load_file(str(f)))
    bad = [n for n, t in iter_hf_tensors([model], cfg) if n in files and not torch.equal(t, files[n])]
    seen = {n for n, _ in iter_hf_tensors([model], cfg)}
    res["roundtrip_mismatch"] = bad
    res["roundtrip_missing"] = sorted(set(files) - seen - ({"lm_head.weight"} if cfg.tie_word_embeddings else set()))
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, res)
    destroy_parallel()
    if dist.get_rank() != 0:
        return None
    merged = {}
    for r in out:
        merged.update({k: v for k, v in r.items() if v is not None})
    return merged


def convert(step: dict) -> int:
    from megatron_rl.convert.cli import main as cli
    from megatron_rl.runtime.parallel import destroy_parallel

    rc = cli([str(a) for a in step["argv"]])
    if rc != 0:
        raise SystemExit(f"{step['key']}: megatron-rl convert {step['argv']} exited {rc}")
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        destroy_parallel()
    return rc


def main():
    plan, out_path = json.loads(Path(sys.argv[1]).read_text()), sys.argv[2]
    if "RANK" in os.environ:  # under torchrun: one process group for every step
        from megatron_rl.runtime.parallel import init_distributed

        init_distributed()
    results = {}
    for step in plan:
        results[step["key"]] = parity(step) if step["op"] == "parity" else convert(step)
        print(f"done {step['key']}", flush=True)
    if not dist.is_initialized() or dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps(results))
    if dist.is_initialized():   # every rank leaves the last collective, then tears gloo down itself: left to the
        dist.barrier()          # interpreter's exit, a rank's gloo pairs could close under a peer's reading thread
        dist.destroy_process_group()   # ("terminate called without an active exception", rank 0 aborted, under load)


if __name__ == "__main__":
    main()
