"""The demo's per-method choices come from each method's registration (its hparams' fields, its data
path's ``prompt_context``) plus the demo's own measured tuning table, and are exactly the ones the
demo made when it branched on method names (the table below is that former behaviour)."""
from __future__ import annotations

import dataclasses
import json

import pytest

#: kind -> the algo.<kind>.* values the demo sets away from the method's defaults (--steps 10)
FORMER = {"bicc": {"context_frac": 0.25},
          "bicc_rcc": {"context_frac": 0.25, "rcc_delta": "mean", "kl_loss_coef": 0.05},
          "dapo": {"overlong_buffer_len": 2, "max_num_gen_batches": 4, "at_cap": "fill"},
          "opsd": {"top_k": 8, "jsd_token_clip": 1.0}, "opsd_ectr": {"top_k": 8, "jsd_token_clip": 1.0},
          "sdpo": {"top_k": 8}, "srpo": {"top_k": 8}, "score": {"stage1_steps": 5}}
#: kind -> the warm start's extra prompt context (former branches: bicc*, score, the teacher kinds)
CONTEXT = {"bicc": "group_answers", "bicc_rcc": "group_answers", "score": "corrector_turn",
           **dict.fromkeys(("rlcsd", "opsd", "sdpo", "srpo", "rlsd", "opsd_ectr", "rlsd_ectr"), "hint")}
KINDS = ("grpo", "dapo", "drgrpo", "remax", "rloo", "bicc", "bicc_rcc", "rlcsd", "opsd", "sdpo", "srpo", "rlsd",
         "opsd_ectr", "rlsd_ectr", "papo", "score")


@pytest.mark.parametrize("kind", KINDS)
def test_demo_choices_follow_the_registration(kind, tmp_path):
    from megatron_rl.cli import demo as D
    from megatron_rl.algorithms import ALGO_KINDS
    from megatron_rl.trainer.paths import path_class

    hf = tmp_path / "model"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 512,
        "vocab_size": 32, "tie_word_embeddings": True, "max_position_embeddings": 128}))
    args = D.build_parser().parse_args(["--algo", kind, "--steps", "10", "-o", "reward.grader_url=http://127.0.0.1:1/v1"])
    cfg = D.demo_config(args, tmp_path / "run", {"train": str(tmp_path / "t.parquet"),
                                                 "test": str(tmp_path / "v.parquet")}, hf)
    hp, default = cfg.algo.hparams, ALGO_KINDS[kind].hparams()
    changed = {f.name: getattr(hp, f.name) for f in dataclasses.fields(hp)
               if getattr(hp, f.name) != getattr(default, f.name)}
    assert changed == FORMER.get(kind, {})
    assert path_class(kind).prompt_context == CONTEXT.get(kind, "")
