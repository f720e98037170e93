"""Knights & Knaves: puzzle generator (unique solution, any number of people) and verifier.

Knights always tell the truth, knaves always lie. Each person makes one statement about others
(simple claims, conjunctions, disjunctions, implications, same/different type). Puzzles are
resampled until brute force over all 2^n assignments finds exactly one consistent solution.
"""
from __future__ import annotations

import itertools
import random
import re

NAMES = ("Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Iris", "Jack", "Kate", "Liam")


def _truth(stmt, assign):
    kind = stmt[0]
    if kind == "is":
        return assign[stmt[1]] == stmt[2]
    if kind == "and":
        return assign[stmt[1]] == stmt[2] and assign[stmt[3]] == stmt[4]
    if kind == "or":
        return assign[stmt[1]] == stmt[2] or assign[stmt[3]] == stmt[4]
    if kind == "if":
        return (not assign[stmt[1]] == stmt[2]) or assign[stmt[3]] == stmt[4]
    if kind == "same":
        return assign[stmt[1]] == assign[stmt[2]]
    raise ValueError(kind)


def _text(stmt, names) -> str:
    role = lambda k: "a knight" if k else "a knave"  # noqa: E731
    k = stmt[0]
    if k == "is":
        return f"{names[stmt[1]]} is {role(stmt[2])}"
    if k in ("and", "or"):
        return f"{names[stmt[1]]} is {role(stmt[2])} {k} {names[stmt[3]]} is {role(stmt[4])}"
    if k == "if":
        return f"if {names[stmt[1]]} is {role(stmt[2])} then {names[stmt[3]]} is {role(stmt[4])}"
    return f"{names[stmt[1]]} and {names[stmt[2]]} are the same type"


def solutions(statements, n: int) -> list[tuple[bool, ...]]:
    """All assignments (True = knight) consistent with every speaker's statement."""
    return [a for a in itertools.product((True, False), repeat=n)
            if all(_truth(s, a) == a[i] for i, s in enumerate(statements))]


def _random_statement(rng, i, n):
    others = [j for j in range(n) if j != i] or [i]
    a, b = rng.choice(others), rng.choice(others)
    kind = rng.choice(("is", "and", "or", "if", "same"))
    if kind == "same":
        return ("same", a, b) if a != b else ("is", a, rng.random() < 0.5)
    if kind == "is":
        return ("is", a, rng.random() < 0.5)
    return (kind, a, rng.random() < 0.5, b, rng.random() < 0.5)


def generate_puzzle(n: int, seed: int, max_tries: int = 10_000) -> dict:
    """A puzzle with exactly one solution: {names, statements (text), solution {name: role}}."""
    if not 2 <= n <= len(NAMES):
        raise ValueError(f"n must be in [2, {len(NAMES)}], got {n}")
    rng = random.Random(seed)
    names = list(NAMES[:n])
    for _ in range(max_tries):
        stmts = [_random_statement(rng, i, n) for i in range(n)]
        sols = solutions(stmts, n)
        if len(sols) == 1:
            text = " ".join(f"{names[i]} says: \"{_text(s, names)}\"." for i, s in enumerate(stmts))
            sol = {names[i]: ("knight" if k else "knave") for i, k in enumerate(sols[0])}
            return {"names": names, "statements": stmts, "question": text, "solution": sol}
    raise RuntimeError(f"no unique-solution puzzle for n={n} after {max_tries} tries")


_PAIR = re.compile(r"\b([A-Z][a-z]+)\s*(?:is\s+(?:a|an)\s+|=\s*|:\s*)(knight|knave)s?\b", re.I)


def parse_roles(text: str) -> dict[str, str]:
    """{name: role} pairs in the text; the first occurrence of a name wins."""
    out: dict[str, str] = {}
    for name, role in _PAIR.findall(text):
        out.setdefault(name.capitalize(), role.lower())
    return out


def verify_kk(response: str, solution) -> float:
    """1.0 iff the roles in the final answer (last box, else <answer>, else whole text) equal the
    solution exactly (every person, no extras)."""
    from megatron_rl.rewards.extract import extract_answer, strip_think

    if isinstance(solution, str):
        solution = parse_roles(solution)
    if not solution:
        raise ValueError("Knights & Knaves ground truth is empty")
    body = strip_think(response)
    ans = extract_answer(body) or body
    return 1.0 if parse_roles(ans) == {k.capitalize(): v for k, v in solution.items()} else 0.0
