"""Vocab-parallel log-probs / entropy vs the full-vocab reference, in one process (no split).

The TP=2 split is checked in ``tests/distributed/test_actor_vocab_parallel.py``.
"""
from __future__ import annotations

import pytest
import torch

from megatron_rl.trainer.policy.vocab_parallel import full_vocab_logprobs, vocab_parallel_logprobs


@pytest.mark.parametrize("vocab_size,width", [(13, 13), (10, 13)], ids=["unpadded", "padded3"])
def test_values_and_grads_match_reference(vocab_size, width):
    torch.manual_seed(0)
    x = (3 * torch.randn(4, 6, width, dtype=torch.float64)).requires_grad_()
    t = torch.randint(0, vocab_size, (4, 6))
    a = vocab_parallel_logprobs(x, t, None, vocab_size=vocab_size)
    b = full_vocab_logprobs(x, t, vocab_size=vocab_size)
    torch.testing.assert_close(a.logp, b.logp, rtol=0, atol=1e-12)
    torch.testing.assert_close(a.entropy, b.entropy, rtol=0, atol=1e-12)
    w1, w2 = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    g1, = torch.autograd.grad((a.logp * w1 + a.entropy * w2).sum(), x)
    g2, = torch.autograd.grad((b.logp * w1 + b.entropy * w2).sum(), x)
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-12)
    if vocab_size < width:
        assert torch.all(g1[..., vocab_size:] == 0), "padded vocab columns must get no gradient"


def test_gradcheck_fp64():
    torch.manual_seed(1)
    x = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 6, (2, 3))
    assert torch.autograd.gradcheck(lambda z: vocab_parallel_logprobs(z, t, None, vocab_size=6), (x,))


def test_closed_form_uniform():
    # uniform logits over V: logp = -log V, entropy = log V
    v = 8
    x = torch.zeros(3, v, requires_grad=True)
    out = vocab_parallel_logprobs(x, torch.tensor([0, 3, 7]))
    torch.testing.assert_close(out.logp, torch.full((3,), -torch.log(torch.tensor(8.0)).item()))
    torch.testing.assert_close(out.entropy, torch.full((3,), torch.log(torch.tensor(8.0)).item()))


def test_only_logp_used_gradient():
    torch.manual_seed(2)
    x = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 9, (5,))
    g, = torch.autograd.grad(vocab_parallel_logprobs(x, t).logp.sum(), x)
    expected = torch.nn.functional.one_hot(t, 9).double() - torch.softmax(x, -1)
    torch.testing.assert_close(g, expected.detach())


def test_bf16_input_computed_in_fp32():
    torch.manual_seed(3)
    x = torch.randn(4, 32).bfloat16().requires_grad_()
    t = torch.randint(0, 32, (4,))
    a = vocab_parallel_logprobs(x, t)
    assert a.logp.dtype == torch.float32
    b = full_vocab_logprobs(x.float(), t)
    torch.testing.assert_close(a.logp, b.logp)
    a.logp.sum().backward()
    assert x.grad.dtype == torch.bfloat16


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="do not match"):
        vocab_parallel_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="vocab_size=9"):
        vocab_parallel_logprobs(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), vocab_size=9)
