#!/usr/bin/env bash
# Installs the Debian packages gcomp needs to build, test and benchmark (as root, or via
# sudo). Skips apt entirely when everything is already there, so it is cheap to re-run.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libzstd-dev libcmocka-dev
  libopenmpi-dev openmpi-bin
  iproute2 valgrind
  zlib1g-dev libopenblas-dev dataset-fashion-mnist gnuplot-nox
  clang libclang-rt-14-dev
  python3-mpi4py python3-numpy python3-torch gfortran
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
