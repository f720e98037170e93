"""Per-token staleness and the two policies of partial rollouts (``rollout/partial.py``), from their
definitions: s_t = V − v_t; drop keeps a response only if max_t s_t <= k; mask keeps the tokens with
s_t <= k (the old-version prefix goes), a response with none left is dropped."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.rollout.partial import StalenessPolicy, staleness_mask, token_staleness

V = torch.tensor


@pytest.mark.parametrize("versions,trainer,want", [
    ([3, 3, 3], 3, [0, 0, 0]),                 # sampled by the trainer's own weights
    ([1, 1, 2, 3], 3, [2, 2, 1, 0]),           # spans two pushes
    ([], 5, []),                                # empty response
], ids=["fresh", "spans-two-pushes", "empty"])
def test_token_staleness(versions, trainer, want):
    assert token_staleness(V(versions, dtype=torch.int64), trainer).tolist() == want


def test_a_token_newer_than_the_trainer_is_an_error():
    with pytest.raises(ValueError, match="newer than the trainer"):
        token_staleness(V([2, 4]), 3)


@pytest.mark.parametrize("versions,k,mode,want", [
    ([1, 1, 2, 3], 2, "drop", [True] * 4),      # max s = 2 <= 2
    ([1, 1, 2, 3], 1, "drop", None),            # max s = 2 > 1: the response goes
    ([1, 1, 2, 3], 1, "mask", [False, False, True, True]),   # the version-1 prefix is masked
    ([1, 1, 2, 3], 0, "mask", [False, False, False, True]),
    ([0, 0], 1, "mask", None),                  # nothing left
    ([0, 0], 3, "drop", [True, True]),
], ids=["drop-keeps", "drop-rejects", "mask-prefix", "mask-bound-0", "mask-all-stale", "drop-within"])
def test_policies(versions, k, mode, want):
    got = staleness_mask(V(versions, dtype=torch.int64), 3, StalenessPolicy(k, mode))
    assert (got if got is None else got.tolist()) == want


def test_bad_policies_fail_in_one_line():
    with pytest.raises(ValueError, match="bound must be >= 0"):
        StalenessPolicy(-1)
    with pytest.raises(ValueError, match="drop|mask"):
        StalenessPolicy(1, "clip")
