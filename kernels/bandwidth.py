"""Measure reduction-kernel bandwidth against a plain copy, in the same run.

Bytes moved: a reduction ``dst = dst op src`` reads two arrays and writes one (3 x nbytes), a
copy reads one and writes one (2 x nbytes). Two copies are timed: the backend's own with the
reduction's threads (NumPy: ``np.copyto``; Numba: the same parallel kernel with a copy in its
loop; CUDA/CuPy: a device copy) and, on the host, ``np.copyto`` (the C library's memcpy, which
may use non-temporal stores that skip reading the destination). The ratio is the reduction's
rate over the faster of the two. Reduction and copies alternate, so all see the same load.
"""

import contextlib
import time

import numpy as np

from .dispatch import select_backend
from .ops import BFLOAT16, check_op, normalize_op

__all__ = ["measure", "TARGET_RATIO"]

#: The kernel target: reductions reach at least this fraction of the copy's bandwidth on large
#: arrays.
TARGET_RATIO = 0.8


def _dtype(dtype):
    if isinstance(dtype, str) and dtype == "bfloat16":
        return BFLOAT16
    return np.dtype(dtype)


def _fill(n, dtype):
    rng = np.random.default_rng(0)
    if dtype.kind == "b":
        return rng.integers(0, 2, n).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(1, 3, n).astype(dtype)
    return (1.0 + rng.random(n) * 1e-3).astype(dtype)  # stays finite under repeated prod


def _time_alternating(runs, repeat, sync):
    """Return the best time of each of ``runs``, timed in turn ``repeat`` times."""
    best = [float("inf")] * len(runs)
    for _ in range(repeat):
        for k, fn in enumerate(runs):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def _cpu(host_dst, host_src, op, backend, threads):
    """Return (backend name, threads context, [reduce, copy, memcpy], sync, threads used)."""
    from . import dispatch
    name = backend or select_backend(host_dst, host_src, op)
    if name == "numba" and not dispatch._module("numba").supports(host_dst.dtype, op):
        name = "numpy"
    mod = dispatch._module(name)
    dst, src, copy_dst = host_dst, host_src, np.empty_like(host_dst)
    if name == "numba":
        context = mod.threads(threads or mod.num_threads())
        used = mod.threads_used
    else:
        context, used = contextlib.nullcontext(), (lambda: 1)
    runs = [lambda: mod.reduce_into(dst, src, op), lambda: mod.copy(copy_dst, src),
            lambda: np.copyto(copy_dst, src)]
    return name, context, runs, lambda: None, used


def _device(host_dst, host_src, op, backend, dt):
    """Return the same tuple as :func:`_cpu` for device arrays (CuPy or Numba CUDA), no memcpy."""
    from . import dispatch
    name = backend
    if name is None:
        name = "cupy" if dispatch.backends()["cupy"]["available"] else "cuda"
    mod = dispatch._module(name)
    view = np.uint16 if dt == BFLOAT16 else dt
    if name == "cupy":
        import cupy
        dst = cupy.asarray(host_dst.view(view))
        src = cupy.asarray(host_src.view(view))
        copy_dst = cupy.empty_like(dst)

        def sync():
            cupy.cuda.get_current_stream().synchronize()
    else:
        from numba import cuda
        dst = cuda.to_device(host_dst.view(view))
        src = cuda.to_device(host_src.view(view))
        copy_dst = cuda.device_array_like(dst)

        def sync():
            cuda.synchronize()
    runs = [lambda: mod.reduce_into(dst, src, op, dtype=dt),
            lambda: mod.copy(copy_dst, src, dtype=dt)]
    return name, contextlib.nullcontext(), runs, sync, lambda: None


def measure(nbytes, dtype="float32", op="sum", backend=None, repeat=10, device="cpu",
            warmup=2, threads=None):
    """Time ``reduce_into`` and a copy on ``nbytes``-byte arrays; return a dict of results.

    ``device`` is "cpu" (NumPy arrays; ``backend`` "numpy", "numba" or None for the automatic
    choice) or "cuda" (device arrays; ``backend`` "cuda" for Numba CUDA or "cupy", default cupy
    when importable). ``threads`` sets the Numba backend's thread count (default: its own).
    Times are the best of ``repeat`` alternating runs after ``warmup`` untimed runs (which
    also pay for JIT compilation). Returned keys: backend, device, threads (how many threads
    really ran the reduction; None on a GPU), dtype, op, nbytes, count, repeat, reduce_s,
    copy_s, memcpy_s, reduce_gbps, copy_gbps, memcpy_gbps (``np.copyto``; None on a GPU), ratio
    (reduce_gbps over the larger of copy_gbps and memcpy_gbps).
    """
    op = normalize_op(op)
    dt = _dtype(dtype)
    check_op(dt, op)
    count = max(1, int(nbytes) // dt.itemsize)
    host_dst, host_src = _fill(count, dt), _fill(count, dt)
    if device == "cpu":
        name, context, runs, sync, used = _cpu(host_dst, host_src, op, backend, threads)
    elif device in ("cuda", "gpu"):
        name, context, runs, sync, used = _device(host_dst, host_src, op, backend, dt)
    else:
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    with context:
        for _ in range(max(0, warmup)):
            for fn in runs:
                fn()
        best = _time_alternating(runs, repeat, sync)
        runs[0]()
        n_threads = used()  # the reduction's own threads, not the copy's
    nb = count * dt.itemsize
    reduce_gbps, copy_gbps = 3 * nb / best[0] / 1e9, 2 * nb / best[1] / 1e9
    memcpy_gbps = 2 * nb / best[2] / 1e9 if len(best) > 2 else None
    return {
        "backend": name, "device": device, "threads": n_threads, "dtype": str(dt), "op": op,
        "nbytes": nb, "count": count, "repeat": repeat, "reduce_s": best[0], "copy_s": best[1],
        "memcpy_s": best[2] if len(best) > 2 else None, "reduce_gbps": reduce_gbps, "copy_gbps": copy_gbps, "memcpy_gbps": memcpy_gbps,
        "ratio": reduce_gbps / max(copy_gbps, memcpy_gbps or 0.0),
    }


def _main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=64 << 20)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--op", default="sum")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    r = measure(args.bytes, args.dtype, args.op, args.backend, args.repeat, args.device,
                threads=args.threads)
    print(f"{r['backend']:>6} x{r['threads'] or '-'} {r['dtype']:>9} {r['op']:>4} {r['nbytes']:>11} B  "
          f"reduce {r['reduce_gbps']:7.2f} GB/s  copy {r['copy_gbps']:7.2f} GB/s  "
          f"memcpy {r['memcpy_gbps'] or 0:7.2f} GB/s  ratio {r['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
