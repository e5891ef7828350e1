"""Print sympy expressions as Triton source (``tl.*`` calls), for the in-kernel gate and
its derivative.  Symbols are mapped to kernel variable names by the caller."""
from __future__ import annotations

import sympy as sp
from sympy.printing.str import StrPrinter

from ..spec.symbols import Sigmoid, Softplus

SOFTPLUS_CUTOFF = 20.0  # softplus(x) == x to fp32 precision above this


def _sigmoid(x: str) -> str:
    """1 / (1 + exp(-x)) with the fast division (div.full.f32, within 2 ulp): tl.sigmoid's IEEE
    division is a multi-instruction sequence per element (docs/decisions/0030-fast-sigmoid.md).  The
    templates' beta sigmoid is the same expression (the ``sigmoid`` macro of _macros.py.j2)."""
    return f"tl.fdiv(1.0, 1.0 + tl.exp(-({x})))"


class TritonPrinter(StrPrinter):
    def __init__(self, names: dict[sp.Symbol, str]):
        super().__init__({"full_prec": False})
        self._names = {s: n for s, n in names.items()}

    def _print_Symbol(self, s):
        try:
            return self._names[s]
        except KeyError:
            raise ValueError(f"symbol {s} has no kernel variable; known: {sorted(map(str, self._names))}") from None

    def _print_Float(self, f):
        return repr(float(f))

    def _print_Integer(self, i):
        return f"{float(i)!r}"

    def _print_Rational(self, r):
        return f"({float(r.p)!r} / {float(r.q)!r})"

    def _print_Half(self, r):
        return "0.5"

    def _print_Exp1(self, e):
        return "2.718281828459045"

    def _print_Pi(self, e):
        return "3.141592653589793"

    def _print_exp(self, e):
        return f"tl.exp({self._print(e.args[0])})"

    def _print_log(self, e):
        return f"tl.log({self._print(e.args[0])})"

    def _print_Sigmoid(self, e):
        return _sigmoid(self._print(e.args[0]))

    def _print_Softplus(self, e):
        x = self._print(e.args[0])
        return f"tl.where(({x}) > {SOFTPLUS_CUTOFF}, ({x}), tl.log(1.0 + tl.exp(tl.minimum(({x}), {SOFTPLUS_CUTOFF}))))"

    def _print_tanh(self, e):
        x = self._print(e.args[0])
        return f"(2.0 * {_sigmoid(f'2.0 * ({x})')} - 1.0)"

    def _print_Abs(self, e):
        return f"tl.abs({self._print(e.args[0])})"

    def _print_Max(self, e):
        args = [self._print(a) for a in e.args]
        out = args[0]
        for a in args[1:]:
            out = f"tl.maximum({out}, {a})"
        return out

    def _print_Min(self, e):
        args = [self._print(a) for a in e.args]
        out = args[0]
        for a in args[1:]:
            out = f"tl.minimum({out}, {a})"
        return out

    def _print_Pow(self, e, rational=False):
        base, ex = e.args
        b = self.parenthesize(base, 1000)
        if ex == -1:
            return f"(1.0 / {b})"
        if ex == sp.Rational(1, 2):
            return f"tl.sqrt({self._print(base)})"
        if ex == -sp.Rational(1, 2):
            return f"(1.0 / tl.sqrt({self._print(base)}))"
        if ex.is_Integer and 1 < int(ex) <= 4:
            return "(" + " * ".join([b] * int(ex)) + ")"
        if ex.is_Integer and -4 <= int(ex) < -1:
            return "(1.0 / (" + " * ".join([b] * -int(ex)) + "))"
        return f"tl.exp(({self._print(ex)}) * tl.log({b}))"

    def _print_Function(self, e):
        raise ValueError(f"kdagen cannot print {e.func} into Triton; use exp/log/Sigmoid/Softplus/tanh/Abs/Min/Max")


def to_triton(expr: sp.Expr, names: dict[sp.Symbol, str]) -> str:
    return TritonPrinter(names).doprint(expr)
