"""Measure reduction-kernel bandwidth against a plain copy, in the same run.

Bytes moved: a reduction ``dst = dst op src`` reads two arrays and writes one (3 x nbytes), a
copy reads one and writes one (2 x nbytes). The copy uses the same backend and threads as the
reduction (NumPy: ``np.copyto``; Numba: the same parallel kernel with a copy in its loop;
CUDA/CuPy: a device copy), so the ratio says how close the reduction gets to what the memory
system gives that backend. Reduction and copy alternate, so both see the same load.
"""

import contextlib
import time

import numpy as np

from .dispatch import select_backend
from .ops import BFLOAT16, check_op, normalize_op

__all__ = ["measure", "TARGET_RATIO"]

#: Issue 5: reductions reach at least this fraction of the copy's bandwidth on large arrays.
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


def _time_pair(run_a, run_b, repeat, sync):
    """Return the best times of ``run_a`` and ``run_b``, timed in turn ``repeat`` times."""
    best = [float("inf"), float("inf")]
    for _ in range(repeat):
        for k, fn in enumerate((run_a, run_b)):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def _cpu(host_dst, host_src, op, backend, threads):
    """Return (backend name, threads context, reduce, copy, sync, threads used) on the host."""
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
    return (name, context, lambda: mod.reduce_into(dst, src, op),
            lambda: mod.copy(copy_dst, src), lambda: None, used)


def _device(host_dst, host_src, op, backend, dt):
    """Return the same tuple as :func:`_cpu` for device arrays (CuPy or Numba CUDA)."""
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
    return (name, contextlib.nullcontext(), lambda: mod.reduce_into(dst, src, op, dtype=dt),
            lambda: mod.copy(copy_dst, src, dtype=dt), sync, lambda: None)


def measure(nbytes, dtype="float32", op="sum", backend=None, repeat=10, device="cpu",
            warmup=2, threads=None):
    """Time ``reduce_into`` and a copy on ``nbytes``-byte arrays; return a dict of results.

    ``device`` is "cpu" (NumPy arrays; ``backend`` "numpy", "numba" or None for the automatic
    choice) or "cuda" (device arrays; ``backend`` "cuda" for Numba CUDA or "cupy", default cupy
    when importable). ``threads`` sets the Numba backend's thread count (default: its own).
    Times are the best of ``repeat`` alternating runs after ``warmup`` untimed runs (which
    also pay for JIT compilation). Returned keys: backend, device, threads (how many threads
    really ran the reduction; None on a GPU), dtype, op, nbytes, count, repeat, reduce_s,
    copy_s, reduce_gbps, copy_gbps, ratio (reduce_gbps / copy_gbps).
    """
    op = normalize_op(op)
    dt = _dtype(dtype)
    check_op(dt, op)
    count = max(1, int(nbytes) // dt.itemsize)
    host_dst, host_src = _fill(count, dt), _fill(count, dt)
    if device == "cpu":
        name, context, run_reduce, run_copy, sync, used = _cpu(host_dst, host_src, op,
                                                               backend, threads)
    elif device in ("cuda", "gpu"):
        name, context, run_reduce, run_copy, sync, used = _device(host_dst, host_src, op,
                                                                  backend, dt)
    else:
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    with context:
        for _ in range(max(0, warmup)):
            run_reduce()
            run_copy()
        reduce_s, copy_s = _time_pair(run_reduce, run_copy, repeat, sync)
        run_reduce()
        n_threads = used()  # the reduction's own threads, not the copy's
    nb = count * dt.itemsize
    reduce_gbps = 3 * nb / reduce_s / 1e9
    copy_gbps = 2 * nb / copy_s / 1e9
    return {
        "backend": name, "device": device, "threads": n_threads, "dtype": str(dt), "op": op,
        "nbytes": nb, "count": count, "repeat": repeat, "reduce_s": reduce_s, "copy_s": copy_s,
        "reduce_gbps": reduce_gbps, "copy_gbps": copy_gbps, "ratio": reduce_gbps / copy_gbps,
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
    print(f"{r['backend']:>6} x{r['threads']} {r['dtype']:>9} {r['op']:>4} {r['nbytes']:>11} B  "
          f"reduce {r['reduce_gbps']:7.2f} GB/s  copy {r['copy_gbps']:7.2f} GB/s  "
          f"ratio {r['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
