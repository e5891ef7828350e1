"""Per-call overheads of Triton's CPU interpreter taken out, leaving what it computes unchanged.  Installed
by the conftest (the processes of the interpreter tests) and by the processes the tests start that run the
interpreter themselves (the bf16 emulation scripts, the context-parallel ranks).  Either is skipped on a
Triton whose interpreter lacks the function it replaces."""
from __future__ import annotations

import hashlib
import inspect
import textwrap

import triton.language as tl
from triton.runtime import interpreter


def _source_is(fn, digest: str) -> bool:
    """Whether ``fn``'s source is the one a replacement below was written against (its SHA-1, first 12
    digits): a Triton whose code differs keeps its own."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return False
    return hashlib.sha1(src.encode()).hexdigest()[:12] == digest


def _builtins_listed_once() -> None:
    """The interpreter patches triton.language's builtins on every launch and on every call of a jitted helper
    inside a kernel, listing each package's members (``inspect.getmembers``: every attribute, sorted) each
    time.  Here each package's builtins are listed once; each call then patches, in the same (sorted) order,
    those of them still builtin -- as Triton's ``_patch_builtin`` does, which finds no builtin under a name
    already patched."""
    if not (hasattr(interpreter, "_patch_builtin") and hasattr(interpreter, "_patch_attr")):
        return
    listed = {}

    def patch_builtin(pkg, builder, scope):
        names = listed.get(pkg)
        if names is None:
            names = listed[pkg] = [n for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)]
        for name in names:
            member = getattr(pkg, name, None)
            if tl.core.is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)

    interpreter._patch_builtin = patch_builtin


def _np_dtypes_remembered() -> None:
    """The numpy dtype of a Triton type (``_get_np_dtype``, millions of calls) builds its table of every type
    on each call; a block type's is its element type's.  Each answer is remembered per type here."""
    if not hasattr(interpreter, "_get_np_dtype"):
        return
    plain, memo = interpreter._get_np_dtype, {}

    def get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):  # (a block of pointers: the pointer's, uint64)
            tt_dtype = tt_dtype.element_ty
        try:
            return memo[tt_dtype]
        except KeyError:
            np_dtype = memo[tt_dtype] = plain(tt_dtype)
            return np_dtype
        except TypeError:  # an unhashable type: Triton's own answer (or error)
            return plain(tt_dtype)

    interpreter._get_np_dtype = get_np_dtype


def _tuple_types_on_demand() -> None:
    """Every interpreted operation builds its result's shape as a ``tl.tuple`` of constexprs, whose type
    (a ``tuple_type`` with a printed name) is built at once -- millions of types and names no kernel reads.
    Here a tuple's type is built when first read, from the values it holds then (a tuple's values change only
    through ``_setitem``, which sets the type again), and a tuple type's name when first printed."""
    tup, tup_type = tl.core.tuple, tl.core.tuple_type
    lazy_types = _source_is(tup.__init__, "7a3fe25df4c0")  # Triton 3.6 to 3.9
    lazy_names = _source_is(tup_type.__init__, "707614104505")  # Triton 3.6 (3.9's name is built on demand)
    plain_type_init = tup_type.__init__

    def tuple_init(self, args, type=None):
        self.values = [i for i in args]
        if isinstance(type, tup_type):
            self.__dict__["_type"] = type
        elif type is not None:  # a list or tuple of types
            self.__dict__["_type"] = tup_type(type)
        else:
            self.__dict__["_type"] = None

    def get_type(self):
        t = self.__dict__.get("_type")
        if t is None:
            t = self.__dict__["_type"] = tl.core._type_for_tuple_values(self.values)
        return t

    def set_type(self, t):
        self.__dict__["_type"] = t

    def type_init(self, types, fields=None):
        self.types = types
        self.fields = fields or [''] * len(types)

    def get_name(self):
        name = self.__dict__.get("_name")
        if name is None:
            name = self.__dict__["_name"] = '[' + ','.join(f"{k}:{v}" for k, v in zip(self.fields, self.types)) + ']'
        return name

    def set_name(self, name):
        self.__dict__["_name"] = name

    if lazy_types:
        tup.__init__, tup.type = tuple_init, property(get_type, set_type)
    if lazy_names:  # Triton's own name, built later: checked against it once, at install
        probe = tup_type.__new__(tup_type)
        plain_type_init(probe, [tl.core.constexpr_type(1)], None)
        tup_type.__init__, tup_type.name = type_init, property(get_name, set_name)
        lazy = tup_type([tl.core.constexpr_type(1)])
        assert lazy.name == probe.__dict__["name"], (lazy.name, probe.__dict__["name"])


def _shapes_on_demand() -> None:
    """Each interpreted operation's result (a ``tl.tensor``) builds its shape as constexprs and a block type
    builds a printed name, though most are never read: here both are built when first read.  A tensor's type
    is set once, at construction, so its shape read later is the one Triton builds at once."""
    tensor, block_type = tl.core.tensor, tl.core.block_type
    if not (_source_is(tensor.__init__, "1f20709236e6") and _source_is(block_type.__init__, "8c5506e30f29")):
        return  # Triton 3.6 to 3.9
    import math

    constexpr, tup = tl.core.constexpr, tl.core.tuple

    def tensor_init(self, handle, type):
        self.handle = handle
        self.type = type
        self.dtype = type.scalar

    def _dims(self):
        t = self.type
        return t.shape if t.is_block() else ()

    def get_shape(self):
        shape = self.__dict__.get("_shape")
        if shape is None:
            shape = self.__dict__["_shape"] = tup([constexpr(s) for s in _dims(self)])
        return shape

    def set_shape(self, shape):
        self.__dict__["_shape"] = shape

    def get_numel(self):
        numel = self.__dict__.get("_numel")
        if numel is None:
            numel = self.__dict__["_numel"] = constexpr(math.prod(_dims(self)))
        return numel

    def set_numel(self, numel):
        self.__dict__["_numel"] = numel

    def block_init(self, element_ty, shape):
        self.element_ty = element_ty
        assert isinstance(shape, (list, tup))  # (core.py's own tuple, as there)
        self.shape = tup(tl.core._unwrap_shape(shape))
        if not self.shape:
            raise TypeError('0d block_type is forbidden')
        self.numel = tl.core.validate_block_shape(self.shape)

    def get_block_name(self):
        name = self.__dict__.get("_name")
        if name is None:
            name = self.__dict__["_name"] = f'<{self.shape}, {self.element_ty}>'
        return name

    def set_block_name(self, name):
        self.__dict__["_name"] = name

    plain_tensor_init, plain_block_init = tensor.__init__, block_type.__init__
    probe_t, probe_b = tensor.__new__(tensor), block_type.__new__(block_type)
    plain_block_init(probe_b, tl.float32, [2, 4])
    plain_tensor_init(probe_t, None, probe_b)
    tensor.__init__ = tensor_init
    tensor.shape, tensor.numel = property(get_shape, set_shape), property(get_numel, set_numel)
    block_type.__init__, block_type.name = block_init, property(get_block_name, set_block_name)
    lazy_b = block_type(tl.float32, [2, 4])
    lazy_t = tensor(None, lazy_b)
    assert lazy_b.name == probe_b.__dict__["name"] and lazy_b == probe_b, (lazy_b.name, probe_b.__dict__["name"])
    assert (str(lazy_t.shape), lazy_t.numel.value) == (str(probe_t.__dict__["shape"]), probe_t.__dict__["numel"].value)


def _same_type_operands_pass_through() -> None:
    """A binary operation type-checks, promotes, casts and broadcasts its operands on every interpreted call
    (a third of an interpreter test's time).  Two tensors of one non-pointer element type and one shape come
    out of that unchanged whenever the promoted type is theirs: each cast to it returns its input and equal
    shapes broadcast to themselves.  Here such a pair is returned at once; the promoted type is Triton's own
    (``computation_type_impl``), asked once per element type; every other pair takes Triton's path."""
    from triton.language.semantic import TritonSemantic as Sem

    plain = Sem.binary_op_type_checking_impl
    if not (_source_is(Sem.cast, "07dd010bcd20") and _source_is(Sem.broadcast_impl_value, "09e5ad76ac14")
            and _source_is(plain, "4f0c4ab39cfa")):  # Triton 3.6
        if not (_source_is(Sem.cast, "23a555da85e8") and _source_is(Sem.broadcast_impl_value, "c357022891e3")
                and _source_is(plain, "a40b28839707")
                and _source_is(getattr(Sem, "_cast_to_computation_type", None), "1f23fe565fe9")):  # Triton 3.9
            return
    tensor, promoted = tl.core.tensor, {}

    def keeps(self, ty, div_or_mod) -> bool:  # whether (ty, ty) promotes to ty: Triton's answer, remembered
        key = (ty, div_or_mod)
        try:
            return promoted[key]
        except KeyError:
            try:
                same = self.computation_type_impl(ty, False, ty, False, div_or_mod) == ty
            except (TypeError, ValueError):
                same = False
            promoted[key] = same
            return same
        except TypeError:  # an unhashable type
            return False

    def binary_op_type_checking_impl(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False,
                                     arithmetic_check=True, div_or_mod=False):
        if type(lhs) is tensor and type(rhs) is tensor:
            lt, rt = lhs.type, rhs.type
            ty = lt.scalar
            if (ty is rt.scalar and not ty.is_ptr() and (not arithmetic_check or keeps(self, ty, div_or_mod))
                    and (lt is rt or (lt.is_block() and rt.is_block() and lt.shape.values == rt.shape.values))):
                return lhs, rhs
        return plain(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)

    Sem.binary_op_type_checking_impl = binary_op_type_checking_impl


def install() -> None:
    _builtins_listed_once()
    _np_dtypes_remembered()
    _tuple_types_on_demand()
    _shapes_on_demand()
    _same_type_operands_pass_through()
