"""What every subcommand shares: its flags, their parsing, rank 0, output.

One meaning per flag across the subcommands:

``-a/--algorithms A,B`` (``-a/--algorithm NAME`` where one is drawn), ``-p/--ranks``,
``-s/--sizes S1,S2`` (``8,64K,16M``; ``-s/--size`` where one is drawn), ``-d/--dtype``,
``-o/--op`` (the reduction), ``-n/--iters``, ``-w/--warmup``, ``-r/--rounds``,
``--option KEY=VALUE`` (an algorithm's option, repeatable), ``--format table|csv|json``,
``--output FILE``, ``--plot FILE.png``, ``--profile FILE``, ``--progress/--no-progress``,
``--quick``.  The ``add_*`` helpers below define each flag once.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["parse_list", "is_root", "world", "show_progress", "write_text",
           "output_format", "positive_int", "non_negative_int", "size", "sizes", "rank_list", "algorithm",
           "algorithm_list", "kernel_dtype_list", "op_list", "options",
           "add_algorithms", "add_sizes", "add_dtype", "add_op", "add_option", "add_format",
           "add_output", "add_profile", "add_progress", "add_quick"]

#: Variables an MPI launcher sets in each rank's environment (MPICH Hydra, Open MPI, PMIx,
#: Slurm's srun): this process's rank, or the job's size.
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")


# --- ranks ----------------------------------------------------------------------------

def is_root() -> bool:
    """True on rank 0 of a launched job, or outside one, without starting MPI."""
    for var in _RANK_VARS:
        if os.environ.get(var) not in (None, "", "0"):
            return False
    return True


def world():
    """``MPI.COMM_WORLD`` when this process is one of several MPI ranks, else None.

    MPI is started only when it already is or a launcher's variables say this process is a
    rank of a job, so commands that need no MPI (``analyze`` on a laptop) never start it.
    """
    if "mpi4py.MPI" not in sys.modules and not any(
            v in os.environ for v in _RANK_VARS + _SIZE_VARS):
        return None
    from mpi4py import MPI
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return None
    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


def show_progress(args) -> bool:
    """Progress bars: as ``--progress/--no-progress`` say, else only when stderr is a terminal."""
    wanted = getattr(args, "progress", None)
    return sys.stderr.isatty() if wanted is None else wanted


# --- values ---------------------------------------------------------------------------

def parse_list(text, item=int) -> list:
    """Parse ``a,b,c`` or ``2,4,8,...,4096[,more]`` (geometric, or arithmetic when b-a is the step)."""
    parts = [t.strip() for t in str(text).split(",") if t.strip()]
    if "..." not in parts:
        return [item(t) for t in parts]
    i = parts.index("...")
    if i < 2 or i == len(parts) - 1:
        raise ValueError(f"{text!r}: write a,b,...,z with two values before '...'")
    head = [item(t) for t in parts[:i]]
    a, b, last = head[-2], head[-1], item(parts[i + 1])
    out = head[:]
    if a > 0 and b % a == 0 and b // a > 1:
        while out[-1] * (b // a) <= last:
            out.append(out[-1] * (b // a))
    elif b > a:
        while out[-1] + (b - a) <= last:
            out.append(out[-1] + (b - a))
    else:
        raise ValueError(f"{text!r}: the values before '...' must grow")
    if out[-1] != last:
        out.append(last)
    return out + parse_list(",".join(parts[i + 2:]), item) if parts[i + 2:] else out


def _argument(parse):
    """An argparse ``type`` from ``parse``: its ValueError becomes the error argparse prints."""
    def convert(text):
        try:
            return parse(text)
        except (ValueError, TypeError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__
    return convert


def _whole(text, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"not a whole number: {text!r}") from None
    if value < least:
        raise ValueError(f"must be {least} or more, got {value}")
    return value


def _positive(text) -> int:
    return _whole(text, 1)


def _non_negative(text) -> int:
    return _whole(text, 0)


def _size(text) -> int:
    from ..units import parse_size
    return parse_size(text)


def _sizes(text) -> list:
    out = parse_list(text, _size)
    if not out:
        raise ValueError(f"no sizes in {text!r} (write e.g. 8,64K,16M)")
    return out


def _rank_list(text) -> list:
    out = parse_list(text, _positive)
    if not out:
        raise ValueError(f"no rank counts in {text!r} (write e.g. 2,4,8 or 2,4,...,64)")
    return out


def _algorithm(text) -> str:
    from ..algorithms import resolve
    return resolve(text.strip())


def _algorithm_list(text):
    """Canonical names of ``A,B`` (aliases allowed); None for ``all``."""
    if text.strip() in ("", "all"):
        return None
    return list(dict.fromkeys(_algorithm(t) for t in text.split(",") if t.strip()))


def _kernel_dtype_list(text) -> list:
    """Names from ``mlcomm.kernels.DTYPES``; anything else is an error naming the valid ones."""
    from ..kernels import DTYPES
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in DTYPES]
    if bad or not names:
        raise ValueError(f"unknown dtype {', '.join(map(repr, bad)) or repr(text)}; "
                         f"choose from {', '.join(DTYPES)}")
    return list(dict.fromkeys(names))


def _op_list(text) -> list:
    """Canonical op names; an unknown one is an error naming the valid ones."""
    from ..kernels import normalize_op
    names = [normalize_op(t) for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError(f"no op in {text!r}")
    return list(dict.fromkeys(names))


def _option(text) -> tuple:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{text!r}: write KEY=VALUE, e.g. servers=2 or chunk_bytes=64K")
    value = value.strip()
    if value.lower() == "none":
        return key.strip(), None
    try:
        return key.strip(), int(value)
    except ValueError:
        pass
    try:
        return key.strip(), _size(value)
    except ValueError:
        return key.strip(), value


positive_int = _argument(_positive)
non_negative_int = _argument(_non_negative)
size = _argument(_size)
sizes = _argument(_sizes)
rank_list = _argument(_rank_list)
algorithm = _argument(_algorithm)
algorithm_list = _argument(_algorithm_list)
kernel_dtype_list = _argument(_kernel_dtype_list)
op_list = _argument(_op_list)
_option_arg = _argument(_option)


def options(args) -> dict:
    """The ``--option KEY=VALUE`` pairs of ``args`` as a dict."""
    return dict(getattr(args, "option", None) or ())


# --- flags ----------------------------------------------------------------------------

def add_algorithms(p, help="algorithms, comma-separated (default: all)", resolve=True) -> None:
    """``-a/--algorithms``: all-reduce's canonical names, or with ``resolve`` False the names
    as written (the command resolves them in its collective's registry)."""
    p.add_argument("-a", "--algorithms", type=algorithm_list if resolve else str,
                   default=None, metavar="all|A,B,...", help=help)


def add_sizes(p, help="message sizes in bytes, e.g. 8,64K,16M or 8,64,...,16M",
              required=False) -> None:
    p.add_argument("-s", "--sizes", type=sizes, default=None, required=required,
                   metavar="S1,S2,...", help=help)


def add_dtype(p, default, help, **kw) -> None:
    p.add_argument("-d", "--dtype", default=default, help=help, **kw)


def add_op(p, default, help="reduction op (default %(default)s)", **kw) -> None:
    p.add_argument("-o", "--op", default=default, help=help, **kw)


def add_option(p) -> None:
    p.add_argument("--option", type=_option_arg, action="append", metavar="KEY=VALUE",
                   help="an algorithm's option, e.g. servers=2 or chunk_bytes=64K (repeatable)")


def add_format(p, default="table", help="output format (default %(default)s)") -> None:
    p.add_argument("--format", choices=["table", "csv", "json"], default=default, help=help)


def add_output(p, help) -> None:
    p.add_argument("--output", metavar="FILE", default=None, help=help)


def add_profile(p, help="the profile to read (default $MLCOMM_PROFILE or "
                        "~/.cache/mlcomm/profile.json)") -> None:
    p.add_argument("--profile", metavar="FILE", default=None, help=help)


def add_progress(p) -> None:
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on stderr (default: only when stderr is a terminal)")


def add_quick(p, help) -> None:
    p.add_argument("--quick", action="store_true", help=help)


# --- output ---------------------------------------------------------------------------

def output_format(args) -> str:
    """``--format``, else the one ``--output``'s extension names, else ``table``."""
    if getattr(args, "format", None):
        return args.format
    ext = os.path.splitext(getattr(args, "output", None) or "")[1].lower()
    return {".csv": "csv", ".json": "json"}.get(ext, "table")


def write_text(path, text: str) -> None:
    """Write ``text`` to ``path``, making its directory."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
