"""Where the benchmark's buffers live: host (NumPy) or CUDA (CuPy)."""

import numpy as np


class _Host:
    """Host (NumPy) buffers."""

    name = "cpu"

    def empty(self, n, dtype):
        return np.empty(n, dtype)

    def to_host(self, a):
        return a

    def upload(self, dst, host):
        dst[...] = host

    def sync(self):
        pass


class _Cuda:
    """CuPy device buffers; rank r uses GPU (local rank mod visible GPUs)."""

    name = "cuda"

    def __init__(self, comm):
        try:
            import cupy
            ngpu = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # ImportError, CUDARuntimeError, ...
            raise SystemExit(f"mlcomm bench --device cuda needs CuPy and a CUDA GPU "
                             f"(pip install 'mlcomm[cupy]'): {exc}") from None
        if ngpu < 1:
            raise SystemExit("mlcomm bench --device cuda: no CUDA device is visible")
        from mpi4py import MPI
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        cupy.cuda.Device(local.Get_rank() % ngpu).use()
        local.Free()
        self.cp = cupy
        from ..buffers.gpu import cuda_aware
        self.aware = cuda_aware()  # the baseline stages exactly when mlcomm does

    def empty(self, n, dtype):
        return self.cp.empty(n, dtype)

    def to_host(self, a):
        return self.cp.asnumpy(a)

    def upload(self, dst, host):
        dst.set(np.ascontiguousarray(host))

    def sync(self):
        self.cp.cuda.get_current_stream().synchronize()
