"""Context parallelism (FLA's ``cp_context``): one long varlen batch split along T over the ranks
of a process group, each rank running the chunk ops on its own tokens.

The state recurrences kdagen runs are affine in the state: over any run of tokens of one sequence
the state leaving it is ``h_end = M h_start + E``, with ``M`` a K x K matrix per value head (the
product of the tokens' transitions: Diag(exp g) - beta k k^T Diag(exp g) for KDA, the DPLR
family's Diag(exp g) + b a^T, ...) and ``E`` the end state from a zero start.  Over a run of tokens the
outputs are affine in the start too: ``o_t = o_t(0) + h_start^T Q_t`` with ``Q_t`` (K per token
and value head) the outputs the recurrence gives from the start state I and zero values.  So:

  forward, on rank r
    * every local sequence starts on this rank (``pre_num_ranks == 0``): the op's own call on the
      rank's tokens (each sequence from its initial_state row, else zero) is already exact; its
      last sequence's end state is the rank's piece ``E`` (``M`` is not needed: the chain restarts
      with that sequence);
    * the first local sequence began ``p = pre_num_ranks`` ranks earlier: one call of the op on
      that sequence's tokens with the values widened to ``[v | 0]`` (V + K columns) from
      ``[0 | I]`` gives, through the generated kernels, ``[o(0) | Q]`` per token and ``[E | M]``
      as its end state; the rank's other sequences (if any) run in one ordinary call, exact
      already.  A rank inside one long sequence publishes ``(M, E)``, one that ends a sequence
      and starts others its last sequence's ``E``;
    * one all-gather of every rank's piece [HV, K, V + K] (float32): CP x HV x K x (K + V) words;
    * the chain: h = E_{r-p}; h = M_j h + E_j for j = r-p+1 .. r-1 (an empty rank passes [0 | I]:
      h unchanged); then the first sequence's outputs are ``o(0) + Q h`` and its end state
      ``E + M h`` -- no second pass over the tokens.  The widened call costs what V + K value
      columns cost the op (where V + K is wider than the op takes, two calls: [v] and [0]).
  an inference call of a rank that continues a sequence (kdagen's chunk ops but general DPLR, on the
  inference forward's solve and pass) does not widen its values; the op's forward runs in two phases
  (:class:`RankSplit`): the solve; the pieces -- [E | M] of the whole local sequence, or the last
  sequence's end state -- by the sequence-parallel pass's launch A over whole sequences, or over the
  forward's segments where it runs the sequence-parallel pass (few programs), folded per sequence
  (:func:`kdagen.ops.chunk_segments.sequence_transition_launch`, :func:`~kdagen.ops.chunk_segments.fold_segments`:
  the pass's recurrence without o, on V + K state columns); the same all-gather and chain; then the pass,
  with outputs, from the start state the chain gave.  The rank's extra work is that walk without outputs, not
  the wide outputs and their correction (docs/decisions/0044-cp-inference-rank-in-two-phases.md).
  backward: autograd through the same graph (the widened call's backward, the corrections'
  matmuls).  The all-gather's backward is one all-reduce of the gathered pieces' gradient (the
  same CP x HV x K x (K + V) words), of which each rank keeps its own piece's row:
  dL/d(M_j, E_j) summed over the ranks whose chains read them -- the reverse chain.  Every rank's
  outputs are tied to the gathered pieces, so every rank runs that all-reduce (in the same order)
  whenever it backpropagates through its outputs.

Before the all-gather, one small all-gather of each rank's shapes and flags (a few int64 words)
lets every rank refuse a disagreement with the same ValueError instead of hanging.

A fixed-length batch (q [B, T_local, H, K], B > 1; beyond FLA, which takes B = 1): each row is one
sequence, split over the ranks as the context's one sequence (``build_cp_context(torch.tensor([0, T]))``
with T one row's global length).  The chain above then runs per row: the pieces are [B, HV, K, V + K]
(CP x B x HV x K x (K + V) words in the all-gather), every row widened where the rank continues them,
``initial_state`` and the final state are [B, HV, K, V].

Beyond FLA: ``initial_state`` ([N_global, HV, K, V], the same tensor on every rank: each rank
reads the rows of the sequences that *start* on it) and ``output_final_state=True`` (each rank
returns [N_global, HV, K, V] holding the final states of the sequences that *end* on it, zero
elsewhere: the sum over the group is the one-process final state; the gradient of
``initial_state`` likewise sums over the group to the one-process one) -- both need kdagen's
context (:func:`build_cp_context`), which knows each local sequence's global index; uneven and
empty ranks (``rank_lengths``).
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist


@dataclass
class CPContext:
    """kdagen's context-parallel context: FLA's ``FLACPContext`` fields (``group``, rank-local
    ``cu_seqlens`` / ``cu_seqlens_cpu``, ``is_first_rank``, ``is_last_rank``, ``pre_num_ranks``,
    ``post_num_ranks``, ``conv1d_kernel_size``, ``pre_num_conv_tokens``) and kdagen's own:
    ``rank``/``world_size`` in the group, ``rank_start``/``rank_end`` (the rank's tokens in the
    global sequence), ``seq_ids`` (the global index of each local sequence), ``num_seqs_global``
    and ``final_empty`` (the global zero-length sequences whose final state this rank returns)."""
    group: object = None
    cu_seqlens: torch.Tensor | None = None
    cu_seqlens_cpu: torch.Tensor | None = None
    is_last_rank: bool | None = None
    pre_num_ranks: int | None = None
    is_first_rank: bool | None = None
    post_num_ranks: int | None = None
    conv1d_kernel_size: int | None = None
    pre_num_conv_tokens: int | None = None
    rank: int = 0
    world_size: int = 1
    rank_start: int = 0
    rank_end: int = 0
    seq_ids: tuple = field(default_factory=tuple)
    num_seqs_global: int = 0
    final_empty: tuple = field(default_factory=tuple)

    @property
    def num_seqs(self) -> int:
        return 0 if self.cu_seqlens is None else len(self.cu_seqlens) - 1

    @property
    def is_cp_enabled(self) -> bool:
        return self.group is not None


def _group_info(group, what: str):
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"{what}: torch.distributed has no process group (call "
                         "torch.distributed.init_process_group first, or pass cp_context=None)")
    if group is None:
        group = dist.group.WORLD
    try:
        return group, dist.get_rank(group), dist.get_world_size(group)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{what}: the context's group is not a process group this process belongs to ({e})")


def build_cp_context(cu_seqlens: torch.Tensor, group=None, conv1d_kernel_size: int | None = None,
                     cu_seqlens_cpu: torch.Tensor | None = None, rank_lengths=None) -> CPContext:
    """Each rank's :class:`CPContext` for the global offsets ``cu_seqlens`` ([0, s1, s1+s2, ..., T],
    before the split) over ``group`` (default: the world).  As FLA's ``build_cp_context``, the T
    tokens are split into equal parts (T must be a positive multiple of the group's size);
    ``rank_lengths`` (kdagen's) gives each rank's token count instead (any split, empty ranks
    included).  Sequences of length 0 are dropped from the local offsets (as FLA's)."""
    what = "build_cp_context"
    group, rank, world = _group_info(group, what)
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{what}: cu_seqlens must be a 1-D tensor [0, ..., T] of at least 2 entries")
    cu = [int(x) for x in (cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens).cpu().tolist()]
    fields = split_context(cu, rank, world, rank_lengths)
    local_cpu = torch.tensor(fields.pop("cu_seqlens"), dtype=torch.int32)
    return CPContext(group=group, cu_seqlens=local_cpu.to(cu_seqlens.device), cu_seqlens_cpu=local_cpu,
                     conv1d_kernel_size=conv1d_kernel_size, **fields)


def split_context(cu: list, rank: int, world: int, rank_lengths=None) -> dict:
    """The host-side fields of rank ``rank``'s context (of ``world``) for the global offsets ``cu``
    (a list of ints): what :func:`build_cp_context` stores, local ``cu_seqlens`` as a list."""
    what = "build_cp_context"
    if cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"{what}: cu_seqlens must start at 0 and never decrease, got {cu}")
    total = cu[-1]
    if rank_lengths is None:
        if total < world or total % world:
            raise ValueError(f"{what}: the {total} tokens must be a positive multiple of the group's {world} "
                             "ranks (or give rank_lengths)")
        lengths = [total // world] * world
    else:
        lengths = [int(x) for x in rank_lengths]
        if len(lengths) != world or min(lengths) < 0 or sum(lengths) != total or total == 0:
            raise ValueError(f"{what}: rank_lengths must be {world} non-negative token counts summing to "
                             f"cu_seqlens[-1] = {total} > 0, got {list(rank_lengths)}")
    starts = [sum(lengths[:j]) for j in range(world)]
    rs, re = starts[rank], starts[rank] + lengths[rank]

    def owner(pos):  # the rank holding global token pos (the last non-empty rank for pos == total)
        if pos >= total:
            return max(j for j in range(world) if lengths[j])
        return next(j for j in range(world) if starts[j] <= pos < starts[j] + lengths[j])

    ids = [n for n in range(len(cu) - 1) if cu[n] < re and cu[n + 1] > rs] if re > rs else []
    ids = [n for n in ids if cu[n + 1] > cu[n]]
    local = [0] + [min(cu[n + 1], re) - rs for n in ids]
    if ids:
        pre, post = rank - owner(cu[ids[0]]), owner(cu[ids[-1] + 1] - 1) - rank
        conv = max(0, rs - cu[ids[0]])
    else:
        pre = post = conv = 0
    empty = tuple(n for n in range(len(cu) - 1) if cu[n] == cu[n + 1] and owner(cu[n]) == rank)
    return dict(cu_seqlens=local, is_last_rank=post == 0, pre_num_ranks=pre, is_first_rank=pre == 0,
                post_num_ranks=post, pre_num_conv_tokens=conv, rank=rank, world_size=world, rank_start=rs,
                rank_end=re, seq_ids=tuple(ids), num_seqs_global=len(cu) - 1, final_empty=empty)


# ------------------------------------------------------------------------------ collectives


def _gather(x: torch.Tensor, group, world: int) -> torch.Tensor:
    """all_gather of one tensor into [world, *x.shape]; gloo takes host tensors (staged)."""
    stage = x.device.type != "cpu" and dist.get_backend(group) == "gloo"
    src = x.detach().contiguous().cpu() if stage else x.detach().contiguous()
    out = [torch.empty_like(src) for _ in range(world)]
    dist.all_gather(out, src, group=group)
    return torch.stack(out).to(x.device)


class _AllGather(torch.autograd.Function):
    """Every rank's piece, stacked; the backward all-reduces the stacked gradient and keeps its row."""

    @staticmethod
    def forward(ctx, piece, group, rank, world):
        ctx.group, ctx.rank = group, rank
        return _gather(piece, group, world)

    @staticmethod
    def backward(ctx, grad):
        g = grad.contiguous().clone()
        stage = g.device.type != "cpu" and dist.get_backend(ctx.group) == "gloo"
        buf = g.cpu() if stage else g
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=ctx.group)
        return buf.to(grad.device)[ctx.rank], None, None, None


class _Tie(torch.autograd.Function):
    """Identity on ``x`` whose backward also reaches ``anchor`` (with a zero gradient): a rank whose
    outputs do not read the gathered pieces still runs the all-gather's backward collective."""

    @staticmethod
    def forward(ctx, x, anchor):
        ctx.anchor_shape = anchor.shape
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad.new_zeros(ctx.anchor_shape, dtype=torch.float32)


# ------------------------------------------------------------------------------ the two-phase rank


class NotSplit(Exception):
    """Raised by an op's forward, before anything runs, where it cannot run a context-parallel rank in two
    phases (:class:`RankSplit`): the rank takes the widened call instead."""


@dataclass
class RankSplit:
    """An inference call of a rank that continues a sequence from earlier ranks, run in two phases by the
    op's own forward (:func:`kdagen.ops.chunk_call.run_forward`) instead of the widened call:

    1. the solve, then the end states from a zero start and the transitions (E, M) of the local sequences
       ``seqs`` (none, the first or the last; None: every row of a fixed-length call), over the solve's
       outputs (chunk_seg_state over whole sequences or the forward's segments, folded: the pass's
       recurrence without o);
    2. ``share(he, hm)``: the rank's piece from them, the one all-gather and the chain -- the start state
       of the first sequence (each row) [S, HV, K, V], which the op writes into its initial state's first
       row (``every_row``: into every row);
    3. the pass from those start states, with outputs: exact, no wide outputs and no correction.

    ``share`` runs once; a call that steps down to another config after a failed compile
    (:mod:`kdagen.ops.fallback`) gets the first answer again, so no rank enters the collective twice."""
    seqs: tuple | None
    every_row: bool
    publish: Callable  # (he, hm) -> the start states, through the collective
    used: bool = False
    entered: bool = False  # the collective was entered (whatever came of it: never enter it again)
    shared: torch.Tensor | None = None

    def share(self, he, hm) -> torch.Tensor:
        if self.shared is None:
            if self.entered:
                raise RuntimeError("the two-phase rank's collective failed on an earlier attempt")
            self.entered = True
            self.shared = self.publish(he, hm)
        return self.shared


_SPLIT: contextvars.ContextVar[RankSplit | None] = contextvars.ContextVar("kdagen_cp_split", default=None)


@contextlib.contextmanager
def rank_split(split: RankSplit):
    """Run the op calls inside the block as the two-phase rank ``split`` describes (:func:`run_cp` sets it
    around one local call; cp_bench times a rank's work through it)."""
    token = _SPLIT.set(split)
    try:
        yield split
    finally:
        _SPLIT.reset(token)


def take_split() -> RankSplit | None:
    """The two-phase rank the current op call is to run (marked as taken), or None.  Only an op's
    inference forward takes it (:func:`kdagen.ops.chunk_call.run_forward`); it is set for one call."""
    split = _SPLIT.get()
    if split is not None:
        _SPLIT.set(None)  # (the call's own inner calls, if any, are ordinary)
        split.used = True
    return split


# ------------------------------------------------------------------------------ the call


@dataclass
class _View:
    group: object
    rank: int
    world: int
    cu: list
    cu_dev: torch.Tensor
    cu_cpu: torch.Tensor
    pre: int
    post: int
    seq_ids: tuple | None
    num_global: int | None
    final_empty: tuple
    world_mismatch: str | None


def _view(op: str, ctx) -> _View:
    """The context's fields this module reads, checked (kdagen's CPContext or FLA's FLACPContext)."""
    for name in ("group", "cu_seqlens", "pre_num_ranks", "post_num_ranks"):
        if not hasattr(ctx, name):
            raise ValueError(f"{op}: cp_context must be a context from kdagen.build_cp_context (or FLA's "
                             f"build_cp_context); {type(ctx).__name__} has no {name!r}")
    group, rank, world = _group_info(ctx.group, f"{op}: cp_context")
    mismatch = None
    if getattr(ctx, "world_size", world) != world or getattr(ctx, "rank", rank) != rank:
        mismatch = (f"{op}: cp_context was built for rank {ctx.rank} of {ctx.world_size}, but this process is "
                    f"rank {rank} of {world} in its group")
    cu_t = ctx.cu_seqlens
    if not isinstance(cu_t, torch.Tensor) or cu_t.dim() != 1 or cu_t.numel() < 1:
        raise ValueError(f"{op}: cp_context.cu_seqlens must be the rank's 1-D offsets")
    cu_cpu = getattr(ctx, "cu_seqlens_cpu", None)
    cu_cpu = cu_t.cpu() if cu_cpu is None else cu_cpu
    cu = [int(x) for x in cu_cpu.tolist()]
    pre, post = int(ctx.pre_num_ranks or 0), int(ctx.post_num_ranks or 0)
    if mismatch is None and (pre < 0 or post < 0 or rank - pre < 0 or rank + post >= world):
        mismatch = (f"{op}: cp_context's pre_num_ranks={pre} / post_num_ranks={post} do not fit rank {rank} "
                    f"of {world}")
        pre = post = 0
    seq_ids = getattr(ctx, "seq_ids", None)
    if mismatch is None and seq_ids is not None and len(seq_ids) != len(cu) - 1:
        mismatch = f"{op}: cp_context.seq_ids names {len(seq_ids)} sequences, its cu_seqlens {len(cu) - 1}"
    return _View(group, rank, world, cu, cu_t, cu_cpu.to(torch.int32), pre, post,
                 None if seq_ids is None else tuple(seq_ids), getattr(ctx, "num_seqs_global", None),
                 tuple(getattr(ctx, "final_empty", ())), mismatch)


_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _agree(op: str, c: _View, shared: list, own: list, error: str | None) -> list:
    """One small all-gather of every rank's shapes and flags (``shared``: (name, value) pairs every
    rank must agree on) and chain fields (``own``: pre, post, N); any disagreement is the same
    ValueError on every rank, raised before the main collective, so no rank is left waiting."""
    t = torch.tensor([int(error is not None)] + [v for _, v in shared] + list(own), dtype=torch.int64)
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(c.group) == "nccl" else "cpu"
    rows = _gather(t.to(dev), c.group, c.world).cpu().tolist()
    if error is not None:
        raise ValueError(error)
    bad = [r for r, row in enumerate(rows) if row[0]]
    if bad:
        raise ValueError(f"{op}: the inputs of rank(s) {bad} of the cp_context's group were refused (see the error "
                         "raised there); every rank stops")
    rows = [row[1:] for row in rows]
    for i, (name, _) in enumerate(shared):
        vals = [r[i] for r in rows]
        if len(set(vals)) > 1:
            raise ValueError(f"{op}: the ranks of the cp_context's group disagree on {name}: {vals} (rank by rank)")
    chain = [r[len(shared):] for r in rows]
    for r, (pre, _, _) in enumerate(chain):
        for j in range(r - pre + 1, r):  # the ranks between hold only this sequence's tokens, or none
            if chain[j][2] and (chain[j][0] != j - (r - pre) or chain[j][2] > 1):
                raise ValueError(f"{op}: the cp_contexts disagree: rank {r} continues a sequence from rank {r - pre}, "
                                 f"but rank {j} does not hold only that sequence's tokens "
                                 f"(pre_num_ranks, post_num_ranks, sequences: {chain[j]})")
        if pre > 0 and chain[r - pre][1] < pre:
            raise ValueError(f"{op}: the cp_contexts disagree: rank {r} continues a sequence from rank {r - pre} "
                             f"(pre_num_ranks={pre}) but rank {r - pre}'s post_num_ranks is {chain[r - pre][1]}")
    return chain


WIDE_LIMIT = 256  # the widest V + K the widened call runs in one launch sequence (every member's head-dim limit)


def _wide_call(call, tokens, h0, V: int, K: int, max_width: int):
    """The op on one sequence's tokens with values [v | 0] (V + K wide) from ``h0`` [1, HV, K, V + K]:
    its outputs and final state.  Where V + K exceeds the op's widest head dim, two calls."""
    v = tokens[2]
    zeros = v.new_zeros(v.shape[:3] + (K,))
    if V + K <= max_width:
        return call(tokens[:2] + (torch.cat([v, zeros], dim=-1),) + tokens[3:], h0, None, None)
    o1, h1 = call(tokens, h0[..., :V].contiguous(), None, None)
    o2, h2 = call(tokens[:2] + (zeros,) + tokens[3:], h0[..., V:].contiguous(), None, None)
    return torch.cat([o1, o2], dim=-1), torch.cat([h1, h2], dim=-1)


def corrected_outputs(ow: torch.Tensor, h: torch.Tensor, V: int) -> torch.Tensor:
    """``o(0) + Q h`` of the widened call's outputs ``ow`` = [o(0) | Q] ([B, T, HV, V + K]) and the start states
    ``h`` [B, HV, K, V] (float32): the first sequence's outputs, in ``ow``'s dtype.  In half precision one batched
    GEMM per row (fp32 accumulation, ``h`` rounded to the dtype as the kernels round the state for their
    products) reads o(0) and Q where they lie, instead of float32 copies of both and of the product -- a pass
    over the rank's outputs, not several (T x HV x (V + K) words each).  In float32, as written."""
    if ow.dtype == torch.float32:
        return ow[..., :V] + torch.einsum("bthk,bhkv->bthv", ow[..., V:], h)
    hd = h.to(ow.dtype)
    rows = []
    for b in range(ow.shape[0]):  # [HV, T, *] views of one row (strided: no copies), one batched GEMM over the heads
        ob = ow[b].transpose(0, 1)
        rows.append(torch.baddbmm(ob[..., :V], ob[..., V:], hd[b]).transpose(0, 1))
    return torch.stack(rows)  # [B, T, HV, V], contiguous


def _split_rank(c: _View, tokens, call, own, rows: bool, N: int, zero_e, eye, blank, share, chain):
    """An inference call of a rank that continues a sequence, as the op's forward in two phases
    (:class:`RankSplit`): ``(o, final states)``, or None where the op's forward cannot (it raised
    :class:`NotSplit` before anything ran, or did not take the split): the widened call then runs.

    The piece the rank publishes: one sequence over the whole rank (each row of a fixed-length call):
    [E | M] of its tokens; several local sequences: the last one's end state -- E + M h_own from its own
    initial state, when it goes on to later ranks -- with the identity (the first sequence's start state
    does not reach later ranks); else [0 | I].  The local call runs from the rows' own initial states, the
    first sequence's (every row's) written in by the op once the chain gave it."""
    last_goes_on = c.post > 0
    if rows:
        seqs, h0 = None, zero_e.clone()
    else:
        seqs = (0,) if N == 1 else ((N - 1,) if last_goes_on else ())
        h0 = torch.stack([zero_e[0] if r is None else r for r in own])

    def publish(he, hm):
        if rows or N == 1:
            piece = torch.cat([he, hm], dim=-1)
        elif last_goes_on:
            end = he[0] if own[-1] is None else he[0] + torch.matmul(hm[0], own[-1])
            piece = torch.cat([end[None], eye], dim=-1)
        else:
            piece = blank
        return chain(share(piece))

    split = RankSplit(seqs, rows, publish)
    try:
        with rank_split(split):
            o, ht = call(tokens, h0, None if rows else c.cu_dev, None if rows else c.cu_cpu)
    except NotSplit:
        return None
    except Exception as err:
        if not split.entered:  # failed before the collective: join it (flagged), so no other rank waits
            share(blank, err)
        raise
    if not split.used:
        return None
    if not split.entered:  # (an op's forward that took the split must share once; never leave a rank waiting)
        share(blank, RuntimeError("the op's forward took the two-phase rank but never shared its piece"))
    return o, ht


def run_cp(op: str, cp_context, tokens: tuple, call, *, initial_state, output_final_state: bool,
           state_v_first: bool, cu_seqlens=None, extra_flags=(), params=(), max_width: int | None = None,
           splits: bool = False):
    """One op call under context parallelism.  ``tokens``: (q, k, v, *per-token tensors) with T on
    dim 1 (None allowed after v); ``call(tokens, initial_state, cu_seqlens, cu_seqlens_cpu)``
    runs the op without a context (state_v_first=False, output_final_state=True) and returns
    ``(o, final_state)``.  ``extra_flags``: (name, int) pairs every rank must agree on; ``params``: the op's
    other tensors that may require grad (A_log, dt_bias: not split along T); ``max_width``:
    the widest value head dim the op takes in one call (default :data:`WIDE_LIMIT`); ``splits``: the op's
    inference forward can run a rank that continues a sequence in two phases (:class:`RankSplit`), which an
    inference call then takes in place of the widened call."""
    max_width = WIDE_LIMIT if max_width is None else max_width
    if torch.compiler.is_compiling():
        raise ValueError(f"{op}: cp_context is not traced by torch.compile (its collectives run eagerly); call the op "
                         "outside the compiled region")
    c = _view(op, cp_context)
    q, k, v = tokens[:3]
    h_in = initial_state
    errors = []  # local refusals: raised on every rank after the agreement gather, so none hangs
    if q.dim() != 4 or v.dim() != 4:
        errors.append(f"{op}: under cp_context the inputs are the rank's tokens, q [B, T_local, H, K], got q "
                      f"{tuple(q.shape)}")
        B = T = H = K = HV = V = 0
    else:
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
    # B > 1: a fixed-length batch, each row one sequence split over the ranks as the context's one sequence
    rows = B > 1
    if errors:
        pass
    elif c.world_mismatch:
        errors.append(c.world_mismatch)
    elif rows and (len(c.cu) > 2 or (c.num_global or 1) != 1 or cu_seqlens is not None):
        errors.append(f"{op}: a batch of B = {B} rows under cp_context needs a context built from one row's offsets "
                      "(build_cp_context(torch.tensor([0, T])): every row is split over the ranks alike); packed "
                      "sequences take B = 1")
    elif c.cu[0] != 0 or c.cu[-1] != T or any(b <= a for a, b in zip(c.cu, c.cu[1:])):
        errors.append(f"{op}: cp_context.cu_seqlens {c.cu} does not describe this rank's {T} tokens "
                      "(it must start at 0, rise and end at T_local)")
    elif cu_seqlens is not None and [int(x) for x in cu_seqlens.cpu().tolist()] != c.cu:
        errors.append(f"{op}: cu_seqlens {cu_seqlens.cpu().tolist()} disagrees with cp_context.cu_seqlens {c.cu}; "
                      "under cp_context pass cu_seqlens=None (the context's local offsets are used)")
    elif any(isinstance(x, torch.Tensor) and (x.dim() < 2 or x.shape[:2] != (B, T)) for x in tokens):
        errors.append(f"{op}: every per-token input must be [B = {B}, T_local = {T}, ...] under cp_context, got "
                      f"{[tuple(x.shape) for x in tokens if isinstance(x, torch.Tensor)]}")
    elif (h_in is not None or output_final_state) and c.seq_ids is None:
        errors.append(f"{op}: initial_state / output_final_state=True under cp_context need kdagen's context "
                      "(kdagen.build_cp_context), which knows each local sequence's global index")
    elif h_in is not None:
        if state_v_first:
            h_in = h_in.transpose(-1, -2)
        n_states = B if rows else c.num_global
        if tuple(h_in.shape) != (n_states, HV, K, V):
            errors.append(f"{op}: under cp_context initial_state holds every global sequence's state, "
                          f"[{n_states}, {HV}, {K}, {V}] (the same tensor on every rank), got "
                          f"{tuple(initial_state.shape)}")
    grads = [x for x in tuple(tokens) + tuple(params) + (h_in,) if isinstance(x, torch.Tensor)]
    training = torch.is_grad_enabled() and any(x.requires_grad for x in grads)
    N = len(c.cu) - 1
    shapes = [d for x in tokens[3:] for d in ((-1,) if x is None else (x.dim(),) + tuple(x.shape[2:]))]
    shared = list(extra_flags) + [
        ("B", B), ("H", H), ("HV", HV), ("K", K), ("V", V), ("q's dtype", _DTYPES.get(q.dtype, 9)),
        ("v's dtype", _DTYPES.get(v.dtype, 9)), ("device type", int(v.device.type == "cuda")),
        ("training", int(training)), ("initial_state", int(h_in is not None)),
        ("output_final_state", int(output_final_state)), ("state_v_first", int(state_v_first)),
        ("the other inputs' shapes", hash(tuple(shapes)) & 0x7FFFFFFF)]
    _agree(op, c, shared, [c.pre, c.post, N], errors[0] if errors else None)

    dev = v.device
    S = B if rows else 1  # the chain's rows: each row of a fixed-length batch, else the first local sequence
    eye = torch.eye(K, device=dev, dtype=torch.float32).expand(S, HV, K, K)
    zero_e = torch.zeros(S, HV, K, V, device=dev, dtype=torch.float32)
    blank = torch.cat([zero_e, eye], dim=-1)  # [0 | I]: no tokens, the state passed on unchanged
    if rows:  # the rows' own initial states where they start here
        own = [h_in.float().contiguous() if h_in is not None and c.pre == 0 else None] * N
    else:  # the local sequences' own initial states (all but a first one continued from before)
        own = [None] * N
        if h_in is not None:
            own = [None if (i == 0 and c.pre > 0) else h_in[c.seq_ids[i]].float() for i in range(N)]
    wide = N > 0 and c.pre > 0
    cu_dev, cu_cpu = (None, None) if rows else (c.cu_dev, c.cu_cpu)

    def share(piece, failure=None):
        """The one all-gather of every rank's piece (and a flag word: a local call that raised), checked:
        [world, S, HV, K, V + K]."""
        flat = torch.cat([piece.float().reshape(-1),
                          piece.new_full((1,), float(failure is not None), dtype=torch.float32)])
        if training and not flat.requires_grad:
            flat = flat.detach().requires_grad_()
        out = _AllGather.apply(flat, c.group, c.rank, c.world) if training else _gather(flat, c.group, c.world)
        if failure is not None:
            raise failure
        bad = [r for r, x in enumerate(out[:, -1].tolist()) if x]
        if bad:
            raise ValueError(f"{op}: the call on rank(s) {bad} of the cp_context's group raised (see the error raised "
                             "there); every rank stops")
        return out[:, :-1].reshape(c.world, S, HV, K, V + K)

    def chain(gathered):
        """The first sequence's (each row's) start state: h = E_{r-p}; h = M_j h + E_j over the ranks between."""
        r0 = c.rank - c.pre
        h = gathered[r0, ..., :V]
        for j in range(r0 + 1, c.rank):
            h = torch.matmul(gathered[j, ..., V:], h) + gathered[j, ..., :V]
        return h

    done = None
    if wide and splits and not training:  # the op's forward in two phases (RankSplit), else the widened call
        done = _split_rank(c, tokens, call, own, rows, N, zero_e, eye, blank, share, chain)
    if done is not None:  # exact, its collective done inside the op's forward
        (o, ht), wide = done, False
    else:
        failure = None
        try:
            if N == 0:
                o, ht, piece = q.new_zeros(B, 0, HV, V), None, blank
            elif not wide:  # every local sequence starts here: the call is exact before the collective
                h0 = own[0] if rows else (None if all(r is None for r in own) else
                                          torch.stack([zero_e[0] if r is None else r for r in own]))
                o, ht = call(tokens, h0, cu_dev, cu_cpu)
                piece = torch.cat([ht[-S:] if c.post > 0 else zero_e, eye], dim=-1)
            else:  # the first sequence (every row): values [v | 0] from [0 | I]; the others as they are
                t1 = c.cu[1]
                first = tuple(x[:, :t1] if isinstance(x, torch.Tensor) else x for x in tokens)
                ow, htw = _wide_call(call, first, blank, V, K, max_width)
                if N == 1:
                    piece = htw
                else:
                    rest = tuple(x[:, t1:] if isinstance(x, torch.Tensor) else x for x in tokens)
                    h0 = None if all(r is None for r in own[1:]) else torch.stack([zero_e[0] if r is None else r
                                                                                  for r in own[1:]])
                    o_rest, ht_rest = call(rest, h0, c.cu_dev[1:] - t1, c.cu_cpu[1:] - t1)
                    piece = torch.cat([ht_rest[-1:] if c.post > 0 else zero_e, eye], dim=-1)
        except Exception as err:  # still joins the collective (flagged), so no other rank waits for it
            failure, piece = err, blank
        gathered = share(piece, failure)  # the piece and one flag word (a local call that raised) travel together
    if wide:  # the chain gives the first sequence's (each row's) start h; its outputs and state are corrected by it
        h = chain(gathered)
        o = corrected_outputs(ow, h, V)
        ht = htw[..., :V] + torch.matmul(htw[..., V:], h)
        if N > 1:
            o, ht = torch.cat([o, o_rest], dim=1), torch.cat([ht, ht_rest])
    if training:
        o = _Tie.apply(o, gathered)

    final = None
    if output_final_state:
        if rows:  # every row ends on the last rank holding tokens
            final = ht.float() if N and c.post == 0 else torch.zeros(B, HV, K, V, device=dev, dtype=torch.float32)
        else:
            final = torch.zeros(c.num_global, HV, K, V, device=dev, dtype=torch.float32)
            idx, src = [], []
            for i in range(N):
                if i < N - 1 or c.post == 0:
                    idx.append(c.seq_ids[i])
                    src.append(ht[i])
            for n in c.final_empty:
                idx.append(n)
                src.append(h_in[n].float() if h_in is not None else zero_e[0])
            if idx:
                final = final.index_copy(0, torch.tensor(idx, device=dev), torch.stack(src))
        if training:
            final = _Tie.apply(final, gathered)
        if state_v_first:
            final = final.transpose(-1, -2).contiguous()
    return o, final


def cp_call(op: str, fn, cp_context, tokens: tuple, scale, initial_state, output_final_state: bool,
            state_v_first: bool, cu_seqlens, kwargs: dict, splits: bool = False):
    """``fn`` (the public op) under context parallelism (:func:`kdagen.ops.cp.run_cp`): each
    local call is ``fn`` without a context, with the op's other keywords (``kwargs``) unchanged
    -- except a pinned ``config``, kept off the transition's call (its values are V + K wide).
    ``splits``: ``fn``'s inference forward runs a two-phase rank (:class:`RankSplit`)."""
    if kwargs.get("return_intermediate_states"):
        raise ValueError(f"{op}: return_intermediate_states=True is not supported under cp_context")
    V = tokens[2].shape[-1]

    def local(t, h0, cu, cu_cpu):
        kw = kwargs if t[2].shape[-1] == V else {n: x for n, x in kwargs.items() if n != "config"}
        return fn(*t, scale=scale, initial_state=h0, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
                  **kw)
    return run_cp(op, cp_context, tokens, local, initial_state=initial_state, output_final_state=output_final_state,
                  state_v_first=state_v_first, cu_seqlens=cu_seqlens, splits=splits,
                  params=tuple(x for x in kwargs.values() if isinstance(x, torch.Tensor)))
