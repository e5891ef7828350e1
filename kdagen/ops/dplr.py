"""General DPLR (diagonal plus rank one): flash-linear-attention 0.6.0's ops of
``fla.ops.generalized_delta_rule.dplr``, with its names, signatures, layouts and conventions,
as thin wrappers over :mod:`kdagen.ops.member` with the spec :func:`kdagen.spec.dplr`.

Per value head, with state S [K, V] and FLA's convention (a: the read vector, b: the write
vector; the rank-1 term reads the undecayed previous state):

    S_t = Diag(exp gk_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,      o_t = S_t^T (scale q_t)

kdagen's spec writes the same recurrence as S_t = (D_t - a' b'^T) S_{t-1} + k v^T
(:func:`kdagen.spec.reference.naive_recurrent_dplr`), so FLA's (a, b) are the spec's
(a' = -b, b' = a); the ops here take FLA's a and b.

Shapes: q, k [B, T, H, K]; v [B, T, HV, V]; a, b, gk [B, T, HV, K] (value heads: GVA with HV a
multiple of H, FLA's HV = H included); states [N, HV, K, V].

    fused_recurrent_dplr_delta_rule    the recurrent form (decode; with gradients, beyond FLA)
"""
from __future__ import annotations

from functools import lru_cache

import torch

from .. import spec as S
from ..codegen.forms import generates
from .member import fused_recurrent_member


@lru_cache(maxsize=1)
def dplr_spec() -> S.Recurrence:
    """General DPLR's spec with g given (the gate gk), unbounded: the spec both forms lower."""
    return S.dplr()


def chunk_form_available() -> bool:
    """Whether this build generates general DPLR's chunk form (its chunk kernels, their tuning and
    ``chunk_dplr_delta_rule``): :func:`kdagen.codegen.forms.generates`, which ``chunk_member``,
    the CLI and the tuner ask before they reach for the chunk form of the dplr spec."""
    return generates("dplr", "chunk")


def fused_recurrent_dplr_delta_rule(q, k, v, a, b, gk, scale: float | None = None, initial_state=None,
                                    output_final_state: bool = False, reverse: bool = False, cu_seqlens=None,
                                    **kwargs):
    """Recurrent general DPLR (decode; FLA 0.6.0's signature and semantics):
    S_t = Diag(exp gk_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T, o_t = S_t^T (scale q_t).

    q, k: [B, T, H, K]; v: [B, T, HV, V]; a (read), b (write), gk (log decay, not cumulated):
    [B, T, HV, K]; scale defaults to K ** -0.5; initial_state: [N, HV, K, V] (N = B, or the
    number of sequences of ``cu_seqlens``, which needs B == 1).  Returns ``(o, final_state)``,
    final_state float32 [N, HV, K, V] with ``output_final_state`` (else None).  ``reverse=True``
    walks each sequence's tokens last to first, as FLA's.  The gate is applied element-wise per
    token, so any gk works, -inf (a reset of that channel) included.

    kdagen's extras, as its other recurrent ops (:func:`kdagen.fused_recurrent_kda`):
    ``ssm_state_indices`` ([N] int: ``initial_state`` is a state pool [P, HV, K, V] whose slot
    ssm_state_indices[n] sequence n reads and writes in place; negative slots are padding),
    ``out=`` (o written there), ``state_v_first`` (states [.., V, K]), ``config``,
    ``check_inputs`` (a value check that synchronises), ``cu_seqlens_cpu``; GVA; float32 inputs.
    Nothing is read from the device, so a decode step with a device cu_seqlens and a pool can be
    captured in a CUDA graph; a decode loop's repeated geometry skips validation and planning.

    Gradients (FLA 0.6.0's op has none): when autograd is on and an input requires grad, the
    forward is the same kernel, storing nothing extra, and the backward is generated from the
    recurrent backward template's DPLR branch (states recomputed from checkpoints), giving the
    gradients of q, k, v, a, b, gk and initial_state; ``ssm_state_indices`` and ``out=`` are
    refused there, and ``reverse=True`` has no backward (NotImplementedError: train with
    ``chunk_dplr_delta_rule``).  The backward needs the sequence lengths on the host
    (``cu_seqlens_cpu``, else one read of cu_seqlens).  Bad inputs raise a ValueError/TypeError
    naming the argument; ``head_first`` and ``cp_context`` are refused."""
    op = "fused_recurrent_dplr_delta_rule"
    if "head_first" in kwargs:
        raise ValueError(f"{op}: head_first has been removed (as in FLA); inputs are [B, T, H, ...]")
    for name, x in (("a", a), ("b", b), ("gk", gk)):
        if x is None:
            raise ValueError(f"{op}: {name} [B, T, HV, K] is required")
    if (isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor) and q.dim() == 4 and v.dim() == 4
            and isinstance(gk, torch.Tensor) and tuple(gk.shape) != (q.shape[0], q.shape[1], v.shape[2], q.shape[3])):
        B, T, _, K = q.shape
        raise ValueError(f"{op}: gk must have shape [B, T, HV, K] = {(B, T, v.shape[2], K)}, got {tuple(gk.shape)}")
    return fused_recurrent_member(dplr_spec(), q, k, v, gk, None, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state, cu_seqlens=cu_seqlens, a=a, b=b,
                                  reverse=reverse, op=op, **kwargs)
