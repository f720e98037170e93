"""Trainer offload (``trainer/policy/offload.py``): storages parked in host buffers and released, views kept,
the round trip bit for bit, a real torch Adam continuing identically; ``trainer.offload`` validated.

The Megatron actor's offload/onload (distributed optimizer, DP=2, and one process) is checked in
``tests/distributed/test_invariance.py`` (its ``*_offload_*`` layouts)."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.trainer.policy.offload import OFFLOAD_MODES, HostStash, check_offload_mode


def _adam_setup(seed=0):
    torch.manual_seed(seed)
    buf = torch.randn(40)                        # one flat "param buffer", params are views (as DDP's)
    w, b = buf[:32].view(4, 8), buf[32:36]
    params = [torch.nn.Parameter(w), torch.nn.Parameter(b)]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    x = torch.randn(16, 8)

    def step():
        opt.zero_grad()
        loss = ((x @ params[0].T + params[1]) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.detach()
    return params, opt, step


def _snapshot(tensors):
    return [t.detach().clone() for t in tensors]


def test_round_trip_releases_storage_and_restores_bits():
    params, opt, step = _adam_setup()
    for _ in range(3):
        step()
    state = [v for st in opt.state.values() for v in st.values()]
    grads = [p.grad for p in params]
    before = _snapshot(params + state + grads)
    expected = sum(t.untyped_storage().nbytes() for t in state + grads) + 40 * 4   # the params' one shared buffer
    stash = HostStash()
    moved = stash.offload(params + state + grads)
    assert moved == expected
    assert all(t.untyped_storage().nbytes() == 0 for t in params + state + grads), "device copies not released"
    assert stash.offloaded and stash.nbytes == moved
    assert stash.offload(params) == 0                        # parked already: nothing moved twice
    assert stash.restore() == moved and not stash.offloaded
    for a, b in zip(params + state + grads, before):
        assert a.dtype == b.dtype and torch.equal(a, b)
    # two stages (trainer.offload=all when colocated): state + grads first, then the rest, one restore
    first = stash.offload(state + grads)
    assert first == expected - 40 * 4 and all(p.untyped_storage().nbytes() for p in params)
    assert stash.offload(params + state + grads) == 40 * 4 and stash.nbytes == moved
    assert stash.restore() == moved and not stash.offloaded
    for a, b in zip(params + state + grads, before):
        assert a.dtype == b.dtype and torch.equal(a, b)      # bit for bit (no NaN here)


def test_training_after_round_trip_equals_training_without():
    pa, oa, step_a = _adam_setup()
    pb, _, step_b = _adam_setup()
    stash = HostStash()
    for i in range(4):
        state = [v for st in oa.state.values() for v in st.values()]
        stash.offload(list(pa) + state + [p.grad for p in pa if p.grad is not None])
        stash.restore()
        la, lb = step_a(), step_b()
        assert torch.equal(la, lb), i
    for a, b in zip(pa, pb):
        assert torch.equal(a, b)


def test_keep_spares_shared_storage():
    base = torch.arange(8.0)
    main_shard = base[2:6]                       # an fp32 main shard that IS a view of the weights
    adam_m = torch.ones(4)
    stash = HostStash()
    stash.offload([main_shard, adam_m], keep=[base])
    assert base.untyped_storage().nbytes() == 32 and adam_m.untyped_storage().nbytes() == 0
    stash.restore()
    assert torch.equal(adam_m, torch.ones(4)) and torch.equal(base, torch.arange(8.0))


def test_offload_mode_is_checked_at_load():
    from megatron_rl.config import load_config

    assert OFFLOAD_MODES == ("none", "optimizer", "all")
    assert load_config(None, ["trainer.offload=optimizer"]).trainer.offload == "optimizer"
    with pytest.raises(ValueError, match=r"^trainer.offload must be one of none\|optimizer\|all, got 'gpu'$"):
        load_config(None, ["trainer.offload=gpu"])
    with pytest.raises(ValueError, match="trainer.offload must be one of"):
        check_offload_mode("opt")


def test_weights_written_by_the_hf_writer_can_still_be_offloaded(tmp_path):
    """Issue 31: the end-of-run HF export passed the live (CPU) parameters to ``HFWriter.write``, whose
    ``Tensor.numpy()`` view marked their storage not resizable for good, so the offload after the export
    failed ("Trying to resize storage that is not resizable"). The file written is read back by the
    safetensors library (the oracle), and the weights still park and come back bit for bit."""
    from safetensors.torch import load_file

    from megatron_rl.convert.hf_io import HFWriter

    params, _, step = _adam_setup()
    step()
    weights = params[0].detach()                 # a view of the flat parameter buffer, as an export streams it
    w = HFWriter(tmp_path, [("w", weights.dtype, tuple(weights.shape))])
    w.write("w", weights)
    w.close()
    assert torch.equal(load_file(str(tmp_path / "model.safetensors"))["w"], weights)
    before = _snapshot(params)
    stash = HostStash()
    assert stash.offload(params) == 40 * 4 and params[0].untyped_storage().nbytes() == 0
    stash.restore()
    assert all(torch.equal(a, b) for a, b in zip(params, before))
