"""Worker: packed teacher passes (trainer/paths/teacher/support.teacher_pass) equal direct single-sequence
computations of the same conditioned inputs, for several samples and every K = 1..4.

Usage: torchrun --nproc_per_node=N teacher_pass.py HF_DIR TP:PP [TP:PP ...]
The layouts run in turn in this process tree (megatron's groups destroyed and rebuilt between
them; one launch per world size instead of one per layout saves the torch + megatron imports);
rank 0 prints ``CASE tp=.. pp=..`` before a layout and ``OK`` after it passed.
The reference log-probs / top-k are computed one unpacked sequence at a time at θ0; then the live
weights are perturbed and the packed pass runs under the snapshot teacher (θ̄ = θ0): equal to
1e-5 in fp32, and the live weights must be back afterwards.

Multi-turn responses (``pack(masks=...)``, docs/multi-turn.md): the teacher reads (teacher prompt ++ the whole
response: policy turns and tool turns) and scores the policy's tokens only; oracle: HF transformers (eager, fp32,
the checkpoint θ0 is) scoring the same ids, at the policy positions (token log-prob, top-k ids and values,
entropy), 0 at the tool positions; and RLSD's registered loss on those teacher log-probs equals its formula
written out over the policy tokens.
"""
from __future__ import annotations

import sys

import torch

from megatron_rl.trainer.paths.teacher.inputs import pack
from megatron_rl.trainer.paths.teacher.support import teacher_pass
from megatron_rl.trainer.paths.teacher.weights import TeacherWeights
from megatron_rl.trainer.pipeline.batch import make_batch
from tests.helpers.actor_common import VOCAB, build_actor

TOL = 1e-5
TOPK = 5


def main(hf: str, tp: int, pp: int) -> None:
    if torch.distributed.is_initialized() and torch.distributed.get_rank() == 0:
        print(f"CASE tp={tp} pp={pp}", flush=True)
    actor = build_actor(hf, tp, pp)
    g = torch.Generator().manual_seed(3)
    # 4 samples; sample j has K = j + 1 negatives -> K + 1 teacher prompts of different lengths
    seqs, max_resp = [], 6
    for j in range(4):
        resp = torch.randint(1, VOCAB, (int(torch.randint(2, max_resp + 1, (1,), generator=g)),), generator=g).tolist()
        for slot in range(j + 2):
            plen = int(torch.randint(3, 12, (1,), generator=g))
            seqs.append((torch.randint(1, VOCAB, (plen,), generator=g).tolist(), resp))
    # reference: each sequence alone (plain causal mask), current weights θ0
    ref_lp, ref_idx, ref_top = [], [], []
    for p, r in seqs:
        b = make_batch([p], [r], pad_id=0)
        out = actor.forward_support(b, 1, k=TOPK)
        cols = torch.arange(len(p) - 1, len(p) - 1 + len(r))
        ref_lp.append(out["token_logp"][0, cols])
        ref_idx.append(out["idx"][0, cols])
        ref_top.append(out["logp"][0, cols])
    teacher = TeacherWeights(actor, "snapshot", sync_interval=1000)
    params = [p for m in actor.bare_models() for p in m.parameters()]
    with torch.no_grad():
        for p in params:
            p.add_(0.05 * torch.randn_like(p))
    live = [p.detach().clone() for p in params]
    pk = pack(seqs, max_resp, pad_id=0, row_len=40, multiple=8 * tp)
    assert pk.batch.num_samples < len(seqs), "packing must put several sequences in a row"
    top = teacher_pass(actor, teacher, pk, dp=actor.groups.dp_size, mbs=2, k=TOPK)
    worst = worst_top = 0.0
    for m, (p, r) in enumerate(seqs):
        n = len(r)
        worst = max(worst, float((top["token_logp"][m, :n] - ref_lp[m]).abs().max()))
        assert torch.equal(top["idx"][m, :n], ref_idx[m]), f"seq {m}: top-k ids differ"
        worst_top = max(worst_top, float((top["logp"][m, :n] - ref_top[m]).abs().max()))
        assert float(pk.resp_mask[m, n:].sum()) == 0
    # gather mode at given ids (the sdpo/srpo/opsd_ectr path) equals the top-k values there
    gat = teacher_pass(actor, teacher, pk, dp=actor.groups.dp_size, mbs=2, index=top["idx"])
    worst_g = max(float((gat["logp"][m, :len(r)] - ref_top[m]).abs().max()) for m, (_, r) in enumerate(seqs))
    # teacher.pack=off (one sequence per row, plain causal mask: the Transformer Engine path)
    flat = teacher_pass(actor, teacher, pack(seqs, max_resp, pad_id=0, row_len=40, multiple=8 * tp, packed=False),
                        dp=actor.groups.dp_size, mbs=2)
    worst_u = max(float((flat["token_logp"][m, :len(r)] - ref_lp[m]).abs().max()) for m, (_, r) in enumerate(seqs))
    assert worst_u < TOL, worst_u
    assert all(torch.equal(a, b) for a, b in zip(live, params)), "live weights not restored after the teacher pass"
    assert max(worst, worst_top, worst_g) < TOL, (worst, worst_top, worst_g)
    worst_hf = masked_against_hf(actor, teacher, hf, tp)
    assert worst_hf < 1e-4, worst_hf
    if torch.distributed.get_rank() == 0:
        print(f"tp={tp} pp={pp}: {len(seqs)} teacher sequences in {pk.batch.num_samples} rows, pad_frac "
              f"{pk.pad_frac:.3f}; max |Δ| token {worst:.2e}, top-k {worst_top:.2e}, gather {worst_g:.2e}; "
              f"multi-turn vs HF {worst_hf:.2e}")
        print("OK", flush=True)


def _hf_model(hf_dir: str):
    """The checkpoint in HF transformers (eager attention, fp32), its safetensors loaded explicitly (the
    rotary buffer is rebuilt by ``from_config``)."""
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(hf_dir)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).float()
    sd = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        sd.update(load_file(str(f)))
    model.load_state_dict(sd, strict=True)
    return model.eval()


def _hf_logsoftmax(model, prompt: list[int], resp: list[int], temperature: float) -> torch.Tensor:
    """HF's log-softmax ``[len(resp), V]`` of the targets of ``prompt ++ resp`` (each response token's)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + resp])).logits[0].double() / temperature
    return torch.log_softmax(logits[len(prompt) - 1:len(prompt) - 1 + len(resp)], -1)


def masked_against_hf(actor, teacher, hf: str, tp: int) -> float:
    """Multi-turn teacher sequences (policy turn, tool turn, policy turn) scored on the policy's tokens under
    θ̄ = θ0: equal to HF's scoring of (teacher prompt ++ full response) there, 0 at the tool tokens; RLSD's
    loss on them equals the formula over the policy tokens. Returns the largest |Δ| log-prob."""
    from megatron_rl.algorithms import AlgoInputs, RLSDHParams, compute_policy_loss

    g = torch.Generator().manual_seed(11)
    seqs, masks, students = [], [], []
    for j, segs in enumerate([(3, 4, 2), (2, 3, 4), (5,)]):        # policy / tool / policy token counts
        resp, m = [], []
        for s, n in enumerate(segs):
            resp += torch.randint(1, VOCAB, (n,), generator=g).tolist()
            m += [1 - s % 2] * n
        seqs.append((torch.randint(1, VOCAB, (5 + 2 * j,), generator=g).tolist(), resp))    # privileged context
        students.append(torch.randint(1, VOCAB, (3,), generator=g).tolist())                  # the policy's prompt
        masks.append(torch.tensor(m))
    max_resp = 10
    pk = pack(seqs, max_resp, pad_id=0, row_len=40, multiple=8 * tp, masks=masks)
    out = teacher_pass(actor, teacher, pk, dp=actor.groups.dp_size, mbs=2, k=TOPK)
    model, temp = _hf_model(hf), actor.temperature
    worst = 0.0
    n = len(seqs)
    x = {k: torch.zeros(n, max_resp, dtype=torch.float64) for k in ("teacher_logp", "logp", "mask")}
    for m, ((p, r), mk) in enumerate(zip(seqs, masks)):
        on, k = mk > 0, len(r)
        assert torch.equal(pk.resp_mask[m, :k], on.float()) and float(pk.resp_mask[m, k:].sum()) == 0
        ref = _hf_logsoftmax(model, p, r, temp)
        ref_tok = ref.gather(-1, torch.tensor(r)[:, None])[:, 0]
        worst = max(worst, float((out["token_logp"][m, :k][on] - ref_tok[on]).abs().max()),
                    float((out["entropy"][m, :k][on] + (ref.exp() * ref).sum(-1)[on]).abs().max()))
        ref_idx = torch.sort(ref, dim=-1, descending=True, stable=True).indices[:, :TOPK]
        assert torch.equal(out["idx"][m, :k][on], ref_idx[on]), f"multi-turn seq {m}: top-k ids differ from HF"
        worst = max(worst, float((out["logp"][m, :k][on] - ref.gather(-1, ref_idx)[on]).abs().max()))
        for name in ("token_logp", "entropy", "logp", "idx"):      # a tool token is context, never scored
            assert not out[name][m, :k][~on].any(), f"multi-turn seq {m}: {name} at a tool token"
        x["teacher_logp"][m, :k] = out["token_logp"][m, :k].double()
        x["logp"][m, :k] = _hf_logsoftmax(model, students[m], r, temp).gather(-1, torch.tensor(r)[:, None])[:, 0]
        x["mask"][m, :k] = on.double()
    hp, adv = RLSDHParams(), torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)
    x.update(old_logp=x["logp"].clone(), rewards=torch.zeros(n, dtype=torch.float64), group_ids=torch.arange(n))
    got = compute_policy_loss("rlsd", AlgoInputs(**x), adv, hp).loss
    # ratio 1 (old = logp): ℓ_t = −Â_t, Â_t = A((1−λ) + λ·clip(exp(sign(A)(ℓT_t − lp_t)), 1 ± ε_w)); token mean
    w = torch.clamp(torch.exp(torch.sign(adv)[:, None] * (x["teacher_logp"] - x["logp"])), 1 - hp.eps_w, 1 + hp.eps_w)
    a_hat = adv[:, None] * ((1 - hp.lam) + hp.lam * w)
    want = (-a_hat * x["mask"]).sum() / x["mask"].sum()
    assert abs(float(got) - float(want)) < 1e-12, (float(got), float(want))
    return worst


if __name__ == "__main__":
    from megatron_rl.runtime.parallel import destroy_parallel, init_distributed

    init_distributed()
    for case in sys.argv[2:]:
        tp, pp = map(int, case.split(":"))
        main(sys.argv[1], tp, pp)
        destroy_parallel()
