"""Start-up rules on the config alone (plus the model's ``config.json`` when ``model.hf_path`` has one), each
failure one line naming the key: :func:`check_config`.

Cross-component rules asked of the registries: the method's data path (``trainer/paths``: hparams class,
inputs it produces, its own rules), async and partial rollouts with that path, the ratio space and the
off-policy bypass, registered reward names, lengths against ``rollout.max_model_len`` and the model's
positions, top-k against the vocabulary, group size of group-relative methods, non-negative counters.
``config.py`` and ``config_sections.py`` (leaves: they import no trainer) check only types, ranges and
enums; every entry point that starts a run loads through ``preflight.load_checked``. Also here: the
warning lines for keys a run never reads (:func:`warn_inert_knobs`).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from megatron_rl.runtime import determinism
from megatron_rl.trainer.loop.async_source import check_async
from megatron_rl.trainer.loop.preflight_resources import check_backend

log = logging.getLogger("megatron_rl.preflight")


def check_config(cfg) -> None:
    """Config-only rules (see module docstring); ``ValueError`` naming the key."""
    from megatron_rl.algorithms import algo_kind, single_sample_kinds  # lazy: defers torch to the call
    from megatron_rl.rewards.manager import get_reward  # lazy: defers torch to the call
    from megatron_rl.trainer.paths import path_class  # lazy: defers torch to the call

    if cfg.trainer.deterministic and (why := determinism.refusal(cfg.parallel.cp, cfg.model.backend, cfg.rollout.partial.enable)):
        raise ValueError(why)
    if cfg.parallel.cp > 1:
        check_backend(cfg)             # context parallelism needs CUDA + TE: said before any layout arithmetic
    if cfg.model.hf_path:
        from megatron_rl.models.provider import check_model_layout  # lazy: defers torch to the call

        check_model_layout(cfg)        # TP / PP / VPP and recompute against the model's config.json
    path = path_class(cfg.algo.kind)   # an unknown path, wrong hparams class, missing inputs, the path's own rules
    path.validate(cfg)
    check_async(cfg.algo.kind, path, cfg.rollout.max_staleness, cfg.algo.off_policy)
    check_partial(cfg, path)
    check_multi_turn(cfg, path)
    check_ratio_space(cfg)
    if cfg.algo.off_policy == "bypass":
        check_bypass(cfg)

    for key, name in [*([("reward.default", cfg.reward.default)] if cfg.reward.default else []),
                      *((f"reward.by_source.{s}", n) for s, n in cfg.reward.by_source.items())]:
        try:
            get_reward(name)
        except (KeyError, TypeError) as e:
            raise ValueError(f"{key}: {e.args[0] if e.args else e}") from None
    r, d, t = cfg.rollout, cfg.data, cfg.trainer
    if d.max_prompt_len + r.max_tokens > r.max_model_len:
        raise ValueError(f"data.max_prompt_len={d.max_prompt_len} + rollout.max_tokens={r.max_tokens} exceeds "
                         f"rollout.max_model_len={r.max_model_len}: raise max_model_len or lower one of the two")
    if d.max_prompt_len + t.eval_max_tokens > r.max_model_len:
        raise ValueError(f"data.max_prompt_len={d.max_prompt_len} + trainer.eval_max_tokens={t.eval_max_tokens} exceeds "
                         f"rollout.max_model_len={r.max_model_len}: raise max_model_len or lower one of the two")
    if r.max_tokens < 1 or d.max_prompt_len < 1:
        raise ValueError("rollout.max_tokens and data.max_prompt_len must be >= 1")
    if r.n == 1 and algo_kind(cfg.algo.kind).needs_group:   # the kind's registration says (needs_group)
        raise ValueError(f"rollout.n=1 with algo.kind={cfg.algo.kind}: its advantage compares the samples of a "
                         "prompt's group, so with one sample every advantage is 0 and nothing is learned; set "
                         f"rollout.n >= 2 (n=1 suits {', '.join(single_sample_kinds())})")
    for key in ("eval_every", "ckpt_every", "keep_last"):
        if getattr(t, key) < 0:
            raise ValueError(f"trainer.{key} must be >= 0, got {getattr(t, key)}")
    if cfg.reward.grader_breaker_failures < 1 or not cfg.reward.grader_breaker_cooldown > 0:
        raise ValueError("reward.grader_breaker_failures must be >= 1 and reward.grader_breaker_cooldown > 0")
    rw = cfg.reward
    if rw.outcome_verifier and not rw.grader_url and "papo_math" in {rw.default, *rw.by_source.values()}:
        raise ValueError("reward papo_math asks PAPO's LLM outcome verifier at reward.grader_url when its rule check says "
                         "wrong: set reward.grader_url (an OpenAI-compatible endpoint), or reward.outcome_verifier=false "
                         "for the rule check alone")
    for key in ("eval_prompts",):
        if getattr(t, key) < 1:
            raise ValueError(f"trainer.{key} must be >= 1, got {getattr(t, key)}")
    check_offload_placement(cfg)
    if cfg.model.hf_path and (Path(cfg.model.hf_path) / "config.json").is_file():
        _check_against_model(cfg)


def check_ratio_space(cfg) -> None:
    """``algo.ratio_space=sampling`` puts the PPO ratio under μ; a loss that also reads the policy's
    full-vocabulary distribution (a declared top-k support, a teacher's token log-probs) would mix the
    two spaces, so it is refused there in one line."""
    from megatron_rl.algorithms import algo_kind, loss_support  # lazy: defers torch to the call
    from megatron_rl.algorithms.hparams import TeacherHParams  # lazy: defers torch to the call

    loss = algo_kind(cfg.algo.kind).loss
    teacher = isinstance(cfg.algo.hparams, TeacherHParams)
    if cfg.algo.ratio_space == "sampling" and (loss_support(loss) is not None or teacher):
        raise ValueError(f"algo.ratio_space=sampling with algo.kind={cfg.algo.kind}: its loss also reads the full-vocabulary "
                         "distribution (teacher / top-k support), which is not under the sampling distribution; use "
                         "algo.ratio_space=full")


def check_bypass(cfg) -> None:
    """``algo.off_policy=bypass`` takes the engines' log-probs as π_old; with a truncating sampler and
    ``rollout.logprobs=processed`` those are log μ, so a ratio under the full softmax would start at the
    kept mass M, not 1: ``algo.ratio_space=sampling`` is required there (one line). Its other rules."""
    from megatron_rl.algorithms.hparams import BiCCHParams  # lazy: defers torch to the call
    from megatron_rl.algorithms.sampling import SamplingSpec  # lazy: defers torch to the call

    r = cfg.rollout
    truncates = SamplingSpec(r.temperature, r.top_k, r.top_p, r.min_p).truncates()
    if truncates and r.logprobs == "processed" and cfg.algo.ratio_space == "full":
        raise ValueError(f"algo.off_policy=bypass with algo.ratio_space=full under a truncating sampler (top_p={r.top_p}, "
                         f"top_k={r.top_k}, min_p={r.min_p}): π_old is then the engines' log μ and the ratio would start at "
                         "the kept mass, not 1; set algo.ratio_space=sampling")
    if cfg.rollout.mismatch_limit and cfg.rollout.max_staleness > 0:
        raise ValueError(f"rollout.mismatch_limit={cfg.rollout.mismatch_limit} with algo.off_policy=bypass and "
                         f"rollout.max_staleness={cfg.rollout.max_staleness}: bypass measures the mismatch in the first "
                         "optimizer step, not split by staleness as the guard reads it; unset one of them")
    hp = cfg.algo.hparams
    if isinstance(hp, BiCCHParams) and hp.old_logprob_context == "conditioned":
        raise ValueError(f"algo.off_policy=bypass with algo.{cfg.algo.kind}.old_logprob_context=conditioned: bypass "
                         "takes the engine's log-probs (plain context) as old, conditioned recomputes them; pick one")


def check_partial(cfg, path_cls) -> None:
    """``rollout.partial.enable``: the loop's partial source (``trainer/loop/partial_source.py``) replaces the
    data path's ``collect`` by one group per prompt from the pool, so only the plain sampling path runs
    with it (no dynamic sampling, no greedy baseline, not SCoRe's two attempts nor the other families,
    whose ``collect`` builds more than one round of prompts); refused in one line otherwise."""
    if not cfg.rollout.partial.enable:
        return
    why = path_cls.partial_refusal(cfg.algo.hparams)   # the path's own answer (DataPath.partial_refusal)
    if why:
        raise ValueError(f"rollout.partial.enable=true with algo.kind={cfg.algo.kind!r} (data path "
                         f"{getattr(path_cls, 'name', path_cls.__name__)!r}): {why}; the partial source drives the plain "
                         "sampling path only (no dynamic sampling, no greedy baseline); set rollout.partial.enable=false")


def check_multi_turn(cfg, path_cls) -> None:
    """``multi_turn.enable`` (docs/multi-turn.md): the loop and tools are registered names (one line saying how to
    register one otherwise), the tools build from their config, ``tool_agent`` has tools, the method's data path
    takes multi-turn rollouts (``DataPath.multi_turn_unsupported``), no partial rollouts."""
    mt = cfg.multi_turn
    if not mt.enable:
        return
    from megatron_rl.agent.loop import agent_loop_class  # lazy: the agent package on use
    from megatron_rl.agent.tools import ToolSet  # lazy: the agent package on use

    try:
        agent_loop_class(mt.loop)
    except KeyError as e:
        raise ValueError(f"multi_turn.loop: {e.args[0]}") from None
    try:
        ToolSet(mt.tools)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"multi_turn.tools: {e.args[0] if e.args else e}") from None
    if mt.loop == "tool_agent" and not mt.tools:
        raise ValueError("multi_turn.loop=tool_agent with no multi_turn.tools: name the tools the model may call "
                         "(e.g. multi_turn.tools=[calculator]), or use multi_turn.loop=single_turn_agent")
    if why := path_cls.multi_turn_unsupported:
        raise ValueError(f"multi_turn.enable=true with algo.kind={cfg.algo.kind!r} (data path "
                         f"{getattr(path_cls, 'name', path_cls.__name__)!r}): {why}; set multi_turn.enable=false")
    if cfg.rollout.partial.enable:
        raise ValueError("multi_turn.enable=true with rollout.partial.enable=true: the partial pool resumes single "
                         "engine requests across weight pushes, not agent-loop trajectories; set one of them false")


def warn_inert_knobs(cfg) -> list[str]:
    """Keys set away from their defaults that this run never reads, one warning line each (returned): the
    ``rollout.partial.*`` knobs without ``rollout.partial.enable=true``; ``trainer.eval_every`` without a held-out
    set (``data.val`` or ``trainer.eval_benchmarks``)."""
    import dataclasses  # lazy: only here

    from megatron_rl.config import PartialConfig  # lazy: the section's defaults

    p = cfg.rollout.partial
    keys = [] if p.enable else [f.name for f in dataclasses.fields(PartialConfig)
                                if getattr(p, f.name) != getattr(PartialConfig(), f.name)]
    lines = [f"rollout.partial.{k}={getattr(p, k)} does nothing without rollout.partial.enable=true (in-flight partial "
             "rollouts); set rollout.partial.enable=true, or drop the key" for k in keys]
    t = cfg.trainer
    if t.eval_every and not cfg.data.val and not t.eval_benchmarks:
        lines.append(f"trainer.eval_every={t.eval_every} does nothing without a held-out set: set data.val (or "
                     "trainer.eval_benchmarks), or trainer.eval_every=0")
    for line in lines:
        log.warning("%s", line)
    return lines


def check_offload_placement(cfg) -> None:
    """``trainer.offload`` acts only while colocated engines generate: with ``separate`` placement the
    trainer never gives its GPUs away, so a set value would silently do nothing."""
    if cfg.trainer.offload != "none" and cfg.rollout.placement != "colocated":
        raise ValueError(f"trainer.offload={cfg.trainer.offload} does nothing with rollout.placement="
                         f"{cfg.rollout.placement}: the trainer parks its state only while colocated engines use its "
                         "GPUs; set rollout.placement=colocated, or trainer.offload=none")


def _check_against_model(cfg) -> None:
    from megatron_rl.models.provider import model_arch_info  # lazy: defers torch to the call

    a = model_arch_info(cfg.model.hf_path)
    positions = json.loads((Path(cfg.model.hf_path) / "config.json").read_text()).get("max_position_embeddings")
    if positions is not None and cfg.rollout.max_model_len > positions:   # only when the file states it
        raise ValueError(f"rollout.max_model_len={cfg.rollout.max_model_len} exceeds the model's "
                         f"max_position_embeddings={positions} ({cfg.model.hf_path}/config.json)")
    etp = cfg.rollout.tensor_parallel_size
    if a.num_heads % etp:
        raise ValueError(f"rollout.tensor_parallel_size={etp} does not divide the model's num_attention_heads={a.num_heads} "
                         f"({cfg.model.hf_path}/config.json); vLLM shards the heads over the engine's GPUs")
    for key, k in cfg.algo.hparams.vocab_bounded().items():   # the method's declared top-k supports
        if k > a.vocab_size:
            raise ValueError(f"algo.{cfg.algo.kind}.{key}={k} exceeds the model's vocab_size={a.vocab_size}")
    for key, k in (("rollout.top_k", cfg.rollout.top_k), ("trainer.eval_top_k", cfg.trainer.eval_top_k)):
        if k > a.vocab_size:   # -1 = off; above the vocabulary it would keep every token, silently
            raise ValueError(f"{key}={k} exceeds the model's vocab_size={a.vocab_size} (it would keep every token): "
                             f"lower it, or -1 for no top-k")
