"""Declarative tuning search spaces.

A space file (``search_spaces/<kernel>.json``, shipped as ``kdagen.search_spaces``)::

    {"kernel": "chunk_fwd", "version": 1,
     "params": {"chunk_size": [32, 64], "sub_chunk": [16, 32], ...},
     "stages": {"intra": {"launch": "chunk_intra", "fields": ["chunk_size", "sub_chunk", ...]},
                "state": {"launch": "chunk_state", "fields": ["chunk_size", "state_block_v", ...]}},
     "constraints": ["chunk_size % sub_chunk == 0", "smem_estimate <= smem_limit", ...]}

Param names are the fields of the kernel's config dataclass (:mod:`kdagen.config`); a
field left out takes the dataclass default.  Candidates are the cartesian product (in the
file's param/value order, then default-valued fields) of the values, minus combinations
the config dataclass itself rejects, filtered by the constraints.

``stages`` (optional) splits a family's search by launch: each stage names the kernel it
times (one of the family's, :data:`kdagen.codegen.render.FAMILY_KERNELS`) and the fields it
varies; the others keep the default's values.  The tuner combines the fastest of each.

Constraints are expressions over the params and a context, evaluated by a small
interpreter over Python's ``ast`` (no ``eval``): numbers, strings, names, arithmetic,
comparisons, ``and``/``or``/``not``, conditional expressions and calls of ``min``, ``max``
and ``abs`` only.  Context names:

* ``K``, ``V``: head dims;  ``elem_bytes``: bytes per input element (default 2);
* ``safe_sub_chunk``: the largest sub-chunk the gate's lower bound makes safe, or 0 when
  the gate has no lower bound (then sub_chunk must be 16);
* ``smem_limit``: the GPU's opt-in shared memory per block, in bytes;
* ``smem_estimate``: computed per candidate by :func:`estimate_smem`.
"""
from __future__ import annotations

import ast
import hashlib
import itertools
import json
import math
import operator
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from ..codegen.render import FAMILY_KERNELS
from ..config import CONFIG_TYPES, ConfigError
from ..resources import search_spaces_dir

FORMAT_VERSION = 1
MAX_PRODUCT = 1_000_000
CONTEXT_NAMES = ("K", "V", "elem_bytes", "safe_sub_chunk", "smem_limit", "smem_estimate")


class SearchSpaceError(ValueError):
    pass


# --------------------------------------------------------------------------- evaluator

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Not: operator.not_,
}
_CMPOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
    ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_FUNCS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}
_MAX_POW_EXP = 64


def _check_node(node: ast.AST, expr: str) -> None:
    """Reject anything outside the whitelist (applied to the whole tree up front)."""
    for n in ast.walk(node):
        ok = isinstance(n, (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.UnaryOp,
                            ast.Compare, ast.IfExp, ast.Name, ast.Load, ast.Constant))
        ok = ok or type(n) in _BINOPS or type(n) in _UNARY or type(n) in _CMPOPS
        if isinstance(n, ast.Constant) and not (
                isinstance(n.value, (int, float, str))):
            ok = False
        if isinstance(n, ast.Call):
            ok = (isinstance(n.func, ast.Name) and n.func.id in _FUNCS and not n.keywords
                  and all(not isinstance(a, ast.Starred) for a in n.args) and len(n.args) >= 1)
        if isinstance(n, ast.Name) and n.id.startswith("__"):
            ok = False
        if not ok:
            raise ValueError(f"disallowed syntax {type(n).__name__} in constraint {expr!r} "
                             f"(allowed: numbers, names, arithmetic, comparisons, and/or/not, "
                             f"min/max/abs)")


def parse_expr(expr: str) -> ast.Expression:
    """Parse and whitelist-check a constraint expression; ``ValueError`` if not allowed."""
    if not isinstance(expr, str):
        raise ValueError(f"constraint must be a string, got {expr!r}")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"syntax error in constraint {expr!r}: {e.msg}") from None
    _check_node(tree, expr)
    return tree


def _eval(node: ast.AST, names: dict[str, Any], expr: str) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body, names, expr)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        try:
            return names[node.id]
        except KeyError:
            raise ValueError(f"unknown name {node.id!r} in constraint {expr!r}; "
                             f"known: {sorted(names)}") from None
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Any = True
            for v in node.values:
                result = _eval(v, names, expr)
                if not result:
                    return result
            return result
        result = False
        for v in node.values:
            result = _eval(v, names, expr)
            if result:
                return result
        return result
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, names, expr))
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, names, expr), _eval(node.right, names, expr)
        if not all(isinstance(x, (int, float)) for x in (left, right)):
            raise ValueError(f"arithmetic on non-numbers ({left!r}, {right!r}) in constraint {expr!r}")
        if isinstance(node.op, ast.Pow):
            if not isinstance(right, (int, float)) or abs(right) > _MAX_POW_EXP:
                raise ValueError(f"exponent too large in constraint {expr!r}")
        try:
            return _BINOPS[type(node.op)](left, right)
        except (TypeError, ZeroDivisionError, OverflowError) as e:
            raise ValueError(f"cannot evaluate constraint {expr!r}: {e}") from None
    if isinstance(node, ast.Compare):
        left = _eval(node.left, names, expr)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, names, expr)
            try:
                if not _CMPOPS[type(op)](left, right):
                    return False
            except TypeError as e:
                raise ValueError(f"cannot evaluate constraint {expr!r}: {e}") from None
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, names, expr) else node.orelse, names, expr)
    if isinstance(node, ast.Call):
        args = [_eval(a, names, expr) for a in node.args]
        try:
            return _FUNCS[node.func.id](*args)  # type: ignore[attr-defined]
        except TypeError as e:
            raise ValueError(f"cannot evaluate constraint {expr!r}: {e}") from None
    raise ValueError(f"disallowed syntax {type(node).__name__} in constraint {expr!r}")


def safe_eval(expr: str | ast.Expression, names: dict[str, Any]) -> Any:
    """Evaluate a whitelisted expression over ``names``; anything else -> ``ValueError``."""
    tree = parse_expr(expr) if isinstance(expr, str) else expr
    return _eval(tree, names, expr if isinstance(expr, str) else ast.unparse(tree))


# --------------------------------------------------------------------------- smem model


def estimate_smem(kernel: str, config: Any, K: int, V: int, elem_bytes: int = 2) -> int:
    """Rough bytes of shared memory the largest launch of a kernel needs.

    A deliberately simple model, used only to prune configs that cannot launch; Triton's
    real allocation may differ by a few KiB (the tuner treats an ``OutOfResources`` at build
    time as a failed trial, so an optimistic estimate is harmless).

    ``chunk_fwd`` (C=chunk_size, BV=min(state_block_v, V), e=elem_bytes):

    * solve launch: the dot operands of one 32-row half, four ``32*K`` tiles, and its fp32
      ``32*32`` matrices (A_kk, A_qk, L, P): ``4*32*K*e + 4*4*32*32``;
    * state pass, per pipeline stage: the ``C*K`` tiles of bk, qg and kgL and the ``C*C`` P;
      once: the state and X as dot operands, ``(K*BV + C*BV)*e``:
      ``state_num_stages*(3*C*K + C*C)*e + (K + C)*BV*e``;
    * with ``state_segment_chunks`` > 0, also the chaining launch (chunk_seg_combine): a
      segment's fp32 ``K*K`` transition and the fp32 ``K*BV`` state as dot operands,
      ``4*(K*K + K*BV)`` (its other two launches hold no more than the pass).

    ``chunk_train`` (C=chunk_size, BK=intra_block_k, BV=min(state_block_v, V)):

    * intra launch: k and q tiles ``2*C*BK`` elements, double-buffered ``intra_num_stages``
      times, the fp32 ``C*C`` matrix A, and a ``C*BV`` v tile:
      ``intra_num_stages*2*C*BK*e + 4*C*C + C*BV*e``;
    * state launch, per pipeline stage: the ``C*K`` tiles of W, k and q, the ``C*C`` Aqk
      and a ``C*BV`` u tile: ``state_num_stages*((3*C*K + C*C)*e + C*BV*e)``.

    For both the estimate is the larger of the two launches'.  ``recurrent`` keeps its state in registers and
    only stages the q/k vectors and a v slice: ``(2*K + block_v)*e``; its pipelined persistent form
    (programs_per_sm > 0, num_stages > 1) buffers per stage the state tile and the token's slices
    in shared memory, counted at 4 bytes (an fp32 pool, the widest).

    ``chunk_bwd``, the largest of: the reverse state pass, per stage, the ``C*K`` tiles of
    qg, kg and W, the ``C*C`` Aqk and a ``C*BV`` dO tile; the chunk-parallel launch, per
    stage, the ``BK*BV`` tiles of S and dS and three ``C*BV`` tiles (V', dU in fp32, dO);
    the intra launch, per stage, four ``C*BK`` tiles and two ``C*BV`` tiles, plus its fp32
    ``C*C`` matrices (E, dT, M: ``12*C*C`` bytes).
    """
    e = int(elem_bytes)
    if kernel == "chunk_fwd":
        C, BV = config.chunk_size, min(config.state_block_v, V)
        solve = 4 * 32 * K * e + 4 * 4 * 32 * 32
        state = config.state_num_stages * (3 * C * K + C * C) * e + (K + C) * BV * e
        chain = 4 * (K * K + K * BV) if config.state_segment_chunks else 0
        return int(max(solve, state, chain))
    if kernel == "chunk_train":
        C, BK = config.chunk_size, config.intra_block_k
        BV = min(config.state_block_v, V)
        intra = config.intra_num_stages * 2 * C * BK * e + 4 * C * C + C * BV * e
        state = config.state_num_stages * ((3 * C * K + C * C) * e + C * BV * e)
        return int(max(intra, state))
    if kernel == "recurrent":
        if config.programs_per_sm and config.num_stages > 1:
            # the pipelined item loop: per stage the state tile (its dtype is the pool's: fp32 at
            # most) and the token's q, k, g and v slices
            return int(config.num_stages * (K * config.block_v * 4 + (3 * K + config.block_v) * 4))
        return int((2 * K + config.block_v) * e)
    if kernel == "chunk_bwd":
        C = config.chunk_size
        bv = min(config.state_block_v, V)
        state = config.state_num_stages * ((3 * C * K + C * C + C * bv) * e)
        bk, bv2 = min(config.dqkw_block_k, K), min(config.dqkw_block_v, V)
        dqkw = config.dqkw_num_stages * (2 * bk * bv2 * e + C * bv2 * (2 * e + 4))
        bki, bvi = min(config.intra_block_k, K), min(config.intra_block_v, V)
        intra = config.intra_num_stages * (4 * C * bki * e + 2 * C * bvi * e) + 12 * C * C
        return int(max(state, dqkw, intra))
    raise ValueError(f"estimate_smem: unknown kernel {kernel!r}")


# --------------------------------------------------------------------------- space


@dataclass
class SearchSpace:
    kernel: str
    params: dict[str, list[Any]]  # as declared in the file
    constraints: list[str]
    source: str = "<dict>"
    version: int = FORMAT_VERSION
    description: str = ""
    stages: dict[str, list[str]] = field(default_factory=dict)  # stage -> the config fields it varies
    stage_launches: dict[str, str] = field(default_factory=dict)  # stage -> the kernel it times
    _trees: list[ast.Expression] = field(default_factory=list, repr=False)
    _configs: list[Any] = field(default_factory=list, repr=False)

    @property
    def config_cls(self) -> type:
        return CONFIG_TYPES[self.kernel]

    @property
    def size(self) -> int:
        """Size of the declared cartesian product (before any filtering)."""
        return math.prod(len(v) for v in self.params.values())

    @property
    def axes(self) -> dict[str, list[Any]]:
        """Every config field with its values (declared, or ``[default]``)."""
        out: dict[str, list[Any]] = dict(self.params)
        for f in fields(self.config_cls):
            if f.name not in out:
                out[f.name] = [f.default]
        return out

    @classmethod
    def from_dict(cls, d: Any, source: str = "<dict>") -> "SearchSpace":
        def fail(msg: str) -> SearchSpaceError:
            return SearchSpaceError(f"search space {source}: {msg}")

        if not isinstance(d, dict):
            raise fail("top level must be a JSON object")
        allowed = {"kernel", "version", "params", "constraints", "description", "stages"}
        extra = [k for k in d if k not in allowed and not str(k).startswith("_")]
        if extra:
            raise fail(f"unknown top-level keys {sorted(extra)}; allowed: {sorted(allowed)}")
        kernel = d.get("kernel")
        if kernel not in CONFIG_TYPES:
            raise fail(f"unknown kernel {kernel!r}; known: {sorted(CONFIG_TYPES)}")
        if d.get("version", FORMAT_VERSION) != FORMAT_VERSION:
            raise fail(f"format version {d.get('version')!r} is not supported (expected {FORMAT_VERSION})")
        cfg_cls = CONFIG_TYPES[kernel]
        field_names = [f.name for f in fields(cfg_cls)]
        params = d.get("params", {})
        if not isinstance(params, dict):
            raise fail("'params' must be an object {name: [values...]}")
        unknown = [p for p in params if p not in field_names]
        if unknown:
            raise fail(f"unknown params {unknown} for kernel {kernel!r}; "
                       f"the {cfg_cls.__name__} fields are {field_names}")
        for name, values in params.items():
            if not isinstance(values, list) or not values:
                raise fail(f"param {name!r} must be a non-empty list of values, got {values!r}")
            seen = set()
            for v in values:
                if not isinstance(v, (int, float, str, bool)):
                    raise fail(f"param {name!r}: value {v!r} is not a JSON scalar")
                if (type(v), v) in seen:
                    raise fail(f"param {name!r}: duplicate value {v!r}")
                seen.add((type(v), v))
        clash = [p for p in params if p in CONTEXT_NAMES]
        if clash:  # pragma: no cover - no config field has a context name today
            raise fail(f"params {clash} clash with context names {CONTEXT_NAMES}")
        stages = d.get("stages", {})
        launches = FAMILY_KERNELS[kernel]
        if not isinstance(stages, dict) or any(
                not isinstance(v, dict) or set(v) != {"launch", "fields"} or v["launch"] not in launches
                or not isinstance(v["fields"], list) or any(f not in field_names for f in v["fields"])
                for v in stages.values()):
            raise fail(f"'stages' must map a stage name to {{\"launch\": the kernel it times (one of "
                       f"{list(launches)}), \"fields\": the {cfg_cls.__name__} fields it varies}}")
        named = [v["launch"] for v in stages.values()]
        if len(set(named)) != len(named):
            raise fail(f"two stages time the same launch: {named}")
        constraints = d.get("constraints", [])
        if not isinstance(constraints, list):
            raise fail("'constraints' must be a list of expression strings")
        trees = []
        for c in constraints:
            try:
                trees.append(parse_expr(c))
            except ValueError as e:
                raise fail(str(e)) from None
        space = cls(kernel=kernel, params={k: list(v) for k, v in params.items()},
                    constraints=list(constraints), source=source,
                    version=d.get("version", FORMAT_VERSION),
                    description=str(d.get("description", "")), _trees=trees,
                    stages={k: list(v["fields"]) for k, v in stages.items()},
                    stage_launches={k: v["launch"] for k, v in stages.items()})
        space._build(fail)
        return space

    def _build(self, fail: Callable[[str], Exception]) -> None:
        """Instantiate every combination the config dataclass accepts; a declared value
        that no combination accepts is an error (it names the file, param and reason)."""
        if self.size > MAX_PRODUCT:
            raise fail(f"cartesian product has {self.size} points (> {MAX_PRODUCT})")
        axes = self.axes
        names = list(axes)
        used: dict[str, set] = {n: set() for n in self.params}
        last_error: dict[tuple[str, Any], str] = {}
        configs = []
        for combo in itertools.product(*(axes[n] for n in names)):
            kw = dict(zip(names, combo))
            try:
                cfg = self.config_cls(**kw)
            except (ConfigError, TypeError, ValueError) as e:
                for n in self.params:
                    last_error[(n, _hashable(kw[n]))] = str(e)
                continue
            configs.append(cfg)
            for n in self.params:
                used[n].add(_hashable(kw[n]))
        for n, values in self.params.items():
            for v in values:
                if _hashable(v) not in used[n]:
                    why = last_error.get((n, _hashable(v)), "rejected")
                    raise fail(f"param {n!r}: value {v!r} is rejected by "
                               f"{self.config_cls.__name__} in every combination ({why})")
        self._configs = configs

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kernel": self.kernel, "version": self.version,
                             "params": {k: list(v) for k, v in self.params.items()},
                             "constraints": list(self.constraints)}
        if self.description:
            d["description"] = self.description
        if self.stages:
            d["stages"] = {k: {"launch": self.stage_launches[k], "fields": list(v)} for k, v in self.stages.items()}
        return d

    def fingerprint(self) -> str:
        """sha256 (16 hex) of the canonical JSON of the space (not of its source path)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def candidates(self, context: dict[str, Any]) -> list[Any]:
        """Configs of the product that the dataclass accepts and every constraint admits.

        ``context`` needs ``K`` and ``V`` and whatever the constraints name
        (``safe_sub_chunk``, ``smem_limit``, ...); ``elem_bytes`` defaults to 2.
        ``smem_estimate`` is computed per candidate.  Order is the product order.
        """
        ctx = dict(context)
        ctx.setdefault("elem_bytes", 2)
        for req in ("K", "V"):
            if req not in ctx:
                raise ValueError(f"search space {self.source}: context is missing {req!r}")
        clash = [k for k in ctx if k in self.axes]
        if clash:
            raise ValueError(f"search space {self.source}: context names {clash} clash with params")
        out = []
        for cfg in self._configs:
            names = dict(ctx)
            names.update(cfg.to_dict())
            names["smem_estimate"] = estimate_smem(self.kernel, cfg, ctx["K"], ctx["V"], ctx["elem_bytes"])
            try:
                if all(_eval(t, names, c) for t, c in zip(self._trees, self.constraints)):
                    out.append(cfg)
            except ValueError as e:
                raise ValueError(f"search space {self.source}: {e}") from None
        return out


def _hashable(v: Any) -> tuple[type, Any]:
    return (type(v), v)


# --------------------------------------------------------------------------- loading


def _packaged_text(kernel: str) -> tuple[str, str]:
    path = search_spaces_dir() / f"{kernel}.json"
    if not path.is_file():
        raise SearchSpaceError(f"no packaged search space for kernel {kernel!r} (looked in {path.parent}); "
                               f"known kernels: {sorted(CONFIG_TYPES)}")
    return path.read_text(encoding="utf-8"), str(path)


def load_space(kernel_or_path: str | os.PathLike) -> SearchSpace:
    """A kernel name (``"chunk_fwd"``) loads the packaged space; a path loads a user file."""
    s = os.fspath(kernel_or_path)
    is_path = (isinstance(kernel_or_path, os.PathLike) or s.endswith(".json")
               or os.sep in s or (os.altsep is not None and os.altsep in s))
    if not is_path and s in CONFIG_TYPES:
        text, source = _packaged_text(s)
    elif not is_path:
        raise SearchSpaceError(f"{s!r} is neither a known kernel ({sorted(CONFIG_TYPES)}) "
                               f"nor a path to a .json search space")
    else:
        source = s
        try:
            text = Path(s).read_text(encoding="utf-8")
        except OSError as e:
            raise SearchSpaceError(f"cannot read search space {s}: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SearchSpaceError(f"search space {source} is not valid JSON: {e}") from None
    return SearchSpace.from_dict(data, source=source)
