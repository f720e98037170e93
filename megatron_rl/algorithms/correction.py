"""Rollout correction: registered ``algo.off_policy`` modes beside ``decoupled | tis | none``
(``offpolicy.py``), after verl's rollout-correction suite (``verl/trainer/ppo/rollout_corr_helper.py``,
``compute_rollout_correction_and_rejection_mask``; Liu, Li et al. 2025, "When Speed Kills Stability:
Demystifying RL Collapse from the Training-Inference Mismatch").

Every mode reads the per-token log-ratio of the trainer-recomputed (proximal, ``old``) policy
against the engine's sampling (behaviour, ``rollout``) policy over the response mask m:

    δ_t = log π_old(y_t) − log π_rollout(y_t)             S_i = Σ_t m_t δ_t   (sequence log-ratio)
    clip20(x) = clamp(x, −20, 20)                        (verl's SAFETY_BOUND, applied in log space)

and returns a :class:`Correction`: ``weights`` [N, T] that multiply each token's loss (no gradient;
0 on padding), ``keep`` [N, T] in {0, 1} that is multiplied INTO the response mask (a rejected token
leaves the loss's normaliser too, as verl's rejection rewrites ``response_mask``), and metrics.
``None`` for either means "not used". Every registered mode acts on every sample (staleness 0
included): it corrects the engine/trainer mismatch as well as staleness.

Modes (a pure function each, its hyper-parameter dataclass = ``algo.correction``):

* ``seq_tis`` — sequence-level truncated IS (verl ``rollout_is=sequence``, preset
  ``decoupled_seq_is``):  w_i = min(exp(clip20(S_i)), C) on every token of i.
* ``seq_mis`` — sequence-level masked IS (verl ``rollout_is=sequence`` + ``rollout_rs=sequence``,
  preset ``decoupled_seq_is_rs`` with both thresholds = U): ρ_i = exp(clip20(S_i));
  keep_i = 1[L ≤ ρ_i ≤ U], w_i = ρ_i on kept sequences.  L defaults to 1/U (verl's rule).
* ``geo_rs`` — geometric-mean rejection (verl ``rollout_rs=geometric``, preset ``decoupled_geo_rs``
  without its veto): g_i = exp(clip20(S_i / max(Σ_t m_t, 1))); keep_i = 1[L ≤ g_i ≤ U]; no weight.
* ``icepop`` — IcePop token masking (Ling team 2025, Ring-1T; verl ``rollout_is_threshold="a_b"``):
  ρ_t = exp(clip20(δ_t)); w_t = ρ_t · 1[a ≤ ρ_t ≤ b] · m_t. Masked tokens get weight 0 but stay in
  the normaliser (verl's IcePop zeroes the weight, not the mask).
* ``bypass`` — π_old := π_rollout (verl ``bypass_mode``, preset ``ppo_is_bypass``): the trainer's
  old-log-prob pass is skipped, the loss's ratio is π_θ/π_rollout; no weight, no mask.

Token-level TIS is the existing ``tis`` mode (w_t = min(exp(clip20(δ_t)), C)·m_t, verl
``rollout_is=token``, preset ``decoupled_token_is``), with its cap ``algo.tis_cap``.

Edge cases (as verl): a row with an empty mask has S_i = 0, so ρ_i = g_i = 1 (kept; it has no token
anyway); bands are closed (a ratio equal to a bound is kept); weights are 0 off the mask.
Metrics (``offpolicy/*``, over the response tokens / the rows with any token): ``is_mean`` (mean
weight, tokens), ``is_max``, ``masked_token_frac`` (tokens with weight or keep 0), ``rejected_seq_frac``
(rows with a token removed), ``ratio_high_frac`` / ``ratio_low_frac`` (share of the mode's ratios —
token or sequence — above U / below L, before truncation).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple

import torch
from torch import Tensor

SAFETY_BOUND = 20.0


class Correction(NamedTuple):
    """weights [N, T] (no grad) or None; keep [N, T] ∈ {0, 1} or None; metrics name → 0-d tensor."""

    weights: Tensor | None
    keep: Tensor | None
    metrics: dict


def _positive(name: str, x) -> None:
    if not (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0):
        raise ValueError(f"algo.correction.{name} must be a finite number > 0, got {x!r}")


@dataclasses.dataclass(frozen=True)
class TruncateHParams:
    """``seq_tis``: the cap C of the sequence weight (verl's ``rollout_is_threshold``; its preset 2.0)."""

    cap: float = 2.0
    """Upper truncation C of min(ρ_i, C) (>= 1)."""

    def __post_init__(self):
        _positive("cap", self.cap)
        if self.cap < 1.0:
            raise ValueError(f"algo.correction.cap must be >= 1, got {self.cap}")

    def band(self) -> tuple[float, float]:
        return 1.0 / self.cap, self.cap


@dataclasses.dataclass(frozen=True)
class BandHParams:
    """A closed band [lower, upper] on a ratio (``seq_mis``; verl preset ``decoupled_seq_is_rs``: 0.5, 2)."""

    upper: float = 2.0
    """Upper bound U of the kept ratios."""
    lower: float | None = None
    """Lower bound L (null: 1/U, verl's default)."""

    def __post_init__(self):
        _positive("upper", self.upper)
        if self.lower is not None:
            _positive("lower", self.lower)
            if self.lower > self.upper:
                raise ValueError(f"algo.correction.lower ({self.lower}) must be <= algo.correction.upper ({self.upper})")

    def band(self) -> tuple[float, float]:
        return (1.0 / self.upper if self.lower is None else self.lower), self.upper


@dataclasses.dataclass(frozen=True)
class GeoHParams(BandHParams):
    """``geo_rs``: the band of the per-token geometric-mean ratio (verl preset ``decoupled_geo_rs``: 0.999, 1.001)."""

    upper: float = 1.001
    """Upper bound U of the kept geometric means."""
    lower: float | None = 0.999
    """Lower bound L (null: 1/U)."""


@dataclasses.dataclass(frozen=True)
class IcePopHParams(BandHParams):
    """``icepop``: the token band [a, b] outside which a token's weight is 0."""

    upper: float = 5.0
    """b: tokens with ρ_t > b get weight 0."""
    lower: float | None = 0.5
    """a: tokens with ρ_t < a get weight 0 (null: 1/b)."""


@dataclasses.dataclass(frozen=True)
class NoHParams:
    """``bypass`` has no threshold."""

    def band(self) -> tuple[float, float] | None:
        return None


@dataclasses.dataclass(frozen=True)
class CorrectionMode:
    """A registered ``algo.off_policy`` mode: its pure function ``fn(old, rollout, mask, hp) ->
    Correction``, its hyper-parameter dataclass, and whether the trainer recomputes π_old."""

    name: str
    fn: Callable
    hparams: type
    recompute: bool = True


CORRECTION_MODES: dict[str, CorrectionMode] = {}


def register_correction(name: str, hparams: type, recompute: bool = True):
    """Decorator: register ``fn`` as ``algo.off_policy=name`` (strict: a second name raises)."""
    def deco(fn):
        if name in CORRECTION_MODES or name in ("decoupled", "tis", "none"):
            raise ValueError(f"algo.off_policy mode {name!r} is already registered")
        CORRECTION_MODES[name] = CorrectionMode(name, fn, hparams, recompute)
        return fn
    return deco


def _seq_log_ratio(delta: Tensor, m: Tensor) -> Tensor:
    return (delta * m).sum(-1)


def _metrics(w: Tensor | None, keep: Tensor | None, m: Tensor, stat: Tensor, lo: float, hi: float) -> dict:
    """Shared metrics; ``stat`` is the ratio the mode thresholds ([N, T] per token or [N] per row)."""
    zero = m.new_zeros(())
    n_tok = m.sum().clamp_min(1.0)
    rows = m.sum(-1) > 0
    n_rows = rows.sum().clamp_min(1).to(m.dtype)
    kept = m if keep is None else m * keep                    # the mask the loss normalises by
    live = kept if w is None else kept * (w > 0).to(m.dtype)  # tokens that still carry gradient
    removed = m - live
    if stat.dim() == 2:
        high, low = (((stat > hi).to(m.dtype) * m).sum() / n_tok, ((stat < lo).to(m.dtype) * m).sum() / n_tok)
    else:
        high, low = (((stat > hi) & rows).sum().to(m.dtype) / n_rows, ((stat < lo) & rows).sum().to(m.dtype) / n_rows)
    if w is None or not bool(kept.any()):
        is_mean = is_max = zero + 1.0
    else:
        is_mean = (w * kept).sum() / kept.sum()
        is_max = torch.where(kept > 0, w, torch.full_like(w, -math.inf)).max()
    return {"offpolicy/is_mean": is_mean, "offpolicy/is_max": is_max,
            "offpolicy/masked_token_frac": removed.sum() / n_tok,
            "offpolicy/rejected_seq_frac": ((removed.sum(-1) > 0) & rows).sum().to(m.dtype) / n_rows,
            "offpolicy/ratio_high_frac": high, "offpolicy/ratio_low_frac": low}


@register_correction("seq_tis", TruncateHParams)
def seq_tis(old: Tensor, rollout: Tensor, mask: Tensor, hp: TruncateHParams) -> Correction:
    """Sequence-level truncated IS: w_i = min(exp(clip20(Σ_t m_t δ_t)), C), broadcast to the row's
    tokens (0 off the mask). Metrics' ratio: ρ_i = exp(S_i) against [1/C, C]."""
    m = mask.to(old.dtype)
    s = _seq_log_ratio(old.detach() - rollout.detach(), m)
    rho = torch.exp(torch.clamp(s, -SAFETY_BOUND, SAFETY_BOUND))
    w = torch.clamp(rho, max=hp.cap)[:, None] * m
    lo, hi = hp.band()
    return Correction(w.detach(), None, _metrics(w, None, m, rho, lo, hi))


@register_correction("seq_mis", BandHParams)
def seq_mis(old: Tensor, rollout: Tensor, mask: Tensor, hp: BandHParams) -> Correction:
    """Sequence-level masked IS: ρ_i = exp(clip20(S_i)); keep_i = 1[L ≤ ρ_i ≤ U] (the whole row leaves
    the mask otherwise); w_i = ρ_i on the kept rows' tokens."""
    m = mask.to(old.dtype)
    s = _seq_log_ratio(old.detach() - rollout.detach(), m)
    rho = torch.exp(torch.clamp(s, -SAFETY_BOUND, SAFETY_BOUND))
    lo, hi = hp.band()
    keep_row = ((rho >= lo) & (rho <= hi)).to(m.dtype)
    keep = keep_row[:, None].expand_as(m).clone()
    w = rho[:, None] * m * keep
    return Correction(w.detach(), keep, _metrics(w, keep, m, rho, lo, hi))


@register_correction("geo_rs", GeoHParams)
def geo_rs(old: Tensor, rollout: Tensor, mask: Tensor, hp: GeoHParams) -> Correction:
    """Geometric-mean rejection: g_i = exp(clip20(S_i / max(Σ_t m_t, 1))); rows with g_i outside
    [L, U] leave the mask; no IS weight."""
    m = mask.to(old.dtype)
    s = _seq_log_ratio(old.detach() - rollout.detach(), m)
    g = torch.exp(torch.clamp(s / m.sum(-1).clamp_min(1.0), -SAFETY_BOUND, SAFETY_BOUND))
    lo, hi = hp.band()
    keep = ((g >= lo) & (g <= hi)).to(m.dtype)[:, None].expand_as(m).clone()
    return Correction(None, keep, _metrics(None, keep, m, g, lo, hi))


@register_correction("icepop", IcePopHParams)
def icepop(old: Tensor, rollout: Tensor, mask: Tensor, hp: IcePopHParams) -> Correction:
    """IcePop token masking: ρ_t = exp(clip20(δ_t)); w_t = ρ_t · 1[a ≤ ρ_t ≤ b] · m_t (the token
    stays in the normaliser with weight 0)."""
    m = mask.to(old.dtype)
    rho = torch.exp(torch.clamp(old.detach() - rollout.detach(), -SAFETY_BOUND, SAFETY_BOUND))
    lo, hi = hp.band()
    w = torch.where((rho >= lo) & (rho <= hi), rho, torch.zeros_like(rho)) * m
    return Correction(w.detach(), None, _metrics(w, None, m, rho, lo, hi))


@register_correction("bypass", NoHParams, recompute=False)
def bypass(old: Tensor, rollout: Tensor, mask: Tensor, hp: NoHParams) -> Correction:
    """π_old := π_rollout: nothing to weight (the pipeline never ran the old-log-prob pass; ``old``
    here IS the engine's log-probs)."""
    return Correction(None, None, {})


def is_correction_mode(name: str) -> bool:
    """True for a mode registered here (False for decoupled / tis / none, ``offpolicy.py``)."""
    return name in CORRECTION_MODES


def correction_recomputes(name: str) -> bool:
    """Whether ``algo.off_policy=name`` needs the trainer's old-log-prob pass (False: bypass)."""
    mode = CORRECTION_MODES.get(name)
    return mode is None or mode.recompute


def correction_mode(name: str) -> CorrectionMode:
    """The registered mode ``name`` (ValueError listing the valid names otherwise)."""
    if name not in CORRECTION_MODES:
        raise ValueError(f"unknown rollout-correction mode {name!r}; valid: {sorted(CORRECTION_MODES)}")
    return CORRECTION_MODES[name]


def apply_correction(name: str, old: Tensor, rollout: Tensor, mask: Tensor, hp) -> Correction:
    """Run the registered mode ``name`` (shapes [N, T]; ``hp`` its dataclass)."""
    mode = correction_mode(name)
    if not isinstance(hp, mode.hparams):
        raise TypeError(f"algo.off_policy={name}: hyper-parameters must be {mode.hparams.__name__}, got {type(hp).__name__}")
    return mode.fn(old, rollout, mask, hp)
