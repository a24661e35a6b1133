"""Reduction ops: one table holding everything mlcomm knows about each op, and the dtypes.

:data:`OP_TABLE` maps each canonical op name to an :class:`Op` record: its stable integer
code, what it reduces as, its NumPy ufunc, the names of the matching MPI op constant and
``torch.distributed.ReduceOp`` member, the dtype kinds it accepts and the hints given when a
dtype does not fit, the views its kernels run on, and the op on one element
(:attr:`Op.element`, plain Python that Numba compiles for the CPU and CUDA kernels;
:attr:`Op.c_expr`, the same in C for CuPy). Every backend, and
every other part of mlcomm, reads its per-op facts here.

min and max follow IEEE 754-2019 ``minimum``/``maximum`` in every backend and so in every
algorithm, whatever its reduction order: a NaN operand gives NaN (the first operand's bits
when it is NaN, else the second's, passed on unchanged, as NumPy's ``np.maximum`` does), and
zeros are ordered ``-0 < +0``, so ``max(-0.0, +0.0)`` is ``+0.0`` and ``min(-0.0, +0.0)`` is
``-0.0`` in either operand order. MPI's ``MPI_MAX``/``MPI_MIN`` promise neither: MPICH
computes ``max(nan, 1)`` as ``1`` (the answer depends on where the NaN sits in the reduction
order) and may return either zero when ``-0.0`` meets ``+0.0``. Integers are unaffected.
"""

import dataclasses
import types

import numpy as np

try:
    import ml_dtypes as _ml_dtypes
    BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a hard dependency
    BFLOAT16 = None

__all__ = ["Op", "OP_TABLE", "OP_BY_CODE", "OPS", "DTYPES", "BFLOAT16", "op_info", "op_code",
           "normalize_op", "dtype_kind", "kernel_view", "check_op", "is_supported",
           "supported_dtypes", "maximum", "minimum"]


# --- one element of each op (plain Python: Numba compiles these for CPU and CUDA) ------------

def _sum(a, b):
    return a + b


def _prod(a, b):
    return a * b


def maximum(a, b):
    """IEEE 754-2019 maximum of two numbers: NaN propagates (a's first), ``-0 < +0``.

    ``b`` when it is larger, equal or NaN; two zeros sum to ``-0`` only when both are ``-0``,
    which is then their maximum.
    """
    if a != a or a > b:
        return a
    return a + b if (a == 0 and b == 0) else b


def minimum(a, b):
    """IEEE 754-2019 minimum of two numbers: NaN propagates (a's first), ``-0 < +0``.

    ``b`` when it is smaller, equal or NaN; for two zeros ``-a - b`` is ``+0`` unless both are
    ``+0``, so its negation is their minimum.
    """
    if a != a or a < b:
        return a
    return -(-a - b) if (a == 0 and b == 0) else b


def _band(a, b):
    return a & b


def _bor(a, b):
    return a | b


def _bxor(a, b):
    return a ^ b


def _land(a, b):
    return 1 if (a != 0 and b != 0) else 0


def _lor(a, b):
    return 1 if (a != 0 or b != 0) else 0


# --- the table ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Op:
    """Everything mlcomm knows about one reduction op."""

    #: canonical name, e.g. "sum"
    name: str
    #: stable small integer naming this op (lowered programs, wire formats); unique per op
    code: int
    #: canonical name of the op whose elementwise reduction this op runs ("sum" for avg)
    reduces_as: str
    #: code of :attr:`reduces_as`: the reduction a lowered program runs for this op
    reduce_code: int
    #: finishing divides the reduced result by the number of ranks (avg)
    divides: bool
    #: the NumPy ufunc reducing two arrays elementwise
    ufunc: np.ufunc
    #: name of the MPI op constant with the same meaning ("SUM", ...; avg reduces as "SUM")
    mpi: str
    #: name of the ``torch.distributed.ReduceOp`` member with the same meaning ("SUM",
    #: "PRODUCT", ...; "" where torch has none)
    torch: str
    #: dtype kinds accepted: "i" signed, "u" unsigned, "f" floating, "c" complex, "b" bool
    kinds: str
    #: what the op needs, for error messages ("a numeric ... dtype")
    needs: str
    #: (kind, what to use instead) for kinds the op rejects
    instead: tuple
    #: other names accepted for the op (lower case)
    aliases: tuple
    #: on integers and bool the result's bits do not depend on signedness: kernels run on
    #: the unsigned view of the same width
    signless: bool
    #: complex reduces component by component: kernels run on the real view
    componentwise: bool
    #: the result is one of the operands (or, for two zeros, the ordered one): a NaN operand's
    #: bits pass through unchanged, where arithmetic produces a new, quiet NaN
    picks: bool
    #: ``element(a, b)``: the op on one element of the kernel view, in plain Python that
    #: Numba compiles (``@njit`` and ``@cuda.jit(device=True)``)
    element: types.FunctionType
    #: the op on one element in C, with ``{a}``, ``{b}`` the operands and ``{T}`` their type
    c_expr: str

    def hint(self, kind):
        """Return what to use instead of this op on dtype kind ``kind`` ("" when none)."""
        return dict(self.instead).get(kind, "")


_NUMERIC = "a numeric (integer, floating or complex) dtype"
_ORDERED = "an integer or floating dtype"
_BITS = "an integer or bool dtype"
_UNORDERED = "complex numbers are not ordered; reduce abs() or the real part instead"
_RAW_BITS = ("view the data as an unsigned integer of the same width "
             "(e.g. arr.view(np.uint32)) to combine raw bits")
_NONZERO = "reduce (arr != 0) as a bool array instead"
_TO_FLOAT = "use sum and divide, or convert to a floating dtype first"

_MAX_C = ("(({a} != {a} || {a} > {b}) ? {a} : ({a} == ({T})0 && {b} == ({T})0) ? "
          "({T})({a} + {b}) : {b})")
_MIN_C = ("(({a} != {a} || {a} < {b}) ? {a} : ({a} == ({T})0 && {b} == ({T})0) ? "
          "({T})(-(-{a} - {b})) : {b})")

# name, code, reduces as, ufunc, MPI, torch, kinds, needs, instead, aliases, signless,
# componentwise, picks, element, C
_ROWS = (
    ("sum", 0, "sum", np.add, "SUM", "SUM", "iufc", _NUMERIC,
     (("b", "use lor (or bor) for a logical OR over ranks, or convert to an integer dtype "
            "to count"),),
     ("add", "+"), True, True, False, _sum, "{a} + {b}"),
    ("prod", 1, "prod", np.multiply, "PROD", "PRODUCT", "iufc", _NUMERIC,
     (("b", "use land (or band) for a logical AND over ranks"),),
     ("mul", "product", "*"), True, False, False, _prod, "{a} * {b}"),
    ("min", 2, "min", np.minimum, "MIN", "MIN", "iuf", _ORDERED,
     (("c", _UNORDERED), ("b", "use land (the minimum of booleans)")),
     ("minimum",), False, False, True, minimum, _MIN_C),
    ("max", 3, "max", np.maximum, "MAX", "MAX", "iuf", _ORDERED,
     (("c", _UNORDERED), ("b", "use lor (the maximum of booleans)")),
     ("maximum",), False, False, True, maximum, _MAX_C),
    ("avg", 9, "sum", np.add, "SUM", "AVG", "fc", "a floating or complex dtype",
     (("i", _TO_FLOAT), ("u", _TO_FLOAT),
      ("b", "use sum on an integer copy, or convert to a floating dtype first")),
     ("mean", "average"), True, True, False, _sum, "{a} + {b}"),
    ("band", 4, "band", np.bitwise_and, "BAND", "BAND", "iub", _BITS,
     (("f", _RAW_BITS), ("c", _RAW_BITS)),
     ("bitwise_and",), True, False, False, _band, "{a} & {b}"),
    ("bor", 5, "bor", np.bitwise_or, "BOR", "BOR", "iub", _BITS,
     (("f", _RAW_BITS), ("c", _RAW_BITS)),
     ("bitwise_or",), True, False, False, _bor, "{a} | {b}"),
    ("bxor", 6, "bxor", np.bitwise_xor, "BXOR", "BXOR", "iub", _BITS,
     (("f", _RAW_BITS), ("c", _RAW_BITS)),
     ("bitwise_xor",), True, False, False, _bxor, "{a} ^ {b}"),
    ("land", 7, "land", np.logical_and, "LAND", "", "iub",
     _BITS + " (MPI logical ops give 1/0)",
     (("f", _NONZERO), ("c", _NONZERO)),
     ("logical_and",), True, False, False, _land,
     "({a} != ({T})0 && {b} != ({T})0) ? ({T})1 : ({T})0"),
    ("lor", 8, "lor", np.logical_or, "LOR", "", "iub", _BITS + " (MPI logical ops give 1/0)",
     (("f", _NONZERO), ("c", _NONZERO)),
     ("logical_or",), True, False, False, _lor,
     "({a} != ({T})0 || {b} != ({T})0) ? ({T})1 : ({T})0"),
)
_CODE = {row[0]: row[1] for row in _ROWS}

#: Every reduction op by canonical name, in :data:`OPS` order.
OP_TABLE = types.MappingProxyType({
    row[0]: Op(name=row[0], code=row[1], reduces_as=row[2], reduce_code=_CODE[row[2]],
               divides=row[0] == "avg", ufunc=row[3], mpi=row[4], torch=row[5], kinds=row[6],
               needs=row[7], instead=row[8], aliases=row[9], signless=row[10],
               componentwise=row[11], picks=row[12], element=row[13], c_expr=row[14])
    for row in _ROWS})

#: The ops indexed by :attr:`Op.code`.
OP_BY_CODE = tuple(sorted(OP_TABLE.values(), key=lambda o: o.code))

#: Every reduction op, by canonical name.
OPS = tuple(OP_TABLE)

#: Every dtype mlcomm has a kernel for, by name (bfloat16 is ml_dtypes.bfloat16).
DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128", "bool")

_ALIASES = {alias: op.name for op in OP_TABLE.values() for alias in op.aliases}

# dtype name -> kind: "i" signed int, "u" unsigned int, "f" floating, "c" complex, "b" bool
_KIND = {
    "int8": "i", "int16": "i", "int32": "i", "int64": "i",
    "uint8": "u", "uint16": "u", "uint32": "u", "uint64": "u",
    "float16": "f", "bfloat16": "f", "float32": "f", "float64": "f",
    "complex64": "c", "complex128": "c", "bool": "b",
}
_UINT = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
         8: np.dtype(np.uint64)}
_REAL = {np.dtype(np.complex64): np.dtype(np.float32),
         np.dtype(np.complex128): np.dtype(np.float64)}

_check_cache = {}


def normalize_op(op):
    """Return the canonical name of ``op`` (a name from :data:`OPS` or an alias)."""
    if isinstance(op, str):
        name = op.strip().lower()
        if name.startswith("mpi_"):
            name = name[4:]
        name = _ALIASES.get(name, name)
        if name in OP_TABLE:
            return name
    raise ValueError(f"unknown reduction op {op!r}; choose one of {', '.join(OPS)}")


def op_info(op):
    """Return the :class:`Op` record of ``op`` (a name from :data:`OPS` or an alias)."""
    return OP_TABLE[normalize_op(op)]


def op_code(op):
    """Return the stable integer code of ``op`` (sum 0, prod 1, min 2, max 3, band 4, bor 5,
    bxor 6, land 7, lor 8, avg 9; avg reduces as sum, see :attr:`Op.reduce_code`)."""
    return OP_TABLE[normalize_op(op)].code


def _dtype_name(dtype):
    """Return the kernel name of ``dtype`` or None when mlcomm has no kernel for it."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return None
    if dt.fields is not None or dt.subdtype is not None:
        return None
    if not dt.isnative:
        return None
    if BFLOAT16 is not None and dt == BFLOAT16:
        return "bfloat16"
    name = dt.name
    return name if name in _KIND else None


def dtype_kind(dtype):
    """Return "i", "u", "f", "c" or "b" for a supported dtype, else None."""
    name = _dtype_name(dtype)
    return None if name is None else _KIND[name]


def kernel_view(dtype, op):
    """Return the dtype an elementwise loop for (``dtype``, ``op``) runs on.

    Integers and bool: the unsigned view of the same width when the op is
    :attr:`~Op.signless`; complex: the real view when it is :attr:`~Op.componentwise`;
    otherwise ``dtype`` itself. float16 and bfloat16 are returned as they are: each backend
    chooses how it holds them (the CPU and CUDA kernels use their raw uint16 bits).
    """
    dtype = np.dtype(dtype)
    info = OP_TABLE[op]
    kind = dtype_kind(dtype)
    if kind in ("i", "u", "b") and info.signless:
        return _UINT[dtype.itemsize]
    if kind == "c" and info.componentwise:
        return _REAL[dtype]
    return dtype


def supported_dtypes():
    """Return the NumPy dtypes mlcomm has kernels for."""
    out = []
    for name in DTYPES:
        out.append(BFLOAT16 if name == "bfloat16" else np.dtype(name))
    return [d for d in out if d is not None]


def _problem(dtype, op):
    """Return (exception class, message) describing why (dtype, op) fails, or None."""
    try:
        info = op_info(op)
    except ValueError as exc:
        return ValueError, str(exc)
    try:
        shown = np.dtype(dtype)
    except TypeError:
        return TypeError, f"{dtype!r} is not a NumPy dtype"
    name = _dtype_name(shown)
    if name is None:
        why = "non-native byte order" if shown.fields is None and not shown.isnative \
            else "no mlcomm kernel for it"
        return TypeError, (f"{info.name} on dtype {shown}: {why}; mlcomm kernels cover "
                           f"{', '.join(DTYPES)} (callers fall back to MPI for others)")
    kind = _KIND[name]
    if kind in info.kinds:
        return None
    msg = f"{info.name} needs {info.needs}, got {name}"
    instead = info.hint(kind)
    if instead:
        msg += f"; {instead}"
    return TypeError, msg


def check_op(dtype, op):
    """Raise TypeError when ``op`` makes no sense for ``dtype`` (ValueError for an unknown op).

    The message names the op, the dtype and what to use instead.
    """
    key = (dtype, op) if isinstance(op, str) else None
    if key is not None:
        try:
            if _check_cache[key] is None:
                return None
        except (KeyError, TypeError):
            pass
    problem = _problem(dtype, op)
    if key is not None:
        try:
            _check_cache[key] = problem
        except TypeError:
            pass
    if problem is not None:
        cls, msg = problem
        raise cls(msg)
    return None


def is_supported(dtype, op):
    """Return True when mlcomm has a kernel for ``op`` on ``dtype`` (never raises)."""
    try:
        check_op(dtype, op)
    except (TypeError, ValueError):
        return False
    return True
