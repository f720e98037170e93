"""The docs (README.md and the site under docs/) match the code: opening commands, Makefile targets,
CLI subcommands, paths, modules, method table, the verl / NeMo-RL key table."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from megatron_rl import cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
PAGES = {p.relative_to(REPO).as_posix(): p.read_text() for p in sorted((REPO / "docs").rglob("*.md"))}
ALL = {"README.md": README, **PAGES}
TEXT = "\n".join(ALL.values())


def page(name: str) -> str:
    return PAGES[f"docs/{name}"]


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


@pytest.mark.parametrize("name", ["docs/index.md", "docs/getting-started.md"])
def test_docs_open_with_the_same_two_commands(name):
    """The site's home page and docs/getting-started.md show the README's two commands first; the GPU
    install block of docs/getting-started.md names Makefile targets only (it needs a GPU to run)."""
    blocks = code_blocks(ALL[name])
    assert blocks[0] == "make demo\nmake test\n"
    if name == "docs/getting-started.md":
        gpu = next(b for b in blocks if "make venv-gpu" in b)
        assert set(re.findall(r"^make ([\w-]+)", gpu, re.MULTILINE)) <= makefile_targets()


def test_readme_is_a_landing_page():
    assert len(README.encode()) <= 12 * 1024, f"README is {len(README.encode())} bytes: move detail into docs/"
    linked = set(re.findall(r"\]\((docs/[\w/.-]+\.md)(?:#[\w-]+)?\)", README))
    assert linked and all((REPO / p).is_file() for p in linked), sorted(p for p in linked if not (REPO / p).is_file())


def test_make_commands_in_docs_are_makefile_targets():
    targets = makefile_targets()
    used = set(re.findall(r"`make ([\w-]+)", TEXT)) | {
        m for block in code_blocks(TEXT) for m in re.findall(r"^make ([\w-]+)", block, re.MULTILINE)}
    assert {"demo", "test", "docs"} <= used
    missing = sorted(used - targets)
    assert not missing, f"the docs mention make targets missing from the Makefile: {missing}"


def test_cli_subcommands_match_docs():
    mentioned = set(re.findall(r"megatron-rl ([a-z][\w-]*)", TEXT)) - {"plan`"}
    unknown = sorted(mentioned - set(cli.COMMANDS) - {"data"})   # `data`: being added (issue 32), named as such
    assert not unknown, f"the docs use subcommands the CLI does not have: {unknown}"
    undocumented = sorted(set(cli.COMMANDS) - mentioned)
    assert not undocumented, f"CLI subcommands missing from the docs: {undocumented}"
    parser_cmds = set(cli.build_parser()._subparsers._group_actions[0].choices)
    assert parser_cmds == set(cli.COMMANDS)


@pytest.mark.parametrize("name", sorted(ALL))
def test_repo_paths_in_docs_exist(name):
    text = ALL[name]
    paths = set(re.findall(r"`((?:megatron_rl|examples|tests|patches|benchmarks|tools|requirements)/[\w./*-]*)`", text))
    paths |= set(re.findall(r"\b(examples/(?:torchrun|slurm|configs)/[\w.-]+\.(?:sh|sbatch|yaml))", text))
    missing = sorted(p for p in paths if not list(REPO.glob(p.rstrip("/"))))
    assert not missing, f"{name} names paths that do not exist: {missing}"


def test_plan_presets_listed_in_plan_page():
    from megatron_rl.planning.arch import PRESETS

    section = page("plan-and-memory.md")
    for name in PRESETS:
        family, _, size = name.rpartition("-")
        assert family in section and size in section, f"plan preset {name} not described in docs/plan-and-memory.md"


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "examples").glob("*/*.s*")))
def test_launch_scripts_are_documented(script):
    assert script in TEXT or script.endswith(".sh") and "examples/torchrun" in TEXT


def test_algorithm_tables_match_algo_kinds():
    """The methods page's table and the README's one-line-per-method table list exactly ``ALGO_KINDS``."""
    from megatron_rl.algorithms import ALGO_KINDS

    for name, text in (("docs/methods/index.md", page("methods/index.md")), ("README.md", README)):
        documented = re.findall(r"^\| `([a-z_]+)` \|", text, re.MULTILINE)
        assert sorted(documented) == sorted(ALGO_KINDS), f"{name} algorithms table != ALGO_KINDS"


def test_every_method_family_has_its_page():
    """Each family page names its kinds, a paper (arXiv id) and the reference repository's commit."""
    from megatron_rl.algorithms import ALGO_KINDS

    families = {"grpo.md": ("grpo", "dapo", "drgrpo", "remax", "rloo"), "bicc-rcc.md": ("bicc", "bicc_rcc"),
                "self-distillation.md": ("rlcsd", "opsd", "sdpo", "srpo", "rlsd", "opsd_ectr", "rlsd_ectr"),
                "papo.md": ("papo",), "score.md": ("score",), "gspo-cispo.md": ("gspo", "cispo")}
    assert sorted(k for ks in families.values() for k in ks) == sorted(ALGO_KINDS)
    for name, kinds in families.items():
        text = page(f"methods/{name}")
        assert all(f"`{k}`" in text for k in kinds), name
        assert re.search(r"arXiv \d{4}\.\d{4,5}", text) and re.search(r"commit `[0-9a-f]{7}`", text), name
        assert "## Departures" in text or "departure" in text.lower(), name


def test_architecture_page_covers_the_package():
    """Every subpackage and top-level module of megatron_rl appears in the architecture page's table."""
    section = page("architecture.md")
    pkg = REPO / "megatron_rl"
    names = {f"megatron_rl/{p.name}/" for p in pkg.iterdir() if (p / "__init__.py").exists()}
    names |= {f"megatron_rl/{p.name}" for p in pkg.glob("*.py") if p.name != "__init__.py"}
    missing = sorted(n for n in names if f"`{n}`" not in section)
    assert not missing, f"docs/architecture.md lacks: {missing}"
    listed = re.findall(r"^\| `((?:megatron_rl|patches|tools)/[\w./]*)` \|", section, re.MULTILINE)
    absent = sorted(n for n in listed if not (REPO / n).exists())
    assert not absent, f"docs/architecture.md lists paths that do not exist: {absent}"
    assert len(listed) == len(set(listed)), "docs/architecture.md lists a module twice"


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
    cannot drift from ``config_sections.py`` / ``config.py`` / ``algorithms/hparams.py``), every row maps or says "no key",
    and the names users arrive with are there."""
    section = page("reference/coming-from-verl.md").split("\n## ")[0]   # the keys table (the reward table follows)
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


# ---- the architecture page's data flow follows the code (issue 34) ----------------------------------

#: a flow block of docs/architecture.md -> (module, function, the module's helpers whose calls count as
#: the function's: the loop's ``_train_steps`` / ``_finish``, the update's ``optimizer_steps``)
FLOWS = {"run": ("megatron_rl.trainer.loop.rl_loop", "run", ("_train_steps", "_train_step", "_finish")),
         "rl_step": ("megatron_rl.trainer.loop.rl_loop", "rl_step", ()),
         "update": ("megatron_rl.trainer.pipeline.update", "update", ("train_rows", "optimizer_steps"))}
#: attributes of ``Run`` / locals whose method calls the page names (``run.path.logged`` -> ``path.logged``)
_HOLDERS = ("path", "colo", "source", "actor", "logger", "client", "ref")


def _dotted(node) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _normal(parts: list[str], glb: dict):
    """``(name as the page writes it, resolved object or None)``: ``run.`` / ``rn.`` / ``run.state.``
    and module aliases (``U.``, ``A.``, ``guard.``) dropped."""
    import inspect

    obj = None
    if parts[0] in ("run", "rn") and len(parts) > 1:
        parts = parts[2:] if parts[1] == "state" and len(parts) > 2 else parts[1:]
    elif inspect.ismodule(glb.get(parts[0])) and len(parts) > 1:
        obj = glb[parts[0]]
        for p in parts[1:]:
            obj = getattr(obj, p, None)
        parts = parts[1:]
    elif len(parts) == 1:
        obj = glb.get(parts[0])
    return ".".join(parts), obj


def _counts(name: str, obj) -> bool:
    """A call the flow blocks may name: a hook / method of a run component, a ``Run`` method, or a
    function or class of the package."""
    from megatron_rl.trainer.loop.setup import Run

    if "." in name:
        return name.split(".")[0] in _HOLDERS
    return hasattr(Run, name) or getattr(obj, "__module__", "").startswith("megatron_rl")


def _flow_calls(flow: str) -> tuple[list[str], set[str]]:
    """The calls of the flow's function in execution order (arguments before the call, a helper of
    ``FLOWS`` expanded where it is called), and those the page must name: every hook of a path,
    colocation or rollout source, and the package's functions the function itself calls."""
    import importlib
    import inspect
    import textwrap

    module, fn, expand = FLOWS[flow]
    mod = importlib.import_module(module)
    seq, required = [], set()

    def walk(func_name: str, top: bool):
        func = getattr(mod, func_name)
        glb = vars(inspect.getmodule(func))   # an expanded stage resolves names in its own module
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))

        class V(ast.NodeVisitor):
            def visit_Call(self, node):
                self.generic_visit(node)
                parts = _dotted(node.func)
                if parts is None:
                    return
                name, obj = _normal(parts, glb)
                if _counts(name, obj):
                    seq.append(name)
                    if name.split(".")[0] in ("path", "colo", "source") or (
                            top and inspect.isfunction(obj) and not name.startswith("_")):
                        required.add(name)
                if name in expand:
                    walk(name, False)

        V().visit(tree.body[0])

    walk(fn, True)
    return seq, required


def _flow_block(flow: str) -> str:
    m = re.search(rf"<!-- flow: {flow} -->\n```text\n(.*?)```", page("architecture.md"), re.DOTALL)
    assert m, f"docs/architecture.md has no flow block `<!-- flow: {flow} -->` followed by a text fence"
    return m.group(1)


@pytest.mark.parametrize("flow", sorted(FLOWS))
def test_architecture_data_flow_follows_the_code(flow):
    """The data-flow block of ``run`` / ``rl_step`` / ``update`` on docs/architecture.md names the calls
    the function makes (read from its source with ``ast``) in the order it makes them: every name of
    the block that is one of the function's calls must come after the previous one in the code's call
    sequence, and every path / colocation / rollout-source hook and every package function the function
    calls must be named."""
    seq, required = _flow_calls(flow)
    assert required, f"no calls read from {flow}"
    block = _flow_block(flow)
    named = []
    for tok in re.findall(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", block):
        name, _ = _normal(tok.split("."), {})
        if name in seq:
            named.append(name)
    pos = 0
    for name in named:
        assert name in seq[pos:], (f"docs/architecture.md, flow {flow}: `{name}` is out of the code's order "
                                   f"(named after a call the code makes later); the code's order: {seq}")
        pos = seq.index(name, pos) + 1
    missing = sorted(required - set(named))
    assert not missing, f"docs/architecture.md, flow {flow}: the code calls {missing}, the page does not name them"
