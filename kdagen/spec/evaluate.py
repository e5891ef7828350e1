"""A spec's sympy expressions evaluated on float64 tensors: its gate, rank-1 factors and write
key for given inputs, so that any spec -- a member or a user's -- runs through the general
token-by-token recurrence (:func:`kdagen.spec.reference.dplr_recurrence`).

Nothing here is hand-written per member: the tensors come from the spec's expressions alone,
which is what lets ``kdagen verify`` check a user's spec against its own recurrence.
"""
from __future__ import annotations

from typing import Mapping

import sympy as sp
import torch

from .recurrence import Recurrence
from .symbols import Sigmoid, Softplus, a_free, b_free, beta, g, k, q

_F64 = torch.float64


def _softplus(x):
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype, device=x.device))  # exact, no cut-off


_FUNCS = {
    sp.exp: torch.exp, sp.log: torch.log, sp.tanh: torch.tanh, sp.sqrt: torch.sqrt, sp.Abs: torch.abs,
    Sigmoid: torch.sigmoid, Softplus: _softplus,
}


def evaluate(expr: sp.Expr, env: Mapping[sp.Symbol, torch.Tensor | float]):
    """``expr`` with every symbol replaced by its tensor (or number) in ``env``; broadcasting as
    torch does.  Supports +, *, powers, exp, log, tanh, sqrt, Abs, Min, Max, Sigmoid, Softplus."""
    expr = sp.sympify(expr)
    if expr.is_Symbol:
        if expr not in env:
            raise ValueError(f"the expression uses {expr}, which has no value here (known: "
                             f"{', '.join(sorted(map(str, env)))})")
        return env[expr]
    if expr.is_Number or expr in (sp.pi, sp.E):
        return float(expr)
    args = [evaluate(a, env) for a in expr.args]
    if expr.is_Add:
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out
    if expr.is_Mul:
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    if expr.is_Pow:
        base, ex = args
        return base ** ex
    if isinstance(expr, (sp.Min, sp.Max)):
        f = torch.minimum if isinstance(expr, sp.Min) else torch.maximum
        ts = [a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=_F64) for a in args]
        out = ts[0]
        for t in ts[1:]:
            out = f(out, t)
        return out
    fn = _FUNCS.get(expr.func)
    if fn is None:
        raise ValueError(f"cannot evaluate {expr.func.__name__}(...) in a float64 check; supported: "
                         "+, *, **, exp, log, tanh, sqrt, Abs, Min, Max, Sigmoid, Softplus")
    (x,) = args
    return fn(x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=_F64))


def gate_values(spec: Recurrence, raw: torch.Tensor, params: Mapping[sp.Symbol, torch.Tensor] | None = None):
    """The log decay ``g`` the spec's gate computes from its raw input (``[B, T, HV, K]``, or
    ``[B, T, HV, 1]`` for a scalar decay), with ``params`` laid out to broadcast against it
    (A_log ``[HV, 1]``, dt_bias ``[HV, K]``)."""
    gate = spec.gate
    (x,) = gate.raw
    env = {x: raw, **(params or {})}
    out = evaluate(gate.substituted, env)
    if not isinstance(out, torch.Tensor):
        out = torch.full_like(raw, float(out))
    return out.expand_as(raw) if out.shape != raw.shape else out


def random_gate_inputs(spec: Recurrence, B: int, T: int, HV: int, K: int, gen: torch.Generator):
    """Random raw gate inputs and parameters for ``spec``'s gate, and the log decay they give:
    ``(raw, params, g)`` with ``g: [B, T, HV, K]`` (a scalar decay broadcast over K, the
    identity ``g = 0``).  A direct gate's g is drawn inside its declared range (``[-5, 0]`` when
    unbounded), some of it exactly at the bound."""
    width = 1 if spec.decay == "scalar" else K
    if spec.decay == "identity":
        zero = torch.zeros(B, T, HV, K, dtype=_F64)
        return None, {}, zero
    gate = spec.gate
    params = {}
    if gate.name == "direct" or gate.raw == (g,):
        lb = gate.lower_bound
        lo = -5.0 if lb is None else lb
        raw = lo * torch.rand(B, T, HV, width, generator=gen, dtype=_F64)
        raw[..., 0, :] = lo if T > 0 else raw[..., 0, :]
    else:
        raw = 3.0 * torch.randn(B, T, HV, width, generator=gen, dtype=_F64)
        for sym, layout in gate.params:
            shape = (HV, 1) if layout == "head" else (HV, width)
            params[sym] = 0.5 * torch.randn(*shape, generator=gen, dtype=_F64)
    return raw, params, gate_values(spec, raw, params).expand(B, T, HV, K)


def rank1_tensors(spec: Recurrence, q_: torch.Tensor, k_: torch.Tensor, g_: torch.Tensor,
                  beta_: torch.Tensor | None = None, a_: torch.Tensor | None = None,
                  b_: torch.Tensor | None = None) -> dict:
    """The spec's ``a``, ``b``, write key and readout evaluated per value head: every argument
    ``[B, T, HV, K]`` (q, k already mapped onto value heads) except ``beta: [B, T, HV]``.
    Returns ``{"a", "b", "write_key", "readout"}`` (``a``/``b`` None without a rank-1 part)."""
    env = {q: q_, k: k_, g: g_}
    if beta_ is not None:
        env[beta] = beta_.unsqueeze(-1)
    if a_ is not None:
        env[a_free] = a_
    if b_ is not None:
        env[b_free] = b_
    shape = k_.shape

    def ev(e):
        if e is None:
            return None
        out = evaluate(e, env)
        if not isinstance(out, torch.Tensor):
            out = torch.full(shape, float(out), dtype=_F64)
        return out.expand(shape)

    return {"a": ev(spec.a), "b": ev(spec.b), "write_key": ev(spec.write_key), "readout": ev(spec.readout)}



def _heads(x: torch.Tensor, HV: int) -> torch.Tensor:
    """[B, T, H, K] onto HV value heads (GVA: head hv reads hv // (HV // H))."""
    return x.repeat_interleave(HV // x.shape[2], dim=2)


def _log_decay(spec: Recurrence, g_, B, T, HV, K):
    if spec.decay == "identity":
        if g_ is not None:
            raise ValueError(f"spec {spec.name!r} has no decay, so it takes no g")
        return torch.zeros(B, T, HV, K, dtype=_F64)
    if g_ is None:
        raise ValueError(f"spec {spec.name!r} has a {spec.decay} decay: g is required")
    g_ = g_.to(_F64)
    if spec.decay == "scalar":
        if tuple(g_.shape) != (B, T, HV):
            raise ValueError(f"a scalar decay's g has shape [B, T, HV] = {(B, T, HV)}, got {tuple(g_.shape)}")
        return g_.unsqueeze(-1).expand(B, T, HV, K)
    if tuple(g_.shape) != (B, T, HV, K):
        raise ValueError(f"a channel decay's g has shape [B, T, HV, K] = {(B, T, HV, K)}, got {tuple(g_.shape)}")
    return g_


def spec_tensors(spec: Recurrence, q_, k_, v_, g_=None, beta_=None, a_=None, b_=None) -> dict:
    """Everything the general recurrence needs, from the spec's expressions: ``readout``, ``a``,
    ``b``, ``write_key`` and ``log_decay``, each ``[B, T, HV, K]`` float64.  q, k: [B, T, H, K];
    v: [B, T, HV, V]; g: the log decay (already through the gate: [B, T, HV, K], or [B, T, HV]
    for a scalar decay, None for none); beta: [B, T, HV]; a, b (general DPLR): [B, T, HV, K]."""
    B, T, H, K = q_.shape
    HV = v_.shape[2]
    qe, ke = _heads(q_.to(_F64), HV), _heads(k_.to(_F64), HV)
    ld = _log_decay(spec, g_, B, T, HV, K)
    out = rank1_tensors(spec, qe, ke, ld, None if beta_ is None else beta_.to(_F64),
                        None if a_ is None else a_.to(_F64), None if b_ is None else b_.to(_F64))
    out["log_decay"] = ld
    return out


def spec_recurrence(spec: Recurrence, q_, k_, v_, g_=None, beta_=None, a_=None, b_=None, *, scale=None,
                    initial_state=None, output_final_state=False, cu_seqlens=None):
    """``spec``'s own recurrence, token by token in float64, with every per-channel quantity
    evaluated from its sympy expressions (:func:`spec_tensors`) and run through
    :func:`~kdagen.spec.reference.dplr_recurrence`:
    ``S_t = (Diag(exp g_t) - a_t b_t^T) S_{t-1} + khat_t v_t^T``, ``o_t = S_t^T (scale * readout_t)``.
    Returns ``(o, final_state)`` as the references do."""
    from .reference import dplr_recurrence

    x = spec_tensors(spec, q_, k_, v_, g_, beta_, a_, b_)
    K = q_.shape[-1]
    return dplr_recurrence(x["readout"], x["write_key"], v_, x["log_decay"], x["a"], x["b"], x["write_key"],
                           scale=K ** -0.5 if scale is None else scale, initial_state=initial_state,
                           output_final_state=output_final_state, cu_seqlens=cu_seqlens)
