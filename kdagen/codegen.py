"""Codegen: render a Jinja template into Triton source from a Plan and a Config.

Rendering is a pure function: the same (template, plan, config, kdagen version) gives the
same bytes, and the kernel's name ends in a hash of those bytes.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import jinja2

from . import __version__
from .config import ChunkBwdConfig, ChunkFwdConfig, ConfigError, RecurrentConfig, _Config
from .lower import Plan
from .resources import templates_dir

# which template renders which kernel, and the config family it takes
TEMPLATES = {
    "chunk_intra": ("chunk_intra.py.j2", ChunkFwdConfig),
    "chunk_state": ("chunk_state.py.j2", ChunkFwdConfig),
    "recurrent": ("recurrent.py.j2", RecurrentConfig),
    "chunk_bwd_state": ("chunk_bwd_state.py.j2", ChunkBwdConfig),
    "chunk_bwd_dqkw": ("chunk_bwd_dqkw.py.j2", ChunkBwdConfig),
    "chunk_bwd_intra": ("chunk_bwd_intra.py.j2", ChunkBwdConfig),
}
_PLACEHOLDER = "__KDAGEN_KERNEL_NAME__"
_TL_DTYPES = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16"}


@dataclass(frozen=True)
class GeneratedSource:
    kernel: str  # template kind, e.g. 'chunk_intra'
    name: str  # python identifier of the @triton.jit function (and of its module)
    text: str
    source_hash: str


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _template_vars(kernel: str, plan: Plan, config: _Config) -> dict:
    dot_dtype = _TL_DTYPES[plan.dtype]
    v = {"dot_dtype": dot_dtype, "loop_kw": "", "dot_kw": "", "inv_kw": ""}
    if plan.dtype == "float32":
        v["dot_kw"] = ', input_precision="ieee"'
    if isinstance(config, ChunkFwdConfig):
        if plan.diag_mode == "factorised" and config.sub_chunk > plan.safe_sub_chunk:
            raise ConfigError(
                f"chunk_fwd: sub_chunk={config.sub_chunk} exceeds the {plan.safe_sub_chunk}-token sub-tile the "
                f"gate's lower bound {plan.lower_bound} makes safe for {plan.dtype} (exp would overflow)")
        v["inv_kw"] = f', input_precision="{config.inverse_precision}"'
        # (I - A)(I + A^2)...(I + A^(2^s)) covers powers below 2^(s+1); A^BC = 0
        v["neumann_steps"] = max(0, (config.sub_chunk - 1).bit_length() - 1)
    if isinstance(config, ChunkBwdConfig):
        v["BKT"] = min(config.dqkw_block_k, plan.BK)  # the K tile of the chunk-parallel launch
    return v


def render(kernel: str, plan: Plan, config: _Config, extra: dict[str, str] | None = None) -> GeneratedSource:
    """Render one kernel.  ``extra``: further template variables decided in Python (e.g. the
    backward's printed gate derivatives); they are part of the rendered text, so of the hash."""
    try:
        template, cfg_type = TEMPLATES[kernel]
    except KeyError:
        raise ValueError(f"unknown kernel {kernel!r}; known: {sorted(TEMPLATES)}") from None
    if not isinstance(config, cfg_type):
        raise TypeError(f"kernel {kernel!r} takes a {cfg_type.__name__}, got {type(config).__name__}")
    text = _env().get_template(template).render(
        name=_PLACEHOLDER, kernel=kernel, plan=plan, config=config, version=__version__,
        **_template_vars(kernel, plan, config), **(extra or {}))
    digest = hashlib.sha256(text.encode()).hexdigest()
    name = f"{plan.spec_name}_{kernel}_{digest[:12]}"
    return GeneratedSource(kernel, name, text.replace(_PLACEHOLDER, name), digest)
