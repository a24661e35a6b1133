"""PyTorch's own backend tests (``DistributedTest._DistTestBase`` in
``torch/testing/_internal/distributed/distributed_test.py``) of gather, scatter, all_to_all,
all_gather and the object collectives, on one backend, under mpiexec:

    mpiexec -n 2 python tests/torch_distributed_test.py [--backend mlcomm] [--unwrap] [NAME ...]

torch's harness spawns its own processes, which MPI did not make ranks of one job; here each
MPI rank is one rank of the test, its group made by ``init_process_group(backend)`` (gloo's
too, through mlcomm.torch's rendezvous), and ``_barrier`` is an MPI barrier. A test torch's
decorators skip for the backend (``BACKEND != "mpi"`` for the CPU all-to-alls, gloo alone for
the object tests, a world size of 4 or of at least 3) is reported as skipped; ``--unwrap``
then runs its undecorated body too (not a ``_group`` test's below 3 ranks: its group is ranks
[1, 2]). expecttest, which torch's test helpers import, must be importable. Rank 0 prints
one line per test, ``name: outcome`` (each rank's where they differ), and the counts."""

import argparse
import inspect
import os
import sys
import traceback
import unittest
from datetime import timedelta

from mpi4py import MPI

NAMES = [
    "test_gather_checks", "test_gather", "test_gather_group", "test_gather_full_group",
    "test_scatter_checks", "test_scatter", "test_scatter_complex", "test_scatter_group",
    "test_scatter_full_group", "test_all_gather", "test_all_gather_complex",
    "test_all_gather_group", "test_all_gather_full_group",
    "test_all_to_all_single_equal_split", "test_all_to_all_single_equal_split_complex",
    "test_all_to_all_single_unequal_split", "test_all_to_all_single_unequal_split_complex",
    "test_all_to_all", "test_all_to_all_complex", "test_all_to_all_single_equal_split_group",
    "test_all_to_all_single_unequal_split_group", "test_all_to_all_group",
    "test_all_to_all_single_equal_split_full_group",
    "test_all_to_all_single_unequal_split_full_group", "test_all_to_all_full_group",
    "test_all_gather_object_default_pg", "test_all_gather_object_subgroup",
    "test_gather_object", "test_gather_object_subgroup", "test_scatter_object_list",
]


def outcome(case, name, unwrap):
    """``pass``, ``skip (why)``, or ``FAIL (error)`` of test ``name`` on this rank; a
    skipped one with ``unwrap`` runs its undecorated body after it (``+ body: ...``)."""
    result = unittest.TestResult()
    case.run(result)
    if result.errors or result.failures:
        last = (result.errors + result.failures)[0][1].strip().splitlines()[-1]
        exited = last.startswith("SystemExit: ") and int(last.split()[-1]) in SKIPS
        return f"skip ({SKIPS[int(last.split()[-1])]})" if exited else f"FAIL ({last})"
    if not result.skipped:
        return "pass"
    said = f"skip ({result.skipped[0][1]})"
    if not unwrap or name.endswith("_group") and not name.endswith(("_full_group",
                                                                    "subgroup")) \
            and int(case.world_size) < 3:  # its group is ranks [1, 2]
        return said
    MPI.COMM_WORLD.Barrier()
    try:
        inspect.unwrap(getattr(type(case), name))(case)
    except unittest.SkipTest as exc:
        return f"{said} + body: skip ({exc})"
    except Exception as exc:
        traceback.print_exc()
        return f"{said} + body: FAIL ({type(exc).__name__}: {str(exc)[:200]})"
    return f"{said} + body: pass"


def kind(line):
    """What a test's line counts as: pass, FAIL, skip, or how a skipped one's body ran."""
    if "body: " in line:
        return "skipped, body " + line.rsplit("body: ", 1)[1].split(" ", 1)[0]
    return "mixed" if line.startswith("rank ") else line.split(" ", 1)[0]


#: the exit codes of torch's skips (TEST_SKIPS: a world too small...) and their messages
SKIPS = {}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="mlcomm")
    parser.add_argument("--unwrap", action="store_true")
    parser.add_argument("names", nargs="*", default=NAMES)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    os.environ.update(BACKEND=args.backend, WORLD_SIZE=str(world.Get_size()))
    import torch
    import torch.distributed as dist
    import mlcomm.torch  # noqa: F401  the backend, and the rendezvous from MPI
    from torch.testing._internal.common_distributed import TEST_SKIPS
    from torch.testing._internal.common_utils import TestCase
    from torch.testing._internal.distributed.distributed_test import DistributedTest

    class Case(DistributedTest._DistTestBase, TestCase):
        rank = world.Get_rank()
        world_size = os.environ["WORLD_SIZE"]  # a string, as torch's TestDistBackend has

        def _barrier(self, *args, **kwargs):
            world.Barrier()

    SKIPS.update({skip.exit_code: skip.message for skip in TEST_SKIPS.values()})
    torch.set_num_threads(1)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=120))
    counts = {}
    for name in args.names:
        world.Barrier()
        said = world.gather(outcome(Case(name), name, args.unwrap), root=0)
        if world.Get_rank() == 0:
            line = said[0] if len({kind(s) for s in said}) == 1 else " | ".join(
                f"rank {r}: {s}" for r, s in enumerate(said))
            counts[kind(line)] = counts.get(kind(line), 0) + 1
            print(f"{name}: {line}", flush=True)
    if world.Get_rank() == 0:
        print(f"{args.backend}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
