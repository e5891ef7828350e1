"""The backward of `chunk_kda`: three launches (four with ``intra_split``) after the forward's
intermediates are at hand.

0. (``store_intermediates=False``, the default) chunk_bwd_rerun rebuilds qg, kg, W and G_n
   from the inputs and the two [C, C]-per-row tiles the training forward kept, A_qk and T
   (grid: chunks x value heads x K tiles; no inverse is redone); with
   ``store_intermediates=True`` the forward keeps all of them.  General DPLR re-runs its
   forward's intra launch instead.
1. reverse state pass (grid: V tiles x sequences x value heads) walks the chunks of each
   sequence last to first with dS in registers; writes dU, dh0 and dS per chunk (dhs).
2. chunk-parallel products over V (grid: chunks x value heads x K tiles) from the stored
   states, dhs and V' (which the forward's state pass also writes when training): dqg, dkg,
   dW, dA_qk and dgamma_n, written once.
3. intra-chunk gradients (grid: chunks x value heads) recompute G, A_kk, (I + A_kk)^-1 from
   q, k, g, beta and write dq, dk (per value head), dv, dbeta and dg (dz for an in-kernel
   gate, plus per-chunk partials of dA_log / ddt_bias).  With ``intra_split`` two launches:
   chunk_bwd_wy (dv, dbeta, and dE and T for the next), then dq, dk, dg per K tile.  Without a
   decay (or with a scalar one given as g) and with ``intra_fold`` (ChunkBwdConfig.folds_intra) the second
   is folded away: launch 2 finishes dq and writes dk's A_qk part (fp32) and its share of dg's sums,
   chunk_bwd_wy adds dk's rank-1 part and takes dg's cumsums.

Only the sequential recurrence is in launch 1 (three dots per chunk); everything that can
run per chunk is in 2 and 3.  What is left to torch: the GVA sum of dq/dk over the value
heads sharing a q/k head, the sums of the gate-parameter partials, and dtype casts.  The
forward saves its inputs (after the host pre-processing, which autograd differentiates) and
the state entering every chunk, [NT_total, HV, K, V], in ``ChunkBwdConfig.state_dtype``.
The autograd Function that calls this module is in :mod:`kdagen.ops.chunk`.  A general DPLR
plan (``plan.structure == "dplr"``) runs the same three launches from its own templates' branches
and intra kernel (:mod:`kdagen.ops.dplr_bwd`), after the same re-run of the forward's intra launch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import triton

from ..codegen.lower import Plan
from ..config import ChunkBwdConfig
from ..kernels import Launch, build, dummy_pointer, has_repair
from .dplr_bwd import DPLR_KEPT_INTERMEDIATES, run_dplr_bwd
from .inputs import Dims, state_shape

INTERMEDIATES = ("qg", "kg", "w", "u", "aqk", "gn")  # what the forward's intra launch writes
KEPT_INTERMEDIATES = ("qg", "kg", "w", "aqk", "gn")  # what the backward reads (V' replaces U)
RERUN_SAVED = ("aqk", "td")  # what recompute mode keeps for chunk_bwd_rerun (td: T, the forward's STORE_T)
INPUT_NAMES = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")
# general DPLR's forward (plan.structure == "dplr") also reads a and b (no beta) and writes aqv and kgv
DPLR_INPUT_NAMES = ("a", "b")
DPLR_INTERMEDIATES = ("aqv", "kgv")


@dataclass(frozen=True)
class BwdMeta(Dims):
    """What the backward needs besides tensors (kept on the autograd ctx): the call's dimensions
    and these."""

    NT: int  # chunks per sequence (fixed-length batches)
    NT_total: int
    C: int
    scale: float
    plan: Plan
    config: ChunkBwdConfig
    is_varlen: bool
    cu_seqlens: torch.Tensor  # or the dummy
    chunk_indices: torch.Tensor  # or the dummy
    chunk_offsets: torch.Tensor  # or the dummy
    fwd_intra: Any  # the forward intra Launch with its tensor arguments taken out
    inter_dtype: torch.dtype
    state_v_first: bool = False  # the initial state, dht and dh0 are [.., V, K]


def meta_from_forward(launches, plan: Plan, config: ChunkBwdConfig) -> BwdMeta:
    """What the backward needs from the forward's launches (``config`` has their chunk lengths)."""
    intra, state = launches[0], launches[1]  # (a third: the output launch of split_output)
    a = intra.args
    B, T, H, K = a["q"].shape
    HV, V = a["v"].shape[2], a["v"].shape[3]
    C, BC = intra.constexprs["BT"], intra.constexprs["BC"]
    assert (config.chunk_size, config.sub_chunk) == (C, BC), "the backward walks the forward's chunks"
    tensors = INPUT_NAMES + INTERMEDIATES + RERUN_SAVED + DPLR_INPUT_NAMES + DPLR_INTERMEDIATES
    stripped = {n: (None if n in tensors else x) for n, x in a.items()}
    return BwdMeta(
        B=B, T=T, H=H, HV=HV, K=K, V=V, N=state.grid[1] // HV, NT=a["NT"], NT_total=intra.grid[0], C=C,
        scale=a["scale"], plan=plan, config=config,
        is_varlen=intra.constexprs["IS_VARLEN"],
        cu_seqlens=a["cu_seqlens"], chunk_indices=a["chunk_indices"], chunk_offsets=state.args["chunk_offsets"],
        fwd_intra=dataclasses.replace(intra, args=stripped, then=None),  # (a re-run builds its own repair launch)
        inter_dtype=a["aqk"].dtype, state_v_first=state.constexprs["STATE_V_FIRST"])


def rerun_forward_intra(meta: BwdMeta, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Recompute qg, kg, W, A_qk and G_n with the forward's own intra launch.  U is not
    rebuilt (``STORE_U=False``): the backward reads V', which the forward's state pass kept."""
    launch, inter = rerun_intra_launch(meta, inputs)
    launch()
    return inter


def _rebuilt_buffers(meta: BwdMeta, dev) -> dict[str, torch.Tensor]:
    """Buffers for the qg, kg, W and G_n a re-run writes (W a dummy without a rank-1 part)."""
    shape = (meta.B, meta.T, meta.HV, meta.K)
    if meta.plan.qk_from_inputs:  # qg and kg are not written (the reverse pass forms them from q and k)
        qg = kg = dummy_pointer(dev)
    else:
        kg = torch.empty(shape, dtype=meta.inter_dtype, device=dev)
        qg = torch.empty(shape, dtype=meta.inter_dtype, device=dev)
    return dict(qg=qg, kg=kg,
                w=torch.empty(shape, dtype=meta.inter_dtype, device=dev) if meta.plan.has_rank1 else dummy_pointer(dev),
                gn=torch.empty(max(meta.NT_total, 1), meta.HV, meta.K, dtype=torch.float32, device=dev))


def rerun_intra_launch(meta: BwdMeta, inputs: dict[str, torch.Tensor]):
    """(the launch, the intermediates it writes) of :func:`rerun_forward_intra`, not run."""
    dev = inputs["q"].device
    inter = dict(_rebuilt_buffers(meta, dev), u=dummy_pointer(dev),
                 aqk=torch.empty(meta.B, meta.T, meta.HV, meta.C, dtype=meta.inter_dtype, device=dev))
    if meta.plan.structure == "dplr":  # A_qk and k exp(G_n - G) too
        inter.update(aqv=torch.empty_like(inter["aqk"]), kgv=torch.empty_like(inter["kg"]))
    fi = meta.fwd_intra
    args = {}
    input_names, inter_names = INPUT_NAMES + DPLR_INPUT_NAMES, INTERMEDIATES + DPLR_INTERMEDIATES
    for n, x in fi.args.items():  # the forward's argument order
        args[n] = inputs[n] if n in input_names else inter[n] if n in inter_names else x
    const = {**fi.constexprs, "STORE_U": False}
    if "td" in args:  # T is not written again
        args["td"], const["STORE_T"] = dummy_pointer(dev), False
    rerun = dataclasses.replace(fi, args=args, constexprs=const)
    return (rerun.with_repair() if has_repair(fi.fn) else rerun), inter


def prepare_chunk_bwd(meta: BwdMeta, inputs: dict[str, torch.Tensor], inter: dict[str, torch.Tensor],
                      hs: torch.Tensor, vn: torch.Tensor, do: torch.Tensor, dht: torch.Tensor | None, need_dh0: bool,
                      built=None):
    """Allocate the gradient buffers and describe the backward's launches (run or compile).
    ``inter``: the forward's intermediates (KEPT_INTERMEDIATES), or in recompute mode
    (``config.reruns_from_saved``) A_qk and T only, and the launches begin with chunk_bwd_rerun."""
    plan, cfg = meta.plan, meta.config
    if built is None:
        built = build(plan, cfg)
    B, T, H, HV, K, V, N, C = meta.B, meta.T, meta.H, meta.HV, meta.K, meta.V, meta.N, meta.C
    q = inputs["q"]
    dev = q.device
    f32 = torch.float32
    NTt = max(meta.NT_total, 1)
    rerun = ()
    if cfg.reruns_from_saved(plan):
        rerun, inter = _rerun_from_saved(meta, built, inputs, inter["aqk"], inter["td"])
    bv = cfg.reverse_pass_block_v(plan)
    NV = triton.cdiv(V, bv)
    dummy = dummy_pointer(dev)
    # dU in the dot dtype: both launches that read it cast it to that dtype on load, so storing
    # it rounded is bit-identical for them and halves its traffic
    du = torch.empty(B, T, HV, V, dtype=q.dtype, device=dev)
    dhs = torch.empty(NTt, HV, K, V, dtype=hs.dtype, device=dev)
    dh0 = torch.empty(state_shape(N, HV, K, V, meta.state_v_first), dtype=f32, device=dev) if need_dh0 else None
    # (no decay: the inputs q and k where qg and kg would be, with their head count)
    rq, kq = (q, inputs["k"]) if plan.qk_from_inputs else (inter["qg"], inter["kg"])
    state_args = dict(qg=rq, kg=kq, w=inter["w"], aqk=inter["aqk"], gn=inter["gn"],
                      **(dict(g=inputs["g"]) if plan.qk_row_scaled else {}), do=do, dht=dht if dht is not None else dummy,
                      du=du, dhs=dhs, dh0=dh0 if dh0 is not None else dummy,
                      cu_seqlens=meta.cu_seqlens, chunk_offsets=meta.chunk_offsets, T=T, NT=meta.NT)
    if cfg.reruns_from_saved(plan) or plan.qk_from_inputs:  # qg is q exp(G) (or q): the pass applies the scale
        state_args["scale"] = float(meta.scale)
    state = Launch("chunk_bwd_state", built.fn("chunk_bwd_state"), (NV, N * HV), state_args,
                   dict(**(dict(H=H) if plan.qk_from_inputs else {}), HV=HV, K=K, V=V, BT=C, BK=plan.BK, BV=bv, USE_DHT=dht is not None,
                        STORE_DH0=need_dh0, IS_VARLEN=meta.is_varlen, STATE_V_FIRST=meta.state_v_first),
                   cfg.state_num_warps, cfg.state_num_stages)
    # a dot operand only, like dU; without a rank-1 part there is no W
    dw = torch.empty(B, T, HV, K, dtype=q.dtype, device=dev) if plan.has_rank1 else dummy
    # dq, dk and dbeta in the inputs' dtypes: the kernel rounds its fp32 values on store as
    # .to() would, so the result is bit-identical without a conversion pass (three copy kernels;
    # docs/decisions/0016-backward-tiles.md).  With GVA,
    # dq and dk stay fp32 until the sum over a q/k head's value heads.
    dqk_dtype = q.dtype if HV == H else f32
    dq = torch.empty(B, T, HV, K, dtype=dqk_dtype, device=dev)
    dk = torch.empty_like(dq)
    fold = cfg.folds_intra(plan)
    bk = min(cfg.dqkw_block_k, plan.BK)
    dqkw_const = dict(HV=HV, K=K, V=V, BT=C, BK=bk, BV=min(cfg.dqkw_block_v, plan.BV), IS_VARLEN=meta.is_varlen)
    nkq = triton.cdiv(K, bk)
    scalar_fold = fold and plan.decay == "scalar"
    # a scalar decay's fold: dqkw's K tiles' shares of dg's sums, per row (A_qk and qg; kg) and per chunk
    # (gamma_n), which the wy launch sums; the flat row and chunk counts both index them by
    shares = dict(dgr=torch.empty(nkq, B * T, HV, dtype=f32, device=dev),
                  dgk=torch.empty(nkq, B * T, HV, dtype=f32, device=dev),
                  dgn=torch.empty(nkq, NTt, HV, dtype=f32, device=dev)) if scalar_fold else {}
    flat = dict(T_all=B * T, NT_all=NTt) if scalar_fold else {}
    if fold:  # no decay (or a scalar one): dqkw finishes dq and writes dk's A_qk part for chunk_bwd_wy
        dkp = torch.empty(B, T, HV, K, dtype=f32, device=dev)
        dqkw_args = dict(vn=vn, hs=hs, dhs=dhs, du=du, do=do, q=q, k=inputs["k"],
                         **(dict(g=inputs["g"]) if scalar_fold else {}), dq=dq, dkp=dkp, dw=dw, **shares,
                         cu_seqlens=meta.cu_seqlens, chunk_indices=meta.chunk_indices, T=T, NT=meta.NT,
                         scale=float(meta.scale), **flat)
        dqkw_const = dict(H=H, **dqkw_const)
    else:
        dqg = torch.empty(B, T, HV, K, dtype=f32, device=dev)
        dkg = torch.empty_like(dqg)
        daqk = torch.empty(B, T, HV, C, dtype=f32, device=dev)
        dgn = torch.empty(NTt, HV, K, dtype=f32, device=dev)
        dqkw_args = dict(vn=vn, hs=hs, dhs=dhs, du=du, do=do, dqg=dqg, dkg=dkg, dw=dw, daqk=daqk, dgn=dgn,
                         cu_seqlens=meta.cu_seqlens, chunk_indices=meta.chunk_indices, T=T, NT=meta.NT)
    dqkw = Launch("chunk_bwd_dqkw", built.fn("chunk_bwd_dqkw"), (meta.NT_total, HV, nkq), dqkw_args,
                  dqkw_const, cfg.dqkw_num_warps, cfg.dqkw_num_stages)
    # dg: per channel, one per token for a scalar decay (summed over the channels in the kernel), none
    # without a decay
    dg = (torch.empty(B, T, HV, K, dtype=f32, device=dev) if plan.decay == "channel"
          else torch.empty(B, T, HV, dtype=f32, device=dev) if plan.decay == "scalar" else dummy)
    dv = torch.empty(B, T, HV, V, dtype=inputs["v"].dtype, device=dev)
    dbeta = torch.empty(B, T, HV, dtype=inputs["beta"].dtype, device=dev) if plan.has_rank1 else None
    dA_part = torch.empty(NTt, HV, K, dtype=f32, device=dev) if plan.gate_has_A else None
    dbias_part = torch.empty(NTt, HV, K, dtype=f32, device=dev) if plan.gate_has_bias else None
    intra_const = dict(H=H, HV=HV, K=K, V=V, BT=C, BC=cfg.sub_chunk, BK=min(cfg.intra_block_k, plan.BK),
                       BV=min(cfg.intra_block_v, plan.BV), IS_VARLEN=meta.is_varlen)
    outputs = dict(dq=dq, dk=dk, dv=dv, dg=dg, dbeta=dbeta, dh0=dh0, dA_part=dA_part, dbias_part=dbias_part)
    if fold:  # (no in-kernel gate, no repair launches; a scalar decay's dg from dqkw's shares and the wy launch)
        wy_args = dict(k=inputs["k"], v=inputs["v"], g=inputs["g"], beta=inputs["beta"], du=du, dw=dw, dkp=dkp,
                       **shares, dv=dv, dbeta=dbeta, dk=dk, **(dict(dg=dg) if scalar_fold else {}),
                       cu_seqlens=meta.cu_seqlens, chunk_indices=meta.chunk_indices, T=T, NT=meta.NT,
                       **flat, **(dict(NKQ=nkq) if scalar_fold else {}))
        wy = Launch("chunk_bwd_wy", built.fn("chunk_bwd_wy"), (meta.NT_total, HV), wy_args, intra_const,
                    cfg.intra_num_warps, cfg.intra_num_stages)
        return rerun + (state, dqkw, wy), outputs
    intra_args = dict(q=q, k=inputs["k"], v=inputs["v"], g=inputs["g"], beta=inputs["beta"])
    if plan.gate_has_A:
        intra_args["A_log"] = inputs["A_log"]
    if plan.gate_has_bias:
        intra_args["dt_bias"] = inputs["dt_bias"]
    intra_args.update(du=du, dqg=dqg, dkg=dkg, dw=dw, daqk=daqk, dgn=dgn, dq=dq, dk=dk, dv=dv, dg=dg,
                      dbeta=dbeta if dbeta is not None else dummy)
    if dA_part is not None:
        intra_args["dA_part"] = dA_part
    if dbias_part is not None:
        intra_args["dbias_part"] = dbias_part
    repair = has_repair(built.fn("chunk_bwd_intra"))  # (the wy launch's source takes the same choice)
    if repair:
        intra_args["bad"] = _repair_flags(meta, dev)
    intra_args.update(cu_seqlens=meta.cu_seqlens, chunk_indices=meta.chunk_indices, T=T, NT=meta.NT,
                      scale=float(meta.scale))
    if not cfg.splits_intra(plan):
        intra = Launch("chunk_bwd_intra", built.fn("chunk_bwd_intra"), (meta.NT_total, HV), intra_args, intra_const,
                       cfg.intra_num_warps, cfg.intra_num_stages)
        return rerun + (state, dqkw, intra.with_repair() if repair else intra), outputs
    split = _split_intra(meta, built, intra_args, intra_const)
    if repair:  # the second launch's repair programs walk every K tile of their chunk: one per (chunk, head)
        split = (split[0].with_repair(), split[1].with_repair(split[1].grid[:2] + (1,)))
    return rerun + (state, dqkw) + split, outputs


def _repair_flags(meta: BwdMeta, dev) -> torch.Tensor:
    """The forward intra launch's flags (one int8 per chunk and value head: a diagonal sub-tile spans over
    the limit), which the backward's repair launches read; where the forward wrote none (its config did
    not check a promised bound, or a traced call rebuilt the description without them) every program is
    flagged: the repair launches re-run them all, which is slower and as exact."""
    bad = meta.fwd_intra.args.get("bad")
    shape = (max(meta.NT_total, 1), meta.HV)
    if isinstance(bad, torch.Tensor) and not bad.is_meta and tuple(bad.shape) == shape and bad.dtype == torch.int8:
        return bad
    return torch.ones(shape, dtype=torch.int8, device=dev)


def _rerun_from_saved(meta: BwdMeta, built, inputs: dict, aqk: torch.Tensor, td: torch.Tensor):
    """(chunk_bwd_rerun's launch, as a 1-tuple; the intermediates it writes with the kept A_qk)."""
    plan, cfg = meta.plan, meta.config
    HV, K = meta.HV, meta.K
    out = _rebuilt_buffers(meta, inputs["q"].device)
    args = dict(q=inputs["q"], k=inputs["k"], g=inputs["g"])
    if plan.gate_has_A:
        args["A_log"] = inputs["A_log"]
    if plan.gate_has_bias:
        args["dt_bias"] = inputs["dt_bias"]
    args.update(td=td, **out, cu_seqlens=meta.cu_seqlens, chunk_indices=meta.chunk_indices, T=meta.T, NT=meta.NT)
    bk = min(cfg.rerun_block_k, plan.BK)
    launch = Launch("chunk_bwd_rerun", built.fn("chunk_bwd_rerun"), (meta.NT_total, HV, triton.cdiv(K, bk)), args,
                    dict(H=meta.H, HV=HV, K=K, BT=meta.C, BC=cfg.sub_chunk, BK=bk, IS_VARLEN=meta.is_varlen),
                    cfg.rerun_num_warps, 1)
    inter = dict(out, aqk=aqk)
    return (launch,), inter


def _split_intra(meta: BwdMeta, built, args: dict, const: dict):
    """The intra-chunk gradients as two launches (``ChunkBwdConfig.intra_split``): chunk_bwd_wy
    writes dv, dbeta and, for the second, dE (fp32) and T (the dot dtype), [B, T, HV, C] each as
    A_qk is laid out; chunk_bwd_intra then reads them for dq, dk and dg, one K tile per program
    with a per-channel decay or none (nothing there sums over channels: ChunkBwdConfig.splits_k)."""
    plan, cfg = meta.plan, meta.config
    de = torch.empty_like(args["daqk"])
    td = torch.empty(de.shape, dtype=args["q"].dtype, device=de.device)
    wy_names = ("k", "v", "g", "beta", "A_log", "dt_bias", "du", "dw", "dv", "dbeta")
    wy_args = {n: args[n] for n in wy_names if n in args}
    wy_args.update(de=de, td=td, **({"bad": args["bad"]} if "bad" in args else {}), cu_seqlens=args["cu_seqlens"],
                   chunk_indices=args["chunk_indices"], T=args["T"], NT=args["NT"])
    wy = Launch("chunk_bwd_wy", built.fn("chunk_bwd_wy"), (meta.NT_total, meta.HV), wy_args, const,
                cfg.intra_num_warps, cfg.intra_num_stages)
    dqkg_args = {}
    for n, x in args.items():  # the fused launch's order, less what the first launch took over
        if n in ("v", "beta", "du", "dv", "dbeta"):
            continue
        dqkg_args[n] = x
        if n == "dgn":
            dqkg_args.update(de=de, td=td)
    # one K tile per program where nothing sums over channels (ChunkBwdConfig.splits_k); else a loop over K
    nk = triton.cdiv(meta.K, const["BK"]) if cfg.splits_k(plan) else 1
    dqkg = Launch("chunk_bwd_intra", built.fn("chunk_bwd_intra"), (meta.NT_total, meta.HV, nk), dqkg_args, const,
                  cfg.intra_num_warps, cfg.intra_num_stages)
    return wy, dqkg


def saved_names(plan: Plan, config: ChunkBwdConfig) -> tuple[str, ...]:
    """Which of the forward intra launch's outputs the training forward keeps for the backward:
    all it reads (``store_intermediates``), A_qk and T (chunk_bwd_rerun rebuilds the rest), or
    none (the backward re-runs the forward's intra launch: general DPLR, C=64)."""
    if config.store_intermediates:
        return KEPT_INTERMEDIATES
    return RERUN_SAVED if config.reruns_from_saved(plan) else ()


def saved_tensors(launches, initial_state, hs, plan: Plan, config: ChunkBwdConfig) -> list:
    """What a training forward keeps for :func:`backward`, from its launches' arguments: the
    (pre-processed) inputs, the per-chunk states, V' and, when the config stores rather than
    recomputes them, the intra launch's intermediates (:func:`saved_names`).  General DPLR (no
    beta: None in its place) appends its inputs a and b, and with ``store_intermediates`` aqv and
    kgv after those."""
    a = launches[0].args
    saved = [a["q"], a["k"], a["v"], a["g"], a.get("beta"), initial_state, a.get("A_log"), a.get("dt_bias"), hs,
             launches[1].args["vn"]]
    saved += [a[n] for n in saved_names(plan, config)]
    if "a" in a:  # general DPLR
        saved += [a[n] for n in DPLR_INPUT_NAMES]
        if config.store_intermediates:
            saved += [a[n] for n in DPLR_INTERMEDIATES]
    return saved


def backward(meta: BwdMeta, saved, like: dict, need: tuple[bool, ...], do, dht):
    """Grads of (q, k, v, g, beta, initial_state, A_log, dt_bias) -- None where ``need`` says
    no -- from :func:`saved_tensors` and the upstream gradients of o and the final state.
    ``like``: the (shape, dtype) of each input whose gradient is converted to it.  General DPLR
    (``plan.structure == "dplr"``) runs its own launches and also returns the grads of a and b."""
    if meta.plan.structure == "dplr":
        return _dplr_backward(meta, saved, like, need, do, dht)
    q, k, v, g, beta, h0, A_log, dt_bias, hs, vn = saved[:10]
    inputs = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias)
    # the kept intermediates; or (recompute mode) A_qk and T, from which the first launch rebuilds
    # them; or nothing, and the forward's intra launch runs again
    names = saved_names(meta.plan, meta.config)
    inter = dict(zip(names, saved[10:])) if names else rerun_forward_intra(meta, inputs)
    if do is None:
        do = torch.zeros(meta.B, meta.T, meta.HV, meta.V, dtype=v.dtype, device=v.device)
    need_dh0 = h0 is not None and need[5]
    launches, out = prepare_chunk_bwd(meta, inputs, inter, hs, vn, do.contiguous(),
                                      None if dht is None else dht.contiguous(), need_dh0)
    for launch in launches:
        launch()
    B, T, H, HV, K = meta.B, meta.T, meta.H, meta.HV, meta.K
    dq, dk = out["dq"], out["dk"]
    if HV != H:  # GVA: value heads hv of one q/k head h are h * (HV // H) ... (h + 1) * (HV // H) - 1
        dq = dq.view(B, T, H, HV // H, K).sum(3)
        dk = dk.view(B, T, H, HV // H, K).sum(3)
    dA_log = ddt_bias = None
    if out["dA_part"] is not None:
        shape, dtype = like["A_log"]
        dA_log = out["dA_part"].sum((0, 2)).reshape(shape).to(dtype)
    if out["dbias_part"] is not None:
        shape, dtype = like["dt_bias"]
        ddt_bias = out["dbias_part"].sum(0).reshape(shape).to(dtype)
    dh0 = out["dh0"].to(h0.dtype) if need_dh0 else None
    dg = out["dg"]  # [B, T, HV] for a scalar decay (summed over the channels in the kernel)
    dbeta = out["dbeta"].to(like["beta"][1]) if out["dbeta"] is not None else None  # no rank-1 part: no beta
    grads = (dq.to(like["q"][1]), dk.to(like["k"][1]), out["dv"], dg.to(like["g"][1]),
             dbeta, dh0, dA_log, ddt_bias)
    return tuple(x if n else None for x, n in zip(grads, need[:8]))


def _dplr_backward(meta: BwdMeta, saved, like: dict, need: tuple[bool, ...], do, dht):
    """General DPLR's grads of (q, k, v, g, beta, initial_state, A_log, dt_bias, a, b): beta,
    A_log and dt_bias are None (it has none); its kernels are :mod:`kdagen.ops.dplr_bwd`'s."""
    q, k, v, g, _, h0, _, _, hs, vn = saved[:10]
    rest = list(saved[10:])
    kept = [rest.pop(0) for _ in KEPT_INTERMEDIATES] if meta.config.store_intermediates else None
    a, b = rest[:2]
    inputs = dict(q=q, k=k, v=v, g=g, a=a, b=b)
    if kept is not None:
        inter = dict(zip(KEPT_INTERMEDIATES, kept), **dict(zip(DPLR_INTERMEDIATES, rest[2:4])))
    else:
        inter = rerun_forward_intra(meta, inputs)
    inter = {n: inter[n] for n in DPLR_KEPT_INTERMEDIATES}
    if do is None:
        do = torch.zeros(meta.B, meta.T, meta.HV, meta.V, dtype=v.dtype, device=v.device)
    need_dh0 = h0 is not None and need[5]
    out = run_dplr_bwd(meta, inputs, inter, hs, vn, do, dht, need_dh0)
    dh0 = out["dh0"].to(h0.dtype) if need_dh0 else None
    grads = (out["dq"].to(like["q"][1]), out["dk"].to(like["k"][1]), out["dv"], out["dg"].to(like["g"][1]), None,
             dh0, None, None, out["da"], out["db"])
    return tuple(x if n else None for x, n in zip(grads, need[:10]))
