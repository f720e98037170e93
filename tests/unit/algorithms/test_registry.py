"""Registries, the algo-kind table, hyper-parameter dataclasses and the AlgoInputs bundle; the
package's architecture rules (torch + stdlib only, small files, docstrings) and the start-up
checks of a kind's config (required inputs per data path, optimizer clip, removed keys)."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
from pathlib import Path

import pytest
import torch

import megatron_rl.algorithms as A
from megatron_rl.algorithms import registry as R
from tests.helpers.algo_builders import D, random_inputs

REQUIRED_KINDS = {"grpo", "dapo", "drgrpo", "remax", "rloo", "bicc", "bicc_rcc", "rlcsd", "opsd", "sdpo", "srpo",
                  "rlsd", "opsd_ectr", "rlsd_ectr", "papo", "score"}


def test_public_names_exist():
    for name in ("grpo_advantage", "rloo_advantage", "remax_advantage", "bicc_advantage", "rcc_advantage",
                 "papo_advantage", "ppo_clip_loss", "aggregate", "kl_penalty", "rlcsd_signal", "rlcsd_advantage",
                 "register_advantage", "register_policy_loss", "get_advantage", "get_policy_loss",
                 "advantage_names", "policy_loss_names", "required_inputs", "AlgoInputs", "ALGO_KINDS"):
        assert callable(getattr(A, name)) or isinstance(getattr(A, name), dict), name
        assert getattr(A, name).__doc__ or isinstance(getattr(A, name), dict), f"{name} lacks a docstring"


def test_every_kind_is_registered_and_defaults_construct():
    assert REQUIRED_KINDS <= set(A.ALGO_KINDS)
    for kind, (adv, loss, hp_cls, *_) in A.ALGO_KINDS.items():
        assert adv in A.advantage_names() and loss in A.policy_loss_names(), kind
        hp = hp_cls()
        assert dataclasses.is_dataclass(hp) and hp_cls.__dataclass_params__.frozen


def test_duplicate_registration_raises():
    with pytest.raises(ValueError, match="already registered"):
        A.register_advantage("grpo")(lambda x, hp: x.rewards)
    with pytest.raises(ValueError, match="already registered"):
        A.register_policy_loss("ppo_clip")(lambda x, a, hp: None)


def test_unknown_name_lists_sorted_valid_names():
    with pytest.raises(KeyError) as e:
        A.get_advantage("grpoo")
    assert str(sorted(A.advantage_names())) in str(e.value)
    with pytest.raises(KeyError) as e:
        A.get_policy_loss("ppo")
    assert str(A.policy_loss_names()) in str(e.value)
    with pytest.raises(KeyError, match="valid"):
        A.algo_kind("grpo2")


def test_register_custom_and_declared_needs_checked():
    with pytest.raises(ValueError, match=r"declares unregistered input\(s\) \['not_a_field'\]"):
        A.register_advantage("tmp_bad_needs", needs=("not_a_field",))
    try:
        @A.register_advantage("tmp_scaled", needs=("process",))
        def _tmp(x, hp):
            """test estimator: reward times process score"""
            return x.rewards * x.process
        assert A.get_advantage("tmp_scaled") is _tmp
        assert A.required_inputs("tmp_scaled", "rlsd") == {"process", "logp", "old_logp", "teacher_logp"}
    finally:
        R._ADVANTAGES.pop("tmp_scaled", None)


@pytest.mark.parametrize("kind,expected", [
    ("grpo", {"logp", "old_logp", "ref_logp"}),   # KL loss 0.001 needs ref
    ("dapo", {"logp", "old_logp"}),
    ("remax", {"logp", "old_logp", "greedy_rewards"}),
    ("papo", {"logp", "old_logp", "process"}),
    ("rlcsd", {"logp", "old_logp", "teacher_logp", "teacher_neg_logp", "teacher_neg_mask"}),
    ("opsd", {"student_topk", "teacher_topk"}),
    ("srpo", {"logp", "old_logp", "student_topk", "teacher_topk", "teacher_entropy"}),
    ("bicc_rcc", {"logp", "old_logp", "ref_logp"}),
])
def test_kind_required_inputs(kind, expected):
    assert A.kind_required_inputs(kind) == expected


def test_rcc_remax_base_needs_greedy():
    hp = A.BiCCRCCHParams(base="remax")
    assert "greedy_rewards" in A.kind_required_inputs("bicc_rcc", hp)
    assert "greedy_rewards" not in A.kind_required_inputs("bicc_rcc")


def test_missing_inputs_fail_clearly():
    x = A.AlgoInputs(rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]), mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"advantage 'remax' needs input\(s\) \['greedy_rewards'\]"):
        A.compute_advantages("remax", x)
    with pytest.raises(ValueError, match=r"\['logp', 'old_logp'\]"):
        A.compute_policy_loss("dapo", x, torch.zeros(2))


def test_inputs_shape_validation_names_field():
    with pytest.raises(ValueError, match=r"input 'old_logp' has shape \(2, 4\); expected \('N', 'T'\) with N=2, T=3"):
        A.AlgoInputs(rewards=torch.zeros(2), group_ids=torch.zeros(2, dtype=torch.long), mask=torch.ones(2, 3),
                     old_logp=torch.zeros(2, 4))
    x = random_inputs()
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.rewards = torch.zeros(3)


@pytest.mark.parametrize("cls,kw,msg", [
    (A.GRPOHParams, {"scale": "x"}, "scale"),
    (A.PPOHParams, {"dual_clip": 1.0}, "dual_clip"),
    (A.PPOHParams, {"loss_agg_mode": "mean"}, "loss_agg_mode"),
    (A.PPOHParams, {"kl_loss_type": "k4"}, "kl_loss_type"),
    (A.BiCCHParams, {"old_logprob_context": "both"}, "old_logprob_context"),
    (A.BiCCRCCHParams, {"rcc_delta": "max"}, "rcc_delta"),
    (A.RLCSDHParams, {"loss_agg_mode": "token-mean"}, "token-sum"),
    (A.ScoreHParams, {"stage": 3}, "stage"),
])
def test_hparams_validate(cls, kw, msg):
    with pytest.raises(ValueError, match=msg):
        cls(**kw)


def test_vocab_bounded_declares_every_top_k_field():
    """Start-up checks a method's top-k supports against the vocabulary by its declaration
    (``PPOHParams.vocab_bounded``): every hparams class with a ``top_k`` field declares it, no other does."""
    classes = {k.hparams for k in A.ALGO_KINDS.values()} | {A.PPOHParams}
    for cls in classes:
        has = "top_k" in {f.name for f in dataclasses.fields(cls)}
        assert cls().vocab_bounded() == ({"top_k": cls().top_k} if has else {}), cls.__name__


def test_spec_defaults():
    assert A.DAPOHParams().clip_high == 0.28 and A.DAPOHParams().kl_loss_coef == 0
    assert A.DrGRPOHParams().loss_agg_mode == "seq-mean-token-sum-norm"
    r = A.RLCSDHParams()
    assert (r.tau, r.beta, r.lam, r.delta, r.eta, r.k_max, r.clip_lo, r.clip_hi) == (0.02, 1.0, 0.5, 0.02, 1.0, 4, -2, 2)
    assert A.RLSDECTRHParams().kl_loss_coef == 0.001 and A.RLSDHParams().lam_decay is False
    assert A.OPSDHParams().grad_clip == 0.1 and A.SDPOHParams().alpha == 0.5
    assert A.BiCCHParams().context_budget(5120) == 2048
    assert A.ScoreHParams().alpha == 10.0 and A.PAPOHParams().lam == 1.0


@pytest.mark.parametrize("kind", sorted(REQUIRED_KINDS))
def test_end_to_end_every_kind(kind):
    x = random_inputs(seed=7)
    hp = A.ALGO_KINDS[kind].hparams()
    adv = A.compute_advantages(kind, x, hp)
    assert adv.shape == x.rewards.shape and torch.isfinite(adv).all()
    obj = A.compute_policy_loss(kind, x, adv, hp)
    assert obj.loss.dim() == 0 and torch.isfinite(obj.loss)
    assert all(v.dim() == 0 for v in obj.metrics.values())
    torch.testing.assert_close(obj.loss, obj.pg_loss + hp.kl_loss_coef * obj.kl_loss)


def test_registered_grpo_equals_public_function():
    x = random_inputs(seed=8)
    torch.testing.assert_close(A.get_advantage("grpo")(x, A.GRPOHParams()), A.grpo_advantage(x.rewards, x.group_ids))
    assert x.rewards.dtype == D


@pytest.mark.parametrize("ov,want", [(["algo.kind=opsd"], 0.1), (["algo.kind=grpo"], 1.0),
                                     (["algo.kind=opsd", "optim.clip_grad=0.5"], 0.5),
                                     (["algo.kind=grpo", "optim.clip_grad=0"], 0.0)])
def test_optim_clip_grad_reaches_the_optimizer(ov, want):
    from megatron_rl.config import load_config
    from megatron_rl.trainer.loop.setup import _optim_spec

    assert _optim_spec(load_config(None, ov)).clip_grad == want


def test_required_inputs_are_checked_at_start_up():
    from megatron_rl.config import load_config
    from megatron_rl.trainer.paths import get_path

    c = load_config(None, ["algo.kind=remax"])
    get_path("greedy").validate(c)
    with pytest.raises(ValueError, match=r"remax.*\['greedy_rewards'\].*'plain'"):
        get_path("plain").validate(c)


def test_one_sample_per_prompt_is_the_kinds_registration():
    """``rollout.n=1`` is refused for a kind registered with a group (the default) and allowed for one
    registered ``needs_group=False``: preflight asks the registry, a user's method declares it too."""
    from megatron_rl.trainer.loop.preflight import load_checked

    assert A.single_sample_kinds() == ["opsd", "remax", "score", "sdpo"]
    with pytest.raises(ValueError, match=r"rollout.n=1 with algo.kind=grpo: .*\(n=1 suits opsd, remax, score, sdpo\)"):
        load_checked(None, ["rollout.n=1"])
    assert load_checked(None, ["algo.kind=remax", "rollout.n=1"]).rollout.n == 1
    try:
        A.register_algo_kind("toy_one", advantage="rloo", loss="ppo_clip", hparams=A.GRPOHParams, needs_group=False)
        A.register_algo_kind("toy_group", advantage="rloo", loss="ppo_clip", hparams=A.GRPOHParams)
        assert load_checked(None, ["algo.kind=toy_one", "rollout.n=1"]).algo.kind == "toy_one"
        with pytest.raises(ValueError, match="rollout.n=1 with algo.kind=toy_group: .*suits opsd, remax, score, sdpo, toy_one"):
            load_checked(None, ["algo.kind=toy_group", "rollout.n=1"])
    finally:
        A.ALGO_KINDS.pop("toy_one", None)
        A.ALGO_KINDS.pop("toy_group", None)


def test_removed_trainer_max_gen_batches_is_rejected():
    from megatron_rl.config import load_config

    with pytest.raises(Exception, match="max_gen_batches"):
        load_config(None, ["trainer.max_gen_batches=3"])


PKG = Path(A.__file__).parent


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
