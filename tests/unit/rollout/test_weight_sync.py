"""Weight-sync buckets: byte budget, and the packed (zero-copy) transport round trip."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.rollout.weight_sync import bucket_tensors, pack_bucket, unpack_bucket


def test_buckets_respect_budget_and_order():
    named = [(f"w{i}", torch.randn(100)) for i in range(10)]  # 400 bytes each
    buckets = list(bucket_tensors(named, bucket_bytes=1000))
    assert [len(b) for b in buckets] == [2, 2, 2, 2, 2]
    assert [n for b in buckets for n, _ in b] == [n for n, _ in named]
    assert len(list(bucket_tensors([("big", torch.randn(1000))], bucket_bytes=10))) == 1
    with pytest.raises(ValueError):
        list(bucket_tensors(named, bucket_bytes=0))


def test_pack_unpack_is_exact_for_all_dtypes():
    bucket = [("a", torch.randn(3, 5)), ("b", torch.randn(7).to(torch.bfloat16)), ("c", torch.arange(6).view(2, 3)),
              ("d", torch.randn(4, 2).t()), ("e", torch.tensor(1.5))]
    flat, meta = pack_bucket(bucket)
    back = unpack_bucket(flat, meta)
    assert [n for n, _ in back] == [n for n, _ in bucket]
    for (_, x), (_, y) in zip(bucket, back):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
