"""The input registry (``algorithms/inputs.py``): strict registration, the frozen bundle's typed access
and checks, and the trainer carrying an input it has never heard of by its registration alone
(padding copies, the objective's policy gathers)."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import megatron_rl.algorithms as A
from megatron_rl.algorithms import inputs as I


@pytest.fixture
def scratch():
    """Names registered by a test are removed afterwards."""
    before = set(I._INPUTS)
    yield
    for k in set(I._INPUTS) - before:
        del I._INPUTS[k]


def _bundle(**kw):
    return A.AlgoInputs(rewards=torch.zeros(2), group_ids=torch.zeros(2, dtype=torch.long), mask=torch.ones(2, 3), **kw)


def test_registration_is_strict(scratch):
    with pytest.raises(ValueError, match="input 'old_logp' is already registered"):
        A.register_input("old_logp", ("N", "T"))
    with pytest.raises(ValueError, match=r"dtype='double' not in \['float', 'int', 'bool', 'any'\]"):
        A.register_input("tmp_x", ("N",), "double")
    with pytest.raises(ValueError, match="must lead with 'N'"):
        A.register_input("tmp_x", ("T", "N"))
    with pytest.raises(ValueError, match=r"policy='teacher' not in \['logp', 'support'\]"):
        A.register_input("tmp_x", ("N", "T"), policy="teacher")
    for clash in ("replace", "keys", "_hidden", "not-a-name"):
        with pytest.raises(ValueError, match="must be an identifier"):
            A.register_input(clash, ("N",))
    assert "tmp_x" not in A.input_names()


def test_roles_follow_the_declared_dims():
    assert {n: A.input_spec(n).role for n in ("rewards", "old_logp", "teacher_neg_mask", "teacher_topk", "step")} == \
        {"rewards": "sequence", "old_logp": "token", "teacher_neg_mask": "sequence", "teacher_topk": "token",
         "step": "scalar"}
    with pytest.raises(KeyError, match="unknown input 'nope'; registered: "):
        A.input_spec("nope")


def test_bundle_access_is_typed_and_frozen():
    x = _bundle(old_logp=torch.zeros(2, 3), ref_logp=None, step=4)
    assert x.present() == {"rewards", "group_ids", "mask", "old_logp", "step"} == set(x)
    assert x.ref_logp is None and x["step"] == 4 and len(x) == 5          # registered but absent: None
    with pytest.raises(AttributeError, match="AlgoInputs has no input 'old_lgp'"):
        _ = x.old_lgp
    with pytest.raises(ValueError, match=r"input 'ref_logp' is not in this step's AlgoInputs"):
        x.tensor("ref_logp")
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.old_logp = None
    y = x.replace(old_logp=None, ref_logp=torch.ones(2, 3))
    assert y.present() == {"rewards", "group_ids", "mask", "ref_logp", "step"} and x.old_logp is not None


@pytest.mark.parametrize("kw,msg", [
    ({"group_ids": torch.zeros(2)}, "input 'group_ids' must be int, got torch.float32"),
    ({"correct": torch.ones(2)}, "input 'correct' must be bool"),
    ({"teacher_neg_logp": torch.zeros(2, 4, 5)}, r"input 'teacher_neg_logp' has shape \(2, 4, 5\); expected \('N', 'K', 'T'\)"),
    ({"rlcsd_counts": torch.zeros(2, 3)}, r"expected \('N', 2\)"),
    ({"step": torch.tensor(3)}, "input 'step' is a scalar, got Tensor"),
])
def test_bundle_checks_shape_and_dtype(kw, msg):
    base = {"rewards": torch.zeros(2), "group_ids": torch.zeros(2, dtype=torch.long), "mask": torch.ones(2, 3)}
    with pytest.raises(ValueError, match=msg):
        A.AlgoInputs(**{**base, **kw})


def test_padding_copies_use_each_inputs_filler(scratch):
    """``TrainBatch.zero_masked``: the response mask and every registered input with a filler (a plugin's
    too) take the filler's rows; other extras are copied as they are."""
    from megatron_rl.trainer.pipeline.batch import TrainBatch

    A.register_input("tmp_keep", ("N", "K"), "float", filler=lambda v: torch.full_like(v, 7.0))
    ex = {"resp_mask": torch.ones(2, 3), "tmp_keep": torch.ones(2, 2), "old_logp": torch.full((2, 3), -1.0),
          "teacher_neg_mask": torch.ones(2, 3, dtype=torch.bool)}
    z = TrainBatch(torch.ones(2, 4, dtype=torch.long), torch.ones(2, 3), ex).zero_masked()
    assert z.loss_mask.sum() == 0 and z.extras["resp_mask"].sum() == 0
    assert (z.extras["tmp_keep"] == 7).all() and (z.extras["old_logp"] == -1).all()
    assert z.extras["teacher_neg_mask"].tolist() == [[True, False, False]] * 2   # one negative slot stays valid


def test_objective_gathers_a_registered_policy_input_at_its_index(scratch):
    """An input registered with ``policy="logp"`` and its own position key is gathered from the current
    policy's log-probs by the objective, with no code naming it."""
    from megatron_rl.trainer.pipeline.objective import Objective

    A.register_input("tmp_logp_at", ("N", "U"), policy="logp", index="tmp_pos")
    logp = torch.arange(10.0).reshape(2, 5)
    ex = {"resp_mask": torch.ones(2, 2), "resp_pos": torch.tensor([[1, 2], [3, 4]]), "rewards": torch.zeros(2),
          "group_ids": torch.zeros(2, dtype=torch.long), "tmp_pos": torch.tensor([[0, 0, 4], [1, 2, 3]])}
    mb = SimpleNamespace(extras=ex)
    x = Objective("grpo", A.GRPOHParams(), mb).inputs(logp, mb)
    assert x.logp.tolist() == [[1.0, 2.0], [8.0, 9.0]]
    assert x.tmp_logp_at.tolist() == [[0.0, 0.0, 4.0], [6.0, 7.0, 8.0]]
    assert x.step is None and "tmp_pos" not in x
