"""What the public ops share: choosing the spec from FLA-style gate arguments, and the
pre-processing FLA performs on the host (l2-norm, beta sigmoid)."""
from __future__ import annotations

from functools import lru_cache

import sympy as sp
import torch

from .. import spec as S

# FLA arguments that change nothing in kdagen's computation and are accepted for drop-in use
IGNORED_KWARGS = ("disable_recompute", "use_graph", "max_num_seqs", "cu_seqlens_cpu", "cp_context")


@lru_cache(maxsize=64)
def select_spec(use_gate_in_kernel: bool, safe_gate: bool, lower_bound: float | None,
                has_A: bool, has_bias: bool) -> S.Recurrence:
    """The KDA spec FLA's flags describe.

    - g given (default): the direct gate; ``safe_gate=True`` promises g >= lower_bound
      (default -5), which lets the diagonal tiles use tensor cores.
    - use_gate_in_kernel with lower_bound: g = lower_bound * sigmoid(exp(A_log) (z + dt_bias)).
    - use_gate_in_kernel without: g = -exp(A_log) * softplus(z + dt_bias).
    A missing A_log / dt_bias is substituted out of the expression (A_log=None -> rate 1).
    """
    if lower_bound is not None and not lower_bound < 0:
        raise ValueError(f"lower_bound must be negative, got {lower_bound}")
    if not use_gate_in_kernel:
        if safe_gate:
            return S.kda(S.gate_direct(-5.0 if lower_bound is None else lower_bound))
        return S.kda(S.gate_direct(None))
    gate = S.gate_lower_bound(lower_bound) if lower_bound is not None else S.gate_softplus()
    subs = {}
    if not has_A:
        if lower_bound is None:
            raise ValueError("use_gate_in_kernel without lower_bound needs A_log (the softplus gate's rate)")
        subs[S.A_log] = 0
    if not has_bias:
        subs[S.dt_bias] = 0
    if subs:
        expr = gate.expr.subs(subs)
        params = tuple((s, lay) for s, lay in gate.params if s not in subs)
        gate = S.Gate(gate.name + ("" if has_A else "_noA") + ("" if has_bias else "_nobias"),
                      sp.simplify(expr), gate.raw, params, gate.constants)
    return S.kda(gate)


def preprocess(q, k, beta, use_qk_l2norm_in_kernel: bool, use_beta_sigmoid_in_kernel: bool,
               allow_neg_eigval: bool):
    if use_qk_l2norm_in_kernel:
        q = torch.nn.functional.normalize(q.float(), p=2, dim=-1).to(q.dtype)
        k = torch.nn.functional.normalize(k.float(), p=2, dim=-1).to(k.dtype)
    if use_beta_sigmoid_in_kernel:
        beta = torch.sigmoid(beta.float()) * (2.0 if allow_neg_eigval else 1.0)
    elif allow_neg_eigval:
        raise ValueError("allow_neg_eigval only takes effect with use_beta_sigmoid_in_kernel=True")
    return q, k, beta


def check_kwargs(op: str, kwargs: dict):
    unknown = [k for k in kwargs if k not in IGNORED_KWARGS]
    if unknown:
        raise TypeError(f"{op}() got unexpected keyword argument(s) {unknown}")


DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
