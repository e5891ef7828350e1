"""The l2-norm of q and k in a training call (FLA's ``use_qk_l2norm_in_kernel=True``), as two
generated launches (templates/qk_l2norm.py.j2) under one autograd Function: the forward writes
q / |q| and k / |k| and each row's 1 / |x| (float32); the backward computes dq and dk from q, k,
those factors and the gradients of the normalised tensors.  Numerically it is
``torch.nn.functional.normalize(x.float(), dim=-1).to(x.dtype)`` (1 / max(|x|, 1e-12), float32
math), in one read and one write of each tensor where the torch ops make several passes.

The inference kernels apply the l2-norm themselves; a traced call (torch.compile) runs these
launches inside registered ops (:mod:`.library`), so that its bits are the eager call's."""
from __future__ import annotations

import torch
import triton

from ..kernels import Launch

# rows per program: ELEMENTS_PER_PROGRAM // BK (16 rows of K = 128), on NUM_WARPS warps.  Both launches run
# at the copy bandwidth with these tiles (docs/decisions/0031-l2norm-tiles.md).
ELEMENTS_PER_PROGRAM = 2048
NUM_WARPS = 4


def _geometry(x: torch.Tensor) -> tuple[int, int, int, int]:
    """(rows, K, BK, BR): rows of K channels, the padded row tile and the rows per program."""
    K = x.shape[-1]
    BK = triton.next_power_of_2(K)
    return x.numel() // K, K, BK, max(1, ELEMENTS_PER_PROGRAM // BK)


def l2norm_launch(fn, q, k, qn, kn, rq, rk) -> Launch:
    """The forward launch: qn, kn (in q's dtype) and the row factors rq, rk (float32)."""
    R, K, BK, BR = _geometry(q)
    return Launch("qk_l2norm", fn, (triton.cdiv(R, BR), 2), dict(q=q, k=k, qn=qn, kn=kn, rq=rq, rk=rk, R=R),
                  dict(K=K, BK=BK, BR=BR), NUM_WARPS, 1)


def l2norm_bwd_launch(fn, q, k, rq, rk, dqn, dkn, dq, dk) -> Launch:
    """The backward launch: dq, dk from q, k, the forward's row factors and dqn, dkn."""
    R, K, BK, BR = _geometry(q)
    return Launch("qk_l2norm_bwd", fn, (triton.cdiv(R, BR), 2),
                  dict(q=q, k=k, rq=rq, rk=rk, dqn=dqn, dkn=dkn, dq=dq, dk=dk, R=R),
                  dict(K=K, BK=BK, BR=BR), NUM_WARPS, 1)


def normalise(q, k, fwd_fn):
    """Run the forward launch: ``(qn, kn, rq, rk)`` for contiguous q and k of one shape."""
    R = _geometry(q)[0]
    qn, kn = torch.empty_like(q), torch.empty_like(k)
    rq = torch.empty(R, dtype=torch.float32, device=q.device)
    rk = torch.empty_like(rq)
    if R:
        l2norm_launch(fwd_fn, q, k, qn, kn, rq, rk)()
    return qn, kn, rq, rk


def normalise_bwd(q, k, rq, rk, dqn, dkn, bwd_fn):
    """Run the backward launch: ``(dq, dk)``; a missing upstream gradient counts as zeros."""
    dqn = torch.zeros_like(q) if dqn is None else dqn.contiguous()
    dkn = torch.zeros_like(k) if dkn is None else dkn.contiguous()
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    if rq.numel():
        l2norm_bwd_launch(bwd_fn, q, k, rq, rk, dqn, dkn, dq, dk)()
    return dq, dk


class QKL2Norm(torch.autograd.Function):
    """``(q / |q|, k / |k|)`` with gradients; q and k contiguous, of one shape [..., K].  (Under
    torch.compile the same launches run inside registered ops: :mod:`.library`.)"""

    @staticmethod
    def forward(ctx, q, k, fwd_fn, bwd_fn):
        qn, kn, rq, rk = normalise(q, k, fwd_fn)
        ctx.save_for_backward(q, k, rq, rk)
        ctx.bwd_fn = bwd_fn
        return qn, kn

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dqn, dkn):
        q, k, rq, rk = ctx.saved_tensors
        dq, dk = normalise_bwd(q, k, rq, rk, dqn, dkn, ctx.bwd_fn)
        return (dq if ctx.needs_input_grad[0] else None), (dk if ctx.needs_input_grad[1] else None), None, None


def qk_l2norm(q: torch.Tensor, k: torch.Tensor, fwd_fn, bwd_fn) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalised q and k of a training call, differentiable; ``fwd_fn``/``bwd_fn``: the loaded
    qk_l2norm kernels (the training forward's and the backward's families)."""
    if q.shape != k.shape:
        raise ValueError(f"the l2-norm of q and k takes one shape for both, got {tuple(q.shape)} and {tuple(k.shape)}")
    return QKL2Norm.apply(q.contiguous(), k.contiguous(), fwd_fn, bwd_fn)
