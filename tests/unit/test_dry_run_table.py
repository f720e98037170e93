"""docs/dry-run.md's table is the one ``tools/dry_run_table.py`` renders from its record (docs/dry-run-results.json)
with the plan as the code computes it now, and ``plan`` answers to the dry run: every component it estimates for
every role of every 7B–14B example is within 10% of what the dry run measured (or 0.05 GiB)."""
from __future__ import annotations

import json

import pytest

from tests.helpers.tools import load_tool

DRT = load_tool("dry_run_table")
RECORD = json.loads(DRT.RECORD.read_text())


def test_every_example_has_a_record():
    assert sorted(RECORD) == DRT.examples(), "run `python tools/dry_run_table.py NAME` for the missing examples"


def test_page_holds_the_generated_table():
    page = DRT.PAGE.read_text()
    body = page.split(DRT.BEGIN, 1)[1].split(DRT.END, 1)[0]
    assert body == "\n" + DRT.table(RECORD), "docs/dry-run.md's table is stale: run `python tools/dry_run_table.py`"


@pytest.mark.parametrize("name", sorted(RECORD))
def test_plan_is_within_ten_percent_of_the_dry_run_per_component(name):
    _, plans = DRT.plan_of(name)
    for role in RECORD[name]["roles"]:
        off = DRT.off_components(role, plans[role["pp_rank"]])
        assert not off, (f"{name} stage {role['pp_rank']}: plan vs measured (GiB) "
                         + ", ".join(f"{k} {p / 2**30:.2f} vs {m / 2**30:.2f}" for k, m, p in off))
