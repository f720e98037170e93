"""Typed, frozen hyper-parameter dataclasses, one per algorithm kind (defaults from the specs).

Selected as ``algo.kind`` + ``algo.<kind>.*``; :data:`ALGO_KINDS` in :mod:`.registry` maps each
kind to (advantage name, policy-loss name, dataclass). Every field is validated in
``__post_init__``. Fields shared by all PPO-style kinds live in :class:`PPOHParams`.
Trainer-side knobs that the loss functions do not read (teacher mode, grad clip) are kept here
so that one dataclass describes a method completely.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .kl import kl_kinds
from .losses import AGG_MODES
from .registry import bicc_base_names


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class PPOHParams:
    """Shared PPO knobs (verl ``vanilla`` loss, GRPO defaults of the RLCSD docs/methods/self-distillation.md)."""

    clip_low: float = 0.2            #: ε_low
    clip_high: float = 0.2           #: ε_high (DAPO clip-higher: 0.28)
    dual_clip: float | None = 3.0    #: dual-clip constant c > 1, None = off
    loss_agg_mode: str = "token-mean"  #: see ``aggregate``
    loss_scale_factor: float | None = None  #: constant normaliser for seq-mean-token-sum-norm
    kl_loss_coef: float = 0.0        #: β of the KL-to-reference loss term
    kl_loss_type: str = "k3"         #: estimator of that term
    kl_reward_coef: float = 0.0      #: β of the in-reward KL r_i − β·Σ_t KL_t(old, ref) (verl use_kl_in_reward, fixed kl_ctrl)
    kl_reward_type: str = "k1"       #: estimator of the in-reward KL (verl ``kl_penalty``; default ``kl`` = k1)
    grad_clip: float = 1.0           #: gradient-norm clip (trainer knob)

    def __post_init__(self) -> None:
        self._check_clip()
        _check(self.loss_agg_mode in AGG_MODES, f"loss_agg_mode {self.loss_agg_mode!r} not in {sorted(AGG_MODES)}")
        _check(self.loss_scale_factor is None or self.loss_scale_factor > 0, "loss_scale_factor must be > 0")
        _check(self.kl_loss_coef >= 0, f"kl_loss_coef must be >= 0, got {self.kl_loss_coef}")
        base = self.kl_loss_type[:-1] if self.kl_loss_type.endswith("+") else self.kl_loss_type
        _check(base in kl_kinds(), f"kl_loss_type {self.kl_loss_type!r} not in {kl_kinds()}")
        _check(self.kl_reward_coef >= 0, f"kl_reward_coef must be >= 0, got {self.kl_reward_coef}")
        _check(self.kl_reward_type in kl_kinds(), f"kl_reward_type {self.kl_reward_type!r} not in {kl_kinds()}")

    def _check_clip(self) -> None:
        """The PPO trust region: 0 ≤ ε_low < 1, ε_high ≥ 0, dual clip > 1 (a method with another clip overrides)."""
        _check(0 <= self.clip_low < 1, f"clip_low={self.clip_low} must be in [0, 1) (the ratio's band starts at "
               "1 - clip_low > 0)")
        _check(self.clip_high >= 0, f"clip_high={self.clip_high} must be >= 0 (the ratio's band ends at 1 + clip_high)")
        _check(self.dual_clip is None or self.dual_clip > 1, f"dual_clip must be > 1 or None, got {self.dual_clip}")

    def to_dict(self) -> dict:
        """Plain dict of the fields (for logging)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def vocab_bounded(self) -> dict[str, int]:
        """The fields that count tokens of the vocabulary (a top-k support), by name: start-up checks them
        against the model's ``vocab_size``. None here; a method with such a field declares it."""
        return {}


@dataclass(frozen=True)
class GRPOHParams(PPOHParams):
    """GRPO (verl): std_u + ε scaling, dual clip 3, k3 KL loss 0.001."""

    eps: float = 1e-6                #: ε of the group scale (r − mean)/(std + ε)
    scale: str = "std"               #: group scale: std (unbiased, verl) | std_pop (population) | none (Dr.GRPO)
    kl_loss_coef: float = 0.001

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.scale in ("std", "std_pop", "none"), f"scale {self.scale!r} not in ['none', 'std', 'std_pop']")


@dataclass(frozen=True)
class SamplingHParams(PPOHParams):
    """DAPO's sampling-side pieces (soft overlong shaping, dynamic sampling), read by the sampling data
    paths (``trainer/paths/plain.py``) of every method whose hparams derive from this class."""

    overlong_enable: bool = False        #: DAPO soft overlong punishment added to the reward
    overlong_buffer_len: int = 4096      #: last tokens before rollout.max_tokens where the penalty ramps up (<= max_tokens)
    overlong_penalty_factor: float = 1.0  #: penalty at the length cap (linear from 0 over the buffer)
    filter_groups: bool = False          #: DAPO dynamic sampling
    filter_metric: str = "acc"           #: what must vary inside a kept group: acc (correctness) | score | seq_reward | seq_final_reward (reward)
    max_num_gen_batches: int = 0         #: generation batches per step at most; ≤ 0 = unlimited
    at_cap: str = "raise"                #: at max_num_gen_batches: raise (reference) | fill (uniform groups, no duplicates)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.overlong_buffer_len > 0, "overlong_buffer_len must be > 0")
        _check(self.filter_metric in ("acc", "score", "seq_reward", "seq_final_reward"),
               f"filter_metric {self.filter_metric!r} invalid")
        _check(self.at_cap in ("raise", "fill"), f"at_cap must be raise|fill, got {self.at_cap!r}")


@dataclass(frozen=True)
class DAPOHParams(GRPOHParams, SamplingHParams):
    """DAPO: clip-higher 0.28, token-mean, no KL, overlong shaping, dynamic sampling."""

    clip_high: float = 0.28
    kl_loss_coef: float = 0.0
    overlong_enable: bool = True
    filter_groups: bool = True


@dataclass(frozen=True)
class DrGRPOHParams(GRPOHParams):
    """Dr.GRPO: no std division, constant normaliser (seq-mean-token-sum-norm), no KL."""

    scale: str = "none"
    loss_agg_mode: str = "seq-mean-token-sum-norm"
    kl_loss_coef: float = 0.0


@dataclass(frozen=True)
class ReMaxHParams(PPOHParams):
    """ReMax: greedy-response baseline, no normalisation."""


@dataclass(frozen=True)
class RLOOHParams(PPOHParams):
    """RLOO: leave-one-out baseline."""


@dataclass(frozen=True)
class BiCCHParams(SamplingHParams):
    """BiCC (released recipe): clip 0.2/0.28, dual clip 10, token-mean; 40 % context budget."""

    clip_high: float = 0.28
    dual_clip: float | None = 10.0
    context_frac: float = 0.4                 #: L_ctx = floor(frac · L_max)
    old_logprob_context: str = "plain"        #: plain (paper) | conditioned
    threshold: float = 0.5                    #: correct iff reward > threshold
    base: str = "bicc"          #: advantage estimator: bicc (released code) | grpo | dapo | drgrpo | remax (docs/methods/bicc-rcc.md)

    def __post_init__(self) -> None:
        super().__post_init__()
        label = "rcc" if hasattr(self, "rcc_delta") else "bicc"
        bases = bicc_base_names()   # the estimators registered as BiCC's base (register_bicc_base)
        _check(self.base in bases, f"{label} base {self.base!r} invalid; valid: {bases}")
        _check(0 < self.context_frac < 1, f"context_frac must be in (0, 1), got {self.context_frac}")
        _check(self.old_logprob_context in ("plain", "conditioned"),
               f"old_logprob_context {self.old_logprob_context!r} not in ['conditioned', 'plain']")

    def context_budget(self, max_len: int) -> int:
        """floor(context_frac · max_len) tokens."""
        return int(self.context_frac * max_len)


@dataclass(frozen=True)
class BiCCRCCHParams(BiCCHParams):
    """BiCC + RCC: baseline r̄ + 2·Cov(R, δ) on top of ``base``'s scale."""

    base: str = "grpo"          #: grpo | dapo | drgrpo | bicc | remax
    rcc_delta: str = "sum"      #: sum (literal) | mean
    eps: float = 1e-6           #: ε of the base estimator's group scale

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.rcc_delta in ("sum", "mean"), f"rcc_delta {self.rcc_delta!r} not in ['mean', 'sum']")


@dataclass(frozen=True)
class TeacherHParams(PPOHParams):
    """Teacher weights θ̄ of the self-distillation methods (``trainer/paths/teacher/weights.py``): the teacher data
    paths (``trainer/paths/teacher/path.py``) read these; ``ema_decay`` is used in ``ema`` mode,
    ``teacher_sync_interval`` in ``snapshot`` mode."""

    teacher_mode: str = "snapshot"   #: teacher weights: fixed (= current θ) | snapshot (copy every teacher_sync_interval steps) | ema
    teacher_sync_interval: int = 10  #: optimizer steps between teacher snapshots (snapshot mode)
    ema_decay: float = 0.95          #: θ̄ ← d·θ̄ + (1 − d)·θ after each step (ema mode)


@dataclass(frozen=True)
class HintHParams(TeacherHParams):
    """RLCSD hint selection (docs/methods/self-distillation.md): at most ``k_max`` negative hints per target, the positive
    hint from a correct self rollout (``self_rollout``) or the ground-truth solution (``gt_cot``)."""

    k_max: int = 1                   #: negative hints per target at most (K_max)
    source: str = "self_rollout"     #: positive hint: self_rollout (a correct sibling) | gt_cot (the reference solution)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.k_max >= 1, f"k_max must be >= 1, got {self.k_max}")
        _check(self.source in ("self_rollout", "gt_cot"), f"hint source {self.source!r} invalid")


@dataclass(frozen=True)
class RLCSDHParams(HintHParams):
    """RLCSD (docs/methods/self-distillation.md)."""

    tau: float = 0.02       #: temperature τ of the contrastive signal: r = clip(β·λ·tanh(e/τ), lo, hi)
    beta: float = 1.0       #: β of that residual
    lam: float = 0.5        #: λ of that residual
    delta: float = 0.02     #: gate: tokens with |r| > δ take the modulated advantage path
    eta: float = 1.0        #: η, weight of the selected (modulated) path in the two-path loss
    clip_lo: float = -2.0   #: lower clip of the residual r
    clip_hi: float = 2.0    #: upper clip of the residual r
    k_max: int = 4
    dual_clip: float | None = None
    loss_agg_mode: str = "token-sum"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.tau > 0 and self.k_max >= 1 and self.clip_lo <= self.clip_hi, "RLCSD tau/k_max/clip invalid")
        _check(self.loss_agg_mode == "token-sum", "rlcsd carries its own two-path normalisers: loss_agg_mode must be 'token-sum'")

    def signal_kwargs(self) -> dict:
        """Keyword arguments of ``rlcsd_advantage``."""
        return dict(tau=self.tau, beta=self.beta, lam=self.lam, delta=self.delta,
                    clip_lo=self.clip_lo, clip_hi=self.clip_hi)


@dataclass(frozen=True)
class OPSDHParams(TeacherHParams):
    """OPSD: teacher top-100 + tail, per-element clip 0.05, teacher = current θ, grad clip 0.1."""

    top_k: int = 100                 #: teacher support: top-k tokens + one tail bucket
    jsd_token_clip: float = 0.05     #: per-token clip κ of the distillation divergence
    teacher_mode: str = "fixed"
    grad_clip: float = 0.1

    def vocab_bounded(self) -> dict[str, int]:
        """The teacher support's ``top_k``."""
        return {"top_k": self.top_k}


@dataclass(frozen=True)
class SDPOHParams(TeacherHParams):
    """SDPO: JSD α 0.5 on student top-100 + tail, IS clip 2, EMA teacher 0.95."""

    top_k: int = 100                 #: student support: top-k tokens + one tail bucket
    alpha: float = 0.5               #: α of the generalized JSD (0.5: symmetric)
    is_clip: float = 2.0             #: cap of the importance weight π_θ/π_old
    teacher_mode: str = "ema"

    def vocab_bounded(self) -> dict[str, int]:
        """The student support's ``top_k``."""
        return {"top_k": self.top_k}


@dataclass(frozen=True)
class SRPOHParams(SDPOHParams):
    """SRPO: GRPO (ε 0.2, c 3) on correct rows, entropy-weighted SDPO on the rest."""

    srpo_beta: float = 1.0           #: β of the entropy weighting of the SDPO term on the incorrect rows


@dataclass(frozen=True)
class RLSDHParams(TeacherHParams):
    """RLSD: ε 0.2, ε_w 0.2, λ₀ 0.5 (decay switch off by default, docs/methods/self-distillation.md), snapshot/10."""

    dual_clip: float | None = None
    eps_w: float = 0.2               #: clip ε_w of the teacher/student token weight
    lam: float = 0.5                 #: λ₀, weight of the teacher term
    lam_decay: bool = False          #: decay λ linearly to 0 over lam_decay_steps (docs/methods/self-distillation.md)
    lam_decay_steps: int = 50        #: steps of that decay


@dataclass(frozen=True)
class RLSDECTRHParams(RLSDHParams, HintHParams):
    """RLSD-ECTR: RLSD with the pos/neg teacher gap; launcher KL 0.001."""

    kl_loss_coef: float = 0.001
    k_max: int = 1


@dataclass(frozen=True)
class OPSDECTRHParams(OPSDHParams, HintHParams):
    """OPSD-ECTR: α_E 0.5, floor −5, τ_cw 1, clip 0.05, KL 0.001, grad clip 0.1."""

    alpha: float = 0.5               #: α_E, weight of the negative-hint teacher in g = (1+α)log p_c − α·max(log p_w, f)
    log_w_floor: float = -5.0        #: floor f of the negative teacher log-prob
    cw_tau: float = 1.0              #: τ of the confidence weight ω = KL/(KL + τ) (0: ω = 1)
    kl_loss_coef: float = 0.001
    k_max: int = 1


@dataclass(frozen=True)
class PAPOHParams(GRPOHParams):
    """PAPO: A_out + λ·A_proc (λ 1.0), clip 0.2/0.28 as in every released run, no KL."""

    lam: float = 1.0                #: λ of A_out + λ·A_proc
    process_norm: str = "correct"   #: correct | full (Fullnorm ablation)
    reward_mode: str = "dual"       #: dual (PAPO) | prm_only (GRPO on r_proc of ALL responses) | mult (GRPO on r_out·r_proc)
    clip_high: float = 0.28
    kl_loss_coef: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.process_norm in ("correct", "full"), f"papo process_norm {self.process_norm!r} invalid")
        _check(self.reward_mode in ("dual", "prm_only", "mult"),
               f"papo reward_mode {self.reward_mode!r} invalid; valid: ['dual', 'mult', 'prm_only']")


@dataclass(frozen=True)
class ScoreHParams(PPOHParams):
    """SCoRe (BY571 arithmetic config): β1 0.01, β2 0.1, α 10, sequence length norm."""

    stage: int = 1               #: SCoRe stage: 1 (first attempt held near the reference) | 2 (both attempts, shaped reward)
    beta1: float = 0.01          #: β1, KL-to-reference weight of stage II
    beta2: float = 0.1           #: β2, first-attempt KL weight of stage I
    alpha: float = 10.0          #: α of the shaped reward r̃2 = r2 + α(r2 − r1)
    length_norm: str = "sequence"  #: per-token weight: sequence (1/length) | constant (1/max_new_attempt*)
    max_new_attempt1: int = 768  #: first-attempt length of length_norm=constant
    max_new_attempt2: int = 768  #: second-attempt length of length_norm=constant
    loss_agg_mode: str = "seq-mean-token-sum"
    stage1_steps: int = 0        #: trainer: stage I for loop steps 1..stage1_steps, II after (0: fixed ``stage``)
    instruction: str = ""        #: trainer: self-correction instruction text ("" -> the CPU demo's "R=")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.stage in (1, 2), f"SCoRe stage must be 1 or 2, got {self.stage}")
        _check(self.length_norm in ("sequence", "constant"), f"length_norm {self.length_norm!r} invalid")
        _check(self.stage1_steps >= 0, f"stage1_steps must be >= 0, got {self.stage1_steps}")
        _check(self.loss_agg_mode == "seq-mean-token-sum", "SCoRe's objective is a mean over samples: loss_agg_mode must be 'seq-mean-token-sum'")
