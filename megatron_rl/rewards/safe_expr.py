"""A small, SAFE parser from normalised answer text to sympy objects (no eval / exec, ever).

Grammar (recursive descent):  expr := term (('+'|'-') term)* ;  term := unary (('*'|'/'|implicit) unary)* ;
unary := ('-'|'+') unary | power ;  power := atom ('^' unary)? ;  atom := number | name | func '(' expr ')'
| '(' expr ')'.  Names: single letters, ``pi``, ``e``, ``i``; functions: sqrt, sin, cos, tan, log, ln, exp.
Guards: input length, nesting depth, and exponent size (a huge power raises ``ValueError``).
"""
from __future__ import annotations

import re

import sympy

MAX_LEN = 2000
MAX_DEPTH = 60
MAX_EXP = 1000
_TOKEN = re.compile(r"\s*(?:(\d+\.\d*|\.\d+|\d+)|([A-Za-z]+)|(.))")
_FUNCS = {"sqrt": sympy.sqrt, "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "log": sympy.log,
          "ln": sympy.log, "exp": sympy.exp}
_CONSTS = {"pi": sympy.pi, "e": sympy.E, "i": sympy.I, "inf": sympy.oo, "infty": sympy.oo}


class _P:
    def __init__(self, s: str):
        if len(s) > MAX_LEN:
            raise ValueError("expression too long")
        self.toks = []
        for num, name, op in _TOKEN.findall(s):
            if num:
                self.toks.append(("num", num))
            elif name:
                self.toks.append(("name", name))
            elif op.strip():
                self.toks.append(("op", op))
        self.i, self.depth = 0, 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else (None, None)

    def take(self, op=None):
        t = self.peek()
        if op is not None and t != ("op", op):
            raise ValueError(f"expected {op!r}")
        self.i += 1
        return t

    def expr(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ValueError("expression nested too deeply")
        v = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            r = self.term()
            v = v + r if op == "+" else v - r
        self.depth -= 1
        return v

    def term(self):
        v = self.unary()
        while True:
            t = self.peek()
            if t in (("op", "*"), ("op", "/")):
                self.take()
                r = self.unary()
                v = v * r if t[1] == "*" else v / r
            elif t[0] in ("num", "name") or t == ("op", "("):
                v = v * self.unary()  # implicit multiplication: 2x, 2(3), 2pi
            else:
                return v

    def unary(self):
        t = self.peek()
        if t in (("op", "-"), ("op", "+")):
            self.take()
            v = self.unary()
            return -v if t[1] == "-" else v
        return self.power()

    def power(self):
        base = self.atom()
        if self.peek() == ("op", "^"):
            self.take()
            ex = self.unary()
            if ex.is_number and abs(complex(ex.evalf(15))) > MAX_EXP:
                raise ValueError("exponent too large")
            return base ** ex
        return base

    def atom(self):
        kind, val = self.take()
        if kind == "num":
            return sympy.Rational(val)
        if kind == "name":
            low = val.lower()
            if low in _FUNCS:
                self.take("(")
                a = self.expr()
                self.take(")")
                return _FUNCS[low](a)
            if low in _CONSTS:
                return _CONSTS[low]
            if len(val) == 1:
                return sympy.Symbol(val)
            raise ValueError(f"unknown name {val!r}")
        if (kind, val) == ("op", "("):
            v = self.expr()
            self.take(")")
            return v
        raise ValueError(f"unexpected token {val!r}")


def parse(s: str):
    """Parse normalised answer text into a sympy expression (``ValueError`` when not parseable)."""
    p = _P(s)
    if not p.toks:
        raise ValueError("empty expression")
    v = p.expr()
    if p.i != len(p.toks):
        raise ValueError("trailing input")
    return v
