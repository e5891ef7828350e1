"""The ``kdagen`` command line.  ``kdagen COMMAND --help`` is the reference for each command.

Every argument is checked before any work starts: a user mistake ends the command with exit
code 2 and one ``Error:`` line that says what was wrong and what is accepted."""
from __future__ import annotations

import json
import os
import importlib.util
import sys
import time

import click
from click.core import ParameterSource

from .dtypes import SHORT_NAMES, dtype as as_dtype
from .spec import GATES, MEMBERS
from .tuning.bench_cases import MEMBERS as _BENCH_MEMBERS, SUITES as BENCH_SUITES
from .tuning.benchmark import PASSES

BENCH_MEMBERS = tuple(_BENCH_MEMBERS)
from .tuning.families import FAMILIES
from .version import __version__

DEFAULT_LOWER_BOUND = "-5"  # the gate bound every command assumes unless told otherwise
DEFAULT_SHAPES = "1,8192,96,128;2,16384,16,128;4,4096,32,128"


# --- argument types ---------------------------------------------------------------------

class _IntTuples(click.ParamType):
    """Groups of positive integers: groups separated by ';', numbers by ','."""

    def __init__(self, name: str, sizes: tuple[int, ...], expected: str):
        self.name, self.sizes, self.expected = name, sizes, expected

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        out = []
        for part in str(value).split(";"):
            if not part.strip():
                continue
            fields = [f.strip() for f in part.split(",")]
            if len(fields) not in self.sizes or not all(f.isdigit() and int(f) > 0 for f in fields):
                where = "" if part.strip() == str(value).strip() else f" in {value!r}"
                self.fail(f"{part.strip()!r}{where}: expected {self.expected}", param, ctx)
            out.append(tuple(int(f) for f in fields))
        if not out:
            self.fail(f"{value!r}: nothing given; expected {self.expected}", param, ctx)
        return out


class _HeadDims(_IntTuples):
    def __init__(self):
        super().__init__("K[,V][;...]", (1, 2), "K or K,V (positive integers), several separated by ';', e.g. 128 "
                                                "or 96,192 or '128;96,192'")

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        return [(d[0], d[-1]) for d in super().convert(value, param, ctx)]


class _List(click.ParamType):
    """Values separated by ','; ``parse`` turns one into its value, or None when it is not
    accepted (``expected`` says what is)."""

    def __init__(self, name: str, parse, expected: str):
        self.name, self.parse, self.expected = name, parse, expected

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        out = [self.parse(f.strip()) for f in str(value).split(",") if f.strip()]
        if not out or None in out:
            self.fail(f"{value!r}: expected {self.expected}", param, ctx)
        return list(dict.fromkeys(out))


class _LowerBound(click.ParamType):
    """The gate's lower bound: a negative number, or 'none' (g unbounded below)."""

    name = "NUMBER|none"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, float):
            return value
        if str(value).strip().lower() == "none":
            return None
        try:
            bound = float(value)
        except ValueError:
            bound = float("nan")
        if not bound < 0:
            self.fail(f"{value!r}: expected a negative number (the smallest log decay g may take, e.g. -5) or "
                      "'none' (g unbounded below)", param, ctx)
        return bound


class _SpecRef(click.ParamType):
    """A spec: a member's name or a Recurrence in the user's file, ``path/to/file.py:NAME``
    (:func:`kdagen.load_spec`).  Converted to the canonical reference (the file made absolute)
    after the spec loads and validates."""

    name = "NAME|FILE.py:NAME"

    def convert(self, value, param, ctx):
        from .spec.load import SpecLoadError, canonical_ref, load_spec

        try:
            load_spec(value)
        except SpecLoadError as e:
            self.fail(str(e), param, ctx)
        return canonical_ref(value)


SPEC_REF = _SpecRef()
SPEC_HELP = (f"a member ({', '.join(MEMBERS)}) or a spec of your own: path/to/file.py:NAME, a Recurrence (or a "
             "function returning one) in that file")
HEAD_DIMS = _HeadDims()
CHUNK_SHAPES = _IntTuples("B,T,H,K[;...]", (4,), "B,T,H,K (positive integers), several separated by ';', e.g. "
                                                 "'1,8192,96,128;2,16384,16,128'")
BENCH_SHAPES = _IntTuples("B,T,H,K[,V][;...]", (4, 5), "B,T,H,K or B,T,H,K,V (positive integers), several "
                                                       "separated by ';', e.g. '1,8192,96,128;2,16384,16,128'")
LOWER_BOUND = _LowerBound()
BATCHES = _List("B,...", lambda f: int(f) if f.isdigit() and int(f) > 0 else None,
                "batch sizes (positive integers) separated by ',', e.g. 1,64,256")
HEADS = _List("HV,...", lambda f: int(f) if f.isdigit() and int(f) > 0 else None,
              "value head counts (positive integers) separated by ',', e.g. 32 or 16,64")
PASS_LIST = _List("PASS,...", lambda f: f if f in PASSES else None,
                  f"passes among {', '.join(PASSES)} separated by ','")
MEMBER_LIST = _List("MEMBER,...", lambda f: f if f in BENCH_MEMBERS else None,
                    f"members among {', '.join(BENCH_MEMBERS)} separated by ','")


def _given(name: str) -> bool:
    """Whether the user gave option ``name`` (rather than its default)."""
    return click.get_current_context().get_parameter_source(name) not in (ParameterSource.DEFAULT, None)


def _options(*decorators):
    def apply(f):
        for d in reversed(decorators):
            f = d(f)
        return f
    return apply


def _gpu_name(ctx, param, value):
    """--gpu: a known profile, or 'auto' (resolved when the command runs)."""
    from .cache.gpus import get_profile

    if value is None or value == "auto":
        return value
    try:
        return get_profile(value).name
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None


def _spec_args(lower_bound: float | None, spec_ref: str = "kda") -> dict:
    """The op arguments of the gate the kernels are built for: g given directly, bounded
    below by ``lower_bound`` when one is given.  (An in-kernel gate changes only the
    printed gate expression, not the tiling, so it is tuned through this one.)  Any spec but
    the KDA member is named too (:func:`kdagen.tuning.families.family_spec`)."""
    args = {"safe_gate": lower_bound is not None, "lower_bound": lower_bound}
    if spec_ref != "kda":
        args["spec"] = spec_ref
    return args


def _is_file_ref(ref: str) -> bool:
    return ref not in MEMBERS


def _resolve_spec(ref: str, lower_bound, gate: str | None = None):
    """The spec a command runs: a member with ``gate`` and ``lower_bound`` (as
    :func:`kdagen.spec.get_spec`), or a user's spec as its file writes it -- where
    ``--lower-bound``, when given, replaces a direct gate's bound and is refused for a gate
    expression, whose range sets its own bound."""
    from .spec import gate_direct, get_spec
    from .spec.load import load_spec

    if not _is_file_ref(ref):
        try:
            return get_spec(ref, gate=gate, lower_bound=lower_bound)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    spec = load_spec(ref)
    if gate is not None:
        raise click.BadParameter(f"--gate chooses a member's gate; {spec.name!r} (from {ref}) has its own gate "
                                 f"({_gate_text(spec)}): leave --gate out", param_hint="--gate")
    if _given("lower_bound"):
        if spec.gate is None:
            raise click.BadParameter(f"{spec.name!r} has no decay, so it takes no bound: leave --lower-bound out",
                                     param_hint="--lower-bound")
        if spec.gate.name != "direct":
            raise click.BadParameter(f"the gate of {spec.name!r} sets its own bound ({_gate_text(spec)}): leave "
                                     "--lower-bound out", param_hint="--lower-bound")
        return spec.with_gate(gate_direct(lower_bound))
    return spec


def _spec_bound(spec, lower_bound):
    """The bound the kernels of a resolved spec may assume: a member's --lower-bound, a user
    spec's own gate's bound."""
    return spec.gate.lower_bound if spec.gate is not None else lower_bound


def _check_head_dims(head_dims, param_hint: str = "--head-dim") -> None:
    from .codegen.lower import WIDEST_HEAD_DIM, head_dim_error

    # the widest any structure takes; a spec's own limit is checked when it is lowered (_check_lowerable)
    for K, V in head_dims:
        why = head_dim_error(K, V, WIDEST_HEAD_DIM)
        if why:
            raise click.BadParameter(why, param_hint=param_hint)


def _check_lowerable(spec, ref: str, head_dims, dtype, forms=("chunk", "recurrent"), gate_in_kernel=False) -> dict:
    """Lower ``spec`` at every head dim (:func:`kdagen.spec.check_lowerable`): the plans, or a usage
    error on --spec that says why kdagen's templates cannot generate its kernels."""
    from .codegen.lower import head_dim_error, spec_max_head_dim
    from .spec.validate import NotLowerable, check_lowerable

    limit = spec_max_head_dim(spec)  # the spec's own (its structure's): GLA's 512, the others' 256
    for K, V in head_dims:
        why = head_dim_error(K, V, limit, f"spec {spec.name!r}")
        if why:
            raise click.BadParameter(why, param_hint="--head-dim")
    plans = {}
    for K, V in head_dims:
        try:
            for key, plan in check_lowerable(spec, K, V, as_dtype(dtype).name, forms, gate_in_kernel).items():
                plans[(K, V) + key] = plan
        except NotLowerable as e:
            raise click.BadParameter(f"{e} (`kdagen verify --spec {ref}` checks its float64 recurrence)",
                                     param_hint="--spec") from None
    return plans


def _gate_text(spec) -> str:
    """Which gate and bound a spec (and its hash) belongs to, for people."""
    if spec.gate is None:
        return "no gate"
    lb = spec.gate.lower_bound
    return f"gate {spec.gate.name}, " + (f"g >= {lb:g}" if lb is not None else "g unbounded below")


def _dims_text(head_dims) -> str:
    return ";".join(str(K) if K == V else f"{K},{V}" for K, V in head_dims)


def _lower_all(spec_args: dict, families, head_dims, dtype, param_hint: str = "--head-dim") -> dict:
    """The plan of every family at every head dim (lowering checks the head dims): ``{(K, V,
    family): plan}``; a usage error naming ``param_hint`` for a head dim kdagen cannot build."""
    from .codegen.lower import LoweringError
    from .tuning import driver

    plans = {}
    for K, V in head_dims:
        for fam in families:
            try:
                plans[(K, V, fam)] = driver.lower_for(driver.family_spec(fam, spec_args), fam, K, V, dtype)
            except (LoweringError, ValueError) as e:
                raise click.BadParameter(str(e), param_hint=param_hint) from None
    return plans


def _padding_notes(plans) -> list[str]:
    from .tuning.report import padding_note

    notes = {}
    for (K, V, _), plan in plans.items():
        note = padding_note(plan)
        if note:
            notes.setdefault((K, V), note)
    return list(notes.values())


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
      kdagen bench --compare fla --plot out.png     check and time against FLA on this GPU
    """


# --- verify -----------------------------------------------------------------------------

@main.command()
@click.option("--spec", "spec_ref", default="kda", show_default=True, type=SPEC_REF,
              help="the spec to check: " + SPEC_HELP)
@click.option("--gate", default=None, type=click.Choice(list(GATES)),
              help="a member's gate (default: the member's direct gate, g given); a spec file's gate is its own")
@click.option("--lower-bound", type=LOWER_BOUND, default=DEFAULT_LOWER_BOUND, show_default=True,
              help="the gate's lower bound (log space), or 'none'; the softplus gate has none; a spec file's gate "
                   "expression has its own")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random inputs")
def verify(spec_ref, gate, lower_bound, seed):
    """Run the spec's and the float64 oracle's self-checks and print a table.

    Checks: structure analysis and safe sub-chunk bound; whether kdagen's templates lower the
    spec; the chunkwise form against the token-by-token recurrence on random shapes (T not a
    multiple of C, T=1, odd K/V, varlen, GVA) -- for a member with its hand-written references,
    for any spec (a spec file's too) with the spec's own recurrence evaluated from its
    expressions; the state carried across a split; the gate's range; for KDA the degenerate
    members and an exact sympy check of the chunkwise form.  Exits 1 if any check fails.
    """
    from .spec.verify import run_verify

    if gate == "softplus" and not _given("lower_bound"):
        lower_bound = None  # the default bound is not the softplus gate's
    spec = _resolve_spec(spec_ref, lower_bound, gate)
    if _is_file_ref(spec_ref):
        ok = run_verify(spec, seed=seed, echo=click.echo)
    else:
        ok = run_verify(spec_ref, gate, lower_bound, seed=seed, echo=click.echo)
    sys.exit(0 if ok else 1)


# --- list -------------------------------------------------------------------------------

@main.command("list")
@click.option("--gpu", default=None, callback=_gpu_name, help="only this GPU's cached winners (a GPU profile name)")
@click.option("--spec", "spec_refs", multiple=True, type=SPEC_REF,
              help="list this spec (repeat for several) instead of every member: " + SPEC_HELP)
def list_cmd(gpu, spec_refs):
    """List the specs kdagen knows -- each member's structure, decay and whether kernels are
    generated for it (decided by lowering it; when not, why) -- the gates, the GPU profiles,
    and the cached tuned winners."""
    from .cache.gpus import PROFILES
    from .cache.paths import cache_dir, cache_dir_problem
    from .cache.store import TuningCache
    from .spec import get_spec
    from .spec.load import load_spec
    from .spec.structure import analyze_structure
    from .spec.validate import lowering_status
    from .tuning.driver import duration, error_text

    lb = float(DEFAULT_LOWER_BOUND)
    click.echo(f"specs (a member's hash with the default gate bound {lb:g}, as build, verify and inspect use):")
    tuned_as = {}  # tuning spec hash -> the spec whose winners are stored under it
    for ref in spec_refs or MEMBERS:
        s = load_spec(ref) if _is_file_ref(ref) else get_spec(ref, lower_bound=lb)
        ok, what = lowering_status(s)
        if ok:
            tuned_as.update(_tuned_as(ref, s, lb))
        click.echo(f"  {s.name:<9} hash {s.hash}  structure {analyze_structure(s).kind:<5} decay {s.decay:<8} "
                   f"({_gate_text(s)})  {'kernels: ' + what if ok else 'spec only (no generated kernels)'}")
        if _is_file_ref(ref):
            click.echo(f"            from {ref}")
        if not ok:
            click.echo(f"            why: {what}")
    click.echo("gates: " + ", ".join(GATES))
    click.echo("gpus:  " + ", ".join(PROFILES))
    d = cache_dir()
    problem = cache_dir_problem(d)
    if problem and d.exists():
        click.echo(f"tuning cache: {problem}; nothing cached can be read")
        return
    files = sorted(d.glob("*.json")) if d.is_dir() else []
    click.echo(f"tuning cache: {d}")
    if gpu:
        files = [f for f in files if f.stem == gpu]
    if not files:
        click.echo(f"  ({'no winners for ' + gpu if gpu else 'empty'}: run `kdagen build --gpu auto` on a GPU to tune)")
    for f in files:
        name = f.stem
        try:
            entries = TuningCache(name, cache_dir=d).entries()
        except Exception as e:  # noqa: BLE001
            click.echo(f"  {f.name}: unusable: {e}")
            continue
        click.echo(f"  {name}: {len(entries)} winner(s)")
        for key, e in sorted(entries.items()):
            dflt = e.get("default_time_ms")
            speed = f"  x{dflt / e['time_ms']:.2f} vs default" if dflt else ""
            owner = (e.get("key") or {}).get("spec_hash", "?")
            owner = tuned_as.get(owner, f"hash {owner}")
            click.echo(f"    {key}: spec {owner}, {duration(e['time_ms'])}{speed}  error {error_text(e.get('error'))}  "
                       f"{json.dumps(e['config'], sort_keys=True)}")


def _tuned_as(ref: str, spec, lb: float) -> dict:
    """{tuning spec hash: name} of the keys `kdagen build --spec REF` stores winners under with
    the default bound (a spec file's own gate bound), for each family."""
    from .tuning.families import FAMILIES, family_spec

    bound = _spec_bound(spec, lb) if _is_file_ref(ref) else lb
    args = _spec_args(bound, ref)
    out = {}
    for fam in FAMILIES:
        try:
            out[family_spec(fam, args).hash] = spec.name
        except Exception:  # noqa: BLE001 - a spec the tuner cannot take has no winners to name
            pass
    return out


# --- inspect ----------------------------------------------------------------------------

@main.command()
@click.option("--spec", "spec_name", default="kda", show_default=True, type=SPEC_REF,
              help="the spec whose kernels to print: " + SPEC_HELP)
@click.option("--head-dim", "head_dims", type=HEAD_DIMS, default="128", show_default=True,
              help="one head dim: K, or K,V")
@click.option("--dtype", "dtype_name", default="bf16", show_default=True, type=click.Choice(SHORT_NAMES),
              help="dtype of q, k and v")
@click.option("--form", default="chunk", show_default=True, type=click.Choice(["chunk", "chunk_bwd", "recurrent"]),
              help="chunk (forward), chunk_bwd (its backward) or recurrent (decode)")
@click.option("--lower-bound", type=LOWER_BOUND, default=DEFAULT_LOWER_BOUND, show_default=True,
              help="the gate's lower bound (enables factorised tiles), or 'none'; a spec file's gate expression "
                   "has its own")
@click.option("--gate-in-kernel", type=click.Choice(["none", "lower_bound", "softplus", "spec"]), default="none",
              show_default=True, help="print the in-kernel gate variant: a member's lower_bound or softplus gate, "
                                      "or 'spec' (the spec's own gate expression, e.g. a spec file's)")
@click.option("--config", "config_json", default=None, help="config as JSON (default: the heuristic config)")
@click.option("--kernel", default=None, help="only this kernel of the form (the error lists them)")
@click.option("--plan-only", is_flag=True, help="print the plan and config, not the source")
def inspect(spec_name, head_dims, dtype_name, form, lower_bound, gate_in_kernel, config_json, kernel, plan_only):
    """Print the plan, the config and the generated Triton source for a key."""
    from .cache.heuristics import default_config
    from .codegen.render import family_kernels, render
    from .config import config_from_dict
    from .ops.inputs import select_spec
    from .spec import get_spec
    from .tuning.report import padding_note

    if len(head_dims) != 1:
        raise click.BadParameter(f"inspect prints one head dim's kernels; got {len(head_dims)} "
                                 f"({_dims_text(head_dims)}): run it once per head dim", param_hint="--head-dim")
    (K, V), = head_dims
    if gate_in_kernel == "softplus" and _given("lower_bound"):
        raise click.BadParameter("the softplus gate has no lower bound: leave --lower-bound out",
                                 param_hint="--lower-bound")
    if gate_in_kernel == "lower_bound" and lower_bound is None:
        raise click.BadParameter("the lower_bound gate needs a bound (a negative number)", param_hint="--lower-bound")
    family = {"chunk": "chunk_fwd", "chunk_bwd": "chunk_bwd", "recurrent": "recurrent"}[form]
    gik = gate_in_kernel != "none"
    if _is_file_ref(spec_name) and gate_in_kernel in ("lower_bound", "softplus"):
        raise click.BadParameter(f"{gate_in_kernel!r} is a member's gate; a spec file's gate is its own: "
                                 "--gate-in-kernel spec computes it in the kernels", param_hint="--gate-in-kernel")
    fname = "recurrent" if form == "recurrent" else "chunk"
    if _is_file_ref(spec_name):
        spec = _resolve_spec(spec_name, lower_bound)
    else:
        try:
            if spec_name == "kda" and gate_in_kernel != "spec":
                lb = lower_bound if gate_in_kernel != "softplus" else None
                # fused_recurrent_kda has no safe_gate: with g given its kernel is the direct gate's
                spec = select_spec(gik, lb is not None and not gik and form != "recurrent", lb, True, True)
            else:
                member_gate = gate_in_kernel if gate_in_kernel in ("lower_bound", "softplus") else None
                lb = None if gate_in_kernel == "softplus" or (form == "recurrent" and not gik) else lower_bound
                spec = get_spec(spec_name, gate=member_gate, lower_bound=lb)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    _check_head_dims(head_dims)
    plan = _check_lowerable(spec, spec_name, head_dims, dtype_name, (fname,), gik)[(K, V, fname, gik)]
    if plan.structure == "dplr" and family == "chunk_fwd":  # general DPLR's chunk forward: the training-path kernels
        family = "chunk_train"
    if config_json:
        try:
            config = config_from_dict(family, json.loads(config_json))
        except (ValueError, TypeError) as e:
            raise click.BadParameter(str(e), param_hint="--config") from None
    else:
        config = default_config(family, plan)
    kinds = family_kernels(family, plan, config)
    if kernel and kernel not in kinds:
        raise click.BadParameter(f"{kernel!r} is not a kernel of the {form} form under this config; its kernels: "
                                 f"{', '.join(kinds)}", param_hint="--kernel")
    click.echo(f"# spec  : {spec.name} hash {spec.hash} ({_gate_text(spec)})")
    note = padding_note(plan)
    if note:
        click.echo(f"# {note}")
    click.echo(f"# plan  : {json.dumps(plan.to_dict(), sort_keys=True)}")
    click.echo(f"# config: {config.canonical()}")
    if plan_only:
        return
    for kind in ((kernel,) if kernel else kinds):
        src = render(kind, plan, config)
        click.echo(f"# ---- {src.name}.py (sha256 {src.source_hash[:16]})")
        click.echo(src.text)


# --- build and tune ---------------------------------------------------------------------

_tuning_options = _options(
    click.option("--spec", "spec_name", default="kda", show_default=True, type=SPEC_REF,
                 help="the spec to generate kernels for: " + SPEC_HELP),
    click.option("--head-dim", "head_dims", type=HEAD_DIMS, default="128", show_default=True,
                 help="K or K,V; several separated by ';' (e.g. '128;96,192')"),
    click.option("--dtype", default="bf16", show_default=True, type=click.Choice(SHORT_NAMES),
                 help="dtype of q, k and v"),
    click.option("--state-dtype", default="fp32", show_default=True, type=click.Choice(SHORT_NAMES),
                 help="dtype of the initial state (a decode pool may be bf16); winners are keyed by it"),
    click.option("--lower-bound", type=LOWER_BOUND, default=DEFAULT_LOWER_BOUND, show_default=True,
                 help="the gate's lower bound the kernels may assume (sets the safe sub-chunk), or 'none'; a spec "
                      "file's gate expression has its own"),
    click.option("--family", "families", multiple=True, type=click.Choice(list(FAMILIES)),
                 help="a kernel family; repeat for several (default: all)"),
    click.option("--space", "space_path", default=None, type=click.Path(exists=True, dir_okay=False),
                 help="a search-space JSON file of your own (one family)"),
    click.option("--shapes", type=CHUNK_SHAPES, default=DEFAULT_SHAPES, show_default=True,
                 help="tuning shapes B,T,H,K of the chunk forms, separated by ';'"),
    click.option("--decode-batches", "batches", type=BATCHES, default="1,64,256", show_default=True,
                 help="tuning batch sizes of decode (one token a sequence)"),
    click.option("--decode-heads", "decode_heads", type=HEADS, default="32", show_default=True,
                 help="value heads of the decode tuning shapes (the model's; winners are keyed by them)"),
    click.option("--seed", type=int, default=0, show_default=True, help="seed of the tuner's sampler"),
    click.option("--quiet", is_flag=True, help="no progress bar or progress lines (the summary is still printed)"),
    click.option("--jobs", type=click.IntRange(min=1), default=None,
                 help="compile in this many processes (default: min(8, CPUs))"),
)


@main.command()
@click.option("--gpu", "gpu_name", required=True, callback=_gpu_name,
              help="GPU profile name (h100, h800, h200, h20, a100, ...) or 'auto' (the GPU here)")
@_tuning_options
@click.option("--compile-only", is_flag=True, help="never tune, even on a matching GPU")
@click.option("--check-all", is_flag=True,
              help="compile every candidate config of the search spaces for the GPU, also where this machine "
                   "does not tune (by default a build that does not tune compiles only what the ops run there; "
                   "the tuner compiles the candidates on that GPU)")
def build(gpu_name, **kw):
    """Generate the kernels for a spec and head dims and compile, for the GPU's architecture (no
    GPU needed), the configs the ops will run there -- kept, so that a first call on that GPU
    loads them.  On that GPU (or with ``--check-all``, or a ``--space`` of your own) it first
    compile-checks every candidate config of the search space, and on that GPU it tunes them
    and stores the winners in the cache.  Ends with a summary: what compiled, what was dropped
    and why, the winners against the defaults, and where everything is.
    """
    _build(gpu_name, "build", **kw)


@main.command()
@_tuning_options
def tune(**kw):
    """Tune on the current GPU and store the winners (``kdagen build --gpu auto``)."""
    _build("auto", "tune", compile_only=False, check_all=False, **kw)


def _resolve_gpu(name: str, command: str):
    from .cache.gpus import detect_current, get_profile, known_names

    if name != "auto":
        return get_profile(name)
    prof = detect_current()
    if prof is None:
        if command == "tune":
            raise click.UsageError("kdagen tune tunes on this machine's GPU and no CUDA GPU is visible here; "
                                   "`kdagen build --gpu NAME` compile-checks for a GPU that is not here "
                                   f"(NAME: {', '.join(known_names())})")
        raise click.UsageError("--gpu auto: no CUDA GPU is visible here; name a GPU "
                               f"({', '.join(known_names())}) to compile-check for it")
    return prof


def _build(gpu_name, command, spec_name, head_dims, dtype, state_dtype, lower_bound, families, space_path,
           compile_only, check_all, shapes, batches, decode_heads, seed, quiet, jobs):
    """``kdagen build`` (and ``tune``): every argument checked, then the compile-check of every
    candidate (on a matching GPU, with ``check_all`` or a space of the user's), the tuning on a
    matching GPU, the configs the ops run compiled and kept, and the summary."""
    batches = [(b, hv) for hv in decode_heads for b in batches]  # decode's tuning shapes: (batch, value heads)
    from .cache.gpus import detect_current
    from .cache.paths import cache_dir_problem, studies_dir
    from .tuning import driver
    from .tuning.compile_pool import CompilePool, default_jobs
    from .tuning.report import BuildSummary, Progress
    from .tuning.space import SearchSpaceError, load_space

    # --- every argument, before anything compiles
    gpu = _resolve_gpu(gpu_name, command)
    all_families = not families and not space_path
    families = [f for f in FAMILIES if f in families] if families else list(FAMILIES)
    user_space = None
    if space_path:
        try:
            user_space = load_space(space_path)
        except (SearchSpaceError, ValueError, OSError) as e:
            raise click.BadParameter(str(e), param_hint="--space") from None
        families = [user_space.kernel]
    # the spec: lowered as a whole (its structure, its gate in the kernels), then as each family is tuned
    asked = _resolve_spec(spec_name, lower_bound)
    lower_bound = _spec_bound(asked, lower_bound)
    _check_head_dims(head_dims)
    chunk_missing = None
    if all_families:  # a structure whose chunk form this build lacks (general DPLR): its recurrent family alone
        from .spec.validate import ChunkFormMissing, NotLowerable, check_lowerable

        try:
            check_lowerable(asked, *head_dims[0], as_dtype(dtype).name, ("chunk",), None)
        except ChunkFormMissing as e:
            chunk_missing, families = e.reason, ["recurrent"]
        except NotLowerable:
            pass  # the check below says why, for every form
    _check_lowerable(asked, spec_name, head_dims, dtype,
                     tuple(dict.fromkeys("recurrent" if f == "recurrent" else "chunk" for f in families)), None)
    spec_args = _spec_args(lower_bound, spec_name)
    plans = _lower_all(spec_args, families, head_dims, dtype)
    try:
        driver.check_tunable(spec_args, families)
    except ValueError as e:
        raise click.BadParameter(f"{e} (`kdagen verify --spec {spec_name}` checks its float64 recurrence)",
                                 param_hint="--spec") from None
    current = None if compile_only else detect_current()
    will_tune = current is not None and current.name == gpu.name
    problem = cache_dir_problem()
    if problem:
        raise click.UsageError(f"{problem}: kdagen {command} writes the kernels it generates"
                               f"{' and the winners it tunes' if will_tune else ''} there; set KDAGEN_CACHE_DIR to "
                               "a writable directory")
    if will_tune and importlib.util.find_spec("optuna") is None:
        # checked before the compile-check, which would otherwise run first and then stop at the tuner
        raise click.UsageError(f"kdagen {command} tunes on this {gpu.name} with optuna, which is not installed: "
                               "`pip install optuna` (or `--compile-only` to compile-check without tuning)")

    # every candidate is compiled where the tuner will load them (this GPU), or when asked; elsewhere the
    # tuner on that GPU compiles them itself, and a build compiles what the ops run there
    survey = will_tune or check_all or user_space is not None
    spec = driver.family_spec("chunk_fwd", spec_args)
    cc = gpu.compute_capability
    doing = ("compile-check and tune" if will_tune else
             "compile-check only" if survey else
             "compile-check only: the configs the ops run there (--check-all: every candidate config)")
    click.echo(f"kdagen {__version__}: build for {gpu.name} (sm_{cc[0]}{cc[1]}, "
               f"{gpu.sm_count} SMs, {gpu.smem_per_block_bytes // 1024} KiB smem/block); spec {spec.name} "
               f"hash {spec.hash} ({_gate_text(spec)}); {doing}")
    if asked.gate is not None and asked.gate.name != "direct":
        click.echo(f"  ({asked.name} hash {asked.hash}: its gate, {_gate_text(asked)}, is computed inside its kernels, "
                   "which are tuned as the spec above, with g given)")
    if chunk_missing:
        doing = "compile-checking and tuning" if will_tune else "compile-checking"
        click.echo(f"  note: {asked.name}: {chunk_missing}; {doing} its recurrent family only")
    if not will_tune and not compile_only:
        here = current.name if current else "no CUDA GPU"
        click.echo(f"  (not tuning: this machine has {here}, not {gpu.name})")
    for note in _padding_notes(plans):
        click.echo(f"  {note}")
    if will_tune:
        for K in sorted({K for K, _ in head_dims} - {s[3] for s in shapes}):
            if {"chunk_fwd", "chunk_bwd"} & set(families):
                click.echo(f"  note: no --shapes entry has K={K}: its chunk kernels are compile-checked, not tuned")

    progress = Progress(enabled=not quiet)
    summary = BuildSummary(gpu.name)
    t_start = time.time()
    cache = None
    # one set of compile processes for the compile-check and the tuner's compiles ahead
    with CompilePool(jobs or default_jobs()) as pool:
        if survey:
            try:
                surveys, n_empty = driver.compile_all(gpu, spec_args, dtype, head_dims, families, shapes, batches,
                                                      pool, space=user_space, quiet=quiet, echo=progress.echo,
                                                      state_dtype=state_dtype, on_progress=progress.compile_step)
            finally:
                progress.close()
            summary.add_surveys(surveys)
            click.echo(f"compile-check done in {time.time() - t_start:.0f}s")
        else:
            surveys, n_empty = driver.plans_for(spec_args, dtype, head_dims, families), 0
        if n_empty:
            _print_summary(summary, gpu, None, head_dims, lower_bound, shapes, will_tune, spec_name, asked,
                           chunk_missing is not None)
            click.echo("error: some kernels have no config that compiles for this GPU", err=True)
            sys.exit(1)
        if will_tune:
            order = [(f"tune {fam} K={K} V={V}", len(driver.tuning_shapes(fam, K, shapes, batches)))
                     for (K, V, fam) in surveys]
            step = progress.tuning(order)

            def on_tuned(*result):
                summary.add_tuned(*result)
                step()

            try:
                cache = driver.tune_and_store(gpu, spec_args, dtype, surveys, shapes, batches, space=user_space,
                                              seed=seed, quiet=quiet or progress.bar, pool=pool, echo=progress.echo,
                                              state_dtype=state_dtype, on_tuned=on_tuned)
            except (KeyboardInterrupt, RuntimeError) as e:
                # an interrupt inside concurrent.futures' wait can surface as "release unlocked lock"
                if not (isinstance(e, KeyboardInterrupt) or isinstance(e.__context__, KeyboardInterrupt)):
                    raise
                progress.close()
                click.echo(f"\ninterrupted after {time.time() - t_start:.0f}s: the winners tuned so far are in the "
                           f"cache and every measured trial is in {studies_dir()}; the same command resumes", err=True)
                sys.exit(130)
            finally:
                progress.close()
        # the binaries the ops will run on this GPU, kept for their first call (the winners where tuned)
        t_keep = time.time()
        if not quiet:
            click.echo(f"compiling what the ops run on a {gpu.name} (sm_{cc[0]}{cc[1]}) at each tuning shape, "
                       "to keep it")
        kept = driver.keep_binaries(gpu, spec_args, dtype, surveys, shapes, batches, pool, cache=cache,
                                    state_dtype=state_dtype)
        failed = [k for k in kept if k.why is not None]
        for k in failed:
            click.echo(f"  {'warning: not kept' if survey else 'error: does not compile'}: {k.family} K={k.K} "
                       f"V={k.V} {k.config.short()}: {k.why}", err=True)
        click.echo(f"kept the binaries of {len(kept) - len(failed)} config(s) in {time.time() - t_keep:.0f}s")
        summary.add_kept(kept)
    _print_summary(summary, gpu, cache, head_dims, lower_bound, shapes, will_tune, spec_name, asked,
                   chunk_missing is not None, surveyed=survey)
    if failed and not survey:  # what the ops run there is the whole check of this build
        click.echo(f"error: some configs the ops run on a {gpu.name} do not compile for it (above)", err=True)
        sys.exit(1)
    click.echo(f"build done in {time.time() - t_start:.0f}s")


def _triton_cache_dir() -> str:
    try:
        from triton import knobs

        return str(knobs.cache.dir)
    except Exception:  # noqa: BLE001 - another Triton version
        return "Triton's cache directory"


def _print_summary(summary, gpu, cache, head_dims, lower_bound, shapes, will_tune, spec_ref="kda",
                   spec=None, recurrent_only: bool = False, surveyed: bool = True) -> None:
    """The closing table, where the results are, and the next command (for ``spec``, the spec
    ``spec_ref`` names; ``recurrent_only``: only its recurrent family was built)."""
    from .cache.binaries import binaries_dir, kept, kept_modules
    from .cache.paths import generated_dir
    from .tuning.driver import duration, error_text

    click.echo("")
    for line in summary.lines(duration, error_text):
        click.echo(line)
    if cache is not None:
        click.echo(f"tuning cache:      {cache.path} ({len(summary.tuned)} family and shape(s) tuned)")
    click.echo(f"generated sources: {generated_dir()}")
    click.echo(f"kept binaries:     {binaries_dir()} ({len(kept())} kernels and {len(kept_modules())} C modules their "
               f"launches build, loaded by the ops' first calls on a {gpu.name} with this Triton"
               f"{f'; every candidate compiled is in {_triton_cache_dir()}' if surveyed else ''})")
    dims = _dims_text(head_dims)
    own_gate = spec is not None and spec.gate is not None and spec.gate.name != "direct"
    bound = "" if lower_bound == float(DEFAULT_LOWER_BOUND) or own_gate else \
        f" --lower-bound {'none' if lower_bound is None else f'{lower_bound:g}'}"
    if spec_ref != "kda":
        bound = f" --spec {spec_ref}{bound}"
    if will_tune:
        shape_text = ";".join(",".join(map(str, s)) for s in shapes)
        ops = "chunk_kda and fused_recurrent_kda run" if spec_ref == "kda" else f"{spec.name}'s kernels run"
        click.echo(f"next: `kdagen list --gpu {gpu.name}` lists the winners ({ops} "
                   f"them from now on); `kdagen bench --compare fla --shapes '{shape_text}'` times them against FLA")
    else:
        if ";" in dims:
            dims = f"'{dims}'"
        click.echo(f"next: on a machine with this GPU ({gpu.name}), `kdagen tune --head-dim {dims}{bound}` tunes these "
                   f"kernels and stores the winners; `kdagen inspect --head-dim {_dims_text(head_dims[:1])}{bound}"
                   f"{' --form recurrent' if recurrent_only else ''}` "
                   f"prints their source{', and `kdagen export` packages them' if spec_ref == 'kda' else ''}")


# --- bench ------------------------------------------------------------------------------

@main.command()
@click.option("--shapes", type=BENCH_SHAPES, default="1,8192,96,128;2,16384,16,128", show_default=True,
              help="B,T,H,K or B,T,H,K,V separated by ';' (decode: B sequences of one token)")
@click.option("--passes", type=PASS_LIST, default="fwd", show_default=True,
              help="fwd (forward), fwdbwd (forward and backward), decode (one recurrent step), separated by ','")
@click.option("--members", type=MEMBER_LIST, default="kda", show_default=True,
              help="the family members whose ops are timed: " + ", ".join(BENCH_MEMBERS) + ", separated by ','")
@click.option("--suite", type=click.Choice(sorted(BENCH_SUITES)), default=None,
              help="a named set of cases (member x pass x shape) instead of --members, --shapes and --passes: "
                   "'readme' is the README's performance table")
@click.option("--compare", type=click.Choice(["none", "fla"]), default="none", show_default=True,
              help="also check and time flash-linear-attention's ops in the same process "
                   "(FLA_DISABLE_BACKEND_DISPATCH=1 unless set: FLA's own kernels)")
@click.option("--dtype", "dtype_name", default="bf16", show_default=True, type=click.Choice(SHORT_NAMES),
              help="dtype of q, k, v and beta (g and the state are fp32)")
@click.option("--out", "out_prefix", default="kdagen-bench", show_default=True,
              help="write the results to OUT.json and OUT.csv")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="also draw the time per shape of each library into this PNG (needs matplotlib: "
                   "pip install 'kdagen[plot]')")
@click.option("--from", "from_json", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="print (and with --plot, draw) an earlier run's OUT.json instead of measuring; needs no GPU. "
                   "Repeat it to join runs of one GPU and one set of versions, each case from one run")
@click.option("--fla-warm-jobs", type=click.IntRange(min=0), default=None,
              help="with --compare fla: processes that compile FLA's autotuning candidates before measuring "
                   "(default: min(14, CPUs); 0: FLA compiles them itself, one after another)")
@click.option("--perf-md", "perf_md", default=None, type=click.Path(dir_okay=False),
              help="also write this Markdown page (docs/PERF.md) of every case from the result")
@click.option("--readme", "readme", default=None, type=click.Path(exists=True, dir_okay=False),
              help="also rewrite the performance table of this README (between its perf-table markers) from "
                   "the result")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random inputs")
@click.option("--per-launch", is_flag=True,
              help="also time each kernel of the forward and forward+backward passes (torch.profiler), with "
                   "kdagen's bytes per launch and the time a copy would move them in (its floor); "
                   "--perf-md lists them")
def bench(shapes, passes, members, suite, compare, dtype_name, out_prefix, plot_path, from_json, fla_warm_jobs,
          perf_md, readme, seed, per_launch):
    """Check kdagen's ops against the float64 reference and time them on this GPU at your
    shapes; with --compare fla, flash-linear-attention's too, in the same process on the same
    inputs.  Prints a table (time, FLA's time over kdagen's, TB/s against a copy measured
    here, error), writes JSON and CSV, with --plot a chart, with --perf-md and --readme the
    performance page and the README's table.  Needs a CUDA GPU (exit 2 without one), except
    with --from."""
    from .tuning import bench_cases as BC, benchmark as BM

    try:
        if plot_path:
            BM.check_plot_available()
        if from_json:
            extra = [n for n in ("shapes", "passes", "members", "suite", "compare", "dtype_name", "fla_warm_jobs",
                                 "seed", "per_launch") if _given(n)]
            if extra:
                raise click.UsageError(f"--from prints an earlier run; {', '.join(extra)} do(es) not apply to it")
            try:  # not JSON, not a bench result, or runs that cannot share a page
                result = BM.merge_results([BM.read_json(f) for f in from_json], list(from_json))
            except ValueError as e:
                raise click.BadParameter(str(e), param_hint="--from") from None
            merged = len(from_json) > 1
            _bench_report(BM, result, out_prefix if _given("out_prefix") else None, plot_path, write_json=merged,
                          perf_md=perf_md, readme=readme, source=", ".join(os.path.basename(f) for f in from_json))
            return
        if suite:
            extra = [n for n in ("shapes", "passes", "members") if _given(n)]
            if extra:
                raise click.UsageError(f"--suite names its cases; {', '.join(extra)} do(es) not apply to it")
            cases = BENCH_SUITES[suite]
        else:
            cases = BC.cases(members, [s if len(s) == 5 else (*s, s[3]) for s in shapes], passes)
        bench_shapes = list(dict.fromkeys(BM.Shape(*c.shape) for c in cases))
        passes = list(dict.fromkeys(c.pass_ for c in cases))
        members = list(dict.fromkeys(c.member for c in cases))
        spec_args = _spec_args(BM.LOWER)
        _lower_all(spec_args, ["chunk_fwd"], sorted({(s.K, s.V) for s in bench_shapes}), dtype_name, "--shapes")
        libraries = [BM.kdagen_library()] + ([BM.fla_library()] if compare == "fla" else [])
        device = BM.cuda_device()
    except BM.Unavailable as e:
        raise click.UsageError(str(e)) from None
    dt = as_dtype(dtype_name).torch
    try:
        if compare == "fla":
            jobs = BM.default_warm_jobs() if fla_warm_jobs is None else fla_warm_jobs
            BM.warm_fla(cases, dt, jobs, echo=click.echo)
        result = BM.run(bench_shapes, libraries, passes, cases=cases, device=device, dtype=dt, timer=BM.median_timer,
                        graph_timer=BM.graph_median_timer, seed=seed, echo=click.echo, copy_bytes=BM.COPY_BYTES,
                        launch_timer=BM.profile_kernels if per_launch else None,
                        on_row=lambda so_far: BM.write_json(so_far, out_prefix + ".json") if out_prefix else None)
    except KeyboardInterrupt:
        if out_prefix and os.path.exists(out_prefix + ".json"):
            kept = f"; the rows measured so far are in {out_prefix}.json"
        else:
            kept = " before any row was measured" + (" (FLA's autotuning may still have been warming: its Triton cache "
                                                       "keeps what it compiled)" if compare == "fla" else "")
        click.echo(f"\ninterrupted{kept}", err=True)
        sys.exit(130)
    _bench_report(BM, result, out_prefix, plot_path, write_json=True, perf_md=perf_md, readme=readme,
                  source=out_prefix + ".json" if out_prefix else "")


def _bench_report(BM, result: dict, out_prefix: str | None, plot_path: str | None, write_json: bool,
                  perf_md: str | None = None, readme: str | None = None, source: str = "") -> None:
    click.echo("")
    for line in BM.table_lines(result):
        click.echo(line)
    written = []
    if out_prefix:
        if write_json:
            BM.write_json(result, out_prefix + ".json")
            written.append(out_prefix + ".json")
        BM.write_csv(result, out_prefix + ".csv")
        written.append(out_prefix + ".csv")
    if plot_path:
        BM.plot(result, plot_path)
        written.append(plot_path)
    if perf_md or readme:
        from .tuning import perf_doc

        if perf_md:
            with open(perf_md, "w") as f:
                f.write(perf_doc.perf_markdown(result, os.path.basename(source)))
            written.append(perf_md)
        if readme:
            with open(readme) as f:
                text = f.read()
            try:
                text = perf_doc.update_readme(text, perf_doc.readme_table(result))
            except ValueError as e:
                raise click.BadParameter(str(e), param_hint="--readme") from None
            with open(readme, "w") as f:
                f.write(text)
            written.append(readme)
    if written:
        click.echo("wrote " + ", ".join(written))


# --- export -----------------------------------------------------------------------------

GPU_LIST = _List("GPU,...", lambda f: f.strip().lower() or None, "GPU profile names separated by ','")
DTYPE_LIST = _List("DTYPE,...", lambda f: f if f in SHORT_NAMES else None,
                   f"input dtypes among {', '.join(SHORT_NAMES)} separated by ','")
EXPORT_GATES = ("both", "bounded", "unbounded")  # kdagen.export.contents.GATES (not imported: it loads the codegen)


@main.command()
@click.option("--gpu", "gpu_names", type=GPU_LIST, required=True,
              help="GPU profile names whose tuned configs the package carries, e.g. h800,h20, or 'auto' (this "
                   "machine's GPU); a GPU without winners gets the heuristic configs, marked in the manifest")
@click.option("--spec", "spec_name", default="kda", show_default=True, type=SPEC_REF,
              help="the recurrence: " + SPEC_HELP + " (packages are written for kda's ops)")
@click.option("--head-dim", "head_dims", type=HEAD_DIMS, default="128", show_default=True,
              help="head dims K or K,V, several separated by ';' (exactly these are exported)")
@click.option("--dtype", "dtypes", type=DTYPE_LIST, default="bf16", show_default=True,
              help="input dtypes of q, k, v, separated by ',' (exactly these are exported)")
@click.option("--lower-bound", type=LOWER_BOUND, default=DEFAULT_LOWER_BOUND, show_default=True,
              help="the bound of the bounded gate (chunk_kda's safe_gate=True, lower_bound), or 'none' (only "
                   "the unbounded gate is exported)")
@click.option("--gates", type=click.Choice(EXPORT_GATES), default="both", show_default=True,
              help="which gates chunk_kda is exported for: 'both' serves FLA's default call (safe_gate=False, "
                   "g unbounded) and safe_gate=True with --lower-bound; 'unbounded' or 'bounded' only one of them "
                   "(a call with the other raises a ValueError in the package). With --gate-in-kernel the "
                   "in-kernel gate follows: the softplus gate (unbounded), lower_bound*sigmoid(..) (bounded)")
@click.option("--gate-in-kernel", is_flag=True,
              help="also export FLA's use_gate_in_kernel=True (g = lower_bound*sigmoid(exp(A_log)(z + dt_bias)), "
                   "g = -exp(A_log)*softplus(z + dt_bias) without a bound), at the bounds --gates exports, with and "
                   "without A_log and dt_bias")
@click.option("--cache", "cache_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="a tuning cache file (e.g. copied from the GPU machine); repeat for several GPUs; default: "
                   "each GPU's file in kdagen's cache directory")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="directory to write the package into (as OUT/NAME/)")
@click.option("--name", required=True, help="the package's name (a Python identifier), e.g. kda_h800")
@click.option("--date", default=None,
              help="the date recorded in the manifest (default: the newest exported winner's measurement "
                   "time), so that the same inputs give the same bytes")
@click.option("--aot", is_flag=True,
              help="ship the binaries `kdagen build --gpu NAME` kept for the exported kernels and GPUs: the "
                   "package's first calls load them instead of compiling (same target and Triton build; any "
                   "other compiles from the package's sources)")
def export(gpu_names, spec_name, head_dims, dtypes, lower_bound, gates, gate_in_kernel, cache_files, out_dir, name,
           date, aot):
    """Export the kernels of a spec, head dims and dtypes, with each GPU's tuned configs, as a
    standalone package OUT/NAME/ that needs torch and triton only: chunk_kda and
    fused_recurrent_kda (FLA's signatures, autograd, torch.compile), the generated Triton
    sources, a manifest, a README and a test file.  The same inputs give byte-identical files.
    chunk_kda is exported for FLA's default gate (safe_gate=False) and the one bounded by
    --lower-bound unless --gates narrows it; a call the package was not exported for raises.
    """
    import keyword

    from .cache.gpus import get_profile
    from .cache.store import TuningCache
    from .export import ExportError, Request, export_package, read_cache_file
    from .export.contents import as_dtype_names, gate_bounds

    _check_head_dims(head_dims)
    spec = _resolve_spec(spec_name, lower_bound)
    _check_lowerable(spec, spec_name, head_dims, "fp32", gate_in_kernel=None)
    if spec_name != "kda":
        raise click.BadParameter(f"{spec.name!r} lowers, but an exported package holds chunk_kda and "
                                 "fused_recurrent_kda (FLA's KDA signatures and gates); packaging another spec's "
                                 "kernels is not implemented yet", param_hint="--spec")
    if not name.isidentifier() or keyword.iskeyword(name) or name in ("kdagen", "torch", "triton") \
            or name in sys.stdlib_module_names:
        raise click.BadParameter(f"{name!r} is not a usable package name: a Python identifier other than "
                                 "kdagen, torch, triton or a standard-library module, e.g. kda_h800",
                                 param_hint="--name")
    gpus = []
    for g in gpu_names:
        if g == "auto":
            from .cache.gpus import detect_current, known_names

            here = detect_current()
            if here is None:
                raise click.BadParameter(f"'auto' names this machine's GPU and no CUDA GPU is visible here; name "
                                         f"the GPUs ({', '.join(known_names())})", param_hint="--gpu")
            gpus.append(here)
            continue
        try:
            gpus.append(get_profile(g))
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--gpu") from None
    gpus = list({g.name: g for g in gpus}.values())  # a GPU named twice (or by 'auto' too) once
    by_name = {g.name: g for g in gpus}
    try:
        bounds = gate_bounds(lower_bound, gates)
    except ExportError as e:
        raise click.BadParameter(str(e), param_hint="--gates") from None
    for bound in bounds:
        _lower_all(_spec_args(bound), ["chunk_fwd", "recurrent"], head_dims, "fp32")  # head dims checked
    caches, paths = {}, {}
    try:
        for path in cache_files:
            data = read_cache_file(path)
            gname = data["metadata"]["gpu_name"]
            if gname not in by_name:
                raise click.BadParameter(f"{path} holds the winners of {gname!r}, which is not among --gpu "
                                         f"({', '.join(by_name)})", param_hint="--cache")
            if gname in caches:
                raise click.BadParameter(f"two cache files for {gname!r}: {paths[gname]} and {path}",
                                         param_hint="--cache")
            caches[gname], paths[gname] = data, path
        for g in gpus:
            if g.name not in caches:
                default = TuningCache(g.name).path
                if default.is_file():
                    caches[g.name], paths[g.name] = read_cache_file(str(default)), str(default)
    except ExportError as e:
        raise click.BadParameter(str(e), param_hint="--cache") from None
    request = Request(name=name, gpus=tuple(gpus), head_dims=tuple(head_dims), dtypes=as_dtype_names(dtypes),
                      lower_bound=lower_bound, caches=caches, cache_paths=paths, date=date, spec_name=spec_name,
                      gate_in_kernel=gate_in_kernel, gates=gates, aot=aot)
    try:
        root, contents = export_package(request, out_dir)
    except ExportError as e:
        raise click.UsageError(str(e)) from None
    for w in contents.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(f"kdagen {__version__}: exported {name} to {root}")
    click.echo(f"  {len(contents.sources)} kernel sources for {len(contents.plans)} plans "
               f"(head dims {_dims_text(head_dims)}; dtypes {', '.join(request.dtypes)})")
    click.echo("  chunk_kda gates: " + ", ".join("safe_gate=False" if b is None else f"safe_gate=True, lower_bound={b:g}"
                                                 for b in bounds))
    for g in gpus:
        m = contents.winner_meta[g.name]
        what = f"{m['entries']} tuned winners from {paths[g.name]}" if m["entries"] else "heuristic configs"
        click.echo(f"  {g.name}: {what}")
    if aot:
        click.echo(f"  binaries compiled ahead of time: {len(contents.binaries)}, with {len(contents.modules)} launch "
                   f"modules (in {root / name / 'binaries'})")
    click.echo(f"next: `pip install {root}` or copy {root / name} into a project; "
               f"`TRITON_INTERPRET=1 python -m pytest {root / 'tests'}` checks it on a CPU")


if __name__ == "__main__":  # pragma: no cover
    main()
