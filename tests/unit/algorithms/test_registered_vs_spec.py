"""The registered adapters (AlgoInputs → pure functions → aggregate) reproduce the spec numbers,
plus DAPO sampling, in-reward KL and the architecture rules of the package."""
from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest
import torch

import megatron_rl.algorithms as A

D = torch.float64
PKG = Path(A.__file__).parent


def t(x):
    return torch.tensor(x, dtype=D)


def test_rlcsd_kind_reproduces_R1():
    lw = torch.zeros(2, 2, 4, dtype=D)
    lw[0, 0], lw[0, 1] = t([-0.60, -1.0005, -0.20, -3.00]), t([-0.50, -0.9990, -0.30, -2.00])
    lw[1, 0] = t([-0.68, -0.10, -1.50, 0.0])
    x = A.AlgoInputs(rewards=t([1, 0]), group_ids=torch.tensor([0, 0]), mask=t([[1, 1, 1, 1], [1, 1, 1, 0]]),
                     logp=torch.zeros(2, 4, dtype=D), old_logp=torch.zeros(2, 4, dtype=D),
                     teacher_logp=t([[-0.40, -1.00, -0.25, -1.00], [-0.70, -0.20, -1.40, 0.0]]),
                     teacher_neg_logp=lw, teacher_neg_mask=torch.tensor([[True, True], [True, False]]))
    obj = A.compute_policy_loss("rlcsd", x, t([2.474874, -0.353553]))
    torch.testing.assert_close(obj.loss, t(-3.609135), atol=1e-6, rtol=0)


def test_rlsd_kind_reproduces_37_with_and_without_decay():
    base = dict(rewards=t([1, 0]), group_ids=torch.tensor([0, 1]), mask=torch.ones(2, 3, dtype=D),
                logp=t([[-1.0, -0.2, -0.7], [-0.3, -2.0, -0.1]]), old_logp=t([[-1.0, -0.2, -0.7], [-0.3, -2.0, -0.1]]),
                teacher_logp=t([[-0.5, -0.3, -0.7], [-1.0, -1.9, -0.1]]))
    adv = t([1.5, -0.5])
    obj = A.compute_policy_loss("rlsd", A.AlgoInputs(**base, step=26), adv)
    torch.testing.assert_close(obj.loss, t(-0.508736), atol=1e-6, rtol=0)  # constant λ = 0.5 by default
    obj = A.compute_policy_loss("rlsd", A.AlgoInputs(**base, step=26), adv, A.RLSDHParams(lam_decay=True))
    torch.testing.assert_close(obj.loss, t(-0.504368), atol=1e-6, rtol=0)  # λ_26 = 0.25


def test_opsd_kind_reproduces_34():
    pt, ps = A.topk_tail_support(t([[2, 1, 0.5, -1, -2], [0, 3, 0, -1, 1]]),
                                 t([[1, 1.5, 0, 0, -1], [0.5, 2, 0.5, 0, 0.5]]), k=3)
    x = A.AlgoInputs(rewards=t([1, 0]), group_ids=torch.tensor([0, 0]), mask=torch.ones(2, 1, dtype=D),
                     student_topk=ps[:, None], teacher_topk=pt[:, None])
    torch.testing.assert_close(A.compute_policy_loss("opsd", x, torch.zeros(2, dtype=D)).loss, t(-0.106646),
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("stage,expected", [(1, 0.292023), (2, 1.449235)])
def test_score_kind_reproduces_310(stage, expected):
    x = A.AlgoInputs(
        rewards=t([1.0, 0.25]), group_ids=torch.tensor([0, 1]), mask=t([[1, 1, 1, 1], [1, 1, 0, 0]]),
        logp=t([[-0.2, -0.6, -0.4, -0.3], [-1.0, -0.5, 0, 0]]), ref_logp=t([[-0.3, -0.6, -0.5, -0.3], [-0.8, -0.9, 0, 0]]),
        first_logp=t([[-0.5, -1.0, -0.2, 0.0], [-0.1, -0.3, -2.0, -0.4]]),
        first_ref_logp=t([[-0.7, -1.0, -0.1, 0.0], [-0.1, -0.2, -1.0, -0.9]]),
        first_mask=t([[1, 1, 1, 0], [1, 1, 1, 1]]), first_rewards=t([0.5, 0.25]))
    hp = A.ScoreHParams(stage=stage)
    adv = A.compute_advantages("score", x, hp)
    torch.testing.assert_close(A.compute_policy_loss("score", x, adv, hp).loss, t(expected), atol=1e-6, rtol=0)


def test_dynamic_sampler_accumulates_and_raises_past_the_limit():
    s = A.DynamicSampler(train_prompts=3, max_num_gen_batches=2)
    kept = s.add(t([1, 0, 1, 1, 0, 0]), torch.tensor([0, 0, 1, 1, 2, 2]))  # only group 0 has signal
    assert kept.tolist() == [0, 1] and not s.ready and s.filtered_prompts == 2
    s.add(t([1, 0, 0, 1, 1, 1]), torch.tensor([3, 3, 4, 4, 5, 5]))
    assert s.ready and s.kept_prompts == 3 and s.take(2) == 6
    with pytest.raises(RuntimeError, match="max_num_gen_batches=2"):
        s.add(t([1, 0]), torch.tensor([6, 6]))


def test_kl_in_reward_and_adaptive_controller():
    # k1 = old − ref = [0.5, 0.1 | 0.2, (off-mask)]; β = 0.1 → rewards − 0.1·k1·m
    out = A.apply_kl_in_reward(t([[0, 1], [0, 0]]), t([[-1.0, -0.4], [-0.3, -9.0]]), t([[-1.5, -0.5], [-0.5, 0.0]]),
                               t([[1, 1], [1, 0]]), beta=0.1)
    torch.testing.assert_close(out.token_rewards, t([[-0.05, 0.99], [-0.02, 0.0]]))
    torch.testing.assert_close(out.mean_kl, t((0.3 + 0.2) / 2))  # mean of per-sequence masked means
    c = A.AdaptiveKLController(value=0.1, target=0.05, horizon=100)
    assert c.update(0.5, 10) == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))  # error clipped at +0.2


def test_remax_kind_uses_greedy_rewards():
    x = A.AlgoInputs(rewards=t([1, 0]), group_ids=torch.tensor([0, 0]), mask=torch.ones(2, 1, dtype=D),
                     greedy_rewards=t([0.5, 0.5]))
    torch.testing.assert_close(A.compute_advantages("remax", x), t([0.5, -0.5]))


def _imports(path: Path) -> set:
    tree = ast.parse(path.read_text())
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            mods.add(node.module.split(".")[0])
    return mods


def test_package_imports_torch_and_stdlib_only_and_files_stay_small():
    allowed = set(sys.stdlib_module_names) | {"torch", "__future__"}
    for f in PKG.glob("*.py"):
        bad = _imports(f) - allowed
        assert not bad, f"{f.name} imports {sorted(bad)}"
        assert len(f.read_text().splitlines()) < 600, f"{f.name} is too long"


def test_public_functions_have_docstrings():
    for name in A.__all__:
        obj = getattr(A, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert inspect.getdoc(obj), f"megatron_rl.algorithms.{name} has no docstring"


def test_distill_support_fields_pick_the_right_chooser():
    teacher = t([[[2, 1, 0.5, -1, -2], [0, 3, 0, -1, 1]]])
    student = t([[[1, 1.5, 0, 0, -1], [0.5, 2, 0.5, 0, 0.5]]])
    f = A.distill_support_fields("opsd", student, teacher, k=3)
    torch.testing.assert_close(f["teacher_topk"][0, 0, :3].exp(), t([0.602732, 0.221733, 0.134488]), atol=1e-6,
                               rtol=0)  # teacher's own top-3 = its three largest probabilities
    g = A.distill_support_fields("sdpo", student, teacher, teacher_neg_logits=teacher, k=3)
    torch.testing.assert_close(A.generalized_jsd(g["student_topk"], g["teacher_topk"])[0], t([0.067689, 0.038209]),
                               atol=1e-6, rtol=0)
    assert set(g) == {"student_topk", "teacher_topk", "teacher_neg_topk"}
    with pytest.raises(KeyError, match="valid"):
        A.distill_support_fields("rlsd", student, teacher)
    h = A.full_entropy(teacher)
    p = torch.softmax(teacher, -1)
    torch.testing.assert_close(h, -(p * p.log()).sum(-1))
