"""The dry run's fake device (``megatron_rl/runtime/fake_device.py``): devices as a GPU reports them, values where
the host has them, and the bytes of every device storage, on a CPU."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from megatron_rl.runtime import fake_device as fd
from megatron_rl.runtime.device import default_device

MiB = 1 << 20


@pytest.fixture
def dev():
    d = fd.FakeDevice().start()
    try:
        yield d
    finally:
        d.stop()


def test_device_factories_meta_when_large_real_when_small(dev):
    big = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    small = torch.arange(5, device="cuda")           # (a small empty() is meta: no values to keep)
    assert big.device == torch.device("cuda", 0) and big.is_cuda and not big.is_meta
    assert small.is_cuda and small.tolist() == [0, 1, 2, 3, 4]      # a small device tensor keeps its values
    assert dev.bytes == 4 * MiB + small.nbytes
    assert default_device() == torch.device("cuda", 0)
    host = torch.zeros(3)
    assert host.device == torch.device("cpu") and not host.is_cuda


def test_bytes_follow_storages_and_views_count_once(dev):
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
    v = x[MiB:]
    assert dev.storage_bytes([x, v]) == 2 * MiB
    start = dev.reset_peak()
    y = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    del y
    assert dev.bytes == start and dev.peak == start + 3 * MiB
    del x
    assert dev.bytes == start                # the view keeps the storage
    del v
    assert dev.bytes == start - 2 * MiB


def test_moves_between_host_and_device(dev):
    ids = torch.tensor([3, 1, 2])
    on = ids.to("cuda")
    assert on.is_cuda and on.tolist() == [3, 1, 2]                 # host data keeps its values on the device
    big = torch.empty(4 * MiB, device="cuda")
    back = big.cpu()
    assert back.device == torch.device("cpu") and back.abs().sum().item() == 0.0   # no values on the device: zeros
    p = torch.nn.Parameter(torch.ones(4))
    assert p.to(default_device()).is_cuda                            # a parameter joins the device as meta


def test_ops_mix_host_and_device_and_reads_answer_zero(dev):
    w = torch.empty(1024, 1024, device="cuda")
    out = w @ torch.ones(1024, 8)                                   # a host operand joins the device
    assert out.is_cuda and tuple(out.shape) == (1024, 8)
    assert float(out.sum()) == 0.0 and out.sum().item() == 0 and bool((out > 0).any()) is False
    flag = torch.zeros((), device="cuda")
    flag += w.sum()                                                 # meta values into a real tensor: unchanged
    assert flag.item() == 0.0
    seg = torch.tensor([0, 0, 1, 1, 1], device="cuda")
    assert torch.nonzero(seg[1:] != seg[:-1]).flatten().tolist() == [1]   # real device data: real answers
    with pytest.raises(fd.DataDependent):
        torch.nonzero(w)
    mask = torch.tensor([True, False] * 512)
    assert tuple(w[mask].shape) == (512, 1024)                      # a host bool mask indexes the device


def test_backward_allocates_on_the_device(dev):
    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            buf = torch.empty(g.shape, dtype=g.dtype, device=0)     # as Megatron's backward passes allocate
            return buf + g * 2

    lin = torch.nn.Linear(512, 512).to(default_device())
    x = torch.empty(64, 512, device="cuda", requires_grad=True)
    Scaled.apply(lin(x)).sum().backward()
    assert lin.weight.grad.is_cuda and x.grad.is_cuda
    assert dev.storage_bytes([lin.weight.grad]) == 512 * 512 * 4


def test_build_makes_host_factories_meta(dev):
    start = dev.bytes
    with dev.build():
        w = torch.empty(4096, 4096)                                 # Megatron's CPU initialisation: no host bytes
    assert dev.bytes - start == w.nbytes and w.is_cuda


WORLD = textwrap.dedent("""
    import torch, torch.distributed as dist
    from megatron_rl.runtime import fake_device as fd
    fd.init_fake_world(3, 8)
    with fd.gloo_as_fake():
        g = dist.new_group([0, 1, 2, 3], backend="gloo")
    d = fd.FakeDevice().start()
    x = torch.empty(1 << 20, device="cuda")
    dist.all_reduce(x, group=g)
    with dist._coalescing_manager(g, async_ops=True) as cm:
        dist.reduce_scatter_tensor(torch.empty(1 << 18, device="cuda"), x, group=g, async_op=True)
    cm.wait()
    out = [None] * 4
    dist.all_gather_object(out, {"k": 1}, group=g)
    print("OK", dist.get_rank(), dist.get_world_size(), dist.get_world_size(g), out[3])
""")


def test_fake_world_collectives_on_device_tensors():
    r = subprocess.run([sys.executable, "-c", WORLD], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "OK 3 8 4 {'k': 1}"
