"""Reduction ops, the dtypes mlcomm has kernels for, and which pairs make sense."""

import numpy as np

try:
    import ml_dtypes as _ml_dtypes
    BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a hard dependency
    BFLOAT16 = None

__all__ = ["OPS", "DTYPES", "BFLOAT16", "normalize_op", "dtype_kind", "check_op",
           "is_supported", "supported_dtypes"]

#: Every reduction op, by canonical name.
OPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor", "land", "lor")

#: Every dtype mlcomm has a kernel for, by name (bfloat16 is ml_dtypes.bfloat16).
DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128", "bool")

_ALIASES = {
    "add": "sum", "+": "sum", "mul": "prod", "product": "prod", "*": "prod",
    "minimum": "min", "maximum": "max", "mean": "avg", "average": "avg",
    "bitwise_and": "band", "bitwise_or": "bor", "bitwise_xor": "bxor",
    "logical_and": "land", "logical_or": "lor",
}

# dtype name -> kind: "i" signed int, "u" unsigned int, "f" floating, "c" complex, "b" bool
_KIND = {
    "int8": "i", "int16": "i", "int32": "i", "int64": "i",
    "uint8": "u", "uint16": "u", "uint32": "u", "uint64": "u",
    "float16": "f", "bfloat16": "f", "float32": "f", "float64": "f",
    "complex64": "c", "complex128": "c", "bool": "b",
}

# op -> dtype kinds it accepts
_ACCEPTS = {
    "sum": "iufc", "prod": "iufc", "avg": "fc",
    "min": "iuf", "max": "iuf",
    "band": "iub", "bor": "iub", "bxor": "iub",
    "land": "iub", "lor": "iub",
}

_INSTEAD = {
    ("sum", "b"): "use lor (or bor) for a logical OR over ranks, or convert to an integer dtype "
                  "to count",
    ("prod", "b"): "use land (or band) for a logical AND over ranks",
    ("avg", "i"): "use sum and divide, or convert to a floating dtype first",
    ("avg", "u"): "use sum and divide, or convert to a floating dtype first",
    ("avg", "b"): "use sum on an integer copy, or convert to a floating dtype first",
    ("min", "c"): "complex numbers are not ordered; reduce abs() or the real part instead",
    ("max", "c"): "complex numbers are not ordered; reduce abs() or the real part instead",
    ("min", "b"): "use land (the minimum of booleans)",
    ("max", "b"): "use lor (the maximum of booleans)",
}
_NEEDS = {
    "sum": "a numeric (integer, floating or complex) dtype",
    "prod": "a numeric (integer, floating or complex) dtype",
    "avg": "a floating or complex dtype",
    "min": "an integer or floating dtype",
    "max": "an integer or floating dtype",
}
for _op in ("band", "bor", "bxor"):
    _NEEDS[_op] = "an integer or bool dtype"
    for _k in "fc":
        _INSTEAD[(_op, _k)] = ("view the data as an unsigned integer of the same width "
                               "(e.g. arr.view(np.uint32)) to combine raw bits")
for _op in ("land", "lor"):
    _NEEDS[_op] = "an integer or bool dtype (MPI logical ops give 1/0)"
    for _k in "fc":
        _INSTEAD[(_op, _k)] = "reduce (arr != 0) as a bool array instead"

_check_cache = {}


def normalize_op(op):
    """Return the canonical name of ``op`` (a name from :data:`OPS` or an alias)."""
    if isinstance(op, str):
        name = op.strip().lower()
        if name.startswith("mpi_"):
            name = name[4:]
        name = _ALIASES.get(name, name)
        if name in _ACCEPTS:
            return name
    raise ValueError(f"unknown reduction op {op!r}; choose one of {', '.join(OPS)}")


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


def supported_dtypes():
    """Return the NumPy dtypes mlcomm has kernels for."""
    out = []
    for name in DTYPES:
        out.append(BFLOAT16 if name == "bfloat16" else np.dtype(name))
    return [d for d in out if d is not None]


def _problem(dtype, op):
    """Return (exception class, message) describing why (dtype, op) fails, or None."""
    try:
        op = normalize_op(op)
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
        return TypeError, (f"{op} on dtype {shown}: {why}; mlcomm kernels cover "
                           f"{', '.join(DTYPES)} (callers fall back to MPI for others)")
    kind = _KIND[name]
    if kind in _ACCEPTS[op]:
        return None
    instead = _INSTEAD.get((op, kind), "")
    msg = f"{op} needs {_NEEDS[op]}, got {name}"
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
