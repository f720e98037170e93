"""``plugins:``: the user's own modules, imported before a config's sections are read.

A method added outside the package (docs/contributing.md, "Adding a method") registers its advantage, loss,
hparams dataclass and kind when its module is imported, a rollout engine (docs/contributing.md,
"Adding a rollout engine") its engine class; ``config.from_dict`` imports the modules named by the top-level
``plugins:`` key first, so ``algo.kind``, ``algo.<kind>.*`` and ``rollout.engine`` validate against
those registrations. Every process that loads the config (each ``torchrun`` rank, a resume from
``run_dir/config.yaml``, which keeps the key) imports them itself; the Ray engine actors get no
config: they run no method code, and import a plugin's engine class by its ``module:Class`` path
(``rollout/registry.engine_path``).

Entries are importable module names (``my_pkg.my_method``), found on ``sys.path`` as any import
(``PYTHONPATH`` for a module outside an installed package). File paths are refused: a name is
imported once per process through ``sys.modules`` whatever each rank's working directory, and the
saved ``config.yaml`` stays valid on another machine.
"""
from __future__ import annotations

import importlib
import re
import sys

_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def plugin_names(value) -> tuple[str, ...]:
    """The ``plugins:`` value as a tuple of module names (a list of names, or one name as text);
    ``ValueError`` naming the key otherwise."""
    if value is None:
        return ()
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)):
        raise ValueError(f"plugins: expected a list of module names, got {value!r} ({type(value).__name__})")  # noqa: TRY004
    for n in names:
        if not isinstance(n, str) or not _MODULE.match(n):
            hint = (" (a file path: put its directory on PYTHONPATH and name the module)"
                    if isinstance(n, str) and ("/" in n or n.endswith(".py")) else "")
            raise ValueError(f"plugins: {n!r} is not a module name such as my_pkg.my_method{hint}")
    return tuple(names)


def import_plugins(names: tuple[str, ...]) -> None:
    """Import each module once (``sys.modules``: loading the config again registers nothing twice);
    a module that cannot be imported is a one-line ``ValueError`` naming the key and the module."""
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                raise ValueError(f"plugins: cannot import {name!r}: no module named {e.name!r} on sys.path "
                                 "(put the directory that holds it on PYTHONPATH)") from e
            raise ValueError(f"plugins: importing {name!r} failed: {type(e).__name__}: {e}") from e
        except Exception as e:  # the plugin's own error (a name registered twice, a syntax error): one line
            first = (str(e).splitlines() or [""])[0]
            raise ValueError(f"plugins: importing {name!r} failed: {type(e).__name__}: {first}") from e
