#!/usr/bin/env bash
# The main job: installs what gcomp needs, builds it, and runs a short data-parallel training
# sweep on Fashion-MNIST (4 real Open MPI ranks, 1 epoch of the MLP) comparing codecs: test
# accuracy against bytes on the wire per step, as a table and a plot. Then a 4-rank
# allreduce_perf comparison against plain MPI_Allreduce on a 16 MiB gradient.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh build
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

out=${GCOMP_QUICKSTART_OUT:-out/quickstart}
echo
echo "== training sweep: Fashion-MNIST MLP, 4 ranks, 1 epoch, one point per codec =="
/usr/bin/python3 bench/sweep --ranks 4 --epochs 1 \
  --codec none --codec fp16 --codec terngrad --codec topk:ratio=0.01 --out "$out"
echo
cat "$out/results.md"
echo
echo "plot: $out/accuracy_vs_bytes.png (and .svg)"

echo
echo "== allreduce_perf: 4 ranks, 16 MiB gradient, each codec vs MPI_Allreduce in the same run =="
timeout 600 mpirun -np 4 ./build/bench/allreduce_perf -b 16M -e 16M -n 10 -w 3 \
  --codec none --codec fp16 --codec terngrad --codec topk:ratio=0.01
