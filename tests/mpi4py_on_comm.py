"""mpi4py's own buffer- and vector-collective tests (``test_cco_buf.py``, ``test_cco_vec.py``)
on ``mlcomm.Comm`` with the default algorithm (``auto``), as a user's mpi4py code would call
it.

mpi4py's tests are not part of this repository; take them from the mpi4py release that is
installed (its ``test/`` folder)::

    git clone --depth 1 --branch 4.1.2 https://github.com/mpi4py/mpi4py /tmp/mpi4py
    mpiexec -n 3 python tests/mpi4py_on_comm.py /tmp/mpi4py/test

Each rank runs the tests on ``mlcomm.Comm(MPI.COMM_WORLD)``, in place, and on its
``Dup()``; the job exits 0 when every test passed on every rank. Array types that need a
GPU are left out where there is none.
"""

import sys
import unittest

from mpi4py import MPI

import mlcomm
from mlcomm.cli import abort_on_error


def main(argv) -> int:
    if len(argv) != 1:
        sys.exit("usage: mpiexec -n P python tests/mpi4py_on_comm.py MPI4PY_TEST_DIR")
    sys.path.insert(0, argv[0])
    import arrayimpl
    import test_cco_buf
    import test_cco_vec

    try:
        from numba import cuda
        gpus = cuda.is_available()
    except ImportError:
        gpus = False
    if not gpus:
        arrayimpl.ArrayBackends[:] = [a for a in arrayimpl.ArrayBackends
                                      if not any(k in a.__name__.lower()
                                                 for k in ("gpu", "cuda", "cupy", "numba"))]

    class World(test_cco_buf.BaseTestCCOBuf, unittest.TestCase):
        COMM = mlcomm.Comm(MPI.COMM_WORLD)

    class WorldInPlace(test_cco_buf.BaseTestCCOBufInplace, unittest.TestCase):
        COMM = mlcomm.Comm(MPI.COMM_WORLD)

    class WorldDup(test_cco_buf.BaseTestCCOBuf, unittest.TestCase):
        def setUp(self):
            self.COMM = mlcomm.Comm(MPI.COMM_WORLD).Dup()

        def tearDown(self):
            self.COMM.Free()

    class Vectors(test_cco_vec.BaseTestCCOVec, unittest.TestCase):
        COMM = mlcomm.Comm(MPI.COMM_WORLD)

    class VectorsInPlace(test_cco_vec.BaseTestCCOVecInplace, unittest.TestCase):
        COMM = mlcomm.Comm(MPI.COMM_WORLD)

    suite = unittest.TestSuite()
    for case in (World, WorldInPlace, WorldDup, Vectors, VectorsInPlace):
        suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(case))
    rank = MPI.COMM_WORLD.rank
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=1 if rank == 0 else 0).run(
        suite)
    ok = MPI.COMM_WORLD.allreduce(int(result.wasSuccessful()), MPI.MIN)
    if rank == 0:
        print(f"mpi4py's test_cco_buf and test_cco_vec on mlcomm.Comm, P = {MPI.COMM_WORLD.size}: "
              f"{result.testsRun} tests a rank, {'all passed' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(abort_on_error(main, sys.argv[1:]))
