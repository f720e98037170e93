"""`megatron-rl plan`: parameter counts vs real HF / Megatron models, closed-form memory terms, errors."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from megatron_rl.cli.plan import add_arguments, format_report
from megatron_rl.planning.arch import PRESETS, ArchSpec, load_arch
from megatron_rl.planning.memory import GIB, PlanInputs, estimate, fits, padded_vocab, params_per_gpu

TINY = {  # hidden 64, 2 layers, GQA 4/2, head_dim 16, vocab 256 (a multiple of 128: no padding)
    "Qwen3ForCausalLM": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                             vocab_size=256, tie_word_embeddings=False),
    "Qwen2ForCausalLM": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                             vocab_size=256, tie_word_embeddings=True),
    "LlamaForCausalLM": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=1, intermediate_size=96,
                             vocab_size=256, tie_word_embeddings=False),
}


@pytest.mark.parametrize("arch", sorted(TINY))
def test_total_params_match_transformers(arch):
    import transformers

    cfg_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    model = getattr(transformers, arch)(cfg_cls(**{k: v for k, v in TINY[arch].items() if k not in ("architectures", "model_type")}))
    expected = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert ArchSpec.from_hf(TINY[arch], arch).total_params() == expected


@pytest.mark.parametrize("name,billions", [("qwen3-8b", 8.191), ("llama3.1-8b", 8.030), ("qwen2.5-14b", 14.770),
                                           ("qwen2.5-7b", 7.616), ("qwen3-4b", 4.022)])
def test_presets_match_published_sizes(name, billions):
    # published model-card sizes: Qwen3-8B 8.2B, Llama-3.1-8B 8.03B, Qwen2.5-14B 14.7B, Qwen2.5-7B 7.61B, Qwen3-4B 4.0B
    assert load_arch(name).total_params() / 1e9 == pytest.approx(billions, abs=5e-4)


MEGATRON_COUNT = textwrap.dedent("""
    import json, sys, warnings
    warnings.filterwarnings("ignore")
    from megatron_rl.runtime.parallel import init_parallel
    init_parallel(tp=1, pp=1, seed=1)
    from megatron_rl.models import provider
    hf = json.loads(sys.argv[1])
    model = provider.build_gpt_model(hf)
    print("COUNT", sum(p.numel() for p in model.parameters()))
    print("PADDED", [provider.padded_vocab_size(dict(hf, vocab_size=v), tp) for v, tp in json.loads(sys.argv[2])])
""")
PAD_CASES = [(256, 1), (256, 2), (100, 1), (151936, 8), (152064, 4), (1000, 3)]


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "Qwen2ForCausalLM"])
def test_params_per_gpu_match_megatron_model_from_provider(arch):
    """Build the tiny model with the project's provider (real megatron-core, gloo, 1 rank)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", MEGATRON_COUNT, json.dumps(TINY[arch]), json.dumps(PAD_CASES)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    out = dict(line.split(" ", 1) for line in p.stdout.splitlines() if line.startswith(("COUNT", "PADDED")))
    planned = params_per_gpu(ArchSpec.from_hf(TINY[arch], arch), PlanInputs(tp=1, pp=1))
    assert planned.first_stage == planned.last_stage == int(out["COUNT"])
    assert json.loads(out["PADDED"]) == [padded_vocab(v, tp) for v, tp in PAD_CASES]


def test_tp_pp_split_closed_form():
    a = ArchSpec.from_hf(TINY["Qwen3ForCausalLM"], "tiny")
    # per layer: qkv 64*(64+2*32) + proj 64*64 + mlp 3*64*128 = 36864 sharded; norms 2*64 + qk-norm 2*16 = 160
    # TP=2: vocab padded to 256 -> embedding 256*64/2 = 8192
    c = params_per_gpu(a, PlanInputs(tp=2, pp=2))
    layer = 36864 // 2 + 160
    assert c.first_stage == 8192 + layer and c.last_stage == layer + 64 + 8192
    assert padded_vocab(151936, 8) == 152576 and padded_vocab(100, 1) == 128


def test_memory_terms_closed_form():
    a = ArchSpec.from_hf(TINY["Qwen3ForCausalLM"], "tiny")
    inp = PlanInputs(tp=1, pp=1, dp=4, micro_batch=2, seq_len=8, overhead_gib=0, rollout_seqs=3, rollout_len=10)
    r = estimate(a, inp)
    n = a.total_params()
    assert (r.weights, r.grads, r.optimizer) == (2 * n, 4 * n, 12 * n // 4)  # bf16 + fp32 grads + 12/DP
    # per token per layer, e=2: norms 2*64 + qkv-in 64 + qkv (64+64) + ctx 64 + fc1-in 64 + 3*128 = 832, and the
    # RoPE'd q, k (64 + 32) with Qwen3's q/k norms' inputs (64 + 32): 1024 -> 2048 B; once per token, the final
    # norm's and the output layer's inputs, 2 * 64 * 2 = 256 B
    assert r.activations == 16 * 2 * 2048 + 16 * 256
    # logits: the bf16 shard, its fp32 copy, z - max and exp (2 + 4 + 4 + 4 B); the output layer's bf16 wgrad
    assert r.logits == 16 * 256 * (2 + 4 + 4 + 4) + 256 * 64 * 2
    # KV: 2 (K,V) * 2 layers * 2 kv heads * 16 dim * 2 B * 3 seqs * 10 tokens
    assert r.rollout_kv == 2 * 2 * 2 * 16 * 2 * 30
    # colocated: update = train + slept engine (its overhead, 0 here); generation = resident + engine
    w, g, o = r.weights, r.grads, r.optimizer
    assert (r.update_peak, r.generation_peak) == (r.train_total, w + g + o + r.rollout_total)
    assert r.peak == max(r.train_total, w + g + o + r.rollout_total)
    for off, resident in (("optimizer", w), ("all", 0)):
        o_rep = estimate(a, dataclasses.replace(inp, offload=off))
        assert o_rep.trainer_resident == resident and o_rep.generation_peak == resident + r.rollout_total
    sep = estimate(a, dataclasses.replace(inp, colocated=False))
    assert sep.peak == max(sep.train_total, sep.rollout_total)
    with pytest.raises(ValueError, match=r"offload must be one of none\|optimizer\|all, got 'gpu'"):
        PlanInputs(offload="gpu")
    no_dist = estimate(a, PlanInputs(dp=4, dist_opt=False, overhead_gib=0))
    assert no_dist.optimizer == 12 * n
    resident = estimate(a, PlanInputs(engine_sleep=False, overhead_gib=0))
    assert resident.peak == resident.train_total + resident.rollout_weights + resident.rollout_kv


def test_token_budget_sets_the_activation_tokens():
    """A packed micro-batch of B token slots plans T = B tokens (rows x row length <= B), whatever the
    sequence length; padded plans b x s. Closed form on the tiny model (per token per layer 2048 B, once 256 B:
    test_memory_terms_closed_form)."""
    a = ArchSpec.from_hf(TINY["Qwen3ForCausalLM"], "tiny")
    packed = estimate(a, PlanInputs(max_tokens_per_micro_batch=40, seq_len=8, overhead_gib=0))
    assert packed.inputs.micro_batch_tokens == 40
    assert (packed.activations, packed.logits) == (40 * (2 * 2048 + 256), 40 * 256 * 14 + 256 * 64 * 2)
    padded = estimate(a, PlanInputs(micro_batch=5, seq_len=8, overhead_gib=0))
    assert (padded.activations, padded.logits) == (packed.activations, packed.logits)   # 5 x 8 = 40 tokens
    assert padded.inputs.micro_batch_text() == "5 x 8 (padded)"
    assert packed.inputs.micro_batch_text() == "40 tokens (packed)"
    # the budget replaces micro-batch x seq-len: a longer sequence under the same budget costs the same
    # activations (flash attention), only its rollout KV cache grows
    longer = estimate(a, PlanInputs(max_tokens_per_micro_batch=40, seq_len=40, overhead_gib=0))
    assert longer.activations == packed.activations and longer.rollout_kv == 5 * packed.rollout_kv
    # the unfused softmax term is per row of s tokens: e * heads * s / t per token per layer
    noflash = estimate(a, PlanInputs(max_tokens_per_micro_batch=40, seq_len=8, attention="local", overhead_gib=0))
    # local attention keeps 6 B per S x S element (fp32 softmax + its bf16 cast) in each of the 2 layers; one
    # layer's working set (raw scores + their fp32 copy, 6 B) comes before the logits and stays below them;
    # megatron's persistent score buffer (2 B per element of one layer) is a buffer
    assert noflash.activations == 40 * 2 * (2048 + 6 * 4 * 8) + 40 * 256
    assert noflash.buffers == 2 * 40 * 4 * 8
    # qwen3-8b, TP=4 + SP: the RLCSD recipe's 40960-token budget holds 2.2x the activations of 1 x 18432
    q = load_arch("qwen3-8b")
    big = {"tp": 4, "dp": 2, "sequence_parallel": True, "seq_len": 18432, "rollout_seqs": 16, "offload": "optimizer"}
    r_budget = estimate(q, PlanInputs(max_tokens_per_micro_batch=40960, max_model_len=40960, **big))
    r_one = estimate(q, PlanInputs(micro_batch=1, **big))
    assert r_budget.activations / r_one.activations == pytest.approx(40960 / 18432, rel=1e-6)
    # per token per layer 2 * (3h/t + (q + 2kv)/t + q/t + 2 (q + kv)/t + h/t + 3f/t) = 36864 B x 36 layers, plus
    # 2 * 2h/t once; logits 14 B x 40960 x 38016 + the wgrad 38016 x 4096 x 2; SP's gather buffer 40960 x 4096 x 2
    assert round(r_budget.activations / GIB, 2) == 50.78 and round(r_budget.logits / GIB, 2) == 20.59
    assert r_budget.buffers == 40960 * 4096 * 2
    assert "raise TP/PP/DP, lower --max-tokens-per-micro-batch" in format_report(r_budget)


@pytest.mark.parametrize("kw,match", [
    ({"max_tokens_per_micro_batch": 4000, "seq_len": 8192},
     (r"--max-tokens-per-micro-batch=4000 is below --seq-len=8192: a single sequence longer than the budget cannot be "
      r"packed; raise it to >= 8192")),
    ({"max_tokens_per_micro_batch": 20000, "seq_len": 18432, "max_model_len": 40960},
     r"--max-tokens-per-micro-batch=20000 is below --max-model-len=40960: a single sequence"),
    ({"max_tokens_per_micro_batch": 40960, "micro_batch": 4},
     r"--micro-batch=4 sets padded micro-batches, but --max-tokens-per-micro-batch=40960 packs them by tokens: drop one"),
    ({"max_tokens_per_micro_batch": -1}, r"--max-tokens-per-micro-batch must be >= 0 \(0 = padded micro-batches\), got -1"),
    ({"max_model_len": 1000, "seq_len": 2048}, r"--max-model-len=1000 is below --seq-len=2048"),
], ids=["below-seq-len", "below-max-model-len", "with-micro-batch", "negative", "model-len-below-seq"])
def test_bad_token_budget_names_the_numbers(kw, match):
    with pytest.raises(ValueError, match=match):
        PlanInputs(**kw)
    PlanInputs(**{**kw, "max_tokens_per_micro_batch": 0, "micro_batch": None,
                  "max_model_len": None})   # the same sizes without the budget are fine


def test_parallelism_and_recompute_reduce_memory():
    a = load_arch("qwen3-8b")
    base = estimate(a, PlanInputs(tp=2, dp=4, seq_len=8192))
    sp = estimate(a, PlanInputs(tp=2, dp=4, seq_len=8192, sequence_parallel=True))
    full = estimate(a, PlanInputs(tp=2, dp=4, seq_len=8192, recompute="full"))
    noflash = estimate(a, PlanInputs(tp=2, dp=4, seq_len=8192, attention="local"))
    assert full.activations < sp.activations < base.activations < noflash.activations
    pp = estimate(a, PlanInputs(tp=2, pp=2, dp=2, seq_len=8192))
    assert pp.weights < base.weights and pp.stage in ("first", "last")
    assert 7.5 * GIB < base.weights < 7.7 * GIB  # 4.1 B params per GPU at TP=2, 2 bytes each
    assert "PEAK per GPU" in format_report(base)


@pytest.mark.parametrize("kw,match", [
    (dict(tp=3), "num_attention_heads=32 is not divisible by tp=3"),
    (dict(tp=16), "num_key_value_heads=8 is not divisible by tp=16"),
    (dict(pp=5), "num_hidden_layers=36 is not divisible by pp=5"),
], ids=["heads-tp", "kv-heads-tp", "layers-pp"])
def test_bad_layout_names_the_sizes(kw, match):
    with pytest.raises(ValueError, match=match):
        estimate(load_arch("qwen3-8b"), PlanInputs(**kw))


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="sequence_parallel needs tp > 1"):
        PlanInputs(sequence_parallel=True)
    with pytest.raises(ValueError, match="micro_batch must be >= 1"):
        PlanInputs(micro_batch=0)
    with pytest.raises(ValueError, match="not a preset .* no config.json found"):
        load_arch(str(tmp_path / "nowhere"))
    (tmp_path / "config.json").write_text(json.dumps({**TINY["LlamaForCausalLM"], "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="'GPT2LMHeadModel' is not supported"):
        load_arch(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 8}))
    with pytest.raises(ValueError, match="lacks the field 'num_attention_heads'"):
        load_arch(str(tmp_path / "config.json"))


def test_config_json_folder_and_cli_args(tmp_path, capsys):
    import argparse

    (tmp_path / "config.json").write_text(json.dumps(PRESETS["qwen3-1.7b"]))
    assert load_arch(str(tmp_path)).total_params() == load_arch("qwen3-1.7b").total_params()
    args = add_arguments(argparse.ArgumentParser()).parse_args(
        ["--model", str(tmp_path), "--tp", "2", "--dp", "2", "--micro-batch", "2", "--seq-len", "1024", "--separate"])
    from megatron_rl.cli.plan import run

    rep = run(args)
    out = capsys.readouterr().out
    assert rep.inputs.tp == 2 and not rep.inputs.colocated
    assert "layout TP=2 PP=1 DP=2 (4 GPUs), micro-batch 2 x 1024 (padded), bf16" in out
    args = add_arguments(argparse.ArgumentParser()).parse_args(
        ["--model", "qwen3-8b", "--tp", "8", "--sequence-parallel", "--max-tokens-per-micro-batch", "40960",
         "--seq-len", "18432", "--max-model-len", "40960"])
    rep = run(args)
    assert (rep.inputs.max_tokens_per_micro_batch, rep.inputs.micro_batch_tokens) == (40960, 40960)
    assert "layout TP=8 PP=1 DP=1 (8 GPUs), micro-batch 40960 tokens (packed), seq 18432, bf16" in capsys.readouterr().out


def test_config_built_copies_swiglu_recompute_and_engine_share():
    """What a config builds, in closed form on the tiny model (per token per layer 2048 B fused, once 256 B, logits
    90112 B: test_memory_terms_closed_form):
    reference = one copy in model precision, teacher shadow = fp32 + the live copy of a teacher pass;
    the unfused SwiGLU keeps 2f/t more per token per layer; full recompute by method (a stage with the output layer
    peaks at its logits before any unit is recomputed: the unit counts only where it exceeds them); an engine share
    (gpu_memory_utilization) is taken whole and must hold the engine's need."""
    a = ArchSpec.from_hf(TINY["Qwen3ForCausalLM"], "tiny")
    base = dict(micro_batch=2, seq_len=8, overhead_gib=0, rollout_seqs=3, rollout_len=10)
    r = estimate(a, PlanInputs(**base))
    n = a.total_params()
    assert estimate(a, PlanInputs(reference=True, **base)).extra_copies == 2 * n
    assert estimate(a, PlanInputs(teacher_shadow=True, **base)).extra_copies == 6 * n
    per_tok, inp, head, logits = 16 * 2048, 16 * 2 * 64, 16 * 256, 90112   # one layer's activations / input, 16 tokens
    assert estimate(a, PlanInputs(fused_swiglu=False, **base)).activations == 2 * (per_tok + 16 * 2 * 2 * 128) + head
    # a recomputed unit of k layers: its activations and the gradients through it, 2k layers' worth
    assert estimate(a, PlanInputs(recompute="full", **base)).activations == 2 * inp + head   # 2 x per_tok < logits
    two = estimate(a, PlanInputs(recompute="full", recompute_num_layers=2, **base))   # the unit outweighs the logits:
    assert (two.activations, two.logits) == (inp + head, 4 * per_tok)                  # held after them, in their place
    assert estimate(a, PlanInputs(recompute="full", recompute_method="block", **base)).activations == \
        inp + per_tok + head
    from megatron_rl.planning.memory import activation_bytes

    first_full, _, _ = activation_bytes(a, PlanInputs(pp=2, recompute="full", **base), 256)
    assert first_full == 2 * inp + 2 * per_tok                 # a first stage holds the recomputed unit whole
    share = estimate(a, PlanInputs(rollout_mem_util=0.5, **base))
    assert share.rollout_total == 40 * GIB and share.generation_peak == r.trainer_resident + 40 * GIB and fits(share)
    first, last, _ = activation_bytes(a, PlanInputs(pp=2, **base), 256)
    i_first, i_last, _ = activation_bytes(a, PlanInputs(pp=2, vpp=2, **base), 256)   # interleaved: x (1 + (p-1)/(p v))
    assert (i_first, i_last) == (int(first * 1.25), last) and first == 2 * per_tok
    assert last == per_tok + head + inp                        # one layer, the head's inputs, the received input
    short = estimate(a, PlanInputs(rollout_mem_util=1e-9, **base))
    assert not fits(short) and "holds less than its weights + KV cache" in format_report(short)


def test_context_parallel_splits_tokens_adds_the_ring_and_shards_over_dp_cp():
    """CP c on the tiny model (per token per layer 2048 B, once 256 B, 16 tokens per micro-batch): activations and
    logits of 16/c tokens, plus TE's p2p ring of one layer, 2 buffers x (16/c) x 2kv (2 x 32) x e; the
    distributed optimizer shards over DP x CP; the report counts tp x pp x cp x dp GPUs."""
    a = ArchSpec.from_hf(TINY["Qwen3ForCausalLM"], "tiny")
    base = dict(micro_batch=2, seq_len=8, overhead_gib=0, rollout_seqs=3, rollout_len=10, dp=2)
    one, two = estimate(a, PlanInputs(**base)), estimate(a, PlanInputs(cp=2, **base))
    n = a.total_params()
    assert one.activations == 16 * (2 * 2048 + 256)
    assert two.activations == 8 * (2 * 2048 + 256) + 2 * 8 * 64 * 2
    assert (one.logits, two.logits) == (16 * 256 * 14 + 256 * 64 * 2, 8 * 256 * 14 + 256 * 64 * 2)
    assert (one.optimizer, two.optimizer) == (12 * n // 2, 12 * n // 4)
    assert (two.weights, two.grads) == (one.weights, one.grads)          # CP replicates the weights
    assert "CP=2 DP=2 (4 GPUs)" in format_report(two)
    full = estimate(a, PlanInputs(cp=4, recompute="full", **base))   # 4 tokens: 2 inputs + the head's + ring
    assert full.activations == 4 * 2 * 64 * 2 + 4 * 256 + 2 * 4 * 64 * 2
    with pytest.raises(ValueError, match="cp must be >= 1"):
        PlanInputs(cp=0)


def test_verdict_hint_names_the_dominant_side():
    a = load_arch("qwen3-8b")
    roll = format_report(estimate(a, PlanInputs(tp=4, dp=2, seq_len=18432, sequence_parallel=True, rollout_seqs=32)))
    assert "DOES NOT FIT in 78 GiB - the generation phase dominates: trainer.offload (--offload) optimizer|all" in roll
    train = format_report(estimate(a, PlanInputs(tp=1, seq_len=32768, rollout_seqs=1)))
    assert "DOES NOT FIT in 78 GiB - raise TP/PP/DP" in train
    # 16 sequences: the trainer's resident state (none) tips generation over 78 GiB; offload=optimizer fits
    resident = PlanInputs(tp=4, dp=2, seq_len=18432, sequence_parallel=True, rollout_seqs=16)
    assert "DOES NOT FIT" in format_report(estimate(a, resident))
    ok = format_report(estimate(a, dataclasses.replace(resident, offload="optimizer")))
    assert ok.endswith("fits in 78 GiB")


WORKER = textwrap.dedent("""
    import json, sys, warnings
    warnings.filterwarnings("ignore")


    def main():
        from megatron_rl.runtime.parallel import destroy_parallel, init_parallel
        from megatron_rl.models import provider
        for case, hf, tp, pp in json.loads(sys.argv[1]):  # one launch, megatron groups rebuilt per layout
            info = init_parallel(tp=tp, pp=pp, seed=1)
            cfg = provider.transformer_config_from_hf(hf, tp=tp, pp=pp)
            model = provider.build_gpt_model(hf, cfg)
            n = sum(p.numel() for p in model.parameters())
            print(f"RANK case={case} tp_rank={info.tp_rank} pp_rank={info.pp_rank} params={n}", flush=True)
            del model
            destroy_parallel()


    if __name__ == "__main__":
        main()
""")


# qwen2-tied-pp2: tied embeddings with PP > 1 call weight.data.cuda() in megatron; patches/cpu_megatron_tensor_cuda.py covers it
SHARDED_CASES = {"qwen3-untied-tp2": ("Qwen3ForCausalLM", 2, 1), "qwen3-untied-pp2": ("Qwen3ForCausalLM", 1, 2),
                 "qwen2-tied-pp2": ("Qwen2ForCausalLM", 1, 2)}


@pytest.fixture(scope="module")
def sharded_counts(tmp_path_factory) -> dict:
    """Per-rank parameter counts of the provider's model for every case of ``SHARDED_CASES``, from ONE
    torchrun (gloo, 2 ranks): case -> {(tp_rank, pp_rank): count}."""
    from tests.helpers.dist import torchrun

    script = tmp_path_factory.mktemp("plan") / "count_worker.py"
    script.write_text(WORKER)
    cases = [(c, TINY[arch], tp, pp) for c, (arch, tp, pp) in SHARDED_CASES.items()]
    out = torchrun(script, json.dumps(cases), nproc=2, timeout=600).stdout
    got: dict = {c: {} for c in SHARDED_CASES}
    for c, a, b, n in re.findall(r"RANK case=(\S+) tp_rank=(\d+) pp_rank=(\d+) params=(\d+)", out):
        got[c][(int(a), int(b))] = int(n)
    return got


@pytest.mark.parametrize("case", list(SHARDED_CASES))
def test_params_per_gpu_match_sharded_megatron_model(case, sharded_counts):
    """Per-rank parameter counts of the provider's model under torchrun (gloo, 2 ranks) = the plan's.

    PP=2 with tied embeddings: the last stage holds its own copy of the embedding (output layer).
    """
    arch, tp, pp = SHARDED_CASES[case]
    got = sharded_counts[case]
    planned = params_per_gpu(ArchSpec.from_hf(TINY[arch], arch), PlanInputs(tp=tp, pp=pp))
    assert len(got) == 2, got
    for (_, pp_rank), n in got.items():
        assert n == (planned.first_stage if pp_rank == 0 else planned.last_stage), (pp_rank, n, planned)


def test_local_attention_is_planned_as_megatron_builds_it():
    """Qwen3-1.7B at 4,096 tokens without Transformer Engine: megatron's local attention keeps 28 layers x 16
    heads x 4096^2 scores x 6 B (fp32 softmax output + its bf16 cast) = 42.0 GiB beside flash's 0, and one
    layer's persistent score buffer (2 B); packed rows are as long as the longest sequence (--max-model-len),
    not the budget; fp32 keeps 4 B; selective recompute none. One layer's working set (raw scores + fp32 copy,
    6 B; 12 B recomputed under selective) precedes the logits and counts only where it outweighs them, as at
    32,768 tokens; --config takes the attention from model.backend (te: flash, local: local)."""
    q = load_arch("qwen3-1.7b")
    base = dict(seq_len=4096, dtype="bf16", reference=True, overhead_gib=0)
    flash, local = estimate(q, PlanInputs(**base)), estimate(q, PlanInputs(attention="local", **base))
    stored = 28 * 16 * 4096 ** 2 * 6
    assert local.activations - flash.activations == stored and 6 * 16 * 4096 ** 2 < local.logits
    assert local.buffers - flash.buffers == 2 * 16 * 4096 ** 2
    assert round(stored / GIB, 1) == 42.0 and local.train_total > 80e9 > flash.train_total   # the old bring-up default: no fit
    sel = estimate(q, PlanInputs(attention="local", recompute="selective", **base))
    assert sel.activations == estimate(q, PlanInputs(recompute="selective", **base)).activations   # 12 B < logits
    fp32 = estimate(q, PlanInputs(attention="local", **{**base, "dtype": "fp32"}))
    assert fp32.activations - estimate(q, PlanInputs(**{**base, "dtype": "fp32"})).activations == 28 * 16 * 4096 ** 2 * 4
    long = {**base, "seq_len": 32768}
    big, big_flash = estimate(q, PlanInputs(attention="local", **long)), estimate(q, PlanInputs(**long))
    assert big.activations - big_flash.activations == 28 * 16 * 32768 ** 2 * 6 + (6 * 16 * 32768 ** 2 - big.logits)
    packed = dict(max_tokens_per_micro_batch=40960, max_model_len=8192, seq_len=4096, overhead_gib=0)
    d = estimate(q, PlanInputs(attention="local", **packed)).activations - estimate(q, PlanInputs(**packed)).activations
    assert d == 40960 * 16 * 8192 * 28 * 6                # 5 rows of 8192 tokens
    assert "of which S x S attention scores (local)" in format_report(local)
    with pytest.raises(ValueError, match="--attention must be one of flash|local"):
        PlanInputs(attention="sdpa")


def test_sampling_term_is_the_mu_pass_working_set():
    """The μ term of the plan is the working set of ``algorithms/sampling.py`` from ITS constants (chunk
    budget, candidates, tie slack): one row chunk, the candidates and their gathered sort, and with
    ``ratio_space=sampling`` the backward's gradient shard; 0 when the sampling does not truncate."""
    import math

    from megatron_rl.algorithms.sampling import CANDIDATES, CHUNK_BYTES, TIE_SLACK
    from megatron_rl.planning import memory as PM

    assert (PM.MU_CHUNK_BYTES, PM.MU_CANDIDATES, PM.MU_TIE_SLACK) == (CHUNK_BYTES, CANDIDATES, TIE_SLACK)
    arch = load_arch("qwen3-8b")
    base = PlanInputs(tp=4, dp=2, max_tokens_per_micro_batch=40960, seq_len=18432, max_model_len=40960,
                      sequence_parallel=True, recompute="full")
    v = padded_vocab(arch.vocab, 4)
    n, w = 40960, v // 4
    rows = min(n, CHUNK_BYTES // (4 * w))

    def want(top_k, top_p, min_p, space):
        c = top_k + TIE_SLACK if top_k > 0 else CANDIDATES
        fwd = rows * (PM.MU_ROW_MASS_BYTES * w * (top_p < 1 and top_k <= 0) + PM.MU_LOCAL_BYTES * c
                      + PM.MU_GATHERED_BYTES * 4 * c)
        bwd = n * w * 2 + rows * w * (PM.MU_BACKWARD_BYTES + 4)        # bf16 logits: the fp32 upcast of a chunk
        return PM.MU_ROW_BYTES * n + (max(fwd, bwd) if space == "sampling" else fwd)

    def adds(top_k, top_p, min_p, space):   # full: after the full softmax's two fp32 temporaries (8 B) are freed
        mu = want(top_k, top_p, min_p, space)
        return mu if space == "sampling" else max(0, mu - 8 * n * w)

    off = estimate(arch, base)
    assert off.sampling == 0
    for k, p, m, space in [(20, 0.95, 0.0, "full"), (-1, 0.7, 0.0, "full"), (-1, 1.0, 0.1, "full"),
                           (3, 1.0, 0.0, "sampling"), (-1, 0.95, 0.0, "sampling")]:
        rep = estimate(arch, dataclasses.replace(base, top_k=k, top_p=p, min_p=m, ratio_space=space))
        assert rep.sampling_working == want(k, p, m, space), (k, p, m, space)
        assert rep.sampling == adds(k, p, m, space) and rep.train_total - off.train_total == rep.sampling
        assert "sampling μ pass" in format_report(rep)
    # the recipe (top-k 20, top-p 0.95): candidates only, ~13 MiB; top-p alone adds one chunk's exp + mask
    assert math.isclose(want(20, 0.95, 0, "full") / 2**20, 12.72, abs_tol=0.01)
    assert PM.MU_ROW_MASS_BYTES * rows * w <= PM.MU_ROW_MASS_BYTES / 4 * CHUNK_BYTES
    assert estimate(arch, dataclasses.replace(base, top_k=arch.vocab)).sampling == 0   # k >= V keeps all
    pp = estimate(arch, dataclasses.replace(base, pp=2, top_p=0.7))                     # the last stage's
    assert pp.sampling_working == (want(-1, 0.7, 0, "full") if pp.stage == "last" else 0)
    with pytest.raises(ValueError, match="ratio-space"):
        PlanInputs(ratio_space="mu")


def test_plan_config_reads_the_sampling_and_ratio_space(tmp_path):
    """``--config``: the μ inputs come from rollout.top_k / top_p / min_p and algo.ratio_space."""
    from megatron_rl.cli.plan import plan_config
    from tests.helpers.tools import load_tool

    path = load_tool("example_plans").CONFIGS / "qwen3_8b_bicc_rcc.yaml"
    got = plan_config(path)
    assert (got["top_k"], got["top_p"], got["min_p"], got["ratio_space"]) == (-1, 0.7, 0.0, "full")


ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.mark.parametrize("targets", [ALL_TARGETS, ("q_proj", "v_proj"), ("o_proj", "down_proj")])
def test_lora_adapter_count_matches_peft(targets):
    """The planned adapter parameters (TP = 1) are what ``peft`` counts trainable on the same HF model (the oracle)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from megatron_rl.planning.memory import lora_params_per_layer

    hf = TINY["Qwen3ForCausalLM"]
    m = Qwen3ForCausalLM(Qwen3Config(**{k: v for k, v in hf.items() if k not in ("architectures", "model_type")}))
    trainable, _ = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=list(targets))).get_nb_trainable_parameters()
    a = ArchSpec.from_hf(hf, "tiny")
    assert a.layers * lora_params_per_layer(a, PlanInputs(lora_rank=4, lora_targets=targets)) == trainable


def test_lora_frozen_base_closed_form():
    """LoRA (module docstring): adapters sharded as the base (column: B split, row: A split), the base frozen (main
    grads and optimizer state for the adapters only), each adapter's A x kept (e·ρ per token, layer and target)."""
    from megatron_rl.planning.memory import lora_params_per_layer

    a = ArchSpec.from_hf(TINY["Qwen3ForCausalLM"], "tiny")   # h 64, q 64, kv 32, f 128
    # TP = 2, rank 4: q 4·64 + 64·4/2 = 384, k = v 4·64 + 32·4/2 = 320, o 4·64/2 + 64·4 = 384,
    # gate = up 4·64 + 128·4/2 = 512, down 4·128/2 + 64·4 = 512
    assert lora_params_per_layer(a, PlanInputs(tp=2, lora_rank=4)) == 384 + 2 * 320 + 384 + 2 * 512 + 512
    inp = PlanInputs(tp=1, pp=1, dp=4, micro_batch=2, seq_len=8, overhead_gib=0)
    full, lora = estimate(a, inp), estimate(a, dataclasses.replace(inp, lora_rank=4))
    n, ad = a.total_params(), 2 * 4096       # 4096 adapter params per layer at TP = 1 (PEFT's count, above)
    assert (lora.weights, lora.grads, lora.optimizer) == (2 * (n + ad), 4 * ad, 12 * ad // 4)
    assert lora.activations - full.activations == 16 * 2 * 2 * 4 * 7   # tokens x layers x e·ρ·|targets|
    # the frozen output layer makes no weight gradient: the logits term without its bf16 wgrad (256 x 64 x 2)
    assert (lora.logits, lora.rollout_weights) == (full.logits - 256 * 64 * 2, full.rollout_weights)
    with pytest.raises(ValueError, match="--lora-targets among"):
        PlanInputs(lora_rank=4, lora_targets=("lm_head",))


def test_plan_config_reads_lora():
    """``--config`` with ``lora.enable``: rank and targets from ``lora.*``, and no reference copy (the KL's reference
    is the policy with its adapters off)."""
    from megatron_rl.planning.config import config_inputs
    from megatron_rl.trainer.loop.preflight import load_checked
    from tests.helpers.tools import load_tool

    path = load_tool("example_plans").CONFIGS / "qwen3_8b_grpo.yaml"
    base = config_inputs(load_checked(path, ["model.hf_path="]))
    got = config_inputs(load_checked(path, ["model.hf_path=", "lora.enable=true", "lora.rank=32",
                                            "lora.target_modules=[q_proj,v_proj]", "model.backend=local"]))
    assert base["lora_rank"] == 0 and base["reference"]
    assert (got["lora_rank"], got["lora_targets"], got["reference"]) == (32, ("q_proj", "v_proj"), False)
