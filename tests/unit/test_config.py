"""Typed config: YAML + dotted overrides, clear errors, cross-component validation."""
from __future__ import annotations

import pytest

from megatron_rl.config import Config, load_config, validate
from megatron_rl.trainer.loop.preflight import load_checked


def test_defaults_and_overrides(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("algo:\n  kind: bicc_rcc\n  bicc_rcc:\n    base: drgrpo\ntrainer:\n  steps: 7\n")
    c = load_config(y, ["optim.lr=1e-3", "algo.bicc_rcc.rcc_delta=mean", "rollout.n=4", "parallel.sequence_parallel=true"])
    assert isinstance(c, Config) and c.trainer.steps == 7 and c.optim.lr == 1e-3 and c.rollout.n == 4
    assert c.algo.kind == "bicc_rcc" and c.algo.hparams.base == "drgrpo" and c.algo.hparams.rcc_delta == "mean"
    assert c.parallel.sequence_parallel is True
    d = c.to_dict()
    assert d["algo"] == {"kind": "bicc_rcc", "bicc_rcc": d["algo"]["bicc_rcc"]} and d["trainer"]["steps"] == 7


@pytest.mark.parametrize("ov", [["algo.off_policy=bypass", "algo.ratio_space=sampling"],
                                ["algo.off_policy=icepop", "algo.correction.upper=4"], ["algo.off_policy=tis", "algo.tis_cap=3"],
                                ["reward.by_source={gsm8k: math}"], ["reward.by_source.gsm8k=math"],
                                ["algo.off_policy=icepop", "algo.correction={upper: 4}"]],
                         ids=["bypass-sampling", "icepop", "tis", "by-source", "by-source-dotted", "correction-flow"])
def test_dump_loads_back_as_the_same_config(ov):
    """What ``config.yaml`` and ``train --check`` write is plain YAML that loads back as the same config: a
    correction mode without thresholds (bypass) wrote ``correction: NoHParams()`` (and ``--check`` died on
    it), ``algo.ratio_space`` was left out, an entry set alone (``reward.by_source.SRC=NAME``) kept the
    override's text type, which YAML cannot write; a section given whole as flow text
    (``algo.correction={upper: 4}``) is the same config as its keys given one by one."""
    import yaml

    from megatron_rl.config import from_dict

    c = load_config(None, ov)
    text = yaml.safe_dump(c.to_dict(), sort_keys=False)
    assert from_dict(yaml.safe_load(text)) == c
    if ov[-1] == "algo.correction={upper: 4}":
        assert c == load_config(None, ["algo.off_policy=icepop", "algo.correction.upper=4"])


@pytest.mark.parametrize("ov,msg", [
    (["trainer.stepz=3"], r"trainer: unknown key\(s\) \['stepz'\]"),
    (["algo.kind=nope"], "unknown algo.kind 'nope'; valid: "),
    (["optim.lr=abc"], "expected a number"),
    (["optim.lr=-1"], "optim.lr must be > 0"),
    (["rollout.engine=sglang"], "rollout.engine: unknown engine 'sglang'; registered: hf, vllm"),
    (["rollout.kv_cache_gib=0"], "rollout.kv_cache_gib must be > 0"),
    (["algo.bicc_rcc.base=ppo", "algo.kind=bicc_rcc"], "rcc base 'ppo' invalid"),
    (["nosection.x=1"], r"unknown section\(s\)"),
    (["trainer.steps"], "must look like section.key=value"),
])
def test_bad_input_is_named(ov, msg):
    with pytest.raises(ValueError, match=msg):
        load_config(None, ov)


@pytest.mark.parametrize("kind", ["rlcsd", "opsd", "sdpo", "srpo", "rlsd", "opsd_ectr", "rlsd_ectr"])
def test_self_distillation_kinds_are_accepted(kind):
    """The RLCSD family's data paths (rlcsd_hints, gt_teacher) run: the config accepts every kind."""
    c = load_config(None, [f"algo.kind={kind}"])
    assert c.algo.kind == kind
    validate(c, world_size=1)


def test_unsupported_data_path_fails_at_startup(monkeypatch):
    import megatron_rl.algorithms as A

    monkeypatch.setitem(A.ALGO_KINDS, "rlcsd", A.ALGO_KINDS["rlcsd"]._replace(path="no_such_path"))
    with pytest.raises(ValueError, match="algo.kind='rlcsd' declares data path 'no_such_path', which is not registered; "
                                         r"valid: \['bicc_context', 'greedy'"):
        load_checked(None, ["algo.kind=rlcsd"])


def test_world_size_and_batch_divisibility():
    c = load_config(None, ["parallel.tp=2", "data.prompts_per_step=3", "rollout.n=3", "trainer.micro_batch_size=2"])
    with pytest.raises(ValueError, match="world size 3 is not divisible by tp\\*pp=2"):
        validate(c, world_size=3)
    with pytest.raises(ValueError, match="batch of 9 sequences"):
        validate(c, world_size=2)


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        load_config("/nonexistent.yaml")


def test_dapo_overlong_buffer_must_fit():
    with pytest.raises(ValueError, match="overlong_buffer_len=4096 must be <= rollout.max_tokens=8"):
        load_checked(None, ["algo.kind=dapo"])
    c = load_checked(None, ["algo.kind=dapo", "algo.dapo.overlong_buffer_len=4"])
    assert c.algo.hparams.overlong_enable


def test_foreign_keys_follow_the_mapping_page():
    """Each (their key, ours) pair of ``config_foreign.FOREIGN_KEYS`` is a row of the mapping page users read:
    their key in one column, ours in another of the same row (the page is the reference, the map follows it)."""
    from pathlib import Path

    from megatron_rl.config_foreign import DOC, FOREIGN_KEYS

    rows = [ln for ln in (Path(__file__).resolve().parents[2] / DOC).read_text().splitlines() if ln.startswith("| ")]
    for theirs, ours in FOREIGN_KEYS.items():
        leaf = theirs.rsplit(".", 1)[-1]
        assert any((f"`{theirs}`" in r or f"`{leaf}`" in r and theirs.rsplit(".", 1)[0] in r) and f"`{ours}`" in r
                   for r in rows), (theirs, ours)


def test_a_verl_section_points_at_ours():
    with pytest.raises(ValueError, match=r"actor_rollout_ref.rollout.n -> rollout.n\).*coming-from-verl.md"):
        load_config(None, ["actor_rollout_ref.rollout.n=4"])


@pytest.mark.parametrize("ov,msg", [
    (["rollout.engine=hf"], r"lora.push=adapter needs rollout.engine=vllm .vLLM's LoRA support serves the adapters., got hf"),
    (["rollout.max_staleness=1"], "lora.push=adapter refused with asynchronous or partial rollouts"),
    (["rollout.engine=vllm-async", "rollout.partial.enable=true"],
     "lora.push=adapter refused with asynchronous or partial rollouts"),
    (["rollout.placement=colocated"], "lora.push=adapter refused with rollout.placement=colocated"),
], ids=["engine", "async", "partial", "colocated"])
def test_adapter_push_refuses_what_it_does_not_serve(ov, msg):
    """``lora.push=adapter`` (docs/lora.md): accepted on the synchronous vllm path, refused elsewhere in one line;
    without ``lora.enable`` the key has nothing to push and nothing is refused."""
    base = ["lora.enable=true", "lora.push=adapter"]
    assert load_config(None, base).lora.push == "adapter"
    with pytest.raises(ValueError, match=msg) as e:
        load_config(None, base + ov)
    assert "\n" not in str(e.value)
    load_config(None, ["lora.push=adapter", *ov])
