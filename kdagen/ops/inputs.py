"""What the public ops do with their arguments before any kernel: validation (every bad input
becomes a ValueError/TypeError that names the argument and what was expected), the spec
that FLA's gate flags describe, and the pre-processing FLA performs on the host (l2-norm,
beta sigmoid)."""
from __future__ import annotations

import inspect
import os
import textwrap
import warnings
from dataclasses import dataclass
from functools import lru_cache, wraps

import sympy as sp
import torch

from .. import spec as S
from ..codegen.lower import MAX_HEAD_DIM, head_dim_error
from ..dtypes import TORCH_DTYPES

# Keywords fused_recurrent_kda takes through **kwargs for drop-in use (FLA 0.6.0's recurrent op
# swallows any keyword): they change nothing in its computation.  ``cp_context`` must be None;
# ``inplace_final_state`` (FLA's fused_recurrent_kda_fwd, as vLLM calls it) must be True with a state pool
# (kdagen updates a pool in place) and is not read otherwise.
RECURRENT_IGNORED_KWARGS = ("disable_recompute", "use_graph", "max_num_seqs", "cp_context", "inplace_final_state")


@dataclass(frozen=True)
class Dims:
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    N: int  # number of sequences

    def decode_shape(self, state_v_first: bool, pool_slots: int = 0, state_indices=None) -> dict:
        """The shape a recurrent-form call's config is resolved for (kdagen.cache.lookup.resolve):
        tokens, batch, sequences, value heads, the state's layout and the state pool's slots (0
        without a pool); with a 2-D ``state_indices`` (speculative decoding: a slot per token, another
        kernel) also "token_slots", which keeps the call's bucket apart (kdagen.cache.keys.call_bucket)."""
        shape = {"T": self.T, "B": self.B, "N": self.N, "HV": self.HV, "state_v_first": state_v_first,
                 "P": pool_slots}
        if state_indices is not None and state_indices.dim() == 2:
            shape["token_slots"] = True
        return shape


def _tensor(name, x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _float(name, x):
    if x.dtype not in TORCH_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")


def check_inputs(q, k, v, g, beta, *, scale, initial_state, cu_seqlens, state_indices=None,
                 A_log=None, dt_bias=None, gate_in_kernel=False, cu_seqlens_cpu=None,
                 sync_seqlens: bool = True, state_v_first: bool = False,
                 decay: str = "channel", rank1: bool = True, max_head_dim: int = MAX_HEAD_DIM,
                 member: str = "", accepted=None) -> tuple[Dims, list[int] | None]:
    """Validate the arguments of chunk_kda / fused_recurrent_kda from their shapes, dtypes and
    devices (no values are read from the device, except as ``sync_seqlens`` says).

    Returns the dimensions and, with cu_seqlens, its values on the host as
    :func:`host_seqlens` gives them (None when they would need a device read and
    ``sync_seqlens`` is False: the decode path, which never synchronises).  ``state_v_first``:
    the initial state (or pool) is [.., HV, V, K] instead of [.., HV, K, V].  ``decay``: the
    spec's decay kind, which sets g's layout: [B, T, HV, K] ('channel'), [B, T, HV] ('scalar'),
    no g at all ('identity': g must be None).  ``rank1`` False: the recurrence has no rank-1 part
    (GLA's), so it takes no beta (beta must be None).  ``max_head_dim``: the widest K and V the
    recurrence's kernels take (:func:`kdagen.codegen.lower.spec_max_head_dim`), named in the error
    as ``member``'s limit.

    ``state_indices`` (a pool's slots): [N], one per sequence, or [N, T_max] (speculative decoding: one
    per token, :func:`check_token_slots`), with ``accepted`` (``num_accepted_tokens`` [N]) only beside
    the 2-D form."""
    if not rank1 and beta is not None:
        raise ValueError("this recurrence has no rank-1 (delta) part, so it takes no beta; pass beta=None")
    if decay == "identity" and g is not None:
        raise ValueError("this recurrence has no decay, so it takes no gate g; pass g=None")
    tensors = ((("q", q), ("k", k), ("v", v)) + ((("g", g),) if decay != "identity" else ())
               + ((("beta", beta),) if rank1 else ()))
    for name, x in tensors:
        _tensor(name, x)
        _float(name, x)
    if q.dim() != 4:
        raise ValueError(f"q must have shape [B, T, H, K], got {tuple(q.shape)}")
    B, T, H, K = q.shape
    if tuple(k.shape) != (B, T, H, K):
        raise ValueError(f"k must have the shape of q, [B, T, H, K] = {(B, T, H, K)}, got {tuple(k.shape)}")
    if v.dim() != 4 or tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v must have shape [B, T, HV, V] = [{B}, {T}, HV, V], got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if HV % H != 0 or HV == 0:
        raise ValueError(f"v has HV={HV} heads, which must be a positive multiple of q/k's H={H} heads (GVA)")
    if decay == "channel" and tuple(g.shape) != (B, T, HV, K):
        raise ValueError(f"g must have shape [B, T, HV, K] = {(B, T, HV, K)}, got {tuple(g.shape)}")
    if decay == "scalar" and tuple(g.shape) != (B, T, HV):
        raise ValueError(f"g must have shape [B, T, HV] = {(B, T, HV)} (one log decay per token and value "
                         f"head), got {tuple(g.shape)}")
    if rank1 and tuple(beta.shape) != (B, T, HV):
        raise ValueError(f"beta must have shape [B, T, HV] = {(B, T, HV)}, got {tuple(beta.shape)}")
    if not (k.dtype == q.dtype and v.dtype == q.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    why = head_dim_error(K, V, max_head_dim, member)
    if why:
        raise ValueError(why)
    dev = q.device
    for name, x in tensors[1:]:
        if x.device != dev:
            raise ValueError(f"{name} is on {x.device} but q is on {dev}; all inputs must share a device")
    if scale is not None and not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if T == 0 or B == 0:
        raise ValueError(f"q has an empty batch or sequence dimension: shape {tuple(q.shape)}")

    seqlens = None
    if cu_seqlens is not None:
        _tensor("cu_seqlens", cu_seqlens)
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"cu_seqlens must be a 1-D int32/int64 tensor, got {cu_seqlens.dtype} "
                            f"of shape {tuple(cu_seqlens.shape)}")
        if B != 1:
            raise ValueError(f"cu_seqlens packs sequences along T and needs B == 1, got B={B}; "
                             "flatten the batch first")
        if cu_seqlens.numel() < 2:
            raise ValueError("cu_seqlens must have at least 2 entries ([0, ..., T])")
        if cu_seqlens.device != dev and cu_seqlens.device.type != "cpu":
            raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but the inputs are on {dev}")
        seqlens = host_seqlens(cu_seqlens, T, cu_seqlens_cpu, sync=sync_seqlens)
        N = cu_seqlens.numel() - 1
    else:
        N = B

    if state_indices is not None:
        _tensor("state_indices", state_indices)
        if (state_indices.dim() not in (1, 2) or state_indices.shape[0] != N
                or state_indices.dtype not in (torch.int32, torch.int64)):
            raise ValueError(f"state_indices must be an int32/int64 tensor of {N} slots (one per sequence), [N], or "
                             f"[N, T_max] (speculative decoding: a slot per token), got {state_indices.dtype} of "
                             f"shape {tuple(state_indices.shape)}")
        if state_indices.device != dev:
            raise ValueError(f"state_indices is on {state_indices.device} but the inputs are on {dev}")
        if initial_state is None:
            raise ValueError("state_indices addresses rows of a state pool: pass the pool as initial_state")
    check_token_slots(state_indices, accepted, N=N, T=T, packed=cu_seqlens is not None, seqlens=seqlens)
    if initial_state is not None:
        _tensor("initial_state", initial_state)
        _float("initial_state", initial_state)
        rows = initial_state.shape[0] if initial_state.dim() == 4 else None
        want_rows = rows if state_indices is not None else N
        tail, names = ((V, K), "V, K") if state_v_first else ((K, V), "K, V")
        if initial_state.dim() != 4 or tuple(initial_state.shape) != (want_rows, HV, *tail):
            what = (f"[P, HV, {names}] (a state pool)" if state_indices is not None
                    else f"[N, HV, {names}] = {(N, HV, *tail)}")
            layout = " (state_v_first=True)" if state_v_first else ""
            raise ValueError(f"initial_state must have shape {what}{layout}, got {tuple(initial_state.shape)}")
        if initial_state.device != dev:
            raise ValueError(f"initial_state is on {initial_state.device} but the inputs are on {dev}")
        if not initial_state.is_contiguous():
            raise ValueError("initial_state must be contiguous")
    if gate_in_kernel:
        if A_log is not None:
            _tensor("A_log", A_log)
            if A_log.numel() != HV:
                raise ValueError(f"A_log must have {HV} entries (one per value head), got shape {tuple(A_log.shape)}")
            if A_log.device != dev:
                raise ValueError(f"A_log is on {A_log.device} but the inputs are on {dev}")
        if dt_bias is not None:
            _tensor("dt_bias", dt_bias)
            if dt_bias.numel() != HV * K and not (decay == "scalar" and dt_bias.numel() == HV):
                want = f"HV = {HV} (one per value head) or HV*K = {HV * K}" if decay == "scalar" else f"HV*K = {HV * K}"
                raise ValueError(f"dt_bias must have {want} entries, got shape {tuple(dt_bias.shape)}")
            if dt_bias.device != dev:
                raise ValueError(f"dt_bias is on {dt_bias.device} but the inputs are on {dev}")
    elif A_log is not None or dt_bias is not None:
        raise ValueError("A_log/dt_bias are only used with use_gate_in_kernel=True")
    return Dims(B, T, H, HV, K, V, N), seqlens


def check_token_slots(state_indices, accepted, *, N: int, T: int, packed: bool, seqlens) -> None:
    """Speculative decoding's arguments (FLA's fused_recurrent_kda_fwd): ``state_indices`` [N, T_max], a
    pool slot for every token (token t of sequence n writes its state to slot [n, t]), and ``accepted``
    (``num_accepted_tokens`` [N], int32/int64 on the inputs' device; sequence n starts from slot
    [n, accepted[n] - 1]; without it, from slot [n, 0]).  T_max must cover the longest sequence where that is
    known without reading the device: T tokens each without cu_seqlens, the host offsets (``seqlens``) with
    them.  The values of ``accepted`` are read only by the opt-in value check (:mod:`kdagen.ops.checks`)."""
    two_d = state_indices is not None and state_indices.dim() == 2
    if accepted is not None:
        _tensor("num_accepted_tokens", accepted)
        if not two_d:
            raise ValueError("num_accepted_tokens (speculative decoding) picks each sequence's starting slot in a "
                             "2-D ssm_state_indices [N, T_max] (a slot per token); pass one, with the pool as "
                             "initial_state")
        if (accepted.dim() != 1 or accepted.numel() != N or accepted.dtype not in (torch.int32, torch.int64)):
            raise ValueError(f"num_accepted_tokens must be a 1-D int32/int64 tensor of {N} counts (one per "
                             f"sequence), got {accepted.dtype} of shape {tuple(accepted.shape)}")
        if accepted.device != state_indices.device:
            raise ValueError(f"num_accepted_tokens is on {accepted.device} but the inputs are on "
                             f"{state_indices.device}")
        if not accepted.is_contiguous():
            raise ValueError("num_accepted_tokens must be contiguous (the kernel reads it with stride 1)")
    if not two_d:
        return
    width = state_indices.shape[1]
    if not packed:
        longest, how = T, "each sequence's T"
    elif seqlens is not None:
        longest, how = max(b - a for a, b in zip(seqlens, seqlens[1:])), "the longest sequence of cu_seqlens"
    else:
        return  # (device offsets: tokens past column T_max - 1 store nothing; the value check names them)
    if width < longest:
        raise ValueError(f"ssm_state_indices [N, T_max] = {tuple(state_indices.shape)} is narrower than "
                         f"{how} ({longest} tokens): every token needs a slot for its state")


def check_rank1_vectors(q, v, a, b, gate=None, gate_name: str = "g") -> None:
    """General DPLR's read and write vectors a, b (and its per-channel gate, by ``gate_name``):
    tensors of float32/float16/bfloat16, [B, T, HV, K] (value heads, as the gate) on q's device.
    Called after :func:`check_inputs` has checked q and v."""
    B, T, _, K = q.shape
    HV = v.shape[2]
    for name, x in (((gate_name, gate),) if gate is not None else ()) + (("a", a), ("b", b)):
        _tensor(name, x)
        _float(name, x)
        if tuple(x.shape) != (B, T, HV, K):
            raise ValueError(f"{name} must have shape [B, T, HV, K] = {(B, T, HV, K)}, got {tuple(x.shape)}")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}; all inputs must share a device")


def host_seqlens(cu_seqlens: torch.Tensor, T: int, cu_seqlens_cpu=None, *, sync: bool = True) -> list[int] | None:
    """cu_seqlens's values on the host, checked (starts at 0, non-decreasing, ends at T).

    Read from ``cu_seqlens_cpu`` when the caller gives it (FLA's keyword: the same offsets on
    the host, so nothing is read from the device; that they equal cu_seqlens is the caller's
    promise), else from cu_seqlens itself when it lives on the host (free).  A device
    cu_seqlens is read only with ``sync=True``: one device-to-host copy, which waits for the
    device and cannot be captured in a CUDA graph; with ``sync=False`` it gives None."""
    if cu_seqlens_cpu is not None:
        if isinstance(cu_seqlens_cpu, torch.Tensor):
            if cu_seqlens_cpu.device.type != "cpu":
                raise ValueError(f"cu_seqlens_cpu must be on the host (the CPU), got {cu_seqlens_cpu.device}")
            seqlens = cu_seqlens_cpu.tolist()
        else:
            seqlens = [int(x) for x in cu_seqlens_cpu]
        if len(seqlens) != cu_seqlens.numel():
            raise ValueError(f"cu_seqlens_cpu has {len(seqlens)} entries but cu_seqlens has {cu_seqlens.numel()}")
    elif cu_seqlens.device.type == "cpu" or sync:
        seqlens = cu_seqlens.tolist()
    else:
        return None
    name = "cu_seqlens_cpu" if cu_seqlens_cpu is not None else "cu_seqlens"
    if seqlens[0] != 0:
        raise ValueError(f"{name} must start at 0, got {seqlens[0]}")
    if any(b < a for a, b in zip(seqlens, seqlens[1:])):
        raise ValueError(f"{name} must be non-decreasing, got {seqlens}")
    if seqlens[-1] != T:
        raise ValueError(f"{name} must end at T={T} (the packed length), got {seqlens[-1]}")
    return seqlens


def check_runnable(q: torch.Tensor) -> None:
    """Before launching: Triton kernels run on CUDA tensors, or on CPU tensors in Triton's
    interpreter.  (Describing launches for compile-only checks needs neither.)"""
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"q is on {q.device}: kdagen's kernels run on CUDA tensors (for the CPU, run Triton's "
                         "interpreter: set TRITON_INTERPRET=1 before importing triton)")


def gate_choice(use_gate_in_kernel: bool, safe_gate: bool, lower_bound: float | None, has_A: bool,
                has_bias: bool) -> tuple[str, float | None, bool, bool]:
    """Which KDA gate FLA's flags describe, without sympy: (gate, bound, has A_log, has dt_bias)
    with gate "direct", "lower_bound" or "softplus" (:func:`select_spec` builds its spec; an
    exported package looks its specs up by it)."""
    if lower_bound is not None and not lower_bound < 0:
        raise ValueError(f"lower_bound must be negative, got {lower_bound}")
    if not use_gate_in_kernel:
        return "direct", ((-5.0 if lower_bound is None else lower_bound) if safe_gate else None), False, False
    if lower_bound is not None:
        return "lower_bound", lower_bound, bool(has_A), bool(has_bias)
    if not has_A:
        raise ValueError("use_gate_in_kernel without lower_bound needs A_log (the softplus gate's rate)")
    return "softplus", None, True, bool(has_bias)


@lru_cache(maxsize=64)
def select_spec(use_gate_in_kernel: bool, safe_gate: bool, lower_bound: float | None,
                has_A: bool, has_bias: bool) -> S.Recurrence:
    """The KDA spec FLA's flags describe (:func:`gate_choice`).

    - g given (default): the direct gate; ``safe_gate=True`` promises g >= lower_bound
      (default -5), which lets the diagonal tiles use tensor cores.
    - use_gate_in_kernel with lower_bound: g = lower_bound * sigmoid(exp(A_log) (z + dt_bias)).
    - use_gate_in_kernel without: g = -exp(A_log) * softplus(z + dt_bias).
    A missing A_log / dt_bias is substituted out of the expression (A_log=None -> rate 1).
    """
    name, bound, has_A, has_bias = gate_choice(use_gate_in_kernel, safe_gate, lower_bound, has_A, has_bias)
    if name == "direct":
        return S.kda(S.gate_direct(bound))
    gate = S.gate_lower_bound(bound) if name == "lower_bound" else S.gate_softplus()
    subs = {}
    if not has_A:
        subs[S.A_log] = 0
    if not has_bias:
        subs[S.dt_bias] = 0
    if subs:
        expr = gate.expr.subs(subs)
        params = tuple((s, lay) for s, lay in gate.params if s not in subs)
        gate = S.Gate(gate.name + ("" if has_A else "_noA") + ("" if has_bias else "_nobias"),
                      sp.simplify(expr), gate.raw, params, gate.constants)
    return S.kda(gate)


def check_beta_flags(use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool) -> None:
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval only takes effect with use_beta_sigmoid_in_kernel=True")


def preprocess(q, k, beta, use_qk_l2norm_in_kernel: bool, use_beta_sigmoid_in_kernel: bool,
               allow_neg_eigval: bool):
    """FLA's in-kernel flags applied as torch ops (autograd differentiates them)."""
    check_beta_flags(use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if use_qk_l2norm_in_kernel:
        q = torch.nn.functional.normalize(q.float(), p=2, dim=-1).to(q.dtype)
        k = torch.nn.functional.normalize(k.float(), p=2, dim=-1).to(k.dtype)
    if use_beta_sigmoid_in_kernel:
        beta = torch.sigmoid(beta.float()) * (2.0 if allow_neg_eigval else 1.0)
    return q, k, beta


def check_kwargs(op: str, kwargs: dict, ignored: tuple[str, ...] = ()) -> None:
    """Refuse keywords neither the op's signature nor ``ignored`` names (a TypeError, as Python's
    own), and a ``cp_context`` that is not None (context parallelism is not implemented)."""
    unknown = [k for k in kwargs if k not in ignored]
    if unknown:
        raise TypeError(f"{op}() got unexpected keyword argument(s) {unknown}")
    check_cp_context(op, kwargs.get("cp_context"))


def check_inplace_final_state(op: str, kwargs: dict, state_indices, initial_state) -> None:
    """FLA's ``inplace_final_state`` (its fused_recurrent_kda_fwd's keyword, True there by default): with a
    state pool kdagen always updates the pool in place, which is True's meaning; False with a pool (FLA then
    writes each token's state to a new [T, HV, K, V] tensor) and True without a pool (FLA then writes the final
    state over initial_state) are refused rather than answered differently."""
    if "inplace_final_state" not in kwargs:
        return
    value = kwargs["inplace_final_state"]
    if not isinstance(value, bool):
        raise TypeError(f"{op}: inplace_final_state must be a bool, got {type(value).__name__}")
    if value and state_indices is None and initial_state is not None:
        raise ValueError(f"{op}: inplace_final_state=True without ssm_state_indices (FLA writes the final state over "
                         "initial_state) is not supported; pass a pool with ssm_state_indices, or leave it False")
    if not value and state_indices is not None:
        raise ValueError(f"{op}: inplace_final_state=False with ssm_state_indices (FLA writes each token's state to a "
                         "new tensor) is not supported; kdagen updates the pool in place (inplace_final_state=True)")


def check_cp_context(op: str, cp_context) -> None:
    if cp_context is not None:
        raise ValueError(f"{op}: cp_context (FLA's context parallelism across devices) is not supported by kdagen; "
                         "only cp_context=None is accepted (run each rank's sequences as separate calls)")


def state_layout(op: str, state_v_first, kwargs: dict) -> bool:
    """``state_v_first``, or FLA's deprecated name for it, ``transpose_state_layout`` (taken out
    of ``kwargs`` with FLA's DeprecationWarning; both at once is FLA's ValueError)."""
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError(f"{op}: cannot pass both `state_v_first` and the deprecated `transpose_state_layout`")
        warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.", DeprecationWarning,
                      stacklevel=3)
        state_v_first = kwargs.pop("transpose_state_layout")
    if not isinstance(state_v_first, bool):
        raise TypeError(f"{op}: state_v_first must be a bool, got {type(state_v_first).__name__}")
    return state_v_first


def state_shape(N: int, HV: int, K: int, V: int, state_v_first: bool) -> tuple[int, int, int, int]:
    """The shape of N states: [N, HV, K, V], or [N, HV, V, K] with ``state_v_first``."""
    return (N, HV, V, K) if state_v_first else (N, HV, K, V)


# ------------------------------------------------------------------- input dtypes (FLA's mixes)

# The float inputs besides q, k, v (and a, b) that an op may take, by the names of its signatures.
_OTHER_FLOATS = ("g", "gk", "beta", "initial_state", "A_log", "dt_bias")


_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"  # Triton reads it once, when it is imported


def interpreting() -> bool:
    """Whether Triton's CPU interpreter runs the kernels (``TRITON_INTERPRET=1``, as Triton read it at import)."""
    return _INTERPRETING


def dtype_note(out_from: str, operands: tuple[str, ...]) -> str:
    """The docstring paragraphs :func:`fla_dtypes` adds to the op it wraps."""
    names = ", ".join(operands[:-1]) + " and " + operands[-1]
    paras = (
        f"Input dtypes, as FLA 0.6.0 takes them: {names} may mix float32, float16 and bfloat16.  They are "
        f"cast to one compute dtype, torch.promote_types of theirs (float16 with float32 computes in float32; "
        f"the cast is exact), before validation and planning, and o is returned in {out_from}'s dtype, as FLA "
        f"returns it.  Gradients come back in each input's own dtype (autograd through the cast).  The gate, "
        f"beta and the state keep their own dtypes, as the kernels read them.",
        "Under Triton's CPU interpreter (TRITON_INTERPRET=1), whose arithmetic on bfloat16 is wrong in Triton "
        "3.6, every bfloat16 input is replaced by a float32 copy (exact), and o is rounded to bfloat16 once, "
        "at the end; a bfloat16 state pool is updated through a float32 copy and rounded back in place.  That "
        "is the recurrence computed in float32, not the GPU's bf16 arithmetic: on a GPU the chunk kernels also "
        "round their dot operands and stored intermediates to bf16, so their error is larger "
        "(tests/bf16_interpreter.py emulates that rounding).")
    fill = lambda p: textwrap.fill(p, 100, initial_indent="    ", subsequent_indent="    ")  # noqa: E731
    return "".join("\n\n" + fill(p) for p in paras) + "\n"


def fla_dtypes(out_from: str, operands: tuple[str, ...] = ("q", "k", "v")):
    """Decorate a public op so it takes FLA's mixes of input dtypes.

    ``operands`` (q, k, v; with a, b for general DPLR) are cast to one compute dtype,
    ``torch.promote_types`` of theirs, before the op runs (validation and planning see one dtype);
    o, the first output, is cast to the dtype of ``out_from`` ("q" or "v", as FLA 0.6.0's op of that
    name returns it).  The casts are differentiable, so gradients reach each input in its own dtype.
    An ``out=`` of the result's dtype receives o by a copy when o had to be cast.

    Under Triton's interpreter a bfloat16 operand, g, beta, state, A_log or dt_bias is replaced by a
    float32 copy (the interpreter's bf16 arithmetic is wrong); a bf16 state pool (with
    ``ssm_state_indices``) is run on a float32 copy and copied back in place.  Inputs that are not
    float tensors pass through untouched, for the op's own validation to name them."""
    def deco(fn):
        params = list(inspect.signature(fn).parameters)
        named = operands + _OTHER_FLOATS + ("out", "ssm_state_indices")
        pos = {n: i for i, n in enumerate(params) if n in named}
        ops_pos = [pos[n] for n in operands]
        out_at = operands.index(out_from)

        def get(args, kwargs, name):
            i = pos.get(name)
            return args[i] if i is not None and i < len(args) else kwargs.get(name)

        where = tuple(zip(ops_pos, operands))

        @wraps(fn)
        def wrapper(*args, **kwargs):
            na = len(args)
            try:
                xs = [args[i] if i < na else kwargs[n] for i, n in where]
                d0 = xs[0].dtype
                same = True
                for x in xs:
                    if x.dtype is not d0:
                        same = False
            except (KeyError, AttributeError):  # missing or not a tensor: the op says what is wrong
                return fn(*args, **kwargs)
            # one dtype: the op as it is (a decode step's path: nothing else is looked at on a GPU)
            if same and (not interpreting() or d0 is not torch.bfloat16 and not any(
                    isinstance(t := get(args, kwargs, n), torch.Tensor) and t.dtype is torch.bfloat16
                    for n in _OTHER_FLOATS)):
                return fn(*args, **kwargs)
            dts = [x.dtype for x in xs]
            if not all(d in TORCH_DTYPES for d in dts):
                return fn(*args, **kwargs)
            return _call_cast(fn, args, kwargs, xs, dts, out_at, pos)

        wrapper.__doc__ = (fn.__doc__ or "").rstrip() + dtype_note(out_from, operands)
        return wrapper

    def _call_cast(fn, args, kwargs, xs, dts, out_at, pos):
        interp = interpreting()
        cdt = dts[0]
        for d in dts[1:]:
            cdt = torch.promote_types(cdt, d)
        if interp and cdt is torch.bfloat16:
            cdt = torch.float32
        args, kwargs = list(args), dict(kwargs)

        def get(name):
            i = pos.get(name)
            return args[i] if i is not None and i < len(args) else kwargs.get(name)

        def put(name, value):
            i = pos.get(name)
            if i is not None and i < len(args):
                args[i] = value
            else:
                kwargs[name] = value

        for n, x in zip(operands, xs):
            put(n, x.to(cdt))
        pool = pool32 = None
        if interp:
            for n in _OTHER_FLOATS:
                t = get(n)
                if isinstance(t, torch.Tensor) and t.dtype is torch.bfloat16:
                    put(n, t.float())
                    if n == "initial_state" and get("ssm_state_indices") is not None:
                        pool, pool32 = t, get(n)  # updated in place: run on the copy, copy back
        out_dtype = dts[out_at]
        out = get("out")
        if isinstance(out, torch.Tensor) and out.dtype == out_dtype != cdt:
            put("out", None)  # o is computed in cdt, then copied there
        else:
            out = None
        res = fn(*args, **kwargs)
        o = res[0] if res[0].dtype == out_dtype else res[0].to(out_dtype)
        if out is not None:
            out.copy_(o)
            o = out
        rest = res[1:]
        if pool is not None:
            pool.copy_(pool32)
            rest = tuple(pool if r is pool32 else r for r in rest)
        return (o, *rest)

    return deco
