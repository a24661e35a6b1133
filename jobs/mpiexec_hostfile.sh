#!/bin/bash
# mlcomm bench with a plain mpiexec and a hostfile (no batch system).
#
#   HOSTFILE=hosts.txt NP=8 bash jobs/mpiexec_hostfile.sh [mlcomm bench options]
#   DRY_RUN=1 HOSTFILE=hosts.txt NP=8 bash jobs/mpiexec_hostfile.sh --quick   # print only
#
# hosts.txt: one host per line; MPICH (Hydra) writes "node01:4", Open MPI "node01 slots=4".
# Every host needs the same Python environment (MLCOMM_VENV) at the same path.
set -euo pipefail
run() { if [ "${DRY_RUN:-0}" != 0 ]; then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi; }

if [ -n "${MLCOMM_VENV:-}" ]; then source "${MLCOMM_VENV}/bin/activate"; fi
HOSTFILE="${HOSTFILE:-hosts.txt}"
NP="${NP:-4}"
OUT="${MLCOMM_OUT:-mlcomm-bench-hostfile}"

run mpiexec --hostfile "${HOSTFILE}" -n "${NP}" \
    mlcomm bench --output "${OUT}.json" --plot "${OUT}.png" "$@"
