"""Which top-k / top-p rule each engine applies is declared (``EngineCaps.sampler``) and is one the trainer
reproduces; a vLLM other than the version the rule was checked against is a start-up warning."""
from __future__ import annotations

import pytest

from megatron_rl.rollout import engine_class
from megatron_rl.rollout.registry import SAMPLER_CHECKED_VLLM, EngineCaps, engine_names


def test_every_engine_declares_the_sort_rule():
    for name in engine_names():
        assert engine_class(name).CAPS.sampler == "sort", name


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="sampler must be one of sort"):
        EngineCaps(transports={"ray": "x"}, sampler="kernel")


def test_unchecked_vllm_version_warns(caplog):
    from megatron_rl.rollout.vllm_engine import warn_unchecked_sampler

    assert warn_unchecked_sampler(SAMPLER_CHECKED_VLLM) is None
    assert warn_unchecked_sampler(SAMPLER_CHECKED_VLLM + "+cpu") is None
    assert warn_unchecked_sampler(None) is None
    with caplog.at_level("WARNING", logger="megatron_rl.rollout.vllm"):
        msg = warn_unchecked_sampler("0.32.1")
    assert msg and "checked against 0.32.0" in msg and msg in caplog.text
