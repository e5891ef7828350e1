"""Heuristic configs: what the ops run when no tuned winner is cached, and the baseline the
tuner measures its candidates against.

The heuristics are one declarative table per config family (:data:`RULES`): a list of
:class:`Rule` -- a name, the decision record (``docs/decisions/``) that chose it, a predicate
over the call's :class:`Features` and the config fields it sets -- applied in order.  A family's
config is its dataclass's defaults overwritten by every rule that matches (the recurrent form's
rules end at the first match).  The features are computed once from the plan, the call's shape,
its state's dtype and layout and whether it is a decode step; every threshold is a named constant
below, next to the record that chose it.  The functions after the table only evaluate it (they
hold no numbers).

The config dataclasses' field defaults (kdagen/config.py) are this table's config for the reference
call -- KDA (g given, bound -5) in bf16 at K=V=128 without a shape (an fp32 decode state): no rule
matches it, and every rule states a departure from it (fp32 or fp16 inputs, K above the measured 128
or above 256, head dims narrower than the default tiles, other members, the call shape's programs,
sequences, pairs and items; tests/tuning/test_heuristic_rules.py holds the two equal)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..codegen.lower import Plan
from ..config import (SEGMENT_MAX_BK, ChunkBwdConfig, ChunkFwdConfig, ChunkTrainConfig, RecurrentConfig,
                      min_state_block_v)
from .miscompiles import avoid_miscompiles

# --------------------------------------------------------------------------- thresholds

# Head dims (K) up to which the half-precision tiles below were measured: the training and backward passes'
# pipelined tiles (docs/decisions/0007-training-state-pass-three-stages.md, 0016-backward-tiles.md), the
# inference forward's 64-row chunks (0002-inference-forward-64-row-chunks.md), the decode tiles
# (0022-decode-fp32-tiles-by-pairs.md)
MEASURED_MAX_K = 128

# A state row wider than this (K > 256: GLA's heads, up to 512) does not fit the state passes' registers on the
# tiles chosen for narrower ones: their [BK, BV] float32 state takes 16-wide V tiles over 8 warps, unpipelined
# (docs/decisions/0033-wide-state-rows.md)
WIDE_STATE_BK = 256

# State-pass programs are counted on V tiles of this width (the features' ``programs``); the training
# forward's narrower tile for few programs is taken where V is at least this wide
# (docs/decisions/0006-narrow-state-tiles-few-programs.md)
COUNTING_TILE = 32

# infers_on_32_row_chunks: state-pass programs (COUNTING_TILE) from which 32-row chunks are taken
# (docs/decisions/0005-gdn-inference-32-row-chunks.md)
SCALAR_DECAY_C32_PROGRAMS = 160

# Many short sequences (the inference forward): at least this many state-pass programs, and sequences of at
# most this many tokens on average (docs/decisions/0003-packed-short-sequences-32-row-chunks.md)
MANY_PROGRAMS = 2048
SHORT_MEAN_TOKENS = 1024

# The sequence-parallel state pass (kdagen/ops/chunk_segments.py): segments of SEGMENT_CHUNKS chunks below
# SEGMENT_PROGRAMS state-pass programs, when the longest sequence holds at least SEGMENT_MIN of them
# (docs/decisions/0004-sequence-parallel-segment-pass.md).  worth_timing leaves it out from
# SEGMENT_TIMED_FACTOR times SEGMENT_PROGRAMS programs on.
SEGMENT_PROGRAMS = 48
SEGMENT_CHUNKS = 32
SEGMENT_MIN = 4
SEGMENT_TIMED_FACTOR = 2

# Below about two state-pass programs per SM of a 132-SM GPU the state pass is latency bound: narrower V
# tiles give more programs (docs/decisions/0006-narrow-state-tiles-few-programs.md).
STATE_PROGRAMS_LOW = 256

# Chunk lengths: the training forward's (and the backward's) by default, and the longer one of
# docs/decisions/0011-64-row-chunks-gdn-deltanet-training.md (two 32-row sub-tiles); the reverse state pass
# takes four stages on the short ones only (docs/decisions/0018-reverse-state-pass.md)
TRAIN_CHUNKING = (32, 16)
LONG_CHUNKING = (64, 32)
# the backward's intra gradients split in two launches, and recompute mode's one-warp re-run, on chunks of this
# many sub-tiles (docs/decisions/0017-recompute-mode-split-intra.md)
SPLIT_SUBTILES = 2

# A half-width (bf16/fp16) pool: from PERSISTENT_ITEMS items on, persistent programs whose item loop Triton
# pipelines (PERSISTENT_PROGRAMS per SM, MANY_PERSISTENT_PROGRAMS from MANY_ITEMS_FACTOR times as many items),
# with the loaded-state readout (docs/decisions/0021-decode-half-pool-persistent.md).
PERSISTENT_ITEMS = 4096
MANY_ITEMS_FACTOR = 4
PERSISTENT_PROGRAMS = 4
MANY_PERSISTENT_PROGRAMS = 16
# items are counted on V tiles of this width (the persistent programs' tile)
ITEM_TILE = 64

# float32 decode states: (sequence, value head) pairs up to which the 16-wide tile on one warp is taken
# (B=1 at H=32: 32 pairs), and the 32-wide one (B=16: 512) (docs/decisions/0022-decode-fp32-tiles-by-pairs.md)
FEW_PAIRS = 64
SOME_PAIRS = 1024

# The slot grid's thresholds (docs/decisions/0024-decode-slot-grid-and-pdl.md).
SLOT_GRID_MIN_PAIRS = 4096
SLOT_GRID_MAX_SEQS = 1024
SLOT_GRID_MAX_RATIO = 2

HALF = ("bfloat16", "float16")


# --------------------------------------------------------------------------- features


@dataclass(frozen=True)
class Features:
    """What a heuristic may branch on, computed once per call (:meth:`of`): the plan's, the call shape's
    (None where the shape does not say), the state's dtype and layout, and whether the call is a decode
    step (no more tokens than sequences).  The derived features are properties."""

    # the plan
    dtype: str
    K: int
    V: int
    BK: int
    BV: int
    decay: str  # "identity", "scalar", "channel"
    diag_mode: str  # "scalar", "factorised", "elementwise"
    structure: str  # "kda", "gla", "dplr"
    has_rank1: bool
    gate_in_kernel: bool
    # the call
    has_shape: bool  # a non-empty shape was given
    N: int | None  # sequences
    HV: int | None  # value heads
    T: int | None  # tokens per batch row
    B: int | None  # batch rows
    T_max: int | None  # the longest sequence's tokens
    P: int  # the decode pool's slots (0: none)
    state_dtype: str
    state_v_first: bool  # states laid out [.., V, K]
    decode_step: bool  # B * T <= N (missing entries read 0: a call without a shape is one)
    chunking: tuple[int, int] = TRAIN_CHUNKING  # the training forward's (C, BC), for the backward

    @classmethod
    def of(cls, plan: Plan, shape: dict | None = None, state_dtype: str = "float32",
           chunking: tuple[int, int] = TRAIN_CHUNKING) -> "Features":
        s = shape or {}

        def get(name):
            return s[name] if name in s else None

        return cls(dtype=plan.dtype, K=plan.K, V=plan.V, BK=plan.BK, BV=plan.BV, decay=plan.decay,
                   diag_mode=plan.diag_mode, structure=plan.structure, has_rank1=plan.has_rank1,
                   gate_in_kernel=plan.gate_in_kernel, has_shape=bool(s), N=get("N"), HV=get("HV"), T=get("T"),
                   B=get("B"), T_max=get("T_max"), P=s.get("P", 0), state_dtype=state_dtype,
                   state_v_first=bool(s.get("state_v_first")),
                   decode_step=s.get("B", 0) * s.get("T", 0) <= s.get("N", 0), chunking=tuple(chunking))

    # -- plan
    @property
    def half(self) -> bool:
        """bf16 / fp16 inputs."""
        return self.dtype in HALF

    @property
    def half_measured(self) -> bool:
        """bf16 / fp16 inputs with K within the measured tiles."""
        return self.half and self.K <= MEASURED_MAX_K

    @property
    def dplr(self) -> bool:
        return self.structure == "dplr"

    @property
    def kda_like(self) -> bool:
        """A per-channel decay and the delta rule's rank-1 part (KDA, not general DPLR)."""
        return self.decay == "channel" and self.has_rank1 and not self.dplr

    @property
    def wide_state(self) -> bool:
        return self.BK > WIDE_STATE_BK

    @property
    def fold_candidate(self) -> bool:
        return ChunkBwdConfig.fold_candidate(self)

    @property
    def gate_launchable(self) -> bool:
        return ChunkTrainConfig.gate_launchable(self)

    @property
    def checked_like_bounded(self) -> bool:
        """A per-channel decay's unbounded diagonal checked in the kernel (bf16/fp32, with a rank-1 part):
        the bounded plan's tiles (docs/decisions/0012-bounded-tiles-for-checked-diagonal.md)."""
        return (self.diag_mode == "elementwise" and self.decay == "channel" and self.dtype != "float16"
                and self.has_rank1)

    @property
    def checks_gate_bound(self) -> bool:
        """A promised gate bound checked by repair launches; general DPLR trusts it
        (docs/decisions/0013-gate-bound-checked-by-repair-launches.md)."""
        return not self.dplr

    @property
    def output_apart(self) -> bool:
        """The training forward's output in a launch of its own (split_output) rather than in the state pass: in
        half precision with K within the measured tiles, not for general DPLR
        (docs/decisions/0009-split-output-launch.md)."""
        return self.half_measured and not self.dplr

    @property
    def inverse_on_tf32(self) -> bool:
        """The training launches' triangular inverse on tf32 dots: for bf16 plans (tf32's operands are finer
        than bf16's rounding of the result); otherwise fp32 FMAs ("ieee"): fp16's rounding is tf32's, and tf32
        dots put fp16's output error above FLA's on ill-conditioned keys; general DPLR keeps fp32
        (docs/decisions/0014-training-inverse-tf32.md)."""
        return self.dtype == "bfloat16" and not self.dplr

    @property
    def diag_on_tf32(self) -> bool:
        """The training launches' factorised diagonal sub-tiles on fp32 operands and tf32 dots: for bf16 plans
        with a rank-1 part whose per-channel diagonal is factorised; otherwise in the input dtype
        (docs/decisions/0015-diag-precision-tf32.md)."""
        factorised = self.decay == "channel" and self.diag_mode == "factorised" and not self.dplr
        return self.dtype == "bfloat16" and factorised and self.has_rank1

    # -- shape
    @property
    def has_programs(self) -> bool:
        return self.has_shape and self.N is not None and self.HV is not None

    @property
    def has_tokens(self) -> bool:
        return self.has_programs and self.T is not None

    @property
    def tokens(self) -> int:
        """The call's tokens (B * T; one batch row where B is not given)."""
        return (1 if self.B is None else self.B) * self.T

    def programs(self, bv: int) -> int:
        """The state pass's programs with V tiles of ``bv``: one per (sequence, value head, V tile)."""
        return self.N * self.HV * -(-self.V // bv)

    @property
    def few_programs(self) -> bool | None:
        """Fewer than STATE_PROGRAMS_LOW state-pass programs; None when the shape does not say."""
        return self.programs(COUNTING_TILE) < STATE_PROGRAMS_LOW if self.has_programs else None

    def longest_chunks(self, C: int) -> int:
        """Chunks of ``C`` tokens in the longest sequence (T_max, else T)."""
        return -(-int(self.T if self.T_max is None else self.T_max) // C)

    def segments(self, C: int, bv: int) -> bool:
        """The sequence-parallel state pass pays at chunks of ``C`` and V tiles of ``bv``."""
        return (self.has_tokens and self.BK <= SEGMENT_MAX_BK and self.programs(bv) < SEGMENT_PROGRAMS
                and self.longest_chunks(C) >= SEGMENT_MIN * SEGMENT_CHUNKS)

    def lean_fits(self, bv: int) -> bool:
        """The lean decode body's masks drop: a tile of ``bv`` divides V and K is its own power of two."""
        return self.BK == self.K and self.V % bv == 0

    @property
    def pairs(self) -> int:
        """(sequence, value head) pairs (0 where the shape does not say)."""
        return (self.N or 0) * (self.HV or 0)

    @property
    def items(self) -> int:
        """A decode launch's items on ITEM_TILE-wide V tiles (0 where the shape does not say)."""
        return self.pairs * -(-self.V // min(ITEM_TILE, self.BV))

    # -- derived decisions other rules (and modules) read
    @property
    def infers_on_32_row_chunks(self) -> bool:
        return (self.decay == "scalar" and self.dtype == "bfloat16" and self.BK <= MEASURED_MAX_K
                and self.has_programs and self.programs(COUNTING_TILE) >= SCALAR_DECAY_C32_PROGRAMS)

    @property
    def trains_on_64_row_chunks(self) -> bool:
        return (self.dtype == "bfloat16" and self.K <= MEASURED_MAX_K and self.has_rank1 and not self.dplr
                and self.fold_candidate and self.BV >= min_state_block_v(LONG_CHUNKING[0])
                and (self.decay == "scalar" or self.few_programs is True))

    @property
    def long_chunks(self) -> bool:
        return self.chunking[0] == LONG_CHUNKING[0]

    @property
    def two_subtiles(self) -> bool:
        """The training chunks hold two sub-tiles (C = 2 BC)."""
        return self.chunking[0] == SPLIT_SUBTILES * self.chunking[1]


# --------------------------------------------------------------------------- the rules

Value = Any  # a field's value, or a callable (features, config so far) -> value


@dataclass(frozen=True)
class Rule:
    """Where ``when(features, config so far)`` holds, set the fields of ``set`` (a value, or a callable
    ``(features, config so far) -> value``); ``record``: the decision record's file name under docs/decisions/."""

    name: str
    record: str
    when: Callable[[Features, dict], bool]
    set: dict[str, Value]

    def apply(self, f: Features, config: dict) -> dict:
        out = dict(config)
        out.update({k: (v(f, config) if callable(v) else v) for k, v in self.set.items()})
        return out


def _within_heads(name: str, record: str, k_tiles: tuple[str, ...] = (), v_tiles: tuple[str, ...] = ()) -> Rule:
    """A rule that narrows the tiles ``k_tiles`` to the plan's BK and ``v_tiles`` to its BV where they are
    wider (the defaults' tiles are K=V=128's)."""

    def when(f, c):
        return any(c[n] > f.BK for n in k_tiles) or any(c[n] > f.BV for n in v_tiles)

    set_ = {n: (lambda f, c, n=n: min(c[n], f.BK)) for n in k_tiles}
    set_.update({n: (lambda f, c, n=n: min(c[n], f.BV)) for n in v_tiles})
    return Rule(name, record, when, set_)


CHUNK_FWD_RULES = [
    _within_heads("V narrower than the state pass's tile", "0002-inference-forward-64-row-chunks.md",
                  v_tiles=("state_block_v",)),
    Rule("fp16: the solve's inverse on tf32 dots", "0002-inference-forward-64-row-chunks.md",
         lambda f, c: f.dtype == "float16", dict(inverse_precision="tf32")),
    Rule("one decay per token: each of the solve's loads where it is first read",
         "0002-inference-forward-64-row-chunks.md", lambda f, c: f.diag_mode == "scalar", dict(solve_load_ahead=0)),
    Rule("many short sequences: 32-row chunks, no prefetch", "0003-packed-short-sequences-32-row-chunks.md",
         lambda f, c: (f.has_tokens and f.programs(COUNTING_TILE) >= MANY_PROGRAMS
                       and f.tokens <= SHORT_MEAN_TOKENS * f.N),
         dict(chunk_size=32, state_prefetch=False)),
    Rule("a scalar decay's bf16 forward with many programs: 32-row chunks", "0005-gdn-inference-32-row-chunks.md",
         lambda f, c: f.infers_on_32_row_chunks, dict(chunk_size=32)),
    Rule("few long sequences: the sequence-parallel pass on 64-wide tiles",
         "0004-sequence-parallel-segment-pass.md",
         lambda f, c: f.segments(c["chunk_size"], c["state_block_v"]),
         dict(state_segment_chunks=SEGMENT_CHUNKS, state_block_v=lambda f, c: min(64, f.BV), state_prefetch=False)),
    Rule("K > 128: 32-row chunks, 8-warp solve, two stages", "0002-inference-forward-64-row-chunks.md",
         lambda f, c: f.BK > MEASURED_MAX_K, dict(
             chunk_size=32, intra_num_warps=8, state_block_v=lambda f, c: min(32, f.BV), state_num_stages=2,
             state_prefetch=True, state_segment_chunks=0, solve_load_ahead=0)),
    Rule("K > 256: 16-wide tiles on 8 warps, unpipelined", "0033-wide-state-rows.md",
         lambda f, c: f.wide_state, dict(state_block_v=lambda f, c: min(16, f.BV), state_num_warps=8,
                                          state_num_stages=1)),
]

CHUNK_TRAIN_RULES = [
    _within_heads("heads narrower than the tiles (the intra launch takes the whole K row)",
                  "0007-training-state-pass-three-stages.md", k_tiles=("intra_block_k", "out_block_k"),
                  v_tiles=("state_block_v", "out_block_v")),
    Rule("fp32, or K > 128: the state pass two stages deep", "0007-training-state-pass-three-stages.md",
         lambda f, c: not f.half_measured, dict(state_num_stages=2)),
    Rule("fp32, K > 128 or general DPLR: the output formed in the state pass", "0009-split-output-launch.md",
         lambda f, c: not f.output_apart, dict(split_output=False, out_block_v=64, out_block_k=64)),
    Rule("the output formed in the state pass, K <= 128: the pass on 2 warps",
         "0007-training-state-pass-three-stages.md",
         lambda f, c: not f.output_apart and f.K <= MEASURED_MAX_K, dict(state_num_warps=2)),
    Rule("general DPLR trusts a promised gate bound", "0013-gate-bound-checked-by-repair-launches.md",
         lambda f, c: not f.checks_gate_bound, dict(check_gate_bound=False)),
    Rule("fp32: each row-block's loads where they are first read", "0008-training-intra-loads-ahead.md",
         lambda f, c: not f.half, dict(intra_load_ahead=False)),
    Rule("the inverse on exact fp32 dots but in bf16 (general DPLR: always)", "0014-training-inverse-tf32.md",
         lambda f, c: not f.inverse_on_tf32, dict(inverse_precision="ieee")),
    Rule("the factorised diagonal in the input dtype but for bf16 KDA", "0015-diag-precision-tf32.md",
         lambda f, c: not f.diag_on_tf32, dict(diag_precision="input")),
    Rule("element-wise diagonal: a [BC, BC, BK] tile, 32-wide K", "0012-bounded-tiles-for-checked-diagonal.md",
         lambda f, c: f.diag_mode == "elementwise" and not f.checked_like_bounded, dict(intra_block_k=32)),
    Rule("GLA with a checked bound keeps its 32-wide intra tile", "0013-gate-bound-checked-by-repair-launches.md",
         lambda f, c: (f.diag_mode == "factorised" and f.checks_gate_bound and not f.gate_in_kernel
                       and not f.has_rank1),
         dict(intra_block_k=lambda f, c: min(32, f.BK))),
    Rule("the output formed in the state pass, few programs: 16-wide tiles on 4 warps",
         "0006-narrow-state-tiles-few-programs.md",
         lambda f, c: not f.output_apart and f.BV >= COUNTING_TILE and bool(f.few_programs),
         dict(state_block_v=16, state_num_warps=4)),
    Rule("general DPLR's 32-wide pass: two stages", "0007-training-state-pass-three-stages.md",
         lambda f, c: f.dplr and c["state_block_v"] >= COUNTING_TILE, dict(state_num_stages=2)),
    Rule("the output out of the state pass, many programs: 64-wide pass tiles", "0009-split-output-launch.md",
         lambda f, c: f.output_apart and f.few_programs is False,
         dict(state_block_v=lambda f, c: min(64, f.BV))),
    Rule("an in-kernel gate launched apart in half precision", "0010-gate-launched-apart.md",
         lambda f, c: f.half and f.gate_launchable, dict(gate_launch=True)),
    Rule("K > 256: 16-wide state tiles on 8 warps, unpipelined", "0033-wide-state-rows.md",
         lambda f, c: f.wide_state, dict(state_block_v=lambda f, c: min(16, f.BV), state_num_warps=8,
                                          state_num_stages=1)),
    Rule("Gated DeltaNet / few-program DeltaNet bf16: 64-row chunks",
         "0011-64-row-chunks-gdn-deltanet-training.md",
         lambda f, c: f.trains_on_64_row_chunks, dict(chunk_size=LONG_CHUNKING[0], sub_chunk=LONG_CHUNKING[1])),
]

CHUNK_BWD_RULES = [
    Rule("the training forward's chunk lengths", "0016-backward-tiles.md",
         lambda f, c: f.chunking != (c["chunk_size"], c["sub_chunk"]),
         dict(chunk_size=lambda f, c: f.chunking[0], sub_chunk=lambda f, c: f.chunking[1])),
    _within_heads("heads narrower than the tiles", "0016-backward-tiles.md",
                  k_tiles=("dqkw_block_k", "intra_block_k", "rerun_block_k"),
                  v_tiles=("state_block_v", "dqkw_block_v", "intra_block_v")),
    Rule("fp16: per-chunk states and their gradients in fp32", "0016-backward-tiles.md",
         lambda f, c: f.dtype == "float16", dict(state_dtype="fp32")),
    Rule("general DPLR trusts a promised gate bound", "0013-gate-bound-checked-by-repair-launches.md",
         lambda f, c: not f.checks_gate_bound, dict(check_gate_bound=False)),
    Rule("the inverse's gradient on exact fp32 dots but in bf16 (general DPLR: always)",
         "0014-training-inverse-tf32.md", lambda f, c: not f.inverse_on_tf32, dict(inverse_precision="ieee")),
    Rule("the factorised diagonal in the input dtype but for bf16 KDA", "0015-diag-precision-tf32.md",
         lambda f, c: not f.diag_on_tf32, dict(diag_precision="input")),
    Rule("fp32, or K > 128: dqkw on [64, 32] tiles", "0016-backward-tiles.md",
         lambda f, c: not f.half_measured, dict(dqkw_block_k=lambda f, c: min(64, f.BK),
                                                dqkw_block_v=lambda f, c: min(32, f.BV))),
    Rule("fp32, or K > 128: the reverse pass two stages deep, no load ahead", "0018-reverse-state-pass.md",
         lambda f, c: not f.half_measured, dict(state_num_stages=2, state_prefetch=False)),
    Rule("reverse pass tiles by programs: 64-wide with many", "0018-reverse-state-pass.md",
         lambda f, c: f.half_measured and f.few_programs is False, dict(state_block_v=lambda f, c: min(64, f.BV))),
    Rule("few programs on short chunks: four stages", "0018-reverse-state-pass.md",
         lambda f, c: f.half_measured and f.few_programs is True and f.chunking[0] == TRAIN_CHUNKING[0],
         dict(state_num_stages=4)),
    Rule("64-row chunks with many programs: the reverse pass on 8 warps",
         "0011-64-row-chunks-gdn-deltanet-training.md",
         lambda f, c: f.half_measured and f.few_programs is False and f.long_chunks and f.trains_on_64_row_chunks,
         dict(state_num_warps=8)),
    Rule("fp32, K > 128 or other than two sub-tiles: the intra gradients in one launch, the re-run on 4 warps",
         "0017-recompute-mode-split-intra.md", lambda f, c: not (f.half_measured and f.two_subtiles),
         dict(intra_split=False, intra_block_v=lambda f, c: min(32, f.BV), intra_num_warps=4, rerun_num_warps=4)),
    Rule("element-wise diagonal: the intra gradients on 4 warps", "0019-elementwise-diagonal-backward-4-warps.md",
         lambda f, c: (f.half_measured and f.two_subtiles and f.diag_mode == "elementwise" and f.has_rank1
                       and not f.checked_like_bounded), dict(intra_num_warps=4)),
    Rule("no decay / a scalar one given: the split folded", "0020-intra-backward-folded.md",
         lambda f, c: f.half_measured and f.two_subtiles and f.fold_candidate and f.has_rank1,
         dict(intra_fold=True, intra_block_k=lambda f, c: min(64, f.BK))),
    Rule("K > 256: dS on 16-wide tiles over 8 warps, unpipelined", "0033-wide-state-rows.md",
         lambda f, c: f.wide_state, dict(state_block_v=lambda f, c: min(16, f.BV), state_num_warps=8,
                                          state_num_stages=1)),
    Rule("the reverse pass's V tile at least C/2", "0028-reverse-pass-min-tile.md",
         lambda f, c: c["state_block_v"] < min_state_block_v(f.chunking[0]),
         dict(state_block_v=lambda f, c: min_state_block_v(f.chunking[0]))),
]

# The recurrent form's rules: the first that matches sets the config (the other fields: the defaults, KDA's
# fp32 state with many pairs, 64-wide tiles on 2 warps with the loaded readout); none matches KDA's defaults.
RECURRENT_RULES = [
    Rule("K > 128: 32-wide tiles on 4 warps", "0022-decode-fp32-tiles-by-pairs.md",
         lambda f, c: f.K > MEASURED_MAX_K, dict(block_v=lambda f, c: min(32, f.BV), num_warps=4,
                                                   readout="updated")),
    Rule("half-width pool, many items: pipelined persistent programs", "0021-decode-half-pool-persistent.md",
         lambda f, c: f.state_dtype in HALF and f.items >= PERSISTENT_ITEMS, dict(
             block_v=lambda f, c: min(64, f.BV), num_stages=2,
             programs_per_sm=lambda f, c: (MANY_PERSISTENT_PROGRAMS if f.items >= MANY_ITEMS_FACTOR * PERSISTENT_ITEMS
                                           else PERSISTENT_PROGRAMS))),
    Rule("half-width pool: 32-wide tiles on one warp", "0021-decode-half-pool-persistent.md",
         lambda f, c: f.state_dtype in HALF, dict(block_v=lambda f, c: min(32, f.BV), num_warps=1)),
    Rule("KDA's fp32 [V, K] state, few pairs: narrow contiguous tiles", "0025-decode-vk-pool.md",
         lambda f, c: f.kda_like and f.state_v_first and 0 < f.pairs <= SOME_PAIRS,
         dict(block_v=lambda f, c: min(4 if f.pairs <= FEW_PAIRS else 8, f.BV), num_warps=1)),
    Rule("KDA's fp32 [V, K] pool, a decode step on the slot grid: lean 8-row tiles",
         "0026-lean-decode-step-vk-fp32.md",
         lambda f, c: (f.kda_like and f.state_v_first and f.pairs > SOME_PAIRS and f.P and f.decode_step
                       and slot_grid(f.N or 0, f.HV or 0, f.P)),
         dict(block_v=lambda f, c: min(8, f.BV), num_warps=1, lean=lambda f, c: f.lean_fits(min(8, f.BV)))),
    Rule("fp32 state, few pairs: 16-wide tiles on one warp", "0022-decode-fp32-tiles-by-pairs.md",
         lambda f, c: 0 < f.pairs <= FEW_PAIRS,
         dict(block_v=lambda f, c: min(16, f.BV), num_warps=1,
              readout=lambda f, c: "updated" if f.dplr else "loaded")),
    Rule("general DPLR's fp32 state: 32-wide tiles on 2 warps", "0022-decode-fp32-tiles-by-pairs.md",
         lambda f, c: f.dplr and f.pairs > 0, dict(block_v=lambda f, c: min(32, f.BV), readout="updated")),
    Rule("fp32 state, some pairs: 32-wide tiles on one warp", "0022-decode-fp32-tiles-by-pairs.md",
         lambda f, c: 0 < f.pairs <= SOME_PAIRS, dict(block_v=lambda f, c: min(32, f.BV), num_warps=1)),
    Rule("fp32 state, many pairs, other members than KDA: the updated readout", "0023-decode-loaded-readout.md",
         lambda f, c: not f.kda_like, dict(block_v=lambda f, c: min(c["block_v"], f.BV), readout="updated")),
    _within_heads("fp32 state, many pairs, V narrower than the tile", "0022-decode-fp32-tiles-by-pairs.md",
                  v_tiles=("block_v",)),
]

# family -> (config class, rules, whether the first match ends the table)
RULES: dict[str, tuple[type, list[Rule], bool]] = {
    "chunk_fwd": (ChunkFwdConfig, CHUNK_FWD_RULES, False),
    "chunk_train": (ChunkTrainConfig, CHUNK_TRAIN_RULES, False),
    "chunk_bwd": (ChunkBwdConfig, CHUNK_BWD_RULES, False),
    "recurrent": (RecurrentConfig, RECURRENT_RULES, True),
}


def applied(family: str, f: Features) -> list[Rule]:
    """The rules of ``family`` that match features ``f``, in order (what chose each field)."""
    return _evaluate(family, f)[1]


def _evaluate(family: str, f: Features):
    cls, rules, first = RULES[family]
    config, taken = cls().to_dict(), []
    for rule in rules:
        if rule.when(f, config):
            config = rule.apply(f, config)
            taken.append(rule)
            if first:
                break
    return cls(**config), taken


# --------------------------------------------------------------------------- the entry points


def default_chunk_config(plan: Plan, shape: dict | None = None) -> ChunkFwdConfig:
    """The inference forward's heuristic config (:data:`CHUNK_FWD_RULES`); ``shape``: optional
    {"N", "HV", "T", "B", "T_max"}."""
    return _evaluate("chunk_fwd", Features.of(plan, shape))[0]


def default_train_config(plan: Plan, shape: dict | None = None) -> ChunkTrainConfig:
    """The forward of a training call (:data:`CHUNK_TRAIN_RULES`).  ``shape``: optional {"N", "HV"}."""
    return _evaluate("chunk_train", Features.of(plan, shape))[0]


def default_chunk_bwd_config(plan: Plan, shape: dict | None = None, chunking: tuple[int, int] = TRAIN_CHUNKING
                             ) -> ChunkBwdConfig:
    """The backward's heuristic config (:data:`CHUNK_BWD_RULES`); ``shape`` (optional {"N", "HV"}) picks the
    reverse state pass's V tile by its program count; ``chunking``: the training forward's (C, BC)."""
    return _evaluate("chunk_bwd", Features.of(plan, shape, chunking=chunking))[0]


def default_recurrent_config(plan: Plan, state_dtype: str = "float32", shape: dict | None = None) -> RecurrentConfig:
    """The recurrent form's heuristic config (:data:`RECURRENT_RULES`).  ``state_dtype``: of the state the call
    reads and writes (its decode pool); ``shape``: optional {"N": sequences, "HV": value heads,
    "state_v_first": the state laid out [.., V, K], "P": the state pool's slots (0 without a pool), "B", "T":
    the call's batch and tokens per batch row}."""
    return _evaluate("recurrent", Features.of(plan, shape, state_dtype))[0]


def default_config(family: str, plan: Plan, shape: dict | None = None,
                   train_config: ChunkTrainConfig | None = None, state_dtype: str = "float32"):
    """The heuristic config of a family at a call's ``shape`` ({"N", "HV", ...}, optional); the
    backward's takes the chunk lengths of ``train_config`` (default: the training forward's
    heuristic); the recurrent form's depends on the ``state_dtype`` of its pool.  The chunk training
    families' configs are kept clear of Triton's miscompiles (:func:`~.miscompiles.avoid_miscompiles`)."""
    if family == "chunk_fwd":
        return default_chunk_config(plan, shape)
    if family == "chunk_train":
        return avoid_miscompiles(family, plan, default_train_config(plan, shape))
    if family == "chunk_bwd":
        fwd = train_config or default_train_config(plan, shape)
        return avoid_miscompiles(family, plan, default_chunk_bwd_config(plan, shape, (fwd.chunk_size, fwd.sub_chunk)))
    if family == "recurrent":
        return default_recurrent_config(plan, state_dtype, shape)
    raise ValueError(f"unknown kernel family {family!r}")


# --------------------------------------------------------------------------- predicates other modules read


def infers_on_32_row_chunks(plan: Plan, shape: dict | None = None) -> bool:
    """Whether a scalar decay's bf16 inference forward takes 32-row chunks: with many state-pass programs
    (docs/decisions/0005-gdn-inference-32-row-chunks.md).  Other plans: 64 rows."""
    return Features.of(plan, shape).infers_on_32_row_chunks


def trains_on_64_row_chunks(plan: Plan, shape: dict | None = None) -> bool:
    """Whether the training step runs on 64-row chunks (two 32-row sub-tiles) instead of 32, in bf16 with
    K <= 128 and the backward's folded split: Gated DeltaNet (a scalar decay given as g) at every shape,
    DeltaNet (no decay) with few state programs; not for value heads narrower than the reverse state pass's
    tile on 64-row chunks (docs/decisions/0011-64-row-chunks-gdn-deltanet-training.md)."""
    return Features.of(plan, shape).trains_on_64_row_chunks


def checked_like_bounded(plan: Plan) -> bool:
    """Whether a plan without a gate bound takes the bounded plan's tiles: its diagonal sub-tiles are
    checked in the kernel (docs/decisions/0012-bounded-tiles-for-checked-diagonal.md)."""
    return Features.of(plan).checked_like_bounded


def checks_gate_bound(plan: Plan) -> bool:
    """The heuristic configs' check_gate_bound (docs/decisions/0013-gate-bound-checked-by-repair-launches.md)."""
    return Features.of(plan).checks_gate_bound


def worth_timing(family: str, plan: Plan, config, shape: dict) -> bool:
    """Whether the tuner times ``config`` at ``shape`` ({"N", "HV", "T", optional "T_max"}) at all.
    Only the sequence-parallel state pass is left out: from SEGMENT_TIMED_FACTOR times the
    :data:`SEGMENT_PROGRAMS` state-pass programs on, or with fewer than :data:`SEGMENT_MIN` segments in the
    longest sequence (docs/decisions/0004-sequence-parallel-segment-pass.md)."""
    L = getattr(config, "state_segment_chunks", 0)
    if family != "chunk_fwd" or not L:
        return True
    f = Features.of(plan, shape)
    return (f.programs(COUNTING_TILE) < SEGMENT_TIMED_FACTOR * SEGMENT_PROGRAMS
            and f.longest_chunks(config.chunk_size) >= SEGMENT_MIN * L)


def slot_grid(n_seqs: int, n_heads: int, n_slots: int) -> bool:
    """Whether a decode step on a state pool puts its programs over the pool's slots rather than over
    the batch (templates/_recurrent_grid.py.j2's SLOT_GRID; one-item programs only): with many (sequence, value
    head) pairs, at most SLOT_GRID_MAX_SEQS sequences (the scan's width) and a pool of at most
    SLOT_GRID_MAX_RATIO slots per sequence (docs/decisions/0024-decode-slot-grid-and-pdl.md)."""
    return (n_seqs * n_heads >= SLOT_GRID_MIN_PAIRS and n_seqs <= SLOT_GRID_MAX_SEQS
            and n_slots <= SLOT_GRID_MAX_RATIO * n_seqs)
