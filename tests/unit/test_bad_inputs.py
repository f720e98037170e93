"""Bad inputs a new user tries in the first hour: each gets ONE clear line, before anything starts.

Every case runs through the real entry point (``megatron_rl.cli.main``, in-process so the suite
stays fast; ``tests/unit/test_cli.py`` covers the installed console script): non-zero exit, exactly
one non-empty stderr line, no traceback, the expected words, and torch.distributed never initialised
(nothing was started: the ``train`` cases run ``--check``, which runs the same ``preflight`` that
``setup_run`` runs before ``init_parallel``).

``python tests/unit/test_bad_inputs.py`` prints the table (input -> message) in markdown.
"""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.helpers.dist import free_port

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "configs" / "tiny_cpu_grpo.yaml"
TINY_HF = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 512,
           "vocab_size": 32, "tie_word_embeddings": True, "max_position_embeddings": 128}


#: (id, argv after the fixture's substitutions, expected words of the one-line message)
#: ``{T}`` = the tiny config with a valid stand-in model, data and fresh run dir; ``{X}`` = the work dir
CASES = [
    ("steps-float", ["{T}", "trainer.steps=3.7"], "trainer.steps: expected an integer, got 3.7 (float)"),
    ("steps-bool", ["{T}", "trainer.steps=true"], "trainer.steps: expected an integer, got True (bool)"),
    ("steps-zero", ["{T}", "trainer.steps=0"], "trainer.steps and micro_batch_size must be >= 1"),
    ("steps-text", ["{T}", "trainer.steps=ten"], "trainer.steps: expected an integer, got 'ten' (str)"),
    ("lr-negative", ["{T}", "optim.lr=-1"], "optim.lr must be > 0"),
    ("lr-text", ["{T}", "optim.lr=fast"], "optim.lr: expected a number, got 'fast'"),
    ("bf16-int", ["{T}", "model.bf16=1"], "model.bf16: expected true or false, got 1 (int)"),
    ("progress-text", ["{T}", "logging.progress=maybe"], "logging.progress: expected true or false, got 'maybe'"),
    ("temperature-0", ["{T}", "rollout.temperature=0"], "rollout.temperature must be > 0"),
    ("n-0", ["{T}", "rollout.n=0"], "rollout.n and rollout.num_engines must be >= 1"),
    ("n-1-group", ["{T}", "rollout.n=1"], "rollout.n=1 with algo.kind=grpo: its advantage compares the samples"),
    ("engine", ["{T}", "rollout.engine=sglang"], "rollout.engine: unknown engine 'sglang'; registered: hf, vllm"),
    ("backend-name", ["{T}", "model.backend=tensorrt"], "model.backend must be auto|local|te, got 'tensorrt'"),
    ("backend-te-cpu", ["{T}", "model.backend=te"], "model.backend=te needs a CUDA GPU with Transformer Engine"),
    ("fp8-cpu", ["{T}", "model.fp8=e4m3"], "model.fp8=e4m3 needs the Transformer Engine backend"),
    ("fp8-format", ["{T}", "model.fp8=e5m2"], "model.fp8 must be null|e4m3|hybrid, got 'e5m2'"),
    ("algo-kind", ["{T}", "algo.kind=ppo"], "unknown algo.kind 'ppo'; valid:"),
    ("algo-key", ["{T}", "algo.grpo.clip_ratio=0.2"], "algo.grpo: unknown key(s) ['clip_ratio']"),
    ("algo-type", ["{T}", "algo.grpo.clip_low=high"], "algo.grpo.clip_low: expected a number, got 'high'"),
    ("trainer-key", ["{T}", "trainer.stepz=3"], "trainer: unknown key(s) ['stepz']"),
    ("section", ["{T}", "optimizer.lr=1"], "config: unknown section(s) ['optimizer']"),
    ("section-scalar", ["{T}", "trainer=5"], "trainer: expected a mapping"),
    ("on-error", ["{T}", "data.on_error=ignore"], "data.on_error must be raise|skip, got 'ignore'"),
    ("wandb-mode", ["{T}", "logging.wandb_mode=cloud"], "logging.wandb_mode invalid: 'cloud'; valid: offline|online|disabled"),
    ("decay-style", ["{T}", "optim.decay_style=exp"], "optim.decay_style invalid: 'exp'"),
    ("reward-name", ["{T}", "reward.default=nope"], "reward.default: unknown reward 'nope'"),
    ("reward-by-source", ["{T}", "reward.by_source={gsm8k: mathh}"], "reward.by_source.gsm8k: unknown reward 'mathh'"),
    ("grader-fallback", ["{T}", "reward.grader_fallback=0.3"], "reward.grader_fallback must be 0, 0.5 or 1"),
    ("teacher-template", ["{T}", "teacher.template=fancy"], "teacher.template invalid: 'fancy'"),
    ("prompt-len", ["{T}", "data.max_prompt_len=200"],
     "data.max_prompt_len=200 + rollout.max_tokens=6 exceeds rollout.max_model_len=128"),
    ("max-tokens", ["{T}", "rollout.max_tokens=500"], "rollout.max_tokens=500 exceeds rollout.max_model_len=128"),
    ("model-len", ["{T}", "rollout.max_model_len=4096"],
     "rollout.max_model_len=4096 exceeds the model's max_position_embeddings=128"),
    ("top-k-vocab", ["{T}", "algo.kind=opsd", "teacher.template=inline", "algo.opsd.top_k=64"],
     "algo.opsd.top_k=64 exceeds the model's vocab_size=32"),
    ("tp-heads", ["{T}", "parallel.tp=3"], "num_attention_heads=4 is not divisible by tensor parallel size 3"),
    ("tp-zero", ["{T}", "parallel.tp=0"], "parallel.tp/pp must be >= 1, got 0/1"),
    ("micro-batch", ["{T}", "trainer.micro_batch_size=7"], "is not divisible by dp=1 x micro_batch_size=7"),
    # issue 20: the token budget (trainer.max_tokens_per_micro_batch; the tiny config is padded, micro_batch_size 64)
    ("budget-below-model-len", ["{T}", "trainer.micro_batch_size=null", "trainer.max_tokens_per_micro_batch=100"],
     "trainer.max_tokens_per_micro_batch=100 is below rollout.max_model_len=128 (rounded up to 128, a multiple of 8 x "
     "parallel.tp), the longest sequence a pass can hold"),
    ("budget-and-micro-batch", ["{T}", "trainer.max_tokens_per_micro_batch=256"],
     ("trainer.micro_batch_size=64 sets padded micro-batches, but trainer.max_tokens_per_micro_batch=256 packs them by "
      "tokens: remove one")),
    ("budget-negative", ["{T}", "trainer.micro_batch_size=null", "trainer.max_tokens_per_micro_batch=-1"],
     "trainer.max_tokens_per_micro_batch must be >= 0 (0 = padded micro-batches)"),
    ("keep-last", ["{T}", "trainer.keep_last=-1"], "trainer.keep_last must be >= 0, got -1"),
    ("train-missing", ["{T}", "data.train={X}/missing.parquet"], "data.train={X}/missing.parquet: no such file"),
    ("val-missing", ["{T}", "data.val={X}/nope.parquet"], "data.val={X}/nope.parquet: no such file"),
    ("model-missing", ["{T}", "model.hf_path={X}/nomodel"], "no config.json in {X}/nomodel"),
    ("model-empty", ["{T}", "model.hf_path="], "model.hf_path is required"),
    ("tokenizer-missing", ["{T}", "model.tokenizer_path={X}/notok"], "model.tokenizer_path={X}/notok: no such directory"),
    ("run-dir-used", ["{T}", "trainer.run_dir={X}/used"],
     "already holds a run (checkpoints/step_10, metrics.jsonl): pass --resume auto"),
    ("export-dir-user-files", ["{T}", "trainer.run_dir={X}/hfuser"],
     "trainer.export_hf: --out {X}/hfuser/hf is not empty (notes.txt) and is not a checkpoint written by megatron-rl"),
    ("overwrite-resume", ["{T}", "--overwrite", "--resume", "auto"],
     "--overwrite starts a fresh run; it cannot be combined with --resume"),
    ("resume-path", ["{T}", "--resume", "{X}/nockpt"], "--resume {X}/nockpt: no such checkpoint directory"),
    ("resume-not-ckpt", ["{T}", "--resume", "{X}/userdir"], "--resume {X}/userdir: not a complete checkpoint"),
    ("train-empty", ["{T}", "data.train={X}/empty.parquet"], "data.train={X}/empty.parquet: the parquet file has no rows"),
    ("val-empty", ["{T}", "data.val={X}/empty.parquet"], "data.val={X}/empty.parquet: the parquet file has no rows"),
    ("train-not-parquet", ["{T}", "data.train={X}/c.jsonl"], "data.train={X}/c.jsonl: not a readable parquet file"),
    ("train-fewer-rows", ["{T}", "data.train={X}/one.parquet"],
     ("data.train={X}/one.parquet has 1 row(s), fewer than data.prompts_per_step=32 (one step's prompts): set "
      "data.prompts_per_step <= 1")),
    ("model-safetensors", ["{T}", "model.hf_path={X}/model/model.safetensors"],
     "model.hf_path={X}/model/model.safetensors is a file; set it to the HF model directory that holds config.json"),
    ("tiny-before-demo", ["train", "--config", str(REPO / "examples/configs/tiny_cpu_dapo.yaml"), "--check"],
     "no config.json in runs/demo_bicc_rcc/sft_hf; `megatron-rl demo --algo bicc_rcc` creates it (so does `make demo`)"),
    ("papo-no-grader", ["{T}", "algo.kind=papo"], "needs a rubric grader: set reward.grader_url"),
    ("grader-down", ["{T}", "algo.kind=papo", "reward.grader_url=http://127.0.0.1:{PORT}/v1"], "grader unreachable"),
    ("grader-url", ["{T}", "algo.kind=papo", "reward.grader_url=localhost:8000"], "is not an http(s) URL"),
    ("papo-math-no-grader", ["{T}", "reward.default=papo_math"],
     "reward papo_math asks PAPO's LLM outcome verifier at reward.grader_url when its rule check says wrong"),
    ("grader-max-tokens", ["{T}", "reward.grader_max_tokens=-1"], "reward.grader_max_tokens must be >= 0 (0: left to the server)"),
    # issue 40: no row is scored by a reward nobody chose; multimodal files are refused
    ("grader-unparsable-policy", ["{T}", "reward.grader_unparsable_policy=maybe"],
     "reward.grader_unparsable_policy must be warn|stop, got 'maybe'"),
    ("train-unmapped-source", ["{T}", "data.train={X}/hellaswag.parquet", "reward.default="],
     "data.train={X}/hellaswag.parquet: no reward for data_source 'Rowan/hellaswag' (32 rows, verl has no scorer for it "
     "either); choose one: reward.by_source={Rowan/hellaswag: NAME}, or a fallback for every unmapped source: "
     "reward.default=NAME"),
    ("train-multimodal", ["{T}", "data.train={X}/geo3k.parquet"],
     "data.train={X}/geo3k.parquet: multimodal rows (a 'images' column): this project trains and scores text-only models"),
    ("eval-unmapped-source", ["eval", "--data", "{X}/hellaswag.parquet", "--completions", "{X}/c.jsonl", "--out", "{X}/e"],
     "--data {X}/hellaswag.parquet: no reward for data_source 'Rowan/hellaswag' (32 rows, verl has no scorer for it "
     "either); choose one: --reward-by-source Rowan/hellaswag=NAME, or a fallback for every unmapped source: --reward NAME"),
    ("eval-reward-name", ["eval", "--data", "{X}/train.parquet", "--completions", "{X}/c.jsonl", "--out", "{X}/e",
                          "--reward-by-source", "reverse=mathh"], "--reward-by-source reverse: unknown reward 'mathh'"),
    ("prepare-verl-unmapped", ["data", "prepare", "verl", "--in", "{X}/hellaswag.parquet", "--out", "{X}/p"],
     "data prepare verl: no reward for data_source 'Rowan/hellaswag' (32 rows, verl has no scorer for it either)"),
    ("prepare-verl-multimodal", ["data", "prepare", "verl", "--in", "{X}/geo3k.parquet", "--out", "{X}/p"],
     "data prepare verl: multimodal rows (a 'images' column)"),
    ("yaml-syntax", ["train", "--config", "{X}/bad.yaml"], "{X}/bad.yaml:4:8: YAML syntax error: expected ',' or ']', but got ':' (while parsing a flow sequence at line 3)"),
    ("yaml-list", ["train", "--config", "{X}/list.yaml"], "a config file is a mapping of sections"),
    ("config-missing", ["train", "--config", "{X}/none.yaml"], "config file not found: {X}/none.yaml"),
    ("config-dir", ["train", "--config", "{X}"], "--config {X} is a directory; pass a YAML file"),
    ("override-form", ["train", "--config", "{X}/none.yaml", "trainer.steps"],
     "override 'trainer.steps' is not of the form section.key=value"),
    ("eval-k0", ["eval", "--data", "{X}/train.parquet", "--completions", "{X}/c.jsonl", "--k", "0", "--out", "{X}/e"],
     "--k must be >= 1"),
    ("eval-response", ["eval", "--data", "{X}/train.parquet", "--completions", "{X}/badresp.jsonl", "--out", "{X}/e"],
     "'response' must be a string, got int"),
    ("eval-index-range", ["eval", "--data", "{X}/train.parquet", "--completions", "{X}/oob.jsonl", "--out", "{X}/e"],
     "{X}/oob.jsonl: index 40 is out of range: --data {X}/train.parquet has 32 rows (indices 0..31)"),
    ("eval-data", ["eval", "--data", "{X}/nodata.parquet", "--completions", "{X}/c.jsonl", "--out", "{X}/e"],
     "--data {X}/nodata.parquet: no such file"),
    ("plan-rollout-tp", ["plan", "--model", "qwen3-8b", "--rollout-tp", "3"],
     "num_attention_heads=32 is not divisible by --rollout-tp=3"),
    ("plan-negative-mem", ["plan", "--model", "qwen3-8b", "--gpu-mem-gib", "-1"], "--gpu-mem-gib must be > 0"),
    ("plan-no-fit", ["plan", "--model", "qwen3-8b", "--tp", "2", "--dp", "4", "--seq-len", "8192"],
     "the layout does not fit: peak 125.59 GiB per GPU > --gpu-mem-gib 78"),
    ("plan-model", ["plan", "--model", "qwen9-1t"], "qwen9-1t"),
    ("plan-budget-below-seq", ["plan", "--model", "qwen3-8b", "--max-tokens-per-micro-batch", "4000", "--seq-len", "8192"],
     "--max-tokens-per-micro-batch=4000 is below --seq-len=8192: a single sequence longer than the budget cannot be packed"),
    ("plan-budget-below-model-len", ["plan", "--model", "qwen3-8b", "--max-tokens-per-micro-batch", "20000",
                                     "--seq-len", "18432", "--max-model-len", "40960"],
     "--max-tokens-per-micro-batch=20000 is below --max-model-len=40960"),
    ("plan-budget-and-micro-batch", ["plan", "--model", "qwen3-8b", "--micro-batch", "2", "--max-tokens-per-micro-batch",
                                     "8192"],
     "--micro-batch=2 sets padded micro-batches, but --max-tokens-per-micro-batch=8192 packs them by tokens: drop one"),
    ("convert-user-dir", ["convert", "hf-to-mcore", "--hf", "{X}/model", "--out", "{X}/userdir"],
     "is not a checkpoint written by megatron-rl; refusing to touch it"),
    ("convert-run-dir", ["convert", "mcore-to-hf", "--ckpt", "{X}/used", "--out", "{X}/hfout"],
     "--ckpt {X}/used is a training run directory: pass one of its checkpoints, e.g. {X}/used/checkpoints/step_10"),
    # issue 24 (more in tests/unit/test_run_explains.py): nothing overwritten, a run that explains itself
    ("eval-out-user-dir", ["eval", "--data", "{X}/train.parquet", "--completions", "{X}/c.jsonl", "--out", "{X}/userdir",
                           "--force"], "is not an eval output of megatron-rl; refusing to touch it"),
    ("demo-user-dir", ["demo", "--run-dir", "{X}/userdir"], "holds files the demo did not write (thesis.tex)"),
    ("opsd-no-solution", ["{T}", "algo.kind=opsd", "teacher.template=chat", "algo.opsd.top_k=8"],
     "data.train={X}/train.parquet: 32 of 32 rows have no extra_info.solution"),
    ("resume-changed-kind", ["{T}", "trainer.run_dir={X}/saved", "algo.kind=rloo", "--resume", "auto"],
     "algo.kind: 'grpo' -> 'rloo'"),
    # issue 21: rollout.placement (rollout/placement.py; the GPU counts: tests/unit/rollout/test_placement.py)
    ("placement-name", ["{T}", "rollout.placement=hybrid"], "rollout.placement must be colocated|separate, got 'hybrid'"),
    ("mismatch-limit", ["{T}", "rollout.mismatch_limit=0.9"], "rollout.mismatch_limit must be null, 0 (off) or a number > 1"),
    ("mismatch-policy", ["{T}", "rollout.mismatch_policy=abort"], "rollout.mismatch_policy must be warn|stop, got 'abort'"),
    ("off-policy-mode", ["{T}", "algo.off_policy=mis"], "algo.off_policy must be one of ['decoupled', 'tis', 'none', "),
    ("correction-for-tis", ["{T}", "algo.off_policy=tis", "algo.correction.cap=3"],
     "algo.correction sets the thresholds of ['bypass', 'geo_rs', 'icepop', 'seq_mis', 'seq_tis'], not of algo.off_policy=tis"),
    ("correction-key", ["{T}", "algo.off_policy=icepop", "algo.correction.cap=3"], "algo.correction: unknown key(s) ['cap']"),
    ("correction-band", ["{T}", "algo.off_policy=seq_mis", "algo.correction.lower=3", "algo.correction.upper=2"],
     "algo.correction.lower (3.0) must be <= algo.correction.upper (2.0)"),
    ("bypass-guard-async", ["{T}", "algo.off_policy=bypass", "rollout.mismatch_limit=1.05", "rollout.max_staleness=1"],
     "rollout.mismatch_limit=1.05 with algo.off_policy=bypass and rollout.max_staleness=1: bypass measures"),
    # issue 42: the PPO ratio's space and the deterministic switch
    ("bypass-full-truncated", ["{T}", "algo.off_policy=bypass", "rollout.top_p=0.7"],
     "algo.off_policy=bypass with algo.ratio_space=full under a truncating sampler (top_p=0.7, top_k=-1, min_p=0.0)"),
    ("bypass-conditioned", ["{T}", "algo.kind=bicc", "algo.off_policy=bypass", "algo.ratio_space=sampling",
                            "algo.bicc.old_logprob_context=conditioned"],
     "algo.off_policy=bypass with algo.bicc.old_logprob_context=conditioned: bypass takes the engine's log-probs"),
    ("ratio-space", ["{T}", "algo.ratio_space=mu"], "algo.ratio_space must be full|sampling, got 'mu'"),
    ("ratio-space-teacher", ["{T}", "algo.kind=sdpo", "algo.ratio_space=sampling", "algo.sdpo.top_k=8"],
     "algo.ratio_space=sampling with algo.kind=sdpo: its loss also reads the full-vocabulary distribution"),
    ("deterministic-cp", ["{T}", "trainer.deterministic=true", "parallel.cp=2"],
     "trainer.deterministic with parallel.cp=2: context parallelism runs through Transformer Engine's attention"),
    ("bypass-score", ["{T}", "algo.kind=score", "algo.off_policy=bypass"],
     "algo.kind='score' (data path 'two_attempts') cannot run with algo.off_policy=bypass"),
    ("placement-async", ["{T}", "rollout.placement=colocated", "rollout.max_staleness=1"],
     "rollout.placement=colocated needs rollout.max_staleness=0 (got 1): engines and trainer share the GPUs"),
    ("placement-vllm-cpu", ["{T}", "rollout.placement=colocated"],
     "rollout.placement=colocated with rollout.engine=vllm needs CUDA: it has no sleep mode without it"),
    ("placement-nccl", ["{T}", "rollout.placement=colocated", "rollout.engine=hf", "rollout.sync_backend=nccl"],
     "rollout.sync_backend=nccl with rollout.placement=colocated: NCCL cannot put the sender and an engine on one GPU"),
    ("placement-ipc", ["{T}", "rollout.sync_backend=ipc"],
     "rollout.sync_backend=ipc with rollout.placement=separate: CUDA IPC shares memory on one GPU"),
    # issue 31: the silent and weak cases of the third first-hour report
    ("override-twice", ["{T}", "trainer.steps=3", "trainer.steps=5"],
     "override trainer.steps given twice with different values (trainer.steps=3 and trainer.steps=5): keep one"),
    ("yaml-empty", ["train", "--config", "{X}/empty.yaml"], "{X}/empty.yaml: the config file is empty"),
    ("offload-separate", ["{T}", "trainer.offload=all"],
     "trainer.offload=all does nothing with rollout.placement=separate: the trainer parks its state only while"),
    ("rollout-top-k-vocab", ["{T}", "rollout.top_k=64"], "rollout.top_k=64 exceeds the model's vocab_size=32"),
    ("eval-top-k-vocab", ["{T}", "trainer.eval_top_k=33"], "trainer.eval_top_k=33 exceeds the model's vocab_size=32"),
    ("kv-cache-host-memory", ["{T}", "rollout.kv_cache_gib=100000"],
     "rollout.kv_cache_gib=100000 x 1 engine(s) on this host = 100000.0 GiB of KV cache in host memory (vLLM-CPU), but "
     "this host has"),
    ("row-too-long", ["{T}", "data.train={X}/long.parquet"],
     "data.train={X}/long.parquet: row 0: prompt has 41 tokens > max_prompt_len=16"),
    ("row-no-column", ["{T}", "data.train={X}/nocol.parquet"],
     "data.train={X}/nocol.parquet: missing column(s) ['reward_model']; a verl prompt file needs"),
    ("row-null-ground-truth", ["{T}", "data.train={X}/nullgt.parquet"],
     "data.train={X}/nullgt.parquet: row 0: reward_model.ground_truth is missing"),
    ("row-string-prompt", ["{T}", "data.train={X}/strprompt.parquet"],
     "data.train={X}/strprompt.parquet: row 0: 'prompt' must be a list of chat messages {role, content}"),
    ("row-reward-model-string", ["{T}", "data.train={X}/rmstr.parquet"],
     "data.train={X}/rmstr.parquet: row 0: 'reward_model' must be a mapping {ground_truth: ...}, got str '21'"),
    ("val-row-bad", ["{T}", "data.val={X}/nullgt.parquet"], "data.val={X}/nullgt.parquet: row 0: reward_model.ground_truth"),
    ("rows-skipped-below-step", ["{T}", "data.train={X}/halfbad.parquet", "data.on_error=skip"],
     "data.train={X}/halfbad.parquet: 16 usable row(s) (16 skipped), fewer than data.prompts_per_step=32"),
    ("model-no-tokenizer", ["{T}", "model.hf_path={X}/notok_model"],
     "model.hf_path={X}/notok_model: no tokenizer there (sp.model, or tokenizer.json / tokenizer_config.json); set "
     "model.tokenizer_path"),
    ("print-config-with-check", ["train", "--print-config", "--check"],
     "--print-config prints a config and exits; it does not go with --check, --resume or --overwrite"),
    ("print-config-overrides", ["train", "--print-config", "trainer.steps=3"],
     "--print-config prints the defaults; overrides go with --config X"),
    ("print-config-algo-mismatch", ["train", "--print-config", "--config", str(TINY), "model.hf_path={X}/model", "--algo",
                                    "dapo"],
     "--algo dapo but the config's algo.kind is grpo: drop --algo, or add the override algo.kind=dapo"),
    ("tp2-world1", ["{T}", "parallel.tp=2"],
     "parallel.tp=2 x parallel.pp=1 = 2 processes per model replica, but the world size 1 is not divisible by tp*pp=2: "
     "launch 2 processes (torchrun --nproc-per-node 2) or set parallel.tp=1 parallel.pp=1"),
    ("resume-past-steps", ["{T}", "trainer.run_dir={X}/ahead", "trainer.steps=3", "--resume", "auto"],
     "--resume auto: the checkpoint step_5 is at step 5, past trainer.steps=3: nothing to train; set trainer.steps "
     "above 5"),
    ("resume-run-dir", ["{T}", "--resume", "{X}/used"],
     "--resume {X}/used is a training run directory: pass one of its checkpoints, e.g. {X}/used/checkpoints/step_10"),
    ("model-is-run-dir", ["{T}", "model.hf_path={X}/used"],
     "model.hf_path={X}/used is a training run directory, not an HF model dir: it has no HF export (hf/) yet"),
    ("model-is-checkpoint", ["{T}", "model.hf_path={X}/saved/checkpoints/step_1"],
     "model.hf_path={X}/saved/checkpoints/step_1 is a Megatron checkpoint, not an HF model dir: export it with "
     "`megatron-rl convert mcore-to-hf --ckpt {X}/saved/checkpoints/step_1 --out DIR`"),
    ("convert-hf-as-ckpt", ["convert", "mcore-to-hf", "--ckpt", "{X}/model", "--out", "{X}/hfout"],
     "--ckpt {X}/model is an HF model dir, not a Megatron checkpoint: it is in HF format already"),
    ("convert-missing-ckpt", ["convert", "mcore-to-hf", "--ckpt", "{X}/nothing", "--out", "{X}/hfout"],
     "--ckpt {X}/nothing: no such directory (a Megatron checkpoint: COMPLETE + dist/)"),
    ("convert-other-dir", ["convert", "mcore-to-hf", "--ckpt", "{X}/userdir", "--out", "{X}/hfout"],
     "--ckpt {X}/userdir is not a Megatron checkpoint (no COMPLETE marker, no dist/)"),
    ("convert-ckpt-as-hf", ["convert", "hf-to-mcore", "--hf", "{X}/saved/checkpoints/step_1", "--out", "{X}/conv"],
     "--hf {X}/saved/checkpoints/step_1 is a Megatron checkpoint, not an HF model dir"),
    ("convert-run-as-hf", ["convert", "hf-to-mcore", "--hf", "{X}/used", "--out", "{X}/conv"],
     "--hf {X}/used is a training run directory, not an HF model dir"),
    ("eval-model-run-dir", ["eval", "--data", "{X}/train.parquet", "--model", "{X}/used", "--out", "{X}/e"],
     "--model {X}/used is a training run directory, not an HF model dir"),
    ("eval-model-checkpoint", ["eval", "--data", "{X}/train.parquet", "--model", "{X}/saved/checkpoints/step_1", "--out",
                               "{X}/e"], "--model {X}/saved/checkpoints/step_1 is a Megatron checkpoint, not an HF model dir"),
    ("eval-tp2-cpu", ["eval", "--data", "{X}/train.parquet", "--model", "{X}/model", "--tp", "2", "--out", "{X}/e"],
     "--tp 2 with no CUDA GPU: vLLM-CPU runs one tensor-parallel rank per NUMA node and this host has"),
    ("hf-tensor-shape", ["{T}", "model.hf_path={X}/badshape"],
     "model.hf_path={X}/badshape: HF tensor 'model.layers.1.mlp.up_proj.weight' has shape (513, 128), expected (512, "
     "128) for Qwen3ForCausalLM"),
    ("gpt2-dir", ["{T}", "model.hf_path={X}/gpt2"],
     "unsupported architecture 'GPT2LMHeadModel'; supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"),
    # issue 31, the reporter's own cases
    ("yaml-duplicate-key", ["train", "--config", "{X}/dupkey.yaml"],
     "{X}/dupkey.yaml:4:1: YAML syntax error: key 'trainer' appears twice in one mapping (first at line 1); merge the two"),
    ("yaml-not-text", ["train", "--config", "{X}/binary.yaml"], "{X}/binary.yaml: not a UTF-8 text file (byte 0)"),
    ("run-dir-empty", ["{T}", "trainer.run_dir="], "trainer.run_dir is empty: set it to the run's own directory"),
    ("run-dir-is-file", ["{T}", "trainer.run_dir={X}/c.jsonl"],
     "trainer.run_dir={X}/c.jsonl is an existing file, not a directory"),
    ("resume-twice", ["{T}", "--resume", "auto", "--resume", "none"], "--resume given 2 times; give it once"),
    ("config-twice", ["{T}", "--config", str(TINY)], "--config given 2 times; give it once"),
    ("overwrite-working-dir", ["{T}", "trainer.run_dir={X}", "--overwrite"],
     "--overwrite would move everything in trainer.run_dir={X} (the working directory or one of its parents) into an "
     "archive"),
    ("resume-hf-dir", ["{T}", "--resume", "{X}/model"],
     "--resume {X}/model is an HF model dir, not a Megatron checkpoint"),
    ("plan-config-missing", ["plan", "--config", "{X}/none.yaml"], "plan: --config {X}/none.yaml: no such file"),
    ("plan-config-model-missing", ["plan", "--config", str(TINY)],
     "model.hf_path=runs/demo_bicc_rcc/sft_hf: no config.json in runs/demo_bicc_rcc/sft_hf"),
    ("demo-bad-steps", ["demo", "--run-dir", "{X}/demo_new", "--steps", "0"],
     "trainer.steps and micro_batch_size must be >= 1"),
    # issue 55: values a run cannot honour, refused before anything starts
    ("engine-temperature", ["{T}", "rollout.temperature=3.0"],
     "rollout.temperature=3: rollout.engine=vllm refuses it (temperature must be in [0, 2], got 3.0)"),
    ("engine-temperature-floor", ["{T}", "rollout.temperature=0.005"],
     "rollout.temperature=0.005: rollout.engine=vllm refuses it (vLLM raises a temperature below 0.01 to 0.01"),
    ("engine-eval-temperature", ["{T}", "trainer.eval_temperature=2.5"],
     "trainer.eval_temperature=2.5: rollout.engine=vllm refuses it (temperature must be in [0, 2], got 2.5)"),
    ("eval-engine-temperature", ["eval", "--data", "{X}/train.parquet", "--model", "{X}/model", "--temperature", "3",
                                 "--out", "{X}/e"], "--temperature 3.0: the vllm engine refuses it (temperature must be in"),
    ("grader-concurrency-0", ["{T}", "reward.grader_concurrency=0"],
     "reward.grader_concurrency must be in [1, 1024] (concurrent grader requests; 0 would never send one"),
    ("grader-timeout-0", ["{T}", "reward.grader_timeout=0"], "reward.grader_timeout must be > 0 (seconds per grader"),
    ("grader-retries-negative", ["{T}", "reward.grader_retries=-1"], "reward.grader_retries must be >= 0, got -1"),
    ("reward-workers-machine", ["{T}", "reward.workers=100000"],
     "reward.workers=100000 is more than 4 per CPU this process may use"),
    ("step-timeout-negative", ["{T}", "trainer.step_timeout_s=-1"],
     "trainer.step_timeout_s must be >= 0 seconds (0 = no bound), got -1.0"),
    ("clip-low-negative", ["{T}", "algo.grpo.clip_low=-0.1"], "algo.grpo: clip_low=-0.1 must be in [0, 1)"),
    ("partial-deterministic", ["{T}", "rollout.engine=vllm-async", "rollout.partial.enable=true", "trainer.deterministic=true"],
     "trainer.deterministic with rollout.partial.enable=true: which groups finish first"),
    ("partial-groups-past-data", ["{T}", "rollout.engine=vllm-async", "rollout.partial.enable=true",
                                  "rollout.partial.extra_groups=20000"],
     "rollout.partial.extra_groups=20000 + data.prompts_per_step=32 groups in flight exceed the 32 rows of data.train="),
    # issue 49: rollout.partial is a section; its earlier flat keys are refused naming the new one
    ("partial-renamed-flag", ["{T}", "rollout.engine=vllm-async", "rollout.partial=true"],
     "rollout.partial was renamed: use rollout.partial.enable"),
    ("partial-renamed-extra", ["{T}", "rollout.partial_extra_groups=2"],
     "rollout.partial_extra_groups was renamed: use rollout.partial.extra_groups"),
    ("partial-renamed-bound", ["{T}", "rollout.partial_max_staleness=1"],
     "rollout.partial_max_staleness was renamed: use rollout.partial.max_staleness"),
    ("partial-renamed-policy", ["{T}", "rollout.partial_policy=mask"],
     "rollout.partial_policy was renamed: use rollout.partial.policy"),
    ("partial-renamed-yaml", ["train", "--config", "{X}/partial_flat.yaml", "--check"],
     "rollout.partial was renamed: use rollout.partial.enable; rollout.partial_policy was renamed: use "
     "rollout.partial.policy"),
    ("verl-section", ["{T}", "actor_rollout_ref.rollout.n=4"],
     "actor_rollout_ref is verl's (actor_rollout_ref.rollout.n -> rollout.n): every key's equivalent is in "
     "docs/reference/coming-from-verl.md"),
    ("override-bad-form-hint", ["{T}", "reward.by_source.a b=math"],
     "a whole mapping in YAML flow form: 'reward.by_source={openai/gsm8k: math}'"),
    ("plan-vpp-pp1", ["plan", "--model", "qwen3-8b", "--vpp", "2", "--pp", "1"],
     "plan: parallel.vpp=2 (interleaved 1F1B) needs parallel.pp >= 2, got 1"),
    ("plan-attention-twice", ["plan", "--model", "qwen3-8b", "--attention", "flash", "--no-flash-attn"],
     "argument --no-flash-attn: not allowed with argument --attention"),
    ("plan-attention-vs-config", ["plan", "--config", "{X}/local_backend.yaml", "--attention", "flash"],
     "plan: --attention=flash contradicts model.backend of {X}/local_backend.yaml (local)"),
    ("resume-async-staleness", ["{T}", "trainer.run_dir={X}/asyncsaved", "--resume", "auto"],
     "--resume auto (step_1): the checkpoint holds 1 rollout batch(es) generated ahead with rollout.max_staleness=1; "
     "resume with the same value (got 0)"),
    ("resume-partial-off", ["{T}", "trainer.run_dir={X}/partialsaved", "--resume", "auto"],
     "--resume auto (step_1): the checkpoint holds 2 partial-rollout group(s) in flight: resume with rollout.partial.enable=true"),
    # issue 19: a method from outside the package (megatron_rl/plugins.py)
    ("plugin-missing", ["{T}", "plugins=[my_pkg.no_such_method]", "algo.kind=toy"],
     "plugins: cannot import 'my_pkg.no_such_method': no module named 'my_pkg' on sys.path (put the directory"),
    ("plugin-path", ["{T}", "plugins=[./my_method.py]"],
     "plugins: './my_method.py' is not a module name such as my_pkg.my_method (a file path: put its directory"),
]


def make_work(x: Path) -> Path:
    """The files the cases refer to: a stand-in model, data, a used run dir, a user dir, bad YAML."""
    (x / "model").mkdir()
    (x / "model" / "config.json").write_text(json.dumps(TINY_HF))
    from tests.helpers.tiny_model import add_char_tokenizer

    add_char_tokenizer(x / "model")   # preflight tokenises the prompt files
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {"data_source": "reverse", "prompt": [{"role": "user", "content": "12"}], "reward_model": {"ground_truth": "21"}}
    pq.write_table(pa.Table.from_pylist([row] * 32), x / "train.parquet")   # the tiny config's prompts_per_step
    pq.write_table(pa.Table.from_pylist([{**row, "data_source": "Rowan/hellaswag"}] * 32), x / "hellaswag.parquet")
    geo = {**row, "data_source": "hiyouga/geometry3k", "images": [{"bytes": b"\x89PNG", "path": None}]}
    pq.write_table(pa.Table.from_pylist([geo] * 32), x / "geo3k.parquet")   # examples/data_preprocess/geo3k.py's columns
    pq.write_table(pa.Table.from_pylist([row]), x / "one.parquet")
    pq.write_table(pa.Table.from_pylist([row]).slice(0, 0), x / "empty.parquet")
    from tests.helpers.tiny_model import save_zero_weights

    save_zero_weights(x / "model")   # what the start-up checks compare with config.json (headers only)
    (x / "badshape").mkdir()
    (x / "badshape" / "config.json").write_text(json.dumps(TINY_HF))
    add_char_tokenizer(x / "badshape")
    save_zero_weights(x / "badshape", reshape="model.layers.1.mlp.up_proj.weight")
    (x / "oob.jsonl").write_text("".join(f'{{"index": {i}, "response": "1"}}\n' for i in (*range(32), 40)))
    (x / "used" / "checkpoints" / "step_10").mkdir(parents=True)
    (x / "used" / "metrics.jsonl").write_text('{"step": 1}\n')
    (x / "hfuser" / "hf").mkdir(parents=True)
    (x / "hfuser" / "hf" / "notes.txt").write_text("mine")
    (x / "userdir").mkdir()
    (x / "userdir" / "thesis.tex").write_text("keep me")
    (x / "bad.yaml").write_text("model:\n  hf_path: x\n  bf16: [true\ntrainer:\n  steps: 3\n")
    (x / "list.yaml").write_text("- model\n- trainer\n")
    (x / "partial_flat.yaml").write_text("rollout:\n  engine: vllm-async\n  partial: true\n  partial_policy: mask\n")
    (x / "empty.yaml").write_text("# nothing here yet\n")
    (x / "dupkey.yaml").write_text("trainer:\n  steps: 3\nmodel: {bf16: false}\ntrainer:\n  seed: 1\n")
    (x / "binary.yaml").write_bytes(b"\xff\xfe\x00PK")
    bad = {"long": {**row, "prompt": [{"role": "user", "content": "1" * 40}]},
           "nullgt": {**row, "reward_model": {"ground_truth": None}},
           "strprompt": {**row, "prompt": "12"}, "rmstr": {**row, "reward_model": "21"}}
    for name, r in bad.items():
        same_type = name in ("long", "nullgt")   # a parquet column holds one type: the others are bad in every row
        pq.write_table(pa.Table.from_pylist([r] + [row if same_type else r] * 31), x / f"{name}.parquet")
    pq.write_table(pa.Table.from_pylist([{"data_source": "reverse", "prompt": row["prompt"]}] * 32), x / "nocol.parquet")
    pq.write_table(pa.Table.from_pylist([bad["nullgt"], row] * 16), x / "halfbad.parquet")
    (x / "gpt2").mkdir()   # token ids outside its vocabulary: transformers warns while validating such a config
    (x / "gpt2" / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                                                        "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100,
                                                        "bos_token_id": 50256, "eos_token_id": 50256}))
    (x / "notok_model").mkdir()
    (x / "notok_model" / "config.json").write_text(json.dumps(TINY_HF))
    (x / "c.jsonl").write_text('{"index": 0, "response": "1"}\n')
    (x / "c32.jsonl").write_text("".join(f'{{"index": {i}, "response": "21"}}\n' for i in range(32)))
    (x / "badresp.jsonl").write_text('{"index": 0, "response": 12}\n')
    (x / "local_backend.yaml").write_text(f"model:\n  hf_path: {x / 'model'}\n  backend: local\n")
    _saved_run(x)
    _saved_run(x, "ahead", step=5)   # a run past the trainer.steps of a resume
    import torch   # what a checkpoint of an async / a partial run holds in flight (trainer/loop/setup.py)

    _saved_run(x, "asyncsaved")
    torch.save({"async": {"pending": [{"step": 2}], "max_staleness": 1, "sampler": {}}},
               x / "asyncsaved" / "checkpoints" / "step_1" / "extra_state.pt")
    _saved_run(x, "partialsaved")
    torch.save({"async": {"partial": {"pending": [3, 4], "next": 5}}},
               x / "partialsaved" / "checkpoints" / "step_1" / "extra_state.pt")
    return x


def _saved_run(x: Path, name: str = "saved", step: int = 1) -> None:
    """``{X}/saved``: a grpo run as a start leaves it (config.yaml, one complete checkpoint)."""
    from megatron_rl.config import load_config
    from megatron_rl.trainer.state.run_config import save_run_config

    (x / name / "checkpoints" / f"step_{step}").mkdir(parents=True)
    (x / name / "checkpoints" / f"step_{step}" / "COMPLETE").write_text(f'{{"step": {step}}}')
    save_run_config(load_config(TINY, [f"model.hf_path={x / 'model'}", f"data.train={x / 'train.parquet'}", "data.val=",
                                       f"trainer.run_dir={x / name}"]))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return make_work(tmp_path_factory.mktemp("bad"))


def expand(argv: list[str], work: Path) -> list[str]:
    tiny = ["train", "--config", str(TINY), f"model.hf_path={work / 'model'}", f"data.train={work / 'train.parquet'}",
            "data.val=", "trainer.eval_every=0", f"trainer.run_dir={work / 'fresh'}"]   # no held-out set: no eval
    given = {a.split("=", 1)[0] for a in argv if "=" in a and not a.startswith("-")}
    tiny = [a for a in tiny if a.split("=", 1)[0] not in given]   # a case's own value replaces the base one
    out = []
    for a in argv:
        out += tiny if a == "{T}" else [a.replace("{X}", str(work)).replace("{PORT}", str(free_port()))]
    return out + (["--check"] if argv[0] == "{T}" else [])


def run_case(argv: list[str], capsys) -> tuple[int, str]:
    from megatron_rl import cli

    try:
        rc = cli.main(argv)
    except SystemExit as e:   # argparse usage errors
        rc = e.code
    return rc, capsys.readouterr().err


def snapshot(root: Path) -> dict:
    """Every path under ``root`` with its size and modification time (what "nothing changed" compares)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_one_clear_line_before_start(case, work, capsys, monkeypatch):
    import torch.distributed as dist

    _, argv, want = case
    monkeypatch.chdir(work)   # relative paths of the example configs (runs/demo_*) resolve in the work dir
    before = snapshot(work)
    rc, err = run_case(expand(argv, work), capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, f"{argv}: exit {rc}, want 2 (refused before the run starts)"
    assert snapshot(work) == before, f"{argv}: files changed on disk"
    assert len(lines) == 1, f"{argv}: expected one line, got {len(lines)}:\n{err}"
    assert "Traceback" not in err and want.replace("{X}", str(work)) in lines[0], lines[0]
    assert not dist.is_initialized(), "a process group was started before the error"
    assert (work / "userdir" / "thesis.tex").read_text() == "keep me"


#: a key set that would do nothing: the run goes on (``--check`` exit 0), with one warning line naming it
WARN_CASES = [
    ("by-source-typo", ["{T}", "reward.by_source={reverze: math}"],
     "reward.by_source.reverze=math maps nothing: no row of {X}/train.parquet has data_source 'reverze' (did you mean "
     "'reverse'?)"),
    ("partial-knob-off", ["{T}", "rollout.partial.extra_groups=5"],
     "rollout.partial.extra_groups=5 does nothing without rollout.partial.enable=true"),
    ("eval-every-no-val", ["{T}", "trainer.eval_every=25"],   # was a TypeError at step 25 (len of no val set)
     "trainer.eval_every=25 does nothing without a held-out set: set data.val (or trainer.eval_benchmarks)"),
    ("eval-by-source-typo", ["eval", "--data", "{X}/train.parquet", "--completions", "{X}/c32.jsonl", "--out", "{X}/ew",
                             "--reward-by-source", "reverze=math"],
     "--reward-by-source reverze=math maps nothing: no row of --data {X}/train.parquet has data_source 'reverze'"),
]


@pytest.mark.parametrize("case", WARN_CASES, ids=[c[0] for c in WARN_CASES])
def test_inert_setting_is_one_warning_line(case, work, capsys, monkeypatch, caplog):
    """The warning is a logged record (the console shows it: ``--check`` through logging's last-resort
    handler, a run through its console handler; pytest's capture takes it here): exactly one, and no other
    line on stderr but eval's progress bar."""
    import logging

    _, argv, want = case
    monkeypatch.chdir(work)
    with caplog.at_level(logging.WARNING, logger="megatron_rl"):
        rc, err = run_case(expand(argv, work), capsys)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("megatron_rl")]
    other = [ln for ln in err.splitlines() if ln.strip() and "WARNING" not in ln and "row/s" not in ln]   # eval's bar
    assert rc == 0 and "Traceback" not in err, err
    assert not other and len(warned) == 1 and want.replace("{X}", str(work)) in warned[0], (other, warned)


#: launch environments that used to hang (torch.distributed until its 30-min timeout, Ray's retries after the
#: model was built): (id, environment, argv as in CASES but run without --check, expected words); ``{PORT}`` = a
#: port nobody listens on
ENV_CASES = [
    ("torchrun-leftover", {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{PORT}"}, ["{T}"],
     ("MASTER_PORT={PORT} are set but no launcher started this process (no TORCHELASTIC_RUN_ID from torchrun, no "
      "SLURM_PROCID from srun), so the other 1 rank(s) would never join: unset WORLD_SIZE RANK MASTER_ADDR MASTER_PORT")),
    # srun's rank variable with no rank 0 anywhere: the rendezvous is polled for parallel.timeout_s (<= 120 s)
    ("rank1-no-rendezvous", {"WORLD_SIZE": "2", "RANK": "1", "SLURM_PROCID": "1", "MASTER_ADDR": "127.0.0.1",
                             "MASTER_PORT": "{PORT}"}, ["{T}", "parallel.timeout_s=3"],
     "MASTER_ADDR:MASTER_PORT=127.0.0.1:{PORT}: rank 1 of 2 got no rendezvous there within 3 s"),
    ("ray-address-env", {"RAY_ADDRESS": "127.0.0.1:{PORT}"}, ["{T}"],
     "RAY_ADDRESS=127.0.0.1:{PORT}: no Ray cluster answers at 127.0.0.1:{PORT}"),
    ("ray-address-config", {}, ["{T}", "rollout.ray_address=127.0.0.1:{PORT}"],
     "rollout.ray_address=127.0.0.1:{PORT}: no Ray cluster answers at 127.0.0.1:{PORT}"),
    ("ray-address-form", {}, ["{T}", "rollout.ray_address=http://"], "rollout.ray_address=http://: expected HOST:PORT"),
    ("world-size-alone", {"WORLD_SIZE": "2"}, ["{T}"],
     "WORLD_SIZE=2 is set but RANK is not: no launcher started this process, so it would train alone"),
    # the real train path: a bad row is refused before anything is written (no run dir, no config.yaml)
    ("bad-row-before-writing", {}, ["{T}", "data.train={X}/nullgt.parquet"],
     "data.train={X}/nullgt.parquet: row 0: reward_model.ground_truth is missing"),
    ("convert-torchrun-leftover", {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{PORT}"},
     ["convert", "hf-to-mcore", "--hf", "{X}/model", "--out", "{X}/conv"], "are set but no launcher started this process"),
]


@pytest.fixture
def restore_logging():
    """``train`` (unlike ``--check``) sets up its console logging; take it down again after the case."""
    import logging

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    for h in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(h)
    root.setLevel(level)
    logging.captureWarnings(False)


@pytest.mark.parametrize("case", ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_bad_launch_environment_fails_fast_in_one_line(case, work, capsys, monkeypatch, restore_logging):
    """The real ``train`` / ``convert`` path (no ``--check``): one line within 15 s, before
    torch.distributed, Ray or any file of the run starts."""
    import time

    import torch.distributed as dist

    from megatron_rl.runtime.launch_env import LAUNCHER_VARS, TORCH_VARS

    _, env, argv, want = case
    port = str(free_port())
    for k in (*LAUNCHER_VARS, *TORCH_VARS, "RAY_ADDRESS"):   # a suite run under torchrun / Slurm / Ray
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v.replace("{PORT}", port))
    argv = [a for a in expand([a.replace("{PORT}", port) for a in argv], work) if a != "--check"]
    import megatron_rl.convert.checkpoints
    import megatron_rl.trainer.loop.rl_loop  # noqa: F401  (imported before the clock starts: the bound is on the checks)

    before = snapshot(work)
    t0 = time.monotonic()
    rc, err = run_case(argv, capsys)
    took = time.monotonic() - t0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and took <= 15, (rc, took)
    assert len(lines) == 1 and want.replace("{PORT}", port).replace("{X}", str(work)) in lines[0], err
    assert not dist.is_initialized() and snapshot(work) == before


#: launches the checks must let through: Ray's own words, a live head, a 1-process world, a launched rank
GOOD_ENV = [
    ("ray-auto", {"RAY_ADDRESS": "auto"}, []),
    ("ray-local", {"RAY_ADDRESS": "local"}, []),
    ("ray-live-head", {}, ["rollout.ray_address=127.0.0.1:{LIVE}"]),
    ("world-of-one", {"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{PORT}"}, []),
    ("srun-rank1", {"WORLD_SIZE": "2", "RANK": "1", "SLURM_PROCID": "1", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": "{LIVE}"}, []),
    ("torchrun-rank0", {"WORLD_SIZE": "2", "RANK": "0", "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "{PORT}"}, []),
]


@pytest.mark.parametrize("case", GOOD_ENV, ids=[c[0] for c in GOOD_ENV])
def test_good_launch_environment_passes_the_checks(case, work, capsys, monkeypatch):
    """``train --check`` accepts what real launches set (``{LIVE}``: a port that accepts connections,
    standing in for a Ray head or rank 0's store)."""
    from megatron_rl.runtime.launch_env import LAUNCHER_VARS, TORCH_VARS

    _, env, overrides = case
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        sub = {"{PORT}": str(free_port()), "{LIVE}": str(live.getsockname()[1])}

        def fill(v: str) -> str:
            for k, x in sub.items():
                v = v.replace(k, x)
            return v

        for k in (*LAUNCHER_VARS, *TORCH_VARS, "RAY_ADDRESS"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, fill(v))
        rc, err = run_case(expand(["{T}", *map(fill, overrides)], work), capsys)
    assert rc == 0, err


def test_print_config_honours_the_config(work, capsys):
    """``--print-config --config X [a.b=c]``: X's values with the overrides applied, each key still
    described, and the output loads back as the same config (it was the defaults, X ignored)."""
    import yaml

    from megatron_rl.config import load_config

    from megatron_rl import cli
    from megatron_rl.config import TrainerConfig
    from megatron_rl.cli.config_doc import field_doc

    argv = ["train", "--print-config", "--config", str(TINY), f"model.hf_path={work / 'model'}", "trainer.steps=7"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    tree = yaml.safe_load(out)
    assert tree["trainer"]["steps"] == 7 and tree["data"]["max_prompt_len"] == 16 and tree["rollout"]["max_tokens"] == 6
    assert f"# {field_doc(TrainerConfig, 'steps').splitlines()[0]}" in out
    assert load_config(None, []).trainer.steps != 7 and load_config(None, []).data.max_prompt_len != 16


def test_unknown_characters_are_warned_and_counted(work, caplog):
    """Characters outside the tokenizer's vocabulary: the run goes on (a logged, counted fallback), the
    start-up checks say how many rows and which characters, and how many ground truths the policy
    can never write."""
    import logging

    import pyarrow as pa
    import pyarrow.parquet as pq

    from megatron_rl.config import load_config
    from megatron_rl.trainer.loop.preflight_inputs import check_prompts, prompt_datasets

    rows = [{"data_source": "reverse", "prompt": [{"role": "user", "content": c}], "reward_model": {"ground_truth": g}}
            for c, g in [("12", "21")] * 28 + [("1\u00e92", "2\u00e91")] * 3 + [("1x2", "21")]]
    pq.write_table(pa.Table.from_pylist(rows), work / "unk.parquet")
    cfg = load_config(TINY, [f"model.hf_path={work / 'model'}", f"data.train={work / 'unk.parquet'}", "data.val="])
    with caplog.at_level(logging.WARNING, logger="megatron_rl.data"):
        check_prompts(cfg)
    train, _ = prompt_datasets(cfg)
    assert len(train) == 32 and (train.unknown.rows, train.unknown.answer_rows) == (4, 3)
    assert train.unknown.chars == {"\u00e9", "x"}
    msgs = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert msgs == [f"{work / 'unk.parquet'}: 4 of 32 rows hold characters the tokenizer does not know ('x', '\u00e9'), "
                    "read as its unknown token; 3 of them in the ground truth, which the policy can never write (reward "
                    "0): fix the data or use a tokenizer that covers them"]


def test_read_only_places_are_one_line_before_anything(work, tmp_path, capsys, monkeypatch):
    """A read-only ``trainer.run_dir``, ``eval --out``, ``convert --out``: one line naming the key and
    "read-only", exit 2, before the log file beside / inside the output is opened (it was a raw OSError,
    or "not enough free space" on a tiny read-only mount)."""
    from megatron_rl.runtime.diskspace import DiskSpaceError, NotWritableError, check_free
    from tests.helpers.tmpfs import read_only_tmpfs

    monkeypatch.chdir(work)
    with read_only_tmpfs(tmp_path / "ro") as ro:
        with pytest.raises(NotWritableError, match="read-only file system") as e:
            check_free(ro / "ckpt", 1, "checkpoint step_1")
        assert not isinstance(e.value, DiskSpaceError)
        for argv, want in [
            (expand(["{T}", f"trainer.run_dir={ro}/run"], work), f"trainer.run_dir {ro}/run: {ro} is on a read-only file"),
            (["eval", "--data", str(work / "train.parquet"), "--completions", str(work / "c.jsonl"), "--out", f"{ro}/e"],
             f"--out {ro}/e: {ro} is on a read-only file system; nothing was written"),
            (["convert", "hf-to-mcore", "--hf", str(work / "model"), "--out", f"{ro}/conv"],
             f"--out {ro}/conv: {ro} is on a read-only file system"),
        ]:
            rc, err = run_case(argv, capsys)
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert rc == 2 and len(lines) == 1 and want in lines[0], (argv, rc, err)
            assert "free space" not in err and "Traceback" not in err


def test_a_failed_eval_leaves_no_output_that_needs_force(work, tmp_path, capsys):
    """An eval that failed before writing anything leaves only its marker in ``--out``: the rerun
    writes there without ``--force`` (user files and finished outputs are still protected)."""
    from megatron_rl.eval.out_dir import MARKER

    out = tmp_path / "e"
    out.mkdir()
    (out / MARKER).write_text("{}")   # what a failed `eval --model` (engine start-up) left
    argv = ["eval", "--data", str(work / "train.parquet"), "--completions", str(tmp_path / "c.jsonl"), "--out", str(out)]
    (tmp_path / "c.jsonl").write_text("".join(f'{{"index": {i}, "response": "21"}}\n' for i in range(32)))
    rc, err = run_case(argv, capsys)
    assert rc == 0, err
    assert (out / "summary.json").is_file()
    rc, err = run_case(argv, capsys)   # now a finished output: --force needed, as before
    assert rc == 2 and "pass --force to replace it" in err


def test_the_table_has_enough_rows():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


if __name__ == "__main__":   # print the table (input -> message) for the notes
    import contextlib
    import io
    import tempfile

    x = make_work(Path(tempfile.mkdtemp()))
    print("| # | input | message |\n|---|---|---|")
    for n, (cid, argv, _) in enumerate(CASES, 1):
        buf = io.StringIO()
        with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(io.StringIO()):
            from megatron_rl import cli

            try:
                cli.main(expand(argv, x))
            except SystemExit:
                pass
        shown = " ".join(a for a in argv if a != "{T}").replace(str(x), "X")
        print(f"| {n} | `{shown}` | {buf.getvalue().strip().replace('|', '/').replace(str(x), 'X')} |")


#: a verl ``data_source`` of each family of verl's table (issue 40), as its preprocessing script names it
VERL_SOURCES = ["openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math_dapo", "aime24",
                "numina_olympiads"]


@pytest.mark.parametrize("source", VERL_SOURCES)
def test_verl_made_files_pass_train_check_with_no_reward_line(source, work, capsys, monkeypatch):
    """``train --check`` accepts a file of a verl data_source with no ``reward.by_source`` and no ``reward.default``
    (the tiny config's fallback cleared): verl's table picks its rule (tests/unit/rewards/test_verl_table.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from megatron_rl.runtime.launch_env import LAUNCHER_VARS, TORCH_VARS

    for k in (*LAUNCHER_VARS, *TORCH_VARS, "RAY_ADDRESS"):
        monkeypatch.delenv(k, raising=False)
    row = {"data_source": source, "prompt": [{"role": "user", "content": "12"}], "ability": "math",
           "reward_model": {"style": "rule", "ground_truth": "21"}, "extra_info": {"split": "train", "index": 0}}
    path = work / f"verl_{source.replace('/', '_')}.parquet"
    pq.write_table(pa.Table.from_pylist([row] * 32), path)
    rc, err = run_case(expand(["{T}", f"data.train={path}", "reward.default="], work), capsys)
    assert rc == 0, err


def test_the_engine_sampling_check_leaves_the_trainer_process_alone():
    """``rollout.temperature`` & co. are asked of vLLM's own ``SamplingParams`` in a child process
    (``EngineCaps.sampling_refusals``): the trainer's process gets the answer -- vLLM's words for 3.0, None for
    0.7 -- without importing vLLM, whose import sets ``TORCHINDUCTOR_COMPILE_THREADS`` and ``LD_LIBRARY_PATH``
    for every process the trainer starts afterwards."""
    import subprocess
    import sys

    script = ("import json, os, sys\n"
              "before = dict(os.environ)\n"
              "from megatron_rl.rollout.engine import SamplingParams\n"
              "from megatron_rl.rollout.registry import caps\n"
              "out = caps('vllm').sampling_refusals([(SamplingParams(temperature=3.0), 'processed'),"
              " (SamplingParams(temperature=0.7, top_k=20), 'processed')])\n"
              "print(json.dumps([out, any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules),"
              " sorted(k for k in os.environ if before.get(k) != os.environ[k])]))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False,
                       cwd=REPO, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-2000:]
    (hot, fine), loaded, changed = json.loads(r.stdout.strip().splitlines()[-1])
    assert hot == ["temperature", "temperature must be in [0, 2], got 3.0"] and fine is None
    assert not loaded and not changed, (loaded, changed)
