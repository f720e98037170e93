"""The simulated GPU (``runtime/simulated_gpu.py``): what it models, and its negative controls.

* a CUDA op given a host operand fails naming the op and both devices — the review's B1 as it was
  (``response_frame`` of device log-probs with host frames) among them — while the mixes CUDA allows pass;
* a host tensor given to a collective on a group that is NCCL on a GPU fails; a device one passes, and a
  group created with ``backend="gloo"`` takes host tensors (real 1-rank gloo groups);
* a deliberate ``.item()`` / ``.tolist()`` / D2H copy shows in the step's sync count, with its call site;
* a small model trains (forward, backward, Adam) without a false alarm, its tensors reporting ``cuda:0``.
Oracle for the mismatch rule: CUDA's own ("Expected all tensors to be on the same device"; a 0-dim CPU
tensor is allowed beside CUDA tensors, copies between devices are allowed).
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from megatron_rl.runtime.simulated_gpu import VIRTUAL, DeviceMismatch, HostTensorToNCCL, SimulatedGPU


@pytest.fixture()
def sim():
    with SimulatedGPU() as s:
        yield s


def test_tensors_carry_the_device_a_gpu_gives_them(sim):
    x = torch.randn(4, 5).to("cuda")
    assert x.device == VIRTUAL and x.is_cuda
    assert (x * 2 + 1).device == VIRTUAL and torch.empty_like(x).device == VIRTUAL
    assert torch.zeros(3, device=0).device == VIRTUAL and torch.ones(2, device=torch.device("cuda", 0)).is_cuda
    h = x.cpu()
    assert h.device.type == "cpu" and not h.is_cuda and h.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert torch.equal(h, x.cpu())   # the values are real
    assert (x + torch.tensor(2.0)).device == VIRTUAL            # a host 0-dim scalar is allowed, as on CUDA
    x.copy_(torch.ones(4, 5))                                     # copies between devices are allowed
    assert x[torch.tensor([0, 2])].device == VIRTUAL              # host indices of advanced indexing too


def test_mixed_devices_fail_naming_the_op_and_both_devices(sim):
    x = torch.randn(4, 5).to("cuda")
    with pytest.raises(DeviceMismatch, match=r"aten\.gather\.default got tensors on cuda:0 and cpu .*\[4, 2\] torch\.int64"):
        x.gather(1, torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(DeviceMismatch, match="aten.sub.Tensor"):
        _ = x - torch.ones(4, 5)


def test_b1_as_it_was_fails_and_the_boundary_fixes_it(sim):
    """Review B1: the log-prob pass's device output gathered with the update's host response frame."""
    from megatron_rl.trainer.pipeline.sequences import build_seq_batch, response_frame
    from megatron_rl.trainer.policy.logprob_model import to_host

    sb = build_seq_batch([[1, 2, 3], [4, 5]], [[6, 7], [8]], pad_id=0, seq_len=8, max_resp=4)
    logp = torch.randn(2, 7).to("cuda")                      # [N, S-1] as the model's last stage leaves it
    with pytest.raises(DeviceMismatch, match="gather"):
        response_frame(logp, sb)
    out = response_frame(to_host({"logp": logp})["logp"], sb)   # the boundary: LogProbModel.to_host
    assert out.device.type == "cpu" and out.shape == (2, 4)


def test_host_syncs_are_counted_with_their_call_site(sim):
    x = torch.randn(8).to("cuda")
    sim.step_metrics()
    y = (x * 2).sum()
    assert sim.step_metrics()["sim/host_syncs"] == 0     # device work alone: no sync
    y.item()                                             # the deliberate sync
    x.tolist()
    x.cpu()
    x.nonzero()
    m = sim.step_metrics()
    assert (m["sim/host_syncs"], m["sim/sync__local_scalar_dense"], m["sim/sync_tolist"], m["sim/sync_d2h_copy"],
            m["sim/sync_nonzero"]) == (4, 1, 1, 1, 1)
    assert m["sim/d2h_bytes"] == x.nbytes
    assert any("test_simulated_gpu_ops.py" in site and site.startswith("_local_scalar_dense") for site in sim.sites), sim.sites
    assert sim.step_metrics()["sim/host_syncs"] == 0     # the counts are per step


def test_a_small_model_trains_without_a_false_alarm(sim):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to(torch.device("cuda", 0))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    x, y = torch.randn(16, 5).to("cuda"), torch.randint(0, 3, (16,)).cuda()
    sim.step_metrics()
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(p.is_cuda and p.grad.is_cuda for p in net.parameters())
    assert all(s.is_cuda for st in opt.state.values() for s in st.values() if isinstance(s, torch.Tensor) and s.dim())
    assert sim.step_metrics()["sim/host_syncs"] == 0


@pytest.fixture()
def world():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29_500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_host_tensor_to_an_nccl_group_fails(world, sim):
    dev = torch.ones(3).cuda()
    dist.broadcast(dev, src=0)                                    # the default group: NCCL on a GPU
    dist.all_reduce(dev)
    with pytest.raises(HostTensorToNCCL, match=r"dist\.broadcast on an NCCL group got a host tensor \[3\]"):
        dist.broadcast(torch.ones(3), src=0)
    sub = dist.new_group([0])                                     # inherits NCCL
    assert dist.get_backend(sub) == "nccl" and dist.get_backend() == "nccl"
    with pytest.raises(HostTensorToNCCL, match="all_reduce"):
        dist.all_reduce(torch.ones(2), group=sub)
    host = dist.new_group([0], backend="gloo")                    # a host-data group (e.g. the replica groups)
    assert dist.get_backend(host) == "gloo"
    t = torch.ones(2)
    dist.all_reduce(t, group=host)
    assert t.tolist() == [1.0, 1.0]


def test_to_follows_another_tensor_and_non_blocking_copies_do_not_sync(sim):
    dev, host = torch.ones(3).cuda(), torch.zeros(2, dtype=torch.float64)
    assert torch.ones(2).to(dev).is_cuda and not dev.to(host).is_cuda and dev.to(host).dtype == torch.float64
    sim.step_metrics()
    dev.to("cpu", non_blocking=True)
    assert sim.step_metrics()["sim/host_syncs"] == 0
    dev.to(torch.float64)                                   # a dtype change stays on the device
    assert dev.to(torch.float64).is_cuda
