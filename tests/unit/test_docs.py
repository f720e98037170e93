"""The README matches the code: opening commands, Makefile targets, CLI subcommands, paths, modules."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from megatron_rl import cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.MULTILINE)}


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.DOTALL)


def test_readme_opens_with_exactly_make_demo_and_make_test():
    lines = README.splitlines()
    assert lines[0].startswith("# ")
    first = README.index("```")
    assert README[:first].strip() == lines[0].strip(), "nothing but the title may precede the two commands"
    assert code_blocks(README)[0] == "make demo\nmake test\n"


def test_make_commands_in_readme_are_makefile_targets():
    targets = makefile_targets()
    used = set(re.findall(r"`make ([\w-]+)", README)) | {
        m for block in code_blocks(README) for m in re.findall(r"^make ([\w-]+)", block, re.MULTILINE)}
    assert {"demo", "test"} <= used
    missing = sorted(used - targets)
    assert not missing, f"README mentions make targets missing from the Makefile: {missing}"


def test_cli_subcommands_match_readme():
    mentioned = set(re.findall(r"megatron-rl ([a-z][\w-]*)", README)) - {"plan`"}
    unknown = sorted(mentioned - set(cli.COMMANDS))
    assert not unknown, f"README uses subcommands the CLI does not have: {unknown}"
    undocumented = sorted(set(cli.COMMANDS) - mentioned)
    assert not undocumented, f"CLI subcommands missing from the README: {undocumented}"
    parser_cmds = set(cli.build_parser()._subparsers._group_actions[0].choices)
    assert parser_cmds == set(cli.COMMANDS)


def test_repo_paths_in_readme_exist():
    paths = set(re.findall(r"`((?:megatron_rl|examples|tests|patches|benchmarks|tools|requirements)/[\w./*-]*)`", README))
    paths |= set(re.findall(r"\b(examples/(?:torchrun|slurm|configs)/[\w.-]+\.(?:sh|sbatch|yaml))", README))
    assert paths
    missing = sorted(p for p in paths if not list(REPO.glob(p.rstrip("/"))))
    assert not missing, f"README names paths that do not exist: {missing}"


def test_plan_presets_listed_in_readme():
    from megatron_rl.cli.plan import PRESETS

    section = README[README.index("### `megatron-rl plan`"):]
    for name in PRESETS:
        family, _, size = name.rpartition("-")
        assert family in section and size in section, f"plan preset {name} not described in the README"


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "examples").glob("*/*.s*")))
def test_launch_scripts_are_documented(script):
    assert script in README or script.endswith(".sh") and "examples/torchrun" in README


def test_algorithms_table_matches_algo_kinds():
    from megatron_rl.algorithms import ALGO_KINDS

    section = README[README.index("## Algorithms"):]
    section = section[: section.index("\n## ", 4)]
    documented = re.findall(r"^\| `([a-z_]+)` \|", section, re.MULTILINE)
    assert sorted(documented) == sorted(ALGO_KINDS), "README algorithms table != ALGO_KINDS"


def test_architecture_section_covers_the_package():
    """Every subpackage and top-level module of megatron_rl appears in the README's architecture table."""
    section = README[README.index("## Architecture"):]
    section = section[: section.index("\n## ", 4)]
    pkg = REPO / "megatron_rl"
    names = {f"megatron_rl/{p.name}/" for p in pkg.iterdir() if (p / "__init__.py").exists()}
    names |= {f"megatron_rl/{p.name}" for p in pkg.glob("*.py") if p.name != "__init__.py"}
    missing = sorted(n for n in names if f"`{n}`" not in section)
    assert not missing, f"README architecture section lacks: {missing}"
    listed = re.findall(r"^\| `((?:megatron_rl|patches|tools)/[\w./]*)` \|", section, re.MULTILINE)
    absent = sorted(n for n in listed if not (REPO / n).exists())
    assert not absent, f"README architecture section lists paths that do not exist: {absent}"


def test_config_reference_matches_config_dataclasses():
    """Every config section is in the README table; every `section.key` / main key listed there exists."""
    import dataclasses
    import typing

    from megatron_rl import config as C

    section = README[README.index("## Config reference"):]
    section = section[: section.index("\n## ", 4)]
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*?) \|", section, re.MULTILINE))
    sections = {f.name for f in dataclasses.fields(C.Config)}
    assert set(rows) == sections, f"README config sections {sorted(rows)} != Config {sorted(sections)}"
    hints = typing.get_type_hints(C.Config)
    for name, keys in rows.items():
        if not dataclasses.is_dataclass(hints[name]):   # a top-level key (plugins), not a section
            continue
        fields = {f.name for f in dataclasses.fields(hints[name])}
        if name == "algo":   # the row also names the knobs every kind has (algo.<kind>.kl_loss_coef, ...)
            from megatron_rl.algorithms import ALGO_KINDS

            fields |= set.intersection(*({f.name for f in dataclasses.fields(k.hparams)} for k in ALGO_KINDS.values()))
        listed = {k for k in re.findall(r"`(\w+)`", keys)} - {"algo"}
        assert listed <= fields, f"README lists {name}.{sorted(listed - fields)} which Config lacks"


def _config_key_exists(key: str) -> bool:
    """``section.key`` of ``Config``, or ``algo.<kind>.knob`` of at least one method's hparams."""
    import dataclasses
    import typing

    from megatron_rl import config as C
    from megatron_rl.algorithms import ALGO_KINDS

    parts = key.split(".")
    if len(parts) == 3 and parts[:2] == ["algo", "<kind>"]:
        return any(parts[2] in {f.name for f in dataclasses.fields(k.hparams)} for k in ALGO_KINDS.values())
    hints = typing.get_type_hints(C.Config)
    return (len(parts) == 2 and parts[0] in hints and dataclasses.is_dataclass(hints[parts[0]])
            and parts[1] in {f.name for f in dataclasses.fields(hints[parts[0]])})


def test_verl_and_nemo_rl_key_table_names_only_existing_keys():
    """The verl / NeMo-RL -> megatron_rl table: every key of ours exists in the config (so the table
    cannot drift from ``config.py`` / ``algorithms/hparams.py``), every row maps or says "no key",
    and the names users arrive with are there."""
    section = README[README.index("### Coming from verl or NeMo-RL"):]
    section = section[: section.index("\n#", 4)]
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in section.splitlines()
            if ln.startswith("| ") and not ln.startswith("| verl ")]
    assert len(rows) >= 30 and all(len(r) == 4 for r in rows), rows
    ours = {}
    for verl, nemo, mine, _ in rows:
        keys = re.findall(r"`([^`]+)`", mine)
        assert keys or mine == "no key", f"row {verl} / {nemo}: third column is neither keys nor 'no key': {mine!r}"
        missing = [k for k in keys if not _config_key_exists(k)]
        assert not missing, f"row {verl} / {nemo} names keys the config lacks: {missing}"
        for name in re.findall(r"`([^`]+)`", verl + " " + nemo):
            ours[name] = keys
    assert ours["data.train_batch_size"] == ours["grpo.num_prompts_per_step"] == ["data.prompts_per_step"]
    assert ours["actor_rollout_ref.rollout.n"] == ours["grpo.num_generations_per_prompt"] == ["rollout.n"]
    assert ours["actor_rollout_ref.actor.optim.lr"] == ["optim.lr"] and ours["trainer.save_freq"] == ["trainer.ckpt_every"]
    assert ours["actor_rollout_ref.actor.ppo_mini_batch_size"] == ["trainer.mini_batch_prompts"]
    assert ours["actor_rollout_ref.actor.ppo_epochs"] == ["trainer.ppo_epochs"]
    assert ours["actor_rollout_ref.actor.use_dynamic_bsz"] == ours["policy.sequence_packing.train_mb_tokens"] == [
        "trainer.max_tokens_per_micro_batch"]
    for name in ("actor_rollout_ref.actor.clip_ratio_low", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                 "algorithm.adv_estimator", "actor_rollout_ref.actor.use_kl_loss", "trainer.total_training_steps",
                 "trainer.test_freq", "actor_rollout_ref.rollout.gpu_memory_utilization",
                 "actor_rollout_ref.rollout.tensor_model_parallel_size", "policy.train_global_batch_size",
                 "policy.max_total_sequence_length", "loss_fn.ratio_clip_min", "loss_fn.reference_policy_kl_penalty",
                 "checkpointing.save_period", "algorithm.use_kl_in_reward"):
        assert name in ours, f"{name} missing from the verl / NeMo-RL table"
    assert not _config_key_exists("trainer.prompts_per_step") and not _config_key_exists("algo.<kind>.nope")
