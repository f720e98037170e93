"""Knights & Knaves: puzzle generator (unique solution, any number of people) and verifier.

The verifier reads the answer formats of both references: the RLCSD reference's (the last ``\\boxed{}``;
"NAME is a knight/knave", "NAME = role", "NAME: role") and Logic-RL's (zhiyuanhubj/Logic-RL
``verl/utils/reward_score/kk.py``: an ``<answer>`` block of "(1) Zoey is a knight" lines; ground truth
``solution_text_format`` text or the row's ``{solution_text_format, statements}`` dict). Reward 1 / 0.

Knights always tell the truth, knaves always lie. Each person makes one statement about others
(simple claims, conjunctions, disjunctions, implications, same/different type). Puzzles are
resampled until brute force over all 2^n assignments finds exactly one consistent solution.
"""
from __future__ import annotations

import itertools
import json
import random
import re

from megatron_rl.rewards.extract import last_boxed, strip_think
from megatron_rl.rewards.verdict import Verdict

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
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
#: a hedge: two roles joined by or / slash ("a knight or a knave", "knight/knave", "either ... or ...")
_HEDGE = re.compile(r"\b(knight|knave)s?\b\s*(?:,?\s*or\b|/|\bor\s+(?:perhaps|maybe|possibly))\s*(?:an?\s+)?(knight|knave)s?\b"
                    r"|\beither\s+(?:an?\s+)?(knight|knave)", re.I)
#: words that stand before "is a knight" without naming a person
_NOT_NAMES = frozenset({"he", "she", "they", "it", "who", "which", "that", "this", "one", "each", "everyone", "someone",
                        "nobody", "person", "speaker", "answer", "there", "and", "so", "thus", "therefore", "hence"})


def parse_roles(text: str) -> dict[str, str]:
    """{name: role} pairs in the text; the first occurrence of a name wins (the RLCSD reference's parse)."""
    out: dict[str, str] = {}
    for name, role in _PAIR.findall(text):
        out.setdefault(name.capitalize(), role.lower())
    return out


def parse_claims(text: str) -> list[tuple[str, str]]:
    """Every (Name, role) claim in the text, in order (a name may appear several times)."""
    return [(name.capitalize(), role.lower()) for name, role in _PAIR.findall(text)
            if name.lower() not in _NOT_NAMES]


def parse_solution(solution) -> dict[str, str]:
    """The ground truth as {Name: role}: a dict of roles, a Logic-RL row's ``{solution_text_format,
    statements}`` dict (or its ``solution_text_format`` text: one "(1) Zoey is a knight" line per
    person), or text in any of the answer formats; a JSON text of such a dict is read too."""
    if isinstance(solution, str) and solution.lstrip().startswith("{"):
        try:
            solution = json.loads(solution)
        except ValueError:
            pass
    if isinstance(solution, dict) and "solution_text_format" in solution:
        solution = solution["solution_text_format"]
    if isinstance(solution, dict):
        return {str(k).capitalize(): str(v).lower() for k, v in solution.items()}
    text = str(solution)
    out: dict[str, str] = {}
    for line in text.splitlines():   # Logic-RL's rule: per line, the first word and the first role after it
        m = re.search(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", line, re.I)
        if m and m.group(1).lower() not in ("is", "a", "an"):
            out.setdefault(m.group(1).capitalize(), m.group(2).lower())
    roles = parse_roles(text)
    return roles if len(roles) >= len(out) else out


def answer_segment(response: str) -> str | None:
    """The final answer of a response: the last ``\\boxed{}`` (RLCSD) or the last ``<answer>…</answer>``
    block (Logic-RL), whichever ends later; None when there is neither (never the whole response)."""
    text = strip_think(response)
    blocks = list(_ANSWER_BLOCK.finditer(text))
    box = last_boxed(text)
    box_at = text.rfind("\\boxed")
    if blocks and (box is None or blocks[-1].end() > box_at):
        return blocks[-1].group(1)
    return box


def kk_verdict(response: str, solution, reference: bool = False):
    """1 iff the final answer assigns exactly the solution's roles: every person, no one else, each
    person one role. A hedge ("a knight or a knave") or a name given two roles ("... Actually, Zoey is
    a knave") is wrong. ``reference``: the RLCSD reference's rule (last box only, first occurrence of a
    name wins, no hedge rule)."""
    truth = parse_solution(solution)
    if not truth:
        raise ValueError(f"Knights & Knaves ground truth is empty or unreadable: {str(solution)[:80]!r}")
    if reference:
        box = last_boxed(strip_think(response))
        ok = box is not None and parse_roles(box) == truth
        return Verdict(1.0 if ok else 0.0, "matched" if ok else ("no answer found" if box is None else "mismatch"))
    seg = answer_segment(response)
    if seg is None:
        return Verdict(0.0, "no answer found")
    if _HEDGE.search(seg):
        return Verdict(0.0, "hedged")
    claims = parse_claims(seg)
    roles: dict[str, set] = {}
    for name, role in claims:
        roles.setdefault(name, set()).add(role)
    if any(len(r) > 1 for r in roles.values()):
        return Verdict(0.0, "contradiction")
    ok = {n: next(iter(r)) for n, r in roles.items()} == truth
    return Verdict(1.0 if ok else 0.0, "matched" if ok else "mismatch")


def verify_kk(response: str, solution):
    """Registered as ``kk`` (:func:`kk_verdict`)."""
    return kk_verdict(response, solution)


def verify_kk_rlcsd(response: str, solution):
    """Registered as ``kk_rlcsd``: the RLCSD reference's KK rule exactly (:func:`kk_verdict`)."""
    return kk_verdict(response, solution, reference=True)
