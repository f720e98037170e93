"""Test modules are imported by basename (rootdir-relative, no packages under tests/): two files with
the same name anywhere under tests/ make pytest stop at collection ("import file mismatch")."""
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1], sorted(n for n, c in names.items() if c > 1)
