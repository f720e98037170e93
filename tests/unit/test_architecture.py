"""Architecture rules as cheap tests (STYLE.md §14-15): import boundaries and docstrings."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "megatron_rl"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _files(sub: str):
    return sorted((PKG / sub).rglob("*.py"))


def test_trainer_never_imports_vllm():
    for f in _files("trainer") + _files("models") + _files("convert"):
        bad = [m for m in _imports(f) if m.split(".")[0] == "vllm"]
        assert not bad, f"{f} imports {bad}"


def test_rollout_never_imports_megatron():
    for f in _files("rollout"):
        bad = [m for m in _imports(f) if m.split(".")[0] == "megatron" or m.startswith("megatron_rl.trainer")]
        assert not bad, f"{f} imports {bad}"


def test_algorithms_import_torch_and_stdlib_only():
    import sys

    allowed = {"torch", "__future__"} | set(sys.stdlib_module_names)
    for f in _files("algorithms"):
        for m in _imports(f):
            assert m.split(".")[0] in allowed, f"{f} imports {m}"


def test_no_bare_torch_cuda_outside_device_helper():
    for f in PKG.rglob("*.py"):
        if f.name == "device.py":
            continue
        assert "torch.cuda." not in f.read_text(), f"{f} uses torch.cuda directly; go through megatron_rl.runtime.device"


def test_public_algorithm_functions_have_docstrings():
    for f in _files("algorithms"):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                assert ast.get_docstring(node), f"{f.name}:{node.name} has no docstring"


def test_files_stay_small():
    for f in PKG.rglob("*.py"):
        n = len(f.read_text().splitlines())
        assert n <= 650, f"{f} has {n} lines (split it)"


def test_config_is_a_leaf_of_the_setup_layer():
    """``config.py`` decides types, ranges and enums; the cross-component rules are the setup layer's
    (``preflight.check_config``), so loading a config imports neither the trainer nor preflight."""
    import subprocess
    import sys

    code = ("import sys; from megatron_rl.config import load_config; load_config(None, ['algo.kind=rlsd']); "
            "print([m for m in sys.modules if m.startswith('megatron_rl.trainer') or m == 'megatron_rl.trainer.loop.preflight'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PKG.parent).stdout
    assert out.strip() == "[]", out
    bad = [m for m in _imports(PKG / "config.py") if m.startswith(("megatron_rl.trainer", "megatron_rl.trainer.loop.preflight"))]
    assert not bad, f"config.py imports {bad}"
