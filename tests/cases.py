"""The tests' case factory and float64 oracle, for every member of the family: KDA ("kda"), Gated DeltaNet
("gdn"), DeltaNet ("delta", also spelled "deltanet"), GLA ("gla") and general DPLR ("dplr").

:func:`inputs` draws one case's seeded tensors -- shapes with GVA (``HV`` value heads over ``H`` q/k heads),
packed sequences (``cu_seqlens``), an initial state or none, the member's gate, beta or rank-1 vectors of
the kind asked for -- and :func:`make_inputs` is KDA's case as most of the suite draws it.  :func:`reference`
runs a member's token recurrence of :mod:`kdagen.spec.reference` in float64 on such a case (or on tensors
given by name), the answer the kernels are checked against.  :func:`in_kernel_gate` draws the parameters
of the in-kernel gate (A_log, dt_bias) from a generator of their own.

Every draw comes from one ``torch.Generator`` seeded with ``seed``, in a fixed order: q, k, v, then the
member's parts in ``order`` (the gate, beta, the rank-1 vectors a and b, the in-kernel gate's parameters),
then the initial state.  A case is its arguments: the same arguments give the same bits, and the options
name what is drawn and how, so tests that drew their inputs in different ways each get theirs back.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

F32, F64 = torch.float32, torch.float64

# the names a member goes by, and its canonical one
MEMBERS = {"kda": "kda", "gdn": "gdn", "delta": "delta", "deltanet": "delta", "gla": "gla", "dplr": "dplr"}

# each member's usual case; an option passed to inputs() replaces its default
DEFAULTS = {
    # KDA: per-channel gates in [g_lo, 0) with some at g_lo, beta in (0, 1) with exact 0s and 1s; the gate
    # stays float32 whatever the inputs' dtype
    "kda": dict(gate="random", beta="random"),
    # Gated DeltaNet: log-sigmoid scalar gates with some strong decays, drawn after beta, in the inputs' dtype
    "gdn": dict(gate="logsigmoid", decays=(3.0, 0.1), beta="uniform", order=("beta", "gate"), gate_in_dtype=True),
    "delta": dict(gate=None, beta="uniform"),
    # GLA: keys scaled by K^-1/2 (not normalised), log-sigmoid per-channel gates with some strong decays
    "gla": dict(key="scaled", gate="logsigmoid", decays=(4.0, 0.05), beta=None),
    # general DPLR (FLA's a, b): a unit read vector a and b = -u a' with a' a unit vector near a
    "dplr": dict(key="scaled", ab="near", gate="logsigmoid", decays=(4.0, 0.05), beta=None, order=("ab", "gate")),
}
PARTS = ("gate", "beta", "ab", "params")  # the default order of the member's draws after q, k, v


@dataclass
class Inputs:
    """One case's tensors; those a member has not are None.  ``g`` is the log decay ([B, T, HV, K], or
    [B, T, HV] for GDN's scalar gate; the raw gate input with the in-kernel gate), ``h0`` the initial state
    [N, HV, K, V]; ``gen`` is the generator after the case's draws (further draws of a test follow on)."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: Optional[torch.Tensor] = None
    beta: Optional[torch.Tensor] = None
    h0: Optional[torch.Tensor] = None
    cu_seqlens: Optional[torch.Tensor] = None
    a: Optional[torch.Tensor] = None
    b: Optional[torch.Tensor] = None
    A_log: Optional[torch.Tensor] = None
    dt_bias: Optional[torch.Tensor] = None
    gen: Optional[torch.Generator] = field(default=None, repr=False, compare=False)

    @property
    def gk(self):
        """FLA's name of a per-channel gate (GLA's and DPLR's)."""
        return self.g

    def take(self, *names):
        """The tensors of ``names``, in that order (None for those the case has not)."""
        return tuple(getattr(self, n) for n in names)

    def tensors(self, *names):
        """{name: tensor} of ``names``, None for those the case has not; by default the per-token tensors the
        case has (of q, k, v, g, beta, a, b)."""
        if names:
            return {n: getattr(self, n) for n in names}
        return {n: t for n in ("q", "k", "v", "g", "beta", "a", "b") if (t := getattr(self, n)) is not None}

    def ref_args(self):
        """q, k, v, g, beta as the float64 reference sees them (the kernel's rounded values)."""
        up = lambda x: None if x is None else x.detach().to(F64)  # noqa: E731
        return up(self.q), up(self.k), up(self.v), up(self.g), up(self.beta)


def inputs(member, B, T, H, HV, K, V, *, dtype=F32, seed=0, N=None, cu_seqlens=None, h0=True, **options) -> Inputs:
    """Seeded inputs of ``member`` (see :data:`MEMBERS`): q, k [B, T, H, K], v [B, T, HV, V], the member's
    parts per value head, and (``h0``) an initial state [N, HV, K, V] with N = ``N``, else the number of
    sequences of ``cu_seqlens`` (a list of offsets, returned as an int64 tensor), else B.

    ``options`` (each member's defaults in :data:`DEFAULTS`):

    * ``query``: "normal" (q = ``q_scale`` * N(0, 1), by default N(0, 1)) or "unit" (l2-normalised per head);
    * ``key``: "unit" (N(0, 1) l2-normalised per head), "scaled" (N(0, 1) * K^-1/2) or "raw"
      (``k_scale`` * N(0, 1), the input of the in-kernel l2-norm);
    * ``gate``: None (DeltaNet), or the log decay's kind --
      "random": in [g_lo, 0) with ~10% exactly g_lo (a second uniform draw picks them);
      "lb": -5 everywhere (no draw); "raw": ``g_scale`` * N(0, 1), the in-kernel gate's input;
      "below": in [-5, 0) but 20 tokens at -8 and one at -20 (below a -5 bound);
      "inf": in [-5, 0) with -inf (a reset) at one token and in some channels of another;
      "uniform": -``g_scale`` * U[0, 1);
      "logsigmoid": logsigmoid(N(0, 1) + 2), with ``decays`` = (d, p) then d less where a uniform draw is
      below p (some strong decays);
      ``lb`` (a promised lower bound): whatever the kind, g = lb * U[0, 1) instead, in [lb, 0);
      ``reset``: an index at which g is then -inf; ``gate_in_dtype``: g in ``dtype`` (else float32);
    * ``beta``: None (GLA, DPLR), or its kind --
      "random": in (0.01, 0.99) with every 7th element (from the 4th) 0 and every 11th (from the 6th) 1;
      "zero" / "one": constant (no draw); "small" / "large": "random"'s draw, then replaced by 1e-3 (0.5 + u)
      or 0.999 + 1e-3 (u - 0.5), u from a generator of its own (seed + 7) after every other draw;
      "uniform": U[0, 1); "sigmoid": sigmoid(N(0, 1)); "raw": ``beta_scale`` * N(0, 1), the in-kernel
      sigmoid's input; "unused": U[0, 1) drawn and not returned (a member without beta, given the draws of
      one with it);
    * ``ab`` (DPLR's FLA-convention a and b; u ~ U[0, 1) per token and head): "near": a a unit vector,
      b = -u a' with a' a unit vector near a; "noisy": a a unit vector, b = -u a + 0.1 K^-1/2 N(0, 1);
      "independent": a = -(a unit vector), b = u (another unit vector); "delta": a = -k', b = u k' (the delta
      rule's rank-1 term);
    * ``params`` (the in-kernel gate's A_log [HV] and dt_bias, [HV * K] for KDA, [HV] for GDN): "log1p":
      A_log = log(1 + 3 u), dt_bias = 0.5 N(0, 1); "log": A_log = log u, dt_bias = 0.5 N(0, 1); "mamba":
      A_log = log(1 + 15 u), dt_bias the inverse softplus of a log-uniform dt in [1e-3, 0.1);
    * ``order``: the order of the parts' draws (any left out follow in :data:`PARTS`' order);
    * ``state_scale``: h0 = state_scale * N(0, 1); ``v_first``: h0 drawn [N, HV, V, K].

    q, k, v, beta, a and b are in ``dtype``; h0, A_log and dt_bias stay float32."""
    m = MEMBERS[member]
    o = dict(DEFAULTS[m])
    o.update(options)
    unknown = set(o) - {"query", "q_scale", "key", "k_scale", "gate", "g_lo", "g_scale", "decays", "lb", "reset",
                        "gate_in_dtype", "beta", "beta_scale", "ab", "params", "order", "state_scale", "v_first"}
    if unknown:
        raise TypeError(f"inputs: unknown options {sorted(unknown)}")
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    if o.get("query", "normal") == "unit":
        q = F.normalize(q, p=2, dim=-1)
    elif o.get("q_scale") is not None:
        q = o["q_scale"] * q
    key = o.get("key", "unit")
    if key == "unit":
        k = F.normalize(torch.randn(B, T, H, K, generator=gen), p=2, dim=-1)
    elif key == "scaled":
        k = torch.randn(B, T, H, K, generator=gen) * K ** -0.5
    elif key == "raw":
        k = torch.randn(B, T, H, K, generator=gen)
        if o.get("k_scale") is not None:
            k = o["k_scale"] * k
    else:
        raise ValueError(f"inputs: key={key!r}")
    v = torch.randn(B, T, HV, V, generator=gen)
    x = Inputs(q, k, v)

    order = tuple(o.get("order", ())) + tuple(p for p in PARTS if p not in o.get("order", ()))
    gate_shape = (B, T, HV, K) if m != "gdn" else (B, T, HV)  # GDN's gate: a scalar per head
    for part in order:
        if part == "gate" and o.get("gate") is not None:
            x.g = _gate(gen, o, gate_shape, T, K)
        elif part == "beta" and o.get("beta") is not None:
            x.beta = _beta(gen, o, (B, T, HV), seed)
        elif part == "ab" and o.get("ab") is not None:
            x.a, x.b = _ab(gen, o["ab"], B, T, HV, K)
        elif part == "params" and o.get("params") is not None:
            x.A_log, x.dt_bias = _params(gen, o["params"], HV, HV * K if m == "kda" else HV)
    if o.get("beta") == "unused":
        x.beta = None
    if o.get("beta") in ("small", "large"):  # after every other draw, from a generator of its own
        u = torch.rand(x.beta.shape, generator=torch.Generator().manual_seed(seed + 7))
        x.beta = 1e-3 * (0.5 + u) if o["beta"] == "small" else 0.999 + 1e-3 * (u - 0.5)

    if N is None:
        N = len(cu_seqlens) - 1 if cu_seqlens is not None else B
    if h0:
        s = torch.randn(*((N, HV, V, K) if o.get("v_first") else (N, HV, K, V)), generator=gen)
        x.h0 = s if o.get("state_scale") is None else o["state_scale"] * s
    x.cu_seqlens = torch.tensor(cu_seqlens, dtype=torch.int64) if cu_seqlens is not None else None
    for n in ("q", "k", "v", "beta", "a", "b") + (("g",) if o.get("gate_in_dtype") else ()):
        if getattr(x, n) is not None:
            setattr(x, n, getattr(x, n).to(dtype))
    x.gen = gen
    return x


def _gate(gen, o, shape, T, K):
    kind = o["gate"]
    if o.get("lb") is not None:
        g = torch.rand(*shape, generator=gen) * o["lb"]
    elif kind == "random":
        g_lo = o.get("g_lo", -5.0)
        g = -g_lo * (torch.rand(*shape, generator=gen) - 1.0)  # (U[0,1) - 1) in [-1, 0)
        g = torch.where(torch.rand(*shape, generator=gen) < 0.1, torch.full_like(g, g_lo), g)
    elif kind == "lb":
        g = torch.full(shape, -5.0)
    elif kind == "raw":
        g = torch.randn(*shape, generator=gen)
        if o.get("g_scale") is not None:
            g = o["g_scale"] * g
    elif kind in ("below", "inf"):
        g = -5.0 * torch.rand(*shape, generator=gen)
        if kind == "below":  # 20 tokens at -8 (160 per 20 tokens: over any 16-token budget of 80), one at -20
            g[:, T // 4:T // 4 + 20] = -8.0
            g[:, (2 * T) // 3] = -20.0
        else:  # resets: a whole token, and some channels of another
            g[:, T // 3] = float("-inf")
            g[:, min(T - 1, T // 3 + 2), :, : K // 3] = float("-inf")
    elif kind == "uniform":
        g = -o["g_scale"] * torch.rand(*shape, generator=gen)
    elif kind == "logsigmoid":
        g = F.logsigmoid(torch.randn(*shape, generator=gen) + 2.0)
        if o.get("decays") is not None:
            drop, below = o["decays"]
            g -= drop * (torch.rand(*shape, generator=gen) < below)  # some strong decays
    else:
        raise ValueError(f"inputs: gate={kind!r}")
    if o.get("reset") is not None:
        g[o["reset"]] = -float("inf")
    return g


def _beta(gen, o, shape, seed):
    kind = o["beta"]
    if kind in ("random", "small", "large"):
        b = 0.01 + 0.98 * torch.rand(*shape, generator=gen)
        flat = b.view(-1)
        flat[3::7] = 0.0
        flat[5::11] = 1.0
        return b
    if kind == "zero":
        return torch.zeros(shape)
    if kind == "one":
        return torch.ones(shape)
    if kind in ("uniform", "unused"):
        return torch.rand(*shape, generator=gen)
    if kind == "sigmoid":
        return torch.sigmoid(torch.randn(*shape, generator=gen))
    if kind == "raw":
        b = torch.randn(*shape, generator=gen)
        return b if o.get("beta_scale") is None else o["beta_scale"] * b
    raise ValueError(f"inputs: beta={kind!r}")


def _ab(gen, kind, B, T, HV, K):
    if kind == "near":
        a = F.normalize(torch.randn(B, T, HV, K, generator=gen), dim=-1)
        b = -torch.rand(B, T, HV, 1, generator=gen) * F.normalize(
            a + 0.5 * torch.randn(B, T, HV, K, generator=gen) * K ** -0.5, dim=-1)
    elif kind == "noisy":
        a = F.normalize(torch.randn(B, T, HV, K, generator=gen), dim=-1)
        u = torch.rand(B, T, HV, 1, generator=gen)
        b = -u * a + 0.1 * torch.randn(B, T, HV, K, generator=gen) * K ** -0.5
    elif kind == "independent":
        a = -F.normalize(torch.randn(B, T, HV, K, generator=gen), dim=-1)
        b = F.normalize(torch.randn(B, T, HV, K, generator=gen), dim=-1) * torch.rand(B, T, HV, 1, generator=gen)
    elif kind == "delta":
        kk = F.normalize(torch.randn(B, T, HV, K, generator=gen), dim=-1)
        u = torch.rand(B, T, HV, 1, generator=gen)
        a, b = -kk, kk * u
    else:
        raise ValueError(f"inputs: ab={kind!r}")
    return a, b


def _params(gen, kind, HV, n_bias):
    if kind == "log1p":
        A_log = torch.log(1 + 3 * torch.rand(HV, generator=gen))
        return A_log, 0.5 * torch.randn(n_bias, generator=gen)
    if kind == "log":
        A_log = torch.rand(HV, generator=gen).log()
        return A_log, 0.5 * torch.randn(n_bias, generator=gen)
    if kind == "mamba":
        A_log = torch.log(1.0 + 15.0 * torch.rand(HV, generator=gen))
        dt = torch.exp(torch.rand(n_bias, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        return A_log, dt + torch.log(-torch.expm1(-dt))  # softplus(dt_bias) = dt
    raise ValueError(f"inputs: params={kind!r}")


def make_inputs(B, T, H, HV, K, V, *, dtype=F32, seed=0, n_seqs=None, h0=True, gate="random", beta="random",
                cu_seqlens=None, g_lo=-5.0) -> Inputs:
    """KDA's case: ``inputs("kda", ...)`` with its gate kinds ("random" in [g_lo, 0), "lb", "raw" at
    N(0, 1.5^2), "below", "inf") and beta kinds ("random", "zero", "one", "small", "large"); the initial
    state has ``n_seqs`` rows (default: the sequences of ``cu_seqlens``, else B).  q, k, v, beta are in
    ``dtype``; g and the initial state stay float32."""
    return inputs("kda", B, T, H, HV, K, V, dtype=dtype, seed=seed, N=n_seqs, cu_seqlens=cu_seqlens, h0=h0,
                  gate=gate, beta=beta, g_lo=g_lo, g_scale=1.5 if gate == "raw" else None)


def in_kernel_gate(seed, HV, K):
    """A_log [HV] and dt_bias [HV * K] of KDA's in-kernel gate, 0.5 N(0, 1) each, from a generator of their
    own (seed + 1000): a case's other inputs are those it has without the gate."""
    gen = torch.Generator().manual_seed(seed + 1000)
    A_log = 0.5 * torch.randn(HV, generator=gen)
    dt_bias = 0.5 * torch.randn(HV * K, generator=gen)
    return A_log, dt_bias


_FROM_INPUTS = object()


def reference(member, x=None, /, *, scale=None, cu_seqlens=_FROM_INPUTS, output_final_state=True, reverse=False,
              **tensors):
    """``(o, final state)`` of ``member``'s token recurrence (kdagen.spec.reference's naive_recurrent_*) in
    float64, on the tensors of ``x`` (an :class:`Inputs`, or a mapping by name) with those of ``tensors``
    (q, k, v, g or gk, beta, a, b, h0) in their place; the names a member does not read are ignored.  DPLR's
    a and b are FLA's (the spec's a', b' = -b, a).  ``cu_seqlens``: by default the case's.  ``reverse``: each
    sequence's tokens walked last to first (FLA's reverse), o given back in the tokens' order."""
    m = MEMBERS[member]

    def get(name):
        if name in tensors:
            return tensors[name]
        if name == "g" and "gk" in tensors:
            return tensors["gk"]
        if x is None:
            return None
        if isinstance(x, Mapping):
            return x.get(name, x.get("gk") if name == "g" else None)
        return getattr(x, name, None)

    if cu_seqlens is _FROM_INPUTS:
        cu_seqlens = None if x is None or isinstance(x, Mapping) else getattr(x, "cu_seqlens", None)
    up = lambda t: None if t is None else t.to(F64)  # noqa: E731
    q, k, v, g, beta, a, b = (up(get(n)) for n in ("q", "k", "v", "g", "beta", "a", "b"))
    h0 = get("h0")
    if reverse:
        bounds = [0, q.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()
        idx = torch.cat([torch.arange(e - 1, s - 1, -1) for s, e in zip(bounds, bounds[1:])]).long()
        q, k, v, g, beta, a, b = (None if t is None else t[:, idx] for t in (q, k, v, g, beta, a, b))
    # (imported here: importing this module imports no kdagen, so a rank tests/cp_worker.py spawns sets its
    # environment up before kdagen is imported)
    from kdagen.spec.reference import (naive_recurrent_deltanet, naive_recurrent_dplr, naive_recurrent_gdn,
                                       naive_recurrent_gla, naive_recurrent_kda)

    kw = dict(scale=scale, initial_state=up(h0), output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    if m == "kda":
        o, ht = naive_recurrent_kda(q, k, v, g, beta, **kw)
    elif m == "gdn":
        o, ht = naive_recurrent_gdn(q, k, v, g, beta, **kw)
    elif m == "delta":
        o, ht = naive_recurrent_deltanet(q, k, v, beta, **kw)
    elif m == "gla":
        o, ht = naive_recurrent_gla(q, k, v, g, **kw)
    else:
        o, ht = naive_recurrent_dplr(q, k, v, -b, a, g, **kw)
    if reverse:
        o = o[:, idx]  # idx is its own inverse (a flip within each sequence)
    return o, ht
