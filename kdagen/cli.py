"""The ``kdagen`` command line.  ``kdagen COMMAND --help`` is the reference for each command."""
from __future__ import annotations

import json
import sys
import time

import click

from .dtypes import SHORT_NAMES, dtype
from .version import __version__


def _head_dims(value: str) -> list[tuple[int, int]]:
    out = []
    for part in value.split(";"):
        if not part.strip():
            continue
        dims = [int(x) for x in part.split(",")]
        if len(dims) == 1:
            dims = dims * 2
        if len(dims) != 2:
            raise click.BadParameter(f"{part!r}: expected K or K,V")
        out.append(tuple(dims))
    if not out:
        raise click.BadParameter("no head dims given")
    return out


def _shapes(value: str) -> list[tuple[int, int, int, int]]:
    out = []
    for sh in value.split(";"):
        if not sh.strip():
            continue
        try:
            B, T, H, K = (int(x) for x in sh.split(","))
        except ValueError:
            raise click.BadParameter(f"{sh!r}: expected B,T,H,K", param_hint="--shapes") from None
        out.append((B, T, H, K))
    return out


def _batches(value: str) -> list[int]:
    try:
        return [int(b) for b in value.split(",") if b.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected batch sizes separated by ','",
                                 param_hint="--decode-batches") from None


def _spec_args(lower_bound: float | None) -> dict:
    """The op arguments of the gate the kernels are built for: g given directly, bounded
    below by ``lower_bound`` when one is given.  (An in-kernel gate changes only the
    printed gate expression, not the tiling, so it is tuned through this one.)"""
    return {"safe_gate": lower_bound is not None, "lower_bound": lower_bound}


def _resolve_gpu(name: str):
    from .cache.gpus import detect_current, get_profile, known_names

    if name == "auto":
        prof = detect_current()
        if prof is None:
            raise click.UsageError("--gpu auto: no CUDA GPU is visible here; name a GPU "
                                   f"({', '.join(known_names())}) to compile-check for it")
        return prof
    try:
        return get_profile(name)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--gpu") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kdagen")
def main():
    """kdagen: generate, check and tune Triton kernels for Kimi Delta Attention (KDA) and
    the DPLR family of linear-attention recurrences.

    \b
    Typical use:
      kdagen verify --spec kda                      spec and oracle self-checks
      kdagen list                                   specs, gates, GPUs, cached winners
      kdagen inspect --spec kda --head-dim 128      print generated Triton source
      kdagen build --gpu h800 --head-dim 128        compile-check (and tune on that GPU)
    """


# --- verify -----------------------------------------------------------------------------

@main.command()
@click.option("--spec", "spec_name", default="kda", show_default=True, help="member: kda, gdn, deltanet, gla, dplr")
@click.option("--gate", default=None, help="gate: direct, lower_bound, softplus (default: the member's direct gate)")
@click.option("--lower-bound", type=float, default=None, help="lower bound of the gate (log space), e.g. -5")
@click.option("--seed", type=int, default=0, show_default=True)
def verify(spec_name, gate, lower_bound, seed):
    """Run the spec's and the float64 oracle's self-checks and print a table.

    Checks: structure analysis and safe sub-chunk bound; the chunkwise reference against the
    token-by-token recurrence on random shapes (T not a multiple of C, T=1, odd K/V, varlen,
    GVA); the degenerate members; and an exact sympy check of the chunkwise form.
    Exits 1 if any check fails.
    """
    from .spec.verify import run_verify

    ok = run_verify(spec_name, gate, lower_bound, seed=seed, echo=click.echo)
    sys.exit(0 if ok else 1)


# --- list -------------------------------------------------------------------------------

@main.command("list")
@click.option("--gpu", default=None, help="only this GPU's cache")
def list_cmd(gpu):
    """List the specs and gates kdagen knows, the GPU profiles, and the cached tuned winners."""
    from .cache.gpus import PROFILES
    from .cache.paths import cache_dir
    from .cache.store import TuningCache
    from .spec import GATES, MEMBERS, get_spec
    from .spec.structure import analyze_structure
    from .tuning.driver import duration, error_text

    click.echo("specs:")
    for name in MEMBERS:
        s = get_spec(name)
        click.echo(f"  {name:<9} hash {s.hash}  structure {analyze_structure(s).kind:<5} decay {s.decay}")
    click.echo("gates: " + ", ".join(GATES))
    click.echo("gpus:  " + ", ".join(PROFILES))
    d = cache_dir()
    files = sorted(d.glob("*.json")) if d.is_dir() else []
    click.echo(f"tuning cache: {d}")
    if not files:
        click.echo("  (empty: run `kdagen build --gpu auto` on a GPU to tune)")
    for f in files:
        name = f.stem
        if gpu and name != gpu:
            continue
        try:
            entries = TuningCache(name, cache_dir=d).entries()
        except Exception as e:  # noqa: BLE001
            click.echo(f"  {f.name}: unusable: {e}")
            continue
        click.echo(f"  {name}: {len(entries)} winner(s)")
        for key, e in sorted(entries.items()):
            dflt = e.get("default_time_ms")
            speed = f"  x{dflt / e['time_ms']:.2f} vs default" if dflt else ""
            click.echo(f"    {key}: {duration(e['time_ms'])}{speed}  error {error_text(e.get('error'))}  "
                       f"{json.dumps(e['config'], sort_keys=True)}")


# --- inspect ----------------------------------------------------------------------------

@main.command()
@click.option("--spec", "spec_name", default="kda", show_default=True)
@click.option("--head-dim", "head_dim", default="128", show_default=True, help="K or K,V")
@click.option("--dtype", "dtype_name", default="bf16", show_default=True, type=click.Choice(SHORT_NAMES))
@click.option("--form", default="chunk", show_default=True, type=click.Choice(["chunk", "chunk_bwd", "recurrent"]),
              help="chunk (forward), chunk_bwd (its backward) or recurrent (decode)")
@click.option("--lower-bound", type=float, default=None, help="the gate's lower bound (enables factorised tiles)")
@click.option("--gate-in-kernel", type=click.Choice(["none", "lower_bound", "softplus"]), default="none",
              show_default=True, help="print the in-kernel gate variant")
@click.option("--config", "config_json", default=None, help="config as JSON (default: the heuristic config)")
@click.option("--kernel", default=None, help="only this kernel (chunk_intra, chunk_state, chunk_bwd_state, "
                                             "chunk_bwd_dqkw, chunk_bwd_intra or recurrent)")
@click.option("--plan-only", is_flag=True, help="print the plan and config, not the source")
def inspect(spec_name, head_dim, dtype_name, form, lower_bound, gate_in_kernel, config_json, kernel, plan_only):
    """Print the plan, the config and the generated Triton source for a key."""
    from .cache.heuristics import default_config
    from .codegen.lower import LoweringError, lower
    from .codegen.render import FAMILY_KERNELS, render
    from .config import config_from_dict
    from .ops.inputs import select_spec
    from .spec import get_spec

    (K, V), = _head_dims(head_dim)
    try:
        if spec_name != "kda":
            spec = get_spec(spec_name, lower_bound=lower_bound)
        else:
            gik = gate_in_kernel != "none"
            lb = lower_bound if (gate_in_kernel != "softplus") else None
            if gate_in_kernel == "lower_bound" and lb is None:
                lb = -5.0
            # fused_recurrent_kda has no safe_gate: with g given its kernel is the direct gate's
            spec = select_spec(gik, lb is not None and not gik and form != "recurrent", lb, True, True)
        plan = lower(spec, K, V, dtype(dtype_name).name, "recurrent" if form == "recurrent" else "chunk",
                     gate_in_kernel != "none")
    except (ValueError, LoweringError) as e:
        raise click.UsageError(str(e)) from None
    family = {"chunk": "chunk_fwd", "chunk_bwd": "chunk_bwd", "recurrent": "recurrent"}[form]
    if config_json:
        try:
            config = config_from_dict(family, json.loads(config_json))
        except (ValueError, TypeError) as e:
            raise click.BadParameter(str(e), param_hint="--config") from None
    else:
        config = default_config(family, plan)
    click.echo(f"# plan  : {json.dumps(plan.to_dict(), sort_keys=True)}")
    click.echo(f"# config: {config.canonical()}")
    if plan_only:
        return
    kinds = FAMILY_KERNELS[family]
    if kernel:
        if kernel not in kinds:
            raise click.BadParameter(f"{kernel!r} is not a kernel of the {form} form ({', '.join(kinds)})")
        kinds = (kernel,)
    for kind in kinds:
        src = render(kind, plan, config)
        click.echo(f"# ---- {src.name}.py (sha256 {src.source_hash[:16]})")
        click.echo(src.text)


# --- build ------------------------------------------------------------------------------

@main.command()
@click.option("--gpu", "gpu_name", required=True, help="GPU profile name (h100, h800, h200, h20, a100, ...) or 'auto'")
@click.option("--spec", "spec_name", default="kda", show_default=True)
@click.option("--head-dim", "head_dim", default="128", show_default=True,
              help="K or K,V; several separated by ';' (e.g. '128;96,192')")
@click.option("--dtype", default="bf16", show_default=True, type=click.Choice(SHORT_NAMES))
@click.option("--state-dtype", default="fp32", show_default=True, type=click.Choice(SHORT_NAMES),
              help="dtype of the initial state (a decode pool may be bf16); winners are keyed by it")
@click.option("--lower-bound", type=float, default=-5.0, show_default=True,
              help="the gate's lower bound the kernels may assume (sets the safe sub-chunk)")
@click.option("--family", "families", multiple=True, type=click.Choice(["chunk_fwd", "chunk_bwd", "recurrent"]),
              help="kernel families (default: all)")
@click.option("--space", "space_path", default=None, help="a search-space JSON file of your own (one family)")
@click.option("--compile-only", is_flag=True, help="never tune, even on a matching GPU")
@click.option("--shapes", default="1,8192,96,128;2,16384,16,128;4,4096,32,128",
              show_default=True, help="tuning shapes B,T,H,K (chunk) separated by ';'")
@click.option("--decode-batches", default="1,64,256", show_default=True, help="tuning batch sizes for decode")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--quiet", is_flag=True, help="no progress lines")
@click.option("--jobs", type=int, default=None, help="compile in this many processes (default: min(8, CPUs))")
def build(gpu_name, spec_name, head_dim, dtype, state_dtype, lower_bound, families, space_path, compile_only, shapes,
          decode_batches, seed, quiet, jobs):
    """Generate the kernels for a spec and head dims, compile-check every candidate config
    for the GPU's architecture (no GPU needed), and -- when the current GPU is that GPU --
    tune them and store the winners in the cache.
    """
    from .cache.gpus import detect_current
    from .cache.paths import studies_dir
    from .codegen.lower import LoweringError
    from .tuning import driver
    from .tuning.compile_pool import CompilePool, default_jobs
    from .tuning.space import SearchSpaceError, load_space

    if spec_name != "kda":
        raise click.UsageError(f"kdagen generates kernels for the KDA structure; {spec_name!r} is not generated yet")
    gpu = _resolve_gpu(gpu_name)
    head_dims, shapes, batches = _head_dims(head_dim), _shapes(shapes), _batches(decode_batches)
    spec_args = _spec_args(lower_bound)
    families = [f for f in ("chunk_fwd", "chunk_bwd", "recurrent") if f in families] if families else \
        ["chunk_fwd", "chunk_bwd", "recurrent"]  # the backward is tuned after the forward (its chunk length)
    user_space = None
    if space_path:
        try:
            user_space = load_space(space_path)
        except SearchSpaceError as e:
            raise click.BadParameter(str(e), param_hint="--space") from None
        families = [user_space.kernel]
    current = None if compile_only else detect_current()
    will_tune = current is not None and current.name == gpu.name
    spec = driver.family_spec("chunk_fwd", spec_args)
    cc = gpu.compute_capability
    click.echo(f"kdagen {__version__}: build for {gpu.name} (sm_{cc[0]}{cc[1]}, "
               f"{gpu.sm_count} SMs, {gpu.smem_per_block_bytes // 1024} KiB smem/block); spec {spec.name} "
               f"hash {spec.hash}; {'compile-check and tune' if will_tune else 'compile-check only'}")
    if not will_tune and not compile_only:
        here = current.name if current else "no CUDA GPU"
        click.echo(f"  (not tuning: this machine has {here}, not {gpu.name})")
    # one set of compile processes for the compile-check and the tuner's compiles ahead
    with CompilePool(jobs or default_jobs()) as pool:
        t_start = time.time()
        try:
            surveys, n_empty = driver.compile_all(gpu, spec_args, dtype, head_dims, families, shapes, batches, pool,
                                                  space=user_space, quiet=quiet, echo=click.echo,
                                                  state_dtype=state_dtype)
        except (ValueError, LoweringError) as e:
            raise click.UsageError(str(e)) from None
        click.echo(f"compile-check done in {time.time() - t_start:.0f}s")
        if n_empty:
            click.echo("error: some kernels have no config that compiles for this GPU", err=True)
            sys.exit(1)
        if will_tune:
            try:
                driver.tune_and_store(gpu, spec_args, dtype, surveys, shapes, batches, space=user_space, seed=seed,
                                      quiet=quiet, pool=pool, echo=click.echo, state_dtype=state_dtype)
            except (KeyboardInterrupt, RuntimeError) as e:
                # an interrupt inside concurrent.futures' wait can surface as "release unlocked lock"
                if not (isinstance(e, KeyboardInterrupt) or isinstance(e.__context__, KeyboardInterrupt)):
                    raise
                click.echo(f"\ninterrupted after {time.time() - t_start:.0f}s: the winners tuned so far are in the "
                           f"cache and every measured trial is in {studies_dir()}; the same command resumes", err=True)
                sys.exit(130)
    click.echo(f"build done in {time.time() - t_start:.0f}s")


# --- tune -------------------------------------------------------------------------------

@main.command()
@click.option("--spec", "spec_name", default="kda", show_default=True)
@click.option("--head-dim", "head_dim", default="128", show_default=True)
@click.option("--dtype", default="bf16", show_default=True, type=click.Choice(SHORT_NAMES))
@click.option("--state-dtype", default="fp32", show_default=True, type=click.Choice(SHORT_NAMES),
              help="dtype of the initial state (a decode pool may be bf16); winners are keyed by it")
@click.option("--lower-bound", type=float, default=-5.0, show_default=True)
@click.option("--family", "families", multiple=True, type=click.Choice(["chunk_fwd", "chunk_bwd", "recurrent"]))
@click.option("--space", "space_path", default=None)
@click.option("--shapes", default="1,8192,96,128;2,16384,16,128;4,4096,32,128", show_default=True)
@click.option("--decode-batches", default="1,64,256", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.pass_context
def tune(ctx, spec_name, head_dim, dtype, state_dtype, lower_bound, families, space_path, shapes, decode_batches,
         seed):
    """Tune on the current GPU and store the winners (``kdagen build --gpu auto``)."""
    ctx.invoke(build, gpu_name="auto", spec_name=spec_name, head_dim=head_dim, dtype=dtype, state_dtype=state_dtype,
               lower_bound=lower_bound, families=families, space_path=space_path, compile_only=False,
               shapes=shapes, decode_batches=decode_batches, seed=seed, quiet=False, jobs=None)


# --- bench ------------------------------------------------------------------------------

@main.command()
@click.option("--shape", default="1,8192,96,128", show_default=True, help="B,T,H,K for the chunkwise form")
@click.option("--decode-batch", type=int, default=64, show_default=True)
def bench(shape, decode_batch):
    """Time kdagen's chunkwise forward, its forward+backward, and one decode step on the
    current GPU.

    The side-by-side comparison with flash-linear-attention lives in the repository's
    bench/bench.py (it needs FLA installed)."""
    import torch

    if not torch.cuda.is_available():
        click.echo("kdagen bench needs a CUDA GPU; none is visible here", err=True)
        sys.exit(1)
    import kdagen
    from triton.testing import do_bench

    from .tuning.candidates import random_inputs

    B, T, H, K = (int(x) for x in shape.split(","))
    x = random_inputs(B, T, H, H, K, K, torch.bfloat16, "cuda", 0)
    ms = do_bench(lambda: kdagen.chunk_kda(**x, output_final_state=True, safe_gate=True, lower_bound=-5.0),
                  warmup=50, rep=200, return_mode="median")
    click.echo(f"chunk_kda {shape}: {ms:.3f} ms")
    leaves = {n: t.detach().requires_grad_(True) for n, t in x.items()}
    do = torch.randn_like(x["v"])

    def fwd_bwd():
        o, _ = kdagen.chunk_kda(**leaves, output_final_state=True, safe_gate=True, lower_bound=-5.0)
        torch.autograd.grad(o, list(leaves.values()), do)

    ms = do_bench(fwd_bwd, warmup=20, rep=100, return_mode="median")
    click.echo(f"chunk_kda {shape} forward+backward: {ms:.3f} ms")
    x = random_inputs(decode_batch, 1, 32, 32, 128, 128, torch.bfloat16, "cuda", 0)
    us = 1e3 * do_bench(lambda: kdagen.fused_recurrent_kda(**x, output_final_state=True),
                        warmup=50, rep=200, return_mode="median")
    click.echo(f"fused_recurrent_kda B={decode_batch} H=32 K=V=128: {us:.1f} us")


# --- export -----------------------------------------------------------------------------

@main.command()
@click.option("--out", "out_dir", default=None, help="directory of the standalone package")
def export(out_dir):
    """Export tuned kernels as a standalone package (not built yet)."""
    click.echo("kdagen export is not built yet: a standalone package of generated sources and frozen "
               "configs registered with torch.library is planned; nothing was written.", err=True)
    sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
