"""What the ops launch with their default configs, recorded without running a kernel: for a refactoring's
before/after check that the generated kernels did not change (issue 56: "the rendered source of every default
config ... byte-identical before and after").

    TRITON_INTERPRET=1 KDAGEN_CACHE_DIR=$(mktemp -d) python tests/render_snapshot.py --out A.json
    (the same at the other commit, e.g. PYTHONPATH=<its tree> ... --out B.json)
    python tests/render_snapshot.py --diff A.json B.json [--show N]     (exit status 1 where they differ)

Each case calls the public ops on CPU tensors in the interpreter with ``kdagen.kernels.launch`` replaced by a
recorder (and the interpreter's bf16-to-fp32 cast of the inputs off, so bf16 calls plan as on a GPU), so every
launch the op makes -- forward, the training step's backward, decode -- is recorded in order with the full
text of its generated module, its constexprs, warps, stages and grid; nothing runs (the outputs stay as
allocated).  The cases are the README suite's and the build's default shapes: KDA forward, layer call and
training step at (1, 8192, 96), (2, 16384, 16), (4, 4096, 32); KDA decode at B = 1, 16, 64, 256 with 32 heads,
with and without a state pool; Gated DeltaNet, DeltaNet, GLA and general DPLR forward (inference and
training) at (2, 16384, 16), and each member's decode; bf16, K = V = 128.  A module's name carries a hash of
its source, so names are compared with it removed.
Only public ops and ``kdagen.kernels.launch`` are used, so the script runs against older trees too."""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys

SHAPES = ((1, 8192, 96), (2, 16384, 16), (4, 4096, 32))
MEMBER_SHAPE = (2, 16384, 16)
DECODE_BATCHES = (1, 16, 64, 256)
K = V = 128


def _inputs(torch, B, T, H, gate: str):
    z = lambda *s, dt=torch.bfloat16: torch.zeros(*s, dtype=dt)  # noqa: E731
    x = dict(q=z(B, T, H, K), k=z(B, T, H, K), v=z(B, T, H, V), beta=z(B, T, H))
    if gate == "channel":
        x["g"] = z(B, T, H, K, dt=torch.float32)
    elif gate == "scalar":
        x["g"] = z(B, T, H, dt=torch.float32)
    return x


def _grad(x: dict) -> dict:
    return {n: t.requires_grad_() for n, t in x.items()}


def _backward(outs):
    o, ht = outs[0], outs[1]
    loss = o.float().sum() + (ht.sum() if ht is not None else 0)
    loss.backward()


def cases(torch, kdagen):
    """(name, a function that makes the case's calls)."""
    h0 = lambda B, H: torch.zeros(B, H, K, V)  # noqa: E731
    out = []
    for B, T, H in SHAPES:
        def kda_fwd(B=B, T=T, H=H):
            x = _inputs(torch, B, T, H, "channel")
            with torch.no_grad():
                kdagen.chunk_kda(**x, initial_state=h0(B, H), output_final_state=True, safe_gate=True,
                                 lower_bound=-5.0)

        def kda_layer(B=B, T=T, H=H):
            x = _inputs(torch, B, T, H, "channel")
            with torch.no_grad():
                kdagen.chunk_kda(**x, initial_state=h0(B, H), output_final_state=True, safe_gate=True,
                                 lower_bound=-5.0, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                 A_log=torch.zeros(H), dt_bias=torch.zeros(H * K), use_beta_sigmoid_in_kernel=True)

        def kda_train(B=B, T=T, H=H):
            x = _grad(_inputs(torch, B, T, H, "channel"))
            _backward(kdagen.chunk_kda(**x, initial_state=h0(B, H).requires_grad_(), output_final_state=True,
                                       safe_gate=True, lower_bound=-5.0))

        out += [(f"kda fwd {B},{T},{H}", kda_fwd), (f"kda layer {B},{T},{H}", kda_layer),
                (f"kda fwdbwd {B},{T},{H}", kda_train)]
    for N in DECODE_BATCHES:
        def kda_decode(N=N):
            x = _inputs(torch, N, 1, 32, "channel")
            with torch.no_grad():
                kdagen.fused_recurrent_kda(**x, initial_state=h0(N, 32), output_final_state=True,
                                           use_qk_l2norm_in_kernel=True)

        def kda_pool(N=N):
            x = _inputs(torch, N, 1, 32, "channel")
            pool = torch.zeros(N + 8, 32, K, V)
            with torch.no_grad():
                kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=torch.arange(N) + 4,
                                           use_qk_l2norm_in_kernel=True)

        out += [(f"kda decode {N}", kda_decode), (f"kda decode pool {N}", kda_pool)]

    B, T, H = MEMBER_SHAPE
    members = dict(
        gdn=(kdagen.chunk_gated_delta_rule, kdagen.fused_recurrent_gated_delta_rule, "scalar", True),
        deltanet=(kdagen.chunk_delta_rule, kdagen.fused_recurrent_delta_rule, None, True),
        gla=(kdagen.chunk_gla, kdagen.fused_recurrent_gla, "channel", False),
    )
    for name, (chunk, recurrent, gate, has_beta) in members.items():
        def fwd(chunk=chunk, gate=gate, has_beta=has_beta, grad=False):
            x = _inputs(torch, B, T, H, gate)
            if not has_beta:
                x.pop("beta")
            if grad:
                x = _grad(x)
                _backward(chunk(**x, initial_state=h0(B, H).requires_grad_(), output_final_state=True))
            else:
                with torch.no_grad():
                    chunk(**x, initial_state=h0(B, H), output_final_state=True)

        def dec(recurrent=recurrent, gate=gate, has_beta=has_beta):
            x = _inputs(torch, 16, 1, 32, gate)
            if not has_beta:  # GLA: no beta, and its recurrent op names the gate gk (FLA's)
                x.pop("beta")
                x["gk"] = x.pop("g")
            with torch.no_grad():
                recurrent(**x, initial_state=h0(16, 32), output_final_state=True)

        out += [(f"{name} fwd", fwd), (f"{name} fwdbwd", lambda fwd=fwd: fwd(grad=True)), (f"{name} decode", dec)]

    def dplr(grad=False):
        x = _inputs(torch, B, T, H, "channel")
        x.pop("beta")
        x["a"], x["b"], x["gk"] = torch.zeros_like(x["q"]), torch.zeros_like(x["q"]), x.pop("g")
        if grad:
            x = _grad(x)
            _backward(kdagen.chunk_dplr_delta_rule(**x, initial_state=h0(B, H).requires_grad_(),
                                                   output_final_state=True))
        else:
            with torch.no_grad():
                kdagen.chunk_dplr_delta_rule(**x, initial_state=h0(B, H), output_final_state=True)

    out += [("dplr fwd", dplr), ("dplr fwdbwd", lambda: dplr(grad=True))]
    return out


def _module_text(fn) -> tuple[str, str]:
    """(the kernel's name, its generated module's text)."""
    py = getattr(fn, "fn", fn)
    with open(py.__code__.co_filename) as f:
        return py.__name__, f.read()


def _plain(v):
    return v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)


def record(names=None) -> dict:
    """The snapshot of the cases named (default: all): case -> its launches, in order."""
    import torch

    import kdagen
    from kdagen import kernels
    from kdagen.ops import inputs

    calls = []

    def recorder(fn, grid, args, constexprs, num_warps, num_stages, *rest, **kw):
        name, text = _module_text(fn)
        calls.append(dict(kernel=name, constexprs={k: _plain(v) for k, v in constexprs.items()},
                          num_warps=num_warps, num_stages=num_stages, grid=[_plain(g) for g in grid], source=text))

    saved = kernels.launch, getattr(inputs, "interpreting", None)
    # every module that bound the launcher by name (a decode fast path's later calls launch through it)
    bound = [m for n, m in list(sys.modules.items())
             if n.startswith("kdagen") and getattr(m, "launch", None) is saved[0]]
    for m in bound:
        m.launch = recorder
    if saved[1] is not None:  # trees that compute bf16 in fp32 under the interpreter: the GPU's launches
        inputs.interpreting = lambda: False
    snap = {}
    try:
        for name, call in cases(torch, kdagen):
            if names and name not in names:
                continue
            calls.clear()
            try:
                call()
                snap[name] = list(calls)
            except Exception as e:  # noqa: BLE001 - a case that fails at one commit is a difference to report
                snap[name] = [dict(error=f"{type(e).__name__}: {e}"[:2000], launches_before_error=len(calls))]
            print(f"{name}: {len(snap[name])} launches", file=sys.stderr)
    finally:
        for m in bound:
            m.launch = saved[0]
        if saved[1] is not None:
            inputs.interpreting = saved[1]
    return snap


_HASH = re.compile(r"_[0-9a-f]{12}\b")


def _norm(s: str) -> str:
    return _HASH.sub("_<hash>", s)


def diff(a: dict, b: dict, show: int) -> int:
    """Print each case's differences; the number of cases that differ."""
    differ = 0
    for case in sorted(set(a) | set(b)):
        la, lb = a.get(case), b.get(case)
        if la is None or lb is None:
            print(f"== {case}: only in {'A' if lb is None else 'B'}")
            differ += 1
            continue
        lines = []
        if len(la) != len(lb):
            lines.append(f"   launches: {len(la)} -> {len(lb)}: {[x.get('kernel') for x in la]} -> "
                         f"{[x.get('kernel') for x in lb]}")
        for i, (x, y) in enumerate(zip(la, lb)):
            if "error" in x or "error" in y:
                if x != y:
                    lines.append(f"   [{i}] error: {x.get('error')} -> {y.get('error')}")
                continue
            what = f"[{i}] {_norm(x['kernel'])}"
            if _norm(x["kernel"]) != _norm(y["kernel"]):
                lines.append(f"   {what}: kernel {x['kernel']} -> {y['kernel']}")
            for field in ("num_warps", "num_stages", "grid"):
                if x[field] != y[field]:
                    lines.append(f"   {what}: {field} {x[field]} -> {y[field]}")
            ca, cb = x["constexprs"], y["constexprs"]
            changed = {k: (ca.get(k, "-"), cb.get(k, "-")) for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)}
            if changed:
                lines.append(f"   {what}: constexprs {changed}")
            sa, sb = _norm(x["source"]), _norm(y["source"])
            if sa != sb:
                d = list(difflib.unified_diff(sa.splitlines(), sb.splitlines(), "A", "B", n=1, lineterm=""))
                lines.append(f"   {what}: source differs ({sum(1 for l in d if l[:1] in '+-') - 2} lines)")
                lines += ["      " + l for l in d[2:2 + show]]
        if lines:
            differ += 1
            print(f"== {case}")
            print("\n".join(lines))
        else:
            print(f"== {case}: identical ({len(la)} launches)")
    return differ


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the snapshot (JSON) here")
    p.add_argument("--cases", default="", help="case names separated by semicolons (default: all)")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), help="compare two snapshots")
    p.add_argument("--show", type=int, default=40, help="diff lines shown per differing source")
    args = p.parse_args(argv)
    if args.diff:
        a, b = (json.load(open(f)) for f in args.diff)
        n = diff(a, b, args.show)
        print(f"{n} case(s) differ")
        return 1 if n else 0
    if os.environ.get("TRITON_INTERPRET") != "1":
        p.error("set TRITON_INTERPRET=1 (the ops take CPU tensors in the interpreter; nothing is run)")
    snap = record([c for c in args.cases.split(";") if c] or None)
    with open(args.out, "w") as f:
        json.dump(snap, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
