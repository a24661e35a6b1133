#!/bin/bash
# mlcomm bench on Intel MPI's Hydra launcher: PPN ranks per node, each pinned to a core.
#
#   NP=16 PPN=16 bash jobs/impi_hydra.sh [mlcomm bench options]
#   DRY_RUN=1 NP=32 PPN=16 HOSTFILE=hosts.txt bash jobs/impi_hydra.sh --quick   # print only
#
# MLCOMM_VENV: a venv with mlcomm whose mpi4py loads Intel MPI (pip install "mlcomm[impi]",
# or the site's Intel MPI module and mpi4py built against it). HOSTFILE (optional): one host
# per line. I_MPI_PIN_DOMAIN (default core) pins each rank to a core; with more ranks than
# cores, OVERSUBSCRIBE=1 turns pinning off and makes waiting ranks yield the CPU
# (I_MPI_THREAD_YIELD=3, sched_yield).
set -euo pipefail
run() { if [ "${DRY_RUN:-0}" != 0 ]; then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi; }

if [ -n "${MLCOMM_VENV:-}" ]; then source "${MLCOMM_VENV}/bin/activate"; fi
NP="${NP:-4}"
PPN="${PPN:-${NP}}"
OUT="${MLCOMM_OUT:-mlcomm-bench-impi}"
where=()
if [ -n "${HOSTFILE:-}" ]; then where=(-f "${HOSTFILE}"); fi
pin=(-genv I_MPI_PIN 1 -genv I_MPI_PIN_DOMAIN "${I_MPI_PIN_DOMAIN:-core}")
if [ "${OVERSUBSCRIBE:-0}" != 0 ]; then
    pin=(-genv I_MPI_PIN 0 -genv I_MPI_THREAD_YIELD 3)
fi

run mpiexec.hydra "${where[@]}" -n "${NP}" -ppn "${PPN}" "${pin[@]}" \
    mlcomm bench --check --output "${OUT}.json" --plot "${OUT}.png" "$@"
