"""Codegen: render a Jinja template into Triton source from a Plan and a Config.

Rendering is a pure function: the same (template, plan, config, kdagen version) gives the
same bytes, and the kernel's name ends in a hash of those bytes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import jinja2

from ..cache.heuristics import WIDE_STATE_BK
from ..cache.paths import compiled_templates_dir
from ..config import (SEGMENT_MAX_BK, ChunkBwdConfig, ChunkFwdConfig, ChunkTrainConfig, ConfigError,
                      RecurrentBwdConfig, RecurrentConfig, _Config)
from ..dtypes import dtype
from ..resources import templates_dir
from ..version import __version__
from ..spec.structure import EXP_BUDGET
from .lower import Plan

# ---------------------------------------------------------------------------- the kernels
# One entry per launched kernel: its template(s), its config family, the launch it stands in for, whether a
# (plan, config) runs it, the variables its template is rendered with.  The families' kernels, the optional
# launches, the DPLR-capable kernels and the launches that replace another's are all read off this table.


@dataclass(frozen=True)
class KernelSpec:
    """A launched kernel: ``templates`` are the files it is rendered from (the first unless ``pick``, given
    the plan and the rendered variables, names another: an algorithm choice made per plan and config);
    ``config``: its config class (and so its family, ``config.kernel``); ``vars``: the values its template
    reads besides the plan (:func:`_template_vars`); ``runs``: whether a (plan, config) launches it
    (None: always); ``replaces``: the launch it stands in for when a config asks (the tuner times it in
    that one's place); ``dplr``: whether it has a general-DPLR form (a branch of its template or a template
    of its own; any other renders KDA's kernel, so a DPLR plan is refused rather than given the wrong
    recurrence's kernel)."""
    kind: str
    templates: tuple[str, ...]
    config: type
    vars: Callable[[str, Plan, _Config], dict]
    runs: Callable[[Plan, _Config], bool] | None = None
    replaces: str | None = None
    dplr: bool = False
    pick: Callable[[Plan, dict], str] | None = None

    @property
    def family(self) -> str:
        return self.config.kernel

    def template(self, plan: Plan, v: dict) -> str:
        return self.pick(plan, v) if self.pick else self.templates[0]


def _base_vars(plan: Plan) -> dict:
    return {"dot_dtype": dtype(plan.dtype).tl, "dot_kw": ', input_precision="ieee"' if plan.dtype == "float32" else ""}


def _raw_qk_vars(plan: Plan, row_scaled: bool) -> dict:
    """No decay: qg = q scale and kg = k, so the launches that would write them do not, and their readers
    take q and k from the inputs ([B, T, H, K], the scale after the product): 4 [T, HV, K] tensors fewer
    written and read per training step.  A scalar decay given as g (half precision): the same, the readers
    (``row_scaled``: those that read it) scaling q and k's rows by exp(G) and exp(G_n - G) from g
    (plan.qk_row_scaled)."""
    v = {"raw_qk": plan.qk_from_inputs}
    if row_scaled:
        v["row_scaled"] = plan.qk_row_scaled
        if plan.qk_row_scaled:
            v["g_floor"] = repr(G_FLOOR)
    return v


def _forward_kernel_vars(kernel: str, plan: Plan, config: ChunkFwdConfig) -> dict:
    return {**_base_vars(plan), **_forward_vars(kernel, plan, config)}


def _k_row_vars(kernel: str, plan: Plan, config: _Config) -> dict:
    return {**_base_vars(plan), "k_mask": plan.K != plan.BK}  # one program holds a whole K row


def _seg_combine_vars(kernel: str, plan: Plan, config: ChunkFwdConfig) -> dict:
    # the transition applied to the state: exact for fp32 inputs, tf32 otherwise (see
    # kdagen/ops/chunk_segments.py on the error)
    return {**_k_row_vars(kernel, plan, config),
            "combine_kw": ', input_precision="ieee"' if plan.dtype == "float32" else ', input_precision="tf32"'}


def _plain_vars(kernel: str, plan: Plan, config: _Config) -> dict:
    return _base_vars(plan)


def _state_vars(kernel: str, plan: Plan, config: _Config) -> dict:
    # the next chunk's element-wise operands loaded one iteration ahead by hand: the forward pass's U (its G_n
    # always is), the reverse pass's G_n
    # a state row past 256 (GLA's wide heads): the [BT, K] tile the pass reads last is loaded where it is read,
    # not live across the products before it (docs/decisions/0033-wide-state-rows.md)
    return {**_base_vars(plan), **_raw_qk_vars(plan, True), "k_mask": plan.K != plan.BK,
            "prefetch": config.state_prefetch, "load_at_use": plan.BK > WIDE_STATE_BK}


def _bwd_state_vars(kernel: str, plan: Plan, config: ChunkBwdConfig) -> dict:
    v = _state_vars(kernel, plan, config)
    # qg from chunk_bwd_rerun is q exp(G): the scale multiplies the dot's fp32 result (FLA's order;
    # rounding q exp(G) scale instead put dh0's bf16 error above FLA's;
    # docs/decisions/0029-dh0-rounding-of-qg.md).  qg from the forward's intra launch carries the scale.
    # no decay (raw_qk): q itself, the scale after the product, whichever launch would have written qg
    v["qg_unscaled"] = config.reruns_from_saved(plan) or plan.qk_from_inputs
    return v


def _out_vars(kernel: str, plan: Plan, config: ChunkTrainConfig) -> dict:
    return {**_base_vars(plan), **_raw_qk_vars(plan, True), "k_mask": plan.K % min(config.out_block_k, plan.BK) != 0}


def _sub_tile_vars(kernel: str, plan: Plan, config: _Config) -> dict:
    """What the intra launches (the training forward's, the backward's) share: sub-tiles, the gate's tile
    shape, the inverse's precision, the diagonal's dot dtype (:func:`_diag_vars`)."""
    sub = config.sub_chunk
    v = _base_vars(plan)
    v.update(n_sub=config.chunk_size // sub, sub=sub, g_floor=repr(G_FLOOR),
             # the gate's tiles: [rows, BK] per channel; [rows, 1] when one number per row holds
             # for every channel (a scalar decay, or none), so exp and cumsum run once per row
             gw="BK" if plan.decay == "channel" else "1",
             k_mask=plan.K % min(config.intra_block_k, plan.BK) != 0,
             inv_kw=f', input_precision="{config.inverse_precision}"')
    v.update(_diag_vars(kernel, plan, config, v))
    return v


def _intra_vars(kernel: str, plan: Plan, config: ChunkTrainConfig) -> dict:
    v = {**_raw_qk_vars(plan, False), "rest_by_difference": _rest_by_difference(plan),
         **_sub_tile_vars(kernel, plan, config)}
    v["cumsum_dot"] = config.cumsum == "dot"
    if plan.structure != "dplr":  # (general DPLR's branch has no such option)
        v["load_ahead"] = config.intra_load_ahead
    return v


def _bwd_intra_vars(kernel: str, plan: Plan, config: ChunkBwdConfig) -> dict:
    v = _sub_tile_vars(kernel, plan, config)
    v["part"] = intra_part(kernel, plan, config)
    v["k_split"] = v["part"] == "dqkg" and config.splits_k(plan)
    v["fold"] = v["part"] == "wy" and config.folds_intra(plan)
    v["scalar_fold"] = v["fold"] and plan.decay == "scalar"
    return v


def _recurrent_vars(kernel: str, plan: Plan, config: RecurrentConfig) -> dict:
    v = _base_vars(plan)
    v["readout_loaded"] = config.readout == "loaded"
    v["persistent"] = config.programs_per_sm > 0
    # lean one-item programs (no masks: the tile must divide K and V)
    v["lean"] = config.lean
    if config.lean and (plan.BK != plan.K or plan.V % min(config.block_v, plan.BV)):
        raise ConfigError(f"recurrent: lean needs a tile that divides K and V; K={plan.K} (tile {plan.BK}), "
                          f"V={plan.V}, block_v={config.block_v}")
    # lean: the value columns at a time of an item that is not a decode step's (lean_item)
    v["lean_cols"] = min(2, config.block_v, plan.BV) if config.lean else 0
    # persistent programs: the item loop is left to Triton's software pipeliner (its loads issued
    # asynchronously into shared memory, num_stages - 1 items ahead; RecurrentConfig asks num_stages >= 2)
    v["pipeline_stages"] = config.num_stages if v["persistent"] else 0
    # speculative decoding: a slot per token (2-D state indices), each token's state stored to its slot
    v["token_slots"] = config.token_slots
    return v


def _rerun_vars(kernel: str, plan: Plan, config: ChunkBwdConfig) -> dict:
    v = {**_base_vars(plan), **_raw_qk_vars(plan, False)}
    v.update(n_sub=config.chunk_size // config.sub_chunk, sub=config.sub_chunk, g_floor=repr(G_FLOOR),
             rest_by_difference=_rest_by_difference(plan),
             gw="BK" if plan.decay == "channel" else "1",
             k_mask=plan.K % min(config.rerun_block_k, plan.BK) != 0)
    return v


def _l2norm_vars(kernel: str, plan: Plan, config: _Config) -> dict:
    return {**_base_vars(plan), "part": "fwd" if kernel == "qk_l2norm" else "bwd"}


def _gate_vars(kernel: str, plan: Plan, config: ChunkTrainConfig) -> dict:
    if not config.launches_gate(plan):
        raise ConfigError(f"{kernel} is the in-kernel gate's own launch: it needs gate_launch=True and a plan "
                          f"whose per-channel gate is computed in the kernels (use_gate_in_kernel), got spec "
                          f"{plan.spec_name!r}, decay {plan.decay}, gate in kernel {plan.gate_in_kernel}")
    return {**_base_vars(plan), "part": "fwd" if kernel == "gate" else "bwd"}


def _dqkw_vars(kernel: str, plan: Plan, config: ChunkBwdConfig) -> dict:
    v = _base_vars(plan)
    v["k_mask"] = plan.K % min(config.dqkw_block_k, plan.BK) != 0
    v["fold"] = config.folds_intra(plan)
    v["scalar_fold"] = v["fold"] and plan.decay == "scalar"
    if v["scalar_fold"]:
        v["g_floor"] = repr(G_FLOOR)
    return v


def intra_part(kernel: str, plan: Plan, config: _Config) -> str:
    """Which of the intra-chunk gradients' kernels renders: "fused" (templates/chunk_bwd_intra.py.j2), or
    the split's two launches, "wy" (chunk_bwd_wy.py.j2) and "dqkg" (chunk_bwd_dqkg.py.j2, kernel
    chunk_bwd_intra after it)."""
    if kernel == "chunk_bwd_wy":
        if not config.splits_intra(plan):
            raise ConfigError("chunk_bwd_wy is the first launch of a split intra backward: it needs "
                              "intra_split=True and a plan with a rank-1 part")
        return "wy"
    if config.folds_intra(plan):
        raise ConfigError("chunk_bwd_intra is not run where a split intra backward is folded (intra_fold=True, "
                          "no decay or a scalar one given as g): dqkw and chunk_bwd_wy do its work")
    return "dqkg" if config.splits_intra(plan) else "fused"


def _pick_bwd_intra(plan: Plan, v: dict) -> str:
    # general DPLR's intra backward shares too little with the others' to be a branch of theirs
    if plan.structure == "dplr":
        return "chunk_bwd_intra_dplr.py.j2"
    return "chunk_bwd_dqkg.py.j2" if v["part"] == "dqkg" else "chunk_bwd_intra.py.j2"


def _pick_recurrent(plan: Plan, v: dict) -> str:
    # one template per body of the recurrent kernel (RecurrentConfig allows at most one of the three)
    if v["persistent"]:
        return "recurrent_persistent.py.j2"
    if v["lean"]:
        return "recurrent_lean.py.j2"
    return "recurrent_token_slots.py.j2" if v["token_slots"] else "recurrent.py.j2"


def _pick_recurrent_bwd(plan: Plan, v: dict) -> str:
    # general DPLR's backward step (a, b in place of beta) and its gradients: a template of its own
    return "recurrent_bwd_dplr.py.j2" if plan.structure == "dplr" else "recurrent_bwd.py.j2"


def _pick_dqkw(plan: Plan, v: dict) -> str:
    # folded (ChunkBwdConfig.folds_intra), the launch also forms dA_qk and the products that need no gate
    return "chunk_bwd_dqkw_fold.py.j2" if v["fold"] else "chunk_bwd_dqkw.py.j2"


def _pick_solve(plan: Plan, v: dict) -> str:
    # a decay that is one number per token (or none) scales whole rows: no anchors, no element-wise fallback;
    # a per-channel decay holds whole K rows, or tiles of them (ChunkFwdConfig.solve_k_tile)
    if plan.diag_mode == "scalar":
        return "chunk_solve_scalar.py.j2"
    return "chunk_solve_ktiled.py.j2" if v["k_tile"] else "chunk_solve.py.j2"


def _pick_intra(plan: Plan, v: dict) -> str:
    # general DPLR's intra launch builds four products and L = (I - A_ab)^-1: a template of its own
    return "chunk_intra_dplr.py.j2" if plan.structure == "dplr" else "chunk_intra.py.j2"


def _k(kind, templates, config, vars, **kw) -> KernelSpec:
    return KernelSpec(kind, (templates,) if isinstance(templates, str) else tuple(templates), config, vars, **kw)


# in each family's launch order
KERNELS: dict[str, KernelSpec] = {s.kind: s for s in (
    # the inference forward
    _k("chunk_solve", ("chunk_solve.py.j2", "chunk_solve_scalar.py.j2", "chunk_solve_ktiled.py.j2"), ChunkFwdConfig,
       _forward_kernel_vars,
       pick=_pick_solve),
    _k("chunk_pass", "chunk_pass.py.j2", ChunkFwdConfig, _forward_kernel_vars),
    # the sequence-parallel state pass (ChunkFwdConfig.state_segment_chunks > 0, kdagen/ops/chunk_segments.py)
    _k("chunk_seg_state", "chunk_seg_state.py.j2", ChunkFwdConfig, _k_row_vars, replaces="chunk_pass"),
    _k("chunk_seg_combine", "chunk_seg_combine.py.j2", ChunkFwdConfig, _seg_combine_vars, replaces="chunk_pass"),
    # chunk_pass's walk, per segment
    _k("chunk_seg_pass", "chunk_seg_pass.py.j2", ChunkFwdConfig, _forward_kernel_vars, replaces="chunk_pass"),
    # a packed call's chunk or segment schedule from device-only offsets (kdagen/ops/schedule.py)
    _k("chunk_schedule", "chunk_schedule.py.j2", ChunkFwdConfig, _plain_vars),
    # the training forward; its in-kernel gate as launches of its own (ChunkTrainConfig.gate_launch): g, then
    # dz and the gate parameters' partial gradients (kdagen/ops/gate.py)
    _k("gate", "gate.py.j2", ChunkTrainConfig, _gate_vars, runs=lambda p, c: c.launches_gate(p)),
    _k("chunk_intra", ("chunk_intra.py.j2", "chunk_intra_dplr.py.j2"), ChunkTrainConfig, _intra_vars, dplr=True,
       pick=_pick_intra),
    _k("chunk_state", "chunk_state.py.j2", ChunkTrainConfig, _state_vars, dplr=True),
    # a training call's l2-norm of q and k (use_qk_l2norm_in_kernel) and its backward (kdagen/ops/l2norm.py)
    # (the l2-norm reads no plan field)
    _k("qk_l2norm", "qk_l2norm.py.j2", ChunkTrainConfig, _l2norm_vars, dplr=True),
    # the output from the stored states and V' (ChunkTrainConfig.split_output)
    _k("chunk_out", "chunk_out.py.j2", ChunkTrainConfig, _out_vars, dplr=True, runs=lambda p, c: c.split_output),
    _k("gate_bwd", "gate.py.j2", ChunkTrainConfig, _gate_vars, runs=lambda p, c: c.launches_gate(p)),
    # the backward
    _k("chunk_bwd_state", "chunk_bwd_state.py.j2", ChunkBwdConfig, _bwd_state_vars, dplr=True),
    _k("chunk_bwd_dqkw", ("chunk_bwd_dqkw.py.j2", "chunk_bwd_dqkw_fold.py.j2"), ChunkBwdConfig, _dqkw_vars,
       dplr=True, pick=_pick_dqkw),
    # the intra-chunk gradients: fused, or the second of the split's two launches; not run where the split
    # is folded (ChunkBwdConfig.folds_intra)
    _k("chunk_bwd_intra", ("chunk_bwd_intra.py.j2", "chunk_bwd_dqkg.py.j2", "chunk_bwd_intra_dplr.py.j2"),
       ChunkBwdConfig, _bwd_intra_vars, dplr=True, pick=_pick_bwd_intra, runs=lambda p, c: not c.folds_intra(p)),
    # the first of the split's two launches (ChunkBwdConfig.intra_split)
    _k("chunk_bwd_wy", "chunk_bwd_wy.py.j2", ChunkBwdConfig, _bwd_intra_vars, replaces="chunk_bwd_intra",
       runs=lambda p, c: c.splits_intra(p)),
    # recompute mode's stage 0: qg, kg, W and G_n from the forward's kept A_qk and T
    _k("chunk_bwd_rerun", "chunk_bwd_rerun.py.j2", ChunkBwdConfig, _rerun_vars,
       runs=lambda p, c: c.reruns_from_saved(p)),
    _k("qk_l2norm_bwd", "qk_l2norm.py.j2", ChunkBwdConfig, _l2norm_vars, dplr=True),
    # the recurrent form: one program per item, the lean body, speculative decoding's, persistent programs
    _k("recurrent", ("recurrent.py.j2", "recurrent_lean.py.j2", "recurrent_token_slots.py.j2",
                     "recurrent_persistent.py.j2"), RecurrentConfig, _recurrent_vars, dplr=True, pick=_pick_recurrent),
    # its backward: the delta rule's and the members' without a rank-1 part, general DPLR's
    _k("recurrent_bwd", ("recurrent_bwd.py.j2", "recurrent_bwd_dplr.py.j2"), RecurrentBwdConfig, _k_row_vars,
       dplr=True, pick=_pick_recurrent_bwd),
)}

# views of the table, for the modules that read them
FAMILY_KERNELS = {}  # the kernels of each config family, in launch order
for _s in KERNELS.values():
    FAMILY_KERNELS.setdefault(_s.family, ())
    FAMILY_KERNELS[_s.family] += (_s.kind,)
REPLACES = {s.kind: s.replaces for s in KERNELS.values() if s.replaces}
DPLR_KERNELS = tuple(s.kind for s in KERNELS.values() if s.dplr)
# launches that only some (plan, config) pairs run (family_kernels leaves them out of the others)
OPTIONAL_KERNELS = tuple(s.kind for s in KERNELS.values() if s.runs)
_PLACEHOLDER = "__KDAGEN_KERNEL_NAME__"
_CONFIG_LINE = "__KDAGEN_CONFIG_LINE__"


def family_kernels(family: str, plan: Plan, config: _Config) -> tuple[str, ...]:
    """The kernels of ``family`` that a (plan, config) runs, in launch order: those of the table less the
    optional launches it does not take (KernelSpec.runs: chunk_bwd_wy without a split, chunk_bwd_rerun
    where the backward keeps or re-runs the forward's intermediates, chunk_bwd_intra where a split is
    folded: ChunkBwdConfig.folds_intra; chunk_out without split_output; the gate's launches where the gate
    is not launched apart: ChunkTrainConfig.launches_gate)."""
    return tuple(k for k in FAMILY_KERNELS[family] if KERNELS[k].runs is None or KERNELS[k].runs(plan, config))


@dataclass(frozen=True)
class GeneratedSource:
    kernel: str  # template kind, e.g. 'chunk_intra'
    name: str  # python identifier of the @triton.jit function (and of its module)
    text: str
    source_hash: str


class _CompiledTemplates(jinja2.FileSystemBytecodeCache):
    """Jinja's compiled templates kept under the cache directory, so that a fresh process (a first call
    with kept binaries) does not parse and compile the templates again: Jinja checks each entry against
    its template's source (a checksum) and the Python version (its magic header); a directory of its
    own per kdagen version (the environment's options are fixed per version).  A cache directory that
    cannot be written costs only the compile."""

    def dump_bytecode(self, bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _compiled_templates() -> jinja2.BytecodeCache | None:
    d = compiled_templates_dir(__version__)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return _CompiledTemplates(str(d))


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        bytecode_cache=_compiled_templates(),
    )


def _check_structure(kernel: str, plan: Plan) -> None:
    if plan.structure == "dplr" and kernel not in DPLR_KERNELS:
        raise ValueError(f"kernel {kernel!r} has no general-DPLR branch yet (spec {plan.spec_name!r}, structure "
                         f"dplr); the DPLR kernels generated so far: {', '.join(DPLR_KERNELS)} (its chunk forward and "
                         "backward, kdagen.chunk_dplr_delta_rule)")


def _check_config(plan: Plan, config: _Config) -> None:
    if isinstance(config, ChunkFwdConfig) and config.state_segment_chunks and plan.BK > SEGMENT_MAX_BK:
        raise ConfigError(
            f"chunk_fwd: state_segment_chunks={config.state_segment_chunks} needs K <= {SEGMENT_MAX_BK} (the "
            f"chaining launch holds a K x K transition in one tile); K={plan.K} takes state_segment_chunks=0")
    if isinstance(config, ChunkTrainConfig) and plan.diag_mode == "factorised" and config.sub_chunk > plan.safe_sub_chunk:
        raise ConfigError(
            f"chunk_train: sub_chunk={config.sub_chunk} exceeds the {plan.safe_sub_chunk}-token sub-tile the "
            f"gate's lower bound {plan.lower_bound} makes safe for {plan.dtype} (exp would overflow)")


def _template_vars(kernel: str, plan: Plan, config: _Config) -> dict:
    """The values a kernel's template reads besides the plan (its KernelSpec.vars), decided here: templates
    branch on these and on plan fields, never on the config.  Each is made only for the kernels that use
    it, since what it reads from the config is part of that kernel's source (its header line)."""
    return KERNELS[kernel].vars(kernel, plan, config)


def _rest_by_difference(plan: Plan) -> bool:
    """Whether the training forward's intra launch and the backward's re-run take the decay still to
    come after row i, G_n - G_i, as that difference of the in-chunk cumsum they already hold (one scan
    of the gate per sub-tile) rather than as a reverse cumsum of the rows after i (a second scan).  The
    difference's float32 rounding is of |G_i| (up to ~1e-4 of the exponent after resets floored at
    G_FLOOR): far below the rounding of the half-precision kg it feeds, not below the 1e-5 an fp32 plan
    is held to, so fp32 plans keep the reverse cumsum."""
    return plan.dtype != "float32" and plan.decay != "identity"


# The forward solve (chunk_solve.py.j2, chunk_solve_scalar.py.j2): halves of HALF rows, sub-tiles of
# config.sub_chunk rows.
HALF = 32
LOG2E = 1.4426950408889634
# The largest decay span (natural log) of a sub-tile the factorised products take: exp(span) and
# |k| exp(span) stay in float32/bf16 range (3.4e38 = exp(88.7)) for |k| up to ~2000.  One above
# the exponent budget a gate bound is checked against (structure.EXP_BUDGET), so that sub-tiles
# whose gate sits at the bound (16 tokens at -5: 80) take the fast path despite rounding.
SPAN_LIMIT = EXP_BUDGET + 1.0
# A log decay below this is raised to it: exp(-40) = 4e-18 is below float32 resolution
# relative to anything the state holds, and the cumulated sums of a chunk stay finite (-inf,
# a reset, becomes a decay to 4e-18)
G_FLOOR = -40.0


def _diag_vars(kernel: str, plan: Plan, config: _Config, v: dict) -> dict:
    """The dot dtype and keywords of the factorised diagonal sub-tile products (diag_dtype,
    diag_kw): the input dtype's, or fp32 operands on tf32 / ieee dots (config.diag_precision;
    read only for a plan whose diagonal is factorised or checked).  fp32 operands hold
    exp(|g_min| BC) factors with fp32's 24-bit mantissa where bf16 keeps 8 bits: in the bf16 emulation
    (tests/bf16_interpreter.py) the diagonal's operand rounding is what lifts dg's and dv's
    errors over dq's.  diag_split ("split"): the dq/dk/dg pass (chunk_bwd_intra, fused or its
    second launch) adds to each diagonal product the upstream tile's rounding error as a second
    operand in the dot dtype -- in the emulation that alone takes dg's error from 3.57e-3 to 2.98e-3
    (fp32 operands everywhere: 2.81e-3), without the fp32 factor tiles (docs/decisions/0015-diag-precision-tf32.md).

    diag_checked: a per-channel gate checks each diagonal sub-tile's decay span in the kernel and
    takes the factorised products when exp(span) <= exp(SPAN_LIMIT), the element-wise ones (one
    column at a time, on the fast path's [BC, BK] tiles) otherwise, as the inference solve does --
    where the factors' dtype has bf16's or fp32's range (fp16 factors, range 6.5e4, stay
    element-wise).  Without a bound (diag_mode 'elementwise') always; with a bound the caller
    promises (g given, ``safe_gate``) when config.check_gate_bound asks, so a g that breaks the
    promise (or -inf) still gets the recurrence's answer; a bound an in-kernel gate's formula
    guarantees is never checked.  KDA's branch (every member but general DPLR) checks in a second
    launch: the fast one factorises every diagonal tile and the forward intra launch flags each (chunk,
    value head) with a sub-tile over the limit; a repair launch of the same source (REPAIR) re-runs
    those programs with the check (kdagen.ops.chunk_train, chunk_bwd: they read the choice off the
    kernel's arguments, kernels.has_repair).  General DPLR's templates check in the kernel, on their
    own dot dtype (no diag_precision there)."""
    out = {"diag_dtype": v["dot_dtype"], "diag_kw": v["dot_kw"], "diag_split": False, "diag_checked": False,
           "diag_span_limit": repr(SPAN_LIMIT)}
    if plan.decay != "channel" or plan.diag_mode not in ("factorised", "elementwise"):
        return out
    check = plan.diag_mode == "elementwise" or (not plan.gate_in_kernel and config.check_gate_bound)
    if plan.structure == "dplr":
        out["diag_checked"] = check and v["dot_dtype"] != "tl.float16"
        return out
    if plan.diag_mode != "factorised" and out["diag_dtype"] == "tl.float16" and config.diag_precision not in ("tf32", "ieee"):
        return out  # fp16 factors without a bound: element-wise, nothing read from the config
    if config.diag_precision == "split":
        out["diag_split"] = kernel == "chunk_bwd_intra"
    elif config.diag_precision in ("tf32", "ieee") and plan.dtype != "float32":
        out.update(diag_dtype="tl.float32", diag_kw=f', input_precision="{config.diag_precision}"')
    out["diag_checked"] = check and out["diag_dtype"] != "tl.float16"
    return out


def _forward_vars(kernel: str, plan: Plan, config: ChunkFwdConfig) -> dict:
    """The forward's template values.  Dot operands: bf16 inputs multiply in bf16; fp16 inputs
    take the factored products in fp32 (tf32), since exp(span) overflows fp16; fp32 inputs are
    exact (ieee) throughout."""
    halves = config.chunk_size // HALF
    v = {"k_mask": plan.K != plan.BK, "halves": halves}
    if kernel in ("chunk_pass", "chunk_seg_pass"):
        v["prefetch"] = config.state_prefetch
        return v
    low = dtype(plan.dtype)
    exact = plan.dtype == "float32"
    ab = "tl.bfloat16" if plan.dtype == "bfloat16" else "tl.float32"
    ab_kw = "" if plan.dtype == "bfloat16" else (', input_precision="ieee"' if exact else ', input_precision="tf32"')
    inv = "ieee" if exact else config.inverse_precision
    # the solve's K tiles (a per-channel decay's; 0 or a tile as wide as BK: whole rows).  The field is looked at
    # without noting it as read first, so that a tile that changes nothing leaves the header, and so the source,
    # as without it.  The tiled solve issues each tile's loads where it reads them (no load_ahead).
    wanted = getattr(config, "_config", config).solve_k_tile
    k_tile = config.solve_k_tile if plan.diag_mode != "scalar" and 0 < wanted < plan.BK else 0
    v.update(
        n_sub=HALF // config.sub_chunk, sub=config.sub_chunk, half_rows=HALF,
        ab_dtype=ab, ab_kw=ab_kw, out_dtype=low.tl, out_kw=', input_precision="ieee"' if exact else "",
        inv_cast=".to(tl.bfloat16)" if inv == "bf16" else "",
        inv_kw="" if inv == "bf16" else f', input_precision="{inv}"',
        factor_low=config.factor_precision == "input" and plan.dtype == "bfloat16",
        # a scalar decay's halves load a few rows and two tiles with nothing between: no choice
        load_ahead=0 if k_tile or plan.diag_mode == "scalar" else config.solve_load_ahead, k_tile=k_tile,
        # the factorised products hold exp(-D) <= exp(span): the exponent budget of the dot
        # dtype (structure.EXP_BUDGET), in log2 units
        # one channel's gate in the element-wise path: z and the bias of that channel alone
        gate_expr_column=re.sub(r"\bb_bias\b", "b_bias_d", re.sub(r"\bb_z\b", "b_zd", plan.gate_expr)),
        span_limit=repr(SPAN_LIMIT * LOG2E), g_floor=repr(G_FLOOR), log2e=repr(LOG2E))
    return v


class _FieldsRead:
    """A config that notes which of its fields are read (``isinstance`` still sees the config's
    class): what a kernel's source depends on, for its header line."""

    def __init__(self, config: _Config):
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "read", set())

    @property
    def __class__(self):  # noqa: D105 - isinstance() checks in _template_vars see the real class
        return type(self._config)

    def __getattr__(self, name: str):
        value = getattr(self._config, name)
        if getattr(value, "__self__", None) is self._config:  # a method: its reads go through here too
            return value.__func__.__get__(self)
        if not callable(value):
            self.read.add(name)
        return value


def _config_line(config: _Config, read: set[str]) -> str:
    """The header's config line: the fields the source read, less those that render nothing at their
    default (the config class's QUIET_AT_DEFAULT) while they are at it."""
    quiet = {f.name: f.default for f in dataclasses.fields(config) if f.name in getattr(config, "QUIET_AT_DEFAULT", ())}
    fields = [f"{k}={v}" for k, v in config.to_dict().items() if k in read and not (k in quiet and v == quiet[k])]
    tail = "the other fields are launch parameters"
    return f"{' '.join(fields)} ({tail})" if fields else f"none read by this source ({tail})"


def render(kernel: str, plan: Plan, config: _Config) -> GeneratedSource:
    """Render one kernel.

    The text depends only on the config fields the template's Python-side variables read
    (:func:`_template_vars`); tiles, warps and stages reach the kernel as launch parameters.
    Two configs that differ only there render the same kernel, under the same name, so Triton
    compiles it once."""
    try:
        spec = KERNELS[kernel]
    except KeyError:
        raise ValueError(f"unknown kernel {kernel!r}; known: {sorted(KERNELS)}") from None
    if not isinstance(config, spec.config):
        raise TypeError(f"kernel {kernel!r} takes a {spec.config.__name__}, got {type(config).__name__}")
    _check_structure(kernel, plan)
    _check_config(plan, config)
    seen = _FieldsRead(config)
    tvars = _template_vars(kernel, plan, seen)
    template = spec.template(plan, tvars)
    text = _env().get_template(template).render(
        name=_PLACEHOLDER, kernel=kernel, plan=plan, config=seen, version=__version__, config_line=_CONFIG_LINE,
        **tvars)
    text = text.replace(_CONFIG_LINE, _config_line(config, seen.read))
    digest = hashlib.sha256(text.encode()).hexdigest()
    name = f"{plan.spec_name}_{kernel}_{digest[:12]}"
    return GeneratedSource(kernel, name, text.replace(_PLACEHOLDER, name), digest)
