"""OptimSpec validation names the offending field."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("kw,msg", [
    (dict(lr=0.0), "lr must be > 0"),
    (dict(min_lr=1.0, lr=0.1), "min_lr"),
    (dict(warmup_steps=5, decay_steps=5), "decay_steps=5"),
    (dict(decay_style="cosine"), "needs decay_steps"),
    (dict(decay_style="exp", decay_steps=3), "decay_style"),
], ids=["lr", "min_lr", "decay<=warmup", "cosine-no-decay", "unknown-style"])
def test_optim_spec_validation(kw, msg):
    from megatron_rl.trainer.policy.optim import OptimSpec

    with pytest.raises(ValueError, match=msg):
        OptimSpec(**kw)
