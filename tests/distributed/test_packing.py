"""Packed token-budget micro-batches (``trainer/pipeline/packing.py``) against padded ones, same global batch
and weights, at TP=1, TP=2 + SP, PP=2 and DP=2 (two torchrun launches): per-sequence log-probs,
entropies and supports to 1e-5 (fp32, local spec), and one optimizer step's loss and gradient norm to
1e-5 for the PPO clip, RLCSD's two-path loss, SCoRe and SDPO's train-time student support."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.dist import torchrun

WORKERS = Path(__file__).parent / "workers"
LAYOUTS = {"tp1": (1, 1, 1, 0), "tp2_sp": (2, 2, 1, 1), "pp2": (2, 1, 2, 0), "dp2": (2, 1, 1, 0)}
KINDS = ("grpo", "rlcsd", "score", "sdpo")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from tests.helpers.actor_common import make_tiny_hf

    d = tmp_path_factory.mktemp("packing")
    hf = make_tiny_hf(d / "hf")
    for nproc in (1, 2):
        cases = [":".join(map(str, (name, *v[1:]))) for name, v in LAYOUTS.items() if v[0] == nproc]
        torchrun(WORKERS / "actor_packing.py", str(hf), str(d), *cases, nproc=nproc, timeout=900)
    return {name: json.loads((d / f"{name}.json").read_text()) for name in LAYOUTS}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_packed_passes_equal_padded(results, name):
    r = results[name]
    lens = r["lens"]
    assert max(lens) / sorted(lens)[len(lens) // 2] >= 8          # long-tailed
    for key in ("logp", "entropy", "topk_logp", "at_ids"):
        diff = (torch.tensor(r["packed"][key]) - torch.tensor(r["padded"][key])).abs().max().item()
        assert diff <= 1e-5, (name, key, diff)
    assert r["packed"]["topk_idx"] == r["padded"]["topk_idx"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_packed_train_step_equals_padded(results, name, kind):
    a, b = results[name]["padded"][kind], results[name]["packed"][kind]
    for k in ("loss", "grad_norm", "kl"):
        assert abs(a[k] - b[k]) <= 1e-5 * max(abs(a[k]), 1.0), (name, kind, k, a[k], b[k])


def test_filler_micro_batch_adds_no_row_to_metrics(results):
    """DP=2, one rank's second micro-batch is a zero-mask filler: loss, grad norm and EVERY metric of the
    step equal the padded path's, which runs a zero-mask padding copy instead (neither is in any
    average's denominator; ``workers/actor_packing.py:filler_case``)."""
    f = results["dp2"]["filler"]
    assert f["rank_micro_batches"] == [[1, 1], [1, 0]]          # rank 1: one sequence, then a filler
    for kind, a in f["padded"].items():
        b = f["packed"][kind]
        assert set(a) == set(b) and "actor/kl_loss" in a
        for k in a:
            assert abs(a[k] - b[k]) <= 1e-5 * max(abs(a[k]), 1.0), (kind, k, a[k], b[k])
