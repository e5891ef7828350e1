"""Float64 reference implementations for Kimi Delta Attention and the DPLR family.

Everything here is plain, differentiable PyTorch evaluated in ``float64`` on the device of the
inputs: ``q``'s device (``g_raw``'s for :func:`kda_gate`), to which the other tensor arguments
are moved and on which the results are returned (CPU inputs compute on the CPU, CUDA inputs on
their GPU).  These functions are the ground truth the generated Triton kernels are tested
against, so they favour clarity over speed: the recurrent forms loop over tokens, the chunkwise
forms loop over chunks and spell out every formula with explicit ``exp(G_i - G_j)`` factors.

Conventions (flash-linear-attention layout), per head with state ``S`` in ``R^{K x V}``::

    S_t = (D_t - a_t b_t^T) S_{t-1} + khat_t v_t^T,        o_t = S_t^T (scale * q_t)

* KDA      : D_t = Diag(exp g_t), a_t = beta_t k_t, b_t = exp(g_t) * k_t, khat_t = beta_t k_t,
             i.e. S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T.
* GDN      : KDA with one scalar gate per head and token (g broadcast over the K channels).
* DeltaNet : KDA with g = 0.
* GLA      : D_t = Diag(exp g_t), no rank-1 part, khat_t = k_t.
* DPLR     : D_t = Diag(exp g_t), free a_t and b_t, khat_t = k_t.

Shapes: ``q, k: [B, T, H, K]``, ``v: [B, T, HV, V]``, gates ``g: [B, T, HV, K]`` (``[B, T, HV]``
for GDN), ``beta: [B, T, HV]``, ``a, b: [B, T, HV, K]``.  Grouped-value attention (GVA): ``HV``
must be a multiple of ``H`` and value head ``hv`` reads q/k head ``hv // (HV // H)``.
``initial_state`` and the returned final state are ``[N, HV, K, V]`` where ``N = B`` or, with
``cu_seqlens`` (int64 ``[N + 1]``, only with ``B == 1``), the number of packed sequences.
Every function returns ``(o, final_state)`` with ``o: [B, T, HV, V]`` in float64 and
``final_state`` ``None`` unless ``output_final_state=True``, both on ``q``'s device.

Invalid arguments raise :class:`ValueError` with a message naming the function and argument.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, List, Optional, Sequence, Tuple

import torch

__all__ = [
    "dplr_recurrence",
    "naive_recurrent_kda",
    "naive_recurrent_gdn",
    "naive_recurrent_deltanet",
    "naive_recurrent_gla",
    "naive_recurrent_dplr",
    "naive_chunk_kda",
    "naive_chunk_gdn",
    "naive_chunk_deltanet",
    "naive_chunk_gla",
    "kda_gate",
]

Tensor = torch.Tensor
_F64 = torch.float64


# ----------------------------------------------------------------------------------------------
# argument checking
# ----------------------------------------------------------------------------------------------


def _f64(x: Optional[Tensor], device: torch.device) -> Optional[Tensor]:
    """Differentiable upcast to float64 on ``device`` (``None`` passes through)."""
    if x is None:
        return None
    return x.to(device=device, dtype=_F64)


def _need_tensor(fn: str, name: str, x, ndim: int, what: str) -> Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{fn}: {name} must be a torch.Tensor of shape {what}, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(
            f"{fn}: {name} must have {ndim} dimensions {what}, got shape {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"{fn}: {name} must be a real floating-point tensor, got dtype {x.dtype}")
    return x


class _Dims:
    __slots__ = ("B", "T", "H", "HV", "K", "V")

    def __init__(self, B: int, T: int, H: int, HV: int, K: int, V: int):
        self.B, self.T, self.H, self.HV, self.K, self.V = B, T, H, HV, K, V


def _check_qkv(fn: str, q, k, v) -> _Dims:
    _need_tensor(fn, "q", q, 4, "[B, T, H, K]")
    _need_tensor(fn, "k", k, 4, "[B, T, H, K]")
    _need_tensor(fn, "v", v, 4, "[B, T, HV, V]")
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"{fn}: q and k must have the same shape [B, T, H, K], got q {tuple(q.shape)} and k {tuple(k.shape)}")
    B, T, H, K = q.shape
    Bv, Tv, HV, V = v.shape
    if (Bv, Tv) != (B, T):
        raise ValueError(f"{fn}: v must be [B, T, HV, V] with B={B}, T={T} as in q, got v {tuple(v.shape)}")
    if H == 0 or K == 0 or HV == 0 or V == 0:
        raise ValueError(f"{fn}: head counts and head dimensions must be positive, got q {tuple(q.shape)}, v {tuple(v.shape)}")
    if HV % H != 0:
        raise ValueError(f"{fn}: the number of value heads HV={HV} must be a multiple of the number of q/k heads H={H} (GVA)")
    return _Dims(B, T, H, HV, K, V)


def _check_shape(fn: str, name: str, x, shape: Sequence[int], what: str) -> Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{fn}: {name} must be a torch.Tensor of shape {what} = {tuple(shape)}, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{fn}: {name} must be a real floating-point tensor, got dtype {x.dtype}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{fn}: {name} must have shape {what} = {tuple(shape)}, got {tuple(x.shape)}")
    return x


def _check_key_side(fn: str, name: str, x, d: _Dims) -> Tensor:
    """a / b / write_key of :func:`dplr_recurrence`: [B, T, HV, K] (or [B, T, H, K], GVA-mapped)."""
    _need_tensor(fn, name, x, 4, "[B, T, HV, K]")
    if tuple(x.shape) not in {(d.B, d.T, d.HV, d.K), (d.B, d.T, d.H, d.K)}:
        raise ValueError(
            f"{fn}: {name} must have shape [B, T, HV, K] = {(d.B, d.T, d.HV, d.K)}"
            f" (or [B, T, H, K] = {(d.B, d.T, d.H, d.K)}), got {tuple(x.shape)}"
        )
    return x


def _check_scale(fn: str, scale, K: int) -> float:
    if scale is None:
        return K ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(float(scale)):
        raise ValueError(f"{fn}: scale must be a finite real number or None, got {scale!r}")
    return float(scale)


def _check_state_and_seqlens(fn: str, d: _Dims, initial_state, cu_seqlens) -> Optional[List[Tuple[int, int]]]:
    """Validates ``initial_state``/``cu_seqlens``; returns the (bos, eos) list or None."""
    bounds: Optional[List[Tuple[int, int]]] = None
    N = d.B
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor):
            raise ValueError(f"{fn}: cu_seqlens must be an integer torch.Tensor of shape [N + 1], got {type(cu_seqlens).__name__}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"{fn}: cu_seqlens must be 1-D with at least 2 entries [N + 1], got shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or cu_seqlens.dtype == torch.bool:
            raise ValueError(f"{fn}: cu_seqlens must have an integer dtype (int64), got {cu_seqlens.dtype}")
        if d.B != 1:
            raise ValueError(f"{fn}: cu_seqlens packs variable-length sequences along T and requires batch size B == 1, got B={d.B}")
        cs = [int(x) for x in cu_seqlens.tolist()]
        if cs[0] != 0:
            raise ValueError(f"{fn}: cu_seqlens must start at 0, got {cs[0]}")
        if cs[-1] != d.T:
            raise ValueError(f"{fn}: cu_seqlens must end at the total length T={d.T}, got {cs[-1]}")
        if any(e < s for s, e in zip(cs[:-1], cs[1:])):
            raise ValueError(f"{fn}: cu_seqlens must be non-decreasing, got {cs}")
        bounds = list(zip(cs[:-1], cs[1:]))
        N = len(bounds)
    if initial_state is not None:
        _check_shape(fn, "initial_state", initial_state, (N, d.HV, d.K, d.V), "[N, HV, K, V]")
    return bounds


def _check_chunk_size(fn: str, chunk_size) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral) or int(chunk_size) < 1:
        raise ValueError(f"{fn}: chunk_size must be a positive integer, got {chunk_size!r}")
    return int(chunk_size)


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def _expand_heads(x: Optional[Tensor], HV: int) -> Optional[Tensor]:
    """Map a [B, T, H, ...] tensor onto HV value heads: head hv reads head hv // (HV // H)."""
    if x is None or x.shape[2] == HV:
        return x
    return x.repeat_interleave(HV // x.shape[2], dim=2)


_Core = Callable[[Sequence[Optional[Tensor]], Tensor], Tuple[Tensor, Tensor]]


def _per_sequence(
    core: _Core,
    tensors: Sequence[Optional[Tensor]],
    d: _Dims,
    initial_state: Optional[Tensor],
    bounds: Optional[List[Tuple[int, int]]],
    output_final_state: bool,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Runs ``core(tensors, S0) -> (o, S)`` per batch (or per packed sequence with cu_seqlens).

    ``tensors`` are [B, T, ...] float64 with ``tensors[0]`` the query; the core receives
    [N', T', ...] slices and a [N', HV, K, V] state, all on the query's device.
    """
    device = tensors[0].device
    h0 = _f64(initial_state, device)
    if bounds is None:
        S0 = h0 if h0 is not None else torch.zeros(d.B, d.HV, d.K, d.V, dtype=_F64, device=device)
        o, S = core(tensors, S0)
    else:
        outs, states = [], []
        for i, (bos, eos) in enumerate(bounds):
            S0 = h0[i : i + 1] if h0 is not None else torch.zeros(1, d.HV, d.K, d.V, dtype=_F64, device=device)
            sl = [None if t is None else t[:, bos:eos] for t in tensors]
            o_i, S_i = core(sl, S0)
            outs.append(o_i)
            states.append(S_i)
        o = torch.cat(outs, dim=1)
        S = torch.cat(states, dim=0)
    return o, (S if output_final_state else None)


# ----------------------------------------------------------------------------------------------
# token-by-token recurrence
# ----------------------------------------------------------------------------------------------


def _recurrence_core(scale: float):
    def core(tensors: Sequence[Optional[Tensor]], S: Tensor) -> Tuple[Tensor, Tensor]:
        q, k, v, ld, a, b, w = tensors  # [N, T, HV, K] (v: [N, T, HV, V]); k unused (w is khat)
        outs = []
        for t in range(q.shape[1]):
            S_prev = S
            # D_t S_{t-1}
            S = torch.exp(ld[:, t]).unsqueeze(-1) * S_prev
            # - a_t (b_t^T S_{t-1})
            if a is not None:
                bS = torch.einsum("nhk,nhkv->nhv", b[:, t], S_prev)
                S = S - a[:, t].unsqueeze(-1) * bS.unsqueeze(-2)
            # + khat_t v_t^T
            S = S + w[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
            # o_t = S_t^T (scale q_t)
            outs.append(torch.einsum("nhk,nhkv->nhv", q[:, t] * scale, S))
        o = torch.stack(outs, dim=1) if outs else v.new_zeros(v.shape)
        return o, S

    return core


def dplr_recurrence(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor,
    a: Optional[Tensor] = None,
    b: Optional[Tensor] = None,
    write_key: Optional[Tensor] = None,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """General DPLR step ``S_t = (Diag(exp ld_t) - a_t b_t^T) S_{t-1} + khat_t v_t^T``, token by token.

    Args:
        q, k: ``[B, T, H, K]``.  v: ``[B, T, HV, V]``.
        log_decay: ``[B, T, HV, K]`` per-token, per-channel log decay (not cumulated).
        a, b: ``[B, T, HV, K]`` (``[B, T, H, K]`` is accepted and GVA-mapped) or both ``None``
            for no rank-1 part.
        write_key: ``khat_t``, same shapes as ``a``; ``None`` means ``khat = k``.
        scale: query scale, default ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` or ``None`` (zeros).
        output_final_state: return the final state ``[N, HV, K, V]`` (else ``None``).
        cu_seqlens: int64 ``[N + 1]`` boundaries of packed sequences (requires ``B == 1``).

    Returns ``(o [B, T, HV, V], final_state or None)``, float64 on ``q``'s device (the other
    tensor arguments are moved there).
    """
    fn = "dplr_recurrence"
    d = _check_qkv(fn, q, k, v)
    _check_shape(fn, "log_decay", log_decay, (d.B, d.T, d.HV, d.K), "[B, T, HV, K]")
    if (a is None) != (b is None):
        raise ValueError(f"{fn}: a and b must be given together (or both None for no rank-1 part)")
    if a is not None:
        _check_key_side(fn, "a", a, d)
        _check_key_side(fn, "b", b, d)
    if write_key is not None:
        _check_key_side(fn, "write_key", write_key, d)
    s = _check_scale(fn, scale, d.K)
    bounds = _check_state_and_seqlens(fn, d, initial_state, cu_seqlens)

    dev = q.device
    qe, ke = _expand_heads(_f64(q, dev), d.HV), _expand_heads(_f64(k, dev), d.HV)
    ae, be = _expand_heads(_f64(a, dev), d.HV), _expand_heads(_f64(b, dev), d.HV)
    we = _expand_heads(_f64(write_key, dev), d.HV) if write_key is not None else ke
    tensors = [qe, ke, _f64(v, dev), _f64(log_decay, dev), ae, be, we]
    return _per_sequence(_recurrence_core(s), tensors, d, initial_state, bounds, output_final_state)


# ----------------------------------------------------------------------------------------------
# recurrent members
# ----------------------------------------------------------------------------------------------


def _kda_via_dplr(q, k, v, g, beta, d, scale, initial_state, output_final_state, cu_seqlens):
    dev = q.device
    ke = _expand_heads(_f64(k, dev), d.HV)
    g64, beta64 = _f64(g, dev), _f64(beta, dev)
    bk = beta64.unsqueeze(-1) * ke
    return dplr_recurrence(
        q, k, v, g64,
        a=bk,
        b=torch.exp(g64) * ke,
        write_key=bk,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
    )


def naive_recurrent_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """KDA, token by token: ``S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T``.

    ``g: [B, T, HV, K]`` per-channel log decay (<= 0, not cumulated), ``beta: [B, T, HV]``.
    """
    fn = "naive_recurrent_kda"
    d = _check_qkv(fn, q, k, v)
    _check_shape(fn, "g", g, (d.B, d.T, d.HV, d.K), "[B, T, HV, K]")
    _check_shape(fn, "beta", beta, (d.B, d.T, d.HV), "[B, T, HV]")
    _check_scale(fn, scale, d.K)
    _check_state_and_seqlens(fn, d, initial_state, cu_seqlens)
    return _kda_via_dplr(q, k, v, g, beta, d, scale, initial_state, output_final_state, cu_seqlens)


def naive_recurrent_gdn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Gated DeltaNet: KDA with one scalar log decay per head and token, ``g: [B, T, HV]``."""
    fn = "naive_recurrent_gdn"
    d = _check_qkv(fn, q, k, v)
    _check_shape(fn, "g", g, (d.B, d.T, d.HV), "[B, T, HV]")
    _check_shape(fn, "beta", beta, (d.B, d.T, d.HV), "[B, T, HV]")
    _check_scale(fn, scale, d.K)
    _check_state_and_seqlens(fn, d, initial_state, cu_seqlens)
    gk = _f64(g, q.device).unsqueeze(-1).expand(d.B, d.T, d.HV, d.K)
    return _kda_via_dplr(q, k, v, gk, beta, d, scale, initial_state, output_final_state, cu_seqlens)


def naive_recurrent_deltanet(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """DeltaNet: ``S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`` (KDA with g = 0)."""
    fn = "naive_recurrent_deltanet"
    d = _check_qkv(fn, q, k, v)
    _check_shape(fn, "beta", beta, (d.B, d.T, d.HV), "[B, T, HV]")
    _check_scale(fn, scale, d.K)
    _check_state_and_seqlens(fn, d, initial_state, cu_seqlens)
    g0 = torch.zeros(d.B, d.T, d.HV, d.K, dtype=_F64, device=q.device)
    return _kda_via_dplr(q, k, v, g0, beta, d, scale, initial_state, output_final_state, cu_seqlens)


def naive_recurrent_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Gated linear attention: ``S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T``, ``g: [B, T, HV, K]``."""
    fn = "naive_recurrent_gla"
    d = _check_qkv(fn, q, k, v)
    _check_shape(fn, "g", g, (d.B, d.T, d.HV, d.K), "[B, T, HV, K]")
    _check_scale(fn, scale, d.K)
    _check_state_and_seqlens(fn, d, initial_state, cu_seqlens)
    return dplr_recurrence(
        q, k, v, g,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
    )


def naive_recurrent_dplr(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    g: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """General DPLR: ``S_t = (Diag(exp g_t) - a_t b_t^T) S_{t-1} + k_t v_t^T``.

    ``a, b, g: [B, T, HV, K]``.  Note the sign: the rank-1 term is *subtracted* (so KDA is
    ``a = beta k``, ``b = exp(g) * k``), and it acts on the undecayed previous state.
    """
    fn = "naive_recurrent_dplr"
    d = _check_qkv(fn, q, k, v)
    _check_shape(fn, "a", a, (d.B, d.T, d.HV, d.K), "[B, T, HV, K]")
    _check_shape(fn, "b", b, (d.B, d.T, d.HV, d.K), "[B, T, HV, K]")
    _check_shape(fn, "g", g, (d.B, d.T, d.HV, d.K), "[B, T, HV, K]")
    _check_scale(fn, scale, d.K)
    _check_state_and_seqlens(fn, d, initial_state, cu_seqlens)
    return dplr_recurrence(
        q, k, v, g, a, b,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
    )


# ----------------------------------------------------------------------------------------------
# chunkwise references
# ----------------------------------------------------------------------------------------------


def _chunk_core(scale: float, chunk_size: int, delta: bool):
    """Chunkwise KDA (``delta=True``) or GLA (``delta=False``) over one [N, T', ...] slice."""

    def core(tensors: Sequence[Optional[Tensor]], S: Tensor) -> Tuple[Tensor, Tensor]:
        q, k, v, g, beta = tensors
        # head-first: q, k, g [N, HV, T, K]; v [N, HV, T, V]; beta [N, HV, T]
        q, k, v, g = (x.transpose(1, 2) for x in (q, k, v, g))
        beta = beta.transpose(1, 2) if beta is not None else None
        T = q.shape[2]
        outs = []
        for s in range(0, T, chunk_size):
            e = min(s + chunk_size, T)
            n = e - s
            qc, kc, vc, gc = q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], g[:, :, s:e]
            G = gc.cumsum(dim=-2)  # inclusive cumsum within the chunk, per channel
            Gamma = torch.exp(G)
            idx = torch.arange(n, device=q.device)
            lower_incl = idx[:, None] >= idx[None, :]  # j <= i
            lower_strict = idx[:, None] > idx[None, :]  # j < i
            # exp(G_id - G_jd) for j <= i; entries above the diagonal are masked *before* exp so
            # they can neither overflow nor leak NaN gradients.
            dG = G.unsqueeze(-2) - G.unsqueeze(-3)  # [N, HV, n(i), n(j), K]
            zero = torch.zeros((), dtype=q.dtype, device=q.device)
            decay = torch.exp(torch.where(lower_incl[..., None], dG, zero))
            A_qk = scale * torch.einsum("nhid,nhjd,nhijd->nhij", qc, kc, decay)
            A_qk = torch.where(lower_incl, A_qk, zero)
            if delta:
                bc = beta[:, :, s:e]
                A_kk = bc.unsqueeze(-1) * torch.einsum("nhid,nhjd,nhijd->nhij", kc, kc, decay)
                A_kk = torch.where(lower_strict, A_kk, zero)
                eye = torch.eye(n, dtype=q.dtype, device=q.device)
                # T = (I + A_kk)^{-1} Diag(beta)
                Tm = torch.linalg.solve_triangular(eye + A_kk, torch.diag_embed(bc), upper=False, unitriangular=True)
                W = Tm @ (Gamma * kc)
                U = Tm @ vc
                Vp = U - W @ S
            else:
                Vp = vc
            outs.append(scale * (qc * Gamma) @ S + A_qk @ Vp)
            G_n = G[:, :, -1:, :]  # [N, HV, 1, K]
            S = torch.exp(G_n).transpose(-1, -2) * S + (kc * torch.exp(G_n - G)).transpose(-1, -2) @ Vp
        if outs:
            o = torch.cat(outs, dim=2).transpose(1, 2)
        else:
            o = v.new_zeros(v.shape).transpose(1, 2)
        return o, S

    return core


def naive_chunk_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    chunk_size: int = 64,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Chunkwise KDA in float64 (the WY / UT-transform form), ``g: [B, T, HV, K]``, ``beta: [B, T, HV]``.

    Per chunk of ``n <= chunk_size`` tokens with ``G`` the inclusive in-chunk cumsum of ``g`` and
    ``Gamma = exp(G)``::

        A_kk[i,j] = beta_i sum_d k_id k_jd exp(G_id - G_jd)       (j < i)
        A_qk[i,j] = scale sum_d q_id k_jd exp(G_id - G_jd)        (j <= i)
        T  = (I + A_kk)^{-1} Diag(beta);  W = T (Gamma * K);  U = T V;  V' = U - W S
        O  = scale (Q * Gamma) S + A_qk V'
        S <- Diag(Gamma_n) S + (K * exp(G_n - G))^T V'
    """
    fn = "naive_chunk_kda"
    d = _check_qkv(fn, q, k, v)
    _check_shape(fn, "g", g, (d.B, d.T, d.HV, d.K), "[B, T, HV, K]")
    _check_shape(fn, "beta", beta, (d.B, d.T, d.HV), "[B, T, HV]")
    C = _check_chunk_size(fn, chunk_size)
    s = _check_scale(fn, scale, d.K)
    bounds = _check_state_and_seqlens(fn, d, initial_state, cu_seqlens)
    dev = q.device
    tensors = [
        _expand_heads(_f64(q, dev), d.HV),
        _expand_heads(_f64(k, dev), d.HV),
        _f64(v, dev),
        _f64(g, dev),
        _f64(beta, dev),
    ]
    return _per_sequence(_chunk_core(s, C, delta=True), tensors, d, initial_state, bounds, output_final_state)


def naive_chunk_gdn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    chunk_size: int = 64,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Chunkwise gated DeltaNet (``g: [B, T, HV]``) through :func:`naive_chunk_kda`."""
    fn = "naive_chunk_gdn"
    d = _check_qkv(fn, q, k, v)
    _check_shape(fn, "g", g, (d.B, d.T, d.HV), "[B, T, HV]")
    _check_shape(fn, "beta", beta, (d.B, d.T, d.HV), "[B, T, HV]")
    gk = _f64(g, q.device).unsqueeze(-1).expand(d.B, d.T, d.HV, d.K)
    return naive_chunk_kda(q, k, v, gk, beta, chunk_size, scale, initial_state, output_final_state, cu_seqlens)


def naive_chunk_deltanet(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    chunk_size: int = 64,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Chunkwise DeltaNet (g = 0) through :func:`naive_chunk_kda`."""
    fn = "naive_chunk_deltanet"
    d = _check_qkv(fn, q, k, v)
    _check_shape(fn, "beta", beta, (d.B, d.T, d.HV), "[B, T, HV]")
    g0 = torch.zeros(d.B, d.T, d.HV, d.K, dtype=_F64, device=q.device)
    return naive_chunk_kda(q, k, v, g0, beta, chunk_size, scale, initial_state, output_final_state, cu_seqlens)


def naive_chunk_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    chunk_size: int = 64,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Chunkwise GLA in float64: ``O = scale (Q * Gamma) S + A_qk V``,
    ``S <- Diag(Gamma_n) S + (K * exp(G_n - G))^T V`` with ``A_qk`` as in :func:`naive_chunk_kda`."""
    fn = "naive_chunk_gla"
    d = _check_qkv(fn, q, k, v)
    _check_shape(fn, "g", g, (d.B, d.T, d.HV, d.K), "[B, T, HV, K]")
    C = _check_chunk_size(fn, chunk_size)
    s = _check_scale(fn, scale, d.K)
    bounds = _check_state_and_seqlens(fn, d, initial_state, cu_seqlens)
    dev = q.device
    tensors = [
        _expand_heads(_f64(q, dev), d.HV),
        _expand_heads(_f64(k, dev), d.HV),
        _f64(v, dev),
        _f64(g, dev),
        None,
    ]
    return _per_sequence(_chunk_core(s, C, delta=False), tensors, d, initial_state, bounds, output_final_state)


# ----------------------------------------------------------------------------------------------
# gate
# ----------------------------------------------------------------------------------------------


def kda_gate(
    g_raw: Tensor,
    A_log: Tensor,
    dt_bias: Optional[Tensor] = None,
    lower_bound: Optional[float] = None,
) -> Tensor:
    """KDA's gate (FLA's fused in-kernel form), float64 ``[B, T, HV, K]`` on ``g_raw``'s device.

    * with ``lower_bound`` (a negative float): ``g = lower_bound * sigmoid(exp(A_log[h]) * (g_raw + dt_bias))``,
      which lies in ``[lower_bound, 0)``;
    * without: ``g = -exp(A_log[h]) * softplus(g_raw + dt_bias)``, which is ``<= 0``.

    ``g_raw: [B, T, HV, K]``, ``A_log: [HV]``, ``dt_bias: [HV * K]`` (``[HV, K]`` also accepted).
    """
    fn = "kda_gate"
    _need_tensor(fn, "g_raw", g_raw, 4, "[B, T, HV, K]")
    B, T, HV, K = g_raw.shape
    _check_shape(fn, "A_log", A_log, (HV,), "[HV]")
    if dt_bias is not None:
        if not isinstance(dt_bias, torch.Tensor) or not dt_bias.is_floating_point():
            raise ValueError(f"{fn}: dt_bias must be a real floating-point tensor of shape [HV * K] = [{HV * K}]")
        if tuple(dt_bias.shape) not in {(HV * K,), (HV, K)}:
            raise ValueError(f"{fn}: dt_bias must have shape [HV * K] = ({HV * K},) (or [HV, K]), got {tuple(dt_bias.shape)}")
    if lower_bound is not None:
        if isinstance(lower_bound, bool) or not isinstance(lower_bound, numbers.Real):
            raise ValueError(f"{fn}: lower_bound must be a negative float or None, got {lower_bound!r}")
        if not (math.isfinite(float(lower_bound)) and float(lower_bound) < 0):
            raise ValueError(f"{fn}: lower_bound must be a finite negative float, got {lower_bound!r}")

    dev = g_raw.device
    x = _f64(g_raw, dev)
    if dt_bias is not None:
        x = x + _f64(dt_bias, dev).reshape(HV, K)
    A = torch.exp(_f64(A_log, dev)).reshape(HV, 1)
    if lower_bound is not None:
        return float(lower_bound) * torch.sigmoid(A * x)
    # softplus(x) = log(1 + e^x) = logaddexp(x, 0), exact in float64 (no linear cut-off)
    return -A * torch.logaddexp(x, torch.zeros((), dtype=_F64, device=dev))
