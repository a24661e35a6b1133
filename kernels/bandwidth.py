"""Measure reduction-kernel bandwidth against a plain copy, in the same run.

Bytes moved: a reduction ``dst = dst op src`` reads two arrays and writes one (3 x nbytes), a
copy reads one and writes one (2 x nbytes). The copy uses the same backend and threads as the
reduction (NumPy: ``np.copyto``; Numba: a parallel copy loop; CUDA/CuPy: a device copy), so the
ratio says how close the reduction gets to what the memory system gives that backend.
"""

import time

import numpy as np

from .dispatch import select_backend
from .ops import BFLOAT16, check_op, normalize_op

__all__ = ["measure"]


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


def _time_best(fn, repeat, sync):
    best = float("inf")
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(nbytes, dtype="float32", op="sum", backend=None, repeat=10, device="cpu",
            warmup=2):
    """Time ``reduce_into`` and a copy on ``nbytes``-byte arrays; return a dict of results.

    ``device`` is "cpu" (NumPy arrays; ``backend`` "numpy", "numba" or None for the automatic
    choice) or "cuda" (device arrays; ``backend`` "cuda" for Numba CUDA or "cupy", default cupy
    when importable). Times are the best of ``repeat`` runs after ``warmup`` untimed runs (which
    also pay for JIT compilation). Returned keys: backend, dtype, op, nbytes, count, repeat,
    reduce_s, copy_s, reduce_gbps, copy_gbps, ratio (reduce_gbps / copy_gbps).
    """
    from . import dispatch

    op = normalize_op(op)
    dt = _dtype(dtype)
    check_op(dt, op)
    count = max(1, int(nbytes) // dt.itemsize)
    host_dst = _fill(count, dt)
    host_src = _fill(count, dt)

    if device == "cpu":
        name = backend or select_backend(host_dst, host_src)
        dst, src = host_dst, host_src
        if name == "numba":
            mod = dispatch._module("numba")
            if not mod.supports(dt):
                name = "numpy"
        mod = dispatch._module(name)
        copy_dst = np.empty_like(dst)

        def sync():
            pass

        def run_reduce():
            mod.reduce_into(dst, src, op)

        def run_copy():
            mod.copy(copy_dst, src)
    elif device in ("cuda", "gpu"):
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

        def run_reduce():
            mod.reduce_into(dst, src, op, dtype=dt)

        def run_copy():
            mod.copy(copy_dst, src, dtype=dt)
    else:
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")

    for _ in range(max(0, warmup)):
        run_reduce()
        run_copy()
    reduce_s = _time_best(run_reduce, repeat, sync)
    copy_s = _time_best(run_copy, repeat, sync)
    nb = count * dt.itemsize
    reduce_gbps = 3 * nb / reduce_s / 1e9
    copy_gbps = 2 * nb / copy_s / 1e9
    return {
        "backend": name, "device": device, "dtype": str(dt), "op": op, "nbytes": nb,
        "count": count, "repeat": repeat, "reduce_s": reduce_s, "copy_s": copy_s,
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
    args = parser.parse_args(argv)
    r = measure(args.bytes, args.dtype, args.op, args.backend, args.repeat, args.device)
    print(f"{r['backend']:>6} {r['dtype']:>9} {r['op']:>4} {r['nbytes']:>11} B  "
          f"reduce {r['reduce_gbps']:7.2f} GB/s  copy {r['copy_gbps']:7.2f} GB/s  "
          f"ratio {r['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
