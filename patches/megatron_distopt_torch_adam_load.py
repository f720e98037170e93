"""Distributed-optimizer checkpoint load with plain ``torch.optim.Adam`` (no TE / apex): two fixes.

Replaces (wraps) two methods of ``megatron.core.optimizer.distrib_optimizer.DistributedOptimizer``:

1. ``_set_main_param_and_optimizer_states(self, model_param, tensors)``. Loading a
   ``fully_reshardable`` / ``fully_sharded_model_space`` checkpoint deliberately drops Adam's
   per-parameter ``step`` from ``tensors`` (it is restored from the param groups instead), but the
   setter iterates over the *destination* keys, which include ``step`` -> ``KeyError: 'step'``.
   The wrapper fills keys missing from ``tensors`` with the destination's current value (a no-op
   copy), so every key present is copied exactly as before.
2. ``load_state_dict(self, state_dict)``. It assigns ONE ``step`` tensor object to every
   parameter's state; torch Adam increments each parameter's ``step`` in place, so after a resume
   the shared counter advances once per parameter per optimizer step and Adam's bias correction
   is wrong from the second resumed step on (observed: 19 params -> step 2 became 21 after one
   step; losses then diverge from the uninterrupted run at 1e-6). The wrapper gives each
   parameter its own copy of the (identical) value after the original load.

Behaviour otherwise unchanged: values loaded are those megatron loads; only aliasing and the
KeyError are removed. Checked on megatron-core 0.16.1 (CPU, torch Adam fallback). Needed only
where megatron found neither TE nor apex (``HAVE_APEX_OR_TE`` false).
"""
from __future__ import annotations

import functools

from megatron_rl.patches import Patch


def _needed() -> bool:
    from megatron.core.optimizer import distrib_optimizer as d

    return not getattr(d, "HAVE_APEX_OR_TE", False)


def _apply() -> None:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer as D

    if getattr(D.load_state_dict, "_mrl_patched", False):
        return
    orig_set, orig_load = D._set_main_param_and_optimizer_states, D.load_state_dict

    @functools.wraps(orig_set)
    def set_states(self, model_param, tensors):
        if not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            current = self._get_main_param_and_optimizer_states(model_param)
            missing = {k: v for k, v in current.items() if k not in tensors}
            if missing:
                tensors = {**tensors, **missing}
        return orig_set(self, model_param, tensors)

    @functools.wraps(orig_load)
    def load_state_dict(self, state_dict):
        out = orig_load(self, state_dict)
        for st in self.optimizer.state.values():
            if "step" in st and hasattr(st["step"], "clone"):
                st["step"] = st["step"].clone()
        return out

    set_states._mrl_patched = load_state_dict._mrl_patched = True
    D._set_main_param_and_optimizer_states = set_states
    D.load_state_dict = load_state_dict


_D = "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer"
PATCH = Patch(name="megatron_distopt_torch_adam_load", group="megatron", package="megatron-core",
              min_version="0.16.0", max_version="0.17.0", needed=_needed, apply=_apply,
              symbols=((f"{_D}._set_main_param_and_optimizer_states", ("self", "model_param", "tensors")),
                       (f"{_D}.load_state_dict", ("self", "state_dict")),
                       (f"{_D}._get_main_param_and_optimizer_states", ("self", "model_param")),
                       (f"{_D}._init_optimizer_states_with_dummy_values", ("self",))))
