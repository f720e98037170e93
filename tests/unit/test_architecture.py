"""Architecture rules as cheap tests (STYLE.md §14-15): import boundaries and docstrings."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.imports import module_imports, module_name

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
    (``preflight_rules.check_config``), so loading a config imports neither the trainer nor preflight."""
    import subprocess
    import sys

    code = ("import sys; from megatron_rl.config import load_config; load_config(None, ['algo.kind=rlsd']); "
            "print([m for m in sys.modules if m.startswith('megatron_rl.trainer') or m == 'megatron_rl.trainer.loop.preflight'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PKG.parent).stdout
    assert out.strip() == "[]", out
    for name in ("config.py", "config_sections.py", "config_features.py"):
        bad = [m for m in _imports(PKG / name) if m.startswith(("megatron_rl.trainer", "megatron_rl.trainer.loop.preflight"))]
        assert not bad, f"{name} imports {bad}"


# ---- the floor plan (issue 33): no cycles, layers point down, short functions, lazy imports say why

LAYERS = {   # lower number = lower layer; a module imports only its own layer or lower ones
    "runtime": 0, "config": 1, "config_sections": 1, "config_features": 1, "config_parse": 1, "config_foreign": 1, "plugins": 1, "algorithms": 1,
    "models": 2, "convert": 2, "rewards": 2, "data": 2, "rollout": 2, "eval": 2, "planning": 2, "agent": 2,
    "trainer": 3, "cli": 4, "recipes": 4,
}
#: registries of names and declared capabilities that config validation asks (``rollout.engine``,
#: ``rollout.sync_backend``): stdlib-only modules, so they count as the config layer although they live
#: beside the engines (the classes they name are imported by name, on use)
DECLARATIONS = {"megatron_rl.rollout.registry": 1, "megatron_rl.rollout.transport": 1}
MAX_FUNCTION_LINES = 60



def _package_imports(path: Path, type_only: bool = False):
    """(imported module of the package, in a function?, has a comment on its line) for each import;
    ``type_only``: also those under ``if TYPE_CHECKING``."""
    name = module_name(path)
    is_pkg = path.name == "__init__.py"
    src = path.read_text()
    lines = src.splitlines()
    known = {module_name(p) for p in PKG.rglob("*.py")}

    def targets(node):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        else:
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            mods = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        out = []
        for m in mods:
            while m and m not in known:
                m = m.rpartition(".")[0]
            if m and m != name:
                out.append(m)
        return out

    def walk(node, in_fn):
        for c in ast.iter_child_nodes(node):
            if isinstance(c, (ast.Import, ast.ImportFrom)):
                commented = any("#" in lines[i - 1] for i in range(c.lineno, c.end_lineno + 1))
                for t in targets(c):
                    yield t, in_fn, commented, c.lineno
            elif isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(c, True)
            elif isinstance(c, ast.If) and "TYPE_CHECKING" in ast.unparse(c.test) and not type_only:
                continue
            else:
                yield from walk(c, in_fn)

    yield from walk(ast.parse(src), False)


def _import_graph() -> dict[str, set[str]]:
    return {module_name(f): {t for t, _, _, _ in _package_imports(f)} for f in PKG.rglob("*.py")}


def _parents(module: str) -> list[str]:
    """The packages whose ``__init__`` an import of ``module`` runs first (``a.b.c`` -> ``a``, ``a.b``)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _runtime_graph() -> dict[str, set[str]]:
    """What importing each module runs, as Python runs it: every import (function-level and type-only ones
    included: a type checker, or a later edit that moves it, runs it) plus the ``__init__`` of every package
    above each imported module -- importing ``megatron_rl.trainer.paths.context`` runs ``paths/__init__.py``
    and every family it imports, which a graph of the named modules alone does not show."""
    graph = {}
    for f in PKG.rglob("*.py"):
        me = module_name(f)
        out = set()
        for t, _, _, _ in _package_imports(f, type_only=True):
            out |= {t, *(p for p in _parents(t) if p != me and not me.startswith(p + "."))}
        graph[me] = out
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    """Top-level, function-level and type-only imports together, each with the package ``__init__``s it runs:
    a cycle hidden in a function, behind ``TYPE_CHECKING`` or through a parent package is still a cycle
    (``trainer/pipeline/update.py`` -> ``paths.context`` ran ``paths/__init__`` -> ``paths.base`` -> ``update``
    was one, invisible to a graph of the named modules: the update could not be imported alone)."""
    bad = [sorted(c) for c in _cycles(_runtime_graph())]
    assert not bad, f"import cycles: {bad}"


def _layer(module: str) -> int:
    if module in DECLARATIONS:
        return DECLARATIONS[module]
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else LAYERS["runtime"]


def test_layers_point_down():
    """runtime < config, algorithms < models, convert, rewards, data, rollout, eval, planning < trainer < cli."""
    missing = sorted({m.split(".")[1] for m in _import_graph() if "." in m} - set(LAYERS))
    assert not missing, f"place these in LAYERS: {missing}"
    bad = [f"{m} -> {t}" for m, ts in _import_graph().items() if m != "megatron_rl"
           for t in ts if t != "megatron_rl" and _layer(t) > _layer(m)]
    assert not bad, "imports of an upper layer:\n" + "\n".join(sorted(bad))


def test_config_and_algorithms_are_leaves():
    """``config`` and ``algorithms`` import nothing of the package but runtime helpers and each other."""
    for m, ts in _import_graph().items():
        if m.startswith(("megatron_rl.config", "megatron_rl.algorithms", "megatron_rl.plugins")):
            bad = [t for t in ts if _layer(t) > 1]
            assert not bad, f"{m} imports {bad}"


def test_declarations_import_the_stdlib_only():
    """The modules of ``DECLARATIONS`` import the standard library and each other, nothing else."""
    import sys

    for m in DECLARATIONS:
        f = PKG.parent / (m.replace(".", "/") + ".py")
        for name in _imports(f):
            assert name in DECLARATIONS or name.split(".")[0] in sys.stdlib_module_names | {"__future__"}, f"{m} imports {name}"
        rel = [n for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ImportFrom) and n.level]
        assert all(f"megatron_rl.rollout.{n.module}" in DECLARATIONS for n in rel), f"{m}: {[ast.unparse(n) for n in rel]}"


def test_a_declaration_module_loads_no_engine():
    """Importing a declaration module (and the config sections that ask it) in a fresh interpreter loads
    no engine module and no torch: ``rollout/__init__.py`` imports nothing eagerly and the built-in engines
    register on first use (``registry.BUILTIN``); asking for one then loads exactly its module."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; import megatron_rl.config_sections, megatron_rl.rollout.registry as r, megatron_rl.rollout.transport\n"
            "before = sorted(m for m in sys.modules if m.startswith('megatron_rl.rollout') or m == 'torch')\n"
            "names = r.engine_names(); r.caps('hf')\n"
            "print(json.dumps([before, names, sorted(m for m in sys.modules if m.endswith('_engine'))]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PKG.parent)
    before, names, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == ["megatron_rl.rollout", "megatron_rl.rollout.registry", "megatron_rl.rollout.transport"], before
    assert {"hf", "vllm", "vllm-async"} <= set(names)
    assert after == ["megatron_rl.rollout.hf_engine"], after


def test_functions_stay_short():
    """No function over 60 lines (``end_lineno - lineno + 1``: signature, docstring and body)."""
    long = []
    for f in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{f.relative_to(PKG)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these functions into named helpers:\n" + "\n".join(long)


def test_function_level_imports_of_the_package_say_why():
    """An import of the package's own modules inside a function must carry a comment saying why it is
    there (it keeps a login-node command or a module's importers free of a heavy library)."""
    bad = [f"{f.relative_to(PKG)}:{line}" for f in PKG.rglob("*.py")
           for _, in_fn, commented, line in _package_imports(f) if in_fn and not commented]
    assert not bad, "function-level imports without a reason:\n" + "\n".join(sorted(set(bad)))


def _all_imports(path: Path) -> set[str]:
    """Every module ``path`` names in an import, type-only and function-level ones included."""
    return module_imports(path)


def test_the_loop_sits_above_the_paths_and_the_pipeline():
    """Issue 41: the method families (``trainer/paths``), the update pipeline (``trainer/pipeline``) and
    what they build on import nothing of ``trainer/loop`` — not even for annotations — so the loop
    composes them from above (``Rollouts`` and its producers live in ``rollout/rollouts.py``)."""
    bad = [f"{f.relative_to(PKG)} -> {m}" for sub in ("trainer/paths", "trainer/pipeline", "trainer/policy", "trainer/state")
           for f in _files(sub) for m in _all_imports(f) if m.startswith("megatron_rl.trainer.loop")]
    assert not bad, "modules below the loop import it:\n" + "\n".join(sorted(bad))
    assert "megatron_rl.trainer.loop.setup" in _all_imports(PKG / "trainer/loop/rl_loop.py")   # the check sees imports


IMPORT_ALONE = """
import importlib, json, sys
bad = []
for m in json.loads(sys.argv[1]):
    for k in [k for k in sys.modules if k == "megatron_rl" or k.startswith("megatron_rl.")]:
        del sys.modules[k]            # the package as a fresh interpreter has it; torch & co. stay loaded
    try:
        importlib.import_module(m)
    except Exception as e:            # noqa: BLE001 (reported, with its type)
        bad.append(f"{m}: {type(e).__name__}: {e}")
print(json.dumps(bad))
"""


def test_every_module_imports_alone():
    """Each module of the package imported first, as ``python -c "import megatron_rl.x.y"`` does: a module that
    works only because callers import another first (``trainer/pipeline/update.py`` did: "cannot import name
    'Sampled' from partially initialized module") fails here. One interpreter, the package's own modules
    dropped from ``sys.modules`` before each import (a fresh interpreter's view of the package, without
    reloading torch 184 times); a package's ``__main__`` runs its command and is left out."""
    import json
    import subprocess
    import sys

    mods = sorted(module_name(f) for f in PKG.rglob("*.py") if f.stem != "__main__")
    r = subprocess.run([sys.executable, "-c", IMPORT_ALONE, json.dumps(mods)], capture_output=True, text=True,
                       timeout=600, check=False, cwd=PKG.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    bad = json.loads(r.stdout.strip().splitlines()[-1])
    assert not bad, "modules that do not import alone:\n" + "\n".join(bad)
