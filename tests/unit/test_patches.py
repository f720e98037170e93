"""Every patch: upstream symbols still exist with the expected signatures; bounds and idempotence."""
from __future__ import annotations

import inspect

import pytest

from megatron_rl import patches
from megatron_rl.patches import Patch, all_patches, resolve_symbol
from tests.helpers.dist import repo_env

PATCHES = all_patches()


def test_every_patch_declares_bounds_and_symbols():
    names = [p.name for p in PATCHES]
    assert len(names) == len(set(names))
    for p in PATCHES:
        assert p.group in ("megatron", "vllm"), p.name
        assert p.min_version and p.max_version, f"{p.name}: upper bound is mandatory"
        assert p.symbols, f"{p.name} declares no upstream symbol"
        mod = __import__(f"megatron_rl.patches.{_module_of(p)}", fromlist=["x"])
        doc = mod.__doc__ or ""
        assert "eplaces" in doc and p.min_version.split(".")[0] + "." in doc, \
            f"{p.name}: header must say what it replaces and the versions it covers"


def _module_of(p: Patch) -> str:
    for m in patches._MODULES:
        if __import__(f"megatron_rl.patches.{m}", fromlist=["PATCH"]).PATCH is p:
            return m
    raise AssertionError(p.name)


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_upstream_symbols_have_expected_signature(patch):
    for path, params in patch.symbols:
        obj = resolve_symbol(path)
        if params is None:
            continue
        got = tuple(n for n, prm in inspect.signature(obj).parameters.items()
                    if prm.kind not in (prm.VAR_POSITIONAL, prm.VAR_KEYWORD))
        assert got[: len(params)] == params, f"{path}: signature changed: {got}"


def test_needed_patch_out_of_bounds_is_a_startup_error(monkeypatch):
    calls = []
    fake = Patch(name="test_oob", group="megatron", package="megatron-core", min_version="0.1",
                 max_version="0.2", needed=lambda: True, apply=lambda: calls.append(1))
    monkeypatch.setattr(patches, "all_patches", lambda: [fake])
    with pytest.raises(RuntimeError, match=r"test_oob is needed .* covers megatron-core \[0.1, 0.2\)"):
        patches.apply_all(("megatron",))
    assert not calls


def test_unneeded_patch_out_of_bounds_is_skipped(monkeypatch):
    fake = Patch(name="test_oob", group="megatron", package="megatron-core", min_version="0.1",
                 max_version="0.2", needed=lambda: False, apply=lambda: None)
    monkeypatch.setattr(patches, "all_patches", lambda: [fake])
    assert patches.apply_all(("megatron",))["test_oob"] == "skipped: not needed on this machine"


def test_pins_match_patch_bounds():
    """requirements/cpu.txt and setup.py allow exactly the megatron-core versions the patches cover."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    lo = max(p.min_version for p in PATCHES if p.package == "megatron-core")
    hi = min(p.max_version for p in PATCHES if p.package == "megatron-core")
    for f in ("requirements/cpu.txt", "setup.py"):
        spec = re.search(r"megatron-core>=([\d.]+),<([\d.]+)", (root / f).read_text())
        assert spec, f
        assert (spec.group(1) + ".0")[:len(lo)] >= lo[:len(spec.group(1))] and spec.group(2) + ".0" <= hi, (f, spec.groups(), lo, hi)


def test_apply_all_is_idempotent_and_logged(caplog):
    caplog.set_level("INFO", logger="megatron_rl.patches")
    first = patches.apply_all(("megatron",))
    second = patches.apply_all(("megatron",))
    assert all(v in ("applied", "already") or v.startswith("skipped") for v in first.values())
    assert all(v == "already" or v.startswith("skipped") for v in second.values())
    assert "patch" in caplog.text


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CPU-only patches are not applied where CUDA is present")
def test_cpu_patches_route_cuda_to_cpu():
    import torch

    patches.apply_all(("megatron",))
    assert torch.zeros(2, device="cuda").device.type == "cpu"
    assert torch.cuda.current_device() == "cpu"
    torch.cuda.manual_seed(3)
    a = torch.rand(3)
    torch.cuda.manual_seed(3)
    assert torch.equal(a, torch.rand(3)), "cuda.manual_seed must seed the CPU generator (P5)"
    x = torch.ones(2)
    assert x.type() == "torch.FloatTensor", "non-megatron callers see the true type"


def test_not_applied_at_import():
    import subprocess
    import sys

    code = ("import torch; orig = torch.zeros; import megatron_rl.patches, megatron_rl.runtime.parallel, "
            "megatron_rl.trainer.policy.actor; assert torch.zeros is orig, 'patched at import'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CPU-only patches are not applied where CUDA is present")
def test_factory_patch_keeps_the_device_context():
    """``with torch.device("meta")`` still reaches the wrapped factories, in a fresh process (torch's cached
    constructor set is first built after the patch, as in a training process). Before the fix the originals
    escaped the context: an HF model loaded after the patches (transformers' meta-device init) kept
    never-filled RoPE frequencies, seen by the bring-up's parity stage (max |dlogp| 0.31 or NaN)."""
    import subprocess
    import sys

    code = ("import torch; from megatron_rl import patches; patches.apply_all(('megatron',), only=('cpu_cuda_factories',));\n"
            "with torch.device('meta'):\n"
            "    got = {f.__name__: f(3).device.type for f in (torch.arange, torch.zeros, torch.ones, torch.empty)}\n"
            "    got['full'] = torch.full((2,), 1.0).device.type\n"
            "assert set(got.values()) == {'meta'}, got\n"
            "assert torch.zeros(2, device='cuda').device.type == 'cpu'\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=repo_env({"CUDA_VISIBLE_DEVICES": ""}))
