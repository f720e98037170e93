"""RLCSD teacher-pass cost vs one policy forward on the same response tokens, and padding.

Run:  python benchmarks/bench_teacher_pass.py [--prompts 16] [--group 8] [--k 4] [--hidden 256]

One process, TP=1, a random Qwen3-style model (built from a config, no download) in the real
Megatron actor. A synthetic step: ``prompts x group`` rollouts with prompt lengths 24..64 and
response lengths 8..96 tokens (uniform), every target with K negative hints + 1 positive, each
teacher prompt = the student prompt + a 40-token reference-solution scaffold + the hint rollout
(the spec's template shape: problem, framing, hint body, answer line, instruction).

Measured in the same run: one warm-up of every pass, then ``--repeats`` rounds, each running the
three passes in turn (so load on a shared machine hits all three alike); the medians are reported,
wall-clock and CPU time of this process (``time.process_time``, all its threads):

* ``policy``: ``actor.forward_logprobs`` of the plain batch (prompt ++ response, right-padded to
  the longest, the trainer's log-prob pass) — the baseline, ratio 1;
* ``teacher packed``: the K+1 teacher sequences of every target, laid out by
  ``trainer/paths/teacher/inputs.pack`` (rows of at most ``--pack-len`` tokens, block-diagonal attention;
  the layout of least estimated cost for the model's ``attention_crossover`` and micro-batches of
  the policy pass's token count) and run by ``support.teacher_pass`` under snapshot weights; ``row
  len`` is the widest row, ``pad frac`` counts the slots of the width-trimmed micro-batches;
* ``teacher naive``: the same sequences one per row, right-padded to the longest (no packing);
* ``policy packed`` (for reference, not the goal's baseline): the policy pass with a token budget of
  the padded pass's slots per micro-batch (``trainer.max_tokens_per_micro_batch``), and the teacher
  sequences' tokens over the policy's (printed); the goal keeps the padded baseline it was written against.

Printed: seconds, ratio to the policy forward, rows, and padding fraction (padded slots / all
slots). Goal (issue): packed ratio <= K+1 with < 10 % padding, checked on both clocks.

On a shared machine run it with ``OMP_NUM_THREADS=1``: two OpenMP threads that keep losing their core
to other work spin at every barrier, which inflates small micro-batches' wall and CPU time alike
(the policy pass: 13 s wall for 3.3 s of single-thread work at load average 10-70).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")


def _model(out: str, hidden: int, layers: int, vocab: int) -> str:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128), head_dim=64,
                      max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(out)
    return out


def _rounds(passes: dict, repeats: int) -> dict[str, tuple[float, float]]:
    """name -> (median wall s, median CPU s) over ``repeats`` interleaved rounds after one warm-up."""
    for fn in passes.values():
        fn()
    wall, cpu = {n: [] for n in passes}, {n: [] for n in passes}
    for _ in range(repeats):
        for n, fn in passes.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[n].append(time.perf_counter() - w0)
            cpu[n].append(time.process_time() - c0)
    return {n: (statistics.median(wall[n]), statistics.median(cpu[n])) for n in passes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--pack-len", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import tempfile

    import torch

    from megatron_rl.models.provider import load_hf_config
    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.trainer.policy.actor import PolicyActor
    from megatron_rl.trainer.pipeline.batch import make_batch
    from megatron_rl.trainer.policy.optim import OptimSpec
    from megatron_rl.trainer.pipeline.packing import TokenBudget, plan, seq_lengths
    from megatron_rl.trainer.paths.teacher.inputs import attention_crossover, pack
    from megatron_rl.trainer.paths.teacher.support import teacher_pass
    from megatron_rl.trainer.paths.teacher.weights import TeacherWeights

    rng = random.Random(0)
    tmp = tempfile.mkdtemp()
    hf = _model(tmp, args.hidden, args.layers, args.vocab)
    info = init_parallel(1, 1, seed=0)
    actor = PolicyActor(load_hf_config(hf), info, OptimSpec(lr=1e-5))
    actor.load_hf(hf)
    teacher = TeacherWeights(actor, "snapshot")
    tok = lambda n: [rng.randrange(4, args.vocab) for _ in range(n)]
    prompts, responses = [], []
    for _ in range(args.prompts):
        p = tok(rng.randint(24, 64))
        for _ in range(args.group):
            prompts.append(p)
            responses.append(tok(rng.randint(8, 96)))
    scaffold = tok(40)
    seqs = []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        g0 = (i // args.group) * args.group
        sib = [j for j in range(g0, g0 + args.group) if j != i]
        for j in rng.sample(sib, args.k + 1):          # 1 positive + K negatives
            seqs.append((p + scaffold + responses[j], r))
    max_resp = max(len(r) for r in responses)
    mbs = args.micro_batch

    plain = make_batch(prompts, responses, pad_id=0)
    resp_tokens = sum(len(r) for r in responses)
    pol_pad = 1 - sum(len(p) + len(r) for p, r in zip(prompts, responses)) / plain.tokens.numel()

    attn = attention_crossover(load_hf_config(hf))
    pk = pack(seqs, max_resp, pad_id=0, row_len=args.pack_len, attn_len=attn)
    t_mbs = max(1, mbs * plain.seq_len // pk.batch.seq_len)      # the policy pass's tokens per micro-batch
    pk = pack(seqs, max_resp, pad_id=0, row_len=args.pack_len, attn_len=attn, group_rows=t_mbs)
    longest = max(len(p) + len(r) for p, r in seqs)
    naive_rows = len(seqs)
    naive_pad = 1 - sum(len(p) + len(r) for p, r in seqs) / (naive_rows * longest)
    naive_batch = make_batch([p for p, _ in seqs], [r for _, r in seqs], pad_id=0)
    budget = TokenBudget(mbs * plain.seq_len)                    # the same slots per micro-batch, packed
    pol_plan = plan(seq_lengths(plain), budget, 1)
    t = _rounds({"policy": lambda: actor.forward_logprobs(plain, mbs),
                 "policy_packed": lambda: actor.forward_logprobs(plain, budget),
                 "packed": lambda: teacher_pass(actor, teacher, pk, dp=1, mbs=t_mbs),
                 "naive": lambda: actor.forward_logprobs(naive_batch, mbs)}, args.repeats)
    (t_policy, c_policy), (t_packed, c_packed), (t_naive, c_naive) = t["policy"], t["packed"], t["naive"]
    print(f"model: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}; {len(prompts)} rollouts "
          f"({resp_tokens} response tokens), K={args.k} -> {len(seqs)} teacher sequences")
    print(f"medians of {args.repeats} rounds; wall = seconds, cpu = CPU seconds of this process")
    print(f"{'pass':<16}{'wall':>8}{'x policy':>10}{'cpu':>8}{'x policy':>10}{'rows':>7}{'row len':>9}{'pad frac':>10}")
    for name, (w, c), rows, width, pad in (
            ("policy", (t_policy, c_policy), plain.num_samples, plain.seq_len, pol_pad),
            ("teacher packed", (t_packed, c_packed), pk.batch.num_samples, pk.batch.seq_len, pk.pad_frac),
            ("teacher naive", (t_naive, c_naive), naive_rows, longest, naive_pad),
            ("policy packed", t["policy_packed"], sum(len(mb) for mb in pol_plan.ranks[0]), pol_plan.row_len,
             pol_plan.pad_frac())):
        print(f"{name:<16}{w:>8.3f}{w / t_policy:>10.2f}{c:>8.3f}{c / c_policy:>10.2f}{rows:>7}{width:>9}{pad:>10.3f}")
    pol_tokens = sum(len(p) + len(r) for p, r in zip(prompts, responses))
    print(f"teacher tokens / policy tokens: {pk.real_tokens / pol_tokens:.2f}; "
          f"packed teacher / packed policy (wall): {t_packed / t['policy_packed'][0]:.2f}")
    for clock, ratio in (("wall", t_packed / t_policy), ("cpu", c_packed / c_policy)):
        ok = ratio <= args.k + 1 and pk.pad_frac < 0.10
        print(f"goal ({clock}): packed <= K+1 = {args.k + 1}x policy with < 10% padding: {'met' if ok else 'NOT met'}")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
