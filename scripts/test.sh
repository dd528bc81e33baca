#!/usr/bin/env bash
# The test suite, exactly as CI runs it (.ci/run calls this): installs what it needs,
# builds, runs every test (unit + multi-rank under mpirun), then the same tests again in an
# AddressSanitizer + UndefinedBehaviorSanitizer build, valgrind memcheck runs, the
# libFuzzer targets for a bounded time, and the threaded tests in a ThreadSanitizer build.
# Set GCOMP_TEST_SKIP_ASAN=1 to skip both sanitizer passes; GCOMP_FUZZ_SECONDS (default 60)
# bounds each fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh

# mpirun refuses root without these; more ranks than cores need oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

echo "== build (Release) =="
bash scripts/build.sh build
echo "== tests (Release) =="
ctest --test-dir build --output-on-failure -j2 -LE valgrind
echo "== valgrind memcheck (codec tests, 2-rank engine run) =="
ctest --test-dir build --output-on-failure -j2 -L valgrind

echo "== fuzzing (libFuzzer, ${GCOMP_FUZZ_SECONDS:-60} s per target) =="
bash tests/fuzz/run.sh

if [ "${GCOMP_TEST_SKIP_ASAN:-0}" != 1 ]; then
  echo "== build (ASan + UBSan) =="
  # CUDA code cannot run on CI: the Release build above compiles and links it
  bash scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DGCOMP_SANITIZE=ON -DGCOMP_BUILD_BENCH=OFF -DGCOMP_WITH_CUDA=OFF
  echo "== tests (ASan + UBSan) =="
  # Open MPI keeps allocations alive until exit by design; leak checking of the library
  # itself is done by the unit tests, which run without MPI.
  ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j2 -LE "mpi|valgrind"
  ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-asan --output-on-failure -j1 -L mpi

  echo "== build (ThreadSanitizer) =="
  bash scripts/build.sh build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGCOMP_SANITIZE_THREAD=ON -DGCOMP_BUILD_BENCH=OFF \
    -DGCOMP_WITH_CUDA=OFF -DGCOMP_WITH_MPI=OFF
  echo "== tests (ThreadSanitizer: ranks as threads on the loopback transport, progress threads) =="
  # Without MPI: Open MPI is not instrumented, so a rank's receive completed by another
  # thread's MPI progress looks like a race to TSan (its synchronisation is invisible).
  # gcc 12's TSan runtime cannot map its shadow memory with more than 28 bits of mmap
  # randomisation (some newer kernels' default): there, run the tests without ASLR.
  tsan_run=()
  if [ "$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)" -gt 28 ]; then
    tsan_run=(setarch "$(uname -m)" -R)
  fi
  TSAN_OPTIONS=halt_on_error=1 "${tsan_run[@]}" ctest --test-dir build-tsan --output-on-failure -j2 \
    -R '^(loop|nonblocking|staging|transport_fault|device|log|user_codec)$'
fi
