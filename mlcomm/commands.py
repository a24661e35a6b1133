"""The ``info`` and ``verify`` commands."""

from __future__ import annotations

import platform

__all__ = ["register"]


def _info(args) -> int:
    import mpi4py
    import numpy
    from mpi4py import MPI

    from . import __version__, kernels
    from .algorithms import COLLECTIVES
    if MPI.COMM_WORLD.Get_rank():
        return 0
    print(f"mlcomm      {__version__}")
    print(f"python      {platform.python_version()}")
    print(f"numpy       {numpy.__version__}")
    print(f"mpi4py      {mpi4py.__version__}")
    print(f"MPI         {MPI.Get_library_version().splitlines()[0].strip()}")
    print(f"MPI std     {'.'.join(map(str, MPI.Get_version()))}, {MPI.COMM_WORLD.Get_size()} ranks")
    try:
        from .gpu import cuda_aware_decision
        from .staging import chunk_bytes
        print(f"CUDA-aware  {cuda_aware_decision()}")
        print(f"staging     {chunk_bytes()}-byte chunks when not CUDA-aware "
              f"(MLCOMM_STAGING_CHUNK_BYTES)")
    except ImportError:
        print("CUDA-aware  no GPU support built in")
    for name, state in kernels.backends().items():
        print(f"kernel      {name:6s} {state}")
    from .profile import load_profile
    profile = load_profile()
    tuned = ", ".join(sorted(profile.tuned, key=int)) or "none (mlcomm tune)"
    model = "calibrated" if profile.calibrated else "built-in defaults (mlcomm calibrate)"
    print(f"profile     {profile.source}; cost model: {model}; auto tuned for ranks: {tuned}")
    for collective, table in COLLECTIVES.items():
        print(f"{collective:11s} {', '.join(sorted(table))}")
    return 0


def _verify(args) -> int:
    from mpi4py import MPI

    from .verify import DTYPES, OPS, verify
    comm = MPI.COMM_WORLD
    rows = verify(comm, args.algorithms.split(",") if args.algorithms else None,
                  args.dtypes.split(",") if args.dtypes else DTYPES,
                  args.ops.split(",") if args.ops else OPS)
    failed = sum(r[3] for r in rows)
    if comm.Get_rank() == 0:
        print(f"mlcomm verify: {comm.Get_size()} ranks, every result compared with MPI_Allreduce "
              f"and across ranks bit for bit")
        print(f"{'algorithm':28s} {'dtype':10s} {'cases':>6s} {'failed':>6s} {'time(s)':>8s}  result")
        for name, dtype, cases, fails, secs, first in rows:
            verdict = "PASS" if not fails else f"FAIL ({first})"
            print(f"{name:28s} {dtype:10s} {cases:6d} {fails:6d} {secs:8.2f}  {verdict}")
        print(f"{'ALL PASSED' if not failed else f'{failed} FAILED'}: "
              f"{sum(r[2] for r in rows)} cases")
    return 1 if failed else 0


def register(sub) -> None:
    p = sub.add_parser("info", help="versions, MPI library, CUDA-awareness, kernels, algorithms")
    p.set_defaults(func=_info)
    p = sub.add_parser("verify", help="check every algorithm against MPI_Allreduce (run under mpiexec)")
    p.add_argument("--algorithms", help="comma-separated names (default: all)")
    p.add_argument("--dtypes", help="comma-separated dtypes (default: %(default)s)")
    p.add_argument("--ops", help="comma-separated ops (default: all)")
    p.set_defaults(func=_verify)
