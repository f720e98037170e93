"""The dry run's table: each role's measured components beside ``megatron-rl plan``'s for the same config and
stage, the peak against the device, the oracles, and the last line::

    dry run: R rank roles, peak X GiB on rank K (plan Y GiB), parameters Z B over all ranks

Measured (``measure.py``, ``step.py``): the static components by owner; ``activations`` = what the update holds
when the last stage's output layer starts (a stage without it: the update's working set); ``logits`` = the rest
of the update's peak (logits, fp32 softmax, the loss's backward); ``μ`` = how far the log-prob pass with μ
peaks above the one without. The plan's numbers are ``planning/memory.py``'s (``params_per_gpu``,
``activation_bytes``, ``sampling_peak_bytes``; its per-GPU overhead is left out on both sides: the dry run measures
tensors). The peak is the highest phase of the step; X and Y are tensors, without that overhead.
"""
from __future__ import annotations

from megatron_rl.planning.arch import ArchSpec
from megatron_rl.planning.memory import DTYPE_BYTES, GIB, PlanInputs, estimate_stages

#: the devices the peak is held against: (name, bytes)
DEVICES = (("80 GB", 80e9), ("141 GB", 141e9))
#: table rows: (key, label)
ROWS = (("weights", "weights"), ("grads", "gradients (fp32 main grads)"),
        ("optimizer", "optimizer (fp32 master + Adam, /DP)"), ("reference", "reference weights"),
        ("teacher", "teacher (fp32 shadow + swap scratch)"), ("other", "other (RoPE, SP gather buffer, ...)"),
        ("activations", "activations (update)"), ("logits", "logits + fp32 softmax + loss backward"),
        ("mu", "μ pass (above the log-prob pass)"), ("push", "weight push (its own phase)"))


def plan_stages(arch: ArchSpec, inp: PlanInputs) -> dict[int, dict[str, float]]:
    """``planning/memory.py``'s components of the first and the last pipeline stage (bytes; no overhead)."""
    out = {}
    for index, rep in estimate_stages(arch, inp).items():
        n, e = (rep.params.first_stage if index == 0 else rep.params.last_stage), DTYPE_BYTES[inp.dtype]
        reference, teacher = inp.reference * n * e, inp.teacher_shadow * n * (4 + e)
        out[index] = {"weights": rep.weights, "grads": rep.grads, "optimizer": rep.optimizer, "reference": reference,
                      "teacher": teacher, "other": rep.buffers + rep.extra_copies - reference - teacher,
                      "activations": rep.activations, "logits": rep.logits, "mu": rep.sampling, "push": rep.push}
    return out


#: the components of the update's working set; ``push`` is a phase of its own
UPDATE = ("activations", "logits", "mu")


def plan_total(plan: dict[str, float]) -> float:
    """The plan's peak of a stage (no overhead): what is held + the larger of the update's working set and the
    push's (``PlanReport.train_total``)."""
    held = sum(v for k, v in plan.items() if k not in UPDATE and k != "push")
    return held + max(sum(plan[k] for k in UPDATE), plan.get("push", 0))


def measured(result: dict) -> dict[str, float]:
    """One role's measured components (module docstring), bytes."""
    st, ph = result["static"], result["phases"]
    upd = ph["update"]
    last = upd["at_output_layer"] > upd["start"]
    out = {k: st[k] for k in ("weights", "grads", "optimizer", "reference", "teacher", "other")}
    out["teacher"] += ph.get("teacher swap", {}).get("working", 0)
    out["activations"] = (upd["at_output_layer"] if last else upd["peak"]) - upd["start"]
    out["logits"] = upd["peak"] - upd["at_output_layer"] if last else 0
    with_mu, without = ph.get("old log-probs + μ"), ph["old log-probs"]
    out["mu"] = max(0, with_mu["peak"] - without["peak"]) if with_mu else 0
    out["push"] = ph["weight push"]["working"] if "weight push" in ph else 0
    return out


def peak_of(result: dict) -> tuple[str, int]:
    """(phase, bytes) of the role's highest phase."""
    name = max(result["phases"], key=lambda k: result["phases"][k]["peak"])
    return name, result["phases"][name]["peak"]


def _g(b: float) -> str:
    return f"{b / GIB:8.2f}"


def _delta(m: float, p: float | None) -> str:
    if p is None:
        return ""
    if not p:
        return "      —" if not m else "    new"
    return f"{(m - p) / p * 100:+6.1f}%"


def role_table(result: dict, name: str, plan: dict | None) -> list[str]:
    """The rows of one role: measured, plan, difference."""
    m = measured(result)
    lines = [f"{name + ' (rank ' + str(result['role']['rank']) + ')':<42}{'measured':>9}{'plan':>9}{'Δ':>9}"]
    for key, label in ROWS:
        p = plan.get(key) if plan else None
        lines.append(f"  {label:<40}{_g(m[key])} {_g(p) if p is not None else '        '} {_delta(m[key], p)}")
    phase, peak = peak_of(result)
    p_total = plan_total(plan) if plan else None
    lines.append(f"  {'peak (' + phase + ')':<40}{_g(peak)} {_g(p_total) if plan else ''} {_delta(peak, p_total)}")
    fits = ", ".join(f"{'fits' if peak <= b else 'DOES NOT FIT'} {n} ({b / GIB:.1f} GiB)" for n, b in DEVICES)
    lines.append(f"  {'':<40}{'':9} against the device: {fits}")
    ph = result["phases"]
    if "flops" in ph["update"]:
        lines.append(f"  update: {ph['update']['flops'] / 1e12:.1f} TFLOP on this rank (torch's flop registry: "
                     "the matmuls, forward + backward + recompute)")
    return lines
