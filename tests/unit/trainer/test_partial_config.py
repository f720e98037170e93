"""``rollout.partial`` (in-flight partial rollouts in the loop, ``trainer/loop/partial_source.py``): its keys
parse, the section is saved nested and loads back, a run saved with the earlier flat keys resumes, every
combination it cannot run with is refused at start-up in one line naming the keys (the earlier flat keys:
``tests/unit/test_bad_inputs.py``), and the pool's prompt order is the sampler's. The engine part:
``tests/e2e/test_partial_train.py``."""
from __future__ import annotations

import types

import pytest
import torch

from megatron_rl.data.dataset import DeterministicSampler

ON = ["rollout.engine=vllm-async", "rollout.partial.enable=true"]


def test_keys_parse_with_their_defaults():
    from megatron_rl.trainer.loop.preflight import load_checked

    r = load_checked(None, [*ON, "rollout.partial.extra_groups=5", "rollout.partial.max_staleness=3"]).rollout
    p = r.partial
    assert (p.enable, p.extra_groups, p.max_staleness, p.policy) == (True, 5, 3, "drop")
    assert load_checked(None, []).rollout.partial.enable is False
    assert load_checked(None, [*ON, "rollout.partial.policy=mask"]).rollout.partial.policy == "mask"
    assert load_checked(None, ["rollout.engine=vllm-async", "rollout.partial={enable: true, policy: mask}"]).rollout.partial \
        == load_checked(None, [*ON, "rollout.partial.policy=mask"]).rollout.partial      # the section given whole


def test_the_saved_section_loads_back_and_an_old_flat_one_resumes(tmp_path, capsys):
    """``run_dir/config.yaml`` holds ``rollout.partial`` as a nested mapping that loads to the same config; a
    file written with the earlier flat keys (``rollout.partial: true``, ``rollout.partial_policy``) is read
    under the new names by ``--resume``: no refusal, no change reported."""
    import yaml

    from megatron_rl.config import load_config
    from megatron_rl.trainer.state.run_config import check_resume, save_run_config

    cfg = load_config(None, [*ON, "rollout.partial.policy=mask", f"trainer.run_dir={tmp_path}"])
    saved = save_run_config(cfg)
    tree = yaml.safe_load(saved.read_text())
    assert tree["rollout"]["partial"] == {"enable": True, "extra_groups": 2, "max_staleness": 1, "policy": "mask"}
    assert load_config(saved, []) == cfg
    sec = tree["rollout"].pop("partial")
    tree["rollout"].update({"partial": sec["enable"], "partial_extra_groups": sec["extra_groups"],
                            "partial_max_staleness": sec["max_staleness"], "partial_policy": sec["policy"]})
    saved.write_text(yaml.safe_dump(tree, sort_keys=False))       # as an earlier release wrote it
    capsys.readouterr()
    check_resume(cfg, str(tmp_path / "checkpoints" / "step_1"))
    assert "changed configuration" not in capsys.readouterr().err
    changed = load_config(None, [*ON, "rollout.partial.policy=drop", f"trainer.run_dir={tmp_path}"])
    check_resume(changed, str(tmp_path / "checkpoints" / "step_1"))
    assert "rollout.partial.policy: 'mask' -> 'drop'" in capsys.readouterr().err


@pytest.mark.parametrize("over,words", [
    (["rollout.engine=vllm-async"], r"rollout.engine=vllm-async is driven by the training loop only with rollout.partial.enable=true"),
    (["rollout.partial.enable=true"], r"rollout.partial.enable=true needs .*rollout.engine=vllm-async.*got rollout.engine=vllm"),
    (["rollout.partial.enable=true", "rollout.engine=hf"], r"rollout.partial.enable=true needs .*got rollout.engine=hf"),
    ([*ON, "rollout.max_staleness=1"], r"replaces one-step-off rollouts: set rollout.max_staleness=0"),
    ([*ON, "rollout.placement=colocated"], r"rollout.partial.enable=true needs rollout.placement=separate"),
    ([*ON, "rollout.partial.policy=keep"], r"rollout.partial.policy must be drop\|mask"),
    ([*ON, "rollout.partial.extra_groups=-1"], r"rollout.partial.extra_groups must be >= 0"),
    ([*ON, "rollout.partial.max_staleness=-1"], r"rollout.partial.max_staleness must be an integer >= 0"),
    ([*ON, "algo.kind=score"], r"rollout.partial.enable=true with algo.kind='score' \(data path 'two_attempts'\): SCoRe"),
    ([*ON, "algo.kind=remax"], r"rollout.partial.enable=true with algo.kind='remax'"),
    ([*ON, "algo.kind=dapo", "algo.dapo.filter_groups=true", "algo.dapo.overlong_enable=false"], r"rollout.partial.enable=true with algo.kind='dapo'"),
], ids=["engine-alone", "vllm", "hf", "one-step-off", "colocated", "bad-policy", "extra", "bound", "score",
        "remax", "dapo-dynamic"])
def test_refused_at_start_up_in_one_line(over, words):
    from megatron_rl.trainer.loop.preflight import load_checked

    with pytest.raises(ValueError, match=words) as e:
        load_checked(None, over)
    assert "\n" not in str(e.value)


def test_pool_prompts_follow_the_sampler_and_seed_by_index():
    from megatron_rl.trainer.loop.partial_source import PoolPrompts

    cfg = types.SimpleNamespace(data=types.SimpleNamespace(seed=3), trainer=types.SimpleNamespace(seed=7),
                                rollout=types.SimpleNamespace(n=2, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, max_tokens=8))
    rows = [types.SimpleNamespace(prompt_ids=[i, i + 1]) for i in range(5)]
    pp = PoolPrompts(cfg, rows, eos_id=0)
    s = DeterministicSampler(5, 1, seed=3)
    assert [pp.row(i) for i in range(12)] == [s.next_batch()[0] for _ in range(12)]   # across epoch boundaries
    a, b = pp.request(4), pp.request(4)
    assert a[0] == list(rows[pp.row(4)].prompt_ids) and a[1].seed == b[1].seed != pp.request(5)[1].seed
    assert torch.tensor(a[1].seed) >= 0
    from megatron_rl.rollout.rollouts import sampling_params, sampling_seed

    # the pool's seeds: the step seeds' function on its own stream (pool index i never draws as step i)
    assert a[1].seed == sampling_seed(7, 4, stream=1) == (7 * 1_000_003 + 4 * 7919 + 1) % 2 ** 31
    assert a[1].seed != sampling_params(cfg, 4).seed
