"""The recipe table: every 7B–14B example config holds its paper's settings (or a documented
departure), and the table of docs/methods/index.md is the one generated from the configs (``megatron_rl/recipes.py``)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from megatron_rl import recipes as R

REPO = Path(__file__).resolve().parents[2]
LARGE = sorted(p.stem for p in (REPO / "examples" / "configs").glob("*.yaml") if not p.stem.startswith("tiny_cpu_"))


def test_every_large_config_has_a_paper_entry():
    assert sorted(R.PAPER) == LARGE


@pytest.mark.parametrize("name", LARGE)
def test_config_holds_its_papers_settings(name):
    assert R.drifts(name) == [], f"{name} drifts from its paper (fix it or list it in recipes.PAPER departures)"
    rec = R.PAPER[name]
    assert set(rec.departures) <= set(rec.values), "a departure names a key the paper entry does not have"


def test_a_drift_fails():
    from megatron_rl.config import load_config

    cfg = load_config(R.CONFIGS / "qwen3_8b_rlcsd.yaml", ["model.hf_path=", "rollout.top_p=1.0", "trainer.eval_n=4"])
    assert sorted(k for k, _, _ in R.drifts("qwen3_8b_rlcsd", cfg)) == ["rollout.top_p", "trainer.eval_n"]


def test_readme_table_is_the_generated_one():
    readme = (REPO / "docs" / "methods" / "index.md").read_text()
    m = re.search(r"<!-- recipe-table:start -->\n(.*?)<!-- recipe-table:end -->", readme, re.DOTALL)
    assert m, "docs/methods/index.md lacks the recipe table markers"
    assert m.group(1) == R.table(), "docs/methods/index.md recipe table is stale: paste `python -m megatron_rl.recipes` between the markers"
    assert "DRIFT" not in m.group(1)


def test_no_missing_knob_left_in_the_configs():
    for p in (REPO / "examples" / "configs").glob("*.yaml"):
        assert not re.search(r"no config knob|no top-p knob", p.read_text()), p.name
