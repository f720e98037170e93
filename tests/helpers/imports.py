"""The modules a source file of the package imports, read from its AST (the architecture tests' one reader)."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "megatron_rl"   # by path: reading imports imports nothing


def module_name(path: Path) -> str:
    """``megatron_rl/a/b.py`` -> ``megatron_rl.a.b``; a package's ``__init__.py`` -> the package."""
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def module_imports(path: Path, with_names: bool = False) -> set[str]:
    """Every module ``path`` names in an import, type-only (``if TYPE_CHECKING``) and function-level ones
    included, relative imports resolved to absolute names; ``with_names``: also ``module.name`` for each
    name of a ``from module import name`` (a submodule imported that way)."""
    me = module_name(path).split(".")
    base = me if path.name == "__init__.py" else me[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            root = ".".join(base[:len(base) - node.level + 1]) if node.level else ""
            mod = ".".join(x for x in (root, node.module or "") if x)
            out.add(mod)
            if with_names:
                out |= {f"{mod}.{a.name}" for a in node.names}
    return out
