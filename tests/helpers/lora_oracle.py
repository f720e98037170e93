"""The PEFT oracle of the LoRA tests: a tiny random HF model, a random PEFT adapter on it (``peft`` with
``init_lora_weights=False``: B is random too, so the adapters change the logits), and what ``peft`` +
``transformers`` compute with it — the logits with the adapters on and off and the adapters' gradients of
``Σ logits · w`` — for ``tests/distributed/workers/lora_parity.py`` to be compared with.
Not a test module; imported by the tests."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from tests.helpers.dist import REPO, repo_env
from tests.helpers.fp32_tolerance import reorder_rtol

WORKER = REPO / "tests" / "distributed" / "workers" / "lora_parity.py"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA = 4, 8.0
HIDDEN, FFN, HEADS, KV, HEAD_DIM, LAYERS, VOCAB, SEQ = 64, 96, 4, 2, 32, 2, 100, 12


def make_oracle(root: Path, targets=TARGETS) -> dict:
    """HF dir, PEFT adapter dir and ``ref.pt`` (ids, loss weights w, PEFT logits / base logits / grads) in ``root``."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HEAD_DIM, max_position_embeddings=64,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, architectures=["Qwen3ForCausalLM"])
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    base = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in base.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in n else 0.2 * torch.randn_like(p))
    hf_dir = root / "hf"
    base.save_pretrained(str(hf_dir))
    model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=list(targets),
                                            init_lora_weights=False)).eval()
    with torch.no_grad():                     # B as large as A: the adapters move the logits by O(1)
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(0.3 * torch.randn_like(p))
    peft_dir = root / "peft_in"
    model.save_pretrained(str(peft_dir))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=g)
    w = torch.randn(2, SEQ, VOCAB, generator=g)
    logits = model(ids).logits
    (logits * w).sum().backward()
    grads = {n.replace(".default", ""): p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    with torch.no_grad(), model.disable_adapter():
        base_logits = model(ids).logits
    ref = {"ids": ids, "w": w, "logits": logits.detach(), "base": base_logits, "grads": grads}
    torch.save(ref, root / "ref.pt")
    return {"hf": hf_dir, "peft": peft_dir, "ref": ref, "root": root}


def run_worker(oracle: dict, out: Path, tp: int = 1, sp: bool = False, nproc: int = 1) -> dict:
    """The Megatron side (``lora_parity.py``): a plain process at nproc 1, torchrun otherwise; its ``res.pt``."""
    args = [str(oracle["hf"]), str(oracle["peft"]), str(oracle["root"] / "ref.pt"), str(out), str(tp), "1" if sp else "0"]
    if nproc == 1:
        env = repo_env()
        env["OMP_NUM_THREADS"] = "1"
        p = subprocess.run([sys.executable, str(WORKER), *args], cwd=REPO, env=env, capture_output=True, text=True, check=False,
                           timeout=600)
        assert p.returncode == 0, p.stderr[-6000:]
    else:
        from tests.helpers.dist import torchrun

        torchrun(WORKER, *args, nproc=nproc)
    return torch.load(out / "res.pt")


def logits_atol(ref_logits: torch.Tensor) -> float:
    """|Megatron − PEFT| bound of the logits: the fp32 reorderings of one forward (per layer the q/k/v/o and
    MLP products over hidden / heads·d / FFN, the adapters' rank-r products, attention over SEQ, the norms;
    then the LM head over hidden) on values of the logits' magnitude."""
    per_layer = [HIDDEN, HIDDEN, HEADS * HEAD_DIM, SEQ, HEAD_DIM, HIDDEN, FFN, RANK, RANK]
    return reorder_rtol(per_layer * LAYERS + [HIDDEN]) * float(ref_logits.abs().max())


def grad_rtol() -> float:
    """Relative bound on an adapter gradient: the forward's reorderings and the backward's transposed products,
    each gradient summed over the 2·SEQ tokens."""
    per_layer = [HIDDEN, HIDDEN, HEADS * HEAD_DIM, SEQ, HEAD_DIM, HIDDEN, FFN, RANK, RANK, 2 * SEQ]
    return 2 * reorder_rtol(per_layer * LAYERS + [HIDDEN, VOCAB])


def peft_logits(hf_dir: Path, adapter_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    """Logits of the HF base at ``hf_dir`` with the PEFT adapter at ``adapter_dir`` (PEFT's own loader)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(hf_dir), attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        return PeftModel.from_pretrained(base, str(adapter_dir)).eval()(ids).logits


def hf_logits(hf_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(str(hf_dir), attn_implementation="eager",
                                                    dtype=torch.float32).eval()(ids).logits


def adapter_config(d: Path) -> dict:
    return json.loads((d / "adapter_config.json").read_text())
