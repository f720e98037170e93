"""In-training validation settings (``trainer.eval_*``): greedy by default, the papers' protocol when
set, refused when they cannot mean what they say."""
from __future__ import annotations

import pytest

from megatron_rl.config import load_config
from megatron_rl.rollout.rollouts import eval_sampling


def test_default_is_greedy_with_the_rollout_length():
    sp = eval_sampling(load_config(None, ["rollout.max_tokens=7"]), step=2, eos_id=5)
    assert sp.greedy and sp.n == 1 and sp.max_tokens == 7 and sp.stop_token_ids == (5,)


def test_papers_protocol():
    cfg = load_config(None, ["trainer.eval_n=4", "trainer.eval_temperature=0.6", "trainer.eval_top_p=0.95",
                             "trainer.eval_top_k=20", "trainer.eval_min_p=0.01", "trainer.eval_max_tokens=12",
                             "rollout.max_model_len=200"])
    sp = eval_sampling(cfg, step=2, eos_id=5)
    assert (sp.greedy, sp.n, sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.max_tokens) == \
        (False, 4, 0.6, 0.95, 20, 0.01, 12)
    assert sp.seed == eval_sampling(cfg, step=2).seed != eval_sampling(cfg, step=3).seed   # resumable


@pytest.mark.parametrize(("over", "words"), [
    (["trainer.eval_n=4"], "identical samples"),
    (["trainer.eval_temperature=0.6", "trainer.eval_top_p=1.5"], "trainer.eval_top_p must be in"),
    (["trainer.eval_max_tokens=500"], "trainer.eval_max_tokens=500 exceeds"),
])
def test_bad_eval_settings_fail_at_load(over, words):
    from megatron_rl.trainer.loop.preflight import load_checked

    with pytest.raises(ValueError, match=words):
        load_checked(None, over)
