"""The stages of the GPU bring-up (``tools/gpu_check_run.py`` runs them in order; ``docs/gpu-status.md``).

Each stage is ``fn(state, args) -> dict``: it reads what earlier stages left in ``state`` (the parallel
info, the HF dir, the actor, ...), adds what it makes, and returns its record (``ok`` False when a check
failed; an exception fails it with the error line). Every figure is measured here, on this device.

Each stage imports the package inside its function on purpose: an import error (a module that moved, a
package the lent machine lacks) then fails that stage alone, with its line in the record.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch

GIB = 1 << 30
#: dense bf16 peak FLOP/s of the devices the bring-up is lent (vendor datasheets, SXM parts), for MFU
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
TINY = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
        "vocab_size": 256, "tie_word_embeddings": True}


def _sync() -> None:
    from megatron_rl.runtime.device import synchronize

    synchronize()


def _dev() -> torch.device:
    from megatron_rl.runtime.device import default_device

    return default_device()


def c_compiler() -> tuple[str | None, str]:
    """The C compiler Triton would build its launcher with, as ``triton/runtime/build.py:_find_compiler``
    picks it (``$CC``, else ``gcc``, else ``clang`` on ``PATH``), and the first line of its ``--version`` —
    (None, why) when there is none or it does not run."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None, "no gcc or clang on PATH and CC unset"
    try:
        r = subprocess.run([*cc.split(), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{cc} --version: {type(e).__name__}: {e}"
    first = (r.stdout or r.stderr).strip().splitlines()[:1]
    return (cc, first[0] if first else "") if r.returncode == 0 else (None, f"{cc} --version exited {r.returncode}")


def python_include_dir() -> str:
    """Where Triton looks for ``Python.h`` (``triton/runtime/build.py``: the default scheme's include path,
    ``posix_prefix`` for Debian's ``posix_local``)."""
    scheme = sysconfig.get_default_scheme()
    return sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]


def toolchain_missing(compiler: str | None, include_dir: str, why_no_compiler: str = "") -> list[str]:
    """What Triton's launcher build lacks here, one line each naming the Debian / Ubuntu package: a C
    compiler (``compiler`` None) and ``Python.h`` in ``include_dir``. On CUDA megatron's ``jit_fuser`` is
    ``torch.compile`` (``bias_swiglu``, ``bias_dropout_add``), whose Triton kernels need both at the first
    call; without them the train step fails there, minutes into the run."""
    out = []
    if compiler is None:
        out.append(f"no C compiler ({why_no_compiler or 'none found'}): Triton builds its launcher with one "
                   "(torch.compile of megatron's fusions on CUDA); apt-get install gcc (or set CC)")
    if not (Path(include_dir) / "Python.h").is_file():
        v = f"{sys.version_info.major}.{sys.version_info.minor}"
        out.append(f"no Python.h in {include_dir}: Triton's launcher includes the Python headers; "
                   f"apt-get install python{v}-dev")
    return out


def stage_env(state: dict, a) -> dict:
    """The device, the stack against the supported versions (``runtime/stack.py``), Transformer Engine's
    import, the layer backend ``auto`` resolves to, the patches applied, the process group; and the C
    toolchain Triton needs (:func:`toolchain_missing`: a C compiler and the Python headers), whose absence
    fails the stage with one line naming what is missing and the package to install."""
    from megatron_rl import patches
    from megatron_rl.models.provider import resolve_model_backend, te_import_error
    from megatron_rl.runtime import stack
    from megatron_rl.runtime.determinism import nccl_version
    from megatron_rl.runtime.device import has_cuda, total_memory
    from megatron_rl.runtime.parallel import init_parallel

    state["info"] = init_parallel(1, 1, seed=0)
    cuda = has_cuda()
    state["cuda"], state["backend"] = cuda, resolve_model_backend("auto")
    rows = stack.report()
    mcore = next(r for r in rows if r["package"] == "megatron-core")
    rec = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "cuda": cuda,
           "device": torch.cuda.get_device_name(0) if cuda else "cpu", "device_gib": round(total_memory() / GIB, 1),
           "stack": {r["package"]: r["installed"] for r in rows},
           "stack_mismatches": [r["mismatch"] for r in rows if r["mismatch"]],
           "transformer_engine": te_import_error() or "imports", "backend": state["backend"],
           "patches_applied": sorted(patches.applied())}
    cc, cc_line = c_compiler()
    include = python_include_dir()
    missing = toolchain_missing(cc, include, cc_line)
    rec.update(c_compiler=cc, c_compiler_version=cc_line if cc else None, python_include=include,
               python_h=(Path(include) / "Python.h").is_file(), nccl=nccl_version())
    rec["ok"] = mcore["installed"] is not None and mcore["mismatch"] is None and not missing
    if missing:
        rec["error"] = "; ".join(missing)
    return rec


def stage_checkpoint(state: dict, a) -> dict:
    """A random HF checkpoint of ``--shape`` drawn on the device (bf16), written to ``WORK/model``."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from megatron_rl.planning.arch import PRESETS

    hf = dict(TINY if a.shape == "tiny" else PRESETS[a.shape])
    hf.update(max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6, bos_token_id=1, eos_token_id=2,
              pad_token_id=0, torch_dtype="bfloat16")
    cfg = AutoConfig.for_model(**hf)
    with torch.device("meta"):                       # names and shapes only
        shapes = {n: p.shape for n, p in AutoModelForCausalLM.from_config(cfg).named_parameters()}
    dev = _dev()
    g = torch.Generator(device=dev).manual_seed(0)
    t0 = time.perf_counter()
    tensors = {n: (torch.ones(s, device=dev, dtype=torch.bfloat16) if "norm" in n else
                   torch.randn(s, generator=g, device=dev, dtype=torch.bfloat16) * 0.02) for n, s in shapes.items()}
    _sync()
    drawn = time.perf_counter() - t0
    out = Path(a.work) / "model"
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(out))
    save_file({n: t.cpu() for n, t in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    state["hf_dir"], state["hf"] = str(out), hf
    n = sum(t.numel() for t in tensors.values())
    return {"shape": a.shape, "params": n, "bytes": (out / "model.safetensors").stat().st_size,
            "drawn_on": str(dev), "draw_s": round(drawn, 3)}


def stage_actor(state: dict, a) -> dict:
    """The policy in bf16 with the distributed optimizer (DP = 1) and the frozen reference, as ``setup_run``
    builds them, after the local-attention check a run's preflight makes."""
    from megatron_rl.models.provider import (
        check_local_attention,
        load_hf_config,
        local_attention_bytes,
        recompute_overrides,
        te_import_error,
    )
    from megatron_rl.runtime.device import memory_allocated, total_memory
    from megatron_rl.trainer.policy.actor import PolicyActor, ReferencePolicy
    from megatron_rl.trainer.policy.optim import OptimSpec

    hf_cfg = load_hf_config(state["hf_dir"])
    need = local_attention_bytes(hf_cfg, tp=1, pp=1, tokens=a.seq_len, row_len=a.seq_len, bf16=True)
    warn = check_local_attention("auto", state["backend"], need, total_memory(), te_import_error())
    actor = PolicyActor(hf_cfg, state["info"], OptimSpec(lr=1e-6, bf16=True), temperature=1.0,
                        backend=state["backend"], recompute=recompute_overrides(a.recompute, "uniform", 1))
    actor.load_hf(state["hf_dir"])
    ref = ReferencePolicy(hf_cfg, 1.0, bf16=True, parallel_info=state["info"], backend=state["backend"])
    ref.load_hf(state["hf_dir"])
    _sync()
    state.update(actor=actor, ref=ref, hf_cfg=hf_cfg)
    return {"backend": actor.backend, "dist_opt": True, "local_attention_warning": warn,
            "allocated_gib": round(memory_allocated() / GIB, 2)}


def stage_roundtrip(state: dict, a) -> dict:
    """HF -> Megatron -> HF: every tensor the actor exports equals the file it loaded, bit for bit."""
    from safetensors import safe_open

    bad, names = [], []
    with safe_open(str(Path(state["hf_dir"]) / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        for name, t in state["actor"].hf_weights():
            names.append(name)
            if name not in keys or not torch.equal(t.cpu(), f.get_tensor(name)):
                bad.append(name)
    tied = {"lm_head.weight"} if state["hf"].get("tie_word_embeddings") else set()
    missing = sorted(keys - set(names) - tied)
    return {"tensors": len(names), "mismatched": bad[:10], "missing": missing[:10], "ok": not bad and not missing}


def _random_batch(vocab: int, rows: int, seq: int, seed: int):
    from megatron_rl.trainer.pipeline.batch import make_batch

    g = torch.Generator().manual_seed(seed)
    half = seq // 2
    prompts = [torch.randint(3, vocab, (half,), generator=g).tolist() for _ in range(rows)]
    resps = [torch.randint(3, vocab, (seq - half,), generator=g).tolist() for _ in range(rows)]
    return make_batch(prompts, resps, pad_id=0, extras={"advantages": torch.randn(rows, generator=g)}, seq_len=seq)


def _hf_logprobs(hf_dir: str, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype, attn_implementation="eager").to(_dev()).eval()
    with torch.no_grad():
        logits = model(tokens.to(_dev())).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, tokens[:, 1:].to(_dev()).unsqueeze(-1)).squeeze(-1).cpu()
    del model, logits
    return lp


def stage_parity(state: dict, a) -> dict:
    """Per-token log-probs of the Megatron reference against HF transformers' model on the same device, in
    fp32 (a second Megatron reference in fp32) and bf16 (the bring-up's reference), full-length random rows."""
    from megatron_rl.runtime.device import release_cached_memory
    from megatron_rl.trainer.policy.actor import ReferencePolicy

    batch = _random_batch(int(state["hf"]["vocab_size"]), 2, a.parity_len, seed=3)
    rec, ok = {}, True
    for name, tol in (("fp32", a.tol_fp32), ("bf16", a.tol_bf16)):
        if name == "fp32":
            model = ReferencePolicy(state["hf_cfg"], 1.0, bf16=False, parallel_info=state["info"], backend=state["backend"])
            model.load_hf(state["hf_dir"])
        else:
            model = state["ref"]
        ours = model.forward_logprobs(batch, 1).logp.float().cpu()
        theirs = _hf_logprobs(state["hf_dir"], batch.tokens, torch.float32 if name == "fp32" else torch.bfloat16)
        d = (ours - theirs).abs()
        rec[name] = {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "tol_max": tol}
        ok = ok and float(d.max()) <= tol
        del model
        release_cached_memory()
    rec["ok"] = ok
    return rec


def _flops_per_token(hf: dict, seq: int) -> float:
    """Model FLOPs of one trained token (forward + backward = 3 x forward): 6 per weight of every matmul
    (Q, K, V, O, gate, up, down, the output layer) plus 12 x L x (heads x head_dim) x s for the two attention
    products over the full s x s scores (local attention computes them all)."""
    h, L, f, V = hf["hidden_size"], hf["num_hidden_layers"], hf["intermediate_size"], hf["vocab_size"]
    d = hf.get("head_dim") or h // hf["num_attention_heads"]
    q, kv = hf["num_attention_heads"] * d, hf["num_key_value_heads"] * d
    matmul = L * (h * (q + 2 * kv) + q * h + 3 * h * f) + V * h
    return 6.0 * matmul + 12.0 * L * q * seq


def _plan(state: dict, a):
    from megatron_rl.planning.arch import ArchSpec
    from megatron_rl.planning.memory import PlanInputs, estimate

    return estimate(ArchSpec.from_hf(state["hf"], a.shape), PlanInputs(
        tp=1, pp=1, dp=1, micro_batch=1, seq_len=a.seq_len, dtype="bf16", reference=True, recompute=a.recompute,
        attention="flash" if state["backend"] == "te" else "local", fused_swiglu=state["cuda"], colocated=False,
        rollout_seqs=1, overhead_gib=0))


def _loss(logp, entropy, mb):
    """PPO surrogate + k3 KL to the reference, token mean."""
    from megatron_rl.trainer.pipeline.objective import partial_aggregate

    ratio = torch.exp(logp - mb.extras["old_logp"])
    d = mb.extras["ref_logp"] - logp
    mat = -mb.extras["advantages"].unsqueeze(-1) * ratio + 1e-3 * (torch.exp(d) - d - 1)
    s, n = partial_aggregate(mat, mb.loss_mask, "token-mean")
    return s, n, {}


def stage_train(state: dict, a) -> dict:
    """``--steps`` optimizer steps on ``--rows`` random rows of ``--seq-len`` tokens (one per micro-batch):
    tokens/s, model FLOP/s and MFU of the steps after the first, the device peak beside plan's estimate."""
    from megatron_rl.planning.memory import score_total
    from megatron_rl.runtime.device import peak_memory, release_cached_memory

    actor = state["actor"]
    batch = _random_batch(int(state["hf"]["vocab_size"]), a.rows, a.seq_len, seed=1)
    release_cached_memory()
    peak_memory(reset=True)
    batch.extras["ref_logp"] = state["ref"].forward_logprobs(batch, 1).logp
    batch.extras["old_logp"] = actor.forward_logprobs(batch, 1).logp
    losses, secs = [], []
    for _ in range(a.steps):
        _sync()
        t0 = time.perf_counter()
        res = actor.train_step(batch, _loss, micro_batch_size=1)
        _sync()
        secs.append(time.perf_counter() - t0)
        losses.append(res.loss)
    peak = peak_memory()
    timed = secs[1:] or secs
    tok_s = a.rows * a.seq_len / (sum(timed) / len(timed))
    flops = tok_s * _flops_per_token(state["hf"], a.seq_len)
    name = torch.cuda.get_device_name(0) if state["cuda"] else "cpu"
    peak_flops = next((v for k, v in PEAK_BF16.items() if k in name), None)
    plan = _plan(state, a)
    state["trained"] = True
    return {"losses": losses, "step_s": [round(s, 4) for s in secs], "tokens_per_s": round(tok_s, 1),
            "model_tflops": round(flops / 1e12, 3), "mfu": round(flops / peak_flops, 4) if peak_flops else None,
            "peak_allocated_gib": round(peak["allocated"] / GIB, 3), "peak_reserved_gib": round(peak["reserved"] / GIB, 3),
            "plan_train_gib": round(plan.train_total / GIB, 3), "plan_scores_gib": round(score_total(plan) / GIB, 3),
            "plan_attention": plan.inputs.attention,
            "measured_over_plan": round(peak["allocated"] / plan.train_total, 3) if peak["allocated"] else None,
            "ok": all(math.isfinite(x) for x in losses)}


def stage_scores(state: dict, a) -> dict:
    """Bytes autograd keeps per S x S score element of the attention the layers run, measured: the saved
    tensors of one forward of the actor's model at three sequence lengths s, s + d, s + 2d (unique storages),
    whose second difference / (2 d^2) is the s^2 coefficient, / (heads x layers) per element; plan's figure beside it."""
    from megatron_rl.planning.memory import PlanInputs, attention_bytes
    from megatron_rl.trainer.policy.chunks import unwrap

    model = unwrap(state["actor"].chunks[0])
    s0, step = a.score_len, a.score_len // 2
    sizes = []
    for s in (s0, s0 + step, s0 + 2 * step):
        seen: dict[int, int] = {}

        def pack(t):
            st = t.untyped_storage()
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
            return t

        tokens = torch.randint(3, int(state["hf"]["vocab_size"]), (1, s), device=_dev())
        pos = torch.arange(s, device=_dev()).unsqueeze(0)
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(tokens, pos, None)
        del out
        sizes.append(sum(seen.values()))
    heads, layers = state["hf"]["num_attention_heads"], state["hf"]["num_hidden_layers"]
    measured = (sizes[2] - 2 * sizes[1] + sizes[0]) / (2 * step * step) / (heads * layers)
    planned = attention_bytes(PlanInputs(dtype="bf16", attention="flash" if state["backend"] == "te" else "local"))[0]
    # each layer also keeps its boolean causal mask (s x s, shared by the heads): 1 / heads per element, which
    # plan leaves out (1.6 % at 16 heads)
    return {"bytes_per_score_measured": round(measured, 4), "bytes_per_score_plan": planned,
            "mask_per_score": round(1 / heads, 4), "saved_bytes": sizes,
            "ok": abs(measured - planned - 1 / heads) <= 0.05 if planned else abs(measured) <= 0.05}


#: torchrun's / init_distributed's variables of this process: the train step's own process must not see them
#: (it would join this process's world-1 group instead of starting its own)
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
             "MASTER_PORT", "TORCHELASTIC_RUN_ID", "RAY_ADDRESS")


def stage_train_step(state: dict, a) -> dict:
    """One ``megatron-rl train`` step, the real command in its own process (world 1; the trainer on this
    device, CUDA on a GPU), with the HF engine as its one Ray actor (``rollout.placement=colocated``: one GPU
    serves both), on a tiny Qwen3 of the demo's reversal task (data, character tokenizer and model written
    to ``WORK/train_step`` as ``megatron-rl demo`` writes them, untrained). Top-k 8 / top-p 0.95, so the
    start-up probe (``startup_gate``), the μ pass and the update's frames all run: the path review row B1
    says fails on a GPU when the log-prob passes return device tensors against host frames. Records the
    exit status, the steps in ``metrics.jsonl`` and, on a failure, the last lines of its stderr.

    Ray is what ``megatron-rl train`` starts its engines with (the HF engine's only weight transport is
    ``ray``); a machine without it (the lent GPU machine's image) records the stage as skipped with that
    reason — not a failure, and not run."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return {"skipped": "megatron-rl train starts its engines as Ray actors (the HF engine's only weight "
                           "transport is ray) and Ray is not installed here", "ran": False}
    from megatron_rl.cli.demo import make_tiny_policy
    from megatron_rl.data.synthetic import task_texts, write_task
    from megatron_rl.data.tokenizer import SentencePieceTokenizer

    work = Path(a.work) / "train_step"
    shutil.rmtree(work, ignore_errors=True)
    paths = write_task("reverse", work / "data", seed=0, sizes={"train": 64, "val": 8, "test": 8})
    hf = make_tiny_policy(work / "hf", SentencePieceTokenizer.train(task_texts("reverse"), work / "tokenizer"), 0)
    run_dir = work / "run"
    cmd = [sys.executable, "-m", "megatron_rl.cli", "train", "--config",
           str(Path(__file__).resolve().parents[1] / "examples" / "configs" / "tiny_cpu_grpo.yaml"),
           f"model.hf_path={hf}", f"data.train={paths['train']}", "data.val=", f"trainer.run_dir={run_dir}",
           "trainer.steps=1", "data.prompts_per_step=4", "rollout.n=4", "trainer.micro_batch_size=8",
           "rollout.engine=hf", "rollout.placement=colocated", "rollout.top_k=8", "rollout.top_p=0.95",
           "logging.wandb_mode=disabled"]
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=a.train_step_timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"megatron-rl train ran past --train-step-timeout {a.train_step_timeout:.0f} s"}
    metrics = run_dir / "metrics.jsonl"
    rows = [ln for ln in metrics.read_text().splitlines() if ln.strip()] if metrics.is_file() else []
    rec = {"ran": True, "exit_status": p.returncode, "wall_s": round(time.perf_counter() - t0, 1),
           "trainer_device": "cuda" if state.get("cuda") else "cpu", "steps": len(rows),
           "ok": p.returncode == 0 and len(rows) == 1}
    if rows:   # what the first GPU run should report (review rows W1 / B1): the engine-trainer gap under truncation
        last = json.loads(rows[-1])
        rec["metrics"] = {k: last[k] for k in ("rollout/logprob_gap", "rollout/outside_support_frac", "actor/entropy",
                                               "time/step") if k in last}
    if not rec["ok"]:
        tail = [ln for ln in p.stderr.splitlines() if ln.strip()][-6:]
        rec.update(error=(tail[-1] if tail else f"exit status {p.returncode}, {len(rows)} step(s)")[:400], stderr_tail=tail)
    return rec


def stage_mu_pass(state: dict, a) -> dict:
    """Time and peak device memory of the μ pass (``trainer/policy/vocab_parallel.vocab_parallel_sampled_logprobs``,
    top-k 20 / top-p 0.95: the flagship recipes' sampler) on one fp32 logits shard of ``--mu-rows`` x
    ``--mu-vocab`` (default 8192 x 151936, Qwen3's vocabulary at TP = 1: 4.6 GiB; on CPU, the rehearsal,
    256 rows), beside the plain log-prob pass (``vocab_parallel_logprobs``) on the same shard; no grad (the
    old-log-prob pass). The targets are each row's top token (always kept), so every log μ must be finite
    and <= 0. Review row S1 puts the transient at about 7x the shard and the time at about one more forward;
    this is the measurement. Peak memory is the CUDA allocator's above the shard (0 on CPU)."""
    from megatron_rl.algorithms.sampling import SamplingSpec
    from megatron_rl.runtime.device import memory_allocated, peak_memory, release_cached_memory
    from megatron_rl.trainer.policy.vocab_parallel import vocab_parallel_logprobs, vocab_parallel_sampled_logprobs

    rows = a.mu_rows or (8192 if state.get("cuda") else 256)
    dev = _dev()
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(rows, a.mu_vocab, generator=g, device=dev, dtype=torch.float32) * 2.0
    targets = logits.argmax(-1)
    spec = SamplingSpec(temperature=1.0, top_k=20, top_p=0.95)
    shard = logits.numel() * logits.element_size()
    rec: dict = {"shape": [rows, a.mu_vocab], "dtype": "float32", "shard_gib": round(shard / GIB, 3), "top_k": 20,
                 "top_p": 0.95, "device": str(dev)}
    passes = {"plain": lambda: vocab_parallel_logprobs(logits, targets).logp,
              "sampled": lambda: vocab_parallel_sampled_logprobs(logits, targets, spec)}
    out = None
    with torch.no_grad():
        for name, fn in passes.items():
            fn()                                              # warm-up (kernels, allocator)
            _sync()
            release_cached_memory()
            base = memory_allocated()
            peak_memory(reset=True)
            secs = []
            for _ in range(a.mu_repeats):
                _sync()
                t0 = time.perf_counter()
                res = fn()
                _sync()
                secs.append(time.perf_counter() - t0)
            peak = peak_memory()["allocated"]
            rec[f"{name}_ms"] = round(1e3 * sum(secs) / len(secs), 2)
            rec[f"{name}_peak_over_shard"] = round((peak - base) / shard, 2) if peak else None
            rec[f"{name}_peak_gib"] = round(peak / GIB, 3) if peak else None
            out = res
    logp, kept = out.logp, out.kept
    rec["sampled_over_plain"] = round(rec["sampled_ms"] / rec["plain_ms"], 2) if rec["plain_ms"] else None
    rec["targets_kept"] = float(kept.float().mean())
    rec["ok"] = bool(torch.isfinite(logp).all() and (logp <= 0).all() and kept.all())
    return rec


def release_memory() -> None:
    """Hand the caching allocator's free blocks back (before the tests' own processes take the device)."""
    from megatron_rl.runtime.device import release_cached_memory

    release_cached_memory()
