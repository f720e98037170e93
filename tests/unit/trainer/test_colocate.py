"""The colocated turn-taking (``trainer/loop/colocate.py``) with a real HF engine: each hook hands the engine
and the trainer over (the engine really releases its weights for the update, and after the push
generates exactly what it would have without the turn-taking), and a hook out of its turn is refused.
The trainer side is recorded (its offload is another module's test)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from megatron_rl.config import from_dict
from megatron_rl.rollout.engine import SamplingParams
from megatron_rl.rollout.hf_engine import HFEngine
from megatron_rl.trainer.loop.colocate import (
    ORDER,
    SLEEP_LEVEL,
    Colocation,
    build_colocation,
)
from tests.helpers.tiny_model import save_tiny_qwen3

GREEDY = SamplingParams(max_tokens=5, greedy=True)
PROMPTS = [[3, 4, 5], [9, 8]]


class RecordingEngine(HFEngine):
    """A real HF engine that writes each sleep / wake / push call into ``calls`` before doing it."""

    def __init__(self, model_dir, calls):
        super().__init__(model_dir, max_model_len=64)
        self.calls = calls

    def sleep(self, level=1):
        self.calls.append("engines.sleep")
        assert level == SLEEP_LEVEL
        super().sleep(level)

    def wake(self, tags=None):
        self.calls.append(f"engines.wake({','.join(tags)})")
        super().wake(tags)

    def update_weights(self, named_tensors):
        self.calls.append("push")
        return super().update_weights(named_tensors)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_qwen3(tmp_path_factory.mktemp("tiny"))


def test_each_turn_hands_the_engine_and_the_trainer_over_and_the_engine_generates_as_before(model_dir):
    """What each hook does to a real HF engine and to the trainer (recorded callables), hook by hook.
    The loop's order of the hooks is not restated here: :class:`Colocation` refuses a hook out of its
    turn (next test), and the real loop (``rl_step``) runs colocated in ``tests/unit/trainer/test_paths.py``'s
    toy-method run (2 steps, a checkpoint and the export between parked stages), which that refusal would stop."""
    from safetensors.torch import load_file

    calls: list[str] = []
    eng = RecordingEngine(str(model_dir), calls)
    weights = load_file(str(Path(model_dir) / "model.safetensors"))   # the trainer's push: the same weights
    colo = Colocation(engines=eng, offload_trainer=lambda: calls.append("trainer.offload"),
                      onload_trainer=lambda: calls.append("trainer.onload"),
                      offload_weights=lambda: calls.append("trainer.offload(weights)"), barrier=lambda: None)
    colo.start()
    assert calls == ["trainer.offload"]    # set-up's push is done: the GPUs go to the engines
    first = eng.generate(PROMPTS, GREEDY)
    for _ in range(2):
        calls.clear()
        colo.after_generate()
        assert calls == ["engines.sleep", "trainer.onload"] and colo.turn == "trainer"
        assert all(p.numel() == 0 for p in eng.model.parameters())      # level 2: the weights are gone
        calls.clear()
        colo.before_push()
        assert calls == ["trainer.offload", "engines.wake(weights)"] and colo.turn == "push"
        eng.update_weights(weights.items())
        calls.clear()
        colo.after_push()
        assert calls == ["trainer.offload(weights)", "engines.wake(kv_cache)"] and colo.turn == "engines"
        assert eng.generate(PROMPTS, GREEDY) == first   # awake again, same weights: the same greedy outputs
    # ORDER (the module's statement of a step) is the hooks' calls in their turns' order
    hooks = ["engines.sleep", "trainer.onload", "trainer.offload", "engines.wake(weights)", "trainer.offload(weights)",
             "engines.wake(kv_cache)"]
    assert [c for c in ORDER if c in hooks] == hooks


@pytest.mark.parametrize("hooks,bad", [(["before_push"], "before_push\\(\\) in the engines turn"),
                                       (["after_push"], "after_push\\(\\) in the engines turn"),
                                       (["after_generate", "after_generate"], "after_generate\\(\\) in the trainer turn"),
                                       (["after_generate", "after_push"], "after_push\\(\\) in the trainer turn"),
                                       (["after_generate", "before_push", "before_push"],
                                        "before_push\\(\\) in the push turn")])
def test_a_hook_out_of_its_turn_is_refused_before_it_touches_anything(hooks, bad):
    calls: list[str] = []
    colo = Colocation(engines=None, offload_trainer=lambda: calls.append("offload"),
                      onload_trainer=lambda: calls.append("onload"), barrier=lambda: None)
    *ok, last = hooks
    for h in ok:
        getattr(colo, h)()
    before = list(calls)
    with pytest.raises(RuntimeError, match=f"colocated placement: {bad}") as e:
        getattr(colo, last)()
    assert "\n" not in str(e.value) and calls == before


def test_separate_placement_takes_no_turns(model_dir):
    calls: list[str] = []
    eng = RecordingEngine(str(model_dir), calls)
    cfg = from_dict({"rollout": {"placement": "separate"}})
    colo = build_colocation(cfg, None, eng)
    assert not colo.active
    colo.start()
    for hook in ("after_generate", "before_push", "after_push", "after_push"):   # no turns to keep either
        getattr(colo, hook)()
    assert calls == [] and all(p.numel() > 0 for p in eng.model.parameters())


def test_colocated_placement_drives_the_engines_from_the_driver_only(model_dir):
    cfg = from_dict({"rollout": {"placement": "colocated", "engine": "hf"}})
    actor = SimpleNamespace(offload=lambda mode=None: None, onload=lambda: None, offload_mode="optimizer")
    driver = build_colocation(cfg, actor, "pool")
    other = build_colocation(cfg, actor, None)
    assert driver.active and driver.engines == "pool" and other.engines is None
    assert driver.offload_trainer is actor.offload and driver.onload_trainer is actor.onload


def test_offload_all_parks_the_weights_after_the_push_and_checkpoints_see_a_loaded_trainer():
    """``trainer.offload=all``: the optimizer stage before the push, the weights after it (the push
    reads them); a checkpoint between steps onloads and re-parks both stages."""
    cfg = from_dict({"rollout": {"placement": "colocated", "engine": "hf"}})
    calls: list[str] = []
    actor = SimpleNamespace(offload=lambda mode=None: calls.append(f"offload({mode})"),
                            onload=lambda: calls.append("onload"), offload_mode="all")
    colo = build_colocation(cfg, actor, None)
    colo.barrier = lambda: None
    colo.start()
    colo.after_generate()
    colo.before_push()
    colo.after_push()
    with colo.trainer_loaded():
        calls.append("save")
    assert calls == ["offload(optimizer)", "onload", "offload(optimizer)", "offload(all)",
                     "onload", "save", "offload(optimizer)", "offload(all)"]
