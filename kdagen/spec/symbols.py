"""The symbols and named functions the spec's sympy expressions are written in.

``q``, ``k``, ``g`` stand for the d-th component of a token's query, key and log-decay;
``beta`` is a per-token scalar; ``a``, ``b`` the free rank-1 factors of general DPLR.  A
gate is an expression of the raw input ``z`` and the parameters ``A_log`` (per head) and
``dt_bias`` (per channel), with ``g_min`` a constant bound.  :class:`Sigmoid` and
:class:`Softplus` are kept as named functions so that they print as Triton calls.
"""
from __future__ import annotations

import sympy as sp

q, k, g, beta = sp.symbols("q k g beta", real=True)
a_free, b_free = sp.symbols("a b", real=True)
# raw gate input and its parameters
z = sp.Symbol("z", real=True)  # raw per-token, per-channel gate input
A_log = sp.Symbol("A_log", real=True)  # per-head log rate
dt_bias = sp.Symbol("dt_bias", real=True)  # per-channel bias
g_min = sp.Symbol("g_min", negative=True)  # lower bound of the gate (a constant)


class Sigmoid(sp.Function):
    """Logistic function, kept as a named function so it prints as one expression
    (``1 / (1 + exp(-x))`` with Triton's fast division)."""

    nargs = 1

    def fdiff(self, argindex=1):
        s = Sigmoid(self.args[0])
        return s * (1 - s)

    @classmethod
    def eval(cls, x):
        if x is sp.oo:
            return sp.Integer(1)
        if x is sp.S.NegativeInfinity:
            return sp.Integer(0)
        if x == 0:
            return sp.Rational(1, 2)
        return None

    def _eval_rewrite_as_exp(self, x, **kw):
        return 1 / (1 + sp.exp(-x))

    def _eval_is_positive(self):
        return self.args[0].is_extended_real

    def _eval_is_real(self):
        return self.args[0].is_extended_real


class Softplus(sp.Function):
    """log(1 + exp(x)), printed with a large-argument cut-off."""

    nargs = 1

    def fdiff(self, argindex=1):
        return Sigmoid(self.args[0])

    @classmethod
    def eval(cls, x):
        if x is sp.oo:
            return sp.oo
        if x is sp.S.NegativeInfinity:
            return sp.Integer(0)
        return None

    def _eval_rewrite_as_log(self, x, **kw):
        return sp.log(1 + sp.exp(x))

    def _eval_is_nonnegative(self):
        return self.args[0].is_extended_real

    def _eval_is_real(self):
        return self.args[0].is_extended_real
