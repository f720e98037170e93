"""The colocated step's order (``trainer/loop/colocate.py``) with a real HF engine: the engine really
releases its weights for the update and the step after the push generates exactly what it would have
without the turn-taking. The trainer side is recorded (its offload is another module's test)."""
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


def _step(colo: Colocation, eng: RecordingEngine, calls: list, weights: dict):
    """One loop step as ``trainer/loop.rl_step`` orders it (generate, update, push)."""
    calls.append("generate")
    out = eng.generate(PROMPTS, GREEDY)
    colo.after_generate()
    calls.append("update")
    released = all(p.numel() == 0 for p in eng.model.parameters())
    colo.before_push()
    eng.update_weights(weights.items())
    colo.after_push()
    return out, released


def test_colocated_step_runs_in_the_stated_order_and_the_engine_frees_its_weights_for_the_update(model_dir):
    from safetensors.torch import load_file

    calls: list[str] = []
    eng = RecordingEngine(str(model_dir), calls)
    weights = load_file(str(Path(model_dir) / "model.safetensors"))   # the trainer's push: the same weights
    colo = Colocation(engines=eng, offload_trainer=lambda: calls.append("trainer.offload"),
                      onload_trainer=lambda: calls.append("trainer.onload"),
                      offload_weights=lambda: calls.append("trainer.offload(weights)"), barrier=lambda: None)
    colo.start()
    assert calls == ["trainer.offload"]    # set-up's push is done: the GPUs go to the engines
    calls.clear()
    first, released = _step(colo, eng, calls, weights)
    assert tuple(calls) == ORDER and released
    calls.clear()
    second, _ = _step(colo, eng, calls, weights)
    assert tuple(calls) == ORDER and second == first   # awake again, same weights: the same greedy outputs


def test_separate_placement_takes_no_turns(model_dir):
    calls: list[str] = []
    eng = RecordingEngine(str(model_dir), calls)
    cfg = from_dict({"rollout": {"placement": "separate"}})
    colo = build_colocation(SimpleNamespace(cfg=cfg, client=eng, actor=None, info=SimpleNamespace(is_driver=True)))
    assert not colo.active
    colo.start()
    _, released = _step(colo, eng, calls, {})
    assert calls == ["generate", "update", "push"] and not released


def test_colocated_placement_drives_the_engines_from_the_driver_only(model_dir):
    cfg = from_dict({"rollout": {"placement": "colocated", "engine": "hf"}})
    actor = SimpleNamespace(offload=lambda mode=None: None, onload=lambda: None, offload_mode="optimizer")
    driver = build_colocation(SimpleNamespace(cfg=cfg, client="pool", actor=actor, info=SimpleNamespace(is_driver=True)))
    other = build_colocation(SimpleNamespace(cfg=cfg, client=None, actor=actor, info=SimpleNamespace(is_driver=False)))
    assert driver.active and driver.engines == "pool" and other.engines is None
    assert driver.offload_trainer is actor.offload and driver.onload_trainer is actor.onload


def test_offload_all_parks_the_weights_after_the_push_and_checkpoints_see_a_loaded_trainer():
    """``trainer.offload=all``: the optimizer stage before the push, the weights after it (the push
    reads them); a checkpoint between steps onloads and re-parks both stages."""
    cfg = from_dict({"rollout": {"placement": "colocated", "engine": "hf"}})
    calls: list[str] = []
    actor = SimpleNamespace(offload=lambda mode=None: calls.append(f"offload({mode})"),
                            onload=lambda: calls.append("onload"), offload_mode="all")
    colo = build_colocation(SimpleNamespace(cfg=cfg, client=None, actor=actor, info=SimpleNamespace(is_driver=False)))
    colo.barrier = lambda: None
    colo.start()
    colo.after_generate()
    colo.before_push()
    colo.after_push()
    with colo.trainer_loaded():
        calls.append("save")
    assert calls == ["offload(optimizer)", "onload", "offload(optimizer)", "offload(all)",
                     "onload", "save", "offload(optimizer)", "offload(all)"]
