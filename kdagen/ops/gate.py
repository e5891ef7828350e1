"""A training call's per-channel in-kernel gate as launches of its own (``ChunkTrainConfig.gate_launch``,
templates/gate.py.j2): the forward computes g = gate(z, A_log, dt_bias) once, in float32, and the chunk
launches then run the plan without an in-kernel gate on it; the backward turns that plan's dg into dz (in
z's dtype) and the gate parameters' gradients (per-program partial sums, summed here).  Otherwise every
launch that reads the gate recomputes it from z, and the backward's intra launch also forms dz and the
parameters' partial sums (docs/decisions/0010-gate-launched-apart.md)."""
from __future__ import annotations

import torch
import triton

from ..kernels import Launch

ROWS_PER_PROGRAM = 16  # tokens of one value head per program: a [16, K] tile


def _rows(z: torch.Tensor, HV: int, K: int) -> int:
    return z.numel() // (HV * K)


def _launch(kind: str, fn, z, A_log, dt_bias, HV: int, K: int, **tensors) -> Launch:
    """One of the gate's launches: z, the gate parameters the plan reads (None: not an argument), then
    ``tensors`` in the kernel's order; one program per ROWS_PER_PROGRAM tokens of one value head."""
    params = dict(A_log=A_log, dt_bias=dt_bias)
    args = dict(z=z, **{n: t for n, t in params.items() if t is not None},
                **{n: t for n, t in tensors.items() if t is not None}, R=_rows(z, HV, K))
    return Launch(kind, fn, (triton.cdiv(_rows(z, HV, K), ROWS_PER_PROGRAM), HV), args,
                  dict(HV=HV, K=K, BK=triton.next_power_of_2(K), BT=ROWS_PER_PROGRAM), 4, 1)


def gate_launch(fn, z, A_log, dt_bias, g, HV: int, K: int) -> Launch:
    """The forward launch: g (float32, z's shape [..., HV, K]) from z and the gate's parameters."""
    return _launch("gate", fn, z, A_log, dt_bias, HV, K, g=g)


def gate_bwd_launch(fn, z, A_log, dt_bias, dg, dz, dA_part, dbias_part, HV: int, K: int) -> Launch:
    """The backward launch: dz from dg and z, and the partial sums of dA_log ([programs, HV]) and of
    ddt_bias ([programs, HV, K]) -- None for a parameter the gate does not have."""
    return _launch("gate_bwd", fn, z, A_log, dt_bias, HV, K, dg=dg, dz=dz, dA_part=dA_part, dbias_part=dbias_part)


class LayerGate(torch.autograd.Function):
    """g = gate(z, A_log, dt_bias) in float32, with gradients for z, A_log and dt_bias (z contiguous,
    [..., HV, K]; A_log [HV]; dt_bias HV * K entries)."""

    @staticmethod
    def forward(ctx, z, A_log, dt_bias, fwd_fn, bwd_fn):
        HV, K = z.shape[-2], z.shape[-1]
        g = torch.empty(z.shape, dtype=torch.float32, device=z.device)
        if z.numel():
            gate_launch(fwd_fn, z, A_log, dt_bias, g, HV, K)()
        ctx.save_for_backward(z, A_log, dt_bias)
        ctx.bwd_fn = bwd_fn
        return g

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dg):
        z, A_log, dt_bias = ctx.saved_tensors
        HV, K = z.shape[-2], z.shape[-1]
        n = triton.cdiv(_rows(z, HV, K), ROWS_PER_PROGRAM)
        dz = torch.empty_like(z)
        dA_part = torch.zeros(n, HV, dtype=torch.float32, device=z.device) if A_log is not None else None
        dbias_part = torch.zeros(n, HV, K, dtype=torch.float32, device=z.device) if dt_bias is not None else None
        if z.numel():
            gate_bwd_launch(ctx.bwd_fn, z, A_log, dt_bias, dg.contiguous(), dz, dA_part, dbias_part, HV, K)()
        dA_log = None if A_log is None else dA_part.sum(0).reshape(A_log.shape).to(A_log.dtype)
        ddt_bias = None if dt_bias is None else dbias_part.sum(0).reshape(dt_bias.shape).to(dt_bias.dtype)
        return dz, dA_log, ddt_bias, None, None


def layer_gate(z: torch.Tensor, A_log, dt_bias, fwd_fn, bwd_fn, per_token: bool = False) -> torch.Tensor:
    """The gate of a training call, differentiable; ``fwd_fn``/``bwd_fn``: the loaded gate kernels of
    the call's plan (the training forward's family, with ``gate_launch``).  ``per_token``: one gate per
    token and value head (a scalar decay, Gated DeltaNet's; z [..., HV]): the launches run on one channel,
    with dt_bias one per head (the member's arguments hold it per channel, every channel the same, [HV, K])."""
    if not per_token:
        return LayerGate.apply(z.contiguous(), A_log, dt_bias, fwd_fn, bwd_fn)
    bias = None if dt_bias is None else dt_bias.reshape(dt_bias.shape[0], -1)[:, :1].contiguous()
    return LayerGate.apply(z.contiguous().unsqueeze(-1), A_log, bias, fwd_fn, bwd_fn).squeeze(-1)
