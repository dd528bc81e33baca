#!/usr/bin/env bash
# examples_args.sh ROOT [INTERPOSER]: the example trainers (examples/ddp_fashion_mnist.py,
# horovod_fashion_mnist.py) and their scripts (netem_ddp.sh, horovod_netem.sh) refuse bad
# arguments with a usage error (exit 2, a message naming the flag) before they train; a failure
# on rank 0 alone ends the DDP job instead of hanging it, and so does a --data one rank cannot
# read (both trainers); the DDP table survives a gcomp setting that never compressed; netem_ddp.sh runs rate none; horovod_netem.sh fails when its runs do.
# Every run is --quick and at most a few steps, so that the originals of these bugs (a training
# run where a usage error was due) stay short too. INTERPOSER (libgcomp_mpi.so) is for
# horovod_netem.sh, whose runs here use no codec; without it, or without Horovod, those cases skip.
# Environment: GCOMP_LIBRARY and PYTHONPATH as tests/python's, OMPI_* to run mpirun as root.
set -uo pipefail
root=$1
interposer=${2:-}
py=/usr/bin/python3
ddp=$root/examples/ddp_fashion_mnist.py
hvd=$root/examples/horovod_fashion_mnist.py
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1
mpirun=(mpirun --oversubscribe -np 2)
fails=0

# expect RC TEXT LIMIT CMD...: CMD exits RC ("nonzero": anything but 0 and timeout's 124/137)
# within LIMIT seconds, and its output contains TEXT.
expect() {
  local want=$1 text=$2 limit=$3 rc=0 t0=$EPOCHREALTIME ok=0
  shift 3
  timeout -k 5 "$limit" "$@" >"$out/log" 2>&1 </dev/null || rc=$?
  local took
  took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  if [ "$want" = nonzero ]; then
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && ok=1
  else
    [ "$rc" -eq "$want" ] && ok=1
  fi
  if [ $ok -eq 1 ] && grep -qF -- "$text" "$out/log"; then
    echo "ok: ${*#"$root/"}: exit $rc in ${took} s, $(grep -F -- "$text" "$out/log" | head -1)"
  else
    echo "FAIL: $*: exit $rc in ${took} s (limit $limit), expected $want and '$text'; output:"
    tail -n 25 "$out/log" | sed 's/^/    /'
    fails=$((fails + 1))
  fi
}

# ---- usage errors: one process (an MPI singleton), before torch is imported ----------------
# (the Horovod trainer checks --batch against the data and --data itself after hvd.init(): those
# two skip there where Horovod is not installed, as on a fresh machine; scripts/horovod-deps.sh)
have_hvd=0
"$py" -c 'import horovod.torch' 2>/dev/null && have_hvd=1
for args in "--batch 0|--batch must be at least 1" \
            "--batch -128|--batch must be at least 1" \
            "--batch 25600|--batch 25600 is larger than the 12800 training images" \
            "--epochs 0|--epochs must be a positive finite number" \
            "--epochs -1|--epochs must be a positive finite number" \
            "--epochs nan|--epochs must be a positive finite number" \
            "--lr 0|--lr must be a positive finite number" \
            "--data $out/none|--data $out/none: cannot read"; do
  # shellcheck disable=SC2086 # the arguments split on purpose
  expect 2 "${args#*|}" 60 "$py" "$ddp" --quick --settings none ${args%%|*}
  case "$have_hvd ${args%%|*}" in
    "0 --batch 25600" | "0 --data "*) echo "skip: $hvd ${args%%|*} (no Horovod)"; continue ;;
  esac
  # shellcheck disable=SC2086
  expect 2 "${args#*|}" 60 "$py" "$hvd" --quick ${args%%|*}
done
expect 2 "--start-iter must be 0 or more" 60 "$py" "$ddp" --quick --settings none --start-iter -1
expect 2 "--start-iter must be at least 2 with torch-powersgd" 60 \
  "$py" "$ddp" --quick --settings torch-powersgd --start-iter 1
expect 2 "--powersgd-rank must be at least 1" 60 "$py" "$ddp" --quick --powersgd-rank 0
expect 2 "--init-timeout must be a positive finite number" 60 "$py" "$ddp" --quick --init-timeout 0
expect 2 "--settings must name at least one" 60 "$py" "$ddp" --quick --settings ,
expect 2 "unknown setting(s) bogus" 60 "$py" "$ddp" --quick --settings none,bogus
# a batch the ranks cannot split: 2 ranks
expect 2 "--batch 129 must be a multiple of the 2 ranks" 60 \
  "${mpirun[@]}" "$py" "$ddp" --quick --settings none --batch 129

# ---- DDP: rank 0 cannot bind --master-addr (TEST-NET-1: on no interface here) ---------------
# Before: rank 0 raised, the other rank waited in MPI_Bcast for ever.
expect nonzero "rank 0 cannot bind a port on --master-addr 192.0.2.1" 30 \
  "${mpirun[@]}" "$py" "$ddp" --quick --settings none --master-addr 192.0.2.1

# ---- DDP: a rank that cannot reach rank 0's --master-addr (TEST-NET-1 on rank 1 only) ------
# Before: torch's 30-minute rendezvous timeout; now --init-timeout's.
expect nonzero "timed out" 60 \
  mpirun --oversubscribe -np 1 "$py" "$ddp" --quick --settings none --init-timeout 10 : \
  -np 1 "$py" "$ddp" --quick --settings none --init-timeout 10 --master-addr 192.0.2.1

# ---- a --data that one rank alone cannot read (each rank reads its own file system) ----------
# Before: that rank exited 2 without a word, and rank 0 waited in gloo's rendezvous for ever.
expect 2 "rank 1: --data $out/none: cannot read" 60 \
  mpirun --oversubscribe -np 1 "$py" "$ddp" --quick --settings none : \
  -np 1 "$py" "$ddp" --quick --settings none --data "$out/none"

# ---- DDP: the table with a gcomp setting that never compressed (10 steps = --start-iter) -----
expect 0 "none compressed: 10 steps <= --start-iter 10" 120 \
  "${mpirun[@]}" "$py" "$ddp" --quick --epochs 0.1 --settings none,gcomp-topk
grep -E '^gcomp-topk +[0-9.]+% .* n/a +- ' "$out/log" >/dev/null ||
  { echo "FAIL: the table's gcomp-topk row has no n/a bytes and - ratio"; fails=$((fails + 1)); }

# ---- netem_ddp.sh, rate none: shared memory, gloo on loopback -------------------------------
expect 0 "identical params: yes" 60 \
  "$root/examples/netem_ddp.sh" none 2 -- --quick --epochs 0.05 --settings none

# ---- horovod_netem.sh ----------------------------------------------------------------------
# -n is checked before the interposer and Horovod are: an absent interposer still reads as one
export GCOMP_MPI_LIB=${interposer:-$out/no-interposer.so}
expect 2 "-n must be 1..200, got '0'" 30 "$root/examples/horovod_netem.sh" -n 0 -r 1 -l none -s none
expect 2 "-n needs a value" 30 "$root/examples/horovod_netem.sh" -n
expect 2 "-r must be a positive integer" 30 "$root/examples/horovod_netem.sh" -r 0
if [ -z "$interposer" ]; then
  echo "skip: horovod_netem.sh runs and the Horovod trainer's rank check (no interposer given)"
elif ! "$py" -c 'import horovod.torch as h; assert h.mpi_built()' 2>/dev/null; then
  echo "skip: horovod_netem.sh runs and the Horovod trainer's rank check (no Horovod with MPI)"
else
  expect 2 "--batch 129 must be a multiple of the 2 ranks" 60 \
    "${mpirun[@]}" "$py" "$hvd" --quick --batch 129
  # a --data that one rank alone cannot read: every rank exits 2 (before: rank 0 waited in hvd)
  expect 2 "rank 1: --data $out/none: cannot read" 60 \
    mpirun --oversubscribe -np 1 "$py" "$hvd" --quick : -np 1 "$py" "$hvd" --quick --data "$out/none"
  # every run fails (the trainer refuses --bogus): the table says so, and the exit status too
  expect 1 "1 of 1 runs failed" 120 \
    "$root/examples/horovod_netem.sh" -n 2 -r 1 -l none -s none -o "$out/hn" -- --bogus
fi

if [ "$fails" -ne 0 ]; then
  echo "examples_args: $fails case(s) failed"
  exit 1
fi
echo "examples_args: all cases passed"
