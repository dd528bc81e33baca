#!/usr/bin/env bash
# The main job: installs what gcomp needs, builds it, and compares codecs on a short
# multi-rank allreduce (4 ranks, real Open MPI over shared memory): time, wire bytes,
# compression ratio and error against the exact sum, next to plain MPI_Allreduce.
# Then one codec_perf table of the codecs alone on a 64 MiB gradient.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh build
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

echo
echo "== allreduce_perf: 4 ranks, 16 MiB gradient, each codec vs MPI_Allreduce =="
timeout 600 mpirun -np 4 ./build/bench/allreduce_perf -b 16M -e 16M -n 10 -w 3 \
  --codec none --codec fp16 --codec terngrad --codec topk:ratio=0.01

echo
echo "== codec_perf: the codecs alone on a 64 MiB gradient (one thread) =="
./build/bench/codec_perf -s 64M
