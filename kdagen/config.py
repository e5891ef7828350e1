"""Kernel configurations: the tunable knobs of each generated kernel family.

A config is a frozen dataclass; ``to_dict``/``from_dict`` give its canonical JSON form
(used by the tuning cache and by the generated-source header).  Heuristic defaults, used
when no tuned winner is cached, live in :mod:`kdagen.cache.heuristics`; each dataclass's field
defaults are that heuristic's config for KDA (g given, bound -5) in bf16 at K=V=128 without a
call shape, and the heuristic's rules are departures from them.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from .dtypes import STORAGE

PRECISIONS = ("ieee", "tf32")  # precision of fp32 operands of tl.dot (A, inverse)
CUMSUM_MODES = ("scan", "dot")  # how the intra launch sums the gate within a sub-tile


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class _Config:
    kernel: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"{cls.kernel}: unknown config fields {sorted(unknown)}; expected {sorted(names)}")
        return cls(**d)

    def canonical(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)

    def short(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.to_dict().items())

    # -- validation shared by the config families (messages start with the family's name)
    def _check_pow2(self, *names: str) -> None:
        for name in names:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not _pow2(v):
                raise ConfigError(f"{self.kernel}: {name} must be a power of two, got {v!r}")

    def _check_stages(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) not in (1, 2, 3, 4):
                raise ConfigError(f"{self.kernel}: {name} must be in 1..4, got {getattr(self, name)!r}")

    def _check_bool(self, *names: str) -> None:
        for name in names:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{self.kernel}: {name} must be a bool, got {getattr(self, name)!r}")

    def _check_choice(self, name: str, choices: tuple) -> None:
        if getattr(self, name) not in choices:
            raise ConfigError(f"{self.kernel}: {name} must be one of {choices}, got {getattr(self, name)!r}")

    def _check_chunking(self) -> None:
        """chunk_size / sub_chunk of the chunk forms (the fields are powers of two already)."""
        if self.sub_chunk < 16 or self.chunk_size % self.sub_chunk:
            raise ConfigError(
                f"{self.kernel}: sub_chunk must be >= 16 and divide chunk_size "
                f"(got sub_chunk={self.sub_chunk}, chunk_size={self.chunk_size})")
        if self.chunk_size > 128:
            raise ConfigError(f"{self.kernel}: chunk_size must be <= 128, got {self.chunk_size}")


def min_state_block_v(chunk_size: int) -> int:
    """The narrowest V tile the backward's reverse state pass takes on chunks of ``chunk_size``
    rows: 64-row chunks on 16-wide tiles gave wrong dk, dv, dbeta and dh0 on the GPU (exact in the
    interpreter: the fault is in the compiled code; docs/decisions/0028-reverse-pass-min-tile.md).
    C/2 is the guard: 16 for C=32, 32 for C=64 and, unmeasured, 64 for C=128."""
    return max(16, chunk_size // 2)


def _pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


INVERSE_PRECISIONS = ("bf16", "tf32", "ieee")  # operands of the forward solve's (I + A)^-1 products
FACTOR_PRECISIONS = ("input", "fp32")  # the factored q/k tiles of the forward solve's A products
# operands of the training path's factorised diagonal sub-tile products (exp(G_i - a) and exp(a - G_j)
# factors): the input dtype, or fp32 on tf32 / ieee dots; "split": the input dtype, and in the backward's
# dq/dk/dg launch the upstream gradient tiles as two input-dtype operands (hi + lo: a second dot each)
DIAG_PRECISIONS = ("input", "tf32", "ieee", "split")
READOUTS = ("updated", "loaded")  # where the recurrent form reads o (RecurrentConfig.readout)
# the widest state row (BK) the sequence-parallel state pass takes (ChunkFwdConfig.state_segment_chunks):
# its chaining launch holds a segment's K x K transition in one float32 tile (BK=256 would be 256 KiB)
SEGMENT_MAX_BK = 128


@dataclass(frozen=True)
class ChunkFwdConfig(_Config):
    """Chunkwise forward (prefill, inference): a chunk-parallel solve launch and a state pass.

    The solve builds each chunk from halves of 32 rows (two halves when ``chunk_size`` is 64),
    each in sub-tiles of ``sub_chunk`` rows, and writes qg, bk, kgL = L^T kg, P = A_qk L and
    G_n; the state pass walks the chunks with the state in registers.  A training call runs
    :class:`ChunkTrainConfig`'s kernels instead (they also keep what the backward reads)."""

    kernel: ClassVar[str] = "chunk_fwd"
    # the chunk lengths the solve and pass take; another length an op accepts (16) runs the training
    # forward's launches for inference (kdagen.ops.chunk_call.chunk_configs)
    CHUNK_SIZES: ClassVar[tuple[int, ...]] = (32, 64)
    chunk_size: int = 64  # C: tokens per chunk, 32 or 64 (one or two halves)
    sub_chunk: int = 16  # BC: rows per factorised sub-tile
    intra_num_warps: int = 4  # the solve launch
    intra_num_stages: int = 1
    state_block_v: int = 32  # BV: V tile owned by one state-pass program
    state_num_warps: int = 4
    state_num_stages: int = 3  # software-pipelining depth of the state pass's loop over chunks
    state_prefetch: bool = True  # load v, beta and G_n of the next chunk one iteration ahead
    inverse_precision: str = "bf16"  # operands of the (I + A)^-1 products (recursive doubling; fp32 inputs: always ieee)
    factor_precision: str = "input"  # the factored q/k tiles of the A products: the input dtype or fp32
    # the state pass, sequence-parallel (kdagen/ops/chunk_segments.py): segments of this many chunks
    # each get their transition and zero-start end state in parallel, a short pass chains them and
    # the pass proper walks each segment from its entering state; 0: one pass over each sequence
    state_segment_chunks: int = 0
    # where the solve (channel decay) issues its loads of g, beta, k and q: 0 where each is first
    # read (k after the cumulative sum, q after bk's store), 1 all of a half's at its start, 2 also
    # the second half's before the first half's inverse (more registers live, fewer round trips)
    solve_load_ahead: int = 2
    # the solve (channel decay) over the K channels in tiles of this many (its products summed over the
    # tiles, kgL formed in a second loop: fewer registers live); 0, or a tile as wide as the padded K
    # (BK), holds whole K rows (templates/chunk_solve_ktiled.py.j2, docs/decisions/0042-solve-k-tiles.md)
    solve_k_tile: int = 0
    # fields whose default renders no text of its own: left out of the source's header line at the default
    QUIET_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("solve_k_tile",)
    SOLVE_K_TILES: ClassVar[tuple[int, ...]] = (0, 16, 32, 64, 128)

    def __post_init__(self):
        self._check_pow2("chunk_size", "sub_chunk", "state_block_v", "intra_num_warps", "state_num_warps")
        if self.chunk_size not in self.CHUNK_SIZES:
            raise ConfigError(f"chunk_fwd: chunk_size must be 32 or 64, got {self.chunk_size}")
        if self.sub_chunk != 16:
            raise ConfigError(f"chunk_fwd: sub_chunk must be 16 (two sub-tiles per 32-row half), got {self.sub_chunk}")
        if self.state_block_v < 16:
            raise ConfigError(f"chunk_fwd: state_block_v must be >= 16 (the smallest tl.dot tile), got {self.state_block_v}")
        self._check_stages("intra_num_stages", "state_num_stages")
        self._check_choice("inverse_precision", INVERSE_PRECISIONS)
        self._check_choice("factor_precision", FACTOR_PRECISIONS)
        self._check_bool("state_prefetch")
        if isinstance(self.solve_load_ahead, bool) or self.solve_load_ahead not in (0, 1, 2):
            raise ConfigError(f"chunk_fwd: solve_load_ahead must be 0, 1 or 2, got {self.solve_load_ahead!r}")
        if isinstance(self.solve_k_tile, bool) or self.solve_k_tile not in self.SOLVE_K_TILES:
            raise ConfigError(f"chunk_fwd: solve_k_tile must be one of {self.SOLVE_K_TILES} (0: whole K rows), "
                              f"got {self.solve_k_tile!r}")
        L = self.state_segment_chunks
        if not isinstance(L, int) or isinstance(L, bool) or not (L == 0 or (L >= 2 and _pow2(L))):
            raise ConfigError(f"chunk_fwd: state_segment_chunks must be 0 (off) or a power of two >= 2, got {L!r}")


@dataclass(frozen=True)
class ChunkTrainConfig(_Config):
    """Chunkwise forward of a training call: an intra-chunk launch writing W = T (Gamma K),
    U = T V, qg, kg and A_qk, and a fused state pass that also keeps the state entering every
    chunk and V' = U - W S for the backward (whose intra-chunk re-run is this launch too).

    Its ``chunk_size`` and ``sub_chunk`` are the backward config's."""

    kernel: ClassVar[str] = "chunk_train"
    chunk_size: int = 32  # C: tokens per chunk
    sub_chunk: int = 16  # BC: tokens per factorised sub-tile (bounded by the gate)
    intra_block_k: int = 128  # BK tile of the intra-chunk launch
    intra_num_warps: int = 4
    intra_num_stages: int = 2
    state_block_v: int = 32  # BV: V tile owned by one state-pass program
    state_num_warps: int = 4
    state_num_stages: int = 3
    # the triangular inverse's fp32 dots (recursive doubling): exact ("ieee") or tf32
    inverse_precision: str = "tf32"
    cumsum: str = "scan"  # in-sub-tile prefix/suffix sums of the gate: tl.cumsum, or an fp32 dot with a triangle
    diag_precision: str = "tf32"  # the factorised diagonal sub-tiles' operands (DIAG_PRECISIONS)
    state_prefetch: bool = False  # the state pass loads U of the next chunk one iteration ahead (G_n always)
    # the intra launch issues every row-block's q, k and g loads at the top of its K tile (every member's
    # template branch but general DPLR's, which ignores it)
    intra_load_ahead: bool = True
    # a gate bound the caller promises (g given, safe_gate) checked, so g below it (or -inf) still gets the
    # recurrence's answer: KDA's and GLA's kernels flag the chunks with a sub-tile over the span limit and
    # re-run those in repair launches; general DPLR checks each sub-tile in its kernels, dearer, so its heuristic
    # config trusts (docs/decisions/0013-gate-bound-checked-by-repair-launches.md)
    # the promise.  False: unchecked factorised tiles, wrong values or NaN where g breaks it
    check_gate_bound: bool = True
    # the output out of the state pass (FLA's split): the pass writes the per-chunk states and V' only
    # (chunk_state with WRITE_O=False) and a chunk-parallel launch (chunk_out, one program per V tile,
    # chunk and value head) forms O = qg S_c + A_qk V' from them.  Training calls only (they store both)
    split_output: bool = True
    out_block_v: int = 128  # BV of the output launch
    out_block_k: int = 64  # BK of its K loop
    out_num_warps: int = 4
    out_num_stages: int = 2
    # a per-channel in-kernel gate (use_gate_in_kernel: g from z, A_log, dt_bias) as launches of its own:
    # g computed once in fp32 before the chunk launches, which then run the plan without an in-kernel gate
    # (its bound, where the gate's formula has one, trusted: the formula guarantees it), and dz, dA_log,
    # ddt_bias from their dg after the backward (templates/gate.py.j2, kdagen/ops/gate.py).  Otherwise every
    # launch that reads the gate recomputes it from z, and the backward's intra launch also forms dz and the
    # parameters' partial sums (launches_gate)
    gate_launch: bool = False

    @staticmethod
    def gate_launchable(plan) -> bool:
        """Whether ``plan``'s gate can run in launches of its own: a gate computed in the kernels
        (``plan.gate_in_kernel``), per channel (KDA's layer call) or per token and head (Gated DeltaNet's
        with FLA's ``use_gate_in_kernel``: its launches take one channel), not general DPLR."""
        return plan.gate_in_kernel and plan.decay in ("channel", "scalar") and plan.structure != "dplr"

    def launches_gate(self, plan) -> bool:
        """Whether a training call of ``plan`` computes its in-kernel gate in launches of its own
        (``gate_launch`` on a :meth:`gate_launchable` plan).  Read only there, so other plans' sources do
        not name it."""
        return self.gate_launch and self.gate_launchable(plan)

    def __post_init__(self):
        self._check_pow2("chunk_size", "sub_chunk", "intra_block_k", "state_block_v", "intra_num_warps",
                         "state_num_warps", "out_block_v", "out_block_k", "out_num_warps")
        self._check_chunking()
        self._check_stages("intra_num_stages", "state_num_stages", "out_num_stages")
        self._check_choice("inverse_precision", PRECISIONS)
        self._check_choice("cumsum", CUMSUM_MODES)
        self._check_choice("diag_precision", DIAG_PRECISIONS)
        self._check_bool("state_prefetch", "intra_load_ahead", "check_gate_bound", "split_output", "gate_launch")


@dataclass(frozen=True)
class ChunkBwdConfig(_Config):
    """Chunkwise backward: a reverse state pass, a chunk-parallel launch for the products
    that contract over V, and an intra-chunk gradient launch.

    ``chunk_size`` and ``sub_chunk`` are those of the training forward (:class:`ChunkTrainConfig`),
    which walks the same chunks."""

    kernel: ClassVar[str] = "chunk_bwd"
    chunk_size: int = 32  # C: tokens per chunk (same as the forward)
    sub_chunk: int = 16  # BC: tokens per sub-tile (same as the forward)
    state_block_v: int = 32  # BV: V tile owned by one reverse-state-pass program
    state_num_warps: int = 4
    state_num_stages: int = 3
    dqkw_block_k: int = 128  # BK: K tile owned by one program of the chunk-parallel launch
    dqkw_block_v: int = 64  # BV tile of its V loop
    dqkw_num_warps: int = 4
    dqkw_num_stages: int = 2
    intra_block_k: int = 32  # BK tile of the intra-chunk gradient launch
    intra_block_v: int = 64  # BV tile of its V loop (dv, dU V^T)
    intra_num_warps: int = 2
    intra_num_stages: int = 2
    # the triangular inverse's (recursive doubling) and its gradient's fp32 dots: "ieee" or tf32
    inverse_precision: str = "tf32"
    store_intermediates: bool = False  # keep qg/kg/W/U/A_qk/G_n from the forward (else recompute)
    # the intra-chunk gradients as two launches: dE, T, dv, dbeta per (chunk, value head), then
    # dq, dk, dg per (chunk, value head, K tile) (templates/chunk_bwd_intra.py.j2); plans with a rank-1 part
    intra_split: bool = True
    diag_precision: str = "tf32"  # the factorised diagonal sub-tiles' operands (DIAG_PRECISIONS)
    rerun_block_k: int = 64  # K tile of one program of recompute mode's re-run (chunk_bwd_rerun)
    rerun_num_warps: int = 1
    state_dtype: str = "input"  # per-chunk states and their gradients: the input dtype or fp32
    state_prefetch: bool = True  # the reverse state pass loads G_n of the chunk before one iteration ahead
    check_gate_bound: bool = True  # as ChunkTrainConfig's: a promised gate bound checked (the repair launches)
    # no decay or a scalar one given as g (DeltaNet, Gated DeltaNet), a split intra backward folded into the
    # launches beside it: dqkw finishes dq and dk's A_qk part, chunk_bwd_wy adds dk's rank-1 part (and with
    # a decay takes dg's cumsums), and the second launch (with its fp32 round trip of dqg, dkg, dA_qk and
    # dE) is not run (folds_intra)
    intra_fold: bool = False

    def __post_init__(self):
        self._check_pow2("chunk_size", "sub_chunk", "state_block_v", "dqkw_block_k", "dqkw_block_v", "intra_block_k",
                         "intra_block_v", "state_num_warps", "dqkw_num_warps", "intra_num_warps", "rerun_block_k",
                         "rerun_num_warps")
        self._check_chunking()
        for name in ("state_block_v", "dqkw_block_k", "dqkw_block_v", "intra_block_k", "intra_block_v",
                     "rerun_block_k"):
            if getattr(self, name) < 16:
                raise ConfigError(f"chunk_bwd: {name} must be >= 16 (the smallest tl.dot tile)")
        if self.state_block_v < min_state_block_v(self.chunk_size):
            raise ConfigError(
                f"chunk_bwd: state_block_v must be >= chunk_size / 2 = {min_state_block_v(self.chunk_size)} "
                f"(got {self.state_block_v} with chunk_size={self.chunk_size}): the reverse state pass on 64-row "
                f"chunks and 16-wide V tiles gave wrong dk, dv, dbeta and dh0 on the GPU (exact in the "
                f"interpreter; docs/decisions/0028-reverse-pass-min-tile.md)")
        self._check_stages("state_num_stages", "dqkw_num_stages", "intra_num_stages")
        self._check_choice("inverse_precision", PRECISIONS)
        self._check_choice("state_dtype", STORAGE)
        self._check_choice("diag_precision", DIAG_PRECISIONS)
        self._check_bool("store_intermediates", "intra_split", "state_prefetch", "check_gate_bound", "intra_fold")

    def with_chunking(self, chunk_size: int, sub_chunk: int) -> "ChunkBwdConfig":
        """This config on the training forward's chunks: its lengths, and the reverse state pass's
        V tile widened to :func:`min_state_block_v` of them where it is narrower (a config chosen
        for 32-row chunks, e.g. a 16-wide tile for few programs, run on 64-row ones).  On longer
        chunks than the config's its pipeline is at most three deep: four stages of 64-row tiles
        take 248 KB of shared memory at BV=32 (the heuristic's four are for 32-row chunks)."""
        stages = self.state_num_stages if chunk_size <= self.chunk_size else min(self.state_num_stages, 3)
        return self.replace(chunk_size=chunk_size, sub_chunk=sub_chunk, state_num_stages=stages,
                            state_block_v=max(self.state_block_v, min_state_block_v(chunk_size)))

    def reverse_pass_block_v(self, plan) -> int:
        """The reverse state pass's V tile on ``plan``: this config's, or V when narrower.  Below
        :func:`min_state_block_v` of the chunk length (a head dim V < 32 on 64-row chunks) the pass
        is refused (ValueError): that tile gave wrong gradients on the GPU
        (docs/decisions/0028-reverse-pass-min-tile.md)."""
        bv = min(self.state_block_v, plan.BV)
        if bv < min_state_block_v(self.chunk_size):
            raise ValueError(
                f"chunk backward: chunks of {self.chunk_size} rows need the reverse state pass's V tile >= "
                f"{min_state_block_v(self.chunk_size)}, but the head dim V={plan.V} allows only {bv}; train with "
                f"chunk_size=32 (the default) at this head dim")
        return bv

    def splits_intra(self, plan) -> bool:
        """Whether the intra-chunk gradients run as two launches (chunk_bwd_wy, then
        chunk_bwd_intra): when this config asks, the chunk holds two sub-tiles, and ``plan`` has
        the rank-1 part the first launch differentiates (general DPLR has an intra template of its
        own, never split).  Two sub-tiles only: with four (C=64, BC=16) the split gave non-finite
        gradients on the GPU (exact in the interpreter, cause not found;
        docs/decisions/0017-recompute-mode-split-intra.md), so there the fused launch runs whatever the
        field says.  The field is read only when the plan could split, so other plans' sources do not
        name it."""
        return (plan.has_rank1 and plan.structure != "dplr" and self.chunk_size == 2 * self.sub_chunk
                and self.intra_split)

    def folds_intra(self, plan) -> bool:
        """Whether a split intra backward is folded into dqkw and chunk_bwd_wy (``intra_fold``): without a
        decay the second launch's work is products that need no gate, dq = scale (dO S^T + tril(dA_qk) K),
        dk = V' dS^T + scale tril(dA_qk)^T Q + dE K + dE^T K + T^T dW, so dqkw (which holds dA_qk) finishes dq
        and writes dk's first two terms in fp32, and chunk_bwd_wy (which holds dE and T) adds the rest.  A
        scalar decay given as g (Gated DeltaNet without an in-kernel gate) is row scales and exp(G_i - G_j)
        on the [C, C] tiles, so the same split holds: dqkw also writes its share of dg's per-row sums and
        chunk_bwd_wy adds its own and takes dg's cumsums.  Read only for those plans, so other plans'
        sources do not name it (nor, from here, intra_split)."""
        return self.fold_candidate(plan) and self.splits_intra(plan) and self.intra_fold

    @staticmethod
    def fold_candidate(plan) -> bool:
        """Plans whose split intra backward can fold (:meth:`folds_intra`): no decay, or a scalar one given
        as g (an in-kernel gate's derivative stays in the unfolded launch)."""
        return plan.decay == "identity" or (plan.decay == "scalar" and not plan.gate_in_kernel)

    def splits_k(self, plan) -> bool:
        """Whether the split's second launch (dq, dk, dg) takes one K tile per program (grid axis 2):
        when the intra gradients are split and nothing in that launch sums over channels -- a
        per-channel decay, or none (no dg at all).  A scalar decay's dg sums the channels, so its
        program loops over K."""
        return self.splits_intra(plan) and plan.decay in ("channel", "identity")

    def reruns_from_saved(self, plan) -> bool:
        """Whether the backward rebuilds the forward's intermediates with chunk_bwd_rerun from the
        A_qk and T the training forward keeps: recompute mode (``store_intermediates=False``) on
        chunks of two sub-tiles.  General DPLR, and chunks of four sub-tiles (C=64, BC=16: not yet
        checked on a GPU, see :meth:`splits_intra`), re-run the forward's intra launch instead."""
        return plan.structure != "dplr" and not self.store_intermediates and self.chunk_size == 2 * self.sub_chunk


@dataclass(frozen=True)
class RecurrentConfig(_Config):
    """Recurrent (decode) form: one launch per step over (sequence, head, V tile)."""

    kernel: ClassVar[str] = "recurrent"
    block_v: int = 64
    num_warps: int = 2
    num_stages: int = 1
    # where o is read from: "updated" -- o = S_t^T q after the update (two reductions over K in
    # a chain); "loaded" -- from the state as loaded plus the token's own terms, so the reductions
    # are independent of each other and of the update (templates/_recurrent_step.py.j2)
    readout: str = "loaded"
    # 0: one program per (V tile, sequence, value head); n > 0: n programs per SM, each taking items in turn in
    # a loop Triton's software pipeliner runs num_stages - 1 items ahead (num_stages >= 2;
    # templates/recurrent_persistent.py.j2)
    programs_per_sm: int = 0
    # one-item programs (programs_per_sm 0) on a tile that divides K and V: no masks (the compiler drops them), a
    # decode step's item as one straight-line step, an item of another length its tile's value columns two at a
    # time -- on the slot grid in row 0's programs (with the padding's o and the NaN o of sequences sharing a
    # slot), on the batch grid in its own -- and on the slot grid a scan of the slot indices alone
    # (templates/recurrent_lean.py.j2).  A slot's program then holds the step alone (on a [V, K] pool at 8 x 128
    # on one warp the step fits 72 registers, as the bench probe's; the compiler gives the kernel 102, for row
    # 0's code).  The heuristic takes it (8 / 1) for KDA's fp32 [V, K] pool on a decode step's call with many
    # pairs on the slot grid (docs/decisions/0026-lean-decode-step-vk-fp32.md).  On a call with more tokens than
    # sequences, row 0 runs the longer items one at a time: it is a decode step's body, and the heuristic leaves
    # such calls to the general body.
    lean: bool = False
    # speculative decoding (a 2-D ssm_state_indices, [N, T_max]: a pool slot for every token): each token's
    # state written to its own slot as it is consumed, the initial state read from the slot of the last
    # accepted token (templates/recurrent_token_slots.py.j2).  Not a tunable: the op sets it from the call
    # (kdagen.ops.recurrent.token_slot_config), on one-item programs of one tile off the slot grid.  At its
    # default it renders nothing, so a plain call's source is the one rendered before the field existed.
    token_slots: bool = False
    # fields whose default renders no text of its own: left out of the source's header line at the default
    QUIET_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("token_slots",)

    def __post_init__(self):
        self._check_pow2("block_v", "num_warps")
        self._check_stages("num_stages")
        self._check_choice("readout", READOUTS)
        pps = self.programs_per_sm
        if isinstance(pps, bool) or not isinstance(pps, int) or not 0 <= pps <= 32:
            raise ConfigError(f"recurrent: programs_per_sm must be an int in 0..32, got {pps!r}")
        if pps and self.num_stages < 2:
            raise ConfigError("recurrent: persistent programs (programs_per_sm > 0) run a pipelined item loop: "
                              f"num_stages must be at least 2, got {self.num_stages}")
        self._check_bool("lean")
        if self.lean and pps:
            raise ConfigError(f"recurrent: lean is for one-item programs (programs_per_sm 0); got programs_per_sm={pps}")
        self._check_bool("token_slots")
        if self.token_slots and (pps or self.lean):
            raise ConfigError("recurrent: token_slots (speculative decoding) runs one-item programs of one tile "
                              f"(programs_per_sm 0, lean False); got programs_per_sm={pps}, lean={self.lean}")


CONFIG_TYPES: dict[str, type[_Config]] = {c.kernel: c for c in (ChunkFwdConfig, ChunkTrainConfig, RecurrentConfig,
                                                                  ChunkBwdConfig)}


def config_from_dict(kernel: str, d: dict[str, Any]) -> _Config:
    try:
        cls = CONFIG_TYPES[kernel]
    except KeyError:
        raise ConfigError(f"unknown kernel family {kernel!r}; known: {sorted(CONFIG_TYPES)}") from None
    return cls.from_dict(d)


@dataclass(frozen=True)
class RecurrentBwdConfig(_Config):
    """Backward of the recurrent form (``fused_recurrent_kda`` with gradients): one program per
    (V tile, sequence, value head) walks the sequence forwards keeping a checkpoint every
    ``segment`` tokens, then the segments backwards, recomputing each one's states from its
    checkpoint (:mod:`kdagen.ops.recurrent_bwd`).  All fields are launch parameters."""

    kernel: ClassVar[str] = "recurrent_bwd"
    block_v: int = 32  # BV: the V tile of one program (partial sums over V tiles are added on the host)
    segment: int = 16  # BT: tokens between checkpoints (and states recomputed into scratch at a time)
    num_warps: int = 4
    num_stages: int = 1

    def __post_init__(self):
        self._check_pow2("block_v", "segment", "num_warps")
        self._check_stages("num_stages")
