#!/bin/sh
# Build the libFuzzer targets and run each for a bounded time: `ctest -L fuzz`.
#
#   tests/fuzz/run.sh [extra ctest arguments]
#
# Environment: CC (default clang; needs libFuzzer: Debian's clang + libclang-rt-14-dev),
# GCOMP_FUZZ_BUILD_DIR (default build-fuzz), GCOMP_FUZZ_SECONDS (per target, default 60),
# GCOMP_FUZZ_JOBS (targets run at once, default the number of CPUs).
# Exits non-zero if a target crashes, leaks, times out or breaks a property; the input that
# did it is in $GCOMP_FUZZ_BUILD_DIR/tests/fuzz/artifacts/<target>/. See docs/FUZZING.md.
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${GCOMP_FUZZ_BUILD_DIR:-$root/build-fuzz}
seconds=${GCOMP_FUZZ_SECONDS:-60}
jobs=${GCOMP_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}

# MPI, CUDA and NCCL play no part in the targets: leave them out of the instrumented build.
CC=${CC:-clang} cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug \
  -DGCOMP_FUZZ=ON -DGCOMP_SANITIZE=ON -DGCOMP_BUILD_BENCH=OFF \
  -DGCOMP_WITH_MPI=OFF -DGCOMP_WITH_CUDA=OFF -DGCOMP_WITH_NCCL=OFF \
  -DGCOMP_FUZZ_SECONDS="$seconds"
# Only the fuzz targets: the rest of tests/ is not needed here.
cmake --build "$build" --target gcomp_fuzz -j "$jobs"
cd "$build"
exec ctest -L fuzz --output-on-failure -j "$jobs" "$@"
