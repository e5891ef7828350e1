"""Resource report of generated kernels for sm_90, without a GPU: registers, spills, shared
memory, and which matrix instructions the compiler chose (wgmma = Hopper's warpgroup MMA,
mma.sync = the Ampere path) and whether loads are asynchronous (cp.async).

    python tests/sm90_report.py                      # the heuristic defaults, K=V=128, bf16
    python tests/sm90_report.py "d.replace(chunk_size=64)" "d.replace(state_num_warps=4)"
    python tests/sm90_report.py --bwd                # the backward's three launches
    python tests/sm90_report.py --bwd "d.replace(dqkw_num_warps=8)"   # d: default ChunkBwdConfig
    python tests/sm90_report.py --layer "d.replace(chunk_size=32)"     # the layer's call (flags in kernel)
    python tests/sm90_report.py --dplr                # general DPLR's training step (forward, re-run, backward)
    python tests/sm90_report.py --gates               # KDA's training step: bound trusted / checked / none
                                                        # (the --dplr rows: unbounded, g >= -5 trusted, checked)
    python tests/sm90_report.py --mix                 # KDA's training step, the SASS instruction mix per warp
    python tests/sm90_report.py --mix --layer '{"diag_precision": "tf32"}'   # the layer's call; backward fields
    python tests/sm90_report.py --decode              # the serving decode step (B=256, slot grid, PDL), batch
                                                        # and packed forms: registers and SASS opcode counts
    python tests/sm90_report.py --decode --v-first 8/4 16/4   # the same on a [V, K] pool (state_v_first),
                                                        # at each BV/warps given (default: 64/2, today's)
    python tests/sm90_report.py --decode --v-first 8/1/lean   # /lean: the config's lean one-item body; lean
                                                        # rows say how many spill loads/stores lie on the
                                                        # decode step's path (lean_step_local)

--mix reads the SASS (cuobjdump, also in Triton's wheel) of each launch of the training step (forward:
intra, state, output; backward: re-run, reverse pass, dqkw, wy, pass 2): these launches run straight-line
code per program (their K loop runs once), so the static count is the instructions each warp issues
(pass 2: 3,480 static against Nsight Compute's 3,517 issued per warp, measured on an H200).  The
columns: total, FP32 (FFMA / FMUL / FADD), shuffles, shared memory (LDS+STS+LDSM), barriers, spill traffic
(LDL+STL), MUFU (exp, rcp), HMMA.

Each argument is a Python expression over ``d`` (the default ChunkFwdConfig) and
``ChunkFwdConfig``.  Uses the ptxas shipped in the Triton wheel.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kdagen.cache.heuristics import default_chunk_config  # noqa: E402
from kdagen.config import ChunkFwdConfig  # noqa: E402
from kdagen.kernels import jit_source  # noqa: E402
from kdagen.ops.inputs import select_spec  # noqa: E402
from kdagen.tuning.compile_pool import launches_for  # noqa: E402
from kdagen.tuning.families import lower_for  # noqa: E402

# the ptxas Triton itself assembles sm_90 code with (its wheel's: from Triton 3.9 the newer of its two, whose
# PTX ISA the PTX it writes needs); nvdisasm and cuobjdump lie beside it
PTXAS = get_ptxas(90).path


def report(launch) -> dict:
    target = GPUTarget("cuda", 90, 32)
    src, options = jit_source(launch.fn, launch.args, launch.constexprs, target, launch.num_warps,
                              launch.num_stages)
    out = triton.compile(src, target=target, options=options)
    ptx = out.asm["ptx"]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        r = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", path, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    regs = max((int(m) for m in re.findall(r"Used (\d+) registers", r.stderr)), default=None)
    spill = max((int(m) for m in re.findall(r"(\d+) bytes spill stores", r.stderr)), default=None)
    return dict(regs=regs, spill_bytes=spill,
                smem=out.metadata.shared, wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"),
                cp_async=ptx.count("cp.async"), griddepcontrol=ptx.count("griddepcontrol."))


MIX = ("FFMA", "FMUL", "FADD", "SHFL", "LDS", "STS", "LDSM", "BAR", "LDL", "STL", "MUFU", "HMMA")


def _sm90_sass(launch, lineinfo: bool = False) -> tuple[str, int | None, int | None]:
    """The launch compiled for sm_90 by ptxas (Triton's wheel) and disassembled: (SASS text, registers, spill
    bytes).  ``lineinfo``: ptxas keeps the PTX's line table (no change to the code) and nvdisasm prints each
    instruction under its file and line and branch targets as labels; otherwise cuobjdump's listing."""
    target = GPUTarget("cuda", 90, 32)
    src, options = jit_source(launch.fn, launch.args, launch.constexprs, target, launch.num_warps,
                              launch.num_stages)
    out = triton.compile(src, target=target, options=options)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(out.asm["ptx"])
        cubin = os.path.join(d, "k.cubin")
        r = subprocess.run([PTXAS, "-v"] + (["-lineinfo"] if lineinfo else []) + ["--gpu-name", "sm_90a", path,
                                                                                  "-o", cubin],
                           capture_output=True, text=True)
        tool = ["nvdisasm", "-g", "-c"] if lineinfo else ["cuobjdump", "-sass"]
        sass = subprocess.run([os.path.join(os.path.dirname(PTXAS), tool[0])] + tool[1:] + [cubin],
                              capture_output=True, text=True).stdout
    regs = max((int(m) for m in re.findall(r"Used (\d+) registers", r.stderr)), default=None)
    spill = max((int(m) for m in re.findall(r"(\d+) bytes spill stores", r.stderr)), default=None)
    return sass, regs, spill


def sass_mix(launch) -> dict:
    """The launch's registers, spill and SASS opcode counts for sm_90 (cuobjdump of ptxas's cubin)."""
    from collections import Counter

    sass, regs, spill = _sm90_sass(launch)
    # one instruction per line: /*offset*/ [@predicate] OPCODE.modifiers ...
    ops = re.findall(r"^\s+/\*[0-9a-f]{4,6}\*/\s+(?:@!?U?P[0-9T] )?([A-Z0-9_]+)", sass, re.M)
    return dict(regs=regs, spill_bytes=spill, total=len(ops), **Counter(ops))


def local_memory(launch) -> dict:
    """The launch's sm_90 code as a control-flow graph with source lines, for where its local-memory traffic
    (register spills: STL / LDL) lies (``_sm90_sass`` with the line table).  Returns regs, spill_bytes,
    ``source`` (the kernel's own file, as the line table names it), ``text`` (the path of its source) and
    ``code``: [(address, opcode, file, line, successors)] in address order, successors being indices into
    ``code``."""
    sass, regs, spill = _sm90_sass(launch, lineinfo=True)
    where, rows, labels = (None, None), [], {}
    for row in sass.splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', row)
        if m:
            where = (m.group(1), int(m.group(2)))
            continue
        m = re.match(r"(\.L_x_\d+):", row)
        if m:
            labels[m.group(1)] = len(rows)
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,6})\*/\s+(@!?U?P[0-9T] )?([A-Z0-9_.]+)(.*)", row)
        if m:
            tgt = re.search(r"`\((\.L_x_\d+)\)", m.group(4))
            rows.append((int(m.group(1), 16), m.group(3), where, bool(m.group(2)), tgt.group(1) if tgt else None))
    code = []
    for i, (addr, op, (file, line), predicated, tgt) in enumerate(rows):
        base = op.split(".")[0]
        succ = []
        if not (base in ("BRA", "EXIT", "RET", "BRX", "JMP") and not predicated and op != "BRA.DIV"):
            succ.append(i + 1)
        if tgt and base in ("BRA", "CALL", "WARPSYNC", "BRX", "JMP"):
            succ.append(labels[tgt])
        code.append((addr, base, file, line, [j for j in succ if j < len(rows)]))
    # the kernel's own file as the line table names it: the entry's (Triton's cache may hand back code compiled
    # from the same source under another path); its text is the launch's source
    return dict(regs=regs, spill_bytes=spill, code=code, source=code[0][2] if code else None,
                text=launch.fn.fn.__code__.co_filename)


def lean_step_local(launch) -> dict:
    """For a lean launch: the local loads and stores (spills) on the decode step's path.  The step is every
    instruction of the kernel's source from the lean item's first line (``o_v0 = ...``) on; its path is
    what runs from the kernel's entry to the step and from the step on (the control-flow graph's
    reachability), so a spill in row 0's code (padding, other lengths, shared slots) is not on it.
    Returns regs, spill_bytes, ``local`` (all STL / LDL), ``on_step_path`` (those on the path) and
    ``step_ops`` (the step's instruction count, 0 if it was not found)."""
    r = local_memory(launch)
    with open(r["text"]) as f:
        first = next(i for i, t in enumerate(f.read().splitlines(), 1) if t.strip().startswith("o_v0 = i_v * BV"))
    code = r["code"]
    seeds = [i for i, c in enumerate(code) if c[2] == r["source"] and c[3] >= first]

    def reach(starts, edges):
        seen, todo = set(starts), list(starts)
        while todo:
            for j in edges[todo.pop()]:
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        return seen

    fwd = [c[4] for c in code]
    back = [[] for _ in code]
    for i, succ in enumerate(fwd):
        for j in succ:
            back[j].append(i)
    path = reach(seeds, fwd) | (reach([0], fwd) & reach(seeds, back))
    local = [(hex(c[0]), c[1], os.path.basename(c[2] or "?"), c[3]) for c in code if c[1] in ("STL", "LDL")]
    on_path = [(hex(c[0]), c[1], os.path.basename(c[2] or "?"), c[3]) for i, c in enumerate(code)
               if c[1] in ("STL", "LDL") and i in path]
    return dict(regs=r["regs"], spill_bytes=r["spill_bytes"] or 0, local=local, on_step_path=on_path,
                step_ops=len(seeds))


def mix_rows(layer: bool, bwd_fields: dict):
    """KDA's training-step launches (forward and backward; B=1, T=128, H=HV=1, K=V=128, bf16, g >= -5
    promised; ``layer``: with the layer's in-kernel gate from A_log/dt_bias -- its l2-norm launches are not
    listed) with the heuristic configs, the backward's changed by
    ``bwd_fields``: (kernel, warps, sass_mix)."""
    from kdagen.cache.heuristics import default_chunk_bwd_config
    from kdagen.ops.chunk import chunk_kda_bwd_launches

    K = V = 128
    x = [torch.zeros(1, 128, 1, n, dtype=torch.bfloat16) for n in (K, K, V)]
    kw = dict(initial_state=torch.zeros(1, 1, K, V), output_final_state=True, safe_gate=True, lower_bound=-5.0)
    if layer:
        kw.update(use_gate_in_kernel=True, A_log=torch.zeros(1), dt_bias=torch.zeros(K))
    plan = lower_for(select_spec(layer, True, -5.0, layer, layer), "chunk_fwd", K, V, torch.bfloat16)
    if bwd_fields:
        kw["bwd_config"] = default_chunk_bwd_config(plan).replace(**bwd_fields)
    fwd, bwd, _ = chunk_kda_bwd_launches(*x, torch.zeros(1, 128, 1, K), torch.zeros(1, 128, 1, dtype=torch.bfloat16),
                                         **kw)
    return [(ln.kernel, ln.num_warps, sass_mix(ln)) for ln in list(fwd) + list(bwd)]


def backward_rows(config=None):
    """The backward's launches (``config`` or the heuristic one) for B=1, T=128, H=HV=1,
    K=V=128, bf16."""
    from kdagen.ops.chunk import chunk_kda_bwd_launches

    K = V = 128
    x = [torch.zeros(1, 128, 1, n, dtype=torch.bfloat16) for n in (K, K, V)]
    _, bwd, _ = chunk_kda_bwd_launches(*x, torch.zeros(1, 128, 1, K), torch.zeros(1, 128, 1, dtype=torch.bfloat16),
                                       initial_state=torch.zeros(1, 1, K, V), output_final_state=True,
                                       safe_gate=True, lower_bound=-5.0, bwd_config=config)
    return [(ln.kernel.replace("chunk_", ""), report(ln)) for ln in bwd]  # the split adds chunk_bwd_wy


def dplr_rows(lower_bound, checked=False):
    """General DPLR's training-step launches with the heuristic configs (gk unbounded: element-wise
    diagonal tiles; bounded: factorised), B=1, T=128, H=HV=1, K=V=128, bf16: the forward's intra and
    state launches, the backward's re-run of the intra launch, and its three launches."""
    from kdagen.ops.dplr import chunk_dplr_bwd_launches

    K = V = 128
    x = [torch.zeros(1, 128, 1, n, dtype=torch.bfloat16) for n in (K, K, V, K, K)]
    cfgs = {}
    if checked:  # the promised bound checked per sub-tile in the kernels (the heuristic trusts it)
        from kdagen import spec as S
        from kdagen.cache.heuristics import default_chunk_bwd_config, default_train_config

        plan = lower_for(S.dplr(S.gate_direct(lower_bound)), "chunk_fwd", K, V, torch.bfloat16)
        shape = {"N": 1, "HV": 1}  # the call's, as the other rows' configs are resolved
        cfgs = dict(config=default_train_config(plan, shape).replace(check_gate_bound=True),
                    bwd_config=default_chunk_bwd_config(plan, shape).replace(check_gate_bound=True))
    fwd, bwd, _ = chunk_dplr_bwd_launches(*x, torch.zeros(1, 128, 1, K), initial_state=torch.zeros(1, 1, K, V),
                                          output_final_state=True, with_rerun=True, safe_gate=lower_bound is not None,
                                          lower_bound=lower_bound, **cfgs)
    names = ["intra", "state", "intra_rerun"][:len(fwd)] + ["bwd_state", "bwd_dqkw", "bwd_intra"]
    return [(name, report(ln)) for name, ln in zip(names, list(fwd) + list(bwd))]


def gate_rows():
    """KDA's training-step launches (heuristic configs, B=1, T=128, H=HV=1, K=V=128, bf16) for the
    promised bound -5 trusted (check_gate_bound=False: unchecked factorised diagonals), the same bound
    checked (the default: the main launches as trusted plus the span flags, and a repair launch after
    each intra launch), and no bound (checked the same way)."""
    from kdagen.cache.heuristics import default_chunk_bwd_config, default_train_config
    from kdagen.kernels import with_repairs
    from kdagen.ops.chunk import chunk_kda_bwd_launches

    K = V = 128
    x = [torch.zeros(1, 128, 1, n, dtype=torch.bfloat16) for n in (K, K, V)]
    rows = []
    for label, bound, check in (("trusted -5", -5.0, False), ("checked -5", -5.0, True), ("unbounded", None, True)):
        plan = lower_for(select_spec(False, bound is not None, bound, False, False), "chunk_fwd", K, V, torch.bfloat16)
        cfg = default_train_config(plan).replace(check_gate_bound=check)
        bcfg = default_chunk_bwd_config(plan).replace(check_gate_bound=check)
        fwd, bwd, _ = chunk_kda_bwd_launches(*x, torch.zeros(1, 128, 1, K), torch.zeros(1, 128, 1, dtype=torch.bfloat16),
                                             initial_state=torch.zeros(1, 1, K, V), output_final_state=True,
                                             safe_gate=bound is not None, lower_bound=bound, config=cfg, bwd_config=bcfg)
        for ln in with_repairs(list(fwd) + list(bwd)):
            name = ln.kernel.replace("chunk_", "") + (" repair" if ln.constexprs.get("REPAIR") else "")
            rows.append((label, name, report(ln)))
    return rows


def decode_launch(form: str, block_v: int = 64, num_warps: int = 2, state_v_first: bool = False,
                  lean: bool = False):
    """The serving decode step's launch (issue 13's shape: B=256, H=32, K=V=128, bf16 inputs, an fp32 pool of
    B+4 slots in the benchmarks' scrambled order, BV=64 on 2 warps unless given, loaded readout) as the H200
    runs it: the slot grid by the heuristic, PDL on.  ``form``: "batch" ([B, 1, H, K]) or "packed"
    (cu_seqlens); ``state_v_first``: the pool laid out [P, HV, V, K]; ``lean``: the config's lean one-item
    body."""
    from kdagen.codegen.lower import lower
    from kdagen.config import RecurrentConfig
    from kdagen.tuning.compile_pool import pool_launch_for

    N, HV, K = 256, 32, 128
    plan = lower(select_spec(False, False, None, False, False), K, K, "bfloat16", "recurrent")
    return pool_launch_for(plan, RecurrentConfig(block_v=block_v, num_warps=num_warps, readout="loaded", lean=lean),
                           torch.bfloat16, (N, 1, HV, HV), pdl=True,
                           slots=((torch.arange(N) * 7) % (N + 4)).to(torch.int32), packed=form == "packed",
                           by_slot=None, state_v_first=state_v_first)


def main(argv):
    if argv[:1] == ["--decode"]:
        cols = ("BAR", "SHFL", "REDUX", "LDS", "STS", "LDG", "STG")
        v_first = argv[1:2] == ["--v-first"]
        # BV/warps, then optionally /lean
        tiles = [tuple(a.split("/")) for a in argv[2 if v_first else 1:]] or [("64", "2")]
        print(f"{'pool':<6} {'BV/warps':>8} {'form':<7} {'slot grid':>9} {'regs':>4} {'spill':>5} {'total':>6} "
              + " ".join(f"{c:>5}" for c in cols))
        for bv, w, *extra in tiles:
            for form in ("batch", "packed"):
                ln = decode_launch(form, int(bv), int(w), v_first, "lean" in extra)
                r = sass_mix(ln)
                tile = "/".join((bv, w) + tuple(extra))
                where = ""
                if "lean" in extra:  # where its spills lie: on the decode step's path, or in row 0's code
                    spot = lean_step_local(ln)
                    where = f"  local loads/stores {len(spot['local'])}, on the step's path {len(spot['on_step_path'])}"
                print(f"{'[V,K]' if v_first else '[K,V]':<6} {tile:>8} {form:<7} "
                      f"{str(ln.constexprs['SLOT_GRID']):>9} {r['regs']:>4} {r['spill_bytes'] or 0:>5} "
                      f"{r['total']:>6} " + " ".join(f"{r.get(c, 0):>5}" for c in cols) + where)
        return
    if argv[:1] == ["--mix"]:
        import json

        layer = argv[1:2] == ["--layer"]
        rest = argv[2:] if layer else argv[1:]
        print(f"{'kernel':<16} {'warps':>5} {'regs':>4} {'spill':>5} {'total':>6} " + " ".join(f"{k:>5}" for k in MIX))
        for name, warps, r in mix_rows(layer, json.loads(rest[0]) if rest else {}):
            print(f"{name:<16} {warps:>5} {r['regs']:>4} {r['spill_bytes']:>5} {r['total']:>6} "
                  + " ".join(f"{r.get(k, 0):>5}" for k in MIX))
        return
    if argv[:1] == ["--gates"]:
        print(f"{'gate':<12} {'kernel':<17} {'regs':>4} {'spill':>5} {'smem':>6} {'wgmma':>5} {'mma.sync':>8}")
        for label, name, r in gate_rows():
            print(f"{label:<12} {name:<17} {r['regs']:>4} {r['spill_bytes']:>5} {r['smem']:>6} {r['wgmma']:>5} "
                  f"{r['mma_sync']:>8}")
        return
    if argv[:1] == ["--dplr"]:
        print(f"{'gate':<12} {'kernel':<12} {'regs':>4} {'spill':>5} {'smem':>6} {'wgmma':>5} {'mma.sync':>8} "
              f"{'cp.async':>8}")
        for lb, checked in ((None, False), (-5.0, False), (-5.0, True)):
            label = ("g >= " + str(lb) + (" checked" if checked else "")) if lb else "unbounded"
            for name, r in dplr_rows(lb, checked):
                print(f"{label:<12} {name:<12} {r['regs']:>4} {r['spill_bytes']:>5} "
                      f"{r['smem']:>6} {r['wgmma']:>5} {r['mma_sync']:>8} {r['cp_async']:>8}")
        return
    if argv[:1] == ["--bwd"]:
        from kdagen.config import ChunkBwdConfig
        from kdagen.cache.heuristics import default_chunk_bwd_config

        plan = lower_for(select_spec(False, True, -5.0, False, False), "chunk_fwd", 128, 128, torch.bfloat16)
        d = default_chunk_bwd_config(plan)
        print(f"{'config':<48} {'kernel':<10} {'regs':>4} {'spill':>5} {'smem':>6} {'wgmma':>5} {'mma.sync':>8} "
              f"{'cp.async':>8}")
        for e in argv[1:] or ["d"]:
            cfg = eval(e, {"d": d, "ChunkBwdConfig": ChunkBwdConfig})  # noqa: S307 - a developer tool
            for name, r in backward_rows(cfg):
                print(f"{e:<48} {name:<10} {r['regs']:>4} {r['spill_bytes']:>5} {r['smem']:>6} {r['wgmma']:>5} "
                      f"{r['mma_sync']:>8} {r['cp_async']:>8}")
        return
    layer = argv[:1] == ["--layer"]
    if layer:  # the KDA layer's call: raw q/k (l2-norm), raw gate with A_log/dt_bias, raw beta, in the kernels
        argv = argv[1:]
    spec = select_spec(False, True, -5.0, False, False)
    plan = lower_for(spec, "chunk_fwd", 128, 128, torch.bfloat16)
    d = default_chunk_config(plan)
    exprs = argv or ["d"]
    print(f"{'config':<48} {'kernel':<11} {'regs':>4} {'spill':>5} {'smem':>6} {'wgmma':>5} {'mma.sync':>8} "
          f"{'cp.async':>8}")
    for e in exprs:
        cfg = eval(e, {"d": d, "ChunkFwdConfig": ChunkFwdConfig})  # noqa: S307 - a developer tool
        if layer:
            from kdagen.ops.chunk import chunk_kda_launches

            x = [torch.zeros(1, 128, 1, 128, dtype=torch.bfloat16) for _ in range(3)]
            launches, _ = chunk_kda_launches(
                *x, torch.zeros(1, 128, 1, 128), torch.zeros(1, 128, 1, dtype=torch.bfloat16),
                initial_state=torch.zeros(1, 1, 128, 128), output_final_state=True, config=cfg,
                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                lower_bound=-5.0, A_log=torch.zeros(1), dt_bias=torch.zeros(128))
        else:
            launches = launches_for(plan, cfg, torch.bfloat16, {"safe_gate": True, "lower_bound": -5.0})
        for ln in launches:
            stage = ln.kernel
            r = report(ln)
            print(f"{e:<48} {stage:<11} {r['regs']:>4} {r['spill_bytes']:>5} {r['smem']:>6} {r['wgmma']:>5} "
                  f"{r['mma_sync']:>8} {r['cp_async']:>8}")


if __name__ == "__main__":
    main(sys.argv[1:])
