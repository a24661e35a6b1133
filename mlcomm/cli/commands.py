"""The ``info`` and ``verify`` commands."""

from __future__ import annotations

import argparse
import platform

from .args import add_algorithms, kernel_dtype_list, op_list

__all__ = ["register"]


# --- info -----------------------------------------------------------------------------

def _info(args) -> int:
    from importlib.metadata import version

    import mpi4py
    import numpy
    from mpi4py import MPI

    from ..algorithms import COLLECTIVES
    from ..buffers.gpu import cuda_aware_decision
    from ..kernels import backends
    from ..transport.libmpi import describe
    from ..model.machine import load_profile
    from ..session import describe_held, session_of
    from ..buffers.staging import chunk_bytes
    session = session_of(MPI.COMM_WORLD)  # collective: the node layout is agreed
    if MPI.COMM_WORLD.Get_rank():
        return 0
    print(f"mlcomm      {version('mlcomm')}")
    print(f"python      {platform.python_version()}")
    print(f"numpy       {numpy.__version__}")
    print(f"mpi4py      {mpi4py.__version__}")
    print(f"MPI         {MPI.Get_library_version().splitlines()[0].strip()}")
    print(f"MPI std     {'.'.join(map(str, MPI.Get_version()))}, {MPI.COMM_WORLD.Get_size()} ranks")
    print(f"libmpi      {describe()}")
    sizes = sorted({len(n) for n in session.nodes})
    print(f"nodes       {len(session.nodes)} of {'/'.join(map(str, sizes))} ranks "
          f"(MLCOMM_RANKS_PER_NODE), window {session.slot_bytes} bytes per rank "
          f"(MLCOMM_SHM_BYTES)")
    print(f"cache       {describe_held()}")
    print(f"CUDA-aware  {cuda_aware_decision()}")
    print(f"staging     {chunk_bytes()}-byte chunks when not CUDA-aware "
          f"(MLCOMM_STAGING_CHUNK_BYTES)")
    for name, state in backends().items():
        print(f"kernel      {name:6s} {state}")
    profile = load_profile()
    tuned = ", ".join(sorted(profile.tuned, key=int)) or "none (mlcomm tune)"
    model = "calibrated" if profile.calibrated else "built-in defaults (mlcomm calibrate)"
    print(f"profile     {profile.source}; cost model: {model}; auto tuned for ranks: {tuned}")
    for collective, table in COLLECTIVES.items():
        print(f"{collective:11s} {', '.join(sorted(table))}")
    _variables()
    return 0


def _variables() -> None:
    """Every MLCOMM_* variable (:data:`mlcomm.config.VARIABLES`): its value here, else its
    default in brackets, and what it sets."""
    from .. import config
    rows = [(v.name, value if value is not None else f"[{v.default}]", v.what)
            for v, value in config.current()]
    width = max(len(shown) for _, shown, _ in rows)
    print("variables   the value set, else [the default]")
    for name, shown, what in rows:
        print(f"  {name:26s} {shown:{width}s}  {what}")


# --- verify ---------------------------------------------------------------------------

def _verify(args) -> int:
    from mpi4py import MPI

    from ..benchmark.verify import FAILED, LIBRARY_WRONG, verify
    comm = MPI.COMM_WORLD
    report = verify(comm, args.algorithms, args.dtype, args.op)
    rows = report.rows
    failed = sum(r.failures for r in rows)
    cases = sum(r.cases for r in rows)
    skipped = sum(r.status == "SKIP" for r in rows)
    if comm.Get_rank() == 0:
        print(f"mlcomm verify: {comm.Get_size()} ranks; integers and bool against the exact "
              f"answer, floats bit for bit")
        print("against their schedule run locally and within rounding of MPI_Allreduce; "
              "across ranks bit for bit,")
        print("in dtype and shape, and with the input unchanged")
        print(f"{'algorithm':28s} {'dtype':10s} {'cases':>6s} {'failed':>6s} {'time(s)':>8s}  "
              f"result")
        for r in rows:
            print(f"{r.algorithm:28s} {r.dtype:10s} {r.cases:6d} {r.failures:6d} "
                  f"{r.seconds:8.2f}  {r.verdict}")
        for line in report.library:
            print(line)
        skips = f", {skipped} rows skipped" if skipped else ""
        library = (f"the MPI library's MPI_Allreduce is wrong in {len(report.library)} of "
                   f"{report.exact_reductions} reductions with an exact answer (above)")
        if report.status == FAILED and cases:
            print(f"FAILED: {failed} of {cases} cases{skips}"
                  + (f"; and {library}" if report.library else ""))
        elif report.status == FAILED:
            print(f"NOTHING CHECKED: 0 cases{skips}")
        elif report.status == LIBRARY_WRONG:
            print(f"MPI LIBRARY WRONG: mlcomm passed all {cases} cases{skips}; {library}, "
                  f"which is not mlcomm's failure")
        else:
            print(f"ALL PASSED: {cases} cases{skips}")
    return report.status


def register(sub) -> None:
    p = sub.add_parser("info", help="versions, MPI library, CUDA-awareness, kernels, "
                                    "algorithms, MLCOMM_* variables")
    p.set_defaults(func=_info)
    p = sub.add_parser(
        "verify", help="check every algorithm against an exact reference (run under mpiexec)",
        description="Run every algorithm x dtype x op x size, in and out of place. Integer\n"
                    "and bool results must equal the exact answer (C's wrap-around\n"
                    "arithmetic); float results must equal bit for bit the algorithm's\n"
                    "schedule run locally on every rank's input, and lie within rounding of\n"
                    "MPI_Allreduce's. Every result must be the same on every rank, in dtype\n"
                    "and shape, with the input unchanged. A wrong result on any rank is a\n"
                    "FAIL on every rank. MPI_Allreduce is checked against the exact answer\n"
                    "too: where it is wrong a line says so, and that is not mlcomm's failure.\n"
                    "Exit status 0 when all passed; 1 on an mlcomm failure (whatever the MPI\n"
                    "library did) or when nothing was checked; 3 when only the MPI library's\n"
                    "MPI_Allreduce was wrong.",
        epilog="example:\n  mpiexec -n 4 mlcomm verify -a ring,auto -d float32,bfloat16 "
               "-o sum,max", formatter_class=argparse.RawDescriptionHelpFormatter)
    add_algorithms(p, "algorithms, comma-separated (default: every one, mpi last)")
    p.add_argument("-d", "--dtype", type=kernel_dtype_list, default=None, metavar="D1,D2,...",
                   help="dtypes, comma-separated (default: every dtype the kernels support)")
    p.add_argument("-o", "--op", type=op_list, default=None, metavar="OP1,OP2,...",
                   help="reduction ops, comma-separated (default: all)")
    p.set_defaults(func=_verify)
