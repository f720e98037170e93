"""The python blocks of docs/tools.md run as written (in one namespace, in order)."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from megatron_rl.agent.tools import registry

PAGE = Path(__file__).resolve().parents[3] / "docs" / "tools.md"


def test_the_pages_python_blocks_run():
    blocks = re.findall(r"<!-- the block below is run by tests/unit/agent/test_tools_doc.py -->\n```python\n(.*?)```",
                        PAGE.read_text(), re.DOTALL)
    assert len(blocks) == 2
    ns, out = {}, io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            for b in blocks:
                exec(compile(b, str(PAGE), "exec"), ns)  # noqa: S102 (the page's own example code)
        assert out.getvalue() == "2\n"
        assert ns["unit_price"](10.0, 4) == "2.50"
        assert "unit_price" in registry.tool_names()
    finally:
        registry._TOOLS.pop("unit_price", None)   # the page registers a tool: leave the registry as it was
