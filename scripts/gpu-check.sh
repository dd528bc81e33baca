#!/usr/bin/env bash
# gpu-check.sh — the one command to run on a GPU machine (CUDA 13 nvcc, cmake; torch optional).
#
# Builds gcomp with CUDA into build-gpu (with MPI when .gpu-deps/openmpi is there, see below),
# prints the GPU and toolkit, runs the cuda tests (ctest -L cuda), the cuda;mpi tests under
# mpirun with 2, 3 and 4 ranks sharing the GPU, the NCCL step, each cuda test again under
# compute-sanitizer memcheck, the device codec table (codec_perf --device cuda), the PyTorch
# peers (bench/torch_peers.py), and ends with a pass/fail line per step. A failing step is
# reported and the next one still runs.
# Exit status: 0 when every step passed, 1 otherwise.
#
# Usage: scripts/gpu-check.sh [STEP ...]
#   STEP: env deps build test mpi nccl sanitize perf torch cpu (default: all but cpu, in that order;
#   build is incremental, so `scripts/gpu-check.sh perf torch` re-runs the benches only).
# Environment:
#   OUT=DIR                 the whole output (gpu-check.log), codec_perf_cuda.json,
#                           torch_peers.json and summary.txt go there: four files. Each
#                           step's own log is BUILD/logs/NN-step.log in any case.
#   GPU_CHECK_BUILD=DIR     build directory (default build-gpu)
#   GPU_CHECK_ALL_ARCHS=1   build for sm_80 as well as sm_90 (default: sm_90 only, faster)
#   GPU_CHECK_PERF_ARGS=..  extra codec_perf arguments (e.g. "-s 256M" for one size)
#   GPU_CHECK_PYTHON=PATH   the python with torch (default: the first of python3,
#                           /usr/bin/python3 that imports torch with CUDA)
#   GPU_CHECK_TEST_EXCLUDE=RE  the test step leaves out the cuda tests matching RE (ctest -E)
#   GPU_CHECK_JOBS=N        cuda tests run N at a time, in both test steps (default 4: their
#                           CPU references dominate and the GPU has room for several)
#   GPU_CHECK_MPI=auto|off  auto (default): MPI on with .gpu-deps/openmpi when it is there
#                           (through scripts/gpu-mpi-env.sh), else with the machine's own
#                           mpicc if any, else off; off: MPI off, the mpi step skips
#   GPU_CHECK_TIMEOUT_{TEST,SANITIZE,PERF,TORCH,MPI,NCCL}=S  each step's limit in seconds
#                           (300 300 180 120 180 240): a step that runs past it fails (status
#                           124) and the next one runs
#   GPU_CHECK_BUDGET=S      the whole run's limit in seconds (default 560): every limit above
#                           is cut to what is left of it, and a step that finds less than 15 s
#                           left is not run (a failure in the summary), so the summary comes
#                           within the ~10 minutes one command may take there. Split the run
#                           if needed: "env deps build test mpi nccl", then "sanitize perf
#                           torch" (the build directory must survive between).
# The tests read GCOMP_TEST_QUICK=1 (set here for the sanitizer run only): they then skip their
# sizes above 4 Mi elements, which memcheck would make slow.
#
# Libraries: the build needs libzstd and the tests cmocka. When pkg-config does not find them,
# the script uses .gpu-deps/ (Debian packages unpacked by scripts/gpu-deps.sh on a machine with
# apt; carry the folder with the tree), exposing only the missing ones. Open MPI likewise: a
# GPU machine without one uses the relocatable copy gpu-deps.sh puts in .gpu-deps/openmpi.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
BUILD=${GPU_CHECK_BUILD:-build-gpu}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
LOGS=$BUILD/logs      # one log per step
RESULTS=${OUT:-$LOGS} # the JSON files and the summary
mkdir -p "$LOGS" "$RESULTS" || { echo "gpu-check: cannot create $LOGS or $RESULTS" >&2; exit 1; }
# everything printed from here on also goes to OUT/gpu-check.log, as it is printed
TEE_PID=
if [ -n "${OUT:-}" ]; then exec > >(tee "$OUT/gpu-check.log") 2>&1; TEE_PID=$!; fi
ARCHS=90
[ "${GPU_CHECK_ALL_ARCHS:-0}" = 1 ] && ARCHS="90;80"
JOBS=${GPU_CHECK_JOBS:-4}
T_TEST=${GPU_CHECK_TIMEOUT_TEST:-300}
T_SANITIZE=${GPU_CHECK_TIMEOUT_SANITIZE:-300}
T_PERF=${GPU_CHECK_TIMEOUT_PERF:-180}
T_TORCH=${GPU_CHECK_TIMEOUT_TORCH:-120}
T_MPI=${GPU_CHECK_TIMEOUT_MPI:-180}
T_NCCL=${GPU_CHECK_TIMEOUT_NCCL:-240}
BUDGET=${GPU_CHECK_BUDGET:-560}
for v in "$T_TEST" "$T_SANITIZE" "$T_PERF" "$T_TORCH" "$T_MPI" "$T_NCCL" "$BUDGET"; do
  # whole seconds: the limits are compared and subtracted in bash, and timeout 0 means none
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check: time limits are whole seconds > 0, got '$v'" >&2; exit 2; }
done
MPI_CMAKE_ARGS=(-DGCOMP_WITH_MPI=OFF) # set by the deps step when an Open MPI is found
ALL_STEPS=(env deps build test mpi nccl sanitize perf torch)
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=("${ALL_STEPS[@]}")
T_START=$SECONDS

# limit S: S seconds, or what is left of the whole run's budget if that is less (at least 1)
limit() {
  local left=$((T_START + BUDGET - SECONDS))
  [ "$left" -lt 1 ] && left=1
  echo $(($1 < left ? $1 : left))
}

declare -a SUMMARY=()
STEP_NO=0

# step NAME CMD...: runs CMD with its output on the terminal and in the step's log; records
# PASS/FAIL (CMD's status) or SKIP (status 77) and the seconds it took.
step() {
  local name=$1; shift
  STEP_NO=$((STEP_NO + 1))
  local log; log=$(printf '%s/%02d-%s.log' "$LOGS" "$STEP_NO" "$name")
  local t0=$SECONDS rc
  echo
  if [ $((T_START + BUDGET - SECONDS)) -lt 15 ]; then
    SUMMARY+=("$(printf '%-9s %-22s %4s   %s' "$name" "FAIL (not run)" "-" \
      "under 15 s left of GPU_CHECK_BUDGET=$BUDGET s")")
    echo "==== [$STEP_NO] $name: not run, under 15 s left of GPU_CHECK_BUDGET=$BUDGET s ===="
    return 1
  fi
  echo "==== [$STEP_NO] $name ($(date -u +%H:%M:%S) UTC) ===="
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  local verdict=PASS
  [ "$rc" -eq 77 ] && verdict=SKIP
  [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && verdict="FAIL (status $rc)"
  SUMMARY+=("$(printf '%-9s %-22s %4ds  %s' "$name" "$verdict" $((SECONDS - t0)) "${log#"$ROOT"/}")")
  echo "==== [$STEP_NO] $name: $verdict in $((SECONDS - t0)) s ===="
  return "$rc"
}

skip_step() {
  SUMMARY+=("$(printf '%-9s %-22s %4s   %s' "$1" "SKIP" "-" "$2")")
  echo; echo "==== $1: skipped: $2 ===="
}

# ---- steps ---------------------------------------------------------------------------------

do_env() {
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  if git -C "$ROOT" rev-parse HEAD >/dev/null 2>&1; then
    echo "commit: $(git -C "$ROOT" rev-parse HEAD) ($(git -C "$ROOT" status --porcelain | wc -l) changed files)"
  else
    echo "commit: unknown (no .git here; say which commit was copied)"
  fi
  echo "host: $(uname -srm), $(nproc) CPUs"
  nvidia-smi || echo "nvidia-smi failed"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem \
    --format=csv 2>/dev/null || true
  command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
  nvcc --version || { echo "nvcc not found"; return 1; }
  cmake --version | head -1
  command -v ninja >/dev/null && echo "ninja $(ninja --version)"
  command -v compute-sanitizer >/dev/null && compute-sanitizer --version | tail -1
  nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU visible to nvidia-smi"; return 1; }
}

# Exposes the packages of .gpu-deps that pkg-config cannot find on this machine, each under
# its own prefix in the build directory (so a present libzstd is not shadowed by ours).
use_gpu_dep() { # PC_NAME LIB_GLOB HEADER...
  local pc=$1 lib=$2; shift 2
  local src; src=$(ls -d "$ROOT"/.gpu-deps/root/usr/lib/*-linux-gnu 2>/dev/null | head -1)
  if [ -z "$src" ] || [ ! -f "$src/pkgconfig/$pc.pc" ]; then
    echo "$pc: missing here and not in .gpu-deps/ (run scripts/gpu-deps.sh where apt works," \
         "then carry .gpu-deps/ with the tree)"
    return 1
  fi
  local prefix=$BUILD/gpu-deps/$pc
  rm -rf "$prefix"; mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
  cp -L "$src"/$lib "$prefix/lib/"
  local h; for h in "$@"; do cp -L "$ROOT/.gpu-deps/root/usr/include/$h" "$prefix/include/"; done
  local version; version=$(sed -n 's/^Version: *//p' "$src/pkgconfig/$pc.pc")
  local libname=${pc#lib}
  cat >"$prefix/lib/pkgconfig/$pc.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include
Name: $pc
Description: $pc from .gpu-deps (scripts/gpu-deps.sh)
Version: $version
Libs: -L\${libdir} -l$libname
Cflags: -I\${includedir}
EOF
  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "$pc: using .gpu-deps ($version) from $prefix"
}

# Chooses the MPI of the build (GPU_CHECK_MPI): the relocatable Open MPI of .gpu-deps when it
# is there, else the machine's own mpicc, else none. Sets MPI_CMAKE_ARGS and MPIEXEC and, for
# .gpu-deps, the environment of scripts/gpu-mpi-env.sh for every later step.
MPIEXEC=
use_mpi() {
  if [ "${GPU_CHECK_MPI:-auto}" = off ]; then echo "MPI: off (GPU_CHECK_MPI=off)"; return 0; fi
  local mpicc extra=()
  if [ -e "$ROOT/.gpu-deps/openmpi" ]; then
    # shellcheck source=scripts/gpu-mpi-env.sh
    . "$ROOT/scripts/gpu-mpi-env.sh" || return 1
    mpicc=$GCOMP_MPICC; MPIEXEC=$GCOMP_MPIEXEC
    echo "MPI: $(cat "$GCOMP_MPI_ROOT/VERSION" 2>/dev/null) from .gpu-deps ($GCOMP_MPI_ROOT)"
    # that copy has no Fortran: no Fortran interposer test, even where another MPI's mpif90 is
    extra=(-DGCOMP_MPIF90=OFF)
  elif mpicc=$(command -v mpicc); then
    MPIEXEC=$(command -v mpiexec || command -v mpirun) || { echo "MPI: $mpicc but no mpiexec"; return 1; }
    echo "MPI: the machine's ($mpicc, $MPIEXEC)"
  else
    echo "MPI: none (no mpicc here, no .gpu-deps/openmpi): built without MPI, the mpi step skips"
    return 0
  fi
  echo "  $("$MPIEXEC" --version 2>&1 | head -1)"
  MPI_CMAKE_ARGS=(-DGCOMP_WITH_MPI=ON "-DMPI_C_COMPILER=$mpicc" "-DMPIEXEC_EXECUTABLE=$MPIEXEC"
                  "${extra[@]}")
}

do_deps() {
  command -v pkg-config >/dev/null || { echo "pkg-config not found"; return 1; }
  local rc=0
  if pkg-config --exists libzstd; then echo "libzstd: system $(pkg-config --modversion libzstd)"
  else use_gpu_dep libzstd 'libzstd.so*' zstd.h zdict.h zstd_errors.h || rc=1; fi
  if pkg-config --exists cmocka; then echo "cmocka: system $(pkg-config --modversion cmocka)"
  else use_gpu_dep cmocka 'libcmocka.so*' cmocka.h cmocka_pbc.h || rc=1; fi
  use_mpi || rc=1
  return $rc
}

do_build() {
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  # a generator other than the cache's cannot be reused: start that build directory afresh
  if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${gen[1]:-Unix Makefiles}" "$BUILD/CMakeCache.txt"; then
    rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  fi
  # nor can a cache made with another MPI (or none): FindMPI would keep its old answers
  local mpicc_now mpicc_cached
  mpicc_now=$(printf '%s\n' "${MPI_CMAKE_ARGS[@]}" | sed -n 's/^-DMPI_C_COMPILER=//p')
  mpicc_cached=$(sed -n 's/^MPI_C_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
  if [ -f "$BUILD/CMakeCache.txt" ] && [ "$mpicc_now" != "$mpicc_cached" ]; then
    rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  fi
  echo "+ cmake -S . -B $BUILD ${gen[*]} ${MPI_CMAKE_ARGS[*]} -DGCOMP_WITH_CUDA=ON -DGCOMP_CUDA_ARCHS=$ARCHS"
  cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "${MPI_CMAKE_ARGS[@]}" \
    -DGCOMP_WITH_CUDA=ON "-DGCOMP_CUDA_ARCHS=$ARCHS" "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" \
    -DBUILD_TESTING=ON || return 1
  # keep going past a failing target: the steps after this one use whatever did build (each
  # checks for its own binaries), so one broken test does not hide the benches
  local keep=(-k); [ ${#gen[@]} -gt 0 ] && keep=(-k 0)
  timeout "$(limit "$BUDGET")" cmake --build "$BUILD" -j"$(nproc)" -- "${keep[@]}"
}

do_test() {
  local out=$BUILD/ctest-cuda.out rc
  # the cuda;mpi tests need mpirun: the mpi step runs them
  # GPU_CHECK_TEST_EXCLUDE=REGEX leaves out tests already run on the same code (ctest -E)
  (cd "$BUILD" && timeout "$(limit "$T_TEST")" ctest -L cuda -LE '^mpi$' -E "${GPU_CHECK_TEST_EXCLUDE:-^\$}" \
    -j "$JOBS" --output-on-failure --timeout "$(limit "$T_TEST")") 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  # On a GPU machine a skipped cuda test means the test did not find the device: a failure.
  if grep -q -e '\*\*\*Skipped' -e 'Not Run' "$out"; then
    echo "gpu-check: a cuda test was skipped or not run on a machine with a GPU"; return 1
  fi
  grep -q "No tests were found" "$out" && { echo "gpu-check: no cuda tests"; return 1; }
  return "$rc"
}

# The cuda;mpi tests' ctest entries as lines "name<TAB>own<TAB>dir<TAB>command": own is 1 when
# the command starts mpirun itself (it then runs as it is), and command, shell-quoted, carries
# the test's ENVIRONMENT through env(1).
CUDA_MPI_TESTS_PY='
import json, re, shlex, sys
for t in json.load(sys.stdin).get("tests", []):
    cmd = t.get("command") or []
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    own = any(re.search(r"(^|[/\s])(mpirun|mpiexec|orterun)(\s|$)", c) for c in cmd)
    env = props.get("ENVIRONMENT", [])
    run = (["env"] + env if env else []) + cmd
    print("\t".join([t["name"], "1" if own else "0", props.get("WORKING_DIRECTORY", "."),
                     shlex.join(run)]))
'

# Issue 15's check (b): the cuda;mpi tests (device buffers through the MPI staging transport,
# bit for bit against host buffers) with 2, 3 and 4 ranks sharing the one GPU. A test whose
# ctest command starts mpirun itself runs as it is; a bare program runs under mpirun once per
# rank count. Skips (77) when the build has no MPI or no such test; on a GPU machine a test
# that skips (no device seen) fails, as in the test step.
do_mpi() {
  [ -n "$MPIEXEC" ] || { echo "no MPI in this build (see the deps step)"; return 77; }
  local granted; granted=$(limit "$T_MPI") # GPU_CHECK_TIMEOUT_MPI, or less: what the budget left
  local deadline=$((SECONDS + granted)) rc=0 r t0 left name own dir cmdline np
  local -a argv nps results=()
  command -v ompi_info >/dev/null && ompi_info --path prefix 2>/dev/null | sed 's/^ */Open MPI /'
  # the launcher alone first, so that an Open MPI that cannot start is not taken for a test
  echo "+ mpirun --oversubscribe -np 4 hostname"
  timeout 60 "$MPIEXEC" --oversubscribe -np 4 hostname </dev/null || { echo "mpirun cannot start 4 ranks here"; return 1; }
  local list
  list=$(cd "$BUILD" && ctest -L '^cuda$' -L '^mpi$' --show-only=json-v1 | python3 -c "$CUDA_MPI_TESTS_PY") ||
    { echo "cannot list the cuda;mpi tests (ctest --show-only=json-v1 and python3)"; return 1; }
  [ -n "$list" ] || { echo "no test labelled cuda;mpi in $BUILD (tests/cuda_mpi_staging.c not built yet?)"; return 77; }
  # the list comes on fd 3: mpirun reads its standard input, which is /dev/null here
  while IFS=$'\t' read -r -u 3 name own dir cmdline; do
    eval "argv=($cmdline)"
    nps=(2 3 4); [ "$own" = 1 ] && nps=(own) # its own rank count: run once, as it is
    for np in "${nps[@]}"; do
      left=$((deadline - SECONDS))
      [ "$left" -gt 0 ] || { results+=("$name np=$np: not run, the step's $granted s spent"); rc=1; continue; }
      t0=$SECONDS
      if [ "$np" = own ]; then
        echo "+ ctest -R ^$name\$ (it starts mpirun itself)"
        (cd "$BUILD" && timeout "$left" ctest -R "^$name\$" --output-on-failure --timeout "$left") </dev/null; r=$?
      else
        echo "+ mpirun --oversubscribe -np $np ${argv[*]}"
        (cd "$dir" && timeout "$left" "$MPIEXEC" --oversubscribe -np "$np" "${argv[@]}") </dev/null; r=$?
      fi
      case $r in
        0) results+=("$name np=$np: passed in $((SECONDS - t0)) s") ;;
        77) results+=("$name np=$np: SKIPPED (no device seen): a failure on a GPU machine"); rc=1 ;;
        124) results+=("$name np=$np: TIMED OUT (the step's $granted s)"); rc=1 ;;
        *) results+=("$name np=$np: FAILED (status $r)"); rc=1 ;;
      esac
    done
  done 3<<<"$list"
  echo; printf -- '-- %s\n' "${results[@]}"
  return "$rc"
}

do_sanitize() {
  command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found"; return 1; }
  local t name rc=0 r running=0
  local tests=()
  for t in "$BUILD"/tests/test_cuda_*; do
    case $t in *mpi*) continue ;; esac # MPI programs: the mpi step runs them under mpirun
    [ -x "$t" ] && [ -f "$t" ] && tests+=("$t")
  done
  [ ${#tests[@]} -gt 0 ] || { echo "no test_cuda_* executables in $BUILD/tests"; return 1; }
  mkdir -p "$BUILD/sanitize"
  # JOBS at a time, each to its own log; the logs are printed whole, in order, afterwards.
  # The NCCL test runs alone, after the others: it checks that a call allocates no device
  # memory (free memory unchanged), which another process's allocations would upset.
  local ordered=() solo=()
  for t in "${tests[@]}"; do case $(basename "$t") in *nccl*) solo+=("$t") ;; *) ordered+=("$t") ;; esac; done
  tests=("${ordered[@]}" "${solo[@]}")
  for t in "${tests[@]}"; do
    name=$(basename "$t")
    case $name in *nccl*) wait; running=0 ;; esac
    # NCCL probes its own kernels at communicator creation (cudaFuncGetAttributes on kernels
    # its build has no image for on this GPU: error 209 each, 480 on the H100 at 930d7cc);
    # memcheck would count those API errors as the test's. The tests check every return code
    # of their own, so for the NCCL test memcheck reports memory errors only.
    local api=()
    case $name in *nccl*) api=(--report-api-errors no) ;; esac
    echo "+ GCOMP_TEST_QUICK=1 compute-sanitizer --tool memcheck ${api[*]} --error-exitcode=1 ${t#"$ROOT"/}"
    ( GCOMP_TEST_QUICK=1 timeout "$(limit "$T_SANITIZE")" compute-sanitizer --tool memcheck "${api[@]}" \
        --error-exitcode=1 --leak-check no "$t" >"$BUILD/sanitize/$name.log" 2>&1
      echo $? >"$BUILD/sanitize/$name.rc" ) &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
  done
  wait
  for t in "${tests[@]}"; do
    name=$(basename "$t")
    echo; echo "---- $name under compute-sanitizer ----"
    cat "$BUILD/sanitize/$name.log"
    r=$(cat "$BUILD/sanitize/$name.rc" 2>/dev/null || echo 1)
    case $r in
      0) echo "-- $name: clean" ;;
      77) echo "-- $name: SKIPPED (no device seen under the sanitizer)"; rc=1 ;;
      124) echo "-- $name: TIMED OUT (GPU_CHECK_TIMEOUT_SANITIZE=$T_SANITIZE s, or what GPU_CHECK_BUDGET left)"; rc=1 ;;
      *) echo "-- $name: FAILED (status $r)"; rc=1 ;;
    esac
  done
  return "$rc"
}

# ---- nccl: the NCCL transport (issue 15 (a) and (c), allreduce_perf --device cuda) ----------

# Where NCCL is, exported as NCCL_ROOT (CMakeLists.txt reads it) for the build: a given
# NCCL_ROOT; else /usr/local/cuda's; else the nvidia-nccl wheel PyTorch brings (nvidia/.../
# include/nccl.h and lib/libnccl.so.2 under a site-packages folder of the first python that
# has one). Runs in the main shell, before the build.
find_nccl() {
  local py root=
  if [ -n "${NCCL_ROOT:-}" ]; then echo "NCCL: NCCL_ROOT=$NCCL_ROOT (given)"; return 0; fi
  if [ -f /usr/local/cuda/include/nccl.h ] && ls /usr/local/cuda/lib*/libnccl.so* >/dev/null 2>&1; then
    echo "NCCL: /usr/local/cuda ($(ls /usr/local/cuda/lib*/libnccl.so.* 2>/dev/null | head -1))"; return 0
  fi
  for py in ${GPU_CHECK_PYTHON:-} python3 /usr/bin/python3; do
    command -v "$py" >/dev/null || continue
    root=$("$py" - 2>/dev/null <<'PY'
import glob, os, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
for d in dirs:
    for h in sorted(glob.glob(os.path.join(d, "nvidia", "**", "include", "nccl.h"), recursive=True)):
        r = os.path.dirname(os.path.dirname(h))
        if glob.glob(os.path.join(r, "lib*", "libnccl.so*")):
            print(r)
            raise SystemExit
PY
)
    [ -n "$root" ] && break
  done
  if [ -n "$root" ]; then
    export NCCL_ROOT=$root
    echo "NCCL: $root (python wheel, found with $py: $(ls "$root"/lib*/ 2>/dev/null | grep nccl | tr '\n' ' '))"
    grep -m1 -E '^#define NCCL_(MAJOR|MINOR|PATCH)' -A2 "$root/include/nccl.h" | tr '\n' ' '; echo
  else
    echo "NCCL: not found (no /usr/local/cuda/include/nccl.h, no nvidia/*/include/nccl.h in python's" \
         "site-packages; set NCCL_ROOT): the NCCL transport is not built and the nccl step fails"
  fi
}

# One process, one NCCL rank (NCCL refuses two ranks on one GPU): test_cuda_nccl (every codec
# with the one-rank switch against the host engine, self send/recv, no allocation per call),
# its timeout case, the ncclAllReduce interposer under a program calling NCCL directly (per
# codec, and off), and allreduce_perf --device cuda at one rank for every codec (#wrong).
do_nccl() {
  local rc=0 name codec
  local bin=$BUILD/tests/test_cuda_nccl prog=$BUILD/tests/cuda_nccl_interpose
  local lib=$BUILD/interpose/libgcomp_nccl.so perf=$BUILD/bench/allreduce_perf
  grep -q '^GCOMP_WITH_NCCL:.*=\(AUTO\|ON\)' "$BUILD/CMakeCache.txt" 2>/dev/null &&
    grep -q '^NCCL_LIBRARY:.*/' "$BUILD/CMakeCache.txt" 2>/dev/null ||
    { echo "the build has no NCCL (see the deps step's NCCL line; set NCCL_ROOT)"; return 1; }
  echo "NCCL library: $(sed -n 's/^NCCL_LIBRARY:[A-Z]*=//p' "$BUILD/CMakeCache.txt")"
  [ -x "$bin" ] || { echo "$bin not built"; return 1; }
  echo "+ tests/test_cuda_nccl"
  timeout "$(limit "$T_NCCL")" "$bin" || rc=1
  echo "+ tests/test_cuda_nccl --timeout"
  timeout "$(limit 120)" "$bin" --timeout || rc=1
  for codec in off none fp16 bf16 terngrad topk:ratio=0.01; do
    name=${codec%%:*}
    echo "+ GCOMP_CODEC=$codec LD_PRELOAD=libgcomp_nccl.so tests/cuda_nccl_interpose --codec $codec"
    rm -f "$RESULTS/nccl_interpose_${name}_0.json"
    if [ "$codec" = off ]; then
      env LD_PRELOAD="$lib" GCOMP_TEST_COMPRESS_ONE_RANK=1 timeout "$(limit 120)" "$prog" --codec off || rc=1
    else
      env LD_PRELOAD="$lib" GCOMP_CODEC="$codec" GCOMP_TEST_COMPRESS_ONE_RANK=1 GCOMP_DEBUG=INFO \
        GCOMP_STATS_FILE="$RESULTS/nccl_interpose_${name}_%r.json" timeout "$(limit 120)" "$prog" --codec "$codec" ||
        rc=1
    fi
  done
  # as if this rank had no memory for a communicator's state: everything passes through, exact
  echo "+ GCOMP_CODEC=fp16 LD_PRELOAD=libgcomp_nccl.so tests/cuda_nccl_interpose --codec fp16 --no-state"
  rm -f "$RESULTS/nccl_interpose_no_state_0.json"
  env LD_PRELOAD="$lib" GCOMP_CODEC=fp16 GCOMP_TEST_COMPRESS_ONE_RANK=1 GCOMP_DEBUG=INFO \
    GCOMP_STATS_FILE="$RESULTS/nccl_interpose_no_state_%r.json" timeout "$(limit 120)" "$prog" --codec fp16 --no-state ||
    rc=1
  if [ -x "$perf" ] && [ -n "$MPIEXEC" ]; then
    echo "+ mpirun -np 1 -x GCOMP_TEST_COMPRESS_ONE_RANK=1 bench/allreduce_perf --device cuda -b 1M -e 256M -f 4 (every codec)"
    timeout "$(limit "$T_NCCL")" "$MPIEXEC" -np 1 -x GCOMP_TEST_COMPRESS_ONE_RANK=1 "$perf" --device cuda \
      -b 1M -e 256M -f 4 \
      -n 10 -w 3 --codec none --codec fp16 --codec bf16 --codec terngrad --codec topk:ratio=0.01 \
      -J "$RESULTS/allreduce_perf_cuda.json" || rc=1
  else
    echo "allreduce_perf --device cuda: not run ($perf needs MPI in the build: see the deps step)"; rc=1
  fi
  return "$rc"
}

do_perf() {
  local bin=$BUILD/bench/codec_perf rc=0
  [ -x "$bin" ] || { echo "$bin not built"; return 1; }
  # shellcheck disable=SC2086 # GPU_CHECK_PERF_ARGS is a list of words
  echo "+ build-gpu/bench/codec_perf --device cuda --json-out ${RESULTS#"$ROOT"/}/codec_perf_cuda.json ${GPU_CHECK_PERF_ARGS:-}"
  timeout "$(limit "$T_PERF")" "$bin" --device cuda --json-out "$RESULTS/codec_perf_cuda.json" \
    ${GPU_CHECK_PERF_ARGS:-} || rc=$?
  return "$rc"
}

find_torch_python() {
  local py
  for py in ${GPU_CHECK_PYTHON:-} python3 /usr/bin/python3; do
    command -v "$py" >/dev/null || continue
    "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
      && { echo "$py"; return 0; }
  done
  return 1
}

do_torch() {
  local py lib
  py=$(find_torch_python) || { echo "no python with torch and CUDA found"; return 77; }
  lib=$BUILD/libgcomp.so
  [ -e "$lib" ] || { echo "$lib not built"; return 1; }
  echo "+ $py bench/torch_peers.py --lib ${lib#"$ROOT"/} --json ${RESULTS#"$ROOT"/}/torch_peers.json"
  PYTHONUNBUFFERED=1 timeout "$(limit "$T_TORCH")" "$py" "$ROOT/bench/torch_peers.py" --lib "$lib" \
    --json "$RESULTS/torch_peers.json"
}

do_cpu() {
  cd "$BUILD" && ctest -L unit -E '^install$' -j"$(nproc)" --output-on-failure --timeout 300
}

# ---- run -----------------------------------------------------------------------------------

want() { local s; for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

for s in "${STEPS[@]}"; do
  case $s in env|deps|build|test|mpi|nccl|sanitize|perf|torch|cpu) ;;
    *) echo "gpu-check: unknown step '$s' (steps: ${ALL_STEPS[*]} cpu)" >&2; exit 2 ;;
  esac
done

command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
want env && step env do_env
# deps sets PKG_CONFIG_PATH / LD_LIBRARY_PATH for the later steps: it runs in this shell (a
# pipeline would run it in a subshell), its output still goes to the terminal and its log.
# perf and torch need it too when the build has the .gpu-deps Open MPI: libgcomp.so then
# loads libmpi.so.40 and Open MPI's own libraries from there through LD_LIBRARY_PATH.
if want deps || want build || want test || want mpi || want nccl || want sanitize || want perf ||
   want torch || want cpu; then
  STEP_NO=$((STEP_NO + 1)); t0=$SECONDS
  deps_log=$(printf '%s/%02d-deps.log' "$LOGS" "$STEP_NO")
  echo; echo "==== [$STEP_NO] deps ===="
  do_deps >"$deps_log" 2>&1; rc=$?
  cat "$deps_log"
  v=PASS; [ $rc -ne 0 ] && v="FAIL (status $rc)"
  SUMMARY+=("$(printf '%-9s %-22s %4ds  %s' deps "$v" $((SECONDS - t0)) "${deps_log#"$ROOT"/}")")
fi
if want build || want nccl; then find_nccl; fi
want build && step build do_build
if [ -f "$BUILD/CTestTestfile.cmake" ]; then
  want test && step test do_test
  want mpi && step mpi do_mpi
  # nccl: do_nccl belongs to the NCCL transport's work (test_cuda_nccl, allreduce_perf)
  if want nccl; then
    if declare -F do_nccl >/dev/null; then step nccl do_nccl; else skip_step nccl "no do_nccl in this script yet"; fi
  fi
  want sanitize && step sanitize do_sanitize
  want perf && step perf do_perf
  want torch && step torch do_torch
  want cpu && step cpu do_cpu
else
  for s in test mpi nccl sanitize perf torch cpu; do want $s && skip_step $s "$BUILD is not configured"; done
fi

echo
echo "==== gpu-check summary ($((SECONDS - T_START)) s; logs in ${LOGS}) ===="
status=0
for line in "${SUMMARY[@]}"; do
  echo "$line"
  case $line in *FAIL*) status=1 ;; esac
done
printf '%s\n' "${SUMMARY[@]}" >"$RESULTS/summary.txt"
if [ $status = 0 ]; then echo "gpu-check: all steps passed"; else echo "gpu-check: SOME STEPS FAILED"; fi
# let tee write the last lines to OUT/gpu-check.log before the caller collects it
if [ -n "$TEE_PID" ]; then exec >&- 2>&-; wait "$TEE_PID" 2>/dev/null; fi
exit $status
