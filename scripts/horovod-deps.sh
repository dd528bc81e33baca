#!/usr/bin/env bash
# horovod-deps.sh — install Horovod 0.28.1 (MPI backend, PyTorch) for Debian 12's
# /usr/bin/python3, against Debian's torch 1.13 (python3-torch) and Open MPI 4.1, for
# examples/horovod_fashion_mnist.py and examples/horovod_netem.sh. Manual runs and docs only:
# CI does not need Horovod. Needs root (apt-get, pip into the system interpreter) and PyPI.
#
#   sudo scripts/horovod-deps.sh
#
# What it took on this machine (docs/INTERPOSE.md, "Horovod"):
#   - libtorch-dev: python3-torch ships its C++ headers as symlinks into /usr/include, which
#     only libtorch-dev fills (without it: no torch/extension.h);
#   - pybind11-dev: torch's headers include pybind11/pybind11.h;
#   - Horovod's Python dependencies from Debian (cffi, cloudpickle, packaging, psutil, yaml)
#     and pip --no-deps, so that pip does not put newer copies of them in /usr/local over
#     Debian's;
#   - the build compiles about 60 C++ files (MAKEFLAGS=-j1 under nice: a few minutes on a
#     free core, much longer on a loaded 2-core machine). Gloo, TensorFlow and MXNet are left
#     out; CPU collectives go through MPI (HOROVOD_CPU_OPERATIONS=MPI), which is what
#     gcomp's MPI_Allreduce interposer intercepts.
# Check: /usr/bin/python3 -c 'import horovod.torch as hvd; print(hvd.mpi_built())' prints True.
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "horovod-deps.sh: needs root (apt-get, pip into /usr/bin/python3)" >&2; exit 2; }
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends \
    python3-torch libtorch-dev pybind11-dev python3-dev python3-pip python3-setuptools python3-wheel \
    python3-cffi python3-cloudpickle python3-packaging python3-psutil python3-yaml \
    libopenmpi-dev openmpi-bin cmake g++ make
HOROVOD_WITH_MPI=1 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITHOUT_GLOO=1 HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS=${MAKEFLAGS:--j1} \
    nice -n 19 /usr/bin/python3 -m pip install --no-cache-dir --break-system-packages --no-deps \
    horovod==0.28.1
/usr/bin/python3 -c 'import horovod, horovod.torch as hvd
assert hvd.mpi_built(), "Horovod was built without MPI"
print("horovod", horovod.__version__, "with MPI: ok")'
