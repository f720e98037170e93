"""The seed papers' settings beside the 7B–14B example configs: the recipe table of docs/methods/index.md.

:data:`PAPER` holds, for each example config, the value its paper or released recipe uses for each
setting (from the paper or reference repository named in ``source``), by config key. A key whose
config value differs must be listed in the entry's ``departures`` with the reason (a true model or
hardware difference); :func:`drifts` returns the others, and ``tests/unit/test_recipes.py`` fails on
any, so a config edit that drifts from the paper fails a test. :func:`table` renders the page's
table from the configs (``python -m megatron_rl.recipes`` prints it; the same test checks that the
page holds exactly that text).

Every reference computes its PPO ratio under the full temperature-scaled softmax (verl's actor: log-softmax
of logits / T, no sampling mask), so each recipe's ``algo.ratio_space`` is ``full``; ``sampling`` is
NeMo-RL's consistent mode (docs/sampling-and-evaluation.md).

Keys are config keys; ``algo.hp.<field>`` is the method's hyper-parameter ``algo.<kind>.<field>``.
Effective values are compared: ``optim.clip_grad`` null is the method's ``grad_clip``,
``trainer.eval_max_tokens`` 0 is ``rollout.max_tokens``, ``trainer.max_tokens_per_micro_batch`` 0 is
shown as padded micro-batches of ``micro_batch_size`` rows. A :class:`Note` is shown, not compared
(the paper states no value, or the setting does not apply to its model).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from megatron_rl.trainer.loop.preflight import load_checked

CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "configs"


@dataclasses.dataclass(frozen=True)
class Note:
    """A paper cell that is text, not a value to compare."""

    text: str


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One example config's paper values (``values``: key -> value) and its documented departures."""

    method: str
    source: str
    values: dict
    departures: dict = dataclasses.field(default_factory=dict)


#: (row label, keys) of the table, in order
ROWS = (
    ("sampling T / top-p / top-k", ("rollout.temperature", "rollout.top_p", "rollout.top_k")),
    ("prompts × G", ("data.prompts_per_step", "rollout.n")),
    ("max prompt / response", ("data.max_prompt_len", "rollout.max_tokens")),
    ("lr / warm-up / wd / grad clip", ("optim.lr", "optim.warmup_steps", "optim.weight_decay", "optim.clip_grad")),
    ("actor token budget (per DP rank)", ("trainer.max_tokens_per_micro_batch",)),
    ("rollout correction (cap)", ("algo.off_policy", "algo.tis_cap")),
    ("PPO ratio space", ("algo.ratio_space",)),
    ("policy clip ε low / high / aggregation", ("algo.hp.clip_low", "algo.hp.clip_high", "algo.hp.loss_agg_mode")),
    ("KL loss β / in-reward β", ("algo.hp.kl_loss_coef", "algo.hp.kl_reward_coef")),
    ("chat template options", ("data.chat_template_kwargs",)),
    ("outcome reward", ("reward.default",)),
    ("eval every / n / T / top-p / top-k / max tokens",
     ("trainer.eval_every", "trainer.eval_n", "trainer.eval_temperature", "trainer.eval_top_p", "trainer.eval_top_k",
      "trainer.eval_max_tokens")),
)

_THINK = {"enable_thinking": True}


def _rlcsd(method: str, kl: float, clip: float = 1.0, **departures: str) -> Recipe:
    """The RLCSD recipe (THU-BPM/RLCSD: the values every method shares, β_KL and grad clip per method)."""
    v = {"rollout.temperature": 1.0, "rollout.top_p": 0.95, "rollout.top_k": 20, "data.prompts_per_step": 64,
         "rollout.n": 8, "data.max_prompt_len": 2048, "rollout.max_tokens": 16384, "optim.lr": 1e-6,
         "optim.warmup_steps": 50, "optim.weight_decay": 0.01, "optim.clip_grad": clip,
         "trainer.max_tokens_per_micro_batch": 40960, "algo.off_policy": "tis",
         "algo.tis_cap": 2.0, "algo.ratio_space": "full", "algo.hp.kl_loss_coef": kl, "algo.hp.kl_reward_coef": 0.0,
         "data.chat_template_kwargs": _THINK, "trainer.eval_every": 50, "trainer.eval_n": 12,
         "trainer.eval_temperature": 0.6, "trainer.eval_top_p": 0.95, "trainer.eval_top_k": 20,
         "trainer.eval_max_tokens": 38912, "reward.default": "math"}
    return Recipe(method, "THU-BPM/RLCSD @ 7eeff3c (configs/math_deepmath, scripts/_run_verl.sh)", v, {k.replace("__", "."): r for k, r in departures.items()})


PAPER: dict[str, Recipe] = {
    "qwen3_8b_grpo": _rlcsd("grpo", 0.001),
    "qwen3_8b_grpo_separate": _rlcsd("grpo", 0.001, trainer__max_tokens_per_micro_batch=(
        "its 4 training GPUs cannot hold a 40960-token micro-batch without activation recompute, and a budget may not "
        "be below rollout.max_model_len (40960)")),
    "qwen3_8b_rlcsd": _rlcsd("rlcsd", 0.0),
    "qwen2_5_14b_grpo_lora": _rlcsd(
        "grpo", 0.001,
        data__max_prompt_len="LoRA needs megatron's local attention, whose S x S scores cap a row at 4096 tokens",
        rollout__max_tokens="as data.max_prompt_len: 1024 + 3072 tokens a row under local attention",
        trainer__eval_max_tokens="as rollout.max_tokens: a row of local attention",
        trainer__max_tokens_per_micro_batch="padded rows of 4096 tokens with full recompute (local attention)",
        optim__lr="LoRA adapters: ten times the full fine-tune's 1e-6",
        optim__weight_decay="no decay pulling the adapters back to the base",
        data__chat_template_kwargs="Qwen2.5 has no thinking mode"),
    "qwen2_5_14b_rlcsd": _rlcsd("rlcsd", 0.0, data__chat_template_kwargs="Qwen2.5 has no thinking mode"),
    "qwen3_8b_opsd": _rlcsd("opsd", 0.0, clip=0.1),
    "qwen3_8b_opsd_ectr": _rlcsd("opsd_ectr", 0.001, clip=0.1),
    "qwen3_8b_rlsd": _rlcsd("rlsd", 0.0),
    "qwen3_8b_rlsd_ectr": _rlcsd("rlsd_ectr", 0.001),
    "qwen3_8b_sdpo": _rlcsd("sdpo", 0.0),
    "qwen3_8b_srpo": _rlcsd("srpo", 0.0),
    "qwen3_8b_gspo": Recipe(
        "gspo", "GSPO paper arXiv 2507.18071 §5.1; volcengine/verl @ 587611b (recipe/gspo/test_gspo_3b_math.sh); "
        "the rest: the GRPO recipe above",
        {**_rlcsd("gspo", 0.0).values, "algo.hp.clip_low": 3e-4, "algo.hp.clip_high": 4e-4,
         "algo.hp.loss_agg_mode": "seq-mean-token-mean"}),
    "qwen3_8b_cispo": Recipe(
        "cispo", "CISPO paper arXiv 2506.13585 §3.1 (no IS lower bound, token normaliser, no KL); eps_high: verl "
        "examples/cispo_trainer; the rest: the GRPO recipe above",
        {**_rlcsd("cispo", 0.0).values, "algo.hp.clip_low": Note("no lower bound (a large value)"),
         "algo.hp.clip_high": Note("tuned, no value stated"), "algo.hp.loss_agg_mode": "token-mean"}),
    "qwen3_8b_bicc_rcc": Recipe(
        "bicc_rcc", "Skylanding/BiCC @ 0c14b23 (recipe/dapo/run_bicc_dapo.sh; eval: paper pass@1 over 32 runs, its README T/top-p/tokens)",
        {"rollout.temperature": 0.2, "rollout.top_p": 0.7, "rollout.top_k": -1, "data.prompts_per_step": 16,
         "rollout.n": 8, "data.max_prompt_len": 2048, "rollout.max_tokens": 3072, "optim.lr": 1e-6,
         "optim.warmup_steps": 10, "optim.weight_decay": 0.1, "optim.clip_grad": 1.0,
         "trainer.max_tokens_per_micro_batch": 6144, "algo.off_policy": Note("none"), "algo.ratio_space": "full", "algo.hp.kl_loss_coef": 0.0, "algo.hp.kl_reward_coef": 0.001,
         "data.chat_template_kwargs": Note("none (Qwen3-4B-Instruct-2507 does not think)"), "trainer.eval_every": 100,
         "trainer.eval_n": 32, "trainer.eval_temperature": 0.6, "trainer.eval_top_p": 0.95, "trainer.eval_top_k": -1,
         "trainer.eval_max_tokens": 3072, "reward.default": "dapo"},
        {"data.chat_template_kwargs": "Qwen3-8B thinks by default; off to match the non-thinking 4B-Instruct"}),
    "qwen2_5_7b_papo": Recipe(
        "papo", "tanzelin430/PAPO (paper appendix + verl/scripts)",
        {"rollout.temperature": 1.0, "data.prompts_per_step": 128, "rollout.n": 8, "data.max_prompt_len": 2048,
         "algo.ratio_space": "full",
         "rollout.max_tokens": 8192, "optim.lr": 1e-6, "trainer.max_tokens_per_micro_batch": 18000,
         "algo.hp.kl_loss_coef": 0.0, "algo.hp.kl_reward_coef": 0.0,
         "data.chat_template_kwargs": Note("none (base model, pass-through template)"), "trainer.eval_every": 10,
         "trainer.eval_n": 4, "trainer.eval_temperature": 0.7, "trainer.eval_max_tokens": 8192}),
    "llama3_1_8b_dapo": Recipe(
        "dapo", "volcengine/verl @ b178a3c (DAPO recipe; token budget: verl recipe/dapo scripts, prompt + response); "
        "eval: DAPO paper §4.1 (avg@32, T 1.0, top-p 0.7)",
        {"rollout.temperature": 1.0, "data.prompts_per_step": 512, "rollout.n": 16, "rollout.max_tokens": 20480,
         "algo.ratio_space": "full",
         "trainer.max_tokens_per_micro_batch": 22528, "optim.lr": 1e-6, "optim.warmup_steps": 20, "optim.weight_decay": 0.1, "optim.clip_grad": 1.0,
         "algo.hp.kl_loss_coef": 0.0, "algo.hp.kl_reward_coef": 0.0, "trainer.eval_n": 32,
         "trainer.eval_temperature": 1.0, "trainer.eval_top_p": 0.7, "trainer.eval_max_tokens": 20480,
         "reward.default": "dapo"}),
}


def value(cfg, key: str) -> Any:
    """The effective value of ``key`` in a loaded config (module docstring)."""
    section, name = key.split(".", 1)
    if section == "algo" and name.startswith("hp."):
        return getattr(cfg.algo.hparams, name[3:])
    v = getattr(getattr(cfg, section), name)
    if key == "optim.clip_grad" and v is None:
        return cfg.algo.hparams.grad_clip
    if key == "trainer.eval_max_tokens" and v == 0:
        return cfg.rollout.max_tokens
    if key == "trainer.max_tokens_per_micro_batch" and v == 0:
        return f"padded (micro_batch_size {cfg.trainer.rows_per_micro_batch})"
    return v


def load(name: str):
    """The example config ``name`` (``examples/configs/<name>.yaml``), validated except against its
    model (``model.hf_path`` unset: the 7B–14B weights are not here)."""
    return load_checked(CONFIGS / f"{name}.yaml", ["model.hf_path="])


def drifts(name: str, cfg=None) -> list[tuple[str, Any, Any]]:
    """(key, paper, config) for each compared key whose config value differs from the paper's and is
    not a documented departure of ``name``."""
    rec = PAPER[name]
    cfg = cfg if cfg is not None else load(name)
    out = []
    for key, want in rec.values.items():
        if isinstance(want, Note) or key in rec.departures:
            continue
        got = value(cfg, key)
        if got != want:
            out.append((key, want, got))
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, Note):
        return v.text
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {str(x).lower() if isinstance(x, bool) else x}" for k, x in v.items()) + "}" if v else "none"
    if isinstance(v, float):
        return f"{v:g}"
    return "—" if v is None else str(v)


def table() -> str:
    """The recipe table of docs/methods/index.md (markdown), from the configs and :data:`PAPER`."""
    lines = ["| config (method) | setting | paper | config | |", "|---|---|---|---|---|"]
    for name, rec in PAPER.items():
        cfg = load(name)
        first = True
        for label, keys in ROWS:
            keys = [k for k in keys if k in rec.values]
            if not keys:
                continue
            paper = " / ".join(_fmt(rec.values[k]) for k in keys)
            mine = " / ".join(_fmt(value(cfg, k)) for k in keys)
            notes = [rec.departures[k] for k in keys if k in rec.departures]
            bad = {k for k, _, _ in drifts(name, cfg)} & set(keys)
            mark = "DRIFT: " + ", ".join(sorted(bad)) if bad else ("departure: " + "; ".join(notes) if notes else "=")
            head = f"`{name}` ({rec.method})" if first else ""
            lines.append(f"| {head} | {label} | {paper} | {mine} | {mark} |")
            first = False
    sources = "; ".join(f"`{n}`: {r.source}" for n, r in PAPER.items() if n in ("qwen3_8b_grpo", "qwen3_8b_bicc_rcc",
                                                                                  "qwen2_5_7b_papo", "llama3_1_8b_dapo"))
    return "\n".join(lines) + f"\n\nSources (the RLCSD family shares the first): {sources}.\n"


if __name__ == "__main__":
    print(table(), end="")
