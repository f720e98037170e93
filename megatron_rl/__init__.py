"""megatron_rl — RL post-training (GRPO family, BiCC/RCC, RLCSD, PAPO, SCoRe) on Megatron-core.

``megatron_rl.patches`` is the repository's top-level ``patches/`` folder (STYLE.md §10). An install maps it
into the package (``setup.py``'s ``package_dir``); a plain checkout on ``PYTHONPATH`` (the GPU bring-up,
``tools/gpu_check.sh``) has no such mapping, so :func:`_checkout_patches` finds it beside this package: a
meta-path finder for that one name, placed first, so a checkout always pairs with its own ``patches/``
(never with another checkout's that an editable install maps).
"""
import importlib.abc
import importlib.util
import os
import sys

__version__ = "0.1.0"


class _CheckoutPatches(importlib.abc.MetaPathFinder):
    """Finds ``megatron_rl.patches`` at ``<checkout>/patches`` (its submodules then resolve through its ``__path__``)."""

    def __init__(self, folder: str):
        self.folder = folder

    def find_spec(self, fullname, path=None, target=None):
        if fullname != f"{__name__}.patches":
            return None
        return importlib.util.spec_from_file_location(fullname, os.path.join(self.folder, "__init__.py"),
                                                      submodule_search_locations=[self.folder])


def _checkout_patches() -> None:
    """Install the finder when this package sits in a checkout (``setup.py`` and ``patches/__init__.py`` beside
    it); in an installed copy ``patches`` is a real subpackage and nothing is installed."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = os.path.join(root, "patches")
    if os.path.isfile(os.path.join(root, "setup.py")) and os.path.isfile(os.path.join(folder, "__init__.py")) \
            and not any(isinstance(f, _CheckoutPatches) for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutPatches(folder))


_checkout_patches()
