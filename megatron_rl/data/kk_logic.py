"""Knights & Knaves puzzles in Logic-RL's format (``megatron-rl data generate kk``).

The puzzle family of Xie et al., "On Memorization of Large Language Models in Logical Reasoning"
(arXiv:2410.23123, the K-and-K/knights-and-knaves dataset), which Logic-RL (Xie et al.,
arXiv:2502.14768) trains on and RLCSD evaluates with (train 4–8 people, test 4–8, OOD 9 / 10 / 11).

A statement is a tree of depth <= 2 over leaves ``('telling-truth', i)`` ("P_i is a knight") and
``('lying', i)`` ("P_i is a knave"); the operators are ``not``, ``and`` / ``or`` (2 operands),
``->`` (if-then) and ``<=>`` (if and only if). Each person says one statement; a knight's statement
is true and a knave's false, so assignment a (True = knight) is consistent iff
``truth(S_i, a) == a_i`` for every person i. Puzzles are resampled until brute force over all 2^n
assignments (vectorised: one boolean column per person) finds exactly one consistent assignment.

A row (verl schema): ``prompt`` = Logic-RL's system instruction + the quiz as the user turn,
``data_source`` ``kk_logic`` (the ``kk`` reward), ``reward_model.ground_truth`` =
``{solution_text_format, statements}`` as Logic-RL's preprocessing writes it (the "(1) NAME is a
knight" lines and the statements tuple as text).
"""
from __future__ import annotations

import dataclasses
import random

import numpy as np

#: Logic-RL's system instruction (its ``qwen-instruct`` template, verbatim: the answer format the ``kk`` reward reads)
SYSTEM_PROMPT = (
    "You are a helpful assistant. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within <think> </think> and"
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here "
    "</answer>.  Now the user asks you to solve a logical reasoning problem. After thinking, when you finally reach "
    "a conclusion, clearly state the identity of each character within <answer> </answer> tags. i.e., <answer> (1) "
    "Zoey is a knight\n(2) ... </answer>.")
DATA_SOURCE = "kk_logic"
#: the K&K dataset's first-name pool (names are drawn without replacement, so at most len(NAMES) people)
NAMES = ("Emma", "Liam", "Olivia", "Noah", "Ava", "Ethan", "Sophia", "Mason", "Isabella", "William", "Mia", "James",
         "Charlotte", "Benjamin", "Amelia", "Lucas", "Harper", "Henry", "Evelyn", "Alexander", "Abigail", "Michael",
         "Emily", "Daniel", "Elizabeth", "Jacob", "Sofia", "Logan", "Avery", "Jackson", "Ella", "Sebastian",
         "Scarlett", "Jack", "Grace", "Aiden", "Chloe", "Owen", "Victoria", "Samuel", "Riley", "Matthew", "Aria",
         "Joseph", "Lily", "Luke", "Aurora", "David", "Zoey", "Oliver", "Penelope")
#: the dataset's ways of reporting what a person said
SAYINGS = ('{name} said that {content}.', '{name} told you that {content}.', '{name} said, "{content}."',
           '{name} stated, "{content}".', 'According to {name}, "{content}".', 'In {name}\'s words: "{content}".',
           '{name} remarked, "{content}".', '"{content}," {name} declared.', '{name} was heard saying, "{content}".',
           '{name} expressed that {content}.', '"{content}" - {name}.', 'As {name} put it, "{content}".',
           '{name} asserted: "{content}".', '"{content}," {name} mentioned.', '{name} commented, "{content}".',
           'In a statement by {name}: "{content}".', '{name} noted, "{content}".', '"{content}," {name} claimed.')
PREFIX = "A very special island is inhabited only by knights and knaves. Knights always tell the truth, and knaves always lie. "
POSTFIX = "So who is a knight and who is a knave?"


@dataclasses.dataclass(frozen=True)
class Puzzle:
    """One puzzle: ``statements[i]`` is what person i says; ``solution[i]`` True = knight."""

    statements: tuple
    solution: tuple[bool, ...]
    names: tuple[str, ...]
    quiz: str

    @property
    def solution_text_format(self) -> str:
        """Logic-RL's answer text: one "(k) NAME is a knight|knave" line per person, in order."""
        return "\n".join(f"({k}) {n} is a {'knight' if s else 'knave'}"
                         for k, (n, s) in enumerate(zip(self.names, self.solution), 1))


def assignments(n: int) -> np.ndarray:
    """All 2^n assignments as a ``[2^n, n]`` bool matrix (column i: person i is a knight)."""
    return ((np.arange(2 ** n)[:, None] >> np.arange(n)[None, :]) & 1).astype(bool)


def truth(stmt: tuple, a: np.ndarray) -> np.ndarray:
    """The statement's truth value under every assignment (a row of ``a`` each)."""
    op = stmt[0]
    if op == "telling-truth":
        return a[:, stmt[1]]
    if op == "lying":
        return ~a[:, stmt[1]]
    if op == "not":
        return ~truth(stmt[1], a)
    vals = [truth(s, a) for s in stmt[1:]]
    if op == "and":
        return np.logical_and.reduce(vals)
    if op == "or":
        return np.logical_or.reduce(vals)
    if op == "->":
        return ~vals[0] | vals[1]
    if op == "<=>":
        return vals[0] == vals[1]
    raise ValueError(f"unknown K&K operator {op!r}")


def solve(statements: tuple) -> list[tuple[bool, ...]]:
    """Every consistent assignment: ``truth(S_i, a) == a_i`` for all i (brute force over 2^n)."""
    a = assignments(len(statements))
    ok = np.logical_and.reduce([truth(s, a) == a[:, i] for i, s in enumerate(statements)])
    return [tuple(bool(x) for x in row) for row in a[ok]]


def canonical(statements: tuple) -> tuple:
    """The puzzle up to the operand order of the symmetric operators (and, or, <=>): the dedupe key."""
    def canon(s):
        if s[0] in ("telling-truth", "lying"):
            return s
        subs = tuple(canon(x) for x in s[1:])
        return (s[0], *(sorted(subs, key=repr) if s[0] in ("and", "or", "<=>") else subs))
    return tuple(canon(s) for s in statements)


def _leaf(rng: random.Random, speaker: int, n: int) -> tuple:
    while True:   # "I am a knave" is never consistent; the dataset leaves it out
        leaf = (rng.choice(("telling-truth", "lying")), rng.randrange(n))
        if leaf != ("lying", speaker):
            return leaf


def sample_statement(rng: random.Random, speaker: int, n: int, depth: int = 2) -> tuple:
    """One statement as the dataset samples it: a die of 6 picks leaf | not | and | or | -> | <=>;
    at depth 1 always a leaf; operands are distinct leaves."""
    dice = rng.randrange(6)
    if depth == 1 or dice == 0:
        return _leaf(rng, speaker, n)
    if dice == 1:
        return ("not", sample_statement(rng, speaker, n, depth - 1))
    op = ("and", "or", "->", "<=>")[dice - 2]
    subs: list = []
    while len(subs) < 2:
        s = sample_statement(rng, speaker, n, depth - 1)
        if s not in subs:
            subs.append(s)
    return (op, *subs)


def statement_space(speaker: int, n: int) -> list[tuple]:
    """Every statement :func:`sample_statement` can give ``speaker`` of ``n`` people, in canonical form
    (a leaf, its negation, an operator over two distinct leaves; and / or / iff up to operand order)."""
    leaves = [(k, i) for k in ("telling-truth", "lying") for i in range(n) if (k, i) != ("lying", speaker)]
    out = {x for leaf in leaves for x in (leaf, ("not", leaf))}
    out |= {canonical(((op, a, b),))[0] for a in leaves for b in leaves if a != b for op in ("and", "or", "->", "<=>")}
    return sorted(out, key=repr)


#: :func:`distinct_puzzles` is counted exactly up to this many people (2^(2^n) consistency masks)
COUNTED_UP_TO = 4


def distinct_puzzles(n: int) -> int | None:
    """The number of distinct (canonical) puzzles of ``n`` people with exactly one solution: what
    :func:`generate` can ever produce for that size (184 for 2 people, 90116 for 3, 81273576 for 4).
    None above :data:`COUNTED_UP_TO` (for 5 people: 198 statements each, 198^5 ~ 3e11 puzzles of which
    about 30% have one solution when sampled: beyond any count asked).

    Person i's statement s is consistent with assignment a iff ``truth(s, a) == a_i``: a bit mask over
    the 2^n assignments. A puzzle has one solution iff the AND of its n masks has one bit set. With
    c_i[m] = #statements of person i with mask m, the count of each AND value is the AND-convolution of
    the c_i, computed as a product of superset sums (zeta transform) and its inverse (Moebius)."""
    if n > COUNTED_UP_TO:
        return None
    a = assignments(n)
    size = 1 << (2 ** n)
    weights = 1 << np.arange(2 ** n, dtype=np.int64)
    idx = np.arange(size)
    total = None
    for i in range(n):
        c = np.zeros(size, dtype=np.int64)
        for s in statement_space(i, n):
            c[int(((truth(s, a) == a[:, i]) * weights).sum())] += 1
        for b in range(2 ** n):   # superset sums
            lo = idx[(idx >> b) & 1 == 0]
            c[lo] += c[lo | (1 << b)]
        total = c if total is None else total * c
    for b in range(2 ** n):   # back from superset sums to the count of each AND value
        lo = idx[(idx >> b) & 1 == 0]
        total[lo] -= total[lo | (1 << b)]
    return int(sum(total[1 << b] for b in range(2 ** n)))


def solver_bytes(n: int) -> int:
    """Peak memory of :func:`solve` for ``n`` people (the ``[2^n, n]`` assignment matrix built through
    int64 and the per-person truth columns): 2^n x (9n + 16) bytes, an upper bound on tracemalloc's
    peak measured at n = 14, 18, 20 (2^n x (8.6n + 8))."""
    return (2 ** n) * (9 * n + 16)


def _leaf_text(names, s: tuple, negated: bool = False) -> str:
    return f"{names[s[1]]} is {'not ' if negated else ''}{'a knight' if s[0] == 'telling-truth' else 'a knave'}"


def statement_text(names, s: tuple) -> str:
    """The dataset's phrasing: "X is a knight", "X is not a knave", "X is a knight and Y is a knave",
    "If X is a knight then Y is a knave", "X is a knight if and only if Y is a knave"."""
    if s[0] == "not":
        return _leaf_text(names, s[1], negated=True)
    if s[0] in ("and", "or"):
        return f" {s[0]} ".join(_leaf_text(names, x) for x in s[1:])
    if s[0] == "->":
        return f"If {_leaf_text(names, s[1])} then {_leaf_text(names, s[2])}"
    if s[0] == "<=>":
        return f"{_leaf_text(names, s[1])} if and only if {_leaf_text(names, s[2])}"
    return _leaf_text(names, s)


def quiz_text(names, statements, rng: random.Random) -> str:
    """The quiz: the island preamble, "You meet N inhabitants: ...", one saying per person, the question."""
    text = PREFIX + f"You meet {len(names)} inhabitants: " + ", ".join(names[:-1]) + ", and " + names[-1] + "."
    for name, s in zip(names, statements):
        text += " " + rng.choice(SAYINGS).format(name=name, content=statement_text(names, s))
    return text + " " + POSTFIX


def generate(n: int, rng: random.Random, seen: set | None = None, max_tries: int = 100_000) -> Puzzle:
    """One puzzle of ``n`` people with exactly one solution whose canonical form is not in ``seen``
    (added to it)."""
    if not 2 <= n <= len(NAMES):
        raise ValueError(f"a K&K puzzle has 2..{len(NAMES)} people (the name pool), got {n}")
    for _ in range(max_tries):
        stmts = tuple(sample_statement(rng, i, n) for i in range(n))
        key = canonical(stmts)
        if seen is not None and key in seen:
            continue
        sols = solve(stmts)
        if len(sols) != 1:
            continue
        if seen is not None:
            seen.add(key)
        names = tuple(rng.sample(NAMES, n))
        return Puzzle(stmts, sols[0], names, quiz_text(names, stmts, rng))
    raise RuntimeError(f"no new unique-solution K&K puzzle of {n} people after {max_tries} tries")


def to_row(p: Puzzle, split: str, index: int) -> dict:
    """The verl row of a puzzle (Logic-RL's preprocessing: system + user prompt, ``kk_logic``)."""
    return {"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": p.quiz}],
            "data_source": DATA_SOURCE, "ability": "logic",
            "reward_model": {"style": "rule", "ground_truth": {"solution_text_format": p.solution_text_format,
                                                               "statements": repr(p.statements)}},
            "extra_info": {"split": split, "index": index, "n_people": len(p.names)}}
