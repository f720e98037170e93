"""Packed token-budget micro-batches (``trainer/pipeline/packing.py``) against padded ones, same global batch
and weights, at TP=1, TP=2 + SP, PP=2 and DP=2 (two torchrun launches): per-sequence log-probs,
entropies and supports, and one optimizer step's loss, gradient norm and KL for the PPO clip, RLCSD's two-path
loss, SCoRe and SDPO's train-time student support (fp32, local spec).

Packing changes only the order and blocking of fp32 reductions, so the tolerances come from the arithmetic
(``tests/helpers/fp32_tolerance.py``): a per-token value (log-prob, entropy, support) within 2·Σγ̃_k of the
forward's reduction lengths k, relative to its magnitude (the log-sum-exp it subtracts is at most
max|value| + log V); a step's loss and gradient norm within the forward + backward + token-sum bound times
κ = Σ|terms| / |loss| that the worker measures (``workers/actor_packing.py:measured``); the KL (k3 >= 0) at κ = 1."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.helpers.dist import torchrun
from tests.helpers.fp32_tolerance import (
    reorder_rtol,
    tiny_qwen3_path,
    transformer_forward,
)

WORKERS = Path(__file__).parent / "workers"
LAYOUTS = {"tp1": (1, 1, 1, 0), "tp2_sp": (2, 2, 1, 1), "pp2": (2, 1, 2, 0), "dp2": (2, 1, 1, 0)}
KINDS = ("grpo", "rlcsd", "score", "sdpo")
SEQ = 48                    #: the worker's sequence length (``build_seq_batch(..., 48, 40)``)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from tests.helpers.actor_common import make_tiny_hf

    d = tmp_path_factory.mktemp("packing")
    hf = make_tiny_hf(d / "hf")
    for nproc in (1, 2):
        cases = [":".join(map(str, (name, *v[1:]))) for name, v in LAYOUTS.items() if v[0] == nproc]
        torchrun(WORKERS / "actor_packing.py", str(hf), str(d), *cases, nproc=nproc, timeout=900)
    out = {name: json.loads((d / f"{name}.json").read_text()) for name in LAYOUTS}
    out["_hf"] = json.loads((hf / "config.json").read_text())
    return out


def _forward(cfg: dict) -> list[int]:
    return transformer_forward(cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"], cfg["num_attention_heads"],
                               cfg["num_key_value_heads"], cfg["num_hidden_layers"], cfg["vocab_size"], SEQ)


def _step_tol(results, rec: dict, cond: float) -> float:
    """One optimizer step's loss / gradient-norm bound at condition number ``cond``."""
    return reorder_rtol(tiny_qwen3_path(results["_hf"], SEQ, rec["tokens"], rec["params"]), cond)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_packed_passes_equal_padded(results, name):
    r, cfg = results[name], results["_hf"]
    lens = r["lens"]
    assert max(lens) / sorted(lens)[len(lens) // 2] >= 8          # long-tailed
    rtol = reorder_rtol(_forward(cfg))
    for key in ("logp", "entropy", "topk_logp", "at_ids"):
        ref = torch.tensor(r["padded"][key])
        diff = (torch.tensor(r["packed"][key]) - ref).abs().max().item()
        tol = rtol * (ref.abs().max().item() + math.log(cfg["vocab_size"]))
        print(f"{name} {key}: max |packed - padded| {diff:.2e}, bound {tol:.2e}")
        assert diff <= tol, (name, key, diff, tol)
    assert r["packed"]["topk_idx"] == r["padded"]["topk_idx"]


def test_step_tolerances_keep_their_power(results):
    """Each step bound stays below half of one response token's share of the loss's magnitude, so a lost or
    doubly counted token (the failure packing could bring) still fails: tol·|loss| < Σ|terms| / (2·tokens)."""
    for kind in KINDS:
        a = results["tp1"]["padded"][kind]
        tol = _step_tol(results, a, a["cond"])
        mag = a["cond"] * abs(a["loss"])
        print(f"{kind}: loss {a['loss']:.4g}, κ {a['cond']:.3g}, tolerance {tol:.2e} = {tol * abs(a['loss']):.2e} absolute;"
              f" one token {mag / a['tokens']:.2e}")
        assert tol * abs(a["loss"]) < mag / (2 * a["tokens"]), (kind, a, tol)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_packed_train_step_equals_padded(results, name, kind):
    a, b = results[name]["padded"][kind], results[name]["packed"][kind]
    cond = results["tp1"]["padded"][kind]["cond"]       # κ of the data and weights, the same in every layout
    for k in ("loss", "grad_norm", "kl"):
        tol = _step_tol(results, a, 1.0 if k == "kl" else cond)
        print(f"{name} {kind} {k}: relative difference {abs(a[k] - b[k]) / max(abs(a[k]), 1e-30):.2e}, bound {tol:.2e}")
        assert abs(a[k] - b[k]) <= tol * abs(a[k]), (name, kind, k, a[k], b[k], tol)


def test_filler_micro_batch_adds_no_row_to_metrics(results):
    """DP=2, one rank's second micro-batch is a zero-mask filler: loss, grad norm and EVERY metric of the
    step equal the padded path's, which runs a zero-mask padding copy instead (neither is in any
    average's denominator; ``workers/actor_packing.py:filler_case``)."""
    f = results["dp2"]["filler"]
    assert f["rank_micro_batches"] == [[1, 1], [1, 0]]          # rank 1: one sequence, then a filler
    params = results["dp2"]["padded"]["grpo"]["params"]
    for kind, a in f["padded"].items():
        b = f["packed"][kind]
        assert set(a) == set(b) and "actor/kl_loss" in a
        # every metric is an average of per-token terms of the same forward and backward: the loss's bound
        # at the larger κ of the two paths (a metric's own κ is at most its loss's)
        cond = max(f["cond"][f"padded/{kind}"], f["cond"][f"packed/{kind}"])
        tol = _step_tol(results, {"tokens": f["tokens"], "params": params}, cond)
        for k in a:
            diff = abs(a[k] - b[k])
            print(f"filler {kind} {k}: |packed - padded| {diff:.2e}, bound {tol * abs(a[k]):.2e}")
            assert diff <= tol * abs(a[k]), (kind, k, a[k], b[k], tol)
