"""Check every algorithm on this job against an exact reference, and the MPI library's own
``MPI_Allreduce`` against the same.

Every rank's input comes from :func:`sample`, deterministic in (dtype, op, count, rank,
seed), so a rank makes every rank's input itself, without a message. The references:

- Integers and bool: the exact answer (:func:`exact`), the inputs reduced in NumPy's
  integer arithmetic, which wraps around as C's does. Every result must equal it. The
  library's ``MPI_Allreduce`` is compared with it too; where they differ the library is
  wrong, which is reported on its own line and is not mlcomm's failure (``mpi``'s row then
  says ``LIB`` where it returned the library's wrong answer).
- Floats and complex: an algorithm with a schedule (and ``auto``, the algorithm it ran) must
  give bit for bit what the local executor (:mod:`mlcomm.ir.local`) gives running the same
  schedule, with the call's options and the session's node layout, on every rank's input:
  the schedule fixes the reduction order. Each result must also lie within rounding of
  ``MPI_Allreduce`` (:func:`close`), which catches a schedule that is wrong in itself;
  ``mpi`` has only that check.

Each (dtype, op, count)'s references are made on one rank, the ranks taking turns
(:func:`_executor_rank`): every rank's output of an all-reduce is the same, so that rank
compares its own result with them, and every other rank's result must have its bits. That
rank samples every rank's input (at P = 8 the integers' samples for one default ``mlcomm
verify`` take 3.4 s of CPU: on every rank they would add that to each). The local
executor runs as the call ran, in place or not, at every size verify uses, up to 65537
elements, with no bound: its runs for one default ``mlcomm verify`` take 1.6 s of CPU at
P = 3 and 6.4 s at P = 8 in all (single process, loaded machine, 2026-11-27), against
minutes for the job's MPI calls.

Every result is also checked for the input's dtype and shape, an unchanged input, and the
same bits on every rank. For each (dtype, op, count), every algorithm's two calls (out of
place, in place) run on every rank, then one gather of every rank's verdicts and digests,
whatever happened locally, in a wait that leaves the CPU (a rank still at work may share
its core: the wait, as the reference's, sleeps between polls where ranks outnumber the
cores three to one, see ``MLCOMM_SLEEP_AFTER_US``), so the ranks always enter the same
collectives: a wrong result on one rank is a failure on all of them, never a hang.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from mpi4py import MPI

from ..algorithms import ALGORITHMS, AUTO, MPI_NATIVE, build_schedules, resolve
from ..api import IN_PLACE, allreduce
from ..kernels import BFLOAT16, DTYPES, OP_TABLE, OPS, is_supported, normalize_op, supported_dtypes
from ..kernels.numpy_backend import bare_kernel, bare_kernel3, finalize
from ..ir.local import run_local
from ..session.auto import agreed_choice, auto_ran, plan_call
from ..session import session_of

__all__ = ["DTYPES", "OPS", "PASSED", "FAILED", "LIBRARY_WRONG", "Row", "Report", "sample",
           "reference", "exact", "library_error", "close", "scheduled", "verify"]

#: Exit statuses of ``mlcomm verify``: every check passed; an mlcomm failure (whatever the
#: library did), or nothing checked; mlcomm passed but the MPI library's MPI_Allreduce is wrong.
PASSED, FAILED, LIBRARY_WRONG = 0, 1, 3

_BY_NAME = {d.name: d for d in supported_dtypes()}
_NARROW_FLOATS = (np.dtype(np.float16), BFLOAT16)


@dataclass
class Row:
    """One algorithm x dtype of the matrix, the same on every rank."""

    algorithm: str
    dtype: str
    cases: int = 0
    failures: int = 0
    seconds: float = 0.0
    first_failure: str = ""
    skipped: str = ""          # why there is no case, when there is none
    note: str = ""             # ops left out of a row that has cases, and why
    library: int = 0           # cases that ran the MPI library and got its wrong answer
    first_library: str = ""

    @property
    def status(self) -> str:
        return "FAIL" if self.failures else "SKIP" if not self.cases else \
            "LIB" if self.library else "PASS"

    @property
    def verdict(self) -> str:
        if self.failures:
            return f"FAIL ({self.first_failure})"
        if not self.cases:
            return f"SKIP ({self.skipped})"
        if self.library:
            return f"LIB ({self.first_library})"
        return f"PASS ({self.note})" if self.note else "PASS"


@dataclass
class Report:
    """What :func:`verify` found, the same on every rank: a :class:`Row` per algorithm x
    dtype, and a line for each reduction where the MPI library's ``MPI_Allreduce`` differs
    from the exact answer, of the ``exact_reductions`` compared."""

    rows: list
    library: list = field(default_factory=list)
    exact_reductions: int = 0

    @property
    def status(self) -> int:
        """:data:`FAILED`, :data:`LIBRARY_WRONG` or :data:`PASSED` (the exit status)."""
        if any(r.failures for r in self.rows) or not any(r.cases for r in self.rows):
            return FAILED
        return LIBRARY_WRONG if self.library else PASSED


def sample(dtype, op, count, rank, seed=0):
    """Test data for ``op``: small integers, floats near 1 for prod, mixed signs otherwise."""
    rng = np.random.default_rng([seed, rank, count])
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    if dtype.kind in "iu":
        hi = 3 if op == "prod" else 50
        lo = 0 if dtype.kind == "u" or op in ("band", "bor", "bxor") else -hi
        return rng.integers(lo, hi, count).astype(dtype)
    if op == "prod":
        x = rng.uniform(0.9, 1.1, count)
    else:
        x = rng.standard_normal(count)
    if dtype.kind == "c":
        x = x + 1j * (rng.uniform(0.9, 1.1, count) if op == "prod" else rng.standard_normal(count))
    return x.astype(dtype)


def reference(comm, x, op):
    """``MPI_Allreduce`` of ``x``; types MPI cannot reduce go through float64/complex128.
    Its non-blocking form, in a watched wait of ``comm``'s session that sleeps while ranks
    are still at work (MPICH spins in the blocking call)."""
    wide = x.astype(np.float64) if x.dtype in _NARROW_FLOATS else x
    out = np.empty_like(wide)
    mpi_op = getattr(MPI, OP_TABLE[op].mpi)
    if x.dtype == np.bool_:  # MPI defines only the logical ops on C bool
        mpi_op = {"band": MPI.LAND, "bor": MPI.LOR, "bxor": MPI.LXOR}.get(op, mpi_op)
    session_of(comm).watch.wait(lambda: comm.Iallreduce(wide, out, mpi_op),
                                "mlcomm verify's reference", sleep=True)
    if op == "avg":
        out = out / comm.Get_size()
    return out


def exact(inputs, op):
    """The all-reduce of integer or bool ``inputs`` (one array per rank) as C computes it:
    NumPy's integer ufuncs on arrays of one dtype wrap around on overflow, in any order;
    land and lor give 1 or 0 (but one rank's input is its own result). avg takes no
    integers."""
    ufunc, out = OP_TABLE[op].ufunc, inputs[0].copy()
    for x in inputs[1:]:
        out = ufunc(out, x).astype(out.dtype, copy=False)
    return out


def close(got, want, p, op):
    """Exact for integers, min/max and logic; a rounding-error bound for sums and products."""
    if got.dtype.kind in "iub" or op in ("min", "max"):
        return np.array_equal(got.astype(want.dtype), want)
    if got.dtype == BFLOAT16:
        eps = 2.0 ** -7
    else:
        eps = float(np.finfo(got.dtype).eps)
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1.0)
    return bool(np.all(np.abs(got.astype(want.dtype) - want) <= 4 * p * eps * scale))


def _first_difference(got, want):
    """The first element whose bits differ between the two arrays, or None."""
    a = np.ascontiguousarray(got).view(np.uint8).reshape(got.size, got.itemsize)
    b = np.ascontiguousarray(want).view(np.uint8).reshape(want.size, want.itemsize)
    differ = np.flatnonzero((a != b).any(axis=1))
    return int(differ[0]) if differ.size else None


def library_error(got, want, op, p) -> str:
    """The line saying the MPI library's ``MPI_Allreduce`` gave ``got`` where the exact
    answer is ``want``, or '' when they are equal."""
    i = _first_difference(got, want)
    if i is None:
        return ""
    return (f"the MPI library's MPI_Allreduce is wrong here: {want.dtype.name} {op} "
            f"{want.size} elements at P = {p}: got {got[i]} where C gives {want[i]} "
            f"(first differing element {i})")


def _problem(got, x, x_before, in_place) -> str:
    """What is wrong with this result's type, dtype or shape, or with the input, or ''."""
    if not isinstance(got, np.ndarray):
        return f"returned {type(got).__name__}, not an ndarray"
    if got.dtype != x.dtype:
        return f"result dtype {got.dtype}, input {x.dtype}"
    if got.shape != x.shape:
        return f"result shape {got.shape}, input {x.shape}"
    if not in_place and x.tobytes() != x_before.tobytes():
        return "the input buffer changed"
    return ""


def _value_problem(got, want, p, op, library, right=None, local=None) -> tuple:
    """``(problem, library's)``: what is wrong with the values of this rank's result ``got``,
    or ''; and whether ``got`` is the MPI library's own wrong answer, which is no problem
    where the call ran the library (``library``: ``mpi``, or ``auto`` that chose it).

    ``want`` is ``MPI_Allreduce``'s result. The rank that makes the references has ``right``,
    the exact answer (integers and bool), or ``local``, the local executor's output or why
    there is none (floats of a hand-written schedule); the other ranks' results are compared
    with that rank's across ranks.
    """
    if got.dtype.kind in "iub":
        if right is None:
            return "", False
        i = _first_difference(got, right)
        if i is None:
            return "", False
        if library and _first_difference(want, right) is not None and \
                _first_difference(got, want) is None:
            return "", True
        return f"differs from the exact answer (element {i}: {got[i]} where C gives " \
               f"{right[i]})", False
    if not close(got, want, p, op):
        return "differs from MPI_Allreduce beyond rounding", False
    if isinstance(local, str):
        return local, False
    if local is not None:
        i = _first_difference(got, local)
        if i is not None:
            return f"differs from its schedule run by the local executor (element {i}: " \
                   f"{got[i]} where the schedule gives {local[i]})", False
    return "", False


def _mpi_lacks(dtype, op) -> str:
    """Why the MPI library cannot reduce ``dtype`` with ``op`` itself, or ''."""
    if dtype in _NARROW_FLOATS:
        return f"MPI has no {dtype.name} reduction"
    if dtype.kind == "b" and op in ("band", "bor", "bxor"):
        return "MPI has no bitwise op on bool"
    return ""


def _plan_row(name, dtype, ops) -> tuple:
    """``(ops to run, why some or all are left out)`` for ``name`` x ``dtype``."""
    ops = [op for op in ops if is_supported(dtype, op)]
    if not ops:
        return [], "no op given applies to " + dtype.name
    lacks = {op: _mpi_lacks(dtype, op) for op in ops} if name == MPI_NATIVE else {}
    left_out = [op for op in ops if lacks.get(op)]
    run = [op for op in ops if op not in left_out]
    if not left_out:
        return run, ""
    reasons = dict.fromkeys(lacks[op] for op in left_out)
    return run, "; ".join(reasons) if not run else \
        f"{','.join(left_out)} left out: {'; '.join(reasons)}"


def _check_names(algorithms, dtypes, ops, counts=None):
    algorithms = [resolve(a) for a in algorithms] if algorithms else \
        [a for a in ALGORITHMS if a != MPI_NATIVE] + [MPI_NATIVE]
    dtypes = list(dtypes) if dtypes else list(DTYPES)
    bad = [d for d in dtypes if d not in _BY_NAME]
    if bad:
        raise ValueError(f"unknown dtype {', '.join(map(repr, bad))}; "
                         f"choose from {', '.join(DTYPES)}")
    ops = [normalize_op(op) for op in ops] if ops else list(OPS)
    if counts is not None and not all(isinstance(c, (int, np.integer)) and c >= 0
                                      for c in counts):
        raise ValueError(f"counts={list(counts)!r}: give whole numbers of elements, 0 or more")
    return algorithms, dtypes, ops


def _ran(session, name, count, dtype, op) -> tuple:
    """``(algorithm, options)`` the call of ``name`` just made ran: ``auto``'s choice, the
    session's node layout and the options it chose, all kept by the session when the call
    decided them, so nothing here sends a message."""
    options = {}
    if name == AUTO:
        name, options = agreed_choice(session, "allreduce", count, dtype, op)
    plan = plan_call(session, "allreduce", name, count, dtype, op, options)
    return name, plan.key[6]  # the plan key's options: sorted (name, value) pairs


@lru_cache(maxsize=64)
def _schedules(name, options, p, count, itemsize):
    return build_schedules(name, p, count, itemsize, **dict(options))


def _same(a, b) -> bool:
    return a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and \
        a.shape == b.shape


def scheduled(name, options, inputs, op, rank, in_place=False):
    """Rank ``rank``'s output of ``name``'s schedules (with ``options``, sorted pairs) run by
    the local executor on every rank's ``inputs``, in place or not; or a string saying why
    there is none.

    Each reduction makes the calls the Python loop makes for it (``HostMemory.reduce`` in
    :mod:`mlcomm.runtime.loop`: ``d = a (op) s`` into ``a``, into ``s``, or a copy of ``a``
    then into it) with the NumPy kernels. Those give the compiled loop's and the Numba kernels' bits for
    every op but complex prod, which NumPy alone runs and whose last bits depend on which
    operand the output is (its multiply fuses some of its products on some paths).
    """
    p, x = len(inputs), inputs[0]
    kernel, kernel3 = bare_kernel(op), bare_kernel3(op)

    def reduce(first, src, out):
        if _same(out, first):
            kernel(out, src)
        elif _same(out, src):
            kernel3(out, first, src)
        else:
            np.copyto(out, first)
            kernel(out, src)
    try:
        schedules = _schedules(name, options, p, x.size, x.itemsize)
        with np.errstate(all="ignore"):
            outputs, unwritten = run_local(schedules, inputs, reduce, in_place)
    except Exception as exc:  # noqa: BLE001 - one rank runs it: any error becomes its verdict
        return f"the local executor failed on its schedule: {type(exc).__name__}: {exc}"
    if unwritten[rank]:
        return f"its schedule leaves {unwritten[rank]} output elements unwritten"
    finalize(outputs[rank], op, p)
    return outputs[rank]


def _executor_rank(group: int, count_index: int, p: int) -> int:
    """The rank that runs the local executor for the ``group``-th (dtype, op) at its
    ``count_index``-th count: the sum goes round the ranks, so each count's (the largest
    too) spread over them."""
    return (group + count_index) % p


def verify(comm=None, algorithms=None, dtypes=None, ops=None, counts=None, seed=0):
    """Run the matrix on ``comm``; return a :class:`Report`, the same on every rank.

    ``algorithms`` (default: all, ``mpi`` last), ``dtypes`` (names, default: every one in
    :data:`DTYPES`), ``ops`` (default: every one in :data:`OPS`) and ``counts`` (elements,
    default 0, 1, P - 1, P + 1, 1000 and 65537) are checked first: an unknown name is a
    ValueError naming the valid ones. Each case passes only when, on every rank, the result
    has the input's dtype and shape, the input is unchanged, the result is bit-identical
    across ranks and matches the references of the module docstring. A row with no case
    (``mpi`` on float16, or no op that applies to the dtype) is skipped and says why; so
    does a row that leaves some ops out (``mpi`` has no bitwise op on bool).
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    algorithms, dtypes, ops = _check_names(algorithms, dtypes, ops, counts)
    p, rank = comm.Get_size(), comm.Get_rank()
    counts = counts or sorted({0, 1, max(p - 1, 1), p + 1, 1000, 65537})
    session = session_of(comm)
    rows, plans, library, exact_reductions, group = {}, {}, [], 0, -1
    for name in algorithms:
        for dname in dtypes:
            row_ops, why = _plan_row(name, _BY_NAME[dname], ops)
            rows[name, dname] = Row(name, dname, skipped=why if not row_ops else "",
                                    note=why if row_ops else "")
            plans[name, dname] = row_ops
    for dname in dtypes:
        dtype = _BY_NAME[dname]
        groups = []  # (number over the whole matrix, op, algorithms) of this dtype
        for op in ops:
            names = [n for n in algorithms if op in plans[n, dname]]
            if names:
                group += 1
                groups.append((group, op, names))
        # each count's ops in turn: their plans share a schedule and program
        for j, count in enumerate(counts):
            for number, op, names in groups:
                by = _executor_rank(number, j, p)
                inputs = [sample(dtype, op, count, r, seed) if by == rank or r == rank else None
                          for r in range(p)]
                x = inputs[rank]
                ref = {"want": reference(comm, x, op), "by": by}
                if dtype.kind in "iub":
                    exact_reductions += 1
                if rank == by and dtype.kind in "iub":
                    ref["exact"] = exact(inputs, op)
                    line = library_error(ref["want"], ref["exact"], op, p)
                    if line:
                        library.append((exact_reductions, line))
                _settle(comm, session, [case for name in names for case in _run_case(
                    rows[name, dname], comm, session, ref, x, op, inputs)], by)
    lines = sorted({item for lines in comm.allgather(library) for item in lines})
    return Report(list(rows.values()), [line for _, line in lines], exact_reductions)


@dataclass
class _Case:
    """One call of a case on this rank: its row, where it ran, and this rank's verdict (a
    problem's text, or "" when none), its result's digest and whether it was the MPI
    library's wrong answer."""

    row: Row
    where: str
    problem: str
    digest: int
    library: bool


def _run_case(row, comm, session, ref, x, op, inputs) -> list:
    """Run one algorithm on ``x``, out of place and in place; return this rank's two
    :class:`_Case` verdicts (:func:`_settle` gathers every rank's)."""
    name, p, rank = row.algorithm, session.size, session.rank
    start, cases = time.perf_counter(), []
    for in_place in (False, True):
        x_before = x.copy()
        if in_place:
            got = x.copy()
            allreduce(IN_PLACE, got, op, comm=comm, algorithm=name)
        else:
            got = allreduce(x, None, op, comm=comm, algorithm=name)
        ran, options = _ran(session, name, x.size, x.dtype, op)  # every rank: no message
        local = None
        if rank == ref["by"] and x.dtype.kind not in "iub" and ALGORITHMS[ran].hand_written:
            local = scheduled(ran, options, inputs, op, rank, in_place)
        problem = _problem(got, x, x_before, in_place)
        is_library = False
        if not problem:
            problem, is_library = _value_problem(got, ref["want"], p, op,
                                                 ALGORITHMS[ran].library, ref.get("exact"),
                                                 local)
        digest = -1 if problem else zlib.crc32(np.ascontiguousarray(got).view(np.uint8))
        where = f"op={op} count={x.size} {'in-place' if in_place else 'out-of-place'}" + (
            f" (ran {auto_ran(session, 'allreduce', x.size, x.dtype, op)})" if name == AUTO
            else "")
        cases.append(_Case(row, where, problem or "", digest, is_library))
    row.seconds += time.perf_counter() - start
    return cases


def _settle(comm, session, cases, by):
    """Gather every rank's verdicts on ``cases`` (the same cases on every rank, in one
    order) and count them in their rows: one gather of numbers in a watched wait, which
    leaves the CPU to ranks still at work, and the problems' texts only when some rank met
    one. ``by``: the rank whose result matched the references itself."""
    p = session.size
    mine = np.array([[bool(c.problem), c.digest, c.library] for c in cases], np.int64)
    every = np.empty((p, *mine.shape), np.int64)
    session.watch.wait(lambda: comm.Iallgather(mine, every), "mlcomm verify's verdicts",
                       sleep=True)
    texts = comm.allgather([c.problem for c in cases]) if every[:, :, 0].any() else None
    for k, case in enumerate(cases):
        row, flags = case.row, every[:, k]
        row.cases += 1
        wrong = [(r, texts[r][k]) for r in range(p) if flags[r, 0]]
        if not wrong:
            wrong = [(r, f"differs from rank {by}'s result, which matches the reference")
                     for r in range(p) if flags[r, 1] != flags[by, 1]]
        if wrong:
            row.failures += 1
            row.first_failure = row.first_failure or f"{case.where}: " + ", ".join(
                f"rank {r}: {text}" for r, text in wrong[:3])
        elif flags[:, 2].any():
            row.library += 1
            row.first_library = row.first_library or \
                f"{case.where}: the MPI library's own answer, which is wrong (below)"
