"""``mlcomm calibrate``: measure alpha, beta and gamma, and write the profile."""

from __future__ import annotations

from ...cli.args import add_dtype, add_op, add_profile, add_quick, add_sizes, op_list, size
from .model import _command
from .text import _seconds


def _calibrate(args) -> int:
    from mpi4py import MPI

    from ..calibrate import GAMMA_DTYPES, GAMMA_OPS, calibrate
    comm = MPI.COMM_WORLD
    prof = calibrate(comm, sizes=args.sizes, quick=args.quick, gamma_bytes=args.gamma_bytes,
                     dtypes=args.dtype.split(",") if args.dtype else GAMMA_DTYPES,
                     ops=args.op or GAMMA_OPS, path=args.profile, write=not args.dry_run)
    if prof is None:
        return 0
    print(f"ping-pong rank 0 <-> 1 ({comm.Get_size()} ranks, {prof.meta['mpi']})")
    print(f"{'bytes':>10s} {'one-way':>12s} {'fit':>12s}")
    for n, t in prof.meta["pingpong"]:
        print(f"{n:10d} {_seconds(t):>12s} {_seconds(prof.alpha + n * prof.beta):>12s}")
    bw = 1 / prof.beta / 1e9 if prof.beta else float("inf")
    print(f"alpha = {prof.alpha:.3g} s   beta = {prof.beta:.3g} s/B ({bw:.2f} GB/s)")
    print(f"loop overhead: {prof.step_overhead * 1e6:.2f} us per step, "
          f"{prof.op_overhead * 1e6:.2f} us per local op")
    print(f"gamma = {prof.gamma:.3g} s/B (default: float64 sum)")
    for backend, table in prof.gammas.items():
        for dtype, ops in table.items():
            cells = "  ".join(f"{op}={v:.3g}" for op, v in ops.items())
            print(f"  gamma[{backend}][{dtype}]: {cells}")
    print("profile not written (--dry-run)" if args.dry_run else f"profile written to {prof.source}")
    return 0


def register(subparsers) -> None:
    """Add ``calibrate``."""
    p = _command(
        subparsers, "calibrate", _calibrate, check=False,
        help="measure alpha, beta, gamma and write the profile (mpiexec -n 2+)",
        description="Ping-pong between ranks 0 and 1 over sizes, least-squares fit of alpha and "
                    "beta; time the reduction kernels for gamma per backend, dtype and op. "
                    "Rank 0 writes the profile to --profile, $MLCOMM_PROFILE or "
                    "~/.cache/mlcomm/profile.json.",
        epilog="example:\n  mpiexec -n 2 mlcomm calibrate --quick")
    add_quick(p, "fewer sizes and iterations (seconds)")
    add_sizes(p, help="ping-pong sizes, e.g. 8,64,...,16M")
    p.add_argument("--gamma-bytes", type=size, default=None,
                   help="array size for the kernel timings (default 4M, 1M with --quick)")
    add_dtype(p, None, "dtypes for gamma, comma-separated (default: a common set)",
              metavar="D1,D2,...")
    add_op(p, None, "ops for gamma, comma-separated (default sum,prod,min,max)", type=op_list,
           metavar="OP1,OP2,...")
    add_profile(p, "the profile to write (default $MLCOMM_PROFILE or "
                   "~/.cache/mlcomm/profile.json)")
    p.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
