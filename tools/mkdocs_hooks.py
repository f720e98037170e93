"""mkdocs hook: adds the generated config and CLI reference pages (``tools/docs_reference.py``) at build time."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import docs_reference as ref


def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, ref.CONFIG_PAGE, content=ref.config_reference()))
    files.append(File.generated(config, ref.CLI_PAGE, content=ref.cli_reference()))
    return files
