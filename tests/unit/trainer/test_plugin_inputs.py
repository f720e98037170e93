"""Methods from OUTSIDE the package, written into ``tmp_path`` and loaded through the config's ``plugins:``
key (as a user's own modules on ``PYTHONPATH``):

* ``mrl_mean_baseline.py`` — a new advantage estimator is one file: A = r − mean_group(r);
* ``mrl_frac_method/`` — a new data path with its own input is one package plus its registration: the
  path registers the per-sequence input ``resp_frac`` (the response's share of ``rollout.max_tokens``)
  and provides it, a loss declares that it needs it, a method pairs that loss with the estimator above.

One real ``megatron-rl train`` run trains that method (both plugins at once); the loss checks in the
training process, on every row it trains, that ``resp_frac`` arrived aligned with its row through
the batch, mini-batch, padding and micro-batch splits (oracle: the response mask the pipeline builds
itself) and logs the largest difference. Start-up refuses a method whose loss needs an input its
path does not provide, in one line, before any model is built."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_rl import algorithms as A
from megatron_rl.trainer.loop.preflight import load_checked

ROOT = Path(__file__).resolve().parents[3]

ADVANTAGE = '''"""A new advantage estimator in one file: A_i = r_i − mean of its group's rewards."""
import json
import os
import sys
from pathlib import Path

import torch

from megatron_rl import algorithms as A

CALLS = [0]


@A.register_advantage("mean_baseline")
def mean_baseline(x, hp):
    CALLS[0] += 1
    if os.environ.get("MRL_DEMO_RESULT"):
        Path(os.environ["MRL_DEMO_RESULT"]).write_text(json.dumps({"calls": CALLS[0], "hparams": hp.to_dict(),
                                                                         "vllm_imported": "vllm" in sys.modules}))
    g = x.group_ids
    total = torch.zeros(int(g.max()) + 1, dtype=x.rewards.dtype).index_add_(0, g, x.rewards)
    return x.rewards - (total / torch.bincount(g).to(x.rewards.dtype))[g]
'''

PACKAGE_INIT = '''"""A method with its own input: the path that provides it, the loss that needs it, their registration."""
from megatron_rl import algorithms as A

from .path import RespFracPath  # noqa: F401  (registers the input first, then the path providing it)
from .loss import FracHParams  # the loss declaring that it needs the input

A.register_algo_kind("frac_reinforce", advantage="mean_baseline", loss="frac_reinforce", hparams=FracHParams,
                     path="resp_frac")
'''

PACKAGE_PATH = '''"""The data path: the plain one, plus the per-sequence input ``resp_frac`` it registers and provides."""
import torch

from megatron_rl.algorithms import register_input
from megatron_rl.trainer.paths import BASE_INPUTS, get_path, register_path

register_input("resp_frac", ("N",), "float", "the response's share of rollout.max_tokens")


@register_path("resp_frac")
class RespFracPath(get_path("plain")):
    provides = BASE_INPUTS | {"resp_frac"}

    def sampled(self, ctx, data, step):
        s = super().sampled(ctx, data, step)
        t = self.cfg.rollout.max_tokens
        s.extras["resp_frac"] = torch.tensor([min(len(r), t) / t for r in data.responses])
        return s
'''

PACKAGE_LOSS = '''"""The loss that needs ``resp_frac``: REINFORCE with each sequence weighted by 1 − w · resp_frac."""
from dataclasses import dataclass

import torch

from megatron_rl import algorithms as A
from megatron_rl.algorithms.losses import LossOutput, masked_mean


@dataclass(frozen=True)
class FracHParams(A.PPOHParams):
    frac_weight: float = 0.5       #: algo.frac_reinforce.frac_weight


@A.register_policy_loss("frac_reinforce", needs=("logp", "resp_frac"))
def frac_reinforce(x, adv, hp):
    m = x.mask
    live = m.sum(-1) > 0                       # zero-mask padding copies repeat row 0's inputs
    err = (x.resp_frac - m.sum(-1) / m.shape[-1]).abs()[live]
    w = (1 - hp.frac_weight * x.resp_frac).to(x.logp.dtype)
    a = (adv.detach().to(x.logp.dtype) * w)[:, None].expand_as(x.logp)
    loss = torch.where(m.bool(), -a * x.logp, torch.zeros_like(x.logp))
    return LossOutput(loss, {"frac_reinforce_frac_err": err.max() if err.numel() else err.new_zeros(()),
                             "frac_reinforce_weight": masked_mean(w[:, None].expand_as(m), m).detach()})
'''


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """The two plugins written into ``tmp_path/mods`` (on this process's ``sys.path`` too); what an
    in-process import registered is removed afterwards, so no other test sees the plugin's method."""
    from megatron_rl.algorithms import inputs as I
    from megatron_rl.algorithms import registry as R
    from megatron_rl.trainer.paths import base as P

    P.path_names()                     # the built-in paths registered before the snapshot below
    mods = tmp_path / "mods"
    (mods / "mrl_frac_method").mkdir(parents=True)
    (mods / "mrl_mean_baseline.py").write_text(ADVANTAGE)
    for name, text in {"__init__": PACKAGE_INIT, "path": PACKAGE_PATH, "loss": PACKAGE_LOSS}.items():
        (mods / "mrl_frac_method" / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(mods))
    tables = (R._ADVANTAGES, R._LOSSES, A.ALGO_KINDS, P._PATHS, I._INPUTS)
    before = [set(t) for t in tables]
    yield mods
    for t, keys in zip(tables, before):
        for k in set(t) - keys:
            del t[k]
    for m in [m for m in sys.modules if m.split(".")[0] in ("mrl_mean_baseline", "mrl_frac_method")]:
        del sys.modules[m]


def _import(name: str):
    return sys.modules.get(name) or importlib.import_module(name)


def test_plugin_estimator_is_dr_grpos_centred_reward(plugins):
    """The one-file estimator equals the package's Dr. GRPO advantage (group-centred reward, no std) on
    groups of two or more (verl's estimator gives a lone sample no baseline; this one centres it)."""
    _import("mrl_mean_baseline")
    g = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    r = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.25, 0.0], dtype=torch.float64)
    x = A.AlgoInputs(rewards=r, group_ids=g, mask=torch.ones(7, 2))
    torch.testing.assert_close(A.get_advantage("mean_baseline")(x, None), A.grpo_advantage(r, g, scale="none"))


def test_loss_needing_an_input_no_path_provides_fails_at_config_load(plugins, monkeypatch):
    """The plugin's loss on the plain path (which does not provide ``resp_frac``): one line at load."""
    _import("mrl_mean_baseline")
    hp = _import("mrl_frac_method").FracHParams
    monkeypatch.setitem(A.ALGO_KINDS, "frac_on_plain", A.AlgoKind("mean_baseline", "frac_reinforce", hp, "plain"))
    with pytest.raises(ValueError) as e:
        load_checked(None, ["algo.kind=frac_on_plain"])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("algo.kind='frac_on_plain' needs input(s) ['resp_frac'] that its "
                                              "data path 'plain' does not produce")


def test_input_unknown_to_the_registry_is_refused(plugins):
    """A loss may only declare registered inputs; a bundle holds only registered inputs."""
    with pytest.raises(ValueError, match=r"declares unregistered input\(s\) \['resp_fraction'\]"):
        A.register_policy_loss("frac_typo", needs=("resp_fraction",))
    with pytest.raises(ValueError, match=r"unregistered input\(s\) \['resp_fraction'\]"):
        A.AlgoInputs(rewards=torch.zeros(2), group_ids=torch.zeros(2, dtype=torch.long), mask=torch.ones(2, 3),
                     resp_fraction=torch.zeros(2))


def test_plugin_method_with_its_own_input_trains_through_the_cli(plugins, tmp_path):
    """The plugin command of docs/contributing.md ("Adding a method"), with a few more overrides:
    ``megatron-rl train ... plugins=[mrl_mean_baseline,mrl_frac_method] algo.kind=frac_reinforce``: the
    estimator ran in the training process with the method's config key, the loss read ``resp_frac``
    equal to its oracle on every trained row, its metrics were logged and ``run_dir/config.yaml`` keeps
    the plugins. The run uses the HF ``generate`` engine (the fallback) through Ray: the suite's loop run
    on that engine (tests/e2e/test_quickstart.py runs vLLM), colocated (``rollout.placement``) with
    ``trainer.offload=all`` (two-stage offload, a checkpoint between parked stages), and the end-of-run
    HF export between parked stages (issue 31: the export left the weights' storage unresizable, so the
    offload after it failed)."""
    import yaml
    from safetensors.torch import load_file

    from megatron_rl.cli.demo import prepare

    paths, _, hf = prepare(tmp_path / "assets", seed=0)
    run_dir, result = tmp_path / "run", tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(plugins)]),
           "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "offline", "MRL_DEMO_RESULT": str(result)}
    p = subprocess.run([sys.executable, "-m", "megatron_rl.cli", "train", "--config", "examples/configs/tiny_cpu_grpo.yaml",
                        "plugins=[mrl_mean_baseline,mrl_frac_method]", "algo.kind=frac_reinforce",
                        "algo.frac_reinforce.frac_weight=0.25", "trainer.mini_batch_prompts=2",
                        f"model.hf_path={hf}", f"data.train={paths['train']}", "data.val=", f"trainer.run_dir={run_dir}",
                        "trainer.steps=2", "trainer.ckpt_every=0", "data.prompts_per_step=4",
                        "rollout.n=4", "rollout.engine=hf", "trainer.micro_batch_size=4", "logging.progress=false",
                        "logging.wandb_mode=disabled", "rollout.placement=colocated", "trainer.offload=all"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    res = json.loads(result.read_text())
    assert res["calls"] == 2 and res["hparams"]["frac_weight"] == 0.25
    assert res["vllm_imported"] is False   # the HF engine's run: the driver imports no engine library it does not use
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["plugins"] == ["mrl_mean_baseline", "mrl_frac_method"]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["frac_reinforce/frac_err"] == 0.0 and 0.75 <= r["frac_reinforce/weight"] <= 1.0 for r in rows)
    assert all(r["actor/optimizer_steps"] == 2.0 and r["actor/loss"] == r["actor/loss"] for r in rows)
    # colocated: one engine sleep per step, and step 2 generated after a level-2 sleep, which the HF
    # engine refuses unless the push restored every weight (trainer/colocate.py's order)
    assert [r["rollout/sleeps"] for r in rows] == [1.0, 2.0]
    assert (run_dir / "checkpoints" / "step_2" / "COMPLETE").is_file()   # saved between the parked stages
    # exported between parked stages too (the run ends with its summary, exit 0 above): the safetensors
    # library reads every tensor of the initial policy back, same shapes and dtypes, finite
    exported = load_file(str(run_dir / "hf" / "model.safetensors"))
    initial = load_file(str(hf / "model.safetensors"))
    assert exported.keys() == initial.keys() and "hf_export" not in p.stderr
    assert all(exported[k].shape == initial[k].shape and exported[k].dtype == initial[k].dtype
               and torch.isfinite(exported[k].float()).all() for k in exported)
    assert (run_dir / "hf" / "config.json").is_file() and "Trying to resize" not in p.stderr
